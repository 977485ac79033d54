/* One round of the bfloat16 product kernel this file is built with (-DMICA_BF16_GEMM=0|1|2, see
 * mica_bf16gemm.h) and of the float32 product Mica uses (OpenBLAS, one single-threaded call per
 * fixed tile: mica_blas_sgemm) on a GPT's product shapes: forward (x @ W^T), the input gradient
 * (g @ W) and the weight gradient (g^T @ x). Prints "shape,seconds_bf16,seconds_f32" per shape,
 * the best of `reps` calls each. Driven by benchmarks/bf16_gemm.py, which alternates the builds. */
#define MICA_OPENBLAS
#include "mica_blas.h"
#include "mica_bf16gemm.h"
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 768, C = argc > 2 ? atoi(argv[2]) : 128, V = 65;
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    int shapes[][5] = {
        {T, 3 * C, C, 0, 1}, {T, C, C, 0, 1}, {T, 4 * C, C, 0, 1}, {T, C, 4 * C, 0, 1}, {T, V, C, 0, 1},
        {T, C, 3 * C, 0, 0}, {T, C, C, 0, 0}, {T, C, 4 * C, 0, 0}, {T, 4 * C, C, 0, 0}, {T, C, V, 0, 0},
        {3 * C, C, T, 1, 0}, {C, C, T, 1, 0}, {4 * C, C, T, 1, 0}, {C, 4 * C, T, 1, 0}, {V, C, T, 1, 0}};
    size_t most = (size_t)T * 4 * C > (size_t)16 * C * C ? (size_t)T * 4 * C : (size_t)16 * C * C;
    float *A = aligned_alloc(64, most * 4 + 64), *B = aligned_alloc(64, most * 4 + 64), *Cf = aligned_alloc(64, most * 4 + 64);
    mica_bf16 *a = aligned_alloc(64, most * 2 + 64), *b = aligned_alloc(64, most * 2 + 64);
    for (size_t i = 0; i < most; i++) {
        A[i] = rand() / (float)RAND_MAX - 0.5f; B[i] = rand() / (float)RAND_MAX - 0.5f;
        a[i] = mica_bf16_store(A[i]); b[i] = mica_bf16_store(B[i]);
    }
    mica_blas_init();
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = shapes[s][3], tb = shapes[s][4];
        int lda = ta ? M : K, ldb = tb ? K : N;
        char *work = aligned_alloc(64, (mica_bf16gemm_shared_bytes(M, N, K) + 63) / 64 * 64);
        char *scratch = aligned_alloc(64, 64 * mica_bf16gemm_thread_bytes(K));
        double t16 = 1e9, t32 = 1e9;
        for (int r = 0; r < reps; r++) {
            double t = now();
            mica_bf16gemm(M, N, K, a, lda, ta, b, ldb, tb, Cf, N, 1, work, scratch);
            t = now() - t;
            if (t < t16) t16 = t;
            t = now();
            mica_blas_sgemm(M, N, K, A, lda, ta, B, ldb, tb, Cf, N);
            t = now() - t;
            if (t < t32) t32 = t;
        }
        printf("%dx%dx%d %c%c,%.9f,%.9f\n", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N', t16, t32);
        free(work); free(scratch);
    }
    return 0;
}
