/* SPDX-License-Identifier: MIT */
/* threads.c — compute threads for the CPU backend and OpenBLAS.
 *
 * Purpose: one place that decides how many threads the CPU's loops (OpenMP) and OpenBLAS
 * use. l2l links OpenBLAS's OpenMP build, so both draw on one OpenMP thread pool: a BLAS
 * call made inside an OpenMP loop (the CPU attention does, one small GEMM per thread)
 * runs single-threaded there, and OpenBLAS's count is set explicitly so that the two
 * never oversubscribe the cores between them.
 * Must never: read the environment more than once or change threads behind a running op.
 */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "cpu.h"

/* openblas_set_num_threads is OpenBLAS's own extension of the BLAS interface. */
void openblas_set_num_threads(int threads);

atomic_int cpu_compute_threads = 1;
static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;

static void apply_threads(int threads) {
  atomic_store(&cpu_compute_threads, threads);
  openblas_set_num_threads(threads);
}

static void runtime_start(void) {
  int threads = omp_get_num_procs();
  const char *env = getenv("L2L_THREADS");
  if (env != NULL) {
    char *end = NULL;
    long wanted = strtol(env, &end, 10);
    if (end != env && *end == '\0' && wanted >= 1 && wanted <= 4096) threads = (int)wanted;
  }
  apply_threads(threads < 1 ? 1 : threads);
}

void cpu_runtime_init(void) { pthread_once(&runtime_once, runtime_start); }

l2l_status l2l_set_threads(int threads) {
  cpu_runtime_init();
  if (threads < 1 || threads > 4096)
    return FAIL(L2L_ERR_INVALID, "threads must be between 1 and 4096, got %d", threads);
  apply_threads(threads);
  return L2L_OK;
}

int l2l_get_threads(void) {
  cpu_runtime_init();
  return atomic_load(&cpu_compute_threads);
}
