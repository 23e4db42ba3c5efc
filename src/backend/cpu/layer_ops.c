/* SPDX-License-Identifier: MIT */
/* layer_ops.c — the CPU backend's ops that layers run: GEMMs (OpenBLAS), bias, GELU
 * (with its memory-frugal form from the output), LayerNorm, softmax, embedding,
 * cross-entropy and dropout, as entries of cpu_backend (cpu/cpu_ops.c).
 *
 * Purpose and rules: as cpu/cpu_ops.c says for the whole backend: every loop vectorizes and
 * splits across the compute threads with a static schedule, so results are the same from
 * run to run for a given thread count.
 * Must never: allocate from a pool, or read an output before writing it unless the op
 * accumulates.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "vmath.h"

/* GELU, tanh form, written as x * sigmoid(2u) (since (1 + tanh u)/2 = sigmoid(2u)): no
   cancellation for large negative x, where 1 + tanh(u) would lose every digit. */
#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* ---------------------------------------------------------------- GEMM */

/* The calling thread's buffer for a 16-bit GEMM's widened inputs, at least `floats` long,
   kept between calls and freed as the thread ends: one allocated a call came from fresh
   pages each time, whose faults were most of a bf16 step at small batches (a 304 M model's
   LM head widened 412 MB a call; bench/RESULTS.md). It holds a panel of each input at a
   time, WIDEN_FLOATS at most (unless one row of k is more), so what a thread keeps does
   not grow with the model. NULL where there is no memory. */
enum { WIDEN_FLOATS = 8 << 20 };   /* 32 MiB */
struct widen_buffer {
  float *data;
  size_t floats;
};
static pthread_key_t widen_key;
static pthread_once_t widen_once = PTHREAD_ONCE_INIT;
static bool widen_key_made;

static void widen_buffer_free(void *p) {
  struct widen_buffer *w = p;
  free(w->data);
  free(w);
}
static void widen_key_make(void) { widen_key_made = pthread_key_create(&widen_key, widen_buffer_free) == 0; }

static float *widen_buffer(size_t floats) {
  pthread_once(&widen_once, widen_key_make);
  if (!widen_key_made) return NULL;
  struct widen_buffer *w = pthread_getspecific(widen_key);
  if (w == NULL) {
    if ((w = calloc(1, sizeof *w)) == NULL) return NULL;
    if (pthread_setspecific(widen_key, w) != 0) {
      free(w);
      return NULL;
    }
  }
  if (w->floats < floats) {
    free(w->data);
    w->data = malloc(floats * sizeof *w->data);
    w->floats = w->data != NULL ? floats : 0;
  }
  return w->data;
}

/* wide (rows, cols) := a 16-bit matrix whose rows are ld apart, rows split across threads */
static void widen_rows(float *wide, const uint16_t *m, l2l_dtype dtype, int64_t rows,
                       int64_t cols, int64_t ld) {
  int nt = threads_for(rows * cols);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++) cpu_widen_16(wide + r * cols, m + r * ld, dtype, 1, cols, ld);
}

/* The panels a 16-bit GEMM's inputs are widened in, within WIDEN_FLOATS: *mt rows of op(a),
   *nt columns of op(b), *kt of k at a time (the products of k panels added into c), so
   that every element is widened once and each call stays large. Where m + n is at most
   32 Ki, both whole and k in panels of 256 or more; else (a dim is a vocabulary's) the
   smaller whole and the larger in panels of 256 or more, all of k where that fits (an LM
   head), else k in panels too. Multiples of 64 (OpenBLAS's kernels' blocks divide it). */
enum { PANEL_LEAST = 256 };
static int64_t panel_of(int64_t want, int64_t whole) {
  return want >= whole ? whole : want < 64 ? 64 : want / 64 * 64;
}
static void widen_panels(int64_t m, int64_t n, int64_t k, int64_t *mt, int64_t *nt, int64_t *kt) {
  const int64_t cap = WIDEN_FLOATS;
  *mt = m, *nt = n, *kt = k;
  if ((m + n) * k <= cap) return;
  if ((m + n) * PANEL_LEAST <= cap) {
    *kt = panel_of(cap / (m + n), k);
    return;
  }
  const int64_t small = m < n ? m : n;
  *kt = panel_of(cap / (small + PANEL_LEAST), k);
  int64_t big = panel_of((cap - small * *kt) / *kt, m < n ? n : m);
  if (m < n) *nt = big;
  else *mt = big;
}

/* f16 / bf16 inputs are widened to f32 (exactly) a panel pair at a time, in memory of the
   backend's own: OpenBLAS has no 16-bit GEMM with f32 accumulation (Debian's exports no
   sbgemm). Each c element is one f32 sum over k either way (in k panels, their sums added
   in order); OpenBLAS's edge kernels may order it otherwise than the whole product's. */
l2l_status cpu_gemm_batched(float *c, const void *a, const void *b, l2l_dtype ab_dtype,
                            int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                            int trans_b, float alpha, float beta, int64_t lda, int64_t ldb,
                            int64_t ldc) {
  /* Row-major: a stored matrix is (rows, cols), its rows ld apart (packed: cols). */
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  if (lda == 0) lda = a_cols;
  if (ldb == 0) ldb = b_cols;
  if (ldc == 0) ldc = n;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (ab_dtype == L2L_F32) {
    for (int64_t i = 0; i < batch; i++)
      cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha,
                  (const float *)a + i * a_rows * lda, (int)lda, (const float *)b + i * b_rows * ldb,
                  (int)ldb, beta, c + i * m * ldc, (int)ldc);
    return L2L_OK;
  }
  int64_t mt, nt, kt;
  widen_panels(m, n, k, &mt, &nt, &kt);
  float *wa = widen_buffer((size_t)((mt + nt) * kt) + 1);   /* (+ 1: never 0, an empty GEMM's) */
  if (wa == NULL)
    return core_fail(L2L_ERR_NOMEM, "cpu backend: no memory to widen a %s GEMM's inputs",
                     l2l_dtype_name(ab_dtype));
  float *wb = wa + mt * kt;
  for (int64_t i = 0; i < batch; i++) {
    const uint16_t *ai = (const uint16_t *)a + i * a_rows * lda, *bi = (const uint16_t *)b + i * b_rows * ldb;
    float *ci = c + i * m * ldc;
    /* wa (mi, ki) or, transposed, (ki, mi): op(a)[m0.., k0..]; wb (ki, ni) or (ni, ki) */
    for (int64_t k0 = 0; k0 < k || k0 == 0; k0 += kt) {
      const int64_t ki = k - k0 < kt ? k - k0 : kt;
      for (int64_t m0 = 0; m0 < m; m0 += mt) {
        const int64_t mi = m - m0 < mt ? m - m0 : mt;
        if (trans_a) widen_rows(wa, ai + k0 * lda + m0, ab_dtype, ki, mi, lda);
        else widen_rows(wa, ai + m0 * lda + k0, ab_dtype, mi, ki, lda);
        for (int64_t n0 = 0; n0 < n; n0 += nt) {
          const int64_t ni = n - n0 < nt ? n - n0 : nt;
          if (m0 == 0) {   /* (a in panels: b is whole, widened once a k panel) */
            if (trans_b) widen_rows(wb, bi + n0 * ldb + k0, ab_dtype, ni, ki, ldb);
            else widen_rows(wb, bi + k0 * ldb + n0, ab_dtype, ki, ni, ldb);
          }
          const int64_t wlda = trans_a ? mi : ki, wldb = trans_b ? ki : ni;   /* (BLAS: >= 1) */
          cblas_sgemm(CblasRowMajor, ta, tb, (int)mi, (int)ni, (int)ki, alpha, wa,
                      (int)(wlda > 0 ? wlda : 1), wb, (int)(wldb > 0 ? wldb : 1), k0 == 0 ? beta : 1.0f,
                      ci + m0 * ldc + n0, (int)ldc);
        }
      }
      if (k == 0) break;
    }
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- element-wise */

l2l_status cpu_add(float *out, const float *a, const float *b, int64_t n) {
  int nt = threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  return L2L_OK;
}

enum { ROW_CHUNK = 512 };   /* a row's columns a thread sums (or widens) at a time on the stack */

l2l_status cpu_bias_add(float *y, void *y16, l2l_dtype y16_dtype, const float *bias,
                        int64_t rows, int64_t cols) {
  int nt = threads_for(rows * cols);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++) {
    float *row = y + r * cols;
    if (y16 == NULL) {
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) row[j] += bias[j];
      continue;
    }
    float sum[ROW_CHUNK];   /* (y + bias, then rounded as convert rounds) */
    for (int64_t j0 = 0; j0 < cols; j0 += ROW_CHUNK) {
      const int64_t n = cols - j0 < ROW_CHUNK ? cols - j0 : ROW_CHUNK;
#pragma omp simd
      for (int64_t j = 0; j < n; j++) sum[j] = row[j0 + j] + bias[j0 + j];
      cpu_round_16((uint16_t *)y16 + r * cols + j0, y16_dtype, sum, n);
    }
  }
  return L2L_OK;
}

/* Column sums of a (rows, cols) matrix added into out (cols). Each thread sums its static
   block of rows into a private buffer; the buffers are then added in thread order, so the
   result does not depend on timing. A 16-bit src (dtype) is widened exactly as it is read. */
static l2l_status column_sums(float *out, const void *src, l2l_dtype dtype, int64_t rows,
                              int64_t cols) {
  int nt = threads_for(rows * cols);
  if (nt > rows) nt = (int)rows;
  float *partial = calloc((size_t)nt * (size_t)cols, sizeof *partial);
  if (partial == NULL)
    return core_fail(L2L_ERR_NOMEM, "cpu backend: no memory for %d column-sum buffers", nt);
#pragma omp parallel num_threads(nt)
  {
    int t = nt > 1 ? omp_get_thread_num() : 0;
    float *acc = partial + (size_t)t * (size_t)cols;
    for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; r++) {
      if (dtype == L2L_F32) {
        const float *row = (const float *)src + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) acc[j] += row[j];
        continue;
      }
      float wide[ROW_CHUNK];
      for (int64_t j0 = 0; j0 < cols; j0 += ROW_CHUNK) {
        const int64_t n = cols - j0 < ROW_CHUNK ? cols - j0 : ROW_CHUNK;
        cpu_widen_16(wide, (const uint16_t *)src + r * cols + j0, dtype, 1, n, n);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) acc[j0 + j] += wide[j];
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    const float *acc = partial + (size_t)t * (size_t)cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) out[j] += acc[j];
  }
  free(partial);
  return L2L_OK;
}

l2l_status cpu_bias_backward(float *dbias, const void *dy, l2l_dtype dy_dtype, int64_t rows,
                             int64_t cols) {
  return column_sums(dbias, dy, dy_dtype, rows, cols);
}

static inline float gelu_of(float v) {
  float u = GELU_K0 * (v + GELU_K1 * v * v * v);
  return v / (1.0f + vexp(-2.0f * u));
}

l2l_status cpu_gelu_forward(float *y, const float *x, int64_t n) {
  int nt = threads_for(n * 8);
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) y[i] = gelu_of(x[i]);
  return L2L_OK;
}

enum { GELU_BACKWARD_CHUNK = 4096 };   /* elements a thread makes, then rounds to dx16 */

/* d/dx [x s(2u)] = s + x * 2u' * s (1 - s), with s = sigmoid(2u), u' = k0 (1 + 3 k1 x^2).
   A chunk's dx goes to dx, or with dx NULL to the stack, then rounded into dx16. */
l2l_status cpu_gelu_backward(float *dx, void *dx16, l2l_dtype dx16_dtype, const float *dy,
                             const float *x, int64_t n) {
  const int64_t chunks = (n + GELU_BACKWARD_CHUNK - 1) / GELU_BACKWARD_CHUNK;
  int nt = threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t first = c * GELU_BACKWARD_CHUNK;
    const int64_t count = n - first < GELU_BACKWARD_CHUNK ? n - first : GELU_BACKWARD_CHUNK;
    float own[GELU_BACKWARD_CHUNK], *out = dx ? dx + first : own;
    const float *xc = x + first, *dyc = dy + first;
#pragma omp simd
    for (int64_t i = 0; i < count; i++) {
      float v = xc[i];
      float u = GELU_K0 * (v + GELU_K1 * v * v * v);
      float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
      float s = 1.0f / (1.0f + vexp(-2.0f * u));
      out[i] = dyc[i] * (s + v * 2.0f * du * s * (1.0f - s));
    }
    if (dx16) cpu_round_16((uint16_t *)dx16 + first, dx16_dtype, out, count);
  }
  return L2L_OK;
}

/* ---- GELU from its output (memory-frugal mode): its slope read off the tables of
   backend/gelu_table.c, which says how. */
#define GELU_CHUNK 512 /* elements whose side bits are unpacked at once */

l2l_status cpu_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n) {
  int64_t bytes = (n + 7) / 8;
  int nt = threads_for(n * 8);
  /* Bits first: y may be x. */
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t byte = 0; byte < bytes; byte++) {
    uint8_t b = 0;
    int64_t end = byte * 8 + 8 < n ? byte * 8 + 8 : n;
    for (int64_t i = byte * 8; i < end; i++) b |= (uint8_t)((x[i] >= L2L_GELU_XMIN) << (i & 7));
    bits[byte] = b;
  }
  return cpu_gelu_forward(y, x, n);
}

l2l_status cpu_gelu_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                         const float *dy, const float *y, const uint8_t *bits,
                                         int64_t n) {
  const struct gelu_slopes *tables = gelu_slopes();
  const float *table = &tables->slope[0][0];
  const float y_left = tables->y_left, last = (float)(GELU_TABLE - 1);
  float scale[3], origin[3];
  memcpy(scale, tables->scale, sizeof scale);
  memcpy(origin, tables->origin, sizeof origin);
  int64_t chunks = (n + GELU_CHUNK - 1) / GELU_CHUNK;
  int nt = threads_for(n * 16);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t first = c * GELU_CHUNK, count = n - first < GELU_CHUNK ? n - first : GELU_CHUNK;
    int32_t right[GELU_CHUNK]; /* the side bits unpacked, so the math loop vectorizes */
    float own[GELU_CHUNK], *out = dx ? dx + first : own;   /* (dx NULL: dx16 alone) */
    for (int64_t i = 0; i < count; i++) right[i] = (bits[(first + i) >> 3] >> ((first + i) & 7)) & 1;
#pragma omp simd
    for (int64_t i = 0; i < count; i++) {
      float v = y[first + i];
      float d = v - L2L_GELU_YMIN;
      float t = sqrtf(d >= 0.0f ? d : 0.0f);
      float w = vlog(-v >= 1.1754944e-38f ? -v : 1.1754944e-38f); /* y = -0 lands left of all */
      int32_t k = right[i] ? 0 : v <= y_left ? 1 : 2;
      float p = ((k == 2 ? w : t) - origin[k]) * scale[k];
      p = p >= 0.0f ? p : 0.0f; /* written so that NaN goes to 0: never out of the table */
      p = p <= last ? p : last;
      int32_t j = (int32_t)p;
      j = j < GELU_TABLE - 2 ? j : GELU_TABLE - 2;
      float f = p - (float)j, lo = table[k * GELU_TABLE + j], hi = table[k * GELU_TABLE + j + 1];
      float slope = lo + f * (hi - lo);
      out[i] = dy[first + i] * (v == v ? slope : v); /* a NaN output stays NaN */
    }
    if (dx16) cpu_round_16((uint16_t *)dx16 + first, dx16_dtype, out, count);
  }
  return L2L_OK;
}

/* pre += bias per column (bias NULL: none), y = gelu(pre), bits = pre's side bits (may be
   NULL), y16 = y rounded (may be NULL; y too, not both), in one pass: the sequence
   bias_add, gelu_forward_bits (or gelu_forward), convert with the same results. Flat chunks
   of whole mask bytes, each walked row segment by row segment. y may be pre. */
l2l_status cpu_bias_gelu_forward(float *pre, float *y, void *y16, l2l_dtype y16_dtype,
                                 uint8_t *bits, const float *bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols, chunks = (n + GELU_CHUNK - 1) / GELU_CHUNK;
  int nt = threads_for(n * 10);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t start = c * GELU_CHUNK, end = n - start < GELU_CHUNK ? n : start + GELU_CHUNK;
    uint8_t side[GELU_CHUNK];
    float own[GELU_CHUNK];   /* y's chunk when only y16 is wanted */
    float *yc = y ? y + start : own;
    for (int64_t i = start; i < end;) {
      const int64_t col = i % cols, len = cols - col < end - i ? cols - col : end - i;
      float *p = pre + i, *out = yc + (i - start);
      uint8_t *sd = side + (i - start);
      if (bias) {
        const float *b = bias + col;
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
          float v = p[j] + b[j];
          sd[j] = v >= L2L_GELU_XMIN;
          p[j] = v;
          out[j] = gelu_of(v);
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
          float v = p[j];
          sd[j] = v >= L2L_GELU_XMIN;
          out[j] = gelu_of(v);
        }
      }
      i += len;
    }
    if (bits) backend_pack_bits(bits + start / 8, side, end - start);
    if (y16) cpu_round_16((uint16_t *)y16 + start, y16_dtype, yc, end - start);
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- LayerNorm */

static inline void layernorm_row(float *yr, float *mean_out, float *rstd_out, const float *xr,
                                 const float *weight, const float *bias, float eps,
                                 int64_t cols) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < cols; j++) sum += xr[j];
  float mean = sum / (float)cols;
  float sq = 0.0f; /* two passes: no cancellation when |mean| >> std */
#pragma omp simd reduction(+ : sq)
  for (int64_t j = 0; j < cols; j++) sq += (xr[j] - mean) * (xr[j] - mean);
  float rstd = 1.0f / sqrtf(sq / (float)cols + eps);
#pragma omp simd
  for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mean) * rstd * weight[j] + bias[j];
  if (mean_out) *mean_out = mean;
  if (rstd_out) *rstd_out = rstd;
}

/* Row r of y, or of `own` (a row of the calling thread) when only y16 is wanted; then
   y16's row rounded from it. */
static inline void layernorm_row_out(float *y, void *y16, l2l_dtype y16_dtype, float *own,
                                     float *mean_out, float *rstd_out, const float *xr,
                                     const float *weight, const float *bias, float eps,
                                     int64_t r, int64_t cols) {
  float *yr = y ? y + r * cols : own;
  layernorm_row(yr, mean_out ? mean_out + r : NULL, rstd_out ? rstd_out + r : NULL, xr, weight,
                bias, eps, cols);
  if (y16) cpu_round_16((uint16_t *)y16 + r * cols, y16_dtype, yr, cols);
}

/* A row for each of nt threads when y is not written (NULL when it is). */
static l2l_status layernorm_rows_own(float **own, const float *y, int nt, int64_t cols) {
  *own = NULL;
  if (y != NULL) return L2L_OK;
  *own = malloc((size_t)nt * (size_t)cols * sizeof **own);
  return *own ? L2L_OK : core_fail(L2L_ERR_NOMEM, "cpu backend: no memory for LayerNorm rows");
}

l2l_status cpu_layernorm_forward(float *y, void *y16, l2l_dtype y16_dtype, float *mean_out,
                                 float *rstd_out, const float *x, const float *weight,
                                 const float *bias, float eps, int64_t rows, int64_t cols) {
  int nt = threads_for(rows * cols * 4);
  float *own;
  TRY(layernorm_rows_own(&own, y, nt, cols));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++)
    layernorm_row_out(y, y16, y16_dtype, own ? own + (size_t)omp_get_thread_num() * cols : NULL,
                      mean_out, rstd_out, x + r * cols, weight, bias, eps, r, cols);
  free(own);
  return L2L_OK;
}

/* sum = a + b, then LayerNorm of sum, row by row while the row is in cache: the sequence
   add, layernorm_forward with the same results. sum may be a or b; y must not overlap
   sum. */
l2l_status cpu_add_layernorm_forward(float *sum, float *y, void *y16, l2l_dtype y16_dtype,
                                     float *mean_out, float *rstd_out, const float *a,
                                     const float *b, const float *weight, const float *bias,
                                     float eps, int64_t rows, int64_t cols) {
  int nt = threads_for(rows * cols * 5);
  float *own;
  TRY(layernorm_rows_own(&own, y, nt, cols));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++) {
    float *sr = sum + r * cols;
    const float *ar = a + r * cols, *br = b + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) sr[j] = ar[j] + br[j];
    layernorm_row_out(y, y16, y16_dtype, own ? own + (size_t)omp_get_thread_num() * cols : NULL,
                      mean_out, rstd_out, sr, weight, bias, eps, r, cols);
  }
  free(own);
  return L2L_OK;
}

/* With x^ = (x - mean) rstd and g = dy * weight:
   dx = rstd (g - mean(g) - x^ mean(g x^)),  dweight += sum_r dy x^,  dbias += sum_r dy.
   x^ comes from the input, (x - mean) rstd, or in the frugal mode from the output,
   (y - bias) / weight (src = y, shift = bias, inv_weight = 1/weight per channel; mean is
   then NULL). With a residual (NULL: none; it may be dx or dy) a row's values go to the
   thread's row buffer first, then dx = them + the residual in a loop of its own (the add
   op's sums: no contraction into the formula); dx16 (NULL: none) is rounded from dx row by
   row. One pass per row; each thread sums its static block of rows' parameter gradients
   into private buffers, added in thread order afterwards (deterministic, no atomics). */
static l2l_status layernorm_backward_rows(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                         float *dweight, float *dbias, const float *dy,
                                         const float *residual, const float *src,
                                         const float *weight, const float *mean,
                                         const float *shift, const float *inv_weight,
                                         const float *rstd, int64_t rows, int64_t cols) {
  int nt = threads_for(rows * cols * 6);
  if (nt > rows) nt = (int)rows;
  /* per thread: [dweight's and dbias's partial sums][a row's values, with a residual] */
  const size_t per_thread = (size_t)cols * ((dweight || dbias ? 2 : 0) + (residual ? 1 : 0));
  float *partial = NULL;
  if (per_thread > 0) {
    partial = calloc((size_t)nt * per_thread, sizeof *partial);
    if (partial == NULL)
      return core_fail(L2L_ERR_NOMEM, "cpu backend: no memory for LayerNorm partial sums");
  }
  const bool from_output = mean == NULL;
#pragma omp parallel num_threads(nt)
  {
    int t = nt > 1 ? omp_get_thread_num() : 0;
    float *mine = partial ? partial + (size_t)t * per_thread : NULL;
    float *pw = dweight || dbias ? mine : NULL;
    float *pb = pw ? pw + cols : NULL;
    float *row_values = residual ? mine + per_thread - (size_t)cols : NULL;
    for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; r++) {
      const float *sr = src + r * cols, *dyr = dy + r * cols;
      const float *res = residual ? residual + r * cols : NULL;
      float *dxr = res ? row_values : dx + r * cols;
      float mu = from_output ? 0.0f : mean[r], rs = rstd[r];
#define XHAT(j) (from_output ? (sr[j] - shift[j]) * inv_weight[j] : (sr[j] - mu) * rs)
      float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int64_t j = 0; j < cols; j++) {
        float g = dyr[j] * weight[j];
        sum_g += g;
        sum_gx += g * XHAT(j);
      }
      float mean_g = sum_g / (float)cols, mean_gx = sum_gx / (float)cols;
      /* dx may be dy (and the residual either): element j of each is read before element
         j of dx is written. */
      if (pw) {
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) {
          float xhat = XHAT(j), d = dyr[j];
          pw[j] += d * xhat;
          pb[j] += d;
          dxr[j] = rs * (d * weight[j] - mean_g - xhat * mean_gx);
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < cols; j++)
          dxr[j] = rs * (dyr[j] * weight[j] - mean_g - XHAT(j) * mean_gx);
      }
#undef XHAT
      if (res) {   /* (every element of the row read: now dx, which may be dy or res) */
        float *out = dx + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) out[j] = dxr[j] + res[j];
        dxr = out;
      }
      if (dx16) cpu_round_16((uint16_t *)dx16 + r * cols, dx16_dtype, dxr, cols);
    }
  }
  for (int t = 0; t < nt && (dweight || dbias); t++) {
    const float *pw = partial + (size_t)t * per_thread, *pb = pw + cols;
    if (dweight)
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) dweight[j] += pw[j];
    if (dbias)
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) dbias[j] += pb[j];
  }
  free(partial);
  return L2L_OK;
}

l2l_status cpu_layernorm_backward(float *dx, void *dx16, l2l_dtype dx16_dtype, float *dweight,
                                  float *dbias, const float *dy, const float *residual,
                                  const float *x, const float *weight, const float *mean,
                                  const float *rstd, int64_t rows, int64_t cols) {
  return layernorm_backward_rows(dx, dx16, dx16_dtype, dweight, dbias, dy, residual, x, weight,
                                 mean, NULL, NULL, rstd, rows, cols);
}

l2l_status cpu_layernorm_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                              float *dweight, float *dbias, const float *dy,
                                              const float *residual, const float *y,
                                              const float *weight, const float *bias,
                                              const float *rstd, int64_t rows,
                                              int64_t cols) {
  float *inv_weight = malloc((size_t)cols * sizeof *inv_weight);
  if (inv_weight == NULL)
    return core_fail(L2L_ERR_NOMEM, "cpu backend: no memory for LayerNorm inverse weights");
  for (int64_t j = 0; j < cols; j++) inv_weight[j] = 1.0f / weight[j];
  l2l_status status = layernorm_backward_rows(dx, dx16, dx16_dtype, dweight, dbias, dy, residual,
                                              y, weight, NULL, bias, inv_weight, rstd, rows,
                                              cols);
  free(inv_weight);
  return status;
}

/* ---------------------------------------------------------------- softmax */

l2l_status cpu_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                               int causal, float scale, int64_t samples,
                               int64_t rows_per_sample, int64_t tq, int64_t tk) {
  int64_t rows = samples * rows_per_sample;
  int nt = threads_for(rows * tk * 6);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * tk;
    float *yr = y + r * tk;
    const uint8_t *mask = key_mask ? key_mask + (r / rows_per_sample) * tk : NULL;
    int64_t query = r % tq;
    int64_t limit = causal ? query + (tk - tq) + 1 : tk; /* keys [0, limit) are visible */
    if (limit > tk) limit = tk;
    if (limit < 0) limit = 0;
    float mx = -INFINITY;
    if (mask) {
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < limit; j++) {
        float z = mask[j] ? scale * xr[j] : -INFINITY;
        mx = z > mx ? z : mx;
      }
    } else {
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < limit; j++) {
        float z = scale * xr[j];
        mx = z > mx ? z : mx;
      }
    }
    if (mx == -INFINITY) { /* every key hidden */
      memset(yr, 0, (size_t)tk * sizeof *yr);
      continue;
    }
    float sum = 0.0f;
    if (mask) {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < limit; j++) {
        float e = mask[j] ? vexp(scale * xr[j] - mx) : 0.0f;
        yr[j] = e;
        sum += e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < limit; j++) {
        float e = vexp(scale * xr[j] - mx);
        yr[j] = e;
        sum += e;
      }
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < limit; j++) yr[j] *= inv;
    for (int64_t j = limit; j < tk; j++) yr[j] = 0.0f;
  }
  return L2L_OK;
}

l2l_status cpu_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                int64_t rows, int64_t cols) {
  int nt = threads_for(rows * cols * 4);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++) {
    const float *dyr = dy + r * cols, *yr = y + r * cols;
    float *dxr = dx + r * cols;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < cols; j++) dot += dyr[j] * yr[j];
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) dxr[j] = scale * yr[j] * (dyr[j] - dot);
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- embedding */

l2l_status cpu_embedding_forward(float *out, const int32_t *ids, const void *table,
                                 l2l_dtype table_dtype, int64_t n, int64_t cols) {
  int nt = threads_for(n * cols);
  if (table_dtype == L2L_F32) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
      memcpy(out + i * cols, (const float *)table + (int64_t)ids[i] * cols,
             (size_t)cols * sizeof *out);
    return L2L_OK;
  }
  const bool f16 = table_dtype == L2L_F16;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) {
    const uint16_t *row = (const uint16_t *)table + (int64_t)ids[i] * cols;
    float *o = out + i * cols;
    if (f16)
      for (int64_t c = 0; c < cols; c++) o[c] = half_f16_to_f32(row[c]);
    else
      for (int64_t c = 0; c < cols; c++) o[c] = half_bf16_to_f32(row[c]);
  }
  return L2L_OK;
}

/* Threads split the columns, not the tokens: each table element has one writer, so
   repeated ids need no atomics and the sums come in token order. */
l2l_status cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                  int64_t n, int64_t vocab, int64_t cols) {
  (void)vocab;
  int nt = threads_for(n * cols);
  if (nt > cols / 16) nt = cols >= 32 ? (int)(cols / 16) : 1;
#pragma omp parallel num_threads(nt)
  {
    int t = nt > 1 ? omp_get_thread_num() : 0;
    int64_t c0 = cols * t / nt, c1 = cols * (t + 1) / nt;
    for (int64_t i = 0; i < n; i++) {
      float *dst = dtable + (int64_t)ids[i] * cols;
      const float *src = dout + i * cols;
#pragma omp simd
      for (int64_t j = c0; j < c1; j++) dst[j] += src[j];
    }
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- cross-entropy */

/* max and log-sum-exp of one row */
static inline void row_logsumexp(const float *row, int64_t v, float *max_out, float *lse_out) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < v; j++) mx = row[j] > mx ? row[j] : mx;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < v; j++) sum += vexp(row[j] - mx);
  *max_out = mx;
  *lse_out = mx + logf(sum);
}

/* The gradient of row `row` (scale (softmax - one-hot), lse its log-sum-exp) for columns
   [first, first + n) into out. */
static inline void cross_entropy_grad(float *out, const float *row, float lse, int32_t target,
                                      float scale, int64_t first, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) out[j] = scale * vexp(row[first + j] - lse);
  if (target >= first && target < first + n) out[target - first] -= scale;
}

enum { CE_CHUNK = 2048 };   /* columns a 16-bit gradient alone is made in, on the stack */

/* losses and dlogits (either may be NULL) from one log-sum-exp per row; the forward and
   backward entries are its two halves. dlogits may be logits (the row's target logit is
   read before the row is overwritten). dlogits16 (NULL: none) gets dlogits rounded, made
   a chunk at a time on the stack when dlogits is NULL. */
l2l_status cpu_cross_entropy_fused(float *losses, float *dlogits, void *dlogits16,
                                   l2l_dtype dlogits16_dtype, const float *logits,
                                   const int32_t *targets, int32_t ignore_index,
                                   float scale, int64_t rows, int64_t vocab, int64_t ld) {
  int nt = threads_for(rows * vocab * 6);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; r++) {
    uint16_t *hrow = dlogits16 ? (uint16_t *)dlogits16 + r * ld : NULL;
    if (targets[r] == ignore_index) {
      if (losses) losses[r] = 0.0f;
      if (dlogits) memset(dlogits + r * ld, 0, (size_t)vocab * sizeof *dlogits);
      if (hrow) memset(hrow, 0, (size_t)vocab * sizeof *hrow);   /* (+0 in both 16-bit types) */
      continue;
    }
    const float *row = logits + r * ld;
    float mx, lse;
    row_logsumexp(row, vocab, &mx, &lse);
    if (losses) losses[r] = lse - row[targets[r]];
    if (dlogits != NULL) {
      float *drow = dlogits + r * ld;
      cross_entropy_grad(drow, row, lse, targets[r], scale, 0, vocab);
      if (hrow) cpu_round_16(hrow, dlogits16_dtype, drow, vocab);
    } else if (hrow) {
      float own[CE_CHUNK];
      for (int64_t j = 0; j < vocab; j += CE_CHUNK) {
        int64_t n = vocab - j < CE_CHUNK ? vocab - j : CE_CHUNK;
        cross_entropy_grad(own, row, lse, targets[r], scale, j, n);
        cpu_round_16(hrow + j, dlogits16_dtype, own, n);
      }
    }
  }
  return L2L_OK;
}

l2l_status cpu_cross_entropy_forward(float *losses, const float *logits,
                                     const int32_t *targets, int32_t ignore_index,
                                     int64_t rows, int64_t vocab, int64_t ld) {
  return cpu_cross_entropy_fused(losses, NULL, NULL, L2L_F32, logits, targets, ignore_index, 0.0f,
                                 rows, vocab, ld);
}

l2l_status cpu_cross_entropy_backward(float *dlogits, const float *logits,
                                      const int32_t *targets, int32_t ignore_index,
                                      float scale, int64_t rows, int64_t vocab, int64_t ld) {
  return cpu_cross_entropy_fused(NULL, dlogits, NULL, L2L_F32, logits, targets, ignore_index,
                                 scale, rows, vocab, ld);
}

/* ---------------------------------------------------------------- dropout */

/* Element kept when its 24 random bits are below (1 - p) 2^24 (backend_keep_threshold).
   Chunks of DROPOUT_CHUNK elements (whole mask bytes): their draws in one vectorized
   Philox pass, then the scaling and the mask bits in loops that vectorize too. */
#define DROPOUT_CHUNK 2048

l2l_status cpu_dropout_forward(float *y, uint8_t *mask, const float *x, float p,
                               uint64_t seed, uint64_t stream, int64_t first, int64_t n) {
  const uint32_t threshold = backend_keep_threshold(p);
  const float keep_scale = 1.0f / (1.0f - p);
  int64_t chunks = (n + DROPOUT_CHUNK - 1) / DROPOUT_CHUNK;
  int nt = threads_for(n * 16);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t start = c * DROPOUT_CHUNK, count = n - start < DROPOUT_CHUNK ? n - start : DROPOUT_CHUNK;
    uint32_t draws[DROPOUT_CHUNK];
    uint8_t kept[DROPOUT_CHUNK];
    philox_range(draws, seed, stream, (uint64_t)first + (uint64_t)start, count);
#pragma omp simd
    for (int64_t i = 0; i < count; i++) {
      kept[i] = (draws[i] >> 8) < threshold;
      y[start + i] = kept[i] ? x[start + i] * keep_scale : 0.0f;
    }
    if (mask) backend_pack_bits(mask + start / 8, kept, count); /* NULL: a backward regenerates */
  }
  return L2L_OK;
}

l2l_status cpu_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p,
                                int64_t n) {
  float keep_scale = 1.0f / (1.0f - p);
  int nt = threads_for(n * 2);
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++)
    dx[i] = ((mask[i >> 3] >> (i & 7)) & 1) ? dy[i] * keep_scale : 0.0f;
  return L2L_OK;
}

