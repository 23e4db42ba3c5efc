/* SPDX-License-Identifier: MIT */
/* sdpa_eval.h — a CPU evaluator of the cuDNN attention graphs l2l builds (sdpa_eval.c).
 *
 * Purpose: without a GPU, cuDNN checks each node's shapes but runs nothing, so the graphs'
 * meaning (which dims a reduction takes, which strides make a transpose, what the mask
 * keeps, how the backward's nodes combine) would go unchecked until a GPU is lent. This
 * evaluates a graph as accelerators.h's backend_sdpa_view describes it, node by node in
 * double with the 16-bit tensors rounded as cuDNN stores them, so test_cudnn.c can hold
 * its outputs to l2l's own CPU attention. It is written from cuDNN's documented node
 * meanings, not from l2l's attention code.
 * Must never: call into l2l beyond the view it is given.
 */
#ifndef L2L_SDPA_EVAL_H
#define L2L_SDPA_EVAL_H

#include "backend/accelerators.h"

struct sdpa_eval {
  const struct backend_sdpa_view *view;
  double *mem[64];        /* each tensor's memory, of sdpa_eval_span elements */
};

/* Memory for every tensor (zeros); sdpa_eval_free gives it back. */
void sdpa_eval_init(struct sdpa_eval *e, const struct backend_sdpa_view *view);
void sdpa_eval_free(struct sdpa_eval *e);
/* Elements of tensor t's memory: its largest offset + 1. */
int64_t sdpa_eval_span(const struct backend_sdpa_tensor *t);
/* The view's tensor of this uid, or -1. */
int sdpa_eval_find(const struct backend_sdpa_view *view, int64_t uid);
/* Sets tensor `uid` (a real one) element by element: value(ctx, i) for each logical index
   i[4], rounded to its type. */
void sdpa_eval_set(struct sdpa_eval *e, int64_t uid, double (*value)(void *ctx, const int64_t i[4]),
                   void *ctx);
/* Element i[4] of tensor `uid`. */
double sdpa_eval_get(const struct sdpa_eval *e, int64_t uid, const int64_t i[4]);
/* Runs every node in order. */
void sdpa_eval_run(struct sdpa_eval *e);
/* x rounded to a 16-bit type's precision (round to nearest even; f32, i32, bool: x). */
double sdpa_eval_round(enum backend_sdpa_type type, double x);

#endif /* L2L_SDPA_EVAL_H */
