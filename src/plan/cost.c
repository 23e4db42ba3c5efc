/* SPDX-License-Identifier: MIT */
/* cost.c — the predicted time of a training step under a policy.
 *
 * Purpose: the planner's objective. A step is the relay's visits in order (src/schedule);
 * each visit has three channels that the relay runs at once: compute on the calling
 * thread (a forward per micro-batch; a backward, with the forward rerun first when the
 * layer recomputes; the head's forward and backward), copies in on the h2d thread (the
 * next visit's parameters unless a slot still holds them, host-stashed inputs and
 * gradients, swapped states coming back) and copies out on the d2h thread (host stashes,
 * swap-outs, the visit's gradients). A visit costs the most of its channels, plus what
 * the relay leaves exposed: the first visit's parameters, the last stash-out of a visit
 * (each visit waits for its stash-outs), a fixed cost per visit, and the host optimizer's
 * updates where backward no longer hides them (the layers' updates run on the EPS
 * workers as each gradient completes; the lowest layer's comes last, and the next step's
 * first visit waits for it; with global clipping or loss scaling all of them wait for the
 * end of backward).
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

/* A record and the lowest layer using it: a record shared by layers (a tied head) is
   counted at the lowest. Sorted by record, then layer: O(n log n) for the chain's n
   records (a search of the layers below for each was O(L^2): 800 layers took seconds). */
struct record_use {
  const l2l_param *param;
  int layer;
};

static int by_record(const void *a, const void *b) {
  const struct record_use *x = a, *y = b;
  if (x->param != y->param) return (uintptr_t)x->param < (uintptr_t)y->param ? -1 : 1;
  return x->layer - y->layer;
}

/* out[k] := the f32 bytes of the records whose lowest user is layer k. */
static l2l_status master_bytes_of(uint64_t *out, const struct plan_chain *c) {
  int n = 0;
  for (int k = 0; k < c->L; k++) n += l2l_layer_param_count(c->layers[k].layer);
  struct record_use *uses = malloc(sizeof *uses * (size_t)(n > 0 ? n : 1));
  if (uses == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  n = 0;
  for (int k = 0; k < c->L; k++) {
    out[k] = 0;
    for (int i = 0; i < l2l_layer_param_count(c->layers[k].layer); i++)
      uses[n++] = (struct record_use){l2l_layer_param(c->layers[k].layer, i), k};
  }
  qsort(uses, (size_t)n, sizeof *uses, by_record);
  for (int i = 0; i < n; i++)
    if (i == 0 || uses[i].param != uses[i - 1].param)
      out[uses[i].layer] += (uint64_t)l2l_tensor_numel(l2l_param_value(uses[i].param)) * sizeof(float);
  free(uses);
  return L2L_OK;
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
        status = plan_time_layer(&o->fwd[i], &o->bwd[i], layer, rows[i], c->seq);
      } else if (rates->flops > 0) {
        o->fwd[i] = plan_layer_flops(layer, rows[i], c->seq) / rates->flops;
        o->bwd[i] = 2 * o->fwd[i];
      }
      l2l_layer_memory m;
      l2l_layer_memory_in(&m, layer, rows[i], c->seq, c->precision, true);
      o->swap_bytes[i] = m.saved + m.input_kept + m.output_kept;
    }
    o->param_bytes = schedule_layer_slot_bytes(layer, SCHEDULE_SLOT_VALUES, c->precision,
                                               c->grad_precision);
    o->grad_bytes = schedule_layer_slot_bytes(
        layer, c->grad_precision != L2L_F32 ? SCHEDULE_SLOT_GRADS_OUT : SCHEDULE_SLOT_GRADS,
        c->precision, c->grad_precision);
    o->master_bytes = masters[k];
  }
  free(masters);
  return status;
}

/* ---------------------------------------------------------------- a step */

static double seconds_for(double bytes, double rate) { return rate > 0 ? bytes / rate : 0; }

double plan_step_seconds(const struct plan_chain *c, const struct plan_layer_costs *costs,
                         const l2l_plan_rates *rates, double *per_layer) {
  int L = c->L;
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  int64_t nmb = (c->batch + mb - 1) / mb, last = c->batch - (nmb - 1) * mb;
  double act_full = (double)(mb * c->seq * c->dim) * sizeof(float);
  double act_last = (double)(last * c->seq * c->dim) * sizeof(float);
  double act_all = act_full * (double)(nmb - 1) + act_last;   /* one boundary, every micro-batch */
  struct schedule sc;
  int slots = c->param_slots > 0 ? c->param_slots : 2;
  struct schedule_slot *slot_use = calloc((size_t)slots, sizeof *slot_use);
  if (plan_schedule(&sc, c) != L2L_OK || slot_use == NULL) {
    schedule_free(&sc), free(slot_use);
    return -1;
  }
  if (per_layer) memset(per_layer, 0, (size_t)L * sizeof *per_layer);
  const struct schedule_visit *visits = sc.visits;
  int n = sc.nvisits, lowest = sc.lowest;
  for (int i = 0; i < slots; i++) slot_use[i] = (struct schedule_slot){.held = -1, .last_used = -1};

  /* Which visits copy their parameters in, by the relay's choice of slots (nothing updates
     a layer between its visits within a step, so a slot holding it is current). */
  bool *copies = calloc((size_t)n, sizeof *copies);
  int running = -1;
  for (int i = 0; copies && i < n; i++) {
    bool reused = false;
    int slot = schedule_slot_choose(slot_use, slots, visits[i].k, running, i, NULL, NULL, &reused);
    if (!reused) slot_use[slot].held = visits[i].k;
    copies[i] = !reused;
    running = slot;
  }

  double total = 0, backward_end = 0, workers_free = 0, total_updates = 0;
  for (int i = 0; copies && i < n; i++) {
    int k = visits[i].k;
    enum schedule_visit_kind kind = visits[i].kind;
    const struct plan_layer_costs *o = &costs[k];
    const struct plan_layer *pl = &c->layers[k];
    double compute = 0, in = 0, out = 0, exposed = 0;
    double whole_fwd = o->fwd[0] * (double)(nmb - 1) + o->fwd[1];
    double whole_bwd = o->bwd[0] * (double)(nmb - 1) + o->bwd[1];
    bool input_host = k >= 1 && pl->stash == L2L_STASH_HOST;
    if (kind == SCHEDULE_FORWARD || kind == SCHEDULE_REBUILD) {
      compute = whole_fwd;
      if (input_host && kind == SCHEDULE_FORWARD) in += act_all;
      bool out_host = kind == SCHEDULE_FORWARD && c->layers[k + 1].stash == L2L_STASH_HOST;
      if (out_host) out += act_all, exposed += seconds_for(act_last, rates->d2h);
      if (kind == SCHEDULE_FORWARD && schedule_keeps(&sc, k) && pl->inner == L2L_INNER_SWAP) {
        out += (double)o->swap_bytes[0] * (double)(nmb - 1) + (double)o->swap_bytes[1];
        exposed += seconds_for((double)o->swap_bytes[1], rates->d2h);
      }
    } else if (kind == SCHEDULE_HEAD) {
      bool backward = lowest < L;
      compute = whole_fwd + (backward ? whole_bwd : 0);
      if (input_host) in += act_all;
      if (backward && k > lowest && input_host) out += act_all, exposed += seconds_for(act_last, rates->d2h);
      if (backward && !pl->frozen) out += (double)o->grad_bytes;
    } else {
      bool recompute = pl->inner == L2L_INNER_RECOMPUTE;
      compute = whole_bwd + (recompute ? whole_fwd : 0);
      if (c->layers[k + 1].stash == L2L_STASH_HOST) in += act_all;   /* the gradient from above */
      if (recompute && input_host) in += act_all;
      if (pl->inner == L2L_INNER_SWAP)
        in += (double)o->swap_bytes[0] * (double)(nmb - 1) + (double)o->swap_bytes[1];
      if (k > lowest && input_host) out += act_all, exposed += seconds_for(act_last, rates->d2h);
      if (!pl->frozen) out += (double)o->grad_bytes;
    }
    /* the next visit's parameters copy in under this one (the first visit's are exposed) */
    if (i + 1 < n && copies[i + 1]) in += (double)costs[visits[i + 1].k].param_bytes;
    if (i == 0 && copies[0]) exposed += seconds_for((double)o->param_bytes, rates->h2d);
    double t = compute, t_in = seconds_for(in, rates->h2d), t_out = seconds_for(out, rates->d2h);
    if (rates->shared) {
      t += t_in + t_out;   /* the copy threads take the compute's cores */
    } else {
      if (t_in > t) t = t_in;
      if (t_out > t) t = t_out;
    }
    t += exposed + rates->visit;
    total += t;
    if (per_layer) per_layer[k] += t;
    /* a trainable layer's update starts once its backward is done, on the workers */
    bool update_here = schedule_visit_grads(&sc, &visits[i]) && !pl->frozen;
    if (update_here) {
      double u = seconds_for((double)o->master_bytes, rates->optimizer) / (double)c->accumulate;
      total_updates += u;
      if (c->updates_deferred) workers_free += u;
      else workers_free = (workers_free > total ? workers_free : total) + u;
    }
    backward_end = total;
  }
  /* updates the backward did not hide: deferred ones all, eager ones past its end; on
     shared cores every update takes its time from the step */
  double tail = c->updates_deferred ? workers_free : workers_free - backward_end;
  if (rates->shared) tail = total_updates;
  if (tail > 0) total += tail;
  free(copies), free(slot_use);
  schedule_free(&sc);
  return total;
}
