/* SPDX-License-Identifier: MIT */
/* slots.c — parameter and gradient slots on the device: their sizes, which slot a visit's
 * parameters copy into, binding them to the layer, and sending the gradients out.
 *
 * Purpose: L2L's double buffer. The visit running holds one parameter slot while the next
 * visit's parameters copy into the least recently used other one; a slot that still
 * holds a layer as the EPS has it now is reused without a copy. Two gradient slots
 * alternate between visits: one computes while the other's gradients go to the EPS.
 * Must never: copy a record before its pending update is done, or reuse a gradient slot
 * before its gradients are out.
 */
#include <stdlib.h>
#include <string.h>

#include "relay.h"

/* What a slot holds of a record (param), in which dtype, and its bytes there (src/order,
   which the planner counts by too). */
static l2l_dtype slot_dtype(const l2l_relay *run, const l2l_param *param,
                            enum order_slot_content content) {
  return order_slot_dtype(param, content, run->config.precision, run->config.grad_precision);
}

static uint64_t slot_bytes(const l2l_relay *run, const l2l_param *param,
                           enum order_slot_content content) {
  return order_param_slot_bytes(param, content, run->config.precision,
                                run->config.grad_precision, false);
}

/* Bytes of a device slot: the largest active layer's. */
static uint64_t slot_size(const struct step *s, enum order_slot_content content) {
  return order_slot_size(&s->order, content, s->run->config.precision,
                         s->run->config.grad_precision);
}

/* ---------------------------------------------------------------- parameters */

/* A tensor for a record (param) at byte *offset of a slot holding `content`, shaped like
   its value (the master's shape, bound to a slot or not); *offset moves past it. */
static l2l_status slot_view(l2l_tensor **out, const struct step *s, const l2l_tensor *slot,
                            uint64_t *offset, const l2l_param *param,
                            enum order_slot_content content) {
  TRY(tensor_view_bytes(out, slot, *offset, slot_dtype(s->run, param, content),
                        param_value(param)));
  *offset += slot_bytes(s->run, param, content);
  return L2L_OK;
}

/* Zeroes the first `bytes` of a slot with one fill (zero bits are 0.0 in every float
   dtype), not one per record. */
static l2l_status zero_slot_bytes(const l2l_tensor *slot, uint64_t bytes) {
  if (bytes == 0) return L2L_OK;
  l2l_tensor *used = NULL;
  l2l_status status = l2l_tensor_view_rows(&used, slot, 0, (int64_t)bytes);
  if (status == L2L_OK) status = l2l_tensor_fill(used, 0.0);
  l2l_tensor_free(used);
  return status;
}

/* L2L_GRADS_OUT: "copy" makes a device that is host memory (the CPU backend's) a GPU's to
   the relay, its gradients copied out and its small f32 masters pinned; unset, as it is.
   *value: another value, which a step refuses (NULL: none). */
static bool grads_copied(const char **value) {
  const char *env = getenv("L2L_GRADS_OUT");
  bool copy = env != NULL && strcmp(env, "copy") == 0;
  *value = env != NULL && !copy ? env : NULL;
  return copy;
}

bool relay_device_is_host(void) {
  const char *bad;
  return backend_device_is_host() && !grads_copied(&bad);
}

/* The slots (bytes), sized for the largest active layer. */
l2l_status relay_slots_new(struct step *s) {
  int64_t shape[1] = {(int64_t)slot_size(s, ORDER_SLOT_VALUES)};
  int64_t gshape[1] = {(int64_t)slot_size(s, ORDER_SLOT_GRADS)};
  int64_t oshape[1] = {(int64_t)slot_size(s, ORDER_SLOT_GRADS_OUT)};
  const char *bad = NULL;
  (void)grads_copied(&bad);
  if (bad != NULL) return FAIL(L2L_ERR_INVALID, "L2L_GRADS_OUT is \"%s\": copy, or unset", bad);
  s->host_device = relay_device_is_host();
  s->nslots = s->run->config.param_slots;
  s->pslots = calloc((size_t)s->nslots, sizeof *s->pslots);
  s->slot_use = calloc((size_t)s->nslots, sizeof *s->slot_use);
  if (s->pslots == NULL || s->slot_use == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int i = 0; i < s->nslots; i++) {
    s->slot_use[i] = (struct order_slot){.held = -1, .last_used = -1};
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

/* Whether parameter slot i, which holds the visit's layer, holds it as the EPS has it now
   (no update since its copy). */
struct slot_question {
  struct step *s;
  const struct params_job *pj;
};

static bool slot_current(void *ctx, int i) {
  const struct slot_question *q = ctx;
  for (int r = 0; r < q->pj->nrec; r++) {
    int64_t now = eps_settled_updates(&q->s->run->eps, q->pj->rec[r]);
    if (now < 0 || now != q->s->pslots[i].updates[r]) return false;
  }
  return true;
}

/* Queues the copy of the parameters of the schedule's visit `visit` into a parameter slot
   for the visit about to run (which 0) or the one after it (which 1; the running visit
   keeps its slot). */
l2l_status relay_params_queue(struct step *s, int which, int visit) {
  l2l_relay *run = s->run;
  int k = s->order.visits[visit].k;
  l2l_layer *layer = active_layer(s, k)->layer;
  struct params_job *pj = calloc(1, sizeof *pj);
  if (pj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a copy job");
  s->params[which] = pj;
  pj->run = run;
  pj->layer = s->active[k];
  pj->nrec = l2l_layer_param_count(layer);
  for (int r = 0; r < pj->nrec; r++)
    pj->rec[r] = eps_find(&run->eps, l2l_layer_param(layer, r));
  bool current = false;
  int busy = which == 1 && s->params[0] != NULL ? s->params[0]->slot : -1;
  struct slot_question q = {s, pj};
  pj->slot = order_slot_choose(s->slot_use, s->nslots, k, busy, s->slot_ticks++, slot_current,
                               &q, &current);
  uint64_t offset = 0;
  int copies = 0;
  for (int r = 0; r < pj->nrec; r++) {
    pj->device[r] = eps_on_device(pj->rec[r]);
    copies += !pj->device[r];
    if (pj->device[r]) {   /* bound where it lives (its slot bytes stay unused) */
      const l2l_tensor *source = eps_device_source(pj->rec[r]);
      TRY(tensor_view_bytes(&pj->value[r], source, 0, (l2l_dtype)l2l_tensor_dtype(source), source));
      continue;
    }
    TRY(slot_view(&pj->value[r], s, s->pslots[pj->slot].t, &offset, l2l_layer_param(layer, r),
                  ORDER_SLOT_VALUES));
  }
  pj->job.run = relay_params_run;
  pj->releases = s->order.visits[visit].kind == ORDER_REBUILD && active_layer(s, k)->frozen;
  if (current || copies == 0) {   /* done already, or on the device: nothing to copy */
    if (current) memcpy(pj->updates, s->pslots[pj->slot].updates, sizeof pj->updates);
    for (int r = 0; pj->releases && r < pj->nrec; r++)
      if (!pj->device[r]) eps_release(&run->eps, pj->rec[r], pj->layer);
    pj->job.queue = &run->h2d;
    pj->job.done = true;
    return L2L_OK;
  }
  relay_copy_thread_push(&run->h2d, &pj->job);
  return L2L_OK;
}

/* Waits for the gradients of slot `slot`'s last visit to be out (the slot is then free).
   A failure there is the run's (relay_check_async), not this visit's. */
void relay_grads_wait(struct step *s, int slot) {
  struct grads_job *gj = s->gout[slot];
  if (gj == NULL) return;
  double t0 = core_now();
  l2l_status status = job_wait(&gj->job);
  relay_waited(s, L2L_WAIT_COPY_GRADS, t0);
  if (status == L2L_OK && s->host_device && gj->drains) s->gzero[slot] = true;
  relay_grads_release(&gj->job);
  s->gout[slot] = NULL;
}

/* The compute thread waits for a copy job onto the device (`cause`: of parameters or of
   activations) whose copy ended at `done` (taken over). The host's wait counts in
   wait_copy; whether the device waited too is known once the step is done
   (relay_stamped_resolve): from a stamp queued now, after the work the copy hides under,
   to `done`. */
l2l_status relay_copy_wait(struct step *s, struct core_job *job, struct core_stamp *done,
                           enum profile_wait cause, int layer, int micro_batch) {
  struct core_stamp before;
  device_stamp(&before);
  l2l_status status = job_wait(job);
  relay_waited(s, cause, before.host);
  if (done->host > 0) /* a copy that ran, not parameters already in their slot */
    relay_stamped_add(s, &before, done, layer, micro_batch, L2L_PHASE_WAIT_COPY);
  else
    device_stamp_release(&before);
  return status;
}

/* Waits for slot 0's parameters (the visit about to run) and binds them with device
   gradients when the visit computes any. */
l2l_status relay_params_bind(struct step *s, int k, bool grads) {
  l2l_relay *run = s->run;
  struct params_job *pj = s->params[0];
  l2l_layer *layer = active_layer(s, k)->layer;
  double t0 = core_now();
  /* The copy job waits for the updates too; waiting here first tells the two waits apart. */
  for (int r = 0; r < pj->nrec; r++) eps_wait_record(&run->eps, pj->rec[r]);
  relay_waited(s, L2L_WAIT_UPDATE, t0);
  double t1 = core_now();
  if (t1 - t0 > 1e-5)
    timeline_add(&run->timeline, s->active[k], -1, L2L_PHASE_WAIT_UPDATE, THREAD_COMPUTE, t0, t1);
  TRY(relay_copy_wait(s, &pj->job, &pj->done, L2L_WAIT_COPY_PARAMS, s->active[k], -1));
  s->ngrads = 0;
  if (grads) relay_grads_wait(s, s->gs);
  uint64_t offset = 0;
  for (int r = 0; r < pj->nrec; r++) {
    if (grads) {
      TRY(slot_view(&s->grads[r], s, s->gslot[s->gs], &offset, l2l_layer_param(layer, r),
                    ORDER_SLOT_GRADS));
      s->ngrads = r + 1;
    }
    param_bind(l2l_layer_param(layer, r), pj->value[r], grads ? s->grads[r] : NULL);
  }
  if (grads && !s->gzero[s->gs]) TRY(zero_slot_bytes(s->gslot[s->gs], offset));
  if (grads) s->gzero[s->gs] = false;
  return L2L_OK;
}

/* After a visit: parameters unbound and freed; gradients of a trainable visit go out to
   the EPS (the job owns them from here), others are dropped. */
l2l_status relay_params_done(struct step *s, int k, bool give) {
  l2l_relay *run = s->run;
  struct params_job *pj = s->params[0];
  l2l_layer *layer = active_layer(s, k)->layer;
  uint64_t grad_bytes = 0;   /* of the gradient slot, the records' */
  for (int r = 0; r < pj->nrec; r++) {
    param_bind(l2l_layer_param(layer, r), NULL, NULL);
    l2l_tensor_free(pj->value[r]);
    if (r < s->ngrads) grad_bytes += slot_bytes(run, l2l_layer_param(layer, r), ORDER_SLOT_GRADS);
    /* a frozen layer's rebuild of a record on the device has read it once its kernels are
       queued: its update, queued after them, may come now */
    if (pj->releases && pj->device[r]) eps_release(&run->eps, pj->rec[r], pj->layer);
  }
  s->slot_use[pj->slot].held = k;
  memcpy(s->pslots[pj->slot].updates, pj->updates, sizeof pj->updates);
  relay_params_job_free(pj);
  s->params[0] = s->params[1];
  s->params[1] = NULL;
  if (!give) {
    /* Dropped gradients (a frozen layer's): the slot is zeroed here instead. */
    for (int r = 0; r < s->ngrads; r++) l2l_tensor_free(s->grads[r]);
    if (s->ngrads > 0)
      s->gzero[s->gs] = s->host_device && zero_slot_bytes(s->gslot[s->gs], grad_bytes) == L2L_OK;
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
    gj->rec[r] = eps_find(&run->eps, l2l_layer_param(layer, r));
    gj->grad[r] = s->grads[r];
  }
  s->ngrads = 0;
  /* 16-bit gradients: rounded here, on the device, into the slot's out slot, so that the
     copy moves half the bytes (all of the visit's in one cast: one launch on a GPU); the
     f32 slot is then cleared by its next visit. */
  uint64_t offset = 0;
  l2l_tensor *out[MAX_RECORDS] = {0}, *from[MAX_RECORDS] = {0};
  int which[MAX_RECORDS], pairs = 0;
  l2l_status cast_status = L2L_OK;
  for (int r = 0; r < gj->nrec && cast_status == L2L_OK; r++) {
    const l2l_param *param = l2l_layer_param(layer, r);
    if (slot_dtype(run, param, ORDER_SLOT_GRADS_OUT) == L2L_F32) continue;
    cast_status = slot_view(&out[pairs], s, s->gout_slot[s->gs], &offset, param, ORDER_SLOT_GRADS_OUT);
    if (cast_status == L2L_OK) from[pairs] = gj->grad[r], which[pairs++] = r;
  }
  if (cast_status == L2L_OK) cast_status = backend_tensors_cast(out, (const l2l_tensor *const *)from, pairs);
  for (int j = 0; j < pairs; j++) {
    if (cast_status != L2L_OK) {
      l2l_tensor_free(out[j]);
      continue;
    }
    l2l_tensor_free(gj->grad[which[j]]);
    gj->grad[which[j]] = out[j];
    gj->drains = false;
  }
  if (cast_status != L2L_OK) {
    relay_grads_release(&gj->job);
    return cast_status;
  }
  /* Records on the device: their gradients added there now, on this thread (queued in the
     device's order, before the slot's next visit clears it); the job takes the others.
     With per-layer clipping the visit's factor is found on the device from all its
     gradients first (a visit's records are all in one place: plan/place.c moves the
     layers that share a record together). */
  int there = 0;
  for (int r = 0; r < gj->nrec; r++) there += eps_on_device(gj->rec[r]);
  bool clipped = gj->clip > 0 && there > 0;
  l2l_status clip_status =
      !clipped ? L2L_OK
      : there < gj->nrec ? FAIL(L2L_ERR_STATE, "layer %d: per-layer clipping of a visit with %d of "
                                "its %d records on the device (relay bug)", gj->layer, there, gj->nrec)
                         : eps_device_clip(&run->eps, gj->grad, gj->nrec, gj->clip);
  if (clip_status != L2L_OK) {
    relay_grads_release(&gj->job);
    return clip_status;
  }
  int out_n = 0;
  for (int r = 0; r < gj->nrec; r++) {
    if (!eps_on_device(gj->rec[r])) {
      gj->rec[out_n] = gj->rec[r];
      gj->grad[out_n++] = gj->grad[r];
      continue;
    }
    eps_give_device(&run->eps, gj->rec[r], gj->grad[r], clipped, gj->layer);
    l2l_tensor_free(gj->grad[r]);
    gj->drains = false;   /* (its part of the slot is left as it was) */
  }
  gj->nrec = out_n;
  if (out_n == 0) {   /* nothing goes out */
    relay_grads_release(&gj->job);
    return L2L_OK;
  }
  gj->job.run = relay_grads_run;
  s->gout[s->gs] = gj;
  relay_copy_thread_push(&run->d2h, &gj->job);
  return L2L_OK;
}
