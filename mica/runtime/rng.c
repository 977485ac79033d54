/* xoshiro256**, seeded by splitmix64: the batch sampler's generator. Its state is saved in every
 * checkpoint, so a resumed run draws the same batches. */
#include "runtime.h"

static uint64_t state[4];

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(void) {
    uint64_t r = rotl(state[1] * 5, 7) * 9, t = state[1] << 17;
    state[2] ^= state[0];
    state[3] ^= state[1];
    state[1] ^= state[2];
    state[0] ^= state[3];
    state[2] ^= t;
    state[3] = rotl(state[3], 45);
    return r;
}

void rng_seed(uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        state[i] = z ^ (z >> 31);
    }
}

int64_t rng_uniform(int64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)n, x;
    do x = rng_next();
    while (x >= limit);
    return (int64_t)(x % (uint64_t)n);
}

double rng_unit(void) { return (rng_next() >> 11) * (1.0 / 9007199254740992.0); }

void rng_get(uint64_t out[4]) {
    for (int i = 0; i < 4; i++) out[i] = state[i];
}

void rng_set(const uint64_t in[4]) {
    for (int i = 0; i < 4; i++) state[i] = in[i];
}
