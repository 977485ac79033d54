"""The NVIDIA target: CUDA C from the shared pipeline.

- target.py     what the target answers the pipeline (256-byte alignment, one stream, no product
                epilogues yet); `program.lower("cuda", simulate=False|True, tf32=False)`
- render.py     the CUDA renderer on the C-style base: grid-stride loops, thread-per-output
                reductions in the canonical order, copies, products as host calls
- lowerings.py  the kernel primitives' lowerings (the row kernels; attention not yet)
- mica_cuda.h, mica_cuda_kernels.h   the runtime of a generated program: launches, errors, the
                cuBLASLt product wrapper; the row kernels (8 cooperating threads per row)
- build.py      nvcc (a fatbin for sm_80/86/89/90/120 + PTX, --fmad=false) or g++ with the simulator
- mica_cudasim.h  the CPU simulator that lets g++ compile and run the very CUDA C source nvcc builds
                (each CUDA thread a fiber, a block's fibers on one OS thread, checked barriers and
                warp exchanges, launches through MICA_LAUNCH), so machines without a GPU run it:

    g++ -x c++ -std=c++17 -O1 -ffp-contract=off -I<this folder> kernel.cu -lboost_context -pthread

  (-fsanitize=address and -DMICA_CUDASIM_RACECHECK for the checked builds; libboost-context-dev).
  cudasim_bench.cpp measures the simulator's speed, cudasim_switch_bench.cpp its fibers against
  ucontext; tests/test_cudasim.py is its test, tests/test_cuda.py the target's.
"""


from .. import Switches

# torch.backends.cuda.matmul.allow_tf32 (torch's default False): the CUDA target's tf32 where a
# program does not choose it (target.py)
matmul = Switches("torch.backends.cuda.matmul", "TF32 products on a card where a program does not choose",
                  allow_tf32=False)


def __getattr__(name):  # (another torch.backends.cuda switch: a sentence)
    if name.startswith("_"):
        raise AttributeError(name)
    from .. import _switch

    raise _switch(f"torch.backends.cuda.{name}")
