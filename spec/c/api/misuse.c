/* SPDX-License-Identifier: MIT */
/* misuse.c — the misuse tests' harness (misuse.h): the watched tensors and their
 * snapshots, the check that a refusal changed nothing (its tensors' bytes and handles, the
 * pools' bytes in use), tensors and layers for the calls, and a relay with two steps
 * behind it.
 * Must never: pass a freed handle, or read a device tensor's bytes unless the device pool
 * is host memory (the CPU backend).
 */
#include <stdlib.h>
#include <string.h>

#include "misuse.h"

/* ---------------------------------------------------------------- what is no handle */

/* Bytes that are no handle of any kind: no magic number anywhere in them. */

static unsigned char junk_bytes[4096] __attribute__((aligned(64)));
void *junk(void) {
  memset(junk_bytes, 0x5a, sizeof junk_bytes);
  return junk_bytes;
}

/* Where *out must stay (misuse.h). */
char sentinel_byte;

/* ---------------------------------------------------------------- what must not change */

/* The tensors a group of refusals must leave alone, and the pools' bytes in use. */
static struct {
  int n;
  const l2l_tensor *t[WATCH_MAX];
  void *snap[WATCH_MAX]; /* NULL: not readable from the host (a GPU's device tensor) */
  int refs[WATCH_MAX];
  uint64_t current[POOLS];
} W;

/* Whether t's bytes can be read here: host memory, or the device pool on the CPU backend. */
bool host_readable(const l2l_tensor *t) {
  return l2l_tensor_pool(t) != L2L_POOL_DEVICE || strcmp(l2l_device_backend(), "cpu") == 0;
}

void watch(const l2l_tensor *t) {
  if (t == NULL) return;
  for (int i = 0; i < W.n; i++)
    if (W.t[i] == t) return;
  if (!CHECK(W.n < WATCH_MAX, "more than %d watched tensors", WATCH_MAX)) return;
  W.t[W.n] = t;
  W.snap[W.n] = NULL;
  W.n++;
}

void watch_list(const l2l_tensor *const *ts, size_t n) {
  for (size_t i = 0; i < n; i++) watch(ts[i]);
}

/* Every parameter value and gradient of a layer. */
void watch_layer(const l2l_layer *layer) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    watch(l2l_param_value(l2l_layer_param(layer, i)));
    watch(l2l_param_grad(l2l_layer_param(layer, i)));
  }
}

/* Forgets the watched tensors (before any of them is freed). */
void unwatch(void) {
  for (int i = 0; i < W.n; i++) free(W.snap[i]);
  W.n = 0;
}

/* Takes the snapshot a refusal is compared with, and clears the error message so that the
   refusal's message is its own. */
void arm(void) {
  for (int i = 0; i < W.n; i++) {
    free(W.snap[i]);
    W.snap[i] = host_readable(W.t[i]) ? snapshot(W.t[i]) : NULL;
    W.refs[i] = l2l_tensor_storage_refs(W.t[i]);
  }
  for (int p = 0; p < POOLS; p++) W.current[p] = stats_of((l2l_pool_kind)p).current;
  l2l_clear_error();
}

/* A refused call: its status, a fresh message containing needle, and nothing changed. */
bool refused_at(l2l_status got, l2l_status want, const char *needle, const char *file,
                int line, const char *expr) {
  bool ok = check_fails(got, want, needle, file, line, expr);
  /* a call's refusal names the public function called, whichever part refused it */
  size_t n = strspn(expr, "abcdefghijklmnopqrstuvwxyz0123456789_");
  if (strncmp(expr, "l2l_", 4) == 0 && expr[n] == '(')
    ok &= check_that(strncmp(l2l_last_error(), expr, n) == 0 && strncmp(l2l_last_error() + n, ": ", 2) == 0,
                     file, line, expr, "the message does not start with \"%.*s: \": %s", (int)n, expr,
                     l2l_last_error());
  for (int i = 0; i < W.n; i++) {
    char shape[64] = "?";
    if (W.snap[i] != NULL && !same_bytes(W.t[i], W.snap[i])) {
      int nd = l2l_tensor_ndim(W.t[i]);
      size_t used = 0;
      for (int d = 0; d < nd && used < sizeof shape; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", d ? "," : "(",
                                 (long long)l2l_tensor_dim(W.t[i], d));
      if (used < sizeof shape) snprintf(shape + used, sizeof shape - used, ")");
      ok &=
          check_that(false, file, line, expr, "watched tensor %d (%s %s) changed by a refused call",
                     i, l2l_dtype_name((l2l_dtype)l2l_tensor_dtype(W.t[i])), shape);
    }
    int refs = l2l_tensor_storage_refs(W.t[i]);
    ok &= check_that(refs == W.refs[i], file, line, expr,
                     "watched tensor %d: %d handles on its storage before, %d after", i, W.refs[i],
                     refs);
  }
  for (int p = 0; p < POOLS; p++) {
    uint64_t now = stats_of((l2l_pool_kind)p).current;
    ok &= check_that(now == W.current[p], file, line, expr,
                     "the %s pool holds %llu bytes, %llu before the refused call (a leak on "
                     "the refusal path?)",
                     l2l_pool_name((l2l_pool_kind)p), (unsigned long long)now,
                     (unsigned long long)W.current[p]);
  }
  return ok;
}


/* ---------------------------------------------------------------- tensors for the tests */

/* Bytes no op computes: 0xa5 everywhere (an f32 of -2.9e-16, an i32 of -1515870811). */
l2l_tensor *poison(l2l_tensor *t) {
  if (host_readable(t)) memset(l2l_tensor_data(t), 0xa5, tensor_bytes(t));
  return t;
}

/* A new tensor of t's shape in `pool` with `dtype`, all zeros. */
l2l_tensor *remake(const l2l_tensor *t, l2l_pool_kind pool, l2l_dtype dtype) {
  int64_t shape[L2L_MAX_DIMS];
  int nd = l2l_tensor_ndim(t);
  for (int i = 0; i < nd; i++) shape[i] = l2l_tensor_dim(t, i);
  l2l_tensor *r = check_tensor(pool, dtype, nd, shape);
  CHECK_OK(l2l_tensor_fill(r, 0.0));
  return r;
}

l2l_tensor *view(const l2l_tensor *t, int64_t first, int64_t count) {
  l2l_tensor *v = NULL;
  CHECK_OK(l2l_tensor_view_rows(&v, t, first, count));
  return v;
}

l2l_tensor *reshaped(const l2l_tensor *t, int ndim, const int64_t *shape) {
  l2l_tensor *r = NULL;
  CHECK_OK(l2l_tensor_reshape(&r, t, ndim, shape));
  return r;
}

l2l_tensor *ids_new(int ndim, const int64_t *shape, int32_t hi) {
  l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_I32, ndim, shape);
  return random_ids(t, 0, hi - 1);
}

l2l_tensor *ones_u8(int ndim, const int64_t *shape) {
  l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_U8, ndim, shape);
  CHECK_OK(l2l_tensor_fill(t, 1.0));
  return t;
}

/* A small block (D 8, 2 heads, F 16, dropout on) in `pool`, for foreign handles and calls. */
l2l_layer_config block_config(void) {
  l2l_layer_config c = default_layer_config(L2L_LAYER_BLOCK);
  c.dim = 8, c.heads = 2, c.mlp = 16, c.causal = 1, c.dropout = 0.1f, c.attn_dropout = 0.1f;
  return c;
}

l2l_layer *layer_in(const l2l_layer_config *c, l2l_pool_kind pool) {
  l2l_layer *layer = NULL;
  if (l2l_layer_new(&layer, c, pool) != L2L_OK) {
    fprintf(stderr, "misuse: cannot make a test layer: %s\n", l2l_last_error());
    exit(2);
  }
  return layer;
}

l2l_layer *small_block(void) {
  l2l_layer_config c = block_config();
  return layer_in(&c, L2L_POOL_HOST);
}


/* ---------------------------------------------------------------- a relay */

l2l_relay_config relay_config(void) {
  l2l_relay_config c;
  l2l_relay_config_default(&c);
  c.micro_batch = 2;
  c.optimizer_threads = 2;
  c.optimizer.lr = 1e-2f;
  c.seed = 5;
  return c;
}

l2l_relay_batch batch_of(const struct data *d) {
  return (l2l_relay_batch){d->tokens, d->targets, d->types, d->key_mask, NULL};
}

void watch_model(const struct model *m) {
  for (int i = 0; i < m->n; i++) watch_layer(m->layer[i]);
}

bool rig_new(struct rig *rig, const l2l_relay_config *c) {
  rig->g = gpt_shape();
  model_new(&rig->m, &rig->g);
  data_new(&rig->d, &rig->g, 4, rig->g.S, 1, 1.0);
  rig->r = NULL;
  if (!CHECK_OK(l2l_relay_new(&rig->r, rig->m.layer, rig->m.n, c))) return false;
  l2l_relay_batch b = batch_of(&rig->d);
  double loss;
  return CHECK_OK(l2l_relay_step(&loss, rig->r, &b)) &&
         CHECK_OK(l2l_relay_step(&loss, rig->r, &b)) && CHECK_OK(l2l_relay_sync(rig->r));
}

void rig_free(struct rig *rig) {
  l2l_relay_free(rig->r);
  data_free(&rig->d);
  model_free(&rig->m);
}
