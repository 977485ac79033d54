/* Mica's native trainer: what its modules share.
 *
 * The trainer is the loop around three generated programs (train_, eval_, logits_), started by
 * `mica train` / `mica sample` with a manifest. Its modules, one job each:
 *
 *   manifest.c    read and check the manifest (every field validated before use)
 *   programs.c    the three programs behind one interface: their arenas, inputs and outputs by
 *                 index through each program's ABI (the runtime never works out an arena offset)
 *   tokens.c      token files (nanoGPT .bin, speedrun shards; several files per split), batch rows
 *   rng.c         the batch sampler's generator (xoshiro256**), saved in every checkpoint
 *   checkpoint.c  safetensors checkpoints: written to a temporary file and renamed, a CRC-32 per
 *                 tensor, verified as they are read back
 *   log.c         log lines, metrics.jsonl, the progress line
 *   loop.c        nanoGPT's training loop: evaluation, steps, checkpoints, interruption
 *   speedrun.c    the speedrun seed's loop: shards in order, validation on the first val_tokens
 *   sampler.c     generation from the logits program
 *   dist.c        data parallelism: MPI's start, the ranks' agreement, a signal's one sentence
 *   main.c        the entry point and the user's errors
 */
#ifndef MICA_RUNTIME_H
#define MICA_RUNTIME_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* the generated programs, linked in under these prefixes; each exports its ABI: inputs and
 * outputs by index (name, dtype, shape, bytes) and the copies in and out of its arena */
#define MICA_PROGRAM(p)                                                                            \
    int64_t p##arena_bytes(void);                                                                  \
    void *p##arena_new(void);                                                                      \
    void *p##arena_alloc(int64_t bytes); /* the arena, zeroed, of max(bytes, its own) bytes */       \
    int p##run(void *arena, int threads, int64_t seed, int64_t offset);                           \
    const char *p##error(void);                                                                    \
    int p##input_count(void);                                                                      \
    const char *p##input_dtype(int i);                                                             \
    int p##input_ndim(int i);                                                                      \
    int64_t p##input_dim(int i, int d);                                                            \
    int64_t p##input_bytes(int i);                                                                 \
    int p##output_count(void);                                                                     \
    int64_t p##output_bytes(int i);                                                                \
    void p##set_input(void *arena, int i, const void *src);                                        \
    void p##get_input(const void *arena, int i, void *dst);                                        \
    void p##set_input_part(void *arena, int i, int64_t start, int64_t n, const void *src);         \
    void p##get_input_part(const void *arena, int i, int64_t start, int64_t n, void *dst);         \
    void p##get_output(const void *arena, int i, void *dst);                                       \
    void p##get_output_part(const void *arena, int i, int64_t start, int64_t count, void *dst);
MICA_PROGRAM(train_)
MICA_PROGRAM(eval_)
MICA_PROGRAM(logits_)

enum { ARENA_TRAIN = 0, ARENA_EVAL = 1, ARENA_LOGITS = 2 };

/* ---- main.c ---------------------------------------------------------------------------------- */
void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
double now(void);
extern volatile sig_atomic_t interrupted; /* the signal that arrived (SIGINT, SIGTERM, SIGHUP), else 0 */

/* ---- manifest.c: the settings ---------------------------------------------------------------- */
typedef struct {
    char *path;
    int64_t header; /* bytes before the first token: 0 for .bin, 1024 for a shard */
} file_spec;

typedef struct {
    char *name, dtype[8];
    int64_t input[3]; /* its input index in the train, eval and logits programs; -1 where absent */
    int64_t nbytes, ndim, shape[8];
    int kind;        /* 0 parameter, 1 optimizer state, 2 this rank's shard of it (ZeRO-1), 3 another rank's */
    int owner;       /* kind 3: the rank that holds it (it has no input here) */
    int64_t load_at; /* byte offset of its data in init_file, -1: not loaded */
    uint32_t crc;    /* the CRC-32 its data must have when loaded */
    int has_crc;
    unsigned char *fill; /* its starting bytes, given in the manifest (a fresh loss scaler), or NULL */
} slot;

typedef struct {
    char mode[16], loop[16]; /* loop: nanogpt or speedrun */
    char *out_dir, *init_file, *batch_order, *config_json;
    file_spec *train_files, *val_files;
    int n_train_files, n_val_files;
    int64_t vocab, block, batch, accum, max_iters, eval_interval, eval_iters, log_interval;
    int64_t eval_only, always_save, seed, threads, time_every_iter, stop_at; /* stop_at: 0, or a step to stop after */
    int64_t pending; /* 1: an earlier run's metrics.jsonl and init.safetensors stay until this run's first save;
                        2: a resume's trimmed log is metrics.jsonl.new until its first save (log.c) */
    double flops_per_iter, peak_flops;
    /* the programs' inputs (tr_x, ...) and outputs (tr_loss, ...) the loop uses, by index */
    int64_t tr_x, tr_y, tr_iter, tr_loss, tr_lr, ev_x, ev_y, ev_loss, lg_idx, lg_logits;
    int64_t resume, resume_iter, *resume_next, n_resume_next;
    double resume_best;
    /* the speedrun loop's train_time where a resumed run starts it: the straight run's at the step
     * resumed from, read from metrics.jsonl (wall-clock time is never in a checkpoint, whose bytes are
     * the same for the same inputs) */
    double resume_time;
    uint64_t resume_rng[4];
    int has_resume_rng;
    int64_t num_samples, max_new_tokens, top_k, decodable; /* decodable > 0: draw only ids below it */
    double temperature;
    int64_t *start_tokens, n_start;
    slot *slots;
    int nslots;
    int64_t world, rank; /* a data-parallel run's ranks (1, 0: one process) */
    char *run_hash;      /* the same on every rank of a run, or it does not start */
    int64_t eval_offset; /* >= 0: the eval arena lies at this offset inside the train arena (over bytes
                          * dead between steps); -1: it is allocated on its own */
} settings;

extern settings S;
void read_manifest(const char *path);

/* ---- programs.c: the programs through their ABI ---------------------------------------------- */
void *prog_arena(int which); /* the program's arena, allocated once */
int prog_input_count(int which);
int64_t prog_input_bytes(int which, int i);
int prog_input_matches(int which, int i, const char *dtype, int64_t ndim, const int64_t *shape);
int prog_output_count(int which);
int64_t prog_output_bytes(int which, int i);
void prog_set_input(int which, int i, const void *src);
void prog_get_input(int which, int i, void *dst);
void prog_set_input_part(int which, int i, int64_t start, int64_t n, const void *src); /* bytes */
void prog_get_input_part(int which, int i, int64_t start, int64_t n, void *dst);
/* tensors pass between programs and files through one host buffer of this many bytes */
#define STAGING_BYTES ((int64_t)16 << 20)
char *staging(void);
void copy_parameters_to_eval(void); /* loop.c: the eval program gets the train program's parameters */
void prog_get_output(int which, int i, void *dst);
void prog_get_output_part(int which, int i, int64_t start, int64_t count, void *dst); /* elements, row-major */

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
/* every rank calls it: rank 0 writes, receiving ZeRO-1's shards (kind 3 slots) from their owners, which send
 * their kind 2 slots; any other rank of a run without shards returns at once */
void checkpoint_save(int64_t iter, double best_val_loss, const int64_t *next, int64_t nnext, const uint64_t gen[4]);
void checkpoint_load(int which); /* the `fill` slots' bytes and the `load` slots from init_file into a program, each verified */

/* ---- log.c ----------------------------------------------------------------------------------- */
void log_open_metrics(int append);
void log_metrics(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_close_metrics(void);
void log_keep_run(void);
void log_finish_metrics(void);
void log_progress(int64_t iter, double tok_per_s, double eta);
void log_clear_progress(void);
const char *log_last_good(const char *unit, int64_t saved); /* a stopped run's last good checkpoint, in words */
void log_stop_text(const char *unit, int64_t saved);       /* what a rank says when a signal ends it (world > 1) */
int log_interrupted(const char *during, const char *unit, int64_t at, int64_t saved); /* its sentence; 128 + signal */

/* ---- loop.c / sampler.c ---------------------------------------------------------------------- */
int train_loop(void);
int speedrun_loop(void);
int sample(void);

/* ---- dist.c ---------------------------------------------------------------------------------- */
void dist_init(void);
void dist_finalize(void);
void dist_broadcast(double *values, int n); /* rank 0's values on every rank */
int dist_any(int flag);
void dist_set_stop_text(const char *text); /* what a rank says when a signal ends it */
void dist_send_to_root(const void *data, int64_t n); /* n <= STAGING_BYTES bytes to rank 0 */
int dist_recv_from(int owner, void *data, int64_t n); /* rank 0: 0, or nonzero when the owner stopped */

#endif
