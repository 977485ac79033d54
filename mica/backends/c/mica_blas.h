/* Single-precision products for generated programs.
 *
 * With MICA_OPENBLAS (the default, chosen by measurement: benchmarks/gemm.py), a product is cut
 * into a fixed grid of at most MICA_TILES output tiles that depends on its shape alone (the
 * program fixes MICA_TILES when it is generated), and every tile is one single-threaded
 * OpenBLAS call; OpenMP runs the tiles. Each output element is therefore computed by the same
 * call with the same arguments whatever the thread count: bitwise identical results for 1, 2
 * or 64 threads. Without it, Mica's own kernel (mica_gemm.h).
 */
#ifndef MICA_BLAS_H
#define MICA_BLAS_H
#include "mica_gemm.h"

#ifndef MICA_TILES
#define MICA_TILES 8
#endif

#ifdef MICA_OPENBLAS
void scipy_cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
void scipy_openblas_set_num_threads(int n);

static void mica_blas_init(void) {
    static int done;
    if (!done) { scipy_openblas_set_num_threads(1); done = 1; }
}

static void mica_blas_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int ta,
                            const float *B, int64_t ldb, int tb, float *C, int64_t ldc) {
    /* rows when there are enough of them, else columns; at most MICA_TILES tiles of at least 64 */
    int64_t tm = M >= 128 ? (M / 64 < MICA_TILES ? M / 64 : MICA_TILES) : 1;
    int64_t tn = tm == 1 ? (N / 64 < MICA_TILES ? (N / 64 > 1 ? N / 64 : 1) : MICA_TILES) : 1;
    int64_t tiles = tm * tn;
#pragma omp parallel for schedule(static) if ((double)M * N * K > 262144.0 && tiles > 1)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t i = t / tn, j = t % tn;
        int64_t m0 = M * i / tm, m1 = M * (i + 1) / tm, n0 = N * j / tn, n1 = N * (j + 1) / tn;
        const float *a = ta ? A + m0 : A + m0 * lda;
        const float *b = tb ? B + n0 * ldb : B + n0;
        scipy_cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, (int)(m1 - m0), (int)(n1 - n0), (int)K, 1.0f, a,
                          (int)lda, b, (int)ldb, 0.0f, C + m0 * ldc + n0, (int)ldc);
    }
}
#else
static void mica_blas_init(void) {}
#endif
#endif
