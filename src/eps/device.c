/* SPDX-License-Identifier: MIT */
/* device.c — records placed on the device (issue 49): a gradient's add into the record's
 * accumulator, its update, its norm, its clear, its 16-bit copy and the flag that says its
 * gradient was not finite, each through the backend's ops table.
 *
 * Purpose: a record whose master, accumulator and optimizer state fit on the device is
 * updated there, in the device's order, by the same optimizer (the backend's optim_update:
 * on the CPU backend the EPS's own host kernels in the EPS's chunks, so the bits are the
 * host placement's; on a GPU kernels/optim.cu), so no byte of it crosses the link or
 * touches host memory in a step. The host never waits to learn whether a gradient was
 * finite: the add sets the record's flag on the device, the eager update reads it there,
 * and the step's end reads the flags back once the step's work is done (eps_device_skipped).
 * Called on the relay's compute thread (the adds and eager updates as its visits end, the
 * deferred ones at the release), never on a worker.
 * Must never: read a device tensor's bytes from the host but through the ops table, or
 * call a file of src/eps/ but record.c (its one lock taken: the EPS's, to count a skip).
 */
#include "record.h"

static const struct backend_ops *ops(void) { return backend_for(L2L_POOL_DEVICE); }

static float *f32_of(const l2l_tensor *t) { return t ? (float *)l2l_tensor_data(t) : NULL; }

l2l_status eps_device_add(struct eps_record *rec, const l2l_tensor *grad, float scale,
                          bool flagged) {
  return ops()->grad_add(f32_of(rec->grad), l2l_tensor_data(grad),
                         (l2l_dtype)l2l_tensor_dtype(grad), scale, l2l_tensor_numel(grad),
                         flagged ? (int32_t *)l2l_tensor_data(rec->device_flag) : NULL);
}

l2l_status eps_device_update(struct eps_record *rec, const struct optim_hyper *h, bool flagged) {
  TRY(ops()->optim_update(f32_of(rec->master), f32_of(rec->state[0]), f32_of(rec->state[1]),
                          f32_of(rec->grad), l2l_tensor_numel(rec->master), h,
                          flagged ? (const int32_t *)l2l_tensor_data(rec->device_flag) : NULL));
  rec->updates++;   /* (taken back at the step's end if its flag skipped it) */
  rec->flag_armed = flagged;
  return L2L_OK;
}

l2l_status eps_device_norm(const struct eps_record *rec, struct eps_norm *out) {
  *out = (struct eps_norm){0, 0};
  return ops()->grad_norm(&out->sumsq, &out->most, f32_of(rec->grad), l2l_tensor_numel(rec->grad));
}

l2l_status eps_device_clear(struct eps_record *rec) {
  TRY(l2l_tensor_fill(rec->grad, 0.0));
  rec->flag_armed = false;
  return l2l_tensor_fill(rec->device_flag, 0.0);
}

/* Whether rec's armed update was skipped (its flag read back, then cleared, disarmed). */
static l2l_status skipped(struct eps_record *rec, bool *out) {
  *out = false;
  if (!rec->flag_armed) return L2L_OK;
  int32_t flag = 0;
  TRY(ops()->copy(&flag, L2L_POOL_HOST, l2l_tensor_data(rec->device_flag), L2L_POOL_DEVICE, sizeof flag));
  rec->flag_armed = false;
  if (flag == 0) return L2L_OK;
  *out = true;
  rec->updates--;
  return l2l_tensor_fill(rec->device_flag, 0.0);
}

l2l_status eps_device_skips(struct eps *eps) {
  l2l_status first = L2L_OK;
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    bool skip = false;
    l2l_status status = rec->placement == EPS_PLACE_DEVICE ? skipped(rec, &skip) : L2L_OK;
    if (first == L2L_OK) first = status;
    pthread_mutex_lock(&eps->lock);
    if (skip && eps->nonfinite_skips++ == 0) {
      eps->nonfinite_name = rec->name;
      eps->nonfinite_layer = rec->last_layer;
    }
    pthread_mutex_unlock(&eps->lock);
  }
  return first;
}

l2l_status eps_device_stage(struct eps_record *rec) {
  return l2l_tensor_cast(rec->staging, rec->master);
}

l2l_status eps_device_state(struct eps_record *rec) {
  for (int a = 0; a < optim_state_count(&rec->eps->optimizer); a++) {
    if (rec->state[a] != NULL) continue;
    TRY(tensor_new_like(&rec->state[a], L2L_POOL_DEVICE, L2L_F32, rec->master));
    TRY(l2l_tensor_fill(rec->state[a], 0.0));
  }
  return L2L_OK;
}

l2l_status eps_device_join(struct eps_record *rec) {
  int64_t one[1] = {1};
  TRY(l2l_tensor_new(&rec->device_flag, L2L_POOL_DEVICE, L2L_I32, 1, one));
  TRY(l2l_tensor_fill(rec->device_flag, 0.0));
  return eps_device_state(rec);
}

l2l_status eps_device_restore(struct eps_record *rec, l2l_tensor *const host[2]) {
  TRY(eps_device_state(rec));
  for (int a = 0; a < optim_state_count(&rec->eps->optimizer); a++)
    TRY(host[a] ? l2l_tensor_copy(rec->state[a], host[a]) : l2l_tensor_fill(rec->state[a], 0.0));
  return L2L_OK;
}

uint64_t eps_device_bytes(const struct eps *eps) {
  uint64_t bytes = 0;
  for (int i = 0; i < eps->count; i++) {
    const struct eps_record *rec = eps->records[i];
    if (rec->placement == EPS_PLACE_DEVICE)
      bytes += device_record_bytes(l2l_tensor_numel(rec->master), optim_state_count(&eps->optimizer),
                                   rec->staging ? (l2l_dtype)l2l_tensor_dtype(rec->staging) : L2L_F32);
  }
  return bytes;
}

/* ---------------------------------------------------------------- a record's move (auto) */

void eps_move_drop(struct eps_move *m) {
  l2l_tensor_free(m->master), l2l_tensor_free(m->grad), l2l_tensor_free(m->staging);
  l2l_tensor_free(m->state[0]), l2l_tensor_free(m->state[1]), l2l_tensor_free(m->flag);
  *m = (struct eps_move){0};
}

/* dst: a new tensor in `pool` of t's dtype and shape holding t's values (t NULL: zeros
   shaped like `like`, f32). */
static l2l_status moved(l2l_tensor **dst, l2l_pool_kind pool, const l2l_tensor *t,
                        const l2l_tensor *like) {
  TRY(tensor_new_like(dst, pool, t ? (l2l_dtype)l2l_tensor_dtype(t) : L2L_F32, t ? t : like));
  return t ? l2l_tensor_copy(*dst, t) : l2l_tensor_fill(*dst, 0.0);
}

l2l_status eps_move_prepare(struct eps_move *m, const struct eps_record *rec, bool to_device) {
  *m = (struct eps_move){.to_device = to_device};
  l2l_pool_kind pool = to_device ? L2L_POOL_DEVICE : L2L_POOL_HOST;
  l2l_status status = moved(&m->master, pool, rec->master, NULL);
  if (status == L2L_OK) status = moved(&m->grad, pool, rec->grad, NULL);
  if (status == L2L_OK && rec->staging)   /* (rewritten from the master as each step begins) */
    status = tensor_new_like(&m->staging, to_device ? L2L_POOL_DEVICE : L2L_POOL_PINNED,
                             (l2l_dtype)l2l_tensor_dtype(rec->staging), rec->staging);
  for (int a = 0; status == L2L_OK && a < optim_state_count(&rec->eps->optimizer); a++)
    if (to_device || rec->state[a]) status = moved(&m->state[a], pool, rec->state[a], rec->master);
  if (status == L2L_OK && to_device) {
    int64_t one[1] = {1};
    status = l2l_tensor_new(&m->flag, L2L_POOL_DEVICE, L2L_I32, 1, one);
    if (status == L2L_OK) status = l2l_tensor_fill(m->flag, 0.0);
  }
  if (status != L2L_OK) eps_move_drop(m);
  return status;
}

void eps_move_commit(struct eps_move *m, struct eps_record *rec, l2l_tensor **master,
                     l2l_tensor **grad) {
  rec->master = *master = m->master, rec->grad = *grad = m->grad;   /* (the param's) */
  l2l_tensor_free(rec->staging), rec->staging = m->staging;
  for (int a = 0; a < 2; a++) {
    l2l_tensor_free(rec->state[a]), rec->state[a] = m->state[a];
    l2l_tensor_free(rec->gathered[a]), rec->gathered[a] = NULL;
  }
  l2l_tensor_free(rec->device_flag), rec->device_flag = m->flag;
  rec->flag_armed = false;
  rec->placement = m->to_device ? EPS_PLACE_DEVICE : EPS_PLACE_HOST;
  *m = (struct eps_move){0};
}
