/* SPDX-License-Identifier: MIT */
/* attention.c — multi-head self-attention for the CPU backend, flash style.
 *
 * Purpose: attention forward and backward that never need an S x S matrix per head beyond
 * one tile of query rows per thread, so that the memory-frugal block keeps only the row
 * log-sum-exp for backward and recomputes the probabilities tile by tile (Dao et al.,
 * FlashAttention, 2022). The standard block passes buffers for P, the dropped P' and the
 * dropout bits, and then the same code keeps them and its backward reads them instead of
 * recomputing: both modes run one implementation.
 *
 * Work is split over (sample, head[, query tile]) with OpenMP; each tile's products are
 * cblas_sgemm calls on strided views (heads live in columns, so no permutes are needed),
 * which OpenBLAS's OpenMP build runs single-threaded inside the parallel region. 16-bit q,
 * k, v (a 16-bit run's block keeps them so) are widened a head's rows at a time into the
 * thread's workspace first, and a 16-bit o is computed a tile at a time in fp32 there and
 * rounded as it is stored; 16-bit dq, dk, dv are a head's fp32 rows there, rounded once
 * the head is done, and a 16-bit do is widened a head's rows at a time like q, k, v: the
 * products are fp32 whatever the dtypes.
 *
 * Backward per tile of query rows i and all visible keys j (dropout mask M, keep = 1-p):
 *   P = exp(scale q k^T - lse),  P' = P M / keep,  dv += P'^T do,  dP' = do v^T,
 *   dS = P (dP' M / keep - D) with D_i = sum_j P'_ij dP'_ij = do_i . o_i,
 *   dq = scale dS k,  dk += scale dS^T q.
 * Must never: allocate (the caller passes the workspace), or let two threads write one
 * head's dk/dv (a head's key gradients belong to the thread that owns the head).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "vmath.h"

enum { TILE_Q = 64 }; /* query rows per tile: a tile row of scores stays in cache */

/* A thread's workspace, in floats, laid out in this order. Forward: the score tile, then
   with a 16-bit o its tile of fp32 rows before they are rounded, then with 16-bit q, k, v
   the tile's q rows and the head's k and v rows widened. Backward: the P, P' and dP'
   tiles, then with a 16-bit o a row of it widened, then with 16-bit q, k, v the head's
   rows of each widened, then with 16-bit dq, dk, dv the head's fp32 rows of each, then
   with a 16-bit do the head's rows of it widened. */
static int64_t o_floats(const struct backend_attention_shape *sh, int backward) {
  return sh->o_dtype == L2L_F32 ? 0 : backward ? sh->head_dim : TILE_Q * sh->head_dim;
}
static int64_t qkv_floats(const struct backend_attention_shape *sh, int backward) {
  if (sh->qkv_dtype == L2L_F32) return 0;
  return (backward ? 3 * sh->seq : TILE_Q + 2 * sh->seq) * sh->head_dim;
}
static int64_t dqkv_floats(const struct backend_attention_shape *sh, int backward) {
  return backward && sh->dqkv_dtype != L2L_F32 ? 3 * sh->seq * sh->head_dim : 0;
}
static int64_t do_floats(const struct backend_attention_shape *sh, int backward) {
  return backward && sh->do_dtype != L2L_F32 ? sh->seq * sh->head_dim : 0;
}

int64_t cpu_attention_workspace(const struct backend_attention_shape *sh, int backward) {
  return (backward ? 3 : 1) * (int64_t)TILE_Q * sh->seq + o_floats(sh, backward) +
         qkv_floats(sh, backward) + dqkv_floats(sh, backward) + do_floats(sh, backward);
}

/* Rows [r0, r0 + rows) of head h of sample b of a tensor of dtype with rows ld apart (q, k
   or v: ld_qkv, qkv_dtype; do: ld_o, do_dtype) as fp32 rows of head_dim: the rows
   themselves when f32 (*ld_out = ld), else widened into buf (*ld_out = hd). */
static const float *rows_of(const void *x, l2l_dtype dtype, int64_t ld,
                            const struct backend_attention_shape *sh, int64_t b, int64_t h,
                            int64_t r0, int64_t rows, float *buf, int64_t *ld_out) {
  const int64_t hd = sh->head_dim, first = (b * sh->seq + r0) * ld + h * hd;
  if (dtype == L2L_F32) {
    *ld_out = ld;
    return (const float *)x + first;
  }
  cpu_widen_16(buf, (const uint16_t *)x + first, dtype, rows, hd, ld);
  *ld_out = hd;
  return buf;
}
static const float *head_rows(const void *x, const struct backend_attention_shape *sh, int64_t b,
                              int64_t h, int64_t r0, int64_t rows, float *buf, int64_t *ld_out) {
  return rows_of(x, sh->qkv_dtype, sh->ld_qkv, sh, b, h, r0, rows, buf, ld_out);
}

/* Threads that fit the workspace, at most the compute threads and `items`; one for
   small problems, where waking a team costs more than it saves. */
static int attention_threads(const struct backend_attention_shape *sh, int backward,
                             int64_t workspace_floats, int64_t items) {
  int64_t fit = workspace_floats / cpu_attention_workspace(sh, backward);
  int64_t flops = sh->batch * sh->heads * sh->seq * sh->seq * sh->head_dim;
  int64_t nt = flops < (1 << 18) ? 1 : atomic_load_explicit(&cpu_compute_threads, memory_order_relaxed);
  if (nt > fit) nt = fit;
  if (nt > items) nt = items;
  return nt < 1 ? 1 : (int)nt;
}

/* Keys visible to query i lie in [0, key_end(i)): causal self-attention stops at i. */
static inline int64_t tile_key_end(const struct backend_attention_shape *sh, int64_t last_row) {
  return sh->causal ? last_row + 1 : sh->seq;
}

static inline bool key_hidden(const struct backend_attention_shape *sh, const uint8_t *key_mask,
                              int64_t b, int64_t i, int64_t j) {
  return (sh->causal && j > i) || (key_mask != NULL && key_mask[b * sh->seq + j] == 0);
}

/* Bit j of row (b, h, i) of a standard-mode mask: rows start on bytes, so that threads
   owning different rows never share a byte. */
static inline int64_t mask_row_bytes(int64_t seq) { return (seq + 7) / 8; }

/* row[j] *= kept_j / keep for j < count, kept_j from draw index0 + j; kept bits go to
   bits (NULL: not kept). Draws come DROP_CHUNK at a time from the vectorized Philox. */
enum { DROP_CHUNK = 256 };

static void dropout_row(float *row, uint8_t *bits, int64_t count, uint64_t index0,
                        const struct backend_attention_shape *sh) {
  const uint32_t threshold = backend_keep_threshold(sh->dropout);
  const float keep_scale = 1.0f / (1.0f - sh->dropout);
  uint32_t draws[DROP_CHUNK];
  uint8_t kept[DROP_CHUNK];
  for (int64_t start = 0; start < count; start += DROP_CHUNK) { /* whole bytes of bits */
    int64_t n = count - start < DROP_CHUNK ? count - start : DROP_CHUNK;
    float *r = row + start;
    philox_range(draws, sh->seed, sh->stream, index0 + (uint64_t)start, n);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
      kept[j] = (draws[j] >> 8) < threshold;
      r[j] = kept[j] ? r[j] * keep_scale : 0.0f;
    }
    if (bits) backend_pack_bits(bits + start / 8, kept, n);
  }
}

/* Same as dropout_row, with the kept bits read from a standard-mode mask row. */
static void dropout_row_from_bits(float *row, const uint8_t *bits, int64_t count, float p) {
  float keep_scale = 1.0f / (1.0f - p);
  for (int64_t j = 0; j < count; j++)
    row[j] = (bits[j >> 3] >> (j & 7)) & 1 ? row[j] * keep_scale : 0.0f;
}

/* Draw index of element (b, h, i, 0) at block site 0 (l2l.h), modulo 2^64 like every draw
   index (first_sample may be as large as INT64_MAX: adding b in int64 overflowed). */
static inline uint64_t draw_index(const struct backend_attention_shape *sh, int64_t b, int64_t h,
                                  int64_t i) {
  return (((uint64_t)sh->first_sample + (uint64_t)b) * (uint64_t)sh->heads + (uint64_t)h) *
             (uint64_t)(sh->seq * sh->seq) + (uint64_t)(i * sh->seq);
}

/* ---------------------------------------------------------------- forward */

static void forward_tile(void *o, float *lse, float *probs, float *dropped, uint8_t *mask,
                         const void *q, const void *k, const void *v,
                         const uint8_t *key_mask, const struct backend_attention_shape *sh,
                         int64_t b, int64_t h, int64_t i0, float *scratch) {
  const int64_t S = sh->seq, hd = sh->head_dim;
  const int64_t rows = S - i0 < TILE_Q ? S - i0 : TILE_Q, kend = tile_key_end(sh, i0 + rows - 1);
  const int64_t head = b * sh->heads + h;
  float *qbuf = scratch + TILE_Q * S + o_floats(sh, 0), *kbuf = qbuf + TILE_Q * hd, *vbuf = kbuf + S * hd;
  int64_t ldq, ldk, ldv;
  const float *qt = head_rows(q, sh, b, h, i0, rows, qbuf, &ldq);
  const float *kb = head_rows(k, sh, b, h, 0, kend, kbuf, &ldk);
  const float *vb = head_rows(v, sh, b, h, 0, kend, vbuf, &ldv);
  /* Scores and probabilities of this tile live in the standard mode's P rows, else in
     the thread's scratch tile; both have row stride S. */
  float *pt = probs ? probs + (head * S + i0) * S : scratch;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kend, (int)hd,
              sh->scale, qt, (int)ldq, kb, (int)ldk, 0.0f, pt, (int)S);
  for (int64_t r = 0; r < rows; r++) {
    int64_t i = i0 + r;
    float *row = pt + r * S, mx = -INFINITY;
    for (int64_t j = 0; j < kend; j++)
      if (key_hidden(sh, key_mask, b, i, j)) row[j] = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < kend; j++) mx = row[j] > mx ? row[j] : mx;
    if (mx == -INFINITY) { /* every key hidden: the row is zeros */
      memset(row, 0, (size_t)S * sizeof *row);
      lse[head * S + i] = -INFINITY;
      continue;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < kend; j++) {
      float e = row[j] == -INFINITY ? 0.0f : vexp(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < kend; j++) row[j] *= inv;
    if (probs) /* kept P is whole rows; the scratch tile is only read up to kend */
      for (int64_t j = kend; j < S; j++) row[j] = 0.0f;
    lse[head * S + i] = mx + logf(sum);
  }
  float *dt = pt; /* P' (dropped) rows */
  if (sh->dropout > 0.0f) {
    if (dropped) {
      dt = dropped + (head * S + i0) * S;
      memcpy(dt, pt, (size_t)(rows * S) * sizeof *dt);
    }
    for (int64_t r = 0; r < rows; r++)
      dropout_row(dt + r * S, mask ? mask + (head * S + i0 + r) * mask_row_bytes(S) : NULL,
                  kend, draw_index(sh, b, h, i0 + r), sh);
  }
  /* o = P' v: straight into an fp32 o, else through the output tile, then rounded */
  const int64_t o0 = (b * S + i0) * sh->ld_o + h * hd;
  if (sh->o_dtype == L2L_F32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)kend, 1.0f,
                dt, (int)S, vb, (int)ldv, 0.0f, (float *)o + o0, (int)sh->ld_o);
    return;
  }
  float *ot = scratch + TILE_Q * S;   /* (rows, hd) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)kend, 1.0f,
              dt, (int)S, vb, (int)ldv, 0.0f, ot, (int)hd);
  for (int64_t r = 0; r < rows; r++)   /* (rounded as convert rounds) */
    cpu_round_16((uint16_t *)o + o0 + r * sh->ld_o, sh->o_dtype, ot + r * hd, hd);
}

l2l_status cpu_attention_forward(void *o, float *lse, float *probs, float *dropped,
                                 uint8_t *mask, const void *q, const void *k,
                                 const void *v, const uint8_t *key_mask,
                                 const struct backend_attention_shape *sh, float *workspace,
                                 int64_t workspace_floats) {
  const int64_t tiles = (sh->seq + TILE_Q - 1) / TILE_Q;
  const int64_t items = sh->batch * sh->heads * tiles;
  const int64_t per_thread = cpu_attention_workspace(sh, 0);
  int nt = attention_threads(sh, 0, workspace_floats, items);
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t item = 0; item < items; item++) {
    int t = nt > 1 ? omp_get_thread_num() : 0;
    int64_t bh = item / tiles, tile = item % tiles;
    forward_tile(o, lse, probs, dropped, mask, q, k, v, key_mask, sh, bh / sh->heads,
                 bh % sh->heads, tile * TILE_Q, workspace + t * per_thread);
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- backward */

static void backward_head(void *dq, void *dk, void *dv, const void *d_o, const void *o,
                          const float *lse, const float *probs, const float *dropped,
                          const uint8_t *mask, const void *q, const void *k, const void *v,
                          const uint8_t *key_mask, const struct backend_attention_shape *sh,
                          int64_t b, int64_t h, float *scratch) {
  const int64_t S = sh->seq, hd = sh->head_dim, ldo = sh->ld_o;
  const int64_t head = b * sh->heads + h;
  const float keep_scale = 1.0f / (1.0f - sh->dropout);
  float *p_tile = scratch, *pd_tile = scratch + TILE_Q * S, *dp_tile = scratch + 2 * TILE_Q * S;
  float *o_row = scratch + 3 * TILE_Q * S;   /* (hd) */
  float *qbuf = o_row + o_floats(sh, 1), *kbuf = qbuf + S * hd, *vbuf = kbuf + S * hd;
  int64_t ldq, ldk, ldv;
  const float *qh = head_rows(q, sh, b, h, 0, S, qbuf, &ldq);
  const float *kb = head_rows(k, sh, b, h, 0, S, kbuf, &ldk);
  const float *vb = head_rows(v, sh, b, h, 0, S, vbuf, &ldv);
  /* the head's dq, dk, dv: in place when f32, else fp32 rows (S, hd) rounded at the end */
  const bool g16 = sh->dqkv_dtype != L2L_F32;
  const int64_t first = b * S * sh->ld_qkv + h * hd, ld = g16 ? hd : sh->ld_qkv;
  float *dqb = g16 ? qbuf + qkv_floats(sh, 1) : (float *)dq + first;
  float *dkb = g16 ? dqb + S * hd : (float *)dk + first;
  float *dvb = g16 ? dkb + S * hd : (float *)dv + first;
  int64_t ld_do;   /* (the head's do rows: in place, or widened past dq, dk, dv's) */
  const float *doh = rows_of(d_o, sh->do_dtype, ldo, sh, b, h, 0, S,
                             qbuf + qkv_floats(sh, 1) + dqkv_floats(sh, 1), &ld_do);
  for (int64_t j = 0; j < S; j++) {
    memset(dkb + j * ld, 0, (size_t)hd * sizeof *dkb);
    memset(dvb + j * ld, 0, (size_t)hd * sizeof *dvb);
  }
  for (int64_t i0 = 0; i0 < S; i0 += TILE_Q) {
    const int64_t rows = S - i0 < TILE_Q ? S - i0 : TILE_Q;
    const int64_t kend = tile_key_end(sh, i0 + rows - 1);
    const float *qt = qh + i0 * ldq;
    const float *dot = doh + i0 * ld_do;
    const int64_t o0 = (b * S + i0) * ldo + h * hd;   /* (o's row r at o0 + r ldo) */
    float *dqt = dqb + i0 * ld;

    /* P of the tile: kept (standard) or recomputed from q, k and lse (frugal). */
    const float *pt = p_tile;
    if (probs) {
      pt = probs + (head * S + i0) * S;
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kend, (int)hd,
                  sh->scale, qt, (int)ldq, kb, (int)ldk, 0.0f, p_tile, (int)S);
      for (int64_t r = 0; r < rows; r++) {
        int64_t i = i0 + r;
        float *row = p_tile + r * S, l = lse[head * S + i];
        for (int64_t j = 0; j < kend; j++)
          if (l == -INFINITY || key_hidden(sh, key_mask, b, i, j)) row[j] = -INFINITY;
#pragma omp simd
        for (int64_t j = 0; j < kend; j++)
          row[j] = row[j] == -INFINITY ? 0.0f : vexp(row[j] - l);
      }
    }
    /* P' = P M / keep: kept, or rebuilt from the mask bits or the generator. */
    const float *pdt = pt;
    if (sh->dropout > 0.0f) {
      if (dropped) {
        pdt = dropped + (head * S + i0) * S;
      } else {
        for (int64_t r = 0; r < rows; r++) {
          memcpy(pd_tile + r * S, pt + r * S, (size_t)kend * sizeof *pd_tile);
          if (mask)
            dropout_row_from_bits(pd_tile + r * S, mask + (head * S + i0 + r) * mask_row_bytes(S),
                                  kend, sh->dropout);
          else
            dropout_row(pd_tile + r * S, NULL, kend, draw_index(sh, b, h, i0 + r), sh);
        }
        pdt = pd_tile;
      }
    }
    /* dv += P'^T do;  dP' = do v^T */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kend, (int)hd, (int)rows, 1.0f,
                pdt, (int)S, dot, (int)ld_do, 1.0f, dvb, (int)ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kend, (int)hd, 1.0f,
                dot, (int)ld_do, vb, (int)ldv, 0.0f, dp_tile, (int)S);
    /* dS = P (dP' M / keep - D), in place of dP'. M / keep is P'/P where P > 0; where the
       dropout dropped an element P' = 0 and so is its gradient. */
    for (int64_t r = 0; r < rows; r++) {
      const float *prow = pt + r * S, *pdrow = pdt + r * S;
      float *drow = dp_tile + r * S, d = 0.0f;
      const float *dor = dot + r * ld_do, *orow = o_row;
      if (sh->o_dtype == L2L_F32)
        orow = (const float *)o + o0 + r * ldo;
      else
        cpu_widen_16(o_row, (const uint16_t *)o + o0 + r * ldo, sh->o_dtype, 1, hd, ldo);
#pragma omp simd reduction(+ : d)
      for (int64_t c = 0; c < hd; c++) d += dor[c] * orow[c];
      if (sh->dropout > 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < kend; j++)
          drow[j] = prow[j] * ((pdrow[j] != 0.0f ? drow[j] * keep_scale : 0.0f) - d);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < kend; j++) drow[j] = prow[j] * (drow[j] - d);
      }
    }
    /* dq = scale dS k;  dk += scale dS^T q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)kend,
                sh->scale, dp_tile, (int)S, kb, (int)ldk, 0.0f, dqt, (int)ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kend, (int)hd, (int)rows,
                sh->scale, dp_tile, (int)S, qt, (int)ldq, 1.0f, dkb, (int)ld);
  }
  if (!g16) return;
  for (int64_t j = 0; j < S; j++) {   /* (rounded as convert rounds) */
    const int64_t at = first + j * sh->ld_qkv;
    cpu_round_16((uint16_t *)dq + at, sh->dqkv_dtype, dqb + j * hd, hd);
    cpu_round_16((uint16_t *)dk + at, sh->dqkv_dtype, dkb + j * hd, hd);
    cpu_round_16((uint16_t *)dv + at, sh->dqkv_dtype, dvb + j * hd, hd);
  }
}

l2l_status cpu_attention_backward(void *dq, void *dk, void *dv, const void *d_o,
                                  const void *o, const float *lse, const float *probs,
                                  const float *dropped, const uint8_t *mask,
                                  const void *q, const void *k, const void *v,
                                  const uint8_t *key_mask,
                                  const struct backend_attention_shape *sh, float *workspace,
                                  int64_t workspace_floats) {
  const int64_t items = sh->batch * sh->heads;
  const int64_t per_thread = cpu_attention_workspace(sh, 1);
  int nt = attention_threads(sh, 1, workspace_floats, items);
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t item = 0; item < items; item++) {
    int t = nt > 1 ? omp_get_thread_num() : 0;
    backward_head(dq, dk, dv, d_o, o, lse, probs, dropped, mask, q, k, v, key_mask, sh,
                  item / sh->heads, item % sh->heads, workspace + t * per_thread);
  }
  return L2L_OK;
}
