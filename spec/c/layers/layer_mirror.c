/* SPDX-License-Identifier: MIT */
/* layer_mirror.c — the layer tests' harness (layer_mirror.h): each kind's float64 mirror,
 * written here from the formulas in l2l.h, and what a layer call is checked against it
 * with.
 *
 * How: the mirror reads the layer's parameter values through l2l_param_value, its dropout
 * masks come from l2l_philox4x32 by the header's formula (test_layers.c proves it equal to
 * l2l_dropout_forward's), and a loss L = sum(w .* y) with random w (heads: loss_scale *
 * sum of the losses) gives every gradient by central differences in double.
 * Must never: take an expected value from the library's layer code. The one fact taken
 * from below l2l.h is how a Philox draw index maps to counter and word (src/core/rng.c,
 * the layout l2l.h's "see l2l_tensor_uniform" points to).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_mirror.h"

double rms(const double *v, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
  return n > 0 ? sqrt(s / (double)n) : 0.0;
}

bool layer_refused_at(l2l_status got, l2l_status want, const char *needle, const char *file,
                      int line, const char *expr) {
  const char *msg = l2l_last_error();
  return check_that(got == want && msg[0] != '\0' && strstr(msg, needle) != NULL, file, line,
                    expr, "want status %d with a message naming \"%s\", got %d: \"%s\"", want,
                    needle, got, msg);
}

/* ---------------------------------------------------------------- dropout draws */

/* The header's stream of a layer call's dropout site. */
uint64_t dropout_stream(uint64_t step, uint32_t rng_id, int site) {
  return (step << 32) + ((uint64_t)rng_id << 8) + (uint64_t)site;
}

/* Whether draw `index` of (seed, stream) keeps its element at drop probability p: the
   draw is word index%4 of Philox4x32-10 at counter (index/4 as 64 bits, stream as 64
   bits) under key seed (src/core/rng.c's layout behind l2l_tensor_uniform), kept when its top
   24 bits are below round((1 - p) 2^24) (l2l.h, layer batch). */
bool ref_kept(uint64_t seed, uint64_t stream, uint64_t index, float p) {
  uint64_t block = index >> 2;
  uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                         (uint32_t)(stream >> 32)};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, word[4] = {0, 0, 0, 0};
  l2l_philox4x32(word, counter, key);
  return (word[index & 3] >> 8) < (uint32_t)llround((1.0 - (double)p) * 16777216.0);
}

/* Inverted-dropout scales (0 or 1/(1-p)) of n consecutive draws from `first`: one site
   of a micro-batch, whose sample b, element e draws (first_sample + b) E + e, so the
   whole site is the run of B E draws from first_sample E. */
static double *ref_dropout_scales(uint64_t seed, uint64_t stream, uint64_t first, int64_t n,
                                  float p) {
  double *s = doubles(n);
  for (int64_t i = 0; i < n; i++)
    s[i] = ref_kept(seed, stream, first + (uint64_t)i, p) ? 1.0 / (1.0 - (double)p) : 0.0;
  return s;
}


/* ---------------------------------------------------------------- parameters */


int expected_params(struct expected *e, const l2l_layer_config *c) {
  int n = 0;
  int64_t D = c->dim;
#define WANT(nm, nd, a, b, in, dec) (e[n++] = (struct expected){(nm), (nd), (a), (b), (in), (dec)})
  switch (c->kind) {
    case L2L_LAYER_EMBEDDING:
      WANT("wte", 2, c->vocab, D, 'n', 0);
      WANT("wpe", 2, c->max_seq, D, 'n', 0);
      if (c->type_vocab > 0) WANT("wtt", 2, c->type_vocab, D, 'n', 0);
      break;
    case L2L_LAYER_BLOCK:
      WANT("ln1.weight", 1, D, 0, '1', 0);
      WANT("ln1.bias", 1, D, 0, '0', 0);
      WANT("attn.qkv.weight", 2, D, 3 * D, 'n', 1);
      if (c->bias) WANT("attn.qkv.bias", 1, 3 * D, 0, '0', 0);
      WANT("attn.proj.weight", 2, D, D, 'r', 1);
      if (c->bias) WANT("attn.proj.bias", 1, D, 0, '0', 0);
      WANT("ln2.weight", 1, D, 0, '1', 0);
      WANT("ln2.bias", 1, D, 0, '0', 0);
      WANT("mlp.fc.weight", 2, D, c->mlp, 'n', 1);
      if (c->bias) WANT("mlp.fc.bias", 1, c->mlp, 0, '0', 0);
      WANT("mlp.proj.weight", 2, c->mlp, D, 'r', 1);
      if (c->bias) WANT("mlp.proj.bias", 1, D, 0, '0', 0);
      break;
    case L2L_LAYER_LM_HEAD:
      if (c->final_ln) {
        WANT("ln.weight", 1, D, 0, '1', 0);
        WANT("ln.bias", 1, D, 0, '0', 0);
      }
      WANT("proj.weight", 2, c->vocab, D, 'n', 1);
      break;
    case L2L_LAYER_CLASSIFIER:
      WANT("weight", 2, D, c->classes, 'n', 1);
      WANT("bias", 1, c->classes, 0, '0', 0);
      break;
    case L2L_LAYER_CUSTOM: break;   /* not made by these tests */
  }
#undef WANT
  return n;
}

bool has_shape(const l2l_tensor *t, const struct expected *e) {
  return t != NULL && l2l_tensor_dtype(t) == L2L_F32 && l2l_tensor_ndim(t) == e->ndim &&
         l2l_tensor_dim(t, 0) == e->d0 && (e->ndim == 1 || l2l_tensor_dim(t, 1) == e->d1);
}

l2l_param *find_param(const l2l_layer *layer, const char *name) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    l2l_param *p = l2l_layer_param(layer, i);
    const char *pn = l2l_param_name(p);
    if (pn != NULL && strcmp(pn, name) == 0) return p;
  }
  return NULL;
}

l2l_layer_config base_config(l2l_layer_kind kind) {
  l2l_layer_config c = default_layer_config(kind);
  c.dim = 12;
  c.heads = 2;
  c.mlp = 20;
  c.vocab = 11;
  c.max_seq = 9;
  c.classes = 5;
  return c;
}

/* A new layer, or NULL after a failed check. */
l2l_layer *new_layer(const l2l_layer_config *c, l2l_pool_kind pool) {
  l2l_layer *layer = NULL;
  if (!CHECK_OK(l2l_layer_new(&layer, c, pool))) return NULL;
  return layer;
}

/* Inputs for `layer` on B samples of S positions: random x and dy, NaN y and dx, tokens
   with a repeated id (embedding scatter-adds must sum), targets with ignored ones, and a
   key mask (when asked) where sample 0 is whole, sample 1 loses a random tail and any
   further sample is all padding, so that its query rows see no key at all. The batch
   draws from a random seed, step, first sample and rng id, so that every term of the
   stream and index formulas counts. */
void run_init(struct run *r, l2l_layer *layer, int64_t B, int64_t S, l2l_pool_kind pool,
              int masked) {
  memset(r, 0, sizeof *r);
  l2l_layer_config c;
  CHECK_OK(l2l_layer_get_config(&c, layer));
  int64_t D = c.dim;
  r->layer = layer;
  r->B = B, r->S = S;
  switch (c.kind) {
    case L2L_LAYER_EMBEDDING: {
      r->tokens = random_ids(NEW(pool, L2L_I32, B, S), 0, c.vocab - 1);
      int32_t *tok = l2l_tensor_data(r->tokens);
      tok[S * B - 1] = tok[0];
      if (c.type_vocab > 0) r->types = random_ids(NEW(pool, L2L_I32, B, S), 0, c.type_vocab - 1);
      r->y = NEW(pool, L2L_F32, B, S, D);
      r->dy = fill_normal(NEW(pool, L2L_F32, B, S, D), 1.0);
      break;
    }
    case L2L_LAYER_BLOCK:
      r->y = NEW(pool, L2L_F32, B, S, D);
      r->dy = fill_normal(NEW(pool, L2L_F32, B, S, D), 1.0);
      r->dx = NEW(pool, L2L_F32, B, S, D);
      if (masked) {
        r->key_mask = NEW(pool, L2L_U8, B, S);
        uint8_t *m = l2l_tensor_data(r->key_mask);
        for (int64_t b = 0; b < B; b++) {
          int64_t len = b == 0 ? S : b == 1 ? check_rand_int(1, S - 1) : 0;
          for (int64_t s = 0; s < S; s++) m[b * S + s] = s < len;
        }
      }
      break;
    case L2L_LAYER_LM_HEAD: {
      r->targets = random_ids(NEW(pool, L2L_I32, B, S), 0, c.vocab - 1);
      int32_t *t = l2l_tensor_data(r->targets);
      for (int64_t i = 0; i < B * S; i++)
        if (check_rand_int(0, 3) == 0) t[i] = -1;
      t[0] = -1;
      r->y = NEW(pool, L2L_F32, B, S);
      r->dx = NEW(pool, L2L_F32, B, S, D);
      break;
    }
    case L2L_LAYER_CLASSIFIER: {
      r->targets = NEW(pool, L2L_I32, B);
      int32_t *t = l2l_tensor_data(r->targets);
      for (int64_t b = 0; b < B; b++)
        t[b] = b == 1 ? -1 : (int32_t)check_rand_int(0, c.classes - 1);
      r->y = NEW(pool, L2L_F32, B);
      r->dx = NEW(pool, L2L_F32, B, S, D);
      break;
    }
    case L2L_LAYER_CUSTOM: break;   /* not made by these tests */
  }
  if (c.kind != L2L_LAYER_EMBEDDING) r->x = fill_normal(NEW(pool, L2L_F32, B, S, D), 1.0);
  r->batch.tokens = r->tokens;
  r->batch.token_types = r->types;
  r->batch.targets = r->targets;
  r->batch.key_mask = r->key_mask;
  r->batch.first_sample = check_rand_int(0, 4000);
  r->batch.seed = check_rand_u64();
  r->batch.step = (uint64_t)check_rand_int(0, 1 << 20);
  r->batch.training = 1;
  r->batch.loss_scale = (float)check_rand_uniform(0.05, 0.5);
  CHECK_OK(l2l_layer_set_rng_id(layer, (uint32_t)check_rand_int(1, (1 << 24) - 1)));
}

void run_free(struct run *r) {
  FREE(r->x, r->y, r->dy, r->dx, r->tokens, r->types, r->targets, r->key_mask);
}

/* ---------------------------------------------------------------- the float64 mirror */

/* A layer in double: copies of its parameter values and input, the call's ids and masks,
   and the dropout scales of each site (NULL: nothing dropped). */
struct mirror {
  l2l_layer_config cfg;
  int64_t B, S;
  int np;
  const char *role[MAX_PARAMS];
  l2l_param *param[MAX_PARAMS];
  double *val[MAX_PARAMS];
  int64_t n[MAX_PARAMS];
  double *x; /* (B,S,D); NULL for the embedding */
  int64_t nx;
  const int32_t *tokens, *types, *targets;
  const uint8_t *key_mask;
  double *drop[3];
  double *w;  /* L = sum(w .* y); NULL for heads: L = loss_scale * sum(losses) */
  double loss_scale;
  double *y;  /* the last ref_forward's output */
  int64_t ny;
};

static const double *pv(const struct mirror *m, const char *role) {
  for (int i = 0; i < m->np; i++)
    if (strcmp(m->role[i], role) == 0) return m->val[i];
  return NULL;
}

static void mirror_set_dropout(struct mirror *m, const l2l_layer_batch *batch, uint32_t rng_id) {
  for (int k = 0; k < 3; k++) free(m->drop[k]), m->drop[k] = NULL;
  if (!batch->training) return;
  const l2l_layer_config *c = &m->cfg;
  int64_t B = m->B, S = m->S, D = c->dim, H = c->heads;
  uint64_t first = (uint64_t)batch->first_sample;
  if (c->kind == L2L_LAYER_EMBEDDING && c->dropout > 0.0f)
    m->drop[0] = ref_dropout_scales(batch->seed, dropout_stream(batch->step, rng_id, 0),
                                    first * (uint64_t)(S * D), B * S * D, c->dropout);
  if (c->kind != L2L_LAYER_BLOCK) return;
  if (c->attn_dropout > 0.0f)
    m->drop[0] = ref_dropout_scales(batch->seed, dropout_stream(batch->step, rng_id, 0),
                                    first * (uint64_t)(H * S * S), B * H * S * S, c->attn_dropout);
  for (int site = 1; site <= 2 && c->dropout > 0.0f; site++)
    m->drop[site] = ref_dropout_scales(batch->seed, dropout_stream(batch->step, rng_id, site),
                                       first * (uint64_t)(S * D), B * S * D, c->dropout);
}

/* Elements in the output: (B,S,D) for the embedding and block; losses (B,S) or (B) for the
   heads with targets, logits (B,S,V) or (B,C) without. */
static int64_t mirror_outputs(const struct mirror *m) {
  const l2l_layer_config *c = &m->cfg;
  switch (c->kind) {
    case L2L_LAYER_LM_HEAD: return m->B * m->S * (m->targets ? 1 : c->vocab);
    case L2L_LAYER_CLASSIFIER: return m->B * (m->targets ? 1 : c->classes);
    default: return m->B * m->S * c->dim;
  }
}

static void mirror_free(struct mirror *m) {
  for (int i = 0; i < m->np; i++) free(m->val[i]);
  for (int k = 0; k < 3; k++) free(m->drop[k]);
  free(m->x);
  free(m->w);
  free(m->y);
  memset(m, 0, sizeof *m);
}

/* The mirror of r's call. False (after a failed check) when the layer lacks a parameter
   the header promises, or has others besides: every parameter tensor must be checked. */
static bool mirror_load(struct mirror *m, const struct run *r) {
  memset(m, 0, sizeof *m);
  if (!CHECK_OK(l2l_layer_get_config(&m->cfg, r->layer))) return false;
  m->B = r->B, m->S = r->S;
  struct expected e[MAX_PARAMS];
  int ne = expected_params(e, &m->cfg);
  if (!CHECK(l2l_layer_param_count(r->layer) == ne, "the layer has %d parameters, the header "
             "promises %d", l2l_layer_param_count(r->layer), ne))
    return false;
  for (int i = 0; i < ne; i++) {
    bool tied = r->tied && strcmp(e[i].name, "proj.weight") == 0;
    l2l_param *p = tied ? r->tied : find_param(r->layer, e[i].name);
    if (!CHECK(p != NULL && has_shape(l2l_param_value(p), &e[i]) &&
               has_shape(l2l_param_grad(p), &e[i]),
        "parameter %s is missing, or its value or gradient is not f32 (%lld x %lld, "
        "second dim only for 2-D)", e[i].name, (long long)e[i].d0, (long long)e[i].d1))
      return false;
    m->role[i] = e[i].name;
    m->param[i] = p;
    m->val[i] = to_doubles(check_data(l2l_param_value(p)), numel(l2l_param_value(p)));
    m->n[i] = numel(l2l_param_value(p));
    m->np = i + 1;
  }
  if (r->x) m->x = to_doubles(check_data(r->x), numel(r->x)), m->nx = numel(r->x);
  if (r->dy) m->w = to_doubles(check_data(r->dy), numel(r->dy));
  m->tokens = r->tokens ? l2l_tensor_data(r->tokens) : NULL;
  m->types = r->types ? l2l_tensor_data(r->types) : NULL;
  m->targets = r->targets ? l2l_tensor_data(r->targets) : NULL;
  m->key_mask = r->key_mask ? l2l_tensor_data(r->key_mask) : NULL;
  m->loss_scale = r->batch.loss_scale;
  mirror_set_dropout(m, &r->batch, l2l_layer_rng_id(r->layer));
  const l2l_layer_config *c = &m->cfg;
  int64_t widest = c->kind == L2L_LAYER_LM_HEAD      ? c->vocab
            : c->kind == L2L_LAYER_CLASSIFIER ? c->classes
                                              : c->dim;
  m->y = doubles(m->B * m->S * widest);
  return true;
}

/* y = (x - mean) / sqrt(var + eps) * w + b per row, biased variance. */
static void ref_layernorm(double *y, const double *x, const double *w, const double *b,
                   int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d;
    double mean = 0.0, var = 0.0;
    for (int64_t c = 0; c < d; c++) mean += xr[c];
    mean /= (double)d;
    for (int64_t c = 0; c < d; c++) var += (xr[c] - mean) * (xr[c] - mean);
    var /= (double)d;
    double rstd = 1.0 / sqrt(var + eps);
    for (int64_t c = 0; c < d; c++) y[r * d + c] = (xr[c] - mean) * rstd * w[c] + b[c];
  }
}

/* y (rows,out) = x (rows,in) @ w (in,out) + bias (out; NULL for none). */
static void ref_linear(double *y, const double *x, const double *w, const double *bias,
                       int64_t rows, int64_t in, int64_t out) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t o = 0; o < out; o++) {
      double acc = bias ? bias[o] : 0.0;
      for (int64_t i = 0; i < in; i++) acc += x[r * in + i] * w[i * out + o];
      y[r * out + o] = acc;
    }
}

static void scale_by(double *v, const double *scales, int64_t n) {
  if (scales)
    for (int64_t i = 0; i < n; i++) v[i] *= scales[i];
}

/* o (B,S,D) from qkv (B,S,3D): per sample and head, softmax of q k^T / sqrt(D/H) over the
   keys a query may see (causal: j <= i; key mask: real keys), all zeros for a query that
   sees none, then attention dropout on those probabilities, times v; heads side by side
   in head order. */
static void ref_attention(double *o, const double *qkv, const struct mirror *m) {
  const l2l_layer_config *c = &m->cfg;
  int64_t B = m->B, S = m->S, D = c->dim, H = c->heads, dh = D / H;
  double scale = 1.0 / sqrt((double)dh);
  double *p = doubles(S);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < S; i++) {
        const double *q = qkv + (b * S + i) * 3 * D + h * dh;
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
          bool seen = !(c->causal && j > i) && !(m->key_mask && m->key_mask[b * S + j] == 0);
          p[j] = -INFINITY;
          if (!seen) continue;
          const double *k = qkv + (b * S + j) * 3 * D + D + h * dh;
          double s = 0.0;
          for (int64_t t = 0; t < dh; t++) s += q[t] * k[t];
          p[j] = s * scale;
          mx = fmax(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < S; j++) {
          p[j] = mx == -INFINITY || p[j] == -INFINITY ? 0.0 : exp(p[j] - mx);
          sum += p[j];
        }
        for (int64_t j = 0; j < S; j++) {
          if (sum > 0.0) p[j] /= sum;
          if (m->drop[0]) p[j] *= m->drop[0][((b * H + h) * S + i) * S + j];
        }
        for (int64_t t = 0; t < dh; t++) {
          double acc = 0.0;
          for (int64_t j = 0; j < S; j++)
            acc += p[j] * qkv[(b * S + j) * 3 * D + 2 * D + h * dh + t];
          o[(b * S + i) * D + h * dh + t] = acc;
        }
      }
  free(p);
}

/* Pre-LN:  h = x + drop(attn(ln1(x)));  y = h + drop(mlp(ln2(h))).
   Post-LN: h = ln1(x + drop(attn(x)));  y = ln2(h + drop(mlp(h))).
   attn(a) = attention(a @ qkv.weight + qkv.bias) @ proj.weight + proj.bias;
   mlp(a) = gelu(a @ fc.weight + fc.bias) @ proj.weight + proj.bias. */
static void ref_block(struct mirror *m) {
  const l2l_layer_config *c = &m->cfg;
  int64_t N = m->B * m->S, D = c->dim, F = c->mlp;
  double eps = c->eps;
  double *a = doubles(N * D), *qkv = doubles(N * 3 * D), *o = doubles(N * D), *h = doubles(N * D);
  double *u = doubles(N * F), *z = doubles(N * D);
  const double *x = m->x;
  if (c->post_ln) {
    ref_linear(qkv, x, pv(m, "attn.qkv.weight"), pv(m, "attn.qkv.bias"), N, D, 3 * D);
  } else {
    ref_layernorm(a, x, pv(m, "ln1.weight"), pv(m, "ln1.bias"), N, D, eps);
    ref_linear(qkv, a, pv(m, "attn.qkv.weight"), pv(m, "attn.qkv.bias"), N, D, 3 * D);
  }
  ref_attention(o, qkv, m);
  ref_linear(a, o, pv(m, "attn.proj.weight"), pv(m, "attn.proj.bias"), N, D, D);
  scale_by(a, m->drop[1], N * D);
  for (int64_t i = 0; i < N * D; i++) h[i] = x[i] + a[i];
  const double *mlp_in = h;
  if (c->post_ln) {
    ref_layernorm(a, h, pv(m, "ln1.weight"), pv(m, "ln1.bias"), N, D, eps);
    memcpy(h, a, (size_t)(N * D) * sizeof(double));
  } else {
    ref_layernorm(a, h, pv(m, "ln2.weight"), pv(m, "ln2.bias"), N, D, eps);
    mlp_in = a;
  }
  ref_linear(u, mlp_in, pv(m, "mlp.fc.weight"), pv(m, "mlp.fc.bias"), N, D, F);
  for (int64_t i = 0; i < N * F; i++) u[i] = ref_gelu(u[i]);
  ref_linear(z, u, pv(m, "mlp.proj.weight"), pv(m, "mlp.proj.bias"), N, F, D);
  scale_by(z, m->drop[2], N * D);
  for (int64_t i = 0; i < N * D; i++) z[i] += h[i];
  if (c->post_ln) ref_layernorm(m->y, z, pv(m, "ln2.weight"), pv(m, "ln2.bias"), N, D, eps);
  else memcpy(m->y, z, (size_t)(N * D) * sizeof(double));
  free(a), free(qkv), free(o), free(h), free(u), free(z);
}

/* y[b,s] = drop(wte[token] + wpe[s] + wtt[type]). */
static void ref_embedding(struct mirror *m) {
  int64_t S = m->S, D = m->cfg.dim;
  const double *wte = pv(m, "wte"), *wpe = pv(m, "wpe"), *wtt = pv(m, "wtt");
  for (int64_t r = 0; r < m->B * S; r++)
    for (int64_t d = 0; d < D; d++) {
      double v = wte[m->tokens[r] * D + d] + wpe[(r % S) * D + d];
      if (wtt) v += wtt[m->types[r] * D + d];
      m->y[r * D + d] = v;
    }
  scale_by(m->y, m->drop[0], m->B * S * D);
}

/* -log softmax(logits)[target]; 0 for target -1. */
static double ref_cross_entropy(const double *logits, int64_t V, int32_t target) {
  if (target == -1) return 0.0;
  double mx = -INFINITY, sum = 0.0;
  for (int64_t v = 0; v < V; v++) mx = fmax(mx, logits[v]);
  for (int64_t v = 0; v < V; v++) sum += exp(logits[v] - mx);
  return mx + log(sum) - logits[target];
}

/* logits = ln(x) @ proj^T (ln only with final_ln); losses per token, or the logits. */
static void ref_lm_head(struct mirror *m) {
  const l2l_layer_config *c = &m->cfg;
  int64_t N = m->B * m->S, D = c->dim, V = c->vocab;
  double *h = doubles(N * D), *logits = doubles(V);
  if (c->final_ln) ref_layernorm(h, m->x, pv(m, "ln.weight"), pv(m, "ln.bias"), N, D, c->eps);
  else memcpy(h, m->x, (size_t)(N * D) * sizeof(double));
  const double *P = pv(m, "proj.weight");
  for (int64_t r = 0; r < N; r++) {
    for (int64_t v = 0; v < V; v++) {
      double acc = 0.0;
      for (int64_t d = 0; d < D; d++) acc += h[r * D + d] * P[v * D + d];
      logits[v] = acc;
    }
    if (m->targets) m->y[r] = ref_cross_entropy(logits, V, m->targets[r]);
    else memcpy(m->y + r * V, logits, (size_t)V * sizeof(double));
  }
  free(h), free(logits);
}

/* logits = x[b, 0] @ weight + bias; a loss per sample, or the logits. */
static void ref_classifier(struct mirror *m) {
  int64_t S = m->S, D = m->cfg.dim, C = m->cfg.classes;
  double *logits = doubles(C);
  for (int64_t b = 0; b < m->B; b++) {
    ref_linear(logits, m->x + b * S * D, pv(m, "weight"), pv(m, "bias"), 1, D, C);
    if (m->targets) m->y[b] = ref_cross_entropy(logits, C, m->targets[b]);
    else memcpy(m->y + b * C, logits, (size_t)C * sizeof(double));
  }
  free(logits);
}

/* Fills m->y and returns the loss L whose gradients the layer's backward gives. */
static double ref_forward(struct mirror *m) {
  switch (m->cfg.kind) {
    case L2L_LAYER_EMBEDDING: ref_embedding(m); break;
    case L2L_LAYER_BLOCK: ref_block(m); break;
    case L2L_LAYER_LM_HEAD: ref_lm_head(m); break;
    case L2L_LAYER_CLASSIFIER: ref_classifier(m); break;
    case L2L_LAYER_CUSTOM: break;   /* not made by these tests */
  }
  m->ny = mirror_outputs(m);
  double L = 0.0;
  for (int64_t i = 0; i < m->ny; i++) L += m->w ? m->w[i] * m->y[i] : m->y[i];
  return m->w ? L : m->loss_scale * L;
}

/* dL/dv by central differences of the mirror. */
static double ref_derivative(struct mirror *m, double *v) {
  double keep = *v;
  *v = keep + FD_STEP;
  double plus = ref_forward(m);
  *v = keep - FD_STEP;
  double minus = ref_forward(m);
  *v = keep;
  return (plus - minus) / (2.0 * FD_STEP);
}

/* got (n) must be g0 + dL/dv (g0 NULL: written, not accumulated) at every entry of a small
   tensor, or at FD_SOME random entries of a large one. */
static void check_gradient(const char *what, struct mirror *m, double *v, int64_t n,
                           const float *got, const float *g0) {
  int64_t k = n <= FD_ALL ? n : FD_SOME;
  int64_t *order = xmalloc((size_t)n * sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) order[i] = i;
  for (int64_t i = 0; i < k && k < n; i++) { /* a random k-subset, Fisher-Yates */
    int64_t j = check_rand_int(i, n - 1), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  double *want = doubles(k), *deriv = doubles(k);
  float *have = xmalloc((size_t)k * sizeof(float));
  for (int64_t i = 0; i < k; i++) {
    int64_t e = order[i];
    deriv[i] = ref_derivative(m, &v[e]);
    want[i] = (g0 ? g0[e] : 0.0) + deriv[i];
    have[i] = got[e];
  }
  CHECK_CLOSE(what, have, want, k, rms(deriv, k) + 1e-30, TOL_GRAD);
  free(order), free(want), free(deriv), free(have);
}

static bool any_dropout(const struct mirror *m) {
  return m->drop[0] || m->drop[1] || m->drop[2];
}

/* The whole contract of one call against the mirror: the forward (kept for backward, and
   as inference), dx written and every parameter gradient added to its random start, and,
   for a layer with dropout, training = 0 dropping nothing. */
void check_layer(struct run *r, const char *what) {
  struct mirror m;
  char label[256];
  if (!mirror_load(&m, r)) {
    mirror_free(&m);
    return;
  }
  ref_forward(&m);
  check_poison(r->y);
  l2l_saved *saved = NULL;
  if (!CHECK_OK(l2l_layer_forward(&saved, r->layer, r->y, r->x, &r->batch))) {
    mirror_free(&m);
    return;
  }
  snprintf(label, sizeof label, "%s: forward", what);
  CHECK_CLOSE(label, check_data(r->y), m.y, m.ny, rms(m.y, m.ny), TOL_FORWARD);

  l2l_tensor *y2 = like(r->y);
  check_poison(y2);
  CHECK_OK(l2l_layer_forward(NULL, r->layer, y2, r->x, &r->batch));
  snprintf(label, sizeof label, "%s: inference forward", what);
  CHECK_CLOSE(label, check_data(y2), m.y, m.ny, rms(m.y, m.ny), TOL_FORWARD);

  float *g0[MAX_PARAMS];
  for (int i = 0; i < m.np; i++) {
    l2l_tensor *g = l2l_param_grad(m.param[i]);
    fill_normal(g, 0.1);
    g0[i] = snapshot(g);
  }
  if (r->dx) check_poison(r->dx);
  if (CHECK_OK(l2l_layer_backward(r->layer, r->dx, r->dy, saved, &r->batch))) {
    if (r->dx) {
      snprintf(label, sizeof label, "%s: dx", what);
      check_gradient(label, &m, m.x, m.nx, check_data(r->dx), NULL);
    }
    for (int i = 0; i < m.np; i++) {
      snprintf(label, sizeof label, "%s: d %s", what, m.role[i]);
      check_gradient(label, &m, m.val[i], m.n[i], check_data(l2l_param_grad(m.param[i])), g0[i]);
    }
  }
  l2l_saved_free(saved);
  for (int i = 0; i < m.np; i++) free(g0[i]);

  if (any_dropout(&m)) {
    l2l_layer_batch eval = r->batch;
    eval.training = 0;
    mirror_set_dropout(&m, &eval, l2l_layer_rng_id(r->layer));
    ref_forward(&m);
    check_poison(y2);
    CHECK_OK(l2l_layer_forward(NULL, r->layer, y2, r->x, &eval));
    snprintf(label, sizeof label, "%s: forward with training = 0", what);
    CHECK_CLOSE(label, check_data(y2), m.y, m.ny, rms(m.y, m.ny), TOL_FORWARD);
  }
  l2l_tensor_free(y2);
  mirror_free(&m);
}

/* A head without targets writes logits and keeps nothing (*saved := NULL). */
void check_logits(struct run *r, const char *what) {
  struct mirror m;
  if (!mirror_load(&m, r)) {
    mirror_free(&m);
    return;
  }
  m.targets = NULL;
  ref_forward(&m);
  l2l_layer_batch batch = r->batch;
  batch.targets = NULL;
  l2l_pool_kind pool = (l2l_pool_kind)l2l_tensor_pool(r->x);
  l2l_tensor *logits = m.cfg.kind == L2L_LAYER_LM_HEAD
                           ? NEW(pool, L2L_F32, r->B, r->S, m.cfg.vocab)
                           : NEW(pool, L2L_F32, r->B, m.cfg.classes);
  check_poison(logits);
  l2l_saved *saved = (l2l_saved *)&m; /* anything but NULL: the call must clear it */
  if (CHECK_OK(l2l_layer_forward(&saved, r->layer, logits, r->x, &batch))) {
    CHECK(saved == NULL, "%s: a head without targets kept a saved state", what);
    char label[256];
    snprintf(label, sizeof label, "%s: logits", what);
    CHECK_CLOSE(label, check_data(logits), m.y, m.ny, rms(m.y, m.ny), TOL_FORWARD);
  }
  l2l_tensor_free(logits);
  mirror_free(&m);
}

