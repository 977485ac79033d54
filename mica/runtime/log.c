/* What the trainer tells the user: metrics.jsonl (every logged value) and the progress line. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

static FILE *metrics;
static int tty = -1;

/* a scratch run starts a fresh file; a resumed one appends to the run it continues */
void log_open_metrics(int append) {
    char path[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", S.out_dir);
    metrics = fopen(path, append ? "a+" : "w");
    if (!metrics) die(2, "cannot write %s: %s; check that the folder is writable", path, strerror(errno));
    if (append && fseek(metrics, -1, SEEK_END) == 0 && fgetc(metrics) != '\n') /* a run killed mid-line */
        fputc('\n', metrics);
}

/* a line of metrics.jsonl; when the disk is full it says so once (training goes on, and a
 * checkpoint that cannot be written stops it with its own sentence) */
void log_metrics(const char *fmt, ...) {
    static int warned;
    if (!metrics) return;
    va_list ap;
    va_start(ap, fmt);
    int ok = vfprintf(metrics, fmt, ap) >= 0;
    va_end(ap);
    ok = fputc('\n', metrics) != EOF && ok;
    ok = fflush(metrics) == 0 && ok;
    if (!ok && !warned) {
        warned = 1;
        log_clear_progress();
        fprintf(stderr, "mica: warning: cannot write %s/metrics.jsonl (%s); its lines from here on are lost, "
                "training goes on\n", S.out_dir, strerror(errno));
    }
}

void log_close_metrics(void) {
    if (metrics) fclose(metrics);
    metrics = 0;
}

/* the progress line is for a person at a terminal; under mpirun a rank's stdout is Open MPI's
 * pseudo-terminal even when the user's output goes to a file, so ranks never draw it */
static int on_tty(void) {
    if (tty < 0) tty = isatty(1) && S.world <= 1;
    return tty;
}

void log_clear_progress(void) {
    if (on_tty() == 1) {
        printf("\r\033[K");
        fflush(stdout);
    }
}

void log_progress(int64_t iter, double tok_per_s, double eta) {
    if (on_tty() != 1) return;
    printf("\r  iter %lld/%lld  %.0f tok/s  ETA %dm%02ds", (long long)iter, (long long)S.max_iters, tok_per_s,
           (int)eta / 60, (int)eta % 60);
    fflush(stdout);
}
