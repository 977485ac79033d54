/* Mica's own blocked single-precision product.
 *
 * C[M,N] = op(A)[M,K] @ op(B)[K,N] (+ C), row-major, op = optional transpose. Panels of A (MR rows)
 * and B (NR columns) are packed, then an MR x NR register-blocked micro-kernel (AVX-512 or
 * AVX2+FMA when the compiler targets them, plain C otherwise) runs the K loop. The order of every
 * sum depends only on (M, N, K), never on threads: work is split over fixed output tiles, so
 * results are bitwise identical for any thread count.
 */
#ifndef MICA_GEMM_H
#define MICA_GEMM_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "mica_runtime.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define MICA_MR 8
#define MICA_NR 32
#elif defined(__AVX2__) && defined(__FMA__)
#define MICA_MR 6
#define MICA_NR 16
#else
#define MICA_MR 4
#define MICA_NR 16
#endif
#define MICA_KC 384
#define MICA_MC 96

/* Pack op(B)[k0:k0+kc, n0:n0+nc] into column panels of NR, zero padded, and op(A)[m0:m0+mc,
 * k0:k0+kc] into row panels of MR. Memory is always read along its stored rows: a transposed
 * operand is walked one stored row at a time and scattered into the panels. */
static void mica_pack_b(const float *B, int64_t ldb, int tb, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                        float *restrict out) {
    int64_t panels = (nc + MICA_NR - 1) / MICA_NR;
    if (!tb) {
        for (int64_t p = 0; p < panels; p++) {
            int64_t j = p * MICA_NR, w = nc - j < MICA_NR ? nc - j : MICA_NR;
            float *dst = out + p * kc * MICA_NR;
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (k0 + k) * ldb + n0 + j;
                for (int64_t c = 0; c < w; c++) dst[k * MICA_NR + c] = src[c];
                for (int64_t c = w; c < MICA_NR; c++) dst[k * MICA_NR + c] = 0.0f;
            }
        }
        return;
    }
    for (int64_t n = 0; n < panels * MICA_NR; n++) {
        float *dst = out + (n / MICA_NR) * kc * MICA_NR + n % MICA_NR;
        if (n < nc) {
            const float *src = B + (n0 + n) * ldb + k0;
            for (int64_t k = 0; k < kc; k++) dst[k * MICA_NR] = src[k];
        } else {
            for (int64_t k = 0; k < kc; k++) dst[k * MICA_NR] = 0.0f;
        }
    }
}

static void mica_pack_a(const float *A, int64_t lda, int ta, int64_t m0, int64_t mc, int64_t k0, int64_t kc,
                        float *restrict out) {
    int64_t panels = (mc + MICA_MR - 1) / MICA_MR;
    if (!ta) {
        for (int64_t m = 0; m < panels * MICA_MR; m++) {
            float *dst = out + (m / MICA_MR) * kc * MICA_MR + m % MICA_MR;
            if (m < mc) {
                const float *src = A + (m0 + m) * lda + k0;
                for (int64_t k = 0; k < kc; k++) dst[k * MICA_MR] = src[k];
            } else {
                for (int64_t k = 0; k < kc; k++) dst[k * MICA_MR] = 0.0f;
            }
        }
        return;
    }
    for (int64_t k = 0; k < kc; k++) {
        const float *src = A + (k0 + k) * lda + m0;
        for (int64_t p = 0; p < panels; p++) {
            float *dst = out + p * kc * MICA_MR + k * MICA_MR;
            int64_t i = p * MICA_MR, h = mc - i < MICA_MR ? mc - i : MICA_MR;
            for (int64_t r = 0; r < h; r++) dst[r] = src[i + r];
            for (int64_t r = h; r < MICA_MR; r++) dst[r] = 0.0f;
        }
    }
}

/* acc[MR][NR] = sum_k a[k][r] * b[k][c] over packed panels */
static inline void mica_micro(int64_t kc, const float *restrict a, const float *restrict b, float *restrict acc) {
#ifdef __AVX512F__
    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(), c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
    __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps(), c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();
    __m512 c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps(), c70 = _mm512_setzero_ps(), c71 = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(b + k * MICA_NR), b1 = _mm512_loadu_ps(b + k * MICA_NR + 16);
        const float *ak = a + k * MICA_MR;
        __m512 x;
        x = _mm512_set1_ps(ak[0]); c00 = _mm512_fmadd_ps(x, b0, c00); c01 = _mm512_fmadd_ps(x, b1, c01);
        x = _mm512_set1_ps(ak[1]); c10 = _mm512_fmadd_ps(x, b0, c10); c11 = _mm512_fmadd_ps(x, b1, c11);
        x = _mm512_set1_ps(ak[2]); c20 = _mm512_fmadd_ps(x, b0, c20); c21 = _mm512_fmadd_ps(x, b1, c21);
        x = _mm512_set1_ps(ak[3]); c30 = _mm512_fmadd_ps(x, b0, c30); c31 = _mm512_fmadd_ps(x, b1, c31);
        x = _mm512_set1_ps(ak[4]); c40 = _mm512_fmadd_ps(x, b0, c40); c41 = _mm512_fmadd_ps(x, b1, c41);
        x = _mm512_set1_ps(ak[5]); c50 = _mm512_fmadd_ps(x, b0, c50); c51 = _mm512_fmadd_ps(x, b1, c51);
        x = _mm512_set1_ps(ak[6]); c60 = _mm512_fmadd_ps(x, b0, c60); c61 = _mm512_fmadd_ps(x, b1, c61);
        x = _mm512_set1_ps(ak[7]); c70 = _mm512_fmadd_ps(x, b0, c70); c71 = _mm512_fmadd_ps(x, b1, c71);
    }
    _mm512_storeu_ps(acc + 0 * 32, c00); _mm512_storeu_ps(acc + 0 * 32 + 16, c01);
    _mm512_storeu_ps(acc + 1 * 32, c10); _mm512_storeu_ps(acc + 1 * 32 + 16, c11);
    _mm512_storeu_ps(acc + 2 * 32, c20); _mm512_storeu_ps(acc + 2 * 32 + 16, c21);
    _mm512_storeu_ps(acc + 3 * 32, c30); _mm512_storeu_ps(acc + 3 * 32 + 16, c31);
    _mm512_storeu_ps(acc + 4 * 32, c40); _mm512_storeu_ps(acc + 4 * 32 + 16, c41);
    _mm512_storeu_ps(acc + 5 * 32, c50); _mm512_storeu_ps(acc + 5 * 32 + 16, c51);
    _mm512_storeu_ps(acc + 6 * 32, c60); _mm512_storeu_ps(acc + 6 * 32 + 16, c61);
    _mm512_storeu_ps(acc + 7 * 32, c70); _mm512_storeu_ps(acc + 7 * 32 + 16, c71);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(b + k * MICA_NR), b1 = _mm256_loadu_ps(b + k * MICA_NR + 8);
        const float *ak = a + k * MICA_MR;
        __m256 x;
        x = _mm256_broadcast_ss(ak + 0); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(ak + 1); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(ak + 2); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(ak + 3); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(ak + 4); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(ak + 5); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    _mm256_storeu_ps(acc + 0 * 16, c00); _mm256_storeu_ps(acc + 0 * 16 + 8, c01);
    _mm256_storeu_ps(acc + 1 * 16, c10); _mm256_storeu_ps(acc + 1 * 16 + 8, c11);
    _mm256_storeu_ps(acc + 2 * 16, c20); _mm256_storeu_ps(acc + 2 * 16 + 8, c21);
    _mm256_storeu_ps(acc + 3 * 16, c30); _mm256_storeu_ps(acc + 3 * 16 + 8, c31);
    _mm256_storeu_ps(acc + 4 * 16, c40); _mm256_storeu_ps(acc + 4 * 16 + 8, c41);
    _mm256_storeu_ps(acc + 5 * 16, c50); _mm256_storeu_ps(acc + 5 * 16 + 8, c51);
#else
    for (int r = 0; r < MICA_MR * MICA_NR; r++) acc[r] = 0.0f;
    for (int64_t k = 0; k < kc; k++)
        for (int r = 0; r < MICA_MR; r++)
            for (int c = 0; c < MICA_NR; c++) acc[r * MICA_NR + c] += a[k * MICA_MR + r] * b[k * MICA_NR + c];
#endif
}

/* One tile, one thread. `work` must hold mica_gemm_work_floats(K, N) floats. */
static inline int64_t mica_gemm_work_floats(int64_t K, int64_t N) {
    int64_t kc = K < MICA_KC ? K : MICA_KC;
    int64_t np = (N + MICA_NR - 1) / MICA_NR * MICA_NR;
    return (kc ? kc : 1) * np + (kc ? kc : 1) * MICA_MC + MICA_MR * MICA_NR;
}

/* Per-thread scratch of the parallel driver: one packed A block and one accumulator tile. */
#define MICA_GEMM_THREAD_FLOATS (MICA_KC * MICA_MC + MICA_MR * MICA_NR)

static void mica_sgemm_tile(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, int ta,
                            const float *B, int64_t ldb, int tb, float beta, float *C, int64_t ldc, float *work) {
    int64_t np = (N + MICA_NR - 1) / MICA_NR * MICA_NR;
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += MICA_KC) {
        int64_t kc = K - k0 < MICA_KC ? K - k0 : MICA_KC;
        float b_eff = k0 == 0 ? beta : 1.0f;
        float *bp = work, *ap = work + (kc ? kc : 1) * np, *acc = ap + (kc ? kc : 1) * MICA_MC;
        if (kc > 0) mica_pack_b(B, ldb, tb, k0, kc, 0, N, bp);
        for (int64_t m0 = 0; m0 < M; m0 += MICA_MC) {
            int64_t mc = M - m0 < MICA_MC ? M - m0 : MICA_MC;
            if (kc > 0) mica_pack_a(A, lda, ta, m0, mc, k0, kc, ap);
            for (int64_t i = 0; i < mc; i += MICA_MR) {
                int64_t h = mc - i < MICA_MR ? mc - i : MICA_MR;
                for (int64_t j = 0; j < N; j += MICA_NR) {
                    int64_t w = N - j < MICA_NR ? N - j : MICA_NR;
                    if (kc > 0) mica_micro(kc, ap + i * kc, bp + j * kc, acc);
                    else memset(acc, 0, sizeof(float) * MICA_MR * MICA_NR);
                    for (int64_t r = 0; r < h; r++) {
                        float *crow = C + (m0 + i + r) * ldc + j;
                        const float *arow = acc + r * MICA_NR;
                        if (b_eff == 0.0f) for (int64_t c = 0; c < w; c++) crow[c] = alpha * arow[c];
                        else for (int64_t c = 0; c < w; c++) crow[c] = alpha * arow[c] + b_eff * crow[c];
                    }
                }
            }
        }
        if (K == 0) break;
    }
}

/* C = op(A) @ op(B) (+ C when beta = 1) over all threads of the enclosing team, or the calling
 * thread alone when called outside a parallel region. `packed` holds the shared packed B block
 * (KC x N rounded up), `scratch` holds MICA_GEMM_THREAD_FLOATS per thread. Work is split over
 * fixed (MC rows x NR columns) tiles; each output element is accumulated by one thread in the
 * same order whatever the split, so the bits do not depend on the thread count. */
static void mica_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int ta,
                       const float *B, int64_t ldb, int tb, float beta, float *C, int64_t ldc,
                       float *packed, float *scratch) {
    int64_t npanel = (N + MICA_NR - 1) / MICA_NR, mblocks = (M + MICA_MC - 1) / MICA_MC;
    int parallel = (double)M * N * (K ? K : 1) > 262144.0;
    /* Tiles: balanced row blocks (multiples of MR), each with all column panels when there are
     * enough row blocks to go round the threads, else split into column groups. The tiling only
     * decides who computes an element, never how, so it may depend on the thread count. */
    int64_t mstep = ((M + mblocks - 1) / (mblocks ? mblocks : 1) + MICA_MR - 1) / MICA_MR * MICA_MR;
    int threads = parallel ? omp_get_max_threads() : 1;
    int64_t ngroups = mblocks >= 2 * threads ? 1 : (2 * threads + mblocks - 1) / mblocks;
    ngroups = ngroups > npanel ? npanel : ngroups;
    int64_t pgroup = (npanel + ngroups - 1) / (ngroups ? ngroups : 1);
    ngroups = (npanel + pgroup - 1) / (pgroup ? pgroup : 1);
    for (int64_t k0 = 0; k0 < K || (K == 0 && k0 == 0); k0 += MICA_KC) {
        int64_t kc = K - k0 < MICA_KC ? K - k0 : MICA_KC;
        float b_eff = k0 == 0 ? beta : 1.0f;
#pragma omp parallel if (parallel)
        {
            if (kc > 0) {
#pragma omp for schedule(static)
                for (int64_t p = 0; p < npanel; p++) {
                    int64_t n0 = p * MICA_NR, w = N - n0 < MICA_NR ? N - n0 : MICA_NR;
                    mica_pack_b(B, ldb, tb, k0, kc, n0, w, packed + p * kc * MICA_NR);
                }
            }
            float *ap = scratch + (int64_t)omp_get_thread_num() * MICA_GEMM_THREAD_FLOATS;
            float *acc = ap + MICA_KC * MICA_MC;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < mblocks * ngroups; t++) {
                int64_t m0 = (t / ngroups) * mstep, g = t % ngroups;
                int64_t mc = M - m0 < mstep ? M - m0 : mstep;
                if (mc <= 0) continue;
                if (kc > 0) mica_pack_a(A, lda, ta, m0, mc, k0, kc, ap);
                for (int64_t p = g * pgroup; p < (g + 1) * pgroup && p < npanel; p++) {
                    int64_t j = p * MICA_NR, w = N - j < MICA_NR ? N - j : MICA_NR;
                    for (int64_t i = 0; i < mc; i += MICA_MR) {
                        int64_t h = mc - i < MICA_MR ? mc - i : MICA_MR;
                        if (kc > 0) mica_micro(kc, ap + i * kc, packed + p * kc * MICA_NR, acc);
                        else memset(acc, 0, sizeof(float) * MICA_MR * MICA_NR);
                        for (int64_t r = 0; r < h; r++) {
                            float *crow = C + (m0 + i + r) * ldc + j;
                            const float *arow = acc + r * MICA_NR;
                            if (b_eff == 0.0f) for (int64_t c = 0; c < w; c++) crow[c] = arow[c];
                            else for (int64_t c = 0; c < w; c++) crow[c] = arow[c] + crow[c];
                        }
                    }
                }
            }
        }
        if (K == 0) break;
    }
}

/* dst[c][r] = src[r][c] for a rows x cols block (strides in elements); 8x8 tiles in registers */
static void mica_transpose_f32(const float *src, int64_t ss, float *dst, int64_t ds, int64_t rows, int64_t cols) {
    int64_t r0 = 0;
#if defined(__AVX2__)
    for (; r0 + 8 <= rows; r0 += 8) {
        int64_t c0 = 0;
        for (; c0 + 8 <= cols; c0 += 8) {
            __m256 t[8], u[8];
            for (int i = 0; i < 8; i++) t[i] = _mm256_loadu_ps(src + (r0 + i) * ss + c0);
            for (int i = 0; i < 8; i += 2) {
                u[i] = _mm256_unpacklo_ps(t[i], t[i + 1]);
                u[i + 1] = _mm256_unpackhi_ps(t[i], t[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                t[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
                t[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
                t[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                t[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (c0 + i) * ds + r0, _mm256_permute2f128_ps(t[i], t[i + 4], 0x20));
                _mm256_storeu_ps(dst + (c0 + i + 4) * ds + r0, _mm256_permute2f128_ps(t[i], t[i + 4], 0x31));
            }
        }
        for (; c0 < cols; c0++)
            for (int64_t r = r0; r < r0 + 8; r++) dst[c0 * ds + r] = src[r * ss + c0];
    }
#endif
    for (; r0 < rows; r0++)
        for (int64_t c = 0; c < cols; c++) dst[c * ds + r0] = src[r0 * ss + c];
}

/* C[M,N] = alpha * op(A)[M,K] @ B[K,N] for small operands that sit in L1: no packing. A is read
 * as A[i*lda + k] (ta = 0) or A[k*lda + i] (ta = 1); B row-major with unit column stride. Each
 * element is one fused multiply-add chain over k in increasing order. */
#define MICA_AN(i, k) A[(i) * lda + (k)]
#define MICA_AT(i, k) A[(k) * lda + (i)]
/* (AVX-512: blocks of 8 rows x 32 columns first; each element the same chain, so the same bits) */
#ifdef __AVX512F__
#define MICA_SMALL_GEMM_512(AX)                                                                     \
    for (; j + 32 <= N; j += 32)                                                                   \
        for (int64_t i = 0; i < M; i += 8) {                                                       \
            int64_t h = M - i < 8 ? M - i : 8, r[8];                                               \
            for (int q = 0; q < 8; q++) r[q] = i + (h > q ? q : 0);                                \
            __m512 c[8][2];                                                                        \
            for (int q = 0; q < 8; q++) c[q][0] = c[q][1] = _mm512_setzero_ps();                   \
            for (int64_t k = 0; k < K; k++) {                                                      \
                __m512 b0 = _mm512_loadu_ps(B + k * ldb + j), b1 = _mm512_loadu_ps(B + k * ldb + j + 16); \
                for (int q = 0; q < 8; q++) {                                                      \
                    __m512 x = _mm512_set1_ps(AX(r[q], k));                                        \
                    c[q][0] = _mm512_fmadd_ps(x, b0, c[q][0]);                                     \
                    c[q][1] = _mm512_fmadd_ps(x, b1, c[q][1]);                                     \
                }                                                                                  \
            }                                                                                      \
            __m512 al = _mm512_set1_ps(alpha);                                                     \
            for (int64_t q = 0; q < h; q++) {                                                      \
                _mm512_storeu_ps(C + (i + q) * ldc + j, _mm512_mul_ps(al, c[q][0]));               \
                _mm512_storeu_ps(C + (i + q) * ldc + j + 16, _mm512_mul_ps(al, c[q][1]));          \
            }                                                                                      \
        }
#else
#define MICA_SMALL_GEMM_512(AX)
#endif
static void mica_small_gemm_n(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc) {
    int64_t j = 0;
    MICA_SMALL_GEMM_512(MICA_AN)
#if defined(__AVX2__) && defined(__FMA__)
    for (; j + 16 <= N; j += 16) {
        for (int64_t i = 0; i < M; i += 6) {
            int64_t h = M - i < 6 ? M - i : 6;
            int64_t r1 = i + (h > 1 ? 1 : 0), r2 = i + (h > 2 ? 2 : 0), r3 = i + (h > 3 ? 3 : 0);
            int64_t r4 = i + (h > 4 ? 4 : 0), r5 = i + (h > 5 ? 5 : 0);
            __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
            __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
            __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
            for (int64_t k = 0; k < K; k++) {
                __m256 b0 = _mm256_loadu_ps(B + k * ldb + j), b1 = _mm256_loadu_ps(B + k * ldb + j + 8), x;
                x = _mm256_set1_ps(MICA_AN(i, k)); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
                x = _mm256_set1_ps(MICA_AN(r1, k)); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
                x = _mm256_set1_ps(MICA_AN(r2, k)); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
                x = _mm256_set1_ps(MICA_AN(r3, k)); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
                x = _mm256_set1_ps(MICA_AN(r4, k)); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
                x = _mm256_set1_ps(MICA_AN(r5, k)); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
            }
            __m256 al = _mm256_set1_ps(alpha);
            __m256 rows[12] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
            for (int64_t r = 0; r < h; r++) {
                _mm256_storeu_ps(C + (i + r) * ldc + j, _mm256_mul_ps(al, rows[2 * r]));
                _mm256_storeu_ps(C + (i + r) * ldc + j + 8, _mm256_mul_ps(al, rows[2 * r + 1]));
            }
        }
    }
#endif
    for (; j < N; j++)
        for (int64_t i = 0; i < M; i++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(MICA_AN(i, k), B[k * ldb + j], acc);
            C[i * ldc + j] = alpha * acc;
        }
}

static void mica_small_gemm_t(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc) {
    int64_t j = 0;
    MICA_SMALL_GEMM_512(MICA_AT)
#if defined(__AVX2__) && defined(__FMA__)
    for (; j + 16 <= N; j += 16) {
        for (int64_t i = 0; i < M; i += 6) {
            int64_t h = M - i < 6 ? M - i : 6;
            int64_t r1 = i + (h > 1 ? 1 : 0), r2 = i + (h > 2 ? 2 : 0), r3 = i + (h > 3 ? 3 : 0);
            int64_t r4 = i + (h > 4 ? 4 : 0), r5 = i + (h > 5 ? 5 : 0);
            __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
            __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
            __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
            for (int64_t k = 0; k < K; k++) {
                __m256 b0 = _mm256_loadu_ps(B + k * ldb + j), b1 = _mm256_loadu_ps(B + k * ldb + j + 8), x;
                x = _mm256_set1_ps(MICA_AT(i, k)); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
                x = _mm256_set1_ps(MICA_AT(r1, k)); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
                x = _mm256_set1_ps(MICA_AT(r2, k)); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
                x = _mm256_set1_ps(MICA_AT(r3, k)); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
                x = _mm256_set1_ps(MICA_AT(r4, k)); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
                x = _mm256_set1_ps(MICA_AT(r5, k)); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
            }
            __m256 al = _mm256_set1_ps(alpha);
            __m256 rows[12] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
            for (int64_t r = 0; r < h; r++) {
                _mm256_storeu_ps(C + (i + r) * ldc + j, _mm256_mul_ps(al, rows[2 * r]));
                _mm256_storeu_ps(C + (i + r) * ldc + j + 8, _mm256_mul_ps(al, rows[2 * r + 1]));
            }
        }
    }
#endif
    for (; j < N; j++)
        for (int64_t i = 0; i < M; i++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(MICA_AT(i, k), B[k * ldb + j], acc);
            C[i * ldc + j] = alpha * acc;
        }
}

#undef MICA_AN
#undef MICA_AT
#undef MICA_SMALL_GEMM_512

static void mica_small_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, int ta,
                            const float *B, int64_t ldb, float *C, int64_t ldc) {
    if (ta) mica_small_gemm_t(M, N, K, alpha, A, lda, B, ldb, C, ldc);
    else mica_small_gemm_n(M, N, K, alpha, A, lda, B, ldb, C, ldc);
}

/* double precision: straightforward, each element summed over k in increasing order */
static void mica_dgemm(int64_t M, int64_t N, int64_t K, const double *A, int64_t lda, int ta,
                       const double *B, int64_t ldb, int tb, double beta, double *C, int64_t ldc) {
#pragma omp parallel for schedule(static) if ((double)M * N * K > 262144.0)
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc = acc + (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = beta == 0.0 ? acc : acc + beta * C[i * ldc + j];
        }
    }
}
#endif
