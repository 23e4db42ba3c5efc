/* SPDX-License-Identifier: MIT */
/* comm_thread.c — the communication thread, its streams and deadlines (see cluster.h).
 *
 * Purpose: one thread per process that owns MPI. Other threads hand it operations under
 * a lock; it posts each stream's operations in index order, tests what is in flight,
 * runs callbacks, records the work on the owners' timelines, and ends the job when an
 * operation outlives the timeout. With nothing in flight it sleeps on a condition
 * variable; with something in flight it polls MPI every POLL_SECONDS, since OpenMPI
 * moves a non-blocking collective forward only inside an MPI call. A watchdog thread that
 * calls no MPI ends the process when an MPI call does not return (the last resort).
 * Must never: hold the lock while calling MPI or a callback.
 */
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"

#define POLL_SECONDS 50e-6
#define DEFAULT_TIMEOUT 300.0

struct dist_stream {
  int comm;
  int next;                      /* the index to post next */
  int64_t sequence;              /* operations posted on it, ever */
  struct dist_op *waiting;   /* handed over, index above next: not posted yet */
};

/* A call the thread makes for another thread (MPI's set-up and tear-down). */
struct thread_call {
  int (*fn)(struct thread_call *call);
  int rc;
  bool done;
  struct dist_stream *stream;
  struct thread_call *next;
};

static struct {
  pthread_mutex_t lock;
  pthread_cond_t work;           /* something for the thread */
  pthread_cond_t finished;       /* a control operation or a call has completed */
  pthread_t thread;
  bool started, running, stopping;
  const struct mpi_plugin *mpi;
  void *handle;
  int rank, size;
  double timeout;
  struct dist_stream *streams[64];
  int nstreams;
  struct dist_stream control;
  int control_given;             /* indexes handed out on the control stream */
  struct dist_op *in_flight;
  struct thread_call *calls;
  char abort_message[512];       /* non-empty: the thread ends the job */
  char error[512];               /* why start failed, or that MPI was finalized */
  l2l_status error_status;
} D = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
       .finished = PTHREAD_COND_INITIALIZER, .size = 1, .timeout = DEFAULT_TIMEOUT};

int dist_rank_now(void) { return D.running ? D.rank : 0; }
int dist_size_now(void) { return D.running ? D.size : 1; }

/* ---------------------------------------------------------------- the thread */

/* ---------------------------------------------------------------- the last resort

   A rank whose MPI library does not come back still ends (issue 47: two hosts, the link
   between them cut): an MPI_Test that blocks on a peer gone, an MPI_Abort that waits for
   a launcher out of reach (for as long as TCP takes to give up: minutes). The thread
   stamps when it enters such a call and clears the stamp when it returns; a watchdog
   thread, which calls no MPI, ends the process once a call has not returned for the
   timeout and the grace after it. */
enum { GRACE_SECONDS = 10 };
static _Atomic double in_mpi_since = 0;   /* core_now() when the call began; 0: none */

static void *watchdog_main(void *unused) {
  (void)unused;
  for (;;) {
    sleep(1);
    pthread_mutex_lock(&D.lock);
    double timeout = D.timeout;
    bool stopping = D.stopping;
    pthread_mutex_unlock(&D.lock);
    double since = atomic_load(&in_mpi_since);
    if (since > 0 && core_now() - since > timeout + GRACE_SECONDS) {
      fprintf(stderr, "l2l: rank %d of %d: an MPI call has not returned for %.0f s (a rank or the "
              "network between them gone?): ending this rank\n", D.rank, D.size, core_now() - since);
      _exit(1);
    }
    if (stopping && since == 0) return NULL;
  }
}

static void report_and_abort(const char *what) {
  fprintf(stderr, "l2l: rank %d of %d: %s; ending the job (MPI_Abort)\n", D.rank, D.size, what);
  fflush(stderr);
  pthread_mutex_lock(&D.lock);
  double timeout = D.timeout;
  pthread_mutex_unlock(&D.lock);
  atomic_store(&in_mpi_since, core_now() - timeout);   /* the watchdog's grace starts now */
  D.mpi->abort(1);
  _exit(1);   /* MPI_Abort does not return; should it, this rank must still end */
}

static void mpi_failed(int rc, const struct dist_op *op, const char *doing) {
  char text[256], what[512];
  D.mpi->error_string(rc, text, sizeof text);
  snprintf(what, sizeof what, "MPI failed %s %s (layer %d, step %lld, sequence %lld): %s", doing,
           op->what ? op->what : "an operation", op->layer + 1, (long long)op->step,
           (long long)op->sequence, text);
  report_and_abort(what);
}

static void post_one(struct dist_op *op) {
  int rc = 0;
  op->posted = core_now();
  op->request = -1;
  switch (op->kind) {
    case DIST_NOOP: return;
    case DIST_REDUCE_SCATTER:
      rc = D.mpi->reduce_scatter(op->send, op->recv, op->counts, op->comm, &op->request);
      break;
    case DIST_ALLGATHERV:
      rc = D.mpi->allgatherv(op->recv, op->elem > 0 ? op->elem : 4, op->counts, op->displs,
                             op->comm, &op->request);
      break;
    case DIST_ALLREDUCE_SUM: rc = D.mpi->allreduce_sum(op->recv, op->n, op->comm, &op->request); break;
    case DIST_ALLGATHER_I64:
      rc = D.mpi->allgather_i64(op->send, op->n, op->recv, op->comm, &op->request);
      break;
    case DIST_BARRIER: rc = D.mpi->barrier(op->comm, &op->request); break;
  }
  if (rc != 0) mpi_failed(rc, op, "to post");
}

static struct dist_stream *stream_at(int s) { return s < 0 ? &D.control : D.streams[s]; }

/* The stream's waiting operation whose turn it is (its link), or NULL; under the lock. */
static struct dist_op **next_in_line(struct dist_stream *stream) {
  for (struct dist_op **p = &stream->waiting; *p; p = &(*p)->next)
    if ((*p)->index == stream->next) return p;
  return NULL;
}

static bool any_ready(void) {
  for (int s = -1; s < D.nstreams; s++)
    if (stream_at(s) && next_in_line(stream_at(s))) return true;
  return false;
}

/* Takes, under the lock, every operation whose turn has come, in stream order. */
static struct dist_op *take_ready(void) {
  struct dist_op *ready = NULL, **tail = &ready;
  for (int s = -1; s < D.nstreams; s++) {
    struct dist_stream *stream = stream_at(s);
    if (stream == NULL) continue;
    for (struct dist_op **p; (p = next_in_line(stream)) != NULL;) {
      struct dist_op *op = *p;
      *p = op->next;
      op->next = NULL;
      op->comm = stream->comm;
      op->sequence = stream->sequence++;
      stream->next++;
      *tail = op;
      tail = &op->next;
    }
  }
  return ready;
}

static void complete(struct dist_op *op) {
  if (op->timeline && op->kind != DIST_NOOP)
    timeline_add(op->timeline, op->layer, -1, op->phase, op->lane, op->posted, core_now());
  if (op->done) op->done(op);
}

static void check_deadline(const struct dist_op *op, double now, double timeout) {
  if (now - op->posted <= timeout) return;
  char what[512];
  snprintf(what, sizeof what,
           "waited %.0f s (the timeout) for the %s%s%s%s of layer %d at step %lld: %llu bytes, "
           "sequence %lld of its stream; a rank died or hangs", now - op->posted,
           op->what ? op->what : "collective", op->name ? " of '" : "", op->name ? op->name : "",
           op->name ? "'" : "", op->layer + 1, (long long)op->step, (unsigned long long)op->bytes,
           (long long)op->sequence);
  report_and_abort(what);
}

/* Posts what is ready, tests what is in flight; true when anything is in flight. */
static bool progress(struct dist_op *ready) {
  for (struct dist_op *op = ready, *next; op; op = next) {
    next = op->next;
    post_one(op);
    if (op->kind == DIST_NOOP) {
      complete(op);
      continue;
    }
    op->next = D.in_flight;   /* only this thread touches the in-flight list */
    D.in_flight = op;
  }
  double now = core_now();
  pthread_mutex_lock(&D.lock);
  double timeout = D.timeout;
  pthread_mutex_unlock(&D.lock);
  for (struct dist_op **p = &D.in_flight; *p;) {
    struct dist_op *op = *p;
    atomic_store(&in_mpi_since, core_now());
    int done = 0, rc = D.mpi->test(op->request, &done);
    atomic_store(&in_mpi_since, 0.0);
    if (rc != 0) mpi_failed(rc, op, "while waiting for");
    if (!done) {
      check_deadline(op, now, timeout);
      p = &op->next;
      continue;
    }
    *p = op->next;
    complete(op);
  }
  return D.in_flight != NULL;
}

static void run_calls(struct thread_call *calls) {
  for (struct thread_call *c = calls, *next; c; c = next) {
    next = c->next;
    int rc = c->fn(c);
    pthread_mutex_lock(&D.lock);
    c->rc = rc;
    c->done = true;
    pthread_cond_broadcast(&D.finished);
    pthread_mutex_unlock(&D.lock);
  }
}

static void *thread_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&D.lock);
  for (;;) {
    if (D.abort_message[0]) {
      char what[sizeof D.abort_message];
      snprintf(what, sizeof what, "%s", D.abort_message);
      pthread_mutex_unlock(&D.lock);
      report_and_abort(what);
    }
    struct thread_call *calls = D.calls;
    D.calls = NULL;
    struct dist_op *ready = take_ready();
    if (D.stopping && D.in_flight == NULL && ready == NULL && calls == NULL) break;
    pthread_mutex_unlock(&D.lock);

    run_calls(calls);
    bool busy = progress(ready);

    pthread_mutex_lock(&D.lock);
    if (D.calls || D.abort_message[0] || any_ready() || (D.stopping && !busy)) continue;
    if (!busy) {
      pthread_cond_wait(&D.work, &D.lock);
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long ns = until.tv_nsec + (long)(POLL_SECONDS * 1e9);
    until.tv_sec += ns / 1000000000L;
    until.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&D.work, &D.lock, &until);
  }
  pthread_mutex_unlock(&D.lock);
  D.mpi->finalize();
  return NULL;
}

/* Runs call->fn on the communication thread and waits for it; its MPI error code. */
static int on_thread(struct thread_call *call) {
  pthread_mutex_lock(&D.lock);
  call->next = D.calls;
  D.calls = call;
  pthread_cond_signal(&D.work);
  while (!call->done) pthread_cond_wait(&D.finished, &D.lock);
  pthread_mutex_unlock(&D.lock);
  return call->rc;
}

static l2l_status mpi_status(int rc, const char *doing) {
  if (rc == 0) return L2L_OK;
  char text[256];
  D.mpi->error_string(rc, text, sizeof text);
  return FAIL(L2L_ERR_STATE, "MPI failed %s: %s", doing, text);
}

/* ---------------------------------------------------------------- start and stop */

static int init_call(struct thread_call *call) {
  (void)call;
  int rc = D.mpi->init(&D.rank, &D.size);
  if (rc == 0) rc = D.mpi->comm_dup(&D.control.comm);
  return rc;
}

/* The plugin beside the library that holds this function (libl2l.so, or a program that
   linked libl2l.a), else L2L_MPI_PLUGIN, else the loader's search path. */
static void *open_plugin(char *why, size_t len) {
  const char *env = getenv("L2L_MPI_PLUGIN");
  char path[4096] = "";
  Dl_info info;
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else if (dladdr((void *)dist_start, &info) && info.dli_fname) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", info.dli_fname);
    snprintf(path, sizeof path, "%s/libl2l-mpi.so", dirname(copy));
  }
  /* RTLD_GLOBAL: OpenMPI opens its own components, which need libmpi's symbols. */
  void *handle = path[0] ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (handle == NULL && !(env && *env)) handle = dlopen("libl2l-mpi.so", RTLD_NOW | RTLD_GLOBAL);
  if (handle == NULL) {
    const char *err = dlerror();
    snprintf(why, len, "cannot open the MPI plugin %s (%s): libl2l was built without MPI "
             "(install openmpi-bin and libopenmpi-dev, then rebuild), or L2L_MPI_PLUGIN "
             "names the wrong file", path[0] ? path : "libl2l-mpi.so", err ? err : "not found");
  }
  return handle;
}

/* One start at a time (two threads asking at once: the second waits for the first's
   outcome). */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static l2l_status start(void);

l2l_status dist_start(void) {
  pthread_mutex_lock(&start_lock);
  l2l_status status = start();
  pthread_mutex_unlock(&start_lock);
  return status;
}

static l2l_status start(void) {
  if (D.started) {
    if (D.running) return L2L_OK;
    return FAIL(D.error_status, "%s", D.error);
  }
  /* Set first, so that a failure is said again rather than retried into a second
     MPI_Init. */
  D.started = true;
  char why[sizeof D.error];
  D.handle = open_plugin(why, sizeof why);
  if (D.handle == NULL) {
    snprintf(D.error, sizeof D.error, "%s", why);
    D.error_status = L2L_ERR_UNSUPPORTED;
    return FAIL(L2L_ERR_UNSUPPORTED, "%s", why);
  }
  mpi_plugin_fn get = (mpi_plugin_fn)dlsym(D.handle, "mpi_plugin");
  D.mpi = get ? get() : NULL;
  if (D.mpi == NULL || D.mpi->version != L2L_MPI_PLUGIN_VERSION) {
    snprintf(D.error, sizeof D.error, "the MPI plugin is not this libl2l's (version %d, "
             "expected %d): reinstall l2l", D.mpi ? D.mpi->version : -1, L2L_MPI_PLUGIN_VERSION);
    D.error_status = L2L_ERR_UNSUPPORTED;
    return FAIL(L2L_ERR_UNSUPPORTED, "%s", D.error);
  }
  const char *t = getenv("L2L_DIST_TIMEOUT");
  if (t && *t) {
    char *end;
    double seconds = strtod(t, &end);
    if (*end == '\0' && seconds > 0 && seconds <= 1e6) D.timeout = seconds;
  }
  if (core_thread_create(&D.thread, thread_main, NULL) != 0) {
    snprintf(D.error, sizeof D.error, "cannot start the communication thread: %s",
             strerror(errno));
    D.error_status = L2L_ERR_NOMEM;
    return FAIL(L2L_ERR_NOMEM, "%s", D.error);
  }
  pthread_t watchdog;   /* (detached: it ends with the thread, or ends the process) */
  if (core_thread_create(&watchdog, watchdog_main, NULL) == 0) pthread_detach(watchdog);
  struct thread_call call = {.fn = init_call};
  int rc = on_thread(&call);
  if (rc != 0) {
    l2l_status status = mpi_status(rc, "to initialise");
    snprintf(D.error, sizeof D.error, "%s", l2l_last_error());
    D.error_status = status;
    pthread_mutex_lock(&D.lock);
    D.stopping = true;
    pthread_cond_signal(&D.work);
    pthread_mutex_unlock(&D.lock);
    pthread_join(D.thread, NULL);
    return status;
  }
  D.running = true;
  return L2L_OK;
}

void dist_stop(void) {
  pthread_mutex_lock(&start_lock);
  bool running = D.running;
  pthread_mutex_unlock(&start_lock);
  if (!running) return;
  pthread_mutex_lock(&D.lock);
  D.stopping = true;
  pthread_cond_signal(&D.work);
  pthread_mutex_unlock(&D.lock);
  pthread_join(D.thread, NULL);
  D.running = false;
  D.error_status = L2L_ERR_STATE;
  snprintf(D.error, sizeof D.error, "MPI was finalized (l2l_dist_finalize): it cannot start again");
}

void dist_fail(const char *what) {
  if (!D.running) return;
  pthread_mutex_lock(&D.lock);
  snprintf(D.abort_message, sizeof D.abort_message, "%s", what);
  pthread_cond_signal(&D.work);
  pthread_mutex_unlock(&D.lock);
  for (;;) pause();   /* the communication thread ends the process */
}

bool dist_set_timeout_now(double seconds) {
  if (!(seconds > 0 && seconds <= 1e6)) return false;
  pthread_mutex_lock(&D.lock);
  D.timeout = seconds;
  pthread_mutex_unlock(&D.lock);
  return true;
}

/* ---------------------------------------------------------------- streams and operations */

static int dup_call(struct thread_call *call) {
  pthread_mutex_lock(&D.lock);
  int rc = 0;
  if (D.nstreams == (int)(sizeof D.streams / sizeof *D.streams)) rc = -1;
  pthread_mutex_unlock(&D.lock);
  if (rc == 0) rc = D.mpi->comm_dup(&call->stream->comm);
  if (rc == 0) {
    pthread_mutex_lock(&D.lock);
    D.streams[D.nstreams++] = call->stream;
    pthread_mutex_unlock(&D.lock);
  }
  return rc;
}

l2l_status dist_stream_new(struct dist_stream **out) {
  if (!D.running) return FAIL(L2L_ERR_STATE, "MPI is not running");
  struct dist_stream *stream = calloc(1, sizeof *stream);
  if (stream == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for an MPI stream");
  struct thread_call call = {.fn = dup_call, .stream = stream};
  int rc = on_thread(&call);
  if (rc == -1) {
    free(stream);
    return FAIL(L2L_ERR_NOMEM, "too many MPI streams (relays with dist = mpi) at once");
  }
  if (rc != 0) {
    free(stream);
    return mpi_status(rc, "to make a communicator");
  }
  *out = stream;
  return L2L_OK;
}

static int free_call(struct thread_call *call) {
  pthread_mutex_lock(&D.lock);
  for (int s = 0; s < D.nstreams; s++)
    if (D.streams[s] == call->stream) D.streams[s] = D.streams[--D.nstreams];
  pthread_mutex_unlock(&D.lock);
  D.mpi->comm_free(call->stream->comm);
  return 0;
}

void dist_stream_free(struct dist_stream *stream) {
  if (stream == NULL) return;
  if (D.running) {
    struct thread_call call = {.fn = free_call, .stream = stream};
    on_thread(&call);
  }
  free(stream);
}

void dist_post(struct dist_stream *stream, struct dist_op *op, int index) {
  pthread_mutex_lock(&D.lock);
  op->index = index;
  op->next = stream->waiting;
  stream->waiting = op;
  if (index == stream->next) pthread_cond_signal(&D.work);
  pthread_mutex_unlock(&D.lock);
}

static void control_done(struct dist_op *op) {
  bool *done = op->ctx;
  pthread_mutex_lock(&D.lock);
  *done = true;
  pthread_cond_broadcast(&D.finished);
  pthread_mutex_unlock(&D.lock);
}

l2l_status dist_run(struct dist_op *op) {
  if (!D.running) return FAIL(L2L_ERR_STATE, "MPI is not running (l2l_dist_init first)");
  bool done = false;
  op->done = control_done;
  op->ctx = &done;
  pthread_mutex_lock(&D.lock);
  op->index = D.control_given++;   /* the control stream's order is its callers' */
  op->next = D.control.waiting;
  D.control.waiting = op;
  pthread_cond_signal(&D.work);
  while (!done) pthread_cond_wait(&D.finished, &D.lock);
  pthread_mutex_unlock(&D.lock);
  return L2L_OK;
}
