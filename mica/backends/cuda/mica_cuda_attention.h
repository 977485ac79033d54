/* Attention on the card, as host functions that launch its parts on the program's stream:
 *
 *   forward   P = scale Q K^T (a product), the softmax rows (Mica's kernel: the CPU's very row
 *             function, mica_attention_row_f32, 8 threads per query row), O = P V (a product);
 *   backward  P = scale Q K^T and dP = G V^T (products), the backward rows (mica_rows.h's row: P
 *             becomes the dropped probabilities, dP becomes dS), dV = P^T G, dK = dS^T Q and
 *             dQ = dS K (products).
 *
 * The products are cuBLASLt's strided-batched ones: all batch rows of one head per call, or all
 * heads of one batch row, whichever makes fewer calls (q, k and v are views into the fused qkv
 * product, so (b, h) is not one uniform stride). Scratch: the [B, H, L, S] scores, twice for the
 * backward. The full L x S square is multiplied even when causal (the rows zero what a query
 * cannot see); a fused, tiled kernel that skips it is the next step.
 */
#ifndef MICA_CUDA_ATTENTION_H
#define MICA_CUDA_ATTENTION_H
#include "mica_cuda_kernels.h"

#define MICA_DEFINE_CUDA_ATTENTION(T, S_)                                                          \
static __global__ void mica_attention_rows_##S_(mica_attn_shape a, T *P, T *lse) {                  \
    MICA_ROW_GROUPS(r, a.B * a.H * a.L) mica_attention_row_##S_(&a, r / a.L, r % a.L, P + r * a.S, a.S, lse + r); \
}                                                                                                  \
static __global__ void mica_attention_backward_rows_##S_(mica_attn_shape a, T *P, T *dP, const T *lse, \
                                                         const T *g, int64_t g_sb, int64_t g_sh,   \
                                                         int64_t g_st, const T *o) {               \
    MICA_ROW_GROUPS(r, a.B * a.H * a.L) {                                                          \
        int64_t bh = r / a.L, i = r % a.L, b = bh / a.H, h = bh % a.H;                             \
        mica_attention_backward_row_##S_(&a, bh, i, P + r * a.S, dP + r * a.S, a.S, lse[r],        \
                                         g + b * g_sb + h * g_sh + i * g_st,                       \
                                         o + b * a.o_sb + h * a.o_sh + i * a.o_st);                \
    }                                                                                              \
}                                                                                                  \
/* one operand of a per-(b, h) product: its base, leading dimension, transposition, (b, h) strides */ \
typedef struct {                                                                                   \
    const T *p;                                                                                    \
    int64_t ld;                                                                                    \
    int t;                                                                                         \
    int64_t sb, sh;                                                                                \
} mica_attn_operand_##S_;                                                                          \
static int mica_attn_product_##S_(cudaStream_t stream, const mica_attn_shape *a, int64_t M, int64_t N, \
                                  int64_t K, T alpha, mica_attn_operand_##S_ x, mica_attn_operand_##S_ y, \
                                  T *c, int64_t ldc, int64_t c_sb, int64_t c_sh) {                 \
    const int by_b = a->B >= a->H; /* batch over the larger dim, loop over the smaller */          \
    const int64_t outer = by_b ? a->H : a->B, count = by_b ? a->B : a->H;                          \
    for (int64_t n = 0; n < outer; n++) {                                                          \
        int64_t ox = n * (by_b ? x.sh : x.sb), oy = n * (by_b ? y.sh : y.sb), oc = n * (by_b ? c_sh : c_sb); \
        if (mica_gemm_##S_##_batched(stream, M, N, K, alpha, x.p + ox, x.ld, x.t, by_b ? x.sb : x.sh, y.p + oy, \
                                     y.ld, y.t, by_b ? y.sb : y.sh, c + oc, ldc, by_b ? c_sb : c_sh, count) != 0) \
            return 1;                                                                              \
    }                                                                                              \
    return 0;                                                                                      \
}                                                                                                  \
static int mica_attention_cuda_##S_(cudaStream_t stream, const mica_attn_shape *a, const T *q, const T *k, \
                                    const T *v, T *o, T *lse, T *P) {                              \
    typedef mica_attn_operand_##S_ op;                                                             \
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev, p_sh = L * S, p_sb = a->H * p_sh;      \
    const op Q = {q, a->q_st, 0, a->q_sb, a->q_sh}, Kt = {k, a->k_st, 1, a->k_sb, a->k_sh};         \
    const op Pm = {P, S, 0, p_sb, p_sh}, V = {v, a->v_st, 0, a->v_sb, a->v_sh};                     \
    if (mica_attn_product_##S_(stream, a, L, S, E, (T)a->scale, Q, Kt, P, S, p_sb, p_sh) != 0) return 1; \
    MICA_LAUNCH(mica_attention_rows_##S_, mica_blocks(MICA_ROW_GROUP * a->B * a->H * L), MICA_THREADS, 0, stream, \
                *a, P, lse);                                                                       \
    return mica_attn_product_##S_(stream, a, L, Ev, S, (T)1, Pm, V, o, a->o_st, a->o_sb, a->o_sh);   \
}                                                                                                  \
static int mica_attention_backward_cuda_##S_(cudaStream_t stream, const mica_attn_shape *a, const T *g, \
                                             const T *q, const T *k, const T *v, const T *o,       \
                                             const T *lse, T *dq, T *dk, T *dv, int64_t g_sb,      \
                                             int64_t g_sh, int64_t g_st, T *P) {                   \
    typedef mica_attn_operand_##S_ op;                                                             \
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev, p_sh = L * S, p_sb = a->H * p_sh;      \
    T *dP = P + a->B * p_sb;                                                                       \
    const op Q = {q, a->q_st, 0, a->q_sb, a->q_sh}, Kt = {k, a->k_st, 1, a->k_sb, a->k_sh};         \
    const op K_ = {k, a->k_st, 0, a->k_sb, a->k_sh}, Vt = {v, a->v_st, 1, a->v_sb, a->v_sh};        \
    const op G = {g, g_st, 0, g_sb, g_sh};                                                         \
    const op Pt = {P, S, 1, p_sb, p_sh}, dSt = {dP, S, 1, p_sb, p_sh}, dS = {dP, S, 0, p_sb, p_sh}; \
    if (mica_attn_product_##S_(stream, a, L, S, E, (T)a->scale, Q, Kt, P, S, p_sb, p_sh) != 0 ||      \
        mica_attn_product_##S_(stream, a, L, S, Ev, (T)1, G, Vt, dP, S, p_sb, p_sh) != 0)             \
        return 1;                                                                                  \
    MICA_LAUNCH(mica_attention_backward_rows_##S_, mica_blocks(MICA_ROW_GROUP * a->B * a->H * L), MICA_THREADS, 0, \
                stream, *a, P, dP, lse, g, g_sb, g_sh, g_st, o);                                   \
    return mica_attn_product_##S_(stream, a, S, Ev, L, (T)1, Pt, G, dv, a->dv_st, a->dv_sb, a->dv_sh) != 0 || \
           mica_attn_product_##S_(stream, a, S, E, L, (T)1, dSt, Q, dk, a->dk_st, a->dk_sb, a->dk_sh) != 0 || \
           mica_attn_product_##S_(stream, a, L, E, S, (T)1, dS, K_, dq, a->dq_st, a->dq_sb, a->dq_sh) != 0; \
}

MICA_DEFINE_CUDA_ATTENTION(float, f32)
MICA_DEFINE_CUDA_ATTENTION(double, f64)
#endif
