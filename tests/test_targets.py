"""A target is a plug-in: one shared pipeline (simplify, order, fuse, plan) serves every target,
the CPU step's bits did not move when the pipeline was lifted out of the C backend, and they do
not depend on the building machine's core count."""
import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

import mica
from mica.errors import MicaError
from mica.models.gpt import GPT, GPTConfig, loss_fn

DIGESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "step_digests.json")


def step_program():
    """nanoGPT's step with dropout, clipping and AdamW, large enough that products are tiled."""
    cfg = GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=128, dropout=0.1, bias=False)
    model = GPT(cfg)
    params = model.init(seed=5)
    groups = mica.optim.nanogpt_param_groups(params, weight_decay=0.1)
    opt = mica.optim.adamw(lr=1e-3, betas=(0.9, 0.95), param_groups=groups)
    state = opt.init(params)

    def step(params, state, idx, targets):
        loss, grads = mica.value_and_grad(loss_fn(model))(params, idx, targets)
        norm = mica.optim.clip_grad_norm(grads, 1.0)
        new_params, new_state = opt.update(params, grads, state, lr=1e-3)
        return new_params, new_state, {"loss": loss, "norm": norm}

    rng = np.random.default_rng(1)
    B, T = 4, 64
    batch = rng.integers(0, 65, (B, T)), rng.integers(0, 65, (B, T))
    model.train()
    specs = (model.param_specs(), opt.state_specs(model.param_specs()), mica.i64[B, T], mica.i64[B, T])
    return mica.trace(step, *specs), params, state, batch


def digest(outs):
    h = hashlib.sha256()
    for leaf in mica.pytree.flatten(outs)[0]:
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()[:16]


def machine():
    """What the bits may depend on: OpenBLAS's kernel family, gcc's -march=native, gcc's version."""
    import ctypes

    import scipy_openblas32

    lib_dir = scipy_openblas32.get_lib_dir()
    lib = ctypes.CDLL(os.path.join(lib_dir, next(f for f in os.listdir(lib_dir) if ".so" in f)))
    lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
    core = lib.scipy_openblas_get_corename().decode()
    out = subprocess.run(["gcc", "-march=native", "-Q", "--help=target"], capture_output=True, text=True).stdout
    march = next((line.split()[-1] for line in out.splitlines() if line.strip().startswith("-march=")), "?")
    version = subprocess.run(["gcc", "-dumpversion"], capture_output=True, text=True).stdout.strip()
    return f"{core}/{march}/gcc{version}"


@pytest.fixture(scope="module")
def gpt():
    return step_program()


def test_the_cpu_steps_bits_are_those_recorded_before_the_pipeline_moved(gpt):
    program, params, state, batch = gpt
    got = digest(program.lower("cpu", opt_level=2).build()(params, state, *batch, threads=2, seed=7))
    recorded = json.load(open(DIGESTS))
    if machine() not in recorded:
        pytest.skip(f"no digest recorded for this machine ({machine()}); recorded: {', '.join(recorded)}")
    assert got == recorded[machine()]


def test_the_bits_do_not_depend_on_the_building_machines_cores(gpt, monkeypatch):
    program, params, state, batch = gpt
    digests = set()
    for cores in (2, 4, 16):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        lowered = program.lower("cpu", opt_level=2)
        digests.add(digest(lowered.build()(params, state, *batch, threads=2, seed=7)))
    assert len(digests) == 1, digests


class PlainC(__import__("mica.backends.c", fromlist=["CTarget"]).CTarget):
    """A test-only second target: the C target with 256-byte alignment and products that carry no
    epilogue. It plugs into the same pipeline by answering two questions differently."""

    name = "c-plain"
    align = 256

    def product_epilogue(self, gemm, loop):
        return False


def test_a_second_target_is_a_plug_in(gpt):
    from helpers import rel_err
    from mica.passes.schedule import Gemm
    from mica.targets import register_target

    register_target("c-plain", PlainC)
    program, params, state, batch = gpt
    plain, cpu = program.lower("c-plain", opt_level=2), program.lower("cpu", opt_level=2)
    assert all(offset % 256 == 0 for offset in plain.plan.offsets.values())
    assert any(k.epilogue for k in cpu.schedule.kernels if isinstance(k, Gemm))
    assert not any(k.epilogue for k in plain.schedule.kernels if isinstance(k, Gemm))
    new_params, new_state, m = plain.build()(params, state, *batch, threads=2, seed=7)
    want_params, want_state, want = mica.reference.run(program, params, state, *batch, seed=7)
    assert rel_err(m["loss"], want["loss"]) < 1e-5 and rel_err(m["norm"], want["norm"]) < 1e-5
    for name in params:
        assert rel_err(new_params[name], want_params[name]) < 1e-4, name
        assert rel_err(new_state["exp_avg"][name], want_state["exp_avg"][name]) < 1e-4, name


def test_shared_passes_name_no_target_and_no_kernels_calling_convention():
    """The pipeline's own modules mention no target, product library or kernel primitive: what
    differs is asked of the Target, and a kernel's ABI is data on its op record."""
    import ast

    from mica.ops import OPS

    root = os.path.dirname(os.path.dirname(os.path.abspath(mica.__file__)))
    shared = [os.path.join(root, "mica", "lower.py")]
    shared += [os.path.join(root, "mica", "passes", f) for f in os.listdir(os.path.join(root, "mica", "passes"))
               if f.endswith(".py")]
    kernels = {name for name, op in OPS.items() if op.family == "kernel"}
    forbidden = kernels | {"cpu", "cuda", "c", "openblas", "blas", "cublas", "omp"}
    for path in shared:
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value.lower() not in forbidden, f"{os.path.basename(path)}:{node.lineno}: {node.value!r}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = getattr(node, "module", None) or ""
                names = [f"{module}.{a.name}" for a in node.names]
                targets = [n for n in names if "backends" in n and "reference" not in n]  # the oracle is no target
                assert not targets, f"{os.path.basename(path)}:{node.lineno} imports a backend: {targets}"


def test_the_shared_math_compiles_as_device_code(tmp_path):
    """mica_math.h is written once for every target: nvcc compiles it into a kernel (and into host
    code beside it) with warnings as errors and no FMA contraction."""
    import shutil

    nvcc = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    from mica.backends.c.emit import SHARED_DIR

    src = tmp_path / "math.cu"
    src.write_text("""
#include "mica_math.h"
__global__ void k(const float *x, float *y, const int64_t *rng, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = mica_gelu_f32(x[i]) + mica_gelu_slope_f32(x[i]) + mica_tanh_f32(x[i]) + mica_erf_f32(x[i])
                      + mica_log_f32(x[i] + 2.0f) + mica_exp_f32(x[i]) + mica_round_bf16(x[i]) + mica_round_f16(x[i])
                      + (float)mica_keep(rng, 1u, (uint64_t)i, 100u) + mica_sum_f32(x, n);
}
float host_side(float x) { return mica_gelu_f32(x); }
""")
    r = subprocess.run([nvcc, "-arch=sm_80", "--fmad=false", "-Werror", "all-warnings", "-I", SHARED_DIR, "-c",
                        str(src), "-o", str(tmp_path / "math.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_targets_options_are_checked_by_name_and_type():
    """A misspelt option, or one the target lacks, is a sentence naming the target's options, not
    Python's TypeError; simulate and tf32 take True or False, never a truthy string."""
    program = mica.trace(lambda w, x: (x @ w).sum(), mica.f32[4, 3], mica.f32[2, 4])
    with pytest.raises(MicaError, match=r"the cuda target has no option 'simulat'; its options are opt_level, "
                                        r"simulate, tf32, threads_per_block"):
        program.lower("cuda", simulat=True)
    with pytest.raises(MicaError, match="the cpu target has no option 'simulate'"):
        program.lower("cpu", simulate=True)
    for bad in ("False", "no", 0.5, 1):
        with pytest.raises(MicaError, match=f"simulate must be True or False, not {bad!r}"):
            program.lower("cuda", simulate=bad)
    with pytest.raises(MicaError, match="tf32 must be True or False, not 'yes'"):
        program.lower("cuda", tf32="yes")


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_every_value_the_source_names_is_one_of_lowered_ir(target):
    """The source's %N are the lowered graph's (the passes renumber program.ir): a reader chasing
    a buffer from the C or CUDA back to the graph finds it in lowered.ir, and the header says so."""
    import re

    def step(w, x):
        h = x * w
        m = h.mean(dim=1, keepdim=True)
        loss = (m * m).sum() + h.amax(dim=1).sum() + h.var(dim=0).sum()
        return loss, mica.grad(loss, w)

    lowered = mica.trace(step, mica.f32[6, 5], mica.f32[6, 5]).lower(target)
    named = set(re.findall(r"%(\d+)", lowered.source))
    defined = set(re.findall(r"^%(\d+)", lowered.ir, re.M))
    assert named and named <= defined, sorted(named - defined)
    assert "%N below names a value of lowered.ir" in lowered.source
    # a fused loop's comment names every line fused into it (the gradients of lines 2 to 4 join in one)
    first = step.__code__.co_firstlineno
    places = re.findall(r"^/\* k\d+: .*\(test_targets\.py:([\d, -]+)\)", lowered.source, re.M)
    assert any("," in p or "-" in p for p in places), places
    assert all(first < int(n) <= first + 5 for p in places for n in re.findall(r"\d+", p)), places
