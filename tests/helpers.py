"""Shared test helpers: random inputs, torch conversions, relative errors, the CLI as a user runs it."""
import subprocess
import sys

import numpy as np

import mica


def rel_err(a, b):
    """||a - b|| / max(||b||, tiny), over whole arrays."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    denom = max(np.linalg.norm(b.ravel()), 1e-300)
    return float(np.linalg.norm((a - b).ravel()) / denom)


def to_torch(x, requires_grad=False):
    import torch

    t = torch.from_numpy(np.array(x, copy=True))
    if requires_grad and t.is_floating_point():
        t.requires_grad_(True)
    return t


def spec_of(a):
    return mica.Spec(a.shape, mica.dtypes.as_dtype(a.dtype))


def mica_cli(*args, cwd=None, check=False):
    """`python -m mica.cli ARGS` in `cwd`, output captured; with check, a failure is an AssertionError."""
    r = subprocess.run([sys.executable, "-m", "mica.cli", *args], cwd=cwd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"mica {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r


def load_values(lib, module, arrays):
    """The same starting values in a Mica or a torch module: `arrays` ({state_dict key: numpy array})
    loaded by the library's own load_state_dict (keys left out keep their values)."""
    if lib is mica:
        module.load_state_dict(arrays, strict=False)
    else:
        import torch

        module.load_state_dict({k: torch.tensor(v) for k, v in arrays.items()}, strict=False)
