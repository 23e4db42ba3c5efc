/* SPDX-License-Identifier: MIT */
/* cluster.h — data parallel over MPI: the communication thread and its ordered collectives
 * (internal to libl2l; the EPS and the relay are its users).
 *
 * Purpose: MPI (OpenMPI from the system) is reached only through a plugin, libl2l-mpi.so,
 * built beside libl2l where mpicc is found and opened with dlopen the first time a program
 * asks for MPI (l2l_dist_init, or a relay with dist = mpi): a program that never asks
 * neither needs mpirun nor loads libmpi. The plugin (mpi_plugin.c, the one file that includes
 * mpi.h) is a table of thin calls; everything else is here.
 * One communication thread per process initialises MPI (MPI_THREAD_FUNNELED: it is the
 * only thread that ever calls MPI), posts every collective non-blocking and keeps calling
 * MPI_Test on what is in flight, because OpenMPI progresses a collective only inside MPI
 * calls. Collectives go out on streams: a stream is a communicator of its own on which
 * operations are posted in index order 0, 1, 2, ... whatever order their owners hand them
 * over in, so every rank issues the same collectives in the same order even when worker
 * threads finish records in a different order on each. An operation's completion runs its
 * callback on the communication thread.
 * Every operation in flight has a deadline (l2l_dist_set_timeout); one that passes it is a
 * rank that died or hangs: the thread prints the step, layer, operation, bytes and
 * sequence number it waited on and ends the job with MPI_Abort.
 * Must never: call MPI from any thread but the communication thread, post an operation of
 * a stream before every lower index of that stream, or run a callback under its lock.
 */
#ifndef L2L_CLUSTER_H
#define L2L_CLUSTER_H

#include "core/core.h"

/* ---------------------------------------------------------------- the plugin (mpi_plugin.c) */

/* What libl2l-mpi.so exports, as mpi_plugin(): MPI's calls over handles of its own
   (ints for communicators and requests), so that no other file sees an MPI type. Every
   call returns an MPI error code (0: MPI_SUCCESS) unless said otherwise. */
#define L2L_MPI_PLUGIN_VERSION 2
struct mpi_plugin {
  int version;                 /* L2L_MPI_PLUGIN_VERSION */
  /* MPI_Init_thread(FUNNELED) unless MPI is up already; errors return (not abort). */
  int (*init)(int *rank, int *size);
  int (*finalize)(void);
  void (*abort)(int code);     /* MPI_Abort(MPI_COMM_WORLD): ends every rank */
  int (*comm_dup)(int *comm);  /* a new communicator over every rank (collective) */
  void (*comm_free)(int comm);
  /* recv (counts[rank] floats) := the sum over ranks of send's segment `rank`, segments
     laid end to end in rank order with counts[r] elements each. */
  int (*reduce_scatter)(const float *send, float *recv, const int *counts, int comm, int *req);
  /* In place: every rank's segment r of buf (counts[r] elements at displs[r], each of
     `bytes` bytes: 4 floats, 2 16-bit values, 1 bytes) is rank r's. */
  int (*allgatherv)(void *buf, int bytes, const int *counts, const int *displs, int comm, int *req);
  int (*allreduce_sum)(double *buf, int n, int comm, int *req);   /* in place */
  /* recv (size * n int64s) := every rank's n, in rank order. */
  int (*allgather_i64)(const int64_t *send, int n, int64_t *recv, int comm, int *req);
  int (*barrier)(int comm, int *req);
  /* *done := 1 when req has completed (its handle is then free), else 0. */
  int (*test)(int req, int *done);
  void (*error_string)(int code, char *text, int len);
  const char *library;         /* MPI_Get_library_version's first line (after init) */
};
const struct mpi_plugin *mpi_plugin(void);
typedef const struct mpi_plugin *(*mpi_plugin_fn)(void);

/* ---------------------------------------------------------------- operations (comm_thread.c) */

enum dist_kind {
  DIST_NOOP,               /* takes its index on the stream and completes at once */
  DIST_REDUCE_SCATTER,     /* send (f32, the sum of counts), recv (counts[rank]) */
  DIST_ALLGATHERV,         /* recv in place, counts, displs (elements of `elem` bytes) */
  DIST_ALLREDUCE_SUM,      /* recv in place (f64), n */
  DIST_ALLGATHER_I64,      /* send (n int64s), recv (size * n) */
  DIST_BARRIER
};

/* One collective, owned by its poster (who keeps it alive until its callback has run). */
struct dist_op {
  enum dist_kind kind;
  const void *send;
  void *recv;
  const int *counts, *displs;
  int n;
  int elem;                    /* DIST_ALLGATHERV: bytes an element, 4 (0 means 4: f32), 2, 1 */
  /* On the communication thread once the operation has completed (NULL: nothing). */
  void (*done)(struct dist_op *op);
  void *ctx;
  /* For a timeout's report and the timeline: what it is for. */
  const char *what;            /* e.g. "reduce-scatter of gradients" */
  const char *name;            /* the record's name, or NULL */
  int layer;                   /* 0-based, -1: none */
  int64_t step;
  uint64_t bytes;              /* the bytes this rank sends (ring-minimum accounting) */
  struct core_timeline *timeline;   /* NULL: not recorded */
  int phase, lane;             /* its timeline phase and thread */
  /* Private to comm_thread.c. */
  int index;                   /* its place on the stream */
  int comm, request;
  double posted;
  int64_t sequence;            /* operations posted on its stream before it, ever */
  struct dist_op *next;
};

/* An ordered stream: a communicator of its own and the next index to post (indexes count
   from 0 over the stream's life: its owner numbers its operations). */
struct dist_stream;

/* ---------------------------------------------------------------- the process's MPI */

/* Opens the plugin and starts the communication thread, which initialises MPI; the
   second call and later ones do nothing. L2L_ERR_UNSUPPORTED when libl2l was built
   without MPI (no plugin), naming why. */
l2l_status dist_start(void);
/* Waits for what is in flight, finalizes MPI and stops the thread (MPI cannot start
   again in this process). */
void dist_stop(void);
/* The deadline of every operation in flight, in seconds; false for one outside (0, 1e6]. */
bool dist_set_timeout_now(double seconds);
int dist_rank_now(void);   /* 0 and 1 when not running */
int dist_size_now(void);

l2l_status dist_stream_new(struct dist_stream **out);   /* collective */
void dist_stream_free(struct dist_stream *stream);
/* Hands op over as the stream's operation `index` (fills op's private fields). */
void dist_post(struct dist_stream *stream, struct dist_op *op, int index);
/* Posts op on the process's control stream (operations in the calling threads' program
   order; the relay's per-step exchanges of counts and losses) and waits for it: every
   rank must call these in the same order. */
l2l_status dist_run(struct dist_op *op);

/* Ends the job from a library thread that cannot go on (a failed exchange): prints what
   on stderr with the rank and calls MPI_Abort. */
void dist_fail(const char *what);

#endif /* L2L_CLUSTER_H */
