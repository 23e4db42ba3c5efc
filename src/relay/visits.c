/* SPDX-License-Identifier: MIT */
/* visits.c — one layer's visit over every micro-batch (forward, rebuild, the head's
 * turnaround, backward), and running a step's visits in order.
 *
 * Purpose: the compute thread's loop: prefetch what the next micro-batch and the next
 * visit read, compute, then release or stash what this one made, as the policies of the
 * layer's boundary (stash) and of its saved state (inner: keep, swap, recompute) say.
 * Every failure names the layer's index and kind and the micro-batch.
 * Must never: keep a saved state past its backward, or a device input nobody reads again.
 */
#include <stdio.h>
#include <string.h>

#include "relay.h"

/* A layer call of visit k's micro-batch u failed: its message, with the layer's index in
   the relay, its kind and the micro-batch in front. */
static l2l_status layer_failed(const struct step *s, int k, int64_t u, l2l_status status) {
  char message[256];
  snprintf(message, sizeof message, "%s", l2l_last_error());
  return l2l_fail(status, "layer %d (%s), micro-batch %lld: %s", s->active[k],
                  l2l_layer_name(active_layer(s, k)->layer), (long long)u, message);
}

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
      if (u + 1 < s->nmb) TRY(relay_act_prefetch(s, &s->x[k][u + 1], li, u + 1));
      TRY(relay_act_on_device(s, &s->x[k][u], li, u, &x));
    }
    struct mb_inputs m;
    TRY(relay_mb_inputs(s, &m, k, u, s->training));
    l2l_status status = relay_new_activation(s, &y, u);
    if (status != L2L_OK) {
      relay_mb_inputs_free(&m);
      return status;
    }
    s->x[k + 1][u].dev = y;
    l2l_saved **saved = keep ? &s->saved[k][u] : NULL;
    struct l2l_stamp t0;
    l2l_device_stamp(&t0);
    status = l2l_layer_forward(saved, rl->layer, y, x, &m.batch);
    relay_compute_done(s, li, u, rebuild ? L2L_PHASE_REBUILD : L2L_PHASE_FORWARD, &t0);
    relay_mb_inputs_free(&m);
    if (status != L2L_OK) return layer_failed(s, k, u, status);
    if (keep && rl->inner == L2L_INNER_SWAP) {
      TRY(relay_swap_queue(s->run, &s->run->d2h, &s->swap[k][u], s->saved[k][u], L2L_POOL_PINNED, li, u));
      s->where[k][u] = 1;
    }
    /* The input: freed when nobody reads it again; else its device copy goes unless the
       device is where it waits (a host stash stays; a dropped one is rebuilt later). */
    if (k > 0) {
      if (!input_needed || (!input_home_device && rl->stash == L2L_STASH_RECOMPUTE))
        relay_act_free(s->run, &s->x[k][u]);
      else if (!input_home_device)
        relay_act_release_device(&s->x[k][u]);
    }
    if (out_host) TRY(relay_act_stash_out(s, &s->x[k + 1][u], li, u));
  }
  /* A swap finishes before the visit's end: its device bytes then are free. */
  if (keep && rl->inner == L2L_INNER_SWAP)
    for (int64_t u = 0; u < s->nmb; u++) TRY(relay_swap_wait(&s->wait_copy, &s->swap[k][u]));
  return relay_out_throttle(s, 0);
}

/* dx of micro-batch u, the gradient for x[k]: kept on the device for the layer below
   (and stashed to the host when boundary k's policy says so), or freed when no layer
   below wants it. */
static l2l_status pass_down(struct step *s, int k, int64_t u, l2l_tensor *dx, bool keep_dx,
                            bool grad_host) {
  if (!keep_dx) {
    l2l_tensor_free(dx);
    return L2L_OK;
  }
  s->g[k][u].dev = dx;
  return grad_host ? relay_act_stash_out(s, &s->g[k][u], s->active[k], u) : L2L_OK;
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
    if (u + 1 < s->nmb) TRY(relay_act_prefetch(s, &s->x[k][u + 1], li, u + 1));
    TRY(relay_act_on_device(s, &s->x[k][u], li, u, &x));
    struct mb_inputs m;
    TRY(relay_mb_inputs(s, &m, k, u, s->training));
    int64_t lshape[3];
    int ldims = l2l_layer_output_dims(lshape, rl->layer, &m.batch, relay_mb_rows(s, u), s->S);
    l2l_saved *saved = NULL;
    double loss = 0;
    l2l_status status = l2l_tensor_new(&losses, L2L_POOL_DEVICE, L2L_F32, ldims, lshape);
    if (status == L2L_OK && backward) status = relay_new_activation(s, &dx, u);
    struct l2l_stamp t0;
    l2l_device_stamp(&t0);
    if (status == L2L_OK)
      status = l2l_layer_forward(backward ? &saved : NULL, rl->layer, losses, x, &m.batch);
    if (status == L2L_OK) status = l2l_sum(&loss, losses);
    if (status == L2L_OK && backward) status = l2l_layer_backward(rl->layer, dx, NULL, saved, &m.batch);
    relay_compute_done(s, li, u, backward ? L2L_PHASE_BACKWARD : L2L_PHASE_FORWARD, &t0);
    l2l_saved_free(saved);
    l2l_tensor_free(losses);
    relay_mb_inputs_free(&m);
    if (status != L2L_OK) {
      l2l_tensor_free(dx);
      return layer_failed(s, k, u, status);
    }
    s->loss_sum += loss;
    relay_act_free(s->run, &s->x[k][u]);
    TRY(pass_down(s, k, u, dx, keep_dx, grad_host));
  }
  return relay_out_throttle(s, 0);
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
      TRY(relay_act_prefetch(s, &s->g[k + 1][u + 1], li, u + 1));
      if (recompute && k > 0) TRY(relay_act_prefetch(s, &s->x[k][u + 1], li, u + 1));
    }
    TRY(relay_act_on_device(s, &s->g[k + 1][u], li, u, &dy));
    /* A swapped state comes back one micro-batch ahead of its use. */
    for (int64_t v = u; v < s->nmb && v <= u + 1; v++)
      if (s->where[k][v]) {
        TRY(relay_swap_queue(s->run, &s->run->h2d, &s->swap[k][v], s->saved[k][v], L2L_POOL_DEVICE, li, v));
        s->where[k][v] = 0;
      }
    TRY(relay_swap_wait(&s->wait_copy, &s->swap[k][u]));
    l2l_saved *saved = s->saved[k][u];
    struct mb_inputs m;
    TRY(relay_mb_inputs(s, &m, k, u, true));
    l2l_status status = L2L_OK;
    if (recompute) {
      if (k > 0) status = relay_act_on_device(s, &s->x[k][u], li, u, &x);
      if (status == L2L_OK) status = relay_new_activation(s, &scratch, u);
    }
    if (status == L2L_OK && k > 0) status = relay_new_activation(s, &dx, u);
    struct l2l_stamp t0;
    l2l_device_stamp(&t0);
    if (status == L2L_OK && recompute)
      status = l2l_layer_forward(&saved, rl->layer, scratch, x, &m.batch);
    if (status == L2L_OK)
      status = l2l_layer_backward(rl->layer, dx, dy, saved, &m.batch);
    relay_compute_done(s, li, u, L2L_PHASE_BACKWARD, &t0);
    relay_mb_inputs_free(&m);
    l2l_saved_free(saved);
    s->saved[k][u] = NULL;
    l2l_tensor_free(scratch);
    if (status != L2L_OK) {
      l2l_tensor_free(dx);
      return layer_failed(s, k, u, status);
    }
    relay_act_free(s->run, &s->g[k + 1][u]);
    if (k > 0) relay_act_free(s->run, &s->x[k][u]);
    TRY(pass_down(s, k, u, dx, keep_dx, grad_host));
  }
  return relay_out_throttle(s, 0);
}

/* Starts bringing in what a visit's first micro-batch reads from the host stash. */
static l2l_status visit_prefetch(struct step *s, const struct visit *v) {
  int li = s->active[v->k];
  bool reads_input = v->kind != V_BACKWARD ||
                     active_layer(s, v->k)->inner == L2L_INNER_RECOMPUTE;
  if (v->kind == V_BACKWARD) TRY(relay_act_prefetch(s, &s->g[v->k + 1][0], li, 0));
  if (reads_input && v->k > 0) TRY(relay_act_prefetch(s, &s->x[v->k][0], li, 0));
  return L2L_OK;
}

l2l_status relay_run_visits(struct step *s) {
  TRY(relay_slots_new(s));
  /* 16-bit staging copies from the masters as they are now (a script may have edited
     them since the last step), each behind its record's pending update */
  if (s->run->config.precision != L2L_F32) l2l_eps_stage(&s->run->eps);
  if (s->nvisits > 0) TRY(relay_params_queue(s, 0, s->visits[0].k));
  for (int i = 0; i < s->nvisits; i++) {
    const struct visit *v = &s->visits[i];
    s->gs = i % 2;
    /* The next visit's parameters copy in while this one computes, behind this visit's
       first input: one copy thread serves both, and a layer's parameters take far longer
       than a micro-batch's activations. */
    TRY(visit_prefetch(s, v));
    if (i + 1 < s->nvisits) TRY(relay_params_queue(s, 1, s->visits[i + 1].k));
    struct relay_layer *rl = active_layer(s, v->k);
    bool grads = s->training && (v->kind == V_BACKWARD || (v->kind == V_HEAD && s->lowest < s->L));
    TRY(relay_params_bind(s, v->k, grads));
    switch (v->kind) {
      case V_FORWARD: TRY(visit_forward(s, v->k, false)); break;
      case V_REBUILD: TRY(visit_forward(s, v->k, true)); break;
      case V_HEAD: TRY(visit_head(s, v->k)); break;
      case V_BACKWARD: TRY(visit_backward(s, v->k)); break;
    }
    TRY(relay_params_done(s, v->k, grads && !rl->frozen));
  }
  relay_grads_wait(s, 0);
  relay_grads_wait(s, 1);
  return L2L_OK;
}
