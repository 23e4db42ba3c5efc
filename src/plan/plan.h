/* SPDX-License-Identifier: MIT */
/* plan.h — the planner's interface to the part above it (the relay): a model as the
 * planner sees it, a policy to judge, and the device peak a step under that policy reaches.
 *
 * Purpose: the KARMA-style planner (issue 22) chooses, per layer, keep / swap / recompute
 * and where each boundary waits, and the micro-batch, under a device budget. Its first
 * piece is here: the device peak of one training step, replayed from the layers' memory
 * statements (layer_memory_in) by walking the step's visit order as the relay does
 * (src/order), so that on the CPU backend it equals the pool's measured peak to the
 * byte.
 * Must never: include the relay's headers or read its state: what it knows of the relay's
 * order is the walk both take.
 */
#ifndef L2L_PLAN_H
#define L2L_PLAN_H

#include "layers/layers.h"
#include "order/order.h"

/* Refused (L2L_ERR_INVALID, naming the first difference) unless `plan` was made for these
   layers (configs, records, frozen flags) and these relay settings (slots, accumulation,
   precisions, deferred updates). The relay checks a plan it is given with this. */
l2l_status plan_check_model(const l2l_plan *plan, l2l_layer *const *layers, const bool *frozen,
                            int nlayers, const l2l_relay_config *config);

/* A layer of the chain: its memory statement is asked per micro-batch size. */
struct plan_layer {
  const l2l_layer *layer;
  enum layer_role role;
  bool frozen;
  l2l_inner_policy inner;
  l2l_stash_policy stash;    /* where the boundary entering this layer waits (k >= 1) */
  uint32_t on_device;        /* bit r: its record r lives on the device (placement): no
                                parameter slot, nothing copied in or out, no host update */
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
  bool any_weights;          /* layers' memory whatever their weights (layer_memory_bound) */
  bool evaluation;           /* a forward-only step (l2l_relay_evaluate): no gradients, nothing
                                kept; the peak replays it, the time model and search do not */
  /* for the time model */
  bool updates_deferred;     /* global clipping or loss scaling: updates after backward */
  int accumulate;            /* minibatches per update */
  /* What replays of this chain share whatever the policies (plan_chain_memo): the
     layers' memory statements at micro_batch, the slots' bytes. NULL: worked out per
     replay. */
  struct plan_memo *memo;
  /* Placement auto's groups in the order plan_place took them (their first layers; L
     entries), and how many (-1: none taken yet); NULL: not kept. A later placement of
     fewer groups takes the first of them (place.c). */
  int *placed_order;
  int placed_count;
};

struct plan_memo {
  int64_t micro_batch;         /* what it was made for */
  bool evaluation;
  l2l_layer_memory *mem[2];    /* per layer: a full micro-batch, the last */
  uint64_t slots[3];           /* a slot's bytes per order_slot_content */
};
/* The memo for the chain's micro-batch (made or remade; freed by plan_memo_free). */
l2l_status plan_chain_memo(struct plan_chain *c);
void plan_memo_free(struct plan_chain *c);

/* ---------------------------------------------------------------- the step's order */

/* The training step's order (src/order: the visits and their acts) from the
   chain's policies; order_free frees it, also after a failure. */
l2l_status plan_schedule(struct order *sc, const struct plan_chain *c);

/* The device peak (pool bytes) of one step of `c` (training, or an evaluation) on top of
   what the pool already holds, or 0 when the chain cannot be replayed (the message says why). Swap
   moves run on the copy threads, so their timing sets where in between a peak with swap
   falls: this gives the bound that holds whatever the timing. */
l2l_status plan_peak(uint64_t *peak, const struct plan_chain *c);
/* A floor under plan_peak for the chain's micro-batch whatever its layers' policies:
   what every step holds at once (the slots, and a layer's forward call with its input,
   output and arenas), the largest over the layers. A budget under it fits no policy of
   that micro-batch (test_plan_search's brute force holds every policy's peak to it). */
l2l_status plan_peak_floor(uint64_t *floor, const struct plan_chain *c);
/* Steps of more micro-batches than this are not replayed whole but from three short
   replays (peak.c says why that is exact); test_plan sets it low to compare the two. */
extern int64_t plan_peak_whole_replay_max;
/* The device peak of one step as the relay runs it: `layers` (the active ones, with their
   policies), the relay's config, the batch's shape, a training step or an evaluation;
   any_weights: the most over every value the weights may take. The relay's budget check
   before a step (src/relay/budget.c). */
l2l_status plan_step_peak(uint64_t *peak, struct plan_layer *layers, int L,
                          const l2l_relay_config *config, int64_t batch, int64_t seq,
                          int64_t micro_batch, bool token_types, bool key_mask,
                          bool training, bool any_weights);
/* The same step's placement auto (plan_place) within budget, among the groups allowed
   (NULL: all): layers[k].on_device set. */
l2l_status plan_step_place(struct plan_layer *layers, int L, const l2l_relay_config *config,
                           int64_t batch, int64_t seq, int64_t micro_batch, bool token_types,
                           bool key_mask, uint64_t budget, const uint32_t *allowed,
                           uint64_t *bytes);
extern _Atomic int64_t plan_peak_fallbacks;   /* short replays not on lines (none expected) */
extern _Atomic int64_t plan_replayed_micro_batches;   /* the replays' work, for test_plan_search */

/* ---------------------------------------------------------------- the time model */

/* What a layer costs, for the chain's micro-batch: a forward and a backward of a full and
   of the last micro-batch (the last may be smaller), and the bytes its visits move. */
struct plan_layer_costs {
  double fwd[2], bwd[2];     /* seconds: [0] a full micro-batch, [1] the last */
  uint64_t param_bytes;      /* its records in a parameter slot (device dtypes) */
  uint64_t grad_bytes;       /* its gradients leaving the device */
  uint64_t master_bytes;     /* f32 masters of the records it updates (a record shared
                                with a layer below is counted there) */
  uint64_t swap_bytes[2];    /* a swapped saved state: arena plus the x / y it refers to */
};

/* The layers' costs for the chain's micro-batch: timed at their shapes (rates->timed),
   else from FLOPs at rates->flops. */
l2l_status plan_layer_costs(struct plan_layer_costs *out, const struct plan_chain *c,
                            const l2l_plan_rates *rates);
/* A step's channels: the bytes it copies each way (as the relay's stats count them), the
   seconds of its visits' compute on the device (with what the calling thread copies as it
   goes: the ids) and of its updates on the host optimizer's workers, at the rates. */
struct plan_step_channels {
  double h2d, d2h;
  double compute, updates;
};
/* Seconds of one training step of the chain under its policies (the order's walk,
   timed; -1: no memory to walk it); per_layer (L entries, or NULL) gets each layer's
   share (its visits), channels (or NULL) the step's channels. */
double plan_step_seconds(const struct plan_chain *c, const struct plan_layer_costs *costs,
                         const l2l_plan_rates *rates, double *per_layer,
                         struct plan_step_channels *channels);
/* This machine's copy and optimizer rates (cached; measured when missing or asked), and
   the visit cost the relay measured (-1 until then). */
l2l_status plan_machine_rates(l2l_plan_rates *out, bool remeasure);
/* The rates cache (calibrate.c): the values of `key` (a line "key v1 .. vn", n <= 4), or
   false; a line appended (a write that fails is skipped: it is a cache). */
bool plan_cache_get(const char *key, double *values, int n);
void plan_cache_put(const char *key, const double *values, int n);
/* The host channel (host.c): the EPS's bytes between steps (masters, accumulators,
   staging, the optimizer state the host budget keeps), the bytes a step's updates read
   from the spill file and as many written back (0 without one), and the smallest host
   budget that works, for a relay over these layers made as the model is (its records in
   layer order). */
struct plan_host {
  uint64_t eps_bytes, disk_bytes, smallest_budget;
  uint64_t device_bytes;       /* the records placed on the device (placement device) */
};
l2l_status plan_host(struct plan_host *out, const struct plan_layer *layers, int L,
                     const l2l_relay_config *config);
/* The sequential read and write rates of a spill directory (the median of three passes of
   256 MiB each way, around the page cache; cached per directory with the machine's
   rates). */
l2l_status plan_disk_rates(double *read, double *write, const char *dir);
/* The median of n timings (v is sorted in place). */
double plan_median(double *v, int n);
/* Caches a measured visit cost (l2l_relay_calibrate_plan, in the relay). */
void plan_cache_visit(double seconds);
/* A forward and backward of `layer` at rows x seq with its low-precision weights bound in
   `precision` (the relay's), measured here (and cached). */
l2l_status plan_time_layer(double *fwd, double *bwd, const l2l_layer *layer, int64_t rows,
                           int64_t seq, l2l_dtype precision);
/* Floating-point operations of a forward of `layer` at rows x seq (a backward: twice). */
double plan_layer_flops(const l2l_layer *layer, int64_t rows, int64_t seq);

/* ---------------------------------------------------------------- the search */

struct plan_result {
  bool found;
  int64_t micro_batch;
  double seconds;
  uint64_t peak;
  double *layer_seconds;        /* L entries, the caller's (may be NULL) */
  struct plan_step_channels channels; /* the step's copies each way, compute and updates */
};
/* The most trials one search's polish takes (search.c says how they are shared), and the
   trials taken, for test_plan_search. */
enum { PLAN_POLISH_SEARCH = 1200 };
extern _Atomic int64_t plan_polish_trials;
/* The search's shortcuts (search.c: a peak replayed only where the policy's time could be
   taken, a size over budget at its floor passed over); false, for test_plan_search: every
   peak replayed, every size judged whole. */
extern bool plan_search_shortcuts;
/* The leanest policy's peak (micro-batch 1, every layer recomputed, its boundary on the
   host): L2L's default, what placement auto places records beside. Replayed only, nothing
   timed. Leaves c at that policy. */
l2l_status plan_leanest_peak(uint64_t *peak, struct plan_chain *c);
/* The least peak of the policies every search starts from (search.c: the uniform and the
   periodic ones) at micro-batch 1: what a refusal names. Policies that swap, or recompute
   every boundary, can need less than the leanest (up to 2.8 % on test_plan_search's small
   chains; 0.7 % on a GPT of width 512 and 50,257 words); over 40,000 of those chains the
   least of every policy was under this in 1 chain in 100, by 1.2 % at most. On a tie the
   leanest. Replayed only, nothing timed (a budget too small for it is refused before the
   timing would allocate past it). Leaves c at that policy. */
l2l_status plan_least_peak(uint64_t *peak, struct plan_chain *c);
/* Placement auto (place.c): the chain's layers' on_device bits for the records the budget
   holds on the device beside the step's peak with its policies and micro-batch: every
   record when all fit, else a layer's own records at a time, the largest first, each while
   they fit (a replay each; with c->placed_order, of at most `most` groups where an earlier
   call took more: the first `most` it took, one replay, when they fit); none
   where the config keeps them on the host. allowed (NULL: every layer's): per layer, nonzero
   where the group that layer begins may go on the device. At most `most` groups (the
   first that fit, largest first; *groups, when not NULL, gets how many). *bytes: the placed
   records' device bytes. */
l2l_status plan_place(struct plan_chain *c, const l2l_relay_config *config, uint64_t budget,
                      const uint32_t *allowed, int most, int *groups, uint64_t *bytes);
/* The fastest micro-batch and policies whose peak fits `budget`: into the chain (its
   micro_batch and layers' policies) and out. out->found false: none fits. */
l2l_status plan_search(struct plan_result *out, struct plan_chain *c, const l2l_plan_rates *rates,
                       uint64_t budget);

#endif /* L2L_PLAN_H */
