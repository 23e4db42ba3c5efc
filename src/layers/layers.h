/* SPDX-License-Identifier: MIT */
/* layers.h — the layers' interface: what the parts above (the relay) use of a layer
 * beyond the public API.
 *
 * Purpose: let the relay bind device copies of a layer's parameters, plan its memory in
 * the precision it will bind, hold it, and move its saved state between pools (KARMA's
 * swap), without knowing any kind's internals. What the kind files share among
 * themselves is kind.h's.
 * Must never: include a header of the parts above it (eps, relay).
 */
#ifndef L2L_LAYERS_H
#define L2L_LAYERS_H

#include "backend/backend.h"

/* What a kind does in a model: the input (reads batch->tokens; no x), a body layer
   ((B,S,D) -> (B,S,D)), or a head (per-target losses, or logits without targets). The
   relay checks a model's shape and feeds each layer its batch fields by role. */
enum layer_role { L2L_ROLE_INPUT, L2L_ROLE_BODY, L2L_ROLE_HEAD };
enum layer_role layer_role(const l2l_layer *layer);
/* The batch fields a live layer reads, for B samples of S positions in the pools of
   `pool`'s domain (backend_pool_domain): shapes, dtypes, pools, ids in range; a head's backward
   also needs targets and a finite loss scale. The message names func and the field. The
   relay checks a whole batch with it (host pool) before a step runs. values_checked: the
   caller checked these values before (the relay, the whole batch on the host): ids are
   not scanned again where they are (on a GPU a device read, a sync, for every call). */
l2l_status layer_check_batch(const char *func, const l2l_layer *layer,
                             const l2l_layer_batch *batch, int64_t B, int64_t S,
                             l2l_pool_kind pool, bool backward, bool values_checked);
/* l2l_layer_forward and l2l_layer_backward for the relay, whose micro-batches are rows of
   a batch it checked whole on the host before the step: every check but the scan of the
   batch's ids (above). */
l2l_status layer_forward_prechecked(l2l_saved **saved, l2l_layer *layer, l2l_tensor *y,
                                    const l2l_tensor *x, const l2l_layer_batch *batch);
l2l_status layer_backward_prechecked(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                     l2l_saved *saved, const l2l_layer_batch *batch);
/* l2l_layer_backward with its grads not handed out: for a caller that puts back what it adds
   into them (the planner timing a relay's custom layer where its parameters are). */
l2l_status layer_backward_grads_kept(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                     l2l_saved *saved, const l2l_layer_batch *batch);
/* The dims (returned: how many) of a live layer's output for B, S and this batch (a head's
   depend on whether it has targets). */
int layer_output_dims(int64_t *dims, const l2l_layer *layer, const l2l_layer_batch *batch,
                      int64_t B, int64_t S);

/* Points a parameter record at other tensors (same shape; grad f32, value f32 or, for a
   low-precision parameter, f16 / bf16) for the layer calls that follow: the relay's
   device copies. value NULL points it back at its own tensors. */
void param_bind(l2l_param *param, l2l_tensor *value, l2l_tensor *grad);
/* The parameter's own value replaced by a tensor of `dtype` in `pool` holding its values
   (rounded to nearest even, or exactly widened): the relay's bf16 masters and records
   placed on the device, and f32 host values again as its layer leaves. Refused while
   bound; a failure leaves the value as it was. */
l2l_status param_rehome(l2l_param *param, l2l_pool_kind pool, l2l_dtype dtype);
/* The same for its gradient (f32 always): a record placed on the device keeps it there. */
l2l_status param_rehome_grad(l2l_param *param, l2l_pool_kind pool);
/* The parameter's own value and grad become these (same shapes; its old ones freed): a
   record the EPS moved between the host and the device. Not while bound. */
void param_adopt(l2l_param *param, l2l_tensor *value, l2l_tensor *grad);
/* A host copy (f32, its shape; NULL: none) of the parameter's value that the frugal
   LayerNorm guard reads instead of the value where it lives: a record on the device, whose
   copy the relay keeps current (borrowed: its owner clears it before freeing it). */
void param_set_guard_copy(l2l_param *param, const l2l_tensor *copy);
/* How many times l2l_param_write has written the value (a relay notes the news). */
uint64_t param_writes(const l2l_param *param);
/* Whether the relay may bind a 16-bit copy of the parameter (a GEMM weight or a gathered
   table); the others stay f32 on the device. */
bool param_low_precision(const l2l_param *param);
/* The parameter's grad as l2l_param_grad gives it, without handing it out: the relay's
   own reads and writes (its EPS's accumulator, a checkpoint's), which the EPS knows of.
   l2l_param_grad marks it handed out (core's tensor_hand_out): a caller may write it
   unseen from then on. */
l2l_tensor *param_grad(const l2l_param *param);
/* The same for its value (the master a relay's EPS keeps): l2l_param_value hands it out
   (the EPS then rewrites its staging copy every step, where its update would write it). */
l2l_tensor *param_value(const l2l_param *param);
/* What a call with targets allocates (l2l_layer_memory_use: a training call) of a layer
   whose low-precision parameters are bound in `precision` (f32: all f32), training (dropout
   runs) or not: the relay's plans. */
void layer_memory_in(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                     int64_t seq, l2l_dtype precision, bool training);
/* The same, the most over every value the parameters may take: the frugal modes' LayerNorm
   guard keeps more once a weight channel gets tiny (per field, the larger of the present
   weights' statement and the guarded one). What a budget must hold for steps to come. */
void layer_memory_bound(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                        int64_t seq, l2l_dtype precision, bool training);
/* The relay holding a live layer (NULL if none), and setting it. */
const void *layer_owner(const l2l_layer *layer);
/* The relay takes the layer (owner) or lets it go (NULL): a layer freed while held
   (l2l_layer_free) is freed then. */
void layer_set_owner(l2l_layer *layer, const void *owner);

/* One parameter record of a list of layers (records.c): a record shared by layers (the
   tied token table) once, at its first user. */
struct layers_record {
  l2l_param *param;
  int layer;      /* its first user's index in the list */
  int place;      /* its index among that layer's parameters */
  int pos;        /* its place among all the list's parameters, layer by layer */
  int users;      /* the layers of the list that hold it */
  bool trained;   /* some user is not frozen (frozen NULL: none is) */
};
/* The distinct records of layers[0..n), layer by layer in each one's parameter order (a
   relay's order), into *out (malloc'ed: the caller frees it) and *count. frozen: NULL, or
   one flag a layer. */
l2l_status layers_records(struct layers_record **out, int *count, const l2l_layer *const *layers,
                          const bool *frozen, int n);
/* How a record is held on the host under a relay's precision and master setting (f32 or
   bf16): its master's dtype (bf16 for a low-precision record under master bf16, else f32)
   and its staging copy's, the 16 bits the device reads (the precision, for a low-precision
   record under a 16-bit precision whose master is f32; L2L_F32: no copy, the master is
   what the device reads). The one rule the planner, the EPS and the relay hold records by. */
struct layers_record_dtypes {
  l2l_dtype master, staging;
};
struct layers_record_dtypes layers_record_dtypes(const l2l_param *param, l2l_dtype precision,
                                                 l2l_dtype master);
/* Moves everything a saved state holds (its buffer and the inputs and outputs it refers
   to) into `pool` (KARMA's swap); the other pool's bytes go with their last handle. */
l2l_status saved_move(l2l_saved *saved, l2l_pool_kind pool);
/* Bytes of pool memory a saved state holds, its references to x and y included. */
uint64_t saved_pool_bytes(const l2l_saved *saved);

#endif /* L2L_LAYERS_H */
