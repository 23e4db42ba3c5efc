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
 * All test names start with "layer_", so `l2l_ctest layer_` runs just these files:
 * test_layers.c (each kind against its mirror, parameters, clones), test_layers_modes.c
 * (frugal against standard, 16-bit weights, micro-batch splits, the byte account) and
 * test_layers_refusals.c; the mirror and the tolerances are layer_mirror.h's.
 * Must never: take an expected value from the library's layer code (frugal against
 * standard is the one comparison of the library with itself, and its point). The one
 * fact taken from below l2l.h is how a Philox draw index maps to counter and word
 * (src/core/rng.c, the layout l2l.h's "see l2l_tensor_uniform" points to), and the first test
 * proves it is the one l2l_dropout_forward uses.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_mirror.h"

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
