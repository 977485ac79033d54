"""nanoGPT's config files, run as its configurator runs them.

nanoGPT's train.py execs each config file named on its command line, in order, in its own
globals: a file sees the settings as the files and --key=value items before it left them, and
what it assigns replaces them. `run` does the same over a copy of the settings and says what the
file set (a setting whose value changed, or whose assignment ran: `dtype = 'bfloat16'` over the
same default still counts as given), which new names it made, and each name's line.
"""
import ast
import os
import sys
import traceback

from ..errors import MicaError
from ..files import read_text


class Ran:
    """What running one config file did: `settings` {name: value} it set, `others` {name: value}
    of the names it made or rebound that are not settings (helpers, imports), `names` every such
    name after it ran (what the next file sees), `lines` {name: line of its last assignment}."""

    def __init__(self, settings, others, names, lines):
        self.settings, self.others, self.names, self.lines = settings, others, names, lines


def run(path, settings, carried=None):
    """Run the config file `path` over `settings` and the names earlier files made (`carried`:
    nanoGPT runs every file in the one namespace of train.py), changing neither; a failure is one
    sentence naming the file and line."""
    text = read_text(path, "config file")
    code = _compile(text, path)
    assigned = _Assignments.of(text, path)
    carried = {**train_py_names(), **(carried or {})}
    scope = {**carried, **settings}
    ran = _run_tracing_lines(code, scope, path)
    gone = [k for k in settings if k not in scope]
    if gone:
        raise MicaError(f"config file {path} deletes the setting {gone[0]}; a config file may assign settings, "
                        "not remove them")
    set_ = {k: scope[k] for k in settings
            if scope[k] is not settings[k] or assigned.all.get(k, set()) & ran}
    names = {k: v for k, v in scope.items() if k not in settings and not k.startswith("_")}
    others = {k: v for k, v in names.items() if k not in carried or v is not carried[k]}
    return Ran(set_, others, names, assigned.last)


class _LazyTorch:
    """train.py's `torch`, imported when a config file first uses it (`torch.cuda.is_available()`):
    most configs never do, and `make train`'s venv has no PyTorch."""

    def __getattr__(self, name):
        try:
            import torch
        except ImportError:
            raise ModuleNotFoundError("it uses torch (train.py's import, which nanoGPT's configs see), and torch is "
                                      "not installed here: pip install torch, or write the value") from None
        return getattr(torch, name)


def train_py_names():
    """What nanoGPT's train.py has imported when its configurator runs a config file in its globals
    (a config may use them: `os.path.join(...)`, `torch.cuda.is_available()`); __file__ is train.py's
    path, in the folder nanoGPT runs from."""
    import contextlib
    import math
    import pickle
    import time

    import numpy as np

    names = {"os": os, "time": time, "math": math, "pickle": pickle, "nullcontext": contextlib.nullcontext, "np": np,
             "torch": _LazyTorch()}
    try:
        names["__file__"] = os.path.join(os.getcwd(), "train.py")
    except OSError:  # (the current folder was deleted)
        pass
    return names


def literal_recipe(path):
    """(recipe, line) of a config file's last module-level `recipe = '...'` of a plain string, read
    without running it; None when it assigns none that way."""
    try:
        tree = ast.parse(read_text(path, "config file"), path)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return None  # (running it says what is wrong)
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                and any(isinstance(t, ast.Name) and t.id == "recipe" for t in node.targets):
            found = node.value.value, node.lineno
    return found


def _compile(text, path):
    try:
        return compile(text, path, "exec")
    except SyntaxError as e:
        where = f" ({path}:{e.lineno})" if e.lineno else ""
        raise MicaError(f"config file {path} is not valid Python: {e.msg}{where}; fix that line") from None
    except (ValueError, OverflowError, MemoryError, RecursionError) as e:
        raise MicaError(f"config file {path} cannot be compiled: {first_line(e)}") from None


def _run_tracing_lines(code, scope, path):
    """exec(code, scope), as nanoGPT's configurator runs a file; returns the module-level lines that
    ran (so an assignment in a branch not taken is not taken for one). The current folder is first on
    the module path meanwhile, as train.py's folder is when nanoGPT runs `python train.py CONFIG`
    there: a config may import a module of that folder (`from config.base import *`)."""
    ran = set()
    try:
        here = os.getcwd()
    except OSError:  # (the current folder was deleted: nothing there to import)
        here = None
    added = here is not None and here not in sys.path[:1]
    if added:
        sys.path.insert(0, here)

    def line(frame, event, arg):
        if event == "line":
            ran.add(frame.f_lineno)
        return line

    def call(frame, event, arg):
        return line if frame.f_code is code else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        exec(code, scope)
    except (Exception, SystemExit) as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        where = f" at {path}:{lines[-1]}" if lines else ""
        raise MicaError(f"config file {path} raised {type(e).__name__}{where}: {first_line(e)}; fix that line") \
            from None
    finally:
        sys.settrace(previous)
        if added and here in sys.path:
            sys.path.remove(here)
    return ran


def first_line(e):
    """An exception's message cut to its first line and 200 characters."""
    try:
        text = str(e)
    except Exception:
        text = ""
    text = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


class _Assignments(ast.NodeVisitor):
    """The lines of each module-level name's assignments in the text (not inside a def, class,
    lambda or comprehension, whose names are their own): `all` {name: {lines}}, `last` {name: line}."""

    def __init__(self):
        self.all, self.last = {}, {}

    @classmethod
    def of(cls, text, path):
        found = cls()
        try:
            found.visit(ast.parse(text, path))
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
            pass  # (compile took it; a parse too deep for the visitor only loses the line numbers)
        return found

    def _store(self, name, line):
        self.all.setdefault(name, set()).add(line)
        self.last[name] = line

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Store):
            self._store(node.id, node.lineno)

    def _alias(self, node):
        for a in node.names:
            self._store((a.asname or a.name).split(".")[0], node.lineno)

    visit_Import = visit_ImportFrom = _alias

    def _own_scope(self, node):
        self._store(node.name, node.lineno)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _own_scope
    visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = lambda self, node: None
