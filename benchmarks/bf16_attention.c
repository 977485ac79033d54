/* The bfloat16 attention kernels alone (mica_kernels.h) at shakespeare_char's shapes (batch 64, 6
 * heads, 256 tokens, head dim 64, causal), random bfloat16 heads: best of `reps` calls of the
 * forward and of the backward, wall clock, and an FNV-1a hash of dQ's bits. Build it once against
 * each tree's headers to compare two versions side by side (BENCHMARKS.md section 8.4):
 *   gcc -O3 -march=native -fopenmp -ffp-contract=off -fno-math-errno -fno-trapping-math \
 *       -mprefer-vector-width=512 -I mica/backends/c -I mica/backends/cstyle \
 *       benchmarks/bf16_attention.c -o attn -lm
 *   OMP_NUM_THREADS=1 ./attn [reps=5] [half_round=0] [layout=0]
 * (half_round 1: fp_half_intermediates' bfloat16 roundings; layout 1: a GPT step's, Q, K and V
 * slices of one [B, T, 3C] tensor and O, dO [B, T, C], rows 3C and C apart, instead of [B, H, T, E])
 * (MICA_BF16_GEMM=2: the AMX kernel; -DMICA_BF16_GEMM=1 or 0 for AVX512-BF16 or the fallback.) */
#ifndef MICA_BF16_GEMM
#define MICA_BF16_GEMM 2
#endif
#include "mica_runtime.h"
#include "mica_bf16gemm.h"
#include "mica_kernels.h"
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc, char **argv) {
    int64_t B = 64, H = 6, T = 256, E = 64; int reps = argc > 1 ? atoi(argv[1]) : 5;
    int64_t n = B * H * T * E, step = argc > 3 ? atoi(argv[3]) : 0;
    mica_bf16 *qkv = malloc(6*n), *q = step ? qkv : malloc(2*n), *k = step ? qkv + H * E : malloc(2*n), *v = step ? qkv + 2 * H * E : malloc(2*n);
    mica_bf16 *o = malloc(2*n), *g = malloc(2*n), *dq = malloc(2*n), *dk = malloc(2*n), *dv = malloc(2*n);
    float *lse = malloc(4 * B * H * T);
    uint32_t s = 1;
    for (int64_t i = 0; step && i < 3 * n; i++) { s = s * 1664525u + 1013904223u; qkv[i] = mica_bf16_store((s >> 8) / 16777216.0f - 0.5f); }
    for (int64_t i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; q[i] = mica_bf16_store((s >> 8) / 16777216.0f - 0.5f);
        s = s * 1664525u + 1013904223u; k[i] = mica_bf16_store((s >> 8) / 16777216.0f - 0.5f);
        s = s * 1664525u + 1013904223u; v[i] = mica_bf16_store((s >> 8) / 16777216.0f - 0.5f);
        s = s * 1664525u + 1013904223u; g[i] = mica_bf16_store((s >> 8) / 16777216.0f - 0.5f); }
    mica_attn_shape a; memset(&a, 0, sizeof a);
    a.B = B; a.H = H; a.L = T; a.S = T; a.E = E; a.Ev = E; a.causal = 1; a.scale = 0.125; a.half_round = argc > 2 ? atoi(argv[2]) : 0;
    a.q_sb = a.k_sb = a.v_sb = a.o_sb = a.dq_sb = a.dk_sb = a.dv_sb = H * T * E;
    a.q_sh = a.k_sh = a.v_sh = a.o_sh = a.dq_sh = a.dk_sh = a.dv_sh = T * E;
    a.q_st = a.k_st = a.v_st = a.o_st = a.dq_st = a.dk_st = a.dv_st = E;
    int64_t g_sb = H * T * E, g_sh = T * E, g_st = E;
    if (step) {  /* [B, T, 3, H, E] and [B, T, H, E] */
        a.q_sb = a.k_sb = a.v_sb = 3 * T * H * E; a.q_sh = a.k_sh = a.v_sh = E; a.q_st = a.k_st = a.v_st = 3 * H * E;
        a.o_sb = a.dq_sb = a.dk_sb = a.dv_sb = g_sb = T * H * E; a.o_sh = a.dq_sh = a.dk_sh = a.dv_sh = g_sh = E;
        a.o_st = a.dq_st = a.dk_st = a.dv_st = g_st = H * E;
    }
    int64_t slot = mica_attention_slot_bf16(T, T, E, E) + 64;
    float *scratch = aligned_alloc(64, (size_t)slot * 4 * 8 + 64);
    double bf = 1e9, bb = 1e9;
    for (int r = 0; r < reps; r++) {
        double t = now(); mica_attention_bf16(&a, q, k, v, o, lse, scratch, slot); t = now() - t; if (t < bf) bf = t;
        t = now(); mica_attention_backward_bf16(&a, g, q, k, v, o, lse, dq, dk, dv, g_sb, g_sh, g_st, scratch, slot); t = now() - t; if (t < bb) bb = t;
    }
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) h = (h ^ dq[i]) * 1099511628211ull;
    printf("forward %.1f ms backward %.1f ms  %016llx\n", bf * 1e3, bb * 1e3, (unsigned long long)h);
    return 0;
}
