/* SPDX-License-Identifier: MIT */
/* tensor_ops.c — the public whole-tensor calls: copies (transfers between pools), casts,
 * fills and random fills.
 *
 * Purpose: check every argument (handles, dtypes, sizes, pools, overlap), then hand the
 * elements to the backend that owns the tensors' pool, so that a refused call writes
 * nothing.
 * Must never: touch an element itself (that is the backend's job).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend.h"

static bool is_float(l2l_dtype d) { return d == L2L_F32 || d == L2L_F16 || d == L2L_BF16; }

/* What a copy checks; the backend of the accelerator side runs it (a copy between domains
   is a transfer), through its copy or copy_queued. */
static l2l_status tensor_copy(const char *func, l2l_tensor *dst, const l2l_tensor *src,
                              bool queued) {
  TRY(tensor_check(func, "dst", dst));
  TRY(tensor_check(func, "src", src));
  if (dst->dtype != src->dtype)
    return core_fail_in(func, L2L_ERR_INVALID, "dst is %s but src is %s (use l2l_tensor_cast)",
                        l2l_dtype_name(dst->dtype), l2l_dtype_name(src->dtype));
  if (dst->numel != src->numel)
    return core_fail_in(func, L2L_ERR_INVALID, "dst has %lld elements but src has %lld",
                        (long long)dst->numel, (long long)src->numel);
  if (dst->storage == src->storage && dst->offset == src->offset) return L2L_OK;
  if (dst->storage == src->storage &&
      dst->offset < src->offset + src->numel && src->offset < dst->offset + dst->numel)
    return core_fail_in(func, L2L_ERR_INVALID, "dst and src overlap in one storage");
  l2l_pool_kind side = backend_pool_domain(dst->storage->pool) ? dst->storage->pool
                                                             : src->storage->pool;
  const struct backend_ops *ops = backend_for(side);
  return (queued ? ops->copy_queued : ops->copy)(
      tensor_ptr(dst), dst->storage->pool, tensor_ptr(src), src->storage->pool,
      (uint64_t)dst->numel * l2l_dtype_size(dst->dtype));
}

l2l_status l2l_tensor_copy(l2l_tensor *dst, const l2l_tensor *src) {
  return tensor_copy(__func__, dst, src, false);
}

l2l_status backend_tensor_copy_queued(l2l_tensor *dst, const l2l_tensor *src) {
  return tensor_copy(__func__, dst, src, true);
}

l2l_status backend_tensors_cast(l2l_tensor *const *dst, const l2l_tensor *const *src, int count) {
  if (count <= 0) return L2L_OK;
  for (int i = 0; i < count; i++) {
    TRY(tensor_check(__func__, "dst", dst[i]));
    TRY(tensor_check(__func__, "src", src[i]));
    if (dst[i]->dtype != dst[0]->dtype || src[i]->dtype != src[0]->dtype ||
        dst[i]->numel != src[i]->numel ||
        backend_pool_domain(dst[i]->storage->pool) != backend_pool_domain(dst[0]->storage->pool) ||
        backend_pool_domain(src[i]->storage->pool) != backend_pool_domain(dst[0]->storage->pool))
      return FAIL(L2L_ERR_INVALID, "pair %d: %s (%lld) from %s (%lld) does not match pair 0's "
                  "dtypes and backend, or its own element count", i,
                  l2l_dtype_name(dst[i]->dtype), (long long)dst[i]->numel,
                  l2l_dtype_name(src[i]->dtype), (long long)src[i]->numel);
  }
  l2l_dtype to = dst[0]->dtype, from = src[0]->dtype;
  if (!((from == L2L_F32 && (to == L2L_F16 || to == L2L_BF16)) ||
        (to == L2L_F32 && (from == L2L_F16 || from == L2L_BF16))))
    return FAIL(L2L_ERR_INVALID, "casts %s to %s: one at once are f32 to f16 or bf16, or back",
                l2l_dtype_name(from), l2l_dtype_name(to));
  void **d = malloc((size_t)count * sizeof *d);
  const void **s = malloc((size_t)count * sizeof *s);
  int64_t *n = malloc((size_t)count * sizeof *n);
  l2l_status status = d && s && n ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory to cast %d tensors", count);
  for (int i = 0; status == L2L_OK && i < count; i++)
    d[i] = tensor_ptr(dst[i]), s[i] = tensor_ptr(src[i]), n[i] = dst[i]->numel;
  if (status == L2L_OK)
    status = backend_for(dst[0]->storage->pool)->convert_many((void *const *)d, to, (const void *const *)s, from, n, count);
  free(d), free(s), free(n);
  return status;
}

l2l_status l2l_tensor_cast(l2l_tensor *dst, const l2l_tensor *src) {
  TRY(tensor_check(__func__, "dst", dst));
  TRY(tensor_check(__func__, "src", src));
  bool numeric_dst = is_float(dst->dtype) || dst->dtype == L2L_I32;
  bool numeric_src = is_float(src->dtype) || src->dtype == L2L_I32;
  if (!numeric_dst || !numeric_src || (!is_float(dst->dtype) && !is_float(src->dtype) &&
                                       dst->dtype != src->dtype))
    return FAIL(L2L_ERR_INVALID, "cannot cast %s to %s (casts are among f32, f16, bf16, i32)",
                l2l_dtype_name(src->dtype), l2l_dtype_name(dst->dtype));
  if (dst->numel != src->numel)
    return FAIL(L2L_ERR_INVALID, "dst has %lld elements but src has %lld",
                (long long)dst->numel, (long long)src->numel);
  if (backend_pool_domain(dst->storage->pool) != backend_pool_domain(src->storage->pool))
    return FAIL(L2L_ERR_INVALID, "dst is in pool '%s' and src in pool '%s': cast within one "
                "backend, then copy", l2l_pool_name(dst->storage->pool),
                l2l_pool_name(src->storage->pool));
  if (dst->storage == src->storage && tensor_ptr(dst) != tensor_ptr(src) &&
      dst->offset < src->offset + src->numel && src->offset < dst->offset + dst->numel)
    return FAIL(L2L_ERR_INVALID, "dst and src overlap in one storage");
  if (dst->storage == src->storage && dst->dtype != src->dtype &&
      l2l_dtype_size(dst->dtype) != l2l_dtype_size(src->dtype))
    return FAIL(L2L_ERR_INVALID, "dst and src share storage but differ in element size");
  int64_t bad = -1;
  TRY(backend_for(dst->storage->pool)
          ->convert(tensor_ptr(dst), dst->dtype, tensor_ptr(src), src->dtype, dst->numel,
                    &bad));
  if (bad >= 0) {   /* (the element named as the front end counts it: core/error.c) */
    char at[128];
    int64_t index[L2L_MAX_DIMS];
    return error_note_element(FAIL(L2L_ERR_INVALID, "src" L2L_NAMED_ELEMENT "%s" L2L_NAMED_END
                                   " is not an integer within int32 range",
                                   core_index_str(at, sizeof at, src, bad)),
                              core_index_of(index, src, bad), index);
  }
  return L2L_OK;
}

l2l_status l2l_tensor_fill(l2l_tensor *t, double value) {
  TRY(tensor_check(__func__, "t", t));
  if (t->dtype == L2L_I32 && !(value == floor(value) && value >= INT32_MIN && value <= INT32_MAX))
    return FAIL(L2L_ERR_INVALID, "t is i32 but value %g is not an int32", value);
  if (t->dtype == L2L_U8 && !(value == floor(value) && value >= 0 && value <= 255))
    return FAIL(L2L_ERR_INVALID, "t is u8 but value %g is not an integer in [0, 255]", value);
  return backend_for(t->storage->pool)->fill(tensor_ptr(t), t->dtype, value, t->numel);
}

static l2l_status random_fill(const char *func, l2l_tensor *t, enum backend_distribution dist,
                              uint64_t seed, uint64_t stream, int64_t first, double a, double b) {
  TRY(tensor_check(func, "t", t));
  if (!is_float(t->dtype))
    return core_fail_in(func, L2L_ERR_INVALID, "t is %s; random fills need f32, f16 or bf16",
                        l2l_dtype_name(t->dtype));
  if (first < 0) return core_fail_in(func, L2L_ERR_INVALID, "first must be >= 0, got %lld",
                                     (long long)first);
  return backend_for(t->storage->pool)
      ->random(tensor_ptr(t), t->dtype, t->numel, dist, seed, stream, first, a, b);
}

/* The largest finite value of a float dtype. */
static double float_max(l2l_dtype d) {
  return d == L2L_F16 ? 65504.0 : d == L2L_BF16 ? 0x1.fep127 : (double)FLT_MAX;
}

l2l_status l2l_tensor_uniform(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                              double lo, double hi) {
  if (!isfinite(lo) || !isfinite(hi) || lo > hi)
    return FAIL(L2L_ERR_INVALID, "need finite lo <= hi, got lo = %g, hi = %g", lo, hi);
  /* Bounds beyond the dtype's finite range: draws below -max rounded to -inf, outside
     [lo, hi) (about half of them for lo = -1e6 in f16, or -1e39 in f32). */
  if (tensor_ok(t) && is_float(t->dtype) &&
      (lo < -float_max(t->dtype) || hi > float_max(t->dtype)))
    return FAIL(L2L_ERR_INVALID, "lo = %g and hi = %g must lie within %s's finite range "
                "(+-%g)", lo, hi, l2l_dtype_name(t->dtype), float_max(t->dtype));
  return random_fill(__func__, t, L2L_UNIFORM, seed, stream, first, lo, hi);
}

l2l_status l2l_tensor_normal(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                             double mean, double std) {
  if (!isfinite(mean) || !isfinite(std) || std < 0)
    return FAIL(L2L_ERR_INVALID, "need a finite mean and std >= 0, got mean = %g, std = %g",
                mean, std);
  return random_fill(__func__, t, L2L_NORMAL, seed, stream, first, mean, std);
}
