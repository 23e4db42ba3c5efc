/* SPDX-License-Identifier: MIT */
/* exchange.c — data parallel in the EPS: each record's gradient reduce-scattered across
 * ranks, its shard updated here, its master all-gathered back (ZeRO-1/2 style, KARMA's
 * pipelined exchange).
 *
 * Purpose: the collectives of a record's life in a step with ranks, each posted by the
 * core (update.c) with its completion as the one before ends:
 *   complete here (eps.c's absorb) -> reduce-scatter of the accumulator into the shard's
 *   reduced gradient (the accumulator is cleared) -> all-reduce of the shard's sum of
 *   squares and non-finite count (every rank then knows the record's global norm and
 *   whether it holds an inf or NaN) -> the shard's update on the workers (eager, or when
 *   the relay releases deferred updates; LAMB's whole-record sums go through one more
 *   all-reduce between its waves) -> all-gather of the master -> settled.
 * This file says what each collective sends and receives, on which stream and in which
 * place; what follows each is the core's (it neither calls nor keeps a function of it).
 * Each stage has a stream (a communicator) of its own, on which a record takes the same
 * place on every rank: this step's due records in the order backward completes them
 * (eps_exchange_order), so collectives match across ranks whatever order the workers
 * finish in. A record skipped on every rank (agreed inf or NaN, or an overflow) takes its
 * place on the remaining streams with nothing sent.
 * A record placed on the device goes through the same stages from pinned memory (its
 * accumulator copied there as it completes, rec->exchange): the reduce-scatter, the norm's
 * all-reduce, then an all-gather of the reduced gradient instead of the master, so every
 * rank holds the whole reduced gradient, the very same bits, and updates all of the
 * record on its device alike (update.c takes it there at the step's end); its place on
 * the stream of LAMB's sums is passed (its device sums its record whole).
 * Shards: core's host_shard (the planner counts them by it too), cut at whole blocks
 * for 8-bit state; uneven sizes are padded by MPI's per-rank counts, never refused. A
 * bf16 master is all-gathered as 16-bit elements; a checkpoint's state in its precision,
 * and so is a record's as placement auto moves it to the device (eps_move_prepare: the
 * move's entry, above the tier's read-back and the device's tensors, which it calls).
 * Must never: issue a collective out of its place, or update a record before every rank
 * has agreed it may.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

struct eps_dist {
  struct dist_stream *rs, *flag, *lamb, *ag;
  int rank, size, lane;
  int base;          /* the place of this step's first due record on every stream */
  uint64_t bytes;    /* what this step's exchanges send (eps_exchange_order, less skips) */
};

l2l_status eps_dist_start(struct eps *eps, int lane) {
  if (eps->count > 0) return FAIL(L2L_ERR_STATE, "the EPS holds records already");
  struct eps_dist *d = calloc(1, sizeof *d);
  if (d == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for the EPS's exchange");
  d->rank = dist_rank_now();
  d->size = dist_size_now();
  d->lane = lane;
  struct dist_stream **streams[4] = {&d->rs, &d->flag, &d->lamb, &d->ag};
  for (int i = 0; i < 4; i++) {
    l2l_status status = dist_stream_new(streams[i]);
    if (status != L2L_OK) {
      for (int j = 0; j < i; j++) dist_stream_free(*streams[j]);
      free(d);
      return status;
    }
  }
  eps->dist = d;
  return L2L_OK;
}

void eps_dist_free(struct eps *eps) {
  struct eps_dist *d = eps->dist;
  if (d == NULL) return;
  dist_stream_free(d->rs);
  dist_stream_free(d->flag);
  dist_stream_free(d->lamb);
  dist_stream_free(d->ag);
  free(d);
  eps->dist = NULL;
}

uint64_t eps_dist_bytes(const struct eps *eps) {
  if (eps->dist == NULL) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&eps->lock);
  uint64_t bytes = eps->dist->bytes;
  pthread_mutex_unlock((pthread_mutex_t *)&eps->lock);
  return bytes;
}

/* rec's shard (eps_shard made its parts) on the device or on the host: a record on the
   device is updated whole on every rank (its reduced gradient all-gathered), so its shard
   is all of it; on the host, this rank's part. */
static void shard_at(const struct eps_record *rec, bool device, int64_t *begin, int64_t *n) {
  int rank = rec->eps->dist->rank;
  *begin = device ? 0 : rec->displs[rank];
  *n = device ? l2l_tensor_numel(rec->master) : rec->counts[rank];
}

l2l_status eps_shard(struct eps *eps, struct eps_record *rec) {
  const struct eps_dist *d = eps->dist;
  int64_t n = l2l_tensor_numel(rec->master);
  /* MPI counts and displacements are ints: every offset into the record must be one */
  if (n > INT_MAX)
    return FAIL(L2L_ERR_INVALID, "parameter '%s' has %lld elements: with dist = mpi a record "
                "holds at most %d (MPI's counts are ints)", rec->name,
                (long long)n, INT_MAX);
  rec->counts = calloc((size_t)d->size, sizeof *rec->counts);
  rec->displs = calloc((size_t)d->size, sizeof *rec->displs);
  if (rec->counts == NULL || rec->displs == NULL)
    return FAIL(L2L_ERR_NOMEM, "no memory for a record's shards");
  for (int r = 0; r < d->size; r++) {
    int64_t begin, count;
    host_shard(n, d->size, r, host_shard_align(eps->optimizer.state), &begin, &count);
    rec->displs[r] = (int)begin;   /* <= n <= INT_MAX */
    rec->counts[r] = (int)count;
  }
  shard_at(rec, rec->placement == EPS_PLACE_DEVICE, &rec->shard_begin, &rec->shard_n);
  return L2L_OK;
}

l2l_status eps_exchange_buffers(struct eps *eps, struct eps_record *rec) {
  if (rec->shard_grad == NULL) {   /* f32, whatever the state's precision */
    int64_t part = rec->counts[eps->dist->rank];
    int64_t shape[1] = {part > 0 ? part : 1};   /* an empty part: 1 unused */
    TRY(l2l_tensor_new(&rec->shard_grad, L2L_POOL_HOST, L2L_F32, 1, shape));
  }
  if (rec->placement == EPS_PLACE_DEVICE && rec->exchange == NULL)
    TRY(tensor_new_like(&rec->exchange, L2L_POOL_PINNED, L2L_F32, rec->master));
  return L2L_OK;
}

/* This rank's part of rec's reduce-scatter: its elements [part_begin, + part_n). */
static int64_t part_n(const struct eps_record *rec) { return rec->counts[rec->eps->dist->rank]; }
static int64_t part_begin(const struct eps_record *rec) { return rec->displs[rec->eps->dist->rank]; }

/* The array rec's all-gather fills in place: on the host its master (2 bytes an element
   for a bf16 one), on the device the f32 reduced gradient (rec->exchange). */
static l2l_tensor *gathered_array(const struct eps_record *rec) {
  return rec->placement == EPS_PLACE_DEVICE ? rec->exchange : rec->master;
}

/* What one collective of rec moves per rank, as a ring does: every part but its own, of
   the f32 gradient (the reduce-scatter) or of the all-gather's array. */
static uint64_t exchange_bytes(const struct eps_record *rec, bool gather) {
  size_t elem = gather ? l2l_dtype_size((l2l_dtype)l2l_tensor_dtype(gathered_array(rec))) : sizeof(float);
  return (uint64_t)(l2l_tensor_numel(rec->master) - part_n(rec)) * elem;
}

void eps_exchange_order(struct eps *eps) {
  struct eps_record *list[eps->count > 0 ? eps->count : 1];
  int n = 0;
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (rec->update_due && rec->expected > 0) list[n++] = rec;
  }
  eps_sort_by_completion(list, n);
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    list[i]->order = eps->dist->base + i;
    bytes += exchange_bytes(list[i], false) + exchange_bytes(list[i], true);
  }
  eps->dist->base += n;
  pthread_mutex_lock(&eps->lock);
  eps->dist->bytes = n > 0 ? bytes : eps->dist->bytes;   /* (a step without update: the last) */
  pthread_mutex_unlock(&eps->lock);
}

static void op_fill(struct dist_op *op, struct eps_record *rec, enum dist_kind kind,
                    const char *what, void (*done)(struct dist_op *)) {
  struct eps *eps = rec->eps;
  *op = (struct dist_op){.kind = kind, .counts = rec->counts, .displs = rec->displs,
                             .done = done, .ctx = rec, .what = what,
                             .name = rec->name, .layer = rec->last_layer,
                             .step = atomic_load(&eps->step), .lane = eps->dist->lane};
}

/* Each collective's operation (in the record), stream and words. */
static struct dist_op *collective(struct eps *eps, struct eps_record *rec,
                                  enum eps_collective which, struct dist_stream **stream,
                                  const char **what) {
  struct eps_dist *d = eps->dist;
  switch (which) {
  case EPS_REDUCE_SCATTER: *stream = d->rs, *what = "reduce-scatter of gradients"; return &rec->rs;
  case EPS_NORM: *stream = d->flag, *what = "all-reduce of the gradient's norm"; return &rec->flag;
  case EPS_LAMB_SUMS: *stream = d->lamb, *what = "all-reduce of LAMB's norms"; return &rec->lamb_op;
  case EPS_ALL_GATHER: break;
  }
  *stream = d->ag, *what = rec->placement == EPS_PLACE_DEVICE
                                ? "all-gather of the reduced gradient (a record on the device)"
                                : "all-gather of the updated weights";
  return &rec->ag;
}

void eps_exchange_post(struct eps *eps, struct eps_record *rec, enum eps_collective which,
                       void (*done)(struct dist_op *op)) {
  struct dist_stream *stream;
  const char *what;
  struct dist_op *op = collective(eps, rec, which, &stream, &what);
  /* Its place for the whole exchange: the next step's eps_exchange_order may give the
     record a new one before this exchange's later stages are posted. */
  if (which == EPS_REDUCE_SCATTER) rec->place = rec->order;
  op_fill(op, rec, which == EPS_NORM || which == EPS_LAMB_SUMS ? DIST_ALLREDUCE_SUM
                   : which == EPS_REDUCE_SCATTER ? DIST_REDUCE_SCATTER : DIST_ALLGATHERV,
          what, done);
  bool device = rec->placement == EPS_PLACE_DEVICE;   /* (its gradient in rec->exchange) */
  if (which == EPS_REDUCE_SCATTER) {
    op->send = l2l_tensor_data(device ? rec->exchange : rec->grad);
    op->recv = l2l_tensor_data(rec->shard_grad);
    op->bytes = exchange_bytes(rec, false);
    op->timeline = eps->timeline;
    op->phase = L2L_PHASE_REDUCE_SCATTER;
  } else if (which == EPS_NORM) {
    float most = 0;
    double sumsq = optim_sumsq_most(l2l_tensor_data(rec->shard_grad), part_n(rec), &most);
    rec->flags[0] = sumsq;
    /* an eager update takes the gradient as it is: at EPS_GRAD_LIMIT or more it is skipped
       on every rank, as an inf is; a deferred one decides by the sum of the shards' largest
       times its scale (a bound of the largest: the sum goes by MPI's sum; it may skip a
       record one process would update only when the largest is within a factor of the
       ranks of the limit) */
    rec->flags[1] = isfinite(sumsq) && most < EPS_GRAD_LIMIT ? 0 : 1;
    rec->flags[2] = most;
    op->recv = rec->flags;
    op->n = 3;
  } else if (which == EPS_LAMB_SUMS) {
    rec->lamb[0] = rec->wave_sums[0];
    rec->lamb[1] = rec->wave_sums[1];
    op->recv = rec->lamb;
    op->n = 2;
  } else {   /* (on the device this rank's part laid in its place first) */
    l2l_tensor *array = gathered_array(rec);
    if (device)
      memcpy((float *)l2l_tensor_data(array) + part_begin(rec), l2l_tensor_data(rec->shard_grad),
             (size_t)part_n(rec) * sizeof(float));
    op->recv = l2l_tensor_data(array);
    op->elem = (int)l2l_dtype_size((l2l_dtype)l2l_tensor_dtype(array));
    op->bytes = exchange_bytes(rec, true);
    op->timeline = eps->timeline;
    op->phase = L2L_PHASE_ALL_GATHER;
  }
  dist_post(stream, op, rec->place);
}

void eps_exchange_pass(struct eps *eps, struct eps_record *rec, enum eps_collective which,
                       void (*done)(struct dist_op *op)) {
  struct dist_stream *stream;
  const char *what;
  struct dist_op *op = collective(eps, rec, which, &stream, &what);
  if (which == EPS_LAMB_SUMS) what = "LAMB's sums";   /* (as a timeout names it) */
  op_fill(op, rec, DIST_NOOP, what, done);
  dist_post(stream, op, rec->place);
}

void eps_exchange_skipped(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  eps->dist->bytes -= exchange_bytes(rec, true);   /* no all-gather */
  pthread_mutex_unlock(&eps->lock);
}

/* The whole state array from every rank's shard, in its precision: each rank's shard laid
   in its place and all-gathered in place; 8 bits in two gathers, the codes (bytes) and the
   scales (a shard's whole blocks: shards start on a block). Collective. */
static l2l_status state_gather(l2l_tensor **out, struct eps *eps, struct eps_record *rec,
                               const l2l_tensor *shard) {
  l2l_state_precision p = eps->optimizer.state;
  int64_t n = l2l_tensor_numel(rec->master);
  int size = eps->dist->size, elem = state_elem_bytes(p);
  l2l_status status;
  if (p == L2L_STATE_8BIT) {
    int64_t shape[1] = {(int64_t)host_state_bytes(p, n)};
    status = l2l_tensor_new(out, L2L_POOL_HOST, L2L_U8, 1, shape);
  } else {
    status = tensor_new_like(out, L2L_POOL_HOST, state_dtype(p), rec->master);
  }
  if (status != L2L_OK) return status;
  uint8_t *whole = l2l_tensor_data(*out);
  const uint8_t *mine = l2l_tensor_data(shard);
  memcpy(whole + (size_t)rec->shard_begin * (size_t)elem, mine, (size_t)rec->shard_n * (size_t)elem);
  struct dist_op op = {.kind = DIST_ALLGATHERV, .recv = whole, .elem = elem,
                           .counts = rec->counts, .displs = rec->displs,
                           .what = "all-gather of optimizer state (a checkpoint)",
                           .name = rec->name, .layer = -1, .step = atomic_load(&eps->step)};
  status = dist_run(&op);
  if (status == L2L_OK && p == L2L_STATE_8BIT) {   /* then every shard's blocks' scales */
    int *counts = calloc(2 * (size_t)size, sizeof *counts), *displs = counts + size;
    if (counts == NULL) status = FAIL(L2L_ERR_NOMEM, "no memory for a gather's counts");
    for (int r = 0; status == L2L_OK && r < size; r++) {
      counts[r] = (int)state8_blocks(rec->counts[r]);
      displs[r] = rec->displs[r] / L2L_STATE_BLOCK;
    }
    uint64_t codes = state8_codes_bytes(n), own = state8_codes_bytes(rec->shard_n);
    float *scales = (float *)(whole + codes);
    memset(whole + n, 0, (size_t)(codes - (uint64_t)n));   /* the padding, zero as documented */
    if (status == L2L_OK) {
      memcpy(scales + displs[eps->dist->rank], mine + own, (size_t)counts[eps->dist->rank] * sizeof(float));
      op.recv = scales, op.elem = 4, op.counts = counts, op.displs = displs;
      op.what = "all-gather of optimizer state's scales (a checkpoint)";
      status = dist_run(&op);
    }
    free(counts);
  }
  if (status != L2L_OK) {
    l2l_tensor_free(*out);
    *out = NULL;
  }
  return status;
}

l2l_status eps_state_whole(l2l_tensor **out, struct eps *eps, struct eps_record *rec,
                           int which) {
  *out = NULL;
  if (rec->gathered[which] != NULL) {   /* asked for before, this step */
    *out = rec->gathered[which];
    return L2L_OK;
  }
  /* Another record's copies go: a checkpoint asks for one record after another, and holds
     one record's state at a time, never the model's (a spilled EPS may exceed memory). */
  if (eps->gathered_last != rec) eps_gathered_free(eps);
  eps->gathered_last = rec;
  l2l_tensor *shard = rec->state[which], *read = NULL;
  if (rec->spilled) {   /* from the spill file (kept until the next step as a gathered one) */
    if (which >= optim_state_count(&eps->optimizer)) return L2L_OK;
    l2l_status status = eps_spill_read_state(eps, rec, which, &read);
    if (status != L2L_OK) {   /* the record named: the file's message knows only an offset */
      char why[1024];
      snprintf(why, sizeof why, "%s", l2l_last_error());
      return core_fail(status, "%s: its optimizer state could not be read: %s", rec->name, why);
    }
    shard = read;
  } else if (rec->updates == 0 || shard == NULL) {
    return L2L_OK;
  }
  if (rec->placement == EPS_PLACE_DEVICE) {   /* a host copy (kept as a gathered one) */
    TRY(tensor_new_like(&rec->gathered[which], L2L_POOL_HOST, (l2l_dtype)l2l_tensor_dtype(shard), shard));
    l2l_status status = l2l_tensor_copy(rec->gathered[which], shard);
    if (status == L2L_OK) *out = rec->gathered[which];
    return status;
  }
  if (eps->dist == NULL) {
    if (read != NULL) rec->gathered[which] = read;   /* freed as the next step begins */
    *out = shard;
    return L2L_OK;
  }
  l2l_tensor *whole = NULL;
  l2l_status status = state_gather(&whole, eps, rec, shard);
  l2l_tensor_free(read);
  if (status != L2L_OK) return status;
  *out = rec->gathered[which] = whole;
  return L2L_OK;
}

/* ---------------------------------------------------------------- a record's move (auto) */

l2l_status eps_move_prepare(struct eps_move *m, struct eps_record *rec, bool to_device) {
  *m = (struct eps_move){.to_device = to_device};
  struct eps *eps = rec->eps;
  TRY(eps_move_ready(rec, to_device));   /* (settled, its state in memory) */
  int64_t begin = rec->shard_begin, n = rec->shard_n;
  const l2l_tensor *whole[2] = {NULL, NULL};
  if (eps->dist) shard_at(rec, to_device, &begin, &n);
  /* with ranks, to the device: the whole state from every rank's shard (collective) */
  for (int a = 0; eps->dist && to_device && a < optim_state_count(&eps->optimizer); a++) {
    l2l_tensor *gathered = NULL;
    TRY(eps_state_whole(&gathered, eps, rec, a));   /* (rec keeps it until the next one's) */
    whole[a] = gathered;
  }
  return eps_device_move_prepare(m, rec, to_device, begin, n, whole);
}

/* ---------------------------------------------------------------- gathered state freed */

void eps_gathered_free(struct eps *eps) {
  struct eps_record *rec = eps->gathered_last;
  for (int a = 0; rec != NULL && a < 2; a++) {
    l2l_tensor_free(rec->gathered[a]);
    rec->gathered[a] = NULL;
  }
  eps->gathered_last = NULL;
}
