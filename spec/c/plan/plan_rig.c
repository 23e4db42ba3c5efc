/* SPDX-License-Identifier: MIT */
/* plan_rig.c — the planner's tests' shared draws (plan_rig.h says what each is).
 *
 * Purpose: as plan_rig.h.
 * Must never: take an expected value from the planner.
 */
#include <string.h>

#include "plan_rig.h"

struct shape random_shape(void) {
  struct shape g = {.D = 8 * check_rand_int(1, 4), .H = 2, .F = check_rand_int(8, 48),
                    .V = check_rand_int(5, 300), .S = check_rand_int(6, 13),
                    .blocks = (int)check_rand_int(1, 4), .post_ln = (int)check_rand_int(0, 1),
                    .causal = (int)check_rand_int(0, 1), .type_vocab = check_rand_int(0, 1) ? 2 : 0,
                    .head = check_rand_int(0, 3) == 0 ? L2L_LAYER_CLASSIFIER : L2L_LAYER_LM_HEAD,
                    .classes = check_rand_int(2, 5), .tie = (int)check_rand_int(0, 1),
                    .dropout = check_rand_int(0, 1) ? 0.1f : 0.0f, .attn_dropout = 0,
                    .frugal_block = (int)check_rand_int(-1, 3)};
  return g;
}

l2l_relay_config random_config(int64_t B) {
  l2l_relay_config c;
  memset(&c, 0, sizeof c);
  l2l_relay_config_default(&c);
  c.micro_batch = check_rand_int(1, B + 1);
  /* (a fifth past the layers' count: the time model looks through at most L + 1) */
  c.param_slots = (int)(check_rand_int(0, 4) ? check_rand_int(2, 4) : check_rand_int(5, 12));
  c.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-3f, .beta1 = 0.9f,
                                       .beta2 = 0.99f, .eps = 1e-8f};
  c.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_CONSTANT};
  c.accumulate = 1;
  c.optimizer_threads = 1;
  c.seed = check_rand_u64();
  int precision = (int)check_rand_int(0, 2);
  c.precision = precision == 0 ? L2L_F32 : precision == 1 ? L2L_BF16 : L2L_F16;
  if (c.precision != L2L_F32 && check_rand_int(0, 1)) c.grad_precision = L2L_BF16;
  if (c.precision == L2L_BF16 && check_rand_int(0, 1)) c.master = L2L_BF16;   /* (2 bytes there) */
  int placement = (int)check_rand_int(0, 5);   /* no slot, no copy of a record there */
  if (placement < 2) c.placement = placement == 0 ? L2L_PLACE_DEVICE : L2L_PLACE_AUTO;
  return c;
}

/* The five policies a middle layer may take (search.c's modes), the head's two. */
const l2l_inner_policy mode_inner[5] = {L2L_INNER_KEEP, L2L_INNER_SWAP, L2L_INNER_RECOMPUTE,
                                               L2L_INNER_RECOMPUTE, L2L_INNER_RECOMPUTE};
const l2l_stash_policy mode_stash[5] = {L2L_STASH_DEVICE, L2L_STASH_DEVICE, L2L_STASH_DEVICE,
                                               L2L_STASH_HOST, L2L_STASH_RECOMPUTE};
