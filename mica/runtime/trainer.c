/* Mica's native trainer: the loop around compiled programs, with no Python in it.
 *
 * Linked with three generated programs — train_ (one optimizer step: forward, backward over the
 * micro-batches, clipping, schedule, AdamW, state updated in place), eval_ (the loss of one
 * batch) and logits_ (all logits of one window, for sampling) — it runs nanoGPT's loop: batches
 * from memory-mapped token files (seeded random offsets, or a recorded order), estimate_loss
 * over eval_iters batches per split, nanoGPT's log lines, metrics.jsonl, safetensors
 * checkpoints written to a temporary file and renamed, bitwise-exact resume, and sampling.
 *
 * It is started by `mica train` / `mica sample` with a manifest: one setting per line,
 * "key value...", naming every arena slot it touches (the Python side knows the memory plan).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* the generated programs */
#define PROGRAM(p)                                                                                 \
    int64_t p##arena_bytes(void);                                                                  \
    void *p##arena_new(void);                                                                      \
    int p##run(void *arena, int threads, int64_t seed, int64_t offset);                           \
    const char *p##error(void);
PROGRAM(train_)
PROGRAM(eval_)
PROGRAM(logits_)

#define MAX_SLOTS 4096
#define LINE 65536

static void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
#include <stdarg.h>
static void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mica: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* ---- settings -------------------------------------------------------------------------------- */
typedef struct {
    char name[512], dtype[8];
    int64_t train_off, eval_off, logits_off, nbytes, ndim, shape[8];
    int kind; /* 0 parameter, 1 optimizer state */
} slot;

static struct {
    char mode[16], out_dir[4096], train_path[4096], val_path[4096], init_file[4096], batch_order[4096];
    char config_json[LINE], start_tokens[LINE];
    int64_t train_header, val_header, vocab, block, batch, accum, max_iters, eval_interval, eval_iters;
    int64_t log_interval, eval_only, always_save, seed, threads, time_every_iter;
    double flops_per_iter, peak_flops;
    int64_t tr_x, tr_y, tr_iter, tr_loss, tr_lr, ev_x, ev_y, ev_loss, lg_idx, lg_logits;
    int64_t resume, resume_iter, resume_next[LINE / 8], n_resume_next;
    double resume_best;
    uint64_t resume_rng[4];
    int64_t num_samples, max_new_tokens, top_k;
    double temperature;
    slot slots[MAX_SLOTS];
    int nslots;
    int64_t load_file_off[MAX_SLOTS];
} S;

static void read_manifest(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) die(2, "cannot read the manifest %s: %s", path, strerror(errno));
    static char line[LINE];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char key[64];
        int n = 0;
        if (sscanf(line, "%63s %n", key, &n) != 1) continue;
        char *v = line + n;
#define STR(k, dst) else if (!strcmp(key, k)) snprintf(dst, sizeof dst, "%s", v)
#define INT(k, dst) else if (!strcmp(key, k)) dst = strtoll(v, 0, 10)
#define DBL(k, dst) else if (!strcmp(key, k)) dst = strtod(v, 0)
        if (0) {}
        STR("mode", S.mode); STR("out_dir", S.out_dir); STR("init_file", S.init_file);
        STR("batch_order", S.batch_order); STR("config_json", S.config_json); STR("start_tokens", S.start_tokens);
        INT("vocab", S.vocab); INT("block", S.block); INT("batch", S.batch); INT("accum", S.accum);
        INT("max_iters", S.max_iters); INT("eval_interval", S.eval_interval); INT("eval_iters", S.eval_iters);
        INT("log_interval", S.log_interval); INT("eval_only", S.eval_only); INT("always_save", S.always_save);
        INT("seed", S.seed); INT("threads", S.threads); INT("time_every_iter", S.time_every_iter);
        DBL("flops_per_iter", S.flops_per_iter); DBL("peak_flops", S.peak_flops);
        INT("train.x", S.tr_x); INT("train.y", S.tr_y); INT("train.iter", S.tr_iter); INT("train.loss", S.tr_loss);
        INT("train.lr", S.tr_lr); INT("eval.x", S.ev_x); INT("eval.y", S.ev_y); INT("eval.loss", S.ev_loss);
        INT("logits.idx", S.lg_idx); INT("logits.out", S.lg_logits);
        INT("resume", S.resume); INT("resume_iter", S.resume_iter); DBL("resume_best", S.resume_best);
        INT("num_samples", S.num_samples); INT("max_new_tokens", S.max_new_tokens); INT("top_k", S.top_k);
        DBL("temperature", S.temperature);
        else if (!strcmp(key, "train_data")) sscanf(v, "%4095s %ld", S.train_path, &S.train_header);
        else if (!strcmp(key, "val_data")) sscanf(v, "%4095s %ld", S.val_path, &S.val_header);
        else if (!strcmp(key, "resume_rng"))
            sscanf(v, "%lx %lx %lx %lx", &S.resume_rng[0], &S.resume_rng[1], &S.resume_rng[2], &S.resume_rng[3]);
        else if (!strcmp(key, "resume_next")) {
            char *p = v, *end;
            S.n_resume_next = 0;
            for (int64_t x = strtoll(p, &end, 10); end != p; x = strtoll(p, &end, 10)) {
                S.resume_next[S.n_resume_next++] = x;
                p = end;
            }
        } else if (!strcmp(key, "slot")) {
            if (S.nslots >= MAX_SLOTS) die(2, "too many slots in the manifest");
            slot *s = &S.slots[S.nslots];
            int used = 0;
            sscanf(v, "%d %ld %ld %ld %ld %7s %ld %n", &s->kind, &s->train_off, &s->eval_off, &s->logits_off,
                   &s->nbytes, s->dtype, &s->ndim, &used);
            char *p = v + used;
            for (int d = 0; d < s->ndim; d++) s->shape[d] = strtoll(p, &p, 10);
            while (*p == ' ') p++;
            snprintf(s->name, sizeof s->name, "%s", p);
            S.load_file_off[S.nslots] = -1;
            S.nslots++;
        } else if (!strcmp(key, "load")) {
            int i; int64_t off;
            sscanf(v, "%d %ld", &i, &off);
            if (i >= 0 && i < S.nslots) S.load_file_off[i] = off;
        }
    }
    fclose(f);
}

/* ---- token data ------------------------------------------------------------------------------ */
typedef struct {
    const uint16_t *tok;
    int64_t n;
} tokens;

static tokens map_tokens(const char *path, int64_t header) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die(2, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    fstat(fd, &st);
    void *p = mmap(0, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) die(2, "cannot map %s: %s", path, strerror(errno));
    close(fd);
    tokens t = {(const uint16_t *)((const char *)p + header), (st.st_size - header) / 2};
    return t;
}

/* xoshiro256**: the batch sampler's generator; its state is saved in every checkpoint */
static uint64_t rng[4];
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t next_u64(void) {
    uint64_t r = rotl(rng[1] * 5, 7) * 9, t = rng[1] << 17;
    rng[2] ^= rng[0]; rng[3] ^= rng[1]; rng[1] ^= rng[2]; rng[0] ^= rng[3]; rng[2] ^= t; rng[3] = rotl(rng[3], 45);
    return r;
}
static void seed_rng(uint64_t seed) {
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        rng[i] = z ^ (z >> 31);
    }
}
static int64_t uniform(int64_t n) { /* unbiased in [0, n) */
    uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)n, x;
    do x = next_u64(); while (x >= limit);
    return (int64_t)(x % (uint64_t)n);
}

static FILE *order_file;
/* a training batch row: from the recorded order when one is given, else from the generator */
static int64_t draw_offset(const tokens *data, int training) {
    if (order_file && training) {
        long long off;
        if (fscanf(order_file, "%lld", &off) != 1) die(2, "the batch order file %s ran out of offsets", S.batch_order);
        if (off < 0 || off + S.block + 1 > data->n) die(2, "batch order offset %lld does not fit the data", off);
        return off;
    }
    return uniform(data->n - S.block);
}

/* x, y [rows, block] as int64 from offsets */
static void fill_batch(const tokens *data, const int64_t *offs, int64_t rows, int64_t *x, int64_t *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < S.block; t++) {
            x[r * S.block + t] = data->tok[offs[r] + t];
            y[r * S.block + t] = data->tok[offs[r] + t + 1];
        }
}

/* ---- checkpoints: safetensors -------------------------------------------------------------- */
static double best_val_loss = 1e9;

static void save_checkpoint(const char *arena, int64_t iter, const int64_t *next_offs, int64_t nnext,
                            const uint64_t *gen) {
    static char header[1 << 22];
    int64_t pos = 0, data = 0;
    pos += snprintf(header + pos, sizeof header - pos,
                    "{\"__metadata__\":{\"format\":\"mica\",\"iter_num\":\"%ld\",\"best_val_loss\":\"%.17g\","
                    "\"rng\":\"%016lx %016lx %016lx %016lx\",\"config\":", iter, best_val_loss,
                    gen[0], gen[1], gen[2], gen[3]);
    /* the config is JSON; metadata values must be strings: escape it */
    header[pos++] = '"';
    for (const char *c = S.config_json; *c; c++) {
        if (*c == '"' || *c == '\\') header[pos++] = '\\';
        header[pos++] = *c;
    }
    header[pos++] = '"';
    pos += snprintf(header + pos, sizeof header - pos, "}");
    for (int i = 0; i < S.nslots; i++) {
        slot *s = &S.slots[i];
        pos += snprintf(header + pos, sizeof header - pos, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", s->name, s->dtype);
        for (int d = 0; d < s->ndim; d++) pos += snprintf(header + pos, sizeof header - pos, d ? ",%ld" : "%ld", s->shape[d]);
        pos += snprintf(header + pos, sizeof header - pos, "],\"data_offsets\":[%ld,%ld]}", data, data + s->nbytes);
        data += s->nbytes;
    }
    pos += snprintf(header + pos, sizeof header - pos, ",\"data.next_offsets\":{\"dtype\":\"I64\",\"shape\":[%ld],"
                    "\"data_offsets\":[%ld,%ld]}}", nnext, data, data + nnext * 8);
    while ((pos + 8) % 8) header[pos++] = ' ';
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", S.out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) die(2, "cannot write a checkpoint in %s: %s", S.out_dir, strerror(errno));
    uint64_t hlen = (uint64_t)pos;
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(header, 1, pos, f) == (size_t)pos;
    for (int i = 0; i < S.nslots && ok; i++)
        ok = fwrite(arena + S.slots[i].train_off, 1, S.slots[i].nbytes, f) == (size_t)S.slots[i].nbytes;
    ok = ok && fwrite(next_offs, 8, nnext, f) == (size_t)nnext;
    ok = (fflush(f) == 0) && ok && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok) {
        unlink(tmp);
        die(2, "writing the checkpoint failed (%s); the previous checkpoint is untouched", strerror(errno));
    }
    if (rename(tmp, path) != 0) die(2, "cannot move the checkpoint into place: %s", strerror(errno));
}

static void load_slots(char *arena, int which) {
    if (!S.init_file[0]) return;
    FILE *f = fopen(S.init_file, "rb");
    if (!f) die(2, "cannot read %s: %s", S.init_file, strerror(errno));
    for (int i = 0; i < S.nslots; i++) {
        if (S.load_file_off[i] < 0) continue;
        slot *s = &S.slots[i];
        int64_t off = which == 0 ? s->train_off : which == 1 ? s->eval_off : s->logits_off;
        if (off < 0) continue;
        if (fseeko(f, S.load_file_off[i], SEEK_SET) != 0 || fread(arena + off, 1, s->nbytes, f) != (size_t)s->nbytes)
            die(2, "%s is truncated: tensor %s could not be read", S.init_file, s->name);
    }
    fclose(f);
}

/* ---- logging --------------------------------------------------------------------------------- */
static FILE *metrics;
static int tty;

static void clear_progress(void) {
    if (tty) { printf("\r\033[K"); fflush(stdout); }
}

static void progress(int64_t iter, double tok_per_s, double eta) {
    if (!tty) return;
    printf("\r  iter %ld/%ld  %.0f tok/s  ETA %dm%02ds", iter, S.max_iters, tok_per_s, (int)eta / 60, (int)eta % 60);
    fflush(stdout);
}

/* ---- the loop ----------------------------------------------------------------------------- */
static double estimate_split(char *ev, const tokens *data) {
    int64_t *x = (int64_t *)(ev + S.ev_x), *y = (int64_t *)(ev + S.ev_y);
    int64_t offs[4096];
    double total = 0;
    for (int64_t k = 0; k < S.eval_iters; k++) {
        for (int64_t r = 0; r < S.batch; r++) offs[r] = draw_offset(data, 0);
        fill_batch(data, offs, S.batch, x, y);
        if (eval_run(ev, (int)S.threads, S.seed, 0) != 0) die(2, "%s", eval_error());
        total += *(float *)(ev + S.ev_loss);
    }
    return total / (double)S.eval_iters;
}

static int train(void) {
    tokens train = map_tokens(S.train_path, S.train_header), val = map_tokens(S.val_path, S.val_header);
    char *tr = train_arena_new(), *ev = eval_arena_new();
    if (!tr || !ev) die(2, "cannot allocate the training arenas (%ld + %ld bytes)", train_arena_bytes(), eval_arena_bytes());
    load_slots(tr, 0);
    if (S.batch_order[0] && !(order_file = fopen(S.batch_order, "r")))
        die(2, "cannot read the batch order file %s: %s", S.batch_order, strerror(errno));
    int64_t rows = S.accum * S.batch, iter = 0, local_iter = 0;
    int64_t *next = calloc(rows, 8);
    uint64_t before_eval[4];
    seed_rng((uint64_t)S.seed);
    if (S.resume) {
        iter = S.resume_iter;
        best_val_loss = S.resume_best;
    }
    if (S.resume && S.n_resume_next) {
        memcpy(rng, S.resume_rng, sizeof rng);
        if (S.n_resume_next != rows) die(2, "the checkpoint's batch does not match this configuration");
        memcpy(next, S.resume_next, rows * 8);
    } else {
        for (int64_t r = 0; r < rows; r++) next[r] = draw_offset(&train, 1);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", S.out_dir);
    metrics = fopen(path, "a");
    if (!metrics) die(2, "cannot write %s: %s", path, strerror(errno));
    tty = isatty(1);
    double t0 = now(), running_mfu = -1.0, started = now();
    int64_t started_iter = iter;
    for (;;) {
        /* a checkpoint holds the generator as it stands here, and the batch already drawn for this
         * iteration: a resumed run redoes this evaluation with the same batches, then goes on */
        memcpy(before_eval, rng, sizeof rng);
        if (iter % S.eval_interval == 0) {
            clear_progress();
            for (int i = 0; i < S.nslots; i++)
                if (S.slots[i].kind == 0 && S.slots[i].eval_off >= 0)
                    memcpy(ev + S.slots[i].eval_off, tr + S.slots[i].train_off, S.slots[i].nbytes);
            double lt = estimate_split(ev, &train), lv = estimate_split(ev, &val);
            if (!isfinite(lt) || !isfinite(lv)) {
                fprintf(stderr, "mica: error: the evaluated loss is not finite at step %ld (train %g, val %g); "
                        "training stopped without saving. The last good checkpoint (if any) is %s/ckpt.safetensors, "
                        "untouched.\n", iter, fabs(lt), fabs(lv), S.out_dir);
                fprintf(metrics, "{\"step\": %ld, \"train_loss\": null, \"val_loss\": null, \"stopped\": "
                        "\"non-finite loss\"}\n", iter);
                fclose(metrics);
                return 3;
            }
            printf("step %ld: train loss %.4f, val loss %.4f\n", iter, lt, lv);
            fflush(stdout);
            fprintf(metrics, "{\"step\": %ld, \"train_loss\": %.9g, \"val_loss\": %.9g}\n", iter, lt, lv);
            fflush(metrics);
            if (lv < best_val_loss || S.always_save) {
                best_val_loss = lv;
                if (iter > 0) {
                    save_checkpoint(tr, iter, next, rows, before_eval);
                    printf("saving checkpoint to %s\n", S.out_dir);
                }
            }
            /* the eval drew from the generator: what follows continues from here, as nanoGPT's does */
        }
        if (iter == 0 && S.eval_only) break;
        int64_t *x = (int64_t *)(tr + S.tr_x), *y = (int64_t *)(tr + S.tr_y);
        fill_batch(&train, next, rows, x, y);
        *(int64_t *)(tr + S.tr_iter) = iter;
        if (iter < S.max_iters) /* the batch after the last one is never used: not drawn */
            for (int64_t r = 0; r < rows; r++) next[r] = draw_offset(&train, 1);
        if (train_run(tr, (int)S.threads, S.seed, iter) != 0) die(2, "%s", train_error());
        float loss = *(float *)(tr + S.tr_loss);
        double lr = *(double *)(tr + S.tr_lr);
        double t1 = now(), dt = t1 - t0;
        t0 = t1;
        if (!isfinite(loss)) {
            clear_progress();
            fflush(stdout);
            fprintf(stderr, "mica: error: the loss is %s at iter %ld; training stopped. The last good checkpoint "
                    "(if any) is %s/ckpt.safetensors, untouched.\n", isnan(loss) ? "nan" : "infinite", iter, S.out_dir);
            fprintf(metrics, "{\"iter\": %ld, \"loss\": null, \"stopped\": \"non-finite loss\"}\n", iter);
            fclose(metrics);
            return 3;
        }
        if (iter % S.log_interval != 0 && S.time_every_iter)  /* the trainer's own clock, for mica bench */
            fprintf(metrics, "{\"iter\": %ld, \"time_ms\": %.3f}\n", iter, dt * 1000);
        if (iter % S.log_interval == 0) {
            if (local_iter >= 5) {
                double mfu = S.flops_per_iter / dt / S.peak_flops;
                running_mfu = running_mfu == -1.0 ? mfu : 0.9 * running_mfu + 0.1 * mfu;
            }
            clear_progress();
            printf("iter %ld: loss %.4f, time %.2fms, mfu %.2f%%\n", iter, loss, dt * 1000, running_mfu * 100);
            fflush(stdout);
            fprintf(metrics, "{\"iter\": %ld, \"loss\": %.9g, \"lr\": %.9g, \"time_ms\": %.3f, \"mfu\": %.5f}\n",
                    iter, loss, lr, dt * 1000, running_mfu);
        }
        iter++;
        local_iter++;
        if (tty) {
            double el = now() - started, rate = (iter - started_iter) / (el > 0 ? el : 1e-9);
            progress(iter, rate * S.batch * S.accum * S.block, (S.max_iters - iter) / (rate > 0 ? rate : 1e-9));
        }
        if (iter > S.max_iters) break;
    }
    clear_progress();
    fclose(metrics);
    return 0;
}

/* ---- sampling ------------------------------------------------------------------------------ */
static double next_unit(void) { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }

static int sample(void) {
    char *lg = logits_arena_new();
    if (!lg) die(2, "cannot allocate the sampling arena");
    load_slots(lg, 2);
    seed_rng((uint64_t)S.seed);
    int64_t start[LINE / 2], nstart = 0;
    char *p = S.start_tokens, *end;
    for (int64_t v = strtoll(p, &end, 10); end != p; v = strtoll(p, &end, 10)) { start[nstart++] = v; p = end; }
    int64_t cap = nstart + S.max_new_tokens;
    int64_t *seq = malloc(cap * 8);
    double *probs = malloc(S.vocab * sizeof(double));
    float *sorted = malloc(S.vocab * sizeof(float));
    int64_t *idx = (int64_t *)(lg + S.lg_idx);
    const float *logits = (const float *)(lg + S.lg_logits);
    for (int64_t k = 0; k < S.num_samples; k++) {
        int64_t n = nstart;
        memcpy(seq, start, nstart * 8);
        for (int64_t t = 0; t < S.max_new_tokens; t++) {
            int64_t from = n > S.block ? n - S.block : 0, len = n - from;
            for (int64_t i = 0; i < S.block; i++) idx[i] = i < len ? seq[from + i] : 0;
            if (logits_run(lg, (int)S.threads, S.seed, 0) != 0) die(2, "%s", logits_error());
            const float *row = logits + (len - 1) * S.vocab;
            float cut = -INFINITY;
            if (S.top_k > 0 && S.top_k < S.vocab) {
                memcpy(sorted, row, S.vocab * sizeof(float));
                for (int64_t i = 0; i < S.top_k; i++) /* partial selection: the k largest first */
                    for (int64_t j = i + 1; j < S.vocab; j++)
                        if (sorted[j] > sorted[i]) { float tmp = sorted[i]; sorted[i] = sorted[j]; sorted[j] = tmp; }
                cut = sorted[S.top_k - 1];
            }
            double m = -INFINITY, z = 0;
            for (int64_t v = 0; v < S.vocab; v++) if (row[v] >= cut && row[v] / S.temperature > m) m = row[v] / S.temperature;
            for (int64_t v = 0; v < S.vocab; v++) {
                probs[v] = row[v] < cut ? 0.0 : exp(row[v] / S.temperature - m);
                z += probs[v];
            }
            double u = next_unit() * z, acc = 0;
            int64_t pick = S.vocab - 1;
            for (int64_t v = 0; v < S.vocab; v++) {
                acc += probs[v];
                if (u < acc) { pick = v; break; }
            }
            seq[n++] = pick;
        }
        for (int64_t i = 0; i < n; i++) printf(i ? " %ld" : "%ld", seq[i]);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) die(2, "usage: %s MANIFEST (this program is started by `mica train` and `mica sample`)", argv[0]);
    read_manifest(argv[1]);
    if (S.threads < 1) S.threads = 1;
    if (!strcmp(S.mode, "train")) return train();
    if (!strcmp(S.mode, "sample")) return sample();
    die(2, "unknown mode %s", S.mode);
}
