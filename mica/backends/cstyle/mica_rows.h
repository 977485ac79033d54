/* One row of each row-wise primitive, written once for every target: the CPU's kernels run them
 * over rows with OpenMP, a thread per row; the CUDA kernels run each row on a group of
 * MICA_ROW_GROUP = 8 threads that share a warp. The arithmetic and its order are these lines on
 * both, so both give the same bits (the canonical sums of mica_math.h, the rest in increasing
 * index). Rows of n elements; the norms' statistics are per row.
 *
 * The rows are written against these names, sequential here unless the includer defines
 * MICA_ROW_GROUP first (mica_cuda_kernels.h does, with the cooperative versions):
 *   MICA_ROW_FN                         a row function's qualifiers
 *   MICA_ROW_FOR(j, lo, hi)             this thread's share of [lo, hi), increasing: the j with
 *                                       j % MICA_ROW_GROUP == its lane (all of them for one thread)
 *   MICA_ROW_OWNS(j), MICA_ROW_LEAD     whether this thread owns element j; writes the row's scalars
 *   MICA_ROW_SUM(S, x, n)               the canonical sum of x[0, n), in every thread of the group
 *   MICA_ROW_SUM_EXPR(T, S, n, r, EXPR) r = the canonical sum of EXPR over j in [0, n)
 *   MICA_ROW_MAX(S, x, n)               mica_row_max's element: the first NaN, else the last largest
 *   MICA_ROW_EACH(T, j, lo, hi, x, xj, y, yj, BODY)
 *                                       MICA_ROW_FOR whose body starts with xj = x[j], yj = y[j]:
 *                                       a target may load several j's first (their loads in flight
 *                                       together: CUDA), so BODY reads x and y at j alone;
 *                                       MICA_ROW_EACH1(T, j, lo, hi, x, xj, BODY) with x alone
 *   MICA_ROW_RESTRICT                   (optional) the qualifier of a row's arrays, which never
 *                                       overlap (cross-entropy's backward, which may run in place,
 *                                       has none): CUDA says __restrict__, so loads go out early
 * A thread reads back only elements it owns (the canonical sum's lane l is the j with j % 8 == l,
 * blocks being multiples of 8 long), so a row needs no barrier: its threads meet only inside the
 * sums' and the max's exchanges. */
#ifndef MICA_ROWS_H
#define MICA_ROWS_H
#include "mica_math.h"

/* a row kernel's bad input stops the program with one sentence, the same on every target and in
 * the oracle (mica/ops/nn.py); its two numbers are the value and the count it must stay below */
#define MICA_CROSS_ENTROPY_RANGE_TEXT \
    "cross_entropy: target %lld is out of range for %lld classes; give targets below the class count, or ignore_index"
#define MICA_NLL_LOSS_RANGE_TEXT \
    "nll_loss: target %lld is out of range for %lld classes; give targets below the class count, or ignore_index"
#define MICA_INDEX_RANGE_TEXT \
    "an index tensor holds %lld, out of range for a dim of %lld elements; give indices from -size to size - 1"
#define MICA_POSITION_RANGE_TEXT \
    "an index tensor holds %lld, out of range for a dim of %lld elements; give indices from 0 to size - 1"
#define MICA_CLASS_RANGE_TEXT \
    "one_hot: class %lld is out of range for %lld classes; give classes from 0 to num_classes - 1"
#define MICA_MASK_COUNT_TEXT                                                                        \
    "x[mask] = values: the mask selects %lld elements and values holds %lld; give one value per True element (torch " \
    "refuses the shape mismatch too)"
#define MICA_EMBEDDING_RANGE_TEXT                                                                   \
    "embedding: index %lld is out of range for %lld embeddings; give indices below the table's row count (a data " \
    "id beyond the vocabulary?)"

#ifndef MICA_ROW_GROUP
#define MICA_ROW_GROUP 1
#define MICA_ROW_FN static inline MICA_HD
#define MICA_ROW_FOR(j, lo, hi) for (int64_t j = (lo); j < (hi); j++)
#define MICA_ROW_OWNS(j) 1
#define MICA_ROW_LEAD 1
#define MICA_ROW_SUM(S, x, n) mica_sum_##S(x, n)
#define MICA_ROW_SUM_EXPR(T, S, n, result, EXPR) MICA_SUM_EXPR(T, n, result, EXPR)
#define MICA_ROW_MAX(S, x, n) mica_row_max_##S(x, n)
#endif
#ifndef MICA_ROW_EACH
#define MICA_ROW_EACH(T, j, lo, hi, x, xj, y, yj, ...)                                             \
    MICA_ROW_FOR(j, lo, hi) { const T xj = (x)[j], yj = (y)[j]; (void)xj; (void)yj; __VA_ARGS__ }
#endif
/* (one array: its loads are the same address twice, which the compiler loads once) */
#define MICA_ROW_EACH1(T, j, lo, hi, x, xj, ...) MICA_ROW_EACH(T, j, lo, hi, x, xj, x, xj##_again, __VA_ARGS__)
#ifndef MICA_ROW_RESTRICT
#define MICA_ROW_RESTRICT /* (a row's inputs and outputs never overlap; a target may say so: restrict) */
#endif

#define MICA_DEFINE_ROWS(T, S)                                                                     \
static inline MICA_HD T mica_row_max_seq_##S(const T *x, int64_t n) {                              \
    T m = x[0];                                                                                    \
    for (int64_t j = 1; j < n; j++) m = mica_max_##S(m, x[j]);                                     \
    return m;                                                                                      \
}                                                                                                  \
/* mica_max over x[0, n) left to right: the first NaN, else the last largest. Sixteen lanes first  \
 * (vectorized), met in a tree; their maximum is the answer unless the row holds a NaN or the      \
 * maximum is zero (whose sign is the last zero's), and then the left-to-right pass decides: any   \
 * other maximum is the same value in any order, so the same bits. */                             \
static inline MICA_HD T mica_row_max_##S(const T *x, int64_t n) {                                  \
    if (n < 32) return mica_row_max_seq_##S(x, n);                                                 \
    T lane[16];                                                                                    \
    int odd[16];                                                                                   \
    for (int l = 0; l < 16; l++) { lane[l] = x[l]; odd[l] = x[l] != x[l]; }                        \
    int64_t j = 16;                                                                                \
    for (; j + 16 <= n; j += 16)                                                                   \
        for (int l = 0; l < 16; l++) {                                                             \
            T v = x[j + l];                                                                        \
            odd[l] |= v != v;                                                                      \
            lane[l] = lane[l] > v ? lane[l] : v;                                                   \
        }                                                                                          \
    int bad = 0;                                                                                   \
    for (int l = 0; l < 16; l++) bad |= odd[l];                                                    \
    for (int h = 8; h >= 1; h /= 2)                                                                \
        for (int l = 0; l < h; l++) lane[l] = lane[l] > lane[l + h] ? lane[l] : lane[l + h];       \
    T m = lane[0];                                                                                 \
    for (; j < n; j++) { bad |= x[j] != x[j]; m = x[j] > m ? x[j] : m; }                           \
    return bad || m == (T)0 ? mica_row_max_seq_##S(x, n) : m;                                      \
}                                                                                                  \
MICA_ROW_FN void mica_layer_norm_row_##S(const T *MICA_ROW_RESTRICT xr, const T *MICA_ROW_RESTRICT w, const T *MICA_ROW_RESTRICT b, T *MICA_ROW_RESTRICT yr, T *mean,      \
                                         T *rstd, int64_t n, T eps) {                              \
    T mu = MICA_ROW_SUM(S, xr, n) / (T)n, var;                                                     \
    MICA_ROW_SUM_EXPR(T, S, n, var, (xr[j] - mu) * (xr[j] - mu));                                  \
    T rs = (T)1 / mica_sqrt_##S(var / (T)n + eps);                                                 \
    MICA_ROW_FOR(j, 0, n) {                                                                        \
        T v = (xr[j] - mu) * rs;                                                                   \
        if (w) v = v * w[j];                                                                       \
        if (b) v = v + b[j];                                                                       \
        yr[j] = v;                                                                                 \
    }                                                                                              \
    if (MICA_ROW_LEAD) {                                                                           \
        *mean = mu;                                                                                \
        *rstd = rs;                                                                                \
    }                                                                                              \
}                                                                                                  \
MICA_ROW_FN void mica_layer_norm_backward_row_##S(const T *MICA_ROW_RESTRICT gr, const T *MICA_ROW_RESTRICT xr, const T *MICA_ROW_RESTRICT w, T mu, T rs, \
                                                  T *dr, int64_t n) {                              \
    MICA_ROW_FOR(j, 0, n) dr[j] = w ? gr[j] * w[j] : gr[j];                                        \
    T a = MICA_ROW_SUM(S, dr, n) / (T)n, c;                                                        \
    MICA_ROW_SUM_EXPR(T, S, n, c, dr[j] * ((xr[j] - mu) * rs));                                    \
    c = c / (T)n;                                                                                  \
    MICA_ROW_FOR(j, 0, n) {                                                                        \
        T xh = (xr[j] - mu) * rs;                                                                  \
        dr[j] = rs * ((dr[j] - a) - xh * c);                                                       \
    }                                                                                              \
}                                                                                                  \
MICA_ROW_FN void mica_rms_norm_row_##S(const T *MICA_ROW_RESTRICT xr, const T *MICA_ROW_RESTRICT w, T *MICA_ROW_RESTRICT yr, T *rstd, int64_t n, T eps) { \
    T ms;                                                                                          \
    MICA_ROW_SUM_EXPR(T, S, n, ms, xr[j] * xr[j]);                                                 \
    T rs = (T)1 / mica_sqrt_##S(ms / (T)n + eps);                                                  \
    MICA_ROW_FOR(j, 0, n) yr[j] = w ? (xr[j] * rs) * w[j] : xr[j] * rs;                            \
    if (MICA_ROW_LEAD) *rstd = rs;                                                                 \
}                                                                                                  \
MICA_ROW_FN void mica_rms_norm_backward_row_##S(const T *MICA_ROW_RESTRICT gr, const T *MICA_ROW_RESTRICT xr, const T *MICA_ROW_RESTRICT w, T rs, T *MICA_ROW_RESTRICT dr, \
                                                int64_t n) {                                       \
    MICA_ROW_FOR(j, 0, n) { T gx = w ? gr[j] * w[j] : gr[j]; dr[j] = gx * (xr[j] * rs); }          \
    T c = MICA_ROW_SUM(S, dr, n) / (T)n;                                                           \
    MICA_ROW_FOR(j, 0, n) {                                                                        \
        T gx = w ? gr[j] * w[j] : gr[j];                                                           \
        dr[j] = rs * (gx - (xr[j] * rs) * c);                                                      \
    }                                                                                              \
}                                                                                                  \
MICA_ROW_FN void mica_softmax_row_##S(const T *MICA_ROW_RESTRICT xr, T *MICA_ROW_RESTRICT yr, int64_t n) {                             \
    T m = MICA_ROW_MAX(S, xr, n);                                                                  \
    MICA_ROW_FOR(j, 0, n) yr[j] = mica_exp_##S(xr[j] - m);                                         \
    T s = MICA_ROW_SUM(S, yr, n);                                                                  \
    MICA_ROW_FOR(j, 0, n) yr[j] = yr[j] / s;                                                       \
}                                                                                                  \
MICA_ROW_FN void mica_softmax_backward_row_##S(const T *MICA_ROW_RESTRICT gr, const T *MICA_ROW_RESTRICT yr, T *MICA_ROW_RESTRICT dr, int64_t n) {       \
    MICA_ROW_FOR(j, 0, n) dr[j] = gr[j] * yr[j];                                                   \
    T dot = MICA_ROW_SUM(S, dr, n);                                                                \
    MICA_ROW_FOR(j, 0, n) dr[j] = yr[j] * (gr[j] - dot);                                           \
}                                                                                                  \
MICA_ROW_FN void mica_log_softmax_row_##S(const T *MICA_ROW_RESTRICT xr, T *MICA_ROW_RESTRICT yr, int64_t n) {                         \
    T m = MICA_ROW_MAX(S, xr, n);                                                                  \
    MICA_ROW_FOR(j, 0, n) yr[j] = mica_exp_##S(xr[j] - m);                                         \
    T lse = mica_log_##S(MICA_ROW_SUM(S, yr, n));                                                  \
    MICA_ROW_FOR(j, 0, n) yr[j] = (xr[j] - m) - lse;                                               \
}                                                                                                  \
MICA_ROW_FN void mica_log_softmax_backward_row_##S(const T *MICA_ROW_RESTRICT gr, const T *MICA_ROW_RESTRICT yr, T *MICA_ROW_RESTRICT dr, int64_t n) {   \
    T s = MICA_ROW_SUM(S, gr, n);                                                                  \
    MICA_ROW_FOR(j, 0, n) dr[j] = gr[j] - mica_exp_##S(yr[j]) * s;                                 \
}                                                                                                  \
MICA_ROW_FN void mica_cross_entropy_backward_row_##S(T g, const T *xr, int64_t k, T l, T *dr,      \
                                                     int64_t n, int64_t ignore) {                  \
    T gr = k == ignore ? (T)0 : g;                                                                 \
    int own = k != ignore && k >= 0 && k < n && MICA_ROW_OWNS(k);                                  \
    T xk = own ? xr[k] : (T)0; /* read before the row is written: dr may be xr (in place) */      \
    MICA_ROW_EACH1(T, j, 0, n, xr, xj, dr[j] = mica_exp_##S(xj - l) * gr;) /* (all 8 read first) */ \
    if (own) dr[k] = (mica_exp_##S(xk - l) - (T)1) * gr;                                           \
}

MICA_DEFINE_ROWS(float, f32)
MICA_DEFINE_ROWS(double, f64)

/* ---- attention ----------------------------------------------------------------------------------
 * q [BH, L, E], k [BH, S, E], v [BH, S, Ev] given by strides (bh index split as b * H + h), the
 * last dim contiguous. Causal masks j > i (top-left aligned, as PyTorch). The rows below are the
 * CPU kernel's softmax steps: the scores (already scaled) come from a product; what follows them
 * is these lines. The CUDA target's fused kernels (mica_cuda_attention.h) take this record and
 * mica_attn_row_keys, and compute the same formulas tile by tile (an online softmax). */
typedef struct {
    int64_t B, H, L, S, E, Ev;
    int64_t q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st;
    int64_t dq_sb, dq_sh, dq_st, dk_sb, dk_sh, dk_st, dv_sb, dv_sh, dv_st; /* the backward's outputs */
    int causal;
    double scale, dropout_p;
    uint32_t stream, threshold;
    const int64_t *rng;
    int half_round; /* fp_half_intermediates: 0 none (every digit kept), 1 bfloat16, 2 float16 */
} mica_attn_shape;

/* x rounded to the half type the record names (x itself when it names none) */
#define MICA_ATTN_ROUND(a, T, x) ((a)->half_round == 1 ? (T)mica_round_bf16((float)(x))                 \
                                  : (a)->half_round == 2 ? (T)mica_round_f16((float)(x)) : (x))

/* the keys query row i sees */
static inline MICA_HD int64_t mica_attn_row_keys(const mica_attn_shape *a, int64_t i) {
    return a->causal ? (i + 1 < a->S ? i + 1 : a->S) : a->S;
}

/* the elements a row's elementwise loops run over: its m visible keys rounded up to 16 (a vector
 * of floats), at most the n it holds, so the loops have no scalar tail; what they compute past the
 * visible keys is overwritten with 0 afterwards, and the row's max and sums read only [0, m) */
static inline MICA_HD int64_t mica_attn_row_span(int64_t m, int64_t n) {
    int64_t w = (m + 15) / 16 * 16;
    return w < n ? w : n;
}

/* mica_row_max of a row's m visible scores x[0, m), where its loops run to w (mica_attn_row_span):
 * on the CPU [m, w) is set to -inf first (overwritten after) and mica_row_max runs over all w, its
 * sixteen lanes with no scalar tail when w is whole vectors; a -inf past the visible scores changes
 * no maximum, no first NaN and no zero's sign, so the same bits. Elsewhere (a group of threads per
 * row) MICA_ROW_MAX over the m. */
#if MICA_ROW_GROUP == 1
#define MICA_DEFINE_ATTN_MAX(T, S_)                                                                \
static inline T mica_attn_row_max_##S_(T *x, int64_t m, int64_t w) {                               \
    for (int64_t j = m; j < w; j++) x[j] = (T)-INFINITY;                                           \
    return mica_row_max_##S_(x, w);                                                                \
}
#else
#define MICA_DEFINE_ATTN_MAX(T, S_)                                                                \
MICA_ROW_FN T mica_attn_row_max_##S_(T *x, int64_t m, int64_t w) { (void)w; return MICA_ROW_MAX(S_, x, m); }
#endif
MICA_DEFINE_ATTN_MAX(float, f32)
MICA_DEFINE_ATTN_MAX(double, f64)

/* query row i of head bh: its scores pi[0, n) become the (dropped) probabilities, its
 * log-sum-exp is stored; keys it cannot see (m_ <= j < n) get 0. And the backward's row: pi holds
 * the scores (scaled), di the output gradient's product with V; they become the dropped
 * probabilities (for dV) and dS (for dQ and dK); D is the row's dot product of the output gradient
 * with the output, summed in increasing index (mica_attn_row_dots).
 * With a->half_round (fp_half_intermediates) the rows round where PyTorch's CPU attention rounds
 * (measured: docs/design.md, Mixed precision): the forward rounds exp(s - max) to the half type
 * and leaves it undivided, its float sum in *sum (the product with V reads the rounded weights,
 * and its result is divided by the sum, as PyTorch's flash kernel and the CUDA target's divide
 * theirs); the backward rounds the probabilities (for dV) and dS before its scale (for dQ and dK). */
#define MICA_DEFINE_ATTENTION_ROWS(T, S_)                                                           \
MICA_ROW_FN void mica_attention_row_##S_(const mica_attn_shape *a, int64_t bh, int64_t i, T *pi,    \
                                         int64_t n, T *lse, T *sum) {                              \
    const int64_t m_ = mica_attn_row_keys(a, i), w = mica_attn_row_span(m_, n);                   \
    const T keep_scale = (T)(1.0 / (1.0 - a->dropout_p));                                          \
    T m = mica_attn_row_max_##S_(pi, m_, w);                                                       \
    MICA_ROW_EACH1(T, j, 0, w, pi, sj, pi[j] = mica_exp_##S_(sj - m);)                             \
    T l = MICA_ROW_SUM(S_, pi, m_);                                                                \
    if (MICA_ROW_LEAD) *lse = m + mica_log_##S_(l);                                                \
    if (MICA_ROW_LEAD && a->half_round) *sum = l;                                                  \
    if (a->half_round == 1) MICA_ROW_FOR(j, 0, w) pi[j] = (T)mica_round_bf16((float)pi[j]);        \
    else if (a->half_round == 2) MICA_ROW_FOR(j, 0, w) pi[j] = (T)mica_round_f16((float)pi[j]);    \
    else MICA_ROW_EACH1(T, j, 0, w, pi, ej, pi[j] = ej / l;)                                       \
    MICA_ROW_FOR(j, m_, n) pi[j] = (T)0;                                                           \
    if (a->dropout_p > 0) {                                                                        \
        uint64_t base = ((uint64_t)bh * a->L + i) * a->S;                                          \
        MICA_ROW_EACH1(T, j, 0, m_, pi, pj,                                                        \
            pi[j] = mica_keep(a->rng, a->stream, base + j, a->threshold) ? pj * keep_scale : (T)0;)  \
    }                                                                                              \
}                                                                                                  \
MICA_ROW_FN void mica_attention_backward_row_##S_(const mica_attn_shape *a, int64_t bh, int64_t i,  \
                                                  T *MICA_ROW_RESTRICT pi, T *MICA_ROW_RESTRICT di, int64_t n, T li, T D) {            \
    const int64_t m_ = mica_attn_row_keys(a, i), w = mica_attn_row_span(m_, n);                   \
    const T scale = (T)a->scale, keep_scale = (T)(1.0 / (1.0 - a->dropout_p));                     \
    if (a->dropout_p > 0) {                                                                        \
        uint64_t base = ((uint64_t)bh * a->L + i) * a->S;                                          \
        MICA_ROW_EACH(T, j, 0, m_, pi, sj, di, dj,                                                 \
            T pj = mica_exp_##S_(sj - li), dpj = dj;                                                \
            int kept = mica_keep(a->rng, a->stream, base + j, a->threshold);                       \
            dpj = kept ? dpj * keep_scale : (T)0;                                                  \
            pi[j] = MICA_ATTN_ROUND(a, T, kept ? pj * keep_scale : (T)0);                          \
            di[j] = MICA_ATTN_ROUND(a, T, pj * (dpj - D)) * scale;)                                \
    } else if (a->half_round == 1) { /* (a branch per half type: each loop vectorizes) */          \
        MICA_ROW_FOR(j, 0, w) {                                                                    \
            T pj = mica_exp_##S_(pi[j] - li);                                                       \
            di[j] = (T)mica_round_bf16((float)(pj * (di[j] - D))) * scale;                         \
            pi[j] = (T)mica_round_bf16((float)pj);                                                 \
        }                                                                                          \
    } else if (a->half_round == 2) {                                                               \
        MICA_ROW_FOR(j, 0, w) {                                                                    \
            T pj = mica_exp_##S_(pi[j] - li);                                                       \
            di[j] = (T)mica_round_f16((float)(pj * (di[j] - D))) * scale;                          \
            pi[j] = (T)mica_round_f16((float)pj);                                                  \
        }                                                                                          \
    } else { /* the common case, kept apart so it vectorizes */                                    \
        MICA_ROW_EACH(T, j, 0, w, pi, sj, di, dj,                                                  \
            T pj = mica_exp_##S_(sj - li);                                                          \
            di[j] = (pj * (dj - D)) * scale;                                                       \
            pi[j] = pj;)                                                                           \
    }                                                                                              \
    MICA_ROW_FOR(j, m_, n) { pi[j] = (T)0; di[j] = (T)0; }                                         \
}

MICA_DEFINE_ATTENTION_ROWS(float, f32)
MICA_DEFINE_ATTENTION_ROWS(double, f64)
#endif
