/* SPDX-License-Identifier: MIT */
/* layer_mirror.h — the layer tests' harness (test_layers*.c): tolerances, one layer call's
 * tensors (struct run), the parameters each kind promises, dropout draws by the header's
 * formula, and the float64 mirror of every kind that a call is checked against
 * (check_layer, check_logits; layer_mirror.c).
 *
 * Purpose: one mirror of the layers, written from l2l.h's formulas, for every file that
 * tests them; test_layers.c says how they test.
 * Must never: take an expected value from the library's layer code.
 */
#ifndef L2L_LAYER_MIRROR_H
#define L2L_LAYER_MIRROR_H

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

/* ---------------------------------------------------------------- tensors, comparisons */

#define F32(...) NEW(L2L_POOL_HOST, L2L_F32, __VA_ARGS__)
#define U8(...) NEW(L2L_POOL_HOST, L2L_U8, __VA_ARGS__)
/* The root mean square of v[0 .. n). */
double rms(const double *v, int64_t n);

#define CHECK_CLOSE(what, got, want, n, floor, tol) \
  close_at(__FILE__, __LINE__, (what), (got), (want), (n), (floor), (tol))
/* A refused call: `want`, and a message that is not empty and contains `needle`. */
bool layer_refused_at(l2l_status got, l2l_status want, const char *needle, const char *file,
                      int line, const char *expr);
#define CHECK_REFUSED(call, status, needle) \
  layer_refused_at((call), (status), (needle), __FILE__, __LINE__, #call)

/* ---------------------------------------------------------------- dropout draws */

/* The header's stream of a layer call's dropout site. */
uint64_t dropout_stream(uint64_t step, uint32_t rng_id, int site);
/* Whether draw `index` of (seed, stream) keeps its element at drop probability p (the
   header's formula: layer_mirror.c says how). */
bool ref_kept(uint64_t seed, uint64_t stream, uint64_t index, float p);

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
/* The parameters config c's kind promises, into e (at most MAX_PARAMS); their count. */
int expected_params(struct expected *e, const l2l_layer_config *c);
/* Whether t is an f32 tensor of e's shape. */
bool has_shape(const l2l_tensor *t, const struct expected *e);
/* The layer's parameter named `name`, or NULL. */
l2l_param *find_param(const l2l_layer *layer, const char *name);
/* The tests' small config of a kind (D 12, 2 heads, F 20, V 11, 9 positions, 5 classes). */
l2l_layer_config base_config(l2l_layer_kind kind);
/* A new layer, or NULL after a failed check. */
l2l_layer *new_layer(const l2l_layer_config *c, l2l_pool_kind pool);

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
/* Inputs for `layer` on B samples of S positions (layer_mirror.c says which), with a key
   mask when `masked`, and a batch with a random seed, step, first sample and rng id. */
void run_init(struct run *r, l2l_layer *layer, int64_t B, int64_t S, l2l_pool_kind pool,
              int masked);
void run_free(struct run *r);

/* ---------------------------------------------------------------- against the mirror */

/* The whole contract of one call against the mirror: the forward (kept for backward, and
   as inference), dx written and every parameter gradient added to its random start, and,
   for a layer with dropout, training = 0 dropping nothing. */
void check_layer(struct run *r, const char *what);
/* A head without targets writes logits and keeps nothing (*saved := NULL). */
void check_logits(struct run *r, const char *what);

#endif /* L2L_LAYER_MIRROR_H */
