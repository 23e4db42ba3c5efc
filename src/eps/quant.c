/* SPDX-License-Identifier: MIT */
/* quant.c — the update that runs on the optimizer state in its precision (bf16 or
 * blockwise 8 bits, the codes the backend's state_codes.c); a record's state arrays made
 * in the precision, and a checkpoint's state,
 * in any precision, checked and converted into it (for eps_restore, which state_tier.c
 * defines: the tier drops a stale read ahead and writes the new state out).
 *
 * Purpose: halve or quarter the host bytes of the optimizer state while the optimizer's
 * arithmetic stays the f32 kernels' of optim.c: an update decodes one block of
 * L2L_STATE_BLOCK elements of each state array into f32 scratch on the worker's stack,
 * runs the optimizer's chunk kernel over that block, and encodes the block again (the
 * first wave writes the state; a later one only reads it), so each state byte crosses
 * memory once each way and the scratch stays in the core's cache. A bf16 master (the
 * relay's master = bf16) goes the same way: decoded into scratch, updated in f32, and
 * rounded back stochastically by Philox draws the record owns (the backend's optim_block,
 * which the CPU backend's update of a record on its device runs too).
 * A restore checks every value it is given (finite; a second moment >= 0) as it converts,
 * and only then replaces the record's state, so a refusal changes nothing; a checkpoint's
 * save checks what it writes the same way (l2l_state_array_check: one check for both).
 * Must never: allocate on the update's path, or read or write past the n elements asked
 * for (the scales of an array's blocks are addressed from its length).
 */
#include <math.h>
#include <string.h>

#include "record.h"

/* ---------------------------------------------------------------- the update */

/* A block's f32 step: the optimizer's chunk kernel on it (the chunk's fields but for p,
   state, grad and n). */
struct compact_block {
  const struct optimizer_ops *optim;
  const struct optim_chunk *chunk;
  int64_t begin;   /* the chunk's first element in the record's arrays */
};
static void compact_step(float *p, float *s0, float *s1, int64_t i, int64_t k, void *ctx) {
  const struct compact_block *c = ctx;
  struct optim_chunk block = *c->chunk;
  block.p = p, block.state[0] = s0, block.state[1] = s1;
  block.grad = c->chunk->grad + (i - c->begin), block.n = k;
  c->optim->chunk(&block);
}

void eps_compact_chunk(const struct optimizer_ops *optim, const struct optim_chunk *chunk,
                       const struct eps_compact *compact, int64_t begin) {
  struct compact_block c = {optim, chunk, begin};
  /* the master from the record's (shard's) element 0, as optim_block indexes it */
  void *p = compact->master != NULL ? (void *)(compact->master - begin) : (void *)(chunk->p - begin);
  for (int64_t at = 0; at < chunk->n; at += L2L_STATE_BLOCK) {
    int64_t k = chunk->n - at < L2L_STATE_BLOCK ? chunk->n - at : L2L_STATE_BLOCK;
    optim_block(p, compact->state[0], compact->state[1], compact->state_n, begin + at, k,
                chunk->h, chunk->wave == 0, chunk->wave == optim->waves - 1, compact_step, &c);
  }
}

/* ---------------------------------------------------------------- state arrays made and restored */

/* An optimizer state array of rec in the state's precision, in `pool`: its shard's
   elements (all of them on one process). (The shard's reduced gradient is f32 whatever
   this precision.) */
l2l_status eps_state_new(l2l_tensor **out, const struct eps_record *rec, l2l_pool_kind pool) {
  return eps_state_new_n(out, rec, rec->shard_n, pool);
}

l2l_status eps_state_new_n(l2l_tensor **out, const struct eps_record *rec, int64_t shard_n,
                           l2l_pool_kind pool) {
  l2l_state_precision state = rec->eps->optimizer.state;
  if (state == L2L_STATE_8BIT) {   /* codes and scales: a vector of bytes (an empty shard: 4) */
    int64_t shape[1] = {shard_n > 0 ? (int64_t)host_state_bytes(state, shard_n) : 4};
    return l2l_tensor_new(out, pool, L2L_U8, 1, shape);
  }
  l2l_dtype dtype = state_dtype(state);
  if (rec->eps->dist == NULL)   /* all of the record, in its shape */
    return tensor_new_like(out, pool, dtype, rec->master);
  int64_t shape[1] = {shard_n > 0 ? shard_n : 1};   /* an empty shard: 1 unused */
  return l2l_tensor_new(out, pool, dtype, 1, shape);
}

/* Elements [lo, lo + k) of a whole state array of rec in precision p, copied as they are
   into a shard's own array: 8 bits, its codes and its blocks' scales (a shard starts on a
   block: host_shard_align). */
static void part_copy(void *dst, const void *src, const struct eps_record *rec, int64_t lo,
                      int64_t k, l2l_state_precision p) {
  int64_t n = l2l_tensor_numel(rec->master);
  if (p == L2L_STATE_8BIT) {
    memcpy(dst, (const uint8_t *)src + lo, (size_t)k);
    memset((uint8_t *)dst + k, 0, (size_t)((uint8_t *)optim_state_scales(dst, k) - ((uint8_t *)dst + k)));
    memcpy(optim_state_scales(dst, k), optim_state_scales((void *)src, n) + lo / L2L_STATE_BLOCK,
           (size_t)state8_blocks(k) * sizeof(float));
  } else {
    size_t elem = (size_t)state_elem_bytes(p);
    memcpy(dst, (const uint8_t *)src + (size_t)lo * elem, (size_t)k * elem);
  }
}

l2l_status eps_state_part(l2l_tensor **out, const struct eps_record *rec, const l2l_tensor *whole,
                          int64_t begin, int64_t n) {
  *out = NULL;
  l2l_tensor *host = NULL;   /* (one whole copy into host memory first) */
  TRY(tensor_new_like(&host, L2L_POOL_HOST, (l2l_dtype)l2l_tensor_dtype(whole), whole));
  l2l_status status = l2l_tensor_copy(host, whole);
  if (status == L2L_OK) status = eps_state_new_n(out, rec, n, L2L_POOL_HOST);
  if (status == L2L_OK && n > 0)
    part_copy(l2l_tensor_data(*out), l2l_tensor_data(host), rec, begin, n, rec->eps->optimizer.state);
  l2l_tensor_free(host);
  return status;
}

/* The precision a state tensor given to restore is kept in, from its dtype (checked). */
static l2l_state_precision given_precision(const l2l_tensor *t) {
  l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(t);
  return dtype == L2L_U8 ? L2L_STATE_8BIT : dtype == L2L_BF16 ? L2L_STATE_BF16 : L2L_STATE_F32;
}

/* The check every state value a relay takes passes (a restore's, and a save's through
   l2l_state_array_check, so that what a save writes loads): the bn values of block, from
   element `at` of array `name`, finite, and a root code's (a second moment) >= 0. */
static l2l_status values_check(const char *func, const char *name, const float *block,
                               int64_t bn, int64_t at, enum optim_code code) {
  for (int64_t i = 0; i < bn; i++)
    if (!isfinite(block[i]) || (code == OPTIM_CODE_ROOT && block[i] < 0.0f))
      return core_fail_in(func, L2L_ERR_INVALID, "%s holds %g at element %lld: optimizer state "
                          "must be finite%s", name, (double)block[i], (long long)(at + i),
                          code == OPTIM_CODE_ROOT ? ", and a second moment >= 0" : "");
  return L2L_OK;
}

/* dst (a shard's state, in the EPS's precision) := the shard's elements of src (the whole
   record's state array `which`, in any precision, any shape), block by block through f32,
   each value checked: finite, and a second moment >= 0. */
static l2l_status state_convert(const char *func, const char *name, l2l_tensor *dst,
                                const l2l_tensor *src, const struct eps_record *rec, int which) {
  if (l2l_tensor_pool(src) == L2L_POOL_DEVICE) {   /* one whole copy into host memory first */
    l2l_tensor *whole = NULL;
    TRY(tensor_new_like(&whole, L2L_POOL_HOST, (l2l_dtype)l2l_tensor_dtype(src), src));
    l2l_status status = l2l_tensor_copy(whole, src);
    if (status == L2L_OK) status = state_convert(func, name, dst, whole, rec, which);
    l2l_tensor_free(whole);
    return status;
  }
  const struct eps *eps = rec->eps;
  enum optim_code code = optim_state_code(eps->optimizer.kind, which);
  l2l_state_precision from = given_precision(src), to = eps->optimizer.state;
  int64_t n = l2l_tensor_numel(rec->master), lo = rec->shard_begin, hi = lo + rec->shard_n;
  /* the same precision: checked, then the shard's bytes themselves (an 8-bit array
     encoded again could differ in the last bit of a scale's division) */
  bool same = from == to;
  float block[L2L_STATE_BLOCK];
  for (int64_t at = lo / L2L_STATE_BLOCK * L2L_STATE_BLOCK; at < hi; at += L2L_STATE_BLOCK) {
    int64_t bn = n - at < L2L_STATE_BLOCK ? n - at : L2L_STATE_BLOCK;
    optim_state_decode(block, l2l_tensor_data(src), n, at, bn, from, code);
    TRY(values_check(func, name, block, bn, at, code));
    int64_t from_at = at > lo ? at : lo, to_at = at + bn < hi ? at + bn : hi;
    if (!same && from_at < to_at)
      optim_state_encode(l2l_tensor_data(dst), rec->shard_n, from_at - lo, block + (from_at - at),
                       to_at - from_at, to, code);
  }
  if (same) part_copy(l2l_tensor_data(dst), l2l_tensor_data(src), rec, lo, rec->shard_n, to);
  return L2L_OK;
}

l2l_status eps_restore_check(const char *func, const struct eps *eps,
                             const struct eps_record *rec, int64_t updates,
                             const l2l_tensor *const given[2], int *arrays) {
  const char *names[2] = {"first", "second"};
  /* The next update is t = updates + 1: it must be an int64 too. */
  if (updates == INT64_MAX)
    return core_fail_in(func, L2L_ERR_INVALID, "updates must be below 2^63 - 1 (the next update "
                        "counts one more), got %lld", (long long)updates);
  int count = optim_state_count(&eps->optimizer);
  *arrays = updates > 0 ? count : 0;
  for (int a = 0; a < 2; a++) {
    if (a >= *arrays) {
      if (given[a] != NULL)
        return core_fail_in(func, L2L_ERR_INVALID,
                            "%s must be NULL: the optimizer keeps %d state arrays%s", names[a],
                            count, updates == 0 ? " and none before the first update" : "");
      continue;
    }
    if (given[a] == NULL)
      return core_fail_in(func, L2L_ERR_INVALID, "%s is NULL: the optimizer keeps %d state arrays",
                          names[a], *arrays);
    TRY(tensor_check(func, names[a], given[a]));
    l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(given[a]);
    if (dtype != L2L_F32 && dtype != L2L_BF16 && dtype != L2L_U8)
      return core_fail_in(func, L2L_ERR_INVALID, "%s must be f32, bf16 or u8 (8-bit state), got %s",
                          names[a], l2l_dtype_name(dtype));
    int64_t n = l2l_tensor_numel(rec->master);
    int64_t want = dtype == L2L_U8 ? (int64_t)host_state_bytes(L2L_STATE_8BIT, n) : n;
    if (l2l_tensor_numel(given[a]) != want)
      return core_fail_in(func, L2L_ERR_INVALID, "%s has %lld elements, the parameter's state "
                          "in %s %lld", names[a], (long long)l2l_tensor_numel(given[a]),
                          dtype == L2L_U8 ? "8 bits" : l2l_dtype_name(dtype), (long long)want);
  }
  return L2L_OK;
}

l2l_status eps_restore_convert(const char *func, const struct eps_record *rec, int arrays,
                               const l2l_tensor *const given[2], l2l_tensor *fresh[2]) {
  const char *names[2] = {"first", "second"};
  for (int a = 0; a < arrays; a++) {
    l2l_status status = eps_state_new(&fresh[a], rec, L2L_POOL_HOST);
    if (status == L2L_OK) status = state_convert(func, names[a], fresh[a], given[a], rec, a);
    if (status != L2L_OK) {
      l2l_tensor_free(fresh[0]);
      l2l_tensor_free(fresh[1]);
      fresh[0] = fresh[1] = NULL;
      return status;
    }
  }
  return L2L_OK;
}

l2l_status l2l_state_array_check(const l2l_tensor *array, const l2l_optimizer_config *optimizer,
                                 int which, int64_t n) {
  TRY(tensor_check(__func__, "array", array));
  if (optimizer == NULL) return FAIL(L2L_ERR_INVALID, "optimizer is NULL");
  TRY_AS(optimizer_check(optimizer));
  int count = optim_state_count(optimizer);
  if (which < 0 || which >= count)
    return FAIL(L2L_ERR_INVALID, "which must be 0 to %d (the optimizer keeps %d state arrays), "
                "got %d", count - 1, count, which);
  if (n < 1 || n > INT64_MAX / 8)
    return FAIL(L2L_ERR_INVALID, "n must be in [1, 2^60), got %lld", (long long)n);
  l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(array);
  if (dtype != L2L_F32 && dtype != L2L_BF16 && dtype != L2L_U8)
    return FAIL(L2L_ERR_INVALID, "array must be f32, bf16 or u8 (8-bit state), got %s",
                l2l_dtype_name(dtype));
  int64_t want = dtype == L2L_U8 ? (int64_t)host_state_bytes(L2L_STATE_8BIT, n) : n;
  if (l2l_tensor_numel(array) != want)
    return FAIL(L2L_ERR_INVALID, "array has %lld elements, a state array of %lld in %s %lld",
                (long long)l2l_tensor_numel(array), (long long)n,
                dtype == L2L_U8 ? "8 bits" : l2l_dtype_name(dtype), (long long)want);
  if (l2l_tensor_pool(array) == L2L_POOL_DEVICE) {   /* one whole copy into host memory first */
    l2l_tensor *whole = NULL;
    TRY(tensor_new_like(&whole, L2L_POOL_HOST, dtype, array));
    l2l_status status = l2l_tensor_copy(whole, array);
    if (status == L2L_OK) status = l2l_state_array_check(whole, optimizer, which, n);
    l2l_tensor_free(whole);
    return status;
  }
  enum optim_code code = optim_state_code(optimizer->kind, which);
  l2l_state_precision from = given_precision(array);
  float block[L2L_STATE_BLOCK];
  for (int64_t at = 0; at < n; at += L2L_STATE_BLOCK) {
    int64_t bn = n - at < L2L_STATE_BLOCK ? n - at : L2L_STATE_BLOCK;
    optim_state_decode(block, l2l_tensor_data(array), n, at, bn, from, code);
    TRY(values_check(__func__, "array", block, bn, at, code));
  }
  return L2L_OK;
}
