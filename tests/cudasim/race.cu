// The opt-in shared-memory race check (build with -DMICA_CUDASIM_RACECHECK). Usage: race MODE
#include "mica_cudasim.h"
#include <cstdio>
#include <cstring>

/* the tree reduction of correct.cu with its barriers: no race */
__global__ void tree(const float* x, float* out, int n) {
    MICA_SHARED_ARRAY(float, sh, 256);
    const int t = threadIdx.x;
    sh[t] = x[blockIdx.x * n + t];
    __syncthreads();
    for (int s = n / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}

/* the same with the barrier inside the loop missing: thread t reads sh[t + s] before (or after)
 * thread t + s has updated it; the GPU gives a value that depends on timing */
__global__ void tree_missing_sync(const float* x, float* out, int n) {
    MICA_SHARED_ARRAY(float, sh, 256);
    const int t = threadIdx.x;
    sh[t] = x[blockIdx.x * n + t];
    __syncthreads();
    for (int s = n / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];  // @missing
    }
    __syncthreads();
    if (t == 0) out[blockIdx.x] = sh[0];
}

/* the barrier after loading the tile missing: a read of another thread's write */
__global__ void stale_read(const float* x, float* out) {
    MICA_SHARED_ARRAY(float, tile, 64);
    const int t = threadIdx.x;
    tile[63 - t] = x[t];  // @stale
    out[t] = tile[t];
}

/* warp-synchronous exchange ordered by __syncwarp: no race */
__global__ void warp_exchange(const float* x, float* out) {
    MICA_SHARED_ARRAY(float, buf, 64);
    const int t = threadIdx.x;
    buf[t] = x[t];
    __syncwarp();
    const int partner = (t & ~31) + (31 - (t & 31));
    float v = buf[partner];
    __syncwarp();
    buf[t] = v * 2.0f;
    __syncthreads();
    out[t] = buf[63 - t];
}

/* an overrun of a static shared array: ASan cannot see thread_local storage, the check can */
__global__ void overrun(float* out) {
    MICA_SHARED_ARRAY(float, tile, 64);
    const int t = threadIdx.x;
    tile[t + 1] = 1.0f;  // @overrun
    __syncthreads();
    out[t] = tile[t];
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const char* m = argv[1];
    const int n = 256;
    float *x, *out;
    cudaMalloc(&x, 2 * n * sizeof(float));
    cudaMalloc(&out, 2 * n * sizeof(float));
    float h[2 * n];
    for (int i = 0; i < 2 * n; ++i) h[i] = (float)(i % 7);
    cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
    if (!strcmp(m, "clean")) {
        MICA_LAUNCH(tree, 2, n, 0, 0, x, out, n);
        float r[2];
        cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost);
        MICA_LAUNCH(warp_exchange, 1, 64, 0, 0, x, out);
        float w[64];
        cudaMemcpy(w, out, sizeof w, cudaMemcpyDeviceToHost);
        printf("clean sums %g %g exchange %g %g\n", r[0], r[1], w[0], w[63]);
    } else if (!strcmp(m, "missing_sync")) {
        MICA_LAUNCH(tree_missing_sync, 1, n, 0, 0, x, out, n);  /* one block: one report */
    } else if (!strcmp(m, "overrun")) {
        MICA_LAUNCH(overrun, 1, 64, 0, 0, out);
    } else if (!strcmp(m, "stale_read")) {
        MICA_LAUNCH(stale_read, 1, 64, 0, 0, x, out);
    } else {
        return 2;
    }
    cudaDeviceSynchronize();
    printf("finished %s\n", m);
    return 0;
}
