/* Mica's runtime for generated CUDA programs: the CUDA runtime (or, with MICA_CUDASIM, the CPU
 * simulator that runs the same source), the launch macro, errors, and the one product wrapper.
 *
 * Products: C[M,N] = op(A)[M,K] @ op(B)[K,N], row-major with leading dimensions, through
 * cuBLASLt (COMPUTE_32F; TF32 only when the program is built with MICA_TF32, as the user
 * permits); in the simulator a plain product on the CPU (its bits are not cuBLASLt's: products
 * aside, Mica's own kernels give the simulator's bits on a card).
 */
#ifndef MICA_CUDA_H
#define MICA_CUDA_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MICA_CUDASIM
#include "mica_cudasim.h"
#else
#include <cublasLt.h>
#include <cuda_runtime.h>
#define MICA_LAUNCH(kernel, grid, block, shared, stream, ...) kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__)
#endif
#include "mica_math.h"

#ifndef MICA_THREADS
#define MICA_THREADS 256
#endif

static char mica_error_text[256];

static int mica_cuda_failed(const char *what) {
    cudaError_t e = cudaGetLastError();
    snprintf(mica_error_text, sizeof mica_error_text, "the GPU failed while %s: %s", what, cudaGetErrorString(e));
    return 2;
}

/* the ABI's copies: a failure is remembered for mica_error() */
static void mica_check(cudaError_t e) {
    if (e != cudaSuccess)
        snprintf(mica_error_text, sizeof mica_error_text, "a copy to or from the GPU failed: %s", cudaGetErrorString(e));
}

/* a device to run on, or a sentence in mica_error_text */
static int mica_cuda_ready(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        snprintf(mica_error_text, sizeof mica_error_text,
                 "no CUDA device is usable here (%s); run on a machine with an NVIDIA GPU and its driver, or "
                 "simulate it (simulate=True)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 0;
    }
    return 1;
}

/* blocks for n threads of work, each block MICA_THREADS threads (grid-stride loops take the rest) */
static inline unsigned mica_blocks(int64_t n) {
    int64_t b = (n + MICA_THREADS - 1) / MICA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* C[M,N] = alpha op(A) op(B) for `count` matrices, the i-th at A + i*sa, B + i*sb, C + i*sc
 * (strides in elements), in float (f64 = 0) or double (f64 = 1) */
#ifdef MICA_CUDASIM
/* the simulator's product: each element a sum over k in order, then alpha; queued on the stream
 * like a kernel, so a captured graph replays it */
template <class T>
static void mica_sim_gemm(int64_t M, int64_t N, int64_t K, T alpha, const T *A, int64_t lda, int ta, int64_t sa,
                          const T *B, int64_t ldb, int tb, int64_t sb, T *C, int64_t ldc, int64_t sc, int64_t count) {
    for (int64_t n = 0; n < count; n++) {
        const T *a = A + n * sa, *b = B + n * sb;
        T *c = C + n * sc;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                T acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += (ta ? a[k * lda + i] : a[i * lda + k]) * (tb ? b[j * ldb + k] : b[k * ldb + j]);
                c[i * ldc + j] = alpha == (T)1 ? acc : alpha * acc;
            }
    }
}

static int mica_gemm_batched(cudaStream_t stream, int64_t M, int64_t N, int64_t K, int f64, double alpha,
                             const void *A, int64_t lda, int ta, int64_t sa, const void *B, int64_t ldb, int tb,
                             int64_t sb, void *C, int64_t ldc, int64_t sc, int64_t count) {
    ::mica_cudasim::detail::enqueue(stream, [=] {
        if (f64)
            mica_sim_gemm<double>(M, N, K, alpha, (const double *)A, lda, ta, sa, (const double *)B, ldb, tb, sb,
                                  (double *)C, ldc, sc, count);
        else
            mica_sim_gemm<float>(M, N, K, (float)alpha, (const float *)A, lda, ta, sa, (const float *)B, ldb, tb, sb,
                                 (float *)C, ldc, sc, count);
    });
    return 0;
}
#else
/* cuBLASLt is column-major: the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
 * so B's storage is the first operand and A's the second, each transposed as the row-major one is */
typedef struct {
    cublasLtHandle_t handle;
    void *workspace;
    size_t workspace_bytes;
} mica_lt;

static mica_lt *mica_lt_get(void) {
    static mica_lt lt;
    if (!lt.handle) {
        if (cublasLtCreate(&lt.handle) != CUBLAS_STATUS_SUCCESS) return 0;
        lt.workspace_bytes = 32u << 20;
        if (cudaMalloc(&lt.workspace, lt.workspace_bytes) != cudaSuccess) return 0;
    }
    return &lt;
}

static int mica_lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                          int64_t stride, int64_t count) {
    int32_t n = (int32_t)count;
    if (cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld) != CUBLAS_STATUS_SUCCESS) return 0;
    return count == 1 ||
           (cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) ==
                CUBLAS_STATUS_SUCCESS);
}

static int mica_gemm_batched(cudaStream_t stream, int64_t M, int64_t N, int64_t K, int f64, double alpha,
                             const void *A, int64_t lda, int ta, int64_t sa, const void *B, int64_t ldb, int tb,
                             int64_t sb, void *C, int64_t ldc, int64_t sc, int64_t count) {
    mica_lt *lt = mica_lt_get();
    if (!lt) {
        snprintf(mica_error_text, sizeof mica_error_text, "cuBLASLt could not start on this GPU");
        return 1;
    }
#ifdef MICA_TF32
    cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F_FAST_TF32;
#else
    cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
#endif
    cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
    cublasLtMatmulDesc_t desc = 0;
    cublasLtMatrixLayout_t lb = 0, la = 0, lc = 0;
    cublasLtMatmulPreference_t pref = 0;
    cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ok = cublasLtMatmulDescCreate(&desc, compute, type) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa) == CUBLAS_STATUS_SUCCESS &&
             /* stored column-major: B as (tb ? K : N) x (tb ? N : K), A as (ta ? M : K) x (ta ? K : M) */
             mica_lt_layout(&lb, type, tb ? K : N, tb ? N : K, ldb, sb, count) &&
             mica_lt_layout(&la, type, ta ? M : K, ta ? K : M, lda, sa, count) &&
             mica_lt_layout(&lc, type, N, M, ldc, sc, count) &&
             cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt->workspace_bytes,
                                                  sizeof lt->workspace_bytes) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    ok = ok && cublasLtMatmulAlgoGetHeuristic(lt->handle, desc, lb, la, lc, lc, pref, 1, &best, &found) ==
                   CUBLAS_STATUS_SUCCESS && found == 1;
    const float alpha32 = (float)alpha, zero32 = 0.0f;
    const double zero64 = 0.0;
    const void *pa = f64 ? (const void *)&alpha : (const void *)&alpha32;
    const void *pz = f64 ? (const void *)&zero64 : (const void *)&zero32;
    ok = ok && cublasLtMatmul(lt->handle, desc, pa, B, lb, A, la, pz, C, lc, C, lc, &best.algo, lt->workspace,
                              lt->workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (!ok) {
        snprintf(mica_error_text, sizeof mica_error_text, "cuBLASLt could not compute a %lld x %lld x %lld product",
                 (long long)M, (long long)N, (long long)K);
        return 1;
    }
    return 0;
}
#endif

#define MICA_DEFINE_GEMM(T, S, F64)                                                                 \
static int mica_gemm_##S##_batched(cudaStream_t stream, int64_t M, int64_t N, int64_t K, T alpha, const T *A,  \
                                   int64_t lda, int ta, int64_t sa, const T *B, int64_t ldb, int tb, int64_t sb, \
                                   T *C, int64_t ldc, int64_t sc, int64_t count) {                 \
    return mica_gemm_batched(stream, M, N, K, F64, alpha, A, lda, ta, sa, B, ldb, tb, sb, C, ldc, sc, count); \
}                                                                                                  \
/* one product C[M,N] = op(A) op(B), row-major with leading dimensions */                          \
static int mica_gemm_##S(cudaStream_t stream, int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, int ta, \
                         const T *B, int64_t ldb, int tb, T *C, int64_t ldc) {                     \
    return mica_gemm_batched(stream, M, N, K, F64, 1.0, A, lda, ta, 0, B, ldb, tb, 0, C, ldc, 0, 1); \
}
MICA_DEFINE_GEMM(float, f32, 0)
MICA_DEFINE_GEMM(double, f64, 1)
#endif
