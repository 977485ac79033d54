/* Collectives over NCCL for a CUDA program compiled for `world` ranks: the same definitions and
 * the same fixed sum order as the CPU's (mica/backends/c/mica_collectives.h). NCCL moves bytes
 * (send/recv, broadcast, all-gather); every sum is a Mica kernel adding operands in rank order,
 * so the bits do not depend on NCCL's ring or tree. The communicator is made before the program's
 * graph is captured (mica_nccl_ready: NCCL allocates device memory, which a capture forbids): rank 0
 * asks NCCL for its id and broadcasts it over MPI (the launcher is mpirun); each rank has taken the
 * card of its local rank (mica_cuda_ready). Host functions: they enqueue on `stream` and return
 * nonzero on failure. In the simulator NCCL is mica_cudasim_nccl.h, the same calls over MPI. */
#ifndef MICA_NCCL_H
#define MICA_NCCL_H

#include "mica_mpi.h"
#ifdef MICA_CUDASIM
#include "mica_cudasim_nccl.h"
#else
#include <nccl.h>
#endif
#include <stdio.h>
#include <stdlib.h>

#define MICA_NCCL_CHUNK ((int64_t)1 << 20) /* elements per step of the all_reduce chain */

static ncclComm_t mica_nccl_comm;
static int mica_nccl_rank = -1;

static int mica_nccl_fail(const char *what, const char *why) {
    snprintf(mica_error_text, sizeof mica_error_text,
             "a collective of this data-parallel run failed (%s: %s): another rank stopped or cannot be reached", what,
             why);
    return 1;
}

static int mica_nccl_ready(int world) {
    if (mica_nccl_rank >= 0) return 0;
    int rank, size = mica_mpi_join(&rank);
    if (size != world) {
        snprintf(mica_error_text, sizeof mica_error_text, MICA_MPI_WORLD_TEXT, (long long)world, (long long)size);
        return 1;
    }
    ncclUniqueId id;
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) return mica_nccl_fail("ncclGetUniqueId", "no NCCL id");
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return mica_nccl_fail("MPI_Bcast", "the NCCL id did not arrive");
    ncclResult_t r = ncclCommInitRank(&mica_nccl_comm, world, id, rank);
    if (r != ncclSuccess) return mica_nccl_fail("ncclCommInitRank", ncclGetErrorString(r));
    mica_nccl_rank = rank;
    return 0;
}

#define MICA_NCCL_CHECK(call)                                                                                 \
    do {                                                                                                      \
        ncclResult_t r_ = (call);                                                                             \
        if (r_ != ncclSuccess) return mica_nccl_fail(#call, ncclGetErrorString(r_));                          \
    } while (0)

template <typename T>
__global__ void mica_nccl_add(T *o, const T *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        o[i] = o[i] + x[i];
}

/* out = the rank-ordered fold of `world` blocks of n in `received` */
template <typename T>
__global__ void mica_nccl_fold(T *out, const T *received, int64_t n, int world) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T acc = received[i];
        for (int r = 1; r < world; r++) acc = acc + received[(int64_t)r * n + i];
        out[i] = acc;
    }
}

template <typename T>
static ncclDataType_t mica_nccl_type();
template <>
ncclDataType_t mica_nccl_type<float>() { return ncclFloat32; }
template <>
ncclDataType_t mica_nccl_type<double>() { return ncclFloat64; }

static unsigned mica_nccl_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

template <typename T>
static int mica_nccl_all_reduce(T *out, const T *const *in, int m, int64_t n, int world, cudaStream_t stream) {
    if (mica_nccl_ready(world)) return 1;
    int rank = mica_nccl_rank;
    ncclDataType_t type = mica_nccl_type<T>();
    for (int64_t at = 0; at < n; at += MICA_NCCL_CHUNK) {
        int64_t k = n - at < MICA_NCCL_CHUNK ? n - at : MICA_NCCL_CHUNK;
        int first = 0;
        if (rank == 0) {
            cudaMemcpyAsync(out + at, in[0] + at, (size_t)k * sizeof(T), cudaMemcpyDeviceToDevice, stream);
            first = 1;
        } else {
            MICA_NCCL_CHECK(ncclRecv(out + at, (size_t)k, type, rank - 1, mica_nccl_comm, stream));
        }
        for (int j = first; j < m; j++) MICA_LAUNCH(mica_nccl_add<T>, mica_nccl_blocks(k), 256, 0, stream, out + at, in[j] + at, k);
        if (rank < world - 1) MICA_NCCL_CHECK(ncclSend(out + at, (size_t)k, type, rank + 1, mica_nccl_comm, stream));
    }
    MICA_NCCL_CHECK(ncclBroadcast(out, out, (size_t)n, type, world - 1, mica_nccl_comm, stream));
    return 0;
}

template <typename T>
static int mica_nccl_reduce_scatter(T *out, const T *x, int64_t n, int world, T *received, cudaStream_t stream) {
    if (mica_nccl_ready(world)) return 1;
    ncclDataType_t type = mica_nccl_type<T>();
    MICA_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < world; r++) {
        MICA_NCCL_CHECK(ncclSend(x + (int64_t)r * n, (size_t)n, type, r, mica_nccl_comm, stream));
        MICA_NCCL_CHECK(ncclRecv(received + (int64_t)r * n, (size_t)n, type, r, mica_nccl_comm, stream));
    }
    MICA_NCCL_CHECK(ncclGroupEnd());
    MICA_LAUNCH(mica_nccl_fold<T>, mica_nccl_blocks(n), 256, 0, stream, out, received, n, world);
    return 0;
}

template <typename T>
static int mica_nccl_all_gather(T *out, const T *x, int64_t n, int world, cudaStream_t stream) {
    if (mica_nccl_ready(world)) return 1;
    MICA_NCCL_CHECK(ncclAllGather(x, out, (size_t)n, mica_nccl_type<T>(), mica_nccl_comm, stream));
    return 0;
}

#endif
