/* The speedrun seed's training loop (train_gpt_simple.py) around the compiled programs: batches
 * taken in order from the shards as its distributed_data_generator takes them, the validation set
 * being the first val_tokens + 1 tokens of the first val shard longer than that (as the seed's
 * generator takes one batch of val_tokens), a validation every val_every steps and after the
 * last, its log lines, and a checkpoint at each validation.
 *
 * The loop's sizes come in the shared settings: block = seq_len, batch = mbs (sequences per
 * micro-batch), accum = micro-batches per step, max_iters = train_steps, eval_interval =
 * val_every, eval_iters = micro-batches in the validation set; stop_at > 0 ends the run after that
 * step, validated and saved, to be resumed later (the schedule still runs to train_steps).
 *
 * In a data-parallel run every rank walks the same stream of batches and reads its contiguous
 * share of each (the seed's `pos + rank * local_batch_size`), so the data does not depend on the
 * world size; the train program sums the gradients and losses across the ranks; rank 0 alone
 * validates (its loss is broadcast, so every rank takes the same decisions), logs and saves. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* the seed's generator at world size 1: the shard being read and the position in it */
typedef struct {
    const token_set *set;
    int file;
    int64_t pos;
} token_stream;

static void stream_open(token_stream *s, const token_set *set) {
    s->set = set;
    s->file = 0;
    s->pos = 0;
}

/* where the next batch of `tokens` + 1 starts: the seed moves to the next shard when
 * pos + batch_size + 1 >= len(tokens), dropping the rest of the current one */
static void stream_next(token_stream *s, int64_t tokens, int *file, int64_t *pos) {
    const token_set *set = s->set;
    if (s->pos + tokens + 1 >= set->files[s->file].n) {
        if (s->file + 1 >= set->nfiles)
            die(2, "the %s ran out: its %d shards hold no further batch of %lld tokens; give more shards or fewer "
                "train_steps", set->what, set->nfiles, (long long)tokens);
        s->file++;
        s->pos = 0;
        if (set->files[s->file].n < tokens + 1)
            die(2, "the %s shard %s holds %lld tokens, fewer than one batch of %lld + 1 (the seed's loader fails "
                "there too); prepare larger shards or a smaller batch_size", set->what, set->files[s->file].path,
                (long long)set->files[s->file].n, (long long)tokens);
    }
    *file = s->file;
    *pos = s->pos;
    s->pos += tokens;
}

/* x = the batch's tokens, y = the same shifted by one, as int64 */
static void read_batch(const token_set *set, int file, int64_t pos, int64_t tokens, int64_t *x, int64_t *y) {
    const token_file *t = &set->files[file];
    const uint16_t *row = t->tok + pos;
    for (int64_t i = 0; i <= tokens; i++)
        if (row[i] >= S.vocab)
            die(2, "the %s shard %s holds token id %u at position %lld, beyond the vocabulary of %lld; prepare it "
                "again, or train with a larger vocab_size", set->what, t->path, row[i], (long long)(pos + i),
                (long long)S.vocab);
    for (int64_t i = 0; i < tokens; i++) {
        x[i] = row[i];
        y[i] = row[i + 1];
    }
}

/* the seed's validation: the summed loss of each micro-batch, added in float32, over val_tokens */
static float validate(const int64_t *vx, const int64_t *vy) {
    void *ev = prog_arena(ARENA_EVAL);
    int64_t cells = S.batch * S.block;
    float total = 0;
    copy_parameters_to_eval();
    for (int64_t k = 0; k < S.eval_iters; k++) {
        if (interrupted) return NAN;
        prog_set_input(ARENA_EVAL, (int)S.ev_x, vx + k * cells);
        prog_set_input(ARENA_EVAL, (int)S.ev_y, vy + k * cells);
        if (eval_run(ev, (int)S.threads, S.seed, 0) != 0) die(2, "%s", eval_error());
        float loss;
        prog_get_output(ARENA_EVAL, (int)S.ev_loss, &loss);
        total += loss;
    }
    return total / (float)(S.eval_iters * cells);
}

int speedrun_loop(void) {
    static token_set train_data, val_data;
    tokens_open(&train_data, S.train_files, S.n_train_files, "training data");
    tokens_open(&val_data, S.val_files, S.n_val_files, "validation data");
    void *tr = prog_arena(ARENA_TRAIN);
    prog_arena(ARENA_EVAL);
    checkpoint_load(ARENA_TRAIN);
    int64_t tokens = S.accum * S.batch * S.block, local = tokens / S.world, val_tokens = S.eval_iters * S.batch * S.block;
    int64_t *x = malloc(local * 8), *y = malloc(local * 8), *vx = malloc(val_tokens * 8), *vy = malloc(val_tokens * 8);
    if (!x || !y || !vx || !vy) die(2, "cannot allocate the batch buffers");
    token_stream val, train;
    int file;
    int64_t pos;
    stream_open(&val, &val_data);
    stream_next(&val, val_tokens, &file, &pos);
    read_batch(&val_data, file, pos, val_tokens, vx, vy);
    stream_open(&train, &train_data);
    int64_t step = 0, start = 0;
    if (S.resume) { /* the generator is a function of the step: skip the batches already trained on */
        start = step = S.resume_iter;
        for (int64_t k = 0; k < step; k++) stream_next(&train, tokens, &file, &pos);
        if (S.n_resume_next == 2 && (S.resume_next[0] != train.file || S.resume_next[1] != train.pos))
            die(2, "the checkpoint was trained on other shards (its next batch is at shard %lld, token %lld; these "
                "shards give shard %d, token %lld): resume with the data the run was trained on",
                (long long)S.resume_next[0], (long long)S.resume_next[1], train.file, (long long)train.pos);
    }
    if (S.rank == 0) log_open_metrics(S.resume != 0);
    uint64_t no_generator[4] = {0, 0, 0, 0};
    /* a resumed run goes on as the run straight through: its train_time from the straight run's row, and no
     * second validation of the step it resumes at (the checkpoint was saved right after that one, its
     * row already in metrics.jsonl) */
    double training_time = S.resume ? S.resume_time : 0, t0 = now();
    int64_t saved_at = S.resume ? S.resume_iter : -1; /* the step of the last good checkpoint; -1: none of this run's */
    for (;; step++) {
        /* --------------- VALIDATION SECTION ----------------- */
        int last = step == S.max_iters || (S.stop_at > 0 && step == S.stop_at);
        if (S.resume && step == start) {
            if (last) break;
        } else if (last || step % S.eval_interval == 0) {
            training_time += now() - t0;
            log_clear_progress();
            double shared = S.rank == 0 ? validate(vx, vy) : 0;
            dist_broadcast(&shared, 1);
            float val_loss = (float)shared;
            if (interrupted) return log_interrupted("while validating at", "step", step, saved_at);
            int64_t done = step > 1 ? step : 1;
            if (S.rank == 0) printf("step:%lld/%lld val_loss:%.5f train_time:%.3fs step_avg:%.2fms\n", (long long)step,
                   (long long)S.max_iters, val_loss, training_time, 1000 * training_time / done);
            fflush(stdout);
            log_metrics("{\"step\": %lld, \"val_loss\": %.9g, \"train_time\": %.6f}", (long long)step, val_loss,
                        training_time);
            if (!isfinite(val_loss)) {
                if (S.rank == 0) fprintf(stderr, "mica: error: the validation loss is not finite at step %lld, so training stopped "
                        "without saving; %s\n", (long long)step, log_last_good("step", saved_at));
                log_close_metrics();
                return 3;
            }
            if (step > start) {
                int64_t next[2] = {train.file, train.pos};
                checkpoint_save(step, val_loss, next, 2, no_generator); /* (rank 0 writes) */
                log_keep_run();
                saved_at = step;
                log_stop_text("step", saved_at);
            }
            t0 = now();
        }
        if (last) break;

        /* --------------- TRAINING SECTION ----------------- */
        double before = now(); /* (the step's own time, as mica bench compares with its outside clock) */
        stream_next(&train, tokens, &file, &pos);
        read_batch(&train_data, file, pos + S.rank * local, local, x, y);
        prog_set_input(ARENA_TRAIN, (int)S.tr_x, x);
        prog_set_input(ARENA_TRAIN, (int)S.tr_y, y);
        prog_set_input(ARENA_TRAIN, (int)S.tr_iter, &step);
        if (train_run(tr, (int)S.threads, S.seed, step) != 0) die(2, "%s", train_error());
        float loss;
        double lr;
        prog_get_output(ARENA_TRAIN, (int)S.tr_loss, &loss);
        prog_get_output(ARENA_TRAIN, (int)S.tr_lr, &lr);
        if (!isfinite(loss)) {
            log_clear_progress();
            if (S.rank == 0) fprintf(stderr, "mica: error: the training loss is %s at step %lld, so training stopped; %s\n",
                    isnan(loss) ? "nan" : "infinite", (long long)step, log_last_good("step", saved_at));
            log_metrics("{\"iter\": %lld, \"loss\": null, \"stopped\": \"non-finite loss\"}", (long long)step);
            log_close_metrics();
            return 3;
        }
        double approx_training_time = training_time + (now() - t0);
        log_metrics("{\"iter\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"time_ms\": %.3f}", (long long)step,
                    loss / (double)tokens, lr, (now() - before) * 1000);
        if ((step + 1) % S.log_interval == 0 && S.rank == 0) {
            log_clear_progress();
            printf("step:%lld/%lld train_time:%.3fs step_avg:%.2fms\n", (long long)(step + 1), (long long)S.max_iters,
                   approx_training_time, 1000 * approx_training_time / (step + 1));
            fflush(stdout);
        }
        if (interrupted) return log_interrupted("after", "step", step + 1, saved_at);
    }
    log_clear_progress();
    log_finish_metrics();
    return 0;
}
