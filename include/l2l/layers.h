/* SPDX-License-Identifier: MIT */
/* l2l/layers.h — a part of the public header l2l.h: layers, the units the relay runs one
 * at a time: the built-in kinds and kinds written elsewhere (custom layers).
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

/* ---------------------------------------------------------------- layers
   A layer is a self-contained unit the relay can run one at a time: its parameters, a
   forward, a backward and an exact account of what the forward keeps for the backward.
   Shapes: B samples (a micro-batch), S positions, D = dim, H heads, F = MLP width,
   V = vocab, N = B*S rows. Every layer's forward and backward run on the backend of the
   tensors passed in; the layer's parameters must live in a pool of that backend. */

typedef enum l2l_layer_kind {
  L2L_LAYER_EMBEDDING = 0,  /* tokens (B,S) -> (B,S,D) */
  L2L_LAYER_BLOCK = 1,      /* (B,S,D) -> (B,S,D) */
  L2L_LAYER_LM_HEAD = 2,    /* (B,S,D) + targets (B,S) -> per-token losses (B,S) */
  L2L_LAYER_CLASSIFIER = 3, /* (B,S,D) + targets (B) -> per-sample losses (B) */
  L2L_LAYER_CUSTOM = 4      /* (B,S,D) -> (B,S,D), written elsewhere (l2l_layer_new_custom) */
} l2l_layer_kind;

/* What a block keeps for its backward (see the README's layer section):
   standard: what a textbook backward reads: LayerNorm inputs with mean and rstd, the GELU
             input and output, the S x S attention probabilities (after softmax and after
             dropout) and dropout masks as bits.
   frugal:   strictly less, same gradients: LayerNorm output and rstd (x^ = (y - b)/w in
             backward), GELU output plus one bit per element (which side of the tanh-form
             GELU's minimum, x = -0.7525, the input was on), attention's row log-sum-exp
             instead of any S x S matrix (recomputed tile by tile in backward), no dropout
             masks (regenerated from the counter-based generator). A LayerNorm whose
             weight has a channel with |w| < 1e-6 or |w| < |b|/64, where x^ cannot be
             recovered from y to float precision, falls back to standard for that
             LayerNorm in that call. The LM head's LayerNorm follows its layer's mode too. */
typedef enum l2l_memory_mode {
  L2L_MEMORY_STANDARD = 0,
  L2L_MEMORY_FRUGAL = 1
} l2l_memory_mode;

/* Fields a kind does not use are ignored. Parameter shapes (row-major, inputs first so
   that y = x @ W):
   embedding:  wte (V,D), wpe (max_seq,D), wtt (type_vocab,D) when type_vocab > 0.
   block:      ln1.weight, ln1.bias (D); attn.qkv.weight (D,3D), attn.qkv.bias (3D) with
               columns [q | k | v], head h using columns h*D/H .. (h+1)*D/H - 1 of each;
               attn.proj.weight (D,D), attn.proj.bias (D); ln2.weight, ln2.bias (D);
               mlp.fc.weight (D,F), mlp.fc.bias (F); mlp.proj.weight (F,D), mlp.proj.bias
               (D). Biases of linear maps only when bias = 1. Pre-LN (GPT-2):
               h = x + drop(attn(ln1(x))); y = h + drop(mlp(ln2(h))). Post-LN (BERT):
               h = ln1(x + drop(attn(x))); y = ln2(h + drop(mlp(h))).
   LM head:    ln.weight, ln.bias (D) when final_ln = 1; proj.weight (V,D), logits =
               ln(x) @ proj.weight^T (no bias), unless tied to an embedding's wte.
   classifier: weight (D,C), bias (C) on the first position's features.
   Initial values: linear weights and embeddings N(0, init_std^2) (the two residual
   projections N(0, resid_std^2), e.g. init_std/sqrt(2 layers) as in GPT-2), biases 0,
   LayerNorm weights 1; drawn from (init_seed, the parameter's place in the list above),
   so layers of one kind and seed start equal. */
typedef struct l2l_layer_config {
  l2l_layer_kind kind;
  int64_t dim;           /* D */
  int64_t heads;         /* block: H, dividing D */
  int64_t mlp;           /* block: F */
  int64_t vocab;         /* embedding, LM head: V */
  int64_t max_seq;       /* embedding: positions */
  int64_t type_vocab;    /* embedding: token types (0: none) */
  int64_t classes;       /* classifier: C */
  int causal;            /* block: 1 hides later positions */
  int post_ln;           /* block: 0 pre-LN (GPT-2), 1 post-LN (BERT) */
  int bias;              /* block: 1 gives the linear maps biases */
  int final_ln;          /* LM head: 1 applies a LayerNorm before the projection */
  float dropout;         /* embedding output, both residual branches; in [0, 1) */
  float attn_dropout;    /* block: attention probabilities; in [0, 1) */
  float eps;             /* LayerNorm epsilon, > 0 */
  l2l_memory_mode memory;
  float init_std;        /* > 0 */
  float resid_std;       /* > 0 */
  uint64_t init_seed;
} l2l_layer_config;

/* A parameter record: the value, its gradient accumulator (same shape, f32) and a name.
   One record may be used by several layers (an LM head tied to the embedding): every user
   adds into the same gradient, so whoever updates the record sees their sum. */
typedef struct l2l_param l2l_param;
typedef struct l2l_layer l2l_layer;
/* What a forward kept for its backward; owned by the caller. */
typedef struct l2l_saved l2l_saved;

/* What a layer call sees beyond its input tensor. Backward must get the same batch (and
   rng fields) as the forward it undoes. Dropout draws are the Philox draws (see
   l2l_tensor_uniform) of (seed, stream, index) with
     stream = step * 2^32 + rng_id * 2^8 + site,
     index  = (first_sample + b) * E + e,
   e the element's place in sample b and E the elements per sample at that site; an
   element is kept when its draw's top 24 bits are below round((1 - p) 2^24). Sites:
   embedding 0 (output, E = S*D); block 0 (attention probabilities, E = H*S*S, e =
   (h*S + i)*S + j), 1 (attention branch, E = S*D), 2 (MLP branch, E = S*D). */
typedef struct l2l_layer_batch {
  const l2l_tensor *tokens;       /* embedding: (B,S) i32 in [0, V) */
  const l2l_tensor *token_types;  /* embedding with type_vocab > 0: (B,S) i32; else NULL */
  const l2l_tensor *targets;      /* LM head (B,S), classifier (B): i32, -1 = ignored.
                                     NULL: the head writes logits instead of losses */
  const l2l_tensor *key_mask;     /* block: (B,S) u8, 1 = real token, 0 = padding; NULL */
  int64_t first_sample;           /* index of this micro-batch's first sample, >= 0 */
  uint64_t seed;
  uint64_t step;
  int training;                   /* 0: no dropout */
  float loss_scale;               /* heads' backward: d(loss)/d(each loss), e.g.
                                     1/(real targets in the whole minibatch) */
} l2l_layer_batch;

/* Bytes a layer needs for one call on B samples of S positions (f32, this build's
   threads). The forward allocates `saved` (kept until l2l_saved_free) and `work_forward`
   (freed before it returns) from the pool of its output; the backward allocates
   `work_backward`. So beyond x, y, dy, dx and the parameters the pool holds at most
   peak = saved + max(work_forward, work_backward) during a forward and backward.
   input_kept / output_kept: bytes of x / y the saved state holds by reference (the caller
   must not change them before the backward). */
typedef struct l2l_layer_memory {
  uint64_t params;
  uint64_t saved;
  uint64_t input_kept;
  uint64_t output_kept;
  uint64_t work_forward;
  uint64_t work_backward;
  uint64_t peak;
} l2l_layer_memory;

/* A layer with freshly initialized parameters (and zero gradients) in `pool`. */
L2L_API l2l_status l2l_layer_new(l2l_layer **out, const l2l_layer_config *config, l2l_pool_kind pool);
/* The records l2l_layer_new would make for `config` (same checks, same order), without
   allocating: a loader checks a file against a description (a few bytes may describe
   terabytes) before it builds. *count: their number; out has room for `capacity`. Not
   for the custom kind (its records are its caller's list). */
typedef struct l2l_param_info { char name[L2L_PARAM_NAME_MAX]; int ndim; int64_t shape[L2L_MAX_DIMS]; int decays; } l2l_param_info;
L2L_API l2l_status l2l_layer_config_params(l2l_param_info *out, int capacity, int *count,
                                           const l2l_layer_config *config);
/* Frees the layer; one a relay holds goes on working until the relay lets it go
   (l2l_relay_remove, l2l_relay_replace, l2l_relay_free), which then frees it. */
L2L_API void l2l_layer_free(l2l_layer *layer);
/* A deep copy: new parameter records (values copied, gradients zero) and a new rng id. */
L2L_API l2l_status l2l_layer_clone(l2l_layer **out, const l2l_layer *layer);
/* The LM head's projection becomes the embedding's wte record (same D and V needed). */
L2L_API l2l_status l2l_layer_tie(l2l_layer *head, l2l_layer *embedding);
L2L_API l2l_status l2l_layer_get_config(l2l_layer_config *out, const l2l_layer *layer);
/* Switches a block between standard and frugal (parameters unchanged). */
L2L_API l2l_status l2l_layer_set_memory(l2l_layer *layer, l2l_memory_mode memory);
/* The id that keys this layer's dropout draws: unique per process by default, < 2^24. */
L2L_API uint32_t l2l_layer_rng_id(const l2l_layer *layer);
L2L_API l2l_status l2l_layer_set_rng_id(l2l_layer *layer, uint32_t rng_id);

L2L_API int l2l_layer_param_count(const l2l_layer *layer);              /* -1 if not a layer */
L2L_API l2l_param *l2l_layer_param(const l2l_layer *layer, int index);  /* NULL if out of range */
L2L_API int64_t l2l_layer_nparams(const l2l_layer *layer);              /* scalars, tied ones included */
L2L_API l2l_status l2l_layer_zero_grad(l2l_layer *layer);
L2L_API l2l_status l2l_layer_memory_use(l2l_layer_memory *out, const l2l_layer *layer,
                                        int64_t micro_batch, int64_t seq);

L2L_API const char *l2l_param_name(const l2l_param *param);
/* The value (borrowed: do not free): a relay's EPS keeps it as the record's master. Asking
   for it hands it out for good, as l2l_param_grad does the accumulator: the EPS then
   rewrites the record's 16-bit staging copy from it as each step begins (a caller may have
   written it), where otherwise its update writes that copy as it moves the master (2
   bytes a parameter instead of 6). */
L2L_API l2l_tensor *l2l_param_value(const l2l_param *param);
/* Its elements (the value's, without handing it out), -1 if not a parameter. */
L2L_API int64_t l2l_param_numel(const l2l_param *param);
/* Its dims (the value's, without handing it out) into dims (L2L_MAX_DIMS of them); returns
   their number, -1 if not a parameter or dims is NULL. */
L2L_API int l2l_param_shape(const l2l_param *param, int64_t *dims);
/* src's values into the value (its shape; f32, f16 or bf16, rounded to the value's dtype
   to nearest even or widened exactly, from either pool), without handing the value out:
   how a loader writes weights, so that a relay's EPS still writes the record's 16-bit
   staging copy as it updates. A relay holding the parameter sees the write as its next
   step begins (its staging and guard copies are made again from it). Write between
   steps, after l2l_relay_sync, as through l2l_param_value: a write while the relay's
   updates may still run races them (undefined values). L2L_ERR_STATE while a visit has
   the parameter bound to device tensors. */
L2L_API l2l_status l2l_param_write(l2l_param *param, const l2l_tensor *src);
/* The gradient accumulator (borrowed: do not free). Asking for it hands it out for good: a
   relay's EPS then reads it at each update, since the caller may write it at any time
   (a relay whose accumulators were never asked for takes one it cleared itself as zero,
   unread: 4 bytes a parameter a step). l2l_layer_backward hands out what it adds into. */
L2L_API l2l_tensor *l2l_param_grad(const l2l_param *param);
L2L_API int l2l_param_users(const l2l_param *param);            /* layers using this record */
/* 1 for the weights of linear maps (weight decay applies by default); 0 for biases,
   LayerNorm and embedding tables. */
L2L_API int l2l_param_decays(const l2l_param *param);

/* y := layer(x). x is NULL for the embedding (it reads batch->tokens); y is (B,S,D), or for
   a head the losses ((B,S) or (B)), or with batch->targets NULL the logits ((B,S,V) or
   (B,C)). saved NULL: inference, nothing kept. Otherwise *saved gets what the backward
   needs (NULL for a head called without targets). */
L2L_API l2l_status l2l_layer_forward(l2l_saved **saved, l2l_layer *layer, l2l_tensor *y,
                                     const l2l_tensor *x, const l2l_layer_batch *batch);
/* dx := d(loss)/dx (NULL for the embedding) and every parameter gradient += its share,
   given dy = d(loss)/dy (NULL for heads: batch->loss_scale is used). Consumes `saved`'s
   contents: a saved state serves one backward. */
L2L_API l2l_status l2l_layer_backward(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                      l2l_saved *saved, const l2l_layer_batch *batch);
L2L_API void l2l_saved_free(l2l_saved *saved);
L2L_API uint64_t l2l_saved_bytes(const l2l_saved *saved);   /* pool bytes it holds; 0 for NULL */

/* ---------------------------------------------------------------- layers written elsewhere
   A custom layer kind (e.g. written in Lua with l2l's ops): (B,S,D) -> (B,S,D), with
   parameter records like a built-in kind. The relay streams, stashes, recomputes and
   updates it like any block. Its forward keeps nothing but a reference to x: its backward
   gets x again and recomputes what it needs. The functions are called on the thread that
   called l2l (never on a copy or optimizer thread), with the layer's parameters bound to
   tensors in the pool of x (l2l_param_value / l2l_param_grad return those during the
   call). They return 0 on success; anything else fails the l2l call with
   L2L_ERR_BACKEND, naming the layer (the caller keeps its own message). */
typedef int (*l2l_custom_forward_fn)(void *user, l2l_layer *layer, l2l_tensor *y,
                                     const l2l_tensor *x, const l2l_layer_batch *batch);
typedef int (*l2l_custom_backward_fn)(void *user, l2l_layer *layer, l2l_tensor *dx,
                                      const l2l_tensor *dy, const l2l_tensor *x,
                                      const l2l_layer_batch *batch);
typedef struct l2l_custom_param {
  const char *name;        /* < 24 bytes */
  int ndim;
  int64_t shape[4];
  float init_std;          /* > 0: N(0, init_std^2); 0: the constant init_value */
  float init_value;
  int decays;              /* 1: weight decay applies by default */
} l2l_custom_param;
/* kind is L2L_LAYER_CUSTOM in l2l_layer_get_config; config.dim = dim. At most 12
   parameters. */
L2L_API l2l_status l2l_layer_new_custom(l2l_layer **out, const char *name, int64_t dim,
                                        const l2l_custom_param *params, int nparams,
                                        l2l_custom_forward_fn forward, l2l_custom_backward_fn backward,
                                        void *user, uint64_t init_seed, l2l_pool_kind pool);
/* The name given to l2l_layer_new_custom, or the kind's name ("block", ...). */
L2L_API const char *l2l_layer_name(const l2l_layer *layer);

/* L2L_FFI_END */
