/* SPDX-License-Identifier: MIT */
/* test_cudnn.c — the CUDA backend's cuDNN attention path (src/backend/cuda/cudnn_*.c).
 *
 * Without a GPU (here): when libcudnn.so.9 loads, every tensor and operation descriptor of
 * the forward and backward SDPA graphs is built and finalized for drawn shapes (causal or
 * not, head dims 64 and 128, odd sequence lengths and batches, bf16 and f16), and a graph
 * wired wrongly on purpose must be refused; the operation graph's finalize, the plan and
 * the run need a GPU and are reported skipped with the reason. Where libcudnn cannot be
 * loaded the tests say skipped and why. On a GPU: the cuDNN path's o, lse, dq, dk, dv
 * against the own f32 kernels' on the same inputs, within bf16 / f16 rounding's
 * tolerances (cuda_twins.h's TOL_ATTN16, plus the rounding of the outputs cuDNN writes in
 * 16 bits), the calls cuDNN does not cover (a key mask, dropout, cuDNN switched off)
 * shown to take the own kernels, and a plan cuDNN would not run leaving its call and
 * shape to them. All test names start with "cudnn_".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_io16.h"
#include "backend/accelerators.h"
#include "cuda_twins.h"
#include "sdpa_eval.h"

/* A drawn shape as the block lays attention out: q, k, v column blocks of one (B*S, 3 H d)
   buffer, o (B*S, H d). */
static struct backend_attention_shape drawn_shape(int64_t head_dim, int causal, l2l_dtype precision) {
  struct backend_attention_shape sh;
  memset(&sh, 0, sizeof sh);
  sh.batch = PICK(1, 2, 3, 5), sh.heads = PICK(1, 2, 3, 12), sh.seq = PICK(1, 7, 64, 129, 200, 1000);
  sh.head_dim = head_dim, sh.causal = causal, sh.precision = precision;
  sh.ld_qkv = 3 * sh.heads * head_dim, sh.ld_o = sh.heads * head_dim;
  sh.scale = 1.0f / sqrtf((float)head_dim);
  return sh;
}

/* false (skipped, with why) when libcudnn cannot be loaded. */
static bool need_cudnn(void) {
  char about[512];
  if (cudnn_probe(about, sizeof about) != 0) return true;
  check_skip("cuDNN is not loaded: %s", about);
  return false;
}

TEST(cudnn_loads_and_says_from_where) {
  char about[512] = "";
  int version = cudnn_probe(about, sizeof about);
  CHECK(about[0] != '\0', "cudnn_probe gave no words");
  if (version == 0) {
    check_skip("cuDNN is not loaded: %s", about);
    return;
  }
  CHECK(version >= 90000 && version < 100000, "version %d is not 9.x", version);
  char want[32];
  snprintf(want, sizeof want, "cuDNN %d.%d.%d from ", version / 10000, version / 100 % 100,
           version % 100);
  CHECK(strstr(about, want) == about && strstr(about, "libcudnn") != NULL,
        "about \"%s\" should start \"%s\" and name the library", about, want);
}

TEST(cudnn_graph_nodes_finalize) {
  if (!need_cudnn()) return;
  static const l2l_dtype types[] = {L2L_BF16, L2L_F16};
  char report[1024] = "";
  int built = 0;
  for (int backward = 0; backward < 2; backward++)
    for (int d = 0; d < 2; d++)
      for (int causal = 0; causal < 2; causal++) {
        struct backend_attention_shape sh = drawn_shape(d ? 128 : 64, causal, types[check_rand_int(0, 1)]);
        sh.qkv_dtype = PICK(L2L_F32, sh.precision);   /* (read in place: the rows' stride) */
        char what[160];
        snprintf(what, sizeof what, "%s B=%lld H=%lld S=%lld d=%lld%s %s%s",
                 backward ? "backward" : "forward", (long long)sh.batch, (long long)sh.heads,
                 (long long)sh.seq, (long long)sh.head_dim, causal ? " causal" : "",
                 l2l_dtype_name(sh.precision), sh.qkv_dtype != L2L_F32 ? " q, k, v in place" : "");
        report[0] = '\0';
        if (!CHECK_OK(cudnn_check_graphs(&sh, backward, 0, report, sizeof report))) continue;
        built++;
        /* the nodes cudnn_sdpa.c lists: 10 forward, 18 backward, 4 more for the causal mask */
        int tensors = 0, ops = 0;
        CHECK(sscanf(report, "%d tensors and %d operations", &tensors, &ops) == 2,
              "%s: report \"%s\"", what, report);
        int want_ops = (backward ? 18 : 10) + (causal ? 4 : 0);
        CHECK(ops == want_ops, "%s: %d operations, want %d", what, ops, want_ops);
        CHECK(tensors > ops, "%s: %d tensors for %d operations", what, tensors, ops);
        /* the same shape wired wrongly must be refused, naming the node: V's head dim halved
           (cuDNN's node check), a node reading what nothing writes or leaving a result
           unread (the wiring check) */
        for (int miswire = 1; miswire <= 2; miswire++) {
          char ignored[64];
          l2l_status st = cudnn_check_graphs(&sh, backward, miswire, ignored, sizeof ignored);
          if (built == 1) printf("  cudnn: miswired, as it must be: %s\n", l2l_last_error());
          CHECK(st == L2L_ERR_BACKEND && strstr(l2l_last_error(), "refused") != NULL,
                "%s miswired (%d): status %d (%s), want a refusal", what, miswire, (int)st,
                l2l_last_error());
        }
      }
  if (built > 0) printf("  cudnn: %s\n", report);
  char why[300];
  if (built > 0 && !cuda_probe(why, sizeof why))
    printf("  skipped: the engine choice, plan and execution (no GPU: %s)\n", why);
}

/* An f32 tensor of the device pool holding normal draws (the host copy kept in *host). */
static l2l_tensor *device_randn(l2l_tensor **host, int64_t rows, int64_t cols) {
  *host = RANDN(1.0, rows, cols);
  return copied_to(*host, L2L_POOL_DEVICE);
}

/* |got - want| / (|want| + rms(want)) over (rows, cols), worst element and normwise. */
static bool close_to(const char *what, const l2l_tensor *got_d, const l2l_tensor *want_d,
                     int64_t rows, int64_t cols, int64_t ld, int64_t offset, double elem_tol,
                     double norm_tol) {
  l2l_tensor *g = copied_to(got_d, L2L_POOL_HOST), *w = copied_to(want_d, L2L_POOL_HOST);
  const float *gp = fdata(g) + offset, *wp = fdata(w) + offset;
  double sw = 0, se = 0, worst = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) sw += (double)wp[r * ld + c] * wp[r * ld + c];
  double rms = sqrt(sw / (double)(rows * cols)) + 1e-30;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      double e = fabs((double)gp[r * ld + c] - wp[r * ld + c]);
      se += e * e;
      double rel = e / (fabs(wp[r * ld + c]) + rms);
      if (!(rel <= worst)) worst = rel;
    }
  double norm = sqrt(se / (double)(rows * cols)) / rms;
  bool ok = CHECK(worst <= elem_tol && norm <= norm_tol,
                  "%s: worst element %.3g (tolerance %.3g), normwise %.3g (tolerance %.3g)", what,
                  worst, elem_tol, norm, norm_tol);
  FREE(g, w);
  return ok;
}

/* The cuDNN path against the own f32 kernels on one drawn shape; own16: cuDNN switched off
   (the own 16-bit kernels must run: cuDNN's count stays). */
static void gpu_case(int64_t head_dim, int causal, l2l_dtype precision) {
  const struct backend_ops *ops = backend_for(L2L_POOL_DEVICE);
  struct backend_attention_shape sh = drawn_shape(head_dim, causal, precision);
  if (sh.seq > 200) sh.seq = 200;
  const int64_t D = sh.heads * head_dim, N = sh.batch * sh.seq, rows = sh.batch * sh.heads * sh.seq;
  struct backend_attention_shape ref = sh;
  ref.precision = L2L_F32;
  l2l_tensor *hq, *hd;
  l2l_tensor *qkv = device_randn(&hq, N, 3 * D), *d_o = device_randn(&hd, N, D);
  l2l_tensor *o[2] = {NEW(L2L_POOL_DEVICE, L2L_F32, N, D), NEW(L2L_POOL_DEVICE, L2L_F32, N, D)};
  /* lse one float into its tensor: not 16-byte aligned, as cuDNN's stats must be (the path
     goes through the scratch then) */
  l2l_tensor *lse_t[2] = {NEW(L2L_POOL_DEVICE, L2L_F32, rows + 1),
                          NEW(L2L_POOL_DEVICE, L2L_F32, rows + 1)};
  float *lse[2] = {fdata(lse_t[0]) + 1, fdata(lse_t[1]) + 1};
  l2l_tensor *g[2] = {NEW(L2L_POOL_DEVICE, L2L_F32, N, 3 * D), NEW(L2L_POOL_DEVICE, L2L_F32, N, 3 * D)};
  const float *q = fdata(qkv);
  char what[160];
  snprintf(what, sizeof what, "B=%lld H=%lld S=%lld d=%lld%s %s", (long long)sh.batch,
           (long long)sh.heads, (long long)sh.seq, (long long)head_dim, causal ? " causal" : "",
           l2l_dtype_name(precision));
  bool routed = cudnn_routes(&sh, NULL, NULL, NULL, NULL);
  /* cuDNN 9 runs head dims 64 and 128 in bf16 and f16 on compute capability 8.0 and newer
     (before 9.16, only with S a multiple of 128 here: no padding mask in l2l's graphs); a
     dry run (the device pool on the CPU, no GPU) has no cuDNN to route to */
  bool expected = cuda_probe(NULL, 0) && (cudnn_probe(NULL, 0) > 91500 || sh.seq % 128 == 0);
  /* the device backend's workspace (the CUDA backend's: none; a dry run's CPU backend's) */
  int64_t wf = 0;
  for (int side = 0; side < 2; side++)
    for (int backward = 0; backward < 2; backward++) {
      int64_t need = ops->attention_workspace(side ? &ref : &sh, backward) * l2l_get_threads();
      wf = need > wf ? need : wf;
    }
  l2l_tensor *work_t = wf > 0 ? NEW(L2L_POOL_DEVICE, L2L_F32, wf) : NULL;
  float *work = work_t ? fdata(work_t) : NULL;
  CHECK(routed || !expected, "%s: cuDNN refused the graph on this GPU (its reason: stderr)", what);
  int64_t before = cudnn_runs();
  for (int side = 0; side < 2; side++) {
    const struct backend_attention_shape *s = side == 0 ? &sh : &ref;
    float *gp = fdata(g[side]);
    CHECK_OK(ops->attention_forward(fdata(o[side]), lse[side], NULL, NULL, NULL, q, q + D,
                                    q + 2 * D, NULL, s, work, wf));
    CHECK_OK(ops->attention_backward(gp, gp + D, gp + 2 * D, fdata(d_o), fdata(o[side]),
                                     lse[side], NULL, NULL, NULL, q, q + D, q + 2 * D, NULL,
                                     s, work, wf));
  }
  CHECK_OK(l2l_device_synchronize());
  CHECK(!routed || cudnn_runs() == before + 2, "%s: cuDNN ran %lld calls, want 2", what,
        (long long)(cudnn_runs() - before));
  /* cuda_twins.h's 16-bit tolerances (inputs, P and dS rounded) plus the 16-bit rounding of
     the outputs cuDNN writes (o, dq, dk, dv: 2^-8 relative for bf16, 2^-11 for f16) */
  double f = precision == L2L_F16 ? 0.25 : 1.0, out = precision == L2L_F16 ? 0x1p-11 : 0x1p-8;
  char label[200];
  snprintf(label, sizeof label, "%s: o", what);
  close_to(label, o[0], o[1], N, D, D, 0, f * TOL_ATTN16_ELEMENT[ATTN_VALUES] + out,
           f * TOL_ATTN16_NORM[ATTN_VALUES] + out);
  snprintf(label, sizeof label, "%s: lse", what);
  close_to(label, lse_t[0], lse_t[1], 1, rows, rows, 1, f * TOL_ATTN16_ELEMENT[ATTN_LSE],
           f * TOL_ATTN16_NORM[ATTN_LSE]);
  static const char *const parts[] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; p++) {
    enum attention_output kind = p == 2 ? ATTN_VALUES : ATTN_DQK;
    snprintf(label, sizeof label, "%s: %s", what, parts[p]);
    close_to(label, g[0], g[1], N, D, 3 * D, p * D, f * TOL_ATTN16_ELEMENT[kind] + out,
             f * TOL_ATTN16_NORM[kind] + out);
  }
  /* what cuDNN does not cover runs on the own kernels: a key mask, dropout, cuDNN off */
  l2l_tensor *hm = HOST(L2L_U8, sh.batch, sh.seq);
  memset(l2l_tensor_data(hm), 1, (size_t)(sh.batch * sh.seq));
  l2l_tensor *key_mask = copied_to(hm, L2L_POOL_DEVICE);
  struct backend_attention_shape dropped = sh;
  dropped.dropout = 0.1f;
  CHECK(!cudnn_routes(&sh, NULL, NULL, NULL, l2l_tensor_data(key_mask)) &&
            !cudnn_routes(&dropped, NULL, NULL, NULL, NULL) &&
            !cudnn_routes(&ref, NULL, NULL, NULL, NULL),
        "%s: a key mask, dropout or f32 products routed to cuDNN", what);
  before = cudnn_runs();
  cudnn_enable(0);
  CHECK_OK(ops->attention_forward(fdata(o[1]), lse[1], NULL, NULL, NULL, q, q + D,
                                  q + 2 * D, NULL, &sh, work, wf));
  cudnn_enable(1);
  CHECK_OK(l2l_device_synchronize());
  CHECK(cudnn_runs() == before, "%s: cuDNN ran while switched off", what);
  snprintf(label, sizeof label, "%s: o, own 16-bit kernels against cuDNN", what);
  close_to(label, o[1], o[0], N, D, D, 0, 2 * f * TOL_ATTN16_ELEMENT[ATTN_VALUES] + out,
           2 * f * TOL_ATTN16_NORM[ATTN_VALUES] + out);
  FREE(hq, hd, qkv, d_o, o[0], o[1], lse_t[0], lse_t[1], g[0], g[1], hm, key_mask, work_t);
}

TEST(cudnn_attention_against_own_kernels) {
  if (!need_cudnn() || !use_gpu()) return;
  for (int d = 0; d < 2; d++)
    for (int causal = 0; causal < 2; causal++)
      for (int t = 0; t < 2; t++) gpu_case(d ? 128 : 64, causal, t ? L2L_F16 : L2L_BF16);
  end_gpu();
}

/* One forward and backward of drawn f32 q, k, v (the packed copies' graphs) on the device
   backend: o, lse (one float into its tensor, as gpu_case's), then dq, dk, dv from
   (o, lse), each into the tensors given. */
struct refusal_case {
  struct backend_attention_shape sh;
  int64_t N, D, rows;
  l2l_tensor *hq, *hd, *qkv, *d_o;
};

static void refusal_forward(const struct refusal_case *c, l2l_tensor *o, l2l_tensor *lse) {
  const float *q = fdata(c->qkv);
  CHECK_OK(backend_for(L2L_POOL_DEVICE)->attention_forward(fdata(o), fdata(lse) + 1, NULL, NULL,
                                                          NULL, q, q + c->D, q + 2 * c->D, NULL,
                                                          &c->sh, NULL, 0));
}

static void refusal_backward(const struct refusal_case *c, l2l_tensor *g, const l2l_tensor *o,
                             const l2l_tensor *lse) {
  const float *q = fdata(c->qkv);
  float *gp = fdata(g);
  CHECK_OK(backend_for(L2L_POOL_DEVICE)->attention_backward(
      gp, gp + c->D, gp + 2 * c->D, fdata(c->d_o), fdata(o), fdata(lse) + 1, NULL, NULL, NULL,
      q, q + c->D, q + 2 * c->D, NULL, &c->sh, NULL, 0));
}

/* A plan cuDNN made and then would not run (cudnn_refuse_next takes the path a real
   refusal takes): the call runs on the own kernels, with their results (to the bit where
   the flash kernels take it: they add in a fixed order; else within the own f32 kernels'
   atomic adds' reordering), cuDNN's count unchanged, and the shape is not routed to cuDNN
   again until its plans are forgotten. Both directions: a refused forward, and a refused
   backward after a forward cuDNN ran (the own backward then reads cuDNN's o and lse). */
TEST(cudnn_attention_refused_plan_runs_on_own_kernels) {
  if (!need_cudnn() || !use_real_gpu()) return;
  struct refusal_case c;
  c.sh = drawn_shape(PICK(64, 128), check_rand_int(0, 1), PICK(L2L_BF16, L2L_F16));
  if (c.sh.seq > 200) c.sh.seq = 200;
  if (cudnn_probe(NULL, 0) <= 91500) c.sh.seq = 128;   /* (what cuDNN covers before 9.16) */
  c.D = c.sh.heads * c.sh.head_dim, c.N = c.sh.batch * c.sh.seq;
  c.rows = c.sh.batch * c.sh.heads * c.sh.seq;
  c.qkv = device_randn(&c.hq, c.N, 3 * c.D), c.d_o = device_randn(&c.hd, c.N, c.D);
  char what[160];
  snprintf(what, sizeof what, "B=%lld H=%lld S=%lld d=%lld%s %s", (long long)c.sh.batch,
           (long long)c.sh.heads, (long long)c.sh.seq, (long long)c.sh.head_dim,
           c.sh.causal ? " causal" : "", l2l_dtype_name(c.sh.precision));
  cudnn_forget_plans();
  if (!CHECK(cudnn_routes(&c.sh, NULL, NULL, NULL, NULL),
             "%s: cuDNN refused the graph on this GPU (its reason: stderr)", what)) {
    FREE(c.hq, c.hd, c.qkv, c.d_o);
    end_gpu();
    return;
  }
  /* index 0: the own kernels (cuDNN off); 1: a refused call */
  l2l_tensor *o[2], *lse[2], *g[2];
  for (int i = 0; i < 2; i++) {
    o[i] = NEW(L2L_POOL_DEVICE, L2L_F32, c.N, c.D), lse[i] = NEW(L2L_POOL_DEVICE, L2L_F32, c.rows + 1);
    g[i] = NEW(L2L_POOL_DEVICE, L2L_F32, c.N, 3 * c.D);
    CHECK_OK(l2l_tensor_fill(o[i], NAN)), CHECK_OK(l2l_tensor_fill(lse[i], NAN));
    CHECK_OK(l2l_tensor_fill(g[i], NAN));
  }
  char label[220];

  /* a refused forward, then the backward it leaves to the own kernels */
  int64_t flash = flash_attention_runs();
  cudnn_enable(0);
  refusal_forward(&c, o[0], lse[0]), refusal_backward(&c, g[0], o[0], lse[0]);
  cudnn_enable(1);
  const int64_t own_flash = flash_attention_runs() - flash;
  /* the own backward's sums: the flash kernels' fixed order, or the f32 kernels' dq atomics
     (S terms a sum, each add's rounding 2^-24 relative) */
  const double tol = own_flash == 2 ? 0.0 : (double)c.sh.seq * 0x1p-23;
  int64_t runs = cudnn_runs();
  flash = flash_attention_runs();
  cudnn_refuse_next(1);
  refusal_forward(&c, o[1], lse[1]);
  CHECK(!cudnn_routes(&c.sh, NULL, NULL, NULL, NULL),
        "%s: a shape whose plan cuDNN refused is still routed to it", what);
  refusal_backward(&c, g[1], o[1], lse[1]);
  CHECK_OK(l2l_device_synchronize());
  cudnn_refuse_next(0);
  CHECK(cudnn_runs() == runs, "%s: cuDNN counted %lld runs for a refused forward and the "
        "backward after it, want 0", what, (long long)(cudnn_runs() - runs));
  CHECK(flash_attention_runs() - flash == own_flash, "%s: the flash kernels ran %lld calls, "
        "want %lld as with cuDNN off", what, (long long)(flash_attention_runs() - flash),
        (long long)own_flash);
  snprintf(label, sizeof label, "%s, refused forward: o against the own kernels'", what);
  close_to(label, o[1], o[0], c.N, c.D, c.D, 0, 0.0, 0.0);
  snprintf(label, sizeof label, "%s, refused forward: lse against the own kernels'", what);
  close_to(label, lse[1], lse[0], 1, c.rows, c.rows, 1, 0.0, 0.0);
  snprintf(label, sizeof label, "%s, refused forward: dq, dk, dv against the own kernels'", what);
  close_to(label, g[1], g[0], c.N, 3 * c.D, 3 * c.D, 0, tol, tol);

  /* forgotten plans route the shape again; cuDNN runs the forward, refuses the backward */
  cudnn_forget_plans();
  CHECK(cudnn_routes(&c.sh, NULL, NULL, NULL, NULL),
        "%s: not routed to cuDNN once its plans are forgotten", what);
  runs = cudnn_runs();
  refusal_forward(&c, o[1], lse[1]);
  CHECK_OK(l2l_tensor_fill(g[1], NAN));
  cudnn_refuse_next(1);
  refusal_backward(&c, g[1], o[1], lse[1]);
  cudnn_enable(0);   /* the own backward on cuDNN's o and lse */
  refusal_backward(&c, g[0], o[1], lse[1]);
  cudnn_enable(1);
  CHECK_OK(l2l_device_synchronize());
  cudnn_refuse_next(0);
  CHECK(cudnn_runs() == runs + 1, "%s: cuDNN counted %lld runs for its forward and a refused "
        "backward, want 1", what, (long long)(cudnn_runs() - runs));
  snprintf(label, sizeof label, "%s, refused backward: dq, dk, dv against the own kernels'", what);
  close_to(label, g[1], g[0], c.N, 3 * c.D, 3 * c.D, 0, tol, tol);
  cudnn_forget_plans();
  FREE(c.hq, c.hd, c.qkv, c.d_o, o[0], o[1], lse[0], lse[1], g[0], g[1]);
  end_gpu();
}

/* ---------------------------------------------------------------- the graphs' numbers, on the CPU */

/* Values of the block's layout for sdpa_eval_set: rows (b*S + s) of ld floats, head h's
   columns from h*hd; `transposed`: the graph's index is (b, h, d, s) (K^T, V^T). */
struct bound {
  const float *base;
  int64_t S, hd, ld;
  bool transposed;
};

static double bound_value(void *ctx, const int64_t i[4]) {
  const struct bound *x = ctx;
  int64_t s = x->transposed ? i[3] : i[2], d = x->transposed ? i[2] : i[3];
  return x->base[(i[0] * x->S + s) * x->ld + i[1] * x->hd + d];
}

/* lse (B*H*S) as the graph's stats (b, h, s, 0). */
struct bound_rows {
  const float *base;
  int64_t H, S;
};

static double rows_value(void *ctx, const int64_t i[4]) {
  const struct bound_rows *x = ctx;
  return x->base[(i[0] * x->H + i[1]) * x->S + i[2]];
}

static double scalar_value(void *ctx, const int64_t i[4]) {
  (void)i;
  return *(const double *)ctx;
}

/* Graph output `uid` (logical (b, h, s, d), or (b, h, s, 0) for rows) against the CPU's
   want in the block's layout (rows: want[(b*H + h)*S + s]), relative to |want| + the
   larger of want's rms and `floor`; tolerances as the GPU test's. */
static void graph_close(const char *what, const struct sdpa_eval *e, int64_t uid,
                        const struct backend_attention_shape *sh, const float *want, int64_t ld,
                        bool rows, double floor, double elem_tol, double norm_tol) {
  const int64_t B = sh->batch, H = sh->heads, S = sh->seq, hd = rows ? 1 : sh->head_dim;
  double sw = 0, se = 0, worst = 0;
  int64_t n = B * H * S * hd, i[4];
  for (int pass = 0; pass < 2; pass++)
    for (i[0] = 0; i[0] < B; i[0]++)
      for (i[1] = 0; i[1] < H; i[1]++)
        for (i[2] = 0; i[2] < S; i[2]++)
          for (i[3] = 0; i[3] < hd; i[3]++) {
            double w = rows ? want[(i[0] * H + i[1]) * S + i[2]]
                            : want[(i[0] * S + i[2]) * ld + i[1] * hd + i[3]];
            if (pass == 0) {
              sw += w * w;
              continue;
            }
            double rms = fmax(sqrt(sw / (double)n), floor) + 1e-30, g = sdpa_eval_get(e, uid, i);
            double err = fabs(g - w);
            se += err * err;
            if (!(err / (fabs(w) + rms) <= worst)) worst = err / (fabs(w) + rms);
          }
  double norm = sqrt(se / (double)n) / (fmax(sqrt(sw / (double)n), floor) + 1e-30);
  CHECK(worst <= elem_tol && norm <= norm_tol,
        "%s: worst element %.3g (tolerance %.3g), normwise %.3g (tolerance %.3g)", what, worst,
        elem_tol, norm, norm_tol);
}

/* l2l's forward and backward graphs evaluated on the CPU (sdpa_eval.c) against the CPU
   backend's f32 attention, for drawn shapes: the graphs' meaning, which no check of
   cuDNN's can show without a GPU. */
TEST(cudnn_graph_math_on_cpu) {
  if (!need_cudnn()) return;
  const struct backend_ops *hops = backend_for(L2L_POOL_HOST);
  struct backend_sdpa_view *view = xmalloc(sizeof *view);
  for (int d = 0; d < 2; d++)
    for (int causal = 0; causal < 2; causal++) {
      struct backend_attention_shape sh = drawn_shape(d ? 128 : 64, causal, PICK(L2L_BF16, L2L_F16));
      sh.qkv_dtype = PICK(L2L_F32, sh.precision);   /* (read in place: the rows' stride) */
      sh.dqkv_dtype = PICK(L2L_F32, sh.precision);  /* (written so too, with q, k, v) */
      sh.batch = PICK(1, 2), sh.heads = PICK(1, 3), sh.seq = PICK(1, 7, 33, 64, 65);
      sh.ld_qkv = 3 * sh.heads * sh.head_dim, sh.ld_o = sh.heads * sh.head_dim;
      const int64_t D = sh.heads * sh.head_dim, N = sh.batch * sh.seq;
      const int64_t rows = sh.batch * sh.heads * sh.seq;
      char what[160];
      snprintf(what, sizeof what, "graph on the CPU: B=%lld H=%lld S=%lld d=%lld%s %s%s%s",
               (long long)sh.batch, (long long)sh.heads, (long long)sh.seq,
               (long long)sh.head_dim, causal ? " causal" : "", l2l_dtype_name(sh.precision),
               sh.qkv_dtype != L2L_F32 ? " q, k, v in place" : "",
               sh.qkv_dtype != L2L_F32 && sh.dqkv_dtype != L2L_F32 ? ", dq, dk, dv too" : "");
      l2l_tensor *qkv = RANDN(1.0, N, 3 * D), *d_o = RANDN(1.0, N, D), *o = NANS(N, D);
      l2l_tensor *lse = NANS(rows), *g = NANS(N, 3 * D);
      int64_t wf = hops->attention_workspace(&sh, 1) * l2l_get_threads();
      int64_t wf0 = hops->attention_workspace(&sh, 0) * l2l_get_threads();
      wf = wf0 > wf ? wf0 : wf;   /* (the forward's and the backward's, in one) */
      l2l_tensor *work = HOST(L2L_F32, wf > 0 ? wf : 1);
      struct backend_attention_shape ref = sh;
      ref.precision = L2L_F32, ref.qkv_dtype = ref.dqkv_dtype = L2L_F32;   /* (the f32 draws themselves) */
      const float *q = fdata(qkv);
      CHECK_OK(hops->attention_forward(fdata(o), fdata(lse), NULL, NULL, NULL, q, q + D, q + 2 * D,
                                       NULL, &ref, fdata(work), wf));
      float *gp = fdata(g);
      CHECK_OK(hops->attention_backward(gp, gp + D, gp + 2 * D, fdata(d_o), fdata(o), fdata(lse),
                                        NULL, NULL, NULL, q, q + D, q + 2 * D, NULL, &ref,
                                        fdata(work), wf));
      double f = sh.precision == L2L_F16 ? 0.25 : 1.0;
      double out = sh.precision == L2L_F16 ? 0x1p-11 : 0x1p-8;
      double scale = sh.scale, hidden = -INFINITY, one = 1.0;
      char label[200];
      /* forward */
      if (!CHECK_OK(cudnn_describe(&sh, 0, view))) break;
      struct sdpa_eval fe;
      sdpa_eval_init(&fe, view);
      struct bound bq = {q, sh.seq, sh.head_dim, 3 * D, false}, bk = {q + D, sh.seq, sh.head_dim, 3 * D, true};
      struct bound bv = {q + 2 * D, sh.seq, sh.head_dim, 3 * D, false};
      sdpa_eval_set(&fe, SDPA_Q, bound_value, &bq);
      sdpa_eval_set(&fe, SDPA_K, bound_value, &bk);
      sdpa_eval_set(&fe, SDPA_V, bound_value, &bv);
      sdpa_eval_set(&fe, SDPA_SCALE, scalar_value, &scale);
      sdpa_eval_set(&fe, SDPA_HIDDEN, scalar_value, &hidden);
      sdpa_eval_run(&fe);
      snprintf(label, sizeof label, "%s: O", what);
      graph_close(label, &fe, SDPA_O, &sh, fdata(o), D, false, 0.0,
                  f * TOL_ATTN16_ELEMENT[ATTN_VALUES] + out, f * TOL_ATTN16_NORM[ATTN_VALUES] + out);
      snprintf(label, sizeof label, "%s: stats (lse)", what);
      /* lse's floor: the scale of one score, scale |q| |k| (~1): with one visible key lse
         is that score, which can be near 0 while its rounding error is not */
      graph_close(label, &fe, SDPA_STATS, &sh, fdata(lse), 0, true, 1.0,
                  f * TOL_ATTN16_ELEMENT[ATTN_LSE], f * TOL_ATTN16_NORM[ATTN_LSE]);
      /* backward, from the CPU forward's o and lse (as the GPU test's backward) */
      if (!CHECK_OK(cudnn_describe(&sh, 1, view))) {
        sdpa_eval_free(&fe);
        break;
      }
      /* dQ, dK, dV written where the runner's pointers say: the block's rows in place (3D
         apart) with q, k, v read so, else packed rows (D apart) in the scratch */
      const int64_t ld_dq = sh.qkv_dtype != L2L_F32 && sh.dqkv_dtype != L2L_F32 ? 3 * D : D;
      for (int p = 0; p < 3; p++) {
        const int64_t uid = p == 0 ? SDPA_DQ : p == 1 ? SDPA_DK : SDPA_DV;
        const int at = sdpa_eval_find(view, uid);
        const int64_t *st = at >= 0 ? view->tensor[at].strides : NULL;
        CHECK(st != NULL && st[0] == sh.seq * ld_dq && st[1] == sh.head_dim && st[2] == ld_dq &&
              st[3] == 1, "%s: the backward's gradient %lld has strides %lld %lld %lld %lld, "
              "want %lld %lld %lld 1", what, (long long)uid, st ? (long long)st[0] : -1LL,
              st ? (long long)st[1] : -1LL, st ? (long long)st[2] : -1LL,
              st ? (long long)st[3] : -1LL, (long long)(sh.seq * ld_dq),
              (long long)sh.head_dim, (long long)ld_dq);
      }
      struct sdpa_eval be;
      sdpa_eval_init(&be, view);
      struct bound bvt = bv, bo = {fdata(o), sh.seq, sh.head_dim, D, false};
      struct bound bdo = {fdata(d_o), sh.seq, sh.head_dim, D, false};
      bvt.transposed = true;
      sdpa_eval_set(&be, SDPA_Q, bound_value, &bq);
      sdpa_eval_set(&be, SDPA_K, bound_value, &bk);
      sdpa_eval_set(&be, SDPA_V, bound_value, &bvt);
      sdpa_eval_set(&be, SDPA_O, bound_value, &bo);
      sdpa_eval_set(&be, SDPA_DO, bound_value, &bdo);
      struct bound_rows bl = {fdata(lse), sh.heads, sh.seq};
      sdpa_eval_set(&be, SDPA_STATS, rows_value, &bl);
      sdpa_eval_set(&be, SDPA_SCALE, scalar_value, &scale);
      sdpa_eval_set(&be, SDPA_HIDDEN, scalar_value, &hidden);
      sdpa_eval_set(&be, SDPA_ONE, scalar_value, &one);
      sdpa_eval_run(&be);
      static const char *const parts[] = {"dQ", "dK", "dV"};
      static const int64_t uids[] = {SDPA_DQ, SDPA_DK, SDPA_DV};
      /* a query that sees one key (S = 1, row 0 when causal) has dS = dP - Dsum = 0 up to
         rounding: its dq and the key's dk are noise, held to a tenth of dv's scale */
      double dv_sq = 0;
      for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < D; c++) dv_sq += (double)gp[r * 3 * D + 2 * D + c] * gp[r * 3 * D + 2 * D + c];
      double dv_rms = sqrt(dv_sq / (double)(N * D));
      for (int p = 0; p < 3; p++) {
        enum attention_output kind = p == 2 ? ATTN_VALUES : ATTN_DQK;
        snprintf(label, sizeof label, "%s: %s", what, parts[p]);
        graph_close(label, &be, uids[p], &sh, gp + p * D, 3 * D, false, p == 2 ? 0.0 : 0.1 * dv_rms,
                    f * TOL_ATTN16_ELEMENT[kind] + out, f * TOL_ATTN16_NORM[kind] + out);
      }
      sdpa_eval_free(&fe);
      sdpa_eval_free(&be);
      FREE(qkv, d_o, o, lse, g, work);
    }
  free(view);
}

/* The GPU's attention with q, k, v and o in 16 bits (as the block keeps them on a 16-bit
   run) against itself on their f32 copies (attention_io16.c): frugal cases through cuDNN
   where it is loaded (q, k, v read in place by graphs with their row stride, o its graph's
   O in place or copied at a row stride past the heads), standard ones and cuDNN switched
   off through the own kernels (frugal: the flash kernels, 16-bit tensors read in place or,
   where their rows are not 16-byte aligned, from packed copies; standard: the fp32 kernels
   through fp32 rows in the scratch; q, k, v in three buffers too, and rows not 16-byte
   aligned, which cuDNN then reads from packed copies). Within two
   16-bit ulps and 1e-5, not to the bit: the in-place graphs may run other engines than the packed ones,
   and the backward's sums may be ordered differently from run to run. Where cuDNN 9.16 or
   later is loaded it must have run. */
TEST(cudnn_attention_reads_and_writes_16_bits) {
  if (!use_gpu()) return;
  const int64_t before = cudnn_runs(), flash_before = flash_attention_runs();
  for (int i = 0; i < 16; i++) {
    cudnn_enable(i < 8);
    attention_io16_check(L2L_POOL_DEVICE, i & 2 ? L2L_BF16 : L2L_F16, i & 1, false);
  }
  cudnn_enable(1);
  /* the frugal cases with cuDNN off: the flash kernels, reading 16-bit q, k, v and do in
     place where aligned */
  if (cuda_probe(NULL, 0) && flash_env_on())
    CHECK(flash_attention_runs() >= flash_before + 8, "the flash kernels ran %lld calls, want 8 or more",
          (long long)(flash_attention_runs() - flash_before));
  /* (before 9.16: only S a multiple of 128; a dry run has no GPU for cuDNN) */
  if (cuda_probe(NULL, 0) && l2l_cudnn_available(NULL, 0) > 91500)
    CHECK(cudnn_runs() > before, "cuDNN is loaded but ran none of the frugal cases");
  end_gpu();
}
