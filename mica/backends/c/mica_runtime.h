/* Mica's C runtime for generated CPU programs: OpenMP (or its absence) and errors. The math,
 * random bits and fixed-order sums every target shares are in mica_math.h (backends/cstyle). */
#ifndef MICA_RUNTIME_H
#define MICA_RUNTIME_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mica_math.h"
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline void omp_set_num_threads(int n) { (void)n; }
static inline int omp_get_max_threads(void) { return 1; }
#endif

/* ---- errors ------------------------------------------------------------------------------------ */
static char mica_error_text[256];
static volatile int mica_failed;

static void mica_fail(const char *msg, long long a, long long b) {
#pragma omp critical(mica_error)
    {
        if (!mica_failed) {
            snprintf(mica_error_text, sizeof mica_error_text, msg, a, b);
            mica_failed = 1;
        }
    }
}

#endif
