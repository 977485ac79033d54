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
#endif
