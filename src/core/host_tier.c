/* SPDX-License-Identifier: MIT */
/* host_tier.c — the host budget's arithmetic, once: what the EPS applies to its records
 * before each step (src/eps/state_tier.c) and what the planner predicts from the layers
 * (src/plan): a record's bytes in host memory, the smallest budget that works, the
 * window of state read ahead and updating, and which records keep their optimizer state
 * in memory.
 * Purpose: one truth for the rules both sides must agree on to the byte (plan_spec
 * compares the planner's host and disk bytes with the relay's).
 * Must never: allocate, or depend on anything but its arguments.
 */
#include "core.h"

void l2l_host_record_bytes(struct l2l_host_record *out, int64_t numel, int64_t shard_n,
                           int arrays, l2l_dtype staging, bool dist) {
  uint64_t whole = l2l_pool_accounted((uint64_t)numel * sizeof(float)),
           shard = l2l_pool_accounted((uint64_t)shard_n * sizeof(float));
  /* master and accumulator whole; with ranks the reduced gradient of this rank's shard;
     a 16-bit staging copy whole */
  out->fixed = 2 * whole + (dist ? shard : 0) +
               (staging != L2L_F32 ? l2l_pool_accounted((uint64_t)numel * l2l_dtype_size(staging)) : 0);
  out->state = (uint64_t)arrays * shard;
  out->moved = (uint64_t)arrays * (uint64_t)shard_n * sizeof(float);
}

void l2l_host_tier_plan(struct l2l_host_tier *out, uint64_t fixed, uint64_t state, uint64_t largest,
                        uint64_t budget, bool spill) {
  uint64_t keep = 0, window = L2L_TIER_WINDOW_MOST;
  if (budget > 0 && spill) {
    /* a quarter of what the state may use is the window, for reads ahead and as much
       again for updates under way (at least the largest record, at most
       L2L_TIER_WINDOW_MOST); the rest keeps state in memory */
    uint64_t room = budget > fixed ? budget - fixed : 0;
    window = room / 4 < largest ? largest : room / 4 > L2L_TIER_WINDOW_MOST ? L2L_TIER_WINDOW_MOST : room / 4;
    keep = room > 2 * window ? room - 2 * window : 0;
  }
  *out = (struct l2l_host_tier){
      .need = fixed + (spill ? 2 * (largest < window ? largest : window) : state),
      .keep = keep, .window = window};
}

bool l2l_host_tier_keeps(const struct l2l_host_tier *tier, uint64_t *kept, uint64_t bytes) {
  if (*kept + bytes > tier->keep) return false;
  *kept += bytes;
  return true;
}
