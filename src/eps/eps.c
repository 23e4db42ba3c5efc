/* SPDX-License-Identifier: MIT */
/* eps.c — the eager parameter server's core (see eps.h): records, arrivals and the step.
 *
 * Purpose: the records (joining and leaving between steps as the relay's list says), a
 * step's bookkeeping (what each record expects, its arrivals counted, deferred updates
 * released, the outcome), and the gradient arrivals: each one split into chunk jobs on
 * the worker queue that add into the accumulator (all the workers on a large record); the
 * arrival that completes a record starts its update (update.c, the core's update queue)
 * or, with ranks, its exchange.
 * Must never: update a record before all its gradients for the minibatch have arrived,
 * or change anything of a record that the step does not update.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* ---------------------------------------------------------------- records */

l2l_status eps_init(struct eps *eps, const struct eps_settings *settings) {
  memset(eps, 0, sizeof *eps);
  eps->optimizer = *settings->optimizer;
  eps->seed = settings->seed;
  eps->optim = optimizer_ops(eps->optimizer.kind);
  eps->precision = settings->precision;
  eps->timeline = settings->timeline;
  eps->host_budget = settings->host_budget;
  eps->add_arrivals = settings->add_arrivals;
  eps->pinned_masters = settings->pinned_masters;
  pthread_mutex_init(&eps->lock, NULL);
  pthread_cond_init(&eps->changed, NULL);
  l2l_status status = queue_start(&eps->workers, settings->threads, 3, "optimizer");
  if (status != L2L_OK) {
    pthread_mutex_destroy(&eps->lock);
    pthread_cond_destroy(&eps->changed);
    return status;
  }
  if (settings->dist_lane >= 0) status = eps_dist_start(eps, settings->dist_lane);
  if (status == L2L_OK && settings->spill_dir != NULL)
    status = eps_spill_state(eps, settings->spill_dir);
  if (status != L2L_OK) eps_free(eps);
  return status;
}

static void record_free(struct eps_record *rec) {
  if (rec->eps->gathered_last == rec) rec->eps->gathered_last = NULL;
  struct eps_spill *spill = rec->eps->spill;
  for (int a = 0; spill && rec->spill_reserved && a < optim_state_count(&rec->eps->optimizer); a++)
    eps_spill_release(spill, rec->spill_at[a], eps_array_bytes(rec));
  if (spill) eps_ahead_drop(rec->eps, rec);
  eps_held_free(rec);
  free(rec->grad_zero);
  free(rec->chunk_norms);
  free(rec->chunk_sums);
  l2l_tensor_free(rec->staging);
  l2l_tensor_free(rec->guard_copy);
  l2l_tensor_free(rec->shard_grad);
  l2l_tensor_free(rec->exchange);
  l2l_tensor_free(rec->gathered[0]);
  l2l_tensor_free(rec->gathered[1]);
  free(rec->counts);
  free(rec->displs);
  l2l_tensor_free(rec->state[0]);
  l2l_tensor_free(rec->state[1]);
  free(rec);
}

void eps_free(struct eps *eps) {
  if (eps->dist) eps_sync(eps);   /* no exchange may still name a record */
  queue_stop(&eps->workers);
  eps_dist_free(eps);
  struct eps_spill *spill = eps->spill;
  if (spill) {
    eps_ahead_drop_all(eps);   /* before the I/O threads stop */
    eps_spill_close(spill);
  }
  eps->spill = NULL;   /* closed: the records' regions go with the file */
  for (int i = 0; i < eps->count; i++) record_free(eps->records[i]);
  l2l_tensor_free(eps->device_flags), l2l_tensor_free(eps->device_norms);
  l2l_tensor_free(eps->device_clip);
  l2l_tensor_free(eps->flags_back);
  free(spill);
  free(eps->records);
  free(eps->ahead);
  free(eps->waiting);
  free(eps->turn_passed);
  pthread_mutex_destroy(&eps->lock);
  pthread_cond_destroy(&eps->changed);
}

struct eps_record *eps_find(const struct eps *eps, const l2l_param *param) {
  for (int i = 0; i < eps->count; i++)
    if (eps->records[i]->param == param) return eps->records[i];
  return NULL;
}

/* A new record of a source, with no optimizer state (a failure frees what it made). */
static l2l_status record_new(struct eps *eps, const struct eps_record_source *source,
                             struct eps_record **out) {
  struct eps_record *rec = calloc(1, sizeof *rec);
  if (rec == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for an EPS record");
  rec->param = source->param;
  rec->name = source->name;
  rec->decays = source->decays;
  rec->eps = eps;
  rec->master = source->master;
  rec->grad = source->grad;
  rec->shard_n = l2l_tensor_numel(rec->master);   /* one process: all of it */
  rec->stream = source->stream;
  rec->placement = source->device ? EPS_PLACE_DEVICE : EPS_PLACE_HOST;
  rec->word = -1;
  l2l_status status = eps->dist ? eps_shard(eps, rec) : L2L_OK;
  /* the staging copy the source names (none for a bf16 master: it is what the device
     reads); on the device, the 16-bit copy the device reads there */
  l2l_pool_kind staging_pool = source->device ? L2L_POOL_DEVICE : L2L_POOL_PINNED;
  if (status == L2L_OK && source->staging != L2L_F32)
    status = tensor_new_like(&rec->staging, staging_pool, source->staging, rec->master);
  if (status == L2L_OK && source->device) status = eps_device_join(rec);
  if (status != L2L_OK) {
    record_free(rec);
    return status;
  }
  *out = rec;
  return L2L_OK;
}

static int by_param(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)(*(struct eps_record *const *)a)->param;
  uintptr_t y = (uintptr_t)(*(struct eps_record *const *)b)->param;
  return (x > y) - (x < y);
}

/* The record of param among n sorted by param, or NULL. */
static struct eps_record *sorted_find(struct eps_record **sorted, int n, const l2l_param *param) {
  struct eps_record key = {.param = (l2l_param *)param}, *k = &key;
  struct eps_record **at = n > 0 ? bsearch(&k, sorted, (size_t)n, sizeof *sorted, by_param) : NULL;
  return at ? *at : NULL;
}

l2l_status eps_set_records(struct eps *eps, const struct eps_record_source *sources,
                           int n, int *failed) {
  *failed = -1;
  if (n < 0 || (n > 0 && sources == NULL))
    return FAIL(L2L_ERR_INVALID, "sources must list n >= 0 records, got %d", n);
  /* Every allocation first, so that a failure leaves the records as they were. */
  struct eps_record **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
  struct eps_record **sorted = malloc((size_t)(eps->count > 0 ? eps->count : 1) * sizeof *sorted);
  struct eps_record **named = malloc((size_t)(n > 0 ? n : 1) * sizeof *named);
  struct eps_record *keys = calloc((size_t)(n > 0 ? n : 1), sizeof *keys);
  l2l_status status = L2L_OK;
  if (list == NULL || sorted == NULL || named == NULL || keys == NULL)
    status = FAIL(L2L_ERR_NOMEM, "no memory for a list of %d records", n);
  for (int i = 0; status == L2L_OK && i < n; i++) {   /* each record once, by someone */
    keys[i].param = sources[i].param;
    keys[i].name = sources[i].name;
    named[i] = &keys[i];
    if (sources[i].param == NULL || sources[i].users < 1)
      status = FAIL(L2L_ERR_INVALID, "sources[%d] has no param or no user", i);
  }
  if (status == L2L_OK) {
    qsort(named, (size_t)n, sizeof *named, by_param);
    for (int i = 1; status == L2L_OK && i < n; i++)
      if (named[i]->param == named[i - 1]->param)
        status = FAIL(L2L_ERR_INVALID, "parameter '%s' is listed twice (a record is listed once)",
                      named[i]->name);
  }
  if (status == L2L_OK && eps->count > 0) {   /* (a new EPS has no list yet) */
    memcpy(sorted, eps->records, (size_t)eps->count * sizeof *sorted);
    qsort(sorted, (size_t)eps->count, sizeof *sorted, by_param);
  }
  int made = 0;
  for (int i = 0; status == L2L_OK && i < n; i++) {
    list[i] = sorted_find(sorted, eps->count, sources[i].param);
    if (list[i] != NULL) continue;
    status = record_new(eps, &sources[i], &list[i]);
    if (status != L2L_OK) *failed = i;
    else made++;
  }
  free(named);
  free(keys);
  if (status != L2L_OK) {
    for (int i = 0; made > 0 && i < n; i++)
      if (list[i] != NULL && sorted_find(sorted, eps->count, list[i]->param) != list[i]) {
        record_free(list[i]);
        made--;
      }
    free(list);
    free(sorted);
    return status;
  }
  /* The listing is the EPS's list from here: the records it does not name leave (their
     state freed), the others keep theirs, each with its users now. */
  for (int i = 0; i < eps->count; i++) eps->records[i]->users = 0;
  for (int i = 0; i < n; i++) list[i]->users = sources[i].users;
  for (int i = 0; i < eps->count; i++)
    if (eps->records[i]->users == 0) {
      eps->words_stale |= eps->records[i]->placement == EPS_PLACE_DEVICE;
      record_free(eps->records[i]);
    }
  free(sorted);
  free(eps->records);
  eps->records = list;
  eps->count = n;
  (void)eps_device_words(eps);   /* (else made as the next step begins) */
  return L2L_OK;
}

const l2l_tensor *eps_device_source(const struct eps_record *rec) {
  return rec->staging ? rec->staging : rec->master;
}
bool eps_on_device(const struct eps_record *rec) { return rec->placement == EPS_PLACE_DEVICE; }
l2l_param *eps_param(const struct eps_record *rec) { return rec->param; }
int64_t eps_updates(const struct eps_record *rec) { return rec->updates; }

void eps_set_stream(struct eps_record *rec, uint64_t stream) { rec->stream = stream; }

/* ---------------------------------------------------------------- a step */

static void held_add(struct eps_record *rec);

void eps_begin_step(struct eps *eps, bool update, bool defer, double lr) {
  pthread_mutex_lock(&eps->lock);
  eps->defer = eps->deferred_step = defer;
  eps->lr = lr;
  eps->nonfinite_skips = 0;
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    /* (a step that ended before its record was complete: what it held is kept as added
       gradients are; a complete record's update, which may still run, owns them) */
    if (rec->arrived < rec->expected) held_add(rec);
    rec->norms_valid = false;
    rec->expected = rec->arrived = rec->given = rec->holds = 0;
    rec->update_due = update;
    rec->sumsq = 0;
    rec->first_expect = -1;
    rec->agreed = false;
  }
  eps_gathered_free(eps);   /* a checkpoint's gathered state is stale from here */
  eps->expects = 0;
  pthread_mutex_unlock(&eps->lock);
}

void eps_expect(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  if (rec->expected++ == 0) rec->first_expect = eps->expects;
  eps->expects++;
  pthread_mutex_unlock(&eps->lock);
}

void eps_hold(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  if (rec->expected > 0) rec->expected++, rec->holds++;
  pthread_mutex_unlock(&eps->lock);
}

l2l_status eps_prepare(struct eps *eps) {
  TRY(eps_host_plan(eps));
  TRY(eps_device_words(eps));
  int arrays = optim_state_count(&eps->optimizer);
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (!rec->update_due || rec->expected == 0) continue;
    /* with a spill file the state comes to memory for its update alone (eps_start_update);
       one on the device has its own there */
    bool device = rec->placement == EPS_PLACE_DEVICE;
    for (int a = 0; (!eps->spill || device) && a < arrays; a++) {
      if (rec->state[a] != NULL) continue;
      if (device) {   /* (a restore of no updates freed it) */
        TRY(eps_device_state(rec));
        continue;
      }
      TRY(eps_state_new(&rec->state[a], rec, L2L_POOL_HOST));
      TRY(l2l_tensor_fill(rec->state[a], 0.0));
    }
    if (eps->optim->waves > 1 && rec->chunk_sums == NULL) {
      rec->chunk_sums = calloc((size_t)optim_chunks(rec->shard_n), sizeof *rec->chunk_sums);
      if (rec->chunk_sums == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for %s's sums", rec->name);
    }
    if (eps->dist) TRY(eps_exchange_buffers(eps, rec));
  }
  return L2L_OK;
}

void eps_order_exchanges(struct eps *eps) {
  if (eps->dist) eps_exchange_order(eps);
}



/* One gradient arrival given to the EPS: its adds run as chunk jobs of CHUNK elements on
   all the workers (a token table's gradient is never one thread's), and the last chunk to
   finish counts it. A record's arrivals add one after the other, in the order given (its
   tied users' gradients sum in the same order every run): one given while another is
   adding waits in the record's list (rec->absorb_tail) and is queued when that one ends.

   Held arrivals. An owned gradient whose record's update follows at once (one process, no
   spill file, no deferred updates, at most EPS_HELD_MAX gradients due, none added) is
   not added: the record holds it, and its update reads it beside the accumulator a block
   at a time (update.c), so the accumulator is neither written by the add nor cleared
   after, and the gradient is read once more instead: 2 + 4 bytes a parameter for a bf16
   one instead of 2 + 8 + 4 + 4. The last of them is checked before the update begins, by
   chunk jobs (`check`) that read the accumulator and the held gradients as the update
   will: an inf, a NaN or EPS_GRAD_LIMIT in any partial sum skips the record as an add's
   would, and each accumulator chunk found all zero is not read again. The sums are the
   adds' own arithmetic in the order given, so the update's bits are those of the same
   gradients added (test_arrivals.c). */
struct arrival {
  struct eps *eps;
  struct eps_record *rec;
  l2l_tensor *incoming;        /* NULL for a check */
  bool check;                  /* the held gradients checked, not an add */
  bool known_zero;             /* (a check) the accumulator taken as zero, not read */
  bool norms;                  /* each chunk's norm found as it is added (deferred updates) */
  float scale;
  int layer;
  atomic_int chunks_left;
  atomic_bool nonfinite;
  struct arrival *next;        /* the record's next arrival, given meanwhile (under the lock) */
};

struct absorb_chunk {
  struct core_job job;
  struct arrival *arrival;
  int64_t begin, end;
};

static void counted(struct eps *eps, struct eps_record *rec, bool finite, int layer);

/* Adds scale * incoming[begin, end) (f32, or a 16-bit gradient widened) into rec's
   accumulator (drain: and zeroes an f32 incoming in the same pass); returns whether every
   sum is finite and below EPS_GRAD_LIMIT. */
static bool absorb_range(struct eps_record *rec, l2l_tensor *incoming, bool drain, float scale,
                         int64_t begin, int64_t end) {
  float *g = (float *)l2l_tensor_data(rec->grad) + begin;
  l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(incoming);
  int64_t n = end - begin;
  /* the incoming read (and zeroed when drained), the accumulator read and written */
  uint64_t in = l2l_dtype_size(dtype) * (drain && dtype == L2L_F32 ? 2 : 1);
  eps_count_bytes(rec->eps, (uint64_t)n * (in + 8));
  if (dtype != L2L_F32)
    return optim_axpy_half(g, (const uint16_t *)l2l_tensor_data(incoming) + begin, dtype, scale, n);
  if (drain) return optim_axpy_drain(g, (float *)l2l_tensor_data(incoming) + begin, scale, n);
  return optim_axpy(g, (const float *)l2l_tensor_data(incoming) + begin, scale, n);
}

/* Whether rec's adds find each chunk's norm as they write it (deferred updates: the norm
   is wanted once the gradient is complete, and a chunk just written is still in cache), its
   list made the first time (no memory: the norm is found at the end, as it was). Under
   the lock. */
static bool adds_norms(const struct eps *eps, struct eps_record *rec) {
  if (!eps->defer || eps->dist) return false;   /* (with ranks the shard's is found) */
  if (rec->chunk_norms == NULL)
    rec->chunk_norms = calloc((size_t)optim_chunks(l2l_tensor_numel(rec->grad)), sizeof *rec->chunk_norms);
  return rec->chunk_norms != NULL;
}

/* rec's chunks' norms, found by the add on the calling thread just done, are its gradient's. */
static void norms_found(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  rec->norms_valid = true;
  pthread_mutex_unlock(&eps->lock);
}

/* The norm of the accumulator's chunk from begin, just written by an add. */
static void chunk_norm(struct eps_record *rec, int64_t begin, int64_t end) {
  struct eps_norm *norm = &rec->chunk_norms[begin / CHUNK];
  *norm = (struct eps_norm){0, 0};
  optim_norm_blocks(&norm->sumsq, &norm->most, (const float *)l2l_tensor_data(rec->grad) + begin,
                    end - begin);
}

/* Whether the whole of an arrival adds to a finite sum, added on the calling thread (with
   its chunks' norms when `norms`). */
static bool absorb_whole(struct eps_record *rec, l2l_tensor *incoming, bool drain, float scale,
                         bool norms) {
  int64_t n = l2l_tensor_numel(rec->grad);
  bool finite = true;
  for (int64_t begin = 0; begin < n; begin += CHUNK) {
    int64_t end = optim_chunk_end(n, begin);
    finite &= absorb_range(rec, incoming, drain, scale, begin, end);
    if (norms) chunk_norm(rec, begin, end);
  }
  return finite;
}

/* An arrival's work on [begin, end): its add (and the chunk's norm), or the held
   gradients' check. */
static bool arrival_range(struct arrival *a, int64_t begin, int64_t end) {
  if (a->check) return eps_held_check(a->rec, begin, end, a->known_zero);
  bool finite = absorb_range(a->rec, a->incoming, false, a->scale, begin, end);
  if (a->norms) chunk_norm(a->rec, begin, end);
  return finite;
}

/* Whether every partial sum of the whole arrival is finite, its work done on the calling
   thread (with no memory for its chunk jobs). */
static bool arrival_whole(struct arrival *a) {
  int64_t n = l2l_tensor_numel(a->rec->grad);
  bool finite = true;
  for (int64_t begin = 0; begin < n; begin += CHUNK)
    finite &= arrival_range(a, begin, optim_chunk_end(n, begin));
  return finite;
}

static void arrival_queue(struct arrival *a);

/* An arrival's adds are done: counted, freed, and the record's next arrival queued. */
static void arrival_done(struct arrival *a, bool finite) {
  struct eps *eps = a->eps;
  struct eps_record *rec = a->rec;
  pthread_mutex_lock(&eps->lock);
  struct arrival *next = a->next;
  if (rec->absorb_tail == a) rec->absorb_tail = NULL;
  if (a->norms) rec->norms_valid = true;   /* (every chunk's, of the sum as it now is) */
  pthread_mutex_unlock(&eps->lock);
  counted(eps, rec, finite, a->layer);
  l2l_tensor_free(a->incoming);
  free(a);
  if (next) arrival_queue(next);
}

static void absorb_chunk_release(struct core_job *job) { free(job); }

static void absorb_chunk_run(struct core_job *job, int thread) {
  (void)thread;
  struct absorb_chunk *ac = (struct absorb_chunk *)job;
  struct arrival *a = ac->arrival;
  if (!arrival_range(a, ac->begin, ac->end)) atomic_store(&a->nonfinite, true);
  if (atomic_fetch_sub(&a->chunks_left, 1) == 1) arrival_done(a, !atomic_load(&a->nonfinite));
}

/* The arrival's chunk jobs on the workers (with no memory for them: added here). */
static void arrival_queue(struct arrival *a) {
  int64_t n = l2l_tensor_numel(a->rec->grad);
  int chunks = optim_chunks(n);
  struct absorb_chunk **jobs = calloc((size_t)chunks, sizeof *jobs);
  bool made = jobs != NULL;
  for (int c = 0; made && c < chunks; c++) made = (jobs[c] = calloc(1, sizeof **jobs)) != NULL;
  if (!made) {   /* add (or check) it here rather than lose it */
    for (int c = 0; jobs && c < chunks; c++) free(jobs[c]);
    free(jobs);
    arrival_done(a, arrival_whole(a));
    return;
  }
  atomic_init(&a->chunks_left, chunks);
  atomic_init(&a->nonfinite, false);
  for (int c = 0; c < chunks; c++) {
    int64_t begin = (int64_t)c * CHUNK;
    *jobs[c] = (struct absorb_chunk){.arrival = a, .begin = begin,
                                     .end = optim_chunk_end(n, begin)};
    jobs[c]->job.run = absorb_chunk_run;
    jobs[c]->job.free_when_done = true;
    jobs[c]->job.release = absorb_chunk_release;
  }
  for (int c = 0; c < chunks; c++) queue_push(&a->eps->workers, &jobs[c]->job);
  free(jobs);
}

/* One arrival counted (a gradient added, or a hold released); the one that completes the
   record starts its update (or leaves its norm for global clipping). */
static void counted(struct eps *eps, struct eps_record *rec, bool finite, int layer) {
  /* Counted under the lock right after this arrival's add, so the one arrival that
     completes the record is the last to have added (two users' gradients may arrive at
     once). */
  pthread_mutex_lock(&eps->lock);
  if (!finite) rec->nonfinite = true;
  bool complete = ++rec->arrived == rec->expected && rec->update_due;
  if (complete) rec->last_layer = layer;
  bool defer = eps->defer, exchange = complete && eps->dist != NULL;
  if (exchange) {   /* with ranks, the sum over ranks decides (exchange.c) */
    rec->nonfinite = false;
    rec->pending = true;
  }
  /* An eager update of a non-finite gradient would write inf or NaN into the master and
     the optimizer state for good: skipped, and the accumulator cleared for the next. */
  bool skip = complete && !exchange && !defer && rec->nonfinite;
  if (skip) {
    if (eps->nonfinite_skips++ == 0) {
      eps->nonfinite_name = rec->name;
      eps->nonfinite_layer = layer;
    }
    rec->nonfinite = false;
  }
  pthread_mutex_unlock(&eps->lock);
  struct eps_norm norm = {0, 0};
  bool device = rec->placement == EPS_PLACE_DEVICE;   /* (its norm read at the release) */
  if (complete && defer && !exchange && device) {
    eps_io_failed(eps, eps_device_norm(rec));
  } else if (complete && defer && !exchange) {
    norm = eps_grad_norm(rec);
  }
  if (exchange && device) {   /* (out to pinned memory first, on the compute thread) */
    eps_io_failed(eps, eps_device_send(rec));
    rec->exchanged = true;
  }
  if (exchange) eps_update_exchange(eps, rec);
  else if (skip) eps_grad_clear(eps, rec, false);
  else if (complete && !defer) eps_start_update(eps, rec, 1.0f);
  /* Counted out last: whoever waits for arrivals then finds the record's norm (or its
     update queued) in place. */
  pthread_mutex_lock(&eps->lock);
  if (complete && !exchange && !device) rec->sumsq = norm.sumsq, rec->grad_most = norm.most;   /* (an
                                                     exchange sets them when agreed) */
  eps->arrivals_in_flight--;
  pthread_cond_broadcast(&eps->changed);
  pthread_mutex_unlock(&eps->lock);
}

/* A gradient reaches rec's accumulator (whose pages come back as it is written): a
   passing one waits first for room among the passing accumulators in memory. It waits
   only for updates already under way: each passing accumulator in memory has had its one
   arrival, so its update runs and clears it without another (called on the relay's
   threads, never a worker's). */
static void grad_arrives(struct eps *eps, struct eps_record *rec) {
  if (eps->spill == NULL) return;
  uint64_t bytes = eps_record_bytes(eps, rec).grad;
  pthread_mutex_lock(&eps->lock);
  if (rec->grad_passing && !rec->grad_counted) {
    bool waited = false;
    while (eps->grad_bytes > 0 && eps->grad_bytes + bytes > eps->grad_limit) {
      waited = true;
      pthread_cond_wait(&eps->changed, &eps->lock);
    }
    eps->grad_waits += waited;
    eps->grad_bytes += bytes;
    rec->grad_counted = true;
  }
  rec->grad_away = false;
  pthread_mutex_unlock(&eps->lock);
}

/* Until no arrival of rec is adding (a whole add on the caller's thread comes after). */
static void eps_wait_absorbs(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  while (rec->absorb_tail != NULL) pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
}

static void arrival_begins(struct eps *eps) {
  pthread_mutex_lock(&eps->lock);
  eps->arrivals_in_flight++;
  pthread_mutex_unlock(&eps->lock);
}

/* Whether rec's next owned arrival is held (see "Held arrivals" above): every one before
   it this step was, and its update follows the last at once. Under the lock. */
static bool holds_arrival(const struct eps *eps, const struct eps_record *rec) {
  return !eps->add_arrivals && eps->dist == NULL && eps->spill == NULL && !eps->defer &&
         rec->update_due && rec->holds == 0 && rec->expected <= EPS_HELD_MAX &&
         rec->held_n == rec->given && rec->held_n < EPS_HELD_MAX;
}

/* rec's held gradients added into its accumulator, as they would have been on arrival
   (as a step begins: the last one ended before the record was complete). */
static void held_add(struct eps_record *rec) {
  if (rec->held_n > 0) rec->grad_known_zero = false;
  for (int k = 0; k < rec->held_n; k++)
    if (!absorb_whole(rec, rec->held[k].grad, false, rec->held[k].scale, false))
      rec->nonfinite = true;
  eps_held_free(rec);
}

/* The last held gradient of rec arrived: the check's chunk jobs (the accumulator's chunks
   found zero noted in rec->grad_zero: none if there is no memory for the list). */
static void held_check(struct eps *eps, struct eps_record *rec, int layer) {
  pthread_mutex_lock(&eps->lock);
  eps->held_checks++;
  bool known_zero = rec->grad_known_zero && !tensor_handed_out(rec->grad);
  eps->known_zero_checks += known_zero;
  pthread_mutex_unlock(&eps->lock);
  size_t chunks = (size_t)optim_chunks(l2l_tensor_numel(rec->grad));
  if (rec->grad_zero == NULL) rec->grad_zero = calloc(chunks, 1);
  else memset(rec->grad_zero, 0, chunks);
  struct arrival check = {.eps = eps, .rec = rec, .check = true, .known_zero = known_zero,
                          .layer = layer};
  struct arrival *a = calloc(1, sizeof *a);
  if (a == NULL) {   /* checked here */
    counted(eps, rec, arrival_whole(&check), layer);
    return;
  }
  *a = check;
  arrival_queue(a);
}

static void eps_give(struct eps *eps, struct eps_record *rec, l2l_tensor *incoming,
                     float scale, int layer) {
  grad_arrives(eps, rec);
  arrival_begins(eps);
  pthread_mutex_lock(&eps->lock);
  bool hold = holds_arrival(eps, rec), last = false, norms = !hold && adds_norms(eps, rec);
  rec->given++;
  if (!hold) rec->grad_known_zero = false;   /* (added into it from here) */
  if (hold) {
    rec->held[rec->held_n++] = (struct eps_held){.grad = incoming, .scale = scale};
    last = rec->held_n == rec->expected;
  }
  pthread_mutex_unlock(&eps->lock);
  if (hold) {   /* counted now, or checked first when it completes the record */
    if (last) held_check(eps, rec, layer);
    else counted(eps, rec, true, layer);
    return;
  }
  struct arrival *a = calloc(1, sizeof *a);
  if (a == NULL) {   /* add it here rather than lose it (after the record's arrivals ahead) */
    eps_wait_absorbs(eps, rec);
    bool finite = absorb_whole(rec, incoming, false, scale, norms);
    if (norms) norms_found(eps, rec);
    counted(eps, rec, finite, layer);
    l2l_tensor_free(incoming);
    return;
  }
  *a = (struct arrival){.eps = eps, .rec = rec, .incoming = incoming, .scale = scale,
                        .layer = layer, .norms = norms};
  pthread_mutex_lock(&eps->lock);
  struct arrival *ahead = rec->absorb_tail;
  if (ahead) ahead->next = a;   /* queued when the one ahead ends */
  rec->absorb_tail = a;
  pthread_mutex_unlock(&eps->lock);
  if (ahead == NULL) arrival_queue(a);
}

static void eps_absorb(struct eps *eps, struct eps_record *rec, l2l_tensor *grad,
                       float scale, int layer) {
  grad_arrives(eps, rec);
  arrival_begins(eps);
  eps_wait_absorbs(eps, rec);
  pthread_mutex_lock(&eps->lock);
  bool norms = adds_norms(eps, rec);
  rec->grad_known_zero = false;
  pthread_mutex_unlock(&eps->lock);
  bool finite = absorb_whole(rec, grad, true, scale, norms);
  if (norms) norms_found(eps, rec);
  counted(eps, rec, finite, layer);
}

/* A record on the device: its add queued there now (on the compute thread, in the device's
   order), then counted; the update it may start is queued there too. */
void eps_give_device(struct eps *eps, struct eps_record *rec, const l2l_tensor *grad,
                     bool clipped, int layer) {
  arrival_begins(eps);
  eps_io_failed(eps, eps_device_add(rec, grad, clipped, !eps->deferred_step));
  counted(eps, rec, true, layer);   /* (its finiteness is the device's flag's) */
}

void eps_give_gradient(struct eps *eps, struct eps_record *rec, l2l_tensor *grad,
                       bool kept, float scale, int layer) {
  if (kept) eps_absorb(eps, rec, grad, scale, layer);
  else eps_give(eps, rec, grad, scale, layer);
}

void eps_record_written(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  rec->grad_known_zero = rec->staging_written = false;
  eps->guards_current = false;   /* (the master may be a device record's) */
  pthread_mutex_unlock(&eps->lock);
}

void eps_drop_gradient(struct eps *eps, struct eps_record *rec) {
  eps_wait_record(eps, rec);
  eps_grad_clear(eps, rec, false);
  pthread_mutex_lock(&eps->lock);
  rec->nonfinite = false;
  rec->grad_known_zero = false;   /* (a script may hold it: the next check reads it) */
  pthread_mutex_unlock(&eps->lock);
}

void eps_release(struct eps *eps, struct eps_record *rec, int layer) {
  pthread_mutex_lock(&eps->lock);
  bool held = rec->holds > 0;
  if (held) rec->holds--, eps->arrivals_in_flight++;
  pthread_mutex_unlock(&eps->lock);
  if (held) counted(eps, rec, true, layer);
}

void eps_wait_record(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  while (rec->pending) pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
}

int64_t eps_settled_updates(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  int64_t updates = rec->pending ? -1 : rec->updates;
  pthread_mutex_unlock(&eps->lock);
  return updates;
}

/* Complete this step and due for an update. */
static bool due(const struct eps_record *rec) {
  return rec->update_due && rec->expected > 0 && rec->arrived == rec->expected;
}

void eps_abandon_step(struct eps *eps) {
  eps_wait_arrivals(eps);
  /* updates queued on the device that a flag skipped are known now, their flags cleared
     (else the next step's would read them) */
  eps_io_failed(eps, eps_device_skips(eps));
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (rec->arrived > 0 && rec->arrived < rec->expected) {
      eps_grad_clear(eps, rec, false);
      rec->nonfinite = false;
    }
    rec->expected = rec->arrived = rec->given = rec->holds = 0;
    rec->update_due = false;
    rec->exchanged = false;   /* (with ranks a failed step ends the job: dist_fail) */
  }
}

bool eps_step_release(struct eps *eps, float clip, double unscale, double *norm) {
  double sumsq = 0;
  eps_wait_arrivals(eps);
  eps_io_failed(eps, eps_device_norms(eps));   /* the device's records' norms, at once */
  if (eps->dist) eps_wait_agreed(eps);   /* every record's norm summed over ranks */
  for (int i = 0; i < eps->count; i++)
    if (due(eps->records[i])) sumsq += eps->records[i]->sumsq;
  *norm = sqrt(sumsq) * unscale;
  bool finite = isfinite(*norm);
  float scale = (float)unscale;
  if (clip > 0 && *norm > clip) scale = (float)(unscale * (clip / *norm));
  pthread_mutex_lock(&eps->lock);
  eps->defer = false;
  pthread_mutex_unlock(&eps->lock);
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (!due(rec)) continue;
    /* an element the update would take at 2^63 or more (the kernels' own float product):
       this record's update is skipped as an inf's would be, the others are made */
    bool over = finite && !(scale * rec->grad_most < EPS_GRAD_LIMIT);
    pthread_mutex_lock(&eps->lock);
    if (finite) rec->nonfinite = false;   /* (the absorbs' flag is at scale 1: not used here) */
    if (over && eps->nonfinite_skips++ == 0) {
      eps->nonfinite_name = rec->name;
      eps->nonfinite_layer = rec->last_layer;
    }
    pthread_mutex_unlock(&eps->lock);
    if (finite && !over) {
      eps_start_update(eps, rec, scale);
    } else if (eps->dist) {   /* the same overflow (or record over) on every rank: nothing
                                 to send */
      rec->update_due = false;
      eps_update_skipped(eps, rec);
    } else {   /* an overflow: this minibatch's gradients are dropped, nothing updates (or
                  this record's, over the limit) */
      eps_grad_clear(eps, rec, false);
      rec->nonfinite = false;
      rec->update_due = false;
    }
  }
  return finite;
}

int eps_nonfinite_skips(struct eps *eps, const char **name, int *layer) {
  eps_wait_arrivals(eps);   /* the last arrival's add decides its record */
  if (eps->dist) eps_wait_agreed(eps);   /* with ranks, the summed gradient does */
  eps_io_failed(eps, eps_device_skips(eps));   /* records on the device: their flags */
  pthread_mutex_lock(&eps->lock);
  int skips = eps->nonfinite_skips;
  *name = eps->nonfinite_name;
  *layer = eps->nonfinite_layer;
  pthread_mutex_unlock(&eps->lock);
  return skips;
}

uint64_t eps_pass_bytes(const struct eps *eps) { return atomic_load(&eps->pass_bytes); }

void eps_wait_arrivals(struct eps *eps) {
  pthread_mutex_lock(&eps->lock);
  while (eps->arrivals_in_flight > 0) pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
}

void eps_wait_agreed(struct eps *eps) {
  pthread_mutex_lock(&eps->lock);
  for (int i = 0; i < eps->count; i++)
    while (due(eps->records[i]) && !eps->records[i]->agreed)
      pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
}

void eps_sync(struct eps *eps) {
  /* With ranks a record stays pending through its exchange, between worker jobs. */
  pthread_mutex_lock(&eps->lock);
  for (int i = 0; eps->dist && i < eps->count; i++)
    while (eps->records[i]->pending) pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
  queue_drain(&eps->workers);
  if (eps->spill) eps_ahead_drop_all(eps);   /* reads no update took (skipped updates) */
}
