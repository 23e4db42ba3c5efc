/* SPDX-License-Identifier: MIT */
/* optim.h — launchers for the CUDA backend's updates of records placed on the device
 * (kernels/optim.cu): a gradient added into its accumulator, and one optimizer step.
 *
 * Purpose: plain-C entry points that src/backend/cuda/cuda_ops.c calls with device
 * pointers, computing what the CPU backend's optim_update and grad_add compute (the host
 * kernels of src/backend/optim_kernels.c), expression for expression; the constants of a
 * step are worked out on the host (k_optim), as the host kernels work them out once
 * before their loops. Every launcher queues its work on `stream` and returns the launch's
 * cudaError_t as an int (0 = queued); n == 0 queues nothing but the LAMB's trust ratio.
 * Must never: synchronize, allocate, print or exit; expose CUDA types; read the skip
 * flag on the host (the kernels read it: the host never waits for a record's finiteness).
 */
#ifndef L2L_KERNELS_OPTIM_H
#define L2L_KERNELS_OPTIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* acc (n) += s * g (n; dtype 0 f32, 1 f16, 2 bf16, widened exactly), s = *scale_at (device
   memory) or, scale_at NULL, scale; and *flag = 1 (flag NULL: none) where a sum is an inf,
   a NaN or 2^63 or more in magnitude (its product by 2^65 is not finite), else *flag is
   left as it was. */
int k_grad_add(float *acc, const void *g, int dtype, float scale, const float *scale_at,
               int64_t n, int32_t *flag, void *stream);

/* Gradients k_clip_scale takes at once, and the doubles of scratch it needs. */
#define L2L_K_CLIP_GRADIENTS 32
#define L2L_K_CLIP_SCRATCH_DOUBLES (L2L_K_CLIP_GRADIENTS * 256)

/* *scale (device memory) = per-layer clipping's factor for the count gradients g[i]
   (device memory, n[i] elements of dtype[i]; the arrays on the host): clip / |g| where
   the norm of them all is over clip, else 1, the squares summed in double in a fixed
   order. */
int k_clip_scale(float *scale, const void *const *g, const int *dtype, const int64_t *n,
                 int count, float clip, double *scratch, void *stream);

/* One step's constants (l2l_optimizer_kind's values for kind), as the host kernels make
   them: g = scale * grad first. SGD: p = p - decay p - lr (g, or b = mu_prev b + g, or
   with nesterov g + momentum b). AdamW: m = b1 m + c1 g, v = b2 v + c2 g^2, p = p - step m
   / (sqrt(v) rsb2 + eps) - decay p. LAMB: the same moments with step = 1 / bc1, r = step m
   / (sqrt(v) rsb2 + eps) + wd p, p = p - lr trust r, trust = |p| / |r| over the record
   (1 where either is 0). A bf16 master (master_bf16 1; k_optim_update_compact only) is
   widened, stepped in f32 and rounded back stochastically: element i by 16-bit Philox draw
   first_draw + i of (seed, stream) (src/core/core.h's philox_halves), as
   src/backend/state_codes.c's optim_block. */
struct k_optim {
  int kind;
  float scale, lr, decay;
  float momentum, mu_prev;
  int nesterov;
  float step, rsb2, b1, c1, b2, c2, eps, wd;
  int master_bf16;
  uint64_t seed, stream, first_draw;
};

/* Doubles of scratch k_optim_update needs (LAMB's partial sums and its trust ratio). */
#define L2L_K_OPTIM_SCRATCH_DOUBLES 2050

/* One update of an f32 master p (n) and its f32 state s0, s1 (NULL beyond the optimizer's count) from grad
   (n), which it leaves zero; where skip (device memory, may be NULL) holds a value other
   than 0, p and the state stay as they were. LAMB's sums: a fixed partition of the
   elements into at most 1024 blocks (it depends on n alone), each block's in double,
   summed in block order: deterministic. */
int k_optim_update(float *p, float *s0, float *s1, float *grad, int64_t n,
                   const struct k_optim *o, const int32_t *skip, double *scratch, void *stream);
/* The same on a master p in f32 or bf16 (o->master_bf16) and state s0, s1 in any
   precision (0: f32, 1: bf16, 2: 8 bits, laid out as include/l2l/relay.h's "optimizers"
   says: an 8-bit array's scales from byte scales_at; root[s]: array s keeps sqrt(v) in the
   unsigned code), the 8-bit codes' values given (256 each: src/backend/state_codes.c's, on
   the host): each block of 2048 decoded, stepped in f32 and encoded again (LAMB's second
   wave only reads the state; the wave that moves the master rounds it back); scratch as
   above. */
int k_optim_update_compact(void *p, void *s0, void *s1, int precision, int64_t scales_at,
                           const int root[2], float *grad, int64_t n,
                           const struct k_optim *o, const float *signed_value,
                           const float *root_value, const int32_t *skip, double *scratch,
                           void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_OPTIM_H */
