/* The device layer on the CPU: the arenas are host memory, copies are memcpy. (The CUDA layer
 * keeps the same functions over device memory and streams.) */
#include <string.h>

#include "runtime.h"

static void *arenas[3];

void *dev_arena(int which) {
    if (!arenas[which]) {
        arenas[which] = which == ARENA_TRAIN ? train_arena_new() : which == ARENA_EVAL ? eval_arena_new()
                                                                                       : logits_arena_new();
        if (!arenas[which])
            die(2, "cannot allocate the %s program's memory (%lld bytes); close other programs or train a "
                "smaller model", which == ARENA_TRAIN ? "train" : which == ARENA_EVAL ? "eval" : "logits",
                (long long)dev_arena_bytes(which));
    }
    return arenas[which];
}

int64_t dev_arena_bytes(int which) {
    return which == ARENA_TRAIN ? train_arena_bytes() : which == ARENA_EVAL ? eval_arena_bytes()
                                                                            : logits_arena_bytes();
}

void dev_write(void *arena, int64_t off, const void *src, int64_t n) { memcpy((char *)arena + off, src, n); }

void dev_read(const void *arena, int64_t off, void *dst, int64_t n) { memcpy(dst, (const char *)arena + off, n); }

void dev_copy(void *dst, int64_t dst_off, const void *src, int64_t src_off, int64_t n) {
    memcpy((char *)dst + dst_off, (const char *)src + src_off, n);
}
