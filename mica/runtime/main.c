/* The trainer's entry point: read the manifest, then train or sample. Every error is one sentence
 * on stderr ("mica: error: ...") and a non-zero exit; Ctrl-C stops at the next safe point. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"

volatile sig_atomic_t interrupted;

void die(int code, const char *fmt, ...) {
    va_list ap;
    char line[4096];
    int n = snprintf(line, sizeof line, "mica: error: ");
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    log_clear_progress();
    fflush(stdout);
    fputs(line, stderr); /* (one write: the ranks of a run share the terminal, and pieces would interleave) */
    exit(code);
}

double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void on_signal(int sig) {
    interrupted = sig; /* the loop stops at its next safe point; a second signal ends it at once */
}

int main(int argc, char **argv) {
    if (argc != 2) die(2, "usage: %s MANIFEST (this program is started by `mica train` and `mica sample`)", argv[0]);
    read_manifest(argv[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART; /* a write in progress finishes; the loop stops after it */
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    struct sigaction hup;
    if (sigaction(SIGHUP, 0, &hup) == 0 && hup.sa_handler != SIG_IGN) /* (nohup's: ignored, it stays so) */
        sigaction(SIGHUP, &sa, 0); /* (a closed terminal: the same safe stop and sentence as SIGTERM's) */
    dist_init();
    if (!strcmp(S.mode, "train")) {
        int code = !strcmp(S.loop, "speedrun") ? speedrun_loop() : train_loop();
        dist_finalize();
        return code;
    }
    return sample();
}
