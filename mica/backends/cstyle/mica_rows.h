/* One row of each row-wise primitive, written once for every target: the CPU's kernels run them
 * over rows with OpenMP, the CUDA kernels one thread per row; the arithmetic and its order are
 * these lines on both, so both give the same bits (the canonical sums of mica_math.h, the rest in
 * increasing index). Rows of n elements; the norms' statistics are per row. */
#ifndef MICA_ROWS_H
#define MICA_ROWS_H
#include "mica_math.h"

#define MICA_DEFINE_ROWS(T, S)                                                                     \
static inline MICA_HD T mica_row_max_##S(const T *x, int64_t n) {                                  \
    T m = x[0];                                                                                    \
    for (int64_t j = 1; j < n; j++) m = mica_max_##S(m, x[j]);                                     \
    return m;                                                                                      \
}                                                                                                  \
static inline MICA_HD void mica_layer_norm_row_##S(const T *xr, const T *w, const T *b, T *yr,     \
                                                   T *mean, T *rstd, int64_t n, T eps) {           \
    T mu = mica_sum_##S(xr, n) / (T)n, var;                                                        \
    MICA_SUM_EXPR(T, n, var, (xr[j] - mu) * (xr[j] - mu));                                         \
    T rs = (T)1 / mica_sqrt_##S(var / (T)n + eps);                                                 \
    for (int64_t j = 0; j < n; j++) {                                                              \
        T v = (xr[j] - mu) * rs;                                                                   \
        if (w) v = v * w[j];                                                                       \
        if (b) v = v + b[j];                                                                       \
        yr[j] = v;                                                                                 \
    }                                                                                              \
    *mean = mu;                                                                                    \
    *rstd = rs;                                                                                    \
}                                                                                                  \
static inline MICA_HD void mica_layer_norm_backward_row_##S(const T *gr, const T *xr, const T *w,  \
                                                            T mu, T rs, T *dr, int64_t n) {        \
    for (int64_t j = 0; j < n; j++) dr[j] = w ? gr[j] * w[j] : gr[j];                              \
    T a = mica_sum_##S(dr, n) / (T)n, c;                                                           \
    MICA_SUM_EXPR(T, n, c, dr[j] * ((xr[j] - mu) * rs));                                           \
    c = c / (T)n;                                                                                  \
    for (int64_t j = 0; j < n; j++) {                                                              \
        T xh = (xr[j] - mu) * rs;                                                                  \
        dr[j] = rs * ((dr[j] - a) - xh * c);                                                       \
    }                                                                                              \
}                                                                                                  \
static inline MICA_HD void mica_rms_norm_row_##S(const T *xr, const T *w, T *yr, T *rstd,          \
                                                 int64_t n, T eps) {                               \
    T ms;                                                                                          \
    MICA_SUM_EXPR(T, n, ms, xr[j] * xr[j]);                                                        \
    T rs = (T)1 / mica_sqrt_##S(ms / (T)n + eps);                                                  \
    for (int64_t j = 0; j < n; j++) yr[j] = w ? (xr[j] * rs) * w[j] : xr[j] * rs;                  \
    *rstd = rs;                                                                                    \
}                                                                                                  \
static inline MICA_HD void mica_rms_norm_backward_row_##S(const T *gr, const T *xr, const T *w,    \
                                                          T rs, T *dr, int64_t n) {                \
    for (int64_t j = 0; j < n; j++) { T gx = w ? gr[j] * w[j] : gr[j]; dr[j] = gx * (xr[j] * rs); } \
    T c = mica_sum_##S(dr, n) / (T)n;                                                              \
    for (int64_t j = 0; j < n; j++) {                                                              \
        T gx = w ? gr[j] * w[j] : gr[j];                                                           \
        dr[j] = rs * (gx - (xr[j] * rs) * c);                                                      \
    }                                                                                              \
}                                                                                                  \
static inline MICA_HD void mica_softmax_row_##S(const T *xr, T *yr, int64_t n) {                   \
    T m = mica_row_max_##S(xr, n);                                                                 \
    for (int64_t j = 0; j < n; j++) yr[j] = mica_exp_##S(xr[j] - m);                               \
    T s = mica_sum_##S(yr, n);                                                                     \
    for (int64_t j = 0; j < n; j++) yr[j] = yr[j] / s;                                             \
}                                                                                                  \
static inline MICA_HD void mica_softmax_backward_row_##S(const T *gr, const T *yr, T *dr,          \
                                                         int64_t n) {                              \
    for (int64_t j = 0; j < n; j++) dr[j] = gr[j] * yr[j];                                         \
    T dot = mica_sum_##S(dr, n);                                                                   \
    for (int64_t j = 0; j < n; j++) dr[j] = yr[j] * (gr[j] - dot);                                 \
}                                                                                                  \
static inline MICA_HD void mica_log_softmax_row_##S(const T *xr, T *yr, int64_t n) {               \
    T m = mica_row_max_##S(xr, n);                                                                 \
    for (int64_t j = 0; j < n; j++) yr[j] = mica_exp_##S(xr[j] - m);                               \
    T lse = mica_log_##S(mica_sum_##S(yr, n));                                                     \
    for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - m) - lse;                                     \
}                                                                                                  \
static inline MICA_HD void mica_log_softmax_backward_row_##S(const T *gr, const T *yr, T *dr,      \
                                                             int64_t n) {                          \
    T s = mica_sum_##S(gr, n);                                                                     \
    for (int64_t j = 0; j < n; j++) dr[j] = gr[j] - mica_exp_##S(yr[j]) * s;                       \
}                                                                                                  \
static inline MICA_HD void mica_cross_entropy_backward_row_##S(T g, const T *xr, int64_t k, T l,   \
                                                               T *dr, int64_t n, int64_t ignore) { \
    T gr = k == ignore ? (T)0 : g;                                                                 \
    for (int64_t j = 0; j < n; j++) dr[j] = mica_exp_##S(xr[j] - l) * gr;                          \
    if (k != ignore && k >= 0 && k < n) dr[k] = (mica_exp_##S(xr[k] - l) - (T)1) * gr;             \
}

MICA_DEFINE_ROWS(float, f32)
MICA_DEFINE_ROWS(double, f64)

/* ---- attention ----------------------------------------------------------------------------------
 * q [BH, L, E], k [BH, S, E], v [BH, S, Ev] given by strides (bh index split as b * H + h), the
 * last dim contiguous. Causal masks j > i (top-left aligned, as PyTorch). The rows below are the
 * float kernels' softmax steps on both targets: the scores (already scaled) come from a product,
 * which differs per target; what follows them is these lines. */
typedef struct {
    int64_t B, H, L, S, E, Ev;
    int64_t q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st;
    int64_t dq_sb, dq_sh, dq_st, dk_sb, dk_sh, dk_st, dv_sb, dv_sh, dv_st; /* the backward's outputs */
    int causal;
    double scale, dropout_p;
    uint32_t stream, threshold;
    const int64_t *rng;
} mica_attn_shape;

/* the keys query row i sees */
static inline MICA_HD int64_t mica_attn_row_keys(const mica_attn_shape *a, int64_t i) {
    return a->causal ? (i + 1 < a->S ? i + 1 : a->S) : a->S;
}

/* query row i of head bh: its scores pi[0, n) become the (dropped) probabilities, its
 * log-sum-exp is stored; keys it cannot see (m_ <= j < n) get 0. And the backward's row: pi holds
 * the scores (scaled), di the output gradient's product with V; they become the dropped
 * probabilities (for dV) and dS (for dQ and dK). */
#define MICA_DEFINE_ATTENTION_ROWS(T, S_)                                                           \
static inline MICA_HD void mica_attention_row_##S_(const mica_attn_shape *a, int64_t bh, int64_t i,  \
                                                  T *pi, int64_t n, T *lse) {                      \
    const int64_t m_ = mica_attn_row_keys(a, i);                                                   \
    const T keep_scale = (T)(1.0 / (1.0 - a->dropout_p));                                          \
    T m = mica_row_max_##S_(pi, m_);                                                                \
    for (int64_t j = 0; j < m_; j++) pi[j] = mica_exp_##S_(pi[j] - m);                              \
    T l = mica_sum_##S_(pi, m_);                                                                    \
    *lse = m + mica_log_##S_(l);                                                                    \
    for (int64_t j = 0; j < m_; j++) pi[j] = pi[j] / l;                                            \
    for (int64_t j = m_; j < n; j++) pi[j] = (T)0;                                                 \
    if (a->dropout_p > 0) {                                                                        \
        uint64_t base = ((uint64_t)bh * a->L + i) * a->S;                                          \
        for (int64_t j = 0; j < m_; j++)                                                           \
            pi[j] = mica_keep(a->rng, a->stream, base + j, a->threshold) ? pi[j] * keep_scale : (T)0; \
    }                                                                                              \
}                                                                                                  \
static inline MICA_HD void mica_attention_backward_row_##S_(const mica_attn_shape *a, int64_t bh,   \
                                                           int64_t i, T *pi, T *di, int64_t n,     \
                                                           T li, const T *gi, const T *oi) {       \
    const int64_t m_ = mica_attn_row_keys(a, i);                                                   \
    const T scale = (T)a->scale, keep_scale = (T)(1.0 / (1.0 - a->dropout_p));                     \
    T D = (T)0;                                                                                    \
    for (int64_t e = 0; e < a->Ev; e++) D = D + gi[e] * oi[e];                                     \
    if (a->dropout_p > 0) {                                                                        \
        uint64_t base = ((uint64_t)bh * a->L + i) * a->S;                                          \
        for (int64_t j = 0; j < m_; j++) {                                                         \
            T pj = mica_exp_##S_(pi[j] - li), dpj = di[j];                                          \
            int kept = mica_keep(a->rng, a->stream, base + j, a->threshold);                       \
            dpj = kept ? dpj * keep_scale : (T)0;                                                  \
            pi[j] = kept ? pj * keep_scale : (T)0;                                                 \
            di[j] = (pj * (dpj - D)) * scale;                                                      \
        }                                                                                          \
    } else { /* the common case, kept apart so it vectorizes */                                    \
        for (int64_t j = 0; j < m_; j++) {                                                         \
            T pj = mica_exp_##S_(pi[j] - li);                                                       \
            di[j] = (pj * (di[j] - D)) * scale;                                                    \
            pi[j] = pj;                                                                            \
        }                                                                                          \
    }                                                                                              \
    for (int64_t j = m_; j < n; j++) { pi[j] = (T)0; di[j] = (T)0; }                               \
}

MICA_DEFINE_ATTENTION_ROWS(float, f32)
MICA_DEFINE_ATTENTION_ROWS(double, f64)
#endif
