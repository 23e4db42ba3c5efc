/* SPDX-License-Identifier: MIT */
/* queue.c — queues of jobs served by threads (see core.h), and the clock.
 *
 * Purpose: the smallest thing that gives the relay CUDA-stream-like ordering on the CPU:
 * a locked FIFO, worker threads that take jobs in order, and a condition variable that
 * wakes whoever waits for a job. Jobs are owned by their waiter, or freed by the worker
 * when nobody waits (free_when_done). Workers run on every CPU of OpenMP's places when
 * OpenMP binds its threads (OMP_PROC_BIND), not on the one place the process's initial
 * thread was bound to, which a new thread would inherit.
 * Must never: hold the queue's lock while a job runs.
 */
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

double core_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct worker_arg {
  struct core_queue *q;
  int id;
};

static void *worker_main(void *p) {
  struct worker_arg arg = *(struct worker_arg *)p;
  free(p);
  struct core_queue *q = arg.q;
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (q->head == NULL && !q->stop) pthread_cond_wait(&q->work, &q->lock);
    if (q->head == NULL) break;   /* stopping, and nothing is left */
    struct core_job *job = q->head;
    q->head = job->next;
    if (q->head == NULL) q->tail = NULL;
    q->busy++;
    pthread_mutex_unlock(&q->lock);
    if (job->after != NULL) {
      l2l_status ordered = device_wait_mark(job->after);
      job->after = NULL;
      if (ordered != L2L_OK) job_fail(job, ordered);   /* the run's copies fail too */
    }
    job->run(job, arg.id);
    pthread_mutex_lock(&q->lock);
    q->busy--;
    if (job->free_when_done) {
      pthread_mutex_unlock(&q->lock);
      job->release(job);
      pthread_mutex_lock(&q->lock);
    } else {
      job->done = true;
    }
    pthread_cond_broadcast(&q->finished);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

/* The union of OpenMP's places when OpenMP binds its threads, else false. */
static bool thread_cpus(cpu_set_t *set) {
  if (omp_get_proc_bind() == omp_proc_bind_false) return false;
  int places = omp_get_num_places();
  CPU_ZERO(set);
  for (int p = 0; p < places; p++) {
    int n = omp_get_place_num_procs(p);
    int *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (ids == NULL) continue;
    omp_get_place_proc_ids(p, ids);
    for (int i = 0; i < n; i++)
      if (ids[i] >= 0 && ids[i] < CPU_SETSIZE) CPU_SET(ids[i], set);
    free(ids);
  }
  return CPU_COUNT(set) > 0;
}

int core_cpus(void) {
  cpu_set_t set;
  if (thread_cpus(&set)) return CPU_COUNT(&set);
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? (int)online : 1;
}

int core_thread_create(pthread_t *tid, void *(*fn)(void *), void *arg) {
  cpu_set_t set;
  pthread_attr_t attr;
  if (thread_cpus(&set) && pthread_attr_init(&attr) == 0) {
    int rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
    if (rc == 0) rc = pthread_create(tid, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (rc == 0) return 0;
  }
  return pthread_create(tid, NULL, fn, arg);
}

l2l_status queue_start(struct core_queue *q, int threads, int first_id, const char *what) {
  memset(q, 0, sizeof *q);
  pthread_mutex_init(&q->lock, NULL);
  pthread_cond_init(&q->work, NULL);
  pthread_cond_init(&q->finished, NULL);
  q->first_id = first_id;
  q->tids = calloc((size_t)threads, sizeof *q->tids);
  if (q->tids == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for %s threads", what);
  for (int i = 0; i < threads; i++) {
    struct worker_arg *arg = malloc(sizeof *arg);
    if (arg == NULL ||
        core_thread_create(&q->tids[i], worker_main,
                           (*arg = (struct worker_arg){q, first_id + i}, arg)) != 0) {
      free(arg);
      queue_stop(q);
      return core_fail(L2L_ERR_NOMEM, "cannot start %s thread %d", what, i);
    }
    q->threads++;
  }
  return L2L_OK;
}

void queue_stop(struct core_queue *q) {
  if (q->tids == NULL) return;
  pthread_mutex_lock(&q->lock);
  q->stop = true;
  pthread_cond_broadcast(&q->work);
  pthread_mutex_unlock(&q->lock);
  for (int i = 0; i < q->threads; i++) pthread_join(q->tids[i], NULL);
  free(q->tids);
  q->tids = NULL;
  pthread_mutex_destroy(&q->lock);
  pthread_cond_destroy(&q->work);
  pthread_cond_destroy(&q->finished);
}

void queue_push(struct core_queue *q, struct core_job *job) {
  job->next = NULL;
  job->queue = q;
  job->done = false;
  job->status = L2L_OK;
  pthread_mutex_lock(&q->lock);
  if (q->tail) q->tail->next = job;
  else q->head = job;
  q->tail = job;
  pthread_cond_signal(&q->work);
  pthread_mutex_unlock(&q->lock);
}

l2l_status job_wait(struct core_job *job) {
  struct core_queue *q = job->queue;
  pthread_mutex_lock(&q->lock);
  while (!job->done) pthread_cond_wait(&q->finished, &q->lock);
  pthread_mutex_unlock(&q->lock);
  if (job->status != L2L_OK) return core_fail(job->status, "%s", job->message);
  return L2L_OK;
}

void queue_drain(struct core_queue *q) {
  pthread_mutex_lock(&q->lock);
  while (q->head != NULL || q->busy > 0) pthread_cond_wait(&q->finished, &q->lock);
  pthread_mutex_unlock(&q->lock);
}

void job_fail(struct core_job *job, l2l_status status) {
  job->status = status;
  snprintf(job->message, sizeof job->message, "%s", l2l_last_error());
}
