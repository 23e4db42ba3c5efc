/* relay.c — the relay: runs a model one layer at a time on the device pool, micro-batch
 * by micro-batch, with the parameters streamed from the EPS (see l2l.h, "the relay").
 *
 * Purpose: the order of work of a step and its overlap. A step is a list of layer
 * visits made before anything runs: forward 0 .. L-2, the head (forward and backward of
 * each micro-batch at once: the turnaround), then backward L-2 .. lowest, with rebuild
 * visits (a forward rerun of a stretch of layers) before a backward whose input boundary
 * was dropped. While a visit computes on this thread, the host-to-device thread copies
 * the next visit's parameters and the next micro-batch's stashed input, the device-to-
 * host thread stashes outputs and sends finished gradients to the EPS, and the EPS's
 * workers update layers whose gradient is complete.
 * Every device tensor of a step is made and freed by this thread, at points of its own
 * choosing, so device memory never depends on when a copy thread gets to run.
 * Must never: change a layer, a record or the EPS when a step is refused (every check
 * runs before the first visit; updates only begin in backward), let a copy thread touch
 * Lua (custom layers run here only), or keep more than two micro-batches of a
 * host-stashed boundary on the device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "eps/eps.h"
#include "layers/layers.h"

#define RELAY_MAGIC 0x6c326c72u  /* "l2lr" */
enum { MAX_RECORDS = 16, MAX_PARAM_SLOTS = 4096, THREAD_COMPUTE = 0, THREAD_H2D = 1,
       THREAD_D2H = 2 };
#define MIN_LOSS_SCALE 0x1p-64
#define MAX_LOSS_SCALE 0x1p100

struct relay_layer {
  l2l_layer *layer;
  bool frozen;
  l2l_stash_policy stash;     /* the boundary before it (its input) */
  l2l_inner_policy inner;
};

struct l2l_relay {
  uint32_t magic;
  l2l_relay_config config;
  struct relay_layer *layers;
  int count, cap;
  struct l2l_eps eps;
  struct l2l_queue h2d, d2h;
  struct l2l_timeline timeline;
  int64_t steps, updates;     /* every step is one minibatch of an accumulation */
  /* Dynamic loss scaling (config.loss_scale > 0): the scale, updates since it last
     changed, updates skipped for an overflow. */
  double scale;
  int64_t scale_good, skipped;
  l2l_relay_stats stats;
  /* Filled by jobs on the copy threads; read between steps. */
  pthread_mutex_t lock;
  uint64_t h2d_bytes, d2h_bytes, stash_now, stash_peak;
  l2l_status async_status;    /* a job nobody waits for failed (gradients out) */
  char async_message[256];
};

static bool relay_ok(const l2l_relay *run) { return run != NULL && run->magic == RELAY_MAGIC; }

static void count_bytes(l2l_relay *run, uint64_t *counter, uint64_t bytes) {
  pthread_mutex_lock(&run->lock);
  *counter += bytes;
  pthread_mutex_unlock(&run->lock);
}

/* Host bytes holding stashed activations or saved states (signed change). */
static void count_stash(l2l_relay *run, int64_t bytes) {
  pthread_mutex_lock(&run->lock);
  run->stash_now += (uint64_t)bytes;
  if (run->stash_now > run->stash_peak) run->stash_peak = run->stash_now;
  pthread_mutex_unlock(&run->lock);
}

static uint64_t tensor_bytes(const l2l_tensor *t) {
  return (uint64_t)l2l_tensor_numel(t) * l2l_dtype_size((l2l_dtype)l2l_tensor_dtype(t));
}

static l2l_status tensor_like(l2l_tensor **out, l2l_pool_kind pool, const l2l_tensor *t) {
  return l2l_tensor_new_like(out, pool, (l2l_dtype)l2l_tensor_dtype(t), t);
}

/* ---------------------------------------------------------------- copy jobs */

/* Queues a job for a copy thread. On a GPU the kernels queued so far (which write what
   the job copies out, or still read what it overwrites) may not have run yet: the job
   carries a mark after them, which its worker waits for (jobs.c). */
static void copy_thread_push(struct l2l_queue *q, struct l2l_job *job) {
  job->after = l2l_device_mark();
  l2l_queue_push(q, job);
}

/* dst := src on a copy thread. The tensors stay the queuing thread's: it frees them
   after waiting, at points of its choosing, so device memory does not depend on when a
   copy thread gets to run. */
struct copy_job {
  struct l2l_job job;
  l2l_relay *run;
  l2l_tensor *dst, *src;
  int layer, micro_batch, phase;
  struct l2l_stamp done;  /* a copy onto the device: its end on the device's clock
                             (copy_wait takes it) */
};

static void copy_job_free(struct copy_job *cj) {
  if (cj == NULL) return;
  l2l_device_stamp_release(&cj->done);
  free(cj);
}

static void copy_run(struct l2l_job *job, int thread) {
  struct copy_job *cj = (struct copy_job *)job;
  double t0 = l2l_now();
  l2l_status status = l2l_tensor_copy(cj->dst, cj->src);
  if (status != L2L_OK) l2l_job_fail(job, status);
  uint64_t bytes = tensor_bytes(cj->src);
  count_bytes(cj->run, thread == THREAD_H2D ? &cj->run->h2d_bytes : &cj->run->d2h_bytes, bytes);
  l2l_timeline_add(&cj->run->timeline, cj->layer, cj->micro_batch, cj->phase, thread, t0,
                   l2l_now());
  /* compute waits only for copies onto the device (copy_wait reads this) */
  if (thread == THREAD_H2D) l2l_device_stamp(&cj->done);
}

static l2l_status copy_queue(struct copy_job **out, l2l_relay *run, struct l2l_queue *q,
                             l2l_tensor *dst, l2l_tensor *src, int layer, int micro_batch,
                             int phase) {
  struct copy_job *cj = calloc(1, sizeof *cj);
  if (cj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a copy job");
  *cj = (struct copy_job){.run = run, .dst = dst, .src = src, .layer = layer,
                          .micro_batch = micro_batch, .phase = phase};
  cj->job.run = copy_run;
  copy_thread_push(q, &cj->job);
  *out = cj;
  return L2L_OK;
}

/* A saved state moved between the device and pinned host memory on a copy thread
   (KARMA's swap). */
struct swap_job {
  struct l2l_job job;
  l2l_relay *run;
  l2l_saved *saved;
  l2l_pool_kind pool;
  int layer, micro_batch, phase;
};

static void swap_run(struct l2l_job *job, int thread) {
  struct swap_job *sj = (struct swap_job *)job;
  double t0 = l2l_now();
  uint64_t bytes = l2l_saved_pool_bytes(sj->saved);
  l2l_status status = l2l_saved_move(sj->saved, sj->pool);
  if (status != L2L_OK) l2l_job_fail(job, status);
  count_bytes(sj->run, thread == THREAD_H2D ? &sj->run->h2d_bytes : &sj->run->d2h_bytes, bytes);
  if (status == L2L_OK) count_stash(sj->run, sj->pool != L2L_POOL_DEVICE ? (int64_t)bytes : -(int64_t)bytes);
  l2l_timeline_add(&sj->run->timeline, sj->layer, sj->micro_batch, sj->phase, thread, t0,
                   l2l_now());
}

/* Queues the move of saved[k][u] to `pool` (no-op if it is there or on its way). */
static l2l_status swap_queue(l2l_relay *run, struct l2l_queue *q, struct swap_job **slot,
                             l2l_saved *saved, l2l_pool_kind pool, int layer, int64_t u) {
  if (*slot != NULL) return L2L_OK;
  struct swap_job *sj = calloc(1, sizeof *sj);
  if (sj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a swap job");
  *sj = (struct swap_job){.run = run, .saved = saved, .pool = pool, .layer = layer,
                          .micro_batch = (int)u,
                          .phase = pool != L2L_POOL_DEVICE ? L2L_PHASE_SWAP_OUT : L2L_PHASE_SWAP_IN};
  sj->job.run = swap_run;
  *slot = sj;
  copy_thread_push(q, &sj->job);
  return L2L_OK;
}

/* Waits for a swap in flight; the saved state is then where the job took it. */
static l2l_status swap_wait(double *waited, struct swap_job **slot) {
  if (*slot == NULL) return L2L_OK;
  double t0 = l2l_now();
  l2l_status status = l2l_job_wait(&(*slot)->job);
  *waited += l2l_now() - t0;
  free(*slot);
  *slot = NULL;
  return status;
}

/* A layer's parameters into their device tensors, after the layer's pending updates. */
struct params_job {
  struct l2l_job job;
  l2l_relay *run;
  int layer, nrec;
  struct eps_record *rec[MAX_RECORDS];
  l2l_tensor *value[MAX_RECORDS];
  int64_t updates[MAX_RECORDS];   /* each record's update count when copied */
  int slot;                       /* the parameter slot it fills */
  struct l2l_stamp done;          /* as copy_job's */
};

static void params_job_free(struct params_job *pj) {
  l2l_device_stamp_release(&pj->done);
  free(pj);
}

static void params_run(struct l2l_job *job, int thread) {
  struct params_job *pj = (struct params_job *)job;
  double t0 = l2l_now();
  for (int i = 0; i < pj->nrec; i++) {
    l2l_eps_wait_record(&pj->run->eps, pj->rec[i]);
    pj->updates[i] = l2l_eps_settled_updates(&pj->run->eps, pj->rec[i]);
    l2l_status status = l2l_tensor_copy(pj->value[i], l2l_eps_device_source(pj->rec[i]));
    if (status != L2L_OK) {
      l2l_job_fail(job, status);
      break;
    }
    count_bytes(pj->run, &pj->run->h2d_bytes, tensor_bytes(pj->value[i]));
  }
  l2l_timeline_add(&pj->run->timeline, pj->layer, -1, L2L_PHASE_PARAMS_IN, thread, t0,
                   l2l_now());
  l2l_device_stamp(&pj->done);
}

/* A visit's gradients out to the EPS: copied to pinned buffers the EPS then owns and
   adds up on its workers. When the device pool is host memory (the CPU backend) there is
   nothing to copy: this thread adds the gradient slot into the EPS's accumulators
   directly, which saves a pass over the gradient and a buffer, and leaves the slot zero.
   Gradients rounded to a 16-bit grad_precision come from the out slot instead, and the
   EPS widens them as it adds. The compute thread waits for this job before the gradient
   slot serves another visit. */
struct grads_job {
  struct l2l_job job;
  l2l_relay *run;
  int layer, nrec;
  float clip;                 /* per-layer clipping, 0: off */
  bool host_readable;         /* the step's host_device: absorb (and zero) in place */
  bool drains;                /* every gradient is the f32 slot's (none rounded to 16 bits):
                                 absorbing in place leaves the whole slot zero */
  struct eps_record *rec[MAX_RECORDS];
  l2l_tensor *grad[MAX_RECORDS];
};

static void grads_release(struct l2l_job *job) {
  struct grads_job *gj = (struct grads_job *)job;
  for (int i = 0; i < gj->nrec; i++) l2l_tensor_free(gj->grad[i]);
  free(gj);
}

static void grads_run(struct l2l_job *job, int thread) {
  struct grads_job *gj = (struct grads_job *)job;
  l2l_relay *run = gj->run;
  const bool host_readable = gj->host_readable;
  double t0 = l2l_now();
  l2l_tensor *incoming[MAX_RECORDS] = {0};
  const l2l_tensor *host[MAX_RECORDS] = {0};
  l2l_status status = L2L_OK;
  for (int i = 0; i < gj->nrec && status == L2L_OK; i++) {
    host[i] = gj->grad[i];
    if (!host_readable) {
      status = tensor_like(&incoming[i], L2L_POOL_PINNED, gj->grad[i]);
      if (status == L2L_OK) status = l2l_tensor_copy(incoming[i], gj->grad[i]);
      host[i] = incoming[i];
    }
    if (status == L2L_OK) count_bytes(run, &run->d2h_bytes, tensor_bytes(gj->grad[i]));
  }
  if (status != L2L_OK) {
    l2l_timeline_add(&run->timeline, gj->layer, -1, L2L_PHASE_GRADS_OUT, thread, t0, l2l_now());
    for (int i = 0; i < gj->nrec; i++) l2l_tensor_free(incoming[i]);
    pthread_mutex_lock(&run->lock);
    if (run->async_status == L2L_OK) {
      run->async_status = status;
      snprintf(run->async_message, sizeof run->async_message, "%s", l2l_last_error());
    }
    pthread_mutex_unlock(&run->lock);
    return;   /* the step fails at its end (check_async) and abandons its gradients */
  }
  float scale = l2l_eps_clip_scale(host, gj->nrec, gj->clip);
  for (int i = 0; i < gj->nrec; i++) {   /* absorbing leaves the slot zero for its next visit */
    if (host_readable) l2l_eps_absorb(&run->eps, gj->rec[i], gj->grad[i], scale, gj->layer);
    else l2l_eps_give(&run->eps, gj->rec[i], incoming[i], scale, gj->layer);
  }
  l2l_timeline_add(&run->timeline, gj->layer, -1, L2L_PHASE_GRADS_OUT, thread, t0, l2l_now());
}

/* ---------------------------------------------------------------- a step's state */

/* One micro-batch's activations (or their gradients) at one boundary. */
struct act {
  l2l_tensor *dev;            /* on the device (NULL when only on the host) */
  l2l_tensor *host;           /* the host stash (pinned) */
  struct copy_job *in;        /* host -> dev in flight */
};

enum visit_kind { V_FORWARD, V_HEAD, V_BACKWARD, V_REBUILD };
struct visit {
  int k;                      /* index among the step's active layers */
  enum visit_kind kind;
};

struct param_slot {
  l2l_tensor *t;
  int held;                   /* active layer whose parameters it holds, -1: none */
  int64_t last_used;          /* slot_ticks when last chosen */
  int64_t updates[MAX_RECORDS];   /* held's records' update counts when copied */
};

struct step {
  l2l_relay *run;
  const l2l_relay_batch *in;
  bool training;
  int64_t B, S, D, mb, nmb;
  int L;                      /* active layers */
  int *active;                /* -> index in run->layers */
  struct act **x;             /* x[k][u]: input of active layer k (k >= 1) */
  struct act **g;             /* g[k][u]: gradient of the loss for x[k][u] */
  l2l_saved ***saved;         /* saved[k][u] of keep and swap layers */
  struct swap_job ***swap;    /* swap[k][u] in flight */
  uint8_t **where;            /* where[k][u]: 1 while saved[k][u] is on the host */
  bool *rebuilt;              /* boundary k rebuilt on the device for the backward */
  bool *reread;               /* x[k] is read again after forward (backward or rebuild) */
  struct visit *visits;
  int nvisits, lowest;
  /* The visit running and the next one's parameters. */
  struct params_job *params[2];
  l2l_tensor *grads[MAX_RECORDS];
  int ngrads;
  /* Parameter slots (config.param_slots, each the size of the largest layer): the visit
     running holds one while the next visit's parameters copy into the least recently
     used other one. A slot remembers the active layer it holds (-1: nothing reusable) at
     its records' update counts, so a visit whose layer is still there as the EPS has it
     now copies nothing: with two slots (L2L's double buffer) the last block's backward
     right after the head and a layer's backward after its own rebuild; each more slot
     keeps one more of the forward's last layers for the backward. */
  struct param_slot *pslots;
  int nslots;
  int64_t slot_ticks;         /* counts slot choices, for least recently used */
  /* Two gradient slots, the size of a parameter slot: visit i computes into slot
     gs = i % 2 while the other's gradients go out to the EPS. With a 16-bit
     grad_precision, each has an out slot for the 16-bit copies that leave the device. */
  l2l_tensor *gslot[2], *gout_slot[2];
  struct grads_job *gout[2];  /* the gradients out of the last visit of each slot */
  int gs;
  /* Device memory the host can read (the CPU backend): the copy thread adds a gradient
     slot into the EPS and zeroes it in the same pass, so a slot is all zero between
     visits (gzero) and the next visit need not clear it. */
  bool host_device, gzero[2];
  struct copy_job *out[2];    /* stash-outs in flight (oldest first) */
  double loss_sum;
  int64_t real;               /* targets that count */
  float loss_scale;           /* the loss gradient's seed (see relay_run) */
  float clip_layer;           /* per-layer clipping, in the loss scale's units */
  double compute, wait_copy, wait_update, exposed_copy;
  /* The compute thread's work and its waits for copies, between stamps: on the timeline
     and in compute / exposed_copy once the step is done and the device's clock can be
     read (stamped_resolve), against the anchor taken as the step began. */
  struct l2l_stamp anchor;
  struct stamped *stamped;
  int64_t nstamped, stamped_cap;
};

/* One unit of the compute thread's work (or of its waiting for a copy) on the device's
   clock: on a GPU the host only queues kernels, so its clock says when they were queued,
   not when they ran. */
struct stamped {
  struct l2l_stamp start, end;
  int layer, micro_batch, phase;
};

/* Keeps [start, end) for stamped_resolve, which releases both; without memory for it,
   releases them now (the unit then misses the timeline and the sums). */
static void stamped_add(struct step *s, struct l2l_stamp *start, struct l2l_stamp *end,
                        int layer, int micro_batch, int phase) {
  if (s->nstamped == s->stamped_cap) {
    int64_t cap = s->stamped_cap ? 2 * s->stamped_cap : 256;
    struct stamped *grown = realloc(s->stamped, (size_t)cap * sizeof *grown);
    if (grown == NULL) {
      l2l_device_stamp_release(start);
      l2l_device_stamp_release(end);
      return;
    }
    s->stamped = grown, s->stamped_cap = cap;
  }
  s->stamped[s->nstamped++] = (struct stamped){*start, *end, layer, micro_batch, phase};
  start->event = end->event = NULL; /* released by stamped_resolve */
}

/* The step's stamped units onto the timeline, in host seconds: the anchor's host time
   plus their offsets from it on the device's clock (on the CPU backend that is their own
   host time). Compute units add up into compute; a wait for a copy counts as exposed
   copy time for the part the device spent idle: from when it had done the work queued
   before the wait to the copy's end, when that came later. */
static void stamped_resolve(struct step *s) {
  l2l_relay *run = s->run;
  (void)l2l_device_synchronize(); /* every stamp has happened (a failure: those not, drop) */
  for (int64_t i = 0; i < s->nstamped; i++) {
    struct stamped *e = &s->stamped[i];
    double from = 0, to = 0;
    if (l2l_device_stamp_seconds(&from, &s->anchor, &e->start) &&
        l2l_device_stamp_seconds(&to, &s->anchor, &e->end)) {
      double t0 = s->anchor.host + from, t1 = s->anchor.host + to;
      bool wait = e->phase == L2L_PHASE_WAIT_COPY;
      if (!wait && t1 < t0) t1 = t0;
      if (!wait || t1 - t0 > 1e-5) {
        *(wait ? &s->exposed_copy : &s->compute) += t1 - t0;
        l2l_timeline_add(&run->timeline, e->layer, e->micro_batch, e->phase, THREAD_COMPUTE,
                         t0, t1);
      }
    }
    l2l_device_stamp_release(&e->start);
    l2l_device_stamp_release(&e->end);
  }
  free(s->stamped);
  s->stamped = NULL;
  s->nstamped = s->stamped_cap = 0;
  l2l_device_stamp_release(&s->anchor);
}

static struct relay_layer *active_layer(const struct step *s, int k) {
  return &s->run->layers[s->active[k]];
}
static l2l_layer_kind kind_of(const l2l_layer *layer) {
  l2l_layer_config c;
  l2l_layer_get_config(&c, layer);
  return c.kind;
}

/* Whether boundary k (k >= 1) is dropped in forward (rebuilt for the backward). */
static bool dropped(const struct step *s, int k) {
  return active_layer(s, k)->stash == L2L_STASH_RECOMPUTE;
}

static void act_free(l2l_relay *run, struct act *a) {
  if (a->in) {
    l2l_job_wait(&a->in->job);
    l2l_tensor_free(a->in->dst);
    copy_job_free(a->in);
    a->in = NULL;
  }
  if (a->host) count_stash(run, -(int64_t)l2l_pool_accounted(tensor_bytes(a->host)));
  l2l_tensor_free(a->dev);
  l2l_tensor_free(a->host);
  a->dev = a->host = NULL;
}

static void step_free(struct step *s) {
  l2l_relay *run = s->run;
  /* Jobs first: they may still read or free what is below. */
  l2l_queue_drain(&run->h2d);
  l2l_queue_drain(&run->d2h);
  stamped_resolve(s);
  for (int i = 0; i < 2; i++) {
    if (s->out[i]) l2l_tensor_free(s->out[i]->src);
    copy_job_free(s->out[i]);
    if (s->params[i]) {
      for (int r = 0; r < s->params[i]->nrec; r++) l2l_tensor_free(s->params[i]->value[r]);
      params_job_free(s->params[i]);
    }
    if (s->gout[i]) grads_release(&s->gout[i]->job);
    l2l_tensor_free(s->gslot[i]);
    l2l_tensor_free(s->gout_slot[i]);
  }
  for (int i = 0; i < s->nslots; i++) l2l_tensor_free(s->pslots[i].t);
  free(s->pslots);
  for (int r = 0; r < s->ngrads; r++) l2l_tensor_free(s->grads[r]);
  for (int k = 0; k <= s->L; k++) {
    for (int64_t u = 0; u < s->nmb; u++) {
      if (s->x && s->x[k]) act_free(run, &s->x[k][u]);
      if (s->g && s->g[k]) act_free(run, &s->g[k][u]);
      if (s->swap && s->swap[k] && s->swap[k][u]) free(s->swap[k][u]);
      if (s->saved && s->saved[k] && s->saved[k][u]) {
        if (s->where[k][u]) count_stash(run, -(int64_t)l2l_saved_pool_bytes(s->saved[k][u]));
        l2l_saved_free(s->saved[k][u]);
      }
    }
    if (s->x) free(s->x[k]);
    if (s->g) free(s->g[k]);
    if (s->saved) free(s->saved[k]);
    if (s->swap) free(s->swap[k]);
    if (s->where) free(s->where[k]);
  }
  free(s->where);
  free(s->x);
  free(s->g);
  free(s->saved);
  free(s->swap);
  free(s->rebuilt);
  free(s->reread);
  free(s->visits);
  free(s->active);
  /* Parameters back to their own tensors whatever happened. */
  for (int i = 0; i < run->count; i++) {
    l2l_layer *layer = run->layers[i].layer;
    for (int r = 0; r < l2l_layer_param_count(layer); r++)
      l2l_param_bind(l2l_layer_param(layer, r), NULL, NULL);
  }
}

/* ---------------------------------------------------------------- checks */

/* A batch tensor: its shape and dtype, in the host or pinned pool (the relay copies each
   micro-batch's rows to the device itself). */
static l2l_status check_tensor(const char *what, const l2l_tensor *t, l2l_dtype dtype, int ndim,
                               const int64_t *dims) {
  TRY(l2l_need_shape(__func__, what, t, dtype, ndim, dims));
  int pool = l2l_tensor_pool(t);
  if (pool != L2L_POOL_HOST && pool != L2L_POOL_PINNED)
    return FAIL(L2L_ERR_INVALID, "%s must be in the host or pinned pool, not '%s'", what,
                l2l_pool_name((l2l_pool_kind)pool));
  return L2L_OK;
}

/* Values of an i32 tensor outside [0, hi) other than `allowed`, found by the backend's
   check (the one the layers use). */
static l2l_status check_range(const char *what, const l2l_tensor *t, int64_t hi, int32_t allowed) {
  int64_t bad = -1;
  int32_t value = 0;
  TRY(l2l_backend_for(L2L_POOL_HOST)->find_out_of_range(&bad, &value, l2l_tensor_data(t),
                                                         l2l_tensor_numel(t), 0, (int32_t)hi,
                                                         allowed));
  if (bad >= 0)
    return FAIL(L2L_ERR_INVALID, "%s[%lld] = %d is outside [0, %lld)%s", what, (long long)bad,
                value, (long long)hi, allowed == -1 ? " and not -1" : "");
  return L2L_OK;
}

/* The model's shape and the batch, before anything runs. */

/* A record's dtype on the device: its staging copy's (16-bit), else f32. */
static l2l_dtype device_dtype(const struct eps_record *rec) {
  return (l2l_dtype)l2l_tensor_dtype(l2l_eps_device_source(rec));
}

/* The dtype a record's gradient leaves the device in: grad_precision for the parameters
   that go 16-bit (GEMM weights, token tables), else f32. */
static l2l_dtype grads_out_dtype(const l2l_relay *run, const struct eps_record *rec) {
  return l2l_param_low_precision(l2l_eps_param(rec)) ? run->config.grad_precision : L2L_F32;
}

/* What a device slot holds for each record: its values in their device dtype, its f32
   gradient, or the 16-bit copy of a gradient made to leave the device (f32 gradients
   leave from the gradient slot itself: 0 bytes). */
enum slot_content { SLOT_VALUES, SLOT_GRADS, SLOT_GRADS_OUT };

static l2l_dtype slot_dtype(const l2l_relay *run, const struct eps_record *rec,
                            enum slot_content content) {
  return content == SLOT_VALUES ? device_dtype(rec)
         : content == SLOT_GRADS ? L2L_F32
                                 : grads_out_dtype(run, rec);
}

/* Bytes a record takes in a slot, rounded so that every record starts on L2L_ALIGN. */
static uint64_t slot_bytes(const l2l_relay *run, const struct eps_record *rec,
                           enum slot_content content) {
  l2l_dtype dtype = slot_dtype(run, rec, content);
  uint64_t size = content == SLOT_GRADS_OUT && dtype == L2L_F32 ? 0 : l2l_dtype_size(dtype);
  uint64_t bytes = (uint64_t)l2l_tensor_numel(l2l_eps_master(rec)) * size;
  return (bytes + L2L_ALIGN - 1) / L2L_ALIGN * L2L_ALIGN;
}

/* Bytes of a device slot: the largest active layer's. */
static uint64_t slot_size(const struct step *s, enum slot_content content) {
  uint64_t most = L2L_ALIGN;
  for (int k = 0; k < s->L; k++) {
    l2l_layer *layer = active_layer(s, k)->layer;
    uint64_t n = 0;
    for (int r = 0; r < l2l_layer_param_count(layer); r++)
      n += slot_bytes(s->run, l2l_eps_find(&s->run->eps, l2l_layer_param(layer, r)), content);
    if (n > most) most = n;
  }
  return most;
}

static l2l_status check_step(struct step *s, const l2l_relay_batch *in) {
  l2l_relay *run = s->run;
  if (in == NULL) return FAIL(L2L_ERR_INVALID, "batch is NULL");
  if (run->count < 2)
    return FAIL(L2L_ERR_INVALID, "the model has %d layers: it needs at least an embedding and a head",
                run->count);
  l2l_layer_config first, last;
  l2l_layer_get_config(&first, run->layers[0].layer);
  l2l_layer_get_config(&last, run->layers[run->count - 1].layer);
  if (first.kind != L2L_LAYER_EMBEDDING)
    return FAIL(L2L_ERR_INVALID, "layer 0 must be an embedding (it reads the tokens)");
  if (last.kind != L2L_LAYER_LM_HEAD && last.kind != L2L_LAYER_CLASSIFIER)
    return FAIL(L2L_ERR_INVALID, "layer %d (the last) must be an LM head or a classifier",
                run->count - 1);
  for (int i = 1; i < run->count; i++) {
    l2l_layer_config c;
    l2l_layer_get_config(&c, run->layers[i].layer);
    if (i < run->count - 1 && c.kind != L2L_LAYER_BLOCK && c.kind != L2L_LAYER_CUSTOM)
      return FAIL(L2L_ERR_INVALID, "layer %d is a %s: only blocks and custom layers go between the embedding and the head",
                  i, l2l_layer_name(run->layers[i].layer));
    if (c.dim != first.dim)
      return FAIL(L2L_ERR_INVALID, "layer %d has dim %lld but the embedding has %lld", i,
                  (long long)c.dim, (long long)first.dim);
  }
  const l2l_tensor *tokens = in->tokens;
  if (tokens == NULL || l2l_tensor_ndim(tokens) != 2)
    return FAIL(L2L_ERR_INVALID, "batch->tokens must be a (B,S) i32 tensor%s",
                tokens == NULL ? " (it is NULL)" : "");
  s->B = l2l_tensor_dim(tokens, 0);
  s->S = l2l_tensor_dim(tokens, 1);
  s->D = first.dim;
  int64_t bs[2] = {s->B, s->S};
  TRY(check_tensor("batch->tokens", tokens, L2L_I32, 2, bs));
  if (s->S > first.max_seq)
    return FAIL(L2L_ERR_INVALID, "batch->tokens has %lld positions but the embedding's max_seq is %lld",
                (long long)s->S, (long long)first.max_seq);
  TRY(check_range("batch->tokens", tokens, first.vocab, 0));
  if (first.type_vocab > 0) {
    TRY(check_tensor("batch->token_types", in->token_types, L2L_I32, 2, bs));
    TRY(check_range("batch->token_types", in->token_types, first.type_vocab, 0));
  } else if (in->token_types != NULL) {
    return FAIL(L2L_ERR_INVALID, "batch->token_types given but the embedding has type_vocab 0");
  }
  if (in->key_mask) TRY(check_tensor("batch->key_mask", in->key_mask, L2L_U8, 2, bs));
  bool lm = last.kind == L2L_LAYER_LM_HEAD;
  TRY(check_tensor("batch->targets", in->targets, L2L_I32, lm ? 2 : 1, bs));
  TRY(check_range("batch->targets", in->targets, lm ? last.vocab : last.classes, -1));
  s->real = 0;
  const int32_t *t = l2l_tensor_data(in->targets);
  for (int64_t i = 0; i < l2l_tensor_numel(in->targets); i++) s->real += t[i] != -1;
  if (s->real == 0) return FAIL(L2L_ERR_INVALID, "batch->targets has no target other than -1");

  /* The active layers: all but the skipped ones. */
  s->active = malloc((size_t)run->count * sizeof *s->active);
  if (s->active == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int i = 0; i < run->count; i++) {
    bool skip = in->skip && in->skip[i];
    if (skip && (i == 0 || i == run->count - 1))
      return FAIL(L2L_ERR_INVALID, "batch->skip[%d]: the embedding and the head cannot be skipped", i);
    if (in->skip && in->skip[i] > 1)
      return FAIL(L2L_ERR_INVALID, "batch->skip[%d] must be 0 or 1, got %d", i, in->skip[i]);
    if (!skip) s->active[s->L++] = i;
  }
  s->mb = run->config.micro_batch < s->B ? run->config.micro_batch : s->B;
  s->nmb = (s->B + s->mb - 1) / s->mb;

  /* The device must hold one layer's visit: the parameter slots (at least the visit's
     and the next one's) and, in training, the two gradient slots and their 16-bit copies
     on the way out, each the size of the largest layer; a micro-batch's input, output and
     gradients; the layer's working memory. */
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  if (device.budget > 0) {
    uint64_t grads = l2l_pool_accounted(slot_size(s, SLOT_GRADS));
    if (run->config.grad_precision != L2L_F32)
      grads += l2l_pool_accounted(slot_size(s, SLOT_GRADS_OUT));
    uint64_t slots = (uint64_t)run->config.param_slots *
                         l2l_pool_accounted(slot_size(s, SLOT_VALUES)) +
                     (s->training ? 2 * grads : 0);
    for (int k = 0; k < s->L; k++) {
      l2l_layer *layer = active_layer(s, k)->layer;
      l2l_layer_memory m;
      l2l_layer_memory_in(&m, layer, s->mb, s->S, run->config.precision);
      uint64_t act = l2l_pool_accounted((uint64_t)(s->mb * s->S * s->D) * sizeof(float));
      uint64_t need = slots + m.peak + 3 * act;
      if (need > device.budget - device.current) {
        char a[32], b[32];
        return FAIL(L2L_ERR_BUDGET,
                    "the device budget (%llu bytes, %s free) is too small for layer %d (%s): one "
                    "micro-batch of %lld needs at least %llu bytes (%s) for its parameters, "
                    "gradients, activations and working memory",
                    (unsigned long long)device.budget,
                    l2l_human_bytes(a, sizeof a, device.budget - device.current), s->active[k],
                    l2l_layer_name(layer), (long long)s->mb, (unsigned long long)need,
                    l2l_human_bytes(b, sizeof b, need));
      }
    }
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- the plan of visits */

static l2l_status plan_visits(struct step *s) {
  int L = s->L;
  s->visits = calloc((size_t)(4 * L + 4), sizeof *s->visits);
  s->rebuilt = calloc((size_t)L + 1, sizeof *s->rebuilt);
  s->reread = calloc((size_t)L + 1, sizeof *s->reread);
  if (s->visits == NULL || s->rebuilt == NULL || s->reread == NULL)
    return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int k = 0; k < L - 1; k++) s->visits[s->nvisits++] = (struct visit){k, V_FORWARD};
  s->visits[s->nvisits++] = (struct visit){L - 1, V_HEAD};
  if (!s->training) return L2L_OK;
  /* Backward reaches down to the lowest trainable layer: below it nobody needs a gradient. */
  s->lowest = L;
  for (int k = 0; k < L; k++)
    if (!active_layer(s, k)->frozen) {
      s->lowest = k;
      break;
    }
  for (int k = L - 2; k >= s->lowest; k--) {
    bool recompute = active_layer(s, k)->inner == L2L_INNER_RECOMPUTE;
    if (k >= 1 && recompute && dropped(s, k) && !s->rebuilt[k]) {
      int j = k - 1;
      while (j >= 1 && dropped(s, j) && !s->rebuilt[j]) j--;
      for (int m = j; m < k; m++) s->visits[s->nvisits++] = (struct visit){m, V_REBUILD};
      for (int m = j + 1; m <= k; m++) s->rebuilt[m] = true;
      if (!s->rebuilt[j]) s->reread[j] = true;
    }
    if (recompute && !s->rebuilt[k]) s->reread[k] = true;
    s->visits[s->nvisits++] = (struct visit){k, V_BACKWARD};
  }
  return L2L_OK;
}

static l2l_status step_alloc(struct step *s) {
  int n = s->L + 1;
  s->x = calloc((size_t)n, sizeof *s->x);
  s->g = calloc((size_t)n, sizeof *s->g);
  s->saved = calloc((size_t)n, sizeof *s->saved);
  s->swap = calloc((size_t)n, sizeof *s->swap);
  s->where = calloc((size_t)n, sizeof *s->where);
  if (!s->x || !s->g || !s->saved || !s->swap || !s->where)
    return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int k = 0; k < n; k++) {
    s->x[k] = calloc((size_t)s->nmb, sizeof **s->x);
    s->g[k] = calloc((size_t)s->nmb, sizeof **s->g);
    s->saved[k] = calloc((size_t)s->nmb, sizeof **s->saved);
    s->swap[k] = calloc((size_t)s->nmb, sizeof **s->swap);
    s->where[k] = calloc((size_t)s->nmb, sizeof **s->where);
    if (!s->x[k] || !s->g[k] || !s->saved[k] || !s->swap[k] || !s->where[k])
      return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- parameters */

/* A tensor for rec at byte *offset of a slot holding `content`, shaped like its master;
   *offset moves past it. */
static l2l_status slot_view(l2l_tensor **out, const struct step *s, const l2l_tensor *slot,
                            uint64_t *offset, const struct eps_record *rec,
                            enum slot_content content) {
  TRY(l2l_tensor_view_bytes(out, slot, *offset, slot_dtype(s->run, rec, content),
                            l2l_eps_master(rec)));
  *offset += slot_bytes(s->run, rec, content);
  return L2L_OK;
}

/* The slots (bytes), sized for the largest active layer. */
static l2l_status slots_new(struct step *s) {
  int64_t shape[1] = {(int64_t)slot_size(s, SLOT_VALUES)};
  int64_t gshape[1] = {(int64_t)slot_size(s, SLOT_GRADS)};
  int64_t oshape[1] = {(int64_t)slot_size(s, SLOT_GRADS_OUT)};
  s->host_device = l2l_device_is_host();
  s->nslots = s->run->config.param_slots;
  s->pslots = calloc((size_t)s->nslots, sizeof *s->pslots);
  if (s->pslots == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int i = 0; i < s->nslots; i++) {
    s->pslots[i].held = -1;
    s->pslots[i].last_used = -1;
    TRY(l2l_tensor_new(&s->pslots[i].t, L2L_POOL_DEVICE, L2L_U8, 1, shape));
  }
  for (int i = 0; s->training && i < 2; i++) {
    TRY(l2l_tensor_new(&s->gslot[i], L2L_POOL_DEVICE, L2L_U8, 1, gshape));
    if (s->run->config.grad_precision != L2L_F32)
      TRY(l2l_tensor_new(&s->gout_slot[i], L2L_POOL_DEVICE, L2L_U8, 1, oshape));
    if (s->host_device) {
      TRY(l2l_tensor_fill(s->gslot[i], 0.0));
      s->gzero[i] = true;
    }
  }
  return L2L_OK;
}

/* Whether parameter slot i still holds active layer k as the EPS has it now. */
static bool slot_current(struct step *s, int i, int k, const struct params_job *pj) {
  if (s->pslots[i].held != k) return false;
  for (int r = 0; r < pj->nrec; r++) {
    int64_t now = l2l_eps_settled_updates(&s->run->eps, pj->rec[r]);
    if (now < 0 || now != s->pslots[i].updates[r]) return false;
  }
  return true;
}

/* The slot for layer k's next visit, other than `busy` (the running visit's, -1: none):
   one that holds k as it is now, else the least recently used. *current: the former. */
static int slot_choose(struct step *s, int k, const struct params_job *pj, int busy,
                       bool *current) {
  int pick = -1;
  for (int i = 0; i < s->nslots; i++) {
    if (i == busy) continue;
    if (slot_current(s, i, k, pj)) {
      *current = true;
      pick = i;
      break;
    }
    if (pick < 0 || s->pslots[i].last_used < s->pslots[pick].last_used) pick = i;
  }
  if (!*current) s->pslots[pick].held = -1;   /* its contents are about to change */
  s->pslots[pick].last_used = s->slot_ticks++;
  return pick;
}

/* Queues the copy of layer k's parameters into a parameter slot for the visit about to
   run (which 0) or the one after it (which 1; the running visit keeps its slot). */
static l2l_status params_queue(struct step *s, int which, int k) {
  l2l_relay *run = s->run;
  l2l_layer *layer = active_layer(s, k)->layer;
  struct params_job *pj = calloc(1, sizeof *pj);
  if (pj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a copy job");
  s->params[which] = pj;
  pj->run = run;
  pj->layer = s->active[k];
  pj->nrec = l2l_layer_param_count(layer);
  for (int r = 0; r < pj->nrec; r++)
    pj->rec[r] = l2l_eps_find(&run->eps, l2l_layer_param(layer, r));
  bool current = false;
  int busy = which == 1 && s->params[0] != NULL ? s->params[0]->slot : -1;
  pj->slot = slot_choose(s, k, pj, busy, &current);
  uint64_t offset = 0;
  for (int r = 0; r < pj->nrec; r++)
    TRY(slot_view(&pj->value[r], s, s->pslots[pj->slot].t, &offset, pj->rec[r], SLOT_VALUES));
  pj->job.run = params_run;
  if (current) {   /* done already: nothing to copy */
    memcpy(pj->updates, s->pslots[pj->slot].updates, sizeof pj->updates);
    pj->job.queue = &run->h2d;
    pj->job.done = true;
    return L2L_OK;
  }
  copy_thread_push(&run->h2d, &pj->job);
  return L2L_OK;
}

/* Waits for the gradients of slot `slot`'s last visit to be out (the slot is then free).
   A failure there is the run's (check_async), not this visit's. */
static void grads_wait(struct step *s, int slot) {
  struct grads_job *gj = s->gout[slot];
  if (gj == NULL) return;
  double t0 = l2l_now();
  l2l_status status = l2l_job_wait(&gj->job);
  s->wait_copy += l2l_now() - t0;
  if (status == L2L_OK && s->host_device && gj->drains) s->gzero[slot] = true;
  grads_release(&gj->job);
  s->gout[slot] = NULL;
}

/* The compute thread waits for a copy job whose copy ended at `done` (taken over). The
   host's wait counts in wait_copy; whether the device waited too is known once the step
   is done (stamped_resolve): from a stamp queued now, after the work the copy hides
   under, to `done`. */
static l2l_status copy_wait(struct step *s, struct l2l_job *job, struct l2l_stamp *done,
                            int layer, int micro_batch) {
  struct l2l_stamp before;
  l2l_device_stamp(&before);
  l2l_status status = l2l_job_wait(job);
  s->wait_copy += l2l_now() - before.host;
  if (done->host > 0) /* a copy that ran, not parameters already in their slot */
    stamped_add(s, &before, done, layer, micro_batch, L2L_PHASE_WAIT_COPY);
  else
    l2l_device_stamp_release(&before);
  return status;
}

/* Waits for slot 0's parameters (the visit about to run) and binds them with device
   gradients when the visit computes any. */
static l2l_status params_bind(struct step *s, int k, bool grads) {
  l2l_relay *run = s->run;
  struct params_job *pj = s->params[0];
  l2l_layer *layer = active_layer(s, k)->layer;
  double t0 = l2l_now();
  /* The copy job waits for the updates too; waiting here first tells the two waits apart. */
  for (int r = 0; r < pj->nrec; r++) l2l_eps_wait_record(&run->eps, pj->rec[r]);
  double t1 = l2l_now();
  s->wait_update += t1 - t0;
  if (t1 - t0 > 1e-5)
    l2l_timeline_add(&run->timeline, s->active[k], -1, L2L_PHASE_WAIT_UPDATE, THREAD_COMPUTE, t0, t1);
  TRY(copy_wait(s, &pj->job, &pj->done, s->active[k], -1));
  s->ngrads = 0;
  if (grads) grads_wait(s, s->gs);
  uint64_t offset = 0;
  for (int r = 0; r < pj->nrec; r++) {
    if (grads) {
      TRY(slot_view(&s->grads[r], s, s->gslot[s->gs], &offset, pj->rec[r], SLOT_GRADS));
      s->ngrads = r + 1;
      if (!s->gzero[s->gs]) TRY(l2l_tensor_fill(s->grads[r], 0.0));
    }
    l2l_param_bind(l2l_layer_param(layer, r), pj->value[r], grads ? s->grads[r] : NULL);
  }
  if (grads) s->gzero[s->gs] = false;
  return L2L_OK;
}

/* After a visit: parameters unbound and freed; gradients of a trainable visit go out to
   the EPS (the job owns them from here), others are dropped. */
static l2l_status params_done(struct step *s, int k, bool give) {
  l2l_relay *run = s->run;
  struct params_job *pj = s->params[0];
  l2l_layer *layer = active_layer(s, k)->layer;
  for (int r = 0; r < pj->nrec; r++) {
    l2l_param_bind(l2l_layer_param(layer, r), NULL, NULL);
    l2l_tensor_free(pj->value[r]);
  }
  s->pslots[pj->slot].held = k;
  memcpy(s->pslots[pj->slot].updates, pj->updates, sizeof pj->updates);
  params_job_free(pj);
  s->params[0] = s->params[1];
  s->params[1] = NULL;
  if (!give) {
    /* Dropped gradients (a frozen layer's): the slot is zeroed here instead. */
    bool zeroed = s->host_device;
    for (int r = 0; r < s->ngrads; r++) {
      if (zeroed) zeroed = l2l_tensor_fill(s->grads[r], 0.0) == L2L_OK;
      l2l_tensor_free(s->grads[r]);
    }
    if (s->ngrads > 0) s->gzero[s->gs] = zeroed;
    s->ngrads = 0;
    return L2L_OK;
  }
  struct grads_job *gj = calloc(1, sizeof *gj);
  if (gj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a copy job");
  gj->run = run;
  gj->layer = s->active[k];
  gj->clip = s->clip_layer;
  gj->host_readable = s->host_device;
  gj->nrec = s->ngrads;
  gj->drains = true;
  for (int r = 0; r < s->ngrads; r++) {
    gj->rec[r] = l2l_eps_find(&run->eps, l2l_layer_param(layer, r));
    gj->grad[r] = s->grads[r];
  }
  s->ngrads = 0;
  /* 16-bit gradients: rounded here, on the device, into the slot's out slot, so that the
     copy moves half the bytes; the f32 slot is then cleared by its next visit. */
  uint64_t offset = 0;
  for (int r = 0; r < gj->nrec; r++) {
    if (grads_out_dtype(run, gj->rec[r]) == L2L_F32) continue;
    l2l_tensor *out = NULL;
    l2l_status status =
        slot_view(&out, s, s->gout_slot[s->gs], &offset, gj->rec[r], SLOT_GRADS_OUT);
    if (status == L2L_OK) status = l2l_tensor_cast(out, gj->grad[r]);
    l2l_tensor_free(gj->grad[r]);
    gj->grad[r] = out;
    gj->drains = false;
    if (status != L2L_OK) {
      grads_release(&gj->job);
      return status;
    }
  }
  gj->job.run = grads_run;
  s->gout[s->gs] = gj;
  copy_thread_push(&run->d2h, &gj->job);
  return L2L_OK;
}

/* ---------------------------------------------------------------- activations */

/* Starts bringing a[u] to the device if it is only on the host. */
static l2l_status act_prefetch(struct step *s, struct act *a, int layer, int64_t u) {
  if (a->dev != NULL || a->in != NULL || a->host == NULL) return L2L_OK;
  l2l_tensor *dev = NULL;
  TRY(tensor_like(&dev, L2L_POOL_DEVICE, a->host));
  l2l_status status = copy_queue(&a->in, s->run, &s->run->h2d, dev, a->host, layer, (int)u,
                                 L2L_PHASE_STASH_IN);
  if (status != L2L_OK) l2l_tensor_free(dev);
  return status;
}

/* a[u] on the device, waiting for its copy if need be. */
static l2l_status act_on_device(struct step *s, struct act *a, int layer, int64_t u,
                                l2l_tensor **out) {
  TRY(act_prefetch(s, a, layer, u));
  if (a->in) {
    l2l_status status = copy_wait(s, &a->in->job, &a->in->done, layer, (int)u);
    a->dev = a->in->dst;
    copy_job_free(a->in);
    a->in = NULL;
    TRY(status);
  }
  if (a->dev == NULL) return FAIL(L2L_ERR_STATE, "layer %d, micro-batch %lld: an input is missing (relay bug)",
                                  layer, (long long)u);
  *out = a->dev;
  return L2L_OK;
}

/* The device copy of a[u] is no longer needed (the host copy, if any, stays). */
static void act_release_device(struct act *a) {
  l2l_tensor_free(a->dev);
  a->dev = NULL;
}

/* Retires the oldest stash-outs until at most `keep` are in flight: each one's device
   tensor is freed once it is copied, so no more than two micro-batches of a host-stashed
   boundary wait on the device. */
static l2l_status out_throttle(struct step *s, int keep) {
  while ((s->out[0] != NULL) + (s->out[1] != NULL) > keep) {
    double t0 = l2l_now();
    l2l_status status = l2l_job_wait(&s->out[0]->job);
    s->wait_copy += l2l_now() - t0;
    l2l_tensor_free(s->out[0]->src);
    copy_job_free(s->out[0]);
    s->out[0] = s->out[1];
    s->out[1] = NULL;
    TRY(status);
  }
  return L2L_OK;
}

/* Sends a[u]'s device tensor to a new host stash; the device tensor goes when copied. */
static l2l_status act_stash_out(struct step *s, struct act *a, int layer, int64_t u) {
  TRY(out_throttle(s, 1));
  l2l_tensor *host = NULL;
  TRY(tensor_like(&host, L2L_POOL_PINNED, a->dev));
  struct copy_job *cj = NULL;
  l2l_status status = copy_queue(&cj, s->run, &s->run->d2h, host, a->dev, layer, (int)u,
                                 L2L_PHASE_STASH_OUT);
  if (status != L2L_OK) {
    l2l_tensor_free(host);
    return status;
  }
  count_stash(s->run, (int64_t)l2l_pool_accounted(tensor_bytes(host)));
  a->host = host;
  a->dev = NULL;
  s->out[s->out[0] ? 1 : 0] = cj;
  return L2L_OK;
}

/* ---------------------------------------------------------------- one micro-batch's inputs */

struct mb_inputs {
  l2l_tensor *tokens, *types, *targets, *mask;
  l2l_layer_batch batch;
};

/* Samples in micro-batch u (the last may be smaller). */
static int64_t mb_rows(const struct step *s, int64_t u) {
  int64_t first = u * s->mb;
  return s->mb < s->B - first ? s->mb : s->B - first;
}

/* Micro-batch u's rows of a host tensor copied to the device (small: ids and masks). */
static l2l_status rows_to_device(struct step *s, l2l_tensor **out, const l2l_tensor *t, int64_t u) {
  if (t == NULL) return L2L_OK;
  l2l_tensor *view = NULL;
  TRY(l2l_tensor_view_rows(&view, t, u * s->mb, mb_rows(s, u)));
  l2l_status status = tensor_like(out, L2L_POOL_DEVICE, view);
  if (status == L2L_OK) status = l2l_tensor_copy(*out, view);
  if (status == L2L_OK) count_bytes(s->run, &s->run->h2d_bytes, tensor_bytes(view));
  l2l_tensor_free(view);
  return status;
}

static void mb_inputs_free(struct mb_inputs *m) {
  l2l_tensor_free(m->tokens);
  l2l_tensor_free(m->types);
  l2l_tensor_free(m->targets);
  l2l_tensor_free(m->mask);
  memset(m, 0, sizeof *m);
}

static l2l_status mb_inputs(struct step *s, struct mb_inputs *m, int k, int64_t u, bool training) {
  memset(m, 0, sizeof *m);
  l2l_layer_kind kind = kind_of(active_layer(s, k)->layer);
  l2l_status status = L2L_OK;
  if (kind == L2L_LAYER_EMBEDDING) {
    status = rows_to_device(s, &m->tokens, s->in->tokens, u);
    if (status == L2L_OK) status = rows_to_device(s, &m->types, s->in->token_types, u);
  } else if (kind == L2L_LAYER_LM_HEAD || kind == L2L_LAYER_CLASSIFIER) {
    status = rows_to_device(s, &m->targets, s->in->targets, u);
  } else {
    status = rows_to_device(s, &m->mask, s->in->key_mask, u);
  }
  if (status != L2L_OK) {
    mb_inputs_free(m);
    return status;
  }
  m->batch = (l2l_layer_batch){.tokens = m->tokens, .token_types = m->types,
                               .targets = m->targets, .key_mask = m->mask,
                               .first_sample = u * s->mb, .seed = s->run->config.seed,
                               .step = (uint64_t)s->run->steps, .training = training,
                               .loss_scale = s->loss_scale};
  return L2L_OK;
}

static l2l_status new_activation(struct step *s, l2l_tensor **out, int64_t u) {
  int64_t shape[3] = {mb_rows(s, u), s->S, s->D};
  return l2l_tensor_new(out, L2L_POOL_DEVICE, L2L_F32, 3, shape);
}

/* Layer calls on this thread since `start`: compute, timed on the device's clock. */
static void compute_done(struct step *s, int layer, int64_t u, int phase,
                         struct l2l_stamp *start) {
  struct l2l_stamp end;
  l2l_device_stamp(&end);
  stamped_add(s, start, &end, layer, (int)u, phase);
}

/* ---------------------------------------------------------------- visits */

/* Forward (or rebuild) of active layer k over every micro-batch: x[k] -> x[k+1]. */
static l2l_status visit_forward(struct step *s, int k, bool rebuild) {
  struct relay_layer *rl = active_layer(s, k);
  int li = s->active[k];
  bool keep = !rebuild && s->training && rl->inner != L2L_INNER_RECOMPUTE && k >= s->lowest;
  /* Whether x[k] is read again (by its backward or a rebuild), and whether it then waits
     on the device (stash device, or rebuilt for the backward) rather than on the host. */
  bool input_needed = rebuild ? s->training && rl->inner == L2L_INNER_RECOMPUTE && k >= s->lowest
                              : s->reread[k];
  bool input_home_device = rl->stash == L2L_STASH_DEVICE || (rebuild && s->rebuilt[k]);
  /* The output boundary: host-stashed in forward when its policy says so (never when
     rebuilding: rebuilt boundaries stay on the device until their backward). */
  bool out_host = !rebuild && active_layer(s, k + 1)->stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < s->nmb; u++) {
    l2l_tensor *x = NULL, *y = NULL;
    if (k > 0) {
      if (u + 1 < s->nmb) TRY(act_prefetch(s, &s->x[k][u + 1], li, u + 1));
      TRY(act_on_device(s, &s->x[k][u], li, u, &x));
    }
    struct mb_inputs m;
    TRY(mb_inputs(s, &m, k, u, s->training));
    l2l_status status = new_activation(s, &y, u);
    if (status != L2L_OK) {
      mb_inputs_free(&m);
      return status;
    }
    s->x[k + 1][u].dev = y;
    l2l_saved **saved = keep ? &s->saved[k][u] : NULL;
    struct l2l_stamp t0;
    l2l_device_stamp(&t0);
    status = l2l_layer_forward(saved, rl->layer, y, x, &m.batch);
    compute_done(s, li, u, rebuild ? L2L_PHASE_REBUILD : L2L_PHASE_FORWARD, &t0);
    mb_inputs_free(&m);
    if (status != L2L_OK) {
      char message[256];
      snprintf(message, sizeof message, "%s", l2l_last_error());
      return l2l_fail(status, "layer %d (%s), micro-batch %lld: %s", li,
                      l2l_layer_name(rl->layer), (long long)u, message);
    }
    if (keep && rl->inner == L2L_INNER_SWAP) {
      TRY(swap_queue(s->run, &s->run->d2h, &s->swap[k][u], s->saved[k][u], L2L_POOL_PINNED, li, u));
      s->where[k][u] = 1;
    }
    /* The input: freed when nobody reads it again; else its device copy goes unless the
       device is where it waits (a host stash stays; a dropped one is rebuilt later). */
    if (k > 0) {
      if (!input_needed || (!input_home_device && rl->stash == L2L_STASH_RECOMPUTE))
        act_free(s->run, &s->x[k][u]);
      else if (!input_home_device)
        act_release_device(&s->x[k][u]);
    }
    if (out_host) TRY(act_stash_out(s, &s->x[k + 1][u], li, u));
  }
  /* A swap finishes before the visit's end: its device bytes then are free. */
  if (keep && rl->inner == L2L_INNER_SWAP)
    for (int64_t u = 0; u < s->nmb; u++) TRY(swap_wait(&s->wait_copy, &s->swap[k][u]));
  return out_throttle(s, 0);
}

/* The head: forward of each micro-batch, its loss, and (training) its backward at once. */
static l2l_status visit_head(struct step *s, int k) {
  struct relay_layer *rl = active_layer(s, k);
  int li = s->active[k];
  bool backward = s->training && s->lowest < s->L;
  bool keep_dx = backward && k > s->lowest;   /* a layer below wants the gradient */
  bool grad_host = rl->stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < s->nmb; u++) {
    l2l_tensor *x = NULL, *losses = NULL, *dx = NULL;
    if (u + 1 < s->nmb) TRY(act_prefetch(s, &s->x[k][u + 1], li, u + 1));
    TRY(act_on_device(s, &s->x[k][u], li, u, &x));
    struct mb_inputs m;
    TRY(mb_inputs(s, &m, k, u, s->training));
    int64_t lshape[2] = {mb_rows(s, u), s->S};
    bool lm = kind_of(rl->layer) == L2L_LAYER_LM_HEAD;
    l2l_saved *saved = NULL;
    double loss = 0;
    l2l_status status = l2l_tensor_new(&losses, L2L_POOL_DEVICE, L2L_F32, lm ? 2 : 1, lshape);
    if (status == L2L_OK && backward) status = new_activation(s, &dx, u);
    struct l2l_stamp t0;
    l2l_device_stamp(&t0);
    if (status == L2L_OK)
      status = l2l_layer_forward(backward ? &saved : NULL, rl->layer, losses, x, &m.batch);
    if (status == L2L_OK) status = l2l_sum(&loss, losses);
    if (status == L2L_OK && backward) status = l2l_layer_backward(rl->layer, dx, NULL, saved, &m.batch);
    compute_done(s, li, u, backward ? L2L_PHASE_BACKWARD : L2L_PHASE_FORWARD, &t0);
    l2l_saved_free(saved);
    l2l_tensor_free(losses);
    mb_inputs_free(&m);
    if (status != L2L_OK) {
      l2l_tensor_free(dx);
      return status;
    }
    s->loss_sum += loss;
    act_free(s->run, &s->x[k][u]);
    if (keep_dx) {
      s->g[k][u].dev = dx;
      if (grad_host) TRY(act_stash_out(s, &s->g[k][u], li, u));
    } else {
      l2l_tensor_free(dx);
    }
  }
  return out_throttle(s, 0);
}

/* Backward of active layer k over every micro-batch: g[k+1] -> g[k], gradients summed
   over micro-batches on the device. */
static l2l_status visit_backward(struct step *s, int k) {
  struct relay_layer *rl = active_layer(s, k);
  int li = s->active[k];
  bool recompute = rl->inner == L2L_INNER_RECOMPUTE;
  bool keep_dx = k > s->lowest;    /* a layer below wants the gradient */
  bool grad_host = k > 0 && rl->stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < s->nmb; u++) {
    l2l_tensor *x = NULL, *dy = NULL, *dx = NULL, *scratch = NULL;
    if (u + 1 < s->nmb) {
      TRY(act_prefetch(s, &s->g[k + 1][u + 1], li, u + 1));
      if (recompute && k > 0) TRY(act_prefetch(s, &s->x[k][u + 1], li, u + 1));
    }
    TRY(act_on_device(s, &s->g[k + 1][u], li, u, &dy));
    /* A swapped state comes back one micro-batch ahead of its use. */
    for (int64_t v = u; v < s->nmb && v <= u + 1; v++)
      if (s->where[k][v]) {
        TRY(swap_queue(s->run, &s->run->h2d, &s->swap[k][v], s->saved[k][v], L2L_POOL_DEVICE, li, v));
        s->where[k][v] = 0;
      }
    TRY(swap_wait(&s->wait_copy, &s->swap[k][u]));
    l2l_saved *saved = s->saved[k][u];
    struct mb_inputs m;
    TRY(mb_inputs(s, &m, k, u, true));
    l2l_status status = L2L_OK;
    if (recompute) {
      if (k > 0) status = act_on_device(s, &s->x[k][u], li, u, &x);
      if (status == L2L_OK) status = new_activation(s, &scratch, u);
    }
    if (status == L2L_OK && k > 0) status = new_activation(s, &dx, u);
    struct l2l_stamp t0;
    l2l_device_stamp(&t0);
    if (status == L2L_OK && recompute)
      status = l2l_layer_forward(&saved, rl->layer, scratch, x, &m.batch);
    if (status == L2L_OK)
      status = l2l_layer_backward(rl->layer, dx, dy, saved, &m.batch);
    compute_done(s, li, u, L2L_PHASE_BACKWARD, &t0);
    mb_inputs_free(&m);
    l2l_saved_free(saved);
    s->saved[k][u] = NULL;
    l2l_tensor_free(scratch);
    if (status != L2L_OK) {
      l2l_tensor_free(dx);
      return status;
    }
    act_free(s->run, &s->g[k + 1][u]);
    if (k > 0) act_free(s->run, &s->x[k][u]);
    if (keep_dx) {
      s->g[k][u].dev = dx;
      if (grad_host) TRY(act_stash_out(s, &s->g[k][u], li, u));
    } else {
      l2l_tensor_free(dx);
    }
  }
  return out_throttle(s, 0);
}

/* ---------------------------------------------------------------- a step */

static l2l_status check_async(l2l_relay *run) {
  pthread_mutex_lock(&run->lock);
  l2l_status status = run->async_status;
  char message[256];
  snprintf(message, sizeof message, "%s", run->async_message);
  run->async_status = L2L_OK;
  pthread_mutex_unlock(&run->lock);
  return status == L2L_OK ? L2L_OK : l2l_fail(status, "%s", message);
}

/* Starts bringing in what a visit's first micro-batch reads from the host stash. */
static l2l_status visit_prefetch(struct step *s, const struct visit *v) {
  int li = s->active[v->k];
  bool reads_input = v->kind != V_BACKWARD ||
                     active_layer(s, v->k)->inner == L2L_INNER_RECOMPUTE;
  if (v->kind == V_BACKWARD) TRY(act_prefetch(s, &s->g[v->k + 1][0], li, 0));
  if (reads_input && v->k > 0) TRY(act_prefetch(s, &s->x[v->k][0], li, 0));
  return L2L_OK;
}

static l2l_status run_visits(struct step *s) {
  TRY(slots_new(s));
  /* 16-bit staging copies from the masters as they are now (a script may have edited
     them since the last step), each behind its record's pending update */
  if (s->run->config.precision != L2L_F32) l2l_eps_stage(&s->run->eps);
  if (s->nvisits > 0) TRY(params_queue(s, 0, s->visits[0].k));
  for (int i = 0; i < s->nvisits; i++) {
    const struct visit *v = &s->visits[i];
    s->gs = i % 2;
    /* The next visit's parameters copy in while this one computes, behind this visit's
       first input: one copy thread serves both, and a layer's parameters take far longer
       than a micro-batch's activations. */
    TRY(visit_prefetch(s, v));
    if (i + 1 < s->nvisits) TRY(params_queue(s, 1, s->visits[i + 1].k));
    struct relay_layer *rl = active_layer(s, v->k);
    bool grads = s->training && (v->kind == V_BACKWARD || (v->kind == V_HEAD && s->lowest < s->L));
    TRY(params_bind(s, v->k, grads));
    switch (v->kind) {
      case V_FORWARD: TRY(visit_forward(s, v->k, false)); break;
      case V_REBUILD: TRY(visit_forward(s, v->k, true)); break;
      case V_HEAD: TRY(visit_head(s, v->k)); break;
      case V_BACKWARD: TRY(visit_backward(s, v->k)); break;
    }
    TRY(params_done(s, v->k, grads && !rl->frozen));
  }
  grads_wait(s, 0);
  grads_wait(s, 1);
  return L2L_OK;
}

static l2l_status relay_run(double *loss, l2l_relay *run, const l2l_relay_batch *batch,
                            bool training) {
  if (loss == NULL) return FAIL(L2L_ERR_INVALID, "loss is NULL");
  if (!relay_ok(run)) return FAIL(L2L_ERR_INVALID, "run is not a live relay");
  /* Updates of the last step may still run (each layer's forward waits for its own);
     its gradient arrivals must be counted before this step's bookkeeping starts. */
  l2l_eps_wait_arrivals(&run->eps);
  TRY(check_async(run));
  struct step s = {.run = run, .in = batch, .training = training};
  l2l_status status = check_step(&s, batch);
  if (status == L2L_OK) status = plan_visits(&s);
  if (status == L2L_OK) status = step_alloc(&s);
  if (status != L2L_OK) {
    step_free(&s);
    return status;
  }
  const l2l_relay_config *c = &run->config;
  bool update = training && (run->steps + 1) % c->accumulate == 0;
  double lr = 0;
  if (update) {
    status = l2l_schedule_lr(&lr, &c->schedule, c->optimizer.lr, run->updates + 1);
    if (status != L2L_OK) {
      step_free(&s);
      return status;
    }
  }
  /* The loss gradient's seed: the mean over the minibatch's real targets (and over the
     accumulation), times the dynamic loss scale. The scale changes only at an update, so
     every minibatch of an accumulation has the same. */
  double dynamic = c->loss_scale > 0 ? run->scale : 1.0;
  s.loss_scale = (float)(dynamic / ((double)s.real * c->accumulate));
  s.clip_layer = (float)(c->clip_layer_norm * dynamic);

  /* Which records expect gradients this step: one arrival per trainable visit. Global
     clipping and loss scaling need every gradient before any update. */
  bool defer = update && (c->clip_global_norm > 0 || c->loss_scale > 0);
  if (training) {
    l2l_eps_begin_step(&run->eps, update, defer, lr);
    for (int k = s.lowest; k < s.L; k++) {
      struct relay_layer *rl = active_layer(&s, k);
      if (rl->frozen) continue;
      for (int r = 0; r < l2l_layer_param_count(rl->layer); r++)
        l2l_eps_expect(&run->eps, l2l_eps_find(&run->eps, l2l_layer_param(rl->layer, r)));
    }
    status = l2l_eps_prepare(&run->eps);
    if (status != L2L_OK) {
      l2l_eps_begin_step(&run->eps, false, false, 0);
      step_free(&s);
      return status;
    }
  }

  l2l_timeline_reset(&run->timeline);
  pthread_mutex_lock(&run->lock);
  run->h2d_bytes = run->d2h_bytes = 0;
  run->stash_peak = run->stash_now;
  pthread_mutex_unlock(&run->lock);
  l2l_pool_reset_peak(L2L_POOL_DEVICE);

  double t0 = l2l_now();
  l2l_device_stamp_anchor(&s.anchor);
  status = run_visits(&s);
  double norm = -1;
  bool applied = update;
  if (status == L2L_OK && defer) {
    /* run_visits waited for every gradient job, so every gradient has been given. */
    status = check_async(run);
    if (status == L2L_OK)
      applied = l2l_eps_release_updates(&run->eps, c->clip_global_norm, 1.0 / dynamic, &norm);
  }
  step_free(&s);   /* drains the copy threads: every gradient has been given */
  if (status == L2L_OK) status = check_async(run);
  if (status != L2L_OK) {
    if (training) l2l_eps_abandon_step(&run->eps);
    return status;
  }

  *loss = s.loss_sum / (double)s.real;
  if (training) {
    run->steps++;
    if (applied) run->updates++;
  }
  if (update && c->loss_scale > 0) {
    if (!applied) {
      run->scale = fmax(run->scale / 2, MIN_LOSS_SCALE);
      run->scale_good = 0;
      run->skipped++;
    } else if (++run->scale_good >= c->loss_scale_window) {
      run->scale = fmin(run->scale * 2, MAX_LOSS_SCALE);
      run->scale_good = 0;
    }
  }
  l2l_relay_stats *st = &run->stats;
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  st->steps = run->steps;
  st->updates = run->updates;
  st->loss = *loss;
  if (applied) st->lr = lr;
  st->loss_scale = c->loss_scale > 0 ? run->scale : 0;
  st->loss_scale_good = run->scale_good;
  st->skipped_updates = run->skipped;
  st->overflow = update && !applied;
  st->grad_norm = norm;
  st->updates_deferred = defer;
  st->device_peak = device.peak;
  st->device_current = device.current;
  st->step_seconds = l2l_now() - t0;
  st->compute_seconds = s.compute;
  st->wait_copy_seconds = s.wait_copy;
  st->exposed_copy_seconds = s.exposed_copy;
  st->wait_update_seconds = s.wait_update;
  pthread_mutex_lock(&run->lock);
  st->h2d_bytes = run->h2d_bytes;
  st->d2h_bytes = run->d2h_bytes;
  st->host_stash_peak = run->stash_peak;
  pthread_mutex_unlock(&run->lock);
  return L2L_OK;
}

l2l_status l2l_relay_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch) {
  return relay_run(loss, run, batch, true);
}

l2l_status l2l_relay_evaluate(double *loss, l2l_relay *run, const l2l_relay_batch *batch) {
  return relay_run(loss, run, batch, false);
}

/* ---------------------------------------------------------------- the relay object */

void l2l_relay_config_default(l2l_relay_config *out) {
  if (out == NULL) return;
  *out = (l2l_relay_config){
      .micro_batch = 1, .stash = L2L_STASH_HOST, .recompute_every = 1,
      .inner = L2L_INNER_RECOMPUTE,
      .optimizer = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                    .eps = 1e-8f, .weight_decay = 0.01f},
      .schedule = {.kind = L2L_SCHEDULE_CONSTANT, .final_ratio = 1.0f},
      .accumulate = 1, .param_slots = 2,
      /* a GPU runs 16-bit products at many times its fp32 rate; a CPU gains nothing */
      .precision = l2l_device_is_host() ? L2L_F32 : L2L_BF16};
}

static l2l_status check_config(const l2l_relay_config *c) {
  if (c == NULL) return FAIL(L2L_ERR_INVALID, "config is NULL");
  if (c->micro_batch < 1)
    return FAIL(L2L_ERR_INVALID, "config->micro_batch must be >= 1, got %lld", (long long)c->micro_batch);
  if (c->stash < L2L_STASH_DEVICE || c->stash > L2L_STASH_RECOMPUTE)
    return FAIL(L2L_ERR_INVALID, "config->stash must be device (0), host (1) or recompute (2), got %d", c->stash);
  if (c->recompute_every < 1)
    return FAIL(L2L_ERR_INVALID, "config->recompute_every must be >= 1, got %d", c->recompute_every);
  if (c->inner < L2L_INNER_RECOMPUTE || c->inner > L2L_INNER_SWAP)
    return FAIL(L2L_ERR_INVALID, "config->inner must be recompute (0), keep (1) or swap (2), got %d", c->inner);
  TRY(l2l_optimizer_check(&c->optimizer));
  TRY(l2l_schedule_check(&c->schedule));
  if (!(c->clip_global_norm >= 0) || !isfinite(c->clip_global_norm))
    return FAIL(L2L_ERR_INVALID, "config->clip_global_norm must be finite and >= 0, got %g", c->clip_global_norm);
  if (!(c->clip_layer_norm >= 0) || !isfinite(c->clip_layer_norm))
    return FAIL(L2L_ERR_INVALID, "config->clip_layer_norm must be finite and >= 0, got %g", c->clip_layer_norm);
  if (c->accumulate < 1)
    return FAIL(L2L_ERR_INVALID, "config->accumulate must be >= 1, got %d", c->accumulate);
  if (c->optimizer_threads < 0 || c->optimizer_threads > 1024)
    return FAIL(L2L_ERR_INVALID, "config->optimizer_threads must be 0 to 1024, got %d", c->optimizer_threads);
  if (!(c->loss_scale >= 0) || !isfinite(c->loss_scale) ||
      (c->loss_scale > 0 && (c->loss_scale < MIN_LOSS_SCALE || c->loss_scale > MAX_LOSS_SCALE)))
    return FAIL(L2L_ERR_INVALID, "config->loss_scale must be 0 (off) or 2^-64 to 2^100, got %g",
                c->loss_scale);
  if (c->loss_scale_window < 0)
    return FAIL(L2L_ERR_INVALID, "config->loss_scale_window must be >= 0, got %d",
                c->loss_scale_window);
  if (c->param_slots < 0 || c->param_slots == 1 || c->param_slots > MAX_PARAM_SLOTS)
    return FAIL(L2L_ERR_INVALID, "config->param_slots must be 0 (two) or 2 to %d, got %d",
                MAX_PARAM_SLOTS, c->param_slots);
  if (c->precision != L2L_F32 && c->precision != L2L_F16 && c->precision != L2L_BF16)
    return FAIL(L2L_ERR_INVALID, "config->precision must be f32 (%d), f16 (%d) or bf16 (%d), got %d",
                L2L_F32, L2L_F16, L2L_BF16, (int)c->precision);
  if (c->grad_precision != L2L_F32 && c->grad_precision != L2L_F16 && c->grad_precision != L2L_BF16)
    return FAIL(L2L_ERR_INVALID, "config->grad_precision must be f32 (%d), f16 (%d) or bf16 (%d), got %d",
                L2L_F32, L2L_F16, L2L_BF16, (int)c->grad_precision);
  if (c->grad_precision == L2L_F16 && c->loss_scale == 0)
    return FAIL(L2L_ERR_INVALID, "config->grad_precision f16 needs loss_scale > 0 (f16 gradients "
                "flush below 6e-8 and turn inf above 65504: loss scaling keeps them in range and "
                "skips a step that overflows)");
  return L2L_OK;
}

/* The policy of boundary `index` (the input of that layer) by the config's default. */
static l2l_stash_policy default_stash(const l2l_relay_config *c, int index) {
  if (c->stash != L2L_STASH_RECOMPUTE) return c->stash;
  return index % c->recompute_every == 0 ? L2L_STASH_DEVICE : L2L_STASH_RECOMPUTE;
}

static l2l_status check_layer(const l2l_relay *run, const l2l_layer *layer, int replacing) {
  if (l2l_layer_param_count(layer) < 0) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  for (int i = 0; i < run->count; i++)
    if (run->layers[i].layer == layer && i != replacing)
      return FAIL(L2L_ERR_INVALID, "the layer is already in the relay (position %d)", i);
  const void *owner = l2l_layer_owner(layer);
  if (owner != NULL && owner != run)
    return FAIL(L2L_ERR_STATE, "the layer is in another relay (remove it there first)");
  l2l_layer_config c, other;
  l2l_layer_get_config(&c, layer);
  for (int i = 0; i < run->count; i++) {
    if (i == replacing) continue;
    l2l_layer_get_config(&other, run->layers[i].layer);
    if (other.dim != c.dim)
      return FAIL(L2L_ERR_INVALID, "the layer has dim %lld but layer %d of the relay has dim %lld",
                  (long long)c.dim, i, (long long)other.dim);
    break;
  }
  for (int r = 0; r < l2l_layer_param_count(layer); r++) {
    const l2l_tensor *v = l2l_param_value(l2l_layer_param(layer, r));
    if (l2l_tensor_pool(v) != L2L_POOL_HOST)
      return FAIL(L2L_ERR_INVALID, "the layer's parameter '%s' is in pool '%s': a relay's layers "
                  "keep their parameters in the host pool (the EPS)",
                  l2l_param_name(l2l_layer_param(layer, r)),
                  l2l_pool_name((l2l_pool_kind)l2l_tensor_pool(v)));
  }
  return L2L_OK;
}

static l2l_status grow(l2l_relay *run) {
  if (run->count < run->cap) return L2L_OK;
  int cap = run->cap ? 2 * run->cap : 16;
  struct relay_layer *layers = realloc(run->layers, (size_t)cap * sizeof *layers);
  if (layers == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for the relay's layer list");
  run->layers = layers;
  run->cap = cap;
  return L2L_OK;
}

/* A layer's records join the EPS, or leave it. */
static l2l_status eps_join(l2l_relay *run, l2l_layer *layer) {
  l2l_param *params[MAX_RECORDS];
  bool low_precision[MAX_RECORDS];
  int n = l2l_layer_param_count(layer);
  for (int r = 0; r < n; r++) {
    params[r] = l2l_layer_param(layer, r);
    low_precision[r] = l2l_param_low_precision(params[r]);
  }
  return l2l_eps_add_records(&run->eps, params, low_precision, n);
}

static void eps_leave(l2l_relay *run, l2l_layer *layer) {
  l2l_param *params[MAX_RECORDS];
  int n = l2l_layer_param_count(layer);
  for (int r = 0; r < n; r++) params[r] = l2l_layer_param(layer, r);
  l2l_eps_remove_records(&run->eps, params, n);
}

static l2l_status insert_at(l2l_relay *run, int index, l2l_layer *layer) {
  TRY(grow(run));
  TRY(eps_join(run, layer));
  l2l_layer_set_owner(layer, run);
  memmove(&run->layers[index + 1], &run->layers[index],
          (size_t)(run->count - index) * sizeof *run->layers);
  run->layers[index] = (struct relay_layer){.layer = layer, .frozen = false,
                                            .stash = default_stash(&run->config, index),
                                            .inner = run->config.inner};
  run->count++;
  return L2L_OK;
}

l2l_status l2l_relay_new(l2l_relay **out, l2l_layer *const *layers, int nlayers,
                         const l2l_relay_config *config) {
  l2l_runtime_init();
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY(check_config(config));
  if (nlayers < 0 || (nlayers > 0 && layers == NULL))
    return FAIL(L2L_ERR_INVALID, "layers must list nlayers >= 0 layers, got %d", nlayers);
  l2l_relay *run = calloc(1, sizeof *run);
  if (run == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a relay");
  run->config = *config;
  if (run->config.param_slots == 0) run->config.param_slots = 2;
  if (run->config.loss_scale_window == 0) run->config.loss_scale_window = 2000;
  run->scale = run->config.loss_scale;
  run->stats.loss_scale = run->scale;
  pthread_mutex_init(&run->lock, NULL);
  l2l_timeline_init(&run->timeline);
  run->stats.grad_norm = -1;
  int threads = config->optimizer_threads;
  if (threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores > 0 ? (int)cores : 1;
  }
  bool eps_up = false, h2d_up = false, d2h_up = false;
  l2l_status status = l2l_eps_init(&run->eps, &config->optimizer, config->precision, threads,
                                   &run->timeline);
  eps_up = status == L2L_OK;
  if (status == L2L_OK) status = l2l_queue_start(&run->h2d, 1, THREAD_H2D, "host-to-device copy");
  h2d_up = status == L2L_OK;
  if (status == L2L_OK) status = l2l_queue_start(&run->d2h, 1, THREAD_D2H, "device-to-host copy");
  d2h_up = status == L2L_OK;
  run->magic = RELAY_MAGIC;
  for (int i = 0; i < nlayers && status == L2L_OK; i++) {
    status = check_layer(run, layers[i], -1);
    if (status == L2L_OK) status = insert_at(run, run->count, layers[i]);
    if (status != L2L_OK) {
      char message[256];
      snprintf(message, sizeof message, "%s", l2l_last_error());
      status = l2l_fail(status, "layers[%d]: %s", i, message);
    }
  }
  if (status != L2L_OK) {
    if (d2h_up && h2d_up && eps_up) {
      l2l_relay_free(run);
    } else {
      if (h2d_up) l2l_queue_stop(&run->h2d);
      if (eps_up) l2l_eps_free(&run->eps);
      free(run);
    }
    return status;
  }
  *out = run;
  return L2L_OK;
}

void l2l_relay_free(l2l_relay *run) {
  if (!relay_ok(run)) return;
  l2l_queue_stop(&run->h2d);
  l2l_queue_stop(&run->d2h);
  l2l_eps_free(&run->eps);
  for (int i = 0; i < run->count; i++) l2l_layer_set_owner(run->layers[i].layer, NULL);
  pthread_mutex_destroy(&run->lock);
  l2l_timeline_free(&run->timeline);
  free(run->layers);
  run->magic = 0;
  free(run);
}

int l2l_relay_layer_count(const l2l_relay *run) { return relay_ok(run) ? run->count : -1; }

l2l_layer *l2l_relay_layer(const l2l_relay *run, int index) {
  if (!relay_ok(run) || index < 0 || index >= run->count) return NULL;
  return run->layers[index].layer;
}

#define CHECK_RUN(run)                                                             \
  do {                                                                             \
    if (!relay_ok(run)) return FAIL(L2L_ERR_INVALID, "run is not a live relay");   \
  } while (0)
#define CHECK_INDEX(index, lo, hi, what)                                                   \
  do {                                                                                     \
    if ((index) < (lo) || (index) > (hi))                                                  \
      return FAIL(L2L_ERR_INVALID, what " must be %d to %d, got %d", (lo), (hi), (index)); \
  } while (0)

l2l_status l2l_relay_insert(l2l_relay *run, int index, l2l_layer *layer) {
  CHECK_RUN(run);
  CHECK_INDEX(index, 0, run->count, "index");
  TRY(check_layer(run, layer, -1));
  l2l_eps_sync(&run->eps);
  return insert_at(run, index, layer);
}

l2l_status l2l_relay_remove(l2l_relay *run, int index) {
  CHECK_RUN(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  l2l_eps_sync(&run->eps);
  eps_leave(run, run->layers[index].layer);
  l2l_layer_set_owner(run->layers[index].layer, NULL);
  memmove(&run->layers[index], &run->layers[index + 1],
          (size_t)(run->count - index - 1) * sizeof *run->layers);
  run->count--;
  return L2L_OK;
}

l2l_status l2l_relay_replace(l2l_relay *run, int index, l2l_layer *layer) {
  CHECK_RUN(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  TRY(check_layer(run, layer, index));
  l2l_eps_sync(&run->eps);
  /* The new layer's records join before the old one's leave: records they share keep
     their state. */
  struct relay_layer old = run->layers[index];
  TRY(eps_join(run, layer));
  eps_leave(run, old.layer);
  l2l_layer_set_owner(old.layer, NULL);
  l2l_layer_set_owner(layer, run);
  run->layers[index].layer = layer;
  run->layers[index].frozen = false;
  return L2L_OK;
}

l2l_status l2l_relay_set_frozen(l2l_relay *run, int index, int frozen) {
  CHECK_RUN(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  if (frozen != 0 && frozen != 1) return FAIL(L2L_ERR_INVALID, "frozen must be 0 or 1, got %d", frozen);
  run->layers[index].frozen = frozen;
  return L2L_OK;
}

int l2l_relay_frozen(const l2l_relay *run, int index) {
  if (!relay_ok(run) || index < 0 || index >= run->count) return -1;
  return run->layers[index].frozen;
}

l2l_status l2l_relay_set_stash(l2l_relay *run, int boundary, l2l_stash_policy policy) {
  CHECK_RUN(run);
  if (run->count < 2) return FAIL(L2L_ERR_INVALID, "the relay has no boundary (fewer than 2 layers)");
  CHECK_INDEX(boundary, 1, run->count - 1, "boundary");
  if (policy < L2L_STASH_DEVICE || policy > L2L_STASH_RECOMPUTE)
    return FAIL(L2L_ERR_INVALID, "policy must be device (0), host (1) or recompute (2), got %d", policy);
  run->layers[boundary].stash = policy;
  return L2L_OK;
}

l2l_status l2l_relay_set_inner(l2l_relay *run, int index, l2l_inner_policy policy) {
  CHECK_RUN(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  if (policy < L2L_INNER_RECOMPUTE || policy > L2L_INNER_SWAP)
    return FAIL(L2L_ERR_INVALID, "policy must be recompute (0), keep (1) or swap (2), got %d", policy);
  run->layers[index].inner = policy;
  return L2L_OK;
}

int l2l_relay_stash(const l2l_relay *run, int boundary) {
  if (!relay_ok(run) || boundary < 1 || boundary >= run->count) return -1;
  return (int)run->layers[boundary].stash;
}

int l2l_relay_inner(const l2l_relay *run, int index) {
  if (!relay_ok(run) || index < 0 || index >= run->count) return -1;
  return (int)run->layers[index].inner;
}

l2l_status l2l_relay_set_micro_batch(l2l_relay *run, int64_t micro_batch) {
  CHECK_RUN(run);
  if (micro_batch < 1)
    return FAIL(L2L_ERR_INVALID, "micro_batch must be >= 1, got %lld", (long long)micro_batch);
  run->config.micro_batch = micro_batch;
  return L2L_OK;
}

l2l_status l2l_relay_sync(l2l_relay *run) {
  CHECK_RUN(run);
  l2l_queue_drain(&run->d2h);
  l2l_eps_sync(&run->eps);
  return check_async(run);
}

l2l_status l2l_relay_get_stats(l2l_relay_stats *out, const l2l_relay *run) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  CHECK_RUN(run);
  l2l_relay *r = (l2l_relay *)run;
  l2l_eps_sync(&r->eps);   /* optimizer time is complete only when the updates are */
  *out = run->stats;
  out->host_eps_bytes = l2l_eps_host_bytes(&run->eps);
  pthread_mutex_lock(&r->timeline.lock);
  out->events = run->timeline.count;
  out->optimizer_seconds = run->timeline.optimizer_seconds;
  out->h2d_seconds = run->timeline.copy_seconds[0];
  out->d2h_seconds = run->timeline.copy_seconds[1];
  pthread_mutex_unlock(&r->timeline.lock);
  return L2L_OK;
}

l2l_status l2l_relay_events(l2l_relay_event *out, const l2l_relay *run, int64_t first,
                            int64_t count) {
  CHECK_RUN(run);
  if (count == 0) return L2L_OK;
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  l2l_relay *r = (l2l_relay *)run;
  pthread_mutex_lock(&r->timeline.lock);
  int64_t n = run->timeline.count;
  bool ok = first >= 0 && count >= 0 && first <= n && count <= n - first;
  if (ok) memcpy(out, run->timeline.events + first, (size_t)count * sizeof *out);
  pthread_mutex_unlock(&r->timeline.lock);
  if (first < 0) return FAIL(L2L_ERR_INVALID, "first must be >= 0, got %lld", (long long)first);
  if (!ok)
    return FAIL(L2L_ERR_INVALID, "first %lld + count %lld goes past the %lld events of the last step",
                (long long)first, (long long)count, (long long)n);
  return L2L_OK;
}

l2l_status l2l_relay_param_state(l2l_tensor **out, l2l_relay *run, const l2l_param *param,
                                 int which) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  CHECK_RUN(run);
  if (which != 0 && which != 1) return FAIL(L2L_ERR_INVALID, "which must be 0 or 1, got %d", which);
  TRY(l2l_relay_sync(run));
  struct eps_record *rec = l2l_eps_find(&run->eps, param);
  if (rec == NULL) return FAIL(L2L_ERR_INVALID, "param is not a record of this relay's layers");
  *out = l2l_eps_state(rec, which);
  return L2L_OK;
}

/* ---------------------------------------------------------------- checkpoints */

l2l_status l2l_relay_param_updates(int64_t *out, l2l_relay *run, const l2l_param *param) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  CHECK_RUN(run);
  TRY(l2l_relay_sync(run));
  struct eps_record *rec = l2l_eps_find(&run->eps, param);
  if (rec == NULL) return FAIL(L2L_ERR_INVALID, "param is not a record of this relay's layers");
  *out = l2l_eps_updates(rec);
  return L2L_OK;
}

/* Every check comes before the first change, so a refused restore leaves the record as
   it was; the new state is allocated whole before the old one is freed. */
l2l_status l2l_relay_restore_param(l2l_relay *run, const l2l_param *param, int64_t updates,
                                   const l2l_tensor *first, const l2l_tensor *second) {
  CHECK_RUN(run);
  if (updates < 0) return FAIL(L2L_ERR_INVALID, "updates must be >= 0, got %lld", (long long)updates);
  TRY(l2l_relay_sync(run));
  struct eps_record *rec = l2l_eps_find(&run->eps, param);
  if (rec == NULL) return FAIL(L2L_ERR_INVALID, "param is not a record of this relay's layers");
  return l2l_eps_restore(__func__, &run->eps, rec, updates, first, second);
}

l2l_status l2l_relay_restore_loss_scale(l2l_relay *run, double scale, int64_t good,
                                        int64_t skipped) {
  CHECK_RUN(run);
  if (run->config.loss_scale == 0)
    return FAIL(L2L_ERR_STATE, "the relay does not scale its loss (config->loss_scale is 0)");
  if (!(scale >= MIN_LOSS_SCALE && scale <= MAX_LOSS_SCALE))
    return FAIL(L2L_ERR_INVALID, "scale must be 2^-64 to 2^100, got %g", scale);
  if (good < 0 || good >= run->config.loss_scale_window || skipped < 0)
    return FAIL(L2L_ERR_INVALID, "need 0 <= good < loss_scale_window (%d) and skipped >= 0, "
                "got good %lld, skipped %lld", run->config.loss_scale_window, (long long)good,
                (long long)skipped);
  TRY(l2l_relay_sync(run));
  run->scale = scale;
  run->scale_good = good;
  run->skipped = skipped;
  run->stats.loss_scale = scale;
  run->stats.loss_scale_good = good;
  run->stats.skipped_updates = skipped;
  return L2L_OK;
}

l2l_status l2l_relay_restore_progress(l2l_relay *run, int64_t steps, int64_t updates) {
  CHECK_RUN(run);
  if (steps < 0 || updates < 0 || updates > steps)
    return FAIL(L2L_ERR_INVALID, "need 0 <= updates <= steps, got steps %lld, updates %lld",
                (long long)steps, (long long)updates);
  TRY(l2l_relay_sync(run));
  run->steps = steps;
  run->updates = updates;
  run->stats.steps = steps;
  run->stats.updates = updates;
  return L2L_OK;
}
