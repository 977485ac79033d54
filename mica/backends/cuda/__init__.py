"""The NVIDIA target (planned): the CUDA C renderer on the C-style base, its per-op lowerings, the
cuBLASLt product wrapper and the build. Here today: mica_cudasim.h, the CPU simulator that lets g++
compile and run the very CUDA C source nvcc builds (each CUDA thread a fiber, a block's fibers on
one OS thread, checked barriers and warp exchanges, launches through MICA_LAUNCH), so CI without a
GPU runs Mica's CUDA kernels:

    g++ -x c++ -std=c++17 -O1 -ffp-contract=off -I<this folder> kernel.cu -lboost_context -pthread

(-fsanitize=address and -DMICA_CUDASIM_RACECHECK for the checked builds; libboost-context-dev).
cudasim_bench.cpp measures the simulator's speed, cudasim_switch_bench.cpp its fibers against
ucontext; tests/test_cudasim.py is its test."""
