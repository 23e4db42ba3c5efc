/* jobs.h — queues of jobs served by threads, and waiting for a job (internal).
 *
 * Purpose: the relay's asynchronous units of work. A queue is a FIFO served by its own
 * threads: one thread per copy direction (host to device, device to host) so copies in
 * one direction stay in order like a CUDA stream, several for the optimizer. A job is
 * embedded in the struct of its kind; the thread that queued it waits for it with
 * l2l_job_wait. A copy job carries a device mark (internal.h) that its worker waits for
 * first: on a GPU, the kernels it depends on run after the queuing thread has moved on.
 * Errors on a worker are recorded in the job and surface on the waiting thread.
 * Must never: run a job on the thread that queued it, or touch Lua.
 */
#ifndef L2L_JOBS_H
#define L2L_JOBS_H

#include <pthread.h>

#include "internal.h"

struct l2l_queue;

struct l2l_job {
  void (*run)(struct l2l_job *job, int thread);   /* thread: the worker's id */
  struct l2l_job *next;
  struct l2l_queue *queue;
  bool done;                  /* under the queue's lock */
  bool free_when_done;        /* nobody waits: the worker frees it (with `release`) */
  void (*release)(struct l2l_job *job);
  struct l2l_device_mark *after;  /* the worker waits for it before run() (NULL: no wait) */
  l2l_status status;          /* set by run(); message below when not OK */
  char message[256];
};

struct l2l_queue {
  pthread_mutex_t lock;
  pthread_cond_t work, finished;
  struct l2l_job *head, *tail;
  int threads, first_id;      /* worker ids first_id .. first_id + threads - 1 */
  int busy;                   /* jobs taken and not done */
  bool stop;
  pthread_t *tids;
};

/* Starts `threads` workers whose ids begin at first_id. */
l2l_status l2l_queue_start(struct l2l_queue *q, int threads, int first_id, const char *what);
/* Finishes every queued job, then stops the workers. */
void l2l_queue_stop(struct l2l_queue *q);
void l2l_queue_push(struct l2l_queue *q, struct l2l_job *job);
/* Blocks until job is done; returns its status (this thread's last error gets its message). */
l2l_status l2l_job_wait(struct l2l_job *job);
/* Blocks until the queue is empty and idle. */
void l2l_queue_drain(struct l2l_queue *q);
/* Records a failed status and this thread's message in the job (for run()). */
void l2l_job_fail(struct l2l_job *job, l2l_status status);

/* Seconds on a monotonic clock. */
double l2l_now(void);

#endif /* L2L_JOBS_H */
