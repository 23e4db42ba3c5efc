/* SPDX-License-Identifier: MIT */
/* test_layers_modes.c — the layers' modes, each against the library's plain way on the same
 * inputs: frugal against standard where frugal is hard (GELU inputs at its minimum,
 * LayerNorm weights at or near zero, the LM head), 16-bit weights against f32 weights
 * rounded alike, a block's micro-batch splits against the whole batch; and the bytes each
 * mode keeps, l2l_layer_memory_use against the device pool's byte counts to the byte
 * (frugal saving less, and no S x S). test_layers.c says how the layer files test; the
 * mirror and the tolerances are layer_mirror.h's. All test names start with "layer_".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_mirror.h"
#include "layers/layers.h"

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

/* The same normwise: ||got - want|| / ||want|| within tol. */
static void compare_tensor_norm(const char *what, const char *name, const l2l_tensor *got,
                                const l2l_tensor *want, double tol) {
  char label[256];
  snprintf(label, sizeof label, "%s: %s", what, name);
  const double err = check_norm_err(check_data(got), check_data(want), numel(want));
  CHECK_WITHIN(err, tol, label, "%s: normwise relative error %.3g > %.3g", label, err, tol);
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
   weight's dtype gives garbage). Each rounding moves an activation by up to 2^-8 (bf16) or
   2^-11 (f16) of itself, and each output sums many such moves: normwise, a few times that.
   Held normwise, not element by element: an element can sit on a cancellation (a gradient
   through softmax's dP - D, a LayerNorm row of small variance) and keep its terms' error at
   a fraction of its own size, a heavy tail: held element-wise at these tolerances with the
   rms as floor, 8 of 3000 seeds failed (an element of attn.qkv.weight's gradient 1.9 times
   over), while the largest normwise error of the 3000, over every output of every kind, was
   0.42 of its tolerance. Garbage (a wrong dtype, a NaN) is off by O(1) normwise. */
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
        param_bind(p, half[i], l2l_param_grad(p));
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
        compare_tensor_norm(what, "y", r.y, twin.y, tol);
        if (r.dx) compare_tensor_norm(what, "dx", r.dx, twin.dx, 2 * tol);
        for (int i = 0; i < l2l_layer_param_count(layer); i++) {
          l2l_param *p = l2l_layer_param(layer, i), *q = find_param(twin_layer, l2l_param_name(p));
          compare_tensor_norm(what, l2l_param_name(p), l2l_param_grad(p), l2l_param_grad(q),
                              2 * tol);
        }
      }
      for (int i = 0; i < l2l_layer_param_count(layer); i++) {
        if (half[i]) param_bind(l2l_layer_param(layer, i), NULL, NULL);
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

/* Bytes an allocation of n elements of `size` bytes is counted as. */
static uint64_t counted(int64_t n, int size) {
  return ((uint64_t)n * (uint64_t)size + L2L_ALIGN - 1) / L2L_ALIGN * L2L_ALIGN;
}

/* With 16-bit weights a layer keeps the activations that only its GEMMs read in their
   dtype, written so by the ops that make them: the statement (layer_memory_in, the relay's
   plans) keeps exactly those buffers' other halves fewer bytes than with f32 weights, and
   the forward allocates what it states. Which activations those are is this test's own
   reading of the layers: a pre-LN block's two LayerNorm outputs (N x D) unless frugal
   mode rebuilds its backward from them, attention's inputs q, k, v (one N x 3D buffer) and
   output (N x D) in either mode (attention reads them widened), and the GELU output (N x
   F) in standard mode (its backward reads the pre-activation); an LM head's final LayerNorm output likewise, and
   its logits' gradient (N x V, each row padded to 8 elements: 16-byte aligned, as a GPU's
   GEMMs want) in either mode (only the projection's GEMMs read it). */
TEST(layer_16bit_weights_keep_gemm_inputs_in_16_bits) {
  for (int kind = 0; kind < 6; kind++) {
    const bool block = kind < 4, frugal = kind & 1, post = kind >= 2 && kind < 4;
    l2l_layer_config c = base_config(block ? L2L_LAYER_BLOCK : L2L_LAYER_LM_HEAD);
    c.memory = frugal ? L2L_MEMORY_FRUGAL : L2L_MEMORY_STANDARD;
    if (block) c.post_ln = post, c.causal = !post, c.dropout = 0.1f, c.bias = kind != 2;
    else c.final_ln = 1;
    const l2l_dtype dtype = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
    l2l_layer *layer = new_layer(&c, L2L_POOL_DEVICE);
    if (layer == NULL) continue;
    randomize_params(layer);
    struct run r;
    run_init(&r, layer, PICK(2, 3), PICK(5, 7), L2L_POOL_DEVICE, block);
    const int64_t N = r.B * r.S, vocab_row = (c.vocab + 7) / 8 * 8;
    int64_t pairs_nd = 0, pairs_nf = 0;   /* buffers kept 16-bit */
    if (block) pairs_nd = !post && !frugal ? 3 : 1;
    if (block && !frugal) pairs_nf = 1;
    if (!block && !frugal) pairs_nd = 1;
    const uint64_t fewer = (uint64_t)pairs_nd * (counted(N * c.dim, 4) - counted(N * c.dim, 2)) +
                           (uint64_t)pairs_nf * (counted(N * c.mlp, 4) - counted(N * c.mlp, 2)) +
                           (block ? counted(N * 3 * c.dim, 4) - counted(N * 3 * c.dim, 2) : 0) +
                           (block ? 0 : counted(N * vocab_row, 4) - counted(N * vocab_row, 2));
    char what[128];
    snprintf(what, sizeof what, "%s %s, %s, %s weights, B=%lld S=%lld", block ? "block" : "LM head",
             post ? "post-LN" : "pre-LN", frugal ? "frugal" : "standard", l2l_dtype_name(dtype),
             (long long)r.B, (long long)r.S);
    l2l_layer_memory m32, m16;
    layer_memory_in(&m32, layer, r.B, r.S, L2L_F32, r.batch.training);
    layer_memory_in(&m16, layer, r.B, r.S, dtype, r.batch.training);
    CHECK(m32.saved - m16.saved == fewer, "%s: keeps %lld bytes fewer than with f32 weights, "
          "expected %llu", what, (long long)(m32.saved - m16.saved), (unsigned long long)fewer);
    l2l_tensor *half[MAX_PARAMS] = {0};
    for (int i = 0; i < l2l_layer_param_count(layer); i++) {
      l2l_param *p = l2l_layer_param(layer, i);
      if (!low_precision_name(&c, l2l_param_name(p))) continue;
      l2l_tensor *v = l2l_param_value(p);
      half[i] = check_tensor(L2L_POOL_DEVICE, dtype, l2l_tensor_ndim(v),
                             (int64_t[]){l2l_tensor_dim(v, 0), l2l_tensor_dim(v, 1)});
      CHECK_OK(l2l_tensor_cast(half[i], v));
      param_bind(p, half[i], l2l_param_grad(p));
    }
    uint64_t before = stats_of(L2L_POOL_DEVICE).current;
    l2l_saved *saved = NULL;
    if (CHECK_OK(l2l_layer_forward(&saved, layer, r.y, r.x, &r.batch))) {
      CHECK(stats_of(L2L_POOL_DEVICE).current - before == m16.saved &&
            l2l_saved_bytes(saved) == m16.saved, "%s: the forward kept %llu bytes, the "
            "statement says %llu", what, (unsigned long long)(stats_of(L2L_POOL_DEVICE).current - before),
            (unsigned long long)m16.saved);
      if (kind == 0) {   /* weights bound otherwise since: its 16-bit buffers are refused */
        for (int i = 0; i < l2l_layer_param_count(layer); i++)
          if (half[i]) param_bind(l2l_layer_param(layer, i), NULL, NULL);
        l2l_status st = l2l_layer_backward(layer, r.dx, r.dy, saved, &r.batch);
        CHECK(st == L2L_ERR_STATE && strstr(l2l_last_error(), "run the forward again"),
              "%s: a backward with f32 weights took a 16-bit forward's state: %s", what,
              st == L2L_OK ? "ok" : l2l_last_error());
      } else {
        CHECK_OK(l2l_layer_backward(layer, r.dx, r.dy, saved, &r.batch));
      }
      l2l_saved_free(saved);
    }
    for (int i = 0; i < l2l_layer_param_count(layer); i++) {
      if (half[i] && kind != 0) param_bind(l2l_layer_param(layer, i), NULL, NULL);
      l2l_tensor_free(half[i]);
    }
    run_free(&r);
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
