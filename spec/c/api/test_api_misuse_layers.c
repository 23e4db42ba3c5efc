/* SPDX-License-Identifier: MIT */
/* test_api_misuse_layers.c — the layers of include/l2l.h called with what they must refuse:
 * making, cloning, tying and freeing layers; their settings and accessors; the calls of a
 * block, an input layer and the heads; custom layers (l2l_layer_kind_register and their
 * calls). test_api_misuse.c says what a refusal must do (the documented status, a message
 * naming what is wrong, set by this call, and nothing changed: watched tensors' bytes and
 * handles, *out, the pools' bytes in use) and how; misuse.h holds the harness. Which tests
 * cover which functions is said above each test. All test names start with "misuse_".
 */
#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"

/* ---------------------------------------------------------------- layers */

/* A config every built-in kind accepts (each reads its fields): D 8, 2 heads, F 16, V 11,
   6 positions, 3 classes, a final LayerNorm. */
static l2l_layer_config config_of(l2l_layer_kind kind) {
  l2l_layer_config c = block_config();
  c.kind = kind;
  c.vocab = 11, c.max_seq = 6, c.classes = 3, c.final_ln = 1;
  return c;
}

/* Every parameter record of a layer and its count of users, to compare after refusals. */
struct records {
  int n;
  l2l_param *param[16];
  int users[16];
};
static struct records records_of(const l2l_layer *layer) {
  struct records r = {0};
  r.n = l2l_layer_param_count(layer);
  for (int i = 0; i < r.n && i < 16; i++) {
    r.param[i] = l2l_layer_param(layer, i);
    r.users[i] = l2l_param_users(r.param[i]);
  }
  return r;
}
static bool same_records(const l2l_layer *layer, const struct records *r) {
  struct records now = records_of(layer);
  return now.n == r->n && memcmp(now.param, r->param, sizeof now.param) == 0 &&
         memcmp(now.users, r->users, sizeof now.users) == 0;
}

/* Covers: l2l_layer_new, l2l_layer_clone, l2l_layer_tie, l2l_layer_free. */
TEST(misuse_layer_new_clone_tie_and_free) {
  l2l_layer *out = SENTINEL(l2l_layer);
  l2l_layer_config base = config_of(L2L_LAYER_BLOCK);
  REFUSES(l2l_layer_new(NULL, &base, L2L_POOL_HOST), L2L_ERR_INVALID, "out");
  REFUSES(l2l_layer_new(&out, NULL, L2L_POOL_HOST), L2L_ERR_INVALID, "config");
  for (int i = 0; i < BAD_POOLS; i++)
    REFUSES(l2l_layer_new(&out, &base, (l2l_pool_kind)bad_pools[i]), L2L_ERR_INVALID, "pool");
  static struct {
    const char *needle;
    l2l_layer_config c;
  } bad[128];
  int nb = 0;
#define BAD(kind_, needle_, stmt)       \
  do {                                  \
    bad[nb].needle = (needle_);         \
    bad[nb].c = config_of(kind_);       \
    {                                   \
      l2l_layer_config *c = &bad[nb].c; \
      stmt;                             \
    }                                   \
    nb++;                               \
  } while (0)
  BAD(L2L_LAYER_BLOCK, "kind with number 99", c->kind = (l2l_layer_kind)99);
  BAD(L2L_LAYER_BLOCK, "kind with number -1", c->kind = (l2l_layer_kind)-1);
  BAD(L2L_LAYER_BLOCK, "kind with number 5", c->kind = (l2l_layer_kind)5);
  BAD(L2L_LAYER_CUSTOM, "l2l_layer_new_custom", (void)c);
  for (int k = L2L_LAYER_EMBEDDING; k <= L2L_LAYER_CLASSIFIER; k++) {
    l2l_layer_kind kind = (l2l_layer_kind)k;
    BAD(kind, "dim", c->dim = 0);
    BAD(kind, "dim", c->dim = -1);
    BAD(kind, "dim", c->dim = INT64_MIN);
    BAD(kind, "dim", c->dim = INT64_MAX);
    BAD(kind, "dim", c->dim = (INT64_C(1) << 24) + 1);
    BAD(kind, "init_std", c->init_std = 0);
    BAD(kind, "init_std", c->init_std = -1);
    BAD(kind, "init_std", c->init_std = NAN);
    BAD(kind, "init_std", c->init_std = INFINITY);
    BAD(kind, "dropout", c->dropout = 1);
    BAD(kind, "dropout", c->dropout = -0.1f);
    BAD(kind, "dropout", c->dropout = NAN);
  }
  BAD(L2L_LAYER_BLOCK, "heads", c->heads = 0);
  BAD(L2L_LAYER_BLOCK, "heads", c->heads = -2);
  BAD(L2L_LAYER_BLOCK, "heads", c->heads = INT64_MAX);
  BAD(L2L_LAYER_BLOCK, "divide", c->heads = 3);
  BAD(L2L_LAYER_BLOCK, "mlp", c->mlp = 0);
  BAD(L2L_LAYER_BLOCK, "mlp", c->mlp = INT64_MIN);
  BAD(L2L_LAYER_BLOCK, "mlp", c->mlp = (INT64_C(1) << 24) + 1);
  BAD(L2L_LAYER_BLOCK, "causal", c->causal = 2);
  BAD(L2L_LAYER_BLOCK, "causal", c->causal = -1);
  BAD(L2L_LAYER_BLOCK, "post_ln", c->post_ln = 2);
  BAD(L2L_LAYER_BLOCK, "bias", c->bias = INT_MIN);
  BAD(L2L_LAYER_BLOCK, "memory", c->memory = (l2l_memory_mode)2);
  BAD(L2L_LAYER_BLOCK, "memory", c->memory = (l2l_memory_mode)-1);
  BAD(L2L_LAYER_BLOCK, "attn_dropout", c->attn_dropout = 1);
  BAD(L2L_LAYER_BLOCK, "attn_dropout", c->attn_dropout = NAN);
  BAD(L2L_LAYER_BLOCK, "resid_std", c->resid_std = 0);
  BAD(L2L_LAYER_BLOCK, "resid_std", c->resid_std = INFINITY);
  BAD(L2L_LAYER_BLOCK, "eps", c->eps = 0);
  BAD(L2L_LAYER_BLOCK, "eps", c->eps = -1e-5f);
  BAD(L2L_LAYER_BLOCK, "eps", c->eps = NAN);
  BAD(L2L_LAYER_EMBEDDING, "vocab", c->vocab = 0);
  BAD(L2L_LAYER_EMBEDDING, "vocab", c->vocab = INT64_MAX);
  BAD(L2L_LAYER_EMBEDDING, "max_seq", c->max_seq = -1);
  BAD(L2L_LAYER_EMBEDDING, "max_seq", c->max_seq = INT64_MIN);
  BAD(L2L_LAYER_EMBEDDING, "type_vocab", c->type_vocab = -1);
  BAD(L2L_LAYER_EMBEDDING, "type_vocab", c->type_vocab = (INT64_C(1) << 24) + 1);
  BAD(L2L_LAYER_LM_HEAD, "vocab", c->vocab = -11);
  BAD(L2L_LAYER_LM_HEAD, "final_ln", c->final_ln = 2);
  BAD(L2L_LAYER_LM_HEAD, "eps", c->eps = INFINITY);
  BAD(L2L_LAYER_CLASSIFIER, "classes", c->classes = 0);
  BAD(L2L_LAYER_CLASSIFIER, "classes", c->classes = INT64_MAX);
#undef BAD
  for (int i = 0; i < nb; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_layer_new case %d (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_layer_new(&out, &bad[i].c, L2L_POOL_HOST)), L2L_ERR_INVALID,
               bad[i].needle, __FILE__, __LINE__, expr);
  }
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_new");

  /* l2l_layer_config_params: the same configs refused with the same needles; count,
     out and capacity checked; nothing written on a refusal */
  l2l_param_info infos[L2L_MAX_PARAMS + 1];
  memset(infos, 0x5a, sizeof infos);
  unsigned char untouched[sizeof infos];
  memcpy(untouched, infos, sizeof infos);
  int count = -7;
  for (int i = 0; i < nb; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_layer_config_params case %d (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, &bad[i].c)),
               L2L_ERR_INVALID, bad[i].needle, __FILE__, __LINE__, expr);
  }
  REFUSES(l2l_layer_config_params(infos, L2L_MAX_PARAMS, NULL, &base), L2L_ERR_INVALID, "count");
  REFUSES(l2l_layer_config_params(NULL, L2L_MAX_PARAMS, &count, &base), L2L_ERR_INVALID, "out");
  REFUSES(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, NULL), L2L_ERR_INVALID, "config");
  REFUSES(l2l_layer_config_params(infos, -1, &count, &base), L2L_ERR_INVALID, "room for");
  REFUSES(l2l_layer_config_params(infos, 0, &count, &base), L2L_ERR_INVALID, "room for");
  REFUSES(l2l_layer_config_params(infos, INT_MIN, &count, &base), L2L_ERR_INVALID, "room for");
  CHECK(memcmp(infos, untouched, sizeof infos) == 0, "a refused l2l_layer_config_params wrote out");
  CHECK_OK(l2l_layer_config_params(infos, INT_MAX, &count, &base));
  CHECK(count >= 1 && count <= L2L_MAX_PARAMS &&
            memcmp(&infos[count], &untouched[count * sizeof *infos], sizeof *infos) == 0,
        "l2l_layer_config_params: %d records, or it wrote past them", count);

  /* configs whose parameters cannot be made: refused, and what was made before is freed */
  if (stats_of(L2L_POOL_HOST).budget != 0) {
    l2l_layer_config c = config_of(L2L_LAYER_EMBEDDING);
    c.dim = INT64_C(1) << 20, c.vocab = 1, c.max_seq = INT64_C(1) << 24; /* wpe: 64 TiB */
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
    c = config_of(L2L_LAYER_LM_HEAD);
    c.dim = INT64_C(1) << 20, c.vocab = INT64_C(1) << 24;
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
    c = config_of(L2L_LAYER_CLASSIFIER);
    c.dim = INT64_C(1) << 24, c.classes = INT64_C(1) << 24;
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
    c = config_of(L2L_LAYER_BLOCK);
    c.dim = INT64_C(1) << 24, c.heads = 1, c.mlp = 1; /* attn.qkv.weight: 3 x 2^48 */
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_INVALID, "2^48");
  }
  /* a device budget that runs out half-way through a block's parameters */
  l2l_pool_stats dev = stats_of(L2L_POOL_DEVICE);
  l2l_layer *on_device = layer_in(&base, L2L_POOL_DEVICE);
  if (CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, stats_of(L2L_POOL_DEVICE).current + 4096))) {
    REFUSES(l2l_layer_new(&out, &base, L2L_POOL_DEVICE), L2L_ERR_BUDGET, "device pool");
    REFUSES(l2l_layer_clone(&out, on_device), L2L_ERR_BUDGET, "device pool");
    CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, dev.budget));
  }
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_new");

  /* clone: out, and a live layer */
  l2l_layer *block = small_block();
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  const l2l_layer *nots[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, t),
                             AS(l2l_layer, l2l_layer_param(block, 0))};
  REFUSES(l2l_layer_clone(NULL, block), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++)
    REFUSES(l2l_layer_clone(&out, nots[i]), L2L_ERR_INVALID, "layer");
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_clone");

  /* tie: a live LM head and a live embedding of its vocab and dim, in one domain */
  l2l_layer_config hc = config_of(L2L_LAYER_LM_HEAD), ec = config_of(L2L_LAYER_EMBEDDING);
  l2l_layer *head = layer_in(&hc, L2L_POOL_HOST), *emb = layer_in(&ec, L2L_POOL_HOST);
  l2l_layer *dev_head = layer_in(&hc, L2L_POOL_DEVICE);
  l2l_layer_config wc = ec;
  wc.vocab = 12;
  l2l_layer *emb12 = layer_in(&wc, L2L_POOL_HOST);
  wc = ec, wc.dim = 16;
  l2l_layer *emb16 = layer_in(&wc, L2L_POOL_HOST);
  watch_layer(head), watch_layer(emb);
  struct records hr = records_of(head), er = records_of(emb);
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    REFUSES(l2l_layer_tie((l2l_layer *)nots[i], emb), L2L_ERR_INVALID, "head");
    REFUSES(l2l_layer_tie(head, (l2l_layer *)nots[i]), L2L_ERR_INVALID, "embedding");
  }
  REFUSES(l2l_layer_tie(block, emb), L2L_ERR_INVALID, "head must be");
  REFUSES(l2l_layer_tie(emb, emb), L2L_ERR_INVALID, "head must be");
  REFUSES(l2l_layer_tie(head, block), L2L_ERR_INVALID, "embedding must be");
  REFUSES(l2l_layer_tie(head, head), L2L_ERR_INVALID, "embedding must be");
  REFUSES(l2l_layer_tie(head, emb12), L2L_ERR_INVALID, "vocab 12");
  REFUSES(l2l_layer_tie(head, emb16), L2L_ERR_INVALID, "dim 16");
  REFUSES(l2l_layer_tie(dev_head, emb), L2L_ERR_INVALID, "pool");
  CHECK(same_records(head, &hr) && same_records(emb, &er), "records changed by a refused tie");
  unwatch();
  CHECK_OK(l2l_layer_tie(head, emb));
  CHECK(l2l_layer_param(head, l2l_layer_param_count(head) - 1) == l2l_layer_param(emb, 0),
        "the tie after refusals");

  /* destructors ignore what is no layer */
  uint64_t host = stats_of(L2L_POOL_HOST).current;
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) l2l_layer_free((l2l_layer *)nots[i]);
  CHECK(stats_of(L2L_POOL_HOST).current == host, "l2l_layer_free freed something");
  CHECK(l2l_tensor_numel(t) == 8 && l2l_param_name(l2l_layer_param(block, 0)) != NULL,
        "a tensor or a record was hurt by l2l_layer_free");
  CHECK_OK(l2l_layer_clone(&out, block));
  l2l_layer_free(out);
  l2l_tensor_free(t);
  l2l_layer *all[] = {on_device, block, head, emb, dev_head, emb12, emb16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) l2l_layer_free(all[i]);
}

/* Covers: l2l_layer_get_config, l2l_layer_set_memory, l2l_layer_rng_id,
   l2l_layer_set_rng_id, l2l_layer_param_count, l2l_layer_param, l2l_layer_nparams,
   l2l_layer_zero_grad, l2l_layer_memory_use, l2l_layer_name, l2l_param_name,
   l2l_param_value, l2l_param_grad, l2l_param_numel, l2l_param_users, l2l_param_decays,
   l2l_param_shape, l2l_param_write. */
TEST(misuse_layer_settings_and_accessors) {
  l2l_layer *block = small_block();
  l2l_layer_config ec = config_of(L2L_LAYER_EMBEDDING);
  l2l_layer *emb = layer_in(&ec, L2L_POOL_HOST);
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  unsigned char stack_bytes[256];
  memset(stack_bytes, 0, sizeof stack_bytes);
  const l2l_layer *nots[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, t),
                             AS(l2l_layer, l2l_layer_param(block, 0)), AS(l2l_layer, stack_bytes)};
  watch_layer(block);
  l2l_layer_config cfg, poisoned, before;
  memset(&poisoned, 0xa5, sizeof poisoned);
  CHECK_OK(l2l_layer_get_config(&before, block));
  uint32_t rng = l2l_layer_rng_id(block);
  REFUSES(l2l_layer_get_config(NULL, block), L2L_ERR_INVALID, "out");
  l2l_layer_memory mem, mem_poisoned;
  memset(&mem_poisoned, 0xa5, sizeof mem_poisoned);
  mem = mem_poisoned;
  REFUSES(l2l_layer_memory_use(NULL, block, 2, 3), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    const l2l_layer *n = nots[i];
    cfg = poisoned;
    REFUSES(l2l_layer_get_config(&cfg, n), L2L_ERR_INVALID, "layer");
    CHECK(memcmp(&cfg, &poisoned, sizeof cfg) == 0, "*out written by a refused get_config");
    REFUSES(l2l_layer_set_memory((l2l_layer *)n, L2L_MEMORY_FRUGAL), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_layer_set_rng_id((l2l_layer *)n, 5), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_layer_zero_grad((l2l_layer *)n), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_layer_memory_use(&mem, n, 2, 3), L2L_ERR_INVALID, "layer");
    CHECK(l2l_layer_rng_id(n) == 0 && l2l_layer_param_count(n) == -1 &&
              l2l_layer_param(n, 0) == NULL && l2l_layer_nparams(n) == -1 &&
              l2l_layer_name(n) == NULL,
          "case %zu: a layer accessor answered for what is no layer", i);
  }
  const int bad_modes[] = {2, -1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++)
    REFUSES(l2l_layer_set_memory(block, (l2l_memory_mode)bad_modes[i]), L2L_ERR_INVALID, "memory");
  const uint32_t bad_ids[] = {1u << 24, (1u << 24) + 1, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++)
    REFUSES(l2l_layer_set_rng_id(block, bad_ids[i]), L2L_ERR_INVALID, "rng_id");
  CHECK_OK(l2l_layer_get_config(&cfg, block));
  CHECK(memcmp(&cfg, &before, sizeof cfg) == 0 && l2l_layer_rng_id(block) == rng,
        "config or rng id changed by refusals");
  const int bad_index[] = {-1, 12, INT_MAX, INT_MIN, l2l_layer_param_count(block)};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++)
    CHECK(l2l_layer_param(block, bad_index[i]) == NULL, "param %d of a block", bad_index[i]);
  /* memory_use: sizes 1 to 2^24, within an embedding's positions, a call a tensor can hold */
  const int64_t bad_sizes[] = {0, -1, INT64_MIN, INT64_MAX, (INT64_C(1) << 24) + 1};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
    REFUSES(l2l_layer_memory_use(&mem, block, bad_sizes[i], 3), L2L_ERR_INVALID, "micro_batch");
    REFUSES(l2l_layer_memory_use(&mem, block, 2, bad_sizes[i]), L2L_ERR_INVALID, "seq");
  }
  REFUSES(l2l_layer_memory_use(&mem, emb, 2, 7), L2L_ERR_INVALID, "max_seq");
  REFUSES(l2l_layer_memory_use(&mem, block, INT64_C(1) << 24, INT64_C(1) << 24), L2L_ERR_INVALID,
          "2^48");
  REFUSES(l2l_layer_memory_use(&mem, block, INT64_C(1) << 20, INT64_C(1) << 14), L2L_ERR_INVALID,
          "2^48");
  CHECK(memcmp(&mem, &mem_poisoned, sizeof mem) == 0, "*out written by a refused memory_use");
  unwatch();
  CHECK_OK(l2l_layer_memory_use(&mem, block, 2, 3));
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_FRUGAL));
  CHECK_OK(l2l_layer_set_rng_id(block, (1u << 24) - 1));
  CHECK_OK(l2l_layer_zero_grad(block));

  /* parameter records */
  const l2l_param *not_params[] = {NULL, JUNK(l2l_param), AS(l2l_param, block), AS(l2l_param, t),
                                   AS(l2l_param, stack_bytes)};
  int64_t dims[L2L_MAX_DIMS];
  for (size_t i = 0; i < sizeof not_params / sizeof not_params[0]; i++) {
    const l2l_param *p = not_params[i];
    CHECK(l2l_param_name(p) == NULL && l2l_param_value(p) == NULL && l2l_param_grad(p) == NULL &&
              l2l_param_numel(p) == -1 && l2l_param_users(p) == -1 && l2l_param_decays(p) == -1 &&
              l2l_param_shape(p, dims) == -1,
          "case %zu: a record accessor answered for what is no record", i);
    REFUSES(l2l_param_write((l2l_param *)p, t), L2L_ERR_INVALID, "param");
  }
  /* a write: its shape and a float dtype, from a live tensor; a refused one writes nothing */
  l2l_param *w = l2l_layer_param(block, 0);   /* ln1.weight (D) */
  CHECK(l2l_param_shape(w, NULL) == -1, "shape into NULL");
  CHECK(l2l_param_shape(w, dims) == 1 && dims[0] == l2l_param_numel(w), "ln1.weight's shape");
  l2l_tensor *wrong = NEW(L2L_POOL_HOST, L2L_F32, dims[0] + 1), *ints = NEW(L2L_POOL_HOST, L2L_I32, dims[0]);
  l2l_tensor *src = NEW(L2L_POOL_HOST, L2L_BF16, dims[0]), *before_w = NEW(L2L_POOL_HOST, L2L_F32, dims[0]);
  CHECK_OK(l2l_tensor_fill(src, 0.375));
  CHECK_OK(l2l_tensor_copy(before_w, l2l_param_value(w)));
  const l2l_tensor *not_tensors[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, block), AS(l2l_tensor, w)};
  for (size_t i = 0; i < sizeof not_tensors / sizeof not_tensors[0]; i++)
    REFUSES(l2l_param_write(w, not_tensors[i]), L2L_ERR_INVALID, "src");
  REFUSES(l2l_param_write(w, wrong), L2L_ERR_INVALID, "src has shape (");
  REFUSES(l2l_param_write(w, ints), L2L_ERR_INVALID, "i32");
  CHECK(memcmp(l2l_tensor_data(before_w), l2l_tensor_data(l2l_param_value(w)),
               (size_t)dims[0] * sizeof(float)) == 0, "a refused write changed the value");
  CHECK_OK(l2l_param_write(w, src));   /* (bf16 widened: 0.375 exactly) */
  for (int64_t i = 0; i < dims[0]; i++)
    if (!CHECK(((const float *)l2l_tensor_data(l2l_param_value(w)))[i] == 0.375f, "element %lld "
               "of the write", (long long)i)) break;
  FREE(wrong, ints, src, before_w);
  CHECK(l2l_param_users(l2l_layer_param(block, 0)) == 1, "a record of one layer");
  for (int r = 0; r < l2l_layer_param_count(block); r++) {
    const l2l_param *p = l2l_layer_param(block, r);
    CHECK(l2l_param_numel(p) == l2l_tensor_numel(l2l_param_value(p)), "record %d's elements", r);
  }
  l2l_tensor_free(t);
  l2l_layer_free(block);
  l2l_layer_free(emb);
}

/* The record of a layer by name (NULL if none). */
static l2l_param *param_named(const l2l_layer *layer, const char *name) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++)
    if (strcmp(l2l_param_name(l2l_layer_param(layer, i)), name) == 0)
      return l2l_layer_param(layer, i);
  return NULL;
}

#define F32(...) poison(NEW(L2L_POOL_HOST, L2L_F32, __VA_ARGS__))

/* Covers: l2l_layer_forward, l2l_layer_backward, l2l_saved_free, l2l_saved_bytes (a block).
   Found here: a y, dx or dy sharing memory with the layer's own parameters or gradients was
   accepted (the call overwrote the weights it computed with); a first_sample near INT64_MAX
   overflowed int64 in the CPU attention's and the frugal backward's dropout indexes. */
TEST(misuse_block_calls) {
  enum { B = 2, S = 3, D = 8 };
  l2l_layer *block = small_block(), *copy = NULL;
  randomize_params(block);
  CHECK_OK(l2l_layer_clone(&copy, block));
  l2l_layer_config ec = config_of(L2L_LAYER_EMBEDDING);
  l2l_layer *emb = layer_in(&ec, L2L_POOL_HOST);
  l2l_tensor *x = check_randn(1.0, 3, B, S, D), *y = F32(B, S, D),
             *dy = check_randn(1.0, 3, B, S, D);
  l2l_tensor *dx = F32(B, S, D), *mask = ones_u8(DIMS(B, S));
  l2l_layer_batch bt = {.key_mask = mask, .seed = 7, .step = 3, .training = 1, .loss_scale = 1};
  watch_layer(block);
  WATCH(x, y, dy, dx, mask);
  const l2l_layer *nots[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, x),
                             AS(l2l_layer, l2l_layer_param(block, 0))};
  l2l_saved *saved = SENTINEL(l2l_saved);
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++)
    REFUSES(l2l_layer_forward(&saved, (l2l_layer *)nots[i], y, x, &bt), L2L_ERR_INVALID, "layer");
  REFUSES(l2l_layer_forward(&saved, block, y, x, NULL), L2L_ERR_INVALID, "batch");
  /* x: a live (B,S,D) f32 tensor in y's domain */
  l2l_tensor *xi = remake(x, L2L_POOL_HOST, L2L_I32), *x9 = F32(B, S, D + 1), *x2 = F32(B * S, D);
  l2l_tensor *x4 = F32(B, S, D, 1), *xdev = remake(x, L2L_POOL_DEVICE, L2L_F32);
  l2l_tensor *ydev = remake(y, L2L_POOL_DEVICE, L2L_F32);
  const l2l_tensor *bad_x[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, block), xi, x9, x2, x4};
  for (size_t i = 0; i < sizeof bad_x / sizeof bad_x[0]; i++)
    REFUSES(l2l_layer_forward(&saved, block, y, bad_x[i], &bt), L2L_ERR_INVALID, "x ");
  REFUSES(l2l_layer_forward(&saved, block, y, xdev, &bt), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_layer_forward(&saved, block, ydev, xdev, &bt), L2L_ERR_INVALID, "parameter");
  l2l_layer_config bc = block_config();
  l2l_layer *dev_block = layer_in(&bc, L2L_POOL_DEVICE);
  REFUSES(l2l_layer_forward(&saved, dev_block, y, x, &bt), L2L_ERR_INVALID, "parameter");
  l2l_layer_free(dev_block);
  /* y: (B,S,D) f32: transposed, off by one, flattened, another dtype */
  l2l_tensor *yt = F32(S, B, D), *ys = F32(B, D, S), *y9 = F32(B, S, D + 1), *y2 = F32(B * S, D);
  l2l_tensor *yi = remake(y, L2L_POOL_HOST, L2L_I32);
  WATCH(yt, ys, y9, y2, yi);
  const l2l_tensor *bad_y[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, block), yt, ys, y9, y2, yi};
  for (size_t i = 0; i < sizeof bad_y / sizeof bad_y[0]; i++)
    REFUSES(l2l_layer_forward(&saved, block, (l2l_tensor *)bad_y[i], x, &bt), L2L_ERR_INVALID,
            "y ");
  /* y overlapping x, or the layer's own parameters or gradients */
  l2l_tensor *both = check_randn(1.0, 3, B + 1, S, D), *lo = view(both, 0, B),
             *hi = view(both, 1, B);
  WATCH(both);
  REFUSES(l2l_layer_forward(&saved, block, x, x, &bt), L2L_ERR_INVALID, "overlap");
  REFUSES(l2l_layer_forward(&saved, block, hi, lo, &bt), L2L_ERR_INVALID, "overlap");
  l2l_param *fc = param_named(block, "mlp.fc.weight"); /* (8,16): 128 = 2 x 8 x 8 */
  l2l_tensor *x88 = check_randn(1.0, 3, 2, 8, D);
  l2l_tensor *in_value = RESHAPED(l2l_param_value(fc), 2, 8, D);
  l2l_tensor *in_grad = RESHAPED(l2l_param_grad(fc), 2, 8, D);
  l2l_tensor *mask88 = ones_u8(DIMS(2, 8));
  l2l_layer_batch b88 = bt;
  b88.key_mask = mask88;
  REFUSES(l2l_layer_forward(&saved, block, in_value, x88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
  REFUSES(l2l_layer_forward(&saved, block, in_grad, x88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
  /* batch fields */
  l2l_layer_batch b = bt;
  const int64_t bad_first[] = {-1, INT64_MIN};
  for (size_t i = 0; i < 2; i++) {
    b = bt, b.first_sample = bad_first[i];
    REFUSES(l2l_layer_forward(&saved, block, y, x, &b), L2L_ERR_INVALID, "first_sample");
  }
  const int bad_training[] = {2, -1, INT_MIN};
  for (size_t i = 0; i < 3; i++) {
    b = bt, b.training = bad_training[i];
    REFUSES(l2l_layer_forward(&saved, block, y, x, &b), L2L_ERR_INVALID, "training");
  }
  l2l_tensor *mi = remake(mask, L2L_POOL_HOST, L2L_I32), *mt = ones_u8(DIMS(S, B));
  l2l_tensor *m4 = ones_u8(DIMS(B, S + 1)), *mdev = remake(mask, L2L_POOL_DEVICE, L2L_U8);
  const l2l_tensor *bad_masks[] = {JUNK(l2l_tensor), AS(l2l_tensor, block), mi, mt, m4, mdev};
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++) {
    b = bt, b.key_mask = bad_masks[i];
    REFUSES(l2l_layer_forward(&saved, block, y, x, &b), L2L_ERR_INVALID, "key_mask");
  }
  CHECK(saved == SENTINEL(l2l_saved), "*saved written by a refused forward");

  /* a good forward, then the backward's refusals */
  saved = NULL;
  l2l_saved *other = NULL, *emb_saved = NULL;
  l2l_tensor *y_copy = F32(B, S, D), *tokens = IDS(11, B, S);
  l2l_tensor *emb_y = F32(B, S, D);
  l2l_layer_batch eb = {.tokens = tokens, .training = 1, .loss_scale = 1};
  if (!CHECK_OK(l2l_layer_forward(&saved, block, y, x, &bt)) ||
      !CHECK_OK(l2l_layer_forward(&other, copy, y_copy, x, &bt)) ||
      !CHECK_OK(l2l_layer_forward(&emb_saved, emb, emb_y, NULL, &eb)))
    goto done;
  CHECK(l2l_saved_bytes(saved) > 0, "a standard block keeps something");
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++)
    REFUSES(l2l_layer_backward((l2l_layer *)nots[i], dx, dy, saved, &bt), L2L_ERR_INVALID, "layer");
  REFUSES(l2l_layer_backward(block, dx, dy, saved, NULL), L2L_ERR_INVALID, "batch");
  const l2l_saved *not_saved[] = {NULL, JUNK(l2l_saved), AS(l2l_saved, x), AS(l2l_saved, block)};
  for (size_t i = 0; i < sizeof not_saved / sizeof not_saved[0]; i++)
    REFUSES(l2l_layer_backward(block, dx, dy, (l2l_saved *)not_saved[i], &bt), L2L_ERR_INVALID,
            "saved");
  REFUSES(l2l_layer_backward(block, dx, dy, other, &bt), L2L_ERR_INVALID, "another");
  REFUSES(l2l_layer_backward(block, dx, dy, emb_saved, &bt), L2L_ERR_INVALID, "saved comes from");
  REFUSES(l2l_layer_backward(emb, NULL, dy, saved, &eb), L2L_ERR_INVALID, "saved comes from");
  for (size_t i = 0; i < sizeof bad_y / sizeof bad_y[0]; i++) {
    REFUSES(l2l_layer_backward(block, dx, bad_y[i], saved, &bt), L2L_ERR_INVALID, "dy ");
    REFUSES(l2l_layer_backward(block, (l2l_tensor *)bad_y[i], dy, saved, &bt), L2L_ERR_INVALID,
            "dx ");
  }
  REFUSES(l2l_layer_backward(block, dy, dy, saved, &bt), L2L_ERR_INVALID, "overlap");
  l2l_layer_memory mem;
  CHECK_OK(l2l_layer_memory_use(&mem, block, B, S));
  if (mem.input_kept > 0)
    REFUSES(l2l_layer_backward(block, x, dy, saved, &bt), L2L_ERR_INVALID, "saved state");
  l2l_tensor *dydev = remake(dy, L2L_POOL_DEVICE, L2L_F32),
             *dxdev = remake(dx, L2L_POOL_DEVICE, L2L_F32);
  REFUSES(l2l_layer_backward(block, dx, dydev, saved, &bt), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_layer_backward(block, dxdev, dy, saved, &bt), L2L_ERR_INVALID, "pool");
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++) {
    b = bt, b.key_mask = bad_masks[i];
    REFUSES(l2l_layer_backward(block, dx, dy, saved, &b), L2L_ERR_INVALID, "key_mask");
  }
  b = bt, b.first_sample = -1;
  REFUSES(l2l_layer_backward(block, dx, dy, saved, &b), L2L_ERR_INVALID, "first_sample");
  /* the backward adds into the gradients: dx and dy must not be one of them */
  l2l_tensor *dy88 = check_randn(1.0, 3, 2, 8, D), *dx88 = F32(2, 8, D), *y88 = F32(2, 8, D);
  l2l_saved *s88 = NULL;
  WATCH(dy88, dx88);
  if (CHECK_OK(l2l_layer_forward(&s88, block, y88, x88, &b88))) {
    REFUSES(l2l_layer_backward(block, in_grad, dy88, s88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
    REFUSES(l2l_layer_backward(block, in_value, dy88, s88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
    REFUSES(l2l_layer_backward(block, dx88, in_grad, s88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
  }
  /* a layer whose config changed since the forward */
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_FRUGAL));
  REFUSES(l2l_layer_backward(block, dx, dy, saved, &bt), L2L_ERR_STATE, "config changed");
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_STANDARD));
  /* after the refusals the saved state serves its backward, once */
  CHECK_OK(l2l_layer_backward(block, dx, dy, saved, &bt));
  REFUSES(l2l_layer_backward(block, dx, dy, saved, &bt), L2L_ERR_STATE, "already");
  /* what is no saved state: freed as nothing, 0 bytes */
  unwatch();
  for (size_t i = 0; i < sizeof not_saved / sizeof not_saved[0]; i++) {
    CHECK(l2l_saved_bytes(not_saved[i]) == 0, "case %zu: bytes of what is no saved state", i);
    l2l_saved_free((l2l_saved *)not_saved[i]);
  }
  CHECK(l2l_tensor_numel(x) == B * S * D && l2l_layer_param_count(block) > 0,
        "l2l_saved_free hurt a tensor or a layer");
  l2l_saved_free(s88);
  /* the largest first_sample is a sample index like any: draw indexes wrap modulo 2^64 (in
     int64 they overflowed: UB in the CPU attention's dropout and the frugal backward's) */
  for (int mode = L2L_MEMORY_STANDARD; mode <= L2L_MEMORY_FRUGAL; mode++) {
    CHECK_OK(l2l_layer_set_memory(block, (l2l_memory_mode)mode));
    b = bt, b.first_sample = INT64_MAX;
    l2l_saved *late = NULL;
    if (CHECK_OK(l2l_layer_forward(&late, block, y, x, &b)))
      CHECK_OK(l2l_layer_backward(block, dx, dy, late, &b));
    l2l_saved_free(late);
  }
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_STANDARD));
  FREE(dy88, dx88, y88, dydev, dxdev);
done:
  l2l_saved_free(saved);
  l2l_saved_free(other);
  l2l_saved_free(emb_saved);
  unwatch();
  FREE(x, y, dy, dx, mask, xi, x9, x2, x4, xdev, ydev, yt, ys, y9, y2, yi, both, lo, hi, x88,
       in_value, in_grad, mask88, mi, mt, m4, mdev, y_copy, tokens, emb_y);
  l2l_layer_free(block);
  l2l_layer_free(copy);
  l2l_layer_free(emb);
}

/* Covers: l2l_layer_forward and l2l_layer_backward of an embedding, an LM head and a
   classifier: the batch fields each reads. */
TEST(misuse_input_and_head_calls) {
  enum { B = 2, S = 3, D = 8, V = 11 };
  l2l_layer_config ec = config_of(L2L_LAYER_EMBEDDING), hc = config_of(L2L_LAYER_LM_HEAD);
  l2l_layer_config cc = config_of(L2L_LAYER_CLASSIFIER), tc = ec;
  tc.type_vocab = 2;
  l2l_layer *emb = layer_in(&ec, L2L_POOL_HOST), *head = layer_in(&hc, L2L_POOL_HOST);
  l2l_layer *cls = layer_in(&cc, L2L_POOL_HOST), *typed = layer_in(&tc, L2L_POOL_HOST);
  l2l_tensor *tokens = IDS(V, B, S), *targets = IDS(V, B, S), *labels = IDS(3, B);
  l2l_tensor *x = check_randn(1.0, 3, B, S, D), *y = F32(B, S, D), *losses = F32(B, S);
  l2l_tensor *closses = F32(B), *dx = F32(B, S, D), *dy = check_randn(1.0, 3, B, S, D);
  l2l_layer_batch eb = {.tokens = tokens, .training = 1, .loss_scale = 1};
  l2l_layer_batch hb = {.targets = targets, .training = 1, .loss_scale = 0.25f};
  l2l_layer_batch cb = {.targets = labels, .training = 1, .loss_scale = 0.5f};
  watch_layer(emb), watch_layer(head), watch_layer(cls);
  WATCH(tokens, targets, labels, x, y, losses, closses, dx, dy);
  l2l_saved *saved = SENTINEL(l2l_saved);
  l2l_layer_batch b;

  /* the embedding reads batch->tokens (and token types when it has a type table) */
  REFUSES(l2l_layer_forward(&saved, emb, y, x, &eb), L2L_ERR_INVALID, "x must be NULL");
  l2l_tensor *tf = remake(tokens, L2L_POOL_HOST, L2L_F32), *t1 = IDS(V, B * S);
  l2l_tensor *t7 = IDS(V, B, 7), *tt = IDS(V, S, B),
             *tdev = remake(tokens, L2L_POOL_DEVICE, L2L_I32);
  WATCH(tf, t1, t7, tt);
  const l2l_tensor *bad_tokens[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, emb), tf, t1, tdev};
  for (size_t i = 0; i < sizeof bad_tokens / sizeof bad_tokens[0]; i++) {
    b = eb, b.tokens = bad_tokens[i];
    REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "tokens");
  }
  b = eb, b.tokens = t7;
  l2l_tensor *y7 = F32(B, 7, D);
  WATCH(y7);
  REFUSES(l2l_layer_forward(&saved, emb, y7, NULL, &b), L2L_ERR_INVALID, "max_seq");
  b = eb, b.tokens = tt;
  REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "y is");
  const int32_t bad_ids[] = {V, -1, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    l2l_tensor *bad = IDS(V, B, S);
    ((int32_t *)l2l_tensor_data(bad))[4] = bad_ids[i];
    WATCH(bad);
    b = eb, b.tokens = bad;
    REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "batch->tokens[1][1]");
    l2l_tensor *types = IDS(2, B, S);
    ((int32_t *)l2l_tensor_data(types))[4] = bad_ids[i] == V ? 2 : bad_ids[i];
    b = eb, b.token_types = types;
    REFUSES(l2l_layer_forward(&saved, typed, y, NULL, &b), L2L_ERR_INVALID, "token_types[1][1]");
    l2l_tensor_free(types);
    unwatch();
    watch_layer(emb), watch_layer(head), watch_layer(cls);
    WATCH(tokens, targets, labels, x, y, losses, closses, dx, dy, tf, t1, t7, tt, y7);
    l2l_tensor_free(bad);
  }
  b = eb, b.token_types = tokens;
  REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "token_types");
  REFUSES(l2l_layer_forward(&saved, typed, y, NULL, &eb), L2L_ERR_INVALID, "token_types");
  l2l_tensor *y9 = F32(B, S, D + 1);
  WATCH(y9);
  REFUSES(l2l_layer_forward(&saved, emb, y9, NULL, &eb), L2L_ERR_INVALID, "y is");

  /* heads read batch->targets: (B,S) for an LM head, (B) for a classifier, in [0, V) or -1 */
  l2l_tensor *gf = remake(targets, L2L_POOL_HOST, L2L_F32), *g4 = IDS(V, B, S + 1);
  l2l_tensor *gt = IDS(V, S, B), *gdev = remake(targets, L2L_POOL_DEVICE, L2L_I32);
  WATCH(gf, g4, gt);
  const l2l_tensor *bad_targets[] = {
      JUNK(l2l_tensor), AS(l2l_tensor, head), gf, g4, gt, gdev, labels};
  for (size_t i = 0; i < sizeof bad_targets / sizeof bad_targets[0]; i++) {
    b = hb, b.targets = bad_targets[i];
    REFUSES(l2l_layer_forward(&saved, head, losses, x, &b), L2L_ERR_INVALID, "targets");
  }
  const int32_t bad_classes[] = {V, -2, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_classes / sizeof bad_classes[0]; i++) {
    l2l_tensor *bad = IDS(V, B, S), *badc = IDS(3, B);
    ((int32_t *)l2l_tensor_data(bad))[5] = bad_classes[i];
    ((int32_t *)l2l_tensor_data(badc))[1] = bad_classes[i] == V ? 3 : bad_classes[i];
    b = hb, b.targets = bad;
    REFUSES(l2l_layer_forward(&saved, head, losses, x, &b), L2L_ERR_INVALID, "targets[1][2]");
    b = cb, b.targets = badc;
    REFUSES(l2l_layer_forward(&saved, cls, closses, x, &b), L2L_ERR_INVALID, "targets[1]");
    FREE(bad, badc);
  }
  b = cb, b.targets = targets; /* (B,S) where a classifier reads (B) */
  REFUSES(l2l_layer_forward(&saved, cls, closses, x, &b), L2L_ERR_INVALID, "targets");
  l2l_tensor *logits = F32(B, S, V), *clogits = F32(B, 3);
  WATCH(logits, clogits);
  REFUSES(l2l_layer_forward(&saved, head, logits, x, &hb), L2L_ERR_INVALID, "y is");
  b = hb, b.targets = NULL;
  REFUSES(l2l_layer_forward(&saved, head, losses, x, &b), L2L_ERR_INVALID, "y is");
  REFUSES(l2l_layer_forward(&saved, cls, clogits, x, &cb), L2L_ERR_INVALID, "y is");
  REFUSES(l2l_layer_forward(&saved, cls, losses, x, &cb), L2L_ERR_INVALID, "y is");
  CHECK(saved == SENTINEL(l2l_saved), "*saved written by a refused forward");
  /* a head without targets keeps nothing: *saved is NULL */
  b = hb, b.targets = NULL;
  CHECK_OK(l2l_layer_forward(&saved, head, logits, x, &b));
  CHECK(saved == NULL, "a head without targets gave a saved state");

  /* backward: heads take no dy and need targets and a finite loss scale */
  l2l_saved *hs = NULL, *es = NULL, *cs = NULL;
  if (!CHECK_OK(l2l_layer_forward(&hs, head, losses, x, &hb)) ||
      !CHECK_OK(l2l_layer_forward(&es, emb, y, NULL, &eb)) ||
      !CHECK_OK(l2l_layer_forward(&cs, cls, closses, x, &cb)))
    goto done;
  REFUSES(l2l_layer_backward(head, dx, dy, hs, &hb), L2L_ERR_INVALID, "dy must be NULL");
  b = hb, b.targets = NULL;
  REFUSES(l2l_layer_backward(head, dx, NULL, hs, &b), L2L_ERR_INVALID, "targets");
  b = cb, b.targets = NULL;
  REFUSES(l2l_layer_backward(cls, dx, NULL, cs, &b), L2L_ERR_INVALID, "targets");
  const float bad_scales[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    b = hb, b.loss_scale = bad_scales[i];
    REFUSES(l2l_layer_backward(head, dx, NULL, hs, &b), L2L_ERR_INVALID, "loss_scale");
    b = cb, b.loss_scale = bad_scales[i];
    REFUSES(l2l_layer_backward(cls, dx, NULL, cs, &b), L2L_ERR_INVALID, "loss_scale");
  }
  b = hb, b.targets = gt;
  REFUSES(l2l_layer_backward(head, dx, NULL, hs, &b), L2L_ERR_INVALID, "targets");
  REFUSES(l2l_layer_backward(head, NULL, NULL, hs, &hb), L2L_ERR_INVALID, "dx is NULL");
  REFUSES(l2l_layer_backward(head, y9, NULL, hs, &hb), L2L_ERR_INVALID, "dx is");
  /* the embedding takes no dx, and the forward's tokens */
  REFUSES(l2l_layer_backward(emb, dx, dy, es, &eb), L2L_ERR_INVALID, "dx must be NULL");
  REFUSES(l2l_layer_backward(emb, NULL, NULL, es, &eb), L2L_ERR_INVALID, "dy is NULL");
  REFUSES(l2l_layer_backward(emb, NULL, y9, es, &eb), L2L_ERR_INVALID, "dy is");
  b = eb, b.tokens = tt;
  REFUSES(l2l_layer_backward(emb, NULL, dy, es, &b), L2L_ERR_INVALID, "tokens");
  b = eb, b.tokens = NULL;
  REFUSES(l2l_layer_backward(emb, NULL, dy, es, &b), L2L_ERR_INVALID, "tokens");
  unwatch();
  CHECK_OK(l2l_layer_backward(head, dx, NULL, hs, &hb));
  CHECK_OK(l2l_layer_backward(emb, NULL, dy, es, &eb));
  CHECK_OK(l2l_layer_backward(cls, dx, NULL, cs, &cb));
done:
  unwatch();
  l2l_saved_free(hs);
  l2l_saved_free(es);
  l2l_saved_free(cs);
  FREE(tokens, targets, labels, x, y, losses, closses, dx, dy, tf, t1, t7, tt, tdev, y7, y9, gf, g4,
       gt, gdev, logits, clogits);
  l2l_layer *all[] = {emb, head, cls, typed};
  for (size_t i = 0; i < 4; i++) l2l_layer_free(all[i]);
}

/* ---------------------------------------------------------------- custom layers */

/* user: NULL, or an int: 1 the forward fails, 2 the backward fails. */
static int identity_forward(void *user, l2l_layer *layer, l2l_tensor *y, const l2l_tensor *x,
                            const l2l_layer_batch *batch) {
  (void)layer, (void)batch;
  if (user != NULL && *(int *)user == 1) return 1;
  return l2l_tensor_copy(y, x) != L2L_OK;
}
static int identity_backward(void *user, l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                             const l2l_tensor *x, const l2l_layer_batch *batch) {
  (void)layer, (void)x, (void)batch;
  if (user != NULL && *(int *)user == 2) return 1;
  return l2l_tensor_copy(dx, dy) != L2L_OK;
}

/* Covers: l2l_layer_new_custom, and calls of a custom layer whose functions fail. */
TEST(misuse_custom_layers) {
  l2l_layer *out = SENTINEL(l2l_layer);
  l2l_custom_param good[2] = {{"scale", 1, {8}, 0.0f, 1.0f, 0}, {"w", 2, {8, 8}, 0.02f, 0, 1}};
  l2l_custom_forward_fn fw = identity_forward;
  l2l_custom_backward_fn bw = identity_backward;
  REFUSES(l2l_layer_new_custom(NULL, "c", 8, good, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "out");
  const char *bad_names[] = {NULL, "", "a_name_of_24_characters_"};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_layer_new_custom(&out, bad_names[i], 8, good, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "name");
  const int64_t bad_dims[] = {0, -1, INT64_MIN, INT64_MAX, (INT64_C(1) << 24) + 1};
  for (size_t i = 0; i < sizeof bad_dims / sizeof bad_dims[0]; i++)
    REFUSES(l2l_layer_new_custom(&out, "c", bad_dims[i], good, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "dim");
  const int bad_counts[] = {-1, 13, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++)
    REFUSES(l2l_layer_new_custom(&out, "c", 8, good, bad_counts[i], fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "nparams");
  REFUSES(l2l_layer_new_custom(&out, "c", 8, NULL, 1, fw, bw, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "nparams");
  REFUSES(l2l_layer_new_custom(&out, "c", 8, good, 2, NULL, bw, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "forward");
  REFUSES(l2l_layer_new_custom(&out, "c", 8, good, 2, fw, NULL, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "backward");
  for (int i = 0; i < BAD_POOLS; i++)
    REFUSES(
        l2l_layer_new_custom(&out, "c", 8, good, 2, fw, bw, NULL, 1, (l2l_pool_kind)bad_pools[i]),
        L2L_ERR_INVALID, "pool");
  struct {
    const char *needle;
    l2l_custom_param p;
  } bad[] = {
      {"name", {NULL, 1, {8}, 0, 1, 0}},
      {"name", {"", 1, {8}, 0, 1, 0}},
      {"name", {"a_name_of_24_characters_", 1, {8}, 0, 1, 0}},
      {"two parameters", {"scale", 1, {8}, 0, 1, 0}},
      {"ndim", {"p", 0, {8}, 0, 1, 0}},
      {"ndim", {"p", 5, {8, 1, 1, 1}, 0, 1, 0}},
      {"ndim", {"p", -1, {8}, 0, 1, 0}},
      {"dim 0", {"p", 1, {0}, 0, 1, 0}},
      {"dim 1", {"p", 2, {8, -1}, 0, 1, 0}},
      {"dim 3", {"p", 4, {1, 1, 1, INT64_MIN}, 0, 1, 0}},
      {"dim 0", {"p", 1, {(INT64_C(1) << 31) + 1}, 0, 1, 0}},
      {"init_std", {"p", 1, {8}, NAN, 1, 0}},
      {"init_std", {"p", 1, {8}, -1, 1, 0}},
      {"init_std", {"p", 1, {8}, INFINITY, 1, 0}},
      {"init_value", {"p", 1, {8}, 0, NAN, 0}},
      {"init_value", {"p", 1, {8}, 0, -INFINITY, 0}},
      {"decays", {"p", 1, {8}, 0, 1, 2}},
      {"decays", {"p", 1, {8}, 0, 1, -1}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    l2l_custom_param list[2] = {good[0], bad[i].p};
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_layer_new_custom, parameter case %zu (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_layer_new_custom(&out, "c", 8, list, 2, fw, bw, NULL, 1, L2L_POOL_HOST)),
               L2L_ERR_INVALID, bad[i].needle, __FILE__, __LINE__, expr);
  }
  /* a parameter that cannot be made after one that was: refused, nothing kept */
  if (stats_of(L2L_POOL_HOST).budget != 0) {
    l2l_custom_param huge[2] = {good[0],
                                {"huge", 2, {INT64_C(1) << 31, INT64_C(1) << 16}, 0, 0, 0}};
    REFUSES(l2l_layer_new_custom(&out, "c", 8, huge, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_BUDGET, "host pool");
    l2l_custom_param wide[2] = {good[0],
                                {"wide", 4, {1 << 30, 1 << 30, 1 << 30, 1 << 30}, 0, 0, 0}};
    REFUSES(l2l_layer_new_custom(&out, "c", 8, wide, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "2^48");
  }
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_new_custom");

  /* calls whose functions fail: BACKEND naming the layer, nothing kept */
  l2l_layer *failing = NULL, *fails_back = NULL, *fine = NULL;
  int forward_fails = 1, backward_fails = 2;
  if (!CHECK_OK(l2l_layer_new_custom(&failing, "failing", 8, good, 2, fw, bw, &forward_fails, 1,
                                     L2L_POOL_HOST)) ||
      !CHECK_OK(l2l_layer_new_custom(&fails_back, "fails_back", 8, good, 2, fw, bw, &backward_fails,
                                     1, L2L_POOL_HOST)) ||
      !CHECK_OK(l2l_layer_new_custom(&fine, "fine", 8, good, 2, fw, bw, NULL, 1, L2L_POOL_HOST)))
    goto done;
  CHECK(strcmp(l2l_layer_name(failing), "failing") == 0, "name \"%s\"", l2l_layer_name(failing));
  l2l_tensor *x = check_randn(1.0, 3, 2, 3, 8), *y = F32(2, 3, 8),
             *dy = check_randn(1.0, 3, 2, 3, 8);
  l2l_tensor *dx = F32(2, 3, 8);
  l2l_layer_batch bt = {.training = 1, .loss_scale = 1};
  l2l_saved *saved = SENTINEL(l2l_saved);
  watch_layer(failing), watch_layer(fails_back);
  WATCH(x, y, dy, dx);
  REFUSES(l2l_layer_forward(&saved, failing, y, x, &bt), L2L_ERR_BACKEND, "'failing'");
  CHECK(saved == NULL || saved == SENTINEL(l2l_saved), "*saved is a state after a failure");
  saved = NULL;
  if (CHECK_OK(l2l_layer_forward(&saved, fails_back, y, x, &bt))) {
    REFUSES(l2l_layer_backward(fails_back, dx, dy, saved, &bt), L2L_ERR_BACKEND, "'fails_back'");
    REFUSES(l2l_layer_backward(fine, dx, dy, saved, &bt), L2L_ERR_INVALID, "another");
  }
  l2l_saved_free(saved);
  saved = NULL;
  unwatch();
  if (CHECK_OK(l2l_layer_forward(&saved, fine, y, x, &bt)))
    CHECK_OK(l2l_layer_backward(fine, dx, dy, saved, &bt));
  l2l_saved_free(saved);
  FREE(x, y, dy, dx);
done:
  l2l_layer_free(failing);
  l2l_layer_free(fails_back);
  l2l_layer_free(fine);
}
