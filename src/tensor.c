/* tensor.c — tensor handles, refcounted storage, views, copies, casts and random fills.
 *
 * Purpose: the one data structure everything else passes around. A handle owns a
 * reference to its storage; views (rows along dim 0, reshapes) are new handles on the
 * same storage, so a micro-batch is a view of its batch without a copy. Element-wise work
 * is done by the backend that owns the storage's pool.
 * Must never: free storage that another handle still uses, or write into a tensor before
 * every argument has been checked.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

const char *l2l_shape_str(char *buf, size_t len, const l2l_tensor *t) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < t->ndim && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? "," : "(",
                             (long long)t->shape[i]);
  if (used < len) snprintf(buf + used, len - used, ")");
  return buf;
}

l2l_status l2l_need_shape(const char *func, const char *name, const l2l_tensor *t,
                          l2l_dtype dtype, int ndim, const int64_t *dims) {
  if (t == NULL) return l2l_fail_in(func, L2L_ERR_INVALID, "%s is NULL", name);
  if (!l2l_tensor_ok(t))
    return l2l_fail_in(func, L2L_ERR_INVALID, "%s is not a live tensor (freed?)", name);
  char have[64], want[64] = "(";
  for (int i = 0; i < ndim; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "",
             (long long)dims[i]);
  strcat(want, ")");
  bool match = t->dtype == dtype && t->ndim == ndim;
  for (int i = 0; match && i < ndim; i++) match = t->shape[i] == dims[i];
  if (!match)
    return l2l_fail_in(func, L2L_ERR_INVALID, "%s is %s %s, need %s %s", name,
                       l2l_dtype_name(t->dtype), l2l_shape_str(have, sizeof have, t),
                       l2l_dtype_name(dtype), want);
  return L2L_OK;
}

/* Checks ndim and shape and returns the element count through *numel. */
static l2l_status check_shape(const char *func, int ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 1 || ndim > L2L_MAX_DIMS)
    return l2l_fail_in(func, L2L_ERR_INVALID, "ndim must be 1 to %d, got %d", L2L_MAX_DIMS, ndim);
  if (shape == NULL) return l2l_fail_in(func, L2L_ERR_INVALID, "shape is NULL");
  int64_t count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1)
      return l2l_fail_in(func, L2L_ERR_INVALID, "dim %d has size %lld; sizes must be >= 1", i,
                         (long long)shape[i]);
    if (count > (INT64_C(1) << 48) / shape[i])
      return l2l_fail_in(func, L2L_ERR_INVALID, "shape has more than 2^48 elements");
    count *= shape[i];
  }
  *numel = count;
  return L2L_OK;
}

static l2l_status check_handle(const char *func, const char *name, const l2l_tensor *t) {
  if (t == NULL) return l2l_fail_in(func, L2L_ERR_INVALID, "%s is NULL", name);
  if (!l2l_tensor_ok(t))
    return l2l_fail_in(func, L2L_ERR_INVALID, "%s is not a live tensor (freed?)", name);
  return L2L_OK;
}

l2l_status l2l_tensor_new(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype, int ndim,
                          const int64_t *shape) {
  l2l_runtime_init();
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!l2l_pool_valid((int)pool)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", pool);
  if (l2l_dtype_size(dtype) == 0) return FAIL(L2L_ERR_INVALID, "no dtype with number %d", dtype);
  int64_t numel;
  TRY(check_shape(__func__, ndim, shape, &numel));

  l2l_tensor *t = calloc(1, sizeof *t);
  struct l2l_storage *s = calloc(1, sizeof *s);
  if (t == NULL || s == NULL) {
    free(t);
    free(s);
    return FAIL(L2L_ERR_NOMEM, "no memory for a tensor handle");
  }
  uint64_t bytes = (uint64_t)numel * l2l_dtype_size(dtype);
  l2l_status status = l2l_pool_alloc(&s->data, pool, bytes);
  if (status != L2L_OK) {
    free(t);
    free(s);
    return status;
  }
  atomic_init(&s->refs, 1);
  s->pool = pool;
  s->bytes = bytes;
  t->magic = L2L_TENSOR_MAGIC;
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->numel = numel;
  t->storage = s;
  *out = t;
  return L2L_OK;
}

void l2l_tensor_free(l2l_tensor *t) {
  if (!l2l_tensor_ok(t)) return;
  struct l2l_storage *s = t->storage;
  t->magic = 0;
  free(t);
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    l2l_pool_free(s->pool, s->data, s->bytes);
    free(s);
  }
}

/* A new handle on t's storage with the given shape and offset. */
static l2l_status make_view(l2l_tensor **out, const l2l_tensor *t, int ndim,
                            const int64_t *shape, int64_t numel, int64_t offset) {
  l2l_tensor *v = calloc(1, sizeof *v);
  if (v == NULL) return l2l_fail(L2L_ERR_NOMEM, "no memory for a tensor handle");
  *v = *t;
  v->ndim = ndim;
  memset(v->shape, 0, sizeof v->shape);
  memcpy(v->shape, shape, (size_t)ndim * sizeof *shape);
  v->numel = numel;
  v->offset = offset;
  atomic_fetch_add(&t->storage->refs, 1);
  *out = v;
  return L2L_OK;
}

l2l_status l2l_tensor_view_rows(l2l_tensor **out, const l2l_tensor *t, int64_t first,
                                int64_t count) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY(check_handle(__func__, "t", t));
  if (first < 0 || count < 1 || first > t->shape[0] - count)
    return FAIL(L2L_ERR_INVALID, "rows [%lld, %lld) are not within dim 0 of size %lld",
                (long long)first, (long long)first + (long long)count, (long long)t->shape[0]);
  int64_t row = t->numel / t->shape[0];
  int64_t shape[L2L_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = count;
  return make_view(out, t, t->ndim, shape, count * row, t->offset + first * row);
}

l2l_status l2l_tensor_new_like(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype,
                               const l2l_tensor *like) {
  return l2l_tensor_new(out, pool, dtype, like->ndim, like->shape);
}

l2l_status l2l_tensor_view_bytes(l2l_tensor **out, const l2l_tensor *t, uint64_t byte_offset,
                                 l2l_dtype dtype, const l2l_tensor *like) {
  const int64_t numel = like->numel;
  uint64_t size = l2l_dtype_size(dtype), start = (uint64_t)t->offset * l2l_dtype_size(t->dtype);
  if (size == 0 || byte_offset % size != 0 || (start + byte_offset) % size != 0 ||
      start + byte_offset + (uint64_t)numel * size > t->storage->bytes)
    return FAIL(L2L_ERR_INVALID, "a %s view of %lld elements at byte %llu does not fit",
                l2l_dtype_name(dtype), (long long)numel, (unsigned long long)byte_offset);
  TRY(make_view(out, t, like->ndim, like->shape, numel, (int64_t)((start + byte_offset) / size)));
  (*out)->dtype = dtype;
  return L2L_OK;
}

l2l_status l2l_tensor_reshape(l2l_tensor **out, const l2l_tensor *t, int ndim,
                              const int64_t *shape) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY(check_handle(__func__, "t", t));
  int64_t numel;
  TRY(check_shape(__func__, ndim, shape, &numel));
  if (numel != t->numel)
    return FAIL(L2L_ERR_INVALID, "cannot reshape %lld elements into %lld", (long long)t->numel,
                (long long)numel);
  return make_view(out, t, ndim, shape, numel, t->offset);
}

int l2l_tensor_ndim(const l2l_tensor *t) { return l2l_tensor_ok(t) ? t->ndim : -1; }

int64_t l2l_tensor_dim(const l2l_tensor *t, int axis) {
  if (!l2l_tensor_ok(t) || axis < 0 || axis >= t->ndim) return -1;
  return t->shape[axis];
}

int64_t l2l_tensor_numel(const l2l_tensor *t) { return l2l_tensor_ok(t) ? t->numel : -1; }
int l2l_tensor_dtype(const l2l_tensor *t) { return l2l_tensor_ok(t) ? (int)t->dtype : -1; }
int l2l_tensor_pool(const l2l_tensor *t) { return l2l_tensor_ok(t) ? (int)t->storage->pool : -1; }
void *l2l_tensor_data(const l2l_tensor *t) { return l2l_tensor_ok(t) ? l2l_tensor_ptr(t) : NULL; }
int64_t l2l_tensor_offset(const l2l_tensor *t) { return l2l_tensor_ok(t) ? t->offset : -1; }

int l2l_tensor_storage_refs(const l2l_tensor *t) {
  return l2l_tensor_ok(t) ? atomic_load(&t->storage->refs) : -1;
}

/* ---------------------------------------------------------------- whole-tensor work */

static bool is_float(l2l_dtype d) { return d == L2L_F32 || d == L2L_F16 || d == L2L_BF16; }

l2l_status l2l_tensor_copy(l2l_tensor *dst, const l2l_tensor *src) {
  TRY(check_handle(__func__, "dst", dst));
  TRY(check_handle(__func__, "src", src));
  if (dst->dtype != src->dtype)
    return FAIL(L2L_ERR_INVALID, "dst is %s but src is %s (use l2l_tensor_cast)",
                l2l_dtype_name(dst->dtype), l2l_dtype_name(src->dtype));
  if (dst->numel != src->numel)
    return FAIL(L2L_ERR_INVALID, "dst has %lld elements but src has %lld",
                (long long)dst->numel, (long long)src->numel);
  if (dst->storage == src->storage && dst->offset == src->offset) return L2L_OK;
  if (dst->storage == src->storage &&
      dst->offset < src->offset + src->numel && src->offset < dst->offset + dst->numel)
    return FAIL(L2L_ERR_INVALID, "dst and src overlap in one storage");
  /* A copy between domains is a transfer; the backend of the accelerator side runs it. */
  l2l_pool_kind side = l2l_pool_domain(dst->storage->pool) ? dst->storage->pool
                                                             : src->storage->pool;
  return l2l_backend_for(side)->copy(l2l_tensor_ptr(dst), dst->storage->pool,
                                     l2l_tensor_ptr(src), src->storage->pool,
                                     (uint64_t)dst->numel * l2l_dtype_size(dst->dtype));
}

l2l_status l2l_tensor_cast(l2l_tensor *dst, const l2l_tensor *src) {
  TRY(check_handle(__func__, "dst", dst));
  TRY(check_handle(__func__, "src", src));
  bool numeric_dst = is_float(dst->dtype) || dst->dtype == L2L_I32;
  bool numeric_src = is_float(src->dtype) || src->dtype == L2L_I32;
  if (!numeric_dst || !numeric_src || (!is_float(dst->dtype) && !is_float(src->dtype) &&
                                       dst->dtype != src->dtype))
    return FAIL(L2L_ERR_INVALID, "cannot cast %s to %s (casts are among f32, f16, bf16, i32)",
                l2l_dtype_name(src->dtype), l2l_dtype_name(dst->dtype));
  if (dst->numel != src->numel)
    return FAIL(L2L_ERR_INVALID, "dst has %lld elements but src has %lld",
                (long long)dst->numel, (long long)src->numel);
  if (l2l_pool_domain(dst->storage->pool) != l2l_pool_domain(src->storage->pool))
    return FAIL(L2L_ERR_INVALID, "dst is in pool '%s' and src in pool '%s': cast within one "
                "backend, then copy", l2l_pool_name(dst->storage->pool),
                l2l_pool_name(src->storage->pool));
  if (dst->storage == src->storage && l2l_tensor_ptr(dst) != l2l_tensor_ptr(src) &&
      dst->offset < src->offset + src->numel && src->offset < dst->offset + dst->numel)
    return FAIL(L2L_ERR_INVALID, "dst and src overlap in one storage");
  if (dst->storage == src->storage && dst->dtype != src->dtype &&
      l2l_dtype_size(dst->dtype) != l2l_dtype_size(src->dtype))
    return FAIL(L2L_ERR_INVALID, "dst and src share storage but differ in element size");
  int64_t bad = -1;
  TRY(l2l_backend_for(dst->storage->pool)
          ->convert(l2l_tensor_ptr(dst), dst->dtype, l2l_tensor_ptr(src), src->dtype, dst->numel,
                    &bad));
  if (bad >= 0)
    return FAIL(L2L_ERR_INVALID, "src element %lld is not an integer within int32 range",
                (long long)bad);
  return L2L_OK;
}

l2l_status l2l_tensor_fill(l2l_tensor *t, double value) {
  TRY(check_handle(__func__, "t", t));
  if (t->dtype == L2L_I32 && !(value == floor(value) && value >= INT32_MIN && value <= INT32_MAX))
    return FAIL(L2L_ERR_INVALID, "t is i32 but value %g is not an int32", value);
  if (t->dtype == L2L_U8 && !(value == floor(value) && value >= 0 && value <= 255))
    return FAIL(L2L_ERR_INVALID, "t is u8 but value %g is not an integer in [0, 255]", value);
  return l2l_backend_for(t->storage->pool)->fill(l2l_tensor_ptr(t), t->dtype, value, t->numel);
}

static l2l_status random_fill(const char *func, l2l_tensor *t, enum l2l_distribution dist,
                              uint64_t seed, uint64_t stream, int64_t first, double a, double b) {
  TRY(check_handle(func, "t", t));
  if (!is_float(t->dtype))
    return l2l_fail_in(func, L2L_ERR_INVALID, "t is %s; random fills need f32, f16 or bf16",
                       l2l_dtype_name(t->dtype));
  if (first < 0) return l2l_fail_in(func, L2L_ERR_INVALID, "first must be >= 0, got %lld",
                                    (long long)first);
  return l2l_backend_for(t->storage->pool)
      ->random(l2l_tensor_ptr(t), t->dtype, t->numel, dist, seed, stream, first, a, b);
}

l2l_status l2l_tensor_uniform(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                              double lo, double hi) {
  if (!isfinite(lo) || !isfinite(hi) || lo > hi)
    return FAIL(L2L_ERR_INVALID, "need finite lo <= hi, got lo = %g, hi = %g", lo, hi);
  return random_fill(__func__, t, L2L_UNIFORM, seed, stream, first, lo, hi);
}

l2l_status l2l_tensor_normal(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                             double mean, double std) {
  if (!isfinite(mean) || !isfinite(std) || std < 0)
    return FAIL(L2L_ERR_INVALID, "need a finite mean and std >= 0, got mean = %g, std = %g",
                mean, std);
  return random_fill(__func__, t, L2L_NORMAL, seed, stream, first, mean, std);
}
