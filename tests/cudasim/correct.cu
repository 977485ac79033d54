// Correct CUDA kernels, built by nvcc and by g++ with mica_cudasim.h; each mode prints values
// that tests/test_cudasim.py checks. Usage: correct MODE
#include "mica_cudasim.h"
#include "mica_math.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(3); } } while (0)

static unsigned bits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
/* inputs both sides can compute exactly: numpy float32 gives the same bits */
static float input(int i) { return (float)((i * 7919) % 10007) / 10007.0f - 0.5f; }

/* (a) block tree reduction over any blockDim.x: pairs (t, t+s) for s = pow2ceil(n)/2 ... 1 */
__global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float sh[1024];
    const int t = threadIdx.x;
    sh[t] = x[blockIdx.x * n + t];
    __syncthreads();
    int p = 1;
    while (p < n) p <<= 1;
    for (int s = p / 2; s > 0; s >>= 1) {
        if (t < s && t + s < n) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}

/* (b) warp shuffles: each warp's tree by __shfl_down_sync, then warp 0 over the warps' sums */
__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__global__ void shuffle_sum(const float* x, float* out, float* warp_out) {
    __shared__ float partial[32];
    const int t = threadIdx.x, lane = t % 32, w = t / 32;
    float v = warp_sum(x[blockIdx.x * blockDim.x + t]);
    if (lane == 0) { partial[w] = v; warp_out[blockIdx.x * 32 + w] = v; }
    __syncthreads();
    if (w == 0) {
        float u = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.0f;
        u = warp_sum(u);
        if (lane == 0) out[blockIdx.x] = u;
    }
}
/* other shuffles and types: butterfly total (int), inclusive scan (long long), broadcast within
 * 8-lane segments (double), a half-warp mask, unsigned rotate by __shfl_sync */
__global__ void shuffle_kinds(int* xor_total, long long* scan, double* seg, unsigned* rot, float* half) {
    const int t = threadIdx.x;
    int a = t + 1;
    for (int m = 16; m > 0; m >>= 1) a += __shfl_xor_sync(0xffffffffu, a, m);
    xor_total[t] = a;
    long long s = (long long)t * 1000000007LL;
    for (int d = 1; d < 32; d <<= 1) {
        long long o = __shfl_up_sync(0xffffffffu, s, d);
        if ((t % 32) >= d) s += o;
    }
    scan[t] = s;
    seg[t] = __shfl_sync(0xffffffffu, (double)t + 0.25, 3, 8);
    rot[t] = __shfl_sync(0xffffffffu, (unsigned)(t * 3u), (t + 1) % 32);
    float h = 0.0f;
    if (t % 32 < 16) h = __shfl_down_sync(0x0000ffffu, (float)t, 1, 16);
    half[t] = h;
}

/* (c) votes */
__global__ void votes(unsigned* ballot, int* all_, int* any_, int* count, unsigned* lowhalf) {
    const int t = threadIdx.x, w = t / 32;
    const int p = (t % 3 == 0);
    unsigned b = __ballot_sync(0xffffffffu, p);
    int al = __all_sync(0xffffffffu, t < 1000);
    int an = __any_sync(0xffffffffu, t == 70);
    int c = __syncthreads_count(p);
    unsigned lh = 0;
    if (t % 32 < 16) lh = __ballot_sync(0x0000ffffu, t % 2);
    if (t % 32 == 0) { ballot[w] = b; all_[w] = al; any_[w] = an; lowhalf[w] = lh; }
    if (t == 0) *count = c;
}

/* (d) atomics from every thread of every block */
__global__ void atomics(int* count, float* fsum, double* dsum, int* maxv, unsigned* cas_count, int* exch) {
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(fsum, 1.0f);
    atomicAdd(dsum, 0.5);
    atomicMax(maxv, (g * 37) % 10007);
    unsigned old = *cas_count, seen;
    while ((seen = atomicCAS(cas_count, old, old + 2u)) != old) old = seen;
    atomicExch(exch, 42);
}

/* (e) grid-stride axpy */
__global__ void axpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + y[i];
}

/* (g) streams, graphs; dynamic shared memory */
__global__ void add_index(float* v, int n, float scale) {
    MICA_EXTERN_SHARED(float, buf);
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    buf[t] = i < n ? (float)i * scale : 0.0f;
    __syncthreads();
    if (i < n) v[i] += buf[blockDim.x - 1 - t] + buf[t] - buf[blockDim.x - 1 - t];
}

/* Mica's own math (mica_math.h, MICA_HD) in a kernel: the same bits as on the host */
__global__ void mica_math(const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = 8.0f * x[i];
        y[4 * i + 0] = mica_exp_f32(v);
        y[4 * i + 1] = mica_tanh_f32(v);
        y[4 * i + 2] = mica_erf_f32(v);
        y[4 * i + 3] = mica_gelu_f32(v);
    }
}

/* a template kernel: MICA_LAUNCH takes it in parentheses */
template <class T, int K>
__global__ void scale(T* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= (T)K;
}

/* 2D/3D coordinates */
__global__ void coords(int* out) {
    const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[bx * blockDim.x * blockDim.y * blockDim.z + tx] = 1000 * bx + tx;
}

static int mode_reduce() {
    const int sizes[] = {1, 2, 3, 31, 32, 33, 64, 100, 255, 256, 1000, 1023, 1024};
    const int blocks = 5;
    for (int n : sizes) {
        std::vector<float> h(blocks * n), out(blocks);
        for (int i = 0; i < blocks * n; ++i) h[i] = input(i);
        float *dx, *dout;
        CHECK(cudaMalloc(&dx, h.size() * 4));
        CHECK(cudaMalloc(&dout, blocks * 4));
        CHECK(cudaMemcpy(dx, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        MICA_LAUNCH(block_sum, blocks, n, 0, 0, dx, dout, n);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(out.data(), dout, blocks * 4, cudaMemcpyDeviceToHost));
        printf("reduce n=%d", n);
        for (int b = 0; b < blocks; ++b) printf(" %08x", bits(out[b]));
        printf("\n");
        cudaFree(dx);
        cudaFree(dout);
    }
    return 0;
}

static int mode_shuffle() {
    const int sizes[] = {32, 64, 96, 256, 1024};
    const int blocks = 3;
    for (int n : sizes) {
        std::vector<float> h(blocks * n), out(blocks), wout(blocks * 32);
        for (int i = 0; i < blocks * n; ++i) h[i] = input(i);
        float *dx, *dout, *dw;
        CHECK(cudaMalloc(&dx, h.size() * 4));
        CHECK(cudaMalloc(&dout, blocks * 4));
        CHECK(cudaMalloc(&dw, blocks * 32 * 4));
        CHECK(cudaMemcpy(dx, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        MICA_LAUNCH(shuffle_sum, blocks, n, 0, 0, dx, dout, dw);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(out.data(), dout, blocks * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(wout.data(), dw, blocks * 32 * 4, cudaMemcpyDeviceToHost));
        printf("shuffle n=%d", n);
        for (int b = 0; b < blocks; ++b) printf(" %08x", bits(out[b]));
        printf(" warps");
        for (int b = 0; b < blocks; ++b)
            for (int w = 0; w < n / 32; ++w) printf(" %08x", bits(wout[b * 32 + w]));
        printf("\n");
        cudaFree(dx); cudaFree(dout); cudaFree(dw);
    }
    const int n = 64;
    int* xt; long long* sc; double* sg; unsigned* rt; float* hf;
    CHECK(cudaMalloc(&xt, n * 4)); CHECK(cudaMalloc(&sc, n * 8)); CHECK(cudaMalloc(&sg, n * 8));
    CHECK(cudaMalloc(&rt, n * 4)); CHECK(cudaMalloc(&hf, n * 4));
    MICA_LAUNCH(shuffle_kinds, 1, n, 0, 0, xt, sc, sg, rt, hf);
    CHECK(cudaGetLastError());
    std::vector<int> hx(n); std::vector<long long> hs(n); std::vector<double> hg(n); std::vector<unsigned> hr(n);
    std::vector<float> hh(n);
    cudaMemcpy(hx.data(), xt, n * 4, cudaMemcpyDeviceToHost); cudaMemcpy(hs.data(), sc, n * 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(hg.data(), sg, n * 8, cudaMemcpyDeviceToHost); cudaMemcpy(hr.data(), rt, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hh.data(), hf, n * 4, cudaMemcpyDeviceToHost);
    printf("xor"); for (int v : hx) printf(" %d", v); printf("\n");
    printf("scan"); for (long long v : hs) printf(" %lld", v); printf("\n");
    printf("seg"); for (double v : hg) printf(" %g", v); printf("\n");
    printf("rot"); for (unsigned v : hr) printf(" %u", v); printf("\n");
    printf("half"); for (float v : hh) printf(" %g", v); printf("\n");
    cudaFree(xt); cudaFree(sc); cudaFree(sg); cudaFree(rt); cudaFree(hf);
    return 0;
}

static int mode_votes() {
    const int n = 96, nw = 3;
    unsigned *b, *lh; int *al, *an, *c;
    CHECK(cudaMalloc(&b, nw * 4)); CHECK(cudaMalloc(&lh, nw * 4)); CHECK(cudaMalloc(&al, nw * 4));
    CHECK(cudaMalloc(&an, nw * 4)); CHECK(cudaMalloc(&c, 4));
    MICA_LAUNCH(votes, 1, n, 0, 0, b, al, an, c, lh);
    CHECK(cudaGetLastError());
    unsigned hb[nw], hl[nw]; int ha[nw], hn[nw], hc;
    cudaMemcpy(hb, b, sizeof hb, cudaMemcpyDeviceToHost); cudaMemcpy(hl, lh, sizeof hl, cudaMemcpyDeviceToHost);
    cudaMemcpy(ha, al, sizeof ha, cudaMemcpyDeviceToHost); cudaMemcpy(hn, an, sizeof hn, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hc, c, 4, cudaMemcpyDeviceToHost);
    for (int w = 0; w < nw; ++w) printf("warp %d ballot %08x all %d any %d lowhalf %08x\n", w, hb[w], ha[w], hn[w], hl[w]);
    printf("count %d\n", hc);
    cudaFree(b); cudaFree(lh); cudaFree(al); cudaFree(an); cudaFree(c);
    return 0;
}

static int mode_atomics() {
    const int blocks = 64, threads = 256;
    int *count, *maxv, *exch; float* fsum; double* dsum; unsigned* cas;
    CHECK(cudaMalloc(&count, 4)); CHECK(cudaMalloc(&maxv, 4)); CHECK(cudaMalloc(&exch, 4));
    CHECK(cudaMalloc(&fsum, 4)); CHECK(cudaMalloc(&dsum, 8)); CHECK(cudaMalloc(&cas, 4));
    CHECK(cudaMemset(count, 0, 4)); CHECK(cudaMemset(fsum, 0, 4)); CHECK(cudaMemset(dsum, 0, 8));
    CHECK(cudaMemset(cas, 0, 4)); CHECK(cudaMemset(exch, 0, 4));
    int m0 = -1;
    CHECK(cudaMemcpy(maxv, &m0, 4, cudaMemcpyHostToDevice));
    MICA_LAUNCH(atomics, blocks, threads, 0, 0, count, fsum, dsum, maxv, cas, exch);
    CHECK(cudaGetLastError());
    int hc, hm, he; float hf; double hd; unsigned hcas;
    cudaMemcpy(&hc, count, 4, cudaMemcpyDeviceToHost); cudaMemcpy(&hm, maxv, 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&he, exch, 4, cudaMemcpyDeviceToHost); cudaMemcpy(&hf, fsum, 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hd, dsum, 8, cudaMemcpyDeviceToHost); cudaMemcpy(&hcas, cas, 4, cudaMemcpyDeviceToHost);
    printf("count %d fsum %.1f dsum %.1f max %d cas %u exch %d\n", hc, hf, hd, hm, hcas, he);
    cudaFree(count); cudaFree(maxv); cudaFree(exch); cudaFree(fsum); cudaFree(dsum); cudaFree(cas);
    return 0;
}

static int mode_axpy() {
    const int n = 10007;
    const int configs[][2] = {{1, 1}, {1, 32}, {3, 64}, {7, 100}, {40, 256}, {20, 1024}};
    std::vector<float> hx(n), hy(n), out(n);
    for (int i = 0; i < n; ++i) { hx[i] = input(i); hy[i] = input(i + 12345); }
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * 4)); CHECK(cudaMalloc(&dy, n * 4));
    CHECK(cudaMemcpy(dx, hx.data(), n * 4, cudaMemcpyHostToDevice));
    for (auto& c : configs) {
        CHECK(cudaMemcpy(dy, hy.data(), n * 4, cudaMemcpyHostToDevice));
        MICA_LAUNCH(axpy, c[0], c[1], 0, 0, n, 0.3f, dx, dy);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(out.data(), dy, n * 4, cudaMemcpyDeviceToHost));
        unsigned long long sum = 0;
        for (int i = 0; i < n; ++i) sum += bits(out[i]);
        printf("axpy grid=%d block=%d bitsum=%llu first=%08x last=%08x\n", c[0], c[1], sum, bits(out[0]), bits(out[n - 1]));
    }
    cudaFree(dx); cudaFree(dy);
    return 0;
}

static int mode_graph() {
    const int n = 300, block = 128, grid = (n + block - 1) / block;
    float *dv;
    std::vector<float> hv(n);
    CHECK(cudaMalloc(&dv, n * 4));
    cudaStream_t s;
    cudaEvent_t e0, e1;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
    CHECK(cudaMemsetAsync(dv, 0, n * 4, s));
    CHECK(cudaEventRecord(e0, s));
    MICA_LAUNCH(add_index, grid, block, block * sizeof(float), s, dv, n, 1.0f);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventSynchronize(e1));
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaMemcpyAsync(hv.data(), dv, n * 4, cudaMemcpyDeviceToHost, s));
    printf("stream v[0]=%g v[299]=%g elapsed_ok=%d\n", hv[0], hv[299], ms >= 0.0f);

    /* capture: two launches and a host-visible copy, replayed three times */
    float* mirror;
    CHECK(cudaMalloc(&mirror, n * 4));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    MICA_LAUNCH(add_index, grid, block, block * sizeof(float), s, dv, n, 1.0f);
    MICA_LAUNCH(add_index, grid, block, block * sizeof(float), s, dv, n, 0.5f);
    CHECK(cudaMemcpyAsync(mirror, dv, n * 4, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    CHECK(cudaMemcpy(hv.data(), dv, n * 4, cudaMemcpyDeviceToHost));
    printf("captured nodes=%zu v[299] after capture=%g\n", nodes, hv[299]);
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(hv.data(), mirror, n * 4, cudaMemcpyDeviceToHost));
    printf("replayed v[0]=%g v[1]=%g v[299]=%g\n", hv[0], hv[1], hv[299]);
    CHECK(cudaGraphExecDestroy(ge)); CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(e0)); CHECK(cudaEventDestroy(e1)); CHECK(cudaStreamDestroy(s));
    cudaFree(dv); cudaFree(mirror);
    return 0;
}

static int mode_math() {
    const int n = 1000;
    std::vector<float> hx(n), hy(4 * n);
    for (int i = 0; i < n; ++i) hx[i] = input(i);
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * 4)); CHECK(cudaMalloc(&dy, 4 * n * 4));
    CHECK(cudaMemcpy(dx, hx.data(), n * 4, cudaMemcpyHostToDevice));
    MICA_LAUNCH(mica_math, 3, 128, 0, 0, dx, dy, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(hy.data(), dy, 4 * n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) {
        const float v = 8.0f * hx[i];
        bad += bits(hy[4 * i]) != bits(mica_exp_f32(v)) || bits(hy[4 * i + 1]) != bits(mica_tanh_f32(v)) ||
               bits(hy[4 * i + 2]) != bits(mica_erf_f32(v)) || bits(hy[4 * i + 3]) != bits(mica_gelu_f32(v));
    }
    printf("math host mismatches %d\n", bad);
    for (int i = 0; i < 8; ++i)
        printf("x %08x exp %08x tanh %08x erf %08x gelu %08x\n", bits(8.0f * hx[i]), bits(hy[4 * i]),
               bits(hy[4 * i + 1]), bits(hy[4 * i + 2]), bits(hy[4 * i + 3]));
    cudaFree(dx); cudaFree(dy);
    return 0;
}

static int mode_device() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
#ifdef MICA_CUDASIM
    const int simulated = 1;
#else
    const int simulated = 0;
#endif
    printf("devices %d name %s warp %d maxthreads %d simulated %d\n", count, p.name, p.warpSize,
           p.maxThreadsPerBlock, simulated);
    /* a bad launch configuration is an error code, as on the card */
    int* d;
    CHECK(cudaMalloc(&d, 4));
    MICA_LAUNCH(coords, 1, 1025, 0, 0, d);
    cudaError_t e = cudaGetLastError();
    printf("launch 1025 threads: %s (%s); then %s\n", cudaGetErrorName(e), cudaGetErrorString(e),
           cudaGetErrorName(cudaGetLastError()));
    MICA_LAUNCH(add_index, 1, 32, 64 * 1024, 0, (float*)nullptr, 0, 1.0f);
    printf("launch 64 KiB dynamic shared: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaFuncSetAttribute(add_index, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    MICA_LAUNCH(add_index, 1, 32, 64 * 1024, 0, (float*)nullptr, 0, 1.0f);
    printf("after cudaFuncSetAttribute: %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaFree(d);
    /* 2D grid, 3D block */
    const dim3 grid(3, 2, 2), block(4, 2, 3);
    const int total = 12 * 24;
    int* c;
    CHECK(cudaMalloc(&c, total * 4));
    MICA_LAUNCH(coords, grid, block, 0, 0, c);
    CHECK(cudaGetLastError());
    std::vector<int> h(total);
    cudaMemcpy(h.data(), c, total * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int b = 0; b < 12; ++b)
        for (int t = 0; t < 24; ++t) bad += h[b * 24 + t] != 1000 * b + t;
    printf("coords bad=%d\n", bad);
    MICA_LAUNCH((scale<int, 3>), 12, 24, 0, 0, c, total);
    CHECK(cudaGetLastError());
    cudaMemcpy(h.data(), c, total * 4, cudaMemcpyDeviceToHost);
    printf("scale<int, 3> c[25]=%d\n", h[25]);
    cudaFree(c);
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const char* m = argv[1];
    if (!strcmp(m, "reduce")) return mode_reduce();
    if (!strcmp(m, "shuffle")) return mode_shuffle();
    if (!strcmp(m, "votes")) return mode_votes();
    if (!strcmp(m, "atomics")) return mode_atomics();
    if (!strcmp(m, "axpy")) return mode_axpy();
    if (!strcmp(m, "graph")) return mode_graph();
    if (!strcmp(m, "device")) return mode_device();
    if (!strcmp(m, "math")) return mode_math();
    fprintf(stderr, "unknown mode %s\n", m);
    return 2;
}
