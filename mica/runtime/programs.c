/* The three generated programs behind one interface. Everything the runtime moves in or out of a
 * program goes through the program's own ABI (inputs and outputs by index): the runtime never
 * works out an arena offset, so the same runtime serves an arena in host or device memory. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static void *arenas[3];

static const char *program_name(int which) {
    return which == ARENA_TRAIN ? "train" : which == ARENA_EVAL ? "eval" : "logits";
}

/* one switch per entry point: (train_ | eval_ | logits_) ## name */
#define DISPATCH(which, call)                                                                      \
    (which == ARENA_TRAIN ? train_##call : which == ARENA_EVAL ? eval_##call : logits_##call)

/* One allocation serves train and eval when the manifest places the eval arena inside the train
 * arena (eval_offset >= 0): eval runs only between optimizer steps, when every train byte from
 * that offset on is dead (mica/train/memory_plan.py chose it), so the trainer holds
 * max(train, eval_offset + eval) bytes instead of their sum. */
static void *allocate(int which) {
    if (which == ARENA_EVAL && S.eval_offset >= 0) return (char *)prog_arena(ARENA_TRAIN) + S.eval_offset;
    if (which == ARENA_TRAIN && S.eval_offset >= 0) {
        int64_t need = S.eval_offset + eval_arena_bytes();
        return train_arena_alloc(need > train_arena_bytes() ? need : train_arena_bytes());
    }
    return which == ARENA_TRAIN ? train_arena_new() : which == ARENA_EVAL ? eval_arena_new() : logits_arena_new();
}

void *prog_arena(int which) {
    if (!arenas[which]) {
        arenas[which] = allocate(which);
        if (!arenas[which]) {
            const char *why = DISPATCH(which, error)();
            if (why && *why) die(2, "%s", why); /* (a GPU program says why: no device, or its memory is full) */
            long long bytes = which == ARENA_TRAIN ? train_arena_bytes() : which == ARENA_EVAL ? eval_arena_bytes()
                                                                                                : logits_arena_bytes();
            if (which == ARENA_TRAIN && S.eval_offset >= 0 && S.eval_offset + eval_arena_bytes() > bytes)
                bytes = S.eval_offset + eval_arena_bytes();
            die(2, "cannot allocate the %s program's memory (%lld bytes); close other programs or train a smaller "
                "model", program_name(which), bytes);
        }
    }
    return arenas[which];
}

int prog_input_count(int which) { return DISPATCH(which, input_count)(); }
int64_t prog_input_bytes(int which, int i) { return DISPATCH(which, input_bytes)(i); }
int prog_output_count(int which) { return DISPATCH(which, output_count)(); }
int64_t prog_output_bytes(int which, int i) { return DISPATCH(which, output_bytes)(i); }

int prog_input_matches(int which, int i, const char *dtype, int64_t ndim, const int64_t *shape) {
    if (i < 0 || i >= prog_input_count(which) || strcmp(DISPATCH(which, input_dtype)(i), dtype) ||
        DISPATCH(which, input_ndim)(i) != ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (DISPATCH(which, input_dim)(i, d) != shape[d]) return 0;
    return 1;
}

void prog_set_input(int which, int i, const void *src) { DISPATCH(which, set_input)(prog_arena(which), i, src); }
void prog_get_input(int which, int i, void *dst) { DISPATCH(which, get_input)(prog_arena(which), i, dst); }
void prog_set_input_part(int which, int i, int64_t start, int64_t n, const void *src) {
    DISPATCH(which, set_input_part)(prog_arena(which), i, start, n, src);
}
void prog_get_input_part(int which, int i, int64_t start, int64_t n, void *dst) {
    DISPATCH(which, get_input_part)(prog_arena(which), i, start, n, dst);
}

char *staging(void) {
    static char *buffer;
    if (!buffer && !(buffer = malloc(STAGING_BYTES)))
        die(2, "cannot allocate %lld bytes to move tensors through", (long long)STAGING_BYTES);
    return buffer;
}

void prog_get_output(int which, int i, void *dst) { DISPATCH(which, get_output)(prog_arena(which), i, dst); }
void prog_get_output_part(int which, int i, int64_t start, int64_t count, void *dst) {
    DISPATCH(which, get_output_part)(prog_arena(which), i, start, count, dst);
}
