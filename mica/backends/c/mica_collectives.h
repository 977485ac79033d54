/* Collectives over MPI_COMM_WORLD for a program compiled for `world` ranks (mica/ops/collective.py
 * defines what each computes). MPI only moves bytes; every sum is Mica's own, in a fixed order:
 *
 *   all_reduce      a chain: rank 0 starts from its first operand and adds the rest, rank r receives
 *                   the running sum from rank r-1, adds its own operands one by one and passes it on;
 *                   rank world-1 broadcasts the total. Each element is ((c0 + c1) + c2) + ... over
 *                   every rank's operands in rank order, the bits of one process adding them in turn.
 *                   The chain runs in chunks, so the ranks work on different chunks at once.
 *   reduce_scatter  the same chain over all `world` blocks, ending at rank world-1, which scatters
 *                   block r to rank r: each element holds all_reduce's bits (ZeRO-1's gradients).
 *   all_gather      MPI_Allgather (a copy).
 *   the _v forms    uneven blocks (counts[r] elements at displs[r]): MPI_Scatterv / MPI_Allgatherv.
 *
 * A program loaded by Python initializes MPI itself (and finalizes it at exit); the trainer has
 * initialized it already. A failed call stops the program with a sentence (the trainer sets
 * MPI_ERRORS_RETURN, so a dead peer is reported rather than aborting the job mid-sentence). */
#ifndef MICA_COLLECTIVES_H
#define MICA_COLLECTIVES_H

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define MICA_CHAIN_CHUNK ((int64_t)1 << 18) /* elements per message of the all_reduce chain */

static void mica_mpi_finalize_at_exit(void) {
    int done;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

/* 0 when MPI runs `world` ranks; sets *rank */
static int mica_mpi_ready(int world, int *rank) {
    int init, size;
    MPI_Initialized(&init);
    if (!init) {
        int provided;
        MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        atexit(mica_mpi_finalize_at_exit);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    if (size != world) {
        mica_fail("this program was compiled for %lld ranks but runs among %lld: start it with mpirun -np "
                  "and the world size it was built for", world, size);
        return 1;
    }
    return 0;
}

static int mica_mpi_failed(int rc) {
    if (rc == MPI_SUCCESS) return 0;
    mica_fail("a collective of this data-parallel run failed (MPI error %lld): another rank stopped or cannot be "
              "reached; see that rank's message", (long long)rc, 0LL);
    return 1;
}

static int mica_mpi_count(int64_t n) {
    if (n > INT_MAX) {
        mica_fail("a collective moves %lld elements in one block, more than MPI's count (%lld) takes", n, INT_MAX);
        return 1;
    }
    return 0;
}

#define MICA_COLLECTIVES(S, T, MT)                                                                          \
    /* acc (n elements) := the chain's total on rank world-1 (a partial sum elsewhere) */                   \
    static int mica_chain_##S(T *acc, const T *const *in, int m, int64_t n, int world, int rank) {         \
        for (int64_t at = 0; at < n; at += MICA_CHAIN_CHUNK) {                                              \
            int k = (int)(n - at < MICA_CHAIN_CHUNK ? n - at : MICA_CHAIN_CHUNK);                            \
            T *o = acc + at;                                                                                \
            int first = 0;                                                                                  \
            if (rank == 0) {                                                                                \
                memcpy(o, in[0] + at, (size_t)k * sizeof(T));                                               \
                first = 1;                                                                                  \
            } else if (mica_mpi_failed(MPI_Recv(o, k, MT, rank - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE))) { \
                return 1;                                                                                   \
            }                                                                                               \
            _Pragma("omp parallel for schedule(static) if (k > 32768)")                                     \
            for (int i = 0; i < k; i++) {                                                                   \
                T a = o[i];                                                                                 \
                for (int j = first; j < m; j++) a = a + in[j][at + i];                                      \
                o[i] = a;                                                                                   \
            }                                                                                               \
            if (rank < world - 1 && mica_mpi_failed(MPI_Send(o, k, MT, rank + 1, 0, MPI_COMM_WORLD)))         \
                return 1;                                                                                   \
        }                                                                                                   \
        return 0;                                                                                           \
    }                                                                                                       \
    static int mica_all_reduce_##S(T *out, const T *const *in, int m, int64_t n, int world) {               \
        int rank;                                                                                           \
        if (mica_mpi_ready(world, &rank) || mica_chain_##S(out, in, m, n, world, rank)) return 1;          \
        for (int64_t at = 0; at < n; at += INT_MAX / 2) {                                                   \
            int k = (int)(n - at < INT_MAX / 2 ? n - at : INT_MAX / 2);                                      \
            if (mica_mpi_failed(MPI_Bcast(out + at, k, MT, world - 1, MPI_COMM_WORLD))) return 1;          \
        }                                                                                                   \
        return 0;                                                                                           \
    }                                                                                                       \
    /* in: m operands of world blocks of n elements; out: n; total: world * n elements of scratch */        \
    static int mica_reduce_scatter_##S(T *out, const T *const *in, int m, int64_t n, int world, T *total) {  \
        int rank;                                                                                           \
        if (mica_mpi_ready(world, &rank) || mica_mpi_count(n) ||                                            \
            mica_chain_##S(total, in, m, n * world, world, rank))                                           \
            return 1;                                                                                       \
        return mica_mpi_failed(MPI_Scatter(total, (int)n, MT, out, (int)n, MT, world - 1, MPI_COMM_WORLD));  \
    }                                                                                                       \
    /* in: m operands of `total` elements, rank r's counts[r] of them at displs[r]; out: this rank's */      \
    static int mica_reduce_scatter_v_##S(T *out, const T *const *in, int m, int64_t total, const int *counts, \
                                         const int *displs, int world, T *sum) {                            \
        int rank;                                                                                           \
        if (mica_mpi_ready(world, &rank) || mica_chain_##S(sum, in, m, total, world, rank)) return 1;      \
        return mica_mpi_failed(MPI_Scatterv(sum, counts, displs, MT, out, counts[rank], MT, world - 1,        \
                                            MPI_COMM_WORLD));                                               \
    }                                                                                                       \
    static int mica_all_gather_v_##S(T *out, const T *x, const int *counts, const int *displs, int world) {  \
        int rank;                                                                                           \
        if (mica_mpi_ready(world, &rank)) return 1;                                                         \
        return mica_mpi_failed(MPI_Allgatherv(x, counts[rank], MT, out, counts, displs, MT, MPI_COMM_WORLD)); \
    }                                                                                                       \
    static int mica_all_gather_##S(T *out, const T *x, int64_t n, int world) {                              \
        int rank;                                                                                           \
        if (mica_mpi_ready(world, &rank) || mica_mpi_count(n)) return 1;                                   \
        return mica_mpi_failed(MPI_Allgather(x, (int)n, MT, out, (int)n, MT, MPI_COMM_WORLD)); \
    }

MICA_COLLECTIVES(f32, float, MPI_FLOAT)
MICA_COLLECTIVES(f64, double, MPI_DOUBLE)

#endif
