/* The row primitives whose backward sums across rows, launched from the host as a few kernels each
 * (a sum across the whole grid needs a second launch: there is no grid-wide barrier). Each gives
 * the CPU target's bits for any launch configuration, with no floating-point atomics.
 *
 *   layer_norm_backward, rms_norm_backward
 *       dx a row per group of 8 threads (mica_rows.h's row function, as mica_cuda_kernels.h; the
 *       kernel's arrays __restrict__, so a thread's loads go out ahead of its stores);
 *       the weight's and bias's gradients are column sums in mica_math.h's canonical order: a
 *       thread per (block of MICA_BLOCK rows, lane l, column j) adds rows b0 + l, b0 + l + 8, ...
 *       in increasing order (a warp's threads are consecutive columns, so every load is
 *       coalesced), then a thread per column adds the 8 lanes by MICA_TREE8 and the blocks left
 *       to right. (Measured on an H200: a group of 8 threads per column, as before, read 8 rows
 *       at a stride and took 1.8 ms for a [16384, 384] layer norm; BENCHMARKS 11.1.)
 *   embedding_backward
 *       dw[v] = the sum of g[i] over the positions i with idx[i] == v, in increasing i. The
 *       positions are put in a stable bucket order with integers alone (exact, so the same for
 *       any launch): a block per chunk of positions ranks each among the equal indices before it
 *       in its chunk and counts each index's occurrences in the chunk; a thread per index turns
 *       the counts into its occurrences in earlier chunks; one block scans the totals into each
 *       bucket's start; a thread per position writes itself to its place. Then a thread per
 *       element of dw adds its bucket's rows in order. (A group of 8 threads per vocabulary row,
 *       as before, scanned every position for each row: 25 ms for 16384 positions and 65 rows.)
 */
#ifndef MICA_CUDA_SWEEPS_H
#define MICA_CUDA_SWEEPS_H
#include "mica_cuda_kernels.h"

/* the blocks of MICA_BLOCK rows a column sum has (one when there are no rows, summing to 0) */
static inline __host__ __device__ int64_t mica_sum_blocks(int64_t rows) {
    return rows <= 0 ? 1 : (rows + MICA_BLOCK - 1) / MICA_BLOCK;
}

/* a norm backward's lane partials: part[(b * 8 + l) * n + j] (dw), and the same after nb * 8 * n (db).
 * A thread's chain of adds waits on its loads: MICA_NORM_AHEAD rows' terms are loaded and computed
 * first, then added in order (the same sum, bit for bit, with that many loads in flight). */
#define MICA_NORM_AHEAD 32
#define MICA_NORM_PARTS(T, rows, n, part, with_w, with_b, DW_EXPR, DB_EXPR)                         \
    const int64_t nb_ = mica_sum_blocks(rows), half_ = nb_ * MICA_LANES * (n);                     \
    MICA_GRID_STRIDE(t, half_) {                                                                   \
        const int64_t j = t % (n), l = t / (n) % MICA_LANES, b0 = t / ((n) * MICA_LANES) * MICA_BLOCK; \
        const int64_t b1 = (rows) - b0 < MICA_BLOCK ? (rows) : b0 + MICA_BLOCK;                    \
        T aw = 0, ab = 0;                                                                          \
        int64_t r0 = b0 + l;                                                                       \
        for (; r0 + MICA_LANES * (MICA_NORM_AHEAD - 1) < b1; r0 += MICA_LANES * MICA_NORM_AHEAD) { \
            T tw[MICA_NORM_AHEAD], tb[MICA_NORM_AHEAD];                                            \
            MICA_UNROLL(32)                                                                        \
            for (int u = 0; u < MICA_NORM_AHEAD; u++) {                                            \
                const int64_t r = r0 + MICA_LANES * u;                                             \
                tw[u] = with_w ? (DW_EXPR) : (T)0;                                                 \
                tb[u] = with_b ? (DB_EXPR) : (T)0;                                                 \
            }                                                                                      \
            MICA_UNROLL(32)                                                                        \
            for (int u = 0; u < MICA_NORM_AHEAD; u++) {                                            \
                if (with_w) aw = aw + tw[u];                                                       \
                if (with_b) ab = ab + tb[u];                                                       \
            }                                                                                      \
        }                                                                                          \
        for (int64_t r = r0; r < b1; r += MICA_LANES) {                                            \
            if (with_w) aw = aw + (DW_EXPR);                                                       \
            if (with_b) ab = ab + (DB_EXPR);                                                       \
        }                                                                                          \
        if (with_w) (part)[t] = aw;                                                                \
        if (with_b) (part)[half_ + t] = ab;                                                        \
    }

#define MICA_DEFINE_CUDA_SWEEPS(T, S)                                                              \
static __global__ void MICA_THREAD_BOUNDS mica_layer_norm_backward_rows_##S(const T *__restrict__ g, const T *__restrict__ x, \
                                                         const T *__restrict__ w, const T *mean,   \
                                                         const T *rstd, T *__restrict__ dx, int64_t rows, \
                                                         int64_t n) {                              \
    MICA_ROW_GROUPS(r, rows)                                                                       \
        mica_layer_norm_backward_row_##S(g + r * n, x + r * n, w, mean[r], rstd[r], dx + r * n, n); \
}                                                                                                  \
static __global__ void MICA_THREAD_BOUNDS mica_layer_norm_backward_parts_##S(const T *g, const T *x, const T *mean,   \
                                                          const T *rstd, T *part, int with_w,      \
                                                          int with_b, int64_t rows, int64_t n) {   \
    MICA_NORM_PARTS(T, rows, n, part, with_w, with_b, g[r * n + j] * ((x[r * n + j] - mean[r]) * rstd[r]), \
                    g[r * n + j])                                                                  \
}                                                                                                  \
static __global__ void MICA_THREAD_BOUNDS mica_rms_norm_backward_rows_##S(const T *__restrict__ g, const T *__restrict__ x, \
                                                       const T *__restrict__ w, const T *rstd,     \
                                                       T *__restrict__ dx, int64_t rows, int64_t n) { \
    MICA_ROW_GROUPS(r, rows)                                                                       \
        mica_rms_norm_backward_row_##S(g + r * n, x + r * n, w, rstd[r], dx + r * n, n);           \
}                                                                                                  \
static __global__ void MICA_THREAD_BOUNDS mica_rms_norm_backward_parts_##S(const T *g, const T *x, const T *rstd,     \
                                                        T *part, int64_t rows, int64_t n) {        \
    MICA_NORM_PARTS(T, rows, n, part, 1, 0, g[r * n + j] * (x[r * n + j] * rstd[r]), (T)0)          \
}                                                                                                  \
/* out[j] = the lanes' tree, the blocks left to right (dw from part, db from part + nb * 8 * n) */  \
static __global__ void MICA_THREAD_BOUNDS mica_norm_columns_##S(const T *part, T *dw, T *db, int64_t rows, int64_t n) { \
    const int64_t nb = mica_sum_blocks(rows);                                                      \
    MICA_GRID_STRIDE(j, n) {                                                                       \
        for (int which = 0; which < 2; which++) {                                                  \
            T *out = which ? db : dw;                                                              \
            if (!out) continue;                                                                    \
            const T *p = part + which * nb * MICA_LANES * n;                                       \
            T tot = 0;                                                                             \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                T lane[MICA_LANES];                                                                \
                for (int l = 0; l < MICA_LANES; l++) lane[l] = p[(b * MICA_LANES + l) * n + j];    \
                const T tree = MICA_TREE8(lane);                                                   \
                tot = b == 0 ? tree : tot + tree;                                                  \
            }                                                                                      \
            out[j] = tot;                                                                          \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
static int mica_layer_norm_backward_cuda_##S(cudaStream_t stream, const T *g, const T *x,          \
                                             const T *w, const T *mean, const T *rstd, T *dx,      \
                                             T *dw, T *db, int64_t rows, int64_t n, T *part) {    \
    MICA_LAUNCH(mica_layer_norm_backward_rows_##S, mica_blocks(MICA_ROW_GROUP * rows), MICA_THREADS, 0, stream, \
                g, x, w, mean, rstd, dx, rows, n);                                                 \
    MICA_PART(stream, 1);                                                                          \
    if (dw || db) {                                                                                \
        MICA_LAUNCH(mica_layer_norm_backward_parts_##S, mica_blocks(mica_sum_blocks(rows) * MICA_LANES * n), \
                    MICA_THREADS, 0, stream, g, x, mean, rstd, part, dw != NULL, db != NULL, rows, n); \
        MICA_PART(stream, 2);                                                                      \
        MICA_LAUNCH(mica_norm_columns_##S, mica_blocks(n), MICA_THREADS, 0, stream, part, dw, db, rows, n); \
    }                                                                                              \
    return 0;                                                                                      \
}                                                                                                  \
static int mica_rms_norm_backward_cuda_##S(cudaStream_t stream, const T *g, const T *x, const T *w, \
                                           const T *rstd, T *dx, T *dw, int64_t rows, int64_t n,   \
                                           T *part) {                                              \
    MICA_LAUNCH(mica_rms_norm_backward_rows_##S, mica_blocks(MICA_ROW_GROUP * rows), MICA_THREADS, 0, stream, \
                g, x, w, rstd, dx, rows, n);                                                       \
    MICA_PART(stream, 1);                                                                          \
    if (dw) {                                                                                      \
        MICA_LAUNCH(mica_rms_norm_backward_parts_##S, mica_blocks(mica_sum_blocks(rows) * MICA_LANES * n), \
                    MICA_THREADS, 0, stream, g, x, rstd, part, rows, n);                           \
        MICA_PART(stream, 2);                                                                      \
        MICA_LAUNCH(mica_norm_columns_##S, mica_blocks(n), MICA_THREADS, 0, stream, part, dw, (T *)NULL, rows, n); \
    }                                                                                              \
    return 0;                                                                                      \
}                                                                                                  \
/* a thread per element of dw: its bucket's rows of g in increasing position */                    \
static __global__ void MICA_THREAD_BOUNDS mica_embedding_backward_sum_##S(const T *g, const int32_t *order,           \
                                                       const int32_t *start, T *dw, int64_t V,     \
                                                       int64_t D) {                                \
    MICA_GRID_STRIDE(e, V * D) {                                                                   \
        const int64_t v = e / D, d = e % D;                                                        \
        T acc = 0;                                                                                 \
        for (int32_t k = start[v]; k < start[v + 1]; k++) acc = acc + g[(int64_t)order[k] * D + d]; \
        dw[e] = acc;                                                                               \
    }                                                                                              \
}                                                                                                  \
static int mica_embedding_backward_cuda_##S(cudaStream_t stream, const T *g, const int64_t *idx,   \
                                            T *dw, int64_t count, int64_t V, int64_t D,            \
                                            int64_t chunk, int32_t *work) {                        \
    if (mica_embedding_order(stream, idx, count, V, chunk, work) != 0) return 1;                    \
    MICA_PART(stream, 1);                                                                          \
    const int64_t chunks = (count + chunk - 1) / chunk;                                            \
    const int32_t *start = work + chunks * V + count, *order = start + V + 1;                      \
    MICA_LAUNCH(mica_embedding_backward_sum_##S, mica_blocks(V * D), MICA_THREADS, 0, stream, g, order, start, dw, V, D); \
    return 0;                                                                                      \
}

/* ---- embedding_backward's stable bucket order of the positions (integers only) ------------------
 * work: counts [chunks][V] (a chunk's occurrences of v, then those of the chunks before it),
 * rank [count] (occurrences of idx[i] before i in i's chunk; -1 for an index out of range),
 * start [V + 1] (where v's bucket begins; start[V] = the positions in range), order [count]. */
static __global__ void MICA_THREAD_BOUNDS mica_embedding_rank(const int64_t *idx, int64_t count, int64_t V, int64_t chunk,
                                           int32_t *counts, int32_t *rank) {
    MICA_EXTERN_SHARED(int32_t, mica_chunk_idx);
    for (int64_t c = blockIdx.x; c * chunk < count; c += gridDim.x) {
        const int64_t i0 = c * chunk, m = count - i0 < chunk ? count - i0 : chunk;
        __syncthreads(); /* (the previous chunk is read) */
        for (int64_t p = threadIdx.x; p < m; p += blockDim.x) {
            const int64_t k = idx[i0 + p];
            if (k < 0 || k >= V) mica_cuda_fail(1, k, V);
            mica_chunk_idx[p] = k < 0 || k >= V ? -1 : (int32_t)k;
        }
        __syncthreads();
        for (int64_t p = threadIdx.x; p < m; p += blockDim.x) {
            const int32_t k = mica_chunk_idx[p];
            int32_t before = 0, after = 0;
            for (int64_t q = 0; q < p; q++) before += mica_chunk_idx[q] == k;
            for (int64_t q = p + 1; q < m; q++) after += mica_chunk_idx[q] == k;
            rank[i0 + p] = k < 0 ? -1 : before;
            if (k >= 0 && after == 0) counts[c * V + k] = before + 1; /* (its last occurrence: the chunk's count) */
        }
    }
}

static __global__ void MICA_THREAD_BOUNDS mica_embedding_chunk_prefix(int32_t *counts, int32_t *start, int64_t chunks, int64_t V) {
    MICA_GRID_STRIDE(v, V) {
        int32_t run = 0;
        for (int64_t c = 0; c < chunks; c++) {
            const int32_t n = counts[c * V + v];
            counts[c * V + v] = run;
            run += n;
        }
        start[v] = run;
    }
}

/* start[0..V] = the exclusive prefix sums of start[0..V) (the totals), by one block */
static __global__ void MICA_THREAD_BOUNDS mica_embedding_scan(int32_t *start, int64_t V) {
    MICA_SHARED_ARRAY(int32_t, part, MICA_THREADS);
    const int64_t per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per;
    const int64_t hi = lo + per < V ? lo + per : V;
    int32_t s = 0;
    for (int64_t v = lo; v < hi; v++) s += start[v];
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0;
        for (unsigned t = 0; t < blockDim.x; t++) {
            const int32_t n = part[t];
            part[t] = run;
            run += n;
        }
        start[V] = run;
    }
    __syncthreads();
    int32_t run = part[threadIdx.x];
    for (int64_t v = lo; v < hi; v++) {
        const int32_t n = start[v];
        start[v] = run;
        run += n;
    }
}

static __global__ void MICA_THREAD_BOUNDS mica_embedding_place(const int64_t *idx, int64_t count, int64_t V, int64_t chunk,
                                            const int32_t *counts, const int32_t *rank, const int32_t *start,
                                            int32_t *order) {
    MICA_GRID_STRIDE(i, count) {
        if (rank[i] < 0) continue;
        const int64_t k = idx[i];
        order[start[k] + counts[i / chunk * V + k] + rank[i]] = (int32_t)i;
    }
}

static int mica_embedding_order(cudaStream_t stream, const int64_t *idx, int64_t count, int64_t V, int64_t chunk,
                                int32_t *work) {
    const int64_t chunks = (count + chunk - 1) / chunk;
    int32_t *counts = work, *rank = counts + chunks * V, *start = rank + count, *order = start + V + 1;
    if (chunks * V > 0 && cudaMemsetAsync(counts, 0, (size_t)(chunks * V) * sizeof(int32_t), stream) != cudaSuccess)
        return mica_cuda_failed("clearing embedding_backward's counts");
    if (count > 0)
        MICA_LAUNCH(mica_embedding_rank, (unsigned)(chunks < 65535 ? chunks : 65535), MICA_THREADS,
                    chunk * sizeof(int32_t), stream, idx, count, V, chunk, counts, rank);
    MICA_LAUNCH(mica_embedding_chunk_prefix, mica_blocks(V), MICA_THREADS, 0, stream, counts, start, chunks, V);
    MICA_LAUNCH(mica_embedding_scan, 1, MICA_THREADS, 0, stream, start, V);
    MICA_LAUNCH(mica_embedding_place, mica_blocks(count), MICA_THREADS, 0, stream, idx, count, V, chunk, counts, rank,
                start, order);
    return 0;
}

MICA_DEFINE_CUDA_SWEEPS(float, f32)
MICA_DEFINE_CUDA_SWEEPS(double, f64)
#endif
