/* Hand-written kernels for Mica's row-wise primitives, each with its backward: layer and RMS
 * norm, softmax, log-softmax, cross-entropy, causal attention, embedding. Defined for float and
 * double by one macro each.
 *
 * Parallel over outputs only (rows, columns, or (batch, head) pairs); every sum runs in a fixed
 * order (mica_sum_* lanes for rows, lane-by-index accumulation for columns), so results are
 * bitwise identical for any thread count.
 */
#ifndef MICA_KERNELS_H
#define MICA_KERNELS_H
#include "mica_runtime.h"
#include "mica_gemm.h"
#include "mica_rows.h"
#include "mica_bf16gemm.h"

#define MICA_PAR_ROWS(rows, n) if ((double)(rows) * (n) > 32768.0)

/* column sums of an [rows, n] expression, canonical order per column (lanes by row index) */
#define MICA_COLUMN_SUMS(T, S, rows, n, out, EXPR)                                                  \
    _Pragma("omp parallel for schedule(static) if ((double)(rows) * (n) > 32768.0)")               \
    for (int64_t c0 = 0; c0 < (n); c0 += 64) {                                                     \
        int64_t cw = (n) - c0 < 64 ? (n) - c0 : 64;                                                \
        T acc[MICA_LANES][64], tot[64];                                                            \
        for (int64_t b0 = 0; b0 < (rows) || b0 == 0; b0 += MICA_BLOCK) {                          \
            int64_t b1 = (rows) - b0 < MICA_BLOCK ? (rows) : b0 + MICA_BLOCK;                      \
            for (int l = 0; l < MICA_LANES; l++) for (int64_t c = 0; c < cw; c++) acc[l][c] = 0;   \
            for (int64_t r = b0; r < b1; r++) {                                                    \
                T *a = acc[(r - b0) & (MICA_LANES - 1)];                                           \
                for (int64_t c = 0; c < cw; c++) { int64_t j = c0 + c; (void)j; a[c] = a[c] + (EXPR); } \
            }                                                                                      \
            for (int64_t c = 0; c < cw; c++) {                                                     \
                T lanes[MICA_LANES];                                                               \
                for (int l = 0; l < MICA_LANES; l++) lanes[l] = acc[l][c];                         \
                tot[c] = b0 == 0 ? MICA_TREE8(lanes) : tot[c] + MICA_TREE8(lanes);                \
            }                                                                                      \
            if ((rows) == 0) break;                                                                \
        }                                                                                          \
        for (int64_t c = 0; c < cw; c++) (out)[c0 + c] = tot[c];                                   \
    }

/* A norm's backward in one sweep over its rows: each row's dx (ROW, for row r), and the column
 * sums of DW_EXPR and DB_EXPR (for row r, column j) into dw and db where they are not NULL, in
 * MICA_COLUMN_SUMS's order exactly: per block of MICA_BLOCK rows, lane r % MICA_LANES adds its rows
 * in increasing r, the lanes meet in MICA_TREE8, the blocks add up in increasing order. A thread
 * owns whole lanes (a contiguous range of them), so each lane's chain is one thread's, and the
 * column sums read the rows the row pass has just read instead of sweeping g and x a second time
 * (a weight gradient's norm backward read both twice from memory). `part` holds 2 * MICA_LANES * n
 * elements (the lanes' sums of a block: the program's shared scratch). At most MICA_LANES threads.
 * Rows shorter than MICA_SWEEP_MIN keep the two passes: there the data is small, and the rows of
 * neighbouring lanes (two threads') share cache lines (measured: 20,000 x 100 took 2x as long). */
#define MICA_SWEEP_MIN 256
#define MICA_NORM_BACKWARD_SWEEP(T, S, rows, n, part, dw, db, ROW, DW_EXPR, DB_EXPR)                \
    if ((n) < MICA_SWEEP_MIN) { /* short rows: two passes (the threads' lanes would share lines) */ \
        _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                       \
        for (int64_t r = 0; r < (rows); r++) { ROW; }                                              \
        if (dw) { MICA_COLUMN_SUMS(T, S, rows, n, dw, DW_EXPR) }                                   \
        if (db) { MICA_COLUMN_SUMS(T, S, rows, n, db, DB_EXPR) }                                   \
    } else {                                                                                       \
        int teams_ = omp_get_max_threads() < MICA_LANES ? omp_get_max_threads() : MICA_LANES;      \
        _Pragma("omp parallel num_threads(teams_) MICA_PAR_ROWS(rows, n)")                        \
        {                                                                                          \
            int t_ = omp_get_thread_num(), nt_ = omp_get_num_threads();                            \
            int l0_ = t_ * MICA_LANES / nt_, l1_ = (t_ + 1) * MICA_LANES / nt_;                    \
            for (int64_t b0 = 0; b0 < (rows) || b0 == 0; b0 += MICA_BLOCK) {                      \
                int64_t b1 = (rows) - b0 < MICA_BLOCK ? (rows) : b0 + MICA_BLOCK;                  \
                for (int l = l0_; l < l1_; l++)                                                    \
                    for (int64_t j = 0; j < (n); j++) { (part)[l * (n) + j] = 0; (part)[(MICA_LANES + l) * (n) + j] = 0; } \
                for (int64_t r8 = b0; r8 < b1; r8 += MICA_LANES)                                   \
                    for (int l = l0_; l < l1_ && r8 + l < b1; l++) {                               \
                        int64_t r = r8 + l;                                                        \
                        ROW;                                                                       \
                        T *aw_ = (part) + l * (n), *ab_ = (part) + (MICA_LANES + l) * (n);         \
                        if (dw) for (int64_t j = 0; j < (n); j++) aw_[j] = aw_[j] + (DW_EXPR);     \
                        if (db) for (int64_t j = 0; j < (n); j++) ab_[j] = ab_[j] + (DB_EXPR);     \
                    }                                                                              \
                _Pragma("omp barrier")                                                             \
                _Pragma("omp for schedule(static)")                                                \
                for (int64_t j = 0; j < (n); j++) {                                                \
                    T lw_[MICA_LANES], lb_[MICA_LANES];                                            \
                    for (int l = 0; l < MICA_LANES; l++) {                                         \
                        lw_[l] = (part)[l * (n) + j];                                              \
                        lb_[l] = (part)[(MICA_LANES + l) * (n) + j];                               \
                    }                                                                              \
                    if (dw) (dw)[j] = b0 == 0 ? MICA_TREE8(lw_) : (dw)[j] + MICA_TREE8(lw_);       \
                    if (db) (db)[j] = b0 == 0 ? MICA_TREE8(lb_) : (db)[j] + MICA_TREE8(lb_);       \
                }                                                                                  \
                if ((rows) == 0) break;                                                            \
            }                                                                                      \
        }                                                                                          \
    }

#define MICA_DEFINE_KERNELS(T, S)                                                                  \
/* ---- layer norm ------------------------------------------------------------------------- */ \
static void mica_layer_norm_##S(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd,        \
                                int64_t rows, int64_t n, T eps) {                                  \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++)                                                             \
        mica_layer_norm_row_##S(x + r * n, w, b, y + r * n, mean + r, rstd + r, n, eps);           \
}                                                                                                  \
static void mica_layer_norm_backward_##S(const T *g, const T *x, const T *w, const T *mean,        \
                                         const T *rstd, T *dx, T *dw, T *db, int64_t rows,         \
                                         int64_t n, T *part) {                                     \
    MICA_NORM_BACKWARD_SWEEP(T, S, rows, n, part, dw, db,                                             \
        mica_layer_norm_backward_row_##S(g + r * n, x + r * n, w, mean[r], rstd[r], dx + r * n, n), \
        g[r * n + j] * ((x[r * n + j] - mean[r]) * rstd[r]), g[r * n + j])                         \
}                                                                                                  \
/* ---- RMS norm --------------------------------------------------------------------------- */ \
static void mica_rms_norm_##S(const T *x, const T *w, T *y, T *rstd, int64_t rows, int64_t n,      \
                              T eps) {                                                             \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++) mica_rms_norm_row_##S(x + r * n, w, y + r * n, rstd + r, n, eps); \
}                                                                                                  \
static void mica_rms_norm_backward_##S(const T *g, const T *x, const T *w, const T *rstd, T *dx,   \
                                       T *dw, int64_t rows, int64_t n, T *part) {                  \
    T *no_db = NULL;                                                                               \
    MICA_NORM_BACKWARD_SWEEP(T, S, rows, n, part, dw, no_db,                                          \
        mica_rms_norm_backward_row_##S(g + r * n, x + r * n, w, rstd[r], dx + r * n, n),           \
        g[r * n + j] * (x[r * n + j] * rstd[r]), (T)0)                                             \
}                                                                                                  \
/* ---- softmax and log-softmax over rows ----------------------------------------------------- */ \
static void mica_softmax_##S(const T *x, T *y, int64_t rows, int64_t n) {                          \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++) mica_softmax_row_##S(x + r * n, y + r * n, n);              \
}                                                                                                  \
static void mica_softmax_backward_##S(const T *g, const T *y, T *dx, int64_t rows, int64_t n) {    \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++) mica_softmax_backward_row_##S(g + r * n, y + r * n, dx + r * n, n); \
}                                                                                                  \
static void mica_log_softmax_##S(const T *x, T *y, int64_t rows, int64_t n) {                      \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++) mica_log_softmax_row_##S(x + r * n, y + r * n, n);          \
}                                                                                                  \
static void mica_log_softmax_backward_##S(const T *g, const T *y, T *dx, int64_t rows, int64_t n) {\
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++)                                                             \
        mica_log_softmax_backward_row_##S(g + r * n, y + r * n, dx + r * n, n);                    \
}                                                                                                  \
/* ---- cross-entropy over rows of logits ------------------------------------------------------- */ \
static void mica_cross_entropy_##S(const T *x, const int64_t *t, T *loss, T *lse, int64_t rows,    \
                                   int64_t n, int64_t ignore, T *scratch) {                        \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++) {                                                           \
        const T *xr = x + r * n;                                                                   \
        T *e = scratch + (int64_t)omp_get_thread_num() * n;                                        \
        T m = mica_row_max_##S(xr, n);                                                             \
        for (int64_t j = 0; j < n; j++) e[j] = mica_exp_##S(xr[j] - m);                            \
        T l = m + mica_log_##S(mica_sum_##S(e, n));                                                \
        int64_t k = t[r];                                                                          \
        lse[r] = l;                                                                                \
        if (k == ignore) { loss[r] = 0; continue; }                                                \
        if (k < 0 || k >= n) { mica_fail(MICA_CROSS_ENTROPY_RANGE_TEXT, k, n); loss[r] = 0; continue; } \
        loss[r] = l - xr[k];                                                                       \
    }                                                                                              \
}                                                                                                  \
static void mica_cross_entropy_backward_##S(const T *g, const T *x, const int64_t *t, const T *lse,\
                                            T *dx, int64_t rows, int64_t n, int64_t ignore) {      \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(rows, n)")                           \
    for (int64_t r = 0; r < rows; r++)                                                             \
        mica_cross_entropy_backward_row_##S(g[r], x + r * n, t[r], lse[r], dx + r * n, n, ignore); \
}                                                                                                  \
/* ---- embedding ----------------------------------------------------------------------------- */ \
static void mica_embedding_##S(const int64_t *idx, const T *w, T *y, int64_t count, int64_t V,     \
                               int64_t D) {                                                        \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(count, D)")                          \
    for (int64_t i = 0; i < count; i++) {                                                          \
        int64_t k = idx[i];                                                                        \
        if (k < 0 || k >= V) { mica_fail(MICA_EMBEDDING_RANGE_TEXT, k, V); continue; } \
        memcpy(y + i * D, w + k * D, sizeof(T) * D);                                               \
    }                                                                                              \
}                                                                                                  \
/* dw[v] = sum of g[i] over positions i with idx[i] == v, in increasing i (the oracle's order);    \
 * `order` (count + V + 1 int64) holds the positions bucketed by row */                           \
static void mica_embedding_backward_##S(const T *g, const int64_t *idx, T *dw, int64_t count,      \
                                        int64_t V, int64_t D, int64_t *order) {                    \
    int64_t *start = order + count;                                                                \
    for (int64_t v = 0; v <= V; v++) start[v] = 0;                                                 \
    for (int64_t i = 0; i < count; i++) {                                                          \
        int64_t k = idx[i];                                                                        \
        if (k < 0 || k >= V) { mica_fail(MICA_EMBEDDING_RANGE_TEXT, k, V); return; } \
        start[k + 1]++;                                                                            \
    }                                                                                              \
    for (int64_t v = 0; v < V; v++) start[v + 1] += start[v];                                      \
    for (int64_t i = 0; i < count; i++) order[start[idx[i]]++] = i;                                \
    for (int64_t v = V; v > 0; v--) start[v] = start[v - 1];                                       \
    start[0] = 0;                                                                                  \
    _Pragma("omp parallel for schedule(static) MICA_PAR_ROWS(V, D)")                              \
    for (int64_t v = 0; v < V; v++) {                                                              \
        T *out = dw + v * D;                                                                       \
        for (int64_t d = 0; d < D; d++) out[d] = 0;                                                \
        for (int64_t p = start[v]; p < start[v + 1]; p++) {                                        \
            const T *gi = g + order[p] * D;                                                        \
            for (int64_t d = 0; d < D; d++) out[d] = out[d] + gi[d];                               \
        }                                                                                          \
    }                                                                                              \
}

MICA_DEFINE_KERNELS(float, f32)
MICA_DEFINE_KERNELS(double, f64)

/* indices copied, each checked against the count it must stay below (mode, mica/ops/nn.py's
 * check_range): 0, nll_loss's class indices (ignore passes); 1, a tensor index of a dim, from
 * -bound up, the negative ones wrapped; 2, one_hot's classes; 3, a tensor index from 0 (gather's);
 * 4, a masked assignment's count of True elements, which must be bound (the values' count) */
static void mica_check_range(const int64_t *t, int64_t *out, int64_t count, int64_t bound, int64_t ignore, int mode) {
    for (int64_t i = 0; i < count; i++) {
        if (mode == 4) {
            if (t[i] != bound) mica_fail(MICA_MASK_COUNT_TEXT, t[i], bound);
            out[i] = t[i];
            continue;
        }
        if (mode == 1) {
            if (t[i] < -bound || t[i] >= bound) mica_fail(MICA_INDEX_RANGE_TEXT, t[i], bound);
            out[i] = t[i] < 0 ? t[i] + bound : t[i];
            continue;
        }
        if ((mode != 0 || t[i] != ignore) && (t[i] < 0 || t[i] >= bound))
            mica_fail(mode == 2 ? MICA_CLASS_RANGE_TEXT : mode == 3 ? MICA_POSITION_RANGE_TEXT : MICA_NLL_LOSS_RANGE_TEXT,
                      t[i], bound);
        out[i] = t[i];
    }
}

/* ---- attention (the shape record and the float rows are in mica_rows.h) --------------------------
 * Dot products over the head dim run in increasing index; softmax sums use the canonical lanes.
 * Per-thread scratch: mica_attention_scratch(S, E, Ev) elements. */
static inline int64_t mica_attention_scratch(int64_t S, int64_t E, int64_t Ev) {
    return 2 * E * S + 2 * Ev * S + 4 * S + E + Ev;
}

#define MICA_DEFINE_ATTENTION(T, S_)                                                               \
static void mica_attention_##S_(const mica_attn_shape *a, const T *q, const T *k, const T *v,      \
                                T *o, T *lse, T *scratch, int64_t slot) {                          \
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;                                        \
    const T scale = (T)a->scale, keep_scale = (T)(1.0 / (1.0 - a->dropout_p));                     \
    _Pragma("omp parallel for schedule(static) if (a->B * a->H * L * S * (E + Ev) > 65536)")      \
    for (int64_t bh = 0; bh < a->B * a->H; bh++) {                                                 \
        int64_t b = bh / a->H, h = bh % a->H;                                                      \
        const T *qb = q + b * a->q_sb + h * a->q_sh, *kb = k + b * a->k_sb + h * a->k_sh;          \
        const T *vb = v + b * a->v_sb + h * a->v_sh;                                               \
        T *ob = o + b * a->o_sb + h * a->o_sh;                                                     \
        T *kt = scratch + (int64_t)omp_get_thread_num() * slot, *s = kt + E * S, *p = s + S;       \
        for (int64_t j = 0; j < S; j++)                                                            \
            for (int64_t d = 0; d < E; d++) kt[d * S + j] = kb[j * a->k_st + d];                   \
        for (int64_t i = 0; i < L; i++) {                                                          \
            const T *qi = qb + i * a->q_st;                                                        \
            int64_t n = a->causal ? (i + 1 < S ? i + 1 : S) : S;                                   \
            for (int64_t j = 0; j < n; j++) s[j] = 0;                                              \
            for (int64_t d = 0; d < E; d++) {                                                      \
                T qd = qi[d];                                                                      \
                const T *kr = kt + d * S;                                                          \
                for (int64_t j = 0; j < n; j++) s[j] = s[j] + qd * kr[j];                          \
            }                                                                                      \
            for (int64_t j = 0; j < n; j++) s[j] = s[j] * scale;                                   \
            T m = mica_row_max_##S_(s, n);                                                         \
            for (int64_t j = 0; j < n; j++) p[j] = mica_exp_##S_(s[j] - m);                        \
            T l = mica_sum_##S_(p, n);                                                             \
            lse[bh * L + i] = m + mica_log_##S_(l);                                                \
            for (int64_t j = 0; j < n; j++) p[j] = p[j] / l;                                       \
            if (a->dropout_p > 0) {                                                                \
                uint64_t base = ((uint64_t)bh * L + i) * S;                                        \
                for (int64_t j = 0; j < n; j++)                                                    \
                    p[j] = mica_keep(a->rng, a->stream, base + j, a->threshold) ? p[j] * keep_scale : (T)0; \
            }                                                                                      \
            T *oi = ob + i * a->o_st;                                                              \
            for (int64_t e = 0; e < Ev; e++) oi[e] = 0;                                            \
            for (int64_t j = 0; j < n; j++) {                                                      \
                T pj = p[j];                                                                       \
                const T *vj = vb + j * a->v_st;                                                    \
                for (int64_t e = 0; e < Ev; e++) oi[e] = oi[e] + pj * vj[e];                       \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
/* gradients of q, k, v, written through the dq/dk/dv strides; g (the output's gradient) by its own strides */       \
static void mica_attention_backward_##S_(const mica_attn_shape *a, const T *g, const T *q,         \
                                         const T *k, const T *v, const T *o, const T *lse, T *dq,  \
                                         T *dk, T *dv, int64_t g_sb, int64_t g_sh, int64_t g_st,   \
                                         T *scratch, int64_t slot) {                               \
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;                                        \
    const T scale = (T)a->scale, keep_scale = (T)(1.0 / (1.0 - a->dropout_p));                     \
    _Pragma("omp parallel for schedule(static) if (a->B * a->H * L * S * (E + Ev) > 65536)")      \
    for (int64_t bh = 0; bh < a->B * a->H; bh++) {                                                 \
        int64_t b = bh / a->H, h = bh % a->H;                                                      \
        const T *qb = q + b * a->q_sb + h * a->q_sh, *kb = k + b * a->k_sb + h * a->k_sh;          \
        const T *vb = v + b * a->v_sb + h * a->v_sh, *ob = o + b * a->o_sb + h * a->o_sh;          \
        const T *gb = g + b * g_sb + h * g_sh;                                                     \
        T *dqb = dq + b * a->dq_sb + h * a->dq_sh, *dkb = dk + b * a->dk_sb + h * a->dk_sh;        \
        T *dvb = dv + b * a->dv_sb + h * a->dv_sh;                                                 \
        T *kt = scratch + (int64_t)omp_get_thread_num() * slot, *vt = kt + E * S;                  \
        T *dka = vt + Ev * S, *dva = dka + E * S, *s = dva + Ev * S, *p = s + S, *dp = p + S;       \
        for (int64_t j = 0; j < S; j++) {                                                          \
            for (int64_t d = 0; d < E; d++) { kt[d * S + j] = kb[j * a->k_st + d]; dka[j * E + d] = 0; } \
            for (int64_t e = 0; e < Ev; e++) { vt[e * S + j] = vb[j * a->v_st + e]; dva[j * Ev + e] = 0; } \
        }                                                                                          \
        for (int64_t i = 0; i < L; i++) {                                                          \
            const T *qi = qb + i * a->q_st, *gi = gb + i * g_st, *oi = ob + i * a->o_st;           \
            int64_t n = a->causal ? (i + 1 < S ? i + 1 : S) : S;                                   \
            for (int64_t j = 0; j < n; j++) { s[j] = 0; dp[j] = 0; }                               \
            for (int64_t d = 0; d < E; d++) {                                                      \
                T qd = qi[d];                                                                      \
                const T *kr = kt + d * S;                                                          \
                for (int64_t j = 0; j < n; j++) s[j] = s[j] + qd * kr[j];                          \
            }                                                                                      \
            T li = lse[bh * L + i];                                                                \
            for (int64_t j = 0; j < n; j++) p[j] = mica_exp_##S_(s[j] * scale - li);               \
            for (int64_t e = 0; e < Ev; e++) {                                                     \
                T ge = gi[e];                                                                      \
                const T *vr = vt + e * S;                                                          \
                for (int64_t j = 0; j < n; j++) dp[j] = dp[j] + ge * vr[j];                        \
            }                                                                                      \
            T D = 0;                                                                               \
            for (int64_t e = 0; e < Ev; e++) D = D + gi[e] * oi[e];                                \
            uint64_t base = ((uint64_t)bh * L + i) * S;                                            \
            for (int64_t j = 0; j < n; j++) {                                                      \
                T pd = p[j], dpj = dp[j];                                                          \
                if (a->dropout_p > 0) {                                                            \
                    int kept = mica_keep(a->rng, a->stream, base + j, a->threshold);               \
                    pd = kept ? p[j] * keep_scale : (T)0;                                          \
                    dpj = kept ? dpj * keep_scale : (T)0;                                          \
                }                                                                                  \
                T *dvj = dva + j * Ev;                                                             \
                for (int64_t e = 0; e < Ev; e++) dvj[e] = dvj[e] + pd * gi[e];                     \
                s[j] = (p[j] * (dpj - D)) * scale; /* dS */                                        \
            }                                                                                      \
            T *dqi = dqb + i * a->dq_st;                                                           \
            for (int64_t d = 0; d < E; d++) dqi[d] = 0;                                            \
            for (int64_t j = 0; j < n; j++) {                                                      \
                T ds = s[j];                                                                       \
                const T *kj = kb + j * a->k_st;                                                    \
                T *dkj = dka + j * E;                                                              \
                for (int64_t d = 0; d < E; d++) { dqi[d] = dqi[d] + ds * kj[d]; dkj[d] = dkj[d] + ds * qi[d]; } \
            }                                                                                      \
        }                                                                                          \
        for (int64_t j = 0; j < S; j++) {                                                          \
            for (int64_t d = 0; d < E; d++) dkb[j * a->dk_st + d] = dka[j * E + d];                \
            for (int64_t e = 0; e < Ev; e++) dvb[j * a->dv_st + e] = dva[j * Ev + e];              \
        }                                                                                          \
    }                                                                                              \
}

MICA_DEFINE_ATTENTION(double, f64)

/* float attention: per (batch, head), in blocks of query rows (16; bfloat16 heads on the product
 * tiles take 32). K and V are transposed once per head into scratch; every float product runs
 * through mica_small_gemm (no packing, one fused chain per element over the contraction index).
 * With a causal mask, a row block only visits the keys it can see, and the key blocks of dK and dV
 * only the queries that see them (the keys a block covers past a row's last visible one hold 0,
 * so the block size never changes a sum).
 * Per-thread scratch: mica_attention_slot_f32(L, S, E, Ev) floats. */
#define MICA_ATTN_ROWS 16
#define MICA_ATTN_ROWS_MAX 32  /* the largest block of query rows (the bfloat16 heads' MICA_BF16_MB) */
static inline int64_t mica_attention_slot_f32(int64_t L, int64_t S, int64_t E, int64_t Ev) {
    return E * S + Ev * S + 2 * L * S;
}

static inline int64_t mica_attn_visible(const mica_attn_shape *a, int64_t i1) {
    return a->causal ? (i1 < a->S ? i1 : a->S) : a->S;
}

/* The products of two sets of rows that attention takes: the scores Q K^T and the backward's
 * dO V^T, out[r * ld + j] = alpha * (x_{i0 + r} . y_j) for r < rows, j < n. In float32 by
 * mica_small_gemm against y transposed once per head (yt [len, S]); bfloat16 heads, where the
 * processor has bfloat16 products, on their kernel instead (mica_attn_dots_bf16). */
typedef struct mica_attn_dots {
    void (*run)(const struct mica_attn_dots *d, int64_t i0, int64_t rows, int64_t n, float alpha, float *out,
                int64_t ld);
    const float *x, *yt;  /* float32: x rows (row stride x_st), y transposed (row stride yt_st) */
    int64_t x_st, yt_st, len;
    const mica_bf16 *xh;  /* bfloat16: x rows (row stride x_st) */
    mica_bf16 *yp, *ap;   /* y packed as a product's B, once per head; one packed 32-row block of x */
    float *acc;           /* one 32 x 32 block of sums */
    int64_t Kp;
    int amx;
} mica_attn_dots;

static void mica_attn_dots_f32(const mica_attn_dots *d, int64_t i0, int64_t rows, int64_t n, float alpha, float *out,
                               int64_t ld) {
    mica_small_gemm(rows, n, d->len, alpha, d->x + i0 * d->x_st, d->x_st, 0, d->yt, d->yt_st, out, ld);
}

static mica_attn_dots mica_attn_dots_of_f32(const float *x, int64_t x_st, const float *yt, int64_t yt_st,
                                            int64_t len) {
    mica_attn_dots d;
    memset(&d, 0, sizeof d);
    d.run = mica_attn_dots_f32;
    d.x = x; d.x_st = x_st; d.yt = yt; d.yt_st = yt_st; d.len = len;
    return d;
}

/* each output row r of a half-rounding head divided by its weights' float sum (the rows left the
 * rounded weights undivided: mica_attention_row_f32) */
static void mica_attn_divide_rows(float *o, int64_t o_st, int64_t rows, int64_t Ev, const float *sum) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < Ev; e++) o[r * o_st + e] = o[r * o_st + e] / sum[r];
}

/* one head (bh) of the float attention: the scores from qk, V rows at v_st; p holds block x S floats */
static void mica_attention_head_f32(const mica_attn_shape *a, int64_t bh, const mica_attn_dots *qk, int64_t block,
                                    const float *vb, int64_t v_st, float *ob, int64_t o_st, float *lse, float *p) {
    const int64_t L = a->L, S = a->S, Ev = a->Ev;
    const float scale = (float)a->scale;
    float sum[MICA_BF16_MB];  /* (block <= 32) each row's float sum, with half_round */
    for (int64_t i0 = 0; i0 < L; i0 += block) {
        int64_t rows = L - i0 < block ? L - i0 : block, n = mica_attn_visible(a, i0 + rows);
        qk->run(qk, i0, rows, n, scale, p, S);
        for (int64_t r = 0; r < rows; r++)
            mica_attention_row_f32(a, bh, i0 + r, p + r * S, n, lse + bh * L + i0 + r, sum + r);
        mica_small_gemm(rows, Ev, n, 1.0f, p, S, 0, vb, v_st, ob + i0 * o_st, o_st);
        if (a->half_round) mica_attn_divide_rows(ob + i0 * o_st, o_st, rows, Ev, sum);
    }
}

static void mica_attention_f32(const mica_attn_shape *a, const float *q, const float *k, const float *v,
                               float *o, float *lse, float *scratch, int64_t slot) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
#pragma omp parallel for schedule(static) if (a->B * a->H * L * S * (E + Ev) > 65536)
    for (int64_t bh = 0; bh < a->B * a->H; bh++) {
        int64_t b = bh / a->H, h = bh % a->H;
        const float *qb = q + b * a->q_sb + h * a->q_sh, *kb = k + b * a->k_sb + h * a->k_sh;
        const float *vb = v + b * a->v_sb + h * a->v_sh;
        float *ob = o + b * a->o_sb + h * a->o_sh;
        float *kt = scratch + (int64_t)omp_get_thread_num() * slot, *p = kt + E * S;
        mica_transpose_f32(kb, a->k_st, kt, S, S, E);
        mica_attn_dots qk = mica_attn_dots_of_f32(qb, a->q_st, kt, S, E);
        mica_attention_head_f32(a, bh, &qk, MICA_ATTN_ROWS, vb, a->v_st, ob, a->o_st, lse, p);
    }
}

/* D[r] = the dot product of rows r of g and o (Ev long) for r < rows, each summed in increasing
 * index as the backward's row defines it; the rows side by side, so the sums run at the vector's
 * width rather than one add's latency at a time: the same bits */
static void mica_attn_row_dots(const float *g, int64_t g_st, const float *o, int64_t o_st, int64_t rows, int64_t Ev,
                               float *D) {
    for (int64_t r = 0; r < rows; r++) D[r] = 0.0f;
    for (int64_t e = 0; e < Ev; e++)
        for (int64_t r = 0; r < rows; r++) D[r] = D[r] + g[r * g_st + e] * o[r * o_st + e];
}

/* one head of the float attention's backward: the scores from qk, dO V^T from gv, K as it lies
 * (kb, k_st); pd and ds hold L x S floats each */
static void mica_attention_backward_head_f32(const mica_attn_shape *a, int64_t bh, const mica_attn_dots *qk,
                                             const mica_attn_dots *gv, int64_t block, const float *gb, int64_t g_st,
                                             const float *qb, int64_t q_st, const float *kb, int64_t k_st,
                                             const float *ob, int64_t o_st, const float *lse, float *dqb,
                                             int64_t dq_st, float *dkb, int64_t dk_st, float *dvb, int64_t dv_st,
                                             float *pd, float *ds) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    const float scale = (float)a->scale;
    for (int64_t i0 = 0; i0 < L; i0 += block) {
        int64_t rows = L - i0 < block ? L - i0 : block, n = mica_attn_visible(a, i0 + rows);
        float *pb = pd + i0 * S, *db = ds + i0 * S;
        qk->run(qk, i0, rows, n, scale, pb, S);  /* scores */
        gv->run(gv, i0, rows, n, 1.0f, db, S);   /* dPd */
        float D[MICA_ATTN_ROWS_MAX];
        mica_attn_row_dots(gb + i0 * g_st, g_st, ob + i0 * o_st, o_st, rows, Ev, D);
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = i0 + r;
            /* (zeroed to S, not n: with fewer queries than keys, the dK and dV products below read
             * key columns past the block's last visible one) */
            mica_attention_backward_row_f32(a, bh, i, pb + r * S, db + r * S, S, lse[bh * L + i], D[r]);
        }
        mica_small_gemm(rows, E, n, 1.0f, db, S, 0, kb, k_st, dqb + i0 * dq_st, dq_st); /* dQ */
    }
    for (int64_t j0 = 0; j0 < S; j0 += MICA_ATTN_ROWS) {
        int64_t cols = S - j0 < MICA_ATTN_ROWS ? S - j0 : MICA_ATTN_ROWS;
        int64_t first = a->causal ? (j0 < L ? j0 : L) : 0;   /* queries before j0 cannot see these keys */
        mica_small_gemm(cols, E, L - first, 1.0f, ds + first * S + j0, S, 1, qb + first * q_st, q_st,
                        dkb + j0 * dk_st, dk_st);                                           /* dK */
        mica_small_gemm(cols, Ev, L - first, 1.0f, pd + first * S + j0, S, 1, gb + first * g_st, g_st,
                        dvb + j0 * dv_st, dv_st);                                           /* dV */
    }
}

static void mica_attention_backward_f32(const mica_attn_shape *a, const float *g, const float *q, const float *k,
                                        const float *v, const float *o, const float *lse, float *dq, float *dk,
                                        float *dv, int64_t g_sb, int64_t g_sh, int64_t g_st, float *scratch,
                                        int64_t slot) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
#pragma omp parallel for schedule(static) if (a->B * a->H * L * S * (E + Ev) > 65536)
    for (int64_t bh = 0; bh < a->B * a->H; bh++) {
        int64_t b = bh / a->H, h = bh % a->H;
        const float *qb = q + b * a->q_sb + h * a->q_sh, *kb = k + b * a->k_sb + h * a->k_sh;
        const float *vb = v + b * a->v_sb + h * a->v_sh, *ob = o + b * a->o_sb + h * a->o_sh;
        const float *gb = g + b * g_sb + h * g_sh;
        float *kt = scratch + (int64_t)omp_get_thread_num() * slot, *vt = kt + E * S;
        float *pd = vt + Ev * S, *ds = pd + L * S;  /* dropped P and dS, [L, S] */
        mica_transpose_f32(kb, a->k_st, kt, S, S, E);
        mica_transpose_f32(vb, a->v_st, vt, S, S, Ev);
        mica_attn_dots qk = mica_attn_dots_of_f32(qb, a->q_st, kt, S, E), gv = mica_attn_dots_of_f32(gb, g_st, vt, S, Ev);
        mica_attention_backward_head_f32(a, bh, &qk, &gv, MICA_ATTN_ROWS, gb, g_st, qb, a->q_st, kb, a->k_st, ob,
                                         a->o_st, lse, dq + b * a->dq_sb + h * a->dq_sh, a->dq_st,
                                         dk + b * a->dk_sb + h * a->dk_sh, a->dk_st, dv + b * a->dv_sb + h * a->dv_sh,
                                         a->dv_st, pd, ds);
    }
}

/* bfloat16 attention: each head's operands widened to dense float32 copies in the thread's scratch
 * (exact), the float head above, its results rounded once to bfloat16 — the same arithmetic as
 * widening the whole tensors around the float kernel (passes/widen.py), without those copies in
 * memory. Where the processor has bfloat16 products (MICA_BF16_GEMM: AMX or AVX512-BF16), the two
 * products of bfloat16 operands (the scores Q K^T, and dO V^T in the backward) run on that kernel
 * instead (mica_attn_dots_bf16): float32 sums of the exact products, in the kernel's order rather
 * than the float chain's, inputs' subnormals read as zero, as a bfloat16 matmul reads them. The
 * products of float32 probabilities and gradients stay float32.
 * Per-thread scratch: mica_attention_slot_bf16(L, S, E, Ev) floats. */
static inline int64_t mica_attention_widened_bf16(int64_t L, int64_t S, int64_t E, int64_t Ev) {
    return mica_attention_slot_f32(L, S, E, Ev) + 2 * L * E + 2 * S * E + 2 * S * Ev + 2 * L * Ev;
}
/* the packed operands' floats: K and V packed (as a product's B) along the head dims, one packed
 * 32-row block, one 32 x 32 block of sums; then, for the half-rounding heads (below), K and V packed
 * along the keys, Q and dO along the queries, P and dS as bfloat16 [L, S]; alignment */
/* the widest of the padded dims: the k a packed 32-row block of A may hold */
static inline int64_t mica_attention_widest(int64_t Lp, int64_t Sp, int64_t Ep, int64_t Evp) {
    int64_t wide = Ep > Evp ? Ep : Evp;
    wide = wide > Sp ? wide : Sp;
    return wide > Lp ? wide : Lp;
}
static inline int64_t mica_attention_tiles_bf16(int64_t L, int64_t S, int64_t E, int64_t Ev) {
    int64_t Ep = (E + 31) / 32 * 32, Evp = (Ev + 31) / 32 * 32, Sp = (S + 31) / 32 * 32, Lp = (L + 31) / 32 * 32;
    int64_t wide = mica_attention_widest(Lp, Sp, Ep, Evp);
    return (Ep + Evp) * Sp / 2 + 16 * wide + 1024 + (Sp * (Ep + Evp) + Lp * (Ep + Evp)) / 2 + L * S + 8 * 64;
}
static inline int64_t mica_attention_slot_bf16(int64_t L, int64_t S, int64_t E, int64_t Ev) {
    return mica_attention_widened_bf16(L, S, E, Ev) + mica_attention_tiles_bf16(L, S, E, Ev);
}

/* dst[r * cols + c] = src[r * st + c] widened */
static void mica_bf16_rows_in(const mica_bf16 *src, int64_t st, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = mica_bf16_load(src[r * st + c]);
}

static void mica_bf16_rows_out(const float *src, int64_t rows, int64_t cols, mica_bf16 *dst, int64_t st) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * st + c] = mica_bf16_store(src[r * cols + c]);
}

/* dst[r * cols + c] = src[r * st + c] widened; and back, rounded to nearest even */
static void mica_f16_rows_in(const mica_f16 *src, int64_t st, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++) mica_wide_row(src, MICA_WIDE_F16, st, r, cols, dst + r * cols);
}
static void mica_f16_rows_out(const float *src, int64_t rows, int64_t cols, mica_f16 *dst, int64_t st) {
    mica_wide_write(src, cols, rows, cols, dst, st, 0, 0, MICA_WIDE_F16, 1);
}

/* a half type's rows (`half`: MICA_WIDE_BF16 or MICA_WIDE_F16; both 2 bytes an element) widened into
 * float32, and float32 rows rounded back: bfloat16 as it is (subnormals kept), float16 exactly */
static void mica_half_rows_in(int half, const void *src, int64_t st, int64_t rows, int64_t cols, float *dst) {
    if (half == MICA_WIDE_F16) mica_f16_rows_in((const mica_f16 *)src, st, rows, cols, dst);
    else mica_bf16_rows_in((const mica_bf16 *)src, st, rows, cols, dst);
}
static void mica_half_rows_out(int half, const float *src, int64_t rows, int64_t cols, void *dst, int64_t st) {
    if (half == MICA_WIDE_F16) mica_f16_rows_out(src, rows, cols, (mica_f16 *)dst, st);
    else mica_bf16_rows_out(src, rows, cols, (mica_bf16 *)dst, st);
}
/* element `at` of a half-type array */
static inline const void *mica_half_at(const void *x, int64_t at) { return (const char *)x + 2 * at; }

/* One head of half-type attention computed in float32: the head widened into the thread's scratch
 * (mica_attention_slot_f16(L, S, E, Ev) floats), the float32 head's arithmetic (its rows round where
 * fp_half_intermediates says: a->half_round), each result rounded once as it is written. float16
 * attention on the CPU, and bfloat16's where the processor has no bfloat16 products. */
static void mica_attention_head_widened(const mica_attn_shape *a, int64_t bh, int half, const void *q, const void *k,
                                        const void *v, void *o, float *lse, float *base) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev, b = bh / a->H, h = bh % a->H;
    float *kt = base, *p = kt + E * S;
    float *qf = p + 2 * L * S, *vf = qf + L * E, *of = vf + S * Ev, *kf = of + L * Ev;
    mica_half_rows_in(half, mica_half_at(q, b * a->q_sb + h * a->q_sh), a->q_st, L, E, qf);
    mica_half_rows_in(half, mica_half_at(k, b * a->k_sb + h * a->k_sh), a->k_st, S, E, kf);  /* (then transposed) */
    mica_transpose_f32(kf, E, kt, S, S, E);
    mica_half_rows_in(half, mica_half_at(v, b * a->v_sb + h * a->v_sh), a->v_st, S, Ev, vf);
    mica_attn_dots qk = mica_attn_dots_of_f32(qf, E, kt, S, E);
    mica_attention_head_f32(a, bh, &qk, MICA_ATTN_ROWS, vf, Ev, of, Ev, lse, p);
    mica_half_rows_out(half, of, L, Ev, (char *)o + 2 * (b * a->o_sb + h * a->o_sh), a->o_st);
}

static void mica_attention_backward_head_widened(const mica_attn_shape *a, int64_t bh, int half, const void *g,
                                                 int64_t g_sb, int64_t g_sh, int64_t g_st, const void *q,
                                                 const void *k, const void *v, const void *o, const float *lse,
                                                 void *dq, void *dk, void *dv, float *base) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev, b = bh / a->H, h = bh % a->H;
    float *kt = base, *vt = kt + E * S;
    float *pd = vt + Ev * S, *ds = pd + L * S;
    float *qf = ds + L * S, *kf = qf + L * E, *gf = kf + S * E, *of = gf + L * Ev;
    float *dqf = of + L * Ev, *dkf = dqf + L * E, *dvf = dkf + S * E;
    float *vf = dvf + S * Ev;  /* V widened, before its transpose */
    mica_half_rows_in(half, mica_half_at(g, b * g_sb + h * g_sh), g_st, L, Ev, gf);
    mica_half_rows_in(half, mica_half_at(o, b * a->o_sb + h * a->o_sh), a->o_st, L, Ev, of);
    mica_half_rows_in(half, mica_half_at(q, b * a->q_sb + h * a->q_sh), a->q_st, L, E, qf);
    mica_half_rows_in(half, mica_half_at(k, b * a->k_sb + h * a->k_sh), a->k_st, S, E, kf);
    mica_transpose_f32(kf, E, kt, S, S, E);
    mica_half_rows_in(half, mica_half_at(v, b * a->v_sb + h * a->v_sh), a->v_st, S, Ev, vf);
    mica_transpose_f32(vf, Ev, vt, S, S, Ev);
    mica_attn_dots qk = mica_attn_dots_of_f32(qf, E, kt, S, E), gv = mica_attn_dots_of_f32(gf, Ev, vt, S, Ev);
    mica_attention_backward_head_f32(a, bh, &qk, &gv, MICA_ATTN_ROWS, gf, Ev, qf, E, kf, E, of, Ev, lse, dqf, E, dkf,
                                     E, dvf, Ev, pd, ds);
    mica_half_rows_out(half, dqf, L, E, (char *)dq + 2 * (b * a->dq_sb + h * a->dq_sh), a->dq_st);
    mica_half_rows_out(half, dkf, S, E, (char *)dk + 2 * (b * a->dk_sb + h * a->dk_sh), a->dk_st);
    mica_half_rows_out(half, dvf, S, Ev, (char *)dv + 2 * (b * a->dv_sb + h * a->dv_sh), a->dv_st);
}

#if MICA_BF16_GEMM != MICA_BF16_F32
#define MICA_ATTN_ROWS_BF16 MICA_BF16_MB
/* out[r * ldo + c] = alpha * (op(A) rows [m0, m0 + rows) . y columns c), k from k0 (a multiple of
 * 32) to K: op(A) [M, K] as the product kernel packs it (ta: stored transposed), y packed whole
 * along its Ky rows, N columns; ap holds one packed A block, acc one 32 x 32 block of sums */
static void mica_attn_tile_product(const mica_bf16 *A, int64_t lda, int ta, int64_t M, int64_t K, int64_t m0,
                                   int64_t k0, const mica_bf16 *yp, int64_t Ky, int64_t N, float alpha, float *out,
                                   int64_t ldo, mica_bf16 *ap, float *acc, int amx) {
    int64_t rows = M - m0 < MICA_BF16_MB ? M - m0 : MICA_BF16_MB, kc = mica_bf16_kpad(K - k0), Kyp = mica_bf16_kpad(Ky);
    if (kc <= 0) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < N; c++) out[r * ldo + c] = 0.0f;
        return;
    }
    int pairs = mica_bf16_a_pairs(ta, amx);
    mica_bf16_pack_a(A, lda, ta, M, K, m0, k0, kc, pairs, ap);
    for (int64_t q = 0; q * MICA_BF16_MB < N; q++) {
        const mica_bf16 *b0p = yp + 2 * q * Kyp * 16 + k0 * 16;
        mica_bf16_block(ap, kc, b0p, b0p + Kyp * 16, acc, 0, amx, pairs);
        int64_t c0 = q * MICA_BF16_MB, w = N - c0 < MICA_BF16_MB ? N - c0 : MICA_BF16_MB;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < w; c++) out[r * ldo + c0 + c] = alpha * acc[r * MICA_BF16_MB + c];
    }
}

/* x's rows [i0, i0 + rows) (rows <= 32) packed as one block of a product's A, against y packed
 * whole as its B: each element one float32 sum over the head dim in the kernel's steps, times alpha */
static void mica_attn_dots_bf16(const mica_attn_dots *d, int64_t i0, int64_t rows, int64_t n, float alpha, float *out,
                                int64_t ld) {
    mica_attn_tile_product(d->xh, d->x_st, 0, i0 + rows, d->len, i0, 0, d->yp, d->len, n, alpha, out, ld, d->ap,
                           d->acc, d->amx);
}

/* x [.., len] rows at x_st against y [S, len] (rows at y_st), y packed into yp now; ap and acc
 * are the thread's (aligned) */
static mica_attn_dots mica_attn_dots_of_bf16(const mica_bf16 *x, int64_t x_st, const mica_bf16 *y, int64_t y_st,
                                             int64_t S, int64_t len, mica_bf16 *yp, mica_bf16 *ap, float *acc,
                                             int amx) {
    mica_attn_dots d;
    memset(&d, 0, sizeof d);
    d.run = mica_attn_dots_bf16;
    d.xh = x; d.x_st = x_st; d.len = len; d.Kp = mica_bf16_kpad(len);
    d.yp = yp; d.ap = ap; d.acc = acc; d.amx = amx;
    for (int64_t q = 0; q < mica_bf16_npad(S) / 16; q++) mica_bf16_pack_b(y, y_st, 1, len, S, d.Kp, q, yp);
    return d;
}

/* the thread's packed operands, after its widened ones: K's (or dO's partner V's) packed B along
 * the head dim at yp[0], V's at yp[1]; one packed A block and its sums; then the half-rounding
 * heads' operands */
typedef struct {
    mica_bf16 *yp[2], *ap;
    float *acc;
    mica_bf16 *keys[2];   /* K and V packed as a product's B along the keys (k = S) */
    mica_bf16 *queries[2]; /* Q and dO packed along the queries (k = L) */
    mica_bf16 *ph, *dh;   /* P and dS (bfloat16 values) as bfloat16 [L, S] */
} mica_attn_tiles;

static mica_attn_tiles mica_attention_tiles(float *slot_base, const mica_attn_shape *a) {
    int64_t Ep = mica_bf16_kpad(a->E), Evp = mica_bf16_kpad(a->Ev), Sp = mica_bf16_npad(a->S);
    int64_t Lp = mica_bf16_npad(a->L), wide = mica_attention_widest(Lp, Sp, Ep, Evp);
    mica_attn_tiles t;
    char *c = (char *)mica_align64(slot_base + mica_attention_widened_bf16(a->L, a->S, a->E, a->Ev));
    t.yp[0] = (mica_bf16 *)c;
    t.yp[1] = t.yp[0] + Ep * Sp;
    t.ap = (mica_bf16 *)mica_align64(t.yp[1] + Evp * Sp);
    t.acc = (float *)mica_align64(t.ap + MICA_BF16_MB * wide);
    t.keys[0] = (mica_bf16 *)mica_align64(t.acc + MICA_BF16_MB * MICA_BF16_MB);
    t.keys[1] = (mica_bf16 *)mica_align64(t.keys[0] + Sp * Ep);
    t.queries[0] = (mica_bf16 *)mica_align64(t.keys[1] + Sp * Evp);
    t.queries[1] = (mica_bf16 *)mica_align64(t.queries[0] + Lp * Ep);
    t.ph = (mica_bf16 *)mica_align64(t.queries[1] + Lp * Evp);
    t.dh = t.ph + a->L * a->S;
    return t;
}

/* y [len, N] (rows at y_st) packed whole as a product's B along its len rows, into out */
static void mica_attn_pack_rows(const mica_bf16 *y, int64_t y_st, int64_t len, int64_t N, mica_bf16 *out) {
    for (int64_t q = 0; q < mica_bf16_npad(N) / 16; q++) mica_bf16_pack_b(y, y_st, 0, len, N, mica_bf16_kpad(len), q, out);
}

/* float rows that hold bfloat16 values (the half-rounding rows' P and dS), as bfloat16: exactly,
 * their first `cols` columns; columns [cols, zero_to) are 0 in src, and written as 0 without a read */
static void mica_attn_rows_exact(const float *src, int64_t rows, int64_t cols, int64_t zero_to, int64_t ld,
                                 mica_bf16 *dst) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) dst[r * ld + c] = mica_bf16_exact(src[r * ld + c]);
        for (int64_t c = cols; c < zero_to; c++) dst[r * ld + c] = 0;
    }
}

/* A bfloat16 head with fp_half_intermediates (a->half_round == 1), where the rows' weights are
 * bfloat16 values: P V (the rounded weights, undivided, then each row divided by its sum), and the
 * backward's dS K, dS^T Q (dS rounded before its scale, which multiplies the float32 sum) and
 * P^T dO also run on the product kernel. Sums in the kernel's order; the forward keeps to dropout
 * 0 (a dropped weight is scaled after its rounding: not a bfloat16 value). */
static void mica_attention_head_rounded(const mica_attn_shape *a, int64_t bh, const mica_attn_dots *qk,
                                        const mica_bf16 *vh, float *of, float *lse, float *p,
                                        const mica_attn_tiles *t, int amx) {
    const int64_t L = a->L, S = a->S, Ev = a->Ev;
    float sum[MICA_BF16_MB];
    mica_attn_pack_rows(vh, a->v_st, S, Ev, t->keys[1]);
    for (int64_t i0 = 0; i0 < L; i0 += MICA_BF16_MB) {
        int64_t rows = L - i0 < MICA_BF16_MB ? L - i0 : MICA_BF16_MB, n = mica_attn_visible(a, i0 + rows);
        qk->run(qk, i0, rows, n, (float)a->scale, p, S);
        for (int64_t r = 0; r < rows; r++)
            mica_attention_row_f32(a, bh, i0 + r, p + r * S, n, lse + bh * L + i0 + r, sum + r);
        mica_attn_rows_exact(p, rows, n, n, S, t->ph);
        mica_attn_tile_product(t->ph, S, 0, rows, n, 0, 0, t->keys[1], S, Ev, 1.0f, of + i0 * Ev, Ev, t->ap, t->acc,
                               amx);
        mica_attn_divide_rows(of + i0 * Ev, Ev, rows, Ev, sum);
    }
}

static void mica_attention_backward_head_rounded(const mica_attn_shape *a, int64_t bh, const mica_attn_dots *qk,
                                                 const mica_attn_dots *gv, const mica_bf16 *qh, const mica_bf16 *kh,
                                                 const mica_bf16 *gh, int64_t g_st, const float *gf, const float *of,
                                                 const float *lse, float *dqf, float *dkf, float *dvf, float *pd,
                                                 float *ds, const mica_attn_tiles *t, int amx) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    const float scale = (float)a->scale;
    mica_attn_shape unit = *a;  /* the rows leave dS unscaled: the scale multiplies dS K's and dS^T Q's sums */
    unit.scale = 1.0;
    mica_attn_pack_rows(kh, a->k_st, S, E, t->keys[0]);
    mica_attn_pack_rows(qh, a->q_st, L, E, t->queries[0]);
    mica_attn_pack_rows(gh, g_st, L, Ev, t->queries[1]);
    for (int64_t i0 = 0; i0 < L; i0 += MICA_BF16_MB) {
        int64_t rows = L - i0 < MICA_BF16_MB ? L - i0 : MICA_BF16_MB, n = mica_attn_visible(a, i0 + rows);
        float *pb = pd + i0 * S, *db = ds + i0 * S;
        qk->run(qk, i0, rows, n, scale, pb, S);  /* scores */
        gv->run(gv, i0, rows, n, 1.0f, db, S);   /* dPd */
        float D[MICA_BF16_MB];
        mica_attn_row_dots(gf + i0 * Ev, Ev, of + i0 * Ev, Ev, rows, Ev, D);
        for (int64_t r = 0; r < rows; r++)
            mica_attention_backward_row_f32(&unit, bh, i0 + r, pb + r * S, db + r * S, S, lse[bh * L + i0 + r], D[r]);
        /* (the rows hold 0 past the block's visible keys: n) */
        mica_attn_rows_exact(pb, rows, n, S, S, t->ph + i0 * S);
        mica_attn_rows_exact(db, rows, n, S, S, t->dh + i0 * S);
        mica_attn_tile_product(t->dh, S, 0, L, n, i0, 0, t->keys[0], S, E, scale, dqf + i0 * E, E, t->ap, t->acc,
                               amx);  /* dQ */
    }
    for (int64_t j0 = 0; j0 < S; j0 += MICA_BF16_MB) {
        /* queries before j0 cannot see these keys: their dS and P hold 0 (the sums skip them) */
        int64_t first = a->causal ? (j0 < L ? j0 : L) / MICA_BF16_MB * MICA_BF16_MB : 0;
        mica_attn_tile_product(t->dh, S, 1, S, L, j0, first, t->queries[0], L, E, scale, dkf + j0 * E, E, t->ap,
                               t->acc, amx);  /* dK */
        mica_attn_tile_product(t->ph, S, 1, S, L, j0, first, t->queries[1], L, Ev, 1.0f, dvf + j0 * Ev, Ev, t->ap,
                               t->acc, amx);  /* dV */
    }
}
#endif

static void mica_attention_bf16(const mica_attn_shape *a, const mica_bf16 *q, const mica_bf16 *k,
                                const mica_bf16 *v, mica_bf16 *o, float *lse, float *scratch, int64_t slot) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    const int amx = mica_bf16_amx();
#pragma omp parallel if (a->B * a->H * L * S * (E + Ev) > 65536)
    {
        mica_bf16_tiles_begin(amx);
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < a->B * a->H; bh++) {
            float *base = scratch + (int64_t)omp_get_thread_num() * slot;
#if MICA_BF16_GEMM != MICA_BF16_F32
            int64_t b = bh / a->H, h = bh % a->H;
            float *p = base + E * S, *vf = p + 2 * L * S + L * E, *of = vf + S * Ev;
            const mica_bf16 *qh = q + b * a->q_sb + h * a->q_sh, *kh = k + b * a->k_sb + h * a->k_sh;
            const mica_bf16 *vh = v + b * a->v_sb + h * a->v_sh;
            mica_attn_tiles t = mica_attention_tiles(base, a);
            mica_attn_dots qk = mica_attn_dots_of_bf16(qh, a->q_st, kh, a->k_st, S, E, t.yp[0], t.ap, t.acc, amx);
            if (a->half_round == 1 && a->dropout_p == 0) {
                mica_attention_head_rounded(a, bh, &qk, vh, of, lse, p, &t, amx);
            } else {
                mica_bf16_rows_in(vh, a->v_st, S, Ev, vf);
                mica_attention_head_f32(a, bh, &qk, MICA_ATTN_ROWS_BF16, vf, Ev, of, Ev, lse, p);
            }
            mica_bf16_rows_out(of, L, Ev, o + b * a->o_sb + h * a->o_sh, a->o_st);
#else
            mica_attention_head_widened(a, bh, MICA_WIDE_BF16, q, k, v, o, lse, base);
#endif
        }
        mica_bf16_tiles_end(amx);
    }
}

static void mica_attention_backward_bf16(const mica_attn_shape *a, const mica_bf16 *g, const mica_bf16 *q,
                                         const mica_bf16 *k, const mica_bf16 *v, const mica_bf16 *o, const float *lse,
                                         mica_bf16 *dq, mica_bf16 *dk, mica_bf16 *dv, int64_t g_sb, int64_t g_sh,
                                         int64_t g_st, float *scratch, int64_t slot) {
    const int64_t L = a->L, S = a->S, E = a->E, Ev = a->Ev;
    const int amx = mica_bf16_amx();
#pragma omp parallel if (a->B * a->H * L * S * (E + Ev) > 65536)
    {
        mica_bf16_tiles_begin(amx);
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < a->B * a->H; bh++) {
            float *base = scratch + (int64_t)omp_get_thread_num() * slot;
#if MICA_BF16_GEMM != MICA_BF16_F32
            int64_t b = bh / a->H, h = bh % a->H;
            float *pd = base + (E + Ev) * S, *ds = pd + L * S;
            float *qf = ds + L * S, *kf = qf + L * E, *gf = kf + S * E, *of = gf + L * Ev;
            float *dqf = of + L * Ev, *dkf = dqf + L * E, *dvf = dkf + S * E;
            const mica_bf16 *gh = g + b * g_sb + h * g_sh, *qh = q + b * a->q_sb + h * a->q_sh;
            const mica_bf16 *kh = k + b * a->k_sb + h * a->k_sh, *vh = v + b * a->v_sb + h * a->v_sh;
            mica_bf16_rows_in(gh, g_st, L, Ev, gf);
            mica_bf16_rows_in(o + b * a->o_sb + h * a->o_sh, a->o_st, L, Ev, of);
            mica_attn_tiles t = mica_attention_tiles(base, a);
            mica_attn_dots qk = mica_attn_dots_of_bf16(qh, a->q_st, kh, a->k_st, S, E, t.yp[0], t.ap, t.acc, amx);
            mica_attn_dots gv = mica_attn_dots_of_bf16(gh, g_st, vh, a->v_st, S, Ev, t.yp[1], t.ap, t.acc, amx);
            if (a->half_round == 1) {
                mica_attention_backward_head_rounded(a, bh, &qk, &gv, qh, kh, gh, g_st, gf, of, lse, dqf, dkf, dvf, pd,
                                                     ds, &t, amx);
            } else {
                mica_bf16_rows_in(qh, a->q_st, L, E, qf);
                mica_bf16_rows_in(kh, a->k_st, S, E, kf);
                mica_attention_backward_head_f32(a, bh, &qk, &gv, MICA_ATTN_ROWS_BF16, gf, Ev, qf, E, kf, E, of, Ev,
                                                 lse, dqf, E, dkf, E, dvf, Ev, pd, ds);
            }
            mica_bf16_rows_out(dqf, L, E, dq + b * a->dq_sb + h * a->dq_sh, a->dq_st);
            mica_bf16_rows_out(dkf, S, E, dk + b * a->dk_sb + h * a->dk_sh, a->dk_st);
            mica_bf16_rows_out(dvf, S, Ev, dv + b * a->dv_sb + h * a->dv_sh, a->dv_st);
#else
            mica_attention_backward_head_widened(a, bh, MICA_WIDE_BF16, g, g_sb, g_sh, g_st, q, k, v, o, lse, dq, dk,
                                                 dv, base);
#endif
        }
        mica_bf16_tiles_end(amx);
    }
}

/* ---- float16 attention: the widened heads above, in place of a cast pass over q, k, v (and o, g)
 * before and after a float32 kernel. Per-thread scratch: mica_attention_slot_f16(L, S, E, Ev) floats. */
static inline int64_t mica_attention_slot_f16(int64_t L, int64_t S, int64_t E, int64_t Ev) {
    return mica_attention_widened_bf16(L, S, E, Ev);
}

static void mica_attention_f16(const mica_attn_shape *a, const mica_f16 *q, const mica_f16 *k, const mica_f16 *v,
                               mica_f16 *o, float *lse, float *scratch, int64_t slot) {
#pragma omp parallel for schedule(static) if (a->B * a->H * a->L * a->S * (a->E + a->Ev) > 65536)
    for (int64_t bh = 0; bh < a->B * a->H; bh++)
        mica_attention_head_widened(a, bh, MICA_WIDE_F16, q, k, v, o, lse,
                                    scratch + (int64_t)omp_get_thread_num() * slot);
}

static void mica_attention_backward_f16(const mica_attn_shape *a, const mica_f16 *g, const mica_f16 *q,
                                        const mica_f16 *k, const mica_f16 *v, const mica_f16 *o, const float *lse,
                                        mica_f16 *dq, mica_f16 *dk, mica_f16 *dv, int64_t g_sb, int64_t g_sh,
                                        int64_t g_st, float *scratch, int64_t slot) {
#pragma omp parallel for schedule(static) if (a->B * a->H * a->L * a->S * (a->E + a->Ev) > 65536)
    for (int64_t bh = 0; bh < a->B * a->H; bh++)
        mica_attention_backward_head_widened(a, bh, MICA_WIDE_F16, g, g_sb, g_sh, g_st, q, k, v, o, lse, dq, dk, dv,
                                             scratch + (int64_t)omp_get_thread_num() * slot);
}

#endif
