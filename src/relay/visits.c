/* SPDX-License-Identifier: MIT */
/* visits.c — the relay's acts of a step's visit order: real tensors, layer calls and copies.
 *
 * Purpose: the compute thread executes the step's walk (src/order/walk.h says the
 * order): activations brought in from the host stash ahead of their use, made, stashed
 * out, released and freed (acts.c), layer calls timed on the device's clock, saved states
 * swapped on the copy threads, and each visit's parameters bound from their slot and
 * their gradients sent out (slots.c). Every failure names the layer's index and kind and
 * the micro-batch.
 * Must never: decide an order of its own: the planner replays the same walk to predict
 * the device peak, which holds only while the two agree.
 */
#include <stdio.h>
#include <string.h>

#include "relay.h"

uint32_t relay_on_device(const l2l_relay *run, const l2l_layer *layer) {
  uint32_t on_device = 0;
  for (int r = 0; r < l2l_layer_param_count(layer); r++)
    on_device |= (uint32_t)eps_on_device(eps_find(&run->eps, l2l_layer_param(layer, r))) << r;
  return on_device;
}

l2l_status relay_schedule(struct step *s) {
  TRY(order_new(&s->order, s->L, s->training));
  for (int k = 0; k < s->L; k++) {
    const struct relay_layer *rl = active_layer(s, k);
    s->order.layers[k] = (struct order_layer){rl->layer, rl->frozen, rl->inner, rl->stash,
                                              relay_on_device(s->run, rl->layer)};
  }
  order_build(&s->order);
  return L2L_OK;
}

/* A layer call of active layer k's micro-batch u failed: its message, with the layer's
   index in the relay, its kind and the micro-batch in front. */
static l2l_status layer_failed(const struct step *s, int k, int64_t u, l2l_status status) {
  status = error_wrap(status, L2L_NAMED_LAYER "layer %d" L2L_NAMED_END " (%s), " L2L_NAMED_MICRO_BATCH
                      "micro-batch %lld" L2L_NAMED_END ": ", s->active[k],
                      l2l_layer_name(active_layer(s, k)->layer), (long long)u);
  return error_note_micro_batch(error_note_layer(status, s->active[k]), u);
}

static struct act *act_at(struct step *s, enum order_act a, int k, int64_t u) {
  return a == ORDER_X ? &s->x[k][u] : a == ORDER_G ? &s->g[k][u] : &s->scratch;
}

/* ---------------------------------------------------------------- visits */

/* The visit's layer names the copies and waits on the timeline, whichever boundary they
   move. */
static void visit_start(void *ctx, int i) {
  struct step *s = ctx;
  s->visit_layer = s->active[s->order.visits[i].k];
}

static l2l_status visit_bind(void *ctx, int i, const struct order_visit *v, bool grads) {
  struct step *s = ctx;
  s->gs = i % 2;
  if (i + 1 < s->order.nvisits) TRY(relay_params_queue(s, 1, i + 1));
  return relay_params_bind(s, v->k, grads);
}

static l2l_status visit_end(void *ctx, int i, const struct order_visit *v, bool grads) {
  struct step *s = ctx;
  (void)i;
  return relay_params_done(s, v->k, grads && !active_layer(s, v->k)->frozen);
}

/* ---------------------------------------------------------------- activations */

static l2l_status prefetch(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  return relay_act_prefetch(s, act_at(s, a, k, u), s->visit_layer, u);
}

static l2l_status prefetch_ahead(void *ctx, enum order_act a, int k) {
  return prefetch(ctx, a, k, 0);
}

static l2l_status on_device(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  l2l_tensor *t = NULL;
  return relay_act_on_device(s, act_at(s, a, k, u), s->visit_layer, u, &t);
}

static l2l_status make(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  return relay_new_activation(s, &act_at(s, a, k, u)->dev, u);
}

static void act_free(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  relay_act_free(s->run, act_at(s, a, k, u));
}

static l2l_status release_device(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  return relay_act_release_device(s, act_at(s, a, k, u));
}

static l2l_status stash_out(void *ctx, enum order_act a, int k, int64_t u, enum order_out how) {
  struct step *s = ctx;
  return relay_act_stash_out(s, act_at(s, a, k, u), s->visit_layer, u, how);
}

static l2l_status throttle(void *ctx, int keep) { return relay_out_throttle(ctx, keep); }

static l2l_status inputs(void *ctx, int k, int64_t u, bool training) {
  struct step *s = ctx;
  return relay_mb_inputs(s, &s->mb_in, k, u, training);
}

static void inputs_free(void *ctx) {
  struct step *s = ctx;
  relay_mb_inputs_free(&s->mb_in);
}

/* ---------------------------------------------------------------- layer calls */

static l2l_status forward(void *ctx, int k, int64_t u, bool keep, bool rebuild) {
  struct step *s = ctx;
  struct core_stamp t0;
  device_stamp(&t0);
  l2l_status status = layer_forward_prechecked(keep ? &s->saved[k][u] : NULL, active_layer(s, k)->layer,
                                        s->x[k + 1][u].dev, k > 0 ? s->x[k][u].dev : NULL,
                                        &s->mb_in.batch);
  relay_compute_done(s, s->active[k], u, rebuild ? L2L_PHASE_REBUILD : L2L_PHASE_FORWARD, &t0);
  return status == L2L_OK ? L2L_OK : layer_failed(s, k, u, status);
}

static l2l_status head(void *ctx, int k, int64_t u, bool backward) {
  struct step *s = ctx;
  l2l_layer *layer = active_layer(s, k)->layer;
  int64_t lshape[3];
  int ldims = layer_output_dims(lshape, layer, &s->mb_in.batch, relay_mb_rows(s, u), s->S);
  l2l_tensor *losses = NULL;
  l2l_saved *saved = NULL;
  l2l_status status = l2l_tensor_new(&losses, L2L_POOL_DEVICE, L2L_F32, ldims, lshape);
  if (status == L2L_OK && backward) status = relay_new_activation(s, &s->g[k][u].dev, u);
  struct core_stamp t0;
  device_stamp(&t0);
  if (status == L2L_OK)
    status = layer_forward_prechecked(backward ? &saved : NULL, layer, losses, s->x[k][u].dev,
                               &s->mb_in.batch);
  if (status == L2L_OK) status = relay_loss_queue(s, u, losses);
  if (status == L2L_OK && backward)
    status = layer_backward_prechecked(layer, s->g[k][u].dev, NULL, saved, &s->mb_in.batch);
  relay_compute_done(s, s->active[k], u, backward ? L2L_PHASE_BACKWARD : L2L_PHASE_FORWARD, &t0);
  l2l_saved_free(saved);
  l2l_tensor_free(losses);
  if (status != L2L_OK) return layer_failed(s, k, u, status);
  return L2L_OK;
}

static l2l_status backward(void *ctx, int k, int64_t u, bool recompute) {
  struct step *s = ctx;
  l2l_layer *layer = active_layer(s, k)->layer;
  l2l_tensor *dx = k > 0 ? s->g[k][u].dev : NULL;
  struct core_stamp t0;
  device_stamp(&t0);
  l2l_status status = L2L_OK;
  if (recompute)
    status = layer_forward_prechecked(&s->saved[k][u], layer, s->scratch.dev,
                               k > 0 ? s->x[k][u].dev : NULL, &s->mb_in.batch);
  if (status == L2L_OK)
    status = layer_backward_prechecked(layer, dx, s->g[k + 1][u].dev, s->saved[k][u], &s->mb_in.batch);
  relay_compute_done(s, s->active[k], u, L2L_PHASE_BACKWARD, &t0);
  return status == L2L_OK ? L2L_OK : layer_failed(s, k, u, status);
}

static void saved_free(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  l2l_saved_free(s->saved[k][u]);
  s->saved[k][u] = NULL;
}

/* ---------------------------------------------------------------- swap */

static l2l_status swap_out(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  TRY(relay_swap_queue(s->run, &s->run->d2h, &s->swap[k][u], s->saved[k][u], L2L_POOL_PINNED,
                       s->active[k], u));
  s->where[k][u] = 1;
  return L2L_OK;
}

static l2l_status swap_wait(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  return relay_swap_wait(s, &s->swap[k][u]);
}

static l2l_status swap_in(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  if (!s->where[k][u]) return L2L_OK;
  TRY(relay_swap_queue(s->run, &s->run->h2d, &s->swap[k][u], s->saved[k][u], L2L_POOL_DEVICE,
                       s->active[k], u));
  s->where[k][u] = 0;
  return L2L_OK;
}

static const struct order_ops relay_acts = {
    .visit_start = visit_start, .visit_bind = visit_bind, .visit_end = visit_end,
    .prefetch = prefetch, .prefetch_ahead = prefetch_ahead, .on_device = on_device,
    .make = make, .free = act_free, .release_device = release_device, .stash_out = stash_out, .throttle = throttle,
    .inputs = inputs, .inputs_free = inputs_free, .forward = forward, .head = head,
    .backward = backward, .saved_free = saved_free, .swap_out = swap_out,
    .swap_out_wait = swap_wait, .swap_in = swap_in, .swap_in_wait = swap_wait,
};

l2l_status relay_run_visits(struct step *s) {
  TRY(relay_slots_new(s));
  /* 16-bit staging copies from the masters as they are now, each behind its record's
     pending update: those a script was given and may have edited since the last step
     (the others' updates wrote theirs) */
  if (s->run->config.precision != L2L_F32) eps_stage(&s->run->eps);
  if (s->order.nvisits > 0) TRY(relay_params_queue(s, 0, 0));
  TRY(order_walk(&s->order, s->nmb, &relay_acts, s));
  relay_grads_wait(s, 0);
  relay_grads_wait(s, 1);
  return L2L_OK;
}
