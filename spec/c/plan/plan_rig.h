/* SPDX-License-Identifier: MIT */
/* plan_rig.h — what the planner's tests (test_plan.c, test_plan_search.c) share: random
 * small models and relay settings, and the five policies a layer may take; plan_rig.c
 * defines them.
 *
 * Purpose: one statement of the random cases both files draw, so the peaks held to the
 * relay's and the search held to a brute force cover the same models.
 * Must never: take an expected value from the planner.
 */
#ifndef L2L_PLAN_RIG_H
#define L2L_PLAN_RIG_H

#include "check.h"
#include "plan/plan.h"
#include "reference.h"

/* A small random model's shape: embedding, 1 to 4 blocks of both memory modes and both
   LayerNorm placements, an LM head tied or not, or a classifier; dropout or none. */
struct shape random_shape(void);
/* A relay's settings for a batch of B: micro-batch, slots (2 to 4, a fifth of the time 5
   to 12: more than the layers), precisions, masters and placement drawn; AdamW, one optimizer thread. */
l2l_relay_config random_config(int64_t B);
/* The five policies a middle layer may take (search.c's modes, in its order), the head's
   two (the recompute ones with the boundary on the device or the host). */
extern const l2l_inner_policy mode_inner[5];
extern const l2l_stash_policy mode_stash[5];

#endif /* L2L_PLAN_RIG_H */
