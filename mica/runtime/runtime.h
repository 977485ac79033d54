/* Mica's native trainer: what its modules share.
 *
 * The trainer is the loop around three generated programs (train_, eval_, logits_), started by
 * `mica train` / `mica sample` with a manifest. Its modules, one job each:
 *
 *   manifest.c    read and check the manifest (every field validated before use)
 *   device_host.c the device layer: arenas and copies in and out of them (host memory on the CPU)
 *   tokens.c      token files (nanoGPT .bin, speedrun shards; several files per split), batch rows
 *   rng.c         the batch sampler's generator (xoshiro256**), saved in every checkpoint
 *   checkpoint.c  safetensors checkpoints: written to a temporary file and renamed, a CRC-32 per
 *                 tensor, verified as they are read back
 *   log.c         log lines, metrics.jsonl, the progress line
 *   loop.c        nanoGPT's training loop: evaluation, steps, checkpoints, interruption
 *   sampler.c     generation from the logits program
 *   main.c        the entry point and the user's errors
 */
#ifndef MICA_RUNTIME_H
#define MICA_RUNTIME_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* the generated programs, linked in under these prefixes */
#define MICA_PROGRAM(p)                                                                            \
    int64_t p##arena_bytes(void);                                                                  \
    void *p##arena_new(void);                                                                      \
    int p##run(void *arena, int threads, int64_t seed, int64_t offset);                           \
    const char *p##error(void);
MICA_PROGRAM(train_)
MICA_PROGRAM(eval_)
MICA_PROGRAM(logits_)

enum { ARENA_TRAIN = 0, ARENA_EVAL = 1, ARENA_LOGITS = 2 };

/* ---- main.c ---------------------------------------------------------------------------------- */
void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
double now(void);
extern volatile sig_atomic_t interrupted; /* Ctrl-C (SIGINT) or SIGTERM arrived */

/* ---- manifest.c: the settings ---------------------------------------------------------------- */
typedef struct {
    char *path;
    int64_t header; /* bytes before the first token: 0 for .bin, 1024 for a shard */
} file_spec;

typedef struct {
    char *name, dtype[8];
    int64_t off[3]; /* byte offset in the train, eval and logits arenas; -1 where absent */
    int64_t nbytes, ndim, shape[8];
    int kind;        /* 0 parameter, 1 optimizer state */
    int64_t load_at; /* byte offset of its data in init_file, -1: not loaded */
    uint32_t crc;    /* the CRC-32 its data must have when loaded */
    int has_crc;
} slot;

typedef struct {
    char mode[16];
    char *out_dir, *init_file, *batch_order, *config_json;
    file_spec *train_files, *val_files;
    int n_train_files, n_val_files;
    int64_t vocab, block, batch, accum, max_iters, eval_interval, eval_iters, log_interval;
    int64_t eval_only, always_save, seed, threads, time_every_iter;
    double flops_per_iter, peak_flops;
    /* where the loop reads and writes the programs' inputs and outputs */
    int64_t tr_x, tr_y, tr_iter, tr_loss, tr_lr, ev_x, ev_y, ev_loss, lg_idx, lg_logits;
    int64_t resume, resume_iter, *resume_next, n_resume_next;
    double resume_best;
    uint64_t resume_rng[4];
    int has_resume_rng;
    int64_t num_samples, max_new_tokens, top_k;
    double temperature;
    int64_t *start_tokens, n_start;
    slot *slots;
    int nslots;
} settings;

extern settings S;
void read_manifest(const char *path);

/* ---- device_host.c: the device layer --------------------------------------------------------- */
void *dev_arena(int which);          /* the program's arena, allocated once */
int64_t dev_arena_bytes(int which);
void dev_write(void *arena, int64_t off, const void *src, int64_t n);
void dev_read(const void *arena, int64_t off, void *dst, int64_t n);
void dev_copy(void *dst, int64_t dst_off, const void *src, int64_t src_off, int64_t n);

/* ---- tokens.c -------------------------------------------------------------------------------- */
typedef struct {
    const char *path;
    const uint16_t *tok;
    int64_t n, first_window; /* tokens; index of its first window among the set's */
} token_file;

typedef struct {
    token_file *files;
    int nfiles;
    int64_t windows; /* rows of block + 1 tokens that can start anywhere, over every file */
    const char *what;
} token_set;

void tokens_open(token_set *set, const file_spec *specs, int n, const char *what);
/* the window'th row: x = tokens [w, w + block), y = the same shifted by one, as int64 */
void tokens_row(const token_set *set, int64_t window, int64_t *x, int64_t *y);

/* ---- rng.c ----------------------------------------------------------------------------------- */
void rng_seed(uint64_t seed);
uint64_t rng_next(void);
int64_t rng_uniform(int64_t n); /* unbiased in [0, n) */
double rng_unit(void);          /* in [0, 1) */
void rng_get(uint64_t state[4]);
void rng_set(const uint64_t state[4]);

/* ---- checkpoint.c ---------------------------------------------------------------------------- */
uint32_t crc32_update(uint32_t crc, const void *data, size_t n); /* zlib's CRC-32: start from 0 */
void checkpoint_save(const void *arena, int64_t iter, double best_val_loss, const int64_t *next, int64_t nnext,
                     const uint64_t gen[4]);
void checkpoint_load(void *arena, int which); /* the `load` slots from init_file, each verified */

/* ---- log.c ----------------------------------------------------------------------------------- */
void log_open_metrics(int append);
void log_metrics(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_close_metrics(void);
void log_progress(int64_t iter, double tok_per_s, double eta);
void log_clear_progress(void);

/* ---- loop.c / sampler.c ---------------------------------------------------------------------- */
int train_loop(void);
int sample(void);

#endif
