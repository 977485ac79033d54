/* Mica's hand-written CUDA kernels for the row-wise primitives: layer and RMS norm, softmax,
 * log-softmax, cross-entropy, embedding, each with its backward. Each is a __device__ routine a
 * generated kernel calls; it walks its rows (or columns, or vocabulary rows) grid-stride, one
 * thread each, and does exactly the CPU kernels' arithmetic in the CPU kernels' order (the
 * canonical sums of mica_math.h, dot products in increasing index): the same bits as the CPU
 * target, for any launch configuration. (Thread-per-row is the correct first step; cooperative
 * blocks that keep the canonical order are the fast one.) Embedding's backward sums each row's
 * gradients in increasing position, without atomics. They take the CPU kernels' arguments, so one
 * lowering rule per primitive serves both targets.
 */
#ifndef MICA_CUDA_KERNELS_H
#define MICA_CUDA_KERNELS_H
#include "mica_cuda.h"
#include "mica_rows.h"

/* a kernel that meets bad input (an index out of range) records it; the host turns it into a
 * sentence after the launch (mica_cuda_kernel_failed) */
typedef struct {
    int failed;
    long long a, b;
    int what;
} mica_cuda_failure;
static __device__ mica_cuda_failure mica_cuda_fail_state;

static __device__ void mica_cuda_fail(int what, long long a, long long b) {
    if (!mica_cuda_fail_state.failed) {
        mica_cuda_fail_state.a = a;
        mica_cuda_fail_state.b = b;
        mica_cuda_fail_state.what = what;
        mica_cuda_fail_state.failed = 1;
    }
}

static int mica_cuda_kernel_failed(void) {
    mica_cuda_failure f;
    if (cudaMemcpyFromSymbol(&f, mica_cuda_fail_state, sizeof f) != cudaSuccess) return mica_cuda_failed("reading a kernel's status");
    if (!f.failed) return 0;
    snprintf(mica_error_text, sizeof mica_error_text,
             f.what == 0 ? "cross_entropy: target %lld is out of range for %lld classes"
                         : "embedding: index %lld is out of range for %lld embeddings", f.a, f.b);
    mica_cuda_failure clear = {0, 0, 0, 0};
    cudaMemcpyToSymbol(mica_cuda_fail_state, &clear, sizeof clear);
    return 1;
}

#define MICA_GRID_STRIDE(i, n)                                                                      \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* the column sums of an [rows, n] expression in the canonical order per column (lanes by row) */
#define MICA_CUDA_COLUMN_SUMS(T, rows, n, out, EXPR)                                                \
    MICA_GRID_STRIDE(j, n) {                                                                       \
        T tot = 0;                                                                                 \
        for (int64_t b0 = 0; b0 < (rows) || b0 == 0; b0 += MICA_BLOCK) {                          \
            int64_t b1 = (rows) - b0 < MICA_BLOCK ? (rows) : b0 + MICA_BLOCK;                      \
            T acc[MICA_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};                                          \
            for (int64_t r = b0; r < b1; r++) acc[(r - b0) & (MICA_LANES - 1)] += (EXPR);          \
            tot = b0 == 0 ? MICA_TREE8(acc) : tot + MICA_TREE8(acc);                               \
            if ((rows) == 0) break;                                                                \
        }                                                                                          \
        (out)[j] = tot;                                                                            \
    }

#define MICA_DEFINE_CUDA_KERNELS(T, S)                                                             \
static __device__ void mica_layer_norm_##S(const T *x, const T *w, const T *b, T *y, T *mean,      \
                                           T *rstd, int64_t rows, int64_t n, T eps) {             \
    MICA_GRID_STRIDE(r, rows) mica_layer_norm_row_##S(x + r * n, w, b, y + r * n, mean + r, rstd + r, n, eps); \
}                                                                                                  \
static __device__ void mica_layer_norm_backward_##S(const T *g, const T *x, const T *w,            \
                                                    const T *mean, const T *rstd, T *dx, T *dw,    \
                                                    T *db, int64_t rows, int64_t n) {             \
    MICA_GRID_STRIDE(r, rows)                                                                      \
        mica_layer_norm_backward_row_##S(g + r * n, x + r * n, w, mean[r], rstd[r], dx + r * n, n); \
    if (dw) { MICA_CUDA_COLUMN_SUMS(T, rows, n, dw, g[r * n + j] * ((x[r * n + j] - mean[r]) * rstd[r])) } \
    if (db) { MICA_CUDA_COLUMN_SUMS(T, rows, n, db, g[r * n + j]) }                                \
}                                                                                                  \
static __device__ void mica_rms_norm_##S(const T *x, const T *w, T *y, T *rstd, int64_t rows,      \
                                         int64_t n, T eps) {                                       \
    MICA_GRID_STRIDE(r, rows) mica_rms_norm_row_##S(x + r * n, w, y + r * n, rstd + r, n, eps);    \
}                                                                                                  \
static __device__ void mica_rms_norm_backward_##S(const T *g, const T *x, const T *w,              \
                                                  const T *rstd, T *dx, T *dw, int64_t rows,       \
                                                  int64_t n) {                                     \
    MICA_GRID_STRIDE(r, rows) mica_rms_norm_backward_row_##S(g + r * n, x + r * n, w, rstd[r], dx + r * n, n); \
    if (dw) { MICA_CUDA_COLUMN_SUMS(T, rows, n, dw, g[r * n + j] * (x[r * n + j] * rstd[r])) }     \
}                                                                                                  \
static __device__ void mica_softmax_##S(const T *x, T *y, int64_t rows, int64_t n) {               \
    MICA_GRID_STRIDE(r, rows) mica_softmax_row_##S(x + r * n, y + r * n, n);                       \
}                                                                                                  \
static __device__ void mica_softmax_backward_##S(const T *g, const T *y, T *dx, int64_t rows,      \
                                                 int64_t n) {                                      \
    MICA_GRID_STRIDE(r, rows) mica_softmax_backward_row_##S(g + r * n, y + r * n, dx + r * n, n);  \
}                                                                                                  \
static __device__ void mica_log_softmax_##S(const T *x, T *y, int64_t rows, int64_t n) {           \
    MICA_GRID_STRIDE(r, rows) mica_log_softmax_row_##S(x + r * n, y + r * n, n);                   \
}                                                                                                  \
static __device__ void mica_log_softmax_backward_##S(const T *g, const T *y, T *dx, int64_t rows,  \
                                                     int64_t n) {                                  \
    MICA_GRID_STRIDE(r, rows) mica_log_softmax_backward_row_##S(g + r * n, y + r * n, dx + r * n, n); \
}                                                                                                  \
/* the exponentials' sum computed as they are made: the CPU's stored row, summed in the same order */ \
static __device__ void mica_cross_entropy_##S(const T *x, const int64_t *t, T *loss, T *lse,       \
                                              int64_t rows, int64_t n, int64_t ignore, T *unused) {\
    (void)unused; /* (the CPU kernel's per-thread row of exponentials: not needed here) */        \
    MICA_GRID_STRIDE(r, rows) {                                                                    \
        const T *xr = x + r * n;                                                                   \
        T m = mica_row_max_##S(xr, n), s;                                                          \
        MICA_SUM_EXPR(T, n, s, mica_exp_##S(xr[j] - m));                                           \
        T l = m + mica_log_##S(s);                                                                 \
        int64_t k = t[r];                                                                          \
        lse[r] = l;                                                                                \
        if (k == ignore) { loss[r] = 0; continue; }                                                \
        if (k < 0 || k >= n) { mica_cuda_fail(0, k, n); loss[r] = 0; continue; }                   \
        loss[r] = l - xr[k];                                                                       \
    }                                                                                              \
}                                                                                                  \
static __device__ void mica_cross_entropy_backward_##S(const T *g, const T *x, const int64_t *t,   \
                                                       const T *lse, T *dx, int64_t rows,          \
                                                       int64_t n, int64_t ignore) {                \
    MICA_GRID_STRIDE(r, rows)                                                                      \
        mica_cross_entropy_backward_row_##S(g[r], x + r * n, t[r], lse[r], dx + r * n, n, ignore); \
}                                                                                                  \
static __device__ void mica_embedding_##S(const int64_t *idx, const T *w, T *y, int64_t count,     \
                                          int64_t V, int64_t D) {                                  \
    MICA_GRID_STRIDE(i, count) {                                                                   \
        int64_t k = idx[i];                                                                        \
        if (k < 0 || k >= V) { mica_cuda_fail(1, k, V); continue; }                                \
        for (int64_t d = 0; d < D; d++) y[i * D + d] = w[k * D + d];                               \
    }                                                                                              \
}                                                                                                  \
/* dw[v] = the sum of g[i] over the positions i with idx[i] == v, in increasing i (the CPU's and the \
 * oracle's order): a thread per vocabulary row, no atomics */                                     \
static __device__ void mica_embedding_backward_##S(const T *g, const int64_t *idx, T *dw,          \
                                                   int64_t count, int64_t V, int64_t D,            \
                                                   int64_t *unused) {                              \
    (void)unused; /* (the CPU kernel's bucket order: not needed here) */                          \
    MICA_GRID_STRIDE(v, V) {                                                                       \
        T *out = dw + v * D;                                                                       \
        for (int64_t d = 0; d < D; d++) out[d] = 0;                                                \
        for (int64_t i = 0; i < count; i++) {                                                      \
            int64_t k = idx[i];                                                                    \
            if (k < 0 || k >= V) { mica_cuda_fail(1, k, V); continue; }                            \
            if (k != v) continue;                                                                  \
            for (int64_t d = 0; d < D; d++) out[d] = out[d] + g[i * D + d];                        \
        }                                                                                          \
    }                                                                                              \
}

MICA_DEFINE_CUDA_KERNELS(float, f32)
MICA_DEFINE_CUDA_KERNELS(double, f64)
#endif
