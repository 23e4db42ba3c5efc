/* SPDX-License-Identifier: MIT */
/* calibrate.c — the rates the planner's time model needs, measured on this machine.
 *
 * Purpose: the machine's copy bandwidth each way, the host optimizer's throughput, and
 * each layer's forward and backward time at its own shape (micro-batch rows, sequence,
 * config), measured on the device backend in use with this many threads: on one machine
 * a GEMM's rate depends on its shape, so the layers are timed as they will run rather than
 * modelled from a peak rate. Everything measured is cached in a small text file per
 * machine (its host name), backend and version under $XDG_CACHE_HOME/l2l/ (else
 * ~/.cache/l2l/), so planning the same model again measures nothing.
 * Layers are timed on twins made from their configs in the device pool (custom layers,
 * which cannot be remade, on themselves), with zero ids and uniform inputs.
 * Must never: change a layer it times, raise a pool's peak (a program's peak is its own,
 * not its measurements': core's pool_measuring_begin), or fail a plan because the cache
 * cannot be written (it is a cache: a write that fails is skipped).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"

enum { CACHE_VERSION = 1, REPEATS = 3 };

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The cache file's path for this machine and backend, or "" when no folder is known. */
static void cache_path(char *out, size_t len) {
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char host[128] = "host";
  gethostname(host, sizeof host - 1);
  for (char *c = host; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-'))
      *c = '_';
  char folder[1200];
  if (xdg && *xdg) snprintf(folder, sizeof folder, "%s/l2l", xdg);
  else if (home && *home) snprintf(folder, sizeof folder, "%s/.cache/l2l", home);
  else {
    out[0] = '\0';
    return;
  }
  snprintf(out, len, "%s/plan-rates-v%d-%s-%s.txt", folder, CACHE_VERSION, host,
           l2l_device_backend());
}

static void make_folders(const char *path) {
  char dir[1400];
  snprintf(dir, sizeof dir, "%s", path);
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(dir, 0700);
      *p = '/';
    }
}

/* The cached values of `key` (a line "key v1 v2 ..."), or false. */
/* (a later line for a key wins: a value measured again is appended) */
bool plan_cache_get(const char *key, double *values, int n) {
  char path[1400];
  cache_path(path, sizeof path);
  if (!path[0]) return false;
  pthread_mutex_lock(&cache_lock);
  FILE *f = fopen(path, "r");
  bool found = false;
  char line[512];
  size_t klen = strlen(key);
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, key, klen) != 0 || line[klen] != ' ') continue;
    char *at = line + klen;
    double read[4];
    int got = 0;
    for (; got < n && got < 4; got++) {
      char *end;
      read[got] = strtod(at, &end);
      if (end == at || !(read[got] >= 0 && read[got] < 1e30)) break;
      at = end;
    }
    if (got == n) {
      memcpy(values, read, (size_t)n * sizeof *values);
      found = true;
    }
  }
  if (f) fclose(f);
  pthread_mutex_unlock(&cache_lock);
  return found;
}

void plan_cache_put(const char *key, const double *values, int n) {
  char path[1400];
  cache_path(path, sizeof path);
  if (!path[0]) return;
  pthread_mutex_lock(&cache_lock);
  make_folders(path);
  FILE *f = fopen(path, "a");
  if (f) {
    fprintf(f, "%s", key);
    for (int i = 0; i < n; i++) fprintf(f, " %.6g", values[i]);
    fprintf(f, "\n");
    fclose(f);
  }
  pthread_mutex_unlock(&cache_lock);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double plan_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

/* ---------------------------------------------------------------- machine rates */

/* Bytes per second of copies from `src` pool to `dst` pool (a 32 MiB tensor). */
static l2l_status copy_rate(double *out, l2l_pool_kind src, l2l_pool_kind dst) {
  /* 32 MiB, or what the device budget leaves (a quarter of it, two buffers' worth, down to
     256 KiB: a rate from smaller copies is a little low, never a refusal mid-plan) */
  int64_t n = 8 << 20;   /* floats */
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  if (device.budget != 0) {
    uint64_t held = device.current + device.backend;
    uint64_t room = device.budget > held ? device.budget - held : 0;
    int64_t fit = (int64_t)(room / 4 / sizeof(float));
    if (fit < n) n = fit > (64 << 10) ? fit : (64 << 10);
  }
  l2l_tensor *a = NULL, *b = NULL;
  l2l_status status = l2l_tensor_new(&a, src, L2L_F32, 1, &n);
  if (status == L2L_OK) status = l2l_tensor_new(&b, dst, L2L_F32, 1, &n);
  if (status == L2L_OK) status = l2l_tensor_fill(a, 1.0);
  double t[REPEATS];
  for (int i = 0; i < REPEATS && status == L2L_OK; i++) {
    double t0 = core_now();
    status = l2l_tensor_copy(b, a);
    if (status == L2L_OK) status = l2l_device_synchronize();
    t[i] = core_now() - t0;
  }
  if (status == L2L_OK) *out = (double)n * sizeof(float) / plan_median(t, REPEATS);
  l2l_tensor_free(a);
  l2l_tensor_free(b);
  return status;
}

/* Master bytes per second of AdamW on the host (the EPS's arithmetic, on every core). */
static l2l_status optimizer_rate(double *out) {
  int64_t n = 4 << 20;
  l2l_tensor *t[4] = {NULL};
  l2l_status status = L2L_OK;
  for (int i = 0; i < 4 && status == L2L_OK; i++) {
    status = l2l_tensor_new(&t[i], L2L_POOL_HOST, L2L_F32, 1, &n);
    if (status == L2L_OK) status = l2l_tensor_fill(t[i], i == 3 ? 1e-3 : 0.0);
  }
  l2l_adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  double times[REPEATS];
  for (int i = 0; i < REPEATS && status == L2L_OK; i++) {
    double t0 = core_now();
    status = l2l_adamw_update(t[0], t[1], t[2], t[3], &cfg, i + 1);
    times[i] = core_now() - t0;
  }
  if (status == L2L_OK) *out = (double)n * sizeof(float) / plan_median(times, REPEATS);
  for (int i = 0; i < 4; i++) l2l_tensor_free(t[i]);
  return status;
}

l2l_status plan_machine_rates(l2l_plan_rates *out, bool remeasure) {
  char key[64];
  snprintf(key, sizeof key, "machine t%d", l2l_get_threads());
  double v[3];
  if (remeasure || !plan_cache_get(key, v, 3)) {
    pool_measuring_begin();   /* (the measurement's buffers are not the program's peak) */
    l2l_status status = copy_rate(&v[0], L2L_POOL_PINNED, L2L_POOL_DEVICE);
    if (status == L2L_OK) status = copy_rate(&v[1], L2L_POOL_DEVICE, L2L_POOL_PINNED);
    if (status == L2L_OK) status = optimizer_rate(&v[2]);
    pool_measuring_end();
    TRY(status);
    plan_cache_put(key, v, 3);
  }
  *out = (l2l_plan_rates){.h2d = v[0], .d2h = v[1], .optimizer = v[2], .timed = 1,
                          .shared = strcmp(l2l_device_backend(), "cpu") == 0};
  /* a visit's fixed cost: measured by the relay (l2l_relay_calibrate_plan), -1 until it is */
  snprintf(key, sizeof key, "visit t%d", l2l_get_threads());
  out->visit = plan_cache_get(key, v, 1) ? v[0] : -1;
  return L2L_OK;
}

void plan_cache_visit(double seconds) {
  char key[64];
  snprintf(key, sizeof key, "visit t%d", l2l_get_threads());
  plan_cache_put(key, &seconds, 1);
}

/* ---------------------------------------------------------------- layers at their shapes */

/* What makes a layer's time: its kind and sizes, the call's rows and sequence, the
   threads and the precision of the weights bound. */
static void layer_key(char *out, size_t len, const l2l_layer *layer, int64_t rows, int64_t seq,
                      l2l_dtype precision) {
  l2l_layer_config c;
  l2l_layer_get_config(&c, layer);
  snprintf(out, len, "layer t%d w%d %s k%d D%lld H%lld F%lld V%lld M%lld T%lld C%lld c%d p%d b%d f%d "
           "m%d d%g a%g r%lld s%lld", l2l_get_threads(), (int)precision, l2l_layer_name(layer), (int)c.kind,
           (long long)c.dim, (long long)c.heads, (long long)c.mlp, (long long)c.vocab,
           (long long)c.max_seq, (long long)c.type_vocab, (long long)c.classes, c.causal,
           c.post_ln, c.bias, c.final_ln, (int)c.memory, c.dropout, c.attn_dropout,
           (long long)rows, (long long)seq);
}

struct timing_call {
  l2l_layer *layer;            /* the twin (or the layer itself) */
  l2l_tensor *bound[L2L_MAX_PARAMS];   /* the twin's 16-bit weights, bound as the relay binds
                                          its (NULL: f32, its own) */
  l2l_pool_kind pool;
  l2l_tensor *x, *y, *dx, *dy, *tokens, *targets;
  l2l_layer_batch batch;
};

static void timing_free(struct timing_call *t, bool own_layer) {
  for (int r = 0; own_layer && t->layer && r < l2l_layer_param_count(t->layer); r++)
    if (t->bound[r] != NULL) {
      param_bind(l2l_layer_param(t->layer, r), NULL, NULL);
      l2l_tensor_free(t->bound[r]);
    }
  if (own_layer) l2l_layer_free(t->layer);
  t->layer = NULL;
  l2l_tensor *all[] = {t->x, t->y, t->dx, t->dy, t->tokens, t->targets};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) l2l_tensor_free(all[i]);
}

static l2l_status timing_tensors(struct timing_call *t, int64_t rows, int64_t seq) {
  l2l_layer_config c;
  TRY(l2l_layer_get_config(&c, t->layer));
  enum layer_role role = layer_role(t->layer);
  int64_t act[3] = {rows, seq, c.dim}, ids[2] = {rows, seq};
  TRY(l2l_tensor_new(&t->tokens, t->pool, L2L_I32, 2, ids));
  TRY(l2l_tensor_fill(t->tokens, 0.0));
  if (role != L2L_ROLE_INPUT) {
    TRY(l2l_tensor_new(&t->x, t->pool, L2L_F32, 3, act));
    TRY(l2l_tensor_uniform(t->x, 1, 1, 0, -1.0, 1.0));
    TRY(l2l_tensor_new(&t->dx, t->pool, L2L_F32, 3, act));
  }
  if (role == L2L_ROLE_HEAD) {
    bool classifier = c.kind == L2L_LAYER_CLASSIFIER;
    TRY(l2l_tensor_new(&t->targets, t->pool, L2L_I32, classifier ? 1 : 2, ids));
    TRY(l2l_tensor_fill(t->targets, 0.0));
    TRY(l2l_tensor_new(&t->y, t->pool, L2L_F32, classifier ? 1 : 2, ids));
  } else {
    TRY(l2l_tensor_new(&t->y, t->pool, L2L_F32, 3, act));
    TRY(l2l_tensor_new(&t->dy, t->pool, L2L_F32, 3, act));
    TRY(l2l_tensor_uniform(t->dy, 1, 2, 0, -1e-3, 1e-3));
  }
  t->batch = (l2l_layer_batch){.tokens = role == L2L_ROLE_INPUT ? t->tokens : NULL,
                               .targets = t->targets, .seed = 1, .training = 1,
                               .loss_scale = 1.0f / (float)(rows * seq)};
  return L2L_OK;
}

/* One forward (kept) and its backward: their seconds. */
static l2l_status time_once(struct timing_call *t, double *fwd, double *bwd) {
  l2l_saved *saved = NULL;
  TRY(l2l_device_synchronize());
  double t0 = core_now();
  l2l_status status = l2l_layer_forward(&saved, t->layer, t->y, t->x, &t->batch);
  if (status == L2L_OK) status = l2l_device_synchronize();
  double t1 = core_now();
  if (status == L2L_OK) status = layer_backward_grads_kept(t->layer, t->dx, t->dy, saved, &t->batch);
  if (status == L2L_OK) status = l2l_device_synchronize();
  *fwd = t1 - t0;
  *bwd = core_now() - t1;
  l2l_saved_free(saved);
  return status;
}

/* The twin's low-precision weights bound in `precision` (16-bit copies of its values, as a
   relay binds its slots: the GEMMs then run at their 16-bit rate). */
static l2l_status bind_precision(struct timing_call *t, l2l_dtype precision) {
  for (int r = 0; precision != L2L_F32 && r < l2l_layer_param_count(t->layer); r++) {
    l2l_param *p = l2l_layer_param(t->layer, r);
    if (!param_low_precision(p)) continue;
    TRY(tensor_new_like(&t->bound[r], t->pool, precision, param_value(p)));
    TRY(l2l_tensor_cast(t->bound[r], param_value(p)));
    param_bind(p, t->bound[r], param_grad(p));
  }
  return L2L_OK;
}

l2l_status plan_time_layer(double *fwd, double *bwd, const l2l_layer *layer, int64_t rows,
                           int64_t seq, l2l_dtype precision) {
  char key[400];
  layer_key(key, sizeof key, layer, rows, seq, precision);
  double v[2];
  if (plan_cache_get(key, v, 2)) {
    *fwd = v[0], *bwd = v[1];
    return L2L_OK;
  }
  l2l_layer_config c;
  TRY(l2l_layer_get_config(&c, layer));
  pool_measuring_begin();   /* (the twin's and its tensors' bytes are not the program's peak) */
  struct timing_call t = {0};
  bool own = c.kind != L2L_LAYER_CUSTOM;
  l2l_status status = L2L_OK;
  if (own) {
    t.pool = L2L_POOL_DEVICE;
    status = l2l_layer_new(&t.layer, &c, t.pool);
    if (status == L2L_OK) status = bind_precision(&t, precision);
  } else {
    /* a custom layer cannot be remade: timed where its parameters are, its gradients
       put back afterwards */
    t.layer = (l2l_layer *)layer;
    const l2l_param *first = l2l_layer_param(layer, 0);
    t.pool = first ? (l2l_pool_kind)l2l_tensor_pool(param_value(first)) : L2L_POOL_HOST;
  }
  int np = own ? 0 : l2l_layer_param_count(layer);
  l2l_tensor *grads[L2L_MAX_PARAMS] = {NULL};
  for (int i = 0; i < np && status == L2L_OK; i++) {
    l2l_tensor *g = param_grad(l2l_layer_param(layer, i));   /* (put back: not handed out) */
    int64_t n = l2l_tensor_numel(g);
    status = l2l_tensor_new(&grads[i], L2L_POOL_HOST, L2L_F32, 1, &n);
    if (status == L2L_OK) status = l2l_tensor_copy(grads[i], g);
  }
  if (status == L2L_OK) status = timing_tensors(&t, rows, seq);
  double f[REPEATS], b[REPEATS], warm_f, warm_b;
  if (status == L2L_OK) status = time_once(&t, &warm_f, &warm_b);
  for (int i = 0; i < REPEATS && status == L2L_OK; i++) status = time_once(&t, &f[i], &b[i]);
  for (int i = 0; i < np; i++) {
    if (grads[i] && status == L2L_OK)
      status = l2l_tensor_copy(param_grad(l2l_layer_param(layer, i)), grads[i]);
    l2l_tensor_free(grads[i]);
  }
  timing_free(&t, own);
  pool_measuring_end();
  if (status != L2L_OK) return status;
  v[0] = *fwd = plan_median(f, REPEATS);
  v[1] = *bwd = plan_median(b, REPEATS);
  plan_cache_put(key, v, 2);
  return L2L_OK;
}
