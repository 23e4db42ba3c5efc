/* SPDX-License-Identifier: MIT */
/* update.c — the EPS core's update queue: a record's update from the moment it may start
 * to the moment it settles.
 *
 * Purpose: an update is split into chunks of CHUNK elements, queued on the workers in one
 * wave, or in two when the optimizer needs whole-record sums between them (LAMB's norms:
 * moments, then apply), so a large record (an embedding table) keeps every worker busy;
 * the last chunk of a record clears its accumulator, counts the update and wakes whoever
 * waits for the record; a staging copy is rewritten the same way. Every continuation of
 * an update is here, in the core, and the parts below are asked, never asking back:
 *   - the storage tier says whether an update has room and hands back, as data, the
 *     waiting updates whose room has come (eps_room_next): this file begins them;
 *   - the ranks' exchange posts each collective of a record with the completion this file
 *     gives it, which the communication thread calls (reduced -> norm_agreed -> the
 *     update -> lamb_summed between waves -> gathered: settled).
 * Must never: update a record before all its gradients for the minibatch have arrived
 * (with ranks, before every rank has agreed its norm), or settle one whose state is not
 * back where the tier keeps it.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* One chunk of one record's update; freed by the worker. */
struct chunk_job {
  struct core_job job;
  struct eps *eps;
  struct eps_record *rec;
  int64_t begin, end;
  int wave;            /* 0 .. the optimizer's waves - 1; STAGE_WAVE: the staging copy
                          from the master */
};

static void chunk_release(struct core_job *job) { free(job); }
static void chunk_run(struct core_job *job, int thread);
static void stage_chunk(struct eps *eps, struct eps_record *rec, int64_t begin, int64_t n,
                        int thread, double t0);
static void gathered(struct dist_op *op);
static void lamb_summed(struct dist_op *op);

/* An update covers this rank's shard (all of the record on one process); a staging
   rewrite the whole record. */
static int64_t wave_elements(const struct eps_record *rec, int wave) {
  return wave == STAGE_WAVE ? l2l_tensor_numel(rec->master) : rec->shard_n;
}

/* Queues the chunks of one wave of rec's update (rec's chunks_left set under the lock). */
static void queue_wave(struct eps *eps, struct eps_record *rec, int wave) {
  int64_t n = wave_elements(rec, wave);
  int chunks = optim_chunks(n);
  pthread_mutex_lock(&eps->lock);
  rec->chunks_left = chunks;
  pthread_mutex_unlock(&eps->lock);
  for (int c = 0; c < chunks; c++) {
    int64_t begin = (int64_t)c * CHUNK, end = optim_chunk_end(n, begin);
    struct chunk_job chunk = {.eps = eps, .rec = rec, .begin = begin, .end = end, .wave = wave};
    struct chunk_job *cj = calloc(1, sizeof *cj);
    if (cj == NULL) {   /* finish the wave inline rather than lose it */
      chunk_run(&chunk.job, 0);
      continue;
    }
    *cj = chunk;
    cj->job.run = chunk_run;
    cj->job.free_when_done = true;
    cj->job.release = chunk_release;
    queue_push(&eps->workers, &cj->job);
  }
}

static void update_begin(struct eps *eps, struct eps_record *rec, float grad_scale);

/* The waiting updates the storage tier hands back, first the one it took with the room or
   the turn just given (NULL: none), then each whose room has come since, begun in turn. */
static void waiting_begin(struct eps *eps, struct eps_record *next) {
  for (; next != NULL; next = eps_room_next(eps)) update_begin(eps, next, next->wait_grad_scale);
}

static void device_gather(struct eps *eps, struct eps_record *rec);

void eps_start_update(struct eps *eps, struct eps_record *rec, float grad_scale) {
  if (rec->placement == EPS_PLACE_DEVICE && eps->dist) {   /* with ranks: its reduced
      gradient all-gathered first; the compute thread takes it and updates at the step's end
      (eps_exchanged_updates), never this thread (which may be the communication thread) */
    rec->exchange_scale = grad_scale;
    device_gather(eps, rec);
    return;
  }
  if (rec->placement == EPS_PLACE_DEVICE) {   /* queued on the device now, on this thread */
    rec->hyper = eps_update_hyper(eps, rec, grad_scale);
    /* (eager: its flag skips it; deferred: the release decided) */
    eps_io_failed(eps, eps_device_update(rec, &rec->hyper, !eps->deferred_step));
    return;
  }
  if (eps->spill == NULL) {
    update_begin(eps, rec, grad_scale);
    return;
  }
  struct eps_record *next = NULL;
  bool room = eps_update_room(eps, rec, grad_scale, &next);
  if (!room) return;   /* it waits (pending), begun once the tier hands it back */
  waiting_begin(eps, next);   /* (the next turn's update may wait) */
  update_begin(eps, rec, grad_scale);
}

/* rec's update has begun with room: its state in memory (a spill file's read), the
   first wave queued. A failed read: not updated, settled as it is. */
static void update_begin(struct eps *eps, struct eps_record *rec, float grad_scale) {
  if (eps->spill) {
    l2l_status status = eps_state_for_update(eps, rec);
    if (status != L2L_OK) {   /* not updated: the next step reports it (eps_io_status) */
      char why[1024];
      snprintf(why, sizeof why, "%s", l2l_last_error());
      eps_io_failed(eps, core_fail(status, "%s was not updated (its optimizer state could not "
                                   "be read): %s", rec->name, why));
      eps_grad_clear(eps, rec, false);
      if (eps->dist) {   /* the other ranks wait for its all-gather: the shard as it is */
        eps_exchange_post(eps, rec, EPS_ALL_GATHER, gathered);
      } else {
        pthread_mutex_lock(&eps->lock);
        rec->pending = false;
        pthread_cond_broadcast(&eps->changed);
        pthread_mutex_unlock(&eps->lock);
      }
      waiting_begin(eps, eps_room_return(eps, rec));
      return;
    }
  }
  rec->hyper = eps_update_hyper(eps, rec, grad_scale);
  rec->wave_sums[0] = rec->wave_sums[1] = 0;
  pthread_mutex_lock(&eps->lock);
  rec->pending = true;
  rec->grad_give = eps->spill && eps->grads_pass && rec->shard_grad == NULL;
  pthread_mutex_unlock(&eps->lock);
  queue_wave(eps, rec, 0);
}

/* The optimizer on elements [begin, begin + n) of rec's shard (n within one chunk), its
   gradient g[0, n): f32 state in place, compact state or a bf16 master decoded a block at
   a time (a range begins on a block: chunks and the held path's blocks do). */
static void update_range(struct eps *eps, struct eps_record *rec, int64_t begin, int64_t n,
                         const float *g, int wave, double sums[2]) {
  bool bf16_master = l2l_tensor_dtype(rec->master) == L2L_BF16;   /* (quant.c decodes it) */
  struct optim_chunk chunk = {
      .p = bf16_master ? NULL : (float *)l2l_tensor_data(rec->master) + rec->shard_begin + begin,
      .grad = g, .n = n, .h = &rec->hyper, .wave = wave, .sums = sums,
      .record_sums = rec->wave_sums};
  if (eps->optimizer.state == L2L_STATE_F32 && !bf16_master) {
    for (int a = 0; a < 2; a++)
      chunk.state[a] = rec->state[a] ? (float *)l2l_tensor_data(rec->state[a]) + begin : NULL;
    eps->optim->chunk(&chunk);
  } else {
    struct eps_compact compact = {
        .state = {rec->state[0] ? l2l_tensor_data(rec->state[0]) : NULL,
                  rec->state[1] ? l2l_tensor_data(rec->state[1]) : NULL},
        .state_n = rec->shard_n,
        .master = bf16_master ? (uint16_t *)l2l_tensor_data(rec->master) + rec->shard_begin + begin
                              : NULL};
    eps_compact_chunk(eps->optim, &chunk, &compact, begin);
  }
}

/* Host bytes an element of a wave of rec's update moves beside its gradient (bench/optim's
   counts): the master read, and written by the last wave (the one that moves the
   weights); each state array read, and written by the first. */
static uint64_t wave_elem_bytes(const struct eps *eps, const struct eps_record *rec, int wave) {
  uint64_t master = l2l_tensor_dtype(rec->master) == L2L_BF16 ? 2 : 4;
  uint64_t state = (uint64_t)state_elem_bytes(eps->optimizer.state) *
                   (uint64_t)optim_state_count(&eps->optimizer);
  return master * (wave == eps->optim->waves - 1 ? 2 : 1) + state * (wave == 0 ? 2 : 1);
}

/* The staging copy's elements [begin, begin + n) from the master's, rounded to the device
   precision. */
static void stage_range(const struct eps *eps, struct eps_record *rec, int64_t begin, int64_t n) {
  const float *p = (const float *)l2l_tensor_data(rec->master) + begin;
  uint16_t *h = (uint16_t *)l2l_tensor_data(rec->staging) + begin;
  if (eps->precision == L2L_BF16)
    for (int64_t i = 0; i < n; i++) h[i] = half_from_f32_bf16(p[i]);
  else
    for (int64_t i = 0; i < n; i++) h[i] = half_from_f32_f16(p[i]);
}

/* Whether rec's update writes its staging copy as it moves the master (one process, an f32
   master on the host that the API never handed out: nothing else writes it). */
static bool stages_in_update(const struct eps *eps, const struct eps_record *rec) {
  return rec->staging != NULL && eps->dist == NULL && rec->placement != EPS_PLACE_DEVICE &&
         l2l_tensor_dtype(rec->master) == L2L_F32 && !tensor_handed_out(rec->master);
}

static void chunk_run(struct core_job *job, int thread) {
  struct chunk_job *cj = (struct chunk_job *)job;
  struct eps *eps = cj->eps;
  struct eps_record *rec = cj->rec;
  double t0 = core_now();
  int64_t n = cj->end - cj->begin;
  if (cj->wave == STAGE_WAVE) {
    stage_chunk(eps, rec, cj->begin, n, thread, t0);
    return;
  }
  /* On one process the update reads the accumulator; with ranks, the shard's reduced
     gradient (the accumulator was cleared once it went out). */
  float *g = (float *)l2l_tensor_data(rec->shard_grad ? rec->shard_grad : rec->grad) + cj->begin;
  double sums[2] = {0, 0};
  /* A block at a time, whatever the state's precision (so a first wave's sums, LAMB's
     norms, add in the same order either way). Gradients held beside the accumulator are
     read by the first wave, which reads the accumulator's chunk only if it held anything
     and clears it as it reads it. */
  bool held = rec->held_n > 0, reads_held = held && cj->wave == 0;
  bool zero = reads_held && rec->grad_zero != NULL && rec->grad_zero[cj->begin / CHUNK];
  bool last_wave = cj->wave == eps->optim->waves - 1;
  /* the last wave writes the staging copy of each block it moved, still in cache, where
     nothing but the updates writes the master (stages: see eps_stage) */
  bool stages = last_wave && stages_in_update(eps, rec);
  float block[L2L_STATE_BLOCK];   /* the held path's gradient block */
  for (int64_t at = 0; at < n || at == 0; at += L2L_STATE_BLOCK) {
    int64_t k = n - at < L2L_STATE_BLOCK ? n - at : L2L_STATE_BLOCK;
    const float *gk = g + at;
    if (reads_held) {
      eps_held_block(block, rec, zero ? NULL : g + at, cj->begin + at, k);
      if (!zero) memset(g + at, 0, (size_t)k * sizeof *g);
      gk = block;
    }
    update_range(eps, rec, cj->begin + at, k, gk, cj->wave, sums);
    if (stages) stage_range(eps, rec, cj->begin + at, k);
  }
  /* the next minibatch starts at 0: when the accumulators pass, the accumulator's pages
     are given back once the whole update has read it (eps_grad_clear) */
  bool give = rec->grad_give;
  bool clears = last_wave && !give && !held;
  if (clears) memset(g, 0, (size_t)n * sizeof *g);
  /* the gradient: the first wave reads it (held: those, and the accumulator's chunk read
     and cleared unless found zero); the accumulator cleared after the last */
  uint64_t grad = cj->wave != 0 ? 0 : !reads_held ? 4 : eps_held_elem_bytes(rec) + (zero ? 0 : 8);
  eps_count_bytes(eps, (uint64_t)n * (wave_elem_bytes(eps, rec, cj->wave) + grad + (clears ? 4 : 0) +
                                       (stages ? sizeof(uint16_t) : 0)));
  timeline_add(eps->timeline, rec->last_layer, -1, L2L_PHASE_UPDATE, thread, t0, core_now());

  pthread_mutex_lock(&eps->lock);
  if (!last_wave) {   /* the last wave reads the sums: nothing writes them then */
    rec->chunk_sums[cj->begin / CHUNK][0] = sums[0];
    rec->chunk_sums[cj->begin / CHUNK][1] = sums[1];
  }
  bool wave_done = --rec->chunks_left == 0;
  for (int c = 0; wave_done && !last_wave && c < optim_chunks(rec->shard_n); c++) {
    rec->wave_sums[0] += rec->chunk_sums[c][0];
    rec->wave_sums[1] += rec->chunk_sums[c][1];
  }
  bool room = wave_done && last_wave && rec->room;   /* given back once the record settles */
  if (wave_done && last_wave && eps->spill) {
    /* the state back to disk and the accumulator cleared while the record is still
       pending: its next arrival, update or checkpoint cannot start before (every other
       chunk of it is done) */
    bool out = !rec->keep_state;
    pthread_mutex_unlock(&eps->lock);
    l2l_status status = out ? eps_state_out(eps, rec) : L2L_OK;
    if (status != L2L_OK) eps_io_failed(eps, status);   /* kept in memory: nothing lost */
    if (rec->shard_grad == NULL) eps_grad_clear(eps, rec, !give);
    pthread_mutex_lock(&eps->lock);
  }
  bool stage = wave_done && last_wave && rec->stage_after;
  bool exchange = eps->dist != NULL;
  if (wave_done && last_wave) {
    eps_held_free(rec);   /* (every chunk has read them) */
    rec->updates++;
    /* on one process every chunk of the accumulator is zero now: cleared as it was read,
       found zero, or given back (with ranks the exchange clears it: not known here) */
    rec->grad_known_zero = !exchange;
    rec->staging_written = stages_in_update(eps, rec);
    if (!exchange) {
      rec->stage_after = false;
      rec->pending = stage;   /* still pending while its staging copy is rewritten */
      pthread_cond_broadcast(&eps->changed);
    }
  }
  pthread_mutex_unlock(&eps->lock);
  if (wave_done && last_wave && exchange) {
    eps_exchange_post(eps, rec, EPS_ALL_GATHER, gathered);   /* the all-gather settles it */
  } else if (wave_done && !last_wave) {
    if (exchange) eps_exchange_post(eps, rec, EPS_LAMB_SUMS, lamb_summed);
    else queue_wave(eps, rec, cj->wave + 1);
  }
  if (stage && !exchange) queue_wave(eps, rec, STAGE_WAVE);
  if (room) waiting_begin(eps, eps_room_return(eps, rec));
}


/* One chunk of a staging rewrite. */
static void stage_chunk(struct eps *eps, struct eps_record *rec, int64_t begin, int64_t n,
                        int thread, double t0) {
  stage_range(eps, rec, begin, n);
  eps_count_bytes(eps, (uint64_t)n * (sizeof(float) + sizeof(uint16_t)));
  timeline_add(eps->timeline, rec->last_layer, -1, L2L_PHASE_UPDATE, thread, t0, core_now());
  pthread_mutex_lock(&eps->lock);
  if (--rec->chunks_left == 0) {
    rec->pending = false;
    rec->stage_after = false;   /* a second request while this ran: nothing changed since */
    /* current until its master changes, where only its updates (which write it too) can
       change it: a frozen record's is written once */
    rec->staging_written = stages_in_update(eps, rec);
    pthread_cond_broadcast(&eps->changed);
  }
  pthread_mutex_unlock(&eps->lock);
}

void eps_note_writes(struct eps *eps, struct eps_record *rec, uint64_t writes) {
  if (writes == rec->writes_seen) return;   /* (only the relay's thread sets it) */
  pthread_mutex_lock(&eps->lock);
  rec->writes_seen = writes;
  rec->staging_written = false;
  eps->guards_current = false;
  pthread_mutex_unlock(&eps->lock);
}

void eps_stage(struct eps *eps) {
  eps_io_failed(eps, eps_device_stage(eps));   /* those on the device, in its order */
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (rec->staging == NULL || rec->placement == EPS_PLACE_DEVICE) continue;
    pthread_mutex_lock(&eps->lock);
    /* written by its last update, from a master nothing else can have written since:
       current (an update still running writes it as it goes, and the visit waits for it) */
    bool current = rec->staging_written && !tensor_handed_out(rec->master);
    if (current) {
      pthread_mutex_unlock(&eps->lock);
      continue;
    }
    bool now = !rec->pending;
    if (now) rec->pending = true;
    else rec->stage_after = true;   /* its update's last chunk queues the rewrite */
    pthread_mutex_unlock(&eps->lock);
    if (now) queue_wave(eps, rec, STAGE_WAVE);
  }
}

/* ---------------------------------------------------------------- with ranks: the exchange

   Each collective of a record is posted by exchange.c (its stream, its place, what it
   sends) with the completion below, which the communication thread calls when it ends. */

/* rec's all-gather has ended (updated or skipped): no longer pending, its staging copy
   rewritten first when one was asked for. */
static void gathered(struct dist_op *op) {
  struct eps_record *rec = op->ctx;
  struct eps *eps = rec->eps;
  pthread_mutex_lock(&eps->lock);
  bool stage = rec->stage_after;
  rec->stage_after = false;
  rec->pending = stage;
  pthread_cond_broadcast(&eps->changed);
  pthread_mutex_unlock(&eps->lock);
  if (stage) queue_wave(eps, rec, STAGE_WAVE);
}

/* A two-wave update's sums, summed over ranks: its second wave. */
static void lamb_summed(struct dist_op *op) {
  struct eps_record *rec = op->ctx;
  rec->wave_sums[0] = rec->lamb[0];
  rec->wave_sums[1] = rec->lamb[1];
  queue_wave(rec->eps, rec, 1);
}

/* A skipped record's place on the stream of LAMB's sums passed: its all-gather's next. */
static void lamb_passed(struct dist_op *op) {
  struct eps_record *rec = op->ctx;
  eps_exchange_pass(rec->eps, rec, EPS_ALL_GATHER, gathered);
}

void eps_update_skipped(struct eps *eps, struct eps_record *rec) {
  if (rec->placement == EPS_PLACE_DEVICE) {   /* (not updated at the step's end) */
    pthread_mutex_lock(&eps->lock);
    rec->nonfinite = true;
    pthread_mutex_unlock(&eps->lock);
  }
  eps_exchange_skipped(eps, rec);
  if (eps->spill) waiting_begin(eps, eps_turn_pass(eps, rec));   /* (its update takes no room) */
  /* the all-gather's place passes last: its completion settles the record, after which
     the record may be freed, so no other operation of it may still be posted */
  if (eps->optim->waves > 1) eps_exchange_pass(eps, rec, EPS_LAMB_SUMS, lamb_passed);
  else eps_exchange_pass(eps, rec, EPS_ALL_GATHER, gathered);
}

/* A record on the device: its reduced gradient all-gathered (its place on the stream of
   LAMB's sums passed first, where it has one: its device sums the whole record). */
static void gradient_gather(struct dist_op *op) {
  struct eps_record *rec = op->ctx;
  eps_exchange_post(rec->eps, rec, EPS_ALL_GATHER, gathered);
}

static void device_gather(struct eps *eps, struct eps_record *rec) {
  if (eps->optim->waves > 1) eps_exchange_pass(eps, rec, EPS_LAMB_SUMS, gradient_gather);
  else eps_exchange_post(eps, rec, EPS_ALL_GATHER, gathered);
}

/* The record's norm and finiteness, summed over ranks: an eager update starts, or the
   record is skipped on every rank alike; a deferred one waits for the relay. */
static void norm_agreed(struct dist_op *op) {
  struct eps_record *rec = op->ctx;
  struct eps *eps = rec->eps;
  bool nonfinite = rec->flags[1] > 0;
  pthread_mutex_lock(&eps->lock);
  bool defer = eps->defer;
  rec->sumsq = rec->flags[0];
  /* (deferred updates: a bound of the largest; a sum past f32's range is past the limit) */
  rec->grad_most = rec->flags[2] < FLT_MAX ? (float)rec->flags[2] : INFINITY;
  rec->agreed = true;
  if (nonfinite && !defer && eps->nonfinite_skips++ == 0) {
    eps->nonfinite_name = rec->name;
    eps->nonfinite_layer = rec->last_layer;
  }
  pthread_cond_broadcast(&eps->changed);
  pthread_mutex_unlock(&eps->lock);
  if (defer) return;
  if (nonfinite) eps_update_skipped(eps, rec);
  else eps_start_update(eps, rec, 1.0f);
}

/* The accumulator went out whole, reduce-scattered: the next minibatch starts from zero,
   and the shard's norm goes round. */
static void reduced(struct dist_op *op) {
  struct eps_record *rec = op->ctx;
  /* (on the device it was cleared as it went out, on the compute thread: eps_device_send) */
  if (rec->placement != EPS_PLACE_DEVICE) eps_grad_clear(rec->eps, rec, false);
  eps_exchange_post(rec->eps, rec, EPS_NORM, norm_agreed);
}

void eps_update_exchange(struct eps *eps, struct eps_record *rec) {
  eps_exchange_post(eps, rec, EPS_REDUCE_SCATTER, reduced);
}

void eps_exchanged_updates(struct eps *eps) {
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (!rec->exchanged) continue;
    pthread_mutex_lock(&eps->lock);   /* (until its all-gather, or its skip's, has ended) */
    while (rec->pending) pthread_cond_wait(&eps->changed, &eps->lock);
    bool skipped = rec->nonfinite;
    rec->nonfinite = false;
    pthread_mutex_unlock(&eps->lock);
    rec->exchanged = false;
    if (skipped) continue;
    l2l_status taken = eps_device_take(rec);
    eps_io_failed(eps, taken);
    if (taken != L2L_OK) continue;   /* (not updated: the step after reports it) */
    rec->hyper = eps_update_hyper(eps, rec, rec->exchange_scale);
    eps_io_failed(eps, eps_device_update(rec, &rec->hyper, false));   /* (the ranks decided) */
  }
}
