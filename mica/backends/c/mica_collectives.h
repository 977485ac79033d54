/* Collectives over MPI_COMM_WORLD for a program compiled for `world` ranks (mica/ops/collective.py
 * defines what each computes). MPI only moves bytes; every sum is Mica's own, in a fixed order:
 *
 *   all_reduce      a chain: rank 0 starts from its first operand and adds the rest, rank r receives
 *                   the running sum from rank r-1, adds its own operands one by one and passes it on;
 *                   rank world-1 broadcasts the total. Each element is ((c0 + c1) + c2) + ... over
 *                   every rank's operands in rank order, the bits of one process adding them in turn.
 *                   The chain runs in chunks, so the ranks work on different chunks at once.
 *   reduce_scatter  the same chain over all `world` blocks, ending at rank world-1, which sends each
 *                   finished chunk's part of block r to rank r: each element holds all_reduce's bits
 *                   (ZeRO-1's gradients), and the scratch is one chunk.
 *   all_gather      MPI_Allgather (a copy).
 *   the _v forms    uneven blocks (counts[r] elements from displs[r]; all_gather's by MPI_Allgatherv).
 *
 * MPI is joined in mica_mpi.h (shared with the cards' NCCL collectives). A failed call stops the
 * program with a sentence: MPI returns its errors, so a dead peer is reported rather than aborting
 * the job mid-sentence. */
#ifndef MICA_COLLECTIVES_H
#define MICA_COLLECTIVES_H

#include <limits.h>
#include "mica_mpi.h"
#include <stdlib.h>
#include <string.h>

#define MICA_CHAIN_CHUNK ((int64_t)1 << 18) /* elements per message of the all_reduce chain */

/* 0 when MPI runs `world` ranks; sets *rank */
static int mica_mpi_ready(int world, int *rank) {
    int size = mica_mpi_join(rank);
    if (size != world) {
        mica_fail(MICA_MPI_WORLD_TEXT, world, size);
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
    /* one chunk of the chain: o (k elements at `at`) := the running sum, passed on to rank + 1 */         \
    static int mica_chain_chunk_##S(T *o, const T *const *in, int m, int64_t at, int k, int world, int rank) { \
        int first = 0;                                                                                      \
        if (rank == 0) {                                                                                    \
            memcpy(o, in[0] + at, (size_t)k * sizeof(T));                                                   \
            first = 1;                                                                                      \
        } else if (mica_mpi_failed(MPI_Recv(o, k, MT, rank - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE))) {     \
            return 1;                                                                                       \
        }                                                                                                   \
        _Pragma("omp parallel for schedule(static) if (k > 32768)")                                         \
        for (int i = 0; i < k; i++) {                                                                       \
            T a = o[i];                                                                                     \
            for (int j = first; j < m; j++) a = a + in[j][at + i];                                          \
            o[i] = a;                                                                                       \
        }                                                                                                   \
        return rank < world - 1 && mica_mpi_failed(MPI_Send(o, k, MT, rank + 1, 0, MPI_COMM_WORLD));        \
    }                                                                                                       \
    static int mica_all_reduce_##S(T *out, const T *const *in, int m, int64_t n, int world) {               \
        int rank;                                                                                           \
        if (mica_mpi_ready(world, &rank)) return 1;                                                         \
        for (int64_t at = 0; at < n; at += MICA_CHAIN_CHUNK) {                                              \
            int k = (int)(n - at < MICA_CHAIN_CHUNK ? n - at : MICA_CHAIN_CHUNK);                            \
            if (mica_chain_chunk_##S(out + at, in, m, at, k, world, rank)) return 1;                        \
        }                                                                                                   \
        for (int64_t at = 0; at < n; at += INT_MAX / 2) {                                                   \
            int k = (int)(n - at < INT_MAX / 2 ? n - at : INT_MAX / 2);                                      \
            if (mica_mpi_failed(MPI_Bcast(out + at, k, MT, world - 1, MPI_COMM_WORLD))) return 1;          \
        }                                                                                                   \
        return 0;                                                                                           \
    }                                                                                                       \
    /* in: m operands of `total` elements, rank r's counts[r] of them from displs[r]; out: this rank's.     \
     * The chain runs chunk by chunk through `chunk` (MICA_CHAIN_CHUNK elements of scratch); the last rank  \
     * sends each owner its part of every finished chunk, which the owner has asked for in advance. */      \
    static int mica_reduce_scatter_v_##S(T *out, const T *const *in, int m, int64_t total, const int64_t *counts, \
                                         const int64_t *displs, int world, T *chunk) {                      \
        int rank, last = world - 1;                                                                         \
        if (mica_mpi_ready(world, &rank)) return 1;                                                         \
        int64_t lo = displs[rank], hi = lo + counts[rank], wanted = 0;                                      \
        MPI_Request *asked = 0;                                                                             \
        if (rank != last) {                                                                                 \
            asked = malloc(sizeof *asked * (size_t)(counts[rank] / MICA_CHAIN_CHUNK + 2));                  \
            if (!asked) {                                                                                   \
                mica_fail("cannot allocate %lld requests for a reduce_scatter", counts[rank], 0LL);          \
                return 1;                                                                                   \
            }                                                                                               \
            for (int64_t at = lo / MICA_CHAIN_CHUNK * MICA_CHAIN_CHUNK; at < hi; at += MICA_CHAIN_CHUNK) {  \
                int64_t a = at > lo ? at : lo, b = at + MICA_CHAIN_CHUNK < hi ? at + MICA_CHAIN_CHUNK : hi;  \
                if (mica_mpi_failed(MPI_Irecv(out + (a - lo), (int)(b - a), MT, last, 1, MPI_COMM_WORLD,     \
                                              &asked[wanted++]))) {                                         \
                    free(asked);                                                                            \
                    return 1;                                                                               \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        int r = 0;                                                                                          \
        for (int64_t at = 0; at < total; at += MICA_CHAIN_CHUNK) {                                          \
            int k = (int)(total - at < MICA_CHAIN_CHUNK ? total - at : MICA_CHAIN_CHUNK);                    \
            if (mica_chain_chunk_##S(chunk, in, m, at, k, world, rank)) {                                   \
                free(asked);                                                                                \
                return 1;                                                                                   \
            }                                                                                               \
            for (; rank == last && r < world && displs[r] < at + k; r++) { /* each owner's part of it */   \
                int64_t a = displs[r] > at ? displs[r] : at;                                                \
                int64_t b = displs[r] + counts[r] < at + k ? displs[r] + counts[r] : at + k;                \
                if (a < b && r == last) memcpy(out + (a - displs[r]), chunk + (a - at), (size_t)(b - a) * sizeof(T)); \
                else if (a < b && mica_mpi_failed(MPI_Send(chunk + (a - at), (int)(b - a), MT, r, 1, MPI_COMM_WORLD))) \
                    return 1;                                                                               \
                if (displs[r] + counts[r] > at + k) break; /* (its rest is in the next chunk) */           \
            }                                                                                               \
        }                                                                                                   \
        int failed = wanted && mica_mpi_failed(MPI_Waitall((int)wanted, asked, MPI_STATUSES_IGNORE));     \
        free(asked);                                                                                        \
        return failed;                                                                                      \
    }                                                                                                       \
    /* x: world blocks of n elements; out: n */                                                             \
    static int mica_reduce_scatter_##S(T *out, const T *const *in, int m, int64_t n, int world, T *chunk) {  \
        int64_t *counts = malloc(sizeof *counts * 2 * (size_t)world);                                      \
        if (!counts) {                                                                                      \
            mica_fail("cannot allocate the blocks of a reduce_scatter among %lld ranks", world, 0LL);        \
            return 1;                                                                                       \
        }                                                                                                   \
        for (int r = 0; r < world; r++) counts[r] = n, counts[world + r] = r * n;                          \
        int failed = mica_reduce_scatter_v_##S(out, in, m, n * world, counts, counts + world, world, chunk); \
        free(counts);                                                                                       \
        return failed;                                                                                      \
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
