/* The bfloat16 product kernel of one mica_bf16gemm.h against another's (build this file twice, -I
 * each header's folder first), on a GPT's product shapes plus odd ones: per shape the best of
 * `reps` calls in process CPU time (the steadier clock on a shared machine) and an FNV-1a hash of
 * the output bits, so two builds' lines show both the speed and whether the bits moved.
 *   gcc -O3 -march=native -fopenmp -ffp-contract=off -I DIR -I mica/backends/c -I mica/backends/cstyle \
 *       -DMICA_BF16_GEMM=2 benchmarks/bf16_gemm_ab.c -o ab -lm      (OpenBLAS flags as bf16_gemm.py)
 *   OMP_NUM_THREADS=1 ./ab [tokens=16384] [n_embd=384] [reps=3] [bf16_out=1]
 * (BENCHMARKS.md 8.3: main's header against the branch's, alternating rounds.) */
#define MICA_OPENBLAS
#include "mica_blas.h"
#include "mica_bf16gemm.h"
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 16384, C = argc > 2 ? atoi(argv[2]) : 384, V = 65;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    int outbf = argc > 4 ? atoi(argv[4]) : 1;
    int shapes[][5] = {
        {T, 3 * C, C, 0, 1}, {T, C, C, 0, 1}, {T, 4 * C, C, 0, 1}, {T, C, 4 * C, 0, 1}, {T, V, C, 0, 1},
        {T, C, 3 * C, 0, 0}, {T, C, C, 0, 0}, {T, C, 4 * C, 0, 0}, {T, 4 * C, C, 0, 0}, {T, C, V, 0, 0},
        {3 * C, C, T, 1, 0}, {C, C, T, 1, 0}, {4 * C, C, T, 1, 0}, {C, 4 * C, T, 1, 0}, {V, C, T, 1, 0},
        {100, 77, 70, 0, 0}, {45, 33, 96, 1, 1}, {33, 50, 31, 0, 1}, {70, 40, 2100, 1, 0}, {64, 64, 4097, 0, 0}};
    size_t most = (size_t)T * 4 * C;
    mica_bf16 *a = aligned_alloc(64, most * 2 + 64), *b = aligned_alloc(64, most * 2 + 64);
    float *Cf = aligned_alloc(64, most * 4 + 64);
    uint32_t s = 12345;
    for (size_t i = 0; i < most; i++) {
        s = s * 1664525u + 1013904223u; a[i] = mica_bf16_store(((s >> 8) / 16777216.0f - 0.5f) * ((s & 255) == 7 ? 1e-39f : 1.0f));
        s = s * 1664525u + 1013904223u; b[i] = mica_bf16_store((s >> 8) / 16777216.0f - 0.5f);
    }
    double tot = 0, fl = 0;
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2], ta = shapes[si][3], tb = shapes[si][4];
        int lda = ta ? M : K, ldb = tb ? K : N;
        char *work = aligned_alloc(64, (mica_bf16gemm_shared_bytes(M, N, K) + 63) / 64 * 64);
        char *scratch = aligned_alloc(64, 64 * mica_bf16gemm_thread_bytes(K));
        double best = 1e9;
        for (int r = 0; r < reps; r++) {
            double t = now();
            mica_bf16gemm(M, N, K, a, lda, ta, b, ldb, tb, Cf, N, outbf, work, scratch);
            t = now() - t;
            if (t < best) best = t;
        }
        uint64_t h = 1469598103934665603ull;
        const unsigned char *p = (const unsigned char *)Cf;
        for (size_t i = 0; i < (size_t)M * N * (outbf ? 2 : 4); i++) h = (h ^ p[i]) * 1099511628211ull;
        if (si < 15) { tot += best; fl += 2.0 * M * N * K; }
        printf("%6dx%5dx%6d %c%c %8.2f ms %7.1f GFs  %016llx\n", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N', best * 1e3,
               2.0 * M * N * K / best / 1e9, (unsigned long long)h);
        free(work); free(scratch);
    }
    printf("total %.1f ms, %.1f GF/s\n", tot * 1e3, fl / tot / 1e9);
    return 0;
}
