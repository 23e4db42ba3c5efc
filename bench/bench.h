/* bench/bench.h — what the benchmark programs share: a monotonic clock, medians and a
 * status check that stops the program with l2l's message.
 * Must never: be used by the library or the tests (benchmarks only).
 */
#ifndef L2L_BENCH_H
#define L2L_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "l2l.h"

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return v[n / 2];
}

static inline void ok(l2l_status status) {
  if (status != L2L_OK) {
    fprintf(stderr, "bench: %s\n", l2l_last_error());
    exit(1);
  }
}

#endif /* L2L_BENCH_H */
