/* bfloat16 products: C[M,N] = op(A)[M,K] @ op(B)[K,N], A and B bfloat16 (row-major storage, op =
 * optional transpose), accumulated in float32, C float32 or bfloat16 (rounded once from the
 * float32 sum, ties to even: mica_bf16_store).
 *
 * Three kernels; the generated program picks one with MICA_BF16_GEMM before including this file
 * (the CPU target chooses it from the building machine's processor, backends/c/bf16gemm.py: AMX
 * where there is AMX; AVX512-BF16 on AMD's processors that have it, where it measured 3.6x the
 * float32 product; else the float32 fallback, which measured faster than Intel's AVX512-BF16):
 *   MICA_BF16_AMX     AMX-BF16 tiles (tdpbf16ps), 32x32 output blocks in four tile registers;
 *   MICA_BF16_AVX512  AVX512-BF16 (vdpbf16ps), 8x32 register blocks;
 *   MICA_BF16_F32     any processor: the operands widened to float32, then the float32 product.
 * The first two read the same packed operands: B in pairs along k ("VNNI": [k/2][16 columns][2])
 * per 16-column panel, packed once per product; A per 32-row block as 32 x 32 tiles (k padded with
 * zeros to a multiple of 32), packed per block and k chunk. When packed B is larger than the L2
 * budget, k runs in chunks (mica_bf16_kchunk), every row block using a chunk before the next, the
 * float32 sums waiting between chunks: a product whose k is the token count (a weight gradient) no
 * longer streams all of B from memory once per row block. B is then packed a chunk at a time, into
 * one chunk's buffer, just before the chunk is used: the packed copy never goes out to memory.
 * Both flush bfloat16 subnormal inputs to zero and float32 subnormal partial sums to zero (the
 * instructions do so whatever MXCSR says); the float32 fallback flushes the inputs too, so all three
 * compute the same mathematical sum. Summation order: k ascending, in pairs (the instruction's own
 * order inside a pair, or inside a tile's 32-deep step for AMX), fixed by the shape alone: every
 * output block is computed whole by one thread, so the bits never depend on the thread count.
 * AMX needs the operating system's permission for the tile state (arch_prctl, asked once); a
 * kernel that refuses it gets the AVX512-BF16 kernel, on the same packed operands.
 */
#ifndef MICA_BF16GEMM_H
#define MICA_BF16GEMM_H
#include <stdint.h>
#include <string.h>
#include "mica_runtime.h"
#include "mica_gemm.h"

#define MICA_BF16_F32 0
#define MICA_BF16_AVX512 1
#define MICA_BF16_AMX 2
#ifndef MICA_BF16_GEMM
#define MICA_BF16_GEMM MICA_BF16_F32
#endif
#if MICA_BF16_GEMM != MICA_BF16_F32 || defined(__F16C__)
#include <immintrin.h>
#endif
#if MICA_BF16_GEMM == MICA_BF16_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define MICA_BF16_MB 32  /* rows of a packed A block, rows and columns of an output block */
#define MICA_BF16_KSTEP 32

static inline int64_t mica_bf16_kpad(int64_t K) { return (K + MICA_BF16_KSTEP - 1) / MICA_BF16_KSTEP * MICA_BF16_KSTEP; }
static inline int64_t mica_bf16_npad(int64_t N) { return (N + MICA_BF16_MB - 1) / MICA_BF16_MB * MICA_BF16_MB; }

/* The k chunk (a multiple of 32) of the packed kernels: all of k while packed B (2 Kp Np bytes) fits
 * the L2 budget, else as much of k as keeps a chunk of packed B within 1 MB. bf16gemm.py mirrors
 * it (the shared scratch depends on it). */
#ifndef MICA_BF16_L2
#define MICA_BF16_L2 (3 << 19)  /* (a build may set it: tests/test_bf16_gemm.py compares chunked and unchunked) */
#endif
static inline int64_t mica_bf16_kchunk(int64_t Kp, int64_t Np) {
    if (2 * Kp * Np <= MICA_BF16_L2 || Np == 0) return Kp;
    int64_t kc = (1 << 20) / (2 * Np) / MICA_BF16_KSTEP * MICA_BF16_KSTEP;
    return kc < MICA_BF16_KSTEP ? MICA_BF16_KSTEP : kc;
}

/* a bfloat16 value with subnormals flushed to zero (sign kept), as the bf16 instructions read it */
static inline mica_bf16 mica_bf16_daz(mica_bf16 h) { return (h & 0x7F80u) ? h : (mica_bf16)(h & 0x8000u); }

/* Scratch of a widened product (any half type: mica_wide_gemm below), in bytes: shared by all
 * threads (widened A [M,K], B [K,N], the float32 result, then the float32 product's own scratch),
 * and per thread */
static inline int64_t mica_wide_shared_bytes(int64_t M, int64_t N, int64_t K) {
    int64_t kc = K < MICA_KC ? K : MICA_KC;
    return 4 * (M * K + K * N + M * N + (kc ? kc : 1) * ((N + MICA_NR - 1) / MICA_NR * MICA_NR)) + 256;
}
static inline int64_t mica_wide_thread_bytes(int64_t K) {
    (void)K;
    return 4 * MICA_GEMM_THREAD_FLOATS + 64;
}

/* Scratch, in bytes: shared by all threads, and per thread (the generated program reserves both) */
static inline int64_t mica_bf16gemm_shared_bytes(int64_t M, int64_t N, int64_t K) {
#if MICA_BF16_GEMM == MICA_BF16_F32
    return mica_wide_shared_bytes(M, N, K);
#else
    int64_t Kp = mica_bf16_kpad(K), Np = mica_bf16_npad(N), kc = mica_bf16_kchunk(Kp, Np);
    int64_t sums = kc && kc < Kp ? 4 * (M + MICA_BF16_MB - 1) / MICA_BF16_MB * MICA_BF16_MB * Np + 64 : 0;
    return 2 * kc * Np + 64 + sums;  /* one k chunk of packed B (all of k when unchunked), and the sums */
#endif
}
static inline int64_t mica_bf16gemm_thread_bytes(int64_t K) {
#if MICA_BF16_GEMM == MICA_BF16_F32
    return mica_wide_thread_bytes(K);
#else
    return (2 * MICA_BF16_MB * mica_bf16_kpad(K) + 4 * MICA_BF16_MB * MICA_BF16_MB + 63) / 64 * 64 + 64;
#endif
}

static inline void *mica_align64(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* write a block of float32 sums (row stride ld) to C, as float32 or rounded to bfloat16 */
static inline void mica_bf16_write(const float *acc, int64_t ld, int64_t h, int64_t w, void *C, int64_t ldc, int64_t r0,
                                   int64_t c0, int out_bf16) {
    for (int64_t r = 0; r < h; r++) {
        const float *src = acc + r * ld;
        if (out_bf16) {
            mica_bf16 *dst = (mica_bf16 *)C + (r0 + r) * ldc + c0;
            for (int64_t c = 0; c < w; c++) dst[c] = mica_bf16_store(src[c]);
        } else {
            float *dst = (float *)C + (r0 + r) * ldc + c0;
            for (int64_t c = 0; c < w; c++) dst[c] = src[c];
        }
    }
}

/* ---- the AMX tile state: the OS's permission and the tiles' shapes; the helpers below serve
 * every kernel (without AMX they do nothing) --------------------------------------------------- */
#if MICA_BF16_GEMM == MICA_BF16_AMX
#define MICA_ARCH_REQ_XCOMP_PERM 0x1023
#define MICA_XFEATURE_XTILEDATA 18
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} mica_tile_config;

/* 1 when the kernel lets this process use the AMX tile state (asked once), else 0 */
static int mica_amx_ready(void) {
    static int state = -1;
    if (state < 0) {
        if (getenv("MICA_NO_AMX")) state = 0;
        else state = syscall(SYS_arch_prctl, MICA_ARCH_REQ_XCOMP_PERM, MICA_XFEATURE_XTILEDATA) == 0;
    }
    return state;
}

/* tiles 0-3: the 2x2 float32 output tiles; 4, 5: A rows 0-15, 16-31; 6, 7: B panels q, q + 1 */
__attribute__((target("amx-tile,amx-bf16"))) static void mica_amx_configure(void) {
    mica_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    /* (ldtilecfg by hand: gcc 12's _tile_loadconfig does not tell the compiler it reads all 64
     * bytes, and the stores above were dropped once this function was inlined) */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg) : "memory");
}

__attribute__((target("amx-tile"))) static void mica_amx_release(void) { _tile_release(); }
#endif

/* 1 where mica_bf16_block runs on AMX tiles */
static inline int mica_bf16_amx(void) {
#if MICA_BF16_GEMM == MICA_BF16_AMX
    return mica_amx_ready();
#else
    return 0;
#endif
}

/* the calling thread's tile state for mica_bf16_block (nothing without AMX) */
static inline void mica_bf16_tiles_begin(int amx) {
#if MICA_BF16_GEMM == MICA_BF16_AMX
    if (amx) mica_amx_configure();
#endif
    (void)amx;
}
static inline void mica_bf16_tiles_end(int amx) {
#if MICA_BF16_GEMM == MICA_BF16_AMX
    if (amx) mica_amx_release();
#endif
    (void)amx;
}

/* ---- widened products: the half operands widened to float32, then the float32 product (OpenBLAS
 * tiles or Mica's own kernel). Every float16 product on the CPU (no float16 product instructions are
 * used), and the bfloat16 ones of the float32 fallback (MICA_BF16_F32). -------------------------- */
#define MICA_WIDE_BF16 0  /* bfloat16 operands: subnormals flushed, as the bf16 instructions read them */
#define MICA_WIDE_F16 1   /* float16 operands: every value as it is (exact in float32) */

/* stored row r of X (row stride ldx) widened to float32. The operands are widened as they are
 * stored, a transposed one too (the float32 product reads it transposed): a contiguous pass, where
 * copying it transposed read it down its columns. */
static inline void mica_wide_row(const void *X, int half, int64_t ldx, int64_t r, int64_t cols, float *out) {
    if (half == MICA_WIDE_F16) {
        const mica_f16 *x = (const mica_f16 *)X + r * ldx;
        int64_t c = 0;
#ifdef __F16C__  /* eight at a time by the processor's conversion (vcvtph2ps: the same values) */
        for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + c))));
#endif
        for (; c < cols; c++) out[c] = mica_f16_load(x[c]);
    } else {
        const mica_bf16 *x = (const mica_bf16 *)X + r * ldx;
        for (int64_t c = 0; c < cols; c++) out[c] = mica_bf16_load(mica_bf16_daz(x[c]));
    }
}

/* an h x w block of float32 results (row stride ld) written to C at (r0, c0): float32, or rounded
 * once to the half type (to nearest, ties to even) */
static inline void mica_wide_write(const float *src, int64_t ld, int64_t h, int64_t w, void *C, int64_t ldc,
                                   int64_t r0, int64_t c0, int half, int out_half) {
    if (!out_half || half == MICA_WIDE_BF16) {
        mica_bf16_write(src, ld, h, w, C, ldc, r0, c0, out_half);
        return;
    }
    for (int64_t r = 0; r < h; r++) {
        mica_f16 *dst = (mica_f16 *)C + (r0 + r) * ldc + c0;
        int64_t c = 0;
#ifdef __F16C__  /* vcvtps2ph rounding to nearest, ties to even: mica_f16_store's bits, NaN and infinity included */
        for (; c + 8 <= w; c += 8)
            _mm_storeu_si128((__m128i *)(dst + c), _mm256_cvtps_ph(_mm256_loadu_ps(src + r * ld + c), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; c < w; c++) dst[c] = mica_f16_store(src[r * ld + c]);
    }
}

#ifdef MICA_OPENBLAS
/* A product in the pieces a parallel region runs, as the packed kernels' below (emit.py runs a
 * product's epilogue on each tile this way): make (outside it), begin (the team widens A and B),
 * tile (one tile of the float32 product's fixed grid, mica_product_grid: one single-threaded
 * OpenBLAS call, then written to C), end. The grid depends on the shape alone, so the bits do
 * not depend on the thread count, and they are mica_blas_sgemm's on the widened operands. */
typedef struct {
    int64_t M, N, K, lda, ldb, ldc, tiles;
    int ta, tb, half, out_half, parallel;
    const void *A, *B;
    void *C;
    float *a, *b, *c;
    mica_product grid;
} mica_wide_product;

static mica_wide_product mica_wide_product_make(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, int ta,
                                                const void *B, int64_t ldb, int tb, void *C, int64_t ldc, int half,
                                                int out_half, char *work) {
    mica_wide_product p;
    p.M = M; p.N = N; p.K = K; p.lda = lda; p.ldb = ldb; p.ldc = ldc; p.ta = ta; p.tb = tb;
    p.half = half; p.out_half = out_half; p.A = A; p.B = B; p.C = C;
    p.a = (float *)mica_align64(work); p.b = p.a + M * K; p.c = p.b + K * N;
    p.grid = mica_product_grid(M, N, K, p.a, ta ? M : K, ta, p.b, tb ? K : N, tb, out_half ? p.c : (float *)C,
                               out_half ? N : ldc);
    p.tiles = p.grid.tm * p.grid.tn;
    p.parallel = (double)M * N * (K ? K : 1) > 262144.0;
    return p;
}

static void mica_wide_product_begin(const mica_wide_product *p) {
    int64_t arows = p->ta ? p->K : p->M, acols = p->ta ? p->M : p->K;
    int64_t brows = p->tb ? p->N : p->K, bcols = p->tb ? p->K : p->N;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < arows; i++) mica_wide_row(p->A, p->half, p->lda, i, acols, p->a + i * acols);
#pragma omp for schedule(static)
    for (int64_t k = 0; k < brows; k++) mica_wide_row(p->B, p->half, p->ldb, k, bcols, p->b + k * bcols);
}

/* tile t of the output, rows [r0, r1) and columns [c0, c1), computed and written to C */
static void mica_wide_product_tile(const mica_wide_product *p, int64_t t, int64_t *r0, int64_t *r1, int64_t *c0,
                                   int64_t *c1) {
    mica_product_bounds(&p->grid, t, r0, r1, c0, c1);
    float *dst = p->grid.C;
    int64_t ldd = p->grid.ldc;
    if (p->K > 0) mica_product_tile(&p->grid, t);
    else for (int64_t i = *r0; i < *r1; i++) memset(dst + i * ldd + *c0, 0, sizeof(float) * (*c1 - *c0));
    if (p->out_half)
        mica_wide_write(dst + *r0 * ldd + *c0, ldd, *r1 - *r0, *c1 - *c0, p->C, p->ldc, *r0, *c0, p->half, 1);
}

static void mica_wide_product_end(const mica_wide_product *p) { (void)p; }

static void mica_wide_gemm(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, int ta, const void *B,
                           int64_t ldb, int tb, void *C, int64_t ldc, int half, int out_half, char *work,
                           char *scratch) {
    (void)scratch;
    mica_wide_product p = mica_wide_product_make(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, half, out_half, work);
    if (M == 0 || N == 0) return;
#pragma omp parallel if (p.parallel)
    {
        mica_wide_product_begin(&p);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < p.tiles; t++) {
            int64_t r0, r1, c0, c1;
            mica_wide_product_tile(&p, t, &r0, &r1, &c0, &c1);
        }
        mica_wide_product_end(&p);
    }
}

/* the float16 products' pieces (emit.py: a float16 product with an epilogue) */
typedef mica_wide_product mica_f16_product;
static inline mica_f16_product mica_f16_product_make(int64_t M, int64_t N, int64_t K, const mica_f16 *A, int64_t lda,
                                                     int ta, const mica_f16 *B, int64_t ldb, int tb, void *C,
                                                     int64_t ldc, int out_f16, char *work, char *scratch) {
    (void)scratch;
    return mica_wide_product_make(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, MICA_WIDE_F16, out_f16, work);
}
#define mica_f16_product_begin mica_wide_product_begin
#define mica_f16_product_tile mica_wide_product_tile
#define mica_f16_product_end mica_wide_product_end
#else
/* Mica's own float32 kernel: widened operands, one product over the team */
static void mica_wide_gemm(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, int ta, const void *B,
                           int64_t ldb, int tb, void *C, int64_t ldc, int half, int out_half, char *work,
                           char *scratch) {
    float *a = (float *)mica_align64(work), *b = a + M * K, *c = b + K * N, *packed = c + M * N;
    int parallel = (double)M * N * (K ? K : 1) > 262144.0;
    int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t i = 0; i < arows; i++) mica_wide_row(A, half, lda, i, acols, a + i * acols);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t k = 0; k < brows; k++) mica_wide_row(B, half, ldb, k, bcols, b + k * bcols);
    float *dst = out_half ? c : (float *)C;
    int64_t ldd = out_half ? N : ldc;
    mica_sgemm(M, N, K, a, acols, ta, b, bcols, tb, 0.0f, dst, ldd, packed, (float *)mica_align64(scratch));
    if (out_half) {
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t i = 0; i < M; i++) mica_wide_write(c + i * N, N, 1, N, C, ldc, i, 0, half, 1);
    }
}
#endif

/* C = op(A) @ op(B), A and B float16; C float32 or float16 (out_f16). `work` holds
 * mica_wide_shared_bytes, `scratch` mica_wide_thread_bytes per thread. */
static void mica_f16gemm(int64_t M, int64_t N, int64_t K, const mica_f16 *A, int64_t lda, int ta, const mica_f16 *B,
                         int64_t ldb, int tb, void *C, int64_t ldc, int out_f16, char *work, char *scratch) {
    mica_wide_gemm(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, MICA_WIDE_F16, out_f16, work, scratch);
}

#if MICA_BF16_GEMM == MICA_BF16_F32
/* ---- any processor: the bfloat16 products widened (mica_wide_gemm) ----------------------------- */
static void mica_bf16gemm(int64_t M, int64_t N, int64_t K, const mica_bf16 *A, int64_t lda, int ta,
                          const mica_bf16 *B, int64_t ldb, int tb, void *C, int64_t ldc, int out_bf16, char *work,
                          char *scratch) {
    mica_wide_gemm(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, MICA_WIDE_BF16, out_bf16, work, scratch);
}
#ifdef MICA_OPENBLAS
typedef mica_wide_product mica_bf16_product;
static inline mica_bf16_product mica_bf16_product_make(int64_t M, int64_t N, int64_t K, const mica_bf16 *A,
                                                       int64_t lda, int ta, const mica_bf16 *B, int64_t ldb, int tb,
                                                       void *C, int64_t ldc, int out_bf16, char *work, char *scratch) {
    (void)scratch;
    return mica_wide_product_make(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, MICA_WIDE_BF16, out_bf16, work);
}
#define mica_bf16_product_begin mica_wide_product_begin
#define mica_bf16_product_tile mica_wide_product_tile
#define mica_bf16_product_end mica_wide_product_end
#endif
#else
/* ---- packing, shared by the AVX512-BF16 and AMX kernels ------------------------------------------ */
/* B's 16-column panel p: ((p * Kp/2 + kk) * 16 + c) * 2 + e holds op(B)[2kk + e][16p + c]: k pairs
 * interleaved as the instructions read them; zeros past K and N, subnormals flushed. B is packed
 * whole, once per product, by the team. */
#define MICA_BF16_VEC __attribute__((target("avx512f,avx512bw,avx512vl")))
/* Packing reads a transposed A, and a weight gradient's B, a row segment at a time down rows that
 * lie a row's length apart (3 KB for a 1,536-wide activation): a stride the hardware prefetchers do
 * not follow across 4 KB pages, so each segment waited on memory (a fifth of a weight gradient's
 * time, by perf). The packers ask for the rows they read next ahead of time: B's k rows
 * MICA_BF16_AHEAD pairs ahead, A's the tile after next (BENCHMARKS.md 8.7). Timing only: the bits
 * are the same. */
#define MICA_BF16_AHEAD 8
MICA_BF16_VEC static inline __m512i mica_bf16_daz16(__m512i x) {  /* mica_bf16_daz on 32 values */
    __mmask32 normal = _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x7F80));
    return _mm512_mask_blend_epi16(normal, _mm512_and_si512(x, _mm512_set1_epi16((short)0x8000)), x);
}

/* 16 x 16 transpose of 32-bit elements: block swaps of 8, 4, 2, 1 */
MICA_BF16_VEC static inline __attribute__((always_inline)) void mica_bf16_transpose16x32(__m512i v[16]) {
    for (int b = 8; b >= 1; b /= 2) {
        int lo[16], hi[16];
        for (int c = 0; c < 16; c++) {
            lo[c] = (c & b) ? 16 + c - b : c;
            hi[c] = (c & b) ? 16 + c : c + b;
        }
        __m512i ilo = _mm512_loadu_si512(lo), ihi = _mm512_loadu_si512(hi);
        for (int i = 0; i < 16; i++)
            if (!(i & b)) {
                __m512i x = v[i], y = v[i + b];
                v[i] = _mm512_permutex2var_epi32(x, ilo, y);
                v[i + b] = _mm512_permutex2var_epi32(x, ihi, y);
            }
    }
}

/* panel p's k rows [k0, k0 + kc) (kc a multiple of 32) at out + p * kc * 16: the chunk of packed B
 * a chunked product uses next (k0 = 0, kc = Kp: all of it) */
MICA_BF16_VEC static void mica_bf16_pack_b_rows(const mica_bf16 *B, int64_t ldb, int tb, int64_t K, int64_t N,
                                                int64_t k0, int64_t kc, int64_t p, mica_bf16 *restrict out) {
    mica_bf16 *dst = out + p * kc * 16;
    int64_t n0 = p * 16, w = N - n0 < 16 ? N - n0 : 16;
    if (w <= 0) { memset(dst, 0, sizeof(mica_bf16) * kc * 16); return; }
    if (!tb) {  /* rows k, k + 1 of B: 16 columns each, interleaved */
        const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                             23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        __mmask16 m = (__mmask16)((1u << w) - 1);
        for (int64_t k = k0; k < k0 + kc; k += 2) {
            if (k + 2 * MICA_BF16_AHEAD + 1 < K) {  /* (rows ldb apart: see MICA_BF16_AHEAD) */
                _mm_prefetch((const char *)(B + (k + 2 * MICA_BF16_AHEAD) * ldb + n0), _MM_HINT_T0);
                _mm_prefetch((const char *)(B + (k + 2 * MICA_BF16_AHEAD + 1) * ldb + n0), _MM_HINT_T0);
            }
            __m256i r0 = k < K ? _mm256_maskz_loadu_epi16(m, B + k * ldb + n0) : _mm256_setzero_si256();
            __m256i r1 = k + 1 < K ? _mm256_maskz_loadu_epi16(m, B + (k + 1) * ldb + n0) : _mm256_setzero_si256();
            __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1);
            _mm512_storeu_si512(dst + (k - k0) * 16, mica_bf16_daz16(_mm512_permutexvar_epi16(idx, x)));
        }
    } else {  /* row n0 + c of B holds column c: its k pairs (32-bit units) transposed, 16 pairs at a time */
        for (int64_t ks = k0; ks < k0 + kc; ks += MICA_BF16_KSTEP) {
            int64_t d = K - ks;
            __mmask32 m = d >= 32 ? 0xFFFFFFFFu : d <= 0 ? 0 : (__mmask32)((1u << d) - 1);
            __m512i v[16];
            for (int c = 0; c < 16; c++)
                v[c] = c < w && m ? _mm512_maskz_loadu_epi16(m, B + (n0 + c) * ldb + ks) : _mm512_setzero_si512();
            mica_bf16_transpose16x32(v);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + ((ks - k0) / 2 + i) * 32, mica_bf16_daz16(v[i]));
        }
    }
}

/* all of panel p (Kp rows) at out + p * Kp * 16 */
static inline void mica_bf16_pack_b(const mica_bf16 *B, int64_t ldb, int tb, int64_t K, int64_t N, int64_t Kp,
                                    int64_t p, mica_bf16 *restrict out) {
    mica_bf16_pack_b_rows(B, ldb, tb, K, N, 0, Kp, p, out);
}

/* k pair i (k 2i, 2i + 1) of a stored-transposed A's rows 0-31 (src[kk * ld + r] = op(A)[r][kk] for
 * r < h, kk < d; zeros elsewhere), interleaved into 32-bit elements, subnormals flushed: rows 0-15
 * in *top, rows 16-31 in *bottom */
MICA_BF16_VEC static inline __attribute__((always_inline)) void
mica_bf16_pair_rows(const mica_bf16 *src, int64_t ld, int64_t h, int64_t d, int i, __m512i *top, __m512i *bottom) {
    short lo[32], hi[32];
    for (int j = 0; j < 32; j++) {
        lo[j] = (short)((j & 1) ? 32 + j / 2 : j / 2);
        hi[j] = (short)((j & 1) ? 48 + j / 2 : 16 + j / 2);
    }
    __mmask32 m = h >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << h) - 1);
    __m512i x = 2 * i < d ? _mm512_maskz_loadu_epi16(m, src + 2 * i * ld) : _mm512_setzero_si512();
    __m512i y = 2 * i + 1 < d ? _mm512_maskz_loadu_epi16(m, src + (2 * i + 1) * ld) : _mm512_setzero_si512();
    *top = mica_bf16_daz16(_mm512_permutex2var_epi16(x, _mm512_loadu_si512(lo), y));
    *bottom = mica_bf16_daz16(_mm512_permutex2var_epi16(x, _mm512_loadu_si512(hi), y));
}

/* tile[r][kk] = op(A)[r][kk] (mica_bf16_pair_rows' src, h, d): its k pairs, then two 16 x 16
 * transposes of those 32-bit elements */
MICA_BF16_VEC static void mica_bf16_transpose_tile(const mica_bf16 *src, int64_t ld, int64_t h, int64_t d,
                                                   mica_bf16 *restrict tile) {
    __m512i top[16], bottom[16];
    for (int i = 0; i < 16; i++) mica_bf16_pair_rows(src, ld, h, d, i, &top[i], &bottom[i]);
    mica_bf16_transpose16x32(top);
    mica_bf16_transpose16x32(bottom);
    for (int r = 0; r < 16; r++) {
        _mm512_storeu_si512(tile + r * MICA_BF16_KSTEP, top[r]);
        _mm512_storeu_si512(tile + (16 + r) * MICA_BF16_KSTEP, bottom[r]);
    }
}

/* The same 32 x 32 of op(A) pair-major in groups of the 8 rows the kernel takes at a time:
 * tile[(r / 8) * 256 + (kk / 2) * 16 + (r % 8) * 2 + kk % 2]; no transpose */
MICA_BF16_VEC static void mica_bf16_interleave_tile(const mica_bf16 *src, int64_t ld, int64_t h, int64_t d,
                                                    mica_bf16 *restrict tile) {
    for (int i = 0; i < 16; i++) {
        __m512i top, bottom;
        mica_bf16_pair_rows(src, ld, h, d, i, &top, &bottom);
        _mm256_storeu_si256((__m256i *)(tile + i * 16), _mm512_castsi512_si256(top));
        _mm256_storeu_si256((__m256i *)(tile + 256 + i * 16), _mm512_extracti64x4_epi64(top, 1));
        _mm256_storeu_si256((__m256i *)(tile + 512 + i * 16), _mm512_castsi512_si256(bottom));
        _mm256_storeu_si256((__m256i *)(tile + 768 + i * 16), _mm512_extracti64x4_epi64(bottom, 1));
    }
}

/* The packed A block's layout: the AMX tiles read rows of 32 k (64 bytes apart); the AVX512-BF16
 * kernel broadcasts one (row, k pair) at a time and reads either layout, so a transposed A is
 * packed pair-major there (mica_bf16_interleave_tile: BENCHMARKS.md 8.8) instead of transposed */
static inline int mica_bf16_a_pairs(int ta, int amx) { return ta && !amx; }

/* A's rows [m0, m0 + 32), k in [k0, k0 + kc) (kc a multiple of 32), as kc/32 tiles of 32 rows x 32
 * k, each 2 KB contiguous: row-major (rows 64 bytes apart: what a tile load reads best), or
 * pair-major where `pairs` (mica_bf16_a_pairs); zeros past M and K. */
MICA_BF16_VEC static void mica_bf16_pack_a(const mica_bf16 *A, int64_t lda, int ta, int64_t M, int64_t K, int64_t m0,
                                           int64_t k0, int64_t kc, int pairs, mica_bf16 *restrict out) {
    int64_t h = M - m0 < MICA_BF16_MB ? M - m0 : MICA_BF16_MB;
    for (int64_t s = 0; s < kc; s += MICA_BF16_KSTEP) {
        mica_bf16 *tile = out + s * MICA_BF16_MB;
        int64_t ks = k0 + s, d = K - ks < MICA_BF16_KSTEP ? K - ks : MICA_BF16_KSTEP;
        if (d <= 0) { memset(tile, 0, sizeof(mica_bf16) * MICA_BF16_MB * MICA_BF16_KSTEP); continue; }
        if (!ta) {
            __mmask32 m = d == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << d) - 1);
            for (int64_t r = 0; r < MICA_BF16_MB; r++) {
                __m512i x = r < h ? _mm512_maskz_loadu_epi16(m, A + (m0 + r) * lda + ks) : _mm512_setzero_si512();
                _mm512_storeu_si512(tile + r * MICA_BF16_KSTEP, mica_bf16_daz16(x));
            }
        } else {
            for (int64_t i = ks + 2 * MICA_BF16_KSTEP; i < ks + 3 * MICA_BF16_KSTEP && i < K; i++)
                _mm_prefetch((const char *)(A + i * lda + m0), _MM_HINT_T0);  /* the tile after next's rows */
            if (pairs) mica_bf16_interleave_tile(A + ks * lda + m0, lda, h, d, tile);
            else mica_bf16_transpose_tile(A + ks * lda + m0, lda, h, d, tile);
        }
    }
}

/* write a 32 x 32 block of float32 sums to C (h x w of it), as float32 or rounded to bfloat16
 * (mica_bf16_store's rounding, 16 at a time) */
MICA_BF16_VEC static void mica_bf16_write_block(const float *acc, int64_t h, int64_t w, void *C, int64_t ldc,
                                                int64_t r0, int64_t c0, int out_bf16) {
    __mmask16 m0 = w >= 16 ? 0xFFFF : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? 0xFFFF : w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
    const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    for (int64_t r = 0; r < h; r++)
        for (int half = 0; half < 2; half++) {
            __mmask16 m = half ? m1 : m0;
            if (!m) continue;
            __m512 x = _mm512_loadu_ps(acc + r * MICA_BF16_MB + 16 * half);
            if (out_bf16) {
                __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
                __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
                b = _mm512_mask_mov_epi32(b, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_or_si512(hi, quiet));
                _mm256_mask_storeu_epi16((mica_bf16 *)C + (r0 + r) * ldc + c0 + 16 * half, m, _mm512_cvtepi32_epi16(b));
            } else {
                _mm512_mask_storeu_ps((float *)C + (r0 + r) * ldc + c0 + 16 * half, m, x);
            }
        }
}

/* acc[32][32] (+)= an A chunk (kc/32 tiles) @ two B panels (q, q + 1) from k row b0p/b1p on, by
 * AVX512-BF16: 8 rows at a time, k ascending in pairs; `more` adds to the sums already in acc. A's
 * (row r0 + r, k pair kk) of a tile lies at r0 * 32 + r * rs + kk * ks: row-major (rs, ks) = (32, 2),
 * or pair-major (2, 16). */
__attribute__((target("avx512f,avx512bf16"), always_inline)) static inline void
mica_bf16_block_avx512_at(const mica_bf16 *a, int64_t kc, const mica_bf16 *b0p, const mica_bf16 *b1p, float *acc,
                          int more, const int64_t rs, const int64_t ks) {
    for (int64_t r0 = 0; r0 < MICA_BF16_MB; r0 += 8) {
        __m512 c[8][2];
        for (int r = 0; r < 8; r++) {
            c[r][0] = more ? _mm512_loadu_ps(acc + (r0 + r) * MICA_BF16_MB) : _mm512_setzero_ps();
            c[r][1] = more ? _mm512_loadu_ps(acc + (r0 + r) * MICA_BF16_MB + 16) : _mm512_setzero_ps();
        }
        for (int64_t s = 0; s < kc; s += MICA_BF16_KSTEP) {
            const mica_bf16 *ar = a + s * MICA_BF16_MB + r0 * MICA_BF16_KSTEP;
            for (int64_t kk = 0; kk < MICA_BF16_KSTEP / 2; kk++) {
                __m512bh b0 = (__m512bh)_mm512_loadu_si512(b0p + (s / 2 + kk) * 32);
                __m512bh b1 = (__m512bh)_mm512_loadu_si512(b1p + (s / 2 + kk) * 32);
                for (int r = 0; r < 8; r++) {
                    int32_t pair;
                    memcpy(&pair, ar + r * rs + kk * ks, 4);
                    __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
                    c[r][0] = _mm512_dpbf16_ps(c[r][0], x, b0);
                    c[r][1] = _mm512_dpbf16_ps(c[r][1], x, b1);
                }
            }
        }
        for (int r = 0; r < 8; r++) {
            _mm512_storeu_ps(acc + (r0 + r) * MICA_BF16_MB, c[r][0]);
            _mm512_storeu_ps(acc + (r0 + r) * MICA_BF16_MB + 16, c[r][1]);
        }
    }
}
__attribute__((target("avx512f,avx512bf16"))) static void mica_bf16_block_avx512(const mica_bf16 *a, int64_t kc,
                                                                                 const mica_bf16 *b0p,
                                                                                 const mica_bf16 *b1p, float *acc,
                                                                                 int more, int pairs) {
    if (pairs) mica_bf16_block_avx512_at(a, kc, b0p, b1p, acc, more, 2, 16);
    else mica_bf16_block_avx512_at(a, kc, b0p, b1p, acc, more, MICA_BF16_KSTEP, 2);
}

#if MICA_BF16_GEMM == MICA_BF16_AMX
/* the same block product on the tiles: tdpbf16ps over each 32-deep k step, k ascending */
__attribute__((target("amx-tile,amx-bf16"))) static void mica_bf16_block_amx(const mica_bf16 *a, int64_t kc,
                                                                            const mica_bf16 *b0p,
                                                                            const mica_bf16 *b1p, float *acc,
                                                                            int more) {
    if (more) {
        _tile_loadd(0, acc, 4 * MICA_BF16_MB);
        _tile_loadd(1, acc + 16, 4 * MICA_BF16_MB);
        _tile_loadd(2, acc + 16 * MICA_BF16_MB, 4 * MICA_BF16_MB);
        _tile_loadd(3, acc + 16 * MICA_BF16_MB + 16, 4 * MICA_BF16_MB);
    } else {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    }
    for (int64_t s = 0; s < kc; s += MICA_BF16_KSTEP) {
        _tile_loadd(4, a + s * MICA_BF16_MB, 2 * MICA_BF16_KSTEP);
        _tile_loadd(5, a + s * MICA_BF16_MB + 16 * MICA_BF16_KSTEP, 2 * MICA_BF16_KSTEP);
        _tile_loadd(6, b0p + s * 16, 64);
        _tile_loadd(7, b1p + s * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, acc, 4 * MICA_BF16_MB);
    _tile_stored(1, acc + 16, 4 * MICA_BF16_MB);
    _tile_stored(2, acc + 16 * MICA_BF16_MB, 4 * MICA_BF16_MB);
    _tile_stored(3, acc + 16 * MICA_BF16_MB + 16, 4 * MICA_BF16_MB);
}
#endif

/* The block product on the kernel this process may run: AMX tiles where `amx` (mica_amx_ready, and
 * the calling thread's tiles configured: mica_bf16_tiles_begin), else AVX512-BF16; the same sums. */
static inline void mica_bf16_block(const mica_bf16 *a, int64_t kc, const mica_bf16 *b0p, const mica_bf16 *b1p,
                                   float *acc, int more, int amx, int pairs) {
#if MICA_BF16_GEMM == MICA_BF16_AMX
    if (amx) { mica_bf16_block_amx(a, kc, b0p, b1p, acc, more); return; }  /* (A row-major: pairs is 0) */
#endif
    (void)amx;
    mica_bf16_block_avx512(a, kc, b0p, b1p, acc, more, pairs);
}

/* A product in the pieces a parallel region runs: make (outside it), begin (every thread: B packed
 * by the team, this thread's tiles set up, then every k chunk but the last), block (the last k
 * chunk of one 32-row block of the output over column blocks [q0, q1), written to C or handed to
 * `store`, mica_bf16gemm_stored's epilogue; tile: a whole
 * row block, which is what emit.py runs a product's epilogue on), end.
 * k is cut into chunks of kc (a multiple of 32, mica_bf16_kchunk) only when packed B is larger
 * than the L2 budget: each chunk's slice of packed B then stays in L2 while every row block uses
 * it, the float32 sums of each 32 x 32 block wait in `sums` between chunks (stored and reloaded
 * exactly), so each block is still one ascending pass over all of k: the same bits as unchunked,
 * whatever the chunk size or the thread count. */
typedef void (*mica_sums_store)(const float *sums, int64_t ld, int64_t r0, int64_t h, int64_t c0, int64_t w,
                                char *arena);
typedef struct {
    int64_t M, N, K, lda, ldb, ldc, Kp, Np, kc, chunks, slot, mblocks, nblocks, ngroups, per, tiles;
    int ta, tb, out_bf16, amx, parallel;
    const mica_bf16 *A, *B;
    void *C;
    mica_bf16 *packed;
    float *sums;
    char *scratch;
    mica_sums_store store;  /* where set, each block's sums go to it instead of to C (mica_bf16gemm_stored) */
    char *arena;
} mica_bf16_product;

static mica_bf16_product mica_bf16_product_make(int64_t M, int64_t N, int64_t K, const mica_bf16 *A, int64_t lda,
                                                int ta, const mica_bf16 *B, int64_t ldb, int tb, void *C, int64_t ldc,
                                                int out_bf16, char *work, char *scratch) {
    mica_bf16_product p;
    p.M = M; p.N = N; p.K = K; p.lda = lda; p.ldb = ldb; p.ldc = ldc; p.ta = ta; p.tb = tb; p.out_bf16 = out_bf16;
    p.A = A; p.B = B; p.C = C; p.scratch = scratch; p.store = 0; p.arena = 0;
    p.Kp = mica_bf16_kpad(K); p.Np = mica_bf16_npad(N); p.slot = mica_bf16gemm_thread_bytes(K);
    p.kc = mica_bf16_kchunk(p.Kp, p.Np);
    p.chunks = p.kc ? (p.Kp + p.kc - 1) / p.kc : 1;
    p.mblocks = (M + MICA_BF16_MB - 1) / MICA_BF16_MB; p.nblocks = p.Np / MICA_BF16_MB;
    p.tiles = p.mblocks;
    p.packed = (mica_bf16 *)mica_align64(work);
    p.sums = (float *)mica_align64((char *)p.packed + 2 * p.kc * p.Np);
    p.parallel = (double)M * N * (K ? K : 1) > 262144.0;
    int threads = p.parallel ? omp_get_max_threads() : 1;
    p.ngroups = p.mblocks >= 2 * threads ? 1 : (2 * threads + p.mblocks - 1) / (p.mblocks ? p.mblocks : 1);
    p.ngroups = p.ngroups > p.nblocks ? p.nblocks : p.ngroups;
    p.ngroups = p.ngroups < 1 ? 1 : p.ngroups;
    p.per = (p.nblocks + p.ngroups - 1) / p.ngroups;
    p.amx = mica_bf16_amx();
    return p;
}

/* the length of k chunk c (which starts at c * kc): kc, or what is left of k for the last one */
static inline int64_t mica_bf16_chunk_len(const mica_bf16_product *p, int64_t c) {
    return p->Kp - c * p->kc < p->kc ? p->Kp - c * p->kc : p->kc;
}

/* k chunk c of output row block t, column blocks [q0, q1): the sums go on to `sums`, or, after the
 * last chunk, to C (or, where set, to `store`) */
static void mica_bf16_product_chunk(const mica_bf16_product *p, int64_t t, int64_t q0, int64_t q1, int64_t c) {
    char *mine = (char *)mica_align64(p->scratch + (int64_t)omp_get_thread_num() * p->slot);
    mica_bf16 *ap = (mica_bf16 *)mine;
    float *acc = (float *)(mine + 2 * MICA_BF16_MB * p->Kp);
    int64_t k0 = c * p->kc, kc = mica_bf16_chunk_len(p, c);
    int64_t m0 = t * MICA_BF16_MB, h = p->M - m0 < MICA_BF16_MB ? p->M - m0 : MICA_BF16_MB;
    int pairs = mica_bf16_a_pairs(p->ta, p->amx);
    mica_bf16_pack_a(p->A, p->lda, p->ta, p->M, p->K, m0, k0, kc, pairs, ap);
    for (int64_t q = q0; q < q1 && q < p->nblocks; q++) {  /* (packed B holds chunk c: mica_bf16_product_pack) */
        const mica_bf16 *b0p = p->packed + 2 * q * kc * 16, *b1p = b0p + kc * 16;
        float *sum = p->chunks > 1 ? p->sums + (t * p->nblocks + q) * MICA_BF16_MB * MICA_BF16_MB : acc;
        mica_bf16_block(ap, kc, b0p, b1p, sum, c > 0, p->amx, pairs);
        if (c == p->chunks - 1) {
            int64_t n0 = q * MICA_BF16_MB, w = p->N - n0 < MICA_BF16_MB ? p->N - n0 : MICA_BF16_MB;
            if (p->store) p->store(sum, MICA_BF16_MB, m0, h, n0, w, p->arena);
            else mica_bf16_write_block(sum, h, w, p->C, p->ldc, m0, n0, p->out_bf16);
        }
    }
}

/* chunk c of packed B, by the team (the barrier after it: no thread reads it half-written, and the
 * chunk before it is no longer read by anyone) */
static void mica_bf16_product_pack(const mica_bf16_product *p, int64_t c) {
    int64_t k0 = c * p->kc, kc = mica_bf16_chunk_len(p, c);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < p->Np / 16; q++) mica_bf16_pack_b_rows(p->B, p->ldb, p->tb, p->K, p->N, k0, kc, q, p->packed);
}

static void mica_bf16_product_begin(const mica_bf16_product *p) {
    mica_bf16_tiles_begin(p->amx);
    for (int64_t c = 0; c + 1 < p->chunks; c++) {
        mica_bf16_product_pack(p, c);
#pragma omp for schedule(static)
        for (int64_t u = 0; u < p->mblocks * p->ngroups; u++)
            mica_bf16_product_chunk(p, u / p->ngroups, (u % p->ngroups) * p->per, (u % p->ngroups + 1) * p->per, c);
    }
    mica_bf16_product_pack(p, p->chunks - 1);
}

static void mica_bf16_product_end(const mica_bf16_product *p) { mica_bf16_tiles_end(p->amx); }

static void mica_bf16_product_block(const mica_bf16_product *p, int64_t t, int64_t q0, int64_t q1) {
    mica_bf16_product_chunk(p, t, q0, q1, p->chunks - 1);
}

/* tile t, the whole of row block t, computed and written to C; its rows [r0, r1) and columns [c0, c1) */
static void mica_bf16_product_tile(const mica_bf16_product *p, int64_t t, int64_t *r0, int64_t *r1, int64_t *c0,
                                   int64_t *c1) {
    mica_bf16_product_block(p, t, 0, p->nblocks);
    *r0 = t * MICA_BF16_MB; *r1 = *r0 + MICA_BF16_MB < p->M ? *r0 + MICA_BF16_MB : p->M;
    *c0 = 0; *c1 = p->N;
}

/* every block of the product, over the threads of a team of its own (or the calling thread) */
static void mica_bf16_product_run(const mica_bf16_product *p) {
#pragma omp parallel if (p->parallel)
    {
        mica_bf16_product_begin(p);
#pragma omp for schedule(static)
        for (int64_t u = 0; u < p->mblocks * p->ngroups; u++)
            mica_bf16_product_block(p, u / p->ngroups, (u % p->ngroups) * p->per, (u % p->ngroups + 1) * p->per);
        mica_bf16_product_end(p);
    }
}

/* C = op(A) @ op(B) over the threads of a team of its own (or the calling thread for small
 * products); `work` holds mica_bf16gemm_shared_bytes, `scratch` mica_bf16gemm_thread_bytes(K) per
 * thread. Output blocks are dealt to threads (row blocks, split into column groups when there
 * are too few of them to go round): who computes a block never changes how. */
static void mica_bf16gemm(int64_t M, int64_t N, int64_t K, const mica_bf16 *A, int64_t lda, int ta,
                          const mica_bf16 *B, int64_t ldb, int tb, void *C, int64_t ldc, int out_bf16, char *work,
                          char *scratch) {
    mica_bf16_product p = mica_bf16_product_make(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, out_bf16, work, scratch);
    mica_bf16_product_run(&p);
}

/* The same product whose float32 sums are never written: each 32 x 32 block of them, rows [r0, r0 + h)
 * and columns [c0, c0 + w) of the output, goes to `store` (a generated epilogue, which reads the
 * arena) while it is in cache. The output then needs no memory: emit.py uses this where nothing
 * but the epilogue reads the product (passes/memory.py's `unstored`). */
static void mica_bf16gemm_stored(int64_t M, int64_t N, int64_t K, const mica_bf16 *A, int64_t lda, int ta,
                                 const mica_bf16 *B, int64_t ldb, int tb, mica_sums_store store, char *arena,
                                 char *work, char *scratch) {
    mica_bf16_product p = mica_bf16_product_make(M, N, K, A, lda, ta, B, ldb, tb, 0, N, 0, work, scratch);
    p.store = store; p.arena = arena;
    mica_bf16_product_run(&p);
}
#endif
#endif
