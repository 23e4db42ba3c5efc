/* SPDX-License-Identifier: MIT */
/* test_layers_refusals.c — the layers' refusals: bad configs to l2l_layer_new (and the
 * fields a kind ignores), bad forward and backward calls (shapes, dtypes, pools, a saved
 * state of another layer), mismatched ties, and setters and queries given bad values. A
 * refusal names what is wrong and changes nothing (a parameter gradient stays as it was).
 * All test names start with "layer_"; layer_mirror.h holds the harness.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_mirror.h"

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
  layer_refused_at(l2l_layer_forward(&saved, layer, y, x, batch), L2L_ERR_INVALID, needle,
                   __FILE__, line, expr);
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
  layer_refused_at(l2l_layer_backward(layer, dx, dy, saved, batch), status, needle, __FILE__, line,
                   expr);
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
