/* SPDX-License-Identifier: MIT */
/* sdpa_eval.c — the CPU evaluator of sdpa_eval.h: cuDNN's node meanings on memory images.
 *
 * Purpose: each tensor is its memory (element (i0..i3) at sum i_n strides[n]); a matmul
 * multiplies the last two dims per batch (dims 0, 1), a reduction sums or maxes into the
 * output's dims of 1, a reshape reads the input's memory with the output's strides, a
 * pointwise node broadcasts dims of 1. Outputs of 16-bit type are rounded when written.
 */
#include "sdpa_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int64_t sdpa_eval_span(const struct backend_sdpa_tensor *t) {
  int64_t last = 0;
  for (int n = 0; n < 4; n++) last += (t->dims[n] - 1) * t->strides[n];
  return last + 1;
}

static int64_t at(const struct backend_sdpa_tensor *t, const int64_t i[4]) {
  int64_t off = 0;
  for (int n = 0; n < 4; n++) off += (t->dims[n] == 1 ? 0 : i[n]) * t->strides[n];
  return off;
}

double sdpa_eval_round(enum backend_sdpa_type type, double x) {
  if ((type != L2L_SDPA_BF16 && type != L2L_SDPA_F16) || x == 0.0 || !isfinite(x)) return x;
  int bits = type == L2L_SDPA_BF16 ? 8 : 11;   /* significant bits */
  int e;
  double m = frexp(x, &e);                     /* x = m 2^e, 0.5 <= |m| < 1 */
  return ldexp(nearbyint(ldexp(m, bits)), e - bits);
}

void sdpa_eval_init(struct sdpa_eval *e, const struct backend_sdpa_view *view) {
  memset(e, 0, sizeof *e);
  e->view = view;
  for (int t = 0; t < view->tensors; t++)
    e->mem[t] = xmalloc(sizeof(double) * (size_t)sdpa_eval_span(&view->tensor[t]));
}

void sdpa_eval_free(struct sdpa_eval *e) {
  for (int t = 0; t < e->view->tensors; t++) free(e->mem[t]);
}

int sdpa_eval_find(const struct backend_sdpa_view *view, int64_t uid) {
  for (int t = 0; t < view->tensors; t++)
    if (view->tensor[t].uid == uid && !view->tensor[t].is_virtual) return t;
  return -1;
}

/* Calls fn(ctx, i) for every logical index i of dims. */
#define EACH(dims, i) \
  for (i[0] = 0; i[0] < (dims)[0]; i[0]++) for (i[1] = 0; i[1] < (dims)[1]; i[1]++) \
  for (i[2] = 0; i[2] < (dims)[2]; i[2]++) for (i[3] = 0; i[3] < (dims)[3]; i[3]++)

void sdpa_eval_set(struct sdpa_eval *e, int64_t uid, double (*value)(void *ctx, const int64_t i[4]),
                   void *ctx) {
  int t = sdpa_eval_find(e->view, uid);
  if (t < 0) return;
  const struct backend_sdpa_tensor *x = &e->view->tensor[t];
  int64_t i[4];
  EACH(x->dims, i) e->mem[t][at(x, i)] = sdpa_eval_round(x->type, value(ctx, i));
}

double sdpa_eval_get(const struct sdpa_eval *e, int64_t uid, const int64_t i[4]) {
  int t = sdpa_eval_find(e->view, uid);
  return t < 0 ? NAN : e->mem[t][at(&e->view->tensor[t], i)];
}

static double pointwise(enum backend_sdpa_pw mode, double a, double b, double c, double index) {
  switch (mode) {
    case L2L_SDPA_ADD: return a + b;
    case L2L_SDPA_SUB: return a - b;
    case L2L_SDPA_MUL: return a * b;
    case L2L_SDPA_DIV: return a / b;
    case L2L_SDPA_EXP: return exp(a);
    case L2L_SDPA_LOG: return log(a);
    case L2L_SDPA_GEN_INDEX: return index;
    case L2L_SDPA_CMP_GE: return a >= b ? 1.0 : 0.0;
    case L2L_SDPA_SELECT: return c != 0.0 ? a : b;
    default: return a;
  }
}

static void run_node(struct sdpa_eval *e, const struct backend_sdpa_node *n) {
  const struct backend_sdpa_tensor *ts = e->view->tensor, *y = &ts[n->out];
  double *out = e->mem[n->out];
  int64_t i[4];
  switch (n->kind) {
    case L2L_SDPA_MATMUL: {
      const struct backend_sdpa_tensor *a = &ts[n->in[0]], *b = &ts[n->in[1]];
      const double *am = e->mem[n->in[0]], *bm = e->mem[n->in[1]];
      EACH(y->dims, i) {
        double sum = 0.0;
        for (int64_t k = 0; k < a->dims[3]; k++) {
          int64_t ai[4] = {i[0], i[1], i[2], k}, bi[4] = {i[0], i[1], k, i[3]};
          sum += am[at(a, ai)] * bm[at(b, bi)];
        }
        out[at(y, i)] = sdpa_eval_round(y->type, sum);
      }
      break;
    }
    case L2L_SDPA_REDUCE_MAX:
    case L2L_SDPA_REDUCE_ADD: {
      const struct backend_sdpa_tensor *x = &ts[n->in[0]];
      const double *xm = e->mem[n->in[0]];
      bool max = n->kind == L2L_SDPA_REDUCE_MAX;
      EACH(y->dims, i) out[at(y, i)] = max ? -INFINITY : 0.0;
      EACH(x->dims, i) {
        double v = xm[at(x, i)], *o = &out[at(y, i)];   /* at() maps reduced dims to 0 */
        *o = max ? fmax(*o, v) : *o + v;
      }
      EACH(y->dims, i) out[at(y, i)] = sdpa_eval_round(y->type, out[at(y, i)]);
      break;
    }
    case L2L_SDPA_RESHAPE: {
      int64_t span = sdpa_eval_span(&ts[n->in[0]]), yspan = sdpa_eval_span(y);
      memcpy(out, e->mem[n->in[0]], sizeof(double) * (size_t)(span < yspan ? span : yspan));
      EACH(y->dims, i) out[at(y, i)] = sdpa_eval_round(y->type, out[at(y, i)]);
      break;
    }
    case L2L_SDPA_POINTWISE:
      EACH(y->dims, i) {
        double v[3] = {0, 0, 0};
        for (int k = 0; k < n->inputs; k++) v[k] = e->mem[n->in[k]][at(&ts[n->in[k]], i)];
        double index = n->axis >= 0 && n->axis < 4 ? (double)i[n->axis] : 0.0;
        out[at(y, i)] = sdpa_eval_round(y->type, pointwise(n->mode, v[0], v[1], v[2], index));
      }
      break;
  }
}

void sdpa_eval_run(struct sdpa_eval *e) {
  for (int n = 0; n < e->view->nodes; n++) run_node(e, &e->view->node[n]);
}
