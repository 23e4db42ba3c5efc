/* SPDX-License-Identifier: MIT */
/* state.c — a step's state: its arrays of activations, saved states and swaps, the stamps
 * of its compute, and freeing all of it whatever happened.
 *
 * Purpose: one place that makes and unmakes a step, so that a step refused or failed
 * half-way leaves no tensor, job or binding behind.
 * Must never: free what a copy job may still use (the queues are drained first).
 */
#include <stdlib.h>

#include "relay.h"

/* Keeps [start, end) for relay_stamped_resolve, which releases both; without memory for it,
   releases them now (the unit then misses the timeline and the sums). */
void relay_stamped_add(struct step *s, struct core_stamp *start, struct core_stamp *end,
                       int layer, int micro_batch, int phase) {
  if (s->nstamped == s->stamped_cap) {
    int64_t cap = s->stamped_cap ? 2 * s->stamped_cap : 256;
    struct stamped *grown = realloc(s->stamped, (size_t)cap * sizeof *grown);
    if (grown == NULL) {
      device_stamp_release(start);
      device_stamp_release(end);
      return;
    }
    s->stamped = grown, s->stamped_cap = cap;
  }
  s->stamped[s->nstamped++] = (struct stamped){*start, *end, layer, micro_batch, phase};
  start->event = end->event = NULL; /* released by relay_stamped_resolve */
}

/* The step's stamped units onto the timeline, in host seconds: the anchor's host time
   plus their offsets from it on the device's clock (on the CPU backend that is their own
   host time), the anchor taken here, once the device has done the step's work. Compute units add up into compute; a wait for a copy counts as exposed
   copy time for the part the device spent idle: from when it had done the work queued
   before the wait to the copy's end, when that came later. */
void relay_stamped_resolve(struct step *s) {
  l2l_relay *run = s->run;
  /* the step's one wait for the device: every stamp has happened after it (a failure:
     those not, dropped), and the anchor relates the device's clock to the host's */
  device_stamp_anchor(&s->anchor);
  for (int64_t i = 0; i < s->nstamped; i++) {
    struct stamped *e = &s->stamped[i];
    double from = 0, to = 0;
    if (device_stamp_seconds(&from, &s->anchor, &e->start) &&
        device_stamp_seconds(&to, &s->anchor, &e->end)) {
      double t0 = s->anchor.host + from, t1 = s->anchor.host + to;
      bool wait = e->phase == L2L_PHASE_WAIT_COPY;
      if (!wait && t1 < t0) t1 = t0;
      if (!wait || t1 - t0 > 1e-5) {
        *(wait ? &s->exposed_copy : &s->compute) += t1 - t0;
        timeline_add(&run->timeline, e->layer, e->micro_batch, e->phase, THREAD_COMPUTE,
                     t0, t1);
      }
    }
    device_stamp_release(&e->start);
    device_stamp_release(&e->end);
  }
  free(s->stamped);
  s->stamped = NULL;
  s->nstamped = s->stamped_cap = 0;
  device_stamp_release(&s->anchor);
}

void relay_act_free(l2l_relay *run, struct act *a) {
  if (a->in) {
    job_wait(&a->in->job);
    l2l_tensor_free(a->in->dst);
    relay_copy_job_free(a->in);
    a->in = NULL;
  }
  if (a->out) {   /* (reading a->dev, freed below) */
    job_wait(&a->out->job);
    relay_copy_job_free(a->out);
    a->out = NULL;
  }
  if (a->host) relay_count_stash(run, -(int64_t)pool_accounted(relay_tensor_bytes(a->host)));
  l2l_tensor_free(a->dev);
  l2l_tensor_free(a->host);
  a->dev = a->host = NULL;
}

void relay_step_free(struct step *s) {
  l2l_relay *run = s->run;
  /* Jobs first: they may still read or free what is below. */
  queue_drain(&run->h2d);
  queue_drain(&run->d2h);
  relay_stamped_resolve(s);
  /* past the step's last wait for the device: the queued copies are done */
  for (int64_t u = 0; s->losses && u < s->nmb; u++) {
    double loss = 0;
    if (s->losses[u] && l2l_sum(&loss, s->losses[u]) == L2L_OK) s->loss_sum += loss;
    l2l_tensor_free(s->losses[u]);
  }
  free(s->losses);
  s->losses = NULL;
  relay_batch_fields_free(&s->staged);
  for (int i = 0; i < 2; i++) {
    if (s->out[i]) l2l_tensor_free(s->out[i]->src);
    relay_copy_job_free(s->out[i]);
    if (s->params[i]) {
      for (int r = 0; r < s->params[i]->nrec; r++) l2l_tensor_free(s->params[i]->value[r]);
      relay_params_job_free(s->params[i]);
    }
    if (s->gout[i]) relay_grads_release(&s->gout[i]->job);
    l2l_tensor_free(s->gslot[i]);
    l2l_tensor_free(s->gout_slot[i]);
  }
  for (int i = 0; i < s->nslots; i++) l2l_tensor_free(s->pslots[i].t);
  free(s->pslots);
  free(s->slot_use);
  for (int r = 0; r < s->ngrads; r++) l2l_tensor_free(s->grads[r]);
  for (int k = 0; k <= s->L; k++) {
    for (int64_t u = 0; u < s->nmb; u++) {
      if (s->x && s->x[k]) relay_act_free(run, &s->x[k][u]);
      if (s->g && s->g[k]) relay_act_free(run, &s->g[k][u]);
      if (s->swap && s->swap[k] && s->swap[k][u]) free(s->swap[k][u]);
      if (s->saved && s->saved[k] && s->saved[k][u]) {
        if (s->where[k][u]) relay_count_stash(run, -(int64_t)saved_pool_bytes(s->saved[k][u]));
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
  relay_act_free(run, &s->scratch);
  relay_mb_inputs_free(&s->mb_in);
  order_free(&s->order);
  free(s->active);
  /* Parameters back to their own tensors whatever happened. */
  for (int i = 0; i < run->count; i++) {
    l2l_layer *layer = run->layers[i].layer;
    for (int r = 0; r < l2l_layer_param_count(layer); r++)
      param_bind(l2l_layer_param(layer, r), NULL, NULL);
  }
}

l2l_status relay_step_alloc(struct step *s) {
  int n = s->L + 1;
  s->x = calloc((size_t)n, sizeof *s->x);
  s->g = calloc((size_t)n, sizeof *s->g);
  s->saved = calloc((size_t)n, sizeof *s->saved);
  s->swap = calloc((size_t)n, sizeof *s->swap);
  s->where = calloc((size_t)n, sizeof *s->where);
  s->losses = calloc((size_t)s->nmb, sizeof *s->losses);
  if (!s->x || !s->g || !s->saved || !s->swap || !s->where || !s->losses)
    return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  TRY(relay_batch_stage(s));
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
