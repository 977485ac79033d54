/* Generation, as nanoGPT's sample.py: the logits program over the last block_size tokens (padded
 * on the right), temperature, an optional top-k cut, then one draw from the softmax (over the ids
 * below `decodable` when it is set: the speedrun pads its vocabulary, and the padding decodes to nothing). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

int sample(void) {
    void *lg = prog_arena(ARENA_LOGITS);
    checkpoint_load(ARENA_LOGITS);
    rng_seed((uint64_t)S.seed);
    if (S.max_new_tokens < 0 || S.n_start < 0 || S.max_new_tokens > INT64_MAX / 8 - S.n_start)
        die(2, "max_new_tokens %lld is more tokens than a sample can hold; ask for fewer", (long long)S.max_new_tokens);
    int64_t cap = S.n_start + S.max_new_tokens;
    int64_t *seq = malloc((size_t)cap * 8), *window = malloc(S.block * 8);
    double *probs = malloc(S.vocab * sizeof(double));
    float *row = malloc(S.vocab * sizeof(float)), *sorted = malloc(S.vocab * sizeof(float));
    if (!seq || !window || !probs || !row || !sorted)
        die(2, "cannot allocate memory for sampling %lld tokens; ask for fewer with --max_new_tokens",
            (long long)cap);
    for (int64_t k = 0; k < S.num_samples && !interrupted; k++) {
        int64_t n = S.n_start;
        memcpy(seq, S.start_tokens, S.n_start * 8);
        for (int64_t t = 0; t < S.max_new_tokens && !interrupted; t++) {
            int64_t from = n > S.block ? n - S.block : 0, len = n - from;
            for (int64_t i = 0; i < S.block; i++) window[i] = i < len ? seq[from + i] : 0;
            prog_set_input(ARENA_LOGITS, (int)S.lg_idx, window);
            if (logits_run(lg, (int)S.threads, S.seed, 0) != 0) die(2, "%s", logits_error());
            prog_get_output_part(ARENA_LOGITS, (int)S.lg_logits, (len - 1) * S.vocab, S.vocab, row); /* row len-1 */
            if (S.decodable > 0) /* a padded vocabulary's unused rows are never drawn */
                for (int64_t v = S.decodable; v < S.vocab; v++) row[v] = -INFINITY;
            float cut = -INFINITY;
            if (S.top_k > 0 && S.top_k < S.vocab) {
                memcpy(sorted, row, S.vocab * sizeof(float));
                for (int64_t i = 0; i < S.top_k; i++) /* partial selection: the k largest first */
                    for (int64_t j = i + 1; j < S.vocab; j++)
                        if (sorted[j] > sorted[i]) {
                            float tmp = sorted[i];
                            sorted[i] = sorted[j];
                            sorted[j] = tmp;
                        }
                cut = sorted[S.top_k - 1];
            }
            double m = -INFINITY, z = 0;
            for (int64_t v = 0; v < S.vocab; v++)
                if (row[v] >= cut && row[v] / S.temperature > m) m = row[v] / S.temperature;
            for (int64_t v = 0; v < S.vocab; v++) {
                probs[v] = row[v] < cut ? 0.0 : exp(row[v] / S.temperature - m);
                z += probs[v];
            }
            double u = rng_unit() * z, acc = 0;
            int64_t pick = S.vocab - 1;
            for (int64_t v = 0; v < S.vocab; v++) {
                acc += probs[v];
                if (u < acc) {
                    pick = v;
                    break;
                }
            }
            seq[n++] = pick;
        }
        for (int64_t i = 0; i < n; i++) printf(i ? " %lld" : "%lld", (long long)seq[i]);
        printf("\n");
        fflush(stdout);
    }
    if (interrupted) {
        int sig = (int)interrupted;
        fprintf(stderr, "mica: %s while sampling\n", sig == SIGTERM ? "stopped by SIGTERM" : sig == SIGHUP ?
                "stopped by SIGHUP" : "interrupted");
        return 128 + sig;
    }
    return 0;
}
