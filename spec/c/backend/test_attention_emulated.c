/* SPDX-License-Identifier: MIT */
/* test_attention_emulated.c — the GPU's attention kernels and launchers (kernels/attention.cu,
 * fp32, every mode; kernels/attention_flash.cu, 16-bit products on tensor cores), their own
 * source run on the CPU by attention_emulated.cpp, against the CPU backend's attention in
 * fp32.
 *
 * Purpose: those kernels are written where no GPU runs them; a wrong index, mask, tile
 * bound, stage, atomic or barrier shows here, in every `make test`, instead of in a lent
 * GPU's few minutes. Calls go through the launchers the CUDA backend calls (their checks,
 * their choice of kernel by head dim, their tiles), with fewer blocks than items (blocks
 * reuse their shared memory and walk several items). Shapes are drawn afresh. The flash
 * kernels: 16-bit q, k, v and do in the block's interleaved layout, lengths across and
 * inside tiles, head dims up to 128 by 8, causal, key masks, dropout, bf16 and f16, o and
 * dq, dk, dv in f32 or 16 bits, the emulated copies landing at issue or only at their wait;
 * the CPU side reads the same 16-bit values widened, and the tolerances are the GPU tests'
 * (cuda_twins.h: the products' rounding), so this also checks that the sums the kernels
 * would make on tensor cores round only where they should. The fp32 kernels: each head-dim
 * template (to 256) in the flash mode (o, lse) and the standard mode (P, P' and the kept
 * bits, every byte the CPU's), causal or not, key masks (a sample all padding), dropout,
 * the backward's P' kept, from the bits or drawn again, within TOL_ATTENTION; o's and dq,
 * dk, dv's padding untouched.
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "attention_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

/* n normal draws rounded to t: the 16-bit values in h16, their f32 values in f. */
static void draw16(uint16_t *h16, float *f, int64_t n, l2l_dtype t) {
  for (int64_t i = 0; i < n; i++) {
    h16[i] = round16((float)check_rand_normal(), t);
    f[i] = widen16(h16[i], t);
  }
}

/* A (rows, cols) result at stride ld in f32 or (half) 16-bit t, widened into f32 at the
   same stride (NaN outside the cols). */
static float *widened(const void *x, bool half, l2l_dtype t, int64_t rows, int64_t cols, int64_t ld) {
  float *w = malloc((size_t)(rows * ld) * sizeof *w);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < ld; c++) {
      const int64_t i = r * ld + c;
      w[i] = c >= cols ? NAN : half ? widen16(((const uint16_t *)x)[i], t) : ((const float *)x)[i];
    }
  return w;
}

static void *poisoned_buffer(int64_t n, bool half) {
  void *p = malloc((size_t)n * (half ? 2 : 4));
  memset(p, 0xff, (size_t)n * (half ? 2 : 4));
  return p;
}

/* A call's shape (the CPU's), its draws' seed, stream and first sample drawn. */
static struct backend_attention_shape drawn_shape(int64_t B, int64_t H, int64_t S, int64_t hd,
                                                  int64_t ld, int64_t ld_o, bool causal,
                                                  float dropout) {
  return (struct backend_attention_shape){
      .batch = B, .heads = H, .seq = S, .head_dim = hd, .ld_qkv = ld, .ld_o = ld_o,
      .causal = causal, .scale = 1.0f / sqrtf((float)hd), .dropout = dropout,
      .seed = check_rand_u64(), .stream = check_rand_u64(),
      .first_sample = check_rand_int(0, 1000)};
}

/* One drawn case: forward and backward, emulated against the CPU; `long_seq`: three key
   tiles or more (each stage of shared memory refilled). */
static bool flash_case(bool lazy, bool long_seq) {
  const l2l_dtype t = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  const int64_t B = check_rand_int(1, 2), H = check_rand_int(1, 2), hd = 8 * check_rand_int(1, 16);
  const int64_t S = long_seq ? check_rand_int(129, 200)
                   : check_rand_int(0, 3) == 0 ? check_rand_int(1, 8) : check_rand_int(9, 150);
  const int64_t D = H * hd, N = B * S, rows = B * H * S, ld = 3 * D;
  const int64_t ld_o = D + 8 * check_rand_int(0, 1);
  const bool causal = check_rand_int(0, 1), masked = check_rand_int(0, 2) == 0;
  const bool o16 = check_rand_int(0, 1), out16 = check_rand_int(0, 1);
  const float dropout = check_rand_int(0, 2) == 0 ? 0.1f : 0.0f;
  const int blocks = (int)check_rand_int(1, 3);
  const struct backend_attention_shape sh = drawn_shape(B, H, S, hd, ld, ld_o, causal, dropout);
  char what[240];
  snprintf(what, sizeof what, "flash emulated %s B=%lld H=%lld S=%lld hd=%lld%s%s dropout=%g, "
           "o %s, dq dk dv %s, copies landing %s, %d block%s", l2l_dtype_name(t), (long long)B,
           (long long)H, (long long)S, (long long)hd, causal ? " causal" : "", masked ? " masked" : "",
           dropout, o16 ? "16-bit" : "f32", out16 ? "16-bit" : "f32", lazy ? "at the wait" : "at issue",
           blocks, blocks > 1 ? "s" : "");

  /* q | k | v interleaved and do, 16-bit, and their f32 values for the CPU */
  uint16_t *qkv16 = malloc((size_t)(N * ld) * 2), *do16 = malloc((size_t)(N * D) * 2);
  float *qkv = malloc((size_t)(N * ld) * 4), *d_o = malloc((size_t)(N * ld_o) * 4);
  draw16(qkv16, qkv, N * ld, t);
  float *do_packed = malloc((size_t)(N * D) * 4);
  draw16(do16, do_packed, N * D, t);
  for (int64_t r = 0; r < N; r++)
    for (int64_t c = 0; c < ld_o; c++) d_o[r * ld_o + c] = c < D ? do_packed[r * D + c] : NAN;
  uint8_t *key_mask = NULL;
  int64_t len = S; /* the last sample's unpadded keys */
  if (masked) { /* sample 0 whole, the last a random tail of padding (all of it at times) */
    key_mask = malloc((size_t)N);
    len = check_rand_int(0, S);
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < S; j++) key_mask[b * S + j] = b == 0 || j < len;
  }

  /* the CPU's forward, f32 */
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t threads = l2l_get_threads();
  const int64_t wf = cpu->attention_workspace(&sh, 0) * threads, wb = cpu->attention_workspace(&sh, 1) * threads;
  float *work = malloc((size_t)(wf > wb ? wf : wb) * 4 + 4);
  float *o_ref = malloc((size_t)(N * ld_o) * 4), *lse_ref = malloc((size_t)rows * 4);
  for (int64_t i = 0; i < N * ld_o; i++) o_ref[i] = NAN;
  bool ok = CHECK_OK(cpu->attention_forward(o_ref, lse_ref, NULL, NULL, NULL, qkv, qkv + D, qkv + 2 * D,
                                            key_mask, &sh, work, wf));

  /* the kernels' */
  void *o = poisoned_buffer(N * ld_o, o16);
  float *lse = poisoned_buffer(rows, false);
  const int dt = (int)t;
  emu_attention_launches(blocks, lazy);
  ok &= CHECK(emu_k_attention_flash_serves(dt, hd, 0) && emu_k_attention_flash_serves(dt, hd, 1) &&
                  !emu_k_attention_flash_serves(dt, hd + 4, 0) && !emu_k_attention_flash_serves(0, hd, 0),
              "%s: the flash kernels serve another call than this (head dims by 8, 16 bits)", what);
  /* what the launcher refuses (the CUDA backend casts or packs first), before the call
     whose o is checked: rows not 16-byte aligned (the pointers, or ld), o in the other
     16-bit type */
  const int other = t == L2L_BF16 ? (int)L2L_F16 : (int)L2L_BF16;
  ok &= CHECK(emu_k_attention_flash_forward(o, 0, lse, qkv16 + 4, qkv16 + D + 4, qkv16 + 2 * D + 4,
                                            key_mask, B, H, S, hd, ld, ld_o, causal, sh.scale,
                                            dropout, 0, 0, 0, 0, dt, NULL) != 0 &&
                  emu_k_attention_flash_forward(o, 0, lse, qkv16, qkv16 + D, qkv16 + 2 * D, key_mask,
                                                B, H, S, hd, ld + 4, ld_o, causal, sh.scale, dropout,
                                                0, 0, 0, 0, dt, NULL) != 0 &&
                  emu_k_attention_flash_forward(o, other, lse, qkv16, qkv16 + D, qkv16 + 2 * D,
                                                key_mask, B, H, S, hd, ld, ld_o, causal, sh.scale,
                                                dropout, 0, 0, 0, 0, dt, NULL) != 0,
              "%s: the flash forward took a call it must refuse", what);
  ok &= CHECK(emu_k_attention_flash_forward(o, o16 ? dt : 0, lse, qkv16, qkv16 + D, qkv16 + 2 * D,
                                            key_mask, B, H, S, hd, ld, ld_o, causal, sh.scale,
                                            dropout, backend_keep_threshold(dropout), sh.seed,
                                            sh.stream, sh.first_sample, dt, NULL) == 0,
              "%s: the emulated forward refused the call", what);
  char label[300];
  float *o_got = widened(o, o16, t, N, D, ld_o);
  snprintf(label, sizeof label, "%s: o", what);
  ok &= attention_close(label, o_got, o_ref, N, D, ld_o, RMS, t, ATTN_VALUES);
  ok &= padding_kept(label, o, o16, N, D, ld_o);
  double score_scale = sh.scale * sqrt((double)hd);   /* (q, k of unit variance) */
  double lse_floor = fmax(score_scale, rms_of(lse_ref, 1, rows, rows));
  snprintf(label, sizeof label, "%s: lse (-inf where every key is hidden)", what);
  ok &= attention_close(label, lse, lse_ref, 1, rows, rows, lse_floor, t, ATTN_LSE);

  /* the backward on both sides from the CPU's lse and the same o values (the kernels'
     16-bit o rounded from the CPU's where o16) */
  if (ok) {
    void *o_in = o16 ? malloc((size_t)(N * ld_o) * 2) : (void *)o_ref;
    float *o_cpu = o_ref;
    if (o16) {
      o_cpu = malloc((size_t)(N * ld_o) * 4);
      for (int64_t i = 0; i < N * ld_o; i++) {
        ((uint16_t *)o_in)[i] = round16(o_ref[i], t);
        o_cpu[i] = i % ld_o < D ? widen16(((uint16_t *)o_in)[i], t) : NAN;
      }
    }
    float *g_ref = malloc((size_t)(N * ld) * 4);
    for (int64_t i = 0; i < N * ld; i++) g_ref[i] = NAN;
    ok &= CHECK_OK(cpu->attention_backward(g_ref, g_ref + D, g_ref + 2 * D, d_o, o_cpu, lse_ref, NULL,
                                           NULL, NULL, qkv, qkv + D, qkv + 2 * D, key_mask, &sh,
                                           work, wb));
    /* dq, dk, dv in three buffers with poisoned padding past each row's heads: a column
       written outside a head's shows */
    const int64_t ldg = D + 8;
    void *g[3] = {poisoned_buffer(N * ldg, out16), poisoned_buffer(N * ldg, out16),
                  poisoned_buffer(N * ldg, out16)};
    float *d_rows = malloc((size_t)rows * 4);
    ok &= CHECK(emu_k_attention_flash_backward(g[0], g[1], g[2], out16 ? dt : 0, ldg, do16, D,
                                               o_in, o16 ? dt : 0, lse_ref, qkv16, qkv16 + D,
                                               qkv16 + 2 * D, key_mask, B, H, S, hd, ld, ld_o,
                                               causal, sh.scale, dropout,
                                               backend_keep_threshold(dropout), sh.seed, sh.stream,
                                               sh.first_sample, dt, d_rows, NULL) == 0,
                "%s: the emulated backward refused the call", what);
    float *g_got = host_floats(N * ld, NAN); /* the three, widened, as the CPU's are laid out */
    for (int p = 0; p < 3; p++) {
      float *w = widened(g[p], out16, t, N, D, ldg);
      for (int64_t r = 0; r < N; r++) memcpy(g_got + r * ld + p * D, w + r * ldg, (size_t)D * 4);
      free(w);
      snprintf(label, sizeof label, "%s: %s's padding", what, p == 0 ? "dq" : p == 1 ? "dk" : "dv");
      ok &= padding_kept(label, g[p], out16, N, D, ldg);
    }
    static const char *const parts[] = {"dq", "dk", "dv"};
    /* floors as test_cuda_layers.c's attention_case: a query that sees one key has dS
       rounding noise on the 16-bit side, held to a tenth of dv's scale; a key serving S
       queries alone (a mask leaving one) gathers that noise S times */
    const double dv_scale = rms_of(g_ref + 2 * D, N, D, ld);
    for (int p = 0; p < 3; p++) {
      double floor = fmax(rms_of(g_ref + p * D, N, D, ld), 0.1 * dv_scale);
      if (p == 1 && B > 1 && len == 1 && S > 1) {
        const double u = t == L2L_BF16 ? 0x1p-8 : 0x1p-11;
        const double noise = u * sqrt(2.0 * (double)S) / (1.0 - dropout);
        const double elem_tol = (t == L2L_F16 ? 0.25 : 1.0) * TOL_ATTN16_ELEMENT[ATTN_DQK];
        floor = fmax(floor, 5.0 * noise / elem_tol);
      }
      snprintf(label, sizeof label, "%s: %s", what, parts[p]);
      ok &= attention_close(label, g_got + p * D, g_ref + p * D, N, D, ld, floor > 0.0 ? floor : RMS, t,
                            p == 2 ? ATTN_VALUES : ATTN_DQK);
    }
    free(g_got), free(g[0]), free(g[1]), free(g[2]), free(d_rows), free(g_ref);
    if (o16) free(o_in), free(o_cpu);
  }
  free(o_got), free(o), free(lse), free(o_ref), free(lse_ref), free(work);
  free(qkv16), free(do16), free(qkv), free(d_o), free(do_packed), free(key_mask);
  return ok;
}

/* One drawn case of the fp32 kernels (attention.cu: every product in f32, every mode),
   forward then backward, against the CPU in f32 within TOL_ATTENTION: the flash mode (o,
   lse) or the standard mode (P too, and with dropout P' and the kept bits); head dims up to
   `hd_max` (the kernels' template at or above it); q, k, v interleaved in one buffer and
   dq, dk, dv in another of the same rows, with o, padding past their heads that must stay
   untouched. */
static bool fp32_case(int64_t hd_max, bool standard) {
  const int64_t hd = check_rand_int(hd_max / 2 + 1, hd_max), H = check_rand_int(1, 2);
  const bool masked = check_rand_int(0, 2) == 0, causal = check_rand_int(0, 1);
  const int64_t B = masked ? 3 : check_rand_int(1, 2);
  const int64_t S = check_rand_int(0, 3) == 0 ? check_rand_int(1, 8) : check_rand_int(9, 150);
  const int64_t D = H * hd, N = B * S, rows = B * H * S;
  const int64_t ld = 3 * D + check_rand_int(0, 3), ld_o = D + check_rand_int(0, 5);
  const float dropout = check_rand_int(0, 1) ? 0.1f : 0.0f;
  const int blocks = (int)check_rand_int(1, 3);
  const struct backend_attention_shape sh = drawn_shape(B, H, S, hd, ld, ld_o, causal, dropout);
  char what[240], label[300];
  snprintf(what, sizeof what, "fp32 attention %s B=%lld H=%lld S=%lld hd=%lld%s%s dropout=%g, %d block%s",
           standard ? "standard" : "flash mode", (long long)B, (long long)H, (long long)S, (long long)hd,
           causal ? " causal" : "", masked ? " masked" : "", dropout, blocks, blocks > 1 ? "s" : "");
  float *qkv = host_normals(N * ld, 1.0), *d_o = host_floats(N * ld_o, NAN);
  for (int64_t r = 0; r < N; r++)
    for (int64_t c = 0; c < D; c++) d_o[r * ld_o + c] = (float)check_rand_normal();
  uint8_t *key_mask = NULL;
  if (masked) { /* sample 0 whole, sample 1 a random tail of padding, sample 2 all padding */
    key_mask = malloc((size_t)N);
    const int64_t len = S > 1 ? check_rand_int(1, S - 1) : 1;
    for (int64_t b = 0; b < B; b++)
      for (int64_t j = 0; j < S; j++) key_mask[b * S + j] = b == 0 || (b == 1 && j < len);
  }
  /* the outputs, both sides: NaN (the kept bits 0xff) before the call */
  const bool rows_kept = standard, bits_kept = standard && dropout > 0.0f;
  const int64_t row_bytes = (S + 7) / 8;
  float *out[2][4]; /* o, lse, P, P' */
  uint8_t *bits[2];
  for (int side = 0; side < 2; side++) {
    out[side][0] = host_floats(N * ld_o, NAN), out[side][1] = host_floats(rows, NAN);
    out[side][2] = rows_kept ? host_floats(rows * S, NAN) : NULL;
    out[side][3] = bits_kept ? host_floats(rows * S, NAN) : NULL;
    if (bits_kept) { /* (0xff: a byte the CPU does not write keeps it) */
      bits[side] = malloc((size_t)(rows * row_bytes));
      memset(bits[side], 0xff, (size_t)(rows * row_bytes));
    } else {
      bits[side] = NULL;
    }
  }
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t threads = l2l_get_threads();
  const int64_t wf = cpu->attention_workspace(&sh, 0) * threads, wb = cpu->attention_workspace(&sh, 1) * threads;
  float *work = malloc((size_t)(wf > wb ? wf : wb) * 4 + 4);
  bool ok = CHECK_OK(cpu->attention_forward(out[0][0], out[0][1], out[0][2], out[0][3], bits[0], qkv,
                                            qkv + D, qkv + 2 * D, key_mask, &sh, work, wf));
  emu_attention_launches(blocks, false);
  ok &= CHECK(emu_k_attention_forward(out[1][0], out[1][1], out[1][2], out[1][3], bits[1], qkv, qkv + D,
                                      qkv + 2 * D, key_mask, B, H, S, hd, ld, ld_o, causal, sh.scale,
                                      dropout, backend_keep_threshold(dropout), sh.seed, sh.stream,
                                      sh.first_sample, NULL, NULL) == 0,
              "%s: the forward's launch", what);
  snprintf(label, sizeof label, "%s: o", what);
  ok &= attention_close(label, out[1][0], out[0][0], N, D, ld_o, RMS, L2L_F32, ATTN_VALUES);
  ok &= padding_kept(label, out[1][0], false, N, D, ld_o);
  const double lse_floor = fmax(sh.scale * sqrt((double)hd), rms_of(out[0][1], 1, rows, rows));
  snprintf(label, sizeof label, "%s: lse (-inf where every key is hidden)", what);
  ok &= attention_close(label, out[1][1], out[0][1], 1, rows, rows, lse_floor, L2L_F32, ATTN_LSE);
  if (rows_kept) {
    snprintf(label, sizeof label, "%s: P", what);
    ok &= CHECK_CLOSE(label, out[1][2], out[0][2], rows * S, RMS, TOL_ATTENTION);
  }
  if (bits_kept) {
    snprintf(label, sizeof label, "%s: P'", what);
    ok &= CHECK_CLOSE(label, out[1][3], out[0][3], rows * S, RMS, TOL_ATTENTION);
    /* every byte the CPU's (it writes each row's bytes up to its query tile's last key) */
    int64_t first = -1;
    for (int64_t i = 0; i < rows * row_bytes && first < 0; i++)
      if (bits[1][i] != bits[0][i]) first = i;
    ok &= CHECK(first < 0, "%s: the kept bits' byte %lld of row %lld is %#x, want %#x", what,
                (long long)(first % row_bytes), (long long)(first / row_bytes),
                first < 0 ? 0 : bits[1][first], first < 0 ? 0 : bits[0][first]);
  }

  /* the backward on both sides from the CPU forward's outputs */
  if (ok) {
    /* dq, dk, dv as q, k, v lie (rows ld apart: the kernels take one stride), NaN before */
    float *g_ref = host_floats(N * ld, NAN), *g = host_floats(N * ld, NAN);
    const int p_from = bits_kept ? (int)check_rand_int(0, 2) : 0;
    const float *dropped = p_from == 0 ? out[0][3] : NULL;
    const uint8_t *kept = p_from <= 1 ? bits[0] : NULL;
    snprintf(what + strlen(what), sizeof what - strlen(what), "%s",
             !bits_kept ? "" : p_from == 0 ? ", P' kept" : p_from == 1 ? ", P' from the bits" : ", P' drawn again");
    ok &= CHECK_OK(cpu->attention_backward(g_ref, g_ref + D, g_ref + 2 * D, d_o, out[0][0], out[0][1],
                                           out[0][2], dropped, kept, qkv, qkv + D, qkv + 2 * D,
                                           key_mask, &sh, work, wb));
    const int64_t scratch_floats = emu_k_attention_scratch_floats(B, H, S, 1);
    float *scratch = host_floats(scratch_floats, NAN);
    /* (a standard-mode backward reads P, and P' from P' kept, from the bits alone, or from
       the draws again; the flash mode's recomputes P from lse and P' from the draws) */
    ok &= CHECK(emu_k_attention_backward(g, g + D, g + 2 * D, d_o, out[0][0], standard ? NULL : out[0][1],
                                         out[0][2], dropped, kept, qkv, qkv + D, qkv + 2 * D,
                                         key_mask, B, H, S, hd, ld, ld_o, causal, sh.scale, dropout,
                                         backend_keep_threshold(dropout), sh.seed, sh.stream,
                                         sh.first_sample, scratch, NULL) == 0,
                "%s: the backward's launch", what);
    /* a query that sees one key has dS = dP - D = 0 up to rounding: its dq and that key's
       dk are noise on both sides, held to a tenth of dv's scale (test_cuda_layers.c) */
    const double dv_scale = rms_of(g_ref + 2 * D, N, D, ld);
    static const char *const parts[] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
      const double floor = fmax(rms_of(g_ref + p * D, N, D, ld), 0.1 * dv_scale);
      snprintf(label, sizeof label, "%s: %s", what, parts[p]);
      ok &= attention_close(label, g + p * D, g_ref + p * D, N, D, ld, floor > 0.0 ? floor : RMS,
                            L2L_F32, p == 2 ? ATTN_VALUES : ATTN_DQK);
    }
    snprintf(label, sizeof label, "%s: dq, dk, dv", what);
    ok &= padding_kept(label, g, false, N, 3 * D, ld);
    free(g);
    free(g_ref), free(scratch);
  }
  for (int side = 0; side < 2; side++) {
    for (int k = 0; k < 4; k++) free(out[side][k]);
    free(bits[side]);
  }
  free(qkv), free(d_o), free(key_mask), free(work);
  return ok;
}

#endif

TEST(flash_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* (under ThreadSanitizer, which also checks every shared-memory access of the emulated
     threads against the kernels' barriers, three long cases, copies landing at issue: the
     stages' refills race with their readers there if a barrier is missing) */
#ifdef L2L_TSAN
  const int cases = 3, long_from = 0;
#else
  const int cases = 8, long_from = 6;
#endif
  int failed = 0;
  for (int i = 0; i < cases && failed < 3; i++)
    failed += !flash_case(i < long_from ? i & 1 : false, i >= long_from);
#endif
}

TEST(attention_fp32_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* each head-dim template (32, 64, 128, 256) in both modes, twice; under ThreadSanitizer,
     which checks every access of the emulated threads against the kernels' barriers, the
     two smaller ones once */
#ifdef L2L_TSAN
  const int templates = 2, rounds = 1;
#else
  const int templates = 4, rounds = 2;
#endif
  int failed = 0;
  for (int round = 0; round < rounds; round++)
    for (int t = 0; t < templates && failed < 3; t++)
      for (int standard = 0; standard < 2; standard++) failed += !fp32_case(32 << t, standard);
#endif
}
