"""Files the user names: a folder Mica will write into, a text file it will read. Every problem
is one sentence (MicaError) saying which path and what to do."""
import os
import tempfile

from .errors import MicaError


def writable_folder(path, what="output folder"):
    """Create `path` if needed and prove it can be written (a probe file is created and removed),
    so a run fails here, before any work, rather than at its first checkpoint."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise MicaError(f"{what} {path} exists and is a file, not a folder; remove it or choose another path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise MicaError(f"cannot create the {what} {path} ({e.strerror}); choose a folder you can write to") from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".mica-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise MicaError(f"cannot write into the {what} {path} ({e.strerror}); choose a folder you can write "
                        "to") from None
    return path


def read_text(path, what="file"):
    """The UTF-8 text of `path`, or a sentence: missing, a folder, unreadable, or not UTF-8 (with
    the line of the first bad byte)."""
    if not os.path.exists(path):
        raise MicaError(f"{what} {path} does not exist")
    if os.path.isdir(path):
        raise MicaError(f"{what} {path} is a folder, not a file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise MicaError(f"cannot read {what} {path} ({e.strerror})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise MicaError(f"{what} {path} is not UTF-8 text: byte 0x{raw[e.start]:02x} at {path}:{line} "
                        f"(offset {e.start:,}); save it as UTF-8") from None
