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
  if (bad >= 0)
    return FAIL(L2L_ERR_INVALID, "src element %lld is not an integer within int32 range",
                (long long)bad);
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
