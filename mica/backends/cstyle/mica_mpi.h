/* Joining MPI, for a program compiled for several ranks on either target: the CPU's collectives
 * (mica_collectives.h) and the cards' (mica_nccl.h) both start here. The trainer's runtime has
 * joined MPI already (mica/runtime/dist.c); a program loaded by Python joins on its first
 * collective and leaves at exit. Either way a failed MPI call returns its code (MPI_ERRORS_RETURN),
 * so a dead peer becomes the caller's sentence rather than MPI's abort. */
#ifndef MICA_MPI_H
#define MICA_MPI_H

#ifndef OMPI_SKIP_MPICXX  /* (C++: MPI's C API alone, not Open MPI's old C++ bindings and their library) */
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stdlib.h>

/* the sentence for a world size other than the program's: printf's arguments, compiled world, actual */
#define MICA_MPI_WORLD_TEXT \
    "this program was compiled for %lld ranks but runs among %lld: start it with mpirun -np and the world size it " \
    "was built for"

static void mica_mpi_finalize_at_exit(void) {
    int done;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

/* the number of ranks MPI runs (joining first where this process has not); sets *rank */
static int mica_mpi_join(int *rank) {
    int init, size;
    MPI_Initialized(&init);
    if (!init) {
        int provided;
        MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        atexit(mica_mpi_finalize_at_exit);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    return size;
}

#endif
