/* Mica's math for generated programs on every target, written once: element types, bit casts
 * and half types, the float math functions, Philox random bits, the canonical order of sums.
 *
 * Numerics: compiled without fast-math and without contraction (-ffp-contract=off for C,
 * --fmad=false for CUDA), so every operation rounds as written. The float math functions are
 * plain arithmetic (no table lookups, no libm calls), so a C compiler vectorizes loops that use
 * them and the result of each element never depends on whether it was computed in a vector lane,
 * a scalar lane or a GPU thread: the same bits at any optimization level, thread count or launch
 * configuration. double versions call the C library.
 *
 * Every function is MICA_HD: __host__ __device__ under nvcc, plain C otherwise.
 */
#ifndef MICA_MATH_H
#define MICA_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MICA_HD __host__ __device__
#include <cuda_fp16.h>
typedef __half mica_f16;
#elif defined(__cplusplus)
#define MICA_HD
typedef _Float16 mica_f16;  /* (the CUDA simulator's C++: a type of its own, for its overloads) */
#else
#define MICA_HD
typedef uint16_t mica_f16;  /* float16 bits: converted with integer operations, which vectorize */
#endif

/* a float16 constant in an initializer, from its bits (and value): of whichever type mica_f16 is */
#ifdef __CUDACC__
#define MICA_F16_LIT(bits, value) __half(__half_raw{bits})
#elif defined(__cplusplus)
#define MICA_F16_LIT(bits, value) ((_Float16)(value))
#else
#define MICA_F16_LIT(bits, value) ((mica_f16)(bits))
#endif

typedef uint8_t mica_bool;
typedef uint16_t mica_bf16;  /* bfloat16 bits */

/* ---- bit casts and half types -------------------------------------------------------------------- */
static inline MICA_HD float mica_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline MICA_HD uint32_t mica_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline MICA_HD float mica_bf16_load(mica_bf16 h) { return mica_bits_f32((uint32_t)h << 16); }
static inline MICA_HD mica_bf16 mica_bf16_store(float f) {
    uint32_t u = mica_f32_bits(f);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  /* round to nearest, ties to even */
    return (mica_bf16)((f != f) ? ((u >> 16) | 0x40u) : r);
}
static inline MICA_HD float mica_round_bf16(float f) { return mica_bf16_load(mica_bf16_store(f)); }
/* the bits of a float that holds a bfloat16 value already (every bfloat16 expression of a loop is
 * rounded where it is made: mica_round_bf16, a load or a constant): mica_bf16_store's result for
 * it, without rounding it a second time */
static inline MICA_HD mica_bf16 mica_bf16_exact(float f) { return (mica_bf16)(mica_f32_bits(f) >> 16); }
/* float16 values: a load widens exactly, a store rounds to nearest, ties to even, overflowing to
 * infinity (NaN stays NaN, quieted, its payload's top bits kept, as the F16C instructions do). In C
 * the bits are converted with integer and float operations a compiler vectorizes (gcc does not
 * vectorize _Float16 conversions without AVX512-FP16: a loop over float16 values ran one element at
 * a time); on a GPU (and its simulator) the hardware's conversions, which give the same bits. */
#if defined(__CUDACC__)
static inline MICA_HD float mica_f16_load(mica_f16 h) { return __half2float(h); }
static inline MICA_HD mica_f16 mica_f16_store(float f) { return __float2half_rn(f); }
#elif defined(__cplusplus)
static inline float mica_f16_load(mica_f16 h) { return (float)h; }
static inline mica_f16 mica_f16_store(float f) { return (mica_f16)f; }
#else
static inline float mica_f16_load(mica_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, a = h & 0x7FFFu;
    /* the half's exponent and mantissa in a float's field, scaled by 2^112: exact for normal and
     * subnormal halves alike (a subnormal half lands on a subnormal float, then becomes normal) */
    uint32_t m = mica_f32_bits(mica_bits_f32(a << 13) * 0x1p112f);
    if (a >= 0x7C00u) m = 0x7F800000u | (a & 0x3FFu) << 13 | (a > 0x7C00u ? 0x400000u : 0u);  /* inf, NaN */
    return mica_bits_f32(m | sign);
}
static inline mica_f16 mica_f16_store(float f) {
    uint32_t u = mica_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu, h;
    if (a >= 0x47800000u) {         /* |f| >= 2^16, inf or NaN: infinity, or a quiet NaN */
        h = a > 0x7F800000u ? 0x7E00u | ((a >> 13) & 0x3FFu) : 0x7C00u;
    } else if (a < 0x38800000u) {   /* below 2^-14: a subnormal half (or zero, or 2^-14 itself) */
        /* 0.5 + |f| rounds to a multiple of 2^-24, the subnormal halves' step: its low bits count them */
        h = mica_f32_bits(mica_bits_f32(a) + 0.5f) - 0x3F000000u;
    } else {                        /* rebias the exponent, round the 13 dropped bits to even */
        h = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    }
    return (mica_f16)(h | sign);
}
#endif
static inline MICA_HD float mica_round_f16(float f) { return mica_f16_load(mica_f16_store(f)); }

/* ---- float math, vectorizable ------------------------------------------------------------------ */
/* exp(xc) for xc in [-174, 89]: beyond, the two scale factors leave float's exponent range */
static inline MICA_HD float mica_exp_core_f32(float xc) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723e-6f;
    float n = (xc * log2e + 12582912.0f) - 12582912.0f; /* nearest integer */
    float r = (xc - n * ln2_hi) - n * ln2_lo;           /* |r| <= ln2/2 */
    float p = 1.98794029e-4f;
    p = p * r + 1.39292938e-3f;
    p = p * r + 8.33332042e-3f;
    p = p * r + 4.16665272e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 5.00000000e-1f;
    float er = 1.0f + (r + (r * r) * p);
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;  /* two factors keep 2^n in range */
    float s1 = mica_bits_f32((uint32_t)(n1 + 127) << 23), s2 = mica_bits_f32((uint32_t)(n2 + 127) << 23);
    return (er * s1) * s2;
}

static inline MICA_HD float mica_exp_f32(float x) { return mica_exp_core_f32(x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x)); }

static inline MICA_HD float mica_log_f32(float x) {
    const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723e-6f;
    int denormal = x < 1.17549435e-38f;
    float xs = denormal ? x * 8388608.0f : x;
    uint32_t ix = mica_f32_bits(xs);
    int32_t e = (int32_t)((ix >> 23) & 0xFFu) - 127 - (denormal ? 23 : 0);
    float m = mica_bits_f32((ix & 0x007FFFFFu) | 0x3F800000u); /* [1, 2) */
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    float s = (m - 1.0f) / (m + 1.0f), z = s * s;
    float q = 0.193527893f;
    q = q * z + 0.221917381f;
    q = q * z + 0.285717542f;
    q = q * z + 0.399999987f;
    q = q * z + 0.666666667f;
    float ef = (float)e;
    float res = (ef * ln2_lo + (2.0f * s + (s * z) * q)) + ef * ln2_hi;
    res = x == 0.0f ? -INFINITY : res;
    res = x < 0.0f ? NAN : res;
    res = x == INFINITY ? x : res;
    return x != x ? x : res;
}

static inline MICA_HD float mica_abs_f32(float x) { return mica_bits_f32(mica_f32_bits(x) & 0x7FFFFFFFu); }
static inline MICA_HD float mica_copysign_f32(float mag, float sgn) {
    return mica_bits_f32((mica_f32_bits(mag) & 0x7FFFFFFFu) | (mica_f32_bits(sgn) & 0x80000000u));
}

static inline MICA_HD float mica_tanh_f32(float x) {
    float a = mica_abs_f32(x), z = x * x;
    float t = 2.29885803e-3f;
    t = t * z - 8.34992202e-3f;
    t = t * z + 2.17710469e-2f;
    t = t * z - 5.39595894e-2f;
    t = t * z + 1.33333055e-1f;
    t = t * z - 3.33333332e-1f;
    float small = x + (x * z) * t;
    float e = mica_exp_f32(2.0f * a);
    float big = mica_copysign_f32(1.0f - 2.0f / (e + 1.0f), x);
    return a < 0.625f ? small : big;
}

/* erf(x) given e = exp(-x*x) (callers that also need the normal density share one exp) */
static inline MICA_HD float mica_erf_core_f32(float x, float e) {
    float a = mica_abs_f32(x), z = x * x;
    float p = -9.67848914e-6f; /* erf(x) = x * E(x^2) on |x| <= 1 */
    p = p * z + 1.12694633e-4f;
    p = p * z - 8.48446962e-4f;
    p = p * z + 5.22104930e-3f;
    p = p * z - 2.68654318e-2f;
    p = p * z + 1.12837824e-1f;
    p = p * z - 3.76126384e-1f;
    p = p * z + 1.12837917e+0f;
    float small = x * p;
    float t = 1.0f / (a > 1.0f ? a : 1.0f); /* erfc(a) = exp(-a^2) G(1/a) on 1 <= a <= 4 */
    float g = -3.66952469e-2f;
    g = g * t + 2.55273666e-1f;
    g = g * t - 7.85088778e-1f;
    g = g * t + 1.38381288e+0f;
    g = g * t - 1.48345752e+0f;
    g = g * t + 8.72038455e-1f;
    g = g * t - 5.66990561e-2f;
    g = g * t - 2.89033516e-1f;
    g = g * t + 3.76832804e-3f;
    g = g * t + 5.63634188e-1f;
    g = g * t + 3.01715312e-5f;
    float big = 1.0f - e * g;
    big = a >= 4.0f ? 1.0f : big;
    big = mica_copysign_f32(big, x);
    return a <= 1.0f ? small : (x != x ? x : big);
}
static inline MICA_HD float mica_erf_f32(float x) { return mica_erf_core_f32(x, mica_exp_f32(-(x * x))); }

/* exp(-x*x/2), the normal density's exponential, with x*x split into its rounded value and the
 * exact remainder (one fma), so the rounding of x*x does not grow with x into the result. Past
 * |x| = 15 the result is 0 in float anyway; the clamp keeps x*x finite and the argument within
 * exp_core's range, so no clamp of exp's own is needed: with one, gcc splits the paths, and a loop
 * computing gelu(x) and its slope no longer shares this exp between them. */
static inline MICA_HD float mica_gauss_exp_f32(float x) {
    float a = mica_abs_f32(x);
    a = a < 15.0f ? a : 15.0f;
    float h = a * a, l = fmaf(a, a, -h);
    float e = mica_exp_core_f32(-0.5f * h);
    return e - e * (0.5f * l);
}

/* The normal distribution's CDF, Phi(x) = erfc(-y) / 2 with y = x / sqrt(2), given
 * e = exp(-y*y) = mica_gauss_exp(x), which GELU's slope shares with the density. One
 * branch-free form on all of y: erfc(a) = exp(-a^2) G(t) with t = 1 / (1 + a/2) and G a degree-9
 * fit of erfc(a) exp(a^2) on 0 <= a <= 10 (relative error <= 3.3e-7 in float). So Phi keeps its
 * relative accuracy in the far negative tail, where 1 + erf(y) would cancel, and it costs half of
 * erf's two-piece form. */
static inline MICA_HD float mica_normal_cdf_core_f32(float y, float e) {
    float a = mica_abs_f32(y);
    float t = 1.0f / (1.0f + 0.5f * a);
    float g = -5.505274981e-02f;
    g = fmaf(g, t, 2.639105320e-01f);
    g = fmaf(g, t, -4.414939284e-01f);
    g = fmaf(g, t, 2.212109864e-01f);
    g = fmaf(g, t, 1.706248149e-02f);
    g = fmaf(g, t, 1.812572181e-01f);
    g = fmaf(g, t, 2.497912496e-01f);
    g = fmaf(g, t, 2.810988426e-01f);
    g = fmaf(g, t, 2.822213471e-01f);
    g = fmaf(g, t, -6.009405297e-06f);
    float h = 0.5f * (e * g); /* erfc(a) / 2 */
    return y < 0.0f ? h : 1.0f - h;
}

/* GELU (exact, erf form) and its slope */
static inline MICA_HD float mica_gelu_f32(float x) {
    return x * mica_normal_cdf_core_f32(x * 0.70710678118654752f, mica_gauss_exp_f32(x));
}
static inline MICA_HD float mica_gelu_slope_f32(float x) {
    float e = mica_gauss_exp_f32(x); /* shared by the CDF and the density */
    float cdf = mica_normal_cdf_core_f32(x * 0.70710678118654752f, e);
    return cdf + x * (e * 0.39894228040143268f);
}
static inline MICA_HD double mica_gelu_f64(double x) { return x * (0.5 * (1.0 + erf(x * 0.7071067811865476))); }
static inline MICA_HD double mica_gelu_slope_f64(double x) {
    double cdf = 0.5 * (1.0 + erf(x * 0.7071067811865476));
    return cdf + x * (exp(-0.5 * (x * x)) * 0.3989422804014327);
}

/* GELU's tanh form and its slope */
#define MICA_DEFINE_GELU_TANH(T, S)                                                                \
    static inline MICA_HD T mica_gelu_tanh_##S(T x) {                                                      \
        T inner = (T)0.7978845608028654 * (x + (T)0.044715 * (x * x * x));                         \
        return (T)0.5 * x * ((T)1 + mica_tanh_##S(inner));                                        \
    }                                                                                              \
    static inline MICA_HD T mica_gelu_tanh_slope_##S(T x) {                                                \
        T x2 = x * x, th = mica_tanh_##S((T)0.7978845608028654 * (x + (T)0.044715 * (x2 * x)));    \
        return (T)0.5 * ((T)1 + th) +                                                              \
               ((T)0.5 * x) * ((T)1 - th * th) * (T)0.7978845608028654 * ((T)1 + (T)0.134145 * x2); \
    }

static inline MICA_HD float mica_sqrt_f32(float x) { return sqrtf(x); }
static inline MICA_HD float mica_sin_f32(float x) { return sinf(x); }
static inline MICA_HD float mica_cos_f32(float x) { return cosf(x); }
static inline MICA_HD float mica_pow_f32(float x, float y) { return powf(x, y); }
/* roundings to an integer value and the remainder of a division are exact in IEEE arithmetic: the
 * same bits from every library and every GPU (rint rounds half to even, as torch.round) */
static inline MICA_HD float mica_floor_f32(float x) { return floorf(x); }
static inline MICA_HD float mica_ceil_f32(float x) { return ceilf(x); }
static inline MICA_HD float mica_trunc_f32(float x) { return truncf(x); }
static inline MICA_HD float mica_rint_f32(float x) { return rintf(x); }
static inline MICA_HD float mica_fmod_f32(float x, float y) { return fmodf(x, y); }
static inline MICA_HD float mica_fabs_f32(float x) { return fabsf(x); } /* (|-0| is +0, as torch's) */
static inline MICA_HD double mica_floor_f64(double x) { return floor(x); }
static inline MICA_HD double mica_ceil_f64(double x) { return ceil(x); }
static inline MICA_HD double mica_trunc_f64(double x) { return trunc(x); }
static inline MICA_HD double mica_rint_f64(double x) { return rint(x); }
static inline MICA_HD double mica_fmod_f64(double x, double y) { return fmod(x, y); }
static inline MICA_HD double mica_fabs_f64(double x) { return fabs(x); }

static inline MICA_HD double mica_exp_f64(double x) { return exp(x); }
static inline MICA_HD double mica_log_f64(double x) { return log(x); }
static inline MICA_HD double mica_tanh_f64(double x) { return tanh(x); }
static inline MICA_HD double mica_erf_f64(double x) { return erf(x); }
static inline MICA_HD double mica_sqrt_f64(double x) { return sqrt(x); }
static inline MICA_HD double mica_sin_f64(double x) { return sin(x); }
static inline MICA_HD double mica_cos_f64(double x) { return cos(x); }
static inline MICA_HD double mica_pow_f64(double x, double y) { return pow(x, y); }

MICA_DEFINE_GELU_TANH(float, f32)
MICA_DEFINE_GELU_TANH(double, f64)

/* ---- counter-based random bits: Philox4x32-10 -------------------------------------------------- */
static inline MICA_HD uint32_t mica_philox_word(uint64_t seed, uint32_t offset, uint32_t stream, uint64_t index) {
    uint64_t block = index >> 2;
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = stream, c3 = offset;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    uint32_t lane = (uint32_t)(index & 3);
    return lane == 0 ? c0 : lane == 1 ? c1 : lane == 2 ? c2 : c3;
}

/* keep element `index` of dropout site `stream` when its top 24 bits reach the threshold */
static inline MICA_HD int mica_keep(const int64_t *rng, uint32_t stream, uint64_t index, uint32_t threshold) {
    return (mica_philox_word((uint64_t)rng[0], (uint32_t)rng[1], stream, index) >> 8) >= threshold;
}

/* element `index` of rand site `stream`: its top 24 bits times 2^-24, a float in [0, 1) */
static inline MICA_HD float mica_uniform(const int64_t *rng, uint32_t stream, uint64_t index) {
    return (float)(mica_philox_word((uint64_t)rng[0], (uint32_t)rng[1], stream, index) >> 8) * 5.9604644775390625e-08f;
}

/* ---- fixed-order sums ---------------------------------------------------------------------------
 * The canonical sum of n values x[0..n): blocks of MICA_BLOCK values; inside a block eight lanes
 * (lane = index % 8) summed in increasing index, then combined as ((0+1)+(2+3))+((4+5)+(6+7));
 * the blocks' results added left to right. The order depends on n alone, never on threads.
 */
#define MICA_LANES 8
#define MICA_BLOCK 8192
#define MICA_TREE8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))

#define MICA_DEFINE_SUMS(T, S)                                                                     \
    static inline MICA_HD T mica_block_sum_##S(const T *x, int64_t n) {                                    \
        T acc[MICA_LANES] = {0};                                                                   \
        int64_t i = 0;                                                                             \
        for (; i + MICA_LANES <= n; i += MICA_LANES)                                               \
            for (int l = 0; l < MICA_LANES; l++) acc[l] = acc[l] + x[i + l];                       \
        for (int l = 0; i + l < n; l++) acc[l] = acc[l] + x[i + l];                                \
        return MICA_TREE8(acc);                                                                    \
    }                                                                                              \
    static inline MICA_HD T mica_sum_##S(const T *x, int64_t n) {                                          \
        T total = mica_block_sum_##S(x, n < MICA_BLOCK ? n : MICA_BLOCK);                          \
        for (int64_t b = MICA_BLOCK; b < n; b += MICA_BLOCK)                                       \
            total = total + mica_block_sum_##S(x + b, n - b < MICA_BLOCK ? n - b : MICA_BLOCK);    \
        return total;                                                                              \
    }

/* result = canonical sum of EXPR over j in [0, n) (EXPR may use j) */
#define MICA_SUM_EXPR(T, n, result, EXPR)                                                          \
    do {                                                                                           \
        T acc_[MICA_LANES], tot_ = 0;                                                              \
        for (int64_t b0_ = 0; b0_ < (n) || b0_ == 0; b0_ += MICA_BLOCK) {                          \
            int64_t b1_ = (n) - b0_ < MICA_BLOCK ? (n) : b0_ + MICA_BLOCK, jb_ = b0_;              \
            for (int l_ = 0; l_ < MICA_LANES; l_++) acc_[l_] = 0;                                  \
            for (; jb_ + MICA_LANES <= b1_; jb_ += MICA_LANES)                                     \
                for (int l_ = 0; l_ < MICA_LANES; l_++) { int64_t j = jb_ + l_; acc_[l_] = acc_[l_] + (EXPR); } \
            for (int l_ = 0; jb_ + l_ < b1_; l_++) { int64_t j = jb_ + l_; acc_[l_] = acc_[l_] + (EXPR); } \
            tot_ = b0_ == 0 ? MICA_TREE8(acc_) : tot_ + MICA_TREE8(acc_);                          \
            if ((n) <= 0) break;                                                                   \
        }                                                                                          \
        (result) = tot_;                                                                           \
    } while (0)

MICA_DEFINE_SUMS(float, f32)
MICA_DEFINE_SUMS(double, f64)

static inline MICA_HD float mica_max_f32(float a, float b) { return (a > b || a != a) ? a : b; }
static inline MICA_HD double mica_max_f64(double a, double b) { return (a > b || a != a) ? a : b; }

#endif
