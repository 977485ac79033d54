// Planted bugs: each mode must abort with one line from the simulator (or AddressSanitizer).
// Usage: bugs MODE
#include "mica_cudasim.h"
#include <cstdio>
#include <cstring>

__global__ void divergent(float* out) {
    __shared__ float sh[64];
    const int t = threadIdx.x;
    sh[t] = (float)t;
    if (t < 32) {
        __syncthreads();  // @divergent_a
        out[t] = sh[63 - t];
    } else {
        __syncthreads();  // @divergent_b
        out[t] = sh[t - 32];
    }
}

__global__ void barrier_after_exit(const float* x, float* out, int n) {
    __shared__ float sh[128];
    const int t = threadIdx.x;
    if (t >= n) return;  /* the bug: these threads never reach the barrier below */
    sh[t] = x[t];
    __syncthreads();  // @exited_barrier
    out[t] = sh[n - 1 - t];
}

__global__ void shuffle_exited(float* out) {
    const int t = threadIdx.x;
    if (t % 32 >= 16) return;
    float v = (float)t;
    v += __shfl_down_sync(0xffffffffu, v, 8);  // @exited_shuffle
    out[t] = v;
}

__global__ void shuffle_sites(float* out) {
    const int t = threadIdx.x;
    float v = (float)t;
    if (t % 2) v += __shfl_xor_sync(0xffffffffu, v, 1);  // @sites_odd
    else v += __shfl_xor_sync(0xffffffffu, v, 1);  // @sites_even
    out[t] = v;
}

__global__ void shuffle_vs_barrier(float* out) {
    const int t = threadIdx.x;
    float v = (float)t;
    if (t == 5) __syncthreads();  // @vs_barrier
    else v = __shfl_sync(0xffffffffu, v, 0);  // @vs_shuffle
    out[t] = v;
}

/* 48 threads: the second warp has 16 lanes, and its lane 0 reads lane 16 */
__global__ void partial_warp(float* out) {
    float v = (float)threadIdx.x;
    v += __shfl_down_sync(0xffffffffu, v, 16);  // @partial
    out[threadIdx.x] = v;
}

/* lanes 0-15 shuffle among themselves, but lane 3 reads lane 20 */
__global__ void outside_mask(float* out) {
    const int t = threadIdx.x;
    if (t < 16) out[t] = __shfl_sync(0x0000ffffu, (float)t, t == 3 ? 20 : 0);  // @outside
}

__global__ void oob(float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 1.0f;  /* the bug: <= */
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const char* m = argv[1];
    float *x, *out;
    cudaMalloc(&x, 128 * sizeof(float));
    cudaMalloc(&out, 128 * sizeof(float));
    cudaMemset(x, 0, 128 * sizeof(float));
    if (!strcmp(m, "divergent")) MICA_LAUNCH(divergent, 1, 64, 0, 0, out);
    else if (!strcmp(m, "exited_barrier")) MICA_LAUNCH(barrier_after_exit, 1, 128, 0, 0, x, out, 100);
    else if (!strcmp(m, "exited_shuffle")) MICA_LAUNCH(shuffle_exited, 1, 64, 0, 0, out);
    else if (!strcmp(m, "shuffle_sites")) MICA_LAUNCH(shuffle_sites, 1, 32, 0, 0, out);
    else if (!strcmp(m, "shuffle_vs_barrier")) MICA_LAUNCH(shuffle_vs_barrier, 1, 32, 0, 0, out);
    else if (!strcmp(m, "partial_warp")) MICA_LAUNCH(partial_warp, 1, 48, 0, 0, out);
    else if (!strcmp(m, "outside_mask")) MICA_LAUNCH(outside_mask, 1, 32, 0, 0, out);
    else if (!strcmp(m, "oob")) MICA_LAUNCH(oob, 5, 32, 0, 0, out, 128);
    else if (!strcmp(m, "none")) MICA_LAUNCH(oob, 5, 32, 0, 0, out, 127);
    else return 2;
    cudaDeviceSynchronize();
    printf("finished %s\n", m);
    cudaFree(x);
    cudaFree(out);
    return 0;
}
