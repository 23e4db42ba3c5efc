/* SPDX-License-Identifier: MIT */
/* cudnn_graph_build.c — the forward and backward SDPA graphs, node by node, through
 * cuDNN's backend descriptors (cudnn_graph_build.h).
 *
 * Purpose: a small builder over cudnnBackendCreateDescriptor / SetAttribute / Finalize
 * that keeps every descriptor it made (freed with the graph) and the first failure with
 * the node's name, so that a refused graph says which node cuDNN refused and why. cuDNN
 * checks each node's shapes and types when it is finalized, but without a GPU not how the
 * nodes connect (an operation graph with a dangling input finalizes), so the builder
 * checks the wiring itself: each node reads only real tensors or virtual ones an earlier
 * node wrote, no tensor is written twice or passed by value as an output, and every
 * virtual tensor written is read.
 * Must never: run without cudnn_loaded() having said yes.
 */
#include <math.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(L2L_CUDA) && defined(L2L_CUDNN_HEADERS)

#include "cudnn_graph_build.h"

typedef cudnnBackendDescriptor_t desc;

enum { MAX_DESCS = 192, MAX_OPS = 48, MAX_TENSORS = 64, MAX_CONFIGS = 8,
       FIRST_VIRTUAL_UID = 1000 };

/* A tensor of the graph and its wiring so far. */
struct tensor_use {
  desc d;
  const char *what;
  bool is_virtual, by_value;
  int writer;                   /* the node writing it, -1: none */
  int readers;
  int64_t uid;
  cudnnDataType_t type;
  struct dims { int64_t d[4], s[4]; } shape;
};

struct sdpa_graph {
  desc all[MAX_DESCS];          /* every descriptor made, destroyed in reverse */
  int count, tensors;
  struct tensor_use uses[MAX_TENSORS];
  struct backend_sdpa_node nodes[MAX_OPS];   /* what each node does, for cudnn_describe */
  desc ops[MAX_OPS];
  int nops;
  int64_t next_uid;
  desc graph;                   /* the operation graph, NULL until finalized */
  desc plan;                    /* NULL until planned */
  int64_t workspace;
  cudnnStatus_t status;         /* the first failure */
  char failed[300];
};

float sdpa_hidden_value(void) { return cudnn_loaded_version() < 91000 ? -FLT_MAX : -INFINITY; }

static void fail(struct sdpa_graph *g, cudnnStatus_t st, const char *what, const char *step) {
  if (g->status != CUDNN_STATUS_SUCCESS) return;
  char detail[200] = "";
  cudnn.last_error(detail, sizeof detail);
  g->status = st;
  snprintf(g->failed, sizeof g->failed, "%s: %s: %s%s%.150s", what, step, cudnn.error_string(st),
           detail[0] ? ": " : "", detail);
}

static desc make(struct sdpa_graph *g, cudnnBackendDescriptorType_t type, const char *what) {
  if (g->status != CUDNN_STATUS_SUCCESS) return NULL;
  if (g->count == MAX_DESCS) {
    fail(g, CUDNN_STATUS_INTERNAL_ERROR, what, "too many descriptors for l2l's table");
    return NULL;
  }
  desc d = NULL;
  cudnnStatus_t st = cudnn.create_descriptor(type, &d);
  if (st != CUDNN_STATUS_SUCCESS) {
    fail(g, st, what, "create");
    return NULL;
  }
  return g->all[g->count++] = d;
}

static void set(struct sdpa_graph *g, desc d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value,
                const char *what) {
  if (g->status != CUDNN_STATUS_SUCCESS) return;
  cudnnStatus_t st = cudnn.set_attribute(d, name, type, count, value);
  if (st != CUDNN_STATUS_SUCCESS) {
    char step[48];
    snprintf(step, sizeof step, "setting attribute %d", (int)name);
    fail(g, st, what, step);
  }
}

static void finalize(struct sdpa_graph *g, desc d, const char *what) {
  if (g->status != CUDNN_STATUS_SUCCESS) return;
  cudnnStatus_t st = cudnn.finalize(d);
  if (st != CUDNN_STATUS_SUCCESS) fail(g, st, what, "finalize");
}

/* ---------------------------------------------------------------- nodes */

static desc tensor_uid(struct sdpa_graph *g, int64_t uid, cudnnDataType_t type, struct dims x,
                       bool is_virtual, bool by_value, const char *what) {
  desc t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
  int64_t align = by_value ? 4 : 16;
  set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
  set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, x.d, what);
  set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, x.s, what);
  set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
  set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
  set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
  if (by_value) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
  finalize(g, t, what);
  if (g->status != CUDNN_STATUS_SUCCESS) return t;
  if (g->tensors == MAX_TENSORS) {
    fail(g, CUDNN_STATUS_INTERNAL_ERROR, what, "too many tensors for l2l's table");
    return t;
  }
  g->uses[g->tensors++] = (struct tensor_use){t, what, is_virtual, by_value, -1, 0, uid, type, x};
  return t;
}

/* The wiring check's failure (not cuDNN's words: its own). */
static void miswired(struct sdpa_graph *g, const char *what, const char *how, const char *which) {
  if (g->status != CUDNN_STATUS_SUCCESS) return;
  g->status = CUDNN_STATUS_BAD_PARAM;
  snprintf(g->failed, sizeof g->failed, "%s: l2l's wiring check: %s %s", what, how, which);
}

static struct tensor_use *use_of(struct sdpa_graph *g, desc d) {
  for (int i = 0; i < g->tensors; i++)
    if (g->uses[i].d == d) return &g->uses[i];
  return NULL;
}

/* The node about to be added (number g->nops, of `kind`; pointwise: `mode` and `axis`)
   reads in[0..n) and writes out. */
static void wire(struct sdpa_graph *g, enum backend_sdpa_kind kind, enum backend_sdpa_pw mode,
                 int64_t axis, const desc *in, int n, desc out, const char *what) {
  if (g->status != CUDNN_STATUS_SUCCESS || g->nops == MAX_OPS) return;
  struct backend_sdpa_node *node = &g->nodes[g->nops];
  *node = (struct backend_sdpa_node){.kind = kind, .mode = mode, .axis = axis, .inputs = n};
  for (int i = 0; i < n; i++) {
    struct tensor_use *u = use_of(g, in[i]);
    if (u == NULL) return miswired(g, what, "reads a tensor outside the graph", "");
    if (u->is_virtual && u->writer < 0)
      return miswired(g, what, "reads a virtual tensor no earlier node writes:", u->what);
    u->readers++;
    node->in[i] = (int)(u - g->uses);
  }
  struct tensor_use *o = use_of(g, out);
  if (o == NULL) return miswired(g, what, "writes a tensor outside the graph", "");
  if (o->writer >= 0) return miswired(g, what, "writes a tensor another node writes:", o->what);
  if (o->by_value) return miswired(g, what, "writes a scalar passed by value:", o->what);
  o->writer = g->nops;
  node->out = (int)(o - g->uses);
}

/* The plain-C name of a pointwise mode the graphs use. */
static enum backend_sdpa_pw pw_of(cudnnPointwiseMode_t mode) {
  switch (mode) {
    case CUDNN_POINTWISE_ADD: return L2L_SDPA_ADD;
    case CUDNN_POINTWISE_SUB: return L2L_SDPA_SUB;
    case CUDNN_POINTWISE_MUL: return L2L_SDPA_MUL;
    case CUDNN_POINTWISE_DIV: return L2L_SDPA_DIV;
    case CUDNN_POINTWISE_EXP: return L2L_SDPA_EXP;
    case CUDNN_POINTWISE_LOG: return L2L_SDPA_LOG;
    case CUDNN_POINTWISE_GEN_INDEX: return L2L_SDPA_GEN_INDEX;
    case CUDNN_POINTWISE_CMP_GE: return L2L_SDPA_CMP_GE;
    case CUDNN_POINTWISE_BINARY_SELECT: return L2L_SDPA_SELECT;
    default: return L2L_SDPA_IDENTITY;   /* the only other mode used */
  }
}

/* After the last node: every virtual tensor is read, every tensor takes part. */
static void wiring_complete(struct sdpa_graph *g) {
  for (int i = 0; i < g->tensors && g->status == CUDNN_STATUS_SUCCESS; i++) {
    const struct tensor_use *u = &g->uses[i];
    if (u->is_virtual && u->readers == 0)
      miswired(g, "graph", "a virtual tensor is written and never read:", u->what);
    else if (u->readers == 0 && u->writer < 0)
      miswired(g, "graph", "a tensor takes part in no node:", u->what);
  }
}

static desc real(struct sdpa_graph *g, int64_t uid, cudnnDataType_t type, struct dims x,
                 const char *what) {
  return tensor_uid(g, uid, type, x, false, false, what);
}
static desc scalar(struct sdpa_graph *g, int64_t uid, const char *what) {
  struct dims one = {{1, 1, 1, 1}, {1, 1, 1, 1}};
  return tensor_uid(g, uid, CUDNN_DATA_FLOAT, one, false, true, what);
}
static desc virt(struct sdpa_graph *g, cudnnDataType_t type, struct dims x, const char *what) {
  return tensor_uid(g, g->next_uid++, type, x, true, false, what);
}

static void add_op(struct sdpa_graph *g, desc op, const char *what) {
  finalize(g, op, what);
  if (g->status != CUDNN_STATUS_SUCCESS) return;
  if (g->nops == MAX_OPS) fail(g, CUDNN_STATUS_INTERNAL_ERROR, what, "too many operations");
  else g->ops[g->nops++] = op;
}

/* y = mode(x[, b][, t]) computed in `prec`; axis >= 0 for GEN_INDEX. */
static void pointwise(struct sdpa_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                      int64_t axis, desc x, desc b, desc t, desc y, const char *what) {
  desc pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
  set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
  set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
  if (axis >= 0) set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
  finalize(g, pw, what);
  desc op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
  if (b != NULL)
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
  if (t != NULL)
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
  desc in[3] = {x, b != NULL ? b : t, t};
  wire(g, L2L_SDPA_POINTWISE, pw_of(mode), axis, in, 1 + (b != NULL) + (t != NULL), y, what);
  add_op(g, op, what);
}

static void matmul(struct sdpa_graph *g, desc a, desc b, desc c, const char *what) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  desc mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
  set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, what);
  finalize(g, mm, what);
  desc op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what);
  wire(g, L2L_SDPA_MATMUL, L2L_SDPA_IDENTITY, -1, (desc[]){a, b}, 2, c, what);
  add_op(g, op, what);
}

static void reduction(struct sdpa_graph *g, cudnnReduceTensorOp_t mode, desc x, desc y,
                      const char *what) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  desc r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
  set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
  set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, what);
  finalize(g, r, what);
  desc op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, what);
  wire(g, mode == CUDNN_REDUCE_TENSOR_MAX ? L2L_SDPA_REDUCE_MAX : L2L_SDPA_REDUCE_ADD,
       L2L_SDPA_IDENTITY, -1, &x, 1, y, what);
  add_op(g, op, what);
}

static void reshape(struct sdpa_graph *g, desc x, desc y, const char *what) {
  desc op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
  wire(g, L2L_SDPA_RESHAPE, L2L_SDPA_IDENTITY, -1, &x, 1, y, what);
  add_op(g, op, what);
}

/* ---------------------------------------------------------------- the graphs */

/* The shapes of one call: packed [B, S, H, D] rows seen as [B, H, S, D] (and K^T, V^T as
   [B, H, D, S]), the scores [B, H, S, S] (and transposed), the rows [B, H, S, 1]. Q, K and
   V the same, or, where the caller's 16-bit q, k, v are read in place (qkv_dtype 16-bit),
   rows ld_qkv elements apart (the block's interleaved q | k | v rows); dQ, dK and dV so
   where they are written in place too (dqkv_dtype 16-bit as well). */
struct shapes { struct dims bhsd, bhds, q_bhsd, q_bhds, dq_bhsd, scores, scores_t, rows; };

static struct shapes shapes_of(const struct backend_attention_shape *sh) {
  const int64_t B = sh->batch, H = sh->heads, S = sh->seq, D = sh->head_dim;
  const int64_t L = sh->qkv_dtype == L2L_F32 ? H * D : sh->ld_qkv;
  const int64_t Ld = sh->qkv_dtype != L2L_F32 && sh->dqkv_dtype != L2L_F32 ? sh->ld_qkv : H * D;
  struct shapes x = {
      .bhsd = {{B, H, S, D}, {S * H * D, D, H * D, 1}},
      .bhds = {{B, H, D, S}, {S * H * D, D, 1, H * D}},
      .q_bhsd = {{B, H, S, D}, {S * L, D, L, 1}},
      .q_bhds = {{B, H, D, S}, {S * L, D, 1, L}},
      .dq_bhsd = {{B, H, S, D}, {S * Ld, D, Ld, 1}},
      .scores = {{B, H, S, S}, {H * S * S, S * S, S, 1}},
      .scores_t = {{B, H, S, S}, {H * S * S, S * S, 1, S}},
      .rows = {{B, H, S, 1}, {H * S, S, 1, 1}},
  };
  return x;
}

/* S = Q K^T * scale, [causal: row >= col ? S : hidden]; returns S's last node. */
static desc scores(struct sdpa_graph *g, const struct shapes *x, desc q, desc kt, desc scale,
                   desc hidden, int causal) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  desc s1 = virt(g, f32, x->scores, "S = Q K^T");
  matmul(g, q, kt, s1, "S = Q K^T");
  desc s2 = virt(g, f32, x->scores, "S * scale");
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, s1, scale, NULL, s2, "S * scale");
  if (!causal) return s2;
  desc row = virt(g, CUDNN_DATA_INT32, x->scores, "row index");
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, 2, s2, NULL, NULL, row, "row index");
  desc col = virt(g, CUDNN_DATA_INT32, x->scores, "column index");
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, 3, s2, NULL, NULL, col, "column index");
  desc keep = virt(g, CUDNN_DATA_BOOLEAN, x->scores, "row >= column");
  pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep,
            "row >= column");
  desc s3 = virt(g, f32, x->scores, "causal select");
  pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, f32, -1, s2, hidden, keep, s3, "causal select");
  return s3;
}

static void build_forward(struct sdpa_graph *g, const struct backend_attention_shape *sh,
                          cudnnDataType_t t16, int miswire) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  struct shapes x = shapes_of(sh);
  struct dims vdims = x.q_bhsd;
  if (miswire == 1) vdims.d[3] /= 2;
  desc q = real(g, SDPA_Q, t16, x.q_bhsd, "Q"), kt = real(g, SDPA_K, t16, x.q_bhds, "K^T");
  desc v = real(g, SDPA_V, t16, vdims, "V"), o = real(g, SDPA_O, t16, x.bhsd, "O");
  desc stats = real(g, SDPA_STATS, f32, x.rows, "stats");
  desc scale = scalar(g, SDPA_SCALE, "scale");
  desc hidden = sh->causal ? scalar(g, SDPA_HIDDEN, "hidden") : NULL;   /* the mask's only */
  desc s = scores(g, &x, q, kt, scale, hidden, sh->causal);
  desc m = virt(g, f32, x.rows, "M = max S");
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, m, "M = max S");
  desc sm = virt(g, f32, x.scores, "S - M");
  pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, s, m, NULL, sm, "S - M");
  desc e = virt(g, f32, x.scores, "E = exp(S - M)");
  pointwise(g, CUDNN_POINTWISE_EXP, f32, -1, sm, NULL, NULL, e, "E = exp(S - M)");
  desc z = virt(g, f32, x.rows, "Z = sum E");
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z, "Z = sum E");
  desc lz = virt(g, f32, x.rows, "log Z");
  pointwise(g, CUDNN_POINTWISE_LOG, f32, -1, z, NULL, NULL, lz, "log Z");
  pointwise(g, CUDNN_POINTWISE_ADD, f32, -1, m, lz, NULL, stats, "stats = M + log Z");
  desc p = virt(g, t16, x.scores, "P = E / Z");
  pointwise(g, CUDNN_POINTWISE_DIV, f32, -1, e, z, NULL, p, "P = E / Z");
  if (miswire == 2) p = virt(g, t16, x.scores, "P written by nothing");
  matmul(g, p, v, o, "O = P V");
}

static void build_backward(struct sdpa_graph *g, const struct backend_attention_shape *sh,
                           cudnnDataType_t t16, int miswire) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  struct shapes x = shapes_of(sh);
  struct dims vdims = x.q_bhds;
  if (miswire == 1) vdims.d[2] /= 2;
  desc q = real(g, SDPA_Q, t16, x.q_bhsd, "Q"), kt = real(g, SDPA_K, t16, x.q_bhds, "K^T");
  desc vt = real(g, SDPA_V, t16, vdims, "V^T"), o = real(g, SDPA_O, t16, x.bhsd, "O");
  desc stats = real(g, SDPA_STATS, f32, x.rows, "stats");
  desc d_o = real(g, SDPA_DO, t16, x.bhsd, "dO");
  desc dq = real(g, SDPA_DQ, t16, x.dq_bhsd, "dQ"), dk = real(g, SDPA_DK, t16, x.dq_bhsd, "dK");
  desc dv = real(g, SDPA_DV, t16, x.dq_bhsd, "dV");
  desc scale = scalar(g, SDPA_SCALE, "scale");
  desc hidden = sh->causal ? scalar(g, SDPA_HIDDEN, "hidden") : NULL;   /* the mask's only */
  desc one = scalar(g, SDPA_ONE, "one");
  desc dsum = real(g, SDPA_DSUM, f32, x.rows, "Dsum");
  struct dims acc = {{sh->batch, sh->heads, sh->seq, sh->head_dim},
                     {sh->heads * sh->seq * sh->head_dim, sh->seq * sh->head_dim, sh->head_dim, 1}};
  desc dq_acc = real(g, SDPA_DQ_ACC, f32, acc, "dQ accumulator");
  /* Dsum = (sum_d dO * O) * 1 */
  desc t = virt(g, f32, x.bhsd, "dO * O");
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, d_o, o, NULL, t, "dO * O");
  desc r = virt(g, f32, x.rows, "sum dO * O");
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, t, r, "sum dO * O");
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, r, one, NULL, dsum, "Dsum");
  /* E = exp(S - stats), masked as the forward */
  desc s1 = virt(g, f32, x.scores, "S = Q K^T");
  matmul(g, q, kt, s1, "S = Q K^T");
  desc s2 = virt(g, f32, x.scores, "S * scale");
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, s1, scale, NULL, s2, "S * scale");
  desc s3 = virt(g, f32, x.scores, "S - stats");
  pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, s2, stats, NULL, s3, "S - stats");
  desc last = s3;
  if (sh->causal) {
    desc row = virt(g, CUDNN_DATA_INT32, x.scores, "row index");
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, 2, s3, NULL, NULL, row, "row index");
    desc col = virt(g, CUDNN_DATA_INT32, x.scores, "column index");
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, 3, s3, NULL, NULL, col, "column index");
    desc keep = virt(g, CUDNN_DATA_BOOLEAN, x.scores, "row >= column");
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep,
              "row >= column");
    last = virt(g, f32, x.scores, "causal select");
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, f32, -1, s3, hidden, keep, last, "causal select");
  }
  desc e = virt(g, f32, x.scores, "P = exp(S - stats)");
  pointwise(g, CUDNN_POINTWISE_EXP, f32, -1, last, NULL, NULL, e, "P = exp(S - stats)");
  /* dV = P^T dO */
  desc pt = virt(g, t16, x.scores_t, "P^T");
  reshape(g, e, pt, "P^T");
  matmul(g, pt, d_o, dv, "dV = P^T dO");
  /* dS = (dO V^T - Dsum) * P * scale */
  desc dp = virt(g, f32, x.scores, "dP = dO V^T");
  matmul(g, d_o, vt, dp, "dP = dO V^T");
  desc d1 = virt(g, f32, x.scores, "dP - Dsum");
  pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, dp, dsum, NULL, d1, "dP - Dsum");
  desc d2 = virt(g, f32, x.scores, "(dP - Dsum) * P");
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, d1, e, NULL, d2, "(dP - Dsum) * P");
  desc ds = virt(g, f32, x.scores, "dS");
  pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, miswire == 2 ? d1 : d2, scale, NULL, ds, "dS");
  /* dK = dS^T Q */
  desc dst = virt(g, t16, x.scores_t, "dS^T");
  reshape(g, ds, dst, "dS^T");
  matmul(g, dst, q, dk, "dK = dS^T Q");
  /* dQ = dS K, accumulated in f32, then cast */
  desc k = virt(g, t16, x.q_bhsd, "K");   /* (K^T's memory read as K: its strides) */
  reshape(g, kt, k, "K");
  matmul(g, ds, k, dq_acc, "dQacc = dS K");
  pointwise(g, CUDNN_POINTWISE_IDENTITY, f32, -1, dq_acc, NULL, NULL, dq, "dQ = dQacc");
}

struct sdpa_graph *sdpa_graph_build(const struct backend_attention_shape *sh, int backward,
                                    int miswire, char *why, size_t len) {
  struct sdpa_graph *g = calloc(1, sizeof *g);
  if (g == NULL) {
    snprintf(why, len, "out of host memory for a cuDNN graph");
    return NULL;
  }
  g->next_uid = FIRST_VIRTUAL_UID;
  cudnnDataType_t t16 = sh->precision == L2L_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  if (backward) build_backward(g, sh, t16, miswire);
  else build_forward(g, sh, t16, miswire);
  wiring_complete(g);
  if (g->status != CUDNN_STATUS_SUCCESS) {
    snprintf(why, len, "the %s graph is refused at node %s", backward ? "backward" : "forward",
             g->failed);
    sdpa_graph_free(g);
    return NULL;
  }
  return g;
}

/* ---------------------------------------------------------------- plan and run */

bool sdpa_graph_finalize(struct sdpa_graph *g, cudnnHandle_t h, char *why, size_t len) {
  if (g->graph == NULL) {
    desc graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
        "operation graph");
    if (h != NULL)   /* needed before cuDNN 9.8 */
      set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "operation graph");
    finalize(g, graph, "operation graph");
    if (g->status == CUDNN_STATUS_SUCCESS) g->graph = graph;
  }
  if (g->graph == NULL) snprintf(why, len, "%s", g->failed);
  return g->graph != NULL;
}

bool sdpa_graph_plan(struct sdpa_graph *g, cudnnHandle_t h, char *why, size_t len) {
  if (!sdpa_graph_finalize(g, h, why, len)) return false;
  desc graph = g->graph;
  desc heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
      "engine heuristics");
  set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "engine heuristics");
  finalize(g, heur, "engine heuristics");
  desc configs[MAX_CONFIGS];
  int64_t got = 0;
  for (int i = 0; i < MAX_CONFIGS; i++) configs[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
  if (g->status == CUDNN_STATUS_SUCCESS) {
    cudnnStatus_t st = cudnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CONFIGS, &got, configs);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, st, "engine heuristics", "results");
    else if (got == 0) fail(g, CUDNN_STATUS_NOT_SUPPORTED, "engine heuristics", "no engine for this graph");
  }
  char last[300] = "";
  for (int64_t i = 0; i < got && g->status == CUDNN_STATUS_SUCCESS && g->plan == NULL; i++) {
    desc plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "execution plan");
    set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
        &configs[i], "execution plan");
    if (g->status != CUDNN_STATUS_SUCCESS) break;
    cudnnStatus_t st = cudnn.finalize(plan);
    if (st != CUDNN_STATUS_SUCCESS) {   /* this engine cannot: try the next */
      char detail[200] = "";
      cudnn.last_error(detail, sizeof detail);
      snprintf(last, sizeof last, "%s %.200s", cudnn.error_string(st), detail);
      continue;
    }
    int64_t count = 0;
    st = cudnn.get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                             &count, &g->workspace);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, st, "execution plan", "workspace size");
    else g->plan = plan;
  }
  if (g->status == CUDNN_STATUS_SUCCESS && g->plan == NULL)
    snprintf(g->failed, sizeof g->failed, "no engine's plan finalizes (last: %.250s)", last);
  if (g->plan == NULL) snprintf(why, len, "%s", g->failed);
  return g->plan != NULL;
}

int64_t sdpa_graph_workspace(const struct sdpa_graph *g) { return g->plan ? g->workspace : 0; }

bool sdpa_graph_execute(struct sdpa_graph *g, cudnnHandle_t h, const int64_t *uids, void **ptrs,
                        int n, void *workspace, char *why, size_t len) {
  desc pack = NULL;
  cudnnStatus_t st = cudnn.create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnn.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnn.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnn.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnn.finalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnn.execute(h, g->plan, pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    char detail[200] = "";
    cudnn.last_error(detail, sizeof detail);
    snprintf(why, len, "executing the plan: %s %.200s", cudnn.error_string(st), detail);
  }
  if (pack != NULL) cudnn.destroy_descriptor(pack);
  return st == CUDNN_STATUS_SUCCESS;
}

void sdpa_graph_counts(const struct sdpa_graph *g, int *tensors, int *ops) {
  *tensors = g->tensors, *ops = g->nops;
}

void sdpa_graph_describe(const struct sdpa_graph *g, struct backend_sdpa_view *out) {
  memset(out, 0, sizeof *out);
  out->tensors = g->tensors, out->nodes = g->nops;
  for (int i = 0; i < g->tensors; i++) {
    const struct tensor_use *u = &g->uses[i];
    struct backend_sdpa_tensor *t = &out->tensor[i];
    t->uid = u->uid, t->is_virtual = u->is_virtual, t->by_value = u->by_value;
    memcpy(t->dims, u->shape.d, sizeof t->dims);
    memcpy(t->strides, u->shape.s, sizeof t->strides);
    t->type = u->type == CUDNN_DATA_BFLOAT16 ? L2L_SDPA_BF16
              : u->type == CUDNN_DATA_HALF   ? L2L_SDPA_F16
              : u->type == CUDNN_DATA_INT32  ? L2L_SDPA_I32
              : u->type == CUDNN_DATA_BOOLEAN ? L2L_SDPA_BOOL
                                             : L2L_SDPA_F32;
    snprintf(t->name, sizeof t->name, "%s", u->what);
  }
  memcpy(out->node, g->nodes, sizeof(struct backend_sdpa_node) * (size_t)g->nops);
}

void sdpa_graph_free(struct sdpa_graph *g) {
  if (g == NULL) return;
  for (int i = g->count - 1; i >= 0; i--) cudnn.destroy_descriptor(g->all[i]);
  free(g);
}

#endif /* L2L_CUDA && L2L_CUDNN_HEADERS */
