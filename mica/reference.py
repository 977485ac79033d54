"""`mica.reference.run(program, *args, precision="float64")`: the numpy oracle."""
from .backends.reference import run, round_bf16  # noqa: F401
