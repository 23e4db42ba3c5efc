/* SPDX-License-Identifier: MIT */
/* tensor.c — tensor handles, refcounted storage and views.
 *
 * Purpose: the one data structure everything else passes around. A handle owns a
 * reference to its storage; views (rows along dim 0, reshapes) are new handles on the
 * same storage, so a micro-batch is a view of its batch without a copy. What reads or
 * writes elements (copies, casts, fills) is the backend's (backend/tensor_ops.c).
 * Must never: free storage that another handle still uses, or touch an element.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

const char *core_shape_str(char *buf, size_t len, const l2l_tensor *t) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < t->ndim && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? "," : "(",
                             (long long)t->shape[i]);
  if (used < len) snprintf(buf + used, len - used, ")");
  return buf;
}

int core_shape_index(int64_t index[L2L_MAX_DIMS], int ndim, const int64_t *shape, int64_t flat) {
  int n = ndim > 0 && ndim <= L2L_MAX_DIMS ? ndim : 1;
  for (int i = n - 1; i > 0; i--) {
    int64_t d = shape[i] > 0 ? shape[i] : 1;
    index[i] = flat % d;
    flat /= d;
  }
  index[0] = flat;
  return n;
}

int core_index_of(int64_t index[L2L_MAX_DIMS], const l2l_tensor *t, int64_t flat) {
  return core_shape_index(index, t->ndim, t->shape, flat);
}

const char *core_index_str(char *buf, size_t len, const l2l_tensor *t, int64_t flat) {
  return core_shape_index_str(buf, len, t->ndim, t->shape, flat);
}

const char *core_shape_index_str(char *buf, size_t len, int ndim, const int64_t *shape, int64_t flat) {
  int64_t index[L2L_MAX_DIMS];
  int n = core_shape_index(index, ndim, shape, flat);
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "[%lld]", (long long)index[i]);
  return buf;
}

l2l_status core_need_shape(const char *func, const char *name, const l2l_tensor *t,
                           l2l_dtype dtype, int ndim, const int64_t *dims) {
  if (t == NULL) return core_fail_in(func, L2L_ERR_INVALID, "%s is NULL", name);
  if (!tensor_ok(t))
    return core_fail_in(func, L2L_ERR_INVALID, "%s is not a live tensor (freed?)", name);
  char have[64], want[64] = "(";
  for (int i = 0; i < ndim; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "",
             (long long)dims[i]);
  strcat(want, ")");
  bool match = t->dtype == dtype && t->ndim == ndim;
  for (int i = 0; match && i < ndim; i++) match = t->shape[i] == dims[i];
  if (!match)
    return core_fail_in(func, L2L_ERR_INVALID, "%s is %s %s, need %s %s", name,
                        l2l_dtype_name(t->dtype), core_shape_str(have, sizeof have, t),
                        l2l_dtype_name(dtype), want);
  return L2L_OK;
}

l2l_status core_same_shape(const char *func, const char *an, const l2l_tensor *a,
                           const char *bn, const l2l_tensor *b) {
  bool same = a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
  if (same) return L2L_OK;
  char sa[64], sb[64];
  return core_fail_in(func, L2L_ERR_INVALID, "%s has shape %s but %s has shape %s", an,
                      core_shape_str(sa, 64, a), bn, core_shape_str(sb, 64, b));
}

/* Checks ndim and shape and returns the element count through *numel. */
static l2l_status check_shape(const char *func, int ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 1 || ndim > L2L_MAX_DIMS)
    return core_fail_in(func, L2L_ERR_INVALID, "ndim must be 1 to %d, got %d", L2L_MAX_DIMS, ndim);
  if (shape == NULL) return core_fail_in(func, L2L_ERR_INVALID, "shape is NULL");
  int64_t count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1)
      return core_fail_in(func, L2L_ERR_INVALID, "dim %d has size %lld; sizes must be >= 1", i,
                          (long long)shape[i]);
    if (count > (INT64_C(1) << 48) / shape[i])
      return core_fail_in(func, L2L_ERR_INVALID, "shape has more than 2^48 elements");
    count *= shape[i];
  }
  *numel = count;
  return L2L_OK;
}

l2l_status tensor_check(const char *func, const char *name, const l2l_tensor *t) {
  if (t == NULL) return core_fail_in(func, L2L_ERR_INVALID, "%s is NULL", name);
  if (!tensor_ok(t))
    return core_fail_in(func, L2L_ERR_INVALID, "%s is not a live tensor (freed?)", name);
  return L2L_OK;
}

l2l_status l2l_tensor_new(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype, int ndim,
                          const int64_t *shape) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!pool_valid((int)pool)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", pool);
  if (l2l_dtype_size(dtype) == 0) return FAIL(L2L_ERR_INVALID, "no dtype with number %d", dtype);
  int64_t numel;
  TRY(check_shape(__func__, ndim, shape, &numel));

  l2l_tensor *t = calloc(1, sizeof *t);
  struct core_storage *s = calloc(1, sizeof *s);
  if (t == NULL || s == NULL) {
    free(t);
    free(s);
    return FAIL(L2L_ERR_NOMEM, "no memory for a tensor handle");
  }
  uint64_t bytes = (uint64_t)numel * l2l_dtype_size(dtype);
  l2l_status status = pool_alloc(&s->data, pool, bytes);
  if (status != L2L_OK) {
    free(t);
    free(s);
    return error_as(__func__, status);
  }
  atomic_init(&s->refs, 1);
  atomic_init(&s->handed_out, false);
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

void tensor_hand_out(const l2l_tensor *t) {
  if (tensor_ok(t)) atomic_store_explicit(&t->storage->handed_out, true, memory_order_release);
}

bool tensor_handed_out(const l2l_tensor *t) {
  return tensor_ok(t) && atomic_load_explicit(&t->storage->handed_out, memory_order_acquire);
}

void l2l_tensor_free(l2l_tensor *t) {
  if (!tensor_ok(t)) return;
  struct core_storage *s = t->storage;
  t->magic = 0;
  free(t);
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    pool_free(s->pool, s->data, s->bytes);
    free(s);
  }
}

/* A new handle on t's storage with the given shape and offset. */
static l2l_status make_view(l2l_tensor **out, const l2l_tensor *t, int ndim,
                            const int64_t *shape, int64_t numel, int64_t offset) {
  l2l_tensor *v = calloc(1, sizeof *v);
  if (v == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for a tensor handle");
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
  TRY(tensor_check(__func__, "t", t));
  if (first < 0 || count < 1 || first > t->shape[0] - count) {
    int64_t end;
    if (__builtin_add_overflow(first, count, &end))   /* first + count is not an int64 */
      return FAIL(L2L_ERR_INVALID, "rows [%lld, %lld + %lld) are not within dim 0 of size %lld",
                  (long long)first, (long long)first, (long long)count, (long long)t->shape[0]);
    return FAIL(L2L_ERR_INVALID, "rows [%lld, %lld) are not within dim 0 of size %lld",
                (long long)first, (long long)end, (long long)t->shape[0]);
  }
  int64_t row = t->numel / t->shape[0];
  int64_t shape[L2L_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = count;
  return make_view(out, t, t->ndim, shape, count * row, t->offset + first * row);
}

l2l_status tensor_new_like(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype,
                           const l2l_tensor *like) {
  return l2l_tensor_new(out, pool, dtype, like->ndim, like->shape);
}

l2l_status tensor_view_bytes(l2l_tensor **out, const l2l_tensor *t, uint64_t byte_offset,
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
  TRY(tensor_check(__func__, "t", t));
  int64_t numel;
  TRY(check_shape(__func__, ndim, shape, &numel));
  if (numel != t->numel)
    return FAIL(L2L_ERR_INVALID, "cannot reshape %lld elements into %lld", (long long)t->numel,
                (long long)numel);
  return make_view(out, t, ndim, shape, numel, t->offset);
}

int l2l_tensor_ndim(const l2l_tensor *t) { return tensor_ok(t) ? t->ndim : -1; }

int64_t l2l_tensor_dim(const l2l_tensor *t, int axis) {
  if (!tensor_ok(t) || axis < 0 || axis >= t->ndim) return -1;
  return t->shape[axis];
}

int64_t l2l_tensor_numel(const l2l_tensor *t) { return tensor_ok(t) ? t->numel : -1; }
int l2l_tensor_dtype(const l2l_tensor *t) { return tensor_ok(t) ? (int)t->dtype : -1; }
int l2l_tensor_pool(const l2l_tensor *t) { return tensor_ok(t) ? (int)t->storage->pool : -1; }
void *l2l_tensor_data(const l2l_tensor *t) { return tensor_ok(t) ? tensor_ptr(t) : NULL; }
int64_t l2l_tensor_offset(const l2l_tensor *t) { return tensor_ok(t) ? t->offset : -1; }

int l2l_tensor_storage_refs(const l2l_tensor *t) {
  return tensor_ok(t) ? atomic_load(&t->storage->refs) : -1;
}
