/* plan.h — the planner's interface to the part above it (the relay): a model as the
 * planner sees it, a policy to judge, and the device peak a step under that policy reaches.
 *
 * Purpose: the KARMA-style planner (issue 22) chooses, per layer, keep / swap / recompute
 * and where each boundary waits, and the micro-batch, under a device budget. Its first
 * piece is here: the device peak of one training step, replayed from the layers' memory
 * statements (l2l_layer_memory_in) in the order the relay allocates and frees, so that on
 * the CPU backend it equals the pool's measured peak to the byte.
 * Must never: include the relay's headers or read its state: what it knows of the relay's
 * order is written down in peak.c, and specs hold the two together.
 */
#ifndef L2L_PLAN_H
#define L2L_PLAN_H

#include "layers/layers.h"

/* A layer of the chain: its memory statement is asked per micro-batch size. */
struct plan_layer {
  const l2l_layer *layer;
  enum l2l_layer_role role;
  bool frozen;
  l2l_inner_policy inner;
  l2l_stash_policy stash;    /* where the boundary entering this layer waits (k >= 1) */
};

/* One training step's shape: the active layers, the batch, and the relay's settings that
   set device memory. */
struct plan_chain {
  int L;
  struct plan_layer *layers;
  int64_t batch, seq, dim;
  int64_t micro_batch;
  int param_slots;
  l2l_dtype precision;       /* of the weights bound on the device */
  l2l_dtype grad_precision;  /* of the gradients leaving it */
  bool token_types, key_mask;  /* the batch has them */
};

/* The device peak (pool bytes) of one training step of `c` on top of what the pool
   already holds, or 0 when the chain cannot be replayed (the message says why). Swap
   moves run on the copy threads, so their timing sets where in between a peak with swap
   falls: this gives the bound that holds whatever the timing. */
l2l_status l2l_plan_peak(uint64_t *peak, const struct plan_chain *c);

#endif /* L2L_PLAN_H */
