/* SPDX-License-Identifier: MIT */
/* cpu_ops.c — the CPU ops table (its reductions, AdamW, and whole-tensor entries here; the
 * ops the layers run in layer_ops.c, attention in attention.c): OpenBLAS for GEMMs,
 * OpenMP loops for the rest.
 *
 * Purpose: the reference semantics of every op (the CUDA backend must match it) at close
 * to the machine's speed: GEMMs go to cblas_sgemm; every other loop is written so that
 * GCC vectorizes it (no calls into libm in hot loops: exp and log come from vmath.h, sqrt
 * vectorizes under -fno-math-errno) and is split across the compute threads with a static
 * schedule, so results are the same from run to run for a given thread count.
 * l2l links OpenBLAS's OpenMP build, so BLAS and these loops share one thread pool (and
 * BLAS inside a parallel region, as attention does, runs single-threaded).
 * Must never: allocate from a pool (a record's update takes its sums from malloc), or read
 * an output before writing it unless the op accumulates.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* ---------------------------------------------------------------- reductions, AdamW */

static l2l_status cpu_reduce(double *out, enum backend_reduction kind, const float *x, int64_t n) {
  int nt = threads_for(n);
  double acc = 0.0;
  if (kind == L2L_REDUCE_MAX_ABS) {
    float mx = 0.0f;
    int nan_seen = 0; /* max ignores NaN; a NaN must not hide */
#pragma omp parallel for simd schedule(static) num_threads(nt) reduction(max : mx) \
    reduction(| : nan_seen)
    for (int64_t i = 0; i < n; i++) {
      float a = fabsf(x[i]);
      mx = a > mx ? a : mx;
      nan_seen |= a != a;
    }
    *out = nan_seen ? NAN : (double)mx;
    return L2L_OK;
  }
  if (kind == L2L_REDUCE_SUM) {
#pragma omp parallel for simd schedule(static) num_threads(nt) reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += (double)x[i];
  } else {
#pragma omp parallel for simd schedule(static) num_threads(nt) reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
  }
  *out = acc;
  return L2L_OK;
}

static l2l_status cpu_adamw(float *param, float *m, float *v, const float *grad, int64_t n,
                            const l2l_adamw_config *c, float bias_correction1,
                            float bias_correction2) {
  /* backend.h's AdamW arithmetic, the EPS's own, split across the compute threads */
  const struct backend_adamw_consts k =
      backend_adamw_consts(c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, bias_correction1,
                           bias_correction2, 1.0);
  int nt = threads_for(n * 4);
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) {
    float mi = m[i], vi = v[i];
    param[i] = backend_adamw_element(param[i], grad[i], &mi, &vi, &k);
    m[i] = mi;
    v[i] = vi;
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- a record on the device

   The EPS's host kernels (optim_kernels.c) in the EPS's chunks and blocks: each chunk of
   L2L_OPTIM_CHUNK is one thread's, a block of L2L_STATE_BLOCK at a time, and sums over the
   record are each chunk's, added in the chunks' order, so a record placed on this
   backend's device gets the bits its update on the host gets. */

/* One block of one wave of an update (LAMB: wave 0 the moments and their sums, wave 1 the
   step with the trust ratio), on f32 state. */
static void update_f32(float *p, float *s0, float *s1, const float *g, int64_t n,
                       const struct optim_hyper *h, int wave, double sums[2], float trust) {
  switch (h->kind) {
    case L2L_OPTIMIZER_SGD: optim_sgd(p, s0, g, n, h); break;
    case L2L_OPTIMIZER_ADAMW: optim_adamw(p, s0, s1, g, n, h); break;
    case L2L_OPTIMIZER_LAMB:
      if (wave == 0) optim_lamb_moments(s0, s1, p, g, n, h, sums);
      else optim_lamb_apply(p, s0, s1, n, h, trust);
      break;
  }
}

/* A block's f32 step (optim_block's), its gradient and wave. */
struct block_wave {
  const float *g;
  const struct optim_hyper *h;
  int wave;
  double *sums;
  float trust;
};
static void block_step(float *p, float *s0, float *s1, int64_t i, int64_t k, void *ctx) {
  const struct block_wave *w = ctx;
  update_f32(p, s0, s1, w->g + i, k, w->h, w->wave, w->sums, w->trust);
}

static l2l_status cpu_optim_update(void *p, void *s0, void *s1, float *grad, int64_t n,
                                   const struct optim_hyper *h, const int32_t *skip) {
  int64_t chunks = optim_chunks(n);
  int waves = h->kind == L2L_OPTIMIZER_LAMB ? 2 : 1, nt = threads_for(n * 8);
  double (*sums)[2] = NULL;
  if (waves > 1 && (sums = calloc((size_t)chunks, sizeof *sums)) == NULL)
    return core_fail(L2L_ERR_NOMEM, "no memory for an update's sums (%lld chunks)", (long long)chunks);
  float trust = 1.0f;
  for (int wave = 0; !(skip != NULL && *skip != 0) && wave < waves; wave++) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < chunks; c++) {
      int64_t end = optim_chunk_end(n, c * L2L_OPTIM_CHUNK);
      for (int64_t at = c * L2L_OPTIM_CHUNK; at < end; at += L2L_STATE_BLOCK) {
        int64_t k = end - at < L2L_STATE_BLOCK ? end - at : L2L_STATE_BLOCK;
        struct block_wave w = {grad, h, wave, sums ? sums[c] : NULL, trust};
        optim_block(p, s0, s1, n, at, k, h, wave == 0, wave == waves - 1, block_step, &w);
      }
    }
    if (wave == 0 && waves > 1) {
      double whole[2] = {0, 0};
      for (int64_t c = 0; c < chunks; c++) whole[0] += sums[c][0], whole[1] += sums[c][1];
      trust = optim_lamb_trust(whole);
    }
  }
  free(sums);
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) grad[i] = 0.0f;
  return L2L_OK;
}

static l2l_status cpu_grad_add(float *acc, const void *g, l2l_dtype dtype, float scale,
                               const float *scale_at, int64_t n, int32_t *flag) {
  if (scale_at != NULL) scale = *scale_at;
  int64_t chunks = optim_chunks(n);
  int nonfinite = 0, nt = threads_for(n * 3);
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : nonfinite)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t at = c * L2L_OPTIM_CHUNK, k = optim_chunk_end(n, at) - at;
    bool finite = dtype == L2L_F32
                      ? optim_axpy(acc + at, (const float *)g + at, scale, k)
                      : optim_axpy_half(acc + at, (const uint16_t *)g + at, dtype, scale, k);
    nonfinite |= !finite;
  }
  if (nonfinite && flag != NULL) *flag = 1;
  return L2L_OK;
}

/* (the host's eps_clip_scale: each gradient's sum in turn, on one thread) */
static l2l_status cpu_clip_scale(float *scale, const void *const *g, const l2l_dtype *dtype,
                                 const int64_t *n, int count, float clip) {
  double sumsq = 0;
  for (int i = 0; i < count; i++) sumsq += optim_sumsq_of(g[i], dtype[i], n[i]);
  *scale = optim_clip_factor(sumsq, clip);
  return L2L_OK;
}

static l2l_status cpu_grad_norm(double *out, const float *g, int64_t n) {
  int64_t chunks = optim_chunks(n);
  struct { double sumsq; float most; } *part = calloc((size_t)chunks, sizeof *part);
  if (part == NULL)
    return core_fail(L2L_ERR_NOMEM, "no memory for a norm's sums (%lld chunks)", (long long)chunks);
  int nt = threads_for(n);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t c = 0; c < chunks; c++)
    optim_norm_blocks(&part[c].sumsq, &part[c].most, g + c * L2L_OPTIM_CHUNK,
                      optim_chunk_end(n, c * L2L_OPTIM_CHUNK) - c * L2L_OPTIM_CHUNK);
  double sumsq = 0;
  float most = 0;
  for (int64_t c = 0; c < chunks; c++) {
    sumsq += part[c].sumsq;
    most = part[c].most > most ? part[c].most : most;
  }
  out[0] = sumsq, out[1] = most;
  free(part);
  return L2L_OK;
}

static l2l_status cpu_find_out_of_range(int64_t *index, int32_t *value, const int32_t *values,
                                        int64_t n, int32_t lo, int32_t hi, int32_t except) {
  *index = -1;
  for (int64_t i = 0; i < n; i++) {
    int32_t v = values[i];
    if ((v < lo || v >= hi) && v != except) {
      *index = i;
      *value = v;
      break;
    }
  }
  return L2L_OK;
}

static l2l_status cpu_layernorm_invertible(bool *invertible, const float *weight,
                                           const float *bias, int64_t n) {
  *invertible = true;
  for (int64_t j = 0; j < n && *invertible; j++) {
    float w = fabsf(weight[j]);
    *invertible = w >= L2L_LN_MIN_WEIGHT && w * L2L_LN_BIAS_RATIO >= fabsf(bias[j]);
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- whole-tensor helpers */

static l2l_status cpu_fill(void *dst, l2l_dtype dtype, double value, int64_t n) {
  int nt = threads_for(n);
  switch (dtype) {
    case L2L_F32: {
      float *d = dst, f = (float)value;
#pragma omp parallel for simd schedule(static) num_threads(nt)
      for (int64_t i = 0; i < n; i++) d[i] = f;
      break;
    }
    case L2L_F16:
    case L2L_BF16: {
      uint16_t *d = dst;
      uint16_t h = dtype == L2L_F16 ? half_from_f32_f16((float)value)
                                    : half_from_f32_bf16((float)value);
#pragma omp parallel for simd schedule(static) num_threads(nt)
      for (int64_t i = 0; i < n; i++) d[i] = h;
      break;
    }
    case L2L_I32: {
      int32_t *d = dst, iv = (int32_t)value;
#pragma omp parallel for simd schedule(static) num_threads(nt)
      for (int64_t i = 0; i < n; i++) d[i] = iv;
      break;
    }
    case L2L_U8: memset(dst, (int)value, (size_t)n); break;
  }
  return L2L_OK;
}

static inline float load_as_f32(const void *src, l2l_dtype dtype, int64_t i) {
  switch (dtype) {
    case L2L_F32: return ((const float *)src)[i];
    case L2L_F16: return half_f16_to_f32(((const uint16_t *)src)[i]);
    case L2L_BF16: return half_bf16_to_f32(((const uint16_t *)src)[i]);
    case L2L_I32: return (float)((const int32_t *)src)[i];
    default: return 0.0f;
  }
}

static inline void store_f32(void *dst, l2l_dtype dtype, int64_t i, float value) {
  switch (dtype) {
    case L2L_F32: ((float *)dst)[i] = value; break;
    case L2L_F16: ((uint16_t *)dst)[i] = half_from_f32_f16(value); break;
    case L2L_BF16: ((uint16_t *)dst)[i] = half_from_f32_bf16(value); break;
    case L2L_I32: ((int32_t *)dst)[i] = (int32_t)value; break; /* checked integral first */
    default: break;
  }
}

static l2l_status cpu_convert(void *dst, l2l_dtype dst_dtype, const void *src,
                              l2l_dtype src_dtype, int64_t n, int64_t *bad);

/* (each segment by cpu_convert: the same bits as a cast of each) */
static l2l_status cpu_convert_many(void *const *dst, l2l_dtype dst_dtype, const void *const *src,
                                   l2l_dtype src_dtype, const int64_t *n, int count) {
  int64_t bad = -1;
  for (int i = 0; i < count; i++) TRY(cpu_convert(dst[i], dst_dtype, src[i], src_dtype, n[i], &bad));
  return L2L_OK;
}

static l2l_status cpu_convert(void *dst, l2l_dtype dst_dtype, const void *src,
                              l2l_dtype src_dtype, int64_t n, int64_t *bad) {
  *bad = -1;
  if (dst_dtype == L2L_I32 && src_dtype != L2L_I32) {
    for (int64_t i = 0; i < n; i++) { /* refuse before writing anything */
      float value = load_as_f32(src, src_dtype, i);
      if (!(value == floorf(value) && value >= -2147483648.0f && value < 2147483648.0f)) {
        *bad = i;
        return L2L_OK;
      }
    }
  }
  if (dst_dtype == src_dtype) {
    if (dst != src) memmove(dst, src, (size_t)n * l2l_dtype_size(dst_dtype));
    return L2L_OK;
  }
  int nt = threads_for(n * 4);
  if (src_dtype == L2L_F32 && (dst_dtype == L2L_F16 || dst_dtype == L2L_BF16)) {
    /* the rounding the ops' 16-bit outputs use (cpu_round_16), in chunks on every thread */
    enum { CONVERT_CHUNK = 1 << 14 };
    const int64_t chunks = (n + CONVERT_CHUNK - 1) / CONVERT_CHUNK;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < chunks; c++) {
      int64_t first = c * CONVERT_CHUNK;
      int64_t count = n - first < CONVERT_CHUNK ? n - first : CONVERT_CHUNK;
      cpu_round_16((uint16_t *)dst + first, dst_dtype, (const float *)src + first, count);
    }
    return L2L_OK;
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) store_f32(dst, dst_dtype, i, load_as_f32(src, src_dtype, i));
  return L2L_OK;
}

/* Stores a uniform draw rounded to dtype, stepping down to the largest representable value
   below hi if rounding reached it: draws are in [lo, hi) whatever the dtype's spacing. */
static void store_uniform(void *dst, l2l_dtype dtype, int64_t i, double value, double lo,
                          double hi) {
  store_f32(dst, dtype, i, (float)value);
  if (hi <= lo) return;
  for (int guard = 0; guard < 4 && (double)load_as_f32(dst, dtype, i) >= hi; guard++) {
    if (dtype == L2L_F32) {
      float *d = dst;
      d[i] = nextafterf(d[i], -INFINITY);
    } else { /* f16 / bf16: one step toward -inf in the bit pattern */
      uint16_t *d = dst;
      d[i] = d[i] == 0 ? 0x8001u : (d[i] & 0x8000u) ? (uint16_t)(d[i] + 1) : (uint16_t)(d[i] - 1);
    }
  }
}

/* Uniform: element i is the 24-bit draw first+i (rng.c layout) scaled into [lo, hi).
   Normal: element i uses draws 2i and 2i + 1 (words 2(i%2), 2(i%2)+1 of block i/2) for
   Box-Muller (u1 in (0, 1], u2 in [0, 1)), so each element is its own pair of draws. */
static l2l_status cpu_random(void *dst, l2l_dtype dtype, int64_t n, enum backend_distribution dist,
                             uint64_t seed, uint64_t stream, int64_t first, double a, double b) {
  enum { CHUNK = 2048 };
  const int per = dist == L2L_UNIFORM ? 1 : 2;
  int64_t chunks = (n + CHUNK - 1) / CHUNK;
  int nt = threads_for(n * 32);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t start = c * CHUNK, count = n - start < CHUNK ? n - start : CHUNK;
    uint32_t draws[2 * CHUNK];
    philox_range(draws, seed, stream, (uint64_t)per * ((uint64_t)first + (uint64_t)start),
                 per * count);
    for (int64_t i = 0; i < count; i++) {
      if (dist == L2L_UNIFORM) {
        double u = (double)(draws[i] >> 8) * 0x1p-24;
        store_uniform(dst, dtype, start + i, a + (b - a) * u, a, b);
      } else {
        double u1 = ((double)draws[2 * i] + 1.0) * 0x1p-32;
        double u2 = (double)draws[2 * i + 1] * 0x1p-32;
        store_f32(dst, dtype, start + i,
                  (float)(a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
      }
    }
  }
  return L2L_OK;
}

static l2l_status cpu_copy(void *dst, l2l_pool_kind dst_pool, const void *src,
                           l2l_pool_kind src_pool, uint64_t bytes) {
  (void)dst_pool, (void)src_pool;
  memcpy(dst, src, bytes);
  return L2L_OK;
}

/* The GEMM, then the bias add (or the cast): the CPU has no epilogue to fuse them in. */
static l2l_status cpu_gemm_bias(float *c, void *c16, l2l_dtype c16_dtype, const void *a,
                                const void *b, l2l_dtype ab_dtype, const float *bias, int64_t m,
                                int64_t n, int64_t k, int trans_a, int trans_b) {
  return backend_gemm_bias_in_steps(&cpu_backend, c, c16, c16_dtype, a, b, ab_dtype, bias, m, n,
                                    k, trans_a, trans_b);
}

/* ---------------------------------------------------------------- the table */

const struct backend_ops cpu_backend = {
    .name = "cpu",
    .gemm_batched = cpu_gemm_batched,
    .gemm_bias = cpu_gemm_bias,
    .bias_add = cpu_bias_add,
    .bias_backward = cpu_bias_backward,
    .add = cpu_add,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .softmax_forward = cpu_softmax_forward,
    .softmax_backward = cpu_softmax_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .gelu_forward_bits = cpu_gelu_forward_bits,
    .gelu_backward_from_output = cpu_gelu_backward_from_output,
    .bias_gelu_forward = cpu_bias_gelu_forward,
    .add_layernorm_forward = cpu_add_layernorm_forward,
    .cross_entropy_fused = cpu_cross_entropy_fused,
    .layernorm_backward_from_output = cpu_layernorm_backward_from_output,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_workspace = cpu_attention_workspace,
    .reduce = cpu_reduce,
    .adamw = cpu_adamw,
    .optim_update = cpu_optim_update,
    .grad_add = cpu_grad_add,
    .clip_scale = cpu_clip_scale,
    .grad_norm = cpu_grad_norm,
    .find_out_of_range = cpu_find_out_of_range,
    .layernorm_invertible = cpu_layernorm_invertible,
    .fill = cpu_fill,
    .convert = cpu_convert,
    .convert_many = cpu_convert_many,
    .random = cpu_random,
    .copy = cpu_copy,
    .copy_queued = cpu_copy,   /* (done when it returns: nothing is queued here) */
};
