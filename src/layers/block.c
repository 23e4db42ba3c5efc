/* SPDX-License-Identifier: MIT */
/* block.c — the transformer block: pre-LN (GPT-2) or post-LN (BERT), multi-head
 * self-attention, GELU MLP, residuals, dropout; standard or memory-frugal saved state.
 *
 * Purpose: one block as a self-contained unit for the relay, with an exact plan of every
 * buffer its forward keeps and its forward and backward use (block_plan), so that the
 * bytes reported are the bytes allocated. Both memory modes run the same code; only where
 * a buffer lives and which backward formula reads it differ:
 *                         standard                      frugal
 *   LayerNorm             input, mean, rstd             output, rstd (input if guarded)
 *   GELU                  input and output              output + 1 bit per element
 *   attention             P and P' (S x S per head)     row log-sum-exp
 *   dropout masks         bits                          none (regenerated)
 * Pre-LN:  a = ln1(x); ctx = attn(a); h = x + drop1(ctx Wp); c = ln2(h);
 *          g = gelu(c Wf); y = h + drop2(g Wf2).
 * Post-LN: ctx = attn(x); r1 = x + drop1(ctx Wp); h = ln1(r1); g = gelu(h Wf);
 *          r2 = h + drop2(g Wf2); y = ln2(r2).
 * With 16-bit weights the GEMMs' inputs that LayerNorm, GELU and attention make come from
 * those ops in 16 bits (kept so when nothing else reads them: LAYER_ACTS_16 in block_plan).
 * Accumulation: parameter gradients +=, dx written.
 * Must never: keep a buffer the plan does not list, or read one the plan put elsewhere.
 */
#include <math.h>

#include "kind.h"

enum block_param {
  LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FC2_W, FC2_B
};

enum block_flag {
  FRUGAL = 1,         /* memory mode of the forward */
  LN1_GUARDED = 2,    /* frugal, but ln1's weight cannot give x^ back: keep its input */
  LN2_GUARDED = 4,
  RESID_DROPOUT = 8,  /* training with dropout > 0 */
  ATTN_DROPOUT = 16   /* training with attn_dropout > 0 */
};

/* ---------------------------------------------------------------- parameters */

static l2l_status block_create(l2l_layer *layer) {
  const l2l_layer_config *c = &layer->config;
  int64_t d = c->dim, f = c->mlp;
  struct {
    const char *name;
    int64_t rows, cols; /* cols 0: a vector of `rows` */
    char init;
    float std;
    int decays;
  } spec[] = {
      {"ln1.weight", d, 0, '1', 0, 0},         {"ln1.bias", d, 0, '0', 0, 0},
      {"attn.qkv.weight", d, 3 * d, 'n', c->init_std, 1},
      {"attn.qkv.bias", 3 * d, 0, '0', 0, 0},
      {"attn.proj.weight", d, d, 'n', c->resid_std, 1},
      {"attn.proj.bias", d, 0, '0', 0, 0},     {"ln2.weight", d, 0, '1', 0, 0},
      {"ln2.bias", d, 0, '0', 0, 0},           {"mlp.fc.weight", d, f, 'n', c->init_std, 1},
      {"mlp.fc.bias", f, 0, '0', 0, 0},        {"mlp.proj.weight", f, d, 'n', c->resid_std, 1},
      {"mlp.proj.bias", d, 0, '0', 0, 0},
  };
  for (int role = 0; role < (int)(sizeof spec / sizeof spec[0]); role++) {
    bool linear_bias = role == QKV_B || role == PROJ_B || role == FC_B || role == FC2_B;
    if (linear_bias && !c->bias) continue;
    int64_t shape[2] = {spec[role].rows, spec[role].cols};
    TRY(layer_add_param(layer, role, spec[role].name, spec[role].cols ? 2 : 1, shape,
                        spec[role].init, spec[role].std, spec[role].decays));
    if (spec[role].cols) layer_mark_low_precision(layer, role);   /* the four GEMM weights */
  }
  return L2L_OK;
}

/* The widest linear map's x and dy: qkv (D in, 3D out) or the MLP's (D, F); the attention
   projection's backward takes 3 N D (its dy, its x, attention's 16-bit d(ctx)). */
static int64_t block_cast_elements(const l2l_layer *layer, int64_t B, int64_t S, uint32_t flags) {
  (void)flags;
  const int64_t D = layer->config.dim, F = layer->config.mlp;
  return B * S * (4 * D > D + F ? 4 * D : D + F);
}

/* ---------------------------------------------------------------- the plan */

/* Where a buffer lives: none, the saved arena, or the forward's or backward's work. */
enum where { NONE, SAVED, WORK };
struct slot {
  enum where where;
  int64_t offset;
};

/* Each buffer's shape, f32 unless said (N = B*S rows; bits: one a value, in bytes of 8;
   16: in the 16-bit weights' dtype when the plan says so), as block_plan sizes it: */
struct block_plan {
  int64_t B, S, N, D, F, H;     /* batch, sequence, rows, width, MLP width, heads */
  uint32_t flags;
  /* With 16-bit weights (LAYER_ACTS_16), the activations only their GEMMs read are kept
     in that dtype: pre-LN's LayerNorm outputs when their backward is the standard one
     (it reads the input), GELU's output in standard mode (its backward reads fc),
     attention's inputs and output (which it reads widened: the attention shape's
     qkv_dtype, o_dtype), and the gradients it reads and writes (do_dtype, dqkv_dtype). */
  bool ln1_16, ln2_16, gelu_16, ctx_16, qkv_16;
  struct arena saved, fwd, bwd;
  /* forward state */
  struct slot mean1, rstd1;     /* (N) LayerNorm 1's row statistics */
  struct slot ln1_in, ln1_out;  /* (N,D) its input (post-LN: r1) and output (16) */
  struct slot qkv;              /* (N,3D) q, k, v side by side (16) */
  struct slot qkv32;            /* (N,3D) the qkv map's f32 output, rounded into qkv (with qkv_16) */
  struct slot lse;              /* (B,H,S) each attention row's log-sum-exp */
  struct slot probs, dropped;   /* (B,H,S,S) P, and P after dropout (standard mode) */
  struct slot attn_mask;        /* (B,H,S, ceil(S/8)) u8 bits kept by attention dropout */
  struct slot ctx;              /* (N,D) attention's output before its projection (16) */
  struct slot drop1_mask;       /* (ceil(N*D/8)) u8 bits kept by the first residual dropout */
  struct slot mean2, rstd2;     /* (N) LayerNorm 2's row statistics */
  struct slot ln2_in, ln2_out;  /* (N,D) its input (pre-LN: h) and output (16) */
  struct slot fc;               /* (N,F) the MLP's first projection, before GELU */
  struct slot gelu;             /* (N,F) GELU's output (16) */
  struct slot gelu_bits;        /* (ceil(N*F/8)) u8 side bits of frugal GELU */
  struct slot drop2_mask;       /* (ceil(N*D/8)) u8 bits kept by the second residual dropout */
  struct slot scratch_d;        /* (N,D) a projection's output before the residual add */
  struct slot attn_work;        /* (attn_work_floats) attention forward's per-thread workspace */
  /* backward temporaries */
  struct slot t1, t2, t3;       /* (N,D) gradients of a row's width */
  struct slot tf;               /* (N,F) the MLP's hidden gradient */
  struct slot tqkv;             /* (N,3D) dq, dk, dv (16) */
  struct slot attn_back_work;   /* (attn_back_work_floats) attention backward's workspace */
  int64_t attn_work_floats, attn_back_work_floats;
};

static struct slot put(struct arena *a, enum where where, uint64_t bytes) {
  struct slot s = {NONE, NO_BUFFER};
  if (where == NONE || bytes == 0) return s;
  s.where = where;
  s.offset = arena_reserve(a, bytes);
  return s;
}

static void block_plan(struct block_plan *p, const l2l_layer *layer, int64_t B, int64_t S,
                       uint32_t flags) {
  const l2l_layer_config *c = &layer->config;
  const struct backend_ops *ops = backend_for(layer->pool);
  *p = (struct block_plan){.B = B, .S = S, .N = B * S, .D = c->dim, .F = c->mlp,
                           .H = c->heads, .flags = flags};
  const uint64_t f4 = sizeof(float), nd = (uint64_t)(p->N * p->D) * f4;
  const uint64_t rows = (uint64_t)p->N * f4, nf = (uint64_t)(p->N * p->F) * f4;
  const uint64_t ss = (uint64_t)(B * p->H * S) * (uint64_t)S * f4;
  const bool frugal = flags & FRUGAL, post = c->post_ln;
  const bool std1 = !frugal || (flags & LN1_GUARDED), std2 = !frugal || (flags & LN2_GUARDED);
  struct arena *sv = &p->saved, *fw = &p->fwd, *bw = &p->bwd;
  int nt = l2l_get_threads();
  const bool acts16 = flags & LAYER_ACTS_16;
  p->ln1_16 = acts16 && !post && std1;
  p->ln2_16 = acts16 && !post && std2;
  p->gelu_16 = acts16 && !frugal;
  p->ctx_16 = p->qkv_16 = acts16;

  /* LayerNorm 1: pre-LN normalizes x (the input, kept by reference when needed);
     post-LN normalizes r1 = x + drop1(...), which the forward builds. */
  p->mean1 = put(sv, std1 ? SAVED : NONE, rows);
  p->rstd1 = put(sv, SAVED, rows);
  if (post) p->ln1_in = put(sv, std1 ? SAVED : NONE, nd); /* frugal: built in ln1_out */
  p->ln1_out = put(sv, SAVED, p->ln1_16 ? nd / 2 : nd);
  p->qkv = put(sv, SAVED, p->qkv_16 ? 3 * nd / 2 : 3 * nd);
  p->qkv32 = put(fw, p->qkv_16 ? WORK : NONE, 3 * nd);
  p->lse = put(frugal ? sv : fw, frugal ? SAVED : WORK, (uint64_t)(B * p->H * S) * f4);
  p->probs = put(sv, frugal ? NONE : SAVED, ss);
  bool attn_drop = flags & ATTN_DROPOUT, resid_drop = flags & RESID_DROPOUT;
  p->dropped = put(sv, !frugal && attn_drop ? SAVED : NONE, ss);
  p->attn_mask = put(sv, !frugal && attn_drop ? SAVED : NONE,
                     (uint64_t)(B * p->H * S) * (uint64_t)((S + 7) / 8));
  p->ctx = put(sv, SAVED, p->ctx_16 ? nd / 2 : nd);
  uint64_t nd_bits = (uint64_t)(p->N * p->D + 7) / 8, nf_bits = (uint64_t)(p->N * p->F + 7) / 8;
  p->drop1_mask = put(sv, !frugal && resid_drop ? SAVED : NONE, nd_bits);
  /* LayerNorm 2: pre-LN normalizes h (built in ln2_in); post-LN normalizes r2. */
  p->mean2 = put(sv, std2 ? SAVED : NONE, rows);
  p->rstd2 = put(sv, SAVED, rows);
  if (!post) {
    p->ln2_in = std2 ? put(sv, SAVED, nd) : put(fw, WORK, nd);
    p->ln2_out = put(sv, SAVED, p->ln2_16 ? nd / 2 : nd);
  } else {
    p->ln2_in = put(sv, std2 ? SAVED : NONE, nd); /* frugal: r2 is built in y itself */
  }
  p->fc = put(sv, frugal ? NONE : SAVED, nf); /* frugal: GELU runs in place */
  p->gelu = put(sv, SAVED, p->gelu_16 ? nf / 2 : nf);
  p->gelu_bits = put(sv, frugal ? SAVED : NONE, nf_bits);
  p->drop2_mask = put(sv, !frugal && resid_drop ? SAVED : NONE, nd_bits);
  if (!post) p->scratch_d = put(fw, WORK, nd); /* the MLP branch before y = h + it */
  /* (the workspace depends on which dtypes are 16-bit, not on which 16 bits) */
  const struct backend_attention_shape ws = {
      .batch = B, .heads = p->H, .seq = S, .head_dim = p->D / p->H,
      .o_dtype = p->ctx_16 ? L2L_BF16 : L2L_F32, .qkv_dtype = p->qkv_16 ? L2L_BF16 : L2L_F32,
      .dqkv_dtype = p->qkv_16 ? L2L_BF16 : L2L_F32, .do_dtype = p->qkv_16 ? L2L_BF16 : L2L_F32};
  p->attn_work_floats = nt * ops->attention_workspace(&ws, 0);
  p->attn_back_work_floats = nt * ops->attention_workspace(&ws, 1);
  p->attn_work = put(fw, WORK, (uint64_t)p->attn_work_floats * f4);

  p->t1 = put(bw, WORK, nd);
  p->t2 = put(bw, WORK, nd);
  p->t3 = put(bw, WORK, nd);
  p->tf = put(bw, WORK, nf);
  p->tqkv = put(bw, WORK, p->qkv_16 ? 3 * nd / 2 : 3 * nd);
  p->attn_back_work = put(bw, WORK, (uint64_t)p->attn_back_work_floats * f4);
}

static uint32_t block_flags(const l2l_layer *layer, bool training, bool logits) {
  const l2l_layer_config *c = &layer->config;
  (void)logits;
  uint32_t flags = 0;
  if (training && c->dropout > 0) flags |= RESID_DROPOUT;
  if (training && c->attn_dropout > 0) flags |= ATTN_DROPOUT;
  if (c->memory == L2L_MEMORY_FRUGAL) {
    flags |= FRUGAL;
    if (layers_layernorm_guarded(layer, LN1_W, LN1_B)) flags |= LN1_GUARDED;
    if (layers_layernorm_guarded(layer, LN2_W, LN2_B)) flags |= LN2_GUARDED;
  }
  return flags;
}

static void block_memory(l2l_layer_memory *out, const l2l_layer *layer, int64_t B, int64_t S,
                         uint32_t flags) {
  struct block_plan p;
  block_plan(&p, layer, B, S, flags);
  const bool frugal = flags & FRUGAL;
  uint64_t nd = (uint64_t)(p.N * p.D) * sizeof(float);
  out->saved = p.saved.bytes;
  out->work_forward = p.fwd.bytes;
  out->work_backward = p.bwd.bytes;
  /* Pre-LN reads x only for ln1's standard backward; post-LN always (x feeds the qkv
     map). Post-LN frugal reads y = ln2's output unless ln2 is guarded. */
  bool pre_reads_x = !frugal || (flags & LN1_GUARDED);
  out->input_kept = layer->config.post_ln || pre_reads_x ? nd : 0;
  out->output_kept = layer->config.post_ln && frugal && !(flags & LN2_GUARDED) ? nd : 0;
}

/* ---------------------------------------------------------------- forward */

struct block_buffers {
  void *saved, *work;
};
static float *at(const struct block_buffers *m, struct slot s) {
  return s.where == NONE ? NULL : (float *)((char *)(s.where == SAVED ? m->saved : m->work) + s.offset);
}
#define BUF(name) at(&mem, p.name)

static const float *param(const l2l_layer *layer, int role) { return param_f32(layer, role); }

static void attention_shape(struct backend_attention_shape *sh, const struct block_plan *p,
                            const l2l_layer *layer, const struct layer_call *call) {
  const l2l_layer_batch *b = call->b;
  const l2l_layer_config *c = &layer->config;
  *sh = (struct backend_attention_shape){
      .batch = p->B, .heads = p->H, .seq = p->S, .head_dim = p->D / p->H,
      .ld_qkv = 3 * p->D, .ld_o = p->D, .causal = c->causal,
      .scale = 1.0f / sqrtf((float)(p->D / p->H)),
      .dropout = (p->flags & ATTN_DROPOUT) ? c->attn_dropout : 0.0f, .seed = b->seed,
      .stream = layers_dropout_stream(layer, b, 0), .first_sample = b->first_sample,
      .precision = call->precision, /* 16-bit weights: 16-bit attention products too */
      .o_dtype = p->ctx_16 ? call->precision : L2L_F32,
      .qkv_dtype = p->qkv_16 ? call->precision : L2L_F32,
      .dqkv_dtype = p->qkv_16 ? call->precision : L2L_F32,
      .do_dtype = p->qkv_16 ? call->precision : L2L_F32};
}

/* Element j of a row of f32s or (h16) of 16-bit values starting at base. */
static void *elem(float *base, int64_t j, bool h16) {
  return h16 ? (void *)((uint16_t *)base + j) : (void *)(base + j);
}

/* branch := drop(branch) at residual site `site` (bits: the kept mask, or NULL). The
   backward regenerates with bits NULL and branch = the incoming gradient. */
static l2l_status residual_dropout(const struct layer_call *call, const l2l_layer *layer,
                                   const struct block_plan *p, float *branch, uint8_t *bits,
                                   int site) {
  if (!(p->flags & RESID_DROPOUT)) return L2L_OK;
  const l2l_layer_batch *b = call->b;
  uint64_t per_sample = (uint64_t)(p->S * p->D);
  return call->ops->dropout_forward(branch, bits, branch, layer->config.dropout, b->seed,
                                    layers_dropout_stream(layer, b, site),
                                    (int64_t)((uint64_t)b->first_sample * per_sample), p->N * p->D);
}

/* out = LayerNorm(in) (out NULL: only its 16-bit copy out16, NULL: none). */
static l2l_status layernorm(const struct layer_call *call, const struct block_plan *p,
                            float *out, void *out16, float *mean, float *rstd, const float *in,
                            const l2l_layer *layer, int w) {
  return call->ops->layernorm_forward(out, out16, call->precision, mean, rstd, in, param(layer, w),
                                      param(layer, w + 1), layer->config.eps, p->N, p->D);
}

/* sum := a + b, then out = LayerNorm(sum) (out16 as layernorm's): one fused pass, or add
   then an in-place LayerNorm when out is sum (post-LN frugal mode keeps no separate sum). */
static l2l_status add_layernorm(const struct layer_call *call, const struct block_plan *p,
                                float *out, void *out16, float *mean, float *rstd, float *sum,
                                const float *a, const float *b, const l2l_layer *layer, int w) {
  if (out == sum) {
    TRY(call->ops->add(sum, a, b, p->N * p->D));
    return layernorm(call, p, out, out16, mean, rstd, sum, layer, w);
  }
  return call->ops->add_layernorm_forward(sum, out, out16, call->precision, mean, rstd, a, b,
                                          param(layer, w), param(layer, w + 1),
                                          layer->config.eps, p->N, p->D);
}


static l2l_status block_forward(const struct layer_call *call, l2l_layer *layer, float *y,
                                const float *x, struct l2l_saved *saved, void *work) {
  const struct backend_ops *ops = call->ops;
  const l2l_layer_config *c = &layer->config;
  struct block_plan p;
  block_plan(&p, layer, call->batch, call->seq, saved->flags);
  const uint32_t flags = saved->flags;
  struct block_buffers mem = {saved_base(saved), work};
  const int64_t N = p.N, D = p.D, F = p.F;
  const uint8_t *key_mask = call->b->key_mask ? tensor_ptr(call->b->key_mask) : NULL;
  struct backend_attention_shape sh;
  attention_shape(&sh, &p, layer, call);
  float *qkv = BUF(qkv), *ctx = BUF(ctx);

  /* attention on its input */
  struct act attn_in = act_f32(x);
  if (!c->post_ln) {
    struct layers_out ln1 = layers_out_of(call, BUF(ln1_out), p.ln1_16);
    TRY(layernorm(call, &p, ln1.f32, ln1.h16, BUF(mean1), BUF(rstd1), x, layer, LN1_W));
    attn_in = layers_act_of(call, ln1);
  }
  /* q, k, v: the map's f32 output, or kept rounded to 16 bits (the forward's work holds
     the f32 sums where the backend makes them) */
  TRY(layers_linear_forward(call, p.qkv_16 ? BUF(qkv32) : qkv, p.qkv_16 ? qkv : NULL, attn_in,
                            layers_weight(layer, QKV_W), param(layer, QKV_B), N, D, 3 * D));
  TRY(ops->attention_forward(ctx, BUF(lse), BUF(probs), BUF(dropped), (uint8_t *)BUF(attn_mask),
                             qkv, elem(qkv, D, p.qkv_16), elem(qkv, 2 * D, p.qkv_16), key_mask,
                             &sh, BUF(attn_work), p.attn_work_floats));
  /* first residual: r = x + drop1(ctx Wp) */
  float *r1 = c->post_ln ? (BUF(ln1_in) ? BUF(ln1_in) : BUF(ln1_out)) : BUF(ln2_in);
  TRY(layers_linear_forward(call, r1, NULL, layers_kept_act(call, ctx, p.ctx_16), layers_weight(layer, PROJ_W),
                            param(layer, PROJ_B), N, D, D));
  TRY(residual_dropout(call, layer, &p, r1, (uint8_t *)BUF(drop1_mask), 1));
  struct act mlp_in;
  const float *h = NULL; /* post-LN: the MLP's input, which the second residual adds */
  if (c->post_ln) { /* h = ln1(r1), in place when frugal keeps no r1 */
    struct layers_out ln1 = layers_out_of(call, BUF(ln1_out), false);
    TRY(add_layernorm(call, &p, ln1.f32, ln1.h16, BUF(mean1), BUF(rstd1), r1, r1, x, layer, LN1_W));
    mlp_in = layers_act_of(call, ln1);
    h = ln1.f32;
  } else {
    struct layers_out ln2 = layers_out_of(call, BUF(ln2_out), p.ln2_16);
    TRY(add_layernorm(call, &p, ln2.f32, ln2.h16, BUF(mean2), BUF(rstd2), r1, r1, x, layer, LN2_W));
    mlp_in = layers_act_of(call, ln2);
  }
  /* MLP: the bias and GELU (and frugal mode's side bits) in one pass after the GEMM */
  float *fc = BUF(fc) ? BUF(fc) : BUF(gelu);
  struct layers_out g = layers_out_of(call, BUF(gelu), p.gelu_16);
  uint8_t *side_bits = flags & FRUGAL ? (uint8_t *)BUF(gelu_bits) : NULL;
  TRY(layers_linear_forward(call, fc, NULL, mlp_in, layers_weight(layer, FC_W), NULL, N, D, F));
  TRY(ops->bias_gelu_forward(fc, g.f32, g.h16, call->precision, side_bits, param(layer, FC_B),
                             N, F));
  struct act g_in = layers_act_of(call, g);
  if (c->post_ln) { /* y = ln2(r2), r2 = h + drop2(g Wf2), built in y when not kept */
    float *r2 = BUF(ln2_in) ? BUF(ln2_in) : y;
    TRY(layers_linear_forward(call, r2, NULL, g_in, layers_weight(layer, FC2_W), param(layer, FC2_B), N, F, D));
    TRY(residual_dropout(call, layer, &p, r2, (uint8_t *)BUF(drop2_mask), 2));
    TRY(add_layernorm(call, &p, y, NULL, BUF(mean2), BUF(rstd2), r2, r2, h, layer, LN2_W));
  } else { /* y = h + drop2(g Wf2) */
    float *m = BUF(scratch_d);
    TRY(layers_linear_forward(call, m, NULL, g_in, layers_weight(layer, FC2_W), param(layer, FC2_B), N, F, D));
    TRY(residual_dropout(call, layer, &p, m, (uint8_t *)BUF(drop2_mask), 2));
    TRY(ops->add(y, r1, m, N * D));
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- backward */

/* out := d(branch) given d(drop(branch)) = in at residual site `site`: the kept bits, or
   (frugal) the same draws again. Without dropout, returns `in` itself. */
static l2l_status residual_dropout_backward(const float **out, float *dst,
                                            const struct layer_call *call,
                                            const l2l_layer *layer, const struct block_plan *p,
                                            const float *in, const uint8_t *bits, int site) {
  if (!(p->flags & RESID_DROPOUT)) {
    *out = in;
    return L2L_OK;
  }
  *out = dst;
  float rate = layer->config.dropout;
  if (bits) return call->ops->dropout_backward(dst, in, bits, rate, p->N * p->D);
  const l2l_layer_batch *b = call->b;
  /* the forward's first draw (residual_dropout): in uint64, as first_sample may be huge */
  uint64_t per_sample = (uint64_t)(p->S * p->D);
  return call->ops->dropout_forward(dst, NULL, in, rate, b->seed, layers_dropout_stream(layer, b, site),
                                    (int64_t)((uint64_t)b->first_sample * per_sample), p->N * p->D);
}

/* dx := LayerNorm backward of dy [+ residual, NULL: none], and dx16 its 16-bit copy
   (NULL: none), from the input (kept) or from the output (frugal). */
static l2l_status layernorm_backward(const struct layer_call *call, const struct block_plan *p,
                                     l2l_layer *layer, int w, float *dx, void *dx16,
                                     const float *dy, const float *residual, const float *in,
                                     const float *mean, const float *out, const float *rstd) {
  float *dw = layers_grad_f32(layer, w), *db = layers_grad_f32(layer, w + 1);
  if (mean) /* the standard path, also frugal's guarded LayerNorm */
    return call->ops->layernorm_backward(dx, dx16, call->precision, dw, db, dy, residual, in,
                                         param(layer, w), mean, rstd, p->N, p->D);
  return call->ops->layernorm_backward_from_output(dx, dx16, call->precision, dw, db, dy,
                                                   residual, out, param(layer, w),
                                                   param(layer, w + 1), rstd, p->N, p->D);
}

static float *grad(const l2l_layer *layer, int role) { return layers_grad_f32(layer, role); }

/* The MLP's backward: dh := d(mlp input) from dm = d(mlp output); in: the MLP's input. */
static l2l_status mlp_backward(const struct layer_call *call, const struct block_plan *p,
                               l2l_layer *layer, const struct block_buffers *m, float *dh,
                               const float *dm, struct act in) {
  const struct backend_ops *ops = call->ops;
  const int64_t N = p->N, D = p->D, F = p->F;
  float *df = at(m, p->tf);
  const float *g = at(m, p->gelu);   /* (f32 in frugal mode, the one that reads it) */
  TRY(layers_linear_backward(call, df, NULL, grad(layer, FC2_W), grad(layer, FC2_B), dm, NULL,
                             layers_kept_act(call, g, p->gelu_16), layers_weight(layer, FC2_W), N, F,
                             D, 0.0f));
  /* d(fc): in f32 (in place of d(gelu)), or with 16-bit weights in 16 bits alone, which
     the GEMMs below read and its bias's gradient sums */
  void *df16 = layers_scratch16(call);
  float *df32 = df16 ? NULL : df;
  if (p->flags & FRUGAL)
    TRY(ops->gelu_backward_from_output(df32, df16, call->precision, df, g,
                                       (const uint8_t *)at(m, p->gelu_bits), N * F));
  else
    TRY(ops->gelu_backward(df32, df16, call->precision, df, at(m, p->fc), N * F));
  return layers_linear_backward(call, dh, NULL, grad(layer, FC_W), grad(layer, FC_B), df32, df16, in,
                                layers_weight(layer, FC_W), N, D, F, 0.0f);
}

/* The attention branch's backward: da := d(attention input) from dz = d(ctx Wp + bp) (and
   dz16, its 16-bit copy, or NULL). */
static l2l_status attention_branch_backward(const struct layer_call *call,
                                            const struct block_plan *p, l2l_layer *layer,
                                            const struct block_buffers *m, float *da,
                                            const float *dz, const void *dz16, struct act in) {
  const struct backend_ops *ops = call->ops;
  const int64_t N = p->N, D = p->D;
  float *dctx = at(m, p->t3), *dqkv = at(m, p->tqkv), *qkv = at(m, p->qkv), *ctx = at(m, p->ctx);
  const bool h16 = p->qkv_16;   /* q, k, v, dq, dk, dv and d(ctx) in 16 bits */
  /* d(ctx) in 16 bits in the cast scratch past dz's and ctx's (3 N D halves of its 4 N D at
     least: block_cast_elements) */
  void *dctx16 = h16 ? (uint16_t *)call->cast + 2 * N * D : NULL;
  TRY(layers_linear_backward(call, dctx, dctx16, grad(layer, PROJ_W), grad(layer, PROJ_B), dz, dz16,
                             layers_kept_act(call, ctx, p->ctx_16), layers_weight(layer, PROJ_W), N,
                             D, D, 0.0f));
  struct backend_attention_shape sh;
  attention_shape(&sh, p, layer, call);
  const uint8_t *key_mask = call->b->key_mask ? tensor_ptr(call->b->key_mask) : NULL;
  TRY(ops->attention_backward(dqkv, elem(dqkv, D, h16), elem(dqkv, 2 * D, h16),
                              h16 ? dctx16 : (void *)dctx, ctx,
                              at(m, p->lse), at(m, p->probs), at(m, p->dropped),
                              (const uint8_t *)at(m, p->attn_mask), qkv, elem(qkv, D, h16),
                              elem(qkv, 2 * D, h16), key_mask, &sh, at(m, p->attn_back_work),
                              p->attn_back_work_floats));
  /* (16-bit dq, dk, dv: the map's GEMMs read them as they are, its bias sums them) */
  return layers_linear_backward(call, da, NULL, grad(layer, QKV_W), grad(layer, QKV_B),
                                h16 ? NULL : dqkv, h16 ? dqkv : NULL, in,
                                layers_weight(layer, QKV_W), N, D, 3 * D, 0.0f);
}

static l2l_status block_backward(const struct layer_call *call, l2l_layer *layer, float *dx,
                                 const float *dy, struct l2l_saved *saved, void *work) {
  const struct backend_ops *ops = call->ops;
  struct block_plan p;
  block_plan(&p, layer, call->batch, call->seq, saved->flags);
  struct block_buffers mem = {saved_base(saved), work};
  const int64_t N = p.N, D = p.D;
  const float *x = saved->input ? tensor_ptr(saved->input) : NULL;
  float *t1 = BUF(t1), *t2 = BUF(t2), *t3 = BUF(t3);
  const float *dm, *dz;
  if (!layer->config.post_ln) {
    TRY(residual_dropout_backward(&dm, t1, call, layer, &p, dy, (uint8_t *)BUF(drop2_mask), 2));
    TRY(mlp_backward(call, &p, layer, &mem, t3, dm, layers_kept_act(call, BUF(ln2_out), p.ln2_16)));
    /* dh = ln2'(dc) + dy in one pass, and with no dropout between, dz = dh in 16 bits too
       for the projection's GEMMs (the cast scratch is free until they read it) */
    void *dz16 = p.flags & RESID_DROPOUT ? NULL : layers_scratch16(call);
    TRY(layernorm_backward(call, &p, layer, LN2_W, t2, dz16, t3, dy, BUF(ln2_in), BUF(mean2),
                           BUF(ln2_out), BUF(rstd2)));
    TRY(residual_dropout_backward(&dz, t1, call, layer, &p, t2, (uint8_t *)BUF(drop1_mask), 1));
    TRY(attention_branch_backward(call, &p, layer, &mem, t1, dz, dz16,
                                  layers_kept_act(call, BUF(ln1_out), p.ln1_16)));
    /* dx = ln1'(da) + dh, in one pass */
    return layernorm_backward(call, &p, layer, LN1_W, dx, NULL, t1, t2, x, BUF(mean1),
                              BUF(ln1_out), BUF(rstd1));
  }
  const float *y = saved->output ? tensor_ptr(saved->output) : NULL;
  /* dr2 = ln2'(dy); dh = mlp'(drop2'(dr2)) + dr2 */
  TRY(layernorm_backward(call, &p, layer, LN2_W, t1, NULL, dy, NULL, BUF(ln2_in), BUF(mean2), y,
                         BUF(rstd2)));
  TRY(residual_dropout_backward(&dm, t2, call, layer, &p, t1, (uint8_t *)BUF(drop2_mask), 2));
  TRY(mlp_backward(call, &p, layer, &mem, t3, dm, act_f32(BUF(ln1_out))));
  TRY(ops->add(t3, t3, t1, N * D));
  /* dr1 = ln1'(dh); dx = attn'(drop1'(dr1)) + dr1 */
  TRY(layernorm_backward(call, &p, layer, LN1_W, t1, NULL, t3, NULL, BUF(ln1_in), BUF(mean1),
                         BUF(ln1_out), BUF(rstd1)));
  TRY(residual_dropout_backward(&dz, t2, call, layer, &p, t1, (uint8_t *)BUF(drop1_mask), 1));
  TRY(attention_branch_backward(call, &p, layer, &mem, dx, dz, NULL, act_f32(x)));
  return ops->add(dx, dx, t1, N * D);
}

static l2l_status block_check_config(const l2l_layer_config *c) {
  CONFIG_SIZE(heads);
  CONFIG_SIZE(mlp);
  CONFIG_NEED(c->dim % c->heads == 0, "heads (%lld) must divide dim (%lld)", (long long)c->heads,
              (long long)c->dim);
  CONFIG_FLAG(causal);
  CONFIG_FLAG(post_ln);
  CONFIG_FLAG(bias);
  CONFIG_NEED(c->memory == L2L_MEMORY_STANDARD || c->memory == L2L_MEMORY_FRUGAL,
              "memory must be standard (0) or frugal (1), got %d", c->memory);
  CONFIG_NEED(isfinite(c->attn_dropout) && c->attn_dropout >= 0 && c->attn_dropout < 1,
              "attn_dropout must be in [0, 1), got %g", c->attn_dropout);
  CONFIG_NEED(isfinite(c->resid_std) && c->resid_std > 0,
              "resid_std must be finite and > 0, got %g", c->resid_std);
  CONFIG_EPS();
  return L2L_OK;
}

const struct layer_kind_ops layers_block_kind = {
    .name = "block",
    .role = L2L_ROLE_BODY,
    .check_config = block_check_config,
    .check_batch = layers_check_key_mask,
    .create_params = block_create,
    .choose_flags = block_flags,
    .weights_set = LN1_GUARDED | LN2_GUARDED,
    .cast_elements = block_cast_elements,
    .memory = block_memory,
    .forward = block_forward,
    .backward = block_backward,
};
