"""The exceptions a user can meet. Each carries one sentence and, where known, the user's file:line."""


import os

IN_CLI = False  # set by the mica command: a call into Mica from it is not a user's line to name


class MicaError(Exception):
    """Base class of every error Mica raises on purpose."""

    def __init__(self, message, loc=None):
        self.sentence = message
        self.loc = loc
        super().__init__(f"{message} ({format_loc(loc)})" if loc else message)

    def locate(self, loc):
        """Give the error a place (file, line) where it had none."""
        if loc and self.loc is None:
            self.loc = loc
            self.args = (f"{self.sentence} ({format_loc(loc)})",)


class ShapeError(MicaError):
    """A verb was given operands whose shapes or dtypes do not fit together."""


class TraceError(MicaError):
    """A verb was used where no trace is active, or with a value it cannot take."""


class IndexOutOfRange(MicaError, IndexError):
    """An index outside a tensor's dim (an IndexError too, as torch's, so `except IndexError` holds)."""


class MissingVerbError(TraceError, AttributeError):
    """A name torch has and Mica does not (an AttributeError too, so hasattr() still answers)."""


def missing_verb(where, name, torch_name):
    """The error for `where.name` (a verb or method Mica lacks), at the user's line."""
    from .tensor import user_location

    listed = "mica.Tensor" if where == "Tensor." else where.rstrip(".")
    return MissingVerbError(f"Mica has no {where}{name} ({torch_name}{name}); write it from the verbs it has "
                            f"(dir({listed}) lists them)", user_location())


class GradError(MicaError):
    """Differentiation was asked for something that has no derivative here."""


def format_loc(loc):
    """'model.py:41' style text for a (path, line) pair; the path is shown relative when short."""
    if not loc:
        return "?"
    import os

    path, line = loc
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except (ValueError, OSError):  # (OSError: the working folder was deleted; the full path then)
        pass
    return f"{path}:{line}"


def _uncaught(kind, value, tb, _python=None):
    """sys.excepthook while Mica is imported: a Mica error nothing caught ends a script with its
    sentence and the user's file:line, as the mica command's do, not with Python's traceback
    through Mica's own frames; MICA_TRACEBACK=1 shows that traceback. One Mica raised without a
    line is placed at the user's call into Mica; one the user's own code raised, and other
    exceptions, get Python's."""
    import sys

    if os.environ.get("MICA_TRACEBACK", "") in ("", "0"):
        if isinstance(value, MicaError) and not value.loc:
            value.locate(_raised_by_mica(tb))  # (one Mica raised without a line: the user's call into it)
        if isinstance(value, MicaError) and value.loc:
            print(f"mica: error: {value}", file=sys.stderr)
            return
        try:
            said = _missing_import(value, tb) or _misused_signature(value, tb)
        except Exception:  # (reading the traceback failed: Python's own report, never none)
            said = None
        if said:
            print(f"mica: error: {said}", file=sys.stderr)
            return
    (_python or sys.__excepthook__)(kind, value, tb)


def _raised_by_mica(tb):
    """(path, line) of the user's last call on the way to an exception raised in Mica's own code;
    None where the user's code raised it, or no frame is the user's."""
    import traceback

    from .tensor import _is_internal

    frames = traceback.extract_tb(tb) if tb else []
    if not frames or not _is_internal(os.path.abspath(frames[-1].filename)):
        return None
    users = [f for f in frames if not f.filename.startswith("<") and not _is_internal(os.path.abspath(f.filename))]
    if not users:  # (python -c, a script on stdin: Python's own name for the user's code, "<string>")
        users = [f for f in frames if f.filename in ("<string>", "<stdin>")]
    return (users[-1].filename, users[-1].lineno) if users else None


_SIGNATURE = (r"([\w.]+\(\)) (got an unexpected keyword argument '\w+'|missing \d+ required (?:positional|keyword-only) "
              r"arguments?: .*|takes (?:from \d+ to )?\d+ positional arguments? but \d+ (?:were|was) given|"
              r"got multiple values for argument '\w+'|takes no arguments)$")


def _misused_signature(value, tb):
    """A verb, Tensor method or module called with arguments its signature (torch's) has no place
    for, as Python's TypeError says it where Mica's code made the call: that sentence at the user's
    line, not a traceback through Mica's frames; None for any other exception."""
    import re
    import traceback

    from .tensor import Tensor, _is_own

    found = re.match(_SIGNATURE, str(value)) if type(value) is TypeError and tb else None
    if not found:
        return None
    frames = traceback.extract_tb(tb)
    own = [_is_own(os.path.abspath(f.filename)) for f in frames]  # (Mica's package, not contextlib's)
    last = tb
    while last.tb_next is not None:
        last = last.tb_next
    entered = last.tb_frame.f_locals.get("func")  # (contextlib calling a generator function: Mica's, as bind?)
    if not own[-1] and isinstance(getattr(entered, "__code__", None), type(_misused_signature.__code__)):
        own[-1] = _is_own(os.path.abspath(entered.__code__.co_filename))
    where = _raised_by_mica(tb) if own[-1] else None
    method = found.group(1)[len("Tensor."):-2] if found.group(1).startswith("Tensor.") else None
    if not where and method and hasattr(Tensor, method) and any(own):  # (a traced Tensor's method,
        where = (frames[-1].filename, frames[-1].lineno)                       # bound at the user's line)
    if not where:
        return None
    name, what = found.groups()
    return (f"{name} {what}; call it with the arguments its signature takes (torch's, for Mica's verbs and "
            f"methods: help() on one lists them) ({format_loc(where)})")


def _missing_import(value, tb):
    """`from mica.optim import Rprop` (a name torch's module has and Mica's does not) as Mica's
    sentence for a missing verb, at the import's line; None for any other exception."""
    import re
    import traceback

    found = re.match(r"cannot import name '(\w+)' from '(mica(?:\.\w+)*)'", str(value)) \
        if isinstance(value, ImportError) else None
    if not found or not tb:
        return None
    name, module = found.groups()
    where = traceback.extract_tb(tb)[-1]
    return (f"Mica has no {module}.{name} ({'torch' + module[4:]}.{name}); write it from what {module} has "
            f"(dir({module}) lists that) ({format_loc((where.filename, where.lineno))})")


def install_excepthook():
    """Take sys.excepthook for uncaught Mica errors, where no one else has taken it."""
    import sys

    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _uncaught
