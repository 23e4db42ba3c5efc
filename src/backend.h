/* backend.h — the ops table: one per backend (cpu now; cuda with its own issue).
 *
 * Purpose: the only place that knows which device runs an op. Public functions (ops.c,
 * tensor.c) check their tensors, then call the table of the backend that owns the
 * tensors' pool with raw pointers and sizes. Entries may assume valid, non-overlapping
 * arguments (except where noted) and must never allocate from a pool, print or exit;
 * they return a status because a GPU launch can fail.
 *
 * Sizes: rows/cols describe matrices; n counts elements. Layouts are contiguous.
 */
#ifndef L2L_BACKEND_H
#define L2L_BACKEND_H

#include "internal.h"

enum l2l_reduction { L2L_REDUCE_SUM, L2L_REDUCE_MAX_ABS, L2L_REDUCE_SUMSQ };
enum l2l_distribution { L2L_UNIFORM, L2L_NORMAL };

struct l2l_backend_ops {
  const char *name;

  /* c[i] = alpha op(a[i]) op(b[i]) + beta c[i] for i < batch; a[i] op'd is (m,k), b[i] op'd
     (k,n), c[i] (m,n); beta = 0 must not read c. */
  l2l_status (*gemm_batched)(float *c, const float *a, const float *b, int64_t batch,
                             int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                             float alpha, float beta);
  l2l_status (*bias_add)(float *y, const float *bias, int64_t rows, int64_t cols);
  l2l_status (*bias_backward)(float *dbias, const float *dy, int64_t rows, int64_t cols);
  l2l_status (*add)(float *out, const float *a, const float *b, int64_t n); /* out may alias */
  l2l_status (*gelu_forward)(float *y, const float *x, int64_t n);          /* y may be x */
  l2l_status (*gelu_backward)(float *dx, const float *dy, const float *x, int64_t n);
  l2l_status (*layernorm_forward)(float *y, float *mean, float *rstd, const float *x,
                                  const float *weight, const float *bias, float eps,
                                  int64_t rows, int64_t cols);
  l2l_status (*layernorm_backward)(float *dx, float *dweight, float *dbias, const float *dy,
                                   const float *x, const float *weight, const float *mean,
                                   const float *rstd, int64_t rows, int64_t cols);
  /* x is (samples, rows_per_sample, tk) and each sample's rows are (heads, tq) with tq
     dividing rows_per_sample; key_mask (samples, tk) or NULL. y may be x. */
  l2l_status (*softmax_forward)(float *y, const float *x, const uint8_t *key_mask, int causal,
                                float scale, int64_t samples, int64_t rows_per_sample,
                                int64_t tq, int64_t tk);
  l2l_status (*softmax_backward)(float *dx, const float *dy, const float *y, float scale,
                                 int64_t rows, int64_t cols);
  l2l_status (*embedding_forward)(float *out, const int32_t *ids, const float *table,
                                  int64_t n, int64_t cols);
  l2l_status (*embedding_backward)(float *dtable, const float *dout, const int32_t *ids,
                                   int64_t n, int64_t vocab, int64_t cols);
  l2l_status (*cross_entropy_forward)(float *losses, const float *logits,
                                      const int32_t *targets, int32_t ignore_index,
                                      int64_t rows, int64_t vocab);
  l2l_status (*cross_entropy_backward)(float *dlogits, const float *logits,
                                       const int32_t *targets, int32_t ignore_index,
                                       float scale, int64_t rows, int64_t vocab);
  l2l_status (*dropout_forward)(float *y, uint8_t *mask, const float *x, float p,
                                uint64_t seed, uint64_t stream, int64_t first, int64_t n);
  l2l_status (*dropout_backward)(float *dx, const float *dy, const uint8_t *mask, float p,
                                 int64_t n);
  l2l_status (*reduce)(double *out, enum l2l_reduction kind, const float *x, int64_t n);
  l2l_status (*adamw)(float *param, float *m, float *v, const float *grad, int64_t n,
                      const l2l_adamw_config *config, float bias_correction1,
                      float bias_correction2);
  /* First index whose value is outside [lo, hi) and not `except`, or -1 (*out). */
  l2l_status (*find_out_of_range)(int64_t *out, const int32_t *values, int64_t n, int32_t lo,
                                  int32_t hi, int32_t except);

  /* Whole-tensor helpers used by tensor.c. */
  l2l_status (*fill)(void *dst, l2l_dtype dtype, double value, int64_t n);
  /* f32 <-> f16/bf16/i32 and between any of those; *bad gets the first element an f32->i32
     conversion could not represent, or -1, checked before anything is written. */
  l2l_status (*convert)(void *dst, l2l_dtype dst_dtype, const void *src, l2l_dtype src_dtype,
                        int64_t n, int64_t *bad);
  l2l_status (*random)(void *dst, l2l_dtype dtype, int64_t n, enum l2l_distribution dist,
                       uint64_t seed, uint64_t stream, int64_t first, double a, double b);
  l2l_status (*copy)(void *dst, l2l_pool_kind dst_pool, const void *src,
                     l2l_pool_kind src_pool, uint64_t bytes);
};

extern const struct l2l_backend_ops l2l_cpu_backend;

/* The backend that runs ops on tensors of `pool`. */
const struct l2l_backend_ops *l2l_backend_for(l2l_pool_kind pool);
/* Which backend's memory a pool is: pools of one domain can meet in one op. */
int l2l_pool_domain(l2l_pool_kind pool);

/* Compute threads for OpenMP loops (runtime.c). */
extern atomic_int l2l_compute_threads;

/* The four 32-bit draws of Philox block `block` of (seed, stream): counter = (block,
   stream), key = seed, as rng.c states. Every backend draws through this layout. */
void l2l_philox_draws(uint32_t *out4, uint64_t seed, uint64_t stream, uint64_t block);

#endif /* L2L_BACKEND_H */
