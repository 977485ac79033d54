/* Mica's hand-written CUDA kernels for the row-wise primitives: layer and RMS norm, softmax,
 * log-softmax, cross-entropy and embedding, and the backward of softmax, log-softmax and
 * cross-entropy (the backward of the norms and of embedding sum across rows, and are launched
 * from the host: mica_cuda_sweeps.h). Each is a __device__ routine a
 * generated kernel calls, taking the CPU kernels' arguments (so one lowering rule per primitive
 * serves both targets), and each gives the CPU target's bits for any launch configuration.
 *
 * A row is the work of a group of MICA_ROW_GROUP = MICA_LANES = 8 consecutive threads of a warp
 * (rows grid-stride over the groups): mica_rows.h's very row functions, with its names
 * defined here. Thread l of a group takes the elements j with j % 8 == l: in every elementwise
 * pass (8 threads read 8 neighbours: coalesced), and in every canonical sum, where those are
 * exactly lane l of mica_math.h's order (blocks of 8192 being multiples of 8), summed in the
 * sequential code's order; the 8 partials then meet by warp shuffles in MICA_TREE8's tree, every
 * addition with its operands in the tree's order, and blocks are added left to right. The row max
 * is mica_row_max's element, found from each lane's candidate and its index (below). A thread
 * reads back only the elements it wrote, so rows need no barrier.
 *
 * Embedding is a thread per element.
 */
#ifndef MICA_CUDA_KERNELS_H
#define MICA_CUDA_KERNELS_H
#include "mica_cuda.h"

#ifdef MICA_ROWS_H
#error "mica_cuda_kernels.h defines the cooperative rows: include it before mica_rows.h"
#endif
#if MICA_THREADS % MICA_LANES != 0
#error "MICA_THREADS must be a multiple of 8: a row's 8 threads share a warp"
#endif

/* ---- a row's group of 8 threads ------------------------------------------------------------------
 * Blocks are one-dimensional, MICA_THREADS a multiple of 8: a group never straddles a warp. */
#define MICA_ROW_GROUP MICA_LANES
static __device__ __forceinline__ unsigned mica_row_lane(void) { return threadIdx.x & (MICA_ROW_GROUP - 1); }
static __device__ __forceinline__ unsigned mica_row_mask(void) { return 0xFFu << (threadIdx.x & 31u & ~7u); }

/* the rows (or columns, or vocabulary rows) r of this thread's group, grid-stride */
#define MICA_ROW_GROUPS(r, rows)                                                                    \
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / MICA_ROW_GROUP; r < (rows); \
         r += (int64_t)gridDim.x * blockDim.x / MICA_ROW_GROUP)

/* r = the canonical sum of EXPR over i in [0, n), by the group's 8 threads, in every one of them:
 * mica_math.h's MICA_SUM_EXPR with lane l's loop run by thread l */
#define MICA_COOP_SUM(T, S, i, n, result, EXPR)                                                     \
    do {                                                                                           \
        const int64_t n_ = (n);                                                                    \
        T tot_ = 0;                                                                                \
        for (int64_t b0_ = 0; b0_ < n_ || b0_ == 0; b0_ += MICA_BLOCK) {                           \
            const int64_t b1_ = n_ - b0_ < MICA_BLOCK ? n_ : b0_ + MICA_BLOCK;                     \
            T acc_ = 0;                                                                            \
            for (int64_t i = b0_ + mica_row_lane(); i < b1_; i += MICA_LANES) acc_ = acc_ + (EXPR); \
            const T block_ = mica_coop_tree8_##S(acc_);                                            \
            tot_ = b0_ == 0 ? block_ : tot_ + block_;                                              \
            if (n_ <= 0) break;                                                                    \
        }                                                                                          \
        (result) = tot_;                                                                           \
    } while (0)

#define MICA_DEFINE_COOP(T, S)                                                                     \
/* MICA_TREE8 of the group's 8 values, in all 8: ((0+1)+(2+3))+((4+5)+(6+7)), each addition with   \
 * the tree's operand order (addition commutes: only a NaN's payload could tell the difference) */  \
static __device__ __forceinline__ T mica_coop_tree8_##S(T v) {                                     \
    const unsigned lane = mica_row_lane(), mask = mica_row_mask();                                 \
    for (unsigned d = 1; d < MICA_LANES; d <<= 1) {                                                \
        T other = __shfl_xor_sync(mask, v, d);                                                     \
        v = (lane & d) ? other + v : v + other;                                                    \
    }                                                                                              \
    return v;                                                                                      \
}                                                                                                  \
static __device__ __forceinline__ T mica_coop_sum_##S(const T *x, int64_t n) {                     \
    T r;                                                                                           \
    MICA_COOP_SUM(T, S, j, n, r, x[j]);                                                            \
    return r;                                                                                      \
}                                                                                                  \
/* whether x[i] = a is mica_row_max's pick over x[k] = b: mica_max keeps its left operand when it   \
 * is greater or NaN, so a row's max is its first NaN, or else the last of its largest values      \
 * (-0 and +0 tie); an index < 0 is no candidate. A strict order on (value, index): any tree       \
 * of it picks the sequential scan's element */                                                    \
static __device__ __forceinline__ int mica_coop_max_beats_##S(T a, int64_t i, T b, int64_t k) {    \
    if (k < 0 || i < 0) return k < 0;                                                              \
    if (a != a || b != b) return a != a && (b == b || i < k);                                      \
    return a > b || (a == b && i > k);                                                             \
}                                                                                                  \
/* mica_row_max_##S(x, n) by the group (n >= 1): each lane's element by mica_max's own rule, then  \
 * the 8 candidates by their indices; the result is a copy of that element, bit for bit */          \
static __device__ __forceinline__ T mica_coop_max_##S(const T *x, int64_t n) {                     \
    const unsigned mask = mica_row_mask();                                                         \
    const int64_t lane = mica_row_lane();                                                          \
    int64_t at = lane < n ? lane : -1;                                                             \
    T m = lane < n ? x[lane] : (T)0;                                                               \
    for (int64_t j = lane + MICA_LANES; j < n; j += MICA_LANES) {                                  \
        T v = x[j];                                                                                \
        if (!(m > v || m != m)) { m = v; at = j; } /* mica_max(m, v) takes v */                    \
    }                                                                                              \
    for (unsigned d = 1; d < MICA_LANES; d <<= 1) {                                                \
        T om = __shfl_xor_sync(mask, m, d);                                                        \
        int64_t oat = __shfl_xor_sync(mask, at, d);                                                \
        if (mica_coop_max_beats_##S(om, oat, m, at)) { m = om; at = oat; }                         \
    }                                                                                              \
    return m;                                                                                      \
}

MICA_DEFINE_COOP(float, f32)
MICA_DEFINE_COOP(double, f64)

/* mica_rows.h's names, cooperative */
#define MICA_ROW_FN static __device__ __forceinline__
#define MICA_ROW_RESTRICT __restrict__
#define MICA_ROW_FOR(j, lo, hi)                                                                     \
    for (int64_t j = (lo) + (((int64_t)mica_row_lane() - (lo)) & (MICA_ROW_GROUP - 1)); j < (hi); j += MICA_ROW_GROUP)
/* MICA_ROW_FOR whose body starts from x[j] and y[j]: MICA_ROW_AHEAD j's of this thread loaded
 * first, so their loads are in flight together (a row's loop otherwise waits on one pair at a
 * time: the stores between them keep the compiler from moving the next loads up), then the bodies
 * in increasing j; the rest one at a time. Each element's arithmetic is the body's, unchanged. */
#define MICA_ROW_AHEAD 8
#define MICA_ROW_EACH(T, j, lo, hi, x, xj, y, yj, ...)                                               \
    {                                                                                              \
        const int64_t j##_hi = (hi);                                                               \
        int64_t j##_at = (lo) + (((int64_t)mica_row_lane() - (lo)) & (MICA_ROW_GROUP - 1));        \
        for (; j##_at + (MICA_ROW_AHEAD - 1) * MICA_ROW_GROUP < j##_hi; j##_at += MICA_ROW_AHEAD * MICA_ROW_GROUP) { \
            T j##_x[MICA_ROW_AHEAD], j##_y[MICA_ROW_AHEAD];                                        \
            MICA_UNROLL(8) /* (MICA_ROW_AHEAD: a pragma takes no macro) */                         \
            for (int j##_u = 0; j##_u < MICA_ROW_AHEAD; j##_u++) {                                 \
                j##_x[j##_u] = (x)[j##_at + j##_u * MICA_ROW_GROUP];                               \
                j##_y[j##_u] = (y)[j##_at + j##_u * MICA_ROW_GROUP];                               \
            }                                                                                      \
            MICA_UNROLL(8) /* (MICA_ROW_AHEAD: a pragma takes no macro) */                         \
            for (int j##_u = 0; j##_u < MICA_ROW_AHEAD; j##_u++) {                                 \
                const int64_t j = j##_at + j##_u * MICA_ROW_GROUP;                                 \
                const T xj = j##_x[j##_u], yj = j##_y[j##_u];                                      \
                (void)xj; (void)yj;                                                                \
                __VA_ARGS__                                                                        \
            }                                                                                      \
        }                                                                                          \
        for (int64_t j = j##_at; j < j##_hi; j += MICA_ROW_GROUP) {                                \
            const T xj = (x)[j], yj = (y)[j];                                                      \
            (void)xj; (void)yj;                                                                    \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }
#define MICA_ROW_OWNS(j) (((j) & (MICA_ROW_GROUP - 1)) == mica_row_lane())
#define MICA_ROW_LEAD (mica_row_lane() == 0)
#define MICA_ROW_SUM(S, x, n) mica_coop_sum_##S(x, n)
#define MICA_ROW_SUM_EXPR(T, S, n, result, EXPR) MICA_COOP_SUM(T, S, j, n, result, EXPR)
#define MICA_ROW_MAX(S, x, n) mica_coop_max_##S(x, n)
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
    if (atomicCAS(&mica_cuda_fail_state.failed, 0, 1) == 0) {  /* (the first of several threads: one record) */
        mica_cuda_fail_state.a = a;
        mica_cuda_fail_state.b = b;
        mica_cuda_fail_state.what = what;
    }
}

static int mica_cuda_kernel_failed(void) {
    mica_cuda_failure f;
    if (cudaMemcpyFromSymbol(&f, mica_cuda_fail_state, sizeof f) != cudaSuccess) return mica_cuda_failed("reading a kernel's status");
    if (!f.failed) return 0;
    snprintf(mica_error_text, sizeof mica_error_text,
             f.what == 0 ? MICA_CROSS_ENTROPY_RANGE_TEXT
             : f.what == 1 ? MICA_EMBEDDING_RANGE_TEXT
             : f.what == 2 ? MICA_NLL_LOSS_RANGE_TEXT
             : f.what == 3 ? MICA_INDEX_RANGE_TEXT
             : f.what == 4 ? MICA_CLASS_RANGE_TEXT
             : f.what == 6 ? MICA_MASK_COUNT_TEXT
                           : MICA_POSITION_RANGE_TEXT, f.a, f.b);
    mica_cuda_failure clear = {0, 0, 0, 0};
    cudaMemcpyToSymbol(mica_cuda_fail_state, &clear, sizeof clear);
    return 1;
}

#define MICA_GRID_STRIDE(i, n)                                                                      \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

#define MICA_DEFINE_CUDA_KERNELS(T, S)                                                             \
static __device__ void mica_layer_norm_##S(const T *x, const T *w, const T *b, T *y, T *mean,      \
                                           T *rstd, int64_t rows, int64_t n, T eps) {             \
    MICA_ROW_GROUPS(r, rows) mica_layer_norm_row_##S(x + r * n, w, b, y + r * n, mean + r, rstd + r, n, eps); \
}                                                                                                  \
static __device__ void mica_rms_norm_##S(const T *x, const T *w, T *y, T *rstd, int64_t rows,      \
                                         int64_t n, T eps) {                                       \
    MICA_ROW_GROUPS(r, rows) mica_rms_norm_row_##S(x + r * n, w, y + r * n, rstd + r, n, eps);     \
}                                                                                                  \
static __device__ void mica_softmax_##S(const T *x, T *y, int64_t rows, int64_t n) {               \
    MICA_ROW_GROUPS(r, rows) mica_softmax_row_##S(x + r * n, y + r * n, n);                        \
}                                                                                                  \
static __device__ void mica_softmax_backward_##S(const T *g, const T *y, T *dx, int64_t rows,      \
                                                 int64_t n) {                                      \
    MICA_ROW_GROUPS(r, rows) mica_softmax_backward_row_##S(g + r * n, y + r * n, dx + r * n, n);   \
}                                                                                                  \
static __device__ void mica_log_softmax_##S(const T *x, T *y, int64_t rows, int64_t n) {           \
    MICA_ROW_GROUPS(r, rows) mica_log_softmax_row_##S(x + r * n, y + r * n, n);                    \
}                                                                                                  \
static __device__ void mica_log_softmax_backward_##S(const T *g, const T *y, T *dx, int64_t rows,  \
                                                     int64_t n) {                                  \
    MICA_ROW_GROUPS(r, rows) mica_log_softmax_backward_row_##S(g + r * n, y + r * n, dx + r * n, n); \
}                                                                                                  \
/* the exponentials' sum computed as they are made: the CPU's stored row, summed in the same order */ \
static __device__ void mica_cross_entropy_##S(const T *x, const int64_t *t, T *loss, T *lse,       \
                                              int64_t rows, int64_t n, int64_t ignore, T *unused) {\
    (void)unused; /* (the CPU kernel's per-thread row of exponentials: not needed here) */        \
    MICA_ROW_GROUPS(r, rows) {                                                                     \
        const T *xr = x + r * n;                                                                   \
        T m = MICA_ROW_MAX(S, xr, n), s;                                                           \
        MICA_ROW_SUM_EXPR(T, S, n, s, mica_exp_##S(xr[j] - m));                                    \
        T l = m + mica_log_##S(s);                                                                 \
        int64_t k = t[r];                                                                          \
        if (!MICA_ROW_LEAD) continue;                                                              \
        lse[r] = l;                                                                                \
        if (k == ignore) { loss[r] = 0; continue; }                                                \
        if (k < 0 || k >= n) { mica_cuda_fail(0, k, n); loss[r] = 0; continue; }                   \
        loss[r] = l - xr[k];                                                                       \
    }                                                                                              \
}                                                                                                  \
static __device__ void mica_cross_entropy_backward_##S(const T *g, const T *x, const int64_t *t,   \
                                                       const T *lse, T *dx, int64_t rows,          \
                                                       int64_t n, int64_t ignore) {                \
    MICA_ROW_GROUPS(r, rows)                                                                       \
        mica_cross_entropy_backward_row_##S(g[r], x + r * n, t[r], lse[r], dx + r * n, n, ignore); \
}                                                                                                  \
/* a thread per element of the output */                                                          \
static __device__ void mica_embedding_##S(const int64_t *idx, const T *w, T *y, int64_t count,     \
                                          int64_t V, int64_t D) {                                  \
    MICA_GRID_STRIDE(e, count * D) {                                                               \
        int64_t i = e / D, k = idx[i];                                                             \
        if (k < 0 || k >= V) { if (e % D == 0) mica_cuda_fail(1, k, V); continue; }                \
        y[e] = w[k * D + e % D];                                                                   \
    }                                                                                              \
}

MICA_DEFINE_CUDA_KERNELS(float, f32)
MICA_DEFINE_CUDA_KERNELS(double, f64)

/* indices copied, each checked (mica_kernels.h's mica_check_range and its modes: nll_loss's class
 * indices, a tensor index of a dim with the negative ones wrapped, one_hot's classes) */
static __device__ void mica_check_range(const int64_t *t, int64_t *out, int64_t count, int64_t bound,
                                        int64_t ignore, int mode) {
    MICA_GRID_STRIDE(i, count) {
        if (mode == 4) {  /* (a masked assignment's count of True elements) */
            if (t[i] != bound) mica_cuda_fail(6, t[i], bound);
            out[i] = t[i];
            continue;
        }
        if (mode == 1) {
            if (t[i] < -bound || t[i] >= bound) { mica_cuda_fail(3, t[i], bound); out[i] = 0; continue; }
            out[i] = t[i] < 0 ? t[i] + bound : t[i];
            continue;
        }
        if ((mode != 0 || t[i] != ignore) && (t[i] < 0 || t[i] >= bound))
            mica_cuda_fail(mode == 2 ? 4 : mode == 3 ? 5 : 2, t[i], bound);
        out[i] = t[i];
    }
}
#endif
