/* Attention on the tensor cores (TF32), for float32 where the user permits TF32: the fused,
 * flash-style algorithm of mica_cuda_attention.h with its dot products as wmma's m16n16k8 TF32
 * products, so no [L, S] matrix exists and the products run at tensor-core rates.
 *
 *   a block   128 threads, four warps, MICA_TC_TILE (64) rows: query rows in the forward and dQ
 *             kernels, keys in the dK/dV kernel; a warp owns 16 of them. The other side passes
 *             through shared memory 64 rows at a time.
 *   a tile    the warp's [16, 64] scores (S = Q K^T, or S^T = K Q^T) and their gradient's product
 *             (dO V^T) go through shared memory, where two lanes per row apply the scale, the causal
 *             mask, the exponentials, dropout and dS (mica_flash_pair: the formulas of every other
 *             attention path); the rows' results are read back as the next product's A operand.
 *   forward   the online softmax: each row keeps its max m and sum l; O's accumulators (registers)
 *             are rescaled by exp(m_old - m_new) row by row (rows_of: the row of each accumulator
 *             element, read once from a matrix of row numbers, since CUDA does not say which
 *             elements a lane holds), then O += P V on the tensor cores; O / l and lse = m + log l
 *             at the end.
 *   backward  D = dO . O per row (mica_flash_delta), then dQ = sum_j dS_ij k_j (a block per query
 *             tile) and dV = sum_i P~_ij dO_i, dK = sum_i dS_ij q_i (a block per key tile): every
 *             sum has one owner and a fixed order (tiles in increasing index, 8 terms per product
 *             step), no atomics, the same bits for any run.
 *
 * Operands are rounded to TF32 (cvt.rna) as they are loaded, products accumulate in float32. The
 * tensor cores add a step's eight products in an order of their own, so these kernels agree with
 * the simulator (mica_cudasim.h's wmma) and the other paths to TF32 rounding, not to the bit:
 * products aside, as cuBLASLt's. __launch_bounds__ asks for 3 forward blocks an SM and 2 of the
 * backward's (their registers: ~160 and ~220-250 at head dim 64, no spills on any of the five
 * architectures, which ptxas's own cap did not give on sm_86/89/120). Head dims must be
 * multiples of 16 and the three kernels' shared
 * memory must fit 99 KiB (the smallest opt-in limit of sm_86/89/120): lowerings.attention_path
 * takes this path only then.
 */
#ifndef MICA_CUDA_ATTENTION_TC_H
#define MICA_CUDA_ATTENTION_TC_H
#include "mica_cuda_attention.h"
#ifdef __CUDACC__
#include <mma.h>
#endif

#define MICA_TC_TILE 64
#define MICA_TC_THREADS 128
#define MICA_TC_LDS (MICA_TC_TILE + 4) /* a [16, 64] score tile's row stride (floats) */

namespace mica_tc {
namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a_frag;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc_frag;

/* a shared tile's row stride for `cols` columns: 4 more, so 8 rows are whole 32-byte lines (wmma's
 * alignment) and consecutive rows start 4 banks apart */
static constexpr __host__ __device__ int64_t ld(int64_t cols) { return cols + 4; }

template <class F>
static __device__ __forceinline__ void to_tf32(F &f) {
#pragma unroll
    for (int t = 0; t < f.num_elements; t++) f.x[t] = wmma::__float_to_tf32(f.x[t]);
}
template <class F>
static __device__ __forceinline__ void load(F &f, const float *p, int64_t ldm) {
    wmma::load_matrix_sync(f, p, (unsigned)ldm);
    to_tf32(f);
}

/* the A operands of a warp's [16, N] row-major block (N / 8 of them) */
template <int N>
static __device__ __forceinline__ void load_rows(a_frag (&f)[N / 8], const float *p, int64_t ldm) {
#pragma unroll
    for (int k = 0; k < N / 8; k++) load(f[k], p + 8 * k, ldm);
}

/* out[16, 16] = A [16, K] (fragments) times 16 columns of B^T, where B's rows (16 of them, K
 * long, row stride ldb) are in shared memory: S = Q K^T's block of 16 keys */
template <int K>
static __device__ __forceinline__ void product_t(acc_frag &out, const a_frag (&a)[K / 8], const float *b, int64_t ldb) {
    wmma::fill_fragment(out, 0.0f);
#pragma unroll
    for (int k = 0; k < K / 8; k++) {
        b_col f;
        load(f, b + 8 * k, ldb);
        wmma::mma_sync(out, a[k], f, out);
    }
}

/* acc[n] += A [16, 8 * steps] (row-major in shared, stride lda) times B [8 * steps, 16 * N]
 * (row-major in shared, stride ldb), 8 terms a step in increasing index */
template <int N>
static __device__ __forceinline__ void accumulate(acc_frag (&acc)[N], const float *a, int64_t lda, const float *b,
                                                  int64_t ldb, int steps) {
    for (int k = 0; k < steps; k++) {
        a_frag fa;
        load(fa, a + 8 * k, lda);
#pragma unroll
        for (int n = 0; n < N; n++) {
            b_row fb;
            load(fb, b + 8 * k * ldb + 16 * n, ldb);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

/* the warp's accumulators into its 16 rows of a shared tile, then those rows (of `rows` valid ones,
 * cols wide) to global memory at out (row stride st) */
template <int N>
static __device__ __forceinline__ void write_rows(const acc_frag (&acc)[N], float *tile, int64_t ldt, float *out,
                                                  int64_t st, int64_t rows) {
#pragma unroll
    for (int n = 0; n < N; n++) wmma::store_matrix_sync(tile + 16 * n, acc[n], (unsigned)ldt, wmma::mem_row_major);
    __syncwarp();
    const int lane = threadIdx.x % 32;
    for (int x = lane; x < 16 * 16 * N; x += 32) {
        const int r = x / (16 * N), c = x % (16 * N);
        if (r < rows) out[r * st + c] = tile[r * ldt + c];
    }
}

/* rows_of.x[t]: the row (0..15) of element t of every accumulator fragment, read from a matrix of
 * row numbers the warp writes into `tile` (16 rows, stride ldt) */
static __device__ __forceinline__ void row_numbers(acc_frag &rows_of, float *tile, int64_t ldt) {
    const int lane = threadIdx.x % 32;
    for (int x = lane; x < 256; x += 32) tile[(x / 16) * ldt + x % 16] = (float)(x / 16);
    __syncwarp();
    wmma::load_matrix_sync(rows_of, tile, (unsigned)ldt, wmma::mem_row_major);
    __syncwarp();
}

/* the keys of a 64-key tile from j0 that any of the query rows [first, last] sees (last < L) */
static __device__ __forceinline__ int keys_seen(const mica_attn_shape &a, int64_t last, int64_t j0) {
    return mica_flash_seen(a, last, j0, MICA_TC_TILE);
}

/* a query tile's block (the forward's, dQ's): its head bh (batch b, head h) and first row i0; the
 * warp's first row rw and last real one wlast; a lane pair's row r (query i), and which lane of it */
struct query_block {
    int64_t bh, i0, b, h, i, wlast;
    int rw, r, half;
    __device__ __forceinline__ explicit query_block(const mica_attn_shape &a) {
        const int64_t tiles = (a.L + MICA_TC_TILE - 1) / MICA_TC_TILE;
        bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * MICA_TC_TILE, b = bh / a.H, h = bh % a.H;
        rw = 16 * (int)(threadIdx.x / 32), r = rw + (int)(threadIdx.x % 32) / 2, half = (int)(threadIdx.x % 2);
        i = i0 + r, wlast = i0 + rw + 15 < a.L ? i0 + rw + 15 : a.L - 1;
    }
};

/* ---- the forward ----------------------------------------------------------------------------
 * shared: K [64, ld(E)] (Q first, to load its fragments), V [64, ld(Ev)] (O last), S/P [64, LDS],
 * a row's rescale factor [64] */
template <int64_t E, int64_t Ev>
static constexpr __host__ __device__ int64_t forward_shared() {
    return (MICA_TC_TILE * (ld(E) + ld(Ev) + MICA_TC_LDS) + MICA_TC_TILE) * 4;
}

template <int64_t E, int64_t Ev>
static __global__ void __launch_bounds__(MICA_TC_THREADS, 3)
forward(mica_attn_shape a, const float *q, const float *k, const float *v, float *o, float *lse) {
    constexpr int64_t LDK = ld(E), LDV = ld(Ev), LDS = MICA_TC_LDS;
    const query_block t(a);
    const int64_t L = a.L, S = a.S, bh = t.bh, i0 = t.i0, b = t.b, h = t.h, i = t.i, wlast = t.wlast;
    const int rw = t.rw, r = t.r, half = t.half;
    MICA_EXTERN_SHARED(unsigned char, mica_tc_shared);
    float *Ks = (float *)mica_tc_shared, *Vs = Ks + MICA_TC_TILE * LDK, *Ss = Vs + MICA_TC_TILE * LDV;
    float *scale_row = Ss + MICA_TC_TILE * LDS, *Sr = Ss + r * LDS;
    const float *kb = k + b * a.k_sb + h * a.k_sh, *vb = v + b * a.v_sb + h * a.v_sh;
    const float scale = (float)a.scale, keep_scale = (float)(1.0 / (1.0 - a.dropout_p));
    mica_flash_load<float, MICA_TC_TILE>(Ks, LDK, q + b * a.q_sb + h * a.q_sh, a.q_st, i0, L, E);
    __syncthreads();
    a_frag qf[E / 8];
    load_rows<E>(qf, Ks + rw * LDK, LDK);
    acc_frag rows_of, of[Ev / 16];
    row_numbers(rows_of, Ss + rw * LDS, LDS);
#pragma unroll
    for (int n = 0; n < Ev / 16; n++) wmma::fill_fragment(of[n], 0.0f);
    float m = -INFINITY, l = 0.0f;
    const int64_t keys = mica_attn_row_keys(&a, (i0 + MICA_TC_TILE < L ? i0 + MICA_TC_TILE : L) - 1);
    for (int64_t j0 = 0; j0 < keys; j0 += MICA_TC_TILE) {
        __syncthreads(); /* (Q's staging, or the previous tile's K and V, are read) */
        mica_flash_load<float, MICA_TC_TILE>(Ks, LDK, kb, a.k_st, j0, S, E);
        mica_flash_load<float, MICA_TC_TILE>(Vs, LDV, vb, a.v_st, j0, S, Ev);
        __syncthreads();
        const int wk = rw < L - i0 ? keys_seen(a, wlast, j0) : 0; /* the keys any of the warp's rows sees */
        for (int n = 0; n < (wk + 15) / 16; n++) {
            acc_frag s;
            product_t<E>(s, qf, Ks + 16 * n * LDK, LDK);
            wmma::store_matrix_sync(Ss + rw * LDS + 16 * n, s, (unsigned)LDS, wmma::mem_row_major);
        }
        __syncwarp();
        /* the row: lanes 2r' and 2r' + 1 take its even and odd keys */
        const int seen = i < L ? mica_flash_seen(a, i, j0, MICA_TC_TILE) : 0;
        float mt = -INFINITY;
        for (int c = half; c < seen; c += 2) {
            Sr[c] = Sr[c] * scale;
            mt = mica_max_f32(mt, Sr[c]);
        }
        mt = mica_max_f32(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        const float m_new = mica_max_f32(m, mt);
        float sum = 0.0f;
        for (int c = half; c < MICA_TC_TILE; c += 2) {
            float p = c < seen ? mica_exp_f32(Sr[c] - m_new) : 0.0f;
            sum = sum + p;
            if (a.dropout_p > 0 && c < seen)
                p = mica_keep(a.rng, a.stream, ((uint64_t)bh * L + i) * S + j0 + c, a.threshold) ? p * keep_scale : 0.0f;
            Sr[c] = p;
        }
        sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        const float alpha = m_new == -INFINITY ? 1.0f : m == -INFINITY ? 0.0f : mica_exp_f32(m - m_new);
        l = l * alpha + sum;
        m = m_new;
        if (half == 0) scale_row[r] = alpha;
        __syncwarp();
#pragma unroll
        for (int n = 0; n < Ev / 16; n++)
#pragma unroll
            for (int t = 0; t < of[n].num_elements; t++) of[n].x[t] = of[n].x[t] * scale_row[rw + (int)rows_of.x[t]];
        accumulate<Ev / 16>(of, Ss + rw * LDS, LDS, Vs, LDV, (wk + 7) / 8);
    }
    __syncthreads(); /* (every warp is done with V: it holds O now) */
    if (half == 0) scale_row[r] = l;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < Ev / 16; n++)
#pragma unroll
        for (int t = 0; t < of[n].num_elements; t++) of[n].x[t] = of[n].x[t] / scale_row[rw + (int)rows_of.x[t]];
    write_rows<Ev / 16>(of, Vs + rw * LDV, LDV, o + b * a.o_sb + h * a.o_sh + (i0 + rw) * a.o_st, a.o_st,
                        L - i0 - rw);
    if (half == 0 && i < L) lse[bh * L + i] = m + mica_log_f32(l);
}

/* ---- dQ: a block per query tile ------------------------------------------------------------------
 * shared: K [64, ld(E)] (Q first; dQ last), V [64, ld(Ev)] (dO first), S then dS and dP [64, LDS]
 * each, the rows' lse and D [64] each */
template <int64_t E, int64_t Ev>
static constexpr __host__ __device__ int64_t dq_shared() {
    return (MICA_TC_TILE * (ld(E) + ld(Ev) + 2 * MICA_TC_LDS) + 2 * MICA_TC_TILE) * 4;
}

template <int64_t E, int64_t Ev>
static __global__ void __launch_bounds__(MICA_TC_THREADS, 2)
dq_kernel(mica_attn_shape a, const float *g, int64_t g_sb, int64_t g_sh, int64_t g_st, const float *q, const float *k,
          const float *v, const float *lse, const float *D, float *dq) {
    constexpr int64_t LDK = ld(E), LDV = ld(Ev), LDS = MICA_TC_LDS;
    const query_block t(a);
    const int64_t L = a.L, S = a.S, bh = t.bh, i0 = t.i0, b = t.b, h = t.h, i = t.i, wlast = t.wlast;
    const int rw = t.rw, r = t.r, half = t.half;
    MICA_EXTERN_SHARED(unsigned char, mica_tc_shared);
    float *Ks = (float *)mica_tc_shared, *Vs = Ks + MICA_TC_TILE * LDK, *Ss = Vs + MICA_TC_TILE * LDV;
    float *Ps = Ss + MICA_TC_TILE * LDS, *ls = Ps + MICA_TC_TILE * LDS, *Ds = ls + MICA_TC_TILE;
    const float *kb = k + b * a.k_sb + h * a.k_sh, *vb = v + b * a.v_sb + h * a.v_sh;
    const float scale = (float)a.scale;
    mica_flash_load<float, MICA_TC_TILE>(Ks, LDK, q + b * a.q_sb + h * a.q_sh, a.q_st, i0, L, E);
    mica_flash_load<float, MICA_TC_TILE>(Vs, LDV, g + b * g_sb + h * g_sh, g_st, i0, L, Ev);
    if (threadIdx.x < MICA_TC_TILE) {
        const int64_t x = i0 + threadIdx.x;
        ls[threadIdx.x] = x < L ? lse[bh * L + x] : 0.0f;
        Ds[threadIdx.x] = x < L ? D[bh * L + x] : 0.0f;
    }
    __syncthreads();
    a_frag qf[E / 8], gf[Ev / 8];
    load_rows<E>(qf, Ks + rw * LDK, LDK);
    load_rows<Ev>(gf, Vs + rw * LDV, LDV);
    acc_frag dqf[E / 16];
#pragma unroll
    for (int n = 0; n < E / 16; n++) wmma::fill_fragment(dqf[n], 0.0f);
    const int64_t keys = mica_attn_row_keys(&a, (i0 + MICA_TC_TILE < L ? i0 + MICA_TC_TILE : L) - 1);
    for (int64_t j0 = 0; j0 < keys; j0 += MICA_TC_TILE) {
        __syncthreads();
        mica_flash_load<float, MICA_TC_TILE>(Ks, LDK, kb, a.k_st, j0, S, E);
        mica_flash_load<float, MICA_TC_TILE>(Vs, LDV, vb, a.v_st, j0, S, Ev);
        __syncthreads();
        const int wk = rw < L - i0 ? keys_seen(a, wlast, j0) : 0;
        for (int n = 0; n < (wk + 15) / 16; n++) {
            acc_frag s;
            product_t<E>(s, qf, Ks + 16 * n * LDK, LDK);
            wmma::store_matrix_sync(Ss + rw * LDS + 16 * n, s, (unsigned)LDS, wmma::mem_row_major);
            product_t<Ev>(s, gf, Vs + 16 * n * LDV, LDV); /* dP = dO V^T */
            wmma::store_matrix_sync(Ps + rw * LDS + 16 * n, s, (unsigned)LDS, wmma::mem_row_major);
        }
        __syncwarp();
        const int seen = i < L ? mica_flash_seen(a, i, j0, MICA_TC_TILE) : 0;
        for (int c = half; c < MICA_TC_TILE; c += 2) {
            float pd, ds = 0.0f;
            if (c < seen) mica_flash_pair<float>(a, Ss[r * LDS + c] * scale, Ps[r * LDS + c], ls[r], Ds[r], i, j0 + c, bh,
                                                 &pd, &ds);
            Ss[r * LDS + c] = ds;
        }
        __syncwarp();
        accumulate<E / 16>(dqf, Ss + rw * LDS, LDS, Ks, LDK, (wk + 7) / 8); /* dQ += dS K */
    }
    __syncthreads(); /* (every warp is done with K: it holds dQ now) */
    write_rows<E / 16>(dqf, Ks + rw * LDK, LDK, dq + b * a.dq_sb + h * a.dq_sh + (i0 + rw) * a.dq_st, a.dq_st,
                       L - i0 - rw);
}

/* ---- dK and dV: a block per key tile --------------------------------------------------------------
 * shared: Q [64, ld(E)] (K first; dK last), dO [64, ld(Ev)] (V first; dV last), S^T then P~, and
 * dP^T then dS [64, LDS] each, the query tile's lse and D [64] each */
template <int64_t E, int64_t Ev>
static constexpr __host__ __device__ int64_t dkv_shared() { return dq_shared<E, Ev>(); }

template <int64_t E, int64_t Ev>
static __global__ void __launch_bounds__(MICA_TC_THREADS, 2)
dkv_kernel(mica_attn_shape a, const float *g, int64_t g_sb, int64_t g_sh, int64_t g_st, const float *q, const float *k,
           const float *v, const float *lse, const float *D, float *dk, float *dv) {
    constexpr int64_t LDK = ld(E), LDV = ld(Ev), LDS = MICA_TC_LDS;
    const int64_t L = a.L, S = a.S, tiles = (S + MICA_TC_TILE - 1) / MICA_TC_TILE;
    const int64_t bh = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * MICA_TC_TILE, b = bh / a.H, h = bh % a.H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rw = 16 * warp, c = rw + lane / 2, half = lane % 2;
    const int64_t j = j0 + c, wfirst = j0 + rw; /* the lane pair's key; the warp's first key */
    MICA_EXTERN_SHARED(unsigned char, mica_tc_shared);
    float *Qs = (float *)mica_tc_shared, *Gs = Qs + MICA_TC_TILE * LDK, *Ss = Gs + MICA_TC_TILE * LDV;
    float *Ps = Ss + MICA_TC_TILE * LDS, *ls = Ps + MICA_TC_TILE * LDS, *Ds = ls + MICA_TC_TILE;
    const float *qb = q + b * a.q_sb + h * a.q_sh, *gb = g + b * g_sb + h * g_sh, scale = (float)a.scale;
    mica_flash_load<float, MICA_TC_TILE>(Qs, LDK, k + b * a.k_sb + h * a.k_sh, a.k_st, j0, S, E);
    mica_flash_load<float, MICA_TC_TILE>(Gs, LDV, v + b * a.v_sb + h * a.v_sh, a.v_st, j0, S, Ev);
    __syncthreads();
    a_frag kf[E / 8], vf[Ev / 8];
    load_rows<E>(kf, Qs + rw * LDK, LDK);
    load_rows<Ev>(vf, Gs + rw * LDV, LDV);
    acc_frag dkf[E / 16], dvf[Ev / 16];
#pragma unroll
    for (int n = 0; n < E / 16; n++) wmma::fill_fragment(dkf[n], 0.0f);
#pragma unroll
    for (int n = 0; n < Ev / 16; n++) wmma::fill_fragment(dvf[n], 0.0f);
    /* the first query row that sees key j0 is j0 itself when causal (tiles of keys and queries are
     * the same size): start at its tile */
    for (int64_t i0 = a.causal ? j0 : 0; i0 < L; i0 += MICA_TC_TILE) {
        __syncthreads();
        mica_flash_load<float, MICA_TC_TILE>(Qs, LDK, qb, a.q_st, i0, L, E);
        mica_flash_load<float, MICA_TC_TILE>(Gs, LDV, gb, g_st, i0, L, Ev);
        if (threadIdx.x < MICA_TC_TILE) {
            const int64_t x = i0 + threadIdx.x;
            ls[threadIdx.x] = x < L ? lse[bh * L + x] : 0.0f;
            Ds[threadIdx.x] = x < L ? D[bh * L + x] : 0.0f;
        }
        __syncthreads();
        /* the tile's query rows [lo, hi) that may see one of the warp's keys */
        int64_t lo = a.causal ? wfirst - i0 : 0, hi = L - i0 < MICA_TC_TILE ? L - i0 : MICA_TC_TILE;
        lo = wfirst >= S ? hi : lo < 0 ? 0 : lo > hi ? hi : lo;
        for (int64_t n = lo / 16; n < (hi + 15) / 16; n++) {
            acc_frag s;
            product_t<E>(s, kf, Qs + 16 * n * LDK, LDK); /* S^T = K Q^T */
            wmma::store_matrix_sync(Ss + rw * LDS + 16 * n, s, (unsigned)LDS, wmma::mem_row_major);
            product_t<Ev>(s, vf, Gs + 16 * n * LDV, LDV); /* dP^T = V dO^T */
            wmma::store_matrix_sync(Ps + rw * LDS + 16 * n, s, (unsigned)LDS, wmma::mem_row_major);
        }
        __syncwarp();
        for (int x = half; x < MICA_TC_TILE; x += 2) { /* x: the query row within the tile */
            const int64_t row = i0 + x;
            float pd = 0.0f, ds = 0.0f;
            if (j < S && row < L && (!a.causal || j <= row))
                mica_flash_pair<float>(a, Ss[c * LDS + x] * scale, Ps[c * LDS + x], ls[x], Ds[x], row, j, bh, &pd, &ds);
            Ss[c * LDS + x] = pd;
            Ps[c * LDS + x] = ds;
        }
        __syncwarp();
        const int first = (int)(lo / 8), steps = (int)((hi + 7) / 8) - first;
        accumulate<Ev / 16>(dvf, Ss + rw * LDS + 8 * first, LDS, Gs + 8 * first * LDV, LDV, steps); /* dV += P~^T dO */
        accumulate<E / 16>(dkf, Ps + rw * LDS + 8 * first, LDS, Qs + 8 * first * LDK, LDK, steps);  /* dK += dS^T Q */
    }
    __syncthreads(); /* (every warp is done with Q and dO: they hold dK and dV now) */
    write_rows<E / 16>(dkf, Qs + rw * LDK, LDK, dk + b * a.dk_sb + h * a.dk_sh + wfirst * a.dk_st, a.dk_st, S - wfirst);
    write_rows<Ev / 16>(dvf, Gs + rw * LDV, LDV, dv + b * a.dv_sb + h * a.dv_sh + wfirst * a.dv_st, a.dv_st, S - wfirst);
}
} // namespace mica_tc

/* ---- the host side --------------------------------------------------------------------------- */
/* o and lse from q, k, v (the forward) */
template <int64_t E, int64_t Ev>
static int mica_attention_tc_cuda(cudaStream_t stream, const mica_attn_shape *a, const float *q, const float *k,
                                  const float *v, float *o, float *lse) {
    static_assert(E % 16 == 0 && Ev % 16 == 0, "the tensor-core attention takes head dims that are multiples of 16");
    constexpr int64_t bytes = mica_tc::forward_shared<E, Ev>();
    const int64_t blocks = a->B * a->H * ((a->L + MICA_TC_TILE - 1) / MICA_TC_TILE);
    if (blocks == 0) return 0;
    mica_flash_allow(mica_tc::forward<E, Ev>, bytes);
    MICA_LAUNCH((mica_tc::forward<E, Ev>), (unsigned)blocks, MICA_TC_THREADS, bytes, stream, *a, q, k, v, o, lse);
    return mica_flash_launched();
}

/* dq, dk, dv from the output gradient g (strides g_sb, g_sh, g_st), q, k, v, o and lse; D (scratch)
 * holds B * H * L values */
template <int64_t E, int64_t Ev>
static int mica_attention_tc_backward_cuda(cudaStream_t stream, const mica_attn_shape *a, const float *g,
                                           const float *q, const float *k, const float *v, const float *o,
                                           const float *lse, float *dq, float *dk, float *dv, int64_t g_sb,
                                           int64_t g_sh, int64_t g_st, float *D) {
    constexpr int64_t q_bytes = mica_tc::dq_shared<E, Ev>(), k_bytes = mica_tc::dkv_shared<E, Ev>();
    const int64_t heads = a->B * a->H, q_blocks = heads * ((a->L + MICA_TC_TILE - 1) / MICA_TC_TILE);
    const int64_t k_blocks = heads * ((a->S + MICA_TC_TILE - 1) / MICA_TC_TILE);
    if (q_blocks > 0) {
        MICA_LAUNCH((mica_flash_delta<float>), mica_blocks(heads * a->L), MICA_THREADS, 0, stream, *a, g, g_sb, g_sh,
                    g_st, o, D);
        MICA_PART(stream, 1);
        mica_flash_allow(mica_tc::dq_kernel<E, Ev>, q_bytes);
        MICA_LAUNCH((mica_tc::dq_kernel<E, Ev>), (unsigned)q_blocks, MICA_TC_THREADS, q_bytes, stream, *a, g, g_sb, g_sh,
                    g_st, q, k, v, lse, D, dq);
        MICA_PART(stream, 8);
    }
    if (k_blocks > 0) {
        mica_flash_allow(mica_tc::dkv_kernel<E, Ev>, k_bytes);
        MICA_LAUNCH((mica_tc::dkv_kernel<E, Ev>), (unsigned)k_blocks, MICA_TC_THREADS, k_bytes, stream, *a, g, g_sb,
                    g_sh, g_st, q, k, v, lse, D, dk, dv);
        MICA_PART(stream, 9);
    }
    return mica_flash_launched();
}
#endif
