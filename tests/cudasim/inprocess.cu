// Built as a shared library and called from Python through ctypes, as an in-process simulated
// Executable will be: launches, the OS thread pool and thread_local __shared__ inside a dlopen'd
// library.
#include "mica_cudasim.h"

__global__ void square_then_swap(const float* x, float* y, int n) {
    __shared__ float sh[128];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    sh[threadIdx.x] = i < n ? x[i] * x[i] : 0.0f;
    __syncthreads();
    const float partner = __shfl_xor_sync(0xffffffffu, sh[threadIdx.x], 1);
    if (i < n) y[i] = partner;
}

extern "C" int run(const float* hx, float* hy, int n) {
    float *x, *y;
    if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess || cudaMalloc(&y, n * sizeof(float)) != cudaSuccess) return -1;
    cudaMemcpy(x, hx, n * sizeof(float), cudaMemcpyHostToDevice);
    MICA_LAUNCH(square_then_swap, (n + 127) / 128, 128, 0, 0, x, y, n);
    const int err = (int)cudaGetLastError();
    cudaMemcpy(hy, y, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(x);
    cudaFree(y);
    return err;
}
