/* The instruction ceilings the products are measured against: how many float32 FLOP/s this machine's
 * cores retire in a loop of nothing but independent 512-bit AVX512-BF16 dot products (`vdpbf16ps`,
 * 64 FLOP each: 16 lanes, two products and two sums a lane) and of 512-bit float32 FMAs (32 FLOP
 * each), on every thread OpenMP starts. Sixteen accumulators hide either instruction's latency.
 * The best of `rounds` rounds is printed (a round on a shared core is slower, never faster).
 *
 *     gcc -O3 -march=native -fopenmp benchmarks/bf16_peak.c -o /tmp/bf16_peak
 *     OMP_NUM_THREADS=2 /tmp/bf16_peak [rounds=7]
 *
 * Needs a compiler and a processor with AVX512-BF16; it says so and stops otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>

#define CHAINS 16
#define ITERS 10000000L

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* GFLOP/s of one round over all threads of CHAINS independent accumulators, each taking `step` (an
 * instruction of `flop` FLOP) ITERS times; `sink` keeps the sums alive */
#define MICA_PEAK_ROUND(name, A, B, a0, b0, step, flop)                                            \
    static double name(float *sink) {                                                              \
        double t0 = seconds();                                                                     \
        float total = 0.0f;                                                                        \
        _Pragma("omp parallel reduction(+ : total)") {                                             \
            __m512 acc[CHAINS];                                                                    \
            for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_setzero_ps();                         \
            A a = a0;                                                                              \
            B b = b0;                                                                              \
            for (long i = 0; i < ITERS; i++) {                                                     \
                _Pragma("GCC unroll 16") for (int c = 0; c < CHAINS; c++) acc[c] = step;           \
                __asm__ volatile("" : "+v"(a)); /* (the loop is not folded away) */                \
            }                                                                                      \
            for (int c = 0; c < CHAINS; c++) total += _mm512_reduce_add_ps(acc[c]);               \
        }                                                                                          \
        *sink += total;                                                                            \
        return (double)ITERS * CHAINS * (flop) * omp_get_max_threads() / (seconds() - t0) / 1e9;  \
    }

MICA_PEAK_ROUND(dot_round, __m512bh, __m512bh, (__m512bh)_mm512_set1_epi16(0x3f80),
                (__m512bh)_mm512_set1_epi16(0x3000), _mm512_dpbf16_ps(acc[c], a, b), 64)
MICA_PEAK_ROUND(fma_round, __m512, __m512, _mm512_set1_ps(1.0f), _mm512_set1_ps(1e-7f),
                _mm512_fmadd_ps(a, b, acc[c]), 32)

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    double dot = 0, fma = 0;
    float sink = 0;
    for (int r = 0; r < rounds; r++) {
        double d = dot_round(&sink), f = fma_round(&sink);
        printf("round %d: vdpbf16ps %.1f GFLOP/s, float32 FMA %.1f GFLOP/s\n", r + 1, d, f);
        if (d > dot) dot = d;
        if (f > fma) fma = f;
    }
    printf("%d thread(s), best of %d: vdpbf16ps %.1f GFLOP/s, float32 FMA %.1f GFLOP/s, ratio %.2f (%g)\n",
           omp_get_max_threads(), rounds, dot, fma, dot / fma, (double)(sink != sink));
    return 0;
}
#else
int main(void) {
    puts("this compiler or processor has no AVX512-BF16 (build with -march=native on one that has it)");
    return 1;
}
#endif
