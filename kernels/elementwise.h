/* SPDX-License-Identifier: MIT */
/* elementwise.h — launchers for the CUDA backend's element-wise ops, fills, casts and
 * random fills (kernels/elementwise.cu).
 *
 * Purpose: plain-C entry points that src/backend/cuda/cuda_ops.c calls with device
 * pointers; each computes what the CPU function of the same name in src/backend/cpu/
 * computes, with the same argument meanings and aliasing rules (noted per launcher). Every
 * launcher queues its work on `stream` (a cudaStream_t; NULL = the default stream) and
 * returns the launch's cudaError_t as an int (0 = queued), or cudaErrorInvalidValue for
 * arguments it cannot serve. n == 0 queues nothing and returns 0, except where a launcher
 * writes a result that must be defined for n == 0 (k_find_non_i32).
 * Must never: synchronize, allocate, print or exit; expose CUDA types.
 *
 * dtype codes are l2l_dtype's values: 0 f32, 1 f16, 2 bf16, 3 i32, 4 u8.
 * `rng_stream` is the Philox stream (l2l's generator), not a CUDA stream.
 */
#ifndef L2L_KERNELS_ELEMENTWISE_H
#define L2L_KERNELS_ELEMENTWISE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = a + b. out may be a or b. */
int k_add(float *out, const float *a, const float *b, int64_t n, void *stream);

/* y (rows, cols) += bias (cols), per column; or, with y16 given (DT_BF16 or DT_F16),
   y16 (rows, cols) := y + bias rounded as k_convert rounds, y only read. */
int k_bias_add(float *y, void *y16, int y16_dtype, const float *bias, int64_t rows,
               int64_t cols, void *stream);

/* y = gelu(x) (tanh form). y may be x. */
int k_gelu_forward(float *y, const float *x, int64_t n, void *stream);

/* dx = dy * gelu'(x). dx may be dy. dx16 (n of dx16_dtype, DT_BF16 or DT_F16; NULL: none)
   gets dx rounded to nearest even as k_convert rounds; dx may be NULL where dx16 is not. */
int k_gelu_backward(float *dx, void *dx16, int dx16_dtype, const float *dy, const float *x,
                    int64_t n, void *stream);

/* y = gelu(x) and bit i%8 of bits[i/8] := (x[i] >= L2L_GELU_XMIN); the last byte's unused
   high bits are 0. bits has (n+7)/8 bytes. y may be x. */
int k_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n, void *stream);

/* GELU's slope from its output: the CPU backend's tables (src/backend/gelu_table.c says
   what they hold; struct gelu_slopes there), the slopes in device memory. */
#define K_GELU_TABLE 4096
struct k_gelu_slopes {
  const float *slope;   /* (3, K_GELU_TABLE), device memory */
  float scale[3], origin[3], y_left;
};

/* dx = dy * gelu'(x), with gelu'(x) read off the slope tables at y = gelu(x) on the branch
   its side bit names, as the CPU backend reads them. dx may be dy. dx16 as
   k_gelu_backward's. */
int k_gelu_backward_from_output(float *dx, void *dx16, int dx16_dtype, const float *dy,
                                const float *y, const uint8_t *bits, int64_t n,
                                const struct k_gelu_slopes *slopes, void *stream);

/* Fused bias + GELU for the layers (the ops table's bias_gelu_forward; defined as the sequence
   k_bias_add(pre, bias, rows, cols) then k_gelu_forward_bits(y, bits, pre,
   rows*cols), or k_gelu_forward(y, pre, rows*cols) when bits is NULL, with identical
   results, in one pass over memory):
     pre (rows, cols) += bias per column (written back: the standard mode keeps it),
     y = gelu(pre),
     bits (may be NULL; (rows*cols+7)/8 bytes) = side bits of pre, indexed by the flat
       element index r*cols + c exactly as k_gelu_forward_bits.
   y may be pre (then pre ends up holding gelu(pre + bias)); otherwise they must not
   overlap. bias NULL: no bias (pre only read). y16 (rows x cols of y16_dtype, DT_BF16 or
   DT_F16), when not NULL, gets y rounded to nearest even as k_convert rounds; y or y16 may
   be NULL, not both. */
int k_bias_gelu_forward(float *pre, float *y, void *y16, int y16_dtype, uint8_t *bits,
                        const float *bias, int64_t rows, int64_t cols, void *stream);

/* Element i (draw first+i of (seed, rng_stream)) is kept iff (draw >> 8) < threshold,
   threshold = backend_keep_threshold(p) computed by the caller; y = kept ? x * (1/(1-p)) : 0
   (the scale computed in float exactly as the CPU does). mask (may be NULL: regenerating
   a backward's mask) gets the kept bits, (n+7)/8 bytes, unused high bits 0. y may be x. */
int k_dropout_forward(float *y, uint8_t *mask, const float *x, float p, uint32_t threshold,
                      uint64_t seed, uint64_t rng_stream, int64_t first, int64_t n,
                      void *stream);

/* dx = mask bit ? dy * (1/(1-p)) : 0. dx may be dy. */
int k_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p, int64_t n,
                       void *stream);

/* One AdamW step, cpu_adamw's formula and operation order:
     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g g;
     param = param - (lr/bc1) m / (sqrt(v) (1/sqrt(bc2)) + eps) - lr wd param. */
int k_adamw(float *param, float *m, float *v, const float *grad, int64_t n, float lr,
            float beta1, float beta2, float eps, float weight_decay, float bias_correction1,
            float bias_correction2, void *stream);

/* Writes the element bit pattern `pattern` into all n elements of dst (dtype 0..4). The
   caller converts the value on the host exactly as cpu_fill does:
     f32:  the bits of (float)value
     f16:  half_from_f32_f16((float)value) in the low 16 bits
     bf16: half_from_f32_bf16((float)value) in the low 16 bits
     i32:  (uint32_t)(int32_t)value
     u8:   (uint8_t)(int)value in the low 8 bits
   Higher bits than the element size are ignored. */
int k_fill(void *dst, int dtype, uint32_t pattern, int64_t n, void *stream);

/* dst = src converted element by element through f32, bit-identical to cpu_convert
   (core.h's round-to-nearest-even, NaN kept quiet, subnormals kept; f32 -> i32 truncates
   and must only be called after k_find_non_i32 found nothing). dtypes f32, f16, bf16,
   i32; the same dtype on both sides (u8 too) is a copy (cudaMemcpyAsync, nothing when
   dst == src; otherwise dst and src must not overlap). dst may be src only for the same
   dtype. */
int k_convert(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n,
              void *stream);

/* Segments k_convert_many takes in one launch. */
#define L2L_K_CONVERT_MANY 64

/* dst[i] (n[i] elements) = src[i] converted as k_convert converts, for i < count (at most
   L2L_K_CONVERT_MANY), in one launch: f32 to f16 or bf16, or back; no segment may overlap
   another's. */
int k_convert_many(void *const *dst, int dst_dtype, const void *const *src, int src_dtype,
                   const int64_t *n, int count, void *stream);

/* *first_bad (device memory) := the first index whose value, read as f32 from src's
   dtype, is not an integer in [-2^31, 2^31) (NaN and inf included), or -1 if none: the
   check cpu_convert makes before an f32/f16/bf16 -> i32 conversion. src_dtype i32 always
   gives -1 (the CPU checks nothing then). Written even for n == 0 (-1). */
int k_find_non_i32(int64_t *first_bad, const void *src, int src_dtype, int64_t n,
                   void *stream);

/* cpu_random into dst (dtype f32, f16, bf16 or i32), dist 0 = uniform, 1 = normal
   (enum backend_distribution):
     uniform: element i uses draw first+i, u = (draw >> 8) 2^-24, value = a + (b-a) u in
       double, rounded to dtype and stepped down below b if rounding reached it (for
       f32/f16/bf16, as store_uniform; i32 stores (int32_t)(float)value, no stepping);
     normal:  element i uses words 2(idx&1), 2(idx&1)+1 of Philox block idx>>1 (idx =
       first+i), u1 = (w0+1) 2^-32, u2 = w1 2^-32, value = a + b sqrt(-2 ln u1)
       cos(2 pi u2) in double, then (float)value stored as dtype. */
int k_random(void *dst, int dtype, int64_t n, int dist, uint64_t seed, uint64_t rng_stream,
             int64_t first, double a, double b, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_ELEMENTWISE_H */
