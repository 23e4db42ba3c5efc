/* SPDX-License-Identifier: MIT */
/* bench/bench.h — what the benchmark programs share: a monotonic clock, medians and a
 * status check that stops the program with l2l's message.
 * Must never: be used by the library or the tests (benchmarks only).
 */
#ifndef L2L_BENCH_H
#define L2L_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

/* The q-quantile (0 <= q <= 1) of v[0..n), nearest rank; sorts v. */
static inline double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  int i = (int)(q * (n - 1) + 0.5);
  return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* CPU seconds the whole process has used, all threads (waiting threads use none). */
static inline double process_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds of CPU time the hypervisor gave to other guests ("steal", summed over this
   machine's CPUs, from /proc/stat; 0 where it cannot be read). */
static inline double stolen_seconds(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (f == NULL) return 0;
  unsigned long long v[8] = {0};
  int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                 &v[4], &v[5], &v[6], &v[7]);
  fclose(f);
  long ticks = sysconf(_SC_CLK_TCK);
  return n == 8 && ticks > 0 ? (double)v[7] / (double)ticks : 0;
}

static inline void ok(l2l_status status) {
  if (status != L2L_OK) {
    fprintf(stderr, "bench: %s\n", l2l_last_error());
    exit(1);
  }
}

#endif /* L2L_BENCH_H */
