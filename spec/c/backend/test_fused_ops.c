/* SPDX-License-Identifier: MIT */
/* test_fused_ops.c — the CPU backend's fused ops give exactly what the sequences they
 * replace give.
 *
 * Purpose: the layers call bias_gelu_forward, add_layernorm_forward and
 * cross_entropy_fused instead of the op sequences whose results the public ops (and
 * their float64 tests in test_ops.c) define; backend.h promises the same results, so they
 * are held to the sequences bit for bit, on fresh random inputs with awkward shapes (rows
 * and columns not multiples of 8, so side bits straddle rows; a single element), outputs
 * poisoned first, and the in-place and NULL variants the layers use; a 16-bit output
 * (bf16, f16) beside y or alone is the convert op's rounding of the sequence's y. (The CPU's
 * cross-entropy forward and backward are the fused op's two halves, held to float64 in
 * test_ops.c; here the fused call with both outputs, and over its own logits, must agree
 * with them.) White box: the ops table is called directly. The GPU's fused kernels are
 * held to these in test_cuda.c. The bias add whose sums go to 16 bits (the qkv map's) against
 * the add then the cast, the GEMM whose bias add (and cast) ride with it against the three
 * steps, and the bias gradient of 16-bit rows (attention's dq, dk, dv)
 * against the one of their widened copies; LayerNorm's backward with the residual's
 * gradient added and its 16-bit copy against the backward, the add and the cast. And the one cast of many tensors (convert_many) against
 * a cast of each; the ops the LM head runs on its padded logits rows (cross-entropy,
 * GEMMs with row strides) against the same ops on packed rows; and attention with its
 * inputs and output in 16 bits against the same on their f32 copies.
 * Must never: compare a fused op with itself only.
 */
#include <stdlib.h>
#include <string.h>

#include "attention_io16.h"
#include "backend/backend.h"
#include "check.h"
#include "reference.h"

static const int64_t shapes[][2] = {{1, 1}, {3, 5}, {7, 33}, {13, 3072}, {257, 771}};
enum { SHAPES = sizeof shapes / sizeof shapes[0] };

static float *randn(int64_t n, double scale) {
  float *v = xmalloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = (float)(scale * check_rand_normal());
  return v;
}

static float *poison(int64_t n) {
  float *v = xmalloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = NAN;
  return v;
}

static float *copy_of(const float *src, int64_t n) {
  float *v = xmalloc((size_t)n * sizeof *v);
  memcpy(v, src, (size_t)n * sizeof *v);
  return v;
}

/* Bit-for-bit equality (NaN never equal: a poisoned output left unwritten fails). */
static bool same_bits(const char *what, const float *got, const float *want, int64_t n,
                      int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof got[i]) != 0 || got[i] != got[i])
      return CHECK(false, "%s %lldx%lld: element %lld is %.9g, the sequence gives %.9g", what,
                   (long long)rows, (long long)cols, (long long)i, (double)got[i],
                   (double)want[i]);
  return true;
}

/* A 16-bit output (NULL: none asked) against the sequence's f32 y rounded by the convert
   op, the cast the layers made before: bit for bit. */
static const l2l_dtype halves[] = {L2L_BF16, L2L_F16};

static uint16_t *poison16(int64_t n) {
  uint16_t *v = xmalloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = 0x7fc1; /* a NaN in both 16-bit types */
  return v;
}

static bool same_halves(const char *what, l2l_dtype dtype, const uint16_t *got, const float *y,
                        int64_t n, int64_t rows, int64_t cols) {
  uint16_t *want = poison16(n);
  int64_t bad = -1;
  CHECK_OK(cpu_backend.convert(want, dtype, y, L2L_F32, n, &bad));
  bool ok = true;
  for (int64_t i = 0; i < n && ok; i++)
    ok = CHECK(got[i] == want[i], "%s (%s) %lldx%lld: element %lld is 0x%04x, convert gives 0x%04x",
               what, l2l_dtype_name(dtype), (long long)rows, (long long)cols, (long long)i,
               got[i], want[i]);
  free(want);
  return ok;
}

TEST(fused_bias_gelu_equals_bias_add_then_gelu) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++) {
    const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols, nb = (n + 7) / 8;
    float *x = randn(n, 2.0), *bias = randn(cols, 1.0);
    /* a band right at GELU's minimum, where the side bit decides */
    for (int64_t i = 0; i < n; i += 3) x[i] = L2L_GELU_XMIN - bias[i % cols] + (float)check_rand_uniform(-1e-3, 1e-3);
    /* the sequence, and without a bias */
    float *pre_seq = copy_of(x, n), *y_seq = poison(n), *y_nob = poison(n);
    uint8_t *bits_seq = xmalloc((size_t)nb), *bits_nob = xmalloc((size_t)nb);
    CHECK_OK(ops->gelu_forward_bits(y_nob, bits_nob, x, n));
    CHECK_OK(ops->bias_add(pre_seq, NULL, L2L_F32, bias, rows, cols));
    CHECK_OK(ops->gelu_forward_bits(y_seq, bits_seq, pre_seq, n));
    /* fused, y beside pre, with and without bits */
    float *pre = copy_of(x, n), *y = poison(n);
    uint8_t *bits = xmalloc((size_t)nb);
    memset(bits, 0xA5, (size_t)nb);
    CHECK_OK(ops->bias_gelu_forward(pre, y, NULL, L2L_F32, bits, bias, rows, cols));
    same_bits("bias_gelu_forward: pre", pre, pre_seq, n, rows, cols);
    same_bits("bias_gelu_forward: y", y, y_seq, n, rows, cols);
    CHECK(memcmp(bits, bits_seq, (size_t)nb) == 0, "bias_gelu_forward %lldx%lld: side bits differ",
          (long long)rows, (long long)cols);
    float *pre2 = copy_of(x, n), *y2 = poison(n);
    CHECK_OK(ops->bias_gelu_forward(pre2, y2, NULL, L2L_F32, NULL, bias, rows, cols));
    same_bits("bias_gelu_forward without bits: y", y2, y_seq, n, rows, cols);
    /* in place: pre ends up holding gelu(pre + bias) */
    float *inplace = copy_of(x, n);
    CHECK_OK(ops->bias_gelu_forward(inplace, inplace, NULL, L2L_F32, bits, bias, rows, cols));
    same_bits("bias_gelu_forward in place", inplace, y_seq, n, rows, cols);
    CHECK(memcmp(bits, bits_seq, (size_t)nb) == 0, "bias_gelu_forward in place %lldx%lld: side "
          "bits differ", (long long)rows, (long long)cols);
    /* no bias: pre only read */
    float *pre3 = copy_of(x, n), *y3 = poison(n);
    memset(bits, 0xA5, (size_t)nb);
    CHECK_OK(ops->bias_gelu_forward(pre3, y3, NULL, L2L_F32, bits, NULL, rows, cols));
    same_bits("bias_gelu_forward without a bias: pre", pre3, x, n, rows, cols);
    same_bits("bias_gelu_forward without a bias: y", y3, y_nob, n, rows, cols);
    CHECK(memcmp(bits, bits_nob, (size_t)nb) == 0, "bias_gelu_forward without a bias %lldx%lld: "
          "side bits differ", (long long)rows, (long long)cols);
    /* the 16-bit output beside y, and alone (standard mode's kept GELU), and in place */
    for (int d = 0; d < 2; d++) {
      uint16_t *h = poison16(n), *h_alone = poison16(n), *h_inplace = poison16(n);
      float *pre4 = copy_of(x, n), *y4 = poison(n), *pre5 = copy_of(x, n), *pre6 = copy_of(x, n);
      CHECK_OK(ops->bias_gelu_forward(pre4, y4, h, halves[d], NULL, bias, rows, cols));
      same_bits("bias_gelu_forward with y16: y", y4, y_seq, n, rows, cols);
      same_halves("bias_gelu_forward: y16", halves[d], h, y_seq, n, rows, cols);
      CHECK_OK(ops->bias_gelu_forward(pre5, NULL, h_alone, halves[d], bits, bias, rows, cols));
      same_bits("bias_gelu_forward, y16 alone: pre", pre5, pre_seq, n, rows, cols);
      same_halves("bias_gelu_forward: y16 alone", halves[d], h_alone, y_seq, n, rows, cols);
      CHECK(memcmp(bits, bits_seq, (size_t)nb) == 0, "bias_gelu_forward, y16 alone %lldx%lld: "
            "side bits differ", (long long)rows, (long long)cols);
      CHECK_OK(ops->bias_gelu_forward(pre6, pre6, h_inplace, halves[d], bits, bias, rows, cols));
      same_bits("bias_gelu_forward in place with y16", pre6, y_seq, n, rows, cols);
      same_halves("bias_gelu_forward in place: y16", halves[d], h_inplace, y_seq, n, rows, cols);
      free(h), free(h_alone), free(h_inplace), free(pre4), free(y4), free(pre5), free(pre6);
    }
    free(x), free(bias), free(pre_seq), free(y_seq), free(bits_seq), free(pre), free(y);
    free(bits), free(pre2), free(y2), free(inplace), free(y_nob), free(bits_nob), free(pre3);
    free(y3);
  }
}

/* GELU's backward, both forms, with the 16-bit copy of dx the GEMMs below read: dx as
   without it, and the copy convert's rounding of dx; in place over dy too. */
TEST(bias_add_and_its_gradient_in_16_bits) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++)
    for (int d = 0; d < 2; d++) {
      const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
      float *y = randn(n, 2.0), *bias = randn(cols, 1.0), *y_seq = copy_of(y, n), *y_kept = copy_of(y, n);
      uint16_t *h = poison16(n);
      CHECK_OK(ops->bias_add(y_seq, NULL, L2L_F32, bias, rows, cols));
      CHECK_OK(ops->bias_add(y, h, halves[d], bias, rows, cols));
      same_halves("bias_add to 16 bits", halves[d], h, y_seq, n, rows, cols);
      same_bits("bias_add to 16 bits: y (only read)", y, y_kept, n, rows, cols);
      /* the column sums of h against those of its widened copy, onto a drawn start */
      float *wide = poison(n), *db16 = randn(cols, 1.0), *db32 = copy_of(db16, cols);
      int64_t bad = -1;
      CHECK_OK(ops->convert(wide, L2L_F32, h, halves[d], n, &bad));
      CHECK_OK(ops->bias_backward(db16, h, halves[d], rows, cols));
      CHECK_OK(ops->bias_backward(db32, wide, L2L_F32, rows, cols));
      same_bits("bias_backward over 16 bits", db16, db32, cols, rows, cols);
      free(y), free(bias), free(y_seq), free(y_kept), free(h), free(wide), free(db16), free(db32);
    }
}

TEST(gemm_bias_equals_gemm_then_bias_add) {
  const struct backend_ops *ops = &cpu_backend;
  static const int64_t sizes[] = {1, 3, 8, 33, 100};
  for (int i = 0; i < 24; i++) {
    const int64_t m = sizes[check_rand_int(0, 4)], n = sizes[check_rand_int(0, 4)],
                  k = sizes[check_rand_int(0, 4)];
    const int ta = (int)check_rand_int(0, 1), tb = (int)check_rand_int(0, 1);
    const l2l_dtype ab = i % 3 == 0 ? L2L_F32 : halves[i % 2], out = halves[(i / 2) % 2];
    const bool with_bias = i % 4 != 3, to16 = i % 2 == 1;
    float *a32 = randn(m * k, 1.0), *b32 = randn(k * n, 1.0), *bias = randn(n, 1.0);
    void *a = a32, *b = b32;
    uint16_t *a16 = NULL, *b16 = NULL;
    int64_t bad = -1;
    if (ab != L2L_F32) {   /* 16-bit operands: their rounded draws */
      a = a16 = poison16(m * k), b = b16 = poison16(k * n);
      CHECK_OK(ops->convert(a16, ab, a32, L2L_F32, m * k, &bad));
      CHECK_OK(ops->convert(b16, ab, b32, L2L_F32, k * n, &bad));
    }
    const float *bp = with_bias ? bias : NULL;
    float *want = poison(m * n), *c = poison(m * n);
    uint16_t *c16 = poison16(m * n);
    CHECK_OK(ops->gemm_batched(want, a, b, ab, 1, m, n, k, ta, tb, 1.0f, 0.0f, 0, 0, 0));
    if (bp) CHECK_OK(ops->bias_add(want, NULL, L2L_F32, bp, m, n));
    CHECK_OK(ops->gemm_bias(c, to16 ? c16 : NULL, out, a, b, ab, bp, m, n, k, ta, tb));
    char what[96];
    snprintf(what, sizeof what, "gemm_bias %c%c %s%s%s", ta ? 'T' : 'N', tb ? 'T' : 'N',
             l2l_dtype_name(ab), bp ? " +bias" : "", to16 ? " to 16 bits" : "");
    if (to16) same_halves(what, out, c16, want, m * n, m, n);
    else same_bits(what, c, want, m * n, m, n);
    free(a32), free(b32), free(bias), free(a16), free(b16), free(want), free(c), free(c16);
  }
}

TEST(gelu_backward_16bit_copy_is_dx_rounded) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++) {
    const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols, nb = (n + 7) / 8;
    float *x = randn(n, 2.0), *dy = randn(n, 1.0), *y = poison(n);
    uint8_t *bits = xmalloc((size_t)nb);
    CHECK_OK(ops->gelu_forward_bits(y, bits, x, n));
    for (int form = 0; form < 2; form++) {
      const char *name = form ? "gelu_backward_from_output" : "gelu_backward";
      float *want = poison(n);
      if (form) CHECK_OK(ops->gelu_backward_from_output(want, NULL, L2L_F32, dy, y, bits, n));
      else CHECK_OK(ops->gelu_backward(want, NULL, L2L_F32, dy, x, n));
      for (int d = 0; d < 2; d++) {
        float *dx = poison(n), *over = copy_of(dy, n), *dy_kept = copy_of(dy, n);
        uint16_t *h = poison16(n), *h_over = poison16(n), *h_alone = poison16(n);
        if (form) {
          CHECK_OK(ops->gelu_backward_from_output(dx, h, halves[d], dy, y, bits, n));
          CHECK_OK(ops->gelu_backward_from_output(over, h_over, halves[d], over, y, bits, n));
          CHECK_OK(ops->gelu_backward_from_output(NULL, h_alone, halves[d], dy, y, bits, n));
        } else {
          CHECK_OK(ops->gelu_backward(dx, h, halves[d], dy, x, n));
          CHECK_OK(ops->gelu_backward(over, h_over, halves[d], over, x, n));
          CHECK_OK(ops->gelu_backward(NULL, h_alone, halves[d], dy, x, n));
        }
        same_bits(name, dx, want, n, rows, cols);
        same_bits(name, over, want, n, rows, cols);
        same_halves(name, halves[d], h, want, n, rows, cols);
        same_halves(name, halves[d], h_over, want, n, rows, cols);
        same_halves(name, halves[d], h_alone, want, n, rows, cols);   /* (dx16 alone) */
        same_bits(name, dy, dy_kept, n, rows, cols);
        free(dx), free(over), free(dy_kept), free(h), free(h_over), free(h_alone);
      }
      free(want);
    }
    free(x), free(dy), free(y), free(bits);
  }
}

TEST(layernorm_backward_with_residual_equals_backward_then_add) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++)
    for (int form = 0; form < 2; form++) {   /* from the input (mean, rstd), from the output */
      const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
      float *x = randn(n, 1.0), *w = randn(cols, 1.0), *b = randn(cols, 0.5), *dy = randn(n, 1.0);
      float *res = randn(n, 1.0), *y = poison(n), *mean = poison(rows), *rstd = poison(rows);
      for (int64_t j = 0; j < cols; j++) w[j] += w[j] < 0 ? -0.5f : 0.5f;   /* invertible */
      CHECK_OK(ops->layernorm_forward(y, NULL, L2L_F32, mean, rstd, x, w, b, 1e-5f, rows, cols));
      /* the sequence: the backward, the add, the cast; the parameter gradients onto a start */
      float *dw0 = randn(cols, 1.0), *db0 = randn(cols, 1.0);
      float *dx_seq = poison(n), *dw_seq = copy_of(dw0, cols), *db_seq = copy_of(db0, cols);
      float *dx = poison(n), *dw = copy_of(dw0, cols), *db = copy_of(db0, cols);
      float *over = copy_of(dy, n), *dw2 = copy_of(dw0, cols), *db2 = copy_of(db0, cols);
      const l2l_dtype dt = halves[s & 1];
      uint16_t *h = poison16(n);
#define LN_BACK(dx_, dx16_, dw_, db_, dy_, res_)                                                  \
  (form ? ops->layernorm_backward_from_output(dx_, dx16_, dt, dw_, db_, dy_, res_, y, w, b, rstd,  \
                                              rows, cols)                                        \
        : ops->layernorm_backward(dx_, dx16_, dt, dw_, db_, dy_, res_, x, w, mean, rstd, rows,    \
                                  cols))
      CHECK_OK(LN_BACK(dx_seq, NULL, dw_seq, db_seq, dy, NULL));
      CHECK_OK(ops->add(dx_seq, dx_seq, res, n));
      CHECK_OK(LN_BACK(dx, h, dw, db, dy, res));
      CHECK_OK(LN_BACK(over, NULL, dw2, db2, over, over));   /* dx, dy and the residual one */
#undef LN_BACK
      const char *name = form ? "layernorm_backward_from_output" : "layernorm_backward";
      same_bits(name, dx, dx_seq, n, rows, cols);
      same_halves(name, dt, h, dx_seq, n, rows, cols);
      same_bits(name, dw, dw_seq, cols, rows, cols);
      same_bits(name, db, db_seq, cols, rows, cols);
      float *twice = poison(n);   /* in place: the backward of dy plus dy itself */
      CHECK_OK(form ? ops->layernorm_backward_from_output(twice, NULL, L2L_F32, NULL, NULL, dy,
                                                          NULL, y, w, b, rstd, rows, cols)
                    : ops->layernorm_backward(twice, NULL, L2L_F32, NULL, NULL, dy, NULL, x, w,
                                              mean, rstd, rows, cols));
      CHECK_OK(ops->add(twice, twice, dy, n));
      same_bits("layernorm backward over its dy and residual", over, twice, n, rows, cols);
      free(x), free(w), free(b), free(dy), free(res), free(y), free(mean), free(rstd), free(dw0);
      free(db0), free(dx_seq), free(dw_seq), free(db_seq), free(dx), free(dw), free(db);
      free(over), free(dw2), free(db2), free(h), free(twice);
    }
}

TEST(fused_add_layernorm_equals_add_then_layernorm) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++) {
    const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
    float *a = randn(n, 1.0), *b = randn(n, 1.0), *w = randn(cols, 1.0), *bias = randn(cols, 0.5);
    for (int64_t i = 0; i < n; i++) a[i] += 3.0f; /* a mean far from 0 */
    float *sum_seq = poison(n), *y_seq = poison(n), *mean_seq = poison(rows), *rstd_seq = poison(rows);
    CHECK_OK(ops->add(sum_seq, a, b, n));
    CHECK_OK(ops->layernorm_forward(y_seq, NULL, L2L_F32, mean_seq, rstd_seq, sum_seq, w, bias,
                                    1e-5f, rows, cols));
    /* the 16-bit output of LayerNorm alone: beside y, and alone */
    for (int d = 0; d < 2; d++) {
      uint16_t *h = poison16(n), *h_alone = poison16(n);
      float *y16_y = poison(n), *rstd16 = poison(rows);
      CHECK_OK(ops->layernorm_forward(y16_y, h, halves[d], NULL, NULL, sum_seq, w, bias, 1e-5f,
                                      rows, cols));
      same_bits("layernorm_forward with y16: y", y16_y, y_seq, n, rows, cols);
      same_halves("layernorm_forward: y16", halves[d], h, y_seq, n, rows, cols);
      CHECK_OK(ops->layernorm_forward(NULL, h_alone, halves[d], NULL, rstd16, sum_seq, w, bias,
                                      1e-5f, rows, cols));
      same_halves("layernorm_forward: y16 alone", halves[d], h_alone, y_seq, n, rows, cols);
      same_bits("layernorm_forward, y16 alone: rstd", rstd16, rstd_seq, rows, rows, cols);
      free(h), free(h_alone), free(y16_y), free(rstd16);
    }
    /* fused into a third buffer, then over a (the block's r1 = r1 + x), without mean */
    float *sum = poison(n), *y = poison(n), *mean = poison(rows), *rstd = poison(rows);
    CHECK_OK(ops->add_layernorm_forward(sum, y, NULL, L2L_F32, mean, rstd, a, b, w, bias, 1e-5f,
                                        rows, cols));
    same_bits("add_layernorm_forward: sum", sum, sum_seq, n, rows, cols);
    same_bits("add_layernorm_forward: y", y, y_seq, n, rows, cols);
    same_bits("add_layernorm_forward: mean", mean, mean_seq, rows, rows, cols);
    same_bits("add_layernorm_forward: rstd", rstd, rstd_seq, rows, rows, cols);
    for (int d = 0; d < 2; d++) {   /* with its 16-bit output, beside y and alone */
      uint16_t *h = poison16(n), *h_alone = poison16(n);
      float *sum2 = poison(n), *y2 = poison(n), *sum3 = poison(n);
      CHECK_OK(ops->add_layernorm_forward(sum2, y2, h, halves[d], NULL, NULL, a, b, w, bias, 1e-5f,
                                          rows, cols));
      same_bits("add_layernorm_forward with y16: y", y2, y_seq, n, rows, cols);
      same_halves("add_layernorm_forward: y16", halves[d], h, y_seq, n, rows, cols);
      CHECK_OK(ops->add_layernorm_forward(sum3, NULL, h_alone, halves[d], NULL, NULL, a, b, w, bias,
                                          1e-5f, rows, cols));
      same_bits("add_layernorm_forward, y16 alone: sum", sum3, sum_seq, n, rows, cols);
      same_halves("add_layernorm_forward: y16 alone", halves[d], h_alone, y_seq, n, rows, cols);
      free(h), free(h_alone), free(sum2), free(y2), free(sum3);
    }
    float *y2 = poison(n), *rstd2 = poison(rows);
    CHECK_OK(ops->add_layernorm_forward(a, y2, NULL, L2L_F32, NULL, rstd2, a, b, w, bias, 1e-5f,
                                        rows, cols));
    same_bits("add_layernorm_forward over a: sum", a, sum_seq, n, rows, cols);
    same_bits("add_layernorm_forward over a: y", y2, y_seq, n, rows, cols);
    same_bits("add_layernorm_forward over a: rstd", rstd2, rstd_seq, rows, rows, cols);
    free(a), free(b), free(w), free(bias), free(sum_seq), free(y_seq), free(mean_seq);
    free(rstd_seq), free(sum), free(y), free(mean), free(rstd), free(y2), free(rstd2);
  }
}

TEST(fused_cross_entropy_equals_forward_and_backward) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++) {
    const int64_t rows = shapes[s][0], vocab = shapes[s][1], n = rows * vocab;
    const int32_t ignore = -1;
    float *logits = randn(n, 3.0);
    int32_t *targets = xmalloc((size_t)rows * sizeof *targets);
    for (int64_t r = 0; r < rows; r++)
      targets[r] = check_rand_int(0, 4) == 0 ? ignore : (int32_t)check_rand_int(0, vocab - 1);
    float scale = (float)check_rand_uniform(0.01, 1.0);
    float *losses_seq = poison(rows), *dlogits_seq = poison(n);
    CHECK_OK(ops->cross_entropy_forward(losses_seq, logits, targets, ignore, rows, vocab, vocab));
    CHECK_OK(ops->cross_entropy_backward(dlogits_seq, logits, targets, ignore, scale, rows, vocab,
                                        vocab));
    float *losses = poison(rows), *dlogits = poison(n);
    CHECK_OK(ops->cross_entropy_fused(losses, dlogits, NULL, L2L_F32, logits, targets, ignore,
                                      scale, rows, vocab, vocab));
    same_bits("cross_entropy_fused: losses", losses, losses_seq, rows, rows, vocab);
    same_bits("cross_entropy_fused: dlogits", dlogits, dlogits_seq, n, rows, vocab);
    /* the heads' way: the gradient over the logits; and each output alone */
    float *inplace = copy_of(logits, n), *losses2 = poison(rows), *losses3 = poison(rows);
    CHECK_OK(ops->cross_entropy_fused(losses2, inplace, NULL, L2L_F32, inplace, targets, ignore,
                                      scale, rows, vocab, vocab));
    same_bits("cross_entropy_fused in place: losses", losses2, losses_seq, rows, rows, vocab);
    same_bits("cross_entropy_fused in place: dlogits", inplace, dlogits_seq, n, rows, vocab);
    CHECK_OK(ops->cross_entropy_fused(losses3, NULL, NULL, L2L_F32, logits, targets, ignore, scale,
                                      rows, vocab, vocab));
    same_bits("cross_entropy_fused, losses only", losses3, losses_seq, rows, rows, vocab);
    float *dlogits2 = poison(n);
    CHECK_OK(ops->cross_entropy_fused(NULL, dlogits2, NULL, L2L_F32, logits, targets, ignore, scale,
                                      rows, vocab, vocab));
    same_bits("cross_entropy_fused, gradient only", dlogits2, dlogits_seq, n, rows, vocab);
    /* the 16-bit gradient (the LM head's with a 16-bit projection): alone, beside the f32
       one over the logits, and beside the losses */
    for (int d = 0; d < 2; d++) {
      uint16_t *h = poison16(n), *h2 = poison16(n);
      float *over = copy_of(logits, n), *losses4 = poison(rows);
      CHECK_OK(ops->cross_entropy_fused(losses4, NULL, h, halves[d], logits, targets, ignore, scale,
                                        rows, vocab, vocab));
      same_bits("cross_entropy_fused with dlogits16 alone: losses", losses4, losses_seq, rows, rows,
                vocab);
      same_halves("cross_entropy_fused: dlogits16 alone", halves[d], h, dlogits_seq, n, rows, vocab);
      CHECK_OK(ops->cross_entropy_fused(NULL, over, h2, halves[d], over, targets, ignore, scale,
                                        rows, vocab, vocab));
      same_bits("cross_entropy_fused in place with dlogits16", over, dlogits_seq, n, rows, vocab);
      same_halves("cross_entropy_fused: dlogits16 beside", halves[d], h2, dlogits_seq, n, rows,
                  vocab);
      free(h), free(h2), free(over), free(losses4);
    }
    free(logits), free(targets), free(losses_seq), free(dlogits_seq), free(losses), free(dlogits);
    free(inplace), free(losses2), free(losses3), free(dlogits2);
  }
}

TEST(fused_cast_many_equals_each_cast) {
  /* backend_tensors_cast (the ops' convert_many: a visit's 16-bit gradients, the device
     records' 16-bit copies) against l2l_tensor_cast of each pair, bit for bit, for the four
     directions, over a drawn number of tensors (past one GPU launch's 64) of drawn sizes
     (1, odd ones), outputs poisoned first; then its refusals, which write nothing. */
  static const l2l_dtype dirs[4][2] = {{L2L_F32, L2L_BF16}, {L2L_F32, L2L_F16},
                                       {L2L_BF16, L2L_F32}, {L2L_F16, L2L_F32}};
  enum { MOST = 70 };
  for (int d = 0; d < 4; d++) {
    int count = (int)check_rand_int(1, MOST);
    l2l_tensor *src[MOST], *many[MOST], *each[MOST];
    for (int i = 0; i < count; i++) {
      int64_t n = i == 0 ? 1 : check_rand_int(2, 3001);
      l2l_tensor *f = check_f32(1, n);
      for (int64_t k = 0; k < n; k++) check_data(f)[k] = (float)(100.0 * check_rand_normal());
      src[i] = check_tensor(L2L_POOL_HOST, dirs[d][0], 1, (int64_t[]){n});
      CHECK_OK(dirs[d][0] == L2L_F32 ? l2l_tensor_copy(src[i], f) : l2l_tensor_cast(src[i], f));
      many[i] = check_tensor(L2L_POOL_HOST, dirs[d][1], 1, (int64_t[]){n});
      each[i] = check_tensor(L2L_POOL_HOST, dirs[d][1], 1, (int64_t[]){n});
      memset(l2l_tensor_data(many[i]), 0x7f, (size_t)n * l2l_dtype_size(dirs[d][1]));
      CHECK_OK(l2l_tensor_cast(each[i], src[i]));
      l2l_tensor_free(f);
    }
    CHECK_OK(backend_tensors_cast(many, (const l2l_tensor *const *)src, count));
    int differ = 0;
    for (int i = 0; i < count; i++)
      differ += memcmp(l2l_tensor_data(many[i]), l2l_tensor_data(each[i]),
                       (size_t)l2l_tensor_numel(each[i]) * l2l_dtype_size(dirs[d][1])) != 0;
    CHECK(differ == 0, "%s -> %s: %d of %d tensors differ from their own casts",
          l2l_dtype_name(dirs[d][0]), l2l_dtype_name(dirs[d][1]), differ, count);
    for (int i = 0; i < count; i++)
      l2l_tensor_free(src[i]), l2l_tensor_free(many[i]), l2l_tensor_free(each[i]);
  }
  /* refusals: a pair of another dtype, a pair of unequal sizes, i32, a pool of the other
     domain; nothing written */
  l2l_tensor *a = check_f32(1, 5), *b = check_f32(1, 5), *h16 = check_tensor(L2L_POOL_HOST, L2L_BF16, 1, (int64_t[]){5});
  l2l_tensor *f16 = check_tensor(L2L_POOL_HOST, L2L_F16, 1, (int64_t[]){5});
  l2l_tensor *short16 = check_tensor(L2L_POOL_HOST, L2L_BF16, 1, (int64_t[]){4});
  l2l_tensor *ids = check_tensor(L2L_POOL_HOST, L2L_I32, 1, (int64_t[]){5});
  l2l_tensor *dev16 = check_tensor(L2L_POOL_DEVICE, L2L_BF16, 1, (int64_t[]){5});
  memset(l2l_tensor_data(h16), 0x11, 10);
  l2l_tensor *to[2] = {h16, f16}, *to_short[2] = {h16, short16}, *to_ids[1] = {ids},
             *to_dev[2] = {h16, dev16};
  const l2l_tensor *from[2] = {a, b};
  CHECK_FAILS(backend_tensors_cast(to, from, 2), L2L_ERR_INVALID, "pair 1");
  CHECK_FAILS(backend_tensors_cast(to_short, from, 2), L2L_ERR_INVALID, "pair 1");
  CHECK_FAILS(backend_tensors_cast(to_ids, from, 1), L2L_ERR_INVALID, "f32 to f16 or bf16");
  CHECK_FAILS(backend_tensors_cast(to_dev, from, 2), L2L_ERR_INVALID, "pair 1");
  bool kept = true;
  for (int k = 0; k < 10; k++) kept &= ((const uint8_t *)l2l_tensor_data(h16))[k] == 0x11;
  CHECK(kept, "a refused cast wrote into pair 0's output");
  l2l_tensor_free(a), l2l_tensor_free(b), l2l_tensor_free(h16), l2l_tensor_free(f16);
  l2l_tensor_free(short16), l2l_tensor_free(ids), l2l_tensor_free(dev16);
}

/* ---------------------------------------------------------------- padded rows */

/* A pad element's bits: a NaN no op makes (a read of it poisons a result; a write of it
   is seen). */
static const uint32_t PAD32 = 0x7fc0beefu;
static const uint16_t PAD16 = 0x7fc3;

/* rows x cols of src (packed) into a fresh (rows, ld) buffer of `size`-byte elements
   whose padding is PAD32 / PAD16. */
static void *padded_copy(const void *src, int64_t rows, int64_t cols, int64_t ld, size_t size) {
  char *v = xmalloc((size_t)(rows * ld) * size);
  for (int64_t i = 0; i < rows * ld; i++)
    memcpy(v + (size_t)i * size, size == 4 ? (const void *)&PAD32 : (const void *)&PAD16, size);
  for (int64_t r = 0; r < rows; r++)
    if (cols > 0) memcpy(v + (size_t)(r * ld) * size, (const char *)src + (size_t)(r * cols) * size,
                         (size_t)cols * size);
  return v;
}

/* A padded (rows, ld) buffer against the packed (rows, cols) result: the same bits in every
   row, the padding still PAD32 / PAD16. */
static bool same_padded(const char *what, const void *got, const void *want, int64_t rows,
                        int64_t cols, int64_t ld, size_t size) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < ld; j++) {
      const char *g = (const char *)got + (size_t)(r * ld + j) * size;
      const void *w = j < cols ? (const char *)want + (size_t)(r * cols + j) * size
                               : size == 4 ? (const void *)&PAD32 : (const void *)&PAD16;
      if (memcmp(g, w, size) != 0)
        return CHECK(false, "%s: row %lld, column %lld of %lld (stride %lld) %s", what,
                     (long long)r, (long long)j, (long long)cols, (long long)ld,
                     j < cols ? "differs from the packed op's" : "(padding) was written");
    }
  return true;
}

/* The LM head pads its logits' rows (heads.c lm_head_ld): the cross-entropy ops and the
   GEMMs given row strides past the packed ones give the packed ops' bits, read no padding
   (it holds NaNs that would poison a result) and write none. */
TEST(padded_rows_give_the_packed_results) {
  const struct backend_ops *ops = &cpu_backend;
  for (int s = 0; s < SHAPES; s++) {
    const int64_t rows = shapes[s][0], vocab = shapes[s][1], n = rows * vocab;
    const int64_t ld = vocab + check_rand_int(1, 9);
    const int32_t ignore = -1;
    float *logits = randn(n, 3.0);
    int32_t *targets = xmalloc((size_t)rows * sizeof *targets);
    for (int64_t r = 0; r < rows; r++)
      targets[r] = check_rand_int(0, 4) == 0 ? ignore : (int32_t)check_rand_int(0, vocab - 1);
    const float scale = (float)check_rand_uniform(0.01, 1.0);
    const l2l_dtype half = halves[check_rand_int(0, 1)];
    float *losses = poison(rows), *dlogits = poison(n);
    uint16_t *d16 = poison16(n);
    CHECK_OK(ops->cross_entropy_fused(losses, dlogits, d16, half, logits, targets, ignore, scale,
                                      rows, vocab, vocab));
    float *lp = padded_copy(logits, rows, vocab, ld, 4), *over = padded_copy(logits, rows, vocab, ld, 4);
    float *losses_p = poison(rows), *dp = padded_copy(dlogits, rows, 0, ld, 4);
    uint16_t *d16p = padded_copy(d16, rows, 0, ld, 2);
    CHECK_OK(ops->cross_entropy_fused(losses_p, dp, d16p, half, lp, targets, ignore, scale, rows,
                                      vocab, ld));
    char what[96];
    snprintf(what, sizeof what, "cross_entropy_fused %lldx%lld", (long long)rows, (long long)vocab);
    same_bits(what, losses_p, losses, rows, rows, vocab);
    same_padded(what, dp, dlogits, rows, vocab, ld, 4);
    same_padded(what, d16p, d16, rows, vocab, ld, 2);
    same_padded(what, lp, logits, rows, vocab, ld, 4);   /* (its input, untouched) */
    /* in place, the LM head's way without a 16-bit projection; and the two halves */
    float *losses_o = poison(rows);
    CHECK_OK(ops->cross_entropy_fused(losses_o, over, NULL, L2L_F32, over, targets, ignore, scale,
                                      rows, vocab, ld));
    same_bits("cross_entropy_fused in place, padded: losses", losses_o, losses, rows, rows, vocab);
    same_padded("cross_entropy_fused in place, padded", over, dlogits, rows, vocab, ld, 4);
    float *losses_f = poison(rows), *db = padded_copy(dlogits, rows, 0, ld, 4);
    CHECK_OK(ops->cross_entropy_forward(losses_f, lp, targets, ignore, rows, vocab, ld));
    CHECK_OK(ops->cross_entropy_backward(db, lp, targets, ignore, scale, rows, vocab, ld));
    same_bits("cross_entropy_forward, padded", losses_f, losses, rows, rows, vocab);
    same_padded("cross_entropy_backward, padded", db, dlogits, rows, vocab, ld, 4);
    free(logits), free(targets), free(losses), free(dlogits), free(d16), free(lp), free(over);
    free(losses_p), free(dp), free(d16p), free(losses_o), free(losses_f), free(db);
  }
  static const l2l_dtype types[] = {L2L_F32, L2L_BF16, L2L_F16};
  for (int trial = 0; trial < 24; trial++) {
    const l2l_dtype dt = types[trial % 3];
    const size_t es = l2l_dtype_size(dt);
    const int ta = (int)check_rand_int(0, 1), tb = (int)check_rand_int(0, 1);
    const int64_t batch = check_rand_int(1, 3), m = check_rand_int(1, 37), n = check_rand_int(1, 37),
                  k = check_rand_int(1, 37);
    const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    /* each stride packed or padded, drawn apart (trial 0 of each type pads all three) */
    const int64_t lda = ac + (trial < 3 || check_rand_int(0, 1) ? check_rand_int(1, 9) : 0);
    const int64_t ldb = bc + (trial < 3 || check_rand_int(0, 1) ? check_rand_int(1, 9) : 0);
    const int64_t ldc = n + (trial < 3 || check_rand_int(0, 1) ? check_rand_int(1, 9) : 0);
    const float alpha = (float)check_rand_uniform(0.5, 2.0), beta = check_rand_int(0, 1) ? 0.5f : 0.0f;
    float *a32 = randn(batch * ar * ac, 1.0), *b32 = randn(batch * br * bc, 1.0);
    void *a = a32, *b = b32;
    if (dt != L2L_F32) {   /* the inputs in 16 bits */
      int64_t bad = -1;
      a = poison16(batch * ar * ac), b = poison16(batch * br * bc);
      CHECK_OK(ops->convert(a, dt, a32, L2L_F32, batch * ar * ac, &bad));
      CHECK_OK(ops->convert(b, dt, b32, L2L_F32, batch * br * bc, &bad));
    }
    float *c = randn(batch * m * n, 1.0);
    void *ap = padded_copy(a, batch * ar, ac, lda, es), *bp = padded_copy(b, batch * br, bc, ldb, es);
    float *cp = padded_copy(c, batch * m, n, ldc, 4);
    CHECK_OK(ops->gemm_batched(c, a, b, dt, batch, m, n, k, ta, tb, alpha, beta, 0, 0, 0));
    CHECK_OK(ops->gemm_batched(cp, ap, bp, dt, batch, m, n, k, ta, tb, alpha, beta, lda, ldb, ldc));
    char what[160];
    snprintf(what, sizeof what, "gemm %s batch %lld, m %lld n %lld k %lld %c%c, strides %lld %lld "
             "%lld", l2l_dtype_name(dt), (long long)batch, (long long)m, (long long)n, (long long)k,
             ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)lda, (long long)ldb, (long long)ldc);
    same_padded(what, cp, c, batch * m, n, ldc, 4);
    if (dt != L2L_F32) free(a), free(b);
    free(a32), free(b32), free(c), free(ap), free(bp), free(cp);
  }
}

/* ---------------------------------------------------------------- attention's o in 16 bits */

/* The CPU's attention with q, k, v and o in bf16 or f16 (as the block keeps them on a 16-bit
   run): the f32 copies' run, o rounded, bit for bit (attention_io16.c). */
TEST(attention_reads_and_writes_16_bits) {
  for (int i = 0; i < 12; i++) attention_io16_check(L2L_POOL_HOST, L2L_F32, i & 1, true);
}
