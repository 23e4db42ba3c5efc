/* SPDX-License-Identifier: MIT */
/* l2l/plan.h — a part of the public header l2l.h: the planner, a cost model of the relay
 * that chooses its micro-batch and policies.
 *
 * Purpose: one seam of the C API. A program includes l2l.h, never a part: a part uses the
 * types the header and the parts before it declare, and l2l.h's conventions hold for it.
 * Its FFI block is read after theirs (scripts/public_header.lua).
 * Must never: be included but by l2l.h.
 */
#ifndef L2L_H
#error "include l2l.h, not its parts"
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- the planner
   A cost model of the relay (KARMA's idea, over everything the relay can do): for a
   device budget it chooses the micro-batch and, per layer, inner (keep / swap /
   recompute) and the stash of its input boundary, minimising the predicted step time
   with the predicted device peak within the budget. The peak is replayed from the
   layers' memory statements in the relay's order (on the CPU backend it is the pool's
   peak to the byte; with swap, a bound). Times come from rates measured on this machine
   (layers timed at their own shapes, copies, the host optimizer; cached per machine and
   backend) or given by the caller. A visit costs the most of its channels (compute,
   copies in, copies out), as the relay overlaps them. This machine's rates come from
   l2l_relay_calibrate_plan (l2l/relay.h, which also names the type: the relay measures
   them). */
struct l2l_plan_rates {
  double flops;       /* device FLOP/s for layers not timed at their shape */
  double h2d, d2h;    /* copy bytes/s: host (pinned) to device, device to host */
  double optimizer;   /* master bytes/s the host optimizer updates (all its threads) */
  double visit;       /* fixed seconds of a layer visit */
  int timed;          /* 1: time layers at their shapes here (calibrated rates) */
  int shared;         /* 1: copies and the host optimizer run on the cores that compute
                         (the CPU backend): their time adds to compute's, not hidden */
  double disk_read, disk_write;   /* bytes/s the config's spill directory reads and writes
                                     sequentially (0: measured there when the config has
                                     one, and cached with the machine's rates) */
};

typedef struct l2l_plan_request {
  int64_t batch, seq;           /* the minibatch's shape */
  uint64_t device_budget;       /* > 0: the bytes the step may hold on the device at its
                                   peak, as l2l_relay_config.device_budget counts them (the
                                   GPU backend's own bytes, shared by every relay, are not
                                   the step's) */
  int token_types, key_mask;    /* 1: the batches carry them */
  const uint8_t *frozen;        /* one byte per layer, 1 = frozen; NULL: none */
  const l2l_plan_rates *rates;  /* NULL: this machine's (l2l_relay_calibrate_plan) */
} l2l_plan_request;

typedef struct l2l_plan l2l_plan;
typedef struct l2l_plan_summary {
  int nlayers;
  int64_t micro_batch;
  double step_seconds;       /* predicted */
  uint64_t device_peak;      /* predicted: the step's own bytes at its peak */
  uint64_t device_records_bytes;   /* with placement device: the records' bytes on the device
                                      (masters, gradients, state, 16-bit copies), there
                                      between steps; the budget holds them and the step */
  uint64_t h2d_bytes, d2h_bytes;   /* predicted: bytes the step copies to the device and
                                      back (as l2l_relay_stats counts them) */
  double streaming_tokens;   /* tokens per layer visit above which a block's weights stream
                                in under its compute (device FLOP/s over h2d bytes/s) */
  /* The host and the disk (config.host_budget, spill_dir), for a relay made over the model
     as it is (its records in layer order): */
  uint64_t host_eps_bytes;   /* the EPS's host bytes between steps (stats.host_eps_bytes) */
  uint64_t host_budget_smallest;   /* the smallest config.host_budget that works */
  uint64_t disk_bytes;       /* what a step's updates read from the spill file, and as much
                                again written back (stats.spill_read_bytes and
                                spill_written_bytes of a step after the first) */
  double disk_seconds;       /* those bytes at the directory's rates, a step's share (with
                                accumulation, an update's over its steps): step_seconds is
                                at least this (the disk works under compute) */
  /* The step's channels at the rates, each as if alone (the relay overlaps them, so the
     largest is the one a faster part of the machine would have to speed up): */
  double compute_seconds;    /* the device computing, every visit's */
  double h2d_seconds, d2h_seconds;   /* the copies each way (h2d_bytes, d2h_bytes) */
  double update_seconds;     /* the host optimizer's updates on all its workers (with
                                accumulation, an update's share of a step) */
} l2l_plan_summary;
typedef struct l2l_plan_layer {
  l2l_inner_policy inner;
  l2l_stash_policy stash;    /* of the layer's input boundary (layer 0: device) */
  uint64_t kept_bytes;       /* device bytes it keeps from forward to backward */
  double seconds;            /* predicted time of its visits in a step */
  int on_device;             /* 1: its records live on the device (placement device, or auto
                                where the plan puts them there: a relay the plan is applied
                                to keeps the others home), 0: in host memory */
} l2l_plan_layer;

/* Plans `layers` under a relay `config` (its param_slots, precisions and optimizer
   threads count; micro_batch, stash and inner are what the plan chooses). Refused with
   L2L_ERR_BUDGET, naming the smallest budget any plan needs and what needs it, when none
   fits. */
L2L_API l2l_status l2l_plan_new(l2l_plan **out, l2l_layer *const *layers, int nlayers,
                                const l2l_relay_config *config, const l2l_plan_request *request);
L2L_API l2l_status l2l_plan_get(l2l_plan_summary *out, const l2l_plan *plan);
L2L_API l2l_status l2l_plan_get_layer(l2l_plan_layer *out, const l2l_plan *plan, int index);
L2L_API void l2l_plan_free(l2l_plan *plan);
/* The plan's micro-batch and per-layer policies into the relay (same layers, in order). */
L2L_API l2l_status l2l_relay_apply_plan(l2l_relay *run, const l2l_plan *plan);
/* Plans the relay for steps of batch x seq (token_types, key_mask: 0 or 1) at this
   machine's rates (l2l_relay_calibrate_plan) within its device budget (config.device_budget;
   with the device pool's budget set, at most what that leaves beside the tensors in use)
   and applies the plan (l2l_relay_apply_plan). A call for the shape and budgets of the
   last one, over the same layers and frozen flags, keeps that plan; any other plans again
   (what `plan = "auto"` does before each step in Lua). *out (may be NULL): the plan
   applied, the relay's (valid until a call plans again or the relay is freed). Refused
   (L2L_ERR_BUDGET) with the smallest budget that works (l2l_last_error_detail's
   needed_bytes: the pool's when the pool's budget binds), or (L2L_ERR_INVALID) with no
   budget at all; a refusal changes nothing. */
L2L_API l2l_status l2l_relay_plan_auto(const l2l_plan **out, l2l_relay *run, int64_t batch, int64_t seq,
                                       int token_types, int key_mask);

/* L2L_FFI_END */
