/* Attention through cuBLASLt's products: the CPU target's algorithm on the card.
 *
 *   forward   for each head (or each batch element: the shorter loop), batched over the other
 *             index in chunks whose [chunk, L, S] scores fit the scratch the lowering planned:
 *             S = scale * Q K^T (a product), each row made the (dropped) probabilities by the
 *             CPU's own row function (mica_rows.h's mica_attention_row, a group of 8 threads per
 *             row, which also stores the row's log-sum-exp), then O = P V (a product).
 *   backward  D = dO . O per row (mica_flash_delta: the CPU's order), then per chunk S = scale *
 *             Q K^T and dP = dO V^T (products), the CPU's backward row (P~ and dS in place:
 *             mica_attention_backward_row), dV = P~^T dO, dQ = dS K, dK = dS^T Q (products).
 *
 * Products aside, every value is the CPU's: the same row functions on the same scores. On a card
 * this is faster than the fused kernels (mica_cuda_attention.h: their scores are dot products of
 * one thread each, without FMA), and the products take TF32 where the user permits it; the cost
 * is one chunk's scores (two in the backward), so the lowering (lowerings.attention_chunk) takes
 * this path only where a chunk of one head's [L, S] scores fits its bound, and the fused kernels
 * elsewhere.
 */
#ifndef MICA_CUDA_ATTENTION_GEMM_H
#define MICA_CUDA_ATTENTION_GEMM_H
#include "mica_cuda_attention.h"

template <typename T> struct mica_attn_gemm_of;
template <> struct mica_attn_gemm_of<float> {
    static constexpr int type = MICA_F32;
    static __device__ __forceinline__ void row(const mica_attn_shape *a, int64_t bh, int64_t i, float *p, int64_t n,
                                               float *lse) {
        float sum; /* (read only with half_round, which this path never has) */
        mica_attention_row_f32(a, bh, i, p, n, lse, &sum);
    }
    static __device__ __forceinline__ void backward_row(const mica_attn_shape *a, int64_t bh, int64_t i, float *p,
                                                        float *dp, int64_t n, float lse, float D) {
        mica_attention_backward_row_f32(a, bh, i, p, dp, n, lse, D);
    }
};
template <> struct mica_attn_gemm_of<double> {
    static constexpr int type = MICA_F64;
    static __device__ __forceinline__ void row(const mica_attn_shape *a, int64_t bh, int64_t i, double *p, int64_t n,
                                               double *lse) {
        double sum;
        mica_attention_row_f64(a, bh, i, p, n, lse, &sum);
    }
    static __device__ __forceinline__ void backward_row(const mica_attn_shape *a, int64_t bh, int64_t i, double *p,
                                                        double *dp, int64_t n, double lse, double D) {
        mica_attention_backward_row_f64(a, bh, i, p, dp, n, lse, D);
    }
};

/* which index a chunk batches over: heads (across) under a loop over batch elements, or batch
 * elements under a loop over heads; (outer, inner) -> bh */
typedef struct {
    int over_heads; /* the products batch over heads (H > B), else over batch elements */
    int64_t outer, first; /* this pass's outer index and its chunk's first inner index */
} mica_attn_pass;

static __host__ __device__ __forceinline__ int64_t mica_attn_pass_bh(const mica_attn_shape *a, mica_attn_pass p,
                                                                     int64_t n) {
    return p.over_heads ? p.outer * a->H + p.first + n : (p.first + n) * a->H + p.outer;
}

/* the rows of a chunk's scores: a group of 8 threads per query row, `count` inner indices (the
 * arrays __restrict__: a thread's loads of its next elements go out before its stores) */
template <typename T>
static __global__ void MICA_THREAD_BOUNDS mica_attn_gemm_rows(mica_attn_shape a, mica_attn_pass pass, int64_t count, T *__restrict__ p,
                                           T *__restrict__ lse) {
    MICA_ROW_GROUPS(r, count * a.L) {
        const int64_t bh = mica_attn_pass_bh(&a, pass, r / a.L), i = r % a.L;
        mica_attn_gemm_of<T>::row(&a, bh, i, p + r * a.S, a.S, lse + bh * a.L + i);
    }
}

template <typename T>
static __global__ void MICA_THREAD_BOUNDS mica_attn_gemm_backward_rows(mica_attn_shape a, mica_attn_pass pass, int64_t count,
                                                    T *__restrict__ p, T *__restrict__ dp, const T *__restrict__ lse,
                                                    const T *__restrict__ D) {
    MICA_ROW_GROUPS(r, count * a.L) {
        const int64_t bh = mica_attn_pass_bh(&a, pass, r / a.L), i = r % a.L;
        mica_attn_gemm_of<T>::backward_row(&a, bh, i, p + r * a.S, dp + r * a.S, a.S, lse[bh * a.L + i],
                                           D[bh * a.L + i]);
    }
}

/* an operand's offset for a pass and its stride along the batched (inner) index */
#define MICA_ATTN_AT(x, sb, sh) ((x) + (pass.over_heads ? pass.outer * (sb) + pass.first * (sh) \
                                                           : pass.outer * (sh) + pass.first * (sb)))
#define MICA_ATTN_INNER(sb, sh) (pass.over_heads ? (sh) : (sb))

/* C[c][M, N] = alpha op(A) op(B) over the chunk's c matrices (mica_cuda.h's batched product) */
template <typename T>
static int mica_attn_product(cudaStream_t stream, int64_t M, int64_t N, int64_t K, double alpha, const T *A,
                             int64_t lda, int ta, int64_t sa, const T *B, int64_t ldb, int tb, int64_t sb, T *C,
                             int64_t ldc, int64_t sc, int64_t count) {
    return mica_gemm_batched(stream, M, N, K, mica_attn_gemm_of<T>::type, alpha, A, lda, ta, sa, B, ldb, tb, sb, C, ldc,
                             sc, count);
}

/* o and lse from q, k, v; `chunk` inner indices per pass, their scores in `scores` (chunk * L * S) */
template <typename T>
static int mica_attention_gemm_cuda(cudaStream_t stream, const mica_attn_shape *a, const T *q, const T *k,
                                    const T *v, T *o, T *lse, int64_t chunk, T *scores) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    mica_attn_pass pass = {a->H > a->B, 0, 0};
    const int64_t outers = pass.over_heads ? a->B : a->H, inners = pass.over_heads ? a->H : a->B;
    for (pass.outer = 0; pass.outer < outers; pass.outer++)
        for (pass.first = 0; pass.first < inners; pass.first += chunk) {
            const int64_t c = inners - pass.first < chunk ? inners - pass.first : chunk;
            if (mica_attn_product<T>(stream, L, S, E, a->scale, MICA_ATTN_AT(q, a->q_sb, a->q_sh), a->q_st, 0,
                                     MICA_ATTN_INNER(a->q_sb, a->q_sh), MICA_ATTN_AT(k, a->k_sb, a->k_sh), a->k_st, 1,
                                     MICA_ATTN_INNER(a->k_sb, a->k_sh), scores, S, L * S, c) != 0)
                return 1;
            MICA_PART(stream, 1);
            MICA_LAUNCH(mica_attn_gemm_rows<T>, mica_blocks(MICA_ROW_GROUP * c * L), MICA_THREADS, 0, stream, *a, pass,
                        c, scores, lse);
            MICA_PART(stream, 2);
            if (mica_attn_product<T>(stream, L, Ev, S, 1.0, scores, S, 0, L * S, MICA_ATTN_AT(v, a->v_sb, a->v_sh),
                                     a->v_st, 0, MICA_ATTN_INNER(a->v_sb, a->v_sh), MICA_ATTN_AT(o, a->o_sb, a->o_sh),
                                     a->o_st, MICA_ATTN_INNER(a->o_sb, a->o_sh), c) != 0)
                return 1;
            MICA_PART(stream, 3);
        }
    return cudaPeekAtLastError() == cudaSuccess ? 0 : mica_cuda_failed("launching attention's kernels");
}

/* where the backward's scratch puts the two chunks of scores after D (B * H * L values, rounded
 * up to 64 so the scores start on a 256-byte boundary) */
static __host__ __device__ inline int64_t mica_attn_gemm_d_len(const mica_attn_shape *a) {
    return (a->B * a->H * a->L + 63) / 64 * 64;
}

/* dq, dk, dv from g (strides g_sb, g_sh, g_st), q, k, v, o and lse; scratch: D, then P and dP
 * (chunk * L * S each) */
template <typename T>
static int mica_attention_gemm_backward_cuda(cudaStream_t stream, const mica_attn_shape *a, const T *g, const T *q,
                                             const T *k, const T *v, const T *o, const T *lse, T *dq, T *dk, T *dv,
                                             int64_t g_sb, int64_t g_sh, int64_t g_st, int64_t chunk, T *scratch) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    T *D = scratch, *p = D + mica_attn_gemm_d_len(a), *dp = p + chunk * L * S;
    if (a->B * a->H * L > 0)
        MICA_LAUNCH((mica_flash_delta<T>), mica_blocks(a->B * a->H * L), MICA_THREADS, 0, stream, *a, g, g_sb, g_sh,
                    g_st, o, D);
    MICA_PART(stream, 1);
    mica_attn_pass pass = {a->H > a->B, 0, 0};
    const int64_t outers = pass.over_heads ? a->B : a->H, inners = pass.over_heads ? a->H : a->B;
    for (pass.outer = 0; pass.outer < outers; pass.outer++)
        for (pass.first = 0; pass.first < inners; pass.first += chunk) {
            const int64_t c = inners - pass.first < chunk ? inners - pass.first : chunk;
            const T *qx = MICA_ATTN_AT(q, a->q_sb, a->q_sh), *kx = MICA_ATTN_AT(k, a->k_sb, a->k_sh);
            const T *vx = MICA_ATTN_AT(v, a->v_sb, a->v_sh), *gx = MICA_ATTN_AT(g, g_sb, g_sh);
            const int64_t qi = MICA_ATTN_INNER(a->q_sb, a->q_sh), ki = MICA_ATTN_INNER(a->k_sb, a->k_sh);
            const int64_t vi = MICA_ATTN_INNER(a->v_sb, a->v_sh), gi = MICA_ATTN_INNER(g_sb, g_sh);
            if (mica_attn_product<T>(stream, L, S, E, a->scale, qx, a->q_st, 0, qi, kx, a->k_st, 1, ki, p, S, L * S, c))
                return 1;
            MICA_PART(stream, 2);
            if (mica_attn_product<T>(stream, L, S, Ev, 1.0, gx, g_st, 0, gi, vx, a->v_st, 1, vi, dp, S, L * S, c))
                return 1;
            MICA_PART(stream, 3);
            MICA_LAUNCH(mica_attn_gemm_backward_rows<T>, mica_blocks(MICA_ROW_GROUP * c * L), MICA_THREADS, 0, stream,
                        *a, pass, c, p, dp, lse, D);
            MICA_PART(stream, 4);
            if (mica_attn_product<T>(stream, S, Ev, L, 1.0, p, S, 1, L * S, gx, g_st, 0, gi,
                                     MICA_ATTN_AT(dv, a->dv_sb, a->dv_sh), a->dv_st, MICA_ATTN_INNER(a->dv_sb, a->dv_sh),
                                     c))
                return 1;
            MICA_PART(stream, 5);
            if (mica_attn_product<T>(stream, L, E, S, 1.0, dp, S, 0, L * S, kx, a->k_st, 0, ki,
                                     MICA_ATTN_AT(dq, a->dq_sb, a->dq_sh), a->dq_st, MICA_ATTN_INNER(a->dq_sb, a->dq_sh),
                                     c))
                return 1;
            MICA_PART(stream, 6);
            if (mica_attn_product<T>(stream, S, E, L, 1.0, dp, S, 1, L * S, qx, a->q_st, 0, qi,
                                     MICA_ATTN_AT(dk, a->dk_sb, a->dk_sh), a->dk_st, MICA_ATTN_INNER(a->dk_sb, a->dk_sh),
                                     c))
                return 1;
            MICA_PART(stream, 7);
        }
    return cudaPeekAtLastError() == cudaSuccess ? 0 : mica_cuda_failed("launching attention's kernels");
}
#undef MICA_ATTN_AT
#undef MICA_ATTN_INNER
#endif
