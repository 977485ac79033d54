// The simulator's speed: a trivial kernel (CUDA threads per second) and a 256x256x256 tiled
// matmul with shared memory and barriers (GFLOP/s). Not a test: timings vary with the machine.
//   g++ -x c++ -std=c++17 -O2 -ffp-contract=off -I. cudasim_bench.cpp -o bench -lboost_context -pthread
//   MICA_CUDASIM_THREADS=1 ./bench; MICA_CUDASIM_THREADS=2 ./bench
// Add -DBOOST_USE_UCONTEXT to measure the same simulator on ucontext (swapcontext) fibers.
#include "mica_cudasim.h"
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void add_one(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}

#define TILE 16
__global__ void matmul(const float* A, const float* B, float* C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < n; k0 += TILE) {
        As[ty][tx] = A[row * n + k0 + tx];
        Bs[ty][tx] = B[(k0 + ty) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    C[row * n + col] = acc;
}

__global__ void shuffle_sum(float* y) {
    float v = (float)threadIdx.x;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) y[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = v;
}

__global__ void barriers(float* y, int rounds) {
    __shared__ float sh[256];
    float v = (float)threadIdx.x;
    for (int r = 0; r < rounds; ++r) {
        sh[threadIdx.x] = v;
        __syncthreads();
        v = sh[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    y[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

static double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
    const int n = 1 << 22;
    float *x, *y;
    cudaMalloc(&x, n * 4);
    cudaMalloc(&y, n * 4);
    cudaMemset(x, 0, n * 4);
    MICA_LAUNCH(add_one, n / 256, 256, 0, 0, x, y, n);  // warm the stack pools
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
        double t0 = seconds();
        MICA_LAUNCH(add_one, n / 256, 256, 0, 0, x, y, n);
        best = std::min(best, seconds() - t0);
    }
    printf("trivial kernel: %.1f M CUDA threads/s\n", n / best / 1e6);

    best = 1e30;
    for (int r = 0; r < 3; ++r) {
        double t0 = seconds();
        MICA_LAUNCH(shuffle_sum, n / 256 / 4, 256, 0, 0, y);
        best = std::min(best, seconds() - t0);
    }
    printf("5 warp shuffles per thread: %.1f M CUDA threads/s\n", n / 4 / best / 1e6);

    best = 1e30;
    const int rounds = 50, bblocks = 64;
    for (int r = 0; r < 3; ++r) {
        double t0 = seconds();
        MICA_LAUNCH(barriers, bblocks, 256, 0, 0, y, rounds);
        best = std::min(best, seconds() - t0);
    }
    printf("__syncthreads: %.1f M thread-barriers/s (a fiber switch each)\n", 2.0 * rounds * bblocks * 256 / best / 1e6);

    const int m = 256;
    std::vector<float> ha(m * m), hb(m * m), hc(m * m);
    for (int i = 0; i < m * m; ++i) { ha[i] = (float)(i % 17) - 8.0f; hb[i] = (float)(i % 13) - 6.0f; }
    float *a, *b, *c;
    cudaMalloc(&a, m * m * 4); cudaMalloc(&b, m * m * 4); cudaMalloc(&c, m * m * 4);
    cudaMemcpy(a, ha.data(), m * m * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), m * m * 4, cudaMemcpyHostToDevice);
    best = 1e30;
    for (int r = 0; r < 3; ++r) {
        double t0 = seconds();
        MICA_LAUNCH(matmul, dim3(m / TILE, m / TILE), dim3(TILE, TILE), 0, 0, a, b, c, m);
        best = std::min(best, seconds() - t0);
    }
    cudaMemcpy(hc.data(), c, m * m * 4, cudaMemcpyDeviceToHost);
    int bad = 0;  // small integers: the products are exact
    for (int i = 0; i < m; i += 7)
        for (int j = 0; j < m; j += 5) {
            float s = 0.0f;
            for (int k = 0; k < m; ++k) s += ha[i * m + k] * hb[k * m + j];
            bad += s != hc[i * m + j];
        }
    printf("tiled matmul 256^3 (16x16 tiles, %d barriers per thread): %.3f GFLOP/s, %.1f ms, wrong=%d\n",
           2 * m / TILE, 2.0 * m * m * m / best / 1e9, best * 1e3, bad);
    return bad != 0;
}
