/* SPDX-License-Identifier: MIT */
/* host_tier.c — the host budget's arithmetic, once: what the EPS applies to its records
 * before each step (src/eps/state_tier.c) and what the planner predicts from the layers
 * (src/plan): a record's bytes in host memory, whose gradient accumulator passes (in
 * memory from its gradient's arrival to its update alone), the smallest budget that works,
 * the windows of state read ahead and updating and of passing gradients, and which records
 * keep their optimizer state in memory.
 * Purpose: one truth for the rules both sides must agree on to the byte (plan_spec
 * compares the planner's host and disk bytes with the relay's).
 * Must never: allocate, or depend on anything but its arguments.
 */
#include "core.h"

uint64_t host_state_bytes(l2l_state_precision state, int64_t n) {
  uint64_t u = n > 0 ? (uint64_t)n : 0;
  switch (state) {
  case L2L_STATE_F32:
  case L2L_STATE_BF16: return u * (uint64_t)state_elem_bytes(state);
  case L2L_STATE_8BIT:
    return state8_codes_bytes(n) + (uint64_t)state8_blocks(n) * sizeof(float);
  }
  return 0;
}

void host_record_bytes(struct host_record *out, int64_t numel, int64_t shard_n,
                       int arrays, l2l_state_precision state, l2l_dtype master,
                       l2l_dtype staging, bool dist) {
  uint64_t whole = pool_accounted((uint64_t)numel * sizeof(float)),
           shard = pool_accounted((uint64_t)shard_n * sizeof(float)),
           array = host_state_bytes(state, shard_n);
  /* the master whole (f32, or a bf16 one the device reads); with ranks the reduced
     gradient of this rank's shard; a 16-bit staging copy whole */
  out->fixed = pool_accounted((uint64_t)numel * l2l_dtype_size(master)) + (dist ? shard : 0) +
               (staging != L2L_F32 ? pool_accounted((uint64_t)numel * l2l_dtype_size(staging)) : 0);
  out->grad = whole;
  out->state = (uint64_t)arrays * pool_accounted(array);
  out->moved = (uint64_t)arrays * array;
}

uint64_t device_record_bytes(int64_t numel, l2l_dtype master, int arrays,
                             l2l_state_precision state, l2l_dtype staging) {
  uint64_t f32 = pool_accounted((uint64_t)numel * sizeof(float));
  return f32 + pool_accounted((uint64_t)numel * l2l_dtype_size(master)) +
         (uint64_t)arrays * pool_accounted(host_state_bytes(state, numel)) +
         (staging != L2L_F32 ? pool_accounted((uint64_t)numel * l2l_dtype_size(staging)) : 0);
}

uint64_t device_record_host_bytes(int64_t numel, int64_t part_n) {
  return pool_accounted((uint64_t)numel * sizeof(float)) + pool_accounted((uint64_t)part_n * sizeof(float));
}

uint64_t device_words_bytes(int n) {
  if (n <= 0) return 0;
  return pool_accounted((uint64_t)n * sizeof(int32_t)) + pool_accounted((uint64_t)n * 2 * sizeof(double)) +
         pool_accounted(sizeof(float));   /* (the clip word) */
}

void host_shard(int64_t n, int ranks, int rank, int64_t align, int64_t *begin, int64_t *count) {
  int64_t s = (n + ranks - 1) / ranks;
  s = (s + align - 1) / align * align;
  int64_t b = (int64_t)rank * s < n ? (int64_t)rank * s : n;
  *begin = b;
  *count = (b + s < n ? b + s : n) - b;
}

bool host_grad_passes(bool spill, bool defer, bool due, int users, int arrivals) {
  /* one arrival, then the update (with ranks: the reduce-scatter) that clears it, which
     waits for no later gradient: a tied table's first arrival would hold the window through
     the whole backward, a deferred update until its end. With ranks a record's
     reduce-scatter waits for those of the records before it on every rank, and their
     places are the order the gradients arrive in (eps_exchange_order): an arrival waiting
     for room waits for exchanges of records that came before it, and on the rank furthest
     behind those are of records every rank has given, so no wait closes a cycle */
  return spill && !defer && due && users == 1 && arrivals == 1;
}

/* A state window: its smallest (`least`, one record) and an eighth of the spare room, at most
   L2L_TIER_WINDOW_MOST unless one record is more. */
static uint64_t window_of(uint64_t least, uint64_t spare) {
  uint64_t most = least > L2L_TIER_WINDOW_MOST ? least : L2L_TIER_WINDOW_MOST;
  return least + spare / 8 < most ? least + spare / 8 : most;
}

void host_tier_plan(struct host_tier *out, uint64_t fixed, uint64_t state, uint64_t largest,
                    uint64_t passing, uint64_t passing_total, uint64_t budget, bool spill) {
  *out = (struct host_tier){.window = L2L_TIER_WINDOW_MOST, .grad_window = UINT64_MAX};
  if (!spill) {   /* everything in memory: the budget is a check */
    out->need = fixed + passing_total + state;
    return;
  }
  /* the least that works: one record's state read ahead, one updating, one passing
     accumulator. The accumulators pass only when the budget cannot hold them all beside
     the state's windows: giving their pages back and faulting them in again costs the
     kernel about a second a GiB on this machine's 4 KiB pages (bench/RESULTS.md), so a
     budget with room for them keeps them */
  out->need = fixed + 2 * largest + passing;
  out->grads_pass = budget > 0 && budget < fixed + passing_total + 2 * largest;
  if (budget == 0) return;   /* no budget: every record's state spills, nothing waits */
  uint64_t in_memory = fixed + (out->grads_pass ? 0 : passing_total);
  uint64_t least = 2 * largest + (out->grads_pass ? passing : 0);
  uint64_t room = budget > in_memory ? budget - in_memory : 0, spare = room > least ? room - least : 0;
  /* what the budget leaves beyond the least widens each state window by an eighth and a
     passing gradient window by half (at most L2L_TIER_GRAD_MOST more), and the rest
     keeps state in memory, the records first in order. The gradient window comes first:
     with room for one accumulator alone, each arrival waits for the last record's update
     to be written out, and the backward's compute no longer overlaps the disk
     (bench/spill_capacity.lua: 34 s a step against 22); a kept byte of state saves only
     the two bytes it would move a step */
  out->window = largest > 0 ? window_of(largest, spare) : 0;
  if (out->grads_pass)
    out->grad_window = passing + (spare / 2 < L2L_TIER_GRAD_MOST ? spare / 2 : L2L_TIER_GRAD_MOST);
  uint64_t windows = 2 * out->window + (out->grads_pass ? out->grad_window : 0);
  out->keep = room > windows ? room - windows : 0;
}

bool host_tier_keeps(const struct host_tier *tier, uint64_t *kept, uint64_t bytes) {
  if (*kept + bytes > tier->keep) return false;
  *kept += bytes;
  return true;
}
