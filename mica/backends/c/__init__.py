"""The CPU target: Program -> (the shared pipeline, mica/lower.py) -> C source -> shared library.

    lowered = program.lower("cpu", opt_level=2)   # schedule, memory plan, source; nothing built
    exe = lowered.build()                           # gcc, cached by hash
    loss, grads = exe(params, idx, targets, threads=2)

target.py answers the pipeline's questions for the CPU; lowerings.py lowers each kernel primitive;
emit.py and loops.py write the C; build.py compiles it; executable.py loads and runs it.
"""
from .executable import Executable  # noqa: F401
from .target import CTarget, default_max_threads  # noqa: F401
