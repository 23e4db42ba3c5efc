/* SPDX-License-Identifier: MIT */
/* acts.c — activations and stashes: a micro-batch's input on the device (fetched from
 * the host stash ahead of its use, unless the visit before left it there), outputs
 * stashed out to pinned host memory (their device copies kept for the next visit where
 * the order says: walk.h), a micro-batch's rows of the batch's tokens, targets and masks
 * (staged in pinned memory as the step begins, copied to the device queued), and the
 * heads' losses copied back queued.
 *
 * Purpose: keep no more than two micro-batches of a host-stashed boundary on their way to
 * the host beside the kept ones, and overlap every copy with the compute of the
 * micro-batch before.
 * Must never: free a device tensor a copy still reads (stash-outs are retired in order;
 * one that kept its device copy is waited for when that copy is released).
 */
#include <stdio.h>
#include <string.h>

#include "relay.h"

/* Starts bringing a[u] to the device if it is only on the host. */
l2l_status relay_act_prefetch(struct step *s, struct act *a, int layer, int64_t u) {
  if (a->dev != NULL || a->in != NULL || a->host == NULL) return L2L_OK;
  l2l_tensor *dev = NULL;
  TRY(relay_tensor_like(&dev, L2L_POOL_DEVICE, a->host));
  l2l_status status = relay_copy_queue(&a->in, s->run, &s->run->h2d, dev, a->host, layer, (int)u,
                                 L2L_PHASE_STASH_IN);
  if (status != L2L_OK) l2l_tensor_free(dev);
  return status;
}

/* a[u] on the device, waiting for its copy if need be. */
l2l_status relay_act_on_device(struct step *s, struct act *a, int layer, int64_t u,
                               l2l_tensor **out) {
  TRY(relay_act_prefetch(s, a, layer, u));
  if (a->in) {
    l2l_status status = relay_copy_wait(s, &a->in->job, &a->in->done, L2L_WAIT_COPY_ACTS_IN,
                                        layer, (int)u);
    a->dev = a->in->dst;
    relay_copy_job_free(a->in);
    a->in = NULL;
    TRY(status);
  }
  if (a->dev == NULL) return FAIL(L2L_ERR_STATE, "layer %d, micro-batch %lld: an input is missing (relay bug)",
                                  layer, (long long)u);
  *out = a->dev;
  return L2L_OK;
}

/* The device copy of a[u] is no longer needed (the host copy, if any, stays): freed once
   a stash-out that kept it has read it. */
l2l_status relay_act_release_device(struct step *s, struct act *a) {
  l2l_status status = L2L_OK;
  if (a->out) {
    double t0 = core_now();
    status = job_wait(&a->out->job);
    relay_waited(s, L2L_WAIT_COPY_ACTS_OUT, t0);
    relay_copy_job_free(a->out);
    a->out = NULL;
  }
  l2l_tensor_free(a->dev);
  a->dev = NULL;
  return status;
}

/* Retires the oldest stash-outs until at most `keep` are in flight: each one's device
   tensor is freed once it is copied, so no more than two micro-batches of a host-stashed
   boundary wait on the device. */
l2l_status relay_out_throttle(struct step *s, int keep) {
  while ((s->out[0] != NULL) + (s->out[1] != NULL) > keep) {
    double t0 = core_now();
    l2l_status status = job_wait(&s->out[0]->job);
    relay_waited(s, L2L_WAIT_COPY_ACTS_OUT, t0);
    l2l_tensor_free(s->out[0]->src);
    relay_copy_job_free(s->out[0]);
    s->out[0] = s->out[1];
    s->out[1] = NULL;
    TRY(status);
  }
  return L2L_OK;
}

/* Sends a[u]'s device tensor to a new host stash as `how` says (order.h): the device
   tensor goes when copied (HOST; at most two such copies in flight), or stays for the next
   visit, the copy waited for when it is released (BOTH); DEVICE sends nothing. */
l2l_status relay_act_stash_out(struct step *s, struct act *a, int layer, int64_t u,
                               enum order_out how) {
  if (how == ORDER_OUT_DEVICE) return L2L_OK;
  if (how == ORDER_OUT_HOST) TRY(relay_out_throttle(s, 1));
  l2l_tensor *host = NULL;
  TRY(relay_tensor_like(&host, L2L_POOL_PINNED, a->dev));
  struct copy_job *cj = NULL;
  l2l_status status = relay_copy_queue(&cj, s->run, &s->run->d2h, host, a->dev, layer, (int)u,
                                 L2L_PHASE_STASH_OUT);
  if (status != L2L_OK) {
    l2l_tensor_free(host);
    return status;
  }
  relay_count_stash(s->run, (int64_t)pool_accounted(relay_tensor_bytes(host)));
  a->host = host;
  if (how == ORDER_OUT_BOTH) {
    a->out = cj;
    return L2L_OK;
  }
  a->dev = NULL;
  s->out[s->out[0] ? 1 : 0] = cj;
  return L2L_OK;
}

/* ---------------------------------------------------------------- one micro-batch's inputs */

/* Samples in micro-batch u (the last may be smaller). */
int64_t relay_mb_rows(const struct step *s, int64_t u) {
  int64_t first = u * s->mb;
  return s->mb < s->B - first ? s->mb : s->B - first;
}

/* A batch field in pinned memory (NULL stays NULL). */
static l2l_status stage(l2l_tensor **out, const l2l_tensor *t) {
  if (t == NULL) return L2L_OK;
  TRY(relay_tensor_like(out, L2L_POOL_PINNED, t));
  return l2l_tensor_copy(*out, t);
}

l2l_status relay_batch_stage(struct step *s) {
  struct batch_fields *b = &s->staged;
  TRY(stage(&b->tokens, s->in->tokens));
  TRY(stage(&b->types, s->in->token_types));
  TRY(stage(&b->targets, s->in->targets));
  return stage(&b->mask, s->in->key_mask);
}

void relay_batch_fields_free(struct batch_fields *b) {
  l2l_tensor_free(b->tokens);
  l2l_tensor_free(b->types);
  l2l_tensor_free(b->targets);
  l2l_tensor_free(b->mask);
  memset(b, 0, sizeof *b);
}

/* Micro-batch u's rows of a staged field copied to the device, queued (small: ids and
   masks). */
static l2l_status rows_to_device(struct step *s, l2l_tensor **out, const l2l_tensor *t, int64_t u) {
  if (t == NULL) return L2L_OK;
  l2l_tensor *view = NULL;
  TRY(l2l_tensor_view_rows(&view, t, u * s->mb, relay_mb_rows(s, u)));
  l2l_status status = relay_tensor_like(out, L2L_POOL_DEVICE, view);
  if (status == L2L_OK) status = backend_tensor_copy_queued(*out, view);
  if (status == L2L_OK) relay_count_bytes(s->run, &s->run->h2d_bytes, relay_tensor_bytes(view));
  l2l_tensor_free(view);
  return status;
}

l2l_status relay_loss_queue(struct step *s, int64_t u, const l2l_tensor *losses) {
  TRY(relay_tensor_like(&s->losses[u], L2L_POOL_PINNED, losses));
  return backend_tensor_copy_queued(s->losses[u], losses);   /* (a failed one: freed with the step) */
}

void relay_mb_inputs_free(struct mb_inputs *m) {
  relay_batch_fields_free(&m->f);
  memset(m, 0, sizeof *m);
}

l2l_status relay_mb_inputs(struct step *s, struct mb_inputs *m, int k, int64_t u, bool training) {
  memset(m, 0, sizeof *m);
  /* each layer gets the batch fields of its role: tokens, targets, or the key mask */
  enum layer_role role = layer_role(active_layer(s, k)->layer);
  l2l_status status = L2L_OK;
  if (role == L2L_ROLE_INPUT) {
    status = rows_to_device(s, &m->f.tokens, s->staged.tokens, u);
    if (status == L2L_OK) status = rows_to_device(s, &m->f.types, s->staged.types, u);
  } else if (role == L2L_ROLE_HEAD) {
    status = rows_to_device(s, &m->f.targets, s->staged.targets, u);
  } else {
    status = rows_to_device(s, &m->f.mask, s->staged.mask, u);
  }
  if (status != L2L_OK) {
    relay_mb_inputs_free(m);
    return status;
  }
  m->batch = (l2l_layer_batch){.tokens = m->f.tokens, .token_types = m->f.types,
                               .targets = m->f.targets, .key_mask = m->f.mask,
                               .first_sample = s->sample_base + u * s->mb, .seed = s->run->config.seed,
                               .step = (uint64_t)s->run->steps, .training = training,
                               .loss_scale = s->loss_scale};
  return L2L_OK;
}

l2l_status relay_new_activation(struct step *s, l2l_tensor **out, int64_t u) {
  int64_t shape[3] = {relay_mb_rows(s, u), s->S, s->D};
  return l2l_tensor_new(out, L2L_POOL_DEVICE, L2L_F32, 3, shape);
}

/* Layer calls on this thread since `start`: compute, timed on the device's clock. */
void relay_compute_done(struct step *s, int layer, int64_t u, int phase,
                        struct core_stamp *start) {
  struct core_stamp end;
  device_stamp(&end);
  relay_stamped_add(s, start, &end, layer, (int)u, phase);
}
