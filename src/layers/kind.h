/* SPDX-License-Identifier: MIT */
/* kind.h — what the layer files share (private to src/layers/): the layer, parameter and
 * saved-state records, the per-kind operations table, and buffer planning.
 *
 * Purpose: layer.c (parameters, ties, clones), call.c (checking calls, memory plans, saved
 * states) and kind_math.c (the GEMMs) do everything common to all kinds; each kind's file
 * (embedding.c, block.c, heads.c, custom.c) is an entry of the registry (registry.c) that
 * supplies its role, its config and batch checks, its parameter layout, its forward and
 * backward on raw buffers, and a plan of the buffers those need. Forward and memory
 * reports use one plan, so the bytes a layer reports are the bytes it allocates.
 * Accumulation contract for every kind: parameter gradients accumulate (+=), activation
 * gradients are written (=).
 * Must never: be included outside src/layers/ (the other parts see layers.h).
 */
#ifndef L2L_LAYERS_KIND_H
#define L2L_LAYERS_KIND_H

#include "layers.h"

#define L2L_PARAM_MAGIC 0x6c326c70u  /* "l2lp" */
#define L2L_LAYER_MAGIC 0x6c326c6cu  /* "l2ll" */
#define L2L_SAVED_MAGIC 0x6c326c73u  /* "l2ls" */
enum { L2L_LAYER_MAX_PARAMS = L2L_MAX_PARAMS, L2L_PARAM_NAME = L2L_PARAM_NAME_MAX };

struct l2l_param {
  uint32_t magic;
  atomic_int users;             /* layers holding this record */
  char name[L2L_PARAM_NAME];
  int decays;
  /* A GEMM weight or a gathered table: the relay may bind a 16-bit device copy of it (its
     precision option); every other parameter is bound in f32. */
  bool low_precision;
  l2l_tensor *value, *grad;     /* same shape, f32, one pool; while bound (the relay), the
                                   device tensors the layer computes with (the value may
                                   then be f16 / bf16 when low_precision; grad stays f32) */
  l2l_tensor *home_value, *home_grad;  /* the record's own tensors while bound, else NULL */
  const l2l_tensor *guard_copy; /* a host copy of its value the frugal LayerNorm guard reads
                                   instead of a device tensor (param_set_guard_copy), NULL */
  _Atomic uint64_t writes;      /* l2l_param_write's so far (param_writes) */
};

struct l2l_layer {
  uint32_t magic;
  l2l_layer_config config;
  uint64_t serial;              /* unique among the layers this process made (never reused,
                                   unlike an address): a saved state names its maker by it */
  uint32_t rng_id;
  l2l_pool_kind pool;
  int nparams;
  l2l_param *params[L2L_LAYER_MAX_PARAMS];
  /* A kind's parameter roles (its own enum) -> index in params; -1: absent (a bias
     switched off). */
  int8_t role[L2L_LAYER_MAX_PARAMS];
  /* A custom kind's name and functions (NULL for the built-in kinds). */
  const struct custom_kind *custom;
  /* Set only on the stand-in layer of l2l_layer_config_params: layer_add_param then
     writes each record's name and shape here instead of making it. */
  l2l_param_info *describe;
  const void *owner;            /* the relay holding the layer, NULL if none */
  bool free_pending;            /* freed while held: freed when the relay lets it go */
};

static inline bool layer_live(const l2l_layer *layer) {
  return layer != NULL && layer->magic == L2L_LAYER_MAGIC;
}
static inline bool param_live(const l2l_param *param) {
  return param != NULL && param->magic == L2L_PARAM_MAGIC;
}

/* A kind written elsewhere (l2l_layer_new_custom); shared by a layer and its clones. */
struct custom_kind {
  atomic_int refs;
  char name[L2L_PARAM_NAME];
  l2l_custom_forward_fn forward;
  l2l_custom_backward_fn backward;
  void *user;
};

/* Bytes carved out of one pool allocation: every buffer starts on L2L_ALIGN. */
struct arena {
  uint64_t bytes;
};
enum { NO_BUFFER = -1 };
/* Reserves `bytes` (0: none) and returns the offset, or NO_BUFFER. */
int64_t arena_reserve(struct arena *a, uint64_t bytes);
static inline void *arena_at(void *base, int64_t offset) {
  return offset == NO_BUFFER ? NULL : (char *)base + offset;
}

/* Parameter roles of the kinds that layer.c needs to know (l2l_layer_tie). */
enum { EMBED_WTE = 0, EMBED_WPE = 1, EMBED_WTT = 2 };
enum { HEAD_LN_W = 0, HEAD_LN_B = 1, HEAD_PROJ = 2 };

/* A call's flag beside its kind's own: the layer's GEMM weights are 16-bit (the call's
   precision), so a kind may keep an activation that only those GEMMs read in their dtype,
   written so by the op that makes it (half the bytes, no cast before the GEMMs). call.c
   sets it from the precision, for the memory reports and the calls alike. */
enum { LAYER_ACTS_16 = 1u << 31 };

struct l2l_saved {
  uint32_t magic;
  l2l_layer_kind kind;
  uint64_t layer_serial;        /* the layer whose forward made it */
  l2l_layer_config config;      /* that layer's config then (byte for byte): its buffers are
                                   laid out for it */
  int64_t batch, seq;           /* the forward's B and S */
  uint32_t flags;               /* kind-specific choices made in forward (e.g. fallbacks),
                                  and LAYER_ACTS_16 */
  l2l_dtype precision;          /* the forward's 16-bit weights' dtype (f32: none) */
  bool used;                    /* a backward has consumed it */
  l2l_tensor *buffer;           /* the saved arena (u8), NULL when empty */
  l2l_tensor *input, *output;   /* references to x and y when the backward reads them */
};

/* One call's view of its tensors, checked by call.c. */
struct layer_call {
  const struct backend_ops *ops;
  l2l_pool_kind pool;           /* where saved and work arenas go (y's pool) */
  int64_t batch, seq;
  const l2l_layer_batch *b;
  bool keep;                    /* forward: a backward will consume this saved state */
  /* The call's tensors, for kinds that work on tensors rather than buffers (custom). */
  l2l_tensor *y, *dx;
  const l2l_tensor *x, *dy;
  /* The layer's 16-bit weights' dtype (f32: none) and scratch for the activations a GEMM
     with them reads, rounded to that dtype (cast_elements of the kind). */
  l2l_dtype precision;
  void *cast;
};

/* Draw stream of a dropout site (l2l.h). */
static inline uint64_t layers_dropout_stream(const l2l_layer *layer, const l2l_layer_batch *b,
                                             int site) {
  return (b->step << 32) + ((uint64_t)layer->rng_id << 8) + (uint64_t)site;
}

/* What a kind's batch check works with: the call's B and S, the domain of pools its
   tensors must be in, and the backend that reads ids there. */
struct batch_check {
  const char *func;            /* the public call, named in messages */
  const l2l_layer *layer;
  const l2l_layer_batch *b;
  int64_t batch, seq;
  int domain;                  /* backend_pool_domain of the call */
  const struct backend_ops *ops;
  bool backward;
  bool values_checked;         /* ids are not scanned (layer_check_batch) */
};
/* The refusal `status` of batch field `name` ("batch->tokens"), its message naming it marked
   (L2L_NAMED_FIELD): the error's detail names the field ("tokens"). Returns status. */
l2l_status batch_refused(l2l_status status, const char *name);
/* A batch field `name` (e.g. "batch->tokens"): `dtype` with dims (B, S) (ndim 2) or (B)
   (ndim 1), in the call's domain of pools. */
l2l_status batch_tensor(const struct batch_check *bc, const char *name, const l2l_tensor *t,
                        l2l_dtype dtype, int ndim);
/* The batch check of a (B,S,D) -> (B,S,D) kind that attends: an optional (B,S) u8 key mask. */
l2l_status layers_check_key_mask(const struct batch_check *bc);
/* Every id of an i32 field within [0, hi), or `except` (-1: ignored targets; 0: none). */
l2l_status batch_ids(const struct batch_check *bc, const char *name, const l2l_tensor *t,
                     int64_t hi, int32_t except);

/* A layer kind: one entry of the registry (registry.c). Adding a kind is its C file with
   one of these (const struct layer_kind_ops l2l_<name>_kind), one line in the registry's
   LAYER_KINDS, its number in l2l.h's l2l_layer_kind, and its entry in
   lua/l2l/layers.lua's table of kinds. */
struct layer_kind_ops {
  const char *name;
  enum layer_role role;
  /* The config fields of this kind (the shared ones, dim, init_std and dropout, are
     checked before); refusals through layers_config_fail. */
  l2l_status (*check_config)(const l2l_layer_config *c);
  /* The batch fields the kind reads (batch_tensor, batch_ids); NULL: none. */
  l2l_status (*check_batch)(const struct batch_check *bc);
  /* The dims of the output for B, S (activations by default: NULL gives (B, S, dim)). */
  int (*output_dims)(int64_t *dims, const l2l_layer *layer, const l2l_layer_batch *batch,
                     int64_t B, int64_t S);
  /* Creates the kind's parameters (layer->config already checked). */
  l2l_status (*create_params)(l2l_layer *layer);
  /* Choices a forward makes from the present parameters and the call (memory mode,
     LayerNorm fallbacks, whether dropout runs), recorded in the saved state so that its
     backward plans the same buffers. training: the batch's flag (dropout runs); logits: a
     head called without targets. */
  uint32_t (*choose_flags)(const l2l_layer *layer, bool training, bool logits);
  /* The flags the parameters' values decide (the LayerNorm guard), as they go when that
     keeps more: set these, clear those (layer_memory_bound). */
  uint32_t weights_set, weights_clear;
  /* Bytes for B, S under `flags`, params excluded: what forward and backward allocate. */
  void (*memory)(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch, int64_t seq,
                 uint32_t flags);
  /* y from x. saved NULL: inference (nothing kept); else its buffer is allocated as
     memory() says. work: work_forward bytes. */
  l2l_status (*forward)(const struct layer_call *call, l2l_layer *layer, float *y,
                        const float *x, struct l2l_saved *saved, void *work);
  /* Elements of activations that the kind's widest GEMM with a 16-bit weight reads (the
     call's cast scratch), under the call's flags; NULL: the kind has no such GEMM. */
  int64_t (*cast_elements)(const l2l_layer *layer, int64_t batch, int64_t seq, uint32_t flags);
  /* dx (NULL for the embedding) from dy (NULL for heads). work: work_backward bytes. */
  l2l_status (*backward)(const struct layer_call *call, l2l_layer *layer, float *dx,
                         const float *dy, struct l2l_saved *saved, void *work);
  /* What the layer holds of its kind beyond its parameters, let go when it is freed (a
     custom kind's functions); NULL: nothing. */
  void (*release)(l2l_layer *layer);
};

/* The config's shared fields, then its kind's (registry.c). */
l2l_status layer_check_config(const l2l_layer_config *c);
/* The registry's entry for a kind number, or NULL. */
const struct layer_kind_ops *kind_ops(l2l_layer_kind kind);
/* A kind's entry, for a live layer. */
static inline const struct layer_kind_ops *layer_kind_of(const l2l_layer *layer) {
  return kind_ops(layer->config.kind);
}

/* For a kind's check_config: L2L_ERR_INVALID "l2l_layer_new (<kind>): <message>". */
l2l_status layers_config_fail(const l2l_layer_config *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define CONFIG_NEED(cond, ...)                                     \
  do {                                                             \
    if (!(cond)) return layers_config_fail(c, __VA_ARGS__);           \
  } while (0)
#define CONFIG_SIZE(field)                                                           \
  CONFIG_NEED(c->field >= 1 && c->field <= (INT64_C(1) << 24),                       \
              #field " must be 1 to 2^24, got %lld", (long long)c->field)
#define CONFIG_FLAG(field) \
  CONFIG_NEED(c->field == 0 || c->field == 1, #field " must be 0 or 1, got %d", c->field)
/* A LayerNorm's eps (the block's, a final LayerNorm's). */
#define CONFIG_EPS() \
  CONFIG_NEED(isfinite(c->eps) && c->eps > 0, "eps must be finite and > 0, got %g", c->eps)

/* Whether the LayerNorm of these parameter roles cannot recover its x^ from its output
   y = x^ w + b to float precision (the backend's layernorm_invertible says no: a channel
   with a tiny or NaN weight, or a bias too large for it). The frugal modes then keep that
   LayerNorm the standard way (its input, mean and rstd). */
bool layers_layernorm_guarded(const l2l_layer *layer, int weight_role, int bias_role);

/* A weight as a GEMM reads it: f32, or the relay's 16-bit device copy. */
struct weight {
  const void *data;
  l2l_dtype dtype;
};
static inline struct weight layers_weight(const l2l_layer *layer, int role) {
  const l2l_tensor *v = layer->params[layer->role[role]]->value;
  return (struct weight){tensor_ptr(v), v->dtype};
}
/* An activation as a GEMM reads it: f32, or already in the 16-bit weights' dtype (the op
   that made it wrote it so, LAYER_ACTS_16: no cast). */
struct act {
  const void *data;
  l2l_dtype dtype;
};
static inline struct act act_f32(const float *data) { return (struct act){data, L2L_F32}; }
/* c = alpha op(a) op(w) + beta c for an activation a and a weight w: with a 16-bit w, an f32
   a is first rounded to w's dtype into the call's cast scratch at element `at` (the
   products then accumulate in f32, as on a GPU's tensor cores); a 16-bit a is read as it
   is (it must be w's dtype). Shapes as gemm_batched; c's rows ldc apart (0: n). */
l2l_status layers_gemm_weight(const struct layer_call *call, float *c, struct act a,
                              struct weight w, int64_t at, int64_t m, int64_t n, int64_t k,
                              int trans_a, int trans_w, float alpha, float beta, int64_t ldc);
/* a as `dtype` reads it: an f32 a rounded into the call's cast scratch at element `at` (f32:
   a itself; a 16-bit a of that dtype: itself). */
l2l_status layers_cast_activation(const struct layer_call *call, const void **out, struct act a,
                                  int64_t n, l2l_dtype dtype, int64_t at);
/* Linear maps on row-major buffers, shared by the kinds: y (n,out) = x (n,in) @ w (in,out)
   [+ bias], in one pass where the backend can (gemm_bias); with y16 given (a 16-bit w's
   dtype), y16 gets the sums rounded and y is work the backend may write. The backward
   adds x^T dy into dw and column sums of dy into db (NULL: none)
   and sets dx = dy w^T + dx_beta * dx (dx NULL: skipped). With a 16-bit w, x (unless it is
   16-bit already) and dy (unless dy16, its copy in w's dtype, is given; NULL: none) are
   rounded to its dtype first (cast scratch: dy's n * out elements, then x's n * in). dy
   may be NULL where dy16 is given: db then sums dy16 (attention's 16-bit dq, dk, dv).
   dx16 (w's dtype, NULL: none) gets dx's sums rounded, dx then being f32 work the backend
   may write (dx_beta must be 0: attention's 16-bit do). */
l2l_status layers_linear_forward(const struct layer_call *call, float *y, void *y16,
                                 struct act x, struct weight w, const float *bias, int64_t n,
                                 int64_t in, int64_t out);
l2l_status layers_linear_backward(const struct layer_call *call, float *dx, void *dx16, float *dw,
                                  float *db, const float *dy, const void *dy16, struct act x,
                                  struct weight w, int64_t n, int64_t in, int64_t out,
                                  float dx_beta);
/* Where an op writes the 16-bit copy a GEMM reads next when nothing keeps it: the cast
   scratch's start (where layers_linear_backward's dy16 is too), NULL with f32 weights. */
static inline void *layers_scratch16(const struct layer_call *call) {
  return call->precision != L2L_F32 ? call->cast : NULL;
}
/* Where an op writes an activation that a 16-bit GEMM reads next, kept in `buffer`: f32
   there (NULL when it is kept 16-bit), and its 16-bit output (NULL: none) there when kept
   16-bit, else into the call's cast scratch (element 0) when the weights are 16-bit. */
struct layers_out {
  float *f32;
  void *h16;
};
static inline struct layers_out layers_out_of(const struct layer_call *call, float *buffer,
                                              bool kept16) {
  return (struct layers_out){kept16 ? NULL : buffer,
                             kept16 ? (void *)buffer : layers_scratch16(call)};
}
/* The activation the next GEMM reads: the 16-bit output when there is one, else the f32. */
static inline struct act layers_act_of(const struct layer_call *call, struct layers_out o) {
  return o.h16 != NULL ? (struct act){o.h16, call->precision} : act_f32(o.f32);
}
/* A kept activation as later GEMMs (a backward's) read it: 16-bit when kept so. */
static inline struct act layers_kept_act(const struct layer_call *call, const void *buffer,
                                         bool kept16) {
  return kept16 ? (struct act){buffer, call->precision} : act_f32(buffer);
}
/* Marks the parameter of `role` as one the relay may bind in 16 bits (create_params). */
void layer_mark_low_precision(l2l_layer *layer, int role);

/* A layer record with no parameters yet and a fresh rng id (config already checked). */
l2l_status layer_alloc(l2l_layer **out, const l2l_layer_config *config, l2l_pool_kind pool);
/* Adds the parameter of `role` for create_params (layer.c). init: 'n' normal(0, std),
   '0' zeros, '1' ones. */
l2l_status layer_add_param(l2l_layer *layer, int role, const char *name, int ndim,
                           const int64_t *shape, char init, float std, int decays);
/* The value / gradient of a role, NULL when the layer has none. */
static inline float *param_f32(const l2l_layer *layer, int role) {
  int i = layer->role[role];
  return i < 0 ? NULL : (float *)tensor_ptr(layer->params[i]->value);
}
static inline float *layers_grad_f32(const l2l_layer *layer, int role) {
  int i = layer->role[role];
  return i < 0 ? NULL : (float *)tensor_ptr(layer->params[i]->grad);
}
static inline void *saved_base(const struct l2l_saved *s) {
  return s && s->buffer ? tensor_ptr(s->buffer) : NULL;
}

#endif /* L2L_LAYERS_KIND_H */
