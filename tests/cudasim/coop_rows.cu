/* The cooperative row helpers of mica_cuda_kernels.h against the sequential code they replace,
 * bit for bit: the canonical sum (mica_sum, MICA_SUM_EXPR) and the row max (mica_row_max) of rows
 * computed by groups of 8 threads, for widths around the lanes (8) and the blocks (8192), on rows
 * of random values of many magnitudes, rows with NaNs of different payloads, rows of signed zeros
 * and tied maxima, and infinities. The max is a selection, so its bits include a NaN's payload;
 * a sum's NaN may carry either operand's payload (compilers swap the operands of an addition, and
 * a GPU's arithmetic gives the canonical NaN), so sums compare equal bits or both NaN. Built with
 * -DMICA_THREADS=32, 256 or 1024, and under AddressSanitizer (a width's rows are one cudaMalloc of
 * exactly their bytes: a read past the last row's end is reported). Prints one line per element
 * type and exits 1 at the first difference. */
#include "mica_cuda.h"
#include "mica_cuda_kernels.h"

static uint64_t state = 88172645463325252ull;
static uint64_t next_bits(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

#define DEFINE_CHECK(T, S, BITS)                                                                   \
static __global__ void rows_##S(const T *x, int64_t rows, int64_t n, T *sum, T *sq, T *max) {      \
    MICA_ROW_GROUPS(r, rows) {                                                                     \
        const T *xr = x + r * n;                                                                   \
        T s = mica_coop_sum_##S(xr, n), q;                                                         \
        MICA_COOP_SUM(T, S, j, n, q, xr[j] * xr[j] - (T)0.5);                                      \
        T m = n > 0 ? mica_coop_max_##S(xr, n) : (T)0;                                             \
        if (MICA_ROW_LEAD) { sum[r] = s; sq[r] = q; max[r] = m; }                                  \
    }                                                                                              \
}                                                                                                  \
static T value_##S(int kind, int64_t j) {                                                          \
    uint64_t u = next_bits();                                                                      \
    T v = (T)((double)(int64_t)(u >> 11) / 9007199254740992.0 - 0.5) *                             \
          (T)ldexp(1.0, (int)(u % 41) - 20);                                                       \
    switch (kind) {                                                                                \
    case 1: { /* NaNs with different payloads, here and there */                                   \
        if (u % 97 == 3 || j == 5 || j == 8192) {                                                  \
            BITS b = (BITS)(next_bits() | 1), nan;                                                 \
            T t = (T)NAN;                                                                          \
            memcpy(&nan, &t, sizeof nan);                                                          \
            nan |= b & ((((BITS)1) << (sizeof(BITS) * 8 - 13)) - 1);                               \
            if (u & 2) nan |= ((BITS)1) << (sizeof(BITS) * 8 - 1);                                 \
            memcpy(&v, &nan, sizeof v);                                                            \
        }                                                                                          \
        break;                                                                                     \
    }                                                                                              \
    case 2: { /* signed zeros and tied maxima */                                                   \
        const T few[5] = {(T)0, -(T)0, (T)-1, (T)0.25, -(T)0.0};                                   \
        v = few[u % (j % 3 == 0 ? 5 : 3)];                                                         \
        break;                                                                                     \
    }                                                                                              \
    case 3: /* infinities among the values */                                                      \
        if (u % 13 == 0) v = (u & 16) ? (T)INFINITY : -(T)INFINITY;                                \
        break;                                                                                     \
    case 4: /* all the same but the sign of zero */                                                \
        v = (u & 1) ? (T)0 : -(T)0;                                                                \
        break;                                                                                     \
    }                                                                                              \
    return v;                                                                                      \
}                                                                                                  \
static int check_##S(void) {                                                                       \
    const int64_t widths[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 63, 8191, 8192, 8193, 16384, 16385, 20000}; \
    const int kinds = 5, per_kind = 3, rows = kinds * per_kind;                                   \
    int checked = 0;                                                                               \
    for (int64_t n : widths) {                                                                     \
        T *host = (T *)malloc(sizeof(T) * (size_t)(rows * n + 1));                                 \
        for (int r = 0; r < rows; r++)                                                             \
            for (int64_t j = 0; j < n; j++) host[r * n + j] = value_##S(r / per_kind, j);          \
        T *x = 0, *out = 0;                                                                        \
        cudaMalloc((void **)&x, sizeof(T) * (size_t)(rows * n > 0 ? rows * n : 1));                \
        cudaMalloc((void **)&out, sizeof(T) * 3 * rows);                                           \
        cudaMemcpy(x, host, sizeof(T) * (size_t)(rows * n), cudaMemcpyHostToDevice);               \
        MICA_LAUNCH(rows_##S, mica_blocks(MICA_ROW_GROUP * rows), MICA_THREADS, 0, 0, x, rows, n, out, \
                    out + rows, out + 2 * rows);                                                   \
        T got[3 * rows];                                                                           \
        cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);                                  \
        for (int r = 0; r < rows; r++) {                                                           \
            const T *xr = host + r * n;                                                            \
            T want[3];                                                                             \
            want[0] = mica_sum_##S(xr, n);                                                         \
            MICA_SUM_EXPR(T, n, want[1], xr[j] * xr[j] - (T)0.5);                                  \
            want[2] = n > 0 ? mica_row_max_##S(xr, n) : (T)0;                                      \
            for (int k = 0; k < 3; k++) {                                                          \
                T g_ = got[k * rows + r];                                                          \
                int both_nan = k < 2 && g_ != g_ && want[k] != want[k]; /* a sum's NaN: any payload */ \
                if (memcmp(&g_, &want[k], sizeof(T)) != 0 && !both_nan) {                          \
                    printf(#S " n=%lld row %d: %s %.17g, not %.17g\n", (long long)n, r,          \
                           k == 0 ? "sum" : k == 1 ? "sum of the expression" : "max",              \
                           (double)got[k * rows + r], (double)want[k]);                          \
                    return 1;                                                                      \
                }                                                                                  \
                checked++;                                                                         \
            }                                                                                      \
        }                                                                                          \
        cudaFree(x);                                                                               \
        cudaFree(out);                                                                             \
        free(host);                                                                                \
    }                                                                                              \
    printf(#S " %d same bits\n", checked);                                                         \
    return 0;                                                                                      \
}

DEFINE_CHECK(float, f32, uint32_t)
DEFINE_CHECK(double, f64, uint64_t)

int main(void) {
    if (check_f32() || check_f64()) return 1;
    return 0;
}
