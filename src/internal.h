/* internal.h — what the files of libl2l share and users never see.
 *
 * Purpose: the error helpers every public function uses to report failure, the layout
 * of a tensor handle and its storage, the pool allocator calls, and lazy start-up of the
 * runtime (threads). Nothing here may be included by code outside src/.
 */
#ifndef L2L_INTERNAL_H
#define L2L_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "l2l.h"

/* ---------------------------------------------------------------- errors */

/* Records a formatted message as this thread's last error and returns `status`, so that
   a check reads `if (bad) return l2l_fail(L2L_ERR_INVALID, "...", ...);`. */
l2l_status l2l_fail(l2l_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The same, prefixed with the calling function's name. */
#define FAIL(status, ...) l2l_fail_in(__func__, (status), __VA_ARGS__)
l2l_status l2l_fail_in(const char *func, l2l_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Propagate a failed status unchanged (its message is already set). */
#define TRY(expr)                                   \
  do {                                              \
    l2l_status try_status_ = (expr);                \
    if (try_status_ != L2L_OK) return try_status_;  \
  } while (0)

/* "1.50 MiB" into buf (for messages beside the exact byte count). */
const char *l2l_human_bytes(char *buf, size_t len, uint64_t bytes);

/* ---------------------------------------------------------------- runtime */

/* Sets compute threads from L2L_THREADS or the core count, once; safe from any thread. */
void l2l_runtime_init(void);

/* ---------------------------------------------------------------- pools */

/* Bytes an allocation of `bytes` is counted as (rounded up to L2L_ALIGN); 0 on overflow. */
uint64_t l2l_pool_accounted(uint64_t bytes);
/* Allocates L2L_ALIGN-aligned memory counted against the pool's budget. */
l2l_status l2l_pool_alloc(void **out, l2l_pool_kind pool, uint64_t bytes);
/* Returns memory from l2l_pool_alloc; `bytes` must be the size that was asked for. */
void l2l_pool_free(l2l_pool_kind pool, void *ptr, uint64_t bytes);
bool l2l_pool_valid(int pool);
/* Gives the pages that freed tensors left cached in the pools' jemalloc arenas back to the
   system (the CUDA cache is backend_cuda.c's). */
void l2l_pool_release_cached(void);

/* ---------------------------------------------------------------- tensors */

#define L2L_TENSOR_MAGIC 0x6c326c74u  /* "l2lt": catches freed or foreign handles */

struct l2l_storage {
  atomic_int refs;       /* tensor handles (views included) using this storage */
  l2l_pool_kind pool;
  uint64_t bytes;        /* as asked of the pool */
  void *data;
};

struct l2l_tensor {
  uint32_t magic;
  l2l_dtype dtype;
  int ndim;
  int64_t shape[L2L_MAX_DIMS];
  int64_t numel;
  int64_t offset;        /* in elements, from the start of the storage */
  struct l2l_storage *storage;
};

static inline bool l2l_tensor_ok(const l2l_tensor *t) {
  return t != NULL && t->magic == L2L_TENSOR_MAGIC;
}

/* The first element of a tensor already checked with l2l_tensor_ok. */
static inline void *l2l_tensor_ptr(const l2l_tensor *t) {
  return (char *)t->storage->data + (size_t)t->offset * l2l_dtype_size(t->dtype);
}

/* Rows and columns of a tensor seen as a matrix (see l2l.h). */
static inline int64_t l2l_tensor_cols(const l2l_tensor *t) { return t->shape[t->ndim - 1]; }
static inline int64_t l2l_tensor_rows(const l2l_tensor *t) {
  return t->numel / l2l_tensor_cols(t);
}

/* Whether two tensors share any byte of storage. */
static inline bool l2l_tensors_overlap(const l2l_tensor *a, const l2l_tensor *b) {
  if (a == NULL || b == NULL || a->storage != b->storage) return false;
  int64_t sa = (int64_t)l2l_dtype_size(a->dtype), sb = (int64_t)l2l_dtype_size(b->dtype);
  int64_t a0 = a->offset * sa, a1 = a0 + a->numel * sa;
  int64_t b0 = b->offset * sb, b1 = b0 + b->numel * sb;
  return a0 < b1 && b0 < a1;
}

/* A new tensor of `like`'s shape with its own dtype and pool (contents undefined). */
l2l_status l2l_tensor_new_like(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype,
                               const l2l_tensor *like);
/* A view of `dtype` in `like`'s shape on t's storage starting byte_offset bytes after t's
   first element (aligned to the dtype's size, within the storage): the relay's slots hold
   records of several dtypes. */
l2l_status l2l_tensor_view_bytes(l2l_tensor **out, const l2l_tensor *t, uint64_t byte_offset,
                                 l2l_dtype dtype, const l2l_tensor *like);

/* ---------------------------------------------------------------- copy threads (device.c) */

/* A mark stands after everything queued on the device's compute stream so far: a CUDA
   event, or NULL where the device's ops are done when they return (the CPU backend). A
   thread that waits for a mark becomes a copy lane: on a GPU its copies then run on a
   stream of its own, overlapping the kernels, and are done when the copy returns. The
   relay marks every job it queues for its copy threads, and the worker waits for the
   mark before it runs the job (jobs.c). */
struct l2l_device_mark;
struct l2l_device_mark *l2l_device_mark(void);
/* Waits for the mark and frees it (NULL: nothing to wait for). */
l2l_status l2l_device_wait_mark(struct l2l_device_mark *mark);

/* A stamp is a moment on the device's clock, taken in the calling thread's order: on a
   GPU a timing event recorded on its stream (the compute stream, or a copy lane's), so it
   happens when the GPU reaches it; on the CPU backend, where ops are done when they
   return, the host clock now. The relay times compute and exposed copies with them: on
   a GPU the host only queues kernels, and its clock says when, not when they ran. */
struct l2l_stamp {
  double host;  /* l2l_now() when taken */
  void *event;  /* the GPU's event; NULL on the CPU backend, or when none could be made
                   (the stamp then never happens) */
};
void l2l_device_stamp(struct l2l_stamp *out);
/* A stamp to relate the device's clock to the host's: taken when the device has done
   everything queued before it, so its host time is its device time. */
void l2l_device_stamp_anchor(struct l2l_stamp *out);
/* Seconds from `from` to `to` on the device's clock (negative when `to` came first), or
   false when either has not happened (yet). */
bool l2l_device_stamp_seconds(double *out, const struct l2l_stamp *from,
                              const struct l2l_stamp *to);
void l2l_device_stamp_release(struct l2l_stamp *stamp);

/* ---------------------------------------------------------------- layers, for the relay */

/* Points a parameter record at other tensors (same shape; grad f32, value f32 or, for a
   low-precision parameter, f16 / bf16) for the layer calls that follow: the relay's
   device copies. value NULL points it back at its own tensors. */
void l2l_param_bind(l2l_param *param, l2l_tensor *value, l2l_tensor *grad);
/* Whether the relay may bind a 16-bit copy of the parameter (a GEMM weight or a gathered
   table); the others stay f32 on the device. */
bool l2l_param_low_precision(const l2l_param *param);
/* What l2l_layer_memory_use reports for a training call of a layer whose low-precision
   parameters are bound in `precision` (f32: all f32): the relay's plans. */
void l2l_layer_memory_in(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                         int64_t seq, l2l_dtype precision);
/* The relay holding a live layer (NULL if none), and setting it. */
const void *l2l_layer_owner(const l2l_layer *layer);
void l2l_layer_set_owner(l2l_layer *layer, const void *owner);
/* Moves everything a saved state holds (its buffer and the inputs and outputs it refers
   to) into `pool` (KARMA's swap); the other pool's bytes go with their last handle. */
l2l_status l2l_saved_move(l2l_saved *saved, l2l_pool_kind pool);
/* Bytes of pool memory a saved state holds, its references to x and y included. */
uint64_t l2l_saved_pool_bytes(const l2l_saved *saved);

/* "(2,3,5)" into buf, for messages. */
const char *l2l_shape_str(char *buf, size_t len, const l2l_tensor *t);
/* t is a live tensor of `dtype` with exactly the dims given (ndim of them); else
   L2L_ERR_INVALID naming `name`, with func's name in front. */
l2l_status l2l_need_shape(const char *func, const char *name, const l2l_tensor *t,
                          l2l_dtype dtype, int ndim, const int64_t *dims);

#endif /* L2L_INTERNAL_H */
