/* What the trainer tells the user: metrics.jsonl (every logged value) and the progress line. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

static FILE *metrics;
static int tty = -1;

/* A scratch run starts a fresh file; a resumed one appends to the run it continues. A run that
 * starts in a folder holding an earlier run's checkpoint (S.pending 1: mica train's note says its
 * first save replaces that run) keeps that run's metrics.jsonl and init.safetensors until its own
 * first checkpoint: it logs to metrics.jsonl.new, starts from init.new.safetensors, and log_keep_run
 * renames both into place. A run that saves none (stopped by Ctrl-C, a non-finite loss or a failure,
 * or finished without a save) leaves the earlier run's files as they were. A resume whose log leaves
 * out rows the stopped run wrote after its checkpoint (S.pending 2: mica train wrote the rows it
 * keeps to metrics.jsonl.new) appends to that file, renamed into place the same way. */
void log_open_metrics(int append) {
    char path[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl%s", S.out_dir, S.pending ? ".new" : "");
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

/* this run's log and start are now the folder's (its first checkpoint): S.pending's
 * files renamed into place, the earlier run's replaced (the open log goes on in the renamed file) */
void log_keep_run(void) {
    if (!S.pending) return;
    int files = S.pending == 2 ? 1 : 2; /* (a resume has no start of its own: an init.new.safetensors there is a
                                           stopped scratch run's, never the resumed run's) */
    S.pending = 0;
    if (S.rank != 0) return;
    const char *names[2][2] = {{"metrics.jsonl.new", "metrics.jsonl"}, {"init.new.safetensors", "init.safetensors"}};
    for (int i = 0; i < files; i++) {
        char from[8192], to[8192];
        snprintf(from, sizeof from, "%s/%s", S.out_dir, names[i][0]);
        snprintf(to, sizeof to, "%s/%s", S.out_dir, names[i][1]);
        if (rename(from, to) != 0 && errno != ENOENT)
            fprintf(stderr, "mica: warning: cannot rename %s to %s (%s); this run's file keeps its name\n", from, to,
                    strerror(errno));
    }
}

/* the end of a run that finished, then the log closes. One that saved no checkpoint in a folder holding
 * an earlier run's (S.pending 1 still: --max_iters=0, --eval_only, or no eval after iter 0) leaves that
 * run whole, as nanoGPT writes nothing then: its start goes, its log stays as metrics.jsonl.new. A
 * resume that finished (S.pending 2) makes its log the run's, as its first save would have. */
void log_finish_metrics(void) {
    log_close_metrics();
    if (!S.pending || S.rank != 0) return;
    if (S.pending == 2) { /* a resume that finished: its log is the run's, saved or not */
        log_keep_run();
        return;
    }
    char path[8192];
    snprintf(path, sizeof path, "%s/init.new.safetensors", S.out_dir);
    unlink(path);
    printf("note: this run saved no checkpoint, so the earlier run's ckpt.safetensors, metrics.jsonl and "
           "init.safetensors in %s stay as they were; this run's log is metrics.jsonl.new\n", S.out_dir);
    fflush(stdout);
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

/* ---- what a stopped run left: the sentences of the nanoGPT loop (loop.c, "iter") and the speedrun's
 * (speedrun.c, "step"); `saved` is the iter or step of this run's last checkpoint, -1 for none */

const char *log_last_good(const char *unit, int64_t saved) {
    static char text[8400];
    if (saved >= 0 && S.pending == 2)
        snprintf(text, sizeof text, "the last good checkpoint, %s/ckpt.safetensors (%s %lld), is untouched, and so is "
                 "metrics.jsonl (this resume's log is metrics.jsonl.new)", S.out_dir, unit, (long long)saved);
    else if (saved >= 0)
        snprintf(text, sizeof text, "the last good checkpoint, %s/ckpt.safetensors (%s %lld), is untouched", S.out_dir,
                 unit, (long long)saved);
    else if (S.pending)
        snprintf(text, sizeof text, "this run saved no checkpoint (the earlier run's ckpt.safetensors, metrics.jsonl "
                 "and init.safetensors in %s are untouched; this run's log is metrics.jsonl.new)", S.out_dir);
    else
        snprintf(text, sizeof text, "this run saved no checkpoint (any ckpt.safetensors in %s is from an earlier run, "
                 "untouched)", S.out_dir);
    return text;
}

/* what a rank of a multi-rank run says when a signal ends it (dist.c); after each save */
void log_stop_text(const char *unit, int64_t saved) {
    if (S.world > 1) {
        char text[8600];
        snprintf(text, sizeof text, "mpirun ended this run (another rank failed or the run was interrupted); %s",
                 log_last_good(unit, saved));
        dist_set_stop_text(text);
    }
}

/* Ctrl-C's sentence, `during` ("after", "while evaluating at") `unit` `at`, and its row in metrics.jsonl
 * (which a resume drops with the other rows after its checkpoint); the file closed */
int log_interrupted(const char *during, const char *unit, int64_t at, int64_t saved) {
    int sig = interrupted ? (int)interrupted : SIGINT;
    const char *how = sig == SIGTERM ? "stopped by SIGTERM" : sig == SIGHUP ? "stopped by SIGHUP" : "interrupted";
    log_clear_progress();
    fflush(stdout);
    if (saved >= 0)
        fprintf(stderr, "mica: %s %s %s %lld; the last good checkpoint is %s/ckpt.safetensors (%s %lld): "
                "resume with --init_from=resume\n", how, during, unit, (long long)at, S.out_dir, unit, (long long)saved);
    else
        fprintf(stderr, "mica: %s %s %s %lld; %s\n", how, during, unit, (long long)at, log_last_good(unit, saved));
    log_metrics("{\"iter\": %lld, \"stopped\": \"interrupted\"}", (long long)at); /* (a training row's key) */
    log_close_metrics();
    return 128 + sig; /* (the status a shell gives a program that signal ended: 130 for Ctrl-C) */
}
