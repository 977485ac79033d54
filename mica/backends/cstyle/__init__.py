"""What the C-style targets (C for CPUs, CUDA C for NVIDIA cards) share: the type map and
literals (types.py), the expression writer and index arithmetic (expr.py), and the math every
kernel calls (mica_math.h, __host__ __device__ under nvcc)."""
