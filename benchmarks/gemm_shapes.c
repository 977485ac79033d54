/* Products of nanoGPT's CPU config (B*T = 768 tokens, C = 128, 4C = 512, vocab 65), forward and
 * both backward products, timed for three implementations, each deterministic across threads:
 *   own      Mica's packed AVX2/AVX-512 kernel, threads over fixed output tiles (mica_gemm.h)
 *   openblas OpenBLAS (scipy-openblas32), one single-threaded call per fixed row tile
 *   mkl      MKL (mkl-devel), one single-threaded call per fixed row tile
 * Rounds alternate the implementations; the best time of each round is kept, the median of the
 * rounds reported. Build and run with benchmarks/gemm.py. */
#include "mica_gemm.h"
#include <dlfcn.h>
#include <time.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static float *A, *B, *C, *packed, *scratch;
static int shapes[][5] = {
    {768, 384, 128, 0, 1}, {768, 128, 128, 0, 1}, {768, 512, 128, 0, 1}, {768, 128, 512, 0, 1}, {768, 65, 128, 0, 1},
    {768, 128, 384, 0, 0}, {768, 128, 128, 0, 0}, {768, 128, 512, 0, 0}, {768, 512, 128, 0, 0}, {768, 128, 65, 0, 0},
    {384, 128, 768, 1, 0}, {128, 128, 768, 1, 0}, {512, 128, 768, 1, 0}, {128, 512, 768, 1, 0}, {65, 128, 768, 1, 0}};
#define NS (int)(sizeof shapes / sizeof shapes[0])

static void tiled(sgemm_fn f, int M, int N, int K, int ta, int tb) {
    int lda = ta ? M : K, ldb = tb ? K : N, tiles = getenv("TILES") ? atoi(getenv("TILES")) : 8;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        int m0 = M * t / tiles, m1 = M * (t + 1) / tiles;
        f(101, ta ? 112 : 111, tb ? 112 : 111, m1 - m0, N, K, 1.0f, ta ? A + m0 : A + (size_t)m0 * lda, lda, B, ldb,
          0.0f, C + (size_t)m0 * N, N);
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5, reps = 30;
    sgemm_fn impl[3] = {0, 0, 0};
    const char *names[3] = {"own", "openblas", "mkl"};
    for (int i = 1; i < 3; i++) {
        const char *path = getenv(i == 1 ? "OPENBLAS_LIB" : "MKL_LIB");
        void *h = path ? dlopen(path, RTLD_NOW) : 0;
        if (h) impl[i] = (sgemm_fn)dlsym(h, i == 1 ? "scipy_cblas_sgemm" : "cblas_sgemm");
        if (!impl[i]) fprintf(stderr, "%s: not available (%s)\n", names[i], path ? dlerror() : "no library given");
    }
    A = aligned_alloc(64, 4 << 20); B = aligned_alloc(64, 4 << 20); C = aligned_alloc(64, 4 << 20);
    packed = aligned_alloc(64, 4 << 20); scratch = aligned_alloc(64, (size_t)64 * MICA_GEMM_THREAD_FLOATS * 4);
    for (int i = 0; i < 1 << 20; i++) { A[i] = rand() / (float)RAND_MAX - 0.5f; B[i] = rand() / (float)RAND_MAX - 0.5f; }
    double best[3][NS][64];
    for (int r = 0; r < rounds; r++)
        for (int o = 0; o < 3; o++) {
            int i = (o + r) % 3;
            if (i && !impl[i]) continue;
            for (int s = 0; s < NS; s++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = shapes[s][3], tb = shapes[s][4];
                double b = 1e9;
                for (int rep = 0; rep < reps; rep++) {
                    double t = now();
                    if (i == 0) mica_sgemm(M, N, K, A, ta ? M : K, ta, B, tb ? K : N, tb, 0.0f, C, N, packed, scratch);
                    else tiled(impl[i], M, N, K, ta, tb);
                    t = now() - t;
                    if (t < b) b = t;
                }
                best[i][s][r] = b;
            }
        }
    printf("shape (MxNxK op)");
    for (int i = 0; i < 3; i++) if (!i || impl[i]) printf(",%s GF/s", names[i]);
    printf("\n");
    double tot[3] = {0, 0, 0}, flops = 0;
    for (int s = 0; s < NS; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        printf("%dx%dx%d %c%c", M, N, K, shapes[s][3] ? 'T' : 'N', shapes[s][4] ? 'T' : 'N');
        flops += 2.0 * M * N * K;
        for (int i = 0; i < 3; i++) {
            if (i && !impl[i]) continue;
            double v[64];
            for (int r = 0; r < rounds; r++) v[r] = best[i][s][r];
            for (int x = 0; x < rounds; x++) for (int y = x + 1; y < rounds; y++) if (v[y] < v[x]) { double t = v[x]; v[x] = v[y]; v[y] = t; }
            tot[i] += v[rounds / 2];
            printf(",%.1f", 2.0 * M * N * K / v[rounds / 2] / 1e9);
        }
        printf("\n");
    }
    printf("all shapes");
    for (int i = 0; i < 3; i++) if (!i || impl[i]) printf(",%.1f", flops / tot[i] / 1e9);
    printf("\n");
    return 0;
}
