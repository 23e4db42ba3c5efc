/* eps_optim.h — the EPS's optimizer kernels and the checks of optimizer and schedule
 * configs (internal to libl2l).
 *
 * Purpose: one update of one chunk of one parameter record, in fp32, SIMD-vectorized and
 * single-threaded: the EPS splits a record into chunks and runs them on its worker
 * threads, so each kernel only ever sees [0, n) of its arrays. The maths is stated once,
 * in l2l.h ("optimizers").
 * Must never: allocate, take locks, or read anything beyond the n elements it is given.
 */
#ifndef L2L_EPS_OPTIM_H
#define L2L_EPS_OPTIM_H

#include "internal.h"

/* One update's hyper-parameters, resolved by the EPS for one record. */
struct l2l_optim_hyper {
  l2l_optimizer_kind kind;
  float lr;              /* after the schedule */
  float weight_decay;    /* 0 for a record that does not decay */
  float momentum;        /* SGD */
  int nesterov;          /* SGD */
  float beta1, beta2, eps;
  int64_t t;             /* updates of this record so far, this one included (>= 1) */
  float grad_scale;      /* the kernels use g = grad_scale * grad (accumulation mean,
                            clipping), without writing grad */
};

/* Config checks: L2L_ERR_INVALID naming the field and its value, or L2L_OK. */
l2l_status l2l_optimizer_check(const l2l_optimizer_config *config);
l2l_status l2l_schedule_check(const l2l_schedule_config *schedule);
/* State arrays per record: SGD 1 when momentum > 0 else 0; AdamW and LAMB 2. */
int l2l_optim_state_count(const l2l_optimizer_config *config);

/* SGD on n elements; buf is NULL when momentum = 0 (state arrays start at zero). */
void l2l_optim_sgd(float *p, float *buf, const float *grad, int64_t n,
                   const struct l2l_optim_hyper *h);
/* AdamW on n elements (same maths as l2l_adamw_update). */
void l2l_optim_adamw(float *p, float *m, float *v, const float *grad, int64_t n,
                     const struct l2l_optim_hyper *h);
/* LAMB in two passes, because its trust ratio needs whole-record norms: moments updates
   m and v of n elements and adds sum p^2 and sum r^2 of them into norms[0] and norms[1];
   apply (after every chunk's moments) does p -= lr * trust * r, r recomputed from m, v, p. */
void l2l_optim_lamb_moments(float *m, float *v, const float *p, const float *grad, int64_t n,
                            const struct l2l_optim_hyper *h, double norms[2]);
void l2l_optim_lamb_apply(float *p, const float *m, const float *v, int64_t n,
                          const struct l2l_optim_hyper *h, float trust);
/* The trust ratio from the summed norms: |p| / |r|, 1 when either is 0. */
float l2l_optim_lamb_trust(const double norms[2]);

/* sum x^2 in double (gradient norms for clipping). */
double l2l_optim_sumsq(const float *x, int64_t n);
/* dst += scale * src (absorbing a gradient into the accumulator). */
void l2l_optim_axpy(float *dst, const float *src, float scale, int64_t n);
/* The same, and src := 0 in the same pass (a gradient slot emptied for its next use). */
void l2l_optim_axpy_drain(float *dst, float *src, float scale, int64_t n);
/* sum x^2 and dst += scale * x for x a 16-bit gradient (dtype bf16 or f16), widened
   exactly to f32 first. */
double l2l_optim_sumsq_half(const uint16_t *x, l2l_dtype dtype, int64_t n);
void l2l_optim_axpy_half(float *dst, const uint16_t *src, l2l_dtype dtype, float scale,
                         int64_t n);

#endif /* L2L_EPS_OPTIM_H */
