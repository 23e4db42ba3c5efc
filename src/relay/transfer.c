/* SPDX-License-Identifier: MIT */
/* transfer.c — the jobs of the relay's copy threads: copies of activations, KARMA swaps
 * of saved states, a layer's parameters onto the device, and a visit's gradients out to
 * the EPS.
 *
 * Purpose: each job runs on the host-to-device or device-to-host thread, in the order it
 * was queued (like a CUDA stream), after the device mark taken when it was queued; its
 * bytes and busy time go into the relay's counters and timeline.
 * Must never: free a tensor the compute thread made (it frees them after waiting), or
 * touch Lua.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay.h"

void relay_count_bytes(l2l_relay *run, uint64_t *counter, uint64_t bytes) {
  pthread_mutex_lock(&run->lock);
  *counter += bytes;
  pthread_mutex_unlock(&run->lock);
}

/* Host bytes holding stashed activations or saved states (signed change). */
void relay_count_stash(l2l_relay *run, int64_t bytes) {
  pthread_mutex_lock(&run->lock);
  run->stash_now += (uint64_t)bytes;
  if (run->stash_now > run->stash_peak) run->stash_peak = run->stash_now;
  pthread_mutex_unlock(&run->lock);
}

uint64_t relay_tensor_bytes(const l2l_tensor *t) {
  return (uint64_t)l2l_tensor_numel(t) * l2l_dtype_size((l2l_dtype)l2l_tensor_dtype(t));
}

l2l_status relay_tensor_like(l2l_tensor **out, l2l_pool_kind pool, const l2l_tensor *t) {
  return tensor_new_like(out, pool, (l2l_dtype)l2l_tensor_dtype(t), t);
}

/* ---------------------------------------------------------------- copy jobs */

/* Queues a job for a copy thread. On a GPU the kernels queued so far (which write what
   the job copies out, or still read what it overwrites) may not have run yet: the job
   carries a mark after them, which its worker waits for (core/queue.c). */
void relay_copy_thread_push(struct core_queue *q, struct core_job *job) {
  job->after = device_mark();
  queue_push(q, job);
}

void relay_copy_job_free(struct copy_job *cj) {
  if (cj == NULL) return;
  device_stamp_release(&cj->done);
  free(cj);
}

static void copy_run(struct core_job *job, int thread) {
  struct copy_job *cj = (struct copy_job *)job;
  double t0 = core_now();
  l2l_status status = l2l_tensor_copy(cj->dst, cj->src);
  if (status != L2L_OK) job_fail(job, status);
  uint64_t bytes = relay_tensor_bytes(cj->src);
  relay_count_bytes(cj->run, thread == THREAD_H2D ? &cj->run->h2d_bytes : &cj->run->d2h_bytes, bytes);
  timeline_add(&cj->run->timeline, cj->layer, cj->micro_batch, cj->phase, thread, t0,
               core_now());
  /* compute waits only for copies onto the device (relay_copy_wait reads this) */
  if (thread == THREAD_H2D) device_stamp(&cj->done);
}

l2l_status relay_copy_queue(struct copy_job **out, l2l_relay *run, struct core_queue *q,
                            l2l_tensor *dst, l2l_tensor *src, int layer, int micro_batch,
                            int phase) {
  struct copy_job *cj = calloc(1, sizeof *cj);
  if (cj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a copy job");
  *cj = (struct copy_job){.run = run, .dst = dst, .src = src, .layer = layer,
                          .micro_batch = micro_batch, .phase = phase};
  cj->job.run = copy_run;
  relay_copy_thread_push(q, &cj->job);
  *out = cj;
  return L2L_OK;
}

static void swap_run(struct core_job *job, int thread) {
  struct swap_job *sj = (struct swap_job *)job;
  double t0 = core_now();
  uint64_t bytes = saved_pool_bytes(sj->saved);
  /* the one job that makes and frees device memory: on the relay's meter */
  struct pool_meter *before = pool_meter_bind(&sj->run->device_meter);
  l2l_status status = saved_move(sj->saved, sj->pool);
  pool_meter_bind(before);
  if (status != L2L_OK) job_fail(job, status);
  relay_count_bytes(sj->run, thread == THREAD_H2D ? &sj->run->h2d_bytes : &sj->run->d2h_bytes, bytes);
  if (status == L2L_OK) relay_count_stash(sj->run, sj->pool != L2L_POOL_DEVICE ? (int64_t)bytes : -(int64_t)bytes);
  timeline_add(&sj->run->timeline, sj->layer, sj->micro_batch, sj->phase, thread, t0,
               core_now());
}

/* Queues the move of saved[k][u] to `pool` (no-op if it is there or on its way). */
l2l_status relay_swap_queue(l2l_relay *run, struct core_queue *q, struct swap_job **slot,
                            l2l_saved *saved, l2l_pool_kind pool, int layer, int64_t u) {
  if (*slot != NULL) return L2L_OK;
  struct swap_job *sj = calloc(1, sizeof *sj);
  if (sj == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a swap job");
  *sj = (struct swap_job){.run = run, .saved = saved, .pool = pool, .layer = layer,
                          .micro_batch = (int)u,
                          .phase = pool != L2L_POOL_DEVICE ? L2L_PHASE_SWAP_OUT : L2L_PHASE_SWAP_IN};
  sj->job.run = swap_run;
  *slot = sj;
  relay_copy_thread_push(q, &sj->job);
  return L2L_OK;
}

/* Waits for a swap in flight; the saved state is then where the job took it. */
l2l_status relay_swap_wait(struct step *s, struct swap_job **slot) {
  if (*slot == NULL) return L2L_OK;
  double t0 = core_now();
  l2l_status status = job_wait(&(*slot)->job);
  bool in = (*slot)->pool == L2L_POOL_DEVICE;
  relay_waited(s, in ? L2L_WAIT_COPY_ACTS_IN : L2L_WAIT_COPY_ACTS_OUT, t0);
  free(*slot);
  *slot = NULL;
  return status;
}

void relay_params_job_free(struct params_job *pj) {
  device_stamp_release(&pj->done);
  free(pj);
}

/* dst[i] := src[i] for i < n on this copy lane: each copy queued, the last one waited
   for, which waits for them all (a lane's stream keeps their order). One wait a visit,
   not one a record: on a GPU each wait costs its wake-up, whatever the copy's size (the
   124M profile: about 0.1 ms a copy of a 3 KiB record). *done: the copies that went
   through; on a failure those are waited for too, so that the caller may free what they
   read and wrote. */
static l2l_status lane_copies(int *done, l2l_tensor *const *dst, const l2l_tensor *const *src,
                              int n) {
  l2l_status status = L2L_OK;
  int i = 0;
  for (; i < n && status == L2L_OK; i++)
    status = i < n - 1 ? backend_tensor_copy_queued(dst[i], src[i]) : l2l_tensor_copy(dst[i], src[i]);
  *done = status == L2L_OK ? n : i - 1;
  if (status != L2L_OK) device_wait_queued();
  return status;
}

void relay_params_run(struct core_job *job, int thread) {
  struct params_job *pj = (struct params_job *)job;
  double t0 = core_now();
  l2l_tensor *dst[MAX_RECORDS];
  const l2l_tensor *src[MAX_RECORDS];
  int copied[MAX_RECORDS], n = 0, done = 0;
  for (int i = 0; i < pj->nrec; i++) {
    if (pj->device[i]) continue;   /* bound where it lives */
    eps_wait_record(&pj->run->eps, pj->rec[i]);
    pj->updates[i] = eps_settled_updates(&pj->run->eps, pj->rec[i]);
    dst[n] = pj->value[i], src[n] = eps_device_source(pj->rec[i]), copied[n++] = i;
  }
  l2l_status status = lane_copies(&done, dst, src, n);
  if (status != L2L_OK) job_fail(job, status);
  for (int c = 0; c < done; c++) {
    relay_count_bytes(pj->run, &pj->run->h2d_bytes, relay_tensor_bytes(dst[c]));
    /* a frozen layer's rebuild has its copy (done when lane_copies returns): the record
       may be updated now */
    if (pj->releases) eps_release(&pj->run->eps, pj->rec[copied[c]], pj->layer);
  }
  timeline_add(&pj->run->timeline, pj->layer, -1, L2L_PHASE_PARAMS_IN, thread, t0,
               core_now());
  device_stamp(&pj->done);
}

void relay_grads_release(struct core_job *job) {
  struct grads_job *gj = (struct grads_job *)job;
  for (int i = 0; i < gj->nrec; i++) l2l_tensor_free(gj->grad[i]);
  free(gj);
}

void relay_grads_run(struct core_job *job, int thread) {
  struct grads_job *gj = (struct grads_job *)job;
  l2l_relay *run = gj->run;
  const bool host_readable = gj->host_readable;
  double t0 = core_now();
  l2l_tensor *incoming[MAX_RECORDS] = {0};
  const l2l_tensor *host[MAX_RECORDS] = {0};
  l2l_status status = L2L_OK;
  for (int i = 0; i < gj->nrec && status == L2L_OK; i++) {
    host[i] = gj->grad[i];
    if (!host_readable) {
      status = relay_tensor_like(&incoming[i], L2L_POOL_PINNED, gj->grad[i]);
      host[i] = incoming[i];
    }
  }
  int done = 0;
  if (status == L2L_OK && !host_readable)
    status = lane_copies(&done, incoming, (const l2l_tensor *const *)gj->grad, gj->nrec);
  if (status == L2L_OK)
    for (int i = 0; i < gj->nrec; i++)
      relay_count_bytes(run, &run->d2h_bytes, relay_tensor_bytes(gj->grad[i]));
  if (status != L2L_OK) {
    timeline_add(&run->timeline, gj->layer, -1, L2L_PHASE_GRADS_OUT, thread, t0, core_now());
    for (int i = 0; i < gj->nrec; i++) l2l_tensor_free(incoming[i]);
    pthread_mutex_lock(&run->lock);
    if (run->async_status == L2L_OK) {
      run->async_status = status;
      snprintf(run->async_message, sizeof run->async_message, "%s", l2l_last_error());
    }
    pthread_mutex_unlock(&run->lock);
    return;   /* the step fails at its end (relay_check_async) and abandons its gradients */
  }
  float scale = eps_clip_scale(host, gj->nrec, gj->clip);
  for (int i = 0; i < gj->nrec; i++) {   /* absorbing leaves the slot zero for its next visit */
    eps_give_gradient(&run->eps, gj->rec[i], host_readable ? gj->grad[i] : incoming[i],
                      host_readable, scale, gj->layer);
  }
  timeline_add(&run->timeline, gj->layer, -1, L2L_PHASE_GRADS_OUT, thread, t0, core_now());
}
