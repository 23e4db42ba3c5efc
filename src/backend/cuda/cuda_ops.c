/* SPDX-License-Identifier: MIT */
/* cuda_ops.c — the CUDA ops table: cuBLAS (and cuBLASLt, cublaslt.c) for GEMMs, kernels/
 * for everything else (attention's entries are attention_ops.c's).
 *
 * Purpose: run every op of the ops table on the GPU with the meaning the CPU backend
 * (backend/cpu/) defines, so that a layer computes the same numbers on either. Work is
 * queued on one compute stream in call order; an op that hands a result to the host
 * (a reduction, a range check, a copy to host memory) waits for the stream first; a copy
 * on a copy lane (runtime.c) runs on the lane's stream and is done when it returns, with
 * every copy the lane queued before it (the stream keeps their order).
 * Every CUDA, cuBLAS or launch error becomes L2L_ERR_BACKEND with file, line, the call
 * and CUDA's own words.
 * Must never: exit or abort on a CUDA error, or allocate from a pool.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef L2L_CUDA

#include "runtime.h"
#include "cublaslt.h"

#include "kernels/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/reduce.h"

/* The launchers take dtypes as the kernels' numbers: they must be l2l_dtype's. */
_Static_assert((int)DT_F32 == (int)L2L_F32 && (int)DT_F16 == (int)L2L_F16 &&
                   (int)DT_BF16 == (int)L2L_BF16 && (int)DT_I32 == (int)L2L_I32 &&
                   (int)DT_U8 == (int)L2L_U8,
               "kernels/dtype.h numbers the dtypes differently from l2l_dtype");

/* Work queued on the compute stream (kernels, cuBLAS calls, copies), for the profile. */
static atomic_llong launches = 0;
void cuda_launched(void) { atomic_fetch_add_explicit(&launches, 1, memory_order_relaxed); }
static int64_t cuda_launches(void) { return atomic_load_explicit(&launches, memory_order_relaxed); }

/* ---------------------------------------------------------------- GEMM */

/* Row-major c = alpha op(a) op(b) + beta c is column-major c^T = alpha op(b)^T op(a)^T
   + beta c^T: cuBLAS gets b first, and the same transposes (a row-major matrix read as
   column-major is already its transpose, with the same stride). a and b are f32, f16 or
   bf16 (both the same); c and the accumulation are f32. */
static l2l_status cuda_gemm_batched(float *c, const void *a, const void *b, l2l_dtype ab_dtype,
                                    int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                                    int trans_b, float alpha, float beta, int64_t lda,
                                    int64_t ldb, int64_t ldc) {
  const int64_t a_rows = trans_a ? k : m, b_rows = trans_b ? n : k;
  if (lda == 0) lda = trans_a ? m : k;
  if (ldb == 0) ldb = trans_b ? k : n;
  if (ldc == 0) ldc = n;
  cudaDataType_t type = cuda_data_type(ab_dtype);
  cublasComputeType_t compute = ab_dtype == L2L_F32 && atomic_load(&cuda_rt.tf32)
                                    ? CUBLAS_COMPUTE_32F_FAST_TF32
                                    : CUBLAS_COMPUTE_32F;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cuda_launched();
  if (batch == 1) {
    CUBLAS_TRY(cublas.gemm(cuda_rt.blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b, type,
                            (int)ldb, a, type, (int)lda, &beta, c, CUDA_R_32F, (int)ldc, compute,
                            CUBLAS_GEMM_DEFAULT));
  } else {
    CUBLAS_TRY(cublas.gemm_strided_batched(cuda_rt.blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha,
                                          b, type, (int)ldb, b_rows * ldb, a, type, (int)lda,
                                          a_rows * lda, &beta, c, CUDA_R_32F, (int)ldc, m * ldc,
                                          (int)batch, compute, CUBLAS_GEMM_DEFAULT));
  }
  return L2L_OK;
}

/* Through cuBLASLt's bias epilogue where it runs (cublaslt.c), else the GEMM, the bias
   kernel (with its 16-bit output) or the cast. A call with neither bias nor c16 is a plain
   GEMM. */
static l2l_status cuda_gemm_bias(float *c, void *c16, l2l_dtype c16_dtype, const void *a,
                                 const void *b, l2l_dtype ab_dtype, const float *bias, int64_t m,
                                 int64_t n, int64_t k, int trans_a, int trans_b) {
  bool ran = false;
  if (bias != NULL || c16 != NULL)
    TRY(cublaslt_gemm_bias(&ran, c16 != NULL ? c16 : (void *)c, c16 != NULL ? c16_dtype : L2L_F32,
                           a, b, ab_dtype, bias, m, n, k, trans_a, trans_b));
  if (ran) {
    cuda_launched();
    return L2L_OK;
  }
  return backend_gemm_bias_in_steps(cuda_ops(), c, c16, c16_dtype, a, b, ab_dtype, bias, m, n, k,
                                    trans_a, trans_b);
}

/* ---------------------------------------------------------------- copies */

/* Between any two pools; the host side may be pageable (jemalloc) or pinned memory.
   A copy that touches host memory waits for it: the caller may reuse that memory next.
   On a lane: on the lane's stream, and done when this returns, with the copies the lane
   queued before it (relay/transfer.c's lane_copies waits for a visit's so). */
static l2l_status cuda_copy(void *dst, l2l_pool_kind dst_pool, const void *src,
                            l2l_pool_kind src_pool, uint64_t bytes) {
  struct lane *lane = cuda_lane;
  if (lane != NULL) {
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane->stream));
    cudaError_t err = cudaEventRecord(lane->done, lane->stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(lane->done);
    if (err != cudaSuccess) {
      cudaStreamSynchronize(lane->stream);   /* the caller frees the buffers next */
      return cuda_error(err, __FILE__, __LINE__, "waiting for a copy lane's copy");
    }
    return L2L_OK;
  }
  cuda_launched();
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_rt.compute));
  if (dst_pool != L2L_POOL_DEVICE || src_pool != L2L_POOL_DEVICE) TRY(cuda_wait_stream());
  return L2L_OK;
}

/* On the calling thread's stream (a lane's or the compute stream), with no wait. */
static l2l_status cuda_copy_queued(void *dst, l2l_pool_kind dst_pool, const void *src,
                                   l2l_pool_kind src_pool, uint64_t bytes) {
  (void)dst_pool, (void)src_pool;
  struct lane *lane = cuda_lane;
  if (lane == NULL) cuda_launched();
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                           lane != NULL ? lane->stream : cuda_rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- scratch */

/* The backend's own device scratch: results the host reads back (a double, an index)
   and partial sums of the ops that need them. It grows when an op needs more (rarely:
   at the first call of a larger shape), never in the steady state. Ops that use it hold
   cuda_rt.lock from their first launch to their last read, so that two host threads' ops
   never interleave on it. */
enum { RESULT_BYTES = 256, REDUCE_BYTES = L2L_K_REDUCE_SCRATCH_DOUBLES * sizeof(double) };

/* Floats of scratch after the result and reduction areas, at least `floats` of them.
   Called with cuda_rt.lock held. */
l2l_status cuda_scratch_floats(float **out, int64_t floats) {
  uint64_t need = RESULT_BYTES + REDUCE_BYTES + (uint64_t)floats * sizeof(float);
  if (need > cuda_rt.scratch_bytes) TRY(cuda_scratch_grow(need));
  *out = (float *)((char *)cuda_rt.scratch + RESULT_BYTES + REDUCE_BYTES);
  return L2L_OK;
}

static double *scratch_reduce(void) { return (double *)((char *)cuda_rt.scratch + RESULT_BYTES); }

/* Copies `bytes` of the result area to the host, after everything queued. */
static l2l_status read_result(void *host, uint64_t bytes) {
  cuda_launched();
  CUDA_TRY(cudaMemcpyAsync(host, cuda_rt.scratch, bytes, cudaMemcpyDeviceToHost, cuda_rt.compute));
  return cuda_wait_stream();
}

/* ---------------------------------------------------------------- element-wise */

static l2l_status cuda_add(float *out, const float *a, const float *b, int64_t n) {
  LAUNCH(k_add(out, a, b, n, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_bias_add(float *y, void *y16, l2l_dtype y16_dtype, const float *bias,
                                int64_t rows, int64_t cols) {
  LAUNCH(k_bias_add(y, y16, (int)y16_dtype, bias, rows, cols, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status bias_backward_locked(float *dbias, const void *dy, l2l_dtype dy_dtype,
                                       int64_t rows, int64_t cols) {
  float *scratch = NULL;
  TRY(cuda_scratch_floats(&scratch, k_bias_backward_scratch_floats(rows, cols)));
  LAUNCH(k_bias_backward(dbias, dy, (int)dy_dtype, rows, cols, scratch, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_bias_backward(float *dbias, const void *dy, l2l_dtype dy_dtype,
                                     int64_t rows, int64_t cols) {
  WITH_SCRATCH(bias_backward_locked(dbias, dy, dy_dtype, rows, cols));
}

static l2l_status cuda_gelu_forward(float *y, const float *x, int64_t n) {
  LAUNCH(k_gelu_forward(y, x, n, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_gelu_backward(float *dx, void *dx16, l2l_dtype dx16_dtype, const float *dy,
                                     const float *x, int64_t n) {
  LAUNCH(k_gelu_backward(dx, dx16, (int)dx16_dtype, dy, x, n, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n) {
  LAUNCH(k_gelu_forward_bits(y, bits, x, n, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_gelu_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                                 const float *dy, const float *y,
                                                 const uint8_t *bits, int64_t n) {
  _Static_assert(K_GELU_TABLE == GELU_TABLE, "kernels/elementwise.h sizes GELU's tables "
                 "differently from src/backend/backend.h");
  const struct gelu_slopes *t = gelu_slopes();
  struct k_gelu_slopes slopes = {.slope = cuda_rt.gelu_slopes, .y_left = t->y_left};
  memcpy(slopes.scale, t->scale, sizeof slopes.scale);
  memcpy(slopes.origin, t->origin, sizeof slopes.origin);
  LAUNCH(k_gelu_backward_from_output(dx, dx16, (int)dx16_dtype, dy, y, bits, n, &slopes,
                                     cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_bias_gelu_forward(float *pre, float *y, void *y16, l2l_dtype y16_dtype,
                                         uint8_t *bits, const float *bias, int64_t rows,
                                         int64_t cols) {
  LAUNCH(k_bias_gelu_forward(pre, y, y16, (int)y16_dtype, bits, bias, rows, cols,
                             cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_dropout_forward(float *y, uint8_t *mask, const float *x, float p,
                                       uint64_t seed, uint64_t stream, int64_t first, int64_t n) {
  LAUNCH(k_dropout_forward(y, mask, x, p, backend_keep_threshold(p), seed, stream, first, n,
                           cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p,
                                        int64_t n) {
  LAUNCH(k_dropout_backward(dx, dy, mask, p, n, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_adamw(float *param, float *m, float *v, const float *grad, int64_t n,
                             const l2l_adamw_config *c, float bias_correction1,
                             float bias_correction2) {
  LAUNCH(k_adamw(param, m, v, grad, n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                 bias_correction1, bias_correction2, cuda_rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- a record on the device */

static l2l_status cuda_grad_add(float *acc, const void *g, l2l_dtype dtype, float scale,
                                const float *scale_at, int64_t n, int32_t *flag) {
  LAUNCH(k_grad_add(acc, g, (int)dtype, scale, scale_at, n, flag, cuda_rt.compute));
  return L2L_OK;
}

/* (its sums in another order than the host's: the factor may differ in its last bit) */
static l2l_status clip_scale_locked(float *scale, const void *const *g, const l2l_dtype *dtype,
                                    const int64_t *n, int count, float clip) {
  if (count > L2L_K_CLIP_GRADIENTS)
    return core_fail(L2L_ERR_UNSUPPORTED, "per-layer clipping of %d gradients at once (at "
                     "most %d)", count, L2L_K_CLIP_GRADIENTS);
  int dtypes[L2L_K_CLIP_GRADIENTS];
  for (int i = 0; i < count; i++) dtypes[i] = (int)dtype[i];
  float *scratch = NULL;
  TRY(cuda_scratch_floats(&scratch, 2 * L2L_K_CLIP_SCRATCH_DOUBLES));
  LAUNCH(k_clip_scale(scale, g, dtypes, n, count, clip, (double *)scratch, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_clip_scale(float *scale, const void *const *g, const l2l_dtype *dtype,
                                  const int64_t *n, int count, float clip) {
  WITH_SCRATCH(clip_scale_locked(scale, g, dtype, n, count, clip));
}

static l2l_status optim_update_locked(void *p, void *s0, void *s1, float *grad, int64_t n,
                                      const struct optim_hyper *h, const int32_t *skip) {
  float *scratch = NULL;
  TRY(cuda_scratch_floats(&scratch, 2 * L2L_K_OPTIM_SCRATCH_DOUBLES));
  struct k_optim o;
  optim_kernel_consts(&o, h);
  int root[2];
  const int precision = optim_kernel_state(h, root);
  if (precision < 0)
    LAUNCH(k_optim_update(p, s0, s1, grad, n, &o, skip, (double *)scratch, cuda_rt.compute));
  else {
    LAUNCH(k_optim_update_compact(p, s0, s1, precision,
                                  (int64_t)state8_codes_bytes(n), root, grad, n, &o,
                                  optim_code_values(OPTIM_CODE_SIGNED),
                                  optim_code_values(OPTIM_CODE_ROOT), skip, (double *)scratch,
                                  cuda_rt.compute));
  }
  return L2L_OK;
}

static l2l_status cuda_optim_update(void *p, void *s0, void *s1, float *grad, int64_t n,
                                    const struct optim_hyper *h, const int32_t *skip) {
  WITH_SCRATCH(optim_update_locked(p, s0, s1, grad, n, h, skip));
}

/* Two reductions into the record's words on the device (nothing read back). A NaN's max
   is NaN here, where the host's ignores it: the sum of squares is NaN either way. */
static l2l_status grad_norm_locked(double *out, const float *g, int64_t n) {
  LAUNCH(k_reduce(out, L2L_REDUCE_SUMSQ, g, n, scratch_reduce(), cuda_rt.compute));
  LAUNCH(k_reduce(out + 1, L2L_REDUCE_MAX_ABS, g, n, scratch_reduce(), cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_grad_norm(double *out, const float *g, int64_t n) {
  WITH_SCRATCH(grad_norm_locked(out, g, n));
}

/* ---------------------------------------------------------------- LayerNorm, softmax */

static l2l_status cuda_layernorm_forward(float *y, void *y16, l2l_dtype y16_dtype, float *mean,
                                         float *rstd, const float *x, const float *weight,
                                         const float *bias, float eps, int64_t rows,
                                         int64_t cols) {
  LAUNCH(k_layernorm_forward(y, y16, (int)y16_dtype, mean, rstd, x, weight, bias, eps, rows,
                             cols, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_add_layernorm_forward(float *sum, float *y, void *y16,
                                             l2l_dtype y16_dtype, float *mean, float *rstd,
                                             const float *a, const float *b, const float *weight,
                                             const float *bias, float eps, int64_t rows,
                                             int64_t cols) {
  LAUNCH(k_add_layernorm_forward(sum, y, y16, (int)y16_dtype, mean, rstd, a, b, weight, bias,
                                 eps, rows, cols, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status layernorm_backward_locked(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                            float *dweight, float *dbias, const float *dy,
                                            const float *residual, const float *src,
                                            const float *weight, const float *mean,
                                            const float *bias, const float *rstd, int64_t rows,
                                            int64_t cols) {
  float *scratch = NULL;
  if (dweight != NULL || dbias != NULL)
    TRY(cuda_scratch_floats(&scratch, k_layernorm_backward_scratch_floats(rows, cols)));
  if (mean != NULL)
    LAUNCH(k_layernorm_backward(dx, dx16, (int)dx16_dtype, dweight, dbias, dy, residual, src,
                                weight, mean, rstd, rows, cols, scratch, cuda_rt.compute));
  else
    LAUNCH(k_layernorm_backward_from_output(dx, dx16, (int)dx16_dtype, dweight, dbias, dy,
                                            residual, src, weight, bias, rstd, rows, cols,
                                            scratch, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_layernorm_backward(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                          float *dweight, float *dbias, const float *dy,
                                          const float *residual, const float *x,
                                          const float *weight, const float *mean,
                                          const float *rstd, int64_t rows, int64_t cols) {
  WITH_SCRATCH(layernorm_backward_locked(dx, dx16, dx16_dtype, dweight, dbias, dy, residual, x,
                                         weight, mean, NULL, rstd, rows, cols));
}

static l2l_status cuda_layernorm_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                                      float *dweight, float *dbias,
                                                      const float *dy, const float *residual,
                                                      const float *y, const float *weight,
                                                      const float *bias, const float *rstd,
                                                      int64_t rows, int64_t cols) {
  WITH_SCRATCH(layernorm_backward_locked(dx, dx16, dx16_dtype, dweight, dbias, dy, residual, y,
                                         weight, NULL, bias, rstd, rows, cols));
}

static l2l_status cuda_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                                       int causal, float scale, int64_t samples,
                                       int64_t rows_per_sample, int64_t tq, int64_t tk) {
  LAUNCH(k_softmax_forward(y, x, key_mask, causal, scale, samples, rows_per_sample, tq, tk,
                           cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                        int64_t rows, int64_t cols) {
  LAUNCH(k_softmax_backward(dx, dy, y, scale, rows, cols, cuda_rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- embedding, loss */

static l2l_status cuda_embedding_forward(float *out, const int32_t *ids, const void *table,
                                         l2l_dtype table_dtype, int64_t n, int64_t cols) {
  LAUNCH(k_embedding_forward(out, ids, table, (int)table_dtype, n, cols, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                          int64_t n, int64_t vocab, int64_t cols) {
  LAUNCH(k_embedding_backward(dtable, dout, ids, n, vocab, cols, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_cross_entropy_forward(float *losses, const float *logits,
                                             const int32_t *targets, int32_t ignore_index,
                                             int64_t rows, int64_t vocab, int64_t ld) {
  LAUNCH(k_cross_entropy_forward(losses, logits, targets, ignore_index, rows, vocab, ld,
                                 cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_cross_entropy_backward(float *dlogits, const float *logits,
                                              const int32_t *targets, int32_t ignore_index,
                                              float scale, int64_t rows, int64_t vocab,
                                              int64_t ld) {
  LAUNCH(k_cross_entropy_backward(dlogits, logits, targets, ignore_index, scale, rows, vocab, ld,
                                  cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_cross_entropy_fused(float *losses, float *dlogits, void *dlogits16,
                                           l2l_dtype dlogits16_dtype, const float *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float scale, int64_t rows, int64_t vocab, int64_t ld) {
  LAUNCH(k_cross_entropy_fused(losses, dlogits, dlogits16, (int)dlogits16_dtype, logits, targets,
                               ignore_index, scale, rows, vocab, ld, cuda_rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- results for the host */

static l2l_status reduce_locked(double *out, enum backend_reduction kind, const float *x,
                                int64_t n) {
  LAUNCH(k_reduce((double *)cuda_rt.scratch, (int)kind, x, n, scratch_reduce(), cuda_rt.compute));
  return read_result(out, sizeof *out);
}

static l2l_status cuda_reduce(double *out, enum backend_reduction kind, const float *x, int64_t n) {
  WITH_SCRATCH(reduce_locked(out, kind, x, n));
}

static l2l_status find_out_of_range_locked(int64_t *index, int32_t *value,
                                           const int32_t *values, int64_t n, int32_t lo,
                                           int32_t hi, int32_t except) {
  LAUNCH(k_find_out_of_range((int64_t *)cuda_rt.scratch, values, n, lo, hi, except, cuda_rt.compute));
  TRY(read_result(index, sizeof *index));
  if (*index >= 0) {
    CUDA_TRY(cudaMemcpyAsync(value, values + *index, sizeof *value, cudaMemcpyDeviceToHost,
                             cuda_rt.compute));
    TRY(cuda_wait_stream());
  }
  return L2L_OK;
}

static l2l_status cuda_find_out_of_range(int64_t *index, int32_t *value, const int32_t *values,
                                         int64_t n, int32_t lo, int32_t hi, int32_t except) {
  WITH_SCRATCH(find_out_of_range_locked(index, value, values, n, lo, hi, except));
}

static l2l_status layernorm_invertible_locked(bool *invertible, const float *weight,
                                              const float *bias, int64_t n) {
  int64_t first = -1;
  LAUNCH(k_layernorm_uninvertible((int64_t *)cuda_rt.scratch, weight, bias, n,
                                  L2L_LN_MIN_WEIGHT, L2L_LN_BIAS_RATIO, cuda_rt.compute));
  TRY(read_result(&first, sizeof first));
  *invertible = first < 0;
  return L2L_OK;
}

static l2l_status cuda_layernorm_invertible(bool *invertible, const float *weight,
                                            const float *bias, int64_t n) {
  WITH_SCRATCH(layernorm_invertible_locked(invertible, weight, bias, n));
}

/* ---------------------------------------------------------------- whole tensors */

/* The element's bit pattern made on the host, as cpu_fill converts the value. */
static l2l_status cuda_fill(void *dst, l2l_dtype dtype, double value, int64_t n) {
  uint32_t pattern = 0;
  switch (dtype) {
    case L2L_F32: {
      float f = (float)value;
      memcpy(&pattern, &f, sizeof f);
      break;
    }
    case L2L_F16: pattern = half_from_f32_f16((float)value); break;
    case L2L_BF16: pattern = half_from_f32_bf16((float)value); break;
    case L2L_I32: pattern = (uint32_t)(int32_t)value; break;
    case L2L_U8: pattern = (uint8_t)(int)value; break;
  }
  LAUNCH(k_fill(dst, (int)dtype, pattern, n, cuda_rt.compute));
  return L2L_OK;
}

/* A float-to-i32 conversion is refused, before anything is written, at the first value
   that is not an integer in range: the check runs and is read back first. */
static l2l_status convert_locked(void *dst, l2l_dtype dst_dtype, const void *src,
                                 l2l_dtype src_dtype, int64_t n, int64_t *bad) {
  *bad = -1;
  if (dst_dtype == L2L_I32 && src_dtype != L2L_I32) {
    LAUNCH(k_find_non_i32((int64_t *)cuda_rt.scratch, src, (int)src_dtype, n, cuda_rt.compute));
    TRY(read_result(bad, sizeof *bad));
    if (*bad >= 0) return L2L_OK;
  }
  LAUNCH(k_convert(dst, (int)dst_dtype, src, (int)src_dtype, n, cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_convert(void *dst, l2l_dtype dst_dtype, const void *src,
                               l2l_dtype src_dtype, int64_t n, int64_t *bad) {
  WITH_SCRATCH(convert_locked(dst, dst_dtype, src, src_dtype, n, bad));
}

/* (a launch for every L2L_K_CONVERT_MANY segments) */
static l2l_status cuda_convert_many(void *const *dst, l2l_dtype dst_dtype, const void *const *src,
                                    l2l_dtype src_dtype, const int64_t *n, int count) {
  for (int at = 0; at < count; at += L2L_K_CONVERT_MANY) {
    int k = count - at < L2L_K_CONVERT_MANY ? count - at : L2L_K_CONVERT_MANY;
    LAUNCH(k_convert_many(dst + at, (int)dst_dtype, src + at, (int)src_dtype, n + at, k,
                          cuda_rt.compute));
  }
  return L2L_OK;
}

static l2l_status cuda_random(void *dst, l2l_dtype dtype, int64_t n, enum backend_distribution dist,
                              uint64_t seed, uint64_t stream, int64_t first, double a, double b) {
  LAUNCH(k_random(dst, (int)dtype, n, dist == L2L_NORMAL ? 1 : 0, seed, stream, first, a, b,
                  cuda_rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- the table */

static const struct backend_ops cuda_backend = {
    .name = "cuda",
    .gemm_batched = cuda_gemm_batched,
    .gemm_bias = cuda_gemm_bias,
    .bias_add = cuda_bias_add,
    .bias_backward = cuda_bias_backward,
    .add = cuda_add,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .softmax_forward = cuda_softmax_forward,
    .softmax_backward = cuda_softmax_backward,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .cross_entropy_forward = cuda_cross_entropy_forward,
    .cross_entropy_backward = cuda_cross_entropy_backward,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .gelu_forward_bits = cuda_gelu_forward_bits,
    .gelu_backward_from_output = cuda_gelu_backward_from_output,
    .bias_gelu_forward = cuda_bias_gelu_forward,
    .add_layernorm_forward = cuda_add_layernorm_forward,
    .cross_entropy_fused = cuda_cross_entropy_fused,
    .layernorm_backward_from_output = cuda_layernorm_backward_from_output,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_workspace = cuda_attention_workspace,
    .reduce = cuda_reduce,
    .adamw = cuda_adamw,
    .optim_update = cuda_optim_update,
    .grad_add = cuda_grad_add,
    .clip_scale = cuda_clip_scale,
    .grad_norm = cuda_grad_norm,
    .find_out_of_range = cuda_find_out_of_range,
    .layernorm_invertible = cuda_layernorm_invertible,
    .fill = cuda_fill,
    .convert = cuda_convert,
    .convert_many = cuda_convert_many,
    .random = cuda_random,
    .copy = cuda_copy,
    .copy_queued = cuda_copy_queued,
    .launches = cuda_launches,
};

const struct backend_ops *cuda_ops(void) { return &cuda_backend; }

#endif /* L2L_CUDA */
