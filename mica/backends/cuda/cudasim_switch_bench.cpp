// Why mica_cudasim.h uses Boost.Context's fcontext fibers rather than ucontext: the cost of a
// fiber switch (a round trip scheduler -> fiber -> scheduler, as at every barrier) and of starting
// a fiber (as for every CUDA thread). Debian's libboost_context is built for fcontext only, so
// ucontext is measured raw (makecontext/swapcontext). Not a test.
//   g++ -std=c++17 -O2 cudasim_switch_bench.cpp -o switch_bench -lboost_context
#include <boost/context/fiber.hpp>
#include <ucontext.h>
#include <chrono>
#include <cstdio>
#include <vector>

namespace ctx = boost::context;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static const int N = 2000000;
static ucontext_t uc_main, uc_fib;
static volatile long counter;
static void uc_body() {
    for (;;) { counter++; swapcontext(&uc_fib, &uc_main); }
}
static void uc_once() { counter++; }

int main() {
    for (int rep = 0; rep < 3; ++rep) {  // fcontext round trips; the first repetition is cold
        ctx::fiber f{[](ctx::fiber&& s) { for (;;) { counter++; s = std::move(s).resume(); } return std::move(s); }};
        double t0 = now();
        for (int i = 0; i < N; ++i) f = std::move(f).resume();
        double t = now() - t0;
        printf("boost fcontext: %.1f ns per round trip\n", t / N * 1e9);
    }
    for (int rep = 0; rep < 3; ++rep) {  // ucontext round trips
        std::vector<char> stack(64 * 1024);
        getcontext(&uc_fib);
        uc_fib.uc_stack.ss_sp = stack.data();
        uc_fib.uc_stack.ss_size = stack.size();
        uc_fib.uc_link = &uc_main;
        makecontext(&uc_fib, uc_body, 0);
        double t0 = now();
        for (int i = 0; i < N; ++i) swapcontext(&uc_main, &uc_fib);
        double t = now() - t0;
        printf("ucontext:       %.1f ns per round trip\n", t / N * 1e9);
    }
    const int M = 500000;
    {  // start + finish a fiber on a reused stack (a CUDA thread that never waits)
        ctx::fixedsize_stack alloc(64 * 1024);
        ctx::stack_context sc = alloc.allocate();
        struct Keep {
            ctx::stack_context sc;
            ctx::stack_context allocate() { return sc; }
            void deallocate(ctx::stack_context&) noexcept {}
        };
        double t0 = now();
        for (int i = 0; i < M; ++i) {
            ctx::fiber f{std::allocator_arg, ctx::preallocated(sc.sp, sc.size, sc), Keep{sc},
                         [](ctx::fiber&& s) { counter++; return std::move(s); }};
            f = std::move(f).resume();
        }
        double t = now() - t0;
        printf("boost fcontext: %.1f ns to start and finish a fiber\n", t / M * 1e9);
        alloc.deallocate(sc);
    }
    {
        std::vector<char> stack(64 * 1024);
        double t0 = now();
        for (int i = 0; i < M; ++i) {
            getcontext(&uc_fib);
            uc_fib.uc_stack.ss_sp = stack.data();
            uc_fib.uc_stack.ss_size = stack.size();
            uc_fib.uc_link = &uc_main;
            makecontext(&uc_fib, uc_once, 0);
            swapcontext(&uc_main, &uc_fib);
        }
        double t = now() - t0;
        printf("ucontext:       %.1f ns to start and finish a fiber\n", t / M * 1e9);
    }
    return counter == 0;
}
