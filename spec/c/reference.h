/* SPDX-License-Identifier: MIT */
/* reference.h — what the C tests share beyond the harness (check.h): float64 references,
 * the helpers every test file needs to make, read and compare tensors, and the plain
 * executor (whole-batch training written with the layers alone) that the relay is checked
 * against.
 *
 * Purpose: one copy of each, used by every C test file, so that a reference is written
 * and reviewed once (reference.c, plain.c).
 * Must never: take an expected value from the code under test (the references compute in
 * double from formulas written here; the plain executor uses only the layers'
 * forward and backward and l2l_adamw_update).
 */
#ifndef L2L_REFERENCE_H
#define L2L_REFERENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "check.h"

/* ---------------------------------------------------------------- tensors and values */

int64_t numel(const l2l_tensor *t);
size_t tensor_bytes(const l2l_tensor *t);
double *doubles(int64_t n);                          /* xmalloc'd */
double *to_doubles(const float *src, int64_t n);     /* xmalloc'd copy in double */
/* The bytes of a tensor (xmalloc'd), to verify later that a refused call left it alone. */
void *snapshot(const l2l_tensor *t);
bool same_bytes(const l2l_tensor *t, const void *snap);
l2l_pool_stats stats_of(l2l_pool_kind pool);
/* t's f32 elements := N(0, scale^2) from the tests' generator; returns t. */
l2l_tensor *fill_normal(l2l_tensor *t, double scale);
/* A new tensor of t's shape and dtype in `pool`, or in t's own pool (contents undefined). */
l2l_tensor *like_in(const l2l_tensor *t, l2l_pool_kind pool);
l2l_tensor *like(const l2l_tensor *t);
/* An i32 tensor's elements := uniform in [lo, hi] (inclusive); returns ids. */
l2l_tensor *random_ids(l2l_tensor *ids, int32_t lo, int32_t hi);
/* Targets in [0, vocab) with about a quarter of the rows (at least one when rows > 1,
   never all) set to ignore_index. Returns the number of real rows. */
int64_t random_targets(l2l_tensor *targets, int32_t vocab, int32_t ignore_index);

/* ---------------------------------------------------------------- comparisons */

/* got vs want with check_rel_err (a failed check prints the worst element). */
bool close_at(const char *file, int line, const char *what, const float *got,
              const double *want, int64_t n, double floor, double tol);
/* After a refused call that mixed pools: the message names both. */
bool pools_named(const char *file, int line);

/* ---------------------------------------------------------------- float64 references */

double ref_gelu(double x);
/* One AdamW step t in double, exactly as l2l.h states it (p on the right is the old p). */
void ref_adamw(double *p, double *m, double *v, const float *g, int64_t n,
               const l2l_adamw_config *c, int64_t t);

/* ---------------------------------------------------------------- layers */

/* The tests' usual config of a kind: biases on, eps 1e-5, standard memory, init_std 0.02,
   resid_std 0.01, a fresh init seed (sizes 0: the caller's). */
l2l_layer_config default_layer_config(l2l_layer_kind kind);
/* Random values in place of a layer's initial ones (biases 0 and LayerNorm weights 1 would
   hide a bias never added or a LayerNorm weight never applied): vectors N(0, vector_std^2)
   (LayerNorm weights around 1), tables N(0, table_std^2), linear weights N(0, 1/fan_in),
   so that every activation is of order one. randomize_params: 0.3 and 0.7. */
void randomize_params_with(l2l_layer *layer, double vector_std, double table_std);
void randomize_params(l2l_layer *layer);

/* ---------------------------------------------------------------- the plain executor (plain.c) */

enum { MAX_LAYERS = 40, PLAIN_MAX_RECORDS = 512 };

/* A model: layers in order, and which are frozen (the plain executor's own flag; the
   relay's is l2l_relay_set_frozen). */
struct model {
  int n;
  l2l_layer *layer[MAX_LAYERS];
  uint8_t frozen[MAX_LAYERS];
};

struct shape {
  int64_t D, H, F, V, S; /* S = max_seq */
  int blocks;
  int post_ln, causal;
  int64_t type_vocab;
  l2l_layer_kind head;   /* LM head or classifier */
  int64_t classes;
  int tie;
  float dropout, attn_dropout;
  int frugal_block;      /* index among blocks in frugal mode (-1: none) */
};

struct data {
  int64_t B, S;
  l2l_tensor *tokens, *targets, *types, *key_mask; /* host; types, key_mask may be NULL */
  int64_t real;                                     /* targets != -1 */
};

/* A record's state in the plain executor: the gradient accumulated for the next update,
   the optimizer's arrays (m, v; SGD's momentum buffer in m) and its update count. */
struct prec {
  l2l_param *param;
  l2l_tensor *acc, *m, *v;
  int64_t t;
  int touched;           /* a layer folded a gradient into acc since the last update */
};

struct plain {
  struct model model;
  l2l_relay_config cfg;  /* optimizer, schedule, clipping, accumulate, seed */
  int nrec;
  struct prec rec[PLAIN_MAX_RECORDS];
  int64_t steps, updates;
  double grad_norm, lr;  /* of the last update */
};

l2l_tensor *view_rows(const l2l_tensor *t, int64_t first, int64_t count);
double sumsq_f32(const float *v, int64_t n);
struct shape gpt_shape(void);
struct shape bert_shape(void);
l2l_layer_config model_layer_config(const struct shape *g, l2l_layer_kind kind);
l2l_layer *model_block_new(const struct shape *g, int frugal);
void model_new(struct model *m, const struct shape *g);
void model_free(struct model *m);
l2l_layer *clone_same_rng(const l2l_layer *layer);
void model_clone(struct model *dst, const struct model *src);
void data_new(struct data *d, const struct shape *g, int64_t B, int64_t S, int pad,
              double mask_frac);
void data_free(struct data *d);
struct prec *plain_rec(struct plain *p, l2l_param *param);
void plain_init(struct plain *p, const struct model *src, const l2l_relay_config *cfg);
void plain_free(struct plain *p);
void model_insert(struct model *m, int index, l2l_layer *layer);
l2l_layer *model_take(struct model *m, int index);
void plain_remove(struct plain *p, int index);
double plain_pass(struct plain *p, const struct data *d, int64_t micro,
                  const uint8_t *skip);
double plain_step(struct plain *p, const struct data *d, int64_t micro,
                  const uint8_t *skip);
double plain_evaluate(struct plain *p, const struct data *d);

#endif /* L2L_REFERENCE_H */
