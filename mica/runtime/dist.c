/* Data parallelism: the trainer's side of an `mpirun -np N mica train` run.
 *
 * Every rank runs the same trainer and the same programs; the train program's collectives
 * (mica_collectives.h) sum the gradients. This module starts MPI, checks that every rank was
 * prepared the same way (a hash of the configuration and programs, compared over MPI before the
 * first step), and gives the loop the few agreements it needs: rank 0's evaluation broadcast, and
 * whether any rank was interrupted. Built without MPI (-DMICA_MPI absent) it serves one rank only.
 *
 * Faults: MPI_ERRORS_RETURN makes a failed call a sentence rather than MPI's abort text; a rank
 * that dies makes mpirun end the others with SIGTERM, and a rank of a multi-rank run then stops at
 * once with one sentence (its checkpoints are written to a temporary file and renamed, so the last
 * good one is whole). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

#ifdef MICA_MPI
#include <mpi.h>
#endif

static char stop_text[1024] = "mica: stopped by a signal\n";

void dist_set_stop_text(const char *text) {
    snprintf(stop_text, sizeof stop_text, "mica: rank %lld of %lld stopped: %s\n", (long long)S.rank,
             (long long)S.world, text);
}

static void stop_now(int sig) {
    (void)sig;
    ssize_t r = write(2, stop_text, strlen(stop_text));
    (void)r;
    _exit(143);
}

/* the ranks must all join within MICA_START_TIMEOUT seconds (default 600) of this one, or it stops */
static char late_text[512];

static void too_late(int sig) {
    (void)sig;
    ssize_t r = write(2, late_text, strlen(late_text));
    (void)r;
    _exit(2);
}

static unsigned start_timeout(void) {
    const char *text = getenv("MICA_START_TIMEOUT");
    char *end;
    long v = text ? strtol(text, &end, 10) : 0;
    if (text && *text && !*end && v > 0 && v < 86400) return (unsigned)v;
    if (text)
        fprintf(stderr, "mica: warning: MICA_START_TIMEOUT=%.40s is not a count of seconds from 1 to 86399; waiting "
                "the default 600 s\n", text);
    return 600;
}

void dist_init(void) {
    if (S.world <= 1) return;
#ifndef MICA_MPI
    die(2, "this trainer was built without MPI but the manifest asks for %lld ranks; install Open MPI (apt-get install "
        "openmpi-bin libopenmpi-dev) and run mica train again", (long long)S.world);
#else
    /* a rank of a multi-rank run cannot stop at a safe point alone (the others would wait for it in the
     * next collective), so a signal ends it at once, in one sentence */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop_now;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    dist_set_stop_text("mpirun ended this run (another rank failed or the run was interrupted); this run saved no "
                       "checkpoint");
    unsigned timeout = start_timeout();
    snprintf(late_text, sizeof late_text, "mica: rank %lld of %lld stopped: the other ranks did not all join within %u s "
             "(one failed to start, or is still compiling: raise MICA_START_TIMEOUT); this run saved no checkpoint\n",
             (long long)S.rank, (long long)S.world, timeout);
    signal(SIGALRM, too_late);
    alarm(timeout);
    int provided, size, rank;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        die(2, "MPI could not start this rank; start the run with mpirun -np %lld mica train ...", (long long)S.world);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size != S.world || rank != S.rank)
        die(2, "MPI says this is rank %d of %d but mica train prepared rank %lld of %lld; start every rank with the same "
            "mpirun", rank, size, (long long)S.rank, (long long)S.world);
    /* the same configuration and programs on every rank, or no step at all */
    char mine[65] = {0}, *all = calloc((size_t)size, 65);
    if (!all) die(2, "cannot allocate the ranks' hashes");
    snprintf(mine, sizeof mine, "%s", S.run_hash ? S.run_hash : "");
    if (MPI_Allgather(mine, 65, MPI_CHAR, all, 65, MPI_CHAR, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(2, "the ranks could not exchange their configuration hashes: another rank did not start");
    for (int r = 1; r < size; r++)
        if (strcmp(all + 65 * r, all)) {
            if (rank == 0 || rank == r)
                die(2, "rank %d was prepared with another configuration or program than rank 0 (a different config "
                    "file, override, data or Mica version); start every rank with the same command", r);
            die(2, "rank %d's configuration differs from rank 0's; this rank stops too", r);
        }
    free(all);
    alarm(0);
#endif
}

void dist_finalize(void) {
#ifdef MICA_MPI
    if (S.world > 1) MPI_Finalize();
#endif
}

/* rank 0's values, on every rank */
void dist_broadcast(double *values, int n) {
#ifdef MICA_MPI
    if (S.world > 1 && MPI_Bcast(values, n, MPI_DOUBLE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(2, "rank 0 stopped answering (its evaluation did not arrive); see its message");
#else
    (void)values;
    (void)n;
#endif
}

/* whether `flag` is set on any rank */
int dist_any(int flag) {
#ifdef MICA_MPI
    int any = flag;
    if (S.world > 1 && MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(2, "another rank stopped answering; see its message");
    return any;
#else
    return flag;
#endif
}

/* ZeRO-1's checkpoint: each rank's optimizer-state shards travel to rank 0, which writes them */
#define CHECKPOINT_TAG 7

void dist_send_to_root(const void *data, int64_t n) {
#ifdef MICA_MPI
    if (MPI_Send(data, (int)n, MPI_BYTE, 0, CHECKPOINT_TAG, MPI_COMM_WORLD) != MPI_SUCCESS)
        die(2, "rank 0 stopped answering while this rank sent it its share of a checkpoint; see its message");
#else
    (void)data;
    (void)n;
    die(2, "internal: a one-process trainer has no rank 0 to send to");
#endif
}

int dist_recv_from(int owner, void *data, int64_t n) {
#ifdef MICA_MPI
    return MPI_Recv(data, (int)n, MPI_BYTE, owner, CHECKPOINT_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS;
#else
    (void)owner;
    (void)data;
    (void)n;
    return 1;
#endif
}
