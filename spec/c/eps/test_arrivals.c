/* SPDX-License-Identifier: MIT */
/* test_arrivals.c — a gradient given to the EPS (eps_give_gradient) is added as one, however
 * its adds are split.
 *
 * What it tests: a gradient the EPS owns (kept = false: a GPU's copy in pinned memory) is
 * added by chunk jobs on all the workers, two arrivals of a record at once (a tied table's
 * two users) included, f32 or bf16; the accumulator then holds scale1 g1 + scale2 g2 to an
 * f32 rounding of each add (float64 reference), and a step's updates leave the masters and
 * the count of non-finite skips exactly as the same gradients added whole on the calling
 * thread (kept = true: the CPU backend's way) leave them, given in the same order (a
 * record's arrivals add in the order given), an inf in one chunk of a record skipping that
 * record alone. Records span a few chunks with a short last one.
 * How: white box, the EPS's step interface (eps.h, "a step") driven as the relay drives it,
 * records made from a layer's parameters (an embedding with a large table). All test names
 * start with "eps_".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "eps/record.h"
#include "layers/layers.h"
#include "reference.h"

/* An EPS of the records of `layer` (f32 masters, no staging) with optimizer `opt`, adding
   every gradient as it arrives when `add`. Its accumulators are the parameters' grads as
   the relay gives them (param_grad: not handed out; a script's l2l_param_grad is). */
static bool eps_adding(struct eps *eps, struct core_timeline *tl, l2l_layer *layer,
                       const l2l_optimizer_config *opt, bool add) {
  struct eps_settings settings = {.optimizer = opt, .precision = L2L_F32, .threads = 3,
                                  .seed = 1, .timeline = tl, .dist_lane = -1,
                                  .add_arrivals = add};
  if (!CHECK_OK(eps_init(eps, &settings))) return false;
  struct eps_record_source src[L2L_MAX_PARAMS];
  int n = l2l_layer_param_count(layer), failed = -1;
  for (int i = 0; i < n; i++) {
    l2l_param *p = l2l_layer_param(layer, i);
    src[i] = (struct eps_record_source){.param = p, .name = l2l_param_name(p),
                                        .master = param_value(p), .grad = param_grad(p),
                                        .staging = L2L_F32, .users = 1};
  }
  if (CHECK_OK(eps_set_records(eps, src, n, &failed))) return true;
  eps_free(eps);   /* (a failed init leaves nothing to free) */
  return false;
}

static bool eps_of(struct eps *eps, struct core_timeline *tl, l2l_layer *layer,
                   const l2l_optimizer_config *opt) {
  return eps_adding(eps, tl, layer, opt, false);
}

/* A step in which each record of `layer` gets the two gradients g[0][i], g[1][i] (scaled
   by scale[0], scale[1]): `owned`, kept = false (the EPS adds and frees a pinned copy),
   else kept = true (f32 only: drained); from two threads at once when `concurrent`, else
   the first's all before the second's. */
struct give {
  struct eps *eps;
  l2l_layer *layer;
  l2l_tensor **g;
  float scale;
  bool owned;
};

static void *give_all(void *arg) {
  struct give *gv = arg;
  for (int i = 0; i < l2l_layer_param_count(gv->layer); i++) {
    struct eps_record *rec = eps_find(gv->eps, l2l_layer_param(gv->layer, i));
    l2l_tensor *grad = gv->g[i];
    if (gv->owned) {
      l2l_tensor *pinned = NULL;
      const l2l_tensor *t = gv->g[i];
      int64_t shape[L2L_MAX_DIMS];
      for (int d = 0; d < l2l_tensor_ndim(t); d++) shape[d] = l2l_tensor_dim(t, d);
      if (!CHECK_OK(l2l_tensor_new(&pinned, L2L_POOL_PINNED, l2l_tensor_dtype(t), l2l_tensor_ndim(t),
                                   shape)) ||
          !CHECK_OK(l2l_tensor_copy(pinned, t)))
        return NULL;
      grad = pinned;
    }
    eps_give_gradient(gv->eps, rec, grad, !gv->owned, gv->scale, 0);
  }
  return NULL;
}

/* (norm non-NULL: updates deferred, released with global clipping to norm 1; the
   accumulated gradients' norm as the EPS found it into *norm) */
static bool run_step_of(struct eps *eps, l2l_layer *layer, l2l_tensor **g[2], const float scale[2],
                        int users, bool owned, bool concurrent, bool update,
                        struct eps_outcome *out, double *norm) {
  l2l_param *expect[2 * L2L_MAX_PARAMS];
  int n = l2l_layer_param_count(layer);
  for (int i = 0; i < n; i++)
    for (int u = 0; u < users; u++) expect[users * i + u] = l2l_layer_param(layer, i);
  struct eps_step step = {.update = update, .defer = norm != NULL, .lr = 0.5, .expect = expect,
                          .n_expect = users * n};
  if (!CHECK_OK(eps_step_begin(eps, &step))) return false;
  eps_step_agreed(eps, true);
  struct give gv[2] = {{eps, layer, g[0], scale[0], owned}, {eps, layer, g[1], scale[1], owned}};
  pthread_t other;
  bool two = users == 2 && concurrent && pthread_create(&other, NULL, give_all, &gv[1]) == 0;
  give_all(&gv[0]);
  if (two) pthread_join(other, NULL);
  else if (users == 2) give_all(&gv[1]);
  eps_wait_arrivals(eps);
  if (norm != NULL) eps_step_release(eps, 1.0f, 1.0, norm);
  eps_step_end(eps, true, out);
  eps_sync(eps);
  return true;
}

static bool run_step(struct eps *eps, l2l_layer *layer, l2l_tensor **g[2], const float scale[2],
                     bool owned, bool concurrent, bool update, struct eps_outcome *out) {
  return run_step_of(eps, layer, g, scale, 2, owned, concurrent, update, out, NULL);
}

/* An updating step of two f32 gradients a record, g0[i] then g1[i], given from copies
   (kept gradients are drained, zeroed: each EPS gets its own), owned or kept. */
static void step_on_copies(struct eps *eps, l2l_layer *layer, l2l_tensor *const *g0,
                           l2l_tensor *const *g1, const float scale[2], bool owned,
                           struct eps_outcome *out, double *norm) {
  const int n = l2l_layer_param_count(layer);
  l2l_tensor *c0[L2L_MAX_PARAMS], *c1[L2L_MAX_PARAMS], **c[2] = {c0, c1};
  for (int i = 0; i < n; i++) {
    c0[i] = check_tensor(L2L_POOL_HOST, L2L_F32, 1, (int64_t[]){l2l_tensor_numel(g0[i])});
    c1[i] = check_tensor(L2L_POOL_HOST, L2L_F32, 1, (int64_t[]){l2l_tensor_numel(g1[i])});
    memcpy(l2l_tensor_data(c0[i]), l2l_tensor_data(g0[i]), (size_t)l2l_tensor_numel(g0[i]) * 4);
    memcpy(l2l_tensor_data(c1[i]), l2l_tensor_data(g1[i]), (size_t)l2l_tensor_numel(g1[i]) * 4);
  }
  run_step_of(eps, layer, c, scale, 2, owned, false, true, out, norm);
  for (int i = 0; i < n; i++) {
    l2l_tensor_free(c0[i]);
    l2l_tensor_free(c1[i]);
  }
}

/* Gradients like the layer's parameters: normal, f32 or bf16 (kept gradients are f32). */
static void draw_grads(l2l_tensor **g, l2l_layer *layer, l2l_dtype dtype) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    const l2l_tensor *v = param_value(l2l_layer_param(layer, i));
    int64_t shape[L2L_MAX_DIMS];
    for (int d = 0; d < l2l_tensor_ndim(v); d++) shape[d] = l2l_tensor_dim(v, d);
    l2l_tensor *f = check_tensor(L2L_POOL_HOST, L2L_F32, l2l_tensor_ndim(v), shape);
    float *x = l2l_tensor_data(f);
    for (int64_t e = 0; e < l2l_tensor_numel(f); e++) x[e] = (float)check_rand_normal();
    g[i] = f;
    if (dtype != L2L_F32) {
      g[i] = check_tensor(L2L_POOL_HOST, dtype, l2l_tensor_ndim(v), shape);
      CHECK_OK(l2l_tensor_cast(g[i], f));
      l2l_tensor_free(f);
    }
  }
}

static double value_at(const l2l_tensor *t, int64_t e) {
  const void *d = l2l_tensor_data(t);
  switch (l2l_tensor_dtype(t)) {
    case L2L_BF16: return (double)half_bf16_to_f32(((const uint16_t *)d)[e]);
    default: return (double)((const float *)d)[e];
  }
}

/* An embedding whose token table spans 2 to 4 chunks of the EPS's adds, the last short. */
static l2l_layer *big_embedding(void) {
  l2l_layer_config c = default_layer_config(L2L_LAYER_EMBEDDING);
  c.dim = 64;
  c.vocab = (int64_t)check_rand_int(2 * CHUNK / 64 + 1, 4 * CHUNK / 64 - 1);
  c.max_seq = 33;
  l2l_layer *layer = NULL;
  if (!CHECK_OK(l2l_layer_new(&layer, &c, L2L_POOL_HOST))) return NULL;
  return layer;
}

/* `count` twins of one big embedding (clones, their accumulators zero), an EPS of each
   with `opt` (twin k adding every gradient as it arrives when bit k of `adding` is set). */
struct twins {
  int count;
  l2l_layer *layers[3];
  struct core_timeline tl[3];
  struct eps eps[3];
};

static void twins_free(struct twins *t) {
  for (int k = 0; k < t->count; k++) {
    eps_free(&t->eps[k]);
    timeline_free(&t->tl[k]);
  }
  for (int k = 0; k < 3; k++) l2l_layer_free(t->layers[k]);
}

/* (a failure frees what was made) */
static bool twins_new(struct twins *t, int count, const l2l_optimizer_config *opt, unsigned adding) {
  memset(t, 0, sizeof *t);
  bool made = (t->layers[0] = big_embedding()) != NULL;
  for (int k = 1; made && k < count; k++) made = CHECK_OK(l2l_layer_clone(&t->layers[k], t->layers[0]));
  for (int k = 0; made && k < count; k++) {
    timeline_init(&t->tl[k]);
    for (int i = 0; i < l2l_layer_param_count(t->layers[k]); i++)
      CHECK_OK(l2l_tensor_fill(param_grad(l2l_layer_param(t->layers[k], i)), 0.0));
    made = eps_adding(&t->eps[k], &t->tl[k], t->layers[k], opt, (adding >> k) & 1u);
    if (made) t->count = k + 1;
    else timeline_free(&t->tl[k]);
  }
  if (!made) twins_free(t);
  return made;
}

TEST(eps_gives_split_across_workers_add_as_one) {
  l2l_layer *layer = big_embedding();
  if (layer == NULL) return;
  const int n = l2l_layer_param_count(layer);
  l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_SGD, .lr = 0.5f};
  for (int d = 0; d < 2; d++) {
    const l2l_dtype dtype = d ? L2L_BF16 : L2L_F32;
    struct core_timeline tl;
    timeline_init(&tl);
    struct eps eps;
    if (!eps_of(&eps, &tl, layer, &opt)) return;
    l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS], **g[2] = {g0, g1};
    draw_grads(g0, layer, dtype);
    draw_grads(g1, layer, dtype);
    const float scale[2] = {(float)check_rand_uniform(0.5, 2), (float)check_rand_uniform(0.5, 2)};
    for (int i = 0; i < n; i++) CHECK_OK(l2l_tensor_fill(l2l_param_grad(l2l_layer_param(layer, i)), 0.0));
    struct eps_outcome out = {0};
    /* accumulation only: the sum stays in the accumulator */
    if (run_step(&eps, layer, g, scale, true, true, false, &out)) {
      for (int i = 0; i < n; i++) {
        const l2l_tensor *acc = l2l_param_grad(l2l_layer_param(layer, i));
        const float *a = l2l_tensor_data(acc);
        int64_t bad = -1;
        double worst = 0;
        for (int64_t e = 0; e < l2l_tensor_numel(acc) && bad < 0; e++) {
          double t0 = scale[0] * value_at(g0[i], e), t1 = scale[1] * value_at(g1[i], e);
          /* two f32 adds, each rounded once (an fma's product exactly): 2^-24 of the
             terms' magnitudes each */
          double err = fabs((double)a[e] - (t0 + t1)), tol = 0x1p-23 * (fabs(t0) + fabs(t1));
          if (err > tol || a[e] != a[e]) bad = e;
          worst = err > worst ? err : worst;
        }
        CHECK(bad < 0, "%s (%s gradients, %lld elements): element %lld of the accumulator is "
              "not the two gradients' sum", l2l_param_name(l2l_layer_param(layer, i)),
              l2l_dtype_name(dtype), (long long)l2l_tensor_numel(acc), (long long)bad);
      }
    }
    for (int i = 0; i < n; i++) {
      l2l_tensor_free(g0[i]);
      l2l_tensor_free(g1[i]);
    }
    eps_free(&eps);
    timeline_free(&tl);
  }
  l2l_layer_free(layer);
}

/* Two twins of one layer, one EPS each: gradients given whole on this thread (kept) to one
   and split over the workers (owned) to the other give the same masters, step after step,
   an inf in a chunk past the first skipping its record in both. */
TEST(eps_gives_split_across_workers_update_as_whole_ones) {
  l2l_layer *a = big_embedding(), *b = NULL;
  if (a == NULL) return;
  if (!CHECK_OK(l2l_layer_clone(&b, a))) return;
  const int n = l2l_layer_param_count(a);
  l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f, .beta1 = 0.9f,
                              .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  struct core_timeline tl[2];
  struct eps eps[2];
  l2l_layer *layers[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    timeline_init(&tl[k]);
    if (!eps_of(&eps[k], &tl[k], layers[k], &opt)) return;
  }
  for (int step = 0; step < 3; step++) {
    l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS];
    draw_grads(g0, a, L2L_F32);
    draw_grads(g1, a, L2L_F32);
    int poisoned = step == 1 ? (int)check_rand_int(0, n - 1) : -1;
    if (poisoned >= 0) {   /* an inf past the first chunk of a record (or its last element) */
      int64_t m = l2l_tensor_numel(g1[poisoned]);
      int64_t at = m > CHUNK ? (int64_t)check_rand_int(CHUNK, m - 1) : m - 1;
      ((float *)l2l_tensor_data(g1[poisoned]))[at] = INFINITY;
    }
    const float scale[2] = {(float)check_rand_uniform(0.5, 2), (float)check_rand_uniform(0.5, 2)};
    struct eps_outcome out[2] = {{0}, {0}};
    for (int k = 0; k < 2; k++)
      step_on_copies(&eps[k], layers[k], g0, g1, scale, k == 1, &out[k], NULL);
    CHECK(out[0].skips == (poisoned >= 0) && out[1].skips == out[0].skips,
          "step %d: %d skips whole, %d split, %d expected", step, out[0].skips, out[1].skips,
          poisoned >= 0);
    for (int i = 0; i < n; i++) {
      const l2l_tensor *pa = param_value(l2l_layer_param(a, i));
      const l2l_tensor *pb = param_value(l2l_layer_param(b, i));
      CHECK(memcmp(l2l_tensor_data(pa), l2l_tensor_data(pb), (size_t)l2l_tensor_numel(pa) * 4) == 0,
            "step %d: %s differs between gradients added whole and split", step,
            l2l_param_name(l2l_layer_param(a, i)));
      l2l_tensor_free(g0[i]);
      l2l_tensor_free(g1[i]);
    }
  }
  for (int k = 0; k < 2; k++) {
    eps_free(&eps[k]);
    timeline_free(&tl[k]);
  }
  l2l_layer_free(a);
  l2l_layer_free(b);
}

/* Element `at` of gradient t (f32 or bf16) set to x (exact in both). */
static void set_element(l2l_tensor *t, int64_t at, float x) {
  if (l2l_tensor_dtype(t) == L2L_F32) ((float *)l2l_tensor_data(t))[at] = x;
  else ((uint16_t *)l2l_tensor_data(t))[at] = half_from_f32_bf16(x);
}

/* Held gradients (eps.c: one process, eager updates, the update reading a GPU's owned
   arrivals beside the accumulator) against the same gradients added as they arrive
   (add_arrivals): masters, optimizer state and skips the same to the bit, every
   accumulator zero after, for each optimizer x state precision x one or two gradients a
   record x f32 or bf16 gradients. Step 1 finds values a script wrote (through
   l2l_param_grad) into part of one chunk of one accumulator (its other chunks zero: both
   ways of the update's read), which the EPS cleared itself at step 0 and would otherwise
   take as zero unread; step 2 an inf past the first chunk of one record's last gradient,
   step 3 an element whose scaled value reaches EPS_GRAD_LIMIT (2^64 times a scale >= 1/2):
   each skips that record alone. From step 1 on, every record the script did not touch is
   checked with its accumulator known zero. */
TEST(eps_held_gradients_update_as_added_ones) {
  static const l2l_optimizer_kind kinds[] = {L2L_OPTIMIZER_SGD, L2L_OPTIMIZER_ADAMW,
                                             L2L_OPTIMIZER_LAMB};
  static const l2l_state_precision states[] = {L2L_STATE_F32, L2L_STATE_BF16, L2L_STATE_8BIT};
  for (int kind = 0; kind < 3; kind++)
    for (int st = 0; st < 3; st++)
      for (int users = 1; users <= 2; users++)
        for (int d = 0; d < 2; d++) {
          const l2l_dtype dtype = d ? L2L_BF16 : L2L_F32;
          l2l_optimizer_config opt = {.kind = kinds[kind], .lr = 1e-2f, .beta1 = 0.9f,
                                      .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                                      .momentum = 0.9f, .state = states[st]};
          struct twins t;
          if (!twins_new(&t, 2, &opt, 1u)) return;   /* twin 0 adds, twin 1 holds */
          l2l_layer **layers = t.layers;
          struct eps *eps = t.eps;
          const int n = l2l_layer_param_count(layers[0]);
          char what[160];
          snprintf(what, sizeof what, "%s, %s state, %d gradient(s) a record, %s",
                   optimizer_ops(opt.kind)->name, states[st] == L2L_STATE_F32 ? "f32"
                   : states[st] == L2L_STATE_BF16 ? "bf16" : "8-bit", users, l2l_dtype_name(dtype));
          for (int step = 0; step < 4; step++) {
            l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS], **g[2] = {g0, g1};
            draw_grads(g0, layers[0], dtype);
            draw_grads(g1, layers[0], dtype);
            int r = (int)check_rand_int(0, n - 1);
            int64_t m = l2l_tensor_numel(g0[r]);
            int64_t at = m > CHUNK ? (int64_t)check_rand_int(CHUNK, m - 1) : m - 1;
            if (step == 1) {   /* a script's values in part of the chunk holding `at` */
              int64_t from = at / CHUNK * CHUNK, to = from + 3 * L2L_STATE_BLOCK + 5;
              to = to < m ? to : m;
              for (int64_t e = from; e < to; e++) {
                float x = (float)check_rand_normal();
                for (int k = 0; k < 2; k++)
                  ((float *)l2l_tensor_data(l2l_param_grad(l2l_layer_param(layers[k], r))))[e] = x;
              }
            }
            if (step > 1) set_element(users == 2 ? g1[r] : g0[r], at, step == 2 ? INFINITY : 0x1p64f);
            const float scale[2] = {(float)check_rand_uniform(0.5, 2),
                                    (float)check_rand_uniform(0.5, 2)};
            struct eps_outcome out[2] = {{0}, {0}};
            for (int k = 0; k < 2; k++)
              run_step_of(&eps[k], layers[k], g, scale, users, true, false, true, &out[k], NULL);
            CHECK(out[0].skips == (step > 1) && out[1].skips == out[0].skips,
                  "%s, step %d: %d skips added, %d held, %d expected", what, step, out[0].skips,
                  out[1].skips, step > 1);
            for (int i = 0; i < n; i++) {
              l2l_param *pa = l2l_layer_param(layers[0], i), *pb = l2l_layer_param(layers[1], i);
              const l2l_tensor *va = param_value(pa), *vb = param_value(pb);
              CHECK(memcmp(l2l_tensor_data(va), l2l_tensor_data(vb),
                           (size_t)l2l_tensor_numel(va) * 4) == 0,
                    "%s, step %d: %s differs between gradients added and held", what, step,
                    l2l_param_name(pa));
              const struct eps_record *ra = eps_find(&eps[0], pa), *rb = eps_find(&eps[1], pb);
              for (int a = 0; a < 2; a++) {
                bool both = (ra->state[a] == NULL) == (rb->state[a] == NULL);
                CHECK(both && (ra->state[a] == NULL ||
                               memcmp(l2l_tensor_data(ra->state[a]), l2l_tensor_data(rb->state[a]),
                                      (size_t)eps_array_bytes(ra)) == 0),
                      "%s, step %d: %s's state array %d differs between added and held", what,
                      step, l2l_param_name(pa), a);
              }
              for (int k = 0; k < 2; k++) {
                const l2l_tensor *acc = param_grad(l2l_layer_param(layers[k], i));
                CHECK(optim_all_zero(l2l_tensor_data(acc), l2l_tensor_numel(acc)),
                      "%s, step %d: %s's accumulator is not zero after its update (%s)", what,
                      step, l2l_param_name(pa), k ? "held" : "added");
              }
              l2l_tensor_free(g0[i]);
              l2l_tensor_free(g1[i]);
            }
          }
          CHECK(eps[0].held_checks == 0 && eps[1].held_checks == 4 * n,
                "%s: %lld and %lld records' held gradients checked, want 0 (added) and %d",
                what, (long long)eps[0].held_checks, (long long)eps[1].held_checks, 4 * n);
          CHECK(eps[1].known_zero_checks == 3 * (n - 1),
                "%s: %lld checks took the accumulator as zero, want %d (steps 1-3, the records "
                "no script was given)", what, (long long)eps[1].known_zero_checks, 3 * (n - 1));
          twins_free(&t);
        }
}

/* Pages of accumulator `t` that are resident (mincore), one byte a page from the one
   holding its first byte; NULL where mincore fails (*pages set either way). */
static unsigned char *resident_pages(const l2l_tensor *t, size_t *pages) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), at = (uintptr_t)l2l_tensor_data(t);
  uint64_t bytes = (uint64_t)l2l_tensor_numel(t) * sizeof(float);
  *pages = (at + bytes - 1) / page - at / page + 1;
  unsigned char *in = malloc(*pages);
  if (in != NULL && mincore((void *)(at / page * page), *pages * page, in) != 0) {
    free(in);
    in = NULL;
  }
  return in;
}

/* The whole pages of accumulator `t` given back, and kept from 2 MiB pages (which the
   kernel's khugepaged may make of a range with any page in memory, at any time). */
static void pages_untouched(const l2l_tensor *t) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), at = (uintptr_t)l2l_tensor_data(t);
  uintptr_t first = (at + page - 1) / page * page, last = (at + (uintptr_t)l2l_tensor_numel(t) * 4) / page * page;
  if (last <= first) return;
  madvise((void *)first, last - first, MADV_NOHUGEPAGE);
  madvise((void *)first, last - first, MADV_DONTNEED);
}

/* A record's first step (a new layer's accumulators: pages never touched, which read as
   zero; here given back again and kept from 2 MiB pages, so that only the EPS can bring
   one in) with held gradients: the check and the update read no block of the accumulator
   (L2L_STATE_BLOCK elements) whose pages have nothing behind them, so none of them comes
   into memory (mincore before and after; reading maps a page even where the machine has
   a shared zero page, and where it has none gives each page memory of its own), but the
   chunk holding a value a script wrote (l2l_param_grad) before the step, which counts: the
   masters are those of a twin that adds every gradient as it arrives, to the bit. AdamW
   on f32 and 8-bit state, one or two bf16 gradients a record. Skipped where
   /proc/self/pagemap does not say which pages are in memory (the EPS then reads them). */
TEST(eps_first_check_brings_no_untouched_accumulator_page_in) {
  static const l2l_state_precision states[] = {L2L_STATE_F32, L2L_STATE_8BIT};
  for (int st = 0; st < 2; st++)
    for (int users = 1; users <= 2; users++) {
      l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f, .beta1 = 0.9f,
                                  .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                                  .state = states[st]};
      l2l_layer *layers[2] = {big_embedding(), NULL};
      struct core_timeline tl[2];
      struct eps eps[2];
      if (layers[0] == NULL || !CHECK_OK(l2l_layer_clone(&layers[1], layers[0]))) {
        l2l_layer_free(layers[0]);
        return;
      }
      const int n = l2l_layer_param_count(layers[0]);
      const l2l_tensor *table = param_grad(l2l_layer_param(layers[1], 0));
      uint8_t one;
      if (!pool_blocks_absent(L2L_POOL_HOST, l2l_tensor_data(table), 4, 4, &one, 1)) {
        check_skip("/proc/self/pagemap does not say which pages are in memory here");
        l2l_layer_free(layers[0]);
        l2l_layer_free(layers[1]);
        return;
      }
      for (int i = 0; i < n; i++) pages_untouched(param_grad(l2l_layer_param(layers[1], i)));
      /* a script's value in one chunk of the table, both twins (handed out: read from now) */
      int64_t m = l2l_tensor_numel(table), at = check_rand_int(0, m - 1);
      float value = (float)check_rand_normal();
      for (int k = 0; k < 2; k++)
        ((float *)l2l_tensor_data(l2l_param_grad(l2l_layer_param(layers[k], 0))))[at] = value;
      unsigned char *before[L2L_MAX_PARAMS];
      size_t pages[L2L_MAX_PARAMS];
      for (int i = 0; i < n; i++) before[i] = resident_pages(param_grad(l2l_layer_param(layers[1], i)), &pages[i]);
      bool made = true;
      for (int k = 0; k < 2; k++) {
        timeline_init(&tl[k]);
        if (made) made = eps_adding(&eps[k], &tl[k], layers[k], &opt, k == 0);   /* 0 adds, 1 holds */
        else timeline_free(&tl[k]);
      }
      if (made) {
        l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS], **g[2] = {g0, g1};
        draw_grads(g0, layers[0], L2L_BF16);
        draw_grads(g1, layers[0], L2L_BF16);
        const float scale[2] = {1.0f, 0.5f};
        struct eps_outcome out;
        for (int k = 0; k < 2; k++) run_step_of(&eps[k], layers[k], g, scale, users, true, false, true, &out, NULL);
        for (int i = 0; i < n; i++) {
          const char *name = l2l_param_name(l2l_layer_param(layers[0], i));
          const l2l_tensor *va = param_value(l2l_layer_param(layers[0], i));
          CHECK(memcmp(l2l_tensor_data(va), l2l_tensor_data(param_value(l2l_layer_param(layers[1], i))),
                       (size_t)l2l_tensor_numel(va) * 4) == 0,
                "%s state, %d gradient(s): %s differs between gradients added and held",
                st ? "8-bit" : "f32", users, name);
          /* blocks of the update (L2L_STATE_BLOCK elements) whose every page was untouched */
          size_t count, came = 0, absent = 0;
          const l2l_tensor *acc = param_grad(l2l_layer_param(layers[1], i));
          unsigned char *after = resident_pages(acc, &count);
          uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), data = (uintptr_t)l2l_tensor_data(acc);
          int64_t elements = l2l_tensor_numel(acc), chunk = at / CHUNK * CHUNK;
          for (int64_t b = 0; before[i] != NULL && after != NULL && b < elements; b += L2L_STATE_BLOCK) {
            int64_t e = b + L2L_STATE_BLOCK < elements ? b + L2L_STATE_BLOCK : elements;
            size_t p0 = (data + (uintptr_t)b * 4) / page - data / page;
            size_t p1 = (data + (uintptr_t)e * 4 - 1) / page - data / page;
            bool untouched = !(i == 0 && b >= chunk && b < optim_chunk_end(m, chunk)), now = false;
            for (size_t p = p0; p <= p1; p++) untouched &= !(before[i][p] & 1), now |= after[p] & 1;
            absent += untouched;
            came += untouched && now;
          }
          CHECK(before[i] != NULL && after != NULL, "%s: mincore failed", name);
          CHECK(came == 0, "%s state, %d gradient(s): %zu of %s's %zu untouched accumulator blocks "
                "came into memory", st ? "8-bit" : "f32", users, came, name, absent);
          CHECK(i != 0 || absent > 0, "%s: no block of the table's accumulator was untouched", name);
          free(after);
        }
        for (int i = 0; i < n; i++) {
          l2l_tensor_free(g0[i]);
          l2l_tensor_free(g1[i]);
        }
        for (int k = 0; k < 2; k++) {
          eps_free(&eps[k]);
          timeline_free(&tl[k]);
        }
      }
      for (int i = 0; i < n; i++) free(before[i]);
      l2l_layer_free(layers[0]);
      l2l_layer_free(layers[1]);
    }
}

/* Deferred updates (global clipping): each add finds its chunks' norms as it writes them,
   on the workers for a GPU's gradients (owned) and on the calling thread for kept ones;
   the global norm both find is the same to the bit, equals the float64 norm of the sums
   the accumulators hold (computed here) to 2^-23, and the clipped updates leave the
   same masters; a step whose gradients were poisoned with an inf overflows (the norm not
   finite, nothing updated) on both. */
TEST(eps_deferred_norms_are_found_by_the_adds) {
  l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f, .beta1 = 0.9f,
                              .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  struct twins t;
  if (!twins_new(&t, 2, &opt, 0u)) return;
  l2l_layer **layers = t.layers;
  struct eps *eps = t.eps;
  const int n = l2l_layer_param_count(layers[0]);
  for (int step = 0; step < 3; step++) {
    l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS];
    draw_grads(g0, layers[0], L2L_F32);
    draw_grads(g1, layers[0], L2L_F32);
    if (step == 2) {
      int r = (int)check_rand_int(0, n - 1);
      ((float *)l2l_tensor_data(g1[r]))[check_rand_int(0, l2l_tensor_numel(g1[r]) - 1)] = INFINITY;
    }
    const float scale[2] = {(float)check_rand_uniform(0.5, 2), (float)check_rand_uniform(0.5, 2)};
    double norm[2] = {0, 0}, want = 0;
    for (int i = 0; i < n; i++) {   /* the sums each accumulator will hold, in float64 */
      const float *x0 = l2l_tensor_data(g0[i]), *x1 = l2l_tensor_data(g1[i]);
      for (int64_t e = 0; e < l2l_tensor_numel(g0[i]); e++) {
        float sum = 0.0f + scale[0] * x0[e];   /* (f32, as the adds round) */
        sum = sum + scale[1] * x1[e];
        want += (double)sum * sum;
      }
    }
    want = sqrt(want);
    for (int k = 0; k < 2; k++) {
      struct eps_outcome out;
      step_on_copies(&eps[k], layers[k], g0, g1, scale, k == 1, &out, &norm[k]);
    }
    CHECK(memcmp(&norm[0], &norm[1], sizeof norm[0]) == 0,
          "step %d: the norm added on the workers %.17g, on the calling thread %.17g", step,
          norm[1], norm[0]);
    /* each f32 sum as the test rounds it may differ from the adds' by an ulp (a fused
       multiply-add or not), 2^-24 of it, so the norms by 2^-24 of the norm, plus float64
       sums grouped otherwise (~1e-16 each): 2^-23. A chunk's norm left out moves it by a
       fifth or more. */
    if (step < 2)
      CHECK(fabs(norm[0] - want) <= 0x1p-23 * want, "step %d: norm %.17g, float64 %.17g", step,
            norm[0], want);
    else
      CHECK(!isfinite(norm[0]), "step %d: an inf gradient gave the norm %g", step, norm[0]);
    for (int i = 0; i < n; i++) {
      const l2l_tensor *pa = param_value(l2l_layer_param(layers[0], i));
      const l2l_tensor *pb = param_value(l2l_layer_param(layers[1], i));
      CHECK(memcmp(l2l_tensor_data(pa), l2l_tensor_data(pb), (size_t)l2l_tensor_numel(pa) * 4) == 0,
            "step %d: %s differs between gradients added on the workers and on the caller",
            step, l2l_param_name(l2l_layer_param(layers[0], i)));
      l2l_tensor_free(g0[i]);
      l2l_tensor_free(g1[i]);
    }
  }
  twins_free(&t);
}

/* Two gradients of each record given from two threads at once, held: in whichever order
   they came, the update is the one of the same two added in that order. Each round, one
   step from the same start on three twins: held (given at once), and added in each order
   (one thread); every record's master equals one of the two added ones to the bit. */
TEST(eps_held_gradients_given_at_once_update_as_added_in_either_order) {
  l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f, .beta1 = 0.9f,
                              .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  for (int round = 0; round < 4; round++) {
    struct twins t;
    if (!twins_new(&t, 3, &opt, 6u)) return;   /* twin 0 holds, twins 1 and 2 add */
    l2l_layer **layers = t.layers;
    struct eps *eps = t.eps;
    const int n = l2l_layer_param_count(layers[0]);
    l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS];
    draw_grads(g0, layers[0], L2L_BF16);
    draw_grads(g1, layers[0], L2L_BF16);
    const float scale[2] = {(float)check_rand_uniform(0.5, 2), (float)check_rand_uniform(0.5, 2)};
    const float swapped[2] = {scale[1], scale[0]};
    l2l_tensor **in_order[2] = {g0, g1}, **reversed[2] = {g1, g0};
    struct eps_outcome out[3];
    run_step_of(&eps[0], layers[0], in_order, scale, 2, true, true, true, &out[0], NULL);
    run_step_of(&eps[1], layers[1], in_order, scale, 2, true, false, true, &out[1], NULL);
    run_step_of(&eps[2], layers[2], reversed, swapped, 2, true, false, true, &out[2], NULL);
    CHECK(eps[0].held_checks == n, "round %d: %lld records' held gradients checked, want %d",
          round, (long long)eps[0].held_checks, n);
    for (int i = 0; i < n; i++) {
      const l2l_tensor *v[3];
      for (int k = 0; k < 3; k++) v[k] = param_value(l2l_layer_param(layers[k], i));
      size_t bytes = (size_t)l2l_tensor_numel(v[0]) * 4;
      CHECK(memcmp(l2l_tensor_data(v[0]), l2l_tensor_data(v[1]), bytes) == 0 ||
                memcmp(l2l_tensor_data(v[0]), l2l_tensor_data(v[2]), bytes) == 0,
            "round %d: %s, its two gradients held as they came from two threads, is neither "
            "the update of the two added in one order nor in the other", round,
            l2l_param_name(l2l_layer_param(layers[0], i)));
      l2l_tensor_free(g0[i]);
      l2l_tensor_free(g1[i]);
    }
    twins_free(&t);
  }
}

/* The host bytes the EPS's passes count (eps_pass_bytes), against bench/optim's counts
   written here: two bf16 gradients a record (2 bytes an element each), f32 masters and
   state; AdamW's update moves 28 bytes an element (p, g, m, v read, p, m, v written),
   LAMB's 40 in two passes. Added: each gradient's add 2 + 8, the update, the clear 4.
   Held: the check 2 + 2 and 4 for the accumulator, the update reading the two gradients
   instead of the accumulator (4 fewer, 4 more), and for a chunk of the accumulator a
   script wrote into, that chunk read and cleared by the update (8 an element of it). The
   check reads an accumulator only while it is not known zero: at the first step (the
   records are new), and from the step a script was given one (l2l_param_grad) on. */
TEST(eps_pass_bytes_count_what_each_pass_moves) {
  static const l2l_optimizer_kind kinds[] = {L2L_OPTIMIZER_ADAMW, L2L_OPTIMIZER_LAMB};
  static const double update[] = {28, 40};
  for (int kind = 0; kind < 2; kind++) {
    l2l_optimizer_config opt = {.kind = kinds[kind], .lr = 1e-2f, .beta1 = 0.9f,
                                .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    struct twins t;
    if (!twins_new(&t, 2, &opt, 1u)) return;   /* twin 0 adds, twin 1 holds */
    const int n = l2l_layer_param_count(t.layers[0]);
    double elements = 0;
    for (int i = 0; i < n; i++) elements += (double)l2l_tensor_numel(param_value(l2l_layer_param(t.layers[0], i)));
    double read = elements;   /* elements of accumulators the check reads (not known zero) */
    for (int step = 0; step < 4; step++) {
      l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS], **g[2] = {g0, g1};
      draw_grads(g0, t.layers[0], L2L_BF16);
      draw_grads(g1, t.layers[0], L2L_BF16);
      double written = 0;   /* elements of the accumulator chunk a script wrote into */
      if (step == 1) read = 0;   /* (each cleared by step 0's update, unseen since) */
      if (step == 2) {
        int r = (int)check_rand_int(0, n - 1);
        int64_t m = l2l_tensor_numel(g0[r]), c = (int64_t)check_rand_int(0, optim_chunks(m) - 1);
        written = (double)(optim_chunk_end(m, c * CHUNK) - c * CHUNK);
        read = (double)m;   /* (handed out for good) */
        for (int k = 0; k < 2; k++)
          ((float *)l2l_tensor_data(l2l_param_grad(l2l_layer_param(t.layers[k], r))))[c * CHUNK] = 1.0f;
      }
      const float scale[2] = {1.0f, 0.5f};
      double want[2] = {elements * (2 * (2 + 8) + update[kind] + 4),
                        elements * ((2 + 2) + update[kind] - 4 + 4) + 4 * read + 8 * written};
      for (int k = 0; k < 2; k++) {
        uint64_t before = eps_pass_bytes(&t.eps[k]);
        struct eps_outcome out;
        run_step_of(&t.eps[k], t.layers[k], g, scale, 2, true, false, true, &out, NULL);
        double got = (double)(eps_pass_bytes(&t.eps[k]) - before);
        CHECK(got == want[k], "%s, step %d, gradients %s: %.0f bytes counted, want %.0f",
              optimizer_ops(opt.kind)->name, step, k ? "held" : "added", got, want[k]);
      }
      for (int i = 0; i < n; i++) {
        l2l_tensor_free(g0[i]);
        l2l_tensor_free(g1[i]);
      }
    }
    twins_free(&t);
  }
}

/* The staging copy (bf16, the device's) written by the update as it moves the master, not
   rewritten as the next step begins, where nothing but the EPS writes the master: after
   each step's updates and the next step's eps_stage, every record's staging copy is its
   master rounded to bf16 (computed here), and the rewrite moves 6 bytes an element of the
   records it rewrites: all of them before the first update (new records), none after it,
   and from step 2 on the one whose master a script was given (l2l_param_value) and wrote;
   its staging copy then holds the script's values. AdamW and LAMB (whose second wave moves
   the master). */
TEST(eps_staging_written_by_the_update_unless_the_master_was_handed_out) {
  static const l2l_optimizer_kind kinds[] = {L2L_OPTIMIZER_ADAMW, L2L_OPTIMIZER_LAMB};
  for (int kind = 0; kind < 2; kind++) {
    l2l_optimizer_config opt = {.kind = kinds[kind], .lr = 1e-2f, .beta1 = 0.9f,
                                .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    l2l_layer *layer = big_embedding();
    if (layer == NULL) return;
    struct core_timeline tl;
    timeline_init(&tl);
    struct eps eps;
    struct eps_settings settings = {.optimizer = &opt, .precision = L2L_BF16, .threads = 3,
                                    .seed = 1, .timeline = &tl, .dist_lane = -1};
    int n = l2l_layer_param_count(layer);
    struct eps_record_source src[L2L_MAX_PARAMS];
    for (int i = 0; i < n; i++) {
      l2l_param *p = l2l_layer_param(layer, i);
      CHECK_OK(l2l_tensor_fill(param_grad(p), 0.0));
      src[i] = (struct eps_record_source){.param = p, .name = l2l_param_name(p),
                                          .master = param_value(p), .grad = param_grad(p),
                                          .staging = L2L_BF16, .users = 1};
    }
    int failed = -1;
    if (!CHECK_OK(eps_init(&eps, &settings))) return;
    if (!CHECK_OK(eps_set_records(&eps, src, n, &failed))) n = 0;
    int r = (int)check_rand_int(0, n - 1);   /* the record a script writes */
    for (int step = 0; n > 0 && step < 4; step++) {
      double rewritten = 0;   /* elements the next step's rewrite must move */
      for (int i = 0; i < n; i++)
        if (step == 0 || (step >= 2 && i == r)) rewritten += (double)l2l_param_numel(l2l_layer_param(layer, i));
      if (step == 2) {   /* between steps 1 and 2: a script's values in record r's master */
        float *m = l2l_tensor_data(l2l_param_value(l2l_layer_param(layer, r)));
        for (int64_t e = 0; e < l2l_param_numel(l2l_layer_param(layer, r)); e++) m[e] = (float)check_rand_normal();
      }
      uint64_t before = eps_pass_bytes(&eps);
      eps_stage(&eps);   /* (as the relay's step begins) */
      eps_sync(&eps);
      CHECK((double)(eps_pass_bytes(&eps) - before) == 6 * rewritten, "%s, step %d: the rewrite "
            "moved %llu bytes, want %.0f", optimizer_ops(opt.kind)->name, step,
            (unsigned long long)(eps_pass_bytes(&eps) - before), 6 * rewritten);
      for (int i = 0; i < n; i++) {
        const struct eps_record *rec = eps_find(&eps, l2l_layer_param(layer, i));
        const float *m = l2l_tensor_data(rec->master);
        const uint16_t *h = l2l_tensor_data(rec->staging);
        int64_t off = 0;
        for (int64_t e = 0; e < l2l_tensor_numel(rec->master) && off == 0; e++)
          if (h[e] != half_from_f32_bf16(m[e])) off = e + 1;
        CHECK(off == 0, "%s, step %d: %s's staging copy is not its master at [%lld]",
              optimizer_ops(opt.kind)->name, step, l2l_param_name(rec->param), (long long)off - 1);
      }
      l2l_tensor *g0[L2L_MAX_PARAMS], *g1[L2L_MAX_PARAMS], **g[2] = {g0, g1};
      draw_grads(g0, layer, L2L_BF16);
      draw_grads(g1, layer, L2L_BF16);
      const float scale[2] = {1.0f, 0.5f};
      struct eps_outcome out;
      run_step_of(&eps, layer, g, scale, 2, true, false, true, &out, NULL);
      for (int i = 0; i < n; i++) l2l_tensor_free(g0[i]), l2l_tensor_free(g1[i]);
    }
    eps_free(&eps);
    timeline_free(&tl);
    l2l_layer_free(layer);
  }
}
