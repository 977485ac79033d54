/* NCCL for the CUDA simulator (mica_cudasim.h): the calls mica_nccl.h makes, carried out over MPI,
 * so a data-parallel CUDA program runs under `mpirun -np N` on CPUs with the very source nvcc builds
 * against the real NCCL. Device memory is host memory here, so MPI reads and writes it directly.
 *
 * As in NCCL, a call only enqueues its work on the stream (mica_cudasim's closures: run at once,
 * or recorded by a graph capture and run at each replay, in stream order with the kernels around
 * it); the point-to-point calls between ncclGroupStart and ncclGroupEnd are posted together at
 * the group's end (nonblocking sends and receives, then a wait for all), so a group that sends and
 * receives among every rank cannot deadlock. NCCL reports a failure that happens after a call has
 * returned through the communicator; here the closure has no caller to return to, so a failed MPI
 * call ends the process with one sentence (the launcher then stops the other ranks). */
#ifndef MICA_CUDASIM_NCCL_H
#define MICA_CUDASIM_NCCL_H

#include <mpi.h> /* (included first by mica_mpi.h, as MPI's C API alone) */

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5 } ncclResult_t;
typedef enum { ncclFloat32 = 7, ncclFloat64 = 8 } ncclDataType_t;
typedef struct { char internal[128]; } ncclUniqueId;
struct mica_cudasim_nccl_comm {
    int rank, world;
};
typedef mica_cudasim_nccl_comm *ncclComm_t;

namespace mica_cudasim { namespace nccl {

inline MPI_Datatype mpi_type(ncclDataType_t t) { return t == ncclFloat64 ? MPI_DOUBLE : MPI_FLOAT; }

/* a failed MPI call inside a stream's work: the sentence, then the end of this rank */
inline void check(int code, const char *call) {
    if (code == MPI_SUCCESS) return;
    fprintf(stderr, "mica: a collective of this data-parallel run failed (%s in the CUDA simulator's NCCL): another "
                    "rank stopped or cannot be reached\n", call);
    exit(1);
}

struct P2p {
    bool send;
    void *buf;
    size_t count;
    ncclDataType_t type;
    int peer;
};
struct Group {
    int depth = 0;
    cudaStream_t stream = nullptr;
    std::vector<P2p> calls;
};
inline Group &group() {
    static Group g;
    return g;
}

inline void post(const std::vector<P2p> &calls) {
    std::vector<MPI_Request> requests(calls.size());
    for (size_t i = 0; i < calls.size(); i++) {
        const P2p &c = calls[i];
        if (c.send)
            check(MPI_Isend(c.buf, (int)c.count, mpi_type(c.type), c.peer, 0, MPI_COMM_WORLD, &requests[i]), "MPI_Isend");
        else
            check(MPI_Irecv(c.buf, (int)c.count, mpi_type(c.type), c.peer, 0, MPI_COMM_WORLD, &requests[i]), "MPI_Irecv");
    }
    check(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
}

inline ncclResult_t p2p(bool send, void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                        cudaStream_t stream) {
    if (!comm || peer < 0 || peer >= comm->world || count > (size_t)0x7FFFFFFF) return ncclInvalidArgument;
    Group &g = group();
    if (g.depth > 0) {
        g.stream = stream;
        g.calls.push_back(P2p{send, buf, count, type, peer});
        return ncclSuccess;
    }
    std::vector<P2p> one{P2p{send, buf, count, type, peer}};
    ::mica_cudasim::detail::enqueue(stream, [one] { post(one); });
    return ncclSuccess;
}

} }

inline const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "MPI failed";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown error";
}

inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "mica-cudasim-nccl");
    return ncclSuccess;
}

inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int world, ncclUniqueId id, int rank) {
    int size = 0;
    if (!comm || strcmp(id.internal, "mica-cudasim-nccl") != 0) return ncclInvalidArgument;
    if (MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS) return ncclSystemError;
    if (world != size || rank < 0 || rank >= world) return ncclInvalidUsage;
    *comm = new mica_cudasim_nccl_comm{rank, world};
    return ncclSuccess;
}

inline ncclResult_t ncclGroupStart() {
    ::mica_cudasim::nccl::group().depth++;
    return ncclSuccess;
}

inline ncclResult_t ncclGroupEnd() {
    auto &g = ::mica_cudasim::nccl::group();
    if (g.depth == 0) return ncclInvalidUsage;
    if (--g.depth > 0) return ncclSuccess;
    std::vector<::mica_cudasim::nccl::P2p> calls;
    calls.swap(g.calls);
    if (!calls.empty())
        ::mica_cudasim::detail::enqueue(g.stream, [calls] { ::mica_cudasim::nccl::post(calls); });
    return ncclSuccess;
}

inline ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    return ::mica_cudasim::nccl::p2p(true, const_cast<void *>(buf), count, type, peer, comm, stream);
}

inline ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    return ::mica_cudasim::nccl::p2p(false, buf, count, type, peer, comm, stream);
}

/* root's sendbuf to every rank's recvbuf (in place where they are the same buffer) */
inline ncclResult_t ncclBroadcast(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    if (!comm || root < 0 || root >= comm->world || count > (size_t)0x7FFFFFFF) return ncclInvalidArgument;
    if (::mica_cudasim::nccl::group().depth > 0) return ncclInvalidUsage;  /* (mica_nccl.h groups only p2p) */
    const int rank = comm->rank;
    ::mica_cudasim::detail::enqueue(stream, [=] {
        const size_t bytes = count * (type == ncclFloat64 ? 8 : 4);
        if (rank == root && sendbuf != recvbuf) memmove(recvbuf, sendbuf, bytes);
        ::mica_cudasim::nccl::check(MPI_Bcast(recvbuf, (int)count, ::mica_cudasim::nccl::mpi_type(type), root,
                                              MPI_COMM_WORLD), "MPI_Bcast");
    });
    return ncclSuccess;
}

/* every rank's `count` elements, in rank order, into every rank's recvbuf */
inline ncclResult_t ncclAllGather(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t type,
                                  ncclComm_t comm, cudaStream_t stream) {
    if (!comm || count > (size_t)0x7FFFFFFF) return ncclInvalidArgument;
    if (::mica_cudasim::nccl::group().depth > 0) return ncclInvalidUsage;
    const int rank = comm->rank;
    ::mica_cudasim::detail::enqueue(stream, [=] {
        const MPI_Datatype t = ::mica_cudasim::nccl::mpi_type(type);
        const size_t bytes = count * (type == ncclFloat64 ? 8 : 4);
        /* (in place, as NCCL allows: this rank's block of recvbuf is sendbuf) */
        const void *mine = sendbuf == (const char *)recvbuf + bytes * (size_t)rank ? MPI_IN_PLACE : sendbuf;
        ::mica_cudasim::nccl::check(MPI_Allgather(mine, (int)count, t, recvbuf, (int)count, t, MPI_COMM_WORLD),
                                    "MPI_Allgather");
    });
    return ncclSuccess;
}

#endif
