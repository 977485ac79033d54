/* nanoGPT's training loop around the compiled programs: estimate_loss over eval_iters batches per
 * split, one optimizer step per iteration (the train program does the micro-batches, clipping,
 * schedule and AdamW), nanoGPT's log lines, checkpoints, and a clean stop on Ctrl-C.
 *
 * In a data-parallel run every rank draws every batch row one process would draw (so the
 * generator, and the data the run sees, do not depend on the world size) and feeds the train
 * program its contiguous share of the micro-batches; rank 0 alone evaluates (its losses are
 * broadcast, so every rank takes the same decisions), logs and writes checkpoints. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static FILE *order_file;
static token_set train_data, val_data;
static int64_t *batch_x, *batch_y; /* host staging of one batch, copied into the arenas */

/* a training batch row: from the recorded order when one is given, else from the generator */
static int64_t draw_offset(const token_set *data, int training) {
    if (order_file && training) {
        long long off;
        if (fscanf(order_file, "%lld", &off) != 1)
            die(2, "the batch order file %s ran out of offsets; it needs batch_size x gradient_accumulation_steps "
                   "offsets per iteration: record a longer order, or train fewer max_iters", S.batch_order);
        if (off < 0 || off >= data->windows)
            die(2, "batch order offset %lld does not fit the training data (%lld rows)", off, (long long)data->windows);
        return off;
    }
    return rng_uniform(data->windows);
}

static void fill_batch(int which, int64_t x_input, int64_t y_input, const token_set *data, const int64_t *offs,
                       int64_t rows) {
    for (int64_t r = 0; r < rows; r++) tokens_row(data, offs[r], batch_x + r * S.block, batch_y + r * S.block);
    prog_set_input(which, (int)x_input, batch_x);
    prog_set_input(which, (int)y_input, batch_y);
}

static int64_t last_saved = -1; /* the iteration of the last good checkpoint, -1: none from this run */

static const char *last_good(void) { return log_last_good("iter", last_saved); }
static void update_stop_text(void) { log_stop_text("iter", last_saved); }
static int stop_interrupted(int64_t iter, const char *during) { return log_interrupted(during, "iter", iter, last_saved); }

/* the eval program gets the train program's current parameters, through the staging buffer */
void copy_parameters_to_eval(void) {
    char *buffer = staging();
    for (int i = 0; i < S.nslots; i++) {
        const slot *s = &S.slots[i];
        if (s->kind != 0 || s->input[ARENA_EVAL] < 0) continue;
        for (int64_t at = 0; at < s->nbytes; at += STAGING_BYTES) {
            int64_t n = s->nbytes - at < STAGING_BYTES ? s->nbytes - at : STAGING_BYTES;
            prog_get_input_part(ARENA_TRAIN, (int)s->input[ARENA_TRAIN], at, n, buffer);
            prog_set_input_part(ARENA_EVAL, (int)s->input[ARENA_EVAL], at, n, buffer);
        }
    }
}

/* the mean loss of eval_iters batches; NAN when interrupted */
static double estimate_split(const token_set *data, int64_t *offs) {
    void *ev = prog_arena(ARENA_EVAL);
    double total = 0;
    for (int64_t k = 0; k < S.eval_iters; k++) {
        if (interrupted) return NAN;
        for (int64_t r = 0; r < S.batch; r++) offs[r] = draw_offset(data, 0);
        if (S.rank != 0) continue; /* (the other ranks keep the generator in step) */
        fill_batch(ARENA_EVAL, S.ev_x, S.ev_y, data, offs, S.batch);
        if (eval_run(ev, (int)S.threads, S.seed, 0) != 0) die(2, "%s", eval_error());
        float loss;
        prog_get_output(ARENA_EVAL, (int)S.ev_loss, &loss);
        total += loss;
    }
    return total / (double)S.eval_iters;
}

int train_loop(void) {
    tokens_open(&train_data, S.train_files, S.n_train_files, "training data");
    tokens_open(&val_data, S.val_files, S.n_val_files, "validation data");
    void *tr = prog_arena(ARENA_TRAIN);
    prog_arena(ARENA_EVAL);
    checkpoint_load(ARENA_TRAIN);
    if (S.batch_order && S.batch_order[0] && !(order_file = fopen(S.batch_order, "r")))
        die(2, "cannot read the batch order file %s: %s", S.batch_order, strerror(errno));
    int64_t rows = S.accum * S.batch, iter = 0, local_iter = 0;
    int64_t *next = calloc(rows, 8), *eval_offs = calloc(S.batch, 8);
    batch_x = malloc(rows * S.block * 8);
    batch_y = malloc(rows * S.block * 8);
    if (!next || !eval_offs || !batch_x || !batch_y) die(2, "cannot allocate the batch buffers");
    uint64_t before_eval[4];
    double best_val_loss = 1e9;
    rng_seed((uint64_t)S.seed);
    if (S.resume) {
        iter = S.resume_iter;
        best_val_loss = S.resume_best;
        last_saved = iter;
    }
    update_stop_text();
    /* A resume takes the batch its checkpoint drew for this iteration, unless a batch order is given:
     * that file's offsets are this run's from its first iteration on, the first one included (as for a
     * resume of an imported checkpoint, which holds no batch). */
    if (S.resume && S.n_resume_next) {
        if (!S.has_resume_rng) die(2, "the checkpoint has a data position but no generator state; it is damaged");
        rng_set(S.resume_rng);
    }
    if (S.resume && S.n_resume_next && !order_file) {
        for (int64_t r = 0; r < rows; r++)
            if (S.resume_next[r] < 0 || S.resume_next[r] >= train_data.windows)
                die(2, "the checkpoint's data position (row offset %lld) lies outside the training data (%lld rows): "
                    "resume with the data the run was trained on, or start afresh with --init_from=scratch",
                    (long long)S.resume_next[r], (long long)train_data.windows);
        memcpy(next, S.resume_next, rows * 8);
    } else {
        for (int64_t r = 0; r < rows; r++) next[r] = draw_offset(&train_data, 1);
    }
    if (S.rank == 0) log_open_metrics(S.resume != 0);
    double t0 = now(), running_mfu = -1.0, started = now();
    int64_t started_iter = iter;
    for (;;) {
        /* a checkpoint holds the generator as it stands here, and the batch already drawn for this
         * iteration: a resumed run redoes this evaluation with the same batches, then goes on */
        rng_get(before_eval);
        if (iter % S.eval_interval == 0) {
            log_clear_progress();
            if (S.rank == 0) copy_parameters_to_eval();
            double lt = estimate_split(&train_data, eval_offs), lv = estimate_split(&val_data, eval_offs);
            double losses[2] = {lt, lv};
            dist_broadcast(losses, 2);
            lt = losses[0], lv = losses[1];
            if (interrupted) return stop_interrupted(iter, "while evaluating at");
            if (!isfinite(lt) || !isfinite(lv)) {
                log_clear_progress();
                if (S.rank == 0) fprintf(stderr, "mica: error: the evaluated loss is not finite at step %lld (train %g, val %g), so "
                        "training stopped without saving; %s\n", (long long)iter, fabs(lt), fabs(lv), last_good());
                log_metrics("{\"step\": %lld, \"train_loss\": null, \"val_loss\": null, \"stopped\": "
                            "\"non-finite loss\"}", (long long)iter);
                log_close_metrics();
                return 3;
            }
            if (S.rank == 0) printf("step %lld: train loss %.4f, val loss %.4f\n", (long long)iter, lt, lv);
            fflush(stdout);
            log_metrics("{\"step\": %lld, \"train_loss\": %.9g, \"val_loss\": %.9g}", (long long)iter, lt, lv);
            if (lv < best_val_loss || S.always_save) {
                best_val_loss = lv;
                if (iter > 0) {
                    checkpoint_save(iter, best_val_loss, next, rows, before_eval); /* (rank 0 writes) */
                    log_keep_run();
                    last_saved = iter;
                    update_stop_text();
                    if (S.rank == 0) printf("saving checkpoint to %s\n", S.out_dir);
                }
            }
            /* the eval drew from the generator: what follows continues from here, as nanoGPT's does */
        }
        if (iter == 0 && S.eval_only) break;
        fill_batch(ARENA_TRAIN, S.tr_x, S.tr_y, &train_data, next + S.rank * (rows / S.world), rows / S.world);
        prog_set_input(ARENA_TRAIN, (int)S.tr_iter, &iter);
        if (iter < S.max_iters) /* the batch after the last one is never used: not drawn */
            for (int64_t r = 0; r < rows; r++) next[r] = draw_offset(&train_data, 1);
        if (train_run(tr, (int)S.threads, S.seed, iter) != 0) die(2, "%s", train_error());
        float loss;
        double lr;
        prog_get_output(ARENA_TRAIN, (int)S.tr_loss, &loss);
        prog_get_output(ARENA_TRAIN, (int)S.tr_lr, &lr);
        double t1 = now(), dt = t1 - t0;
        t0 = t1;
        if (!isfinite(loss)) {
            log_clear_progress();
            fflush(stdout);
            if (S.rank == 0) fprintf(stderr, "mica: error: the loss is %s at iter %lld, so training stopped; %s\n",
                    isnan(loss) ? "nan" : "infinite", (long long)iter, last_good());
            log_metrics("{\"iter\": %lld, \"loss\": null, \"stopped\": \"non-finite loss\"}", (long long)iter);
            log_close_metrics();
            return 3;
        }
        if (iter % S.log_interval != 0 && S.time_every_iter) /* the trainer's own clock, for mica bench */
            log_metrics("{\"iter\": %lld, \"time_ms\": %.3f}", (long long)iter, dt * 1000);
        if (iter % S.log_interval == 0 && S.rank == 0) {
            if (local_iter >= 5) {
                double mfu = S.flops_per_iter / dt / S.peak_flops;
                running_mfu = running_mfu == -1.0 ? mfu : 0.9 * running_mfu + 0.1 * mfu;
            }
            log_clear_progress();
            printf("iter %lld: loss %.4f, time %.2fms, mfu %.2f%%\n", (long long)iter, loss, dt * 1000,
                   running_mfu * 100);
            fflush(stdout);
            log_metrics("{\"iter\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"time_ms\": %.3f, \"mfu\": %.5f}",
                        (long long)iter, loss, lr, dt * 1000, running_mfu);
        }
        iter++;
        local_iter++;
        if (interrupted && iter <= S.max_iters) return stop_interrupted(iter - 1, "after");
        double el = now() - started, rate = (iter - started_iter) / (el > 0 ? el : 1e-9);
        if (iter > S.max_iters) break;
        /* (under mpirun a rank's stdout is a pseudo-terminal even when the job's output goes to a file) */
        if (S.rank == 0 && S.world == 1)
            log_progress(iter, rate * S.batch * S.accum * S.block, (S.max_iters - iter) / (rate > 0 ? rate : 1e-9));
    }
    log_clear_progress();
    log_finish_metrics();
    return 0;
}
