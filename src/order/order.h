/* SPDX-License-Identifier: MIT */
/* order.h — one training step's order, written once for the relay that runs it and the
 * planner that replays it (the part's interface).
 *
 * Purpose: a step is a list of layer visits (forward 0 .. L-2, the head, then backward from
 * L-2 down to the lowest trainable layer, with rebuild visits before a backward whose input
 * boundary was dropped), and within each visit, micro-batch by micro-batch, an order of
 * device allocations and frees: inputs brought in ahead, outputs made, layer calls,
 * boundaries released, stashed or freed, gradients handed down, saved states swapped. All of
 * it is decided here: the relay executes the walk with real tensors and copies
 * (src/relay/visits.c), the planner executes it with counted blocks (src/plan/peak.c) and
 * with timed channels (src/plan/cost.c), so the planner's device peak and the bytes its
 * time model copies are the relay's by construction. The bytes a layer's records
 * take in a device slot are here too, for the same reason.
 * Must never: allocate, copy or compute anything of a step: every act is the executor's.
 */
#ifndef L2L_ORDER_H
#define L2L_ORDER_H

#include "layers/layers.h"

/* ---------------------------------------------------------------- the visit order */

enum order_visit_kind { ORDER_FORWARD, ORDER_REBUILD, ORDER_HEAD, ORDER_BACKWARD };
struct order_visit {
  int k;                       /* index among the step's layers */
  enum order_visit_kind kind;
};

/* What the order depends on, per layer, and the layer (its records fill the slots). */
struct order_layer {
  const l2l_layer *layer;
  bool frozen;
  l2l_inner_policy inner;      /* its saved state: keep, swap or recompute */
  l2l_stash_policy stash;      /* where the boundary entering it waits (k >= 1) */
  uint32_t on_device;          /* bit r: its record r lives on the device (placement): bound
                                  where it lives, it takes no parameter slot and no copy */
};

struct order {
  int L;
  bool training;
  struct order_layer *layers;   /* L, the caller fills them before order_build */
  struct order_visit *visits;
  int nvisits;
  int lowest;                  /* the lowest trainable layer (L: none, or not training) */
  bool *rebuilt;               /* boundary k rebuilt on the device for its backward */
  bool *reread;                /* x[k] is read again after the forward (backward or rebuild) */
};

/* Whether layer k's forward keeps its saved state for the backward (keep or swap). */
static inline bool order_keeps(const struct order *sc, int k) {
  return sc->training && sc->layers[k].inner != L2L_INNER_RECOMPUTE && k >= sc->lowest;
}
/* Whether a visit computes gradients (a backward, or the head's turnaround in training). */
static inline bool order_visit_grads(const struct order *sc, const struct order_visit *v) {
  return sc->training && (v->kind == ORDER_BACKWARD ||
                          (v->kind == ORDER_HEAD && sc->lowest < sc->L));
}

/* Room for a step of L layers (freed by order_free, also after a failure). */
l2l_status order_new(struct order *sc, int L, bool training);
/* The visits, lowest, rebuilt and reread from the layers' policies. */
void order_build(struct order *sc);
void order_free(struct order *sc);

/* ---------------------------------------------------------------- the walk */

/* The step's activations, per boundary and micro-batch: x[k][u], the input of layer k
   (k >= 1); g[k][u], the gradient for it; the scratch output of a recomputing backward. */
enum order_act { ORDER_X, ORDER_G, ORDER_SCRATCH };

/* How a micro-batch of a host-stashed boundary waits for its next reader (stash_out's
   `how`): on the host alone (its device copy freed once copied), on both (the next visit
   reads the device copy, a later one the host's), or on the device alone (the next visit
   is its last reader). */
enum order_out { ORDER_OUT_HOST, ORDER_OUT_BOTH, ORDER_OUT_DEVICE };

/* Whether micro-batch u of nmb of a visit's output stays on the device for the next visit:
   the first (the next visit reads it at once) and the last (the visit would wait at its end
   for its copy out, which can only start when the visit's compute has ended); the next
   visit fetches the others one ahead of their use, under the compute of the one before.
   A timing that walks two micro-batches for many keeps both: the first stands for the
   first and the middle ones (those its counts weigh), the second for the last. */
static inline bool order_kept(int64_t u, int64_t nmb) { return u == 0 || u == nmb - 1; }

/* The executor's acts, called in the step's order. Optional hooks may be NULL. */
struct order_ops {
  /* Hooks: visit i is about to start (before its first inputs are brought in); micro-batch
     u of the visit running is about to start. */
  void (*visit_start)(void *ctx, int i);
  void (*micro_batch)(void *ctx, int64_t u);
  /* Visit i starts, its first inputs on their way: its parameters bound (with gradients
     when `grads`). After it: they go (with the gradients). */
  l2l_status (*visit_bind)(void *ctx, int i, const struct order_visit *v, bool grads);
  l2l_status (*visit_end)(void *ctx, int i, const struct order_visit *v, bool grads);
  /* a[k][u]: brought toward the device when only on the host; on the device (waiting for
     its copy); made new on the device (micro-batch u's rows); freed; its device copy freed
     (a host stash stays; a copy to it still reading the device copy is waited for); sent
     out as `how` says: to a new host stash, its device tensor freed once copied (HOST),
     or kept too (BOTH), or not at all (DEVICE: the executor's step holds it as it is; the
     walk calls it so that a timing of one micro-batch standing for many counts the rest). */
  l2l_status (*prefetch)(void *ctx, enum order_act a, int k, int64_t u);
  /* a[k][0], the next visit's first input, brought toward the device while this visit runs
     (prefetch of micro-batch 0; a timing that walks one micro-batch for many counts one). */
  l2l_status (*prefetch_ahead)(void *ctx, enum order_act a, int k);
  l2l_status (*on_device)(void *ctx, enum order_act a, int k, int64_t u);
  l2l_status (*make)(void *ctx, enum order_act a, int k, int64_t u);
  void (*free)(void *ctx, enum order_act a, int k, int64_t u);
  l2l_status (*release_device)(void *ctx, enum order_act a, int k, int64_t u);
  l2l_status (*stash_out)(void *ctx, enum order_act a, int k, int64_t u, enum order_out how);
  /* Retires the oldest stash-outs until at most `keep` are in flight. */
  l2l_status (*throttle)(void *ctx, int keep);
  /* Micro-batch u's rows of the batch fields layer k's role reads, on the device (one
     micro-batch's at a time); freed. */
  l2l_status (*inputs)(void *ctx, int k, int64_t u, bool training);
  void (*inputs_free)(void *ctx);
  /* Layer calls. forward: x[k][u] (none for k = 0) to x[k+1][u], the saved state kept in
     saved[k][u] when `keep`; the call's own arenas (saved, work) come and go inside it.
     head: its losses, then (backward) the gradient made at g[k][u], the forward, the
     loss, the backward; the losses and the saved state freed. backward: with `recompute`,
     the forward of x[k][u] into the scratch rebuilds saved[k][u]; then g[k+1][u] to
     g[k][u] (none for k = 0). */
  l2l_status (*forward)(void *ctx, int k, int64_t u, bool keep, bool rebuild);
  l2l_status (*head)(void *ctx, int k, int64_t u, bool backward);
  l2l_status (*backward)(void *ctx, int k, int64_t u, bool recompute);
  void (*saved_free)(void *ctx, int k, int64_t u);
  /* KARMA's swap of saved[k][u]: out after its forward, done by the visit's end; in one
     micro-batch ahead of its backward (nothing when it is not away), waited for at it. */
  l2l_status (*swap_out)(void *ctx, int k, int64_t u);
  l2l_status (*swap_out_wait)(void *ctx, int k, int64_t u);
  l2l_status (*swap_in)(void *ctx, int k, int64_t u);
  l2l_status (*swap_in_wait)(void *ctx, int k, int64_t u);
};

/* order_walk(sc, nmb, ops, ctx): runs the step's visits over nmb micro-batches through
   `ops` (a static const table: the walk is inline, walk.h), stopping at the first act that
   fails (the executor frees what the step holds). */
#include "order/walk.h"

/* ---------------------------------------------------------------- device slots */

/* A parameter slot as the choice of slots sees it. */
struct order_slot {
  int held;                    /* the layer whose parameters it holds, -1: none reusable */
  int64_t last_used;           /* the tick when last chosen, -1: never */
};
/* The parameter slot for the next visit of layer k, other than `busy` (the running
   visit's; -1: none): one that holds k as it is now (held == k and, when `current` is not
   NULL, current(ctx, i): the relay asks whether the layer was updated since), else the
   least recently used. *reused says which; the slot is marked used at `tick`, and one not
   reused holds nothing reusable until its copy is done (the caller then sets held). */
int order_slot_choose(struct order_slot *slots, int nslots, int k, int busy, int64_t tick,
                      bool (*current)(void *ctx, int i), void *ctx, bool *reused);

/* What a device slot holds for each record: its values in their device dtype, its f32
   gradient, or the 16-bit copy of a gradient made to leave the device (f32 gradients leave
   from the gradient slot itself: 0 bytes). */
enum order_slot_content { ORDER_SLOT_VALUES, ORDER_SLOT_GRADS, ORDER_SLOT_GRADS_OUT };

/* The dtype `param` takes in a slot holding `content`: values in `precision` for the
   parameters that may go 16-bit (GEMM weights, token tables), else f32; gradients in f32;
   gradients out in `grad_precision` for those parameters, else f32. */
l2l_dtype order_slot_dtype(const l2l_param *param, enum order_slot_content content,
                           l2l_dtype precision, l2l_dtype grad_precision);
/* Bytes `param` takes in such a slot, rounded so that every record starts on L2L_ALIGN
   (none in a parameter slot for a record on the device). */
uint64_t order_param_slot_bytes(const l2l_param *param, enum order_slot_content content,
                                l2l_dtype precision, l2l_dtype grad_precision, bool on_device);
/* Bytes of a step's layer's records in such a slot. */
uint64_t order_layer_slot_bytes(const struct order_layer *layer, enum order_slot_content content,
                                l2l_dtype precision, l2l_dtype grad_precision);
/* The layer whose records take the most in such a slot (the first of equals), and in
   *bytes the slot's size: its bytes, at least L2L_ALIGN. */
int order_largest_layer(const struct order *sc, enum order_slot_content content,
                        l2l_dtype precision, l2l_dtype grad_precision, uint64_t *bytes);
/* Bytes of one such slot of a step: the largest layer's, at least L2L_ALIGN. */
uint64_t order_slot_size(const struct order *sc, enum order_slot_content content,
                         l2l_dtype precision, l2l_dtype grad_precision);
/* Bytes of every slot a step holds: param_slots (0: two) for values and, in training, two
   for gradients and two for their 16-bit copies when grad_precision is 16-bit. */
uint64_t order_slots_bytes(const struct order *sc, int param_slots, l2l_dtype precision,
                           l2l_dtype grad_precision);

#endif /* L2L_ORDER_H */
