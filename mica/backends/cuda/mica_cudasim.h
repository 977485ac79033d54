/* mica_cudasim.h: CUDA C source, compiled unchanged by g++, runs on the CPU.
 *
 * One source, two compilers. Under nvcc (__CUDACC__) this header only includes cuda_runtime.h
 * and defines the three macros below as CUDA syntax. Under any other C++17 compiler it defines
 * MICA_CUDASIM and the subset of CUDA's programming model that hand-written and generated Mica
 * kernels use, so CI without a GPU runs the very kernels the card will run.
 *
 *   MICA_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)   the only launch syntax:
 *       nvcc: kernel<<<grid, block, shared_bytes, stream>>>(args...); here: a call into the
 *       scheduler. A template kernel with a comma goes in parentheses: MICA_LAUNCH((k<float, 4>), ...)
 *   MICA_EXTERN_SHARED(type, name)           dynamic shared memory (nvcc: extern __shared__ type name[])
 *                                            sized by the launch's shared_bytes. `extern __shared__`
 *                                            itself cannot work here (an array name cannot be bound
 *                                            to a per-launch buffer): it fails to link.
 *   MICA_SHARED_ARRAY(type, name, count)     __shared__ type name[count]; with MICA_CUDASIM_RACECHECK
 *                                            defined, the simulator checks every access for races.
 *
 * Execution model. Each CUDA thread is a fiber (Boost.Context's fcontext fibers, user-space register
 * switches; measured by cudasim_switch_bench.cpp on these machines: a scheduler-fiber round trip
 * ~15 ns against ~700 ns for ucontext's swapcontext, which makes a sigprocmask system call per
 * switch, and starting a fiber ~35-60 ns against ~700-900 ns; Debian's libboost_context is built
 * for fcontext only, so BOOST_USE_UCONTEXT does not link). All fibers of one block run on one
 * OS thread, round robin, each until it reaches a barrier, a warp exchange or its end. Blocks are
 * claimed from an atomic counter by a pool of OS threads (MICA_CUDASIM_THREADS, default: the
 * machine's cores) and each runs to completion before its OS thread takes the next. Launches are
 * synchronous; streams, events and graphs are host bookkeeping.
 *
 * __shared__ is `thread_local`: at block scope thread_local implies static storage, one instance
 * per OS thread, and an OS thread runs one block at a time, so each block sees its own instance,
 * shared by its fibers (fibers never migrate between OS threads). `__shared__ float tile[256];`
 * inside a kernel therefore works unchanged. Like the GPU's, its contents are garbage when a block
 * starts (the previous block's values).
 *
 * Checked, each an abort with one line on stderr ("mica_cudasim: ..."):
 *   - a divergent barrier: the threads of a block wait at __syncthreads at different call sites
 *     (__syncthreads is a macro passing __FILE__/__LINE__; two calls on one source line count as
 *     one site, a __device__ function's barrier is one site for every caller);
 *   - a barrier reached after some threads of the block exited;
 *   - warp exchanges (__shfl*_sync, votes, __syncwarp): every lane named in the mask must reach
 *     the same intrinsic at the same site with the same mask; a lane in the mask that has exited,
 *     or a shuffle whose source lane is outside the mask, aborts; a deadlock (lanes of a mask held
 *     at a block barrier) is reported with both sites;
 *   - with MICA_CUDASIM_RACECHECK, arrays declared with MICA_SHARED_ARRAY record per element the
 *     last writer and readers with their barrier epoch; a read of another thread's write, or a
 *     write over another thread's read or write, with no __syncthreads between (or __syncwarp,
 *     within a warp) aborts. Because a block's fibers run one after another until a barrier, a
 *     missing __syncthreads shows up as a write after another thread's read in the same epoch.
 *   - out-of-bounds accesses: build with -fsanitize=address (fiber switches are annotated for
 *     ASan; cudaMalloc and the dynamic shared buffer are exactly the bytes asked for). ASan does
 *     not instrument thread_local arrays, so an overrun of a static __shared__ array is caught only
 *     when it is declared with MICA_SHARED_ARRAY under MICA_CUDASIM_RACECHECK (bounds-checked).
 *
 * Not simulated: a kernel that spins on another thread's write without a barrier hangs (fibers are
 * not preempted; the GPU gives no such guarantee either, across blocks), dynamic parallelism,
 * cooperative groups, half-precision intrinsics, textures, tensor cores other than wmma's TF32 m16n16k8
 * (below). The race check covers 1-D arrays
 * declared with MICA_SHARED_ARRAY (a proxy element: pass a value, not tile[i], to a template).
 * Environment: MICA_CUDASIM_THREADS (OS threads running blocks), MICA_CUDASIM_TF32 (below), MICA_CUDASIM_STACK_KB (each
 * CUDA thread's stack, 128 KiB, 512 under ASan; an overflow hits a guard page, SIGSEGV).
 *
 * Numerics. Mica's kernels are built with no FMA contraction (nvcc --fmad=false, g++
 * -ffp-contract=off), no fast-math, and use Mica's own math functions (cstyle/mica_math.h,
 * MICA_HD: plain float arithmetic, no libm), and sums in one fixed order independent of the launch
 * configuration. Every float operation then rounds as written on both sides, so a Mica kernel
 * gives the same bits on a GPU as in this simulator (cuBLASLt products aside). Device intrinsics
 * whose GPU result is approximate cannot match: __expf, __fdividef, __logf, __sinf, __cosf,
 * __powf are refused at compile time here; rsqrtf is defined as 1.0f / sqrtf(x), which is NOT the
 * GPU's approximate rsqrtf, so a kernel that must give the same bits must not call rsqrtf
 * (write 1.0f / sqrtf(x): two correctly rounded operations on both, nvcc's defaults being
 * --prec-div=true --prec-sqrt=true). The __f*_rn intrinsics are exact IEEE operations and are
 * provided. Library calls (expf, logf, and the double versions) are glibc's here and libdevice's
 * on the card, so their bits may differ: Mica's kernels call mica_math.h instead.
 *
 * Build: g++ -x c++ -std=c++17 -O1 -ffp-contract=off file.cu -lboost_context -pthread
 */
#ifndef MICA_CUDASIM_H
#define MICA_CUDASIM_H

#ifdef __CUDACC__
/* ------------------------------------------------------------------------------------ nvcc */
#include <cuda_runtime.h>
#define MICA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define MICA_EXTERN_SHARED(type, name) extern __shared__ __align__(128) type name[]
#define MICA_SHARED_ARRAY(type, name, count) __shared__ type name[count]

#else
/* ------------------------------------------------------------------------------- simulator */
#define MICA_CUDASIM 1

#if defined(__SANITIZE_ADDRESS__)
#define MICA_CUDASIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MICA_CUDASIM_ASAN 1
#endif
#endif

#include <boost/context/fiber.hpp>
#if MICA_CUDASIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

/* ---- qualifiers --------------------------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __shared__ thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
/* __restrict__ is already a g++ keyword */

/* ---- vector types ------------------------------------------------------------------------- */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
#define MICA_VEC2(T, N) struct alignas(2 * sizeof(T)) N { T x, y; }; \
    static inline N make_##N(T x, T y) { return N{x, y}; }
#define MICA_VEC4(T, N) struct alignas(4 * sizeof(T) > 16 ? 16 : 4 * sizeof(T)) N { T x, y, z, w; }; \
    static inline N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }
MICA_VEC2(float, float2) MICA_VEC4(float, float4) MICA_VEC2(int, int2) MICA_VEC4(int, int4)
MICA_VEC2(unsigned int, uint2) MICA_VEC4(unsigned int, uint4) MICA_VEC2(double, double2)
#undef MICA_VEC2
#undef MICA_VEC4
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

constexpr int warpSize = 32;

/* ---- host API types (numbers as in CUDA's driver_types.h) --------------------------------- */
enum cudaError_t {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9, cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400, cudaErrorIllegalState = 401, cudaErrorNotReady = 600,
    cudaErrorStreamCaptureUnsupported = 900, cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903, cudaErrorStreamCaptureWrongThread = 908
};
typedef cudaError_t cudaError;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
                               cudaStreamCaptureStatusInvalidated = 2 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
    int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    int multiProcessorCount, major, minor, l2CacheSize, maxThreadsPerMultiProcessor;
    int clockRate, memoryClockRate, memoryBusWidth, concurrentKernels, integrated;
};

namespace mica_cudasim {

/* ---- failure: one line, then abort ---------------------------------------------------------- */
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    static std::atomic<bool> failing{false};
    if (failing.exchange(true))  /* another OS thread is already reporting: one line, one abort */
        for (;;) pause();
    fprintf(stderr, "mica_cudasim: %s\n", line);
    fflush(stderr);
    abort();
}

namespace detail {

namespace ctx = boost::context;

enum class Wait : uint8_t { Run, Barrier, Warp, Done };
enum class WarpOp : uint8_t { SyncWarp, ShflIdx, ShflUp, ShflDown, ShflXor, All, Any, Ballot };

inline const char* warp_op_name(WarpOp op) {
    switch (op) {
    case WarpOp::SyncWarp: return "__syncwarp";
    case WarpOp::ShflIdx: return "__shfl_sync";
    case WarpOp::ShflUp: return "__shfl_up_sync";
    case WarpOp::ShflDown: return "__shfl_down_sync";
    case WarpOp::ShflXor: return "__shfl_xor_sync";
    case WarpOp::All: return "__all_sync";
    case WarpOp::Any: return "__any_sync";
    case WarpOp::Ballot: return "__ballot_sync";
    }
    return "?";
}

struct Thread {
    ctx::fiber fib;
    uint3 idx;
    unsigned linear;
    Wait wait = Wait::Run;
    const char* what = nullptr;  /* the intrinsic it waits in */
    const char* file = nullptr;
    int line = 0;
    WarpOp op = WarpOp::SyncWarp;
    unsigned mask = 0;
    int arg = 0, width = 32;
    uint64_t value = 0, result = 0;
    ctx::stack_context stack{};
#if MICA_CUDASIM_ASAN
    void* fake_stack = nullptr;
#endif
};

/* Fiber stacks: mmap'd with a guard page below, kept per OS thread and reused by every block. */
struct StackPool {
    size_t size;
    std::vector<ctx::stack_context> free_list;
    StackPool() {
        const char* env = getenv("MICA_CUDASIM_STACK_KB");
        size_t kb = env ? strtoul(env, nullptr, 10) : 0;
#if MICA_CUDASIM_ASAN
        if (kb == 0) kb = 512;
#else
        if (kb == 0) kb = 128;
#endif
        size = kb * 1024;
    }
    ~StackPool() {
        for (auto& sc : free_list) munmap(static_cast<char*>(sc.sp) - sc.size - 4096, sc.size + 4096);
    }
    ctx::stack_context get() {
        if (!free_list.empty()) {
            ctx::stack_context sc = free_list.back();
            free_list.pop_back();
            return sc;
        }
        void* p = mmap(nullptr, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fail("cannot map a %zu KiB fiber stack", size / 1024);
        mprotect(p, 4096, PROT_NONE);
        ctx::stack_context sc;
        sc.size = size;
        sc.sp = static_cast<char*>(p) + 4096 + size;
        return sc;
    }
    void put(ctx::stack_context& sc) {
#if MICA_CUDASIM_ASAN
        __asan_unpoison_memory_region(static_cast<char*>(sc.sp) - sc.size, sc.size);
#endif
        free_list.push_back(sc);
    }
};

inline StackPool& stack_pool() {
    static thread_local StackPool pool;
    return pool;
}

/* The fiber is built on a stack taken from the pool beforehand (preallocated), so the scheduler
 * knows its bounds for ASan; when the fiber ends, boost hands the stack back here. */
struct PoolAlloc {
    ctx::stack_context allocate() { return stack_pool().get(); }
    void deallocate(ctx::stack_context& sc) noexcept { stack_pool().put(sc); }
};

struct Block;

/* What a fiber sees as its CUDA coordinates: set by the scheduler before every resume. */
inline thread_local uint3 tl_thread_idx;
inline thread_local uint3 tl_block_idx;
inline thread_local dim3 tl_block_dim;
inline thread_local dim3 tl_grid_dim;
inline thread_local Thread* tl_thread = nullptr;
inline thread_local Block* tl_block = nullptr;
inline thread_local void* tl_dynamic_shared = nullptr;
inline thread_local uint64_t tl_block_serial = 0;  /* counts blocks run on this OS thread */

struct Block {
    const char* kernel;
    std::vector<Thread> threads;
    unsigned n = 0, live = 0, at_barrier = 0;
    std::vector<unsigned> warp_waiting;
    std::vector<uint32_t> warp_epoch;  /* advanced by __syncwarp and barriers (race check) */
    uint32_t epoch = 0;                /* advanced by every block barrier (race check) */
    const std::function<void()>* body = nullptr;
    ctx::fiber sched;
#if MICA_CUDASIM_ASAN
    const void* sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
};


/* ---- the block scheduler ------------------------------------------------------------------ */
inline void thread_coords(unsigned linear, unsigned& x, unsigned& y, unsigned& z) {
    x = linear % tl_block_dim.x;
    y = (linear / tl_block_dim.x) % tl_block_dim.y;
    z = linear / (tl_block_dim.x * tl_block_dim.y);
}

/* "thread (x,y,z)" for messages; a small ring of buffers so one message can name several */
inline const char* thread_name(unsigned linear) {
    static thread_local char ring[4][48];
    static thread_local unsigned next = 0;
    char* s = ring[next++ % 4];
    unsigned x, y, z;
    thread_coords(linear, x, y, z);
    snprintf(s, 48, "thread (%u,%u,%u)", x, y, z);
    return s;
}

inline const char* block_name() {
    static thread_local char s[160];
    snprintf(s, sizeof s, "%s block (%u,%u,%u)", tl_block ? tl_block->kernel : "?", tl_block_idx.x,
             tl_block_idx.y, tl_block_idx.z);
    return s;
}

inline bool same_site(const Thread& a, const Thread& b) {
    return a.line == b.line && (a.file == b.file || strcmp(a.file, b.file) == 0) &&
           (a.what == b.what || strcmp(a.what, b.what) == 0);
}

inline void fiber_yield(Thread* t) {
    Block* b = tl_block;
#if MICA_CUDASIM_ASAN
    __sanitizer_start_switch_fiber(&t->fake_stack, b->sched_bottom, b->sched_size);
#endif
    b->sched = std::move(b->sched).resume();
#if MICA_CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(t->fake_stack, &b->sched_bottom, &b->sched_size);
#else
    (void)t;
#endif
}

inline void start_fiber(Block& b, Thread& t) {
    t.stack = stack_pool().get();
    Block* bp = &b;
    Thread* tp = &t;
    t.fib = ctx::fiber(std::allocator_arg, ctx::preallocated(t.stack.sp, t.stack.size, t.stack), PoolAlloc{},
                       [bp, tp](ctx::fiber&& sched) -> ctx::fiber {
#if MICA_CUDASIM_ASAN
                           __sanitizer_finish_switch_fiber(nullptr, &bp->sched_bottom, &bp->sched_size);
#endif
                           bp->sched = std::move(sched);
                           (*bp->body)();
                           tp->wait = Wait::Done;
                           bp->live--;
#if MICA_CUDASIM_ASAN
                           __sanitizer_start_switch_fiber(nullptr, bp->sched_bottom, bp->sched_size);
#endif
                           return std::move(bp->sched);
                       });
}

inline void resume(Thread& t) {
    tl_thread = &t;
    tl_thread_idx = t.idx;
#if MICA_CUDASIM_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, static_cast<char*>(t.stack.sp) - t.stack.size, t.stack.size);
#endif
    t.fib = std::move(t.fib).resume();
#if MICA_CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    tl_thread = nullptr;
}

inline void release_barrier(Block& b) {
    const Thread* first = nullptr;
    int count = 0;
    for (unsigned i = 0; i < b.n; ++i) {
        const Thread& t = b.threads[i];
        if (t.wait != Wait::Barrier) continue;
        if (!first) first = &t;
        else if (!same_site(*first, t))
            fail("divergent barrier in %s: %s waits at %s at %s:%d, %s at %s at %s:%d", block_name(),
                 thread_name(first->linear), first->what, first->file, first->line, thread_name(t.linear), t.what,
                 t.file, t.line);
        count += t.value != 0;
    }
    if (b.live != b.n) {
        unsigned gone = 0;
        while (b.threads[gone].wait != Wait::Done) ++gone;
        fail("barrier reached after some threads exited in %s: %u of %u threads wait at %s at %s:%d, %s and %u "
             "others have returned",
             block_name(), b.live, b.n, first->what, first->file, first->line, thread_name(gone), b.n - b.live - 1);
    }
    for (unsigned i = 0; i < b.n; ++i) {
        b.threads[i].wait = Wait::Run;
        b.threads[i].result = (uint64_t)count;
    }
    b.at_barrier = 0;
    b.epoch++;
    for (auto& e : b.warp_epoch) e++;
}

inline unsigned lowest_lane(unsigned m) { return (unsigned)__builtin_ctz(m); }

/* Resolve every group of lanes of warp w whose whole mask has arrived at a warp exchange. */
inline bool resolve_warp(Block& b, unsigned w) {
    const unsigned base = w * 32, lanes = std::min(32u, b.n - base);
    const unsigned exist = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    bool progress = false;
    for (unsigned l = 0; l < lanes; ++l) {
        Thread& a = b.threads[base + l];
        if (a.wait != Wait::Warp) continue;
        const unsigned m = a.mask & exist;
        if (!((m >> l) & 1u))
            fail("%s at %s:%d in %s: lane %u (%s) is not in its own mask 0x%08x", a.what, a.file, a.line,
                 block_name(), l, thread_name(a.linear), a.mask);
        bool ready = true;
        for (unsigned mm = m; mm; mm &= mm - 1) {
            const unsigned j = lowest_lane(mm);
            const Thread& o = b.threads[base + j];
            if (o.wait == Wait::Done)
                fail("%s at %s:%d in %s: mask 0x%08x names lane %u (%s), which has exited", a.what, a.file, a.line,
                     block_name(), a.mask, j, thread_name(o.linear));
            if (o.wait != Wait::Warp) { ready = false; continue; }
            if (o.op != a.op || o.mask != a.mask || o.width != a.width || !same_site(a, o))
                fail("mismatched warp exchange in %s: lane %u calls %s at %s:%d with mask 0x%08x, lane %u calls %s "
                     "at %s:%d with mask 0x%08x",
                     block_name(), l, a.what, a.file, a.line, a.mask, j, o.what, o.file, o.line, o.mask);
        }
        if (!ready) continue;
        unsigned ballot = 0;
        for (unsigned mm = m; mm; mm &= mm - 1) {
            const unsigned j = lowest_lane(mm);
            if (b.threads[base + j].value != 0) ballot |= 1u << j;
        }
        for (unsigned mm = m; mm; mm &= mm - 1) {
            const unsigned j = lowest_lane(mm);
            Thread& o = b.threads[base + j];
            const unsigned seg = j & ~(unsigned)(o.width - 1), ua = (unsigned)o.arg;
            unsigned src = j;
            switch (o.op) {
            case WarpOp::SyncWarp: break;
            case WarpOp::ShflIdx: src = seg + (ua & (unsigned)(o.width - 1)); break;
            case WarpOp::ShflUp: src = (j >= seg + ua) ? j - ua : j; break;
            case WarpOp::ShflDown: src = (j + ua < seg + (unsigned)o.width) ? j + ua : j; break;
            case WarpOp::ShflXor: src = ((j ^ ua) < seg + (unsigned)o.width) ? (j ^ ua) : j; break;
            case WarpOp::All: o.result = ballot == m; break;
            case WarpOp::Any: o.result = ballot != 0; break;
            case WarpOp::Ballot: o.result = ballot; break;
            }
            if (o.op >= WarpOp::ShflIdx && o.op <= WarpOp::ShflXor) {
                if (!((m >> src) & 1u)) {
                    if (src >= lanes)
                        fail("%s at %s:%d in %s: lane %u (%s) reads lane %u, which does not exist (the block has "
                             "%u threads)", o.what, o.file, o.line, block_name(), j, thread_name(o.linear), src, b.n);
                    fail("%s at %s:%d in %s: lane %u (%s) reads lane %u, which is not in the mask 0x%08x%s", o.what,
                         o.file, o.line, block_name(), j, thread_name(o.linear), src, o.mask,
                         b.threads[base + src].wait == Wait::Done ? " and has exited" : "");
                }
                o.result = b.threads[base + src].value;
            }
        }
        for (unsigned mm = m; mm; mm &= mm - 1) b.threads[base + lowest_lane(mm)].wait = Wait::Run;
        b.warp_waiting[w] -= (unsigned)__builtin_popcount(m);
        if (a.op == WarpOp::SyncWarp) b.warp_epoch[w]++;
        progress = true;
    }
    return progress;
}

[[noreturn]] inline void report_deadlock(Block& b) {
    for (unsigned i = 0; i < b.n; ++i) {
        const Thread& a = b.threads[i];
        if (a.wait != Wait::Warp) continue;
        const unsigned base = i & ~31u;
        for (unsigned mm = a.mask; mm; mm &= mm - 1) {
            const unsigned j = base + lowest_lane(mm);
            if (j < b.n && b.threads[j].wait == Wait::Barrier)
                fail("deadlock in %s: %s waits in %s at %s:%d with mask 0x%08x, but %s in that mask waits at %s at "
                     "%s:%d", block_name(), thread_name(i), a.what, a.file, a.line, a.mask, thread_name(j),
                     b.threads[j].what, b.threads[j].file, b.threads[j].line);
        }
    }
    fail("deadlock in %s: no thread can proceed", block_name());
}

inline void run_block(Block& b) {
    b.live = b.n;
    b.at_barrier = 0;
    std::fill(b.warp_waiting.begin(), b.warp_waiting.end(), 0u);
    for (unsigned i = 0; i < b.n; ++i) {
        Thread& t = b.threads[i];
        t.wait = Wait::Run;
        t.linear = i;
        thread_coords(i, t.idx.x, t.idx.y, t.idx.z);
    }
    const unsigned nwarps = (unsigned)b.warp_waiting.size();
    for (;;) {
        for (unsigned i = 0; i < b.n; ++i) {
            Thread& t = b.threads[i];
            if (t.wait != Wait::Run) continue;
            if (!t.fib) start_fiber(b, t);
            resume(t);
        }
        if (b.live == 0) return;
        bool progress = false;
        for (unsigned w = 0; w < nwarps; ++w)
            if (b.warp_waiting[w]) progress |= resolve_warp(b, w);
        if (progress) continue;
        if (b.at_barrier == b.live) {
            release_barrier(b);
            continue;
        }
        report_deadlock(b);
    }
}

/* ---- intrinsics that switch fibers -------------------------------------------------------- */
inline Thread* current(const char* what) {
    Thread* t = tl_thread;
    if (!t) fail("%s called outside a kernel", what);
    return t;
}

inline int block_barrier(const char* what, int pred, const char* file, int line) {
    Thread* t = current(what);
    t->wait = Wait::Barrier;
    t->what = what;
    t->file = file;
    t->line = line;
    t->value = pred != 0;
    tl_block->at_barrier++;
    fiber_yield(t);
    return (int)t->result;
}

inline uint64_t warp_exchange(WarpOp op, const char* file, int line, unsigned mask, uint64_t value, int arg,
                              int width) {
    Thread* t = current(warp_op_name(op));
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s at %s:%d: width %d is not a power of 2 from 1 to 32", warp_op_name(op), file, line, width);
    t->wait = Wait::Warp;
    t->op = op;
    t->what = warp_op_name(op);
    t->file = file;
    t->line = line;
    t->mask = mask;
    t->value = value;
    t->arg = arg;
    t->width = width;
    tl_block->warp_waiting[t->linear / 32]++;
    fiber_yield(t);
    return t->result;
}

template <class T>
inline T shfl(WarpOp op, const char* file, int line, unsigned mask, T var, int arg, int width = 32) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "mica_cudasim: shuffles move up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = warp_exchange(op, file, line, mask, bits, arg, width);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

inline unsigned active_mask() {
    Thread* t = current("__activemask");
    Block& b = *tl_block;
    const unsigned base = t->linear & ~31u, lanes = std::min(32u, b.n - base);
    unsigned m = 0;
    for (unsigned j = 0; j < lanes; ++j)
        if (b.threads[base + j].wait != Wait::Done) m |= 1u << j;
    return m;
}

inline const uint3& coord_thread() { return tl_thread_idx; }
inline const uint3& coord_block() { return tl_block_idx; }
inline const dim3& coord_block_dim() { return tl_block_dim; }
inline const dim3& coord_grid_dim() { return tl_grid_dim; }

/* ---- the OS thread pool: blocks claimed from an atomic counter ---------------------------- */
struct Pool {
    std::mutex m;
    std::condition_variable cv_work, cv_done;
    std::vector<std::thread> workers;
    bool stop = false;
    uint64_t generation = 0, total = 0;
    unsigned busy = 0, nthreads = 1;
    const std::function<void(uint64_t)>* job = nullptr;
    std::atomic<uint64_t> next{0};
    std::mutex launch_m;  /* launches from several host threads run one at a time */

    Pool() {
        const char* env = getenv("MICA_CUDASIM_THREADS");
        long v = env ? strtol(env, nullptr, 10) : 0;
        nthreads = v > 0 ? (unsigned)v : std::max(1u, std::thread::hardware_concurrency());
    }
    ~Pool() {
        {
            std::lock_guard<std::mutex> lk(m);
            stop = true;
        }
        cv_work.notify_all();
        for (auto& w : workers) w.join();
    }
    void work() {
        for (;;) {
            const uint64_t i = next.fetch_add(1);
            if (i >= total) return;
            (*job)(i);
        }
    }
    void worker() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lk(m);
        for (;;) {
            cv_work.wait(lk, [&] { return stop || generation != seen; });
            if (stop) return;
            seen = generation;
            lk.unlock();
            work();
            lk.lock();
            if (--busy == 0) cv_done.notify_one();
        }
    }
    void run(uint64_t n, const std::function<void(uint64_t)>& fn) {
        std::lock_guard<std::mutex> one_launch(launch_m);
        if (nthreads <= 1 || n <= 1) {
            for (uint64_t i = 0; i < n; ++i) fn(i);
            return;
        }
        std::unique_lock<std::mutex> lk(m);
        while (workers.size() + 1 < nthreads) workers.emplace_back([this] { worker(); });
        job = &fn;
        total = n;
        next = 0;
        busy = (unsigned)workers.size();
        generation++;
        lk.unlock();
        cv_work.notify_all();
        work();
        lk.lock();
        cv_done.wait(lk, [&] { return busy == 0; });
        job = nullptr;
    }
};

inline Pool& pool() {
    static Pool p;
    return p;
}

/* dynamic shared memory: exactly the launch's bytes, so ASan sees an overrun */
struct DynamicShared {
    void* p = nullptr;
    size_t n = 0;
    ~DynamicShared() { free(p); }
    void* get(size_t bytes) {
        if (bytes != n) {
            free(p);
            p = nullptr;
            n = bytes;
            if (bytes && posix_memalign(&p, 128, bytes)) fail("cannot allocate %zu bytes of dynamic shared memory", bytes);
        }
        return p;
    }
};

struct Launch {
    const char* name;
    const void* kernel;
    dim3 grid, block;
    size_t shared_bytes;
    std::function<void()> body;
};

inline thread_local cudaError_t tl_last_error = cudaSuccess;
inline std::mutex g_attr_mutex;
inline std::vector<std::pair<const void*, int>> g_max_dynamic_shared;

inline size_t max_dynamic_shared(const void* kernel) {
    std::lock_guard<std::mutex> lk(g_attr_mutex);
    for (auto& kv : g_max_dynamic_shared)
        if (kv.first == kernel) return (size_t)kv.second;
    return 48 * 1024;
}

inline void run_grid(const Launch& L) {
    if (tl_thread) fail("kernel %s launched from inside a kernel (dynamic parallelism is not simulated)", L.name);
    const uint64_t nthreads = (uint64_t)L.block.x * L.block.y * L.block.z;
    const uint64_t nblocks = (uint64_t)L.grid.x * L.grid.y * L.grid.z;
    if (nthreads == 0 || nthreads > 1024 || L.block.x > 1024 || L.block.y > 1024 || L.block.z > 64 || nblocks == 0 ||
        L.grid.x > 0x7fffffffu || L.grid.y > 65535 || L.grid.z > 65535 || L.shared_bytes > max_dynamic_shared(L.kernel)) {
        tl_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    const dim3 grid = L.grid, block = L.block;
    const size_t shared_bytes = L.shared_bytes;
    const char* name = L.name;
    const std::function<void()>* body = &L.body;
    std::function<void(uint64_t)> one_block = [=](uint64_t bl) {
        static thread_local Block blk;
        static thread_local DynamicShared dyn;
        tl_block_dim = block;
        tl_grid_dim = grid;
        tl_block_idx = uint3{(unsigned)(bl % grid.x), (unsigned)((bl / grid.x) % grid.y),
                             (unsigned)(bl / ((uint64_t)grid.x * grid.y))};
        tl_dynamic_shared = dyn.get(shared_bytes);
        tl_block_serial++;
        blk.kernel = name;
        blk.body = body;
        if (blk.n != (unsigned)nthreads || blk.threads.size() != nthreads) {
            blk.threads.clear();
            blk.threads.resize(nthreads);
            blk.n = (unsigned)nthreads;
        }
        blk.warp_waiting.assign((nthreads + 31) / 32, 0u);
        blk.warp_epoch.assign((nthreads + 31) / 32, 0u);
        blk.epoch = 0;
        tl_block = &blk;
        run_block(blk);
        tl_block = nullptr;
    };
    pool().run(nblocks, one_block);
}

} /* namespace detail */

/* ---- the shared-memory race check (MICA_CUDASIM_RACECHECK) -------------------------------- */
struct Site {
    long long i;
    const char* file;
    int line;
    Site(long long i_, const char* file_ = __builtin_FILE(), int line_ = __builtin_LINE()) : i(i_), file(file_), line(line_) {}
};

template <class T, long long N>
struct RaceArray {
    static constexpr uint32_t NONE = 0xffffffffu, MANY = 0xfffffffeu;
    struct Shadow {
        uint64_t serial;
        uint32_t w_tid, w_epoch, w_wepoch, r_tid, r_warp, r_epoch, r_wepoch, r_first, r_last;
    };
    const char* name;
    T data[N]{};
    Shadow sh[N]{};
    constexpr explicit RaceArray(const char* n) : name(n) {}

    struct Ref {
        RaceArray* a;
        long long i;
        const char* file;
        int line;
        operator T() const { a->on_read(*this); return a->data[i]; }
        Ref& operator=(T v) { a->on_write(*this); a->data[i] = v; return *this; }
        Ref& operator=(const Ref& o) { T v = o; return *this = v; }
        Ref& operator+=(T v) { T c = *this; return *this = c + v; }
        Ref& operator-=(T v) { T c = *this; return *this = c - v; }
        Ref& operator*=(T v) { T c = *this; return *this = c * v; }
        Ref& operator/=(T v) { T c = *this; return *this = c / v; }
    };
    Ref operator[](Site s) {
        if (s.i < 0 || s.i >= N)
            fail("%s[%lld] at %s:%d in %s: index out of bounds (the array has %lld elements)", name, s.i, s.file, s.line,
                 detail::block_name(), N);
        return Ref{this, s.i, s.file, s.line};
    }

    Shadow& shadow(const Ref& r, uint32_t& t, uint32_t& w, uint32_t& E, uint32_t& WE) {
        detail::Thread* th = detail::current("a MICA_SHARED_ARRAY access");
        t = th->linear;
        w = t / 32;
        E = detail::tl_block->epoch;
        WE = detail::tl_block->warp_epoch[w];
        Shadow& s = sh[r.i];
        if (s.serial != detail::tl_block_serial) s = Shadow{detail::tl_block_serial, NONE, 0, 0, NONE, NONE, 0, 0, NONE, NONE};
        return s;
    }
    /* an earlier access by `prev` is ordered before the current one by thread t */
    static bool ordered(uint32_t prev, uint32_t prev_warp, uint32_t pe, uint32_t pwe, uint32_t t, uint32_t w, uint32_t E,
                        uint32_t WE) {
        return prev == NONE || prev == t || pe != E || (prev_warp == w && pwe != WE);
    }
    void on_read(const Ref& r) {
        uint32_t t, w, E, WE;
        Shadow& s = shadow(r, t, w, E, WE);
        if (!ordered(s.w_tid, s.w_tid / 32, s.w_epoch, s.w_wepoch, t, w, E, WE))
            fail("shared-memory race on %s[%lld] at %s:%d in %s: %s reads it after %s wrote it, with no barrier "
                 "between (a missing __syncthreads?)", name, r.i, r.file, r.line, detail::block_name(),
                 detail::thread_name(t), detail::thread_name(s.w_tid));
        if (s.r_tid == NONE || s.r_epoch != E) {  /* the first read since the last barrier */
            s.r_tid = t;
            s.r_warp = w;
            s.r_first = t;
        } else {
            if (s.r_tid != t) s.r_tid = MANY;
            if (s.r_warp != w) s.r_warp = MANY;
        }
        s.r_last = t;
        s.r_epoch = E;
        s.r_wepoch = WE;
    }
    void on_write(const Ref& r) {
        uint32_t t, w, E, WE;
        Shadow& s = shadow(r, t, w, E, WE);
        if (!ordered(s.w_tid, s.w_tid / 32, s.w_epoch, s.w_wepoch, t, w, E, WE))
            fail("shared-memory race on %s[%lld] at %s:%d in %s: %s writes it after %s wrote it, with no barrier "
                 "between", name, r.i, r.file, r.line, detail::block_name(), detail::thread_name(t),
                 detail::thread_name(s.w_tid));
        if (!ordered(s.r_tid, s.r_warp, s.r_epoch, s.r_wepoch, t, w, E, WE))
            fail("shared-memory race on %s[%lld] at %s:%d in %s: %s writes it after %s read it, with no barrier "
                 "between (a missing __syncthreads?)", name, r.i, r.file, r.line, detail::block_name(),
                 detail::thread_name(t),
                 s.r_first != t ? detail::thread_name(s.r_first)
                                : s.r_last != t ? detail::thread_name(s.r_last) : "another thread");
        s.w_tid = t;
        s.w_epoch = E;
        s.w_wepoch = WE;
    }
};

} /* namespace mica_cudasim */

/* ---- CUDA's names ------------------------------------------------------------------------- */
#define threadIdx (::mica_cudasim::detail::coord_thread())
#define blockIdx (::mica_cudasim::detail::coord_block())
#define blockDim (::mica_cudasim::detail::coord_block_dim())
#define gridDim (::mica_cudasim::detail::coord_grid_dim())

#define __syncthreads() ::mica_cudasim::detail::block_barrier("__syncthreads", 0, __FILE__, __LINE__)
#define __syncthreads_count(pred) ::mica_cudasim::detail::block_barrier("__syncthreads_count", (pred), __FILE__, __LINE__)
#define __syncthreads_and(pred) \
    (::mica_cudasim::detail::block_barrier("__syncthreads_and", (pred), __FILE__, __LINE__) == \
     (int)(blockDim.x * blockDim.y * blockDim.z))
#define __syncthreads_or(pred) (::mica_cudasim::detail::block_barrier("__syncthreads_or", (pred), __FILE__, __LINE__) > 0)

#define MICA_WARP_OP(op) ::mica_cudasim::detail::WarpOp::op, __FILE__, __LINE__
#define __syncwarp(...) (::mica_cudasim::detail::SyncWarpAt{__FILE__, __LINE__}(__VA_ARGS__))
#define __shfl_sync(...) ::mica_cudasim::detail::shfl(MICA_WARP_OP(ShflIdx), __VA_ARGS__)
#define __shfl_up_sync(...) ::mica_cudasim::detail::shfl(MICA_WARP_OP(ShflUp), __VA_ARGS__)
#define __shfl_down_sync(...) ::mica_cudasim::detail::shfl(MICA_WARP_OP(ShflDown), __VA_ARGS__)
#define __shfl_xor_sync(...) ::mica_cudasim::detail::shfl(MICA_WARP_OP(ShflXor), __VA_ARGS__)
#define __all_sync(mask, pred) ((int)::mica_cudasim::detail::warp_exchange(MICA_WARP_OP(All), (mask), (pred) != 0, 0, 32))
#define __any_sync(mask, pred) ((int)::mica_cudasim::detail::warp_exchange(MICA_WARP_OP(Any), (mask), (pred) != 0, 0, 32))
#define __ballot_sync(mask, pred) \
    ((unsigned)::mica_cudasim::detail::warp_exchange(MICA_WARP_OP(Ballot), (mask), (pred) != 0, 0, 32))
#define __activemask() (::mica_cudasim::detail::active_mask())

namespace mica_cudasim { namespace detail {
/* a call site, called with the optional mask (portable C++17: no __VA_OPT__ needed) */
struct SyncWarpAt {
    const char* file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { warp_exchange(WarpOp::SyncWarp, file, line, mask, 0, 0, 32); }
};
} }

#define MICA_EXTERN_SHARED(type, name) type* const name = static_cast<type*>(::mica_cudasim::detail::tl_dynamic_shared)

/* ---- nvcuda::wmma: TF32 tensor-core fragments (m16n16k8) -----------------------------------
 * CUDA leaves a fragment's element-to-lane layout unspecified, and Mica's kernels touch fragments
 * only through load/store/fill/mma and element-wise operations, so any layout is a faithful one:
 * here element t of lane l is element t * 32 + l of the fragment's matrix, row by row. Each call
 * is warp-collective (every lane of the warp must reach it, checked as __syncwarp checks), and
 * the card's requirements are checked: pointers 32-byte aligned, ldm a multiple of 4 floats.
 * mma_sync is a warp exchange: each lane posts its A and B fragments, then computes its own
 * elements of D = A B + C, the eight products (exact: TF32 significands) added to C one by one
 * in increasing k. The card's tensor cores add them in an order of their own, so a kernel that
 * multiplies on them agrees with the card to rounding, not to the bit (products aside, like
 * cuBLASLt's). __float_to_tf32 rounds to nearest, ties away from zero (cvt.rna.tf32.f32).
 * MICA_CUDASIM_TF32=keep (read once) keeps every float32 digit of the operands instead, so a test
 * can hold a tensor-core kernel's algorithm to float32 apart from TF32's rounding. */
namespace mica_cudasim { namespace detail {
inline thread_local const float* tl_wmma_posted[1024][2];
inline void wmma_check(const char* what, const void* p, unsigned ldm) {
    if ((uintptr_t)p % 32) fail("wmma::%s: pointer %p is not 32-byte aligned, as the card requires", what, p);
    if (ldm % 4) fail("wmma::%s: ldm %u is not a multiple of 4 floats (16 bytes), as the card requires", what, ldm);
}
inline bool tf32_keep() {
    static const bool keep = getenv("MICA_CUDASIM_TF32") && !strcmp(getenv("MICA_CUDASIM_TF32"), "keep");
    return keep;
}
inline float tf32_bits(float x) { /* the value a tensor core reads: the low 13 bits of the significand dropped */
    if (tf32_keep()) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0xffffe000u;
    memcpy(&x, &u, 4);
    return x;
}
} }
namespace nvcuda { namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major, mem_col_major };

template <int R, int C> struct mica_fragment { /* an R x C matrix spread over a warp's 32 lanes */
    enum { rows = R, cols = C, num_elements = R * C / 32 };
    float x[R * C / 32];
};
template <class Use, int M, int N, int K, class T, class Layout = void> class fragment;
template <class Layout> class fragment<matrix_a, 16, 16, 8, precision::tf32, Layout> : public mica_fragment<16, 8> {};
template <class Layout> class fragment<matrix_b, 16, 16, 8, precision::tf32, Layout> : public mica_fragment<8, 16> {};
template <> class fragment<accumulator, 16, 16, 8, float, void> : public mica_fragment<16, 16> {};

inline float __float_to_tf32(float in) {
    if (!std::isfinite(in) || ::mica_cudasim::detail::tf32_keep()) return in;
    uint32_t u;
    memcpy(&u, &in, 4);
    u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&in, &u, 4);
    return in;
}

inline unsigned mica_lane() { return ::mica_cudasim::detail::current("wmma")->linear & 31u; }

template <int R, int C>
inline void mica_load(mica_fragment<R, C>& f, const float* p, unsigned ldm, bool row, const char* what) {
    __syncwarp();
    ::mica_cudasim::detail::wmma_check(what, p, ldm);
    const unsigned lane = mica_lane();
    for (int t = 0; t < f.num_elements; t++) {
        const int e = t * 32 + (int)lane, r = e / C, c = e % C;
        f.x[t] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}
template <class Use, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 8, precision::tf32, Layout>& f, const float* p, unsigned ldm) {
    mica_load(f, p, ldm, std::is_same<Layout, row_major>::value, "load_matrix_sync");
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 8, float>& f, const float* p, unsigned ldm, layout_t layout) {
    mica_load(f, p, ldm, layout == mem_row_major, "load_matrix_sync");
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 8, float>& f, unsigned ldm, layout_t layout) {
    __syncwarp();
    ::mica_cudasim::detail::wmma_check("store_matrix_sync", p, ldm);
    const unsigned lane = mica_lane();
    for (int t = 0; t < f.num_elements; t++) {
        const int e = t * 32 + (int)lane, r = e / 16, c = e % 16;
        (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[t];
    }
}
template <int R, int C>
inline void fill_fragment(mica_fragment<R, C>& f, float v) {
    for (int t = 0; t < f.num_elements; t++) f.x[t] = v;
}
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 8, float>& d, const fragment<matrix_a, 16, 16, 8, precision::tf32, LA>& a,
                     const fragment<matrix_b, 16, 16, 8, precision::tf32, LB>& b,
                     const fragment<accumulator, 16, 16, 8, float>& c) {
    using ::mica_cudasim::detail::tf32_bits;
    using ::mica_cudasim::detail::tl_wmma_posted;
    const unsigned me = ::mica_cudasim::detail::current("wmma::mma_sync")->linear, base = me & ~31u, lane = me & 31u;
    tl_wmma_posted[me][0] = a.x;
    tl_wmma_posted[me][1] = b.x;
    __syncwarp(); /* (every lane's fragments are posted) */
    float out[8];
    for (int t = 0; t < 8; t++) {
        const int e = t * 32 + (int)lane, r = e / 16, col = e % 16;
        float s = c.x[t];
        for (int k = 0; k < 8; k++) {
            const int ea = r * 8 + k, eb = k * 16 + col;
            s = s + tf32_bits(tl_wmma_posted[base + ea % 32][0][ea / 32]) * tf32_bits(tl_wmma_posted[base + eb % 32][1][eb / 32]);
        }
        out[t] = s;
    }
    __syncwarp(); /* (every lane has read the others' fragments before any is changed) */
    for (int t = 0; t < 8; t++) d.x[t] = out[t];
}
} }
#ifdef MICA_CUDASIM_RACECHECK
#define MICA_SHARED_ARRAY(type, name, count) thread_local ::mica_cudasim::RaceArray<type, (count)> name(#name)
#else
#define MICA_SHARED_ARRAY(type, name, count) __shared__ type name[count]
#endif

/* The launch: parameters converted to the kernel's types and copied once, as CUDA does; every
 * CUDA thread calls the kernel with its own copy of them. */
namespace mica_cudasim { namespace detail {
inline void enqueue(cudaStream_t stream, std::function<void()> op);

template <class... P>
struct Launcher {
    const char* name;
    void (*kernel)(P...);
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    template <class... A>
    void operator()(A&&... args) const {
        static_assert(sizeof...(P) == sizeof...(A),
                      "mica_cudasim: MICA_LAUNCH passes a different number of arguments than the kernel takes");
        auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(args)...);
        void (*k)(P...) = kernel;
        auto L = std::make_shared<Launch>(Launch{name, reinterpret_cast<const void*>(k), grid, block, shared_bytes,
                                                 [k, params] { std::apply(k, *params); }});
        enqueue(stream, [L] { run_grid(*L); });
    }
};
template <class... P>
inline Launcher<P...> launcher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
                               cudaStream_t stream) {
    return Launcher<P...>{name, kernel, grid, block, shared_bytes, stream};
}
} }
#define MICA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    ::mica_cudasim::detail::launcher(#kernel, kernel, dim3(grid), dim3(block), (size_t)(shared_bytes), (stream))(__VA_ARGS__)

/* ---- streams, events, graphs: host bookkeeping; launches run synchronously ---------------- */
struct CUstream_st {
    bool capturing = false;
    CUgraph_st* graph = nullptr;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point when{};
    bool recorded = false;
    unsigned flags = 0;
};
struct CUgraph_st {
    std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> nodes;
};

namespace mica_cudasim { namespace detail {
inline void enqueue(cudaStream_t stream, std::function<void()> op) {
    if (stream && stream->capturing) stream->graph->nodes.push_back(std::move(op));
    else op();
}
inline cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) tl_last_error = e;
    return e;
}
} }

inline cudaError_t cudaGetLastError() {
    cudaError_t e = ::mica_cudasim::detail::tl_last_error;
    ::mica_cudasim::detail::tl_last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return ::mica_cudasim::detail::tl_last_error; }
inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    }
    return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    }
    return "unknown error";
}

/* device: one, the simulator */
inline cudaError_t cudaGetDeviceCount(int* n) {
    if (!n) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : ::mica_cudasim::detail::set_error(cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceReset() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaDriverGetVersion(int* v) { *v = 13000; return cudaSuccess; }
inline cudaError_t cudaRuntimeGetVersion(int* v) { *v = 13000; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (!p) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    if (d != 0) return ::mica_cudasim::detail::set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "Mica CPU simulator");
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    p->totalGlobalMem = (size_t)pages * (size_t)page;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    p->multiProcessorCount = (int)::mica_cudasim::detail::pool().nthreads;
    p->maxThreadsPerMultiProcessor = 1024;
    p->major = 8;
    p->minor = 0;
    p->concurrentKernels = 0;
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    *free_bytes = (size_t)sysconf(_SC_AVPHYS_PAGES) * page;
    *total = (size_t)sysconf(_SC_PHYS_PAGES) * page;
    return cudaSuccess;
}
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
        return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(::mica_cudasim::detail::g_attr_mutex);
    for (auto& kv : ::mica_cudasim::detail::g_max_dynamic_shared)
        if (kv.first == reinterpret_cast<const void*>(kernel)) { kv.second = value; return cudaSuccess; }
    ::mica_cudasim::detail::g_max_dynamic_shared.emplace_back(reinterpret_cast<const void*>(kernel), value);
    return cudaSuccess;
}

/* memory: device memory is host memory, allocated to exactly the bytes asked (ASan sees overruns) */
inline cudaError_t cudaMalloc(void** p, size_t n) {
    if (!p) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    *p = nullptr;
    if (posix_memalign(p, 256, n ? n : 1)) {
        *p = nullptr;
        return ::mica_cudasim::detail::set_error(cudaErrorMemoryAllocation);
    }
    return cudaSuccess;
}
template <class T>
inline cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
inline cudaError_t cudaFree(void* p) { free(p); return cudaSuccess; }
inline cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
template <class T>
inline cudaError_t cudaMallocHost(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
inline cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void* p) { free(p); return cudaSuccess; }
template <class T>
inline cudaError_t cudaMallocManaged(T** p, size_t n, unsigned = 1) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
template <class T>
inline cudaError_t cudaMallocAsync(T** p, size_t n, cudaStream_t) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { free(p); return cudaSuccess; }

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t stream = 0) {
    if (n && (!dst || !src)) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    ::mica_cudasim::detail::enqueue(stream, [dst, src, n] { if (n) memmove(dst, src, n); });
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, n, kind, 0);
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream = 0) {
    if (n && !dst) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    ::mica_cudasim::detail::enqueue(stream, [dst, value, n] { if (n) memset(dst, value, n); });
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* dst, int value, size_t n) { return cudaMemsetAsync(dst, value, n, 0); }
template <class T>
inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t n, size_t offset = 0,
                                      cudaMemcpyKind = cudaMemcpyHostToDevice) {
    if (offset + n > sizeof(T)) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    memcpy(reinterpret_cast<char*>(&symbol) + offset, src, n);
    return cudaSuccess;
}
template <class T>
inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t n, size_t offset = 0,
                                        cudaMemcpyKind = cudaMemcpyDeviceToHost) {
    if (offset + n > sizeof(T)) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    memcpy(dst, reinterpret_cast<const char*>(&symbol) + offset, n);
    return cudaSuccess;
}
template <class T>
inline cudaError_t cudaGetSymbolAddress(void** p, T& symbol) { *p = const_cast<void*>(static_cast<const void*>(&symbol)); return cudaSuccess; }

/* streams */
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = new CUstream_st(); return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) { return cudaStreamCreate(s); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
    delete s->graph;
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s && s->capturing) return ::mica_cudasim::detail::set_error(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}
inline cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }
inline cudaError_t cudaLaunchHostFunc(cudaStream_t s, void (*fn)(void*), void* data) {
    ::mica_cudasim::detail::enqueue(s, [fn, data] { fn(data); });
    return cudaSuccess;
}

/* events: the host clock when a record runs (at replay, inside a graph) */
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new CUevent_st(); return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    *e = new CUevent_st();
    (*e)->flags = flags;
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0) {
    if (!e) return ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
    ::mica_cudasim::detail::enqueue(s, [e] { e->when = std::chrono::steady_clock::now(); e->recorded = true; });
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    return e ? cudaSuccess : ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
    return e ? cudaSuccess : ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) return ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

/* graphs: a capture records each operation of the stream as a closure; a launch replays them */
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (!s) return ::mica_cudasim::detail::set_error(cudaErrorStreamCaptureUnsupported);
    if (s->capturing) return ::mica_cudasim::detail::set_error(cudaErrorIllegalState);
    s->capturing = true;
    s->graph = new CUgraph_st();
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
    if (!s || !s->capturing) return ::mica_cudasim::detail::set_error(cudaErrorIllegalState);
    s->capturing = false;
    *g = s->graph;
    s->graph = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* st) {
    *st = (s && s->capturing) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long = 0) {
    if (!exec || !g) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st();
    (*exec)->nodes = g->nodes;
    return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return ::mica_cudasim::detail::set_error(cudaErrorInvalidResourceHandle);
    ::mica_cudasim::detail::enqueue(s, [exec] { for (auto& op : exec->nodes) op(); });
    return cudaSuccess;
}
inline cudaError_t cudaGraphGetNodes(cudaGraph_t g, void* nodes, size_t* n) {
    if (!g || nodes) return ::mica_cudasim::detail::set_error(cudaErrorInvalidValue);  /* count only */
    *n = g->nodes.size();
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { delete exec; return cudaSuccess; }
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }

/* ---- device functions ------------------------------------------------------------------- */
/* exact IEEE operations: the same bits as the GPU's */
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
/* NOT the GPU's: its rsqrtf is approximate. Kernels that must match bits write 1.0f / sqrtf(x). */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* Refused where used (macros: glibc's math.h declares some of these names itself) */
#define MICA_CUDASIM_REFUSED(name)                                                                      \
    ([]() -> float {                                                                                    \
        static_assert(sizeof(float) == 0, "mica_cudasim: " #name " is the GPU's approximate intrinsic " \
                                          "and cannot give the GPU's bits here; use Mica's math "       \
                                          "(mica_math.h) or the exact operation");                      \
        return 0.0f;                                                                                    \
    }())
#define __expf(...) MICA_CUDASIM_REFUSED(__expf)
#define __fdividef(...) MICA_CUDASIM_REFUSED(__fdividef)
#define __logf(...) MICA_CUDASIM_REFUSED(__logf)
#define __log2f(...) MICA_CUDASIM_REFUSED(__log2f)
#define __sinf(...) MICA_CUDASIM_REFUSED(__sinf)
#define __cosf(...) MICA_CUDASIM_REFUSED(__cosf)
#define __tanf(...) MICA_CUDASIM_REFUSED(__tanf)
#define __powf(...) MICA_CUDASIM_REFUSED(__powf)
#define __exp10f(...) MICA_CUDASIM_REFUSED(__exp10f)

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <class T>
static inline T __ldg(const T* p) { return *p; }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
/* a block's threads share one OS thread: a compiler barrier orders them */
static inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }
static inline long long clock64() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* ---- atomics: real atomics (blocks run on several OS threads), relaxed as CUDA's ---------- */
#define MICA_ATOMIC_INT(T)                                                                                     \
    static inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }               \
    static inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }               \
    static inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }             \
    static inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }               \
    static inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }                 \
    static inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }               \
    static inline T atomicCAS(T* a, T expected, T desired) {                                                  \
        __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);         \
        return expected;                                                                                      \
    }                                                                                                         \
    static inline T atomicMax(T* a, T v) {                                                                    \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                         \
        while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                                     \
        return old;                                                                                           \
    }                                                                                                         \
    static inline T atomicMin(T* a, T v) {                                                                    \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                         \
        while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                                     \
        return old;                                                                                           \
    }
MICA_ATOMIC_INT(int)
MICA_ATOMIC_INT(unsigned int)
MICA_ATOMIC_INT(long long)
MICA_ATOMIC_INT(unsigned long long)
#undef MICA_ATOMIC_INT
#define MICA_ATOMIC_FLOAT(T)                                                                                   \
    static inline T atomicAdd(T* a, T v) {                                                                    \
        T old, sum;                                                                                           \
        __atomic_load(a, &old, __ATOMIC_RELAXED);                                                             \
        do {                                                                                                  \
            sum = old + v;                                                                                    \
        } while (!__atomic_compare_exchange(a, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));         \
        return old;                                                                                           \
    }                                                                                                         \
    static inline T atomicExch(T* a, T v) {                                                                   \
        T old;                                                                                                \
        __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);                                                     \
        return old;                                                                                           \
    }
MICA_ATOMIC_FLOAT(float)
MICA_ATOMIC_FLOAT(double)
#undef MICA_ATOMIC_FLOAT

#endif /* !__CUDACC__ */
#endif /* MICA_CUDASIM_H */
