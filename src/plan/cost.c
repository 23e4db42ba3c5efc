/* SPDX-License-Identifier: MIT */
/* cost.c — the predicted time of a training step under a policy.
 *
 * Purpose: the planner's objective. A step is the order's walk (src/order/walk.h),
 * executed here with acts that time instead of allocate, as peak.c's count bytes: each
 * visit has three channels that the relay runs at once: compute on the calling thread
 * (a forward per micro-batch; a backward, with the forward rerun first when the layer
 * recomputes; the head's forward and backward), copies in on the h2d thread (the next
 * visit's parameters unless a slot still holds them, and whatever the walk brings to the
 * device from the host: stashed inputs and gradients, swapped states coming back) and
 * copies out on the d2h thread (host stashes, swap-outs, the visit's gradients). A visit
 * costs the most of its channels, plus what the relay leaves exposed: the first visit's
 * parameters, the last stash-out and swap-out of a visit (each visit waits for them), a
 * fixed cost per visit, and the host optimizer's updates where backward no longer hides
 * them (the layers' updates run on the EPS workers as each gradient completes; the lowest
 * layer's comes last, and the next step's first visit waits for it; with global clipping
 * or loss scaling all of them wait for the end of backward).
 * Must never: count a copy the relay does not make (a slot reused, a boundary on the
 * device) or miss one it makes.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* ---------------------------------------------------------------- layer costs */

double plan_layer_flops(const l2l_layer *layer, int64_t rows, int64_t seq) {
  l2l_layer_config c;
  if (l2l_layer_get_config(&c, layer) != L2L_OK) return 0;
  double N = (double)rows * (double)seq, D = (double)c.dim, S = (double)seq;
  switch (c.kind) {
    case L2L_LAYER_BLOCK:   /* qkv, proj, the MLP's two maps; QK^T and PV */
      return 2 * N * (4 * D * D + 2 * D * (double)c.mlp) + 4 * (double)rows * S * S * D;
    case L2L_LAYER_LM_HEAD: return 2 * N * D * (double)c.vocab;
    case L2L_LAYER_CLASSIFIER: return 2 * (double)rows * D * (double)c.classes;
    case L2L_LAYER_EMBEDDING: return 2 * N * D;
    default: return 0;   /* a custom layer says nothing of its arithmetic: timed only */
  }
}

/* out[k] := the f32 bytes of the records whose first user is layer k (a record shared by
   layers, a tied head, counted there: layers_records). */
static l2l_status master_bytes_of(uint64_t *out, const struct plan_chain *c) {
  const l2l_layer **list = calloc((size_t)(c->L > 0 ? c->L : 1), sizeof *list);
  if (list == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  for (int k = 0; k < c->L; k++) list[k] = c->layers[k].layer, out[k] = 0;
  struct layers_record *recs = NULL;
  int n = 0;
  l2l_status status = layers_records(&recs, &n, list, NULL, c->L);
  free(list);
  TRY(status);
  for (int i = 0; i < n; i++)   /* (one on the device is updated there) */
    if (!(c->layers[recs[i].layer].on_device >> recs[i].place & 1))
      out[recs[i].layer] += (uint64_t)l2l_tensor_numel(param_value(recs[i].param)) * sizeof(float);
  free(recs);
  return L2L_OK;
}

/* Bytes a copy of a layer's records moves: each record's elements in its slot's dtype (a
   slot's alignment padding is not copied; nothing of a record on the device crosses). */
static uint64_t copied_bytes(const struct plan_layer *pl, enum order_slot_content content,
                             const struct plan_chain *c) {
  const l2l_layer *layer = pl->layer;
  uint64_t bytes = 0;
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    if (pl->on_device >> i & 1) continue;
    const l2l_param *p = l2l_layer_param(layer, i);
    bytes += (uint64_t)l2l_tensor_numel(param_value(p)) *
             l2l_dtype_size(order_slot_dtype(p, content, c->precision, c->grad_precision));
  }
  return bytes;
}

l2l_status plan_layer_costs(struct plan_layer_costs *out, const struct plan_chain *c,
                            const l2l_plan_rates *rates) {
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  int64_t nmb = (c->batch + mb - 1) / mb, last = c->batch - (nmb - 1) * mb;
  uint64_t *masters = malloc(sizeof *masters * (size_t)c->L);
  if (masters == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  l2l_status status = master_bytes_of(masters, c);
  for (int k = 0; k < c->L && status == L2L_OK; k++) {
    struct plan_layer_costs *o = &out[k];
    memset(o, 0, sizeof *o);
    const l2l_layer *layer = c->layers[k].layer;
    int64_t rows[2] = {mb, last};
    for (int i = 0; i < 2 && status == L2L_OK; i++) {
      if (rates->timed) {
        status = plan_time_layer(&o->fwd[i], &o->bwd[i], layer, rows[i], c->seq, c->precision);
      } else if (rates->flops > 0) {
        o->fwd[i] = plan_layer_flops(layer, rows[i], c->seq) / rates->flops;
        o->bwd[i] = 2 * o->fwd[i];
      }
      l2l_layer_memory m;
      layer_memory_in(&m, layer, rows[i], c->seq, c->precision, true);
      o->swap_bytes[i] = pool_accounted(m.saved) + pool_accounted(m.input_kept) +
                         pool_accounted(m.output_kept);   /* as the swap counts them */
    }
    o->param_bytes = copied_bytes(&c->layers[k], ORDER_SLOT_VALUES, c);
    o->grad_bytes = copied_bytes(
        &c->layers[k], c->grad_precision != L2L_F32 ? ORDER_SLOT_GRADS_OUT : ORDER_SLOT_GRADS, c);
    o->master_bytes = masters[k];
  }
  free(masters);
  return status;
}

/* ---------------------------------------------------------------- a step */

static double seconds_for(double bytes, double rate) { return rate > 0 ? bytes / rate : 0; }

/* A step timed by walking its order (src/order/walk.h) with acts that count: each
   act adds what it makes the relay do to the running visit's channels, so a copy is
   counted where, and only where, the relay makes it. Every micro-batch but the last (which
   may be smaller, and whose stash-outs the visit waits for) costs what the others cost, as
   each copy is counted once, whether it starts a micro-batch ahead or at its use: so two
   are walked, the first standing for all but the last, its counts weighed by as many: the
   same sums as a walk of them all, in a time independent of the batch. */
enum { TIMED_MICRO_BATCHES = 2 };

/* Where a boundary activation of a walked micro-batch is (as the relay's acts.c keeps it):
   whether a host stash holds it, and how many of the micro-batches it stands for are on
   the host alone (their copies in come at on_device). */
struct timed_act {
  bool host;
  double fetch;
};

struct timing {
  const struct plan_chain *c;
  const struct order *sc;
  const struct plan_layer_costs *costs;
  const l2l_plan_rates *rates;
  int64_t nmb, walked, mb, last;
  struct timed_act *x, *g, scratch;   /* [(L + 1) * walked] */
  bool *away;                         /* [L * walked]: a saved state swapped out */
  struct order_slot *slot_use;
  int slots, running;
  /* the running visit's channels: seconds of compute, bytes in and out, exposed seconds */
  double compute, in, out, exposed, first_exposed;
  /* the step: its seconds so far, the host optimizer's updates, its channels */
  double total, workers_free, total_updates, backward_end;
  double *per_layer;
  struct plan_step_channels channels;
  int64_t head_width;   /* targets per sample: S for an LM head, 1 for a classifier */
};

/* Walked micro-batch u is the step's last (the costs' [1]; it may be smaller). */
static int timed_last(const struct timing *t, int64_t u) { return u + 1 == t->walked; }

static int64_t timed_rows(const struct timing *t, int64_t u) {
  return timed_last(t, u) ? t->last : t->mb;
}

/* How many of the step's micro-batches walked micro-batch u stands for. */
static double timed_weight(const struct timing *t, int64_t u) {
  return timed_last(t, u) ? 1 : (double)(t->nmb - 1);
}

static double timed_act_bytes(const struct timing *t, int64_t u) {
  return (double)(timed_rows(t, u) * t->c->seq * t->c->dim) * sizeof(float);
}

static struct timed_act *timed_at(struct timing *t, enum order_act a, int k, int64_t u) {
  if (a == ORDER_SCRATCH) return &t->scratch;
  return (a == ORDER_X ? t->x : t->g) + (size_t)k * (size_t)t->walked + (size_t)u;
}

/* Bytes moved out of the device: the visit waits for its last micro-batch's (the relay
   waits for a visit's stash-outs and swap-outs before the next visit). */
static void timed_out(struct timing *t, double bytes, int64_t u) {
  t->out += bytes * timed_weight(t, u);
  t->channels.d2h += bytes * timed_weight(t, u);
  if (timed_last(t, u)) t->exposed += seconds_for(bytes, t->rates->d2h);
}

/* Visit i's parameters: copied in unless a slot still holds them (nothing updates a layer
   between its visits within a step, so a slot holding it is current). */
static bool timed_params_copied(struct timing *t, int i) {
  bool reused = false;
  int k = t->sc->visits[i].k;
  int slot = order_slot_choose(t->slot_use, t->slots, k, t->running, i, NULL, NULL, &reused);
  if (!reused) t->slot_use[slot].held = k;
  t->running = slot;   /* the busy one when the visit after it is queued */
  return !reused;
}

static void timed_visit_start(void *ctx, int i) {
  struct timing *t = ctx;
  t->compute = t->in = t->out = 0;
  t->exposed = i == 0 ? t->first_exposed : 0;
}

/* The next visit's parameters copy in under this one (the relay queues them here). */
static l2l_status timed_visit_bind(void *ctx, int i, const struct order_visit *v, bool grads) {
  struct timing *t = ctx;
  (void)v, (void)grads;
  if (i + 1 < t->sc->nvisits && timed_params_copied(t, i + 1)) {
    double bytes = (double)t->costs[t->sc->visits[i + 1].k].param_bytes;
    t->in += bytes;
    t->channels.h2d += bytes;
  }
  return L2L_OK;
}

/* Its gradients leave the device (a frozen layer's are not sent), and its update starts on
   the EPS workers: eager ones under the rest of the backward, deferred ones at its end. */
static l2l_status timed_visit_end(void *ctx, int i, const struct order_visit *v, bool grads) {
  struct timing *t = ctx;
  (void)i;
  int k = v->k;
  const struct plan_layer_costs *o = &t->costs[k];
  bool update = grads && !t->c->layers[k].frozen;
  if (update) t->out += (double)o->grad_bytes, t->channels.d2h += (double)o->grad_bytes;
  const l2l_plan_rates *rates = t->rates;
  t->channels.compute += t->compute;
  double seconds = t->compute, in = seconds_for(t->in, rates->h2d),
         out = seconds_for(t->out, rates->d2h);
  if (rates->shared) {
    seconds += in + out;   /* the copy threads take the compute's cores */
  } else {
    if (in > seconds) seconds = in;
    if (out > seconds) seconds = out;
  }
  seconds += t->exposed + rates->visit;
  t->total += seconds;
  if (t->per_layer) t->per_layer[k] += seconds;
  if (update) {
    double u = seconds_for((double)o->master_bytes, rates->optimizer) / (double)t->c->accumulate;
    t->total_updates += u;
    if (t->c->updates_deferred) t->workers_free += u;
    else t->workers_free = (t->workers_free > t->total ? t->workers_free : t->total) + u;
  }
  t->backward_end = t->total;
  return L2L_OK;
}

/* A copy in when the activation is only on the host (counted from its start). */
static l2l_status timed_on_device(void *ctx, enum order_act a, int k, int64_t u) {
  struct timing *t = ctx;
  struct timed_act *x = timed_at(t, a, k, u);
  double bytes = timed_act_bytes(t, u) * x->fetch;
  t->in += bytes;
  t->channels.h2d += bytes;
  x->fetch = 0;
  return L2L_OK;
}

/* One micro-batch of those the walked first one stands for (the step's first), counted
   with the running visit. */
static l2l_status timed_prefetch_ahead(void *ctx, enum order_act a, int k) {
  struct timing *t = ctx;
  struct timed_act *x = timed_at(t, a, k, 0);
  if (x->fetch < 1) return L2L_OK;
  double bytes = timed_act_bytes(t, 0);
  t->in += bytes;
  t->channels.h2d += bytes;
  x->fetch -= 1;
  return L2L_OK;
}

static l2l_status timed_make(void *ctx, enum order_act a, int k, int64_t u) {
  *timed_at(ctx, a, k, u) = (struct timed_act){0};
  return L2L_OK;
}

static void timed_free(void *ctx, enum order_act a, int k, int64_t u) {
  *timed_at(ctx, a, k, u) = (struct timed_act){0};
}

static l2l_status timed_release(void *ctx, enum order_act a, int k, int64_t u) {
  struct timing *t = ctx;
  struct timed_act *x = timed_at(t, a, k, u);
  x->fetch = x->host ? timed_weight(t, u) : 0;
  return L2L_OK;
}

/* Kept (BOTH, DEVICE): one of the micro-batches the walked one stands for stays on the
   device (the first, or the last), the others (a visit's middle ones) go to the host alone;
   the visit does not wait for a kept one's copy (the next visit's release does, long after),
   nor, the last being kept, for a middle one's (done under the last one's compute). */
static l2l_status timed_stash_out(void *ctx, enum order_act a, int k, int64_t u,
                                  enum order_out how) {
  struct timing *t = ctx;
  struct timed_act *x = timed_at(t, a, k, u);
  double w = timed_weight(t, u), bytes = timed_act_bytes(t, u);
  if (how == ORDER_OUT_HOST) {
    *x = (struct timed_act){.host = true, .fetch = w};
    timed_out(t, bytes, u);
    return L2L_OK;
  }
  double copied = how == ORDER_OUT_BOTH ? w : w - 1;
  *x = (struct timed_act){.host = copied > 0, .fetch = w - 1};
  t->out += bytes * copied;
  t->channels.d2h += bytes * copied;
  return L2L_OK;
}

static l2l_status timed_nothing(void *ctx, int keep) {
  (void)ctx, (void)keep;
  return L2L_OK;
}

/* The micro-batch's rows of the batch fields the layer's role reads, copied by the
   compute thread before the call (acts.c): tokens (and types) for the input, targets
   for a head, the key mask for a body layer. */
static l2l_status timed_inputs(void *ctx, int k, int64_t u, bool training) {
  struct timing *t = ctx;
  (void)training;
  const struct plan_chain *c = t->c;
  double rows = (double)timed_rows(t, u), S = (double)c->seq, bytes = 0;
  switch (c->layers[k].role) {
    case L2L_ROLE_INPUT: bytes = rows * S * 4 * (c->token_types ? 2 : 1); break;
    case L2L_ROLE_HEAD: bytes = rows * (double)t->head_width * 4; break;
    default: bytes = c->key_mask ? rows * S : 0;
  }
  bytes *= timed_weight(t, u);
  t->compute += seconds_for(bytes, t->rates->h2d);
  t->channels.h2d += bytes;
  return L2L_OK;
}

static void timed_inputs_free(void *ctx) { (void)ctx; }

/* Layer calls: compute on the calling thread, [0] a full micro-batch's, [1] the last's. */
static double timed_fwd(const struct timing *t, int k, int64_t u) {
  return t->costs[k].fwd[timed_last(t, u)] * timed_weight(t, u);
}

static double timed_bwd(const struct timing *t, int k, int64_t u) {
  return t->costs[k].bwd[timed_last(t, u)] * timed_weight(t, u);
}

static l2l_status timed_forward(void *ctx, int k, int64_t u, bool keep, bool rebuild) {
  struct timing *t = ctx;
  (void)keep, (void)rebuild;
  t->compute += timed_fwd(t, k, u);
  return L2L_OK;
}

static l2l_status timed_head(void *ctx, int k, int64_t u, bool backward) {
  struct timing *t = ctx;
  t->compute += timed_fwd(t, k, u) + (backward ? timed_bwd(t, k, u) : 0);
  return L2L_OK;
}

static l2l_status timed_backward(void *ctx, int k, int64_t u, bool recompute) {
  struct timing *t = ctx;
  t->compute += timed_bwd(t, k, u) + (recompute ? timed_fwd(t, k, u) : 0);
  return L2L_OK;
}

static void timed_saved_free(void *ctx, int k, int64_t u) { (void)ctx, (void)k, (void)u; }

static double timed_swap_bytes(const struct timing *t, int k, int64_t u) {
  return (double)t->costs[k].swap_bytes[timed_last(t, u)];
}

static l2l_status timed_swap_out(void *ctx, int k, int64_t u) {
  struct timing *t = ctx;
  t->away[(size_t)k * (size_t)t->walked + (size_t)u] = true;
  timed_out(t, timed_swap_bytes(t, k, u), u);
  return L2L_OK;
}

/* A swap-in is queued once (the walk asks one micro-batch ahead, and again at its use). */
static l2l_status timed_swap_in(void *ctx, int k, int64_t u) {
  struct timing *t = ctx;
  bool *away = &t->away[(size_t)k * (size_t)t->walked + (size_t)u];
  if (*away) {
    double bytes = timed_swap_bytes(t, k, u) * timed_weight(t, u);
    t->in += bytes;
    t->channels.h2d += bytes;
  }
  *away = false;
  return L2L_OK;
}

static l2l_status timed_wait(void *ctx, int k, int64_t u) {
  (void)ctx, (void)k, (void)u;
  return L2L_OK;
}

static const struct order_ops timing_acts = {
    .visit_start = timed_visit_start, .visit_bind = timed_visit_bind,
    .visit_end = timed_visit_end, .prefetch = timed_on_device,
    .prefetch_ahead = timed_prefetch_ahead, .on_device = timed_on_device,
    .make = timed_make, .free = timed_free, .release_device = timed_release,
    .stash_out = timed_stash_out, .throttle = timed_nothing, .inputs = timed_inputs,
    .inputs_free = timed_inputs_free, .forward = timed_forward, .head = timed_head,
    .backward = timed_backward, .saved_free = timed_saved_free, .swap_out = timed_swap_out,
    .swap_out_wait = timed_wait, .swap_in = timed_swap_in, .swap_in_wait = timed_wait,
};

/* Flattened, as peak.c's replay_step is, for the same reason. */
__attribute__((flatten)) double plan_step_seconds(const struct plan_chain *c,
                                                  const struct plan_layer_costs *costs,
                                                  const l2l_plan_rates *rates, double *per_layer,
                                                  struct plan_step_channels *channels) {
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  int64_t nmb = (c->batch + mb - 1) / mb;
  struct timing t = {.c = c, .costs = costs, .rates = rates, .nmb = nmb, .mb = mb,
                     .last = c->batch - (nmb - 1) * mb, .per_layer = per_layer,
                     .walked = nmb < TIMED_MICRO_BATCHES ? nmb : TIMED_MICRO_BATCHES,
                     .slots = c->param_slots > 0 ? c->param_slots : 2};
  /* Past L + 1 slots no layer's parameters are ever evicted (a new layer always finds a
     slot never used, the lowest first, as with more), so more choose alike: the walk looks
     through at most that many (a fuzzed plan asked for 3,893 slots over 50 layers: 60 % of
     its 28 s went to looking through them) */
  if (t.slots > c->L + 1) t.slots = c->L + 1;
  struct order sc;
  if (plan_schedule(&sc, c) != L2L_OK) return -1;
  t.sc = &sc;
  l2l_layer_config head;
  l2l_layer_get_config(&head, c->layers[c->L - 1].layer);
  t.head_width = head.kind == L2L_LAYER_CLASSIFIER ? 1 : c->seq;
  size_t acts = (size_t)(c->L + 1) * (size_t)t.walked;
  t.x = calloc(acts, sizeof *t.x);
  t.g = calloc(acts, sizeof *t.g);
  t.away = calloc(acts, sizeof *t.away);
  t.slot_use = calloc((size_t)t.slots, sizeof *t.slot_use);
  double total = -1;
  if (t.x && t.g && t.away && t.slot_use) {
    if (per_layer) memset(per_layer, 0, (size_t)c->L * sizeof *per_layer);
    for (int i = 0; i < t.slots; i++)
      t.slot_use[i] = (struct order_slot){.held = -1, .last_used = -1};
    /* the first visit's parameters are queued before the step and waited for */
    if (sc.nvisits > 0 && timed_params_copied(&t, 0)) {
      t.channels.h2d = (double)costs[sc.visits[0].k].param_bytes;
      t.first_exposed = seconds_for(t.channels.h2d, rates->h2d);
    }
    (void)order_walk(&sc, t.walked, &timing_acts, &t);   /* the timing acts cannot fail */
    /* updates the backward did not hide: deferred ones all, eager ones past its end; on
       shared cores every update takes its time from the step */
    double tail = c->updates_deferred ? t.workers_free : t.workers_free - t.backward_end;
    if (rates->shared) tail = t.total_updates;
    total = t.total + (tail > 0 ? tail : 0);
    t.channels.updates = t.total_updates;
    if (channels) *channels = t.channels;
  }
  free(t.x), free(t.g), free(t.away), free(t.slot_use);
  order_free(&sc);
  return total;
}
