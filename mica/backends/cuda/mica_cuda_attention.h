/* Attention on the card: one fused, tiled (flash-style) kernel for the forward and two for the
 * backward, written once for float and double. No [L, S] matrix exists anywhere: scores and
 * probabilities live one tile at a time in shared memory.
 *
 *   forward   a block per (batch, head, tile of TILE query rows); K and V pass through shared
 *             memory TILE keys at a time; each query row keeps a running max m and sum l of its
 *             exponentials (the online softmax) and its output rescaled by exp(m_old - m_new);
 *             it writes O = (sum_j p_j v_j) / l and the row's log-sum-exp m + log(l), saved for
 *             the backward.
 *   backward  D_i = dO_i . O_i first (a thread per row, in increasing index); then a block per
 *             query tile recomputes p_ij = exp(s_ij - lse_i) and dS_ij tile by tile and sums
 *             dQ_i = sum_j dS_ij k_j, and a block per key tile sums dV_j = sum_i p~_ij dO_i and
 *             dK_j = sum_i dS_ij q_i over the query tiles that see it. Every sum has one owner and
 *             a fixed order (tiles in increasing index, each tile's terms in increasing index): no
 *             atomics, the same bits for any launch or run.
 *
 * A row (of queries, or of keys in the key-tile kernel) is the work of a group of 8 consecutive
 * threads of a warp (as the row kernels): lane l scores the keys (or queries) c of a tile with
 * c % 8 == l, a tile's max and exponential sum meet by shuffles within the group (the sum in
 * mica_math.h's canonical order of the tile: lanes in increasing index, then MICA_TREE8's tree),
 * and lane l owns the output columns e with e % 8 == l. A score is q . k summed in increasing
 * index and then scaled, computed by the same lines wherever it is needed, so the forward and
 * both backward kernels see the same bits for the same (i, j); so does dS.
 *
 * Causal masks j > i (top-left aligned, as PyTorch); the keys a row cannot see are skipped, not
 * zeroed (a tile is cut at the row's last visible key). Dropout draws the CPU's mask: element
 * (bh * L + i) * S + j of the call site's Philox stream (mica_rows.h's rows), in all three
 * kernels. With a->half_round (fp_half_intermediates) the forward runs two passes over the keys,
 * the first for the row max alone, so that exp(s - max) is rounded to the half type with the
 * final max as mica_rows.h rounds it; the backward rounds p (for dV) and dS before the scale, as
 * mica_rows.h does.
 *
 * TILE (32, 16 or 8) is the largest whose shared memory fits in 48 KiB for the head dims and the
 * element type (8 with a larger carve-out past that): a function of the shape alone, so the same
 * on the card and in the simulator. Shared rows are padded to an odd stride so that the 8 rows a
 * group's lanes read at one column fall in distinct banks. The only scratch is D: B * H * L values.
 */
#ifndef MICA_CUDA_ATTENTION_H
#define MICA_CUDA_ATTENTION_H
#include "mica_cuda_kernels.h"

template <typename T> struct mica_flash_math;
template <> struct mica_flash_math<float> {
    static __device__ __forceinline__ float exp(float x) { return mica_exp_f32(x); }
    static __device__ __forceinline__ float log(float x) { return mica_log_f32(x); }
    static __device__ __forceinline__ float max(float a, float b) { return mica_max_f32(a, b); }
    static __device__ __forceinline__ float tree8(float v) { return mica_coop_tree8_f32(v); }
};
template <> struct mica_flash_math<double> {
    static __device__ __forceinline__ double exp(double x) { return mica_exp_f64(x); }
    static __device__ __forceinline__ double log(double x) { return mica_log_f64(x); }
    static __device__ __forceinline__ double max(double a, double b) { return mica_max_f64(a, b); }
    static __device__ __forceinline__ double tree8(double v) { return mica_coop_tree8_f64(v); }
};

/* a shared tile's row stride for `cols` columns: odd */
static constexpr __host__ __device__ int64_t mica_flash_ld(int64_t cols) { return cols | 1; }

/* the keys query row i sees (mica_rows.h's rule) and how many of them lie in the tile from j0 */
static __device__ __forceinline__ int mica_flash_seen(const mica_attn_shape &a, int64_t i, int64_t j0, int tile) {
    const int64_t n = mica_attn_row_keys(&a, i) - j0;
    return n < 0 ? 0 : n > tile ? tile : (int)n;
}

/* rows [row0, row0 + TILE) of an [n, cols] matrix (row stride st, columns contiguous) into a shared
 * tile with row stride ld, rows past n as zeros; by all the block's threads, coalesced */
template <typename T, int TILE>
static __device__ __forceinline__ void mica_flash_load(T *dst, int64_t ld, const T *src, int64_t st, int64_t row0,
                                                       int64_t n, int64_t cols) {
    for (int64_t x = threadIdx.x; x < TILE * cols; x += blockDim.x) {
        const int64_t r = x / cols, c = x % cols;
        dst[r * ld + c] = row0 + r < n ? src[(row0 + r) * st + c] : (T)0;
    }
}

/* out[u] = x . ys[u * 8 * ld] over n elements, in increasing index, for NU rows ys at once */
template <typename T, int NU>
static __device__ __forceinline__ void mica_flash_dots(const T *x, const T *ys, int64_t ld, int64_t n, T *out) {
#pragma unroll
    for (int u = 0; u < NU; u++) out[u] = (T)0;
    for (int64_t e = 0; e < n; e++) {
        const T xe = x[e];
#pragma unroll
        for (int u = 0; u < NU; u++) out[u] = out[u] + xe * ys[u * 8 * ld + e];
    }
}

/* the same dots, x varying with u and ys fixed (the key-tile kernel: one key, NU queries); a
 * product's operands commute exactly, so these are the bits of mica_flash_dots for the same pair */
template <typename T, int NU>
static __device__ __forceinline__ void mica_flash_dots_t(const T *xs, int64_t ld, const T *y, int64_t n, T *out) {
#pragma unroll
    for (int u = 0; u < NU; u++) out[u] = (T)0;
    for (int64_t e = 0; e < n; e++) {
        const T ye = y[e];
#pragma unroll
        for (int u = 0; u < NU; u++) out[u] = out[u] + xs[u * 8 * ld + e] * ye;
    }
}

/* pair (i, j) of the backward, from its scaled score s, dp = dO_i . v_j, the row's lse and D:
 * *pd = the (dropped) probability dV reads, *ds = dS (mica_rows.h's backward row, element j) */
template <typename T>
static __device__ __forceinline__ void mica_flash_pair(const mica_attn_shape &a, T s, T dp, T lse, T D, int64_t i,
                                                       int64_t j, int64_t bh, T *pd, T *ds) {
    const T p = mica_flash_math<T>::exp(s - lse), scale = (T)a.scale;
    if (a.dropout_p > 0) {
        const T keep_scale = (T)(1.0 / (1.0 - a.dropout_p));
        const int kept = mica_keep(a.rng, a.stream, ((uint64_t)bh * a.L + i) * a.S + j, a.threshold);
        dp = kept ? dp * keep_scale : (T)0;
        *pd = MICA_ATTN_ROUND(&a, T, kept ? p * keep_scale : (T)0);
    } else {
        *pd = MICA_ATTN_ROUND(&a, T, p);
    }
    *ds = MICA_ATTN_ROUND(&a, T, p * (dp - D)) * scale;
}

/* ---- the forward ---------------------------------------------------------------------------------
 * shared: Q [TILE, ldq], K [TILE, ldq], V [TILE, ldv], P [TILE, TILE + 1], O [TILE, ldv] */
template <typename T>
static constexpr __host__ __device__ int64_t mica_flash_forward_shared(int64_t tile, int64_t E, int64_t Ev) {
    return tile * (2 * mica_flash_ld(E) + 2 * mica_flash_ld(Ev) + tile + 1) * (int64_t)sizeof(T);
}

template <typename T, int TILE>
static __global__ void
mica_flash_forward(mica_attn_shape a, const T *q, const T *k, const T *v, T *o, T *lse) {
    typedef mica_flash_math<T> M;
    constexpr int NU = TILE / 8;
    const int64_t L = a.L, S = a.S, E = a.E, Ev = a.Ev, tiles = (L + TILE - 1) / TILE;
    const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * TILE, b = bh / a.H, h = bh % a.H;
    const int r = threadIdx.x / 8, lane = threadIdx.x % 8;
    const int64_t i = i0 + r, ldq = mica_flash_ld(E), ldv = mica_flash_ld(Ev);
    const unsigned mask = mica_row_mask();
    const int row = i < L; /* (a group past the last query row only keeps the barriers) */
    MICA_EXTERN_SHARED(unsigned char, mica_flash_shared);
    T *Qs = (T *)mica_flash_shared, *Ks = Qs + TILE * ldq, *Vs = Ks + TILE * ldq, *Ps = Vs + TILE * ldv;
    T *Os = Ps + TILE * (TILE + 1), *Pr = Ps + r * (TILE + 1), *Or = Os + r * ldv;
    const T *kb = k + b * a.k_sb + h * a.k_sh, *vb = v + b * a.v_sb + h * a.v_sh;
    const T scale = (T)a.scale, keep_scale = (T)(1.0 / (1.0 - a.dropout_p));
    const int64_t last = (i0 + TILE < L ? i0 + TILE : L) - 1, keys = mica_attn_row_keys(&a, last);
    mica_flash_load<T, TILE>(Qs, ldq, q + b * a.q_sb + h * a.q_sh, a.q_st, i0, L, E);
    for (int64_t e = lane; e < Ev; e += 8) Or[e] = (T)0;
    T m = -(T)INFINITY, l = (T)0, s[NU];
    /* with half_round, pass 0 finds the row max alone and pass 1 keeps it; else one online pass */
    for (int pass = a.half_round ? 0 : 1; pass < 2; pass++) {
        for (int64_t j0 = 0; j0 < keys; j0 += TILE) {
            __syncthreads(); /* (the previous tile's K and V are read) */
            mica_flash_load<T, TILE>(Ks, ldq, kb, a.k_st, j0, S, E);
            if (pass == 1) mica_flash_load<T, TILE>(Vs, ldv, vb, a.v_st, j0, S, Ev);
            __syncthreads();
            const int seen = row ? mica_flash_seen(a, i, j0, TILE) : 0;
            mica_flash_dots<T, NU>(Qs + r * ldq, Ks + lane * ldq, ldq, E, s);
            T mt = -(T)INFINITY;
#pragma unroll
            for (int u = 0; u < NU; u++) {
                s[u] = s[u] * scale;
                if (lane + 8 * u < seen) mt = M::max(mt, s[u]);
            }
            for (unsigned d = 1; d < 8; d <<= 1) mt = M::max(mt, __shfl_xor_sync(mask, mt, d));
            if (pass == 0) {
                m = M::max(m, mt);
                continue;
            }
            const T m_new = a.half_round ? m : M::max(m, mt);
            T sum = (T)0;
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const int c = lane + 8 * u;
                T p = c < seen ? M::exp(s[u] - m_new) : (T)0;
                sum = sum + p;
                p = MICA_ATTN_ROUND(&a, T, p);
                if (a.dropout_p > 0 && c < seen)
                    p = mica_keep(a.rng, a.stream, ((uint64_t)bh * L + i) * S + j0 + c, a.threshold) ? p * keep_scale
                                                                                                  : (T)0;
                Pr[c] = p;
            }
            sum = M::tree8(sum);
            const T alpha = a.half_round ? (T)1 : j0 == 0 ? (T)0 : M::exp(m - m_new);
            l = l * alpha + sum;
            m = m_new;
            __syncwarp(mask); /* (the group's P row is written) */
            for (int64_t e = lane; e < Ev; e += 8) {
                T acc = (T)0;
                for (int c = 0; c < seen; c++) acc = acc + Pr[c] * Vs[c * ldv + e];
                Or[e] = Or[e] * alpha + acc;
            }
        }
    }
    if (!row) return;
    T *orow = o + b * a.o_sb + h * a.o_sh + i * a.o_st;
    for (int64_t e = lane; e < Ev; e += 8) orow[e] = Or[e] / l;
    if (lane == 0) lse[bh * L + i] = m + M::log(l);
}

/* ---- the backward --------------------------------------------------------------------------------*/
/* D[bh * L + i] = dO_i . O_i in increasing index, a thread per row */
template <typename T>
static __global__ void MICA_THREAD_BOUNDS mica_flash_delta(mica_attn_shape a, const T *g, int64_t g_sb, int64_t g_sh, int64_t g_st,
                                        const T *o, T *D) {
    MICA_GRID_STRIDE(x, a.B * a.H * a.L) {
        const int64_t bh = x / a.L, i = x % a.L, b = bh / a.H, h = bh % a.H;
        const T *gi = g + b * g_sb + h * g_sh + i * g_st, *oi = o + b * a.o_sb + h * a.o_sh + i * a.o_st;
        T d = (T)0;
        for (int64_t e = 0; e < a.Ev; e++) d = d + gi[e] * oi[e];
        D[x] = d;
    }
}

/* dQ, a block per query tile. shared: Q, K, dQ [TILE, ldq], dO, V [TILE, ldv], dS [TILE, TILE + 1] */
template <typename T>
static constexpr __host__ __device__ int64_t mica_flash_dq_shared(int64_t tile, int64_t E, int64_t Ev) {
    return tile * (3 * mica_flash_ld(E) + 2 * mica_flash_ld(Ev) + tile + 1) * (int64_t)sizeof(T);
}

template <typename T, int TILE>
static __global__ void
mica_flash_dq(mica_attn_shape a, const T *g, int64_t g_sb, int64_t g_sh, int64_t g_st, const T *q, const T *k,
              const T *v, const T *lse, const T *D, T *dq) {
    constexpr int NU = TILE / 8;
    const int64_t L = a.L, S = a.S, E = a.E, Ev = a.Ev, tiles = (L + TILE - 1) / TILE;
    const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * TILE, b = bh / a.H, h = bh % a.H;
    const int r = threadIdx.x / 8, lane = threadIdx.x % 8;
    const int64_t i = i0 + r, ldq = mica_flash_ld(E), ldv = mica_flash_ld(Ev);
    const unsigned mask = mica_row_mask();
    const int row = i < L;
    MICA_EXTERN_SHARED(unsigned char, mica_flash_shared);
    T *Qs = (T *)mica_flash_shared, *Ks = Qs + TILE * ldq, *dQs = Ks + TILE * ldq, *Gs = dQs + TILE * ldq;
    T *Vs = Gs + TILE * ldv, *dSs = Vs + TILE * ldv, *dSr = dSs + r * (TILE + 1), *dQr = dQs + r * ldq;
    const T *kb = k + b * a.k_sb + h * a.k_sh, *vb = v + b * a.v_sb + h * a.v_sh;
    const int64_t last = (i0 + TILE < L ? i0 + TILE : L) - 1, keys = mica_attn_row_keys(&a, last);
    mica_flash_load<T, TILE>(Qs, ldq, q + b * a.q_sb + h * a.q_sh, a.q_st, i0, L, E);
    mica_flash_load<T, TILE>(Gs, ldv, g + b * g_sb + h * g_sh, g_st, i0, L, Ev);
    for (int64_t e = lane; e < E; e += 8) dQr[e] = (T)0;
    const T li = row ? lse[bh * L + i] : (T)0, Di = row ? D[bh * L + i] : (T)0, scale = (T)a.scale;
    for (int64_t j0 = 0; j0 < keys; j0 += TILE) {
        __syncthreads();
        mica_flash_load<T, TILE>(Ks, ldq, kb, a.k_st, j0, S, E);
        mica_flash_load<T, TILE>(Vs, ldv, vb, a.v_st, j0, S, Ev);
        __syncthreads();
        const int seen = row ? mica_flash_seen(a, i, j0, TILE) : 0;
        T s[NU], dp[NU];
        mica_flash_dots<T, NU>(Qs + r * ldq, Ks + lane * ldq, ldq, E, s);
        mica_flash_dots<T, NU>(Gs + r * ldv, Vs + lane * ldv, ldv, Ev, dp);
#pragma unroll
        for (int u = 0; u < NU; u++) {
            const int c = lane + 8 * u;
            T pd, ds = (T)0;
            if (c < seen) mica_flash_pair<T>(a, s[u] * scale, dp[u], li, Di, i, j0 + c, bh, &pd, &ds);
            dSr[c] = ds;
        }
        __syncwarp(mask);
        for (int64_t e = lane; e < E; e += 8) {
            T acc = (T)0;
            for (int c = 0; c < seen; c++) acc = acc + dSr[c] * Ks[c * ldq + e];
            dQr[e] = dQr[e] + acc;
        }
    }
    if (!row) return;
    T *out = dq + b * a.dq_sb + h * a.dq_sh + i * a.dq_st;
    for (int64_t e = lane; e < E; e += 8) out[e] = dQr[e];
}

/* dK and dV, a block per key tile. shared: K, Q, dK [TILE, ldq], V, dO, dV [TILE, ldv], P~ and dS
 * [TILE, TILE + 1] (by key), the query tile's lse and D [TILE] */
template <typename T>
static constexpr __host__ __device__ int64_t mica_flash_dkv_shared(int64_t tile, int64_t E, int64_t Ev) {
    return tile * (3 * mica_flash_ld(E) + 3 * mica_flash_ld(Ev) + 2 * (tile + 1) + 2) * (int64_t)sizeof(T);
}

template <typename T, int TILE>
static __global__ void
mica_flash_dkv(mica_attn_shape a, const T *g, int64_t g_sb, int64_t g_sh, int64_t g_st, const T *q, const T *k,
               const T *v, const T *lse, const T *D, T *dk, T *dv) {
    constexpr int NU = TILE / 8;
    const int64_t L = a.L, S = a.S, E = a.E, Ev = a.Ev, tiles = (S + TILE - 1) / TILE;
    const int64_t bh = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * TILE, b = bh / a.H, h = bh % a.H;
    const int c = threadIdx.x / 8, lane = threadIdx.x % 8;
    const int64_t j = j0 + c, ldq = mica_flash_ld(E), ldv = mica_flash_ld(Ev);
    const unsigned mask = mica_row_mask();
    const int key = j < S;
    MICA_EXTERN_SHARED(unsigned char, mica_flash_shared);
    T *Ks = (T *)mica_flash_shared, *Qs = Ks + TILE * ldq, *dKs = Qs + TILE * ldq, *Vs = dKs + TILE * ldq;
    T *Gs = Vs + TILE * ldv, *dVs = Gs + TILE * ldv, *Ps = dVs + TILE * ldv, *dSs = Ps + TILE * (TILE + 1);
    T *ls = dSs + TILE * (TILE + 1), *Ds = ls + TILE;
    T *Pc = Ps + c * (TILE + 1), *dSc = dSs + c * (TILE + 1), *dKc = dKs + c * ldq, *dVc = dVs + c * ldv;
    const T *qb = q + b * a.q_sb + h * a.q_sh, *gb = g + b * g_sb + h * g_sh, scale = (T)a.scale;
    mica_flash_load<T, TILE>(Ks, ldq, k + b * a.k_sb + h * a.k_sh, a.k_st, j0, S, E);
    mica_flash_load<T, TILE>(Vs, ldv, v + b * a.v_sb + h * a.v_sh, a.v_st, j0, S, Ev);
    for (int64_t e = lane; e < E; e += 8) dKc[e] = (T)0;
    for (int64_t e = lane; e < Ev; e += 8) dVc[e] = (T)0;
    /* the first query row that sees key j0 is j0 itself when causal: start at its tile */
    for (int64_t i0 = a.causal ? j0 / TILE * TILE : 0; i0 < L; i0 += TILE) {
        __syncthreads();
        mica_flash_load<T, TILE>(Qs, ldq, qb, a.q_st, i0, L, E);
        mica_flash_load<T, TILE>(Gs, ldv, gb, g_st, i0, L, Ev);
        if (threadIdx.x < TILE) {
            const int64_t x = i0 + threadIdx.x;
            ls[threadIdx.x] = x < L ? lse[bh * L + x] : (T)0;
            Ds[threadIdx.x] = x < L ? D[bh * L + x] : (T)0;
        }
        __syncthreads();
        /* the query rows [lo, hi) of the tile that see key j */
        int64_t lo = a.causal ? j - i0 : 0, hi = L - i0 < TILE ? L - i0 : TILE;
        lo = !key ? hi : lo < 0 ? 0 : lo > hi ? hi : lo;
        T s[NU], dp[NU];
        mica_flash_dots_t<T, NU>(Qs + lane * ldq, ldq, Ks + c * ldq, E, s);
        mica_flash_dots_t<T, NU>(Gs + lane * ldv, ldv, Vs + c * ldv, Ev, dp);
#pragma unroll
        for (int u = 0; u < NU; u++) {
            const int r = lane + 8 * u;
            T pd = (T)0, ds = (T)0;
            if (r >= lo && r < hi) mica_flash_pair<T>(a, s[u] * scale, dp[u], ls[r], Ds[r], i0 + r, j, bh, &pd, &ds);
            Pc[r] = pd;
            dSc[r] = ds;
        }
        __syncwarp(mask);
        for (int64_t e = lane; e < Ev; e += 8) {
            T acc = (T)0;
            for (int64_t r = lo; r < hi; r++) acc = acc + Pc[r] * Gs[r * ldv + e];
            dVc[e] = dVc[e] + acc;
        }
        for (int64_t e = lane; e < E; e += 8) {
            T acc = (T)0;
            for (int64_t r = lo; r < hi; r++) acc = acc + dSc[r] * Qs[r * ldq + e];
            dKc[e] = dKc[e] + acc;
        }
    }
    if (!key) return;
    T *ko = dk + b * a.dk_sb + h * a.dk_sh + j * a.dk_st, *vo = dv + b * a.dv_sb + h * a.dv_sh + j * a.dv_st;
    for (int64_t e = lane; e < E; e += 8) ko[e] = dKc[e];
    for (int64_t e = lane; e < Ev; e += 8) vo[e] = dVc[e];
}

/* ---- the host side: a tile for the shape, the launches ---------------------------------------- */
#define MICA_FLASH_SHARED_DEFAULT (48 * 1024)

/* the largest tile whose shared memory fits the default 48 KiB (8 past that), for head dims known
 * when the program is generated (so only the kernels of that tile are compiled) */
static constexpr int mica_flash_tile(int64_t (*bytes)(int64_t, int64_t, int64_t), int64_t E, int64_t Ev) {
    return bytes(32, E, Ev) <= MICA_FLASH_SHARED_DEFAULT ? 32 : bytes(16, E, Ev) <= MICA_FLASH_SHARED_DEFAULT ? 16 : 8;
}

/* a kernel whose shared memory passes the default carve-out is allowed it (device limits permitting:
 * past them the launch fails and the run says so) */
template <typename K>
static void mica_flash_allow(K *kernel, int64_t bytes) {
    if (bytes > MICA_FLASH_SHARED_DEFAULT)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

static int mica_flash_launched(void) {
    return cudaPeekAtLastError() == cudaSuccess ? 0 : mica_cuda_failed("launching attention's kernels");
}

/* o and lse from q, k, v (the forward); E and Ev are a->E and a->Ev */
template <typename T, int64_t E, int64_t Ev>
static int mica_attention_cuda(cudaStream_t stream, const mica_attn_shape *a, const T *q, const T *k, const T *v,
                               T *o, T *lse) {
    constexpr int TILE = mica_flash_tile(mica_flash_forward_shared<T>, E, Ev);
    constexpr int64_t bytes = mica_flash_forward_shared<T>(TILE, E, Ev);
    const int64_t blocks = a->B * a->H * ((a->L + TILE - 1) / TILE);
    if (blocks == 0) return 0;
    mica_flash_allow(mica_flash_forward<T, TILE>, bytes);
    MICA_LAUNCH((mica_flash_forward<T, TILE>), (unsigned)blocks, 8 * TILE, bytes, stream, *a, q, k, v, o, lse);
    return mica_flash_launched();
}

/* dq, dk, dv from the output gradient g (strides g_sb, g_sh, g_st), q, k, v, o and lse; D (scratch)
 * holds B * H * L values */
template <typename T, int64_t E, int64_t Ev>
static int mica_attention_backward_cuda(cudaStream_t stream, const mica_attn_shape *a, const T *g, const T *q,
                                        const T *k, const T *v, const T *o, const T *lse, T *dq, T *dk, T *dv,
                                        int64_t g_sb, int64_t g_sh, int64_t g_st, T *D) {
    constexpr int TQ = mica_flash_tile(mica_flash_dq_shared<T>, E, Ev);
    constexpr int TK = mica_flash_tile(mica_flash_dkv_shared<T>, E, Ev);
    constexpr int64_t q_bytes = mica_flash_dq_shared<T>(TQ, E, Ev), k_bytes = mica_flash_dkv_shared<T>(TK, E, Ev);
    const int64_t heads = a->B * a->H, q_blocks = heads * ((a->L + TQ - 1) / TQ);
    const int64_t k_blocks = heads * ((a->S + TK - 1) / TK);
    if (q_blocks > 0) {
        MICA_LAUNCH((mica_flash_delta<T>), mica_blocks(heads * a->L), MICA_THREADS, 0, stream, *a, g, g_sb, g_sh, g_st,
                    o, D);
        mica_flash_allow(mica_flash_dq<T, TQ>, q_bytes);
        MICA_LAUNCH((mica_flash_dq<T, TQ>), (unsigned)q_blocks, 8 * TQ, q_bytes, stream, *a, g, g_sb, g_sh, g_st, q, k,
                    v, lse, D, dq);
    }
    if (k_blocks > 0) {
        mica_flash_allow(mica_flash_dkv<T, TK>, k_bytes);
        MICA_LAUNCH((mica_flash_dkv<T, TK>), (unsigned)k_blocks, 8 * TK, k_bytes, stream, *a, g, g_sb, g_sh, g_st, q, k,
                    v, lse, D, dk, dv);
    }
    return mica_flash_launched();
}
#endif
