/* l2l.h — the one public header of libl2l.
 *
 * Purpose: everything a C program, or LuaJIT's FFI, needs to use l2l: status codes and
 * the per-thread error message, compute threads, memory pools, tensors, the counter-based
 * random generator and the tensor ops of the backends. It must never expose a backend's
 * internals, include a CUDA header, or declare anything a user cannot call.
 *
 * Conventions, stated once for every function below:
 *  - Fallible calls return l2l_status. On failure l2l_last_error() (per thread) names what
 *    was wrong, and no output tensor or statistic has been changed: arguments are checked
 *    in full before anything is written.
 *  - Constructors return their object through `T **out`, which comes first; op arguments
 *    come outputs first, then inputs, then parameters, then sizes. Destructors accept NULL.
 *  - Tensors are contiguous and row-major with 1 to 4 dims, each at least 1. Where an op
 *    treats a tensor as a matrix, its columns are the last dim and its rows are the product
 *    of the others ("rows" below).
 *  - Parameter gradients accumulate (+=); activation gradients are written (=).
 *  - All tensors of one op live in one backend: the host and pinned pools belong to the
 *    CPU; the device pool belongs to the accelerator (on a CPU-only build, to the CPU too,
 *    but mixing it with host tensors is still refused, so that what runs on a CPU-only
 *    build runs unchanged on a GPU build).
 *
 * The block between L2L_FFI_BEGIN and L2L_FFI_END is plain C that LuaJIT's ffi.cdef
 * accepts; lua/l2l/cdef.lua is generated from it (make) and a spec fails if they drift.
 * Keep includes and macros outside it.
 */
#ifndef L2L_H
#define L2L_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- status and errors */

typedef enum l2l_status {
  L2L_OK = 0,
  L2L_ERR_INVALID = 1,     /* a bad argument: NULL, shape, dtype, pool, value out of range */
  L2L_ERR_NOMEM = 2,       /* the system could not provide memory */
  L2L_ERR_BUDGET = 3,      /* a pool's byte budget would be exceeded */
  L2L_ERR_STATE = 4,       /* not possible in the object's present state */
  L2L_ERR_UNSUPPORTED = 5, /* a valid request this build cannot serve */
  L2L_ERR_BACKEND = 6      /* a library below (BLAS, CUDA) failed */
} l2l_status;

enum { L2L_MAX_DIMS = 4, L2L_ALIGN = 64 };

/* The message of this thread's last failed call ("" if none). Valid until the next call
   into l2l on this thread. */
const char *l2l_last_error(void);
void l2l_clear_error(void);
const char *l2l_status_name(l2l_status status);
const char *l2l_version(void);

/* ---------------------------------------------------------------- compute threads */

/* Threads used by the CPU backend's loops and by OpenBLAS (never nested in each other).
   Default: the L2L_THREADS environment variable, else every core. */
l2l_status l2l_set_threads(int threads);
int l2l_get_threads(void);

/* ---------------------------------------------------------------- memory pools */

/* host:   jemalloc, called explicitly (mallocx/dallocx in an arena of l2l's own;
           jemalloc never replaces malloc).
   pinned: page-locked host memory for transfers (its own jemalloc arena; on a GPU build
           the arena's extents come from the CUDA pinned allocator).
   device: the accelerator's memory; on a CPU-only build a host-backed pool with the same
           budget and accounting, so device-memory claims are testable without a GPU.
   Every allocation is counted as its size rounded up to L2L_ALIGN bytes. */
typedef enum l2l_pool_kind {
  L2L_POOL_HOST = 0,
  L2L_POOL_PINNED = 1,
  L2L_POOL_DEVICE = 2
} l2l_pool_kind;

typedef struct l2l_pool_stats {
  uint64_t current;  /* bytes in use now */
  uint64_t peak;     /* most bytes in use since start or the last reset_peak */
  uint64_t budget;   /* 0: no budget */
  uint64_t allocs;   /* allocations served */
  uint64_t frees;
  uint64_t refused;  /* allocations refused (budget or out of memory) */
} l2l_pool_stats;

l2l_status l2l_pool_get_stats(l2l_pool_stats *out, l2l_pool_kind pool);
/* 0 removes the budget; a budget below the bytes now in use is refused. */
l2l_status l2l_pool_set_budget(l2l_pool_kind pool, uint64_t bytes);
l2l_status l2l_pool_reset_peak(l2l_pool_kind pool);  /* peak := current */
const char *l2l_pool_name(l2l_pool_kind pool);      /* "host", "pinned", "device"; NULL if invalid */

/* ---------------------------------------------------------------- tensors */

typedef enum l2l_dtype {
  L2L_F32 = 0,
  L2L_F16 = 1,
  L2L_BF16 = 2,
  L2L_I32 = 3,   /* token ids, targets */
  L2L_U8 = 4     /* masks, packed bits */
} l2l_dtype;

typedef struct l2l_tensor l2l_tensor;

size_t l2l_dtype_size(l2l_dtype dtype);        /* 0 if invalid */
const char *l2l_dtype_name(l2l_dtype dtype);   /* "f32", ...; NULL if invalid */

/* A new tensor with fresh storage from `pool`; its contents are undefined. */
l2l_status l2l_tensor_new(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype, int ndim,
                          const int64_t *shape);
/* Releases the handle; the storage goes when its last view goes. NULL is fine. */
void l2l_tensor_free(l2l_tensor *t);
/* A view of rows [first, first+count) along dim 0: same storage, no copy. */
l2l_status l2l_tensor_view_rows(l2l_tensor **out, const l2l_tensor *t, int64_t first,
                                int64_t count);
/* A view with another shape of the same number of elements. */
l2l_status l2l_tensor_reshape(l2l_tensor **out, const l2l_tensor *t, int ndim,
                              const int64_t *shape);

/* Accessors never fail: for a NULL or freed tensor they return -1 / NULL. */
int l2l_tensor_ndim(const l2l_tensor *t);
int64_t l2l_tensor_dim(const l2l_tensor *t, int axis);
int64_t l2l_tensor_numel(const l2l_tensor *t);
int l2l_tensor_dtype(const l2l_tensor *t);
int l2l_tensor_pool(const l2l_tensor *t);
void *l2l_tensor_data(const l2l_tensor *t);
int64_t l2l_tensor_offset(const l2l_tensor *t);        /* first element's index in its storage */
int l2l_tensor_storage_refs(const l2l_tensor *t);      /* handles sharing the storage */

/* dst := src, same dtype and number of elements; any pools (a transfer). */
l2l_status l2l_tensor_copy(l2l_tensor *dst, const l2l_tensor *src);
/* dst := src converted among f32, f16, bf16 and i32 (round to nearest even). A float to
   i32 cast refuses, before writing, any value that is not an integer within int32 range.
   dst and src in pools of one backend. */
l2l_status l2l_tensor_cast(l2l_tensor *dst, const l2l_tensor *src);
/* Every element := value (converted to t's dtype; integer dtypes need an integer value
   within their range). */
l2l_status l2l_tensor_fill(l2l_tensor *t, double value);

/* ---------------------------------------------------------------- random numbers */

/* Philox4x32-10 (Salmon et al., SC 2011): out = 10 rounds of the bijection of `counter`
   keyed by `key`. Every random number in l2l is a function of (seed, stream, index), so
   splitting a batch into micro-batches never changes a draw. */
l2l_status l2l_philox4x32(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2);

/* Element i of t gets the draw with index first+i of (seed, stream). Pass the element's
   position in the whole batch as `first` and any split gives the same numbers. */
l2l_status l2l_tensor_uniform(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                              double lo, double hi);
l2l_status l2l_tensor_normal(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                             double mean, double std);

/* Scalar conversions with round to nearest even (NaN stays NaN, overflow gives inf). */
uint16_t l2l_f32_to_bf16(float x);
float l2l_bf16_to_f32(uint16_t x);
uint16_t l2l_f32_to_f16(float x);
float l2l_f16_to_f32(uint16_t x);

/* ---------------------------------------------------------------- ops
   f32 tensors unless stated. Shapes in comments: R = rows, C = columns. */

/* c = alpha * op(a) @ op(b) + beta * c, op(x) = x^T when trans_x is 1, x when 0 (other
   values are refused). As matrices: op(a) (M,K), op(b) (K,N), c (M,N); alpha and beta
   finite. With beta = 0, c is not read (NaN in c does not propagate). */
l2l_status l2l_gemm(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b, int trans_a,
                    int trans_b, float alpha, float beta);
/* The same for a batch of matrices: each tensor is (batch..., rows, cols) with the batch
   dims (all but the last two) multiplied into one count that must agree. */
l2l_status l2l_gemm_batched(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b,
                            int trans_a, int trans_b, float alpha, float beta);

l2l_status l2l_bias_add(l2l_tensor *y, const l2l_tensor *bias);          /* y (R,C) += bias (C) */
l2l_status l2l_bias_backward(l2l_tensor *dbias, const l2l_tensor *dy);   /* dbias (C) += sum_r dy */
/* out = a + b (the residual add); out may be a or b. */
l2l_status l2l_add(l2l_tensor *out, const l2l_tensor *a, const l2l_tensor *b);

/* GELU, tanh form: y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). y may be x. */
l2l_status l2l_gelu_forward(l2l_tensor *y, const l2l_tensor *x);
l2l_status l2l_gelu_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *x);

/* LayerNorm over the last dim: y = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var+eps)
   with the biased variance; eps finite and > 0. mean and rstd (R) are saved for backward
   (NULL to skip). */
l2l_status l2l_layernorm_forward(l2l_tensor *y, l2l_tensor *mean, l2l_tensor *rstd,
                                 const l2l_tensor *x, const l2l_tensor *weight,
                                 const l2l_tensor *bias, float eps);
/* dx written; dweight, dbias accumulated (either may be NULL). */
l2l_status l2l_layernorm_backward(l2l_tensor *dx, l2l_tensor *dweight, l2l_tensor *dbias,
                                  const l2l_tensor *dy, const l2l_tensor *x,
                                  const l2l_tensor *weight, const l2l_tensor *mean,
                                  const l2l_tensor *rstd);

/* Row softmax of scale * x over the last dim (Tk), x (..., Tq, Tk). causal is 0 or 1; 1
   hides key j from query i when j > i + (Tk - Tq). key_mask (B, Tk) u8, 1 = real token,
   0 = padding, hides padded keys of sample b, where b is x's first index (x needs at least
   3 dims); NULL for none. A row whose keys are all hidden is all zeros. y may be x. */
l2l_status l2l_softmax_forward(l2l_tensor *y, const l2l_tensor *x, const l2l_tensor *key_mask,
                               int causal, float scale);
/* dx = scale * y * (dy - sum(dy * y)) per row; masked entries (y = 0) get 0. */
l2l_status l2l_softmax_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *y,
                                float scale);

/* out (N..., C) = table (V, C) rows picked by ids (N...) i32. Ids outside [0, V) are refused
   before anything is written. */
l2l_status l2l_embedding_forward(l2l_tensor *out, const l2l_tensor *ids, const l2l_tensor *table);
/* dtable[ids[n]] += dout[n] (scatter-add; repeated ids sum). */
l2l_status l2l_embedding_backward(l2l_tensor *dtable, const l2l_tensor *dout,
                                  const l2l_tensor *ids);

/* losses (R) = -log softmax(logits (R,V))[target] per row; rows whose target equals
   ignore_index get 0. Other targets outside [0, V) are refused. */
l2l_status l2l_cross_entropy_forward(l2l_tensor *losses, const l2l_tensor *logits,
                                     const l2l_tensor *targets, int32_t ignore_index);
/* dlogits = scale * (softmax(logits) - onehot(target)); ignored rows get 0. For the mean
   over real tokens, scale = 1 / (number of real tokens in the whole batch). */
l2l_status l2l_cross_entropy_backward(l2l_tensor *dlogits, const l2l_tensor *logits,
                                      const l2l_tensor *targets, int32_t ignore_index,
                                      float scale);

/* Inverted dropout: element i is kept when uniform draw first+i of (seed, stream) is below
   1 - p; y = x * kept / (1 - p). mask (ceil(numel/8)) u8 gets the kept bits, bit i%8 of
   byte i/8. 0 <= p < 1; y may be x. */
l2l_status l2l_dropout_forward(l2l_tensor *y, l2l_tensor *mask, const l2l_tensor *x, float p,
                               uint64_t seed, uint64_t stream, int64_t first);
l2l_status l2l_dropout_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *mask,
                                float p);

/* Reductions over every element, accumulated in double. */
l2l_status l2l_sum(double *out, const l2l_tensor *x);
l2l_status l2l_max_abs(double *out, const l2l_tensor *x);
l2l_status l2l_norm2(double *out, const l2l_tensor *x);   /* sqrt(sum x^2) */

/* AdamW (Loshchilov & Hutter), one step t >= 1, bias-corrected, decoupled weight decay:
   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
   p -= lr * ( m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + weight_decay * p ).
   Refused: lr < 0, beta outside [0, 1), eps <= 0, weight_decay < 0, anything not finite. */
typedef struct l2l_adamw_config {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
} l2l_adamw_config;
l2l_status l2l_adamw_update(l2l_tensor *param, l2l_tensor *m, l2l_tensor *v,
                            const l2l_tensor *grad, const l2l_adamw_config *config, int64_t step);

/* L2L_FFI_END */

#ifdef __cplusplus
}
#endif
#endif /* L2L_H */
