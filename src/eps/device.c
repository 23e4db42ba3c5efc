/* SPDX-License-Identifier: MIT */
/* device.c — records placed on the device (issue 49): a gradient's add into the record's
 * accumulator, its update, its norm, its clear, its 16-bit copy and the flag that says its
 * gradient was not finite, each through the backend's ops table.
 *
 * Purpose: a record whose master, accumulator and optimizer state (in its precision, laid
 * out as on the host: quant.c's eps_state_new) fit on the device is
 * updated there, in the device's order, by the same optimizer (the backend's optim_update:
 * on the CPU backend the EPS's own host kernels in the EPS's chunks, so the bits are the
 * host placement's; on a GPU kernels/optim.cu), so no byte of it crosses the link or
 * touches host memory in a step. The host never waits to learn whether a gradient was
 * finite: the add sets the record's flag on the device, the eager update reads it there,
 * and the step's end reads every record's flag back at once (eps_device_skips), as a
 * deferred update's release reads every norm at once (eps_device_norms).
 * Called on the relay's compute thread (the adds and eager updates as its visits end, the
 * deferred ones at the release), never on a worker.
 * Must never: read a device tensor's bytes from the host but through the ops table, or
 * call a file of src/eps/ but record.c (its one lock taken: the EPS's, to count a skip).
 */
#include <stdlib.h>
#include <string.h>

#include "record.h"

static const struct backend_ops *ops(void) { return backend_for(L2L_POOL_DEVICE); }

static void *data_of(const l2l_tensor *t) { return t ? l2l_tensor_data(t) : NULL; }
static float *f32_of(const l2l_tensor *t) { return data_of(t); }

/* ---------------------------------------------------------------- the records' words

   Each record on the device has a word in two arrays of the EPS, at its index: its flag
   (i32: an add made a sum that is not finite) and its gradient's norm (two f64: the sum of
   squares and the largest magnitude, a deferred update's). Kept side by side so that a
   step reads each array back once (a GPU's one sync for all the records), not a value a
   record. They are made anew, exactly as many words as records there, when the records
   on the device have changed (eps->words_stale: a record joined, left or moved): at once,
   or as the next training step begins. Beside them one f32, the clip word: a visit's
   per-layer clipping factor, which its adds read there in the device's order. */

static int32_t *flag_of(const struct eps_record *rec) {
  return (int32_t *)l2l_tensor_data(rec->eps->device_flags) + rec->word;
}
static double *norm_of(const struct eps_record *rec) {
  return (double *)l2l_tensor_data(rec->eps->device_norms) + 2 * rec->word;
}

/* n values of `array` (a device tensor, NULL: none) into host memory. */
static l2l_status read_back(void *out, const l2l_tensor *array, size_t bytes) {
  if (array == NULL || bytes == 0) return L2L_OK;
  return ops()->copy(out, L2L_POOL_HOST, l2l_tensor_data(array), L2L_POOL_DEVICE, bytes);
}

l2l_status eps_device_words(struct eps *eps) {
  if (!eps->words_stale) return L2L_OK;
  int n = 0;
  for (int i = 0; i < eps->count; i++) n += eps->records[i]->placement == EPS_PLACE_DEVICE;
  int32_t *old = calloc((size_t)(eps->words > 0 ? eps->words : 1), sizeof *old);
  int32_t *flags = calloc((size_t)(n > 0 ? n : 1), sizeof *flags);
  l2l_tensor *fresh[3] = {NULL, NULL, NULL};
  int64_t shape[3][1] = {{n}, {2 * (int64_t)n * (int64_t)sizeof(double)}, {1}};   /* (norms: bytes) */
  const l2l_dtype dtype[3] = {L2L_I32, L2L_U8, L2L_F32};
  l2l_status status = old && flags ? read_back(old, eps->device_flags, (size_t)eps->words * sizeof *old)
                                   : FAIL(L2L_ERR_NOMEM, "no memory for %d records' flags", n);
  for (int a = 0; status == L2L_OK && n > 0 && a < 3; a++)
    status = l2l_tensor_new(&fresh[a], L2L_POOL_DEVICE, dtype[a], 1, shape[a]);
  /* each record's flag kept: one that came from the host brings its own (nonfinite); its
     new index given once everything is made (a failure keeps the old ones) */
  for (int i = 0, w = 0; status == L2L_OK && i < eps->count; i++) {
    const struct eps_record *rec = eps->records[i];
    if (rec->placement != EPS_PLACE_DEVICE) continue;
    flags[w++] = rec->word >= 0 && rec->word < eps->words ? old[rec->word] : rec->nonfinite;
  }
  if (status == L2L_OK && n > 0)
    status = ops()->copy(l2l_tensor_data(fresh[0]), L2L_POOL_DEVICE, flags, L2L_POOL_HOST,
                         (size_t)n * sizeof *flags);
  if (status == L2L_OK && n > 0) status = l2l_tensor_fill(fresh[1], 0.0);
  l2l_tensor *back = NULL;   /* (where the flags come back, queued) */
  if (status == L2L_OK && n > 0) status = l2l_tensor_new(&back, L2L_POOL_PINNED, L2L_I32, 1, shape[0]);
  if (status == L2L_OK) {
    l2l_tensor_free(eps->flags_back), eps->flags_back = back;
    l2l_tensor_free(eps->device_flags), eps->device_flags = fresh[0];
    l2l_tensor_free(eps->device_norms), eps->device_norms = fresh[1];
    l2l_tensor_free(eps->device_clip), eps->device_clip = fresh[2];
    eps->words = n, eps->words_stale = false;
    for (int i = 0, w = 0; i < eps->count; i++) {
      struct eps_record *rec = eps->records[i];
      if (rec->placement != EPS_PLACE_DEVICE) continue;
      rec->word = w++;
      rec->nonfinite = false;   /* (in its flag now) */
    }
  } else {   /* (the old arrays and indices stay, stale: made again as a step begins) */
    l2l_tensor_free(fresh[0]), l2l_tensor_free(fresh[1]), l2l_tensor_free(fresh[2]);
    l2l_tensor_free(back);
  }
  free(old), free(flags);
  return status;
}

l2l_status eps_device_add(struct eps_record *rec, const l2l_tensor *grad, bool clipped,
                          bool flagged) {
  return ops()->grad_add(f32_of(rec->grad), l2l_tensor_data(grad),
                         (l2l_dtype)l2l_tensor_dtype(grad), 1.0f,
                         clipped ? f32_of(rec->eps->device_clip) : NULL,
                         l2l_tensor_numel(grad), flagged ? flag_of(rec) : NULL);
}

l2l_status eps_device_clip(struct eps *eps, l2l_tensor *const *grads, int n, float clip) {
  enum { MOST = 32 };   /* (a layer's records: the relay's bits of on_device) */
  if (n > MOST || eps->device_clip == NULL)
    return FAIL(L2L_ERR_STATE, "per-layer clipping of %d gradients on the device (at most %d, "
                "with a record there)", n, MOST);
  const void *g[MOST];
  l2l_dtype dtype[MOST];
  int64_t numel[MOST];
  for (int i = 0; i < n; i++)
    g[i] = l2l_tensor_data(grads[i]), dtype[i] = (l2l_dtype)l2l_tensor_dtype(grads[i]),
    numel[i] = l2l_tensor_numel(grads[i]);
  return ops()->clip_scale(f32_of(eps->device_clip), g, dtype, numel, n, clip);
}

l2l_status eps_device_update(struct eps_record *rec, const struct optim_hyper *h, bool flagged) {
  TRY(ops()->optim_update(data_of(rec->master), data_of(rec->state[0]), data_of(rec->state[1]),
                          f32_of(rec->grad), l2l_tensor_numel(rec->master), h,
                          flagged ? flag_of(rec) : NULL));
  rec->updates++;   /* (taken back at the step's end if its flag skipped it) */
  rec->flag_armed = flagged;
  return L2L_OK;
}

l2l_status eps_device_norm(struct eps_record *rec) {
  return ops()->grad_norm(norm_of(rec), f32_of(rec->grad), l2l_tensor_numel(rec->grad));
}

l2l_status eps_device_norms(struct eps *eps) {
  if (eps->dist) return L2L_OK;   /* (with ranks the exchange agrees each record's norm) */
  double *norms = calloc((size_t)(2 * eps->words > 0 ? 2 * eps->words : 1), sizeof *norms);
  if (norms == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for %d records' norms", eps->words);
  l2l_status status = read_back(norms, eps->device_norms, (size_t)(2 * eps->words) * sizeof *norms);
  for (int i = 0; status == L2L_OK && i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (rec->placement != EPS_PLACE_DEVICE || rec->word < 0) continue;
    rec->sumsq = norms[2 * rec->word];
    /* (a NaN's largest is NaN here, not ignored: its sum of squares is NaN either way) */
    rec->grad_most = (float)norms[2 * rec->word + 1];
  }
  free(norms);
  return status;
}

l2l_status eps_device_send(struct eps_record *rec) {
  size_t bytes = (size_t)l2l_tensor_numel(rec->grad) * sizeof(float);
  l2l_status status = ops()->copy(l2l_tensor_data(rec->exchange), L2L_POOL_PINNED, f32_of(rec->grad),
                                  L2L_POOL_DEVICE, bytes);
  if (status != L2L_OK) {   /* zeros go out instead of the last step's gradient */
    memset(l2l_tensor_data(rec->exchange), 0, bytes);
    return status;
  }
  return eps_device_clear(rec);
}

l2l_status eps_device_take(struct eps_record *rec) {
  return backend_tensor_copy_queued(rec->grad, rec->exchange);
}

l2l_status eps_device_clear(struct eps_record *rec) {
  TRY(l2l_tensor_fill(rec->grad, 0.0));
  rec->flag_armed = false;
  return rec->word >= 0 ? ops()->fill(flag_of(rec), L2L_I32, 0.0, 1) : L2L_OK;
}

static bool any_armed(const struct eps *eps) {
  for (int i = 0; i < eps->count; i++)
    if (eps->records[i]->flag_armed) return true;
  return false;
}

void eps_device_flags_queue(struct eps *eps) {
  eps->flags_queued = any_armed(eps) && eps->flags_back != NULL &&
                      backend_tensor_copy_queued(eps->flags_back, eps->device_flags) == L2L_OK;
}

l2l_status eps_device_skips(struct eps *eps) {
  bool queued = eps->flags_queued;   /* (read after the step's wait: there already) */
  eps->flags_queued = false;
  if (!any_armed(eps)) return L2L_OK;
  int32_t *flags = calloc((size_t)eps->words, sizeof *flags);
  if (flags == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for %d records' flags", eps->words);
  l2l_status status = L2L_OK;
  if (queued) memcpy(flags, l2l_tensor_data(eps->flags_back), (size_t)eps->words * sizeof *flags);
  else status = read_back(flags, eps->device_flags, (size_t)eps->words * sizeof *flags);
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    bool skip = status == L2L_OK && rec->flag_armed && flags[rec->word] != 0;
    rec->flag_armed = false;
    if (!skip) continue;
    rec->updates--;   /* (its update left it as it was) */
    l2l_status cleared = ops()->fill(flag_of(rec), L2L_I32, 0.0, 1);
    if (status == L2L_OK) status = cleared;
    pthread_mutex_lock(&eps->lock);
    if (eps->nonfinite_skips++ == 0) {
      eps->nonfinite_name = rec->name;
      eps->nonfinite_layer = rec->last_layer;
    }
    pthread_mutex_unlock(&eps->lock);
  }
  free(flags);
  return status;
}

l2l_status eps_device_stage(struct eps *eps) {
  l2l_tensor **to = calloc((size_t)(eps->count > 0 ? eps->count : 1), sizeof *to);
  const l2l_tensor **from = calloc((size_t)(eps->count > 0 ? eps->count : 1), sizeof *from);
  int n = 0;
  l2l_status status = to && from ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory to list %d records", eps->count);
  for (int i = 0; status == L2L_OK && i < eps->count; i++) {
    const struct eps_record *rec = eps->records[i];
    if (rec->placement == EPS_PLACE_DEVICE && rec->staging != NULL)
      to[n] = rec->staging, from[n++] = rec->master;
  }
  if (status == L2L_OK) status = backend_tensors_cast(to, from, n);
  free(to), free(from);
  return status;
}

l2l_status eps_device_state(struct eps_record *rec) {
  for (int a = 0; a < optim_state_count(&rec->eps->optimizer); a++) {
    if (rec->state[a] != NULL) continue;
    TRY(eps_state_new(&rec->state[a], rec, L2L_POOL_DEVICE));
    TRY(l2l_tensor_fill(rec->state[a], 0.0));   /* (zero in every precision: 8 bits too) */
  }
  return L2L_OK;
}

/* dst: a new tensor in `pool` of t's dtype and shape holding t's values. */
static l2l_status moved(l2l_tensor **dst, l2l_pool_kind pool, const l2l_tensor *t) {
  TRY(tensor_new_like(dst, pool, (l2l_dtype)l2l_tensor_dtype(t), t));
  return l2l_tensor_copy(*dst, t);
}

/* A guard copy of `master` (pinned, f32, its values) for a 1-D one, else none. */
static l2l_status guard_copy_of(l2l_tensor **out, const l2l_tensor *master) {
  *out = NULL;
  return l2l_tensor_ndim(master) == 1 ? moved(out, L2L_POOL_PINNED, master) : L2L_OK;
}

l2l_status eps_device_join(struct eps_record *rec) {
  rec->word = -1;
  rec->eps->words_stale = true;   /* (its words made as the next step begins) */
  TRY(guard_copy_of(&rec->guard_copy, rec->master));
  return eps_device_state(rec);
}

const l2l_tensor *eps_guard_copy(const struct eps_record *rec) { return rec->guard_copy; }

/* Queues every guard copy (*any: there are some; *handed: a master among them was handed
   out, so a script may have written it). */
static l2l_status guards_queue(struct eps *eps, bool *any, bool *handed, bool copy) {
  *any = *handed = false;
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (rec->placement != EPS_PLACE_DEVICE || rec->guard_copy == NULL) continue;
    if (copy) TRY(backend_tensor_copy_queued(rec->guard_copy, rec->master));
    *any = true, *handed |= tensor_handed_out(rec->master);
  }
  return L2L_OK;
}

l2l_status eps_device_guard_copies(struct eps *eps, bool training) {
  bool current = eps->guards_current, any = false, handed = false;
  eps->guards_current = false;
  TRY(guards_queue(eps, &any, &handed, false));
  if (any && (!current || handed)) {
    TRY(guards_queue(eps, &any, &handed, true));
    TRY(l2l_device_synchronize());
  }
  eps->guards_current = !training;   /* (an evaluation leaves the masters as they are) */
  return L2L_OK;
}

void eps_device_guard_copies_queue(struct eps *eps) {
  bool any = false, handed = false;
  eps->guards_queued = guards_queue(eps, &any, &handed, true) == L2L_OK;
}

void eps_device_guards_settled(struct eps *eps, bool ok) {
  eps->guards_current = ok && eps->guards_queued;
  eps->guards_queued = false;
}

l2l_status eps_device_restore(struct eps_record *rec, l2l_tensor *const host[2]) {
  TRY(eps_device_state(rec));
  for (int a = 0; a < optim_state_count(&rec->eps->optimizer); a++)
    TRY(host[a] ? l2l_tensor_copy(rec->state[a], host[a]) : l2l_tensor_fill(rec->state[a], 0.0));
  return L2L_OK;
}

uint64_t eps_device_bytes(const struct eps *eps) {
  uint64_t bytes = 0;
  int n = 0;
  for (int i = 0; i < eps->count; i++) {
    const struct eps_record *rec = eps->records[i];
    if (rec->placement != EPS_PLACE_DEVICE) continue;
    n++;
    bytes += device_record_bytes(l2l_tensor_numel(rec->master),
                                 (l2l_dtype)l2l_tensor_dtype(rec->master),
                                 optim_state_count(&eps->optimizer),
                                 eps->optimizer.state,
                                 rec->staging ? (l2l_dtype)l2l_tensor_dtype(rec->staging) : L2L_F32);
  }
  return bytes + device_words_bytes(n);
}

/* ---------------------------------------------------------------- a record's move (auto) */

void eps_move_drop(struct eps_move *m) {
  l2l_tensor_free(m->master), l2l_tensor_free(m->grad), l2l_tensor_free(m->staging);
  l2l_tensor_free(m->state[0]), l2l_tensor_free(m->state[1]), l2l_tensor_free(m->guard_copy);
  *m = (struct eps_move){0};
}

/* State array `a` of rec's new place (eps_device_move_prepare): the old one copied (one
   process: the same elements); with ranks the whole record's, gathered, to the device, or
   this rank's part of the device's to the host. Never updated: zeros on the device, none
   on the host (made as the next step begins). */
static l2l_status moved_state(l2l_tensor **out, const struct eps_record *rec, int a,
                              const struct eps_move *m, const l2l_tensor *const whole[2]) {
  bool ranks = rec->eps->dist != NULL;
  l2l_pool_kind pool = m->to_device ? L2L_POOL_DEVICE : L2L_POOL_HOST;
  const l2l_tensor *from = ranks && m->to_device ? whole[a] : rec->state[a];
  if (from == NULL && !m->to_device) return L2L_OK;
  if (from != NULL && !ranks) return moved(out, pool, from);
  if (from != NULL && !m->to_device) return eps_state_part(out, rec, from, m->shard_begin, m->shard_n);
  TRY(eps_state_new_n(out, rec, m->shard_n, pool));
  return from ? l2l_tensor_copy(*out, from) : l2l_tensor_fill(*out, 0.0);
}

l2l_status eps_device_move_prepare(struct eps_move *m, const struct eps_record *rec, bool to_device,
                                   int64_t shard_begin, int64_t shard_n,
                                   const l2l_tensor *const whole[2]) {
  *m = (struct eps_move){.to_device = to_device, .shard_begin = shard_begin, .shard_n = shard_n};
  l2l_pool_kind pool = to_device ? L2L_POOL_DEVICE : L2L_POOL_HOST;
  /* (a master on the host the device reads goes to pinned memory, as the relay has it) */
  l2l_pool_kind home = eps_master_pool(rec->eps, (l2l_dtype)l2l_tensor_dtype(rec->master),
                                       rec->staging != NULL, l2l_tensor_numel(rec->master));
  l2l_status status = moved(&m->master, to_device ? pool : home, rec->master);
  if (status == L2L_OK) status = moved(&m->grad, pool, rec->grad);
  if (status == L2L_OK && rec->staging)   /* (rewritten from the master as each step begins) */
    status = tensor_new_like(&m->staging, to_device ? L2L_POOL_DEVICE : L2L_POOL_PINNED,
                             (l2l_dtype)l2l_tensor_dtype(rec->staging), rec->staging);
  for (int a = 0; status == L2L_OK && a < optim_state_count(&rec->eps->optimizer); a++)
    status = moved_state(&m->state[a], rec, a, m, whole);
  if (status == L2L_OK && to_device) status = guard_copy_of(&m->guard_copy, rec->master);
  if (status != L2L_OK) eps_move_drop(m);
  return status;
}

void eps_move_commit(struct eps_move *m, struct eps_record *rec, l2l_tensor **master,
                     l2l_tensor **grad) {
  rec->master = *master = m->master, rec->grad = *grad = m->grad;   /* (the param's) */
  rec->grad_known_zero = false;   /* (a new accumulator: read once before it is known) */
  rec->staging_written = false;   /* (a new staging copy: written as the next step begins) */
  l2l_tensor_free(rec->staging), rec->staging = m->staging;
  l2l_tensor_free(rec->guard_copy), rec->guard_copy = m->guard_copy;
  for (int a = 0; a < 2; a++) {
    l2l_tensor_free(rec->state[a]), rec->state[a] = m->state[a];
    l2l_tensor_free(rec->gathered[a]), rec->gathered[a] = NULL;
  }
  /* its flag comes with it: the host's nonfinite, read back from the device (between
     steps), or the host's into its word there (eps_device_words) */
  int32_t flag = 0;
  if (!m->to_device && rec->word >= 0 && rec->word < rec->eps->words &&
      ops()->copy(&flag, L2L_POOL_HOST, flag_of(rec), L2L_POOL_DEVICE, sizeof flag) == L2L_OK)
    rec->nonfinite |= flag != 0;
  rec->word = -1;
  rec->flag_armed = false;
  /* (the spill tier's flags start again: a new accumulator, in memory, not passing) */
  rec->grad_passing = rec->grad_away = rec->grad_counted = false;
  rec->keep_state = true;
  rec->eps->words_stale = true;
  /* with ranks: its sums sized for the new shard and a device record's exchange made as
     the next step begins (eps_prepare); a host record has none */
  if (rec->shard_n != m->shard_n) free(rec->chunk_sums), rec->chunk_sums = NULL;
  if (!m->to_device) l2l_tensor_free(rec->exchange), rec->exchange = NULL;
  rec->shard_begin = m->shard_begin, rec->shard_n = m->shard_n;
  rec->placement = m->to_device ? EPS_PLACE_DEVICE : EPS_PLACE_HOST;
  *m = (struct eps_move){0};
}
