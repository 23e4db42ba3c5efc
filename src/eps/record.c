/* SPDX-License-Identifier: MIT */
/* record.c — the bottom of the EPS: what every file of it reads of a record.
 *
 * Purpose: where a master lives on the host (eps_master_pool), a record's bytes in host
 * memory and on disk (core's host_record_bytes, the one formula the planner and the host
 * budget use too; the EPS's whole, and a visit's gradients' norm for per-layer clipping),
 * an update's hyper-parameters, the order backward
 * completes a step's due records in (the read-ahead list of state_tier.c and the places
 * on the ranks' streams of exchange.c), and a block of its gradient as the accumulator
 * and its held arrivals make it (update.c's update; eps_held_check, the last arrival's
 * check that eps.c queues, for all of them).
 * The core (eps.c) and its parts (exchange.c, state_tier.c, quant.c, spill.c) call these;
 * they call nothing of the EPS above them.
 * Must never: call a function of another file of src/eps/ but optim.c (it is the EPS's
 * bottom), or take the EPS's lock.
 */
#include <stdlib.h>
#include <string.h>

#include "record.h"

l2l_pool_kind eps_master_pool(const struct eps *eps, l2l_dtype dtype, bool staged, int64_t numel) {
  bool small_f32 = eps->pinned_masters && numel * (int64_t)sizeof(float) <= EPS_PINNED_F32_MASTER_MAX;
  bool read_there = !staged && (dtype == L2L_BF16 || small_f32);
  return read_there ? L2L_POOL_PINNED : L2L_POOL_HOST;
}

struct host_record eps_record_bytes(const struct eps *eps, const struct eps_record *rec) {
  struct host_record b = {0};
  if (rec->placement == EPS_PLACE_DEVICE) {   /* (with ranks its exchange's buffers alone) */
    if (eps->dist != NULL)
      b.fixed = device_record_host_bytes(l2l_tensor_numel(rec->master), rec->counts[dist_rank_now()]);
    return b;
  }
  host_record_bytes(&b, l2l_tensor_numel(rec->master), rec->shard_n,
                    optim_state_count(&eps->optimizer), eps->optimizer.state,
                    (l2l_dtype)l2l_tensor_dtype(rec->master),
                    rec->staging ? eps->precision : L2L_F32, eps->dist != NULL);
  return b;
}

struct optim_hyper eps_update_hyper(const struct eps *eps, const struct eps_record *rec,
                                    float grad_scale) {
  const l2l_optimizer_config *o = &eps->optimizer;
  bool decays = o->decay_all || rec->decays;
  return (struct optim_hyper){
      .kind = o->kind, .lr = (float)eps->lr, .weight_decay = decays ? o->weight_decay : 0.0f,
      .momentum = o->momentum, .nesterov = o->nesterov, .beta1 = o->beta1, .beta2 = o->beta2,
      .eps = o->eps, .t = rec->updates + 1, .grad_scale = grad_scale, .state = o->state,
      /* update t of record `stream` draws t * numel + element (the record's, whatever
         rank or device updates it) */
      .master = (l2l_dtype)l2l_tensor_dtype(rec->master), .seed = eps->seed,
      .stream = rec->stream,
      .first_draw = (uint64_t)(rec->updates + 1) * (uint64_t)l2l_tensor_numel(rec->master) +
                    (uint64_t)rec->shard_begin};
}

uint64_t eps_host_bytes(const struct eps *eps) {
  uint64_t bytes = 0;
  for (int i = 0; i < eps->count; i++) {
    const struct eps_record *rec = eps->records[i];
    if (rec->placement == EPS_PLACE_DEVICE) {   /* (with ranks its exchange's, once made) */
      bytes += rec->exchange ? eps_record_bytes(eps, rec).fixed : 0;
      continue;
    }
    uint64_t shard = pool_accounted((uint64_t)rec->shard_n * sizeof(float));
    /* the optimizer state is the shard's, in its precision; the reduced gradient counts
       once made */
    uint64_t arrays = (rec->state[0] != NULL) + (rec->state[1] != NULL);
    struct host_record b = eps_record_bytes(eps, rec);
    bytes += b.fixed + (rec->grad_away ? 0 : b.grad) + pool_accounted(eps_array_bytes(rec)) * arrays;
    if (eps->dist != NULL && rec->shard_grad == NULL) bytes -= shard;
  }
  return bytes;
}

float eps_clip_scale(const l2l_tensor *const *grads, int n, float clip) {
  if (!(clip > 0)) return 1.0f;
  double sumsq = 0;
  for (int i = 0; i < n; i++) sumsq += optim_tensor_sumsq(grads[i]);
  return optim_clip_factor(sumsq, clip);
}

/* A record completes at the visit of its lowest user, and eps_expect names the layers from
   the lowest up, so the later a record was first named, the sooner it completes. */
static int by_completion(const void *a, const void *b) {
  const struct eps_record *x = *(struct eps_record *const *)a, *y = *(struct eps_record *const *)b;
  return (y->first_expect > x->first_expect) - (y->first_expect < x->first_expect);
}

void eps_sort_by_completion(struct eps_record **list, int n) {
  qsort(list, (size_t)n, sizeof *list, by_completion);
}

bool eps_held_block(float *g, const struct eps_record *rec, const float *acc, int64_t begin,
                    int64_t n) {
  if (acc != NULL) memcpy(g, acc, (size_t)n * sizeof *g);
  else memset(g, 0, (size_t)n * sizeof *g);
  bool finite = true;
  for (int k = 0; k < rec->held_n; k++) {
    const l2l_tensor *x = rec->held[k].grad;
    l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(x);
    float scale = rec->held[k].scale;
    if (dtype == L2L_F32)
      finite &= optim_axpy(g, (const float *)l2l_tensor_data(x) + begin, scale, n);
    else
      finite &= optim_axpy_half(g, (const uint16_t *)l2l_tensor_data(x) + begin, dtype, scale, n);
  }
  return finite;
}

bool eps_held_check(struct eps_record *rec, int64_t begin, int64_t end, bool known_zero) {
  const float *acc = (const float *)l2l_tensor_data(rec->grad);
  float block[L2L_STATE_BLOCK];
  uint8_t absent[CHUNK / L2L_STATE_BLOCK + 1];
  bool asked = !known_zero &&
               pool_blocks_absent((l2l_pool_kind)l2l_tensor_pool(rec->grad), acc + begin,
                                  (uint64_t)(end - begin) * 4, L2L_STATE_BLOCK * 4, absent,
                                  sizeof absent);
  bool finite = true, zero = true;
  int64_t read = 0;
  for (int64_t at = begin; at < end; at += L2L_STATE_BLOCK) {
    int64_t k = end - at < L2L_STATE_BLOCK ? end - at : L2L_STATE_BLOCK;
    bool unread = known_zero || (asked && absent[(at - begin) / L2L_STATE_BLOCK]);
    bool z = unread || optim_all_zero(acc + at, k);
    read += unread ? 0 : k;
    zero &= z;
    finite &= eps_held_block(block, rec, z ? NULL : acc + at, at, k);
  }
  if (rec->grad_zero != NULL) rec->grad_zero[begin / CHUNK] = zero;
  eps_count_bytes(rec->eps, (uint64_t)(end - begin) * eps_held_elem_bytes(rec) + (uint64_t)read * 4);
  return finite;
}

struct eps_norm eps_grad_norm(const struct eps_record *rec) {
  int64_t n = l2l_tensor_numel(rec->grad);
  const float *g = l2l_tensor_data(rec->grad);
  struct eps_norm whole = {0, 0};
  for (int c = 0; c < optim_chunks(n); c++) {
    int64_t begin = (int64_t)c * CHUNK;
    struct eps_norm chunk = {0, 0};
    if (rec->norms_valid) chunk = rec->chunk_norms[c];
    else optim_norm_blocks(&chunk.sumsq, &chunk.most, g + begin, optim_chunk_end(n, begin) - begin);
    whole.sumsq += chunk.sumsq;
    whole.most = chunk.most > whole.most ? chunk.most : whole.most;
  }
  return whole;
}

uint64_t eps_held_elem_bytes(const struct eps_record *rec) {
  uint64_t bytes = 0;
  for (int k = 0; k < rec->held_n; k++) bytes += l2l_dtype_size(l2l_tensor_dtype(rec->held[k].grad));
  return bytes;
}

void eps_held_free(struct eps_record *rec) {
  if (rec->held_n == 0) return;   /* (writes nothing: a record's last update may still read) */
  for (int k = 0; k < rec->held_n; k++) l2l_tensor_free(rec->held[k].grad);
  rec->held_n = 0;
}
