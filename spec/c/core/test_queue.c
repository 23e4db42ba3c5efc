/* SPDX-License-Identifier: MIT */
/* test_queue.c — the core's worker threads (queue.c): where they run.
 *
 * What it tests: with OpenMP's binding on (OMP_PROC_BIND), OpenMP binds the process's
 * initial thread to its first place as the process starts, and a thread started later
 * inherits that one place; l2l's workers (the copy threads, the optimizer's) must run on
 * every CPU of OpenMP's places instead. The binding is read from the environment at
 * start, so the test runs itself again in a child with OMP_PROC_BIND=close and
 * OMP_PLACES=cores; there a worker's CPUs are compared with the places' union (read
 * through OpenMP's own place queries, not through core_thread_create's) and with the
 * initial thread's, which must be fewer (else the child skips: nothing was bound).
 * All test names start with "queue_".
 */
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/core.h"

#define TEST_NAME "queue_workers_run_on_every_cpu_openmp_binds_to"

struct where_job {
  struct core_job job;
  cpu_set_t cpus;
};

static void where_run(struct core_job *job, int thread) {
  (void)thread;
  struct where_job *w = (struct where_job *)job;
  CPU_ZERO(&w->cpus);
  sched_getaffinity(0, sizeof w->cpus, &w->cpus);
}

/* The union of OpenMP's places, from OpenMP's queries. */
static cpu_set_t places_union(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int p = 0; p < omp_get_num_places(); p++) {
    int ids[CPU_SETSIZE];
    int n = omp_get_place_num_procs(p);
    if (n <= 0 || n > CPU_SETSIZE) continue;
    omp_get_place_proc_ids(p, ids);
    for (int i = 0; i < n; i++) CPU_SET(ids[i], &set);
  }
  return set;
}

/* The child's part: OMP_PROC_BIND is set. */
static void in_child(void) {
  cpu_set_t initial, places = places_union();
  CPU_ZERO(&initial);
  sched_getaffinity(0, sizeof initial, &initial);
  if (CPU_COUNT(&places) < 2 || CPU_COUNT(&initial) >= CPU_COUNT(&places)) {
    check_skip("OpenMP bound the initial thread to %d of its places' %d CPUs: nothing to undo",
               CPU_COUNT(&initial), CPU_COUNT(&places));
    return;
  }
  struct core_queue q;
  if (!CHECK_OK(queue_start(&q, 1, 0, "test"))) return;
  struct where_job w = {.job = {.run = where_run}};
  queue_push(&q, &w.job);
  CHECK_OK(job_wait(&w.job));
  queue_stop(&q);
  CHECK(CPU_EQUAL(&w.cpus, &places), "a worker runs on %d CPUs, OpenMP's places hold %d (the "
        "initial thread is bound to %d)", CPU_COUNT(&w.cpus), CPU_COUNT(&places),
        CPU_COUNT(&initial));
}

TEST(queue_workers_run_on_every_cpu_openmp_binds_to) {
  const char *bind = getenv("OMP_PROC_BIND");
  if (bind != NULL && strcmp(bind, "false") != 0) {
    in_child();
    return;
  }
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    check_skip("one CPU online: no binding to undo");
    return;
  }
  /* this process's own image, through its /proc link: it runs even where the file was
     rebuilt since this process started (its path then names another file, or none) */
  char cmd[200];
  snprintf(cmd, sizeof cmd, "OMP_PROC_BIND=close OMP_PLACES=cores /proc/%ld/exe --exact " TEST_NAME " 2>&1",
           (long)getpid());
  FILE *child = popen(cmd, "r");
  if (!CHECK(child != NULL, "cannot run %s", cmd)) return;
  char out[8192] = "";
  size_t got = fread(out, 1, sizeof out - 1, child);
  out[got] = '\0';
  int status = pclose(child);
  if (strstr(out, "1 skipped") != NULL) {
    const char *why = strstr(out, "skip ");
    check_skip("the child skipped: %.200s", why ? why : out);
    return;
  }
  CHECK(status == 0 && strstr(out, "1 passed") != NULL, "the child (%s) said:\n%s", cmd, out);
}
