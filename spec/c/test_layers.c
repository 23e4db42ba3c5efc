/* SPDX-License-Identifier: MIT */
/* test_layers.c — the layers of l2l.h's "layers" section against float64 references.
 *
 * What it tests: every layer kind and option: the token+position embedding (with and
 * without token types, with dropout), the transformer block (pre-LN and post-LN, causal
 * and bidirectional, with and without a key padding mask, with and without biases, with
 * and without dropout, standard and frugal memory), the LM head (with and without its
 * final LayerNorm, tied to an embedding and not, standard and frugal, with ignored
 * targets, and its logits mode) and the classifier. For each: the forward output, dx and
 * every parameter gradient, the accumulation contract (parameter gradients +=, dx =),
 * inference calls and training = 0. Beyond that: frugal against standard where frugal is
 * hard (GELU inputs at its minimum, LayerNorm weights at or near zero); dropout draws
 * that follow the header's (seed, stream, index) formula and do not depend on how a
 * batch is split into micro-batches; l2l_layer_memory_use against the device pool's byte
 * counts, to the byte; initial values, clone and tie; and refusals of bad configs and
 * calls, which must change nothing.
 *
 * How: each layer has a float64 mirror written here from the formulas in l2l.h: it reads
 * the layer's parameter values through l2l_param_value, its dropout masks come from
 * l2l_philox4x32 by the header's formula (proven equal to l2l_dropout_forward's once),
 * and a loss L = sum(w .* y) with random w (heads: loss_scale * sum of the losses) gives
 * every gradient by central differences in double. Parameters and inputs are random and
 * of awkward sizes (B 2-3, S 5-7, D 12-16, H 2-4, F 20-24, V 11); outputs a layer writes
 * start as NaN, gradients it accumulates start random. Comparisons are relative errors
 * with a floor at the scale of the compared values (check_rel_err).
 * All test names start with "layer_", so `l2l_ctest layer_` runs just this file.
 * Must never: take an expected value from the library's layer code (frugal against
 * standard is the one comparison of the library with itself, and its point). The one
 * fact taken from below l2l.h is how a Philox draw index maps to counter and word
 * (src/core/rng.c, the layout l2l.h's "see l2l_tensor_uniform" points to), and the first test
 * proves it is the one l2l_dropout_forward uses.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "reference.h"

/* ---------------------------------------------------------------- tolerances */

/* A block's f32 forward is a chain of about six stages (LayerNorm, GEMMs of at most 48
   terms, softmax, GELU), each good to a few ulp of the size of its values (~1e-6);
   2e-5 of the output's scale is that with a margin. A wrong formula is off by 1e-2 or
   more (eps outside the square root, with eps = 0.05, by ~2e-2). */
#define TOL_FORWARD 2e-5
/* f32 backward against float64 central differences (themselves good to ~1e-9): standard
   blocks come within ~1e-5 of the gradient's scale, but frugal GELU loses up to ~2e-4 of
   GELU' for inputs within ~1e-3 of its minimum (see TOL_GELU_MIN), and a gradient entry
   that sums a few such elements inherits that relative to the tensor's scale: measured,
   at most 1.5e-4 over 700 seeds. 5e-4 of the gradient's scale; a missed dropout scale, a
   wrong mask or a write instead of an add is off by 1e-2 or more. */
#define TOL_GRAD 5e-4
/* Frugal against standard, same inputs: the same forward (bit for bit on the CPU; a few
   ulp allow another order), and gradients apart by frugal GELU's loss as for TOL_GRAD. */
#define TOL_SAME_FORWARD 2e-6
#define TOL_SAME_GRAD 5e-4
/* GELU' recovered from an f32 output near the minimum: y - y_min = c/2 (x - x_min)^2 with
   c = GELU''(x_min) ~ 0.43, so an error dy in y (a few ulp of 0.17, ~3e-8) leaves
   |x - x_min| uncertain by sqrt(2 dy / c) ~ 4e-4 and GELU' = c (x - x_min) by ~2e-4,
   whatever the method: f32 storage of y does not keep more. 5e-4 allows that and still
   catches GELU' of the wrong sign (a wrong branch bit) for |x - x_min| >= 1e-3. */
#define TOL_GELU_MIN 5e-4
/* Central differences in double: truncation h^2 f''' / 6 ~ 1e-11, rounding
   1e-16 |L| / h ~ 1e-9 of the gradient's scale. */
#define FD_STEP 1e-5
/* Every entry of a tensor is differentiated up to FD_ALL entries; larger ones get FD_SOME
   random entries (the same count at every size keeps the run short). */
enum { FD_ALL = 128, FD_SOME = 48, MAX_PARAMS = 12 };

/* ---------------------------------------------------------------- tensors */

#define F32(...) NEW(L2L_POOL_HOST, L2L_F32, __VA_ARGS__)
#define U8(...) NEW(L2L_POOL_HOST, L2L_U8, __VA_ARGS__)

static double rms(const double *v, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
  return n > 0 ? sqrt(s / (double)n) : 0.0;
}

/* ---------------------------------------------------------------- comparisons */

#define CHECK_CLOSE(what, got, want, n, floor, tol) \
  close_at(__FILE__, __LINE__, (what), (got), (want), (n), (floor), (tol))

/* A refused call: `want`, and a message that is not empty and contains `needle`. */
static bool refused_at(l2l_status got, l2l_status want, const char *needle, const char *file,
                       int line, const char *expr) {
  const char *msg = l2l_last_error();
  return check_that(got == want && msg[0] != '\0' && strstr(msg, needle) != NULL, file, line,
                    expr, "want status %d with a message naming \"%s\", got %d: \"%s\"", want,
                    needle, got, msg);
}
#define CHECK_REFUSED(call, status, needle) \
  refused_at((call), (status), (needle), __FILE__, __LINE__, #call)

/* ---------------------------------------------------------------- dropout draws */

/* The header's stream of a layer call's dropout site. */
static uint64_t dropout_stream(uint64_t step, uint32_t rng_id, int site) {
  return (step << 32) + ((uint64_t)rng_id << 8) + (uint64_t)site;
}

/* Whether draw `index` of (seed, stream) keeps its element at drop probability p: the
   draw is word index%4 of Philox4x32-10 at counter (index/4 as 64 bits, stream as 64
   bits) under key seed (src/core/rng.c's layout behind l2l_tensor_uniform), kept when its top
   24 bits are below round((1 - p) 2^24) (l2l.h, layer batch). */
static bool ref_kept(uint64_t seed, uint64_t stream, uint64_t index, float p) {
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

TEST(layer_dropout_reference_matches_the_library) {
  /* ref_kept decides every mask in the mirrors below: here it meets l2l_dropout_forward on
     a tensor of ones, at streams and first indices built the way layers build them. */
  static const float ps[] = {0.1f, 0.5f, 0.85f};
  for (int rep = 0; rep < 6; rep++) {
    float p = ps[rep % 3];
    int64_t n = check_rand_int(1, 4000);
    uint64_t seed = check_rand_u64();
    uint64_t stream = dropout_stream((uint64_t)check_rand_int(0, 1 << 20),
                                     (uint32_t)check_rand_int(0, (1 << 24) - 1),
                                     (int)check_rand_int(0, 2));
    int64_t first = check_rand_int(0, 5000) * check_rand_int(1, 7 * 7 * 4);
    l2l_tensor *x = F32(n), *y = F32(n), *mask = U8((n + 7) / 8);
    CHECK_OK(l2l_tensor_fill(x, 1.0));
    check_poison(y);
    CHECK_OK(l2l_dropout_forward(y, mask, x, p, seed, stream, first));
    const float *yd = check_data(y);
    double scale = 1.0 / (1.0 - (double)p);
    int64_t wrong = 0, first_wrong = -1;
    for (int64_t i = 0; i < n; i++) {
      bool kept = ref_kept(seed, stream, (uint64_t)(first + i), p);
      bool ok = kept ? fabs(yd[i] - scale) <= 1e-6 * scale : yd[i] == 0.0f;
      if (!ok) wrong++, first_wrong = first_wrong < 0 ? i : first_wrong;
    }
    CHECK(wrong == 0, "p=%g n=%lld first=%lld: %lld elements differ from the reference mask, "
          "first at %lld", p, (long long)n, (long long)first, (long long)wrong,
          (long long)first_wrong);
    FREE(x, y, mask);
  }
}

/* ---------------------------------------------------------------- parameters */

/* One parameter the header promises a kind: name, shape, initial values ('1' ones,
   '0' zeros, 'n' N(0, init_std^2), 'r' N(0, resid_std^2)) and whether it decays. */
struct expected {
  const char *name;
  int ndim;
  int64_t d0, d1;
  char init;
  int decays;
};

static int expected_params(struct expected *e, const l2l_layer_config *c) {
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

static bool has_shape(const l2l_tensor *t, const struct expected *e) {
  return t != NULL && l2l_tensor_dtype(t) == L2L_F32 && l2l_tensor_ndim(t) == e->ndim &&
         l2l_tensor_dim(t, 0) == e->d0 && (e->ndim == 1 || l2l_tensor_dim(t, 1) == e->d1);
}

static l2l_param *find_param(const l2l_layer *layer, const char *name) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    l2l_param *p = l2l_layer_param(layer, i);
    const char *pn = l2l_param_name(p);
    if (pn != NULL && strcmp(pn, name) == 0) return p;
  }
  return NULL;
}

static l2l_layer_config base_config(l2l_layer_kind kind) {
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
static l2l_layer *new_layer(const l2l_layer_config *c, l2l_pool_kind pool) {
  l2l_layer *layer = NULL;
  if (!CHECK_OK(l2l_layer_new(&layer, c, pool))) return NULL;
  return layer;
}

/* ---------------------------------------------------------------- one layer call */

/* The tensors and batch of one call, in one pool. */
struct run {
  l2l_layer *layer;
  l2l_param *tied;             /* an LM head's projection: the embedding's wte record */
  int64_t B, S;
  l2l_tensor *x, *y, *dy, *dx; /* x, dx NULL for the embedding; dy NULL for heads */
  l2l_tensor *tokens, *types, *targets, *key_mask;
  l2l_layer_batch batch;
};

/* Inputs for `layer` on B samples of S positions: random x and dy, NaN y and dx, tokens
   with a repeated id (embedding scatter-adds must sum), targets with ignored ones, and a
   key mask (when asked) where sample 0 is whole, sample 1 loses a random tail and any
   further sample is all padding, so that its query rows see no key at all. The batch
   draws from a random seed, step, first sample and rng id, so that every term of the
   stream and index formulas counts. */
static void run_init(struct run *r, l2l_layer *layer, int64_t B, int64_t S, l2l_pool_kind pool,
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

static void run_free(struct run *r) {
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
static void check_layer(struct run *r, const char *what) {
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
static void check_logits(struct run *r, const char *what) {
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

/* ---------------------------------------------------------------- each kind against its mirror */

TEST(layer_embedding_matches_reference) {
  for (int i = 0; i < 4; i++) {
    l2l_layer_config c = base_config(L2L_LAYER_EMBEDDING);
    c.dim = PICK(12, 16);
    c.type_vocab = i & 1 ? 3 : 0;
    c.dropout = i & 2 ? (float)check_rand_uniform(0.1, 0.4) : 0.0f;
    int64_t B = PICK(2, 3), S = PICK(5, 7);
    c.max_seq = S + 2; /* positions S.. get no gradient: their rows must keep their start */
    l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
    if (layer == NULL) continue;
    randomize_params(layer);
    struct run r;
    run_init(&r, layer, B, S, L2L_POOL_HOST, 0);
    char what[160];
    snprintf(what, sizeof what, "embedding types=%lld dropout=%.3g B=%lld S=%lld D=%lld",
             (long long)c.type_vocab, c.dropout, (long long)B, (long long)S, (long long)c.dim);
    check_layer(&r, what);
    run_free(&r);
    l2l_layer_free(layer);
  }
}

TEST(layer_block_matches_reference) {
  /* A 2^(6-2) fractional factorial over post_ln, causal, key mask, frugal, bias
     (= post_ln ^ causal ^ mask) and dropout (= causal ^ mask ^ frugal): 16 blocks in which
     every two options meet in all four combinations. eps is 1e-5 or 0.05 (where eps
     outside the square root would show). */
  static const int64_t dim_heads[][2] = {{12, 2}, {12, 4}, {16, 2}, {16, 4}};
  for (int i = 0; i < 16; i++) {
    int post_ln = i & 1, causal = (i >> 1) & 1, masked = (i >> 2) & 1, frugal = (i >> 3) & 1;
    int bias = post_ln ^ causal ^ masked, dropout = causal ^ masked ^ frugal;
    l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
    int64_t k = check_rand_int(0, 3);
    c.dim = dim_heads[k][0], c.heads = dim_heads[k][1], c.mlp = PICK(20, 24);
    c.post_ln = post_ln, c.causal = causal, c.bias = bias;
    c.memory = frugal ? L2L_MEMORY_FRUGAL : L2L_MEMORY_STANDARD;
    c.dropout = dropout ? (float)check_rand_uniform(0.1, 0.4) : 0.0f;
    c.attn_dropout = dropout ? (float)check_rand_uniform(0.1, 0.4) : 0.0f;
    c.eps = check_rand_int(0, 1) ? 1e-5f : 0.05f;
    int64_t B = masked ? 3 : PICK(2, 3), S = PICK(5, 7);
    l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
    if (layer == NULL) continue;
    randomize_params(layer);
    struct run r;
    run_init(&r, layer, B, S, L2L_POOL_HOST, masked);
    char what[200];
    snprintf(what, sizeof what, "block %s %s%s bias=%d dropout=%.3g/%.3g %s eps=%g B=%lld "
             "S=%lld D=%lld H=%lld F=%lld", post_ln ? "post-LN" : "pre-LN",
             causal ? "causal" : "bidirectional", masked ? " masked" : "", bias, c.dropout,
             c.attn_dropout, frugal ? "frugal" : "standard", c.eps, (long long)B, (long long)S,
             (long long)c.dim, (long long)c.heads, (long long)c.mlp);
    check_layer(&r, what);
    run_free(&r);
    l2l_layer_free(layer);
  }
}

TEST(layer_lm_head_matches_reference) {
  /* Every combination of final_ln, tied and memory mode (the head's LayerNorm follows it). */
  for (int i = 0; i < 8; i++) {
    int final_ln = i & 1, tied = (i >> 1) & 1, frugal = (i >> 2) & 1;
    int64_t B = PICK(2, 3), S = PICK(5, 7);
    l2l_layer_config c = base_config(L2L_LAYER_LM_HEAD);
    c.dim = PICK(12, 16);
    c.final_ln = final_ln;
    c.memory = frugal ? L2L_MEMORY_FRUGAL : L2L_MEMORY_STANDARD;
    c.eps = final_ln && check_rand_int(0, 1) ? 0.05f : 1e-5f;
    l2l_layer *head = new_layer(&c, L2L_POOL_HOST), *emb = NULL;
    if (head == NULL) continue;
    l2l_param *wte = NULL;
    if (tied) {
      l2l_layer_config ec = base_config(L2L_LAYER_EMBEDDING);
      ec.dim = c.dim, ec.vocab = c.vocab, ec.max_seq = S;
      emb = new_layer(&ec, L2L_POOL_HOST);
      wte = emb ? find_param(emb, "wte") : NULL;
      if (!CHECK(wte != NULL, "embedding without wte") || !CHECK_OK(l2l_layer_tie(head, emb))) {
        l2l_layer_free(head), l2l_layer_free(emb);
        continue;
      }
      /* The head's projection is now the embedding's record itself, counted in both. */
      bool listed = false;
      for (int k = 0; k < l2l_layer_param_count(head); k++)
        listed |= l2l_layer_param(head, k) == wte;
      CHECK(listed, "the tied head does not list the embedding's wte among its parameters");
      CHECK(l2l_param_users(wte) == 2, "wte has %d users after tie", l2l_param_users(wte));
      CHECK(l2l_layer_nparams(head) == c.vocab * c.dim + (final_ln ? 2 * c.dim : 0),
            "tied head has %lld scalars", (long long)l2l_layer_nparams(head));
      randomize_params(emb);
    }
    randomize_params(head);
    struct run r;
    run_init(&r, head, B, S, L2L_POOL_HOST, 0);
    r.tied = wte;
    char what[160];
    snprintf(what, sizeof what, "lm head final_ln=%d %s %s eps=%g B=%lld S=%lld D=%lld",
             final_ln, tied ? "tied" : "untied", frugal ? "frugal" : "standard", c.eps,
             (long long)B, (long long)S, (long long)c.dim);
    check_layer(&r, what);
    check_logits(&r, what);
    run_free(&r);
    if (tied) {
      /* The embedding, the record's other user, adds into the same gradient (from any
         start, here random); after it is freed the head is the only user. */
      struct run er;
      run_init(&er, emb, B, S, L2L_POOL_HOST, 0);
      snprintf(what, sizeof what, "embedding tied to an lm head, D=%lld", (long long)c.dim);
      check_layer(&er, what);
      run_free(&er);
      l2l_layer_free(emb);
      CHECK(l2l_param_users(wte) == 1, "after the embedding is freed, wte has %d users",
            l2l_param_users(wte));
    }
    l2l_layer_free(head);
  }
}

TEST(layer_classifier_matches_reference) {
  for (int i = 0; i < 2; i++) {
    l2l_layer_config c = base_config(L2L_LAYER_CLASSIFIER);
    c.dim = PICK(12, 16);
    c.classes = PICK(2, 5);
    int64_t B = 3, S = PICK(5, 7);
    l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
    if (layer == NULL) continue;
    randomize_params(layer);
    struct run r;
    run_init(&r, layer, B, S, L2L_POOL_HOST, 0);
    char what[160];
    snprintf(what, sizeof what, "classifier C=%lld B=%lld S=%lld D=%lld", (long long)c.classes,
             (long long)B, (long long)S, (long long)c.dim);
    check_layer(&r, what);
    check_logits(&r, what);
    run_free(&r);
    l2l_layer_free(layer);
  }
}

/* ---------------------------------------------------------------- parameters, clone, config */

/* The fields a kind uses (the others are ignored, so they need not come back). */
static bool same_config(const l2l_layer_config *a, const l2l_layer_config *b) {
  bool same = a->kind == b->kind && a->dim == b->dim && a->init_seed == b->init_seed &&
              a->init_std == b->init_std;
  switch (a->kind) {
    case L2L_LAYER_EMBEDDING:
      return same && a->vocab == b->vocab && a->max_seq == b->max_seq &&
             a->type_vocab == b->type_vocab && a->dropout == b->dropout;
    case L2L_LAYER_BLOCK:
      return same && a->heads == b->heads && a->mlp == b->mlp && a->causal == b->causal &&
             a->post_ln == b->post_ln && a->bias == b->bias && a->dropout == b->dropout &&
             a->attn_dropout == b->attn_dropout && a->eps == b->eps && a->memory == b->memory &&
             a->resid_std == b->resid_std;
    case L2L_LAYER_LM_HEAD:
      return same && a->vocab == b->vocab && a->final_ln == b->final_ln &&
             (!a->final_ln || a->eps == b->eps);
    case L2L_LAYER_CLASSIFIER: return same && a->classes == b->classes;
    case L2L_LAYER_CUSTOM: break;   /* not made by these tests */
  }
  return false;
}

static double max_abs_of(const l2l_tensor *t) {
  double v = NAN;
  CHECK_OK(l2l_max_abs(&v, t));
  return v;
}

TEST(layer_new_has_the_promised_parameters) {
  /* Sizes large enough (thousands of entries) for the initial distributions to show. */
  l2l_layer_config cs[6];
  cs[0] = base_config(L2L_LAYER_EMBEDDING);
  cs[0].vocab = 50, cs[0].max_seq = 40, cs[0].type_vocab = 3;
  cs[1] = base_config(L2L_LAYER_BLOCK);
  cs[1].heads = 4, cs[1].mlp = 96;
  cs[2] = cs[1];
  cs[2].bias = 0, cs[2].post_ln = 1;
  cs[3] = base_config(L2L_LAYER_LM_HEAD);
  cs[3].vocab = 50, cs[3].final_ln = 1;
  cs[4] = cs[3];
  cs[4].final_ln = 0;
  cs[5] = base_config(L2L_LAYER_CLASSIFIER);
  cs[5].classes = 7;
  for (int i = 0; i < 6; i++) {
    l2l_layer_config c = cs[i];
    c.dim = 64, c.init_std = 0.02f, c.resid_std = 0.005f;
    l2l_layer_config reseeded = c;
    reseeded.init_seed = c.init_seed + 1;
    l2l_layer *layer = new_layer(&c, L2L_POOL_HOST), *twin = new_layer(&c, L2L_POOL_HOST);
    l2l_layer *other = new_layer(&reseeded, L2L_POOL_HOST);
    if (layer == NULL || twin == NULL || other == NULL) {
      l2l_layer_free(layer), l2l_layer_free(twin), l2l_layer_free(other);
      continue;
    }
    l2l_layer_config back;
    CHECK_OK(l2l_layer_get_config(&back, layer));
    CHECK(same_config(&c, &back), "config %d does not come back from get_config", i);
    /* Ids are unique per process and below 2^24. */
    CHECK(l2l_layer_rng_id(layer) != l2l_layer_rng_id(twin) && l2l_layer_rng_id(layer) < (1u << 24),
          "rng ids %u and %u", l2l_layer_rng_id(layer), l2l_layer_rng_id(twin));
    struct expected e[MAX_PARAMS];
    int ne = expected_params(e, &c);
    CHECK(l2l_layer_param_count(layer) == ne, "config %d: %d parameters, want %d", i,
          l2l_layer_param_count(layer), ne);
    int64_t total = 0;
    for (int k = 0; k < ne; k++) {
      l2l_param *p = find_param(layer, e[k].name);
      if (!CHECK(p != NULL, "config %d: no parameter %s", i, e[k].name)) continue;
      l2l_tensor *v = l2l_param_value(p), *g = l2l_param_grad(p);
      if (!CHECK(has_shape(v, &e[k]) && has_shape(g, &e[k]), "%s: value or gradient has the "
                 "wrong shape or dtype", e[k].name))
        continue;
      total += numel(v);
      CHECK(l2l_tensor_pool(v) == L2L_POOL_HOST && l2l_tensor_pool(g) == L2L_POOL_HOST,
            "%s not in the layer's pool", e[k].name);
      CHECK(l2l_param_decays(p) == e[k].decays, "%s: decays %d, want %d", e[k].name,
            l2l_param_decays(p), e[k].decays);
      CHECK(l2l_param_users(p) == 1, "%s: %d users", e[k].name, l2l_param_users(p));
      CHECK(max_abs_of(g) == 0.0, "%s: gradient does not start at zero", e[k].name);
      const float *d = check_data(v);
      int64_t n = numel(v);
      if (e[k].init == '0' || e[k].init == '1') {
        int64_t off = 0;
        for (int64_t j = 0; j < n; j++) off += d[j] != (e[k].init == '1' ? 1.0f : 0.0f);
        CHECK(off == 0, "%s: %lld of %lld entries are not %c", e[k].name, (long long)off,
              (long long)n, e[k].init);
        continue;
      }
      /* N(0, std^2): the sample mean is within 6 std/sqrt(n) of 0 and the sample std within
         6/sqrt(2n) of std, relative: six standard errors, so that no seed fails by chance
         (five did, once in 700 runs) while a wrong std (resid_std for init_std is 4x) fails. */
      double want = e[k].init == 'r' ? c.resid_std : c.init_std, sum = 0.0, sq = 0.0;
      for (int64_t j = 0; j < n; j++) sum += d[j], sq += (double)d[j] * d[j];
      double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
      CHECK(fabs(mean) <= 6.0 * want / sqrt((double)n) &&
                fabs(sd / want - 1.0) <= 6.0 / sqrt(2.0 * (double)n),
            "%s (%lld entries): mean %.3g std %.4g, want N(0, %.4g^2)", e[k].name, (long long)n,
            mean, sd, want);
      /* Drawn from (init_seed, the parameter's place): equal for one seed, not for two. */
      l2l_param *q = find_param(twin, e[k].name), *o = find_param(other, e[k].name);
      CHECK(q != NULL && same_bytes(l2l_param_value(q), d), "%s: two layers of one kind and "
            "seed start different", e[k].name);
      CHECK(o != NULL && !same_bytes(l2l_param_value(o), d), "%s: init_seed and init_seed + 1 "
            "drew the same values", e[k].name);
    }
    CHECK(l2l_layer_nparams(layer) == total, "config %d: nparams %lld, want %lld", i,
          (long long)l2l_layer_nparams(layer), (long long)total);
    /* The records described without making them are the ones made, in order, and
       describing them allocates nothing. */
    l2l_param_info infos[L2L_MAX_PARAMS + 1];
    memset(infos, 0x5a, sizeof infos);
    int count = -1;
    uint64_t host = stats_of(L2L_POOL_HOST).current;
    CHECK_OK(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, &c));
    CHECK(stats_of(L2L_POOL_HOST).current == host, "config %d: describing allocated", i);
    if (CHECK(count == l2l_layer_param_count(layer), "config %d: %d described, %d made", i,
              count, l2l_layer_param_count(layer))) {
      for (int k = 0; k < count; k++) {
        l2l_param *p = l2l_layer_param(layer, k);
        l2l_tensor *v = l2l_param_value(p);
        bool same = strcmp(infos[k].name, l2l_param_name(p)) == 0 &&
                    infos[k].ndim == l2l_tensor_ndim(v) && infos[k].decays == l2l_param_decays(p);
        for (int d = 0; same && d < infos[k].ndim; d++) same = infos[k].shape[d] == l2l_tensor_dim(v, d);
        CHECK(same, "config %d: record %d described as %s (%d dims) but made as %s", i, k,
              infos[k].name, infos[k].ndim, l2l_param_name(p));
      }
    }
    CHECK(infos[L2L_MAX_PARAMS].ndim == 0x5a5a5a5a, "config_params wrote past its capacity");
    if (count > 1) {
      CHECK_REFUSED(l2l_layer_config_params(infos, count - 1, &count, &c), L2L_ERR_INVALID,
                    "room for");
    }
    l2l_layer_free(layer);
    l2l_layer_free(twin);
    l2l_layer_free(other);
  }
}

TEST(layer_clone_copies_values_not_gradients) {
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  c.memory = L2L_MEMORY_FRUGAL;
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST), *copy = NULL;
  if (layer == NULL) return;
  randomize_params(layer);
  for (int i = 0; i < l2l_layer_param_count(layer); i++)
    fill_normal(l2l_param_grad(l2l_layer_param(layer, i)), 1.0);
  if (CHECK_OK(l2l_layer_clone(&copy, layer))) {
    l2l_layer_config back;
    CHECK_OK(l2l_layer_get_config(&back, copy));
    CHECK(same_config(&c, &back), "the clone's config differs");
    CHECK(l2l_layer_rng_id(copy) != l2l_layer_rng_id(layer), "the clone kept the rng id");
    CHECK(l2l_layer_param_count(copy) == l2l_layer_param_count(layer), "parameter counts differ");
    for (int i = 0; i < l2l_layer_param_count(layer); i++) {
      l2l_param *p = l2l_layer_param(layer, i), *q = find_param(copy, l2l_param_name(p));
      if (!CHECK(q != NULL && q != p, "%s: not a new record in the clone", l2l_param_name(p)))
        continue;
      l2l_tensor *v = l2l_param_value(p), *w = l2l_param_value(q);
      CHECK(same_bytes(w, check_data(v)) && check_data(w) != check_data(v),
            "%s: the clone's value is not a copy", l2l_param_name(p));
      CHECK(max_abs_of(l2l_param_grad(q)) == 0.0 && max_abs_of(l2l_param_grad(p)) > 0.0,
            "%s: the clone's gradient is not zero, or the original's was touched",
            l2l_param_name(p));
    }
    CHECK_OK(l2l_layer_set_memory(copy, L2L_MEMORY_STANDARD));
    CHECK_OK(l2l_layer_get_config(&back, copy));
    CHECK(back.memory == L2L_MEMORY_STANDARD, "set_memory not reflected in get_config");
    CHECK_OK(l2l_layer_get_config(&back, layer));
    CHECK(back.memory == L2L_MEMORY_FRUGAL, "set_memory on the clone changed the original");
  }
  CHECK_OK(l2l_layer_zero_grad(layer));
  for (int i = 0; i < l2l_layer_param_count(layer); i++)
    CHECK(max_abs_of(l2l_param_grad(l2l_layer_param(layer, i))) == 0.0, "zero_grad left %s",
          l2l_param_name(l2l_layer_param(layer, i)));
  l2l_layer_free(copy);
  l2l_layer_free(layer);
}

/* ---------------------------------------------------------------- frugal against standard */

/* Zeroes the layer's gradients, then one forward and backward of r's call. */
static bool forward_backward(struct run *r) {
  l2l_saved *saved = NULL;
  bool ok = CHECK_OK(l2l_layer_zero_grad(r->layer)) &&
            CHECK_OK(l2l_layer_forward(&saved, r->layer, r->y, r->x, &r->batch)) &&
            CHECK_OK(l2l_layer_backward(r->layer, r->dx, r->dy, saved, &r->batch));
  l2l_saved_free(saved);
  return ok;
}

static void compare_tensor(const char *what, const char *name, const l2l_tensor *got,
                           const l2l_tensor *want, double tol) {
  char label[256];
  double *w = to_doubles(check_data(want), numel(want));
  snprintf(label, sizeof label, "%s: %s", what, name);
  CHECK_CLOSE(label, check_data(got), w, numel(want), rms(w, numel(want)) + 1e-30, tol);
  free(w);
}

/* b's call against a's: the same y, dx and gradient of every parameter (matched by name)
   except those whose name starts with `skip` (NULL: none). */
static void compare_runs(const char *what, struct run *a, struct run *b, const char *skip) {
  if (!forward_backward(a) || !forward_backward(b)) return;
  compare_tensor(what, "y", b->y, a->y, TOL_SAME_FORWARD);
  compare_tensor(what, "dx", b->dx, a->dx, TOL_SAME_GRAD);
  for (int i = 0; i < l2l_layer_param_count(a->layer); i++) {
    l2l_param *p = l2l_layer_param(a->layer, i);
    const char *name = l2l_param_name(p);
    if (skip && starts_with(name, skip)) continue;
    l2l_param *q = find_param(b->layer, name);
    if (CHECK(q != NULL, "%s: no %s in the twin", what, name))
      compare_tensor(what, name, l2l_param_grad(q), l2l_param_grad(p), TOL_SAME_GRAD);
  }
}

/* ---------------------------------------------------------------- 16-bit weights */

/* The relay's binding (src/layers/layers.h): a parameter record pointed at other tensors. */
void l2l_param_bind(l2l_param *param, l2l_tensor *value, l2l_tensor *grad);

/* The parameters the relay binds in 16 bits: the GEMM weights and the token table. */
static bool low_precision_name(const l2l_layer_config *c, const char *name) {
  switch (c->kind) {
    case L2L_LAYER_EMBEDDING: return strcmp(name, "wte") == 0;
    case L2L_LAYER_BLOCK: return ends_with(name, "weight") && !starts_with(name, "ln");
    case L2L_LAYER_LM_HEAD: return strcmp(name, "proj.weight") == 0;
    case L2L_LAYER_CLASSIFIER: return strcmp(name, "weight") == 0;
    case L2L_LAYER_CUSTOM: break;
  }
  return false;
}

/* A layer computing with 16-bit copies of its weights (as the relay binds them) against
   the same layer in f32 with those weights rounded to 16 bits beforehand: the two differ
   only where the 16-bit layer rounds a GEMM's activations, so they agree to the 16-bit
   precision (and a weight read with the wrong dtype or an activation not rounded to the
   weight's dtype gives garbage). */
TEST(layer_16bit_weights_match_rounded_f32) {
  static const l2l_layer_kind kinds[] = {L2L_LAYER_EMBEDDING, L2L_LAYER_BLOCK, L2L_LAYER_BLOCK,
                                         L2L_LAYER_LM_HEAD, L2L_LAYER_CLASSIFIER};
  for (int dt = 0; dt < 2; dt++) {
    const l2l_dtype dtype = dt ? L2L_BF16 : L2L_F16;
    const double tol = dtype == L2L_BF16 ? 3e-2 : 4e-3;   /* 2^-8 and 2^-11, and sums */
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      l2l_layer_config c = base_config(kinds[k]);
      if (k == 2) {   /* the other block options */
        c.post_ln = 1, c.causal = 0, c.bias = 0;
        c.memory = L2L_MEMORY_FRUGAL;
        c.dropout = c.attn_dropout = 0.2f;
      }
      l2l_layer *layer = new_layer(&c, L2L_POOL_HOST), *twin_layer = NULL;
      if (layer == NULL) continue;
      randomize_params(layer);
      if (!CHECK_OK(l2l_layer_clone(&twin_layer, layer))) {
        l2l_layer_free(layer);
        continue;
      }
      struct run r, twin;
      run_init(&r, layer, PICK(2, 3), PICK(5, 9), L2L_POOL_HOST, kinds[k] == L2L_LAYER_BLOCK);
      CHECK_OK(l2l_layer_set_rng_id(twin_layer, l2l_layer_rng_id(layer)));
      twin = r;
      twin.layer = twin_layer;
      twin.y = like(r.y), twin.dx = r.dx ? like(r.dx) : NULL;
      l2l_tensor *half[MAX_PARAMS] = {0};
      int bound = 0;
      for (int i = 0; i < l2l_layer_param_count(layer); i++) {
        l2l_param *p = l2l_layer_param(layer, i), *q = find_param(twin_layer, l2l_param_name(p));
        if (!low_precision_name(&c, l2l_param_name(p))) continue;
        l2l_tensor *v = l2l_param_value(p), *w = l2l_param_value(q);
        half[i] = check_tensor(L2L_POOL_HOST, dtype, l2l_tensor_ndim(v),
                               (int64_t[]){l2l_tensor_dim(v, 0), l2l_tensor_dim(v, 1)});
        CHECK_OK(l2l_tensor_cast(half[i], v));
        CHECK_OK(l2l_tensor_cast(w, half[i]));   /* the twin's weight: the same values, f32 */
        l2l_param_bind(p, half[i], l2l_param_grad(p));
        bound++;
      }
      static const char *const kind_names[] = {"embedding", "block", "LM head", "classifier"};
      CHECK(bound > 0, "%s: no 16-bit weight", kind_names[kinds[k]]);
      check_poison(r.y);
      if (r.dx) check_poison(r.dx);
      char what[128];
      snprintf(what, sizeof what, "%s %s weights%s", kind_names[kinds[k]],
               l2l_dtype_name(dtype), k == 2 ? " (post-LN, frugal, dropout)" : "");
      if (forward_backward(&r) && forward_backward(&twin)) {
        compare_tensor(what, "y", r.y, twin.y, tol);
        if (r.dx) compare_tensor(what, "dx", r.dx, twin.dx, 2 * tol);
        for (int i = 0; i < l2l_layer_param_count(layer); i++) {
          l2l_param *p = l2l_layer_param(layer, i), *q = find_param(twin_layer, l2l_param_name(p));
          compare_tensor(what, l2l_param_name(p), l2l_param_grad(p), l2l_param_grad(q), 2 * tol);
        }
      }
      for (int i = 0; i < l2l_layer_param_count(layer); i++) {
        if (half[i]) l2l_param_bind(l2l_layer_param(layer, i), NULL, NULL);
        l2l_tensor_free(half[i]);
      }
      FREE(twin.y, twin.dx);
      run_free(&r);
      l2l_layer_free(twin_layer);
      l2l_layer_free(layer);
    }
  }
}

/* A frugal copy of r's layer drawing the same dropout, on r's inputs with outputs of its
   own. A block is cloned and switched (set_memory is promised for blocks); an LM head is
   made frugal from its config and given r's values. */
static bool frugal_twin(struct run *twin, const struct run *r) {
  *twin = *r;
  twin->layer = NULL;
  twin->y = twin->dx = NULL;
  l2l_layer_config c;
  if (!CHECK_OK(l2l_layer_get_config(&c, r->layer))) return false;
  if (c.kind == L2L_LAYER_BLOCK) {
    if (!CHECK_OK(l2l_layer_clone(&twin->layer, r->layer))) return false;
    CHECK_OK(l2l_layer_set_rng_id(twin->layer, l2l_layer_rng_id(r->layer)));
    CHECK_OK(l2l_layer_set_memory(twin->layer, L2L_MEMORY_FRUGAL));
  } else {
    c.memory = L2L_MEMORY_FRUGAL;
    if ((twin->layer = new_layer(&c, L2L_POOL_HOST)) == NULL) return false;
    for (int i = 0; i < l2l_layer_param_count(r->layer); i++) {
      l2l_param *p = l2l_layer_param(r->layer, i), *q = find_param(twin->layer, l2l_param_name(p));
      if (!CHECK(q != NULL, "the frugal head has no %s", l2l_param_name(p))) return false;
      CHECK_OK(l2l_tensor_copy(l2l_param_value(q), l2l_param_value(p)));
    }
  }
  twin->y = like(r->y);
  twin->dx = like(r->dx);
  return true;
}

static void twin_free(struct run *twin) {
  FREE(twin->y, twin->dx);
  l2l_layer_free(twin->layer);
}

/* A block with every option that changes what is saved: mask (with an all-padding
   sample), both dropouts, B = 3, S = 7. */
static l2l_layer *frugal_test_block(int post_ln, int causal, int bias) {
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  c.dim = 16, c.heads = 4, c.mlp = 24;
  c.post_ln = post_ln, c.causal = causal, c.bias = bias;
  c.dropout = 0.2f, c.attn_dropout = 0.25f;
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
  if (layer) randomize_params(layer);
  return layer;
}

TEST(layer_frugal_matches_standard) {
  for (int i = 0; i < 4; i++) {
    int post_ln = i & 1, bias = (i >> 1) & 1;
    l2l_layer *layer = frugal_test_block(post_ln, !post_ln, bias);
    if (layer == NULL) continue;
    struct run r, twin;
    run_init(&r, layer, 3, 7, L2L_POOL_HOST, 1);
    char what[96];
    snprintf(what, sizeof what, "frugal vs standard, %s bias=%d", post_ln ? "post-LN" : "pre-LN",
             bias);
    if (frugal_twin(&twin, &r)) compare_runs(what, &r, &twin, NULL);
    twin_free(&twin);
    run_free(&r);
    l2l_layer_free(layer);
  }
}

/* GELU' of the tanh form. */
static double ref_gelu_slope(double x) {
  const double k = 0.7978845608028654, a = 0.044715;
  double t = tanh(k * (x + a * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * a * x * x);
}

/* Where the tanh-form GELU' changes sign (x ~ -0.7525), by bisection. */
static double gelu_argmin(void) {
  double lo = -1.0, hi = -0.5;
  for (int i = 0; i < 100; i++) {
    double mid = 0.5 * (lo + hi);
    if (ref_gelu_slope(mid) < 0.0) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

TEST(layer_frugal_at_the_gelu_minimum) {
  /* With mlp.fc.weight = 0, every MLP pre-activation of channel f is exactly
     mlp.fc.bias[f] (pre-LN, so nothing else moves); most channels sit at GELU's minimum
     plus offsets of both signs from 0 to 1e-2, where GELU' ~ 0 and the output alone is
     ambiguous and ill-conditioned. Nothing but mlp.fc's gradients depends on GELU' there
     (fc.weight = 0 stops the rest), and those are GELU'(b_f) times the gradient the same
     call has at GELU' = 1, which a run with b = 8 gives: frugal may differ from standard
     by TOL_GELU_MIN of that, and must not be NaN. */
  static const double offsets[] = {0,     1e-7,  -1e-7, 1e-6,  -1e-6, 1e-5, -1e-5, 1e-4,
                                   -1e-4, 1e-3,  -1e-3, 3e-3,  -3e-3, 1e-2, -1e-2, 3e-2};
  l2l_layer *layer = frugal_test_block(0, 1, 1);
  if (layer == NULL) return;
  l2l_param *fcw = find_param(layer, "mlp.fc.weight"), *fcb = find_param(layer, "mlp.fc.bias");
  if (!CHECK(fcw && fcb, "block without mlp.fc parameters")) {
    l2l_layer_free(layer);
    return;
  }
  CHECK_OK(l2l_tensor_fill(l2l_param_value(fcw), 0.0));
  float *b = check_data(l2l_param_value(fcb));
  double x_min = gelu_argmin();
  for (int f = 0; f < 16; f++) b[f] = (float)(x_min + offsets[f]);
  struct run r, twin;
  run_init(&r, layer, 3, 7, L2L_POOL_HOST, 1);
  if (frugal_twin(&twin, &r)) {
    compare_runs("frugal at the GELU minimum", &r, &twin, "mlp.fc.");
    const char *names[2] = {"mlp.fc.weight", "mlp.fc.bias"};
    l2l_tensor *std_grad[2], *frugal_grad[2];
    for (int k = 0; k < 2; k++) {
      l2l_param *q = find_param(twin.layer, names[k]);
      std_grad[k] = like(l2l_param_grad(find_param(layer, names[k])));
      CHECK_OK(l2l_tensor_copy(std_grad[k], l2l_param_grad(find_param(layer, names[k]))));
      frugal_grad[k] = q ? l2l_param_grad(q) : NULL;
    }
    CHECK_OK(l2l_tensor_fill(l2l_param_value(fcb), 8.0)); /* GELU'(8) = 1 in double */
    if (frugal_grad[0] && frugal_grad[1] && forward_backward(&r)) {
      for (int k = 0; k < 2; k++) {
        const float *got = check_data(frugal_grad[k]), *want = check_data(std_grad[k]);
        const float *unit = check_data(l2l_param_grad(find_param(layer, names[k])));
        int64_t n = numel(std_grad[k]), bad = 0, worst = 0;
        double scale = 0.0, worst_excess = -INFINITY;
        for (int64_t i = 0; i < n; i++) scale += (double)unit[i] * unit[i] / (double)n;
        scale = sqrt(scale);
        for (int64_t i = 0; i < n; i++) {
          /* Plus f32 rounding of the sums (channels away from the minimum, GELU' ~ 1). */
          double bound = TOL_GELU_MIN * fabs(unit[i]) + 1e-5 * scale;
          double excess = fabs((double)got[i] - want[i]) - bound;
          if (!(excess <= 0.0)) bad++;
          if (!(excess <= worst_excess)) worst_excess = excess, worst = i;
        }
        CHECK(bad == 0, "d %s: %lld of %lld entries differ from standard by more than "
              "TOL_GELU_MIN of the unit-slope gradient; worst [%lld]: frugal %.9g, standard "
              "%.9g, unit %.9g", names[k], (long long)bad, (long long)n, (long long)worst,
              (double)got[worst], (double)want[worst], (double)unit[worst]);
      }
    }
    FREE(std_grad[0], std_grad[1]);
  }
  twin_free(&twin);
  run_free(&r);
  l2l_layer_free(layer);
}

/* An LM head with its final LayerNorm and random values. */
static l2l_layer *frugal_test_head(void) {
  l2l_layer_config c = base_config(L2L_LAYER_LM_HEAD);
  c.dim = 16, c.final_ln = 1;
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
  if (layer) randomize_params(layer);
  return layer;
}

TEST(layer_frugal_head_matches_standard) {
  l2l_layer *head = frugal_test_head();
  if (head == NULL) return;
  struct run r, twin;
  run_init(&r, head, 3, 7, L2L_POOL_HOST, 0);
  if (frugal_twin(&twin, &r)) compare_runs("frugal vs standard, lm head", &r, &twin, NULL);
  twin_free(&twin);
  run_free(&r);
  l2l_layer_free(head);
}

TEST(layer_frugal_layernorm_with_tiny_weights) {
  /* LayerNorm channels whose x^ = (y - b)/w cannot be had back from y: w = 0, w = +-1e-7,
     and w = 1e-3 beside b = 0.5 (|w| < |b|/64). Frugal must fall back to standard for
     that LayerNorm and match it; channels just inside the limits (w = 0.02, b = 1, where
     |b|/64 = 0.0156; w = -0.05, b = 0.2) stay frugal and lose at most 64 ulp of x^.
     Each LayerNorm of a pre-LN and a post-LN block, and the LM head's. */
  static const float w_at[] = {0.0f, 1e-7f, -1e-7f, 1e-3f, 0.02f, -0.05f};
  static const float b_at[] = {0.3f, 0.0f, -0.2f, 0.5f, 1.0f, 0.2f};
  for (int i = 0; i < 5; i++) {
    int post_ln = i & 1;
    const char *ln = i == 4 ? "ln" : i >> 1 ? "ln2" : "ln1";
    l2l_layer *layer = i == 4 ? frugal_test_head() : frugal_test_block(post_ln, !post_ln, 1);
    if (layer == NULL) continue;
    char wname[16], bname[16];
    snprintf(wname, sizeof wname, "%s.weight", ln);
    snprintf(bname, sizeof bname, "%s.bias", ln);
    l2l_param *pw = find_param(layer, wname), *pb = find_param(layer, bname);
    if (CHECK(pw && pb, "block without %s", ln)) {
      float *w = check_data(l2l_param_value(pw)), *b = check_data(l2l_param_value(pb));
      for (int k = 0; k < 6; k++) w[k] = w_at[k], b[k] = b_at[k];
      struct run r, twin;
      run_init(&r, layer, 3, 7, L2L_POOL_HOST, i < 4);
      char what[96];
      snprintf(what, sizeof what, "frugal with tiny %s weights, %s", ln,
               i == 4 ? "lm head" : post_ln ? "post-LN" : "pre-LN");
      if (frugal_twin(&twin, &r)) {
        /* The fallback keeps more than frugal would, and the account must say so. */
        l2l_layer_memory mem;
        l2l_saved *saved = NULL;
        CHECK_OK(l2l_layer_memory_use(&mem, twin.layer, twin.B, twin.S));
        CHECK_OK(l2l_layer_forward(&saved, twin.layer, twin.y, twin.x, &twin.batch));
        CHECK(l2l_saved_bytes(saved) == mem.saved, "%s: saved %llu bytes, memory_use says %llu",
              what, (unsigned long long)l2l_saved_bytes(saved), (unsigned long long)mem.saved);
        l2l_saved_free(saved);
        compare_runs(what, &r, &twin, NULL);
      }
      twin_free(&twin);
      run_free(&r);
    }
    l2l_layer_free(layer);
  }
}

/* ---------------------------------------------------------------- micro-batch splits */

TEST(layer_block_does_not_depend_on_the_split) {
  /* Samples [0,1) and [1,3) as two micro-batches (first_sample 0 and 1 past the whole's,
     backward in reverse like the relay) give the whole batch's output, dx and summed
     gradients: every dropout draw is keyed by the sample's place in the whole batch. */
  for (int frugal = 0; frugal < 2; frugal++) {
    l2l_layer *layer = frugal_test_block((int)check_rand_int(0, 1), (int)check_rand_int(0, 1), 1);
    if (layer == NULL) continue;
    CHECK_OK(l2l_layer_set_memory(layer, frugal ? L2L_MEMORY_FRUGAL : L2L_MEMORY_STANDARD));
    struct run r;
    run_init(&r, layer, 3, 7, L2L_POOL_HOST, 1);
    if (forward_backward(&r)) {
      int np = l2l_layer_param_count(layer);
      l2l_tensor *whole[MAX_PARAMS] = {0};
      for (int i = 0; i < np && i < MAX_PARAMS; i++) {
        whole[i] = like(l2l_param_grad(l2l_layer_param(layer, i)));
        CHECK_OK(l2l_tensor_copy(whole[i], l2l_param_grad(l2l_layer_param(layer, i))));
      }
      l2l_tensor *y = like(r.y), *dx = like(r.dx);
      check_poison(y), check_poison(dx);
      CHECK_OK(l2l_layer_zero_grad(layer));
      static const int64_t first[2] = {0, 1}, count[2] = {1, 2};
      l2l_tensor *xs[2], *ys[2], *dys[2], *dxs[2], *masks[2];
      l2l_layer_batch batch[2];
      l2l_saved *saved[2] = {NULL, NULL};
      for (int k = 0; k < 2; k++) {
        CHECK_OK(l2l_tensor_view_rows(&xs[k], r.x, first[k], count[k]));
        CHECK_OK(l2l_tensor_view_rows(&ys[k], y, first[k], count[k]));
        CHECK_OK(l2l_tensor_view_rows(&dys[k], r.dy, first[k], count[k]));
        CHECK_OK(l2l_tensor_view_rows(&dxs[k], dx, first[k], count[k]));
        CHECK_OK(l2l_tensor_view_rows(&masks[k], r.key_mask, first[k], count[k]));
        batch[k] = r.batch;
        batch[k].key_mask = masks[k];
        batch[k].first_sample = r.batch.first_sample + first[k];
        CHECK_OK(l2l_layer_forward(&saved[k], layer, ys[k], xs[k], &batch[k]));
      }
      for (int k = 1; k >= 0; k--) {
        CHECK_OK(l2l_layer_backward(layer, dxs[k], dys[k], saved[k], &batch[k]));
        l2l_saved_free(saved[k]);
        FREE(xs[k], ys[k], dys[k], dxs[k], masks[k]);
      }
      const char *what = frugal ? "split, frugal" : "split, standard";
      compare_tensor(what, "y", y, r.y, TOL_SAME_FORWARD);
      compare_tensor(what, "dx", dx, r.dx, TOL_SAME_GRAD);
      for (int i = 0; i < np && i < MAX_PARAMS; i++) {
        compare_tensor(what, l2l_param_name(l2l_layer_param(layer, i)),
                       l2l_param_grad(l2l_layer_param(layer, i)), whole[i], TOL_SAME_GRAD);
        l2l_tensor_free(whole[i]);
      }
      FREE(y, dx);
    }
    run_free(&r);
    l2l_layer_free(layer);
  }
}

/* ---------------------------------------------------------------- the byte account */

/* Forward and backward in the device pool (host-backed on a CPU-only build, with the same
   accounting) held to l2l_layer_memory_use: the forward leaves exactly `saved` bytes,
   which l2l_saved_bytes reports, and peaks at exactly saved + work_forward above where it
   started; the backward peaks at exactly work_backward above what the pool held (the
   header states both as what the calls allocate, in "an exact account"; "at most peak"
   follows); inference stays within peak; inference and l2l_saved_free give every byte
   back. */
static void check_memory_account(struct run *r, const char *what) {
  l2l_layer_memory mem;
  if (!CHECK_OK(l2l_layer_memory_use(&mem, r->layer, r->B, r->S))) return;
  uint64_t work = mem.work_forward > mem.work_backward ? mem.work_forward : mem.work_backward;
  CHECK(mem.peak == mem.saved + work, "%s: peak %llu != saved %llu + max(work) %llu", what,
        (unsigned long long)mem.peak, (unsigned long long)mem.saved, (unsigned long long)work);
  CHECK(mem.input_kept <= (r->x ? tensor_bytes(r->x) : 0) && mem.output_kept <= tensor_bytes(r->y),
        "%s: kept %llu bytes of x and %llu of y, more than they hold", what,
        (unsigned long long)mem.input_kept, (unsigned long long)mem.output_kept);
  CHECK(mem.params >= 4 * (uint64_t)l2l_layer_nparams(r->layer), "%s: params %llu bytes for "
        "%lld scalars", what, (unsigned long long)mem.params,
        (long long)l2l_layer_nparams(r->layer));

  uint64_t before = stats_of(L2L_POOL_DEVICE).current;
  CHECK_OK(l2l_pool_reset_peak(L2L_POOL_DEVICE));
  CHECK_OK(l2l_layer_forward(NULL, r->layer, r->y, r->x, &r->batch));
  l2l_pool_stats s = stats_of(L2L_POOL_DEVICE);
  CHECK(s.current == before && s.peak <= before + mem.peak, "%s: inference left %lld bytes, "
        "peaked %llu above, account %llu", what, (long long)(s.current - before),
        (unsigned long long)(s.peak - before), (unsigned long long)mem.peak);

  CHECK_OK(l2l_pool_reset_peak(L2L_POOL_DEVICE));
  l2l_saved *saved = NULL;
  if (!CHECK_OK(l2l_layer_forward(&saved, r->layer, r->y, r->x, &r->batch))) return;
  s = stats_of(L2L_POOL_DEVICE);
  CHECK(s.current == before + mem.saved && l2l_saved_bytes(saved) == mem.saved,
        "%s: forward kept %lld bytes, l2l_saved_bytes says %llu, memory_use says %llu", what,
        (long long)(s.current - before), (unsigned long long)l2l_saved_bytes(saved),
        (unsigned long long)mem.saved);
  CHECK(s.peak == before + mem.saved + mem.work_forward, "%s: forward peaked %llu above, "
        "account saved %llu + work_forward %llu", what, (unsigned long long)(s.peak - before),
        (unsigned long long)mem.saved, (unsigned long long)mem.work_forward);

  uint64_t held = s.current;
  CHECK_OK(l2l_pool_reset_peak(L2L_POOL_DEVICE));
  CHECK_OK(l2l_layer_backward(r->layer, r->dx, r->dy, saved, &r->batch));
  s = stats_of(L2L_POOL_DEVICE);
  CHECK(s.peak == held + mem.work_backward, "%s: backward peaked %llu above what the pool "
        "held, account work_backward %llu", what, (unsigned long long)(s.peak - held),
        (unsigned long long)mem.work_backward);
  CHECK(s.current == before + l2l_saved_bytes(saved), "%s: after backward the pool holds %lld "
        "bytes more, the saved state says %llu", what, (long long)(s.current - before),
        (unsigned long long)l2l_saved_bytes(saved));
  l2l_saved_free(saved);
  CHECK(stats_of(L2L_POOL_DEVICE).current == before, "%s: saved_free did not give back every "
        "byte", what);
}

TEST(layer_saved_bytes_are_exact) {
  static const int64_t sizes[2][2] = {{2, 5}, {3, 7}};
  for (int kind = 0; kind < 7; kind++) {
    l2l_layer_config c;
    const char *name;
    switch (kind) {
      case 0:
        c = base_config(L2L_LAYER_EMBEDDING), name = "embedding";
        c.type_vocab = 2, c.dropout = 0.1f;
        break;
      case 1:
      case 2:
        c = base_config(L2L_LAYER_BLOCK);
        name = kind == 1 ? "pre-LN block, standard" : "pre-LN block, frugal";
        c.causal = 1, c.dropout = 0.1f, c.attn_dropout = 0.1f, c.heads = 4;
        c.memory = kind == 1 ? L2L_MEMORY_STANDARD : L2L_MEMORY_FRUGAL;
        break;
      case 3:
        c = base_config(L2L_LAYER_BLOCK), name = "post-LN block without biases, frugal";
        c.post_ln = 1, c.bias = 0, c.dropout = 0.1f, c.memory = L2L_MEMORY_FRUGAL;
        break;
      case 4:
      case 5:
        c = base_config(L2L_LAYER_LM_HEAD);
        name = kind == 4 ? "lm head, standard" : "lm head, frugal";
        c.final_ln = 1, c.memory = kind == 4 ? L2L_MEMORY_STANDARD : L2L_MEMORY_FRUGAL;
        break;
      default:
        c = base_config(L2L_LAYER_CLASSIFIER), name = "classifier";
        break;
    }
    l2l_layer *layer = new_layer(&c, L2L_POOL_DEVICE);
    if (layer == NULL) continue;
    randomize_params(layer);
    for (int k = 0; k < 2; k++) {
      struct run r;
      run_init(&r, layer, sizes[k][0], sizes[k][1], L2L_POOL_DEVICE, c.kind == L2L_LAYER_BLOCK);
      char what[96];
      snprintf(what, sizeof what, "%s B=%lld S=%lld", name, (long long)r.B, (long long)r.S);
      check_memory_account(&r, what);
      run_free(&r);
    }
    l2l_layer_free(layer);
  }
}

TEST(layer_frugal_saves_less_and_no_s_by_s) {
  /* memory_use of one block in both modes: frugal keeps strictly less, and nothing that
     grows like S^2 (f(2S) - 2 f(S) cancels every term linear in S; what is left is
     allocation rounding, a few 64-byte blocks per buffer), while standard keeps the S x S
     probabilities: at least one f32 matrix per sample and head, which leaves
     2 B H S^2 f32 in f(2S) - 2 f(S). */
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  c.dim = 16, c.heads = 4, c.mlp = 24, c.causal = 1, c.dropout = 0.1f, c.attn_dropout = 0.1f;
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
  if (layer == NULL) return;
  const int64_t B = 2, S = 64;
  l2l_layer_memory m[2][2]; /* [mode][S, 2S] */
  for (int mode = 0; mode < 2; mode++) {
    CHECK_OK(l2l_layer_set_memory(layer, mode ? L2L_MEMORY_FRUGAL : L2L_MEMORY_STANDARD));
    CHECK_OK(l2l_layer_memory_use(&m[mode][0], layer, B, S));
    CHECK_OK(l2l_layer_memory_use(&m[mode][1], layer, B, 2 * S));
  }
  CHECK(m[1][0].saved < m[0][0].saved && m[1][1].saved < m[0][1].saved,
        "frugal saves %llu / %llu bytes, standard %llu / %llu", (unsigned long long)m[1][0].saved,
        (unsigned long long)m[1][1].saved, (unsigned long long)m[0][0].saved,
        (unsigned long long)m[0][1].saved);
  double frugal_sq = (double)m[1][1].saved - 2.0 * (double)m[1][0].saved;
  double standard_sq = (double)m[0][1].saved - 2.0 * (double)m[0][0].saved;
  CHECK(fabs(frugal_sq) <= 64.0 * 64.0, "frugal saved bytes grow like S^2: f(2S) - 2 f(S) = %.0f",
        frugal_sq);
  CHECK(standard_sq >= 2.0 * (double)(B * c.heads * S * S) * 4.0, "standard keeps no S x S "
        "probabilities? f(2S) - 2 f(S) = %.0f", standard_sq);
  l2l_layer_free(layer);
}

/* ---------------------------------------------------------------- refusals */

TEST(layer_new_refuses_bad_configs) {
  for (int i = 0; i < 21; i++) {
    l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
    const char *needle = "";
    switch (i) {
      case 0: c.heads = 5, needle = "heads"; break; /* 12 is not divisible by 5 */
      case 1: c.heads = 0, needle = "heads"; break;
      case 2: c.dim = -12, needle = "dim"; break;
      case 3: c.mlp = 0, needle = "mlp"; break;
      case 4: c.mlp = -20, needle = "mlp"; break;
      case 5: c.dropout = 1.0f, needle = "dropout"; break;
      case 6: c.dropout = -0.1f, needle = "dropout"; break;
      case 7: c.dropout = NAN, needle = "dropout"; break;
      case 8: c.attn_dropout = 1.0f, needle = "attn_dropout"; break;
      case 9: c.eps = 0.0f, needle = "eps"; break;
      case 10: c.eps = -1e-5f, needle = "eps"; break;
      case 11: c.eps = INFINITY, needle = "eps"; break;
      case 12: c.init_std = 0.0f, needle = "init_std"; break;
      case 13: c.resid_std = -0.01f, needle = "resid_std"; break;
      case 14: c.memory = (l2l_memory_mode)2, needle = "memory"; break;
      case 15: c.kind = (l2l_layer_kind)7, needle = "kind"; break;
      case 16: c.kind = L2L_LAYER_EMBEDDING, c.vocab = 0, needle = "vocab"; break;
      case 17: c.kind = L2L_LAYER_EMBEDDING, c.max_seq = -1, needle = "max_seq"; break;
      case 18: c.kind = L2L_LAYER_EMBEDDING, c.type_vocab = -2, needle = "type_vocab"; break;
      case 19: c.kind = L2L_LAYER_LM_HEAD, c.vocab = -11, needle = "vocab"; break;
      default: c.kind = L2L_LAYER_CLASSIFIER, c.classes = 0, needle = "classes"; break;
    }
    uint64_t host = stats_of(L2L_POOL_HOST).current;
    l2l_layer *out = NULL;
    if (!CHECK_REFUSED(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_INVALID, needle))
      fprintf(stderr, "    (bad config %d)\n", i);
    l2l_param_info infos[L2L_MAX_PARAMS];
    int count = -1;
    if (!CHECK_REFUSED(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, &c),
                       L2L_ERR_INVALID, needle))
      fprintf(stderr, "    (bad config %d, described)\n", i);
    CHECK(out == NULL && stats_of(L2L_POOL_HOST).current == host,
          "bad config %d: a refused layer_new wrote *out or kept memory", i);
    l2l_layer_free(out);
  }
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  l2l_layer *out = NULL;
  CHECK_REFUSED(l2l_layer_new(NULL, &c, L2L_POOL_HOST), L2L_ERR_INVALID, "out");
  CHECK_REFUSED(l2l_layer_new(&out, NULL, L2L_POOL_HOST), L2L_ERR_INVALID, "config");
  CHECK_REFUSED(l2l_layer_new(&out, &c, (l2l_pool_kind)9), L2L_ERR_INVALID, "pool");
  CHECK(out == NULL, "a refused layer_new wrote *out");
  l2l_param_info infos[L2L_MAX_PARAMS];
  int count = -1;
  CHECK_REFUSED(l2l_layer_config_params(infos, L2L_MAX_PARAMS, NULL, &c), L2L_ERR_INVALID, "count");
  CHECK_REFUSED(l2l_layer_config_params(NULL, L2L_MAX_PARAMS, &count, &c), L2L_ERR_INVALID, "out");
  CHECK_REFUSED(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, NULL), L2L_ERR_INVALID, "config");
  c.kind = L2L_LAYER_CUSTOM;
  CHECK_REFUSED(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, &c), L2L_ERR_INVALID,
                "l2l_layer_new_custom");
  /* sizes a layer_new would refuse only when it cannot allocate them are described */
  c = base_config(L2L_LAYER_BLOCK);
  c.dim = INT64_C(1) << 20, c.heads = 1, c.mlp = INT64_C(1) << 22;
  CHECK_OK(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, &c));
  CHECK(count == 12 && infos[8].shape[0] == c.dim && infos[8].shape[1] == c.mlp,
        "a block of dim 2^20: %d records, mlp.fc.weight (%lld, %lld)", count,
        (long long)infos[8].shape[0], (long long)infos[8].shape[1]);
}

TEST(layer_new_ignores_fields_its_kind_does_not_use) {
  /* "Fields a kind does not use are ignored": values that would be refused for a block. */
  l2l_layer_config e = base_config(L2L_LAYER_EMBEDDING);
  e.heads = 0, e.mlp = -1, e.classes = 0, e.attn_dropout = 1.0f, e.eps = 0.0f;
  l2l_layer_config k = base_config(L2L_LAYER_CLASSIFIER);
  k.heads = 0, k.mlp = 0, k.vocab = 0, k.max_seq = 0, k.eps = 0.0f, k.attn_dropout = 2.0f;
  l2l_layer_config b = base_config(L2L_LAYER_BLOCK);
  b.vocab = 0, b.max_seq = -1, b.type_vocab = -1, b.classes = 0;
  const l2l_layer_config *cs[3] = {&e, &k, &b};
  for (int i = 0; i < 3; i++) {
    l2l_layer *layer = NULL;
    CHECK_OK(l2l_layer_new(&layer, cs[i], L2L_POOL_HOST));
    l2l_layer_free(layer);
  }
}

/* A forward that must be refused naming `needle` ("" for any message): y keeps its
   poison, *saved stays NULL, and no pool holds a byte more. */
static void forward_refused(int line, const char *needle, l2l_layer *layer, l2l_tensor *y,
                            const l2l_tensor *x, const l2l_layer_batch *batch) {
  void *y0 = y ? snapshot(y) : NULL;
  uint64_t host = stats_of(L2L_POOL_HOST).current, device = stats_of(L2L_POOL_DEVICE).current;
  l2l_saved *saved = NULL;
  char expr[64];
  snprintf(expr, sizeof expr, "refused forward (line %d)", line);
  refused_at(l2l_layer_forward(&saved, layer, y, x, batch), L2L_ERR_INVALID, needle, __FILE__,
             line, expr);
  check_that(saved == NULL && (y == NULL || same_bytes(y, y0)) &&
                 stats_of(L2L_POOL_HOST).current == host &&
                 stats_of(L2L_POOL_DEVICE).current == device,
             __FILE__, line, expr, "a refused forward wrote y or *saved, or kept memory");
  l2l_saved_free(saved);
  free(y0);
}
#define FORWARD_REFUSED(needle, layer, y, x, batch) \
  forward_refused(__LINE__, (needle), (layer), (y), (x), (batch))

TEST(layer_forward_refuses_bad_calls) {
  const int64_t B = 2, S = 5, D = 12, V = 11;
  /* Block. */
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  l2l_layer *block = new_layer(&c, L2L_POOL_HOST), *dev_block = new_layer(&c, L2L_POOL_DEVICE);
  l2l_layer_config ec = base_config(L2L_LAYER_EMBEDDING);
  ec.max_seq = 6, ec.type_vocab = 2;
  l2l_layer *emb = new_layer(&ec, L2L_POOL_HOST);
  l2l_layer_config hc = base_config(L2L_LAYER_LM_HEAD);
  l2l_layer *head = new_layer(&hc, L2L_POOL_HOST);
  l2l_layer_config kc = base_config(L2L_LAYER_CLASSIFIER);
  l2l_layer *cls = new_layer(&kc, L2L_POOL_HOST);
  if (block && dev_block && emb && head && cls) {
    l2l_tensor *x = fill_normal(F32(B, S, D), 1.0), *y = F32(B, S, D);
    l2l_tensor *x_wide = F32(B, S, D + 1), *x_flat = F32(B * S, D);
    l2l_tensor *x_int = NEW(L2L_POOL_HOST, L2L_I32, B, S, D);
    l2l_tensor *y_long = F32(B, S + 1, D), *y_half = NEW(L2L_POOL_HOST, L2L_F16, B, S, D);
    l2l_tensor *y_dev = NEW(L2L_POOL_DEVICE, L2L_F32, B, S, D);
    l2l_tensor *x_dev = fill_normal(NEW(L2L_POOL_DEVICE, L2L_F32, B, S, D), 1.0);
    l2l_tensor *mask = U8(B, S), *mask_long = U8(B, S + 1), *mask_f = F32(B, S);
    l2l_tensor *mask_dev = NEW(L2L_POOL_DEVICE, L2L_U8, B, S);
    memset(l2l_tensor_data(mask), 1, (size_t)(B * S));
    memset(l2l_tensor_data(mask_long), 1, (size_t)(B * (S + 1)));
    memset(l2l_tensor_data(mask_dev), 1, (size_t)(B * S));
    check_poison(y), check_poison(y_long), check_poison(y_dev);
    l2l_layer_batch ok = {0};
    ok.training = 1, ok.seed = 5, ok.loss_scale = 1.0f;
    l2l_layer_batch bad = ok;
    FORWARD_REFUSED("layer", NULL, y, x, &ok);
    FORWARD_REFUSED("y", block, NULL, x, &ok);
    FORWARD_REFUSED("x", block, y, NULL, &ok);
    FORWARD_REFUSED("batch", block, y, x, NULL);
    FORWARD_REFUSED("x", block, y, x_wide, &ok);
    FORWARD_REFUSED("x", block, y, x_flat, &ok);
    FORWARD_REFUSED("x", block, y, x_int, &ok);
    FORWARD_REFUSED("y", block, y_long, x, &ok);
    FORWARD_REFUSED("y", block, y_half, x, &ok);
    FORWARD_REFUSED("device", block, y_dev, x, &ok);
    FORWARD_REFUSED("device", dev_block, y, x, &ok);      /* parameters on the device */
    FORWARD_REFUSED("host", block, y_dev, x_dev, &ok);    /* parameters on the host */
    bad.key_mask = mask_long;
    FORWARD_REFUSED("key_mask", block, y, x, &bad);
    bad.key_mask = mask_f;
    FORWARD_REFUSED("key_mask", block, y, x, &bad);
    bad.key_mask = mask_dev;
    FORWARD_REFUSED("device", block, y, x, &bad);
    bad = ok, bad.first_sample = -1;
    FORWARD_REFUSED("first_sample", block, y, x, &bad);

    /* Embedding (V 11, max_seq 6, 2 types). */
    const l2l_pool_kind host = L2L_POOL_HOST;
    l2l_tensor *tok = random_ids(NEW(host, L2L_I32, B, S), 0, V - 1), *types = random_ids(NEW(host, L2L_I32, B, S), 0, 1);
    l2l_tensor *tok_f = F32(B, S), *tok_long = random_ids(NEW(host, L2L_I32, B, 7), 0, V - 1);
    l2l_tensor *types_long = random_ids(NEW(host, L2L_I32, B, 7), 0, 1), *y7 = F32(B, 7, D);
    l2l_tensor *tok_bad = random_ids(NEW(host, L2L_I32, B, S), 0, V - 1);
    l2l_tensor *types_bad = random_ids(NEW(host, L2L_I32, B, S), 0, 1);
    check_poison(y7);
    l2l_layer_batch eb = ok;
    eb.tokens = tok, eb.token_types = types;
    CHECK_OK(l2l_layer_forward(NULL, emb, y, NULL, &eb)); /* the base call is fine */
    check_poison(y);
    bad = eb, bad.tokens = NULL;
    FORWARD_REFUSED("tokens", emb, y, NULL, &bad);
    bad.tokens = tok_f;
    FORWARD_REFUSED("tokens", emb, y, NULL, &bad);
    ((int32_t *)l2l_tensor_data(tok_bad))[B * S - 1] = (int32_t)V;
    bad.tokens = tok_bad;
    FORWARD_REFUSED("token", emb, y, NULL, &bad);
    ((int32_t *)l2l_tensor_data(tok_bad))[B * S - 1] = -1;
    FORWARD_REFUSED("token", emb, y, NULL, &bad);
    bad = eb, bad.token_types = NULL;
    FORWARD_REFUSED("token_types", emb, y, NULL, &bad);
    ((int32_t *)l2l_tensor_data(types_bad))[3] = 2;
    bad.token_types = types_bad;
    FORWARD_REFUSED("type", emb, y, NULL, &bad);
    bad = eb, bad.tokens = tok_long, bad.token_types = types_long;
    FORWARD_REFUSED("max_seq", emb, y7, NULL, &bad);
    FORWARD_REFUSED("y", emb, y_long, NULL, &eb);

    /* LM head (V 11) and classifier (C 5). */
    l2l_tensor *targets = random_ids(NEW(host, L2L_I32, B, S), 0, V - 1), *targets_b = NEW(host, L2L_I32, B);
    l2l_tensor *targets_f = F32(B, S), *targets_bad = random_ids(NEW(host, L2L_I32, B, S), 0, V - 1);
    l2l_tensor *losses = F32(B, S), *logits = F32(B, S, V);
    l2l_tensor *cls_targets = NEW(host, L2L_I32, B), *cls_losses = F32(B);
    check_poison(losses), check_poison(logits), check_poison(cls_losses);
    CHECK_OK(l2l_tensor_fill(targets_b, 0.0));
    ((int32_t *)l2l_tensor_data(cls_targets))[0] = 1;
    ((int32_t *)l2l_tensor_data(cls_targets))[1] = (int32_t)kc.classes;
    l2l_layer_batch hb = ok;
    hb.targets = targets;
    bad = hb, bad.targets = targets_b;
    FORWARD_REFUSED("targets", head, losses, x, &bad);
    bad.targets = targets_f;
    FORWARD_REFUSED("targets", head, losses, x, &bad);
    ((int32_t *)l2l_tensor_data(targets_bad))[2] = (int32_t)V;
    bad.targets = targets_bad;
    FORWARD_REFUSED("target", head, losses, x, &bad);
    ((int32_t *)l2l_tensor_data(targets_bad))[2] = -2;
    FORWARD_REFUSED("target", head, losses, x, &bad);
    FORWARD_REFUSED("y", head, logits, x, &hb);
    FORWARD_REFUSED("y", head, losses, x, &ok); /* no targets: logits wanted */
    FORWARD_REFUSED("x", head, losses, x_wide, &hb);
    FORWARD_REFUSED("x", head, losses, NULL, &hb);
    bad = ok, bad.targets = targets;
    FORWARD_REFUSED("targets", cls, cls_losses, x, &bad);
    bad.targets = cls_targets;
    FORWARD_REFUSED("target", cls, cls_losses, x, &bad);
    ((int32_t *)l2l_tensor_data(cls_targets))[1] = 0;
    FORWARD_REFUSED("y", cls, losses, x, &bad);
    FREE(x, y, x_wide, x_flat, x_int, y_long, y_half, y_dev, x_dev, mask, mask_long, mask_f,
         mask_dev, tok, types, tok_f, tok_long, types_long, y7, tok_bad, types_bad, targets,
         targets_b, targets_f, targets_bad, losses, logits, cls_targets, cls_losses);
  }
  l2l_layer_free(block), l2l_layer_free(dev_block), l2l_layer_free(emb);
  l2l_layer_free(head), l2l_layer_free(cls);
}

/* Every gradient of a layer, to verify that a refused call left them alone. */
static void **grads_snapshot(const l2l_layer *layer) {
  int n = l2l_layer_param_count(layer);
  void **snap = xmalloc((size_t)n * sizeof(void *));
  for (int i = 0; i < n; i++) snap[i] = snapshot(l2l_param_grad(l2l_layer_param(layer, i)));
  return snap;
}

static bool grads_unchanged(const l2l_layer *layer, void **snap) {
  bool same = true;
  for (int i = 0; i < l2l_layer_param_count(layer); i++)
    same &= same_bytes(l2l_param_grad(l2l_layer_param(layer, i)), snap[i]);
  return same;
}

static void grads_free(const l2l_layer *layer, void **snap) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++) free(snap[i]);
  free(snap);
}

/* A backward that must be refused: r's dx keeps its poison and no gradient of r's layer
   moves (the saved state must still serve the real backward afterwards). */
static void backward_refused(int line, const struct run *r, l2l_status status, const char *needle,
                             l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                             l2l_saved *saved, const l2l_layer_batch *batch) {
  void **grads = grads_snapshot(r->layer);
  void *dx0 = snapshot(r->dx);
  char expr[64];
  snprintf(expr, sizeof expr, "refused backward (line %d)", line);
  refused_at(l2l_layer_backward(layer, dx, dy, saved, batch), status, needle, __FILE__, line, expr);
  check_that(grads_unchanged(r->layer, grads) && same_bytes(r->dx, dx0), __FILE__, line, expr,
             "a refused backward changed a gradient or dx");
  grads_free(r->layer, grads);
  free(dx0);
}
#define BACKWARD_REFUSED(run, status, needle, ...) \
  backward_refused(__LINE__, (run), (status), (needle), __VA_ARGS__)

TEST(layer_backward_refuses_bad_calls) {
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  c.dropout = 0.1f;
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
  if (layer == NULL) return;
  randomize_params(layer);
  struct run r;
  run_init(&r, layer, 2, 5, L2L_POOL_HOST, 1);
  l2l_saved *saved = NULL;
  if (CHECK_OK(l2l_layer_forward(&saved, layer, r.y, r.x, &r.batch))) {
    for (int i = 0; i < l2l_layer_param_count(layer); i++)
      fill_normal(l2l_param_grad(l2l_layer_param(layer, i)), 1.0);
    check_poison(r.dx);
    l2l_tensor *wide = F32(2, 5, c.dim + 1), *half = NEW(L2L_POOL_HOST, L2L_F16, 2, 5, c.dim);
    l2l_tensor *dev = NEW(L2L_POOL_DEVICE, L2L_F32, 2, 5, c.dim);
    l2l_tensor *more = F32(3, 5, c.dim), *more_dy = fill_normal(F32(3, 5, c.dim), 1.0);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "layer", NULL, r.dx, r.dy, saved, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "saved", layer, r.dx, r.dy, NULL, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "batch", layer, r.dx, r.dy, saved, NULL);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "dx", layer, NULL, r.dy, saved, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "dy", layer, r.dx, NULL, saved, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "dx", layer, wide, r.dy, saved, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "dy", layer, r.dx, wide, saved, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "dx", layer, half, r.dy, saved, &r.batch);
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "device", layer, dev, r.dy, saved, &r.batch);
    /* dx and dy of another B than the forward's. */
    BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "", layer, more, more_dy, saved, &r.batch);
    /* The saved state survived every refusal; it serves one backward, then no more. */
    CHECK_OK(l2l_layer_backward(layer, r.dx, r.dy, saved, &r.batch));
    check_poison(r.dx);
    BACKWARD_REFUSED(&r, L2L_ERR_STATE, "saved", layer, r.dx, r.dy, saved, &r.batch);
    FREE(wide, half, dev, more, more_dy);
  }
  l2l_saved_free(saved);
  run_free(&r);
  l2l_layer_free(layer);
}

/* A saved state's buffers are laid out for the layer and config that made it: a block of
   the same kind but a wider MLP, more heads, or the other memory mode would read them out
   of bounds, and a clone (same config) is still another layer. Each is refused, changes no
   gradient of either layer, and the saved state then serves its own layer's backward. */
TEST(layer_backward_refuses_a_saved_state_of_another_layer) {
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  c.dropout = 0.1f;
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
  if (layer == NULL) return;
  randomize_params(layer);
  l2l_layer_config wider = c, more_heads = c, frugal = c;
  wider.mlp = 2 * c.mlp;
  more_heads.heads = 2 * c.heads;
  frugal.memory = L2L_MEMORY_FRUGAL;
  l2l_layer *others[4] = {new_layer(&wider, L2L_POOL_HOST), new_layer(&more_heads, L2L_POOL_HOST),
                          new_layer(&frugal, L2L_POOL_HOST), NULL};
  CHECK_OK(l2l_layer_clone(&others[3], layer));
  struct run r;
  run_init(&r, layer, 3, 7, L2L_POOL_HOST, 1);
  l2l_saved *saved = NULL;
  if (CHECK_OK(l2l_layer_forward(&saved, layer, r.y, r.x, &r.batch))) {
    check_poison(r.dx);
    for (int i = 0; i < 4; i++) {
      if (others[i] == NULL) continue;
      void **theirs = grads_snapshot(others[i]);
      BACKWARD_REFUSED(&r, L2L_ERR_INVALID, "another", others[i], r.dx, r.dy, saved, &r.batch);
      CHECK(grads_unchanged(others[i], theirs), "layer %d's gradients moved", i);
      grads_free(others[i], theirs);
    }
    /* The layer itself, its config changed since the forward, then changed back. */
    CHECK_OK(l2l_layer_set_memory(layer, L2L_MEMORY_FRUGAL));
    BACKWARD_REFUSED(&r, L2L_ERR_STATE, "changed", layer, r.dx, r.dy, saved, &r.batch);
    CHECK_OK(l2l_layer_set_memory(layer, L2L_MEMORY_STANDARD));
    CHECK_OK(l2l_layer_backward(layer, r.dx, r.dy, saved, &r.batch));
    check_poison(r.dx);
  }
  l2l_saved_free(saved);
  run_free(&r);
  for (int i = 0; i < 4; i++) l2l_layer_free(others[i]);
  l2l_layer_free(layer);
}

TEST(layer_tie_refuses_mismatches) {
  l2l_layer_config hc = base_config(L2L_LAYER_LM_HEAD);
  hc.final_ln = 1;
  l2l_layer_config ec = base_config(L2L_LAYER_EMBEDDING);
  l2l_layer_config wide = ec, longer = ec, bc = base_config(L2L_LAYER_BLOCK);
  wide.dim = 16, longer.vocab = 13;
  l2l_layer *head = new_layer(&hc, L2L_POOL_HOST), *emb = new_layer(&ec, L2L_POOL_HOST);
  l2l_layer *emb_wide = new_layer(&wide, L2L_POOL_HOST);
  l2l_layer *emb_long = new_layer(&longer, L2L_POOL_HOST);
  l2l_layer *block = new_layer(&bc, L2L_POOL_HOST), *emb_dev = new_layer(&ec, L2L_POOL_DEVICE);
  if (head && emb && emb_wide && emb_long && block && emb_dev) {
    l2l_param *proj = find_param(head, "proj.weight");
    l2l_layer *heads[] = {head, head, head, block, NULL, head, head};
    l2l_layer *embs[] = {emb_wide, emb_long, block, emb, emb, NULL, emb_dev};
    for (int i = 0; i < 7; i++) {
      if (!CHECK_REFUSED(l2l_layer_tie(heads[i], embs[i]), L2L_ERR_INVALID, ""))
        fprintf(stderr, "    (bad tie %d)\n", i);
      CHECK(find_param(head, "proj.weight") == proj && l2l_param_users(proj) == 1 &&
                l2l_layer_param_count(head) == 3,
            "bad tie %d changed the head", i);
    }
    CHECK(l2l_param_users(find_param(emb_wide, "wte")) == 1 &&
              l2l_param_users(find_param(emb_long, "wte")) == 1,
          "a refused tie added a user to an embedding's wte");
    CHECK_OK(l2l_layer_tie(head, emb)); /* the refusals were for the mismatches */
  }
  l2l_layer_free(head), l2l_layer_free(emb), l2l_layer_free(emb_wide);
  l2l_layer_free(emb_long), l2l_layer_free(block), l2l_layer_free(emb_dev);
}

TEST(layer_setters_and_queries_refuse_bad_values) {
  l2l_layer_config c = base_config(L2L_LAYER_BLOCK);
  l2l_layer *layer = new_layer(&c, L2L_POOL_HOST);
  if (layer) {
    uint32_t id = l2l_layer_rng_id(layer);
    CHECK_REFUSED(l2l_layer_set_memory(layer, (l2l_memory_mode)2), L2L_ERR_INVALID, "memory");
    CHECK_REFUSED(l2l_layer_set_memory(NULL, L2L_MEMORY_FRUGAL), L2L_ERR_INVALID, "layer");
    CHECK_REFUSED(l2l_layer_set_rng_id(layer, 1u << 24), L2L_ERR_INVALID, "rng_id");
    l2l_layer_config back;
    CHECK_OK(l2l_layer_get_config(&back, layer));
    CHECK(back.memory == L2L_MEMORY_STANDARD && l2l_layer_rng_id(layer) == id,
          "a refused setter changed the layer");
    l2l_layer_memory mem, mem0;
    memset(&mem, 0xA5, sizeof mem);
    mem0 = mem;
    CHECK_REFUSED(l2l_layer_memory_use(&mem, layer, 0, 5), L2L_ERR_INVALID, "micro_batch");
    CHECK_REFUSED(l2l_layer_memory_use(&mem, layer, 2, -5), L2L_ERR_INVALID, "seq");
    CHECK_REFUSED(l2l_layer_memory_use(&mem, NULL, 2, 5), L2L_ERR_INVALID, "layer");
    CHECK_REFUSED(l2l_layer_memory_use(NULL, layer, 2, 5), L2L_ERR_INVALID, "out");
    /* sizes within 2^24 each whose products overflow the plan's int64 arithmetic */
    CHECK_REFUSED(l2l_layer_memory_use(&mem, layer, 1 << 24, 1 << 24), L2L_ERR_INVALID,
                  "more than a tensor can hold");
    l2l_layer_config ec = base_config(L2L_LAYER_EMBEDDING);
    l2l_layer *embedding = new_layer(&ec, L2L_POOL_HOST);
    if (embedding) {
      l2l_layer_memory fits;
      CHECK_OK(l2l_layer_memory_use(&fits, embedding, 2, ec.max_seq));
      CHECK_REFUSED(l2l_layer_memory_use(&mem, embedding, 2, ec.max_seq + 1), L2L_ERR_INVALID,
                    "max_seq");
      l2l_layer_free(embedding);
    }
    CHECK(memcmp(&mem, &mem0, sizeof mem) == 0, "a refused memory_use wrote its output");
    l2l_layer *copy = NULL;
    CHECK_REFUSED(l2l_layer_clone(&copy, NULL), L2L_ERR_INVALID, "layer");
    CHECK(copy == NULL, "a refused clone wrote *out");
    CHECK_REFUSED(l2l_layer_zero_grad(NULL), L2L_ERR_INVALID, "layer");
    CHECK_REFUSED(l2l_layer_get_config(NULL, layer), L2L_ERR_INVALID, "out");
    CHECK(l2l_layer_param_count(NULL) == -1 && l2l_layer_param(layer, -1) == NULL &&
              l2l_layer_param(layer, l2l_layer_param_count(layer)) == NULL,
          "parameter queries out of range");
    l2l_layer_free(NULL);
    l2l_saved_free(NULL);
    CHECK(l2l_saved_bytes(NULL) == 0, "l2l_saved_bytes(NULL)");
  }
  l2l_layer_free(layer);
}
