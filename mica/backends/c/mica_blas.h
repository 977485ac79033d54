/* Single-precision products for generated programs.
 *
 * With MICA_OPENBLAS (the default, chosen by measurement: benchmarks/gemm.py), a product is cut
 * into a fixed grid of at most MICA_TILES output tiles that depends on its shape alone (not on
 * the threads, nor on the cores of the machine that built it), and every tile is one single-threaded
 * OpenBLAS call; OpenMP runs the tiles. Each output element is therefore computed by the same
 * call with the same arguments whatever the thread count: bitwise identical results for 1, 2
 * or 64 threads. Without it, Mica's own kernel (mica_gemm.h).
 */
#ifndef MICA_BLAS_H
#define MICA_BLAS_H
#include "mica_gemm.h"

#define MICA_TILES 8

#ifdef MICA_OPENBLAS
void scipy_cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
void scipy_openblas_set_num_threads(int n);

static void mica_blas_init(void) {
    static int done;
    if (!done) { scipy_openblas_set_num_threads(1); done = 1; }
}

typedef struct {
    int64_t M, N, K, lda, ldb, ldc, tm, tn;
    int ta, tb;
    const float *A, *B;
    float *C;
} mica_product;

/* rows when there are enough of them, else columns; at most MICA_TILES tiles of at least 64 */
static mica_product mica_product_grid(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int ta,
                                      const float *B, int64_t ldb, int tb, float *C, int64_t ldc) {
    mica_product p = {M, N, K, lda, ldb, ldc, 1, 1, ta, tb, A, B, C};
    p.tm = M >= 128 ? (M / 64 < MICA_TILES ? M / 64 : MICA_TILES) : 1;
    p.tn = p.tm == 1 ? (N / 64 < MICA_TILES ? (N / 64 > 1 ? N / 64 : 1) : MICA_TILES) : 1;
    return p;
}

static inline int mica_product_parallel(const mica_product *p) {
    return (double)p->M * p->N * p->K > 262144.0 && p->tm * p->tn > 1;
}

/* tile t's output rows [r0, r1) and columns [c0, c1) */
static inline void mica_product_bounds(const mica_product *p, int64_t t, int64_t *r0, int64_t *r1, int64_t *c0,
                                       int64_t *c1) {
    int64_t i = t / p->tn, j = t % p->tn;
    *r0 = p->M * i / p->tm; *r1 = p->M * (i + 1) / p->tm;
    *c0 = p->N * j / p->tn; *c1 = p->N * (j + 1) / p->tn;
}

static void mica_product_tile(const mica_product *p, int64_t t) {
    int64_t m0, m1, n0, n1;
    mica_product_bounds(p, t, &m0, &m1, &n0, &n1);
    const float *a = p->ta ? p->A + m0 : p->A + m0 * p->lda;
    const float *b = p->tb ? p->B + n0 * p->ldb : p->B + n0;
    scipy_cblas_sgemm(101, p->ta ? 112 : 111, p->tb ? 112 : 111, (int)(m1 - m0), (int)(n1 - n0), (int)p->K, 1.0f, a,
                      (int)p->lda, b, (int)p->ldb, 0.0f, p->C + m0 * p->ldc + n0, (int)p->ldc);
}

static void mica_blas_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int ta,
                            const float *B, int64_t ldb, int tb, float *C, int64_t ldc) {
    mica_product p = mica_product_grid(M, N, K, A, lda, ta, B, ldb, tb, C, ldc);
#pragma omp parallel for schedule(static) if (mica_product_parallel(&p))
    for (int64_t t = 0; t < p.tm * p.tn; t++) mica_product_tile(&p, t);
}
#else
static void mica_blas_init(void) {}
#endif
#endif
