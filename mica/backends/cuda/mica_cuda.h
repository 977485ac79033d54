/* Mica's runtime for generated CUDA programs: the CUDA runtime (or, with MICA_CUDASIM, the CPU
 * simulator that runs the same source), the launch macro, errors, and the one product wrapper.
 *
 * Products: C[M,N] = op(A)[M,K] @ op(B)[K,N], row-major with leading dimensions, through
 * cuBLASLt (COMPUTE_32F; TF32 only when the program is built with MICA_TF32, as the user
 * permits); A, B and C are float32, float64 (COMPUTE_64F), bfloat16 or float16 (a half product
 * reads half operands, accumulates in float32 and rounds C once); in the simulator a plain
 * product on the CPU in the same arithmetic (its bits are not cuBLASLt's: products aside, Mica's
 * own kernels give the simulator's bits on a card).
 */
#ifndef MICA_CUDA_H
#define MICA_CUDA_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MICA_CUDASIM
#include "mica_cudasim.h"
#else
#include <cublasLt.h>
#include <cuda_runtime.h>
/* (each launch's own error, e.g. too many resources for its block, is known as it is made: mica_launched) */
#define MICA_LAUNCH(kernel, grid, block, shared, stream, ...) \
    (kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__), mica_launched(#kernel))
#define MICA_EXTERN_SHARED(type, name) extern __shared__ __align__(16) type name[] /* (mica_cudasim.h's, under nvcc) */
#define MICA_SHARED_ARRAY(type, name, count) __shared__ type name[count]
#endif
#include "mica_math.h"

/* unroll the next loop n times on the card (a canonical sum's loop: its terms' loads then go out
 * ahead of its chain of adds, which keep their order); the simulator's g++ ignores it */
#ifdef __CUDACC__
#define MICA_PRAGMA(x) _Pragma(#x)
#define MICA_UNROLL(n) MICA_PRAGMA(unroll n)
#else
#define MICA_UNROLL(n)
#endif

/* a lane reduction's terms computed ahead of its adds (render.py's `ahead`: 64 of 4 bytes, 32 of 8).
 * compute_120's front end (cicc) takes ten times longer than the other architectures' on loops unrolled
 * 64 times (41 s of the test GPT step's 47 s five-architecture build), so there a lane keeps 16 ahead:
 * the same terms added in the same order, so the same bits, with fewer loads in flight */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define MICA_AHEAD64 16
#define MICA_AHEAD32 16
#else
#define MICA_AHEAD64 64
#define MICA_AHEAD32 32
#endif

#ifndef MICA_THREADS
#define MICA_THREADS 256
#endif
/* on every kernel launched with MICA_THREADS threads a block: ptxas then keeps its registers within
 * what that many threads may have (65,536 a block; a layer norm's backward takes 96 and a float64
 * sum 255 when unbounded, which 512 or 1024 threads could not launch with) */
#define MICA_THREAD_BOUNDS __launch_bounds__(MICA_THREADS)

static char mica_error_text[256];

static int mica_cuda_failed(const char *what) {
    cudaError_t e = cudaGetLastError();
    snprintf(mica_error_text, sizeof mica_error_text, "the GPU failed while %s: %s", what, cudaGetErrorString(e));
    return 2;
}

#ifndef MICA_CUDASIM
/* The first kernel that could not be launched since mica_launches_begin, and why. A launch that
 * fails while the step is captured adds nothing to the graph and may leave the capture valid: the
 * graph must not be kept without it (nor the error be cleared by a later call and forgotten). */
static char mica_launch_error[200];
static int mica_launch_own; /* 1: that launch's own error; 0: one a kernel before it made, noticed there */

static void mica_launched(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess || mica_launch_error[0]) return;
    /* the launch's own errors name the kernel; any other (a kernel that ran before it failed, in a
     * profile run, which runs kernels as they are launched) is only noticed here */
    mica_launch_own = e == cudaErrorInvalidConfiguration || e == cudaErrorLaunchOutOfResources ||
                      e == cudaErrorInvalidDeviceFunction || e == cudaErrorNoKernelImageForDevice ||
                      e == cudaErrorInvalidValue;
    snprintf(mica_launch_error, sizeof mica_launch_error, "%s (%s)", kernel, cudaGetErrorString(e));
}

static void mica_launches_begin(void) {
    cudaGetLastError();
    mica_launch_error[0] = 0;
}

/* 0, or 2 with the sentence in mica_error_text when a launch since mica_launches_begin failed */
static int mica_launches_failed(void) {
    if (!mica_launch_error[0]) return 0;
    if (!mica_launch_own)
        snprintf(mica_error_text, sizeof mica_error_text, "the GPU failed while running the program before %s",
                 mica_launch_error);
    else
        snprintf(mica_error_text, sizeof mica_error_text,
                 "the GPU could not launch Mica's kernel %s; please report it with the program's .source",
                 mica_launch_error);
    return 2;
}
#else
static void mica_launches_begin(void) {}
static int mica_launches_failed(void) { return 0; }
#endif

/* the ABI's copies: a failure is remembered for mica_error() */
static void mica_check(cudaError_t e) {
    if (e != cudaSuccess)
        snprintf(mica_error_text, sizeof mica_error_text, "a copy to or from the GPU failed: %s", cudaGetErrorString(e));
}

/* a device to run on, or a sentence in mica_error_text. A rank of several on one machine (mpirun's
 * OMPI_COMM_WORLD_LOCAL_RANK, or LOCAL_RANK) takes the card of its local rank, before its first
 * allocation, so ranks never share a card unless there are fewer cards than ranks. */
static int mica_cuda_ready(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        snprintf(mica_error_text, sizeof mica_error_text,
                 "no CUDA device is usable here (%s); run on a machine with an NVIDIA GPU and its driver, or "
                 "simulate it (simulate=True)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 0;
    }
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!local) local = getenv("LOCAL_RANK");
    if (local && cudaSetDevice(atoi(local) % n) != cudaSuccess) {
        snprintf(mica_error_text, sizeof mica_error_text, "this rank could not take CUDA device %d of %d (%s)",
                 atoi(local) % n, n, cudaGetErrorString(cudaGetLastError()));
        return 0;
    }
    return 1;
}

/* blocks for n threads of work, each block MICA_THREADS threads (grid-stride loops take the rest); a group
 * kernel works out its members' blocks with it too */
static __host__ __device__ inline unsigned mica_blocks(int64_t n) {
    int64_t b = (n + MICA_THREADS - 1) / MICA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---- the products record -------------------------------------------------------------------
 * Every product shape the program runs, with the cuBLASLt algorithm chosen for it by timing its
 * candidates on this card, kept in the file $MICA_PRODUCTS (when set; `mica train` sets it), so
 * that every later run uses the same routines. The file names the card, the driver and cuBLASLt's
 * version; a file made elsewhere is not used (and is rewritten). A shape the record lacks is met
 * while the step is captured as a graph: it is timed after that capture, recorded, and the capture
 * is redone. The simulator has one routine; it records its shapes the same way. */
/* a product's element types (the record's first field: 0 and 1 as float32 and float64 always were):
 * A's, B's and C's, or, for the last two, half operands whose C is float32 (their sums unrounded) */
enum { MICA_F32 = 0, MICA_F64 = 1, MICA_BF16 = 2, MICA_F16 = 3, MICA_BF16_F32 = 4, MICA_F16_F32 = 5 };

/* the operands' element bytes, and the result's */
static inline int64_t mica_type_size(int type) { return type == MICA_F64 ? 8 : type == MICA_F32 ? 4 : 2; }
static inline int64_t mica_c_size(int type) { return type >= MICA_BF16_F32 ? 4 : mica_type_size(type); }

typedef struct {
    int64_t M, N, K, lda, ldb, ldc, sa, sb, sc, count;
    int ta, tb, type, tf32; /* type: A's, B's and C's (MICA_F32 ...; MICA_BF16_F32: C float32) */
    int align_a, align_b, align_c; /* bytes (a power of two up to 256) every matrix's start is a multiple of */
} mica_product_shape;

typedef struct {
    mica_product_shape shape;
    uint64_t algo[8]; /* cuBLASLt's cublasLtMatmulAlgo_t, its 8 words */
    double us;        /* the chosen algorithm's measured time */
    int pending;      /* met during a capture, not timed yet */
} mica_product;

static struct {
    mica_product *p;
    int n, cap, loaded;
} mica_record;

#ifdef MICA_TF32
#define MICA_TF32_ON 1
#else
#define MICA_TF32_ON 0
#endif

static int mica_same_shape(const mica_product_shape *a, const mica_product_shape *b) {
    return a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->sa == b->sa && a->sb == b->sb && a->sc == b->sc && a->count == b->count &&
           a->ta == b->ta && a->tb == b->tb && a->type == b->type && a->tf32 == b->tf32 && a->align_a == b->align_a &&
           a->align_b == b->align_b && a->align_c == b->align_c;
}

static mica_product *mica_record_find(const mica_product_shape *s) {
    for (int i = 0; i < mica_record.n; i++)
        if (mica_same_shape(&mica_record.p[i].shape, s)) return &mica_record.p[i];
    return 0;
}

static mica_product *mica_record_add(const mica_product_shape *s) {
    if (mica_record.n == mica_record.cap) {
        int cap = mica_record.cap ? 2 * mica_record.cap : 64;
        mica_product *p = (mica_product *)realloc(mica_record.p, (size_t)cap * sizeof *p);
        if (!p) return 0;
        mica_record.p = p, mica_record.cap = cap;
    }
    mica_product *e = &mica_record.p[mica_record.n++];
    memset(e, 0, sizeof *e);
    e->shape = *s;
    return e;
}

/* the line naming what the record's times were measured on */
static void mica_record_machine(char *line, size_t size) {
#ifdef MICA_CUDASIM
    snprintf(line, size, "machine the CUDA simulator (one routine per product)");
#else
    int dev = 0, driver = 0;
    cudaDeviceProp prop;
    cudaGetDevice(&dev);
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) prop.name[0] = 0, prop.major = prop.minor = 0;
    cudaDriverGetVersion(&driver);
    snprintf(line, size, "machine %s sm_%d%d driver %d cublasLt %zu", prop.name, prop.major, prop.minor, driver,
             cublasLtGetVersion());
#endif
    for (char *c = line; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
}

#define MICA_RECORD_FIRST "# Mica products record: the algorithm chosen for each product shape, by timing"

/* the entries of the record file at `path` made on this machine, added to the table when absent
 * (a line that does not parse, or a file from another machine, adds nothing) */
static void mica_record_read(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024], machine[512], want[512];
    mica_record_machine(want, sizeof want);
    if (!fgets(line, sizeof line, f) || strncmp(line, MICA_RECORD_FIRST, strlen(MICA_RECORD_FIRST)) != 0 ||
        !fgets(machine, sizeof machine, f)) {
        fclose(f);
        return;
    }
    machine[strcspn(machine, "\n")] = 0;
    if (strcmp(machine, want) != 0) {
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        mica_product_shape s;
        unsigned long long w[8];
        long long v[10];
        int t[7], used = 0;
        double us;
        memset(&s, 0, sizeof s);
        if (sscanf(line, "product %d %d %lld %lld %lld %d %d %lld %lld %lld %lld %lld %lld %lld align %d %d %d "
                         "algo %llx %llx %llx %llx %llx %llx %llx %llx us %lf%n",
                   &t[0], &t[1], &v[0], &v[1], &v[2], &t[2], &t[3], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9],
                   &t[4], &t[5], &t[6], &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &us, &used) != 26 ||
            used == 0)
            continue;
        if (t[0] < MICA_F32 || t[0] > MICA_F16_F32) continue;
        s.type = t[0], s.tf32 = t[1], s.M = v[0], s.N = v[1], s.K = v[2], s.ta = t[2], s.tb = t[3];
        s.align_a = t[4], s.align_b = t[5], s.align_c = t[6];
        s.lda = v[3], s.ldb = v[4], s.ldc = v[5], s.sa = v[6], s.sb = v[7], s.sc = v[8], s.count = v[9];
        if (mica_record_find(&s)) continue;
        mica_product *e = mica_record_add(&s);
        if (!e) break;
        for (int k = 0; k < 8; k++) e->algo[k] = (uint64_t)w[k];
        e->us = us;
    }
    fclose(f);
}

/* the table, merged with what the file holds now (another program of the trainer may have added
 * shapes), written to a temporary file and renamed over it */
static void mica_record_write(void) {
    const char *path = getenv("MICA_PRODUCTS");
    if (!path || !*path) return;
    mica_record_read(path);
    char tmp[4096], machine[512];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return; /* (the record is a cache: without it every run times its products again) */
    mica_record_machine(machine, sizeof machine);
    fprintf(f, "%s\n%s\n", MICA_RECORD_FIRST, machine);
    for (int i = 0; i < mica_record.n; i++) {
        const mica_product *e = &mica_record.p[i];
        const mica_product_shape *s = &e->shape;
        if (e->pending) continue;
        fprintf(f, "product %d %d %lld %lld %lld %d %d %lld %lld %lld %lld %lld %lld %lld align %d %d %d algo", s->type,
                s->tf32, (long long)s->M, (long long)s->N, (long long)s->K, s->ta, s->tb, (long long)s->lda,
                (long long)s->ldb, (long long)s->ldc, (long long)s->sa, (long long)s->sb, (long long)s->sc,
                (long long)s->count, s->align_a, s->align_b, s->align_c);
        for (int k = 0; k < 8; k++) fprintf(f, " %llx", (unsigned long long)e->algo[k]);
        fprintf(f, " us %.3f\n", e->us);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) remove(tmp);
}

#ifdef MICA_CUDASIM
/* the simulator's product: each element a sum over k in order (in A, the accumulator's type:
 * float for float and the half types, whose operands are widened exactly), then alpha, then C
 * rounded once to its type; queued on the stream like a kernel, so a captured graph replays it */
static inline float mica_sim_load(float x) { return x; }
static inline double mica_sim_load(double x) { return x; }
static inline float mica_sim_load(mica_bf16 x) { return mica_bf16_load(x); }
static inline float mica_sim_load(mica_f16 x) { return (float)x; }
static inline void mica_sim_store(float *p, float f) { *p = f; }
static inline void mica_sim_store(double *p, double f) { *p = f; }
static inline void mica_sim_store(mica_bf16 *p, float f) { *p = mica_bf16_store(f); }
static inline void mica_sim_store(mica_f16 *p, float f) { *p = (mica_f16)f; }

template <class T, class A, class TC>
static void mica_sim_gemm(const mica_product_shape *s, A alpha, const T *A_, const T *B, TC *C) {
    for (int64_t n = 0; n < s->count; n++) {
        const T *a = A_ + n * s->sa, *b = B + n * s->sb;
        TC *c = C + n * s->sc;
        for (int64_t i = 0; i < s->M; i++)
            for (int64_t j = 0; j < s->N; j++) {
                A acc = 0;
                for (int64_t k = 0; k < s->K; k++)
                    acc += mica_sim_load(s->ta ? a[k * s->lda + i] : a[i * s->lda + k]) *
                           mica_sim_load(s->tb ? b[j * s->ldb + k] : b[k * s->ldb + j]);
                mica_sim_store(&c[i * s->ldc + j], alpha == (A)1 ? acc : alpha * acc);
            }
    }
}

static int mica_products_ready(void) {
    if (!mica_record.loaded) {
        const char *path = getenv("MICA_PRODUCTS");
        if (path && *path) mica_record_read(path);
        mica_record.loaded = 1;
    }
    return 1;
}

static int mica_product_run(cudaStream_t stream, const mica_product_shape *s, double alpha, const void *A,
                            const void *B, void *C) {
    if (!mica_record_find(s)) {
        mica_product *e = mica_record_add(s);
        if (e) e->pending = 1;
    }
    mica_product_shape shape = *s;
    ::mica_cudasim::detail::enqueue(stream, [=] {
        if (shape.type == MICA_F64) mica_sim_gemm<double, double>(&shape, alpha, (const double *)A, (const double *)B, (double *)C);
        else if (shape.type == MICA_F32) mica_sim_gemm<float, float>(&shape, (float)alpha, (const float *)A, (const float *)B, (float *)C);
        else if (shape.type == MICA_BF16) mica_sim_gemm<mica_bf16, float>(&shape, (float)alpha, (const mica_bf16 *)A,
                                                                          (const mica_bf16 *)B, (mica_bf16 *)C);
        else if (shape.type == MICA_F16)
            mica_sim_gemm<mica_f16, float>(&shape, (float)alpha, (const mica_f16 *)A, (const mica_f16 *)B, (mica_f16 *)C);
        else if (shape.type == MICA_BF16_F32)
            mica_sim_gemm<mica_bf16, float>(&shape, (float)alpha, (const mica_bf16 *)A, (const mica_bf16 *)B, (float *)C);
        else mica_sim_gemm<mica_f16, float>(&shape, (float)alpha, (const mica_f16 *)A, (const mica_f16 *)B, (float *)C);
    });
    return 0;
}

static int mica_product_time(mica_product *e) { /* one routine: nothing to choose */
    memset(e->algo, 0, sizeof e->algo);
    e->us = 0;
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
        if (cudaMalloc(&lt.workspace, lt.workspace_bytes) != cudaSuccess) {
            cublasLtDestroy(lt.handle);
            lt.handle = 0;
            return 0;
        }
    }
    return &lt;
}

/* cuBLASLt's handle and workspace and the record, before a capture (no allocation inside one) */
static int mica_products_ready(void) {
    if (!mica_lt_get()) {
        snprintf(mica_error_text, sizeof mica_error_text, "cuBLASLt could not start on this GPU");
        return 0;
    }
    if (!mica_record.loaded) {
        const char *path = getenv("MICA_PRODUCTS");
        if (path && *path) mica_record_read(path);
        mica_record.loaded = 1;
    }
    return 1;
}

typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
} mica_lt_problem;

static int mica_lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                          int64_t stride, int64_t count) {
    int32_t n = (int32_t)count;
    if (cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld) != CUBLAS_STATUS_SUCCESS) return 0;
    return count == 1 ||
           (cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) ==
                CUBLAS_STATUS_SUCCESS);
}

static void mica_lt_release(mica_lt_problem *p) {
    if (p->pref) cublasLtMatmulPreferenceDestroy(p->pref);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

static int mica_lt_describe(mica_lt *lt, const mica_product_shape *s, mica_lt_problem *p) {
    const int f64 = s->type == MICA_F64;
    cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : s->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F; /* (alpha's type: float for every type but double) */
    cudaDataType_t type = f64                                                ? CUDA_R_64F
                          : s->type == MICA_BF16 || s->type == MICA_BF16_F32 ? CUDA_R_16BF
                          : s->type == MICA_F16 || s->type == MICA_F16_F32   ? CUDA_R_16F
                                                                             : CUDA_R_32F;
    cudaDataType_t ctype = s->type >= MICA_BF16_F32 ? CUDA_R_32F : type; /* (half operands, float32 C) */
    cublasOperation_t opb = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t M = s->M, N = s->N, K = s->K;
    memset(p, 0, sizeof *p);
    int ok = cublasLtMatmulDescCreate(&p->desc, compute, scale) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa) == CUBLAS_STATUS_SUCCESS &&
             /* stored column-major: B as (tb ? K : N) x (tb ? N : K), A as (ta ? M : K) x (ta ? K : M) */
             mica_lt_layout(&p->lb, type, s->tb ? K : N, s->tb ? N : K, s->ldb, s->sb, s->count) &&
             mica_lt_layout(&p->la, type, s->ta ? M : K, s->ta ? K : M, s->lda, s->sa, s->count) &&
             mica_lt_layout(&p->lc, ctype, N, M, s->ldc, s->sc, s->count) &&
             cublasLtMatmulPreferenceCreate(&p->pref) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt->workspace_bytes,
                                                  sizeof lt->workspace_bytes) == CUBLAS_STATUS_SUCCESS;
    /* the routines must take the operands' real alignment (views start inside buffers: heads, q/k/v);
     * cuBLASLt's A is Mica's B (the column-major trick) */
    uint32_t al[4] = {(uint32_t)s->align_b, (uint32_t)s->align_a, (uint32_t)s->align_c, (uint32_t)s->align_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; ok && i < 4; i++)
        ok = cublasLtMatmulPreferenceSetAttribute(p->pref, which[i], &al[i], sizeof al[i]) == CUBLAS_STATUS_SUCCESS;
    if (!ok) mica_lt_release(p);
    return ok;
}

static int mica_lt_matmul(mica_lt *lt, mica_lt_problem *p, const cublasLtMatmulAlgo_t *algo, int f64, double alpha,
                          const void *A, const void *B, void *C, cudaStream_t stream) {
    const float alpha32 = (float)alpha, zero32 = 0.0f;
    const double zero64 = 0.0;
    const void *pa = f64 ? (const void *)&alpha : (const void *)&alpha32;
    const void *pz = f64 ? (const void *)&zero64 : (const void *)&zero32;
    return cublasLtMatmul(lt->handle, p->desc, pa, B, p->lb, A, p->la, pz, C, p->lc, C, p->lc, algo, lt->workspace,
                          lt->workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
}

static int mica_product_run(cudaStream_t stream, const mica_product_shape *s, double alpha, const void *A,
                            const void *B, void *C) {
    mica_lt *lt = mica_lt_get();
    mica_lt_problem p;
    if (!lt || !mica_lt_describe(lt, s, &p)) {
        snprintf(mica_error_text, sizeof mica_error_text, "cuBLASLt could not describe a %lld x %lld x %lld product",
                 (long long)s->M, (long long)s->N, (long long)s->K);
        return 1;
    }
    mica_product *e = mica_record_find(s);
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulHeuristicResult_t check;
    int ok = 0;
    if (e && !e->pending) { /* the recorded routine, if cuBLASLt still takes it for this problem */
        memcpy(&algo, e->algo, sizeof algo);
        ok = cublasLtMatmulAlgoCheck(lt->handle, p.desc, p.lb, p.la, p.lc, p.lc, &algo, &check) == CUBLAS_STATUS_SUCCESS;
        if (!ok) e->pending = 1; /* (a damaged or stale entry: timed again after this capture) */
    }
    if (!ok) { /* cuBLASLt's first choice, until the shape is timed */
        int found = 0;
        ok = cublasLtMatmulAlgoGetHeuristic(lt->handle, p.desc, p.lb, p.la, p.lc, p.lc, p.pref, 1, &check, &found) ==
                 CUBLAS_STATUS_SUCCESS && found == 1;
        if (ok) algo = check.algo;
        if (ok && !e && (e = mica_record_add(s)) != 0) e->pending = 1;
    }
    ok = ok && mica_lt_matmul(lt, &p, &algo, s->type == MICA_F64, alpha, A, B, C, stream);
    mica_lt_release(&p);
    if (!ok) {
        snprintf(mica_error_text, sizeof mica_error_text, "cuBLASLt could not compute a %lld x %lld x %lld product",
                 (long long)s->M, (long long)s->N, (long long)s->K);
        return 1;
    }
    return 0;
}

/* elements a row-major operand spans: `count` matrices `stride` apart, `rows` rows `ld` apart */
static int64_t mica_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t count) {
    return (count - 1) * stride + (rows - 1) * ld + cols;
}

/* time cuBLASLt's candidates for one shape on scratch buffers (never the program's memory) */
static int mica_product_time(mica_product *e) {
    const mica_product_shape *s = &e->shape;
    mica_lt *lt = mica_lt_get();
    mica_lt_problem p;
    size_t size = (size_t)mica_type_size(s->type);
    const int f64 = s->type == MICA_F64;
    int64_t na = mica_span(s->ta ? s->K : s->M, s->ta ? s->M : s->K, s->lda, s->sa, s->count);
    int64_t nb = mica_span(s->tb ? s->N : s->K, s->tb ? s->K : s->N, s->ldb, s->sb, s->count);
    int64_t nc = mica_span(s->M, s->N, s->ldc, s->sc, s->count);
    void *A = 0, *B = 0, *C = 0;
    cudaEvent_t t0 = 0, t1 = 0;
    cublasLtMatmulHeuristicResult_t cand[8];
    int found = 0, best = -1;
    float best_ms = 0;
    int described = lt && mica_lt_describe(lt, s, &p);
    int ok = described &&
             cublasLtMatmulAlgoGetHeuristic(lt->handle, p.desc, p.lb, p.la, p.lc, p.lc, p.pref, 8, cand, &found) ==
                 CUBLAS_STATUS_SUCCESS;
    int room = ok && cudaMalloc(&A, (size_t)na * size) == cudaSuccess && cudaMalloc(&B, (size_t)nb * size) == cudaSuccess &&
               cudaMalloc(&C, (size_t)nc * mica_c_size(s->type)) == cudaSuccess && cudaMemset(A, 0, (size_t)na * size) == cudaSuccess &&
               cudaMemset(B, 0, (size_t)nb * size) == cudaSuccess && cudaEventCreate(&t0) == cudaSuccess &&
               cudaEventCreate(&t1) == cudaSuccess;
    if (ok && !room) { /* no room to time on scratch (the arenas hold the card): cuBLASLt's first choice, untimed */
        for (int c = 0; best < 0 && c < found; c++)
            if (cand[c].state == CUBLAS_STATUS_SUCCESS) best = c, best_ms = -0.005f;
        ok = 0;
    }
    for (int c = 0; ok && c < found; c++) {
        if (cand[c].state != CUBLAS_STATUS_SUCCESS) continue;
        if (!mica_lt_matmul(lt, &p, &cand[c].algo, f64, 1.0, A, B, C, 0)) continue; /* (warm-up) */
        int good = cudaEventRecord(t0, 0) == cudaSuccess;
        for (int r = 0; good && r < 5; r++) good = mica_lt_matmul(lt, &p, &cand[c].algo, f64, 1.0, A, B, C, 0);
        float ms = 0;
        good = good && cudaEventRecord(t1, 0) == cudaSuccess && cudaEventSynchronize(t1) == cudaSuccess &&
               cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess;
        if (good && (best < 0 || ms < best_ms)) best = c, best_ms = ms;
    }
    cudaGetLastError(); /* (a candidate that failed leaves no error behind) */
    if (best >= 0) {
        memcpy(e->algo, &cand[best].algo, sizeof e->algo);
        e->us = best_ms * 1000.0 / 5;
    }
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(A), cudaFree(B), cudaFree(C);
    cudaGetLastError(); /* (nor does a failed allocation) */
    if (described) mica_lt_release(&p);
    if (best < 0) {
        snprintf(mica_error_text, sizeof mica_error_text, "cuBLASLt has no routine for a %lld x %lld x %lld product",
                 (long long)s->M, (long long)s->N, (long long)s->K);
        return 1;
    }
    return 0;
}
#endif

/* the largest power of two up to 256 that the start of every row and every matrix is a multiple of */
static int mica_alignment(const void *p, int64_t ld_bytes, int64_t stride_bytes) {
    int a = 256;
    while (a > 1 && ((uintptr_t)p % a || ld_bytes % a || stride_bytes % a)) a /= 2;
    return a;
}

/* C[M,N] = alpha op(A) op(B) for `count` matrices, the i-th at A + i*sa, B + i*sb, C + i*sc
 * (strides in elements), all of one element type (MICA_F32, MICA_F64, MICA_BF16, MICA_F16) */
static int mica_gemm_batched(cudaStream_t stream, int64_t M, int64_t N, int64_t K, int type, double alpha,
                             const void *A, int64_t lda, int ta, int64_t sa, const void *B, int64_t ldb, int tb,
                             int64_t sb, void *C, int64_t ldc, int64_t sc, int64_t count) {
    mica_product_shape s;
    memset(&s, 0, sizeof s);
    s.M = M, s.N = N, s.K = K, s.lda = lda, s.ldb = ldb, s.ldc = ldc, s.ta = ta, s.tb = tb, s.type = type;
    s.sa = count > 1 ? sa : 0, s.sb = count > 1 ? sb : 0, s.sc = count > 1 ? sc : 0, s.count = count;
    s.tf32 = type == MICA_F32 ? MICA_TF32_ON : 0;
    const int64_t size = mica_type_size(type);
    s.align_a = mica_alignment(A, lda * size, s.sa * size);
    s.align_b = mica_alignment(B, ldb * size, s.sb * size);
    s.align_c = mica_alignment(C, ldc * mica_c_size(type), s.sc * mica_c_size(type));
    return mica_product_run(stream, &s, alpha, A, B, C);
}

#define MICA_DEFINE_GEMM(T, TC, ALPHA, S, TYPE)                                                    \
static int mica_gemm_##S##_batched(cudaStream_t stream, int64_t M, int64_t N, int64_t K, ALPHA alpha, const T *A, \
                                   int64_t lda, int ta, int64_t sa, const T *B, int64_t ldb, int tb, int64_t sb, \
                                   TC *C, int64_t ldc, int64_t sc, int64_t count) {                \
    return mica_gemm_batched(stream, M, N, K, TYPE, alpha, A, lda, ta, sa, B, ldb, tb, sb, C, ldc, sc, count); \
}                                                                                                  \
/* one product C[M,N] = op(A) op(B), row-major with leading dimensions */                          \
static int mica_gemm_##S(cudaStream_t stream, int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, int ta, \
                         const T *B, int64_t ldb, int tb, TC *C, int64_t ldc) {                    \
    return mica_gemm_batched(stream, M, N, K, TYPE, 1.0, A, lda, ta, 0, B, ldb, tb, 0, C, ldc, 0, 1); \
}
MICA_DEFINE_GEMM(float, float, float, f32, MICA_F32)
MICA_DEFINE_GEMM(double, double, double, f64, MICA_F64)
MICA_DEFINE_GEMM(mica_bf16, mica_bf16, float, bf16, MICA_BF16)
MICA_DEFINE_GEMM(mica_f16, mica_f16, float, f16, MICA_F16)
MICA_DEFINE_GEMM(mica_bf16, float, float, bf16_f32, MICA_BF16_F32) /* (half operands, their sums in float32) */
MICA_DEFINE_GEMM(mica_f16, float, float, f16_f32, MICA_F16_F32)

/* ---- the step as one CUDA graph ------------------------------------------------------------- */
typedef int (*mica_steps)(char *A, cudaStream_t stream);

static int mica_capture_once(cudaStream_t stream, char *A, mica_steps steps, cudaGraphExec_t *exec) {
    cudaGraph_t g = 0;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return mica_cuda_failed("capturing the program as a graph");
    mica_launches_begin();
    int bad = steps(A, stream);
    cudaError_t e = cudaStreamEndCapture(stream, &g);
    if (!bad && mica_launches_failed()) bad = 2;
    if (bad) {
        if (g) cudaGraphDestroy(g);
        return bad;
    }
    if (e != cudaSuccess || cudaGraphInstantiate(exec, g, 0) != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return mica_cuda_failed("capturing the program as a graph");
    }
    cudaGraphDestroy(g);
    return 0;
}

/* ---- MICA_PROFILE: one run's time by kernel ------------------------------------------------------
 * With MICA_PROFILE=<file> in the environment, each program's MICA_PROFILE_RUN-th run (default the
 * 3rd: after the capture and the first replays) is enqueued without its graph, with an event recorded
 * after each kernel or host call (MICA_MARK in mica_enqueue), and each one's time, from the mark
 * before it to its own, is appended to the file as "<program> k<N> <microseconds>" lines (a host
 * call's parts, MICA_PART, as "k<N>.<part>"). That run
 * computes what the graph does (the same kernels in the same order), so training goes on unchanged;
 * its times include the gaps of launching one kernel at a time, which the graph does not have. */
#define MICA_PROFILE_MAX 8192
static int mica_profiling, mica_profile_n;
static int mica_profile_k[MICA_PROFILE_MAX];
static cudaEvent_t mica_profile_event[MICA_PROFILE_MAX];

static void mica_profile_mark(cudaStream_t stream, int k) {
    if (mica_profile_n >= MICA_PROFILE_MAX) return;
    cudaEvent_t *e = &mica_profile_event[mica_profile_n];
    if ((!*e && cudaEventCreate(e) != cudaSuccess) || cudaEventRecord(*e, stream) != cudaSuccess) return;
    mica_profile_k[mica_profile_n++] = k;
}
#define MICA_MARK(stream, k) (mica_profiling ? mica_profile_mark((stream), (k)) : (void)0)
/* the end of part `part` (1, 2, ...) of a host call's work (its products and kernels), marked inside
 * it: the profile names that time "k<N>.<part>", N the host call's kernel */
#define MICA_PART(stream, part) (mica_profiling ? mica_profile_mark((stream), -1000 - (part)) : (void)0)

/* whether a program's run number `run` (from 1) is the one MICA_PROFILE times */
static int mica_profile_due(long run) {
    const char *path = getenv("MICA_PROFILE"), *at = getenv("MICA_PROFILE_RUN");
    return path && *path && run == (at && atol(at) > 0 ? atol(at) : 3);
}

/* one run of `steps`, timed kernel by kernel into $MICA_PROFILE (a file that cannot be written is
 * said on stderr; the run itself still counts) */
static int mica_profile_run(const char *program, cudaStream_t stream, char *A, mica_steps steps) {
    mica_profile_n = 0;
    mica_profiling = 1;
    mica_profile_mark(stream, -1);
    mica_launches_begin();
    int bad = steps(A, stream);
    mica_profiling = 0;
    if (bad) return 1;
    if (mica_launches_failed()) return 2;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return mica_cuda_failed("running the program");
    const char *path = getenv("MICA_PROFILE");
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "mica: cannot write the profile to %s; set MICA_PROFILE to a writable file\n", path);
        return 0;
    }
    for (int i = 1; i < mica_profile_n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, mica_profile_event[i - 1], mica_profile_event[i]) != cudaSuccess) ms = -1;
        const int k = mica_profile_k[i];
        if (k > -1000) {
            fprintf(f, "%s k%d %.3f\n", program, k, ms * 1e3);
            continue;
        }
        int owner = -1; /* (a part belongs to the host call whose own mark comes next) */
        for (int j = i + 1; j < mica_profile_n && owner < 0; j++)
            if (mica_profile_k[j] > -1000) owner = mica_profile_k[j];
        fprintf(f, "%s k%d.%d %.3f\n", program, owner, -1000 - k, ms * 1e3);
    }
    fclose(f);
    return 0;
}

/* capture; when a product shape was new, time it, keep it in the record and capture again */
static int mica_capture(cudaStream_t stream, char *A, mica_steps steps, cudaGraphExec_t *exec) {
    if (!mica_products_ready() || mica_capture_once(stream, A, steps, exec) != 0) return 1;
    int timed = 0;
    for (int i = 0; i < mica_record.n; i++) {
        mica_product *e = &mica_record.p[i];
        if (!e->pending) continue;
        if (mica_product_time(e) != 0) return 1;
        e->pending = 0;
        timed++;
    }
    if (!timed) return 0;
    mica_record_write();
    cudaGraphExecDestroy(*exec);
    *exec = 0;
    return mica_capture_once(stream, A, steps, exec);
}
#endif
