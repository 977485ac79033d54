"""The NVIDIA target (planned): the CUDA C renderer on the C-style base, its per-op lowerings, the
cuBLASLt product wrapper and the build, and — here today — mica_cudasim.h, the CPU simulator that
lets g++ compile and run the very CUDA C source nvcc builds (each CUDA thread a fiber, a block's
fibers on one OS thread, checked barriers and warp exchanges), so CI without a GPU runs Mica's
CUDA kernels. cudasim_bench.cpp measures the simulator."""
