/* SPDX-License-Identifier: MIT */
/* test_optim_emulated.c — the GPU's updates of a record placed on the device
 * (kernels/optim.cu), their own source run on the CPU by optim_emulated.cpp, against the
 * CPU backend's ops of the same names.
 *
 * Purpose: a record on the device (issue 49) takes these kernels every step: its gradients'
 * adds with the flag an update's skip reads, per-layer clipping's factor, and one update by
 * SGD (without momentum, with it, with Nesterov's), AdamW or LAMB on an f32 or bf16 master and
 * f32, bf16 or 8-bit state; and the file is changed where no GPU runs it. Here the
 * launchers plan as on a GPU, with three blocks for the grid-stride loops, LAMB's partial
 * sums and the compact update's state blocks (so a record of four state blocks walks the
 * stride), at drawn sizes, steps and seeds, with the step's constants from the one function
 * the CUDA backend takes them from (optim_kernel_consts). Held to the CPU's as the GPU test
 * (test_cuda_records.c) holds the GPU's: an f32 master, f32 state, the accumulators and the
 * clipping factor within TOL_F32 of their scale (the library contracts products into FMAs,
 * this emulation does not), a bf16 master's and compact state's codes the CPU's or their
 * neighbours (state_neighbours), the gradient cleared bit for bit, the flags the CPU's; an
 * update whose flag is set leaves every byte of the master and state as it was.
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "optim_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

/* n bytes of malloc (at least one) holding a copy of src. */
static void *copy_of(const void *src, size_t n) {
  void *p = xmalloc(n > 0 ? n : 1);
  memcpy(p, src, n);
  return p;
}

/* Gradients added into an accumulator (f32 and a 16-bit one, scaled), per-layer clipping's
   factor of `count` gradients (some empty) found by the kernels, a third add scaled by it
   where it lies; then the flag: a sum at or past the limit sets it on both sides, the
   largest below it does not, and an add given no flag reads none. */
static bool adds_case(int64_t n) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const l2l_dtype half = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  float *acc = host_normals(n, 1.0), *g32 = host_normals(n, 1.0), *f = host_normals(n, 1.0);
  uint16_t *g16 = xmalloc((size_t)(n > 0 ? n : 1) * 2);
  for (int64_t i = 0; i < n; i++) g16[i] = round16(f[i], half);
  float *got = copy_of(acc, (size_t)n * 4);
  int32_t flag_want = 0, flag_got = 0;
  bool ok = true;
  char what[160];
  snprintf(what, sizeof what, "grad_add n %lld (f32, then %s)", (long long)n, l2l_dtype_name(half));
  ok &= CHECK_OK(cpu->grad_add(acc, g32, L2L_F32, 1.0f, NULL, n, &flag_want));
  ok &= CHECK_OK(cpu->grad_add(acc, g16, half, 0.25f, NULL, n, &flag_want));
  ok &= CHECK(emu_k_grad_add(got, g32, (int)L2L_F32, 1.0f, NULL, n, &flag_got, NULL) == 0 &&
                  emu_k_grad_add(got, g16, (int)half, 0.25f, NULL, n, &flag_got, NULL) == 0,
              "%s: the launches", what);
  ok &= CHECK_CLOSE(what, got, acc, n, RMS, TOL_F32);

  /* clipping's factor over up to 5 gradients of drawn sizes (one empty at times) and types,
     the clip a third of their norm so that it clips */
  const int count = (int)check_rand_int(1, 5);
  const void *g[5];
  l2l_dtype types[5];
  int dtypes[5];
  int64_t sizes[5];
  double sumsq = 0;
  for (int k = 0; k < count; k++) {
    sizes[k] = check_rand_int(0, 4) == 0 ? 0 : check_rand_int(1, n);
    types[k] = k % 2 ? half : L2L_F32;
    dtypes[k] = (int)types[k];
    g[k] = k % 2 ? (const void *)g16 : (const void *)g32;
    for (int64_t i = 0; i < sizes[k]; i++) {
      const double x = k % 2 ? (double)widen16(g16[i], half) : (double)g32[i];
      sumsq += x * x;
    }
  }
  const float clip = (float)(sqrt(sumsq) / 3);
  float word_want = NAN, word_got = NAN;
  double *scratch = xmalloc(L2L_K_CLIP_SCRATCH_DOUBLES * sizeof(double));
  for (int i = 0; i < L2L_K_CLIP_SCRATCH_DOUBLES; i++) scratch[i] = NAN;
  ok &= CHECK_OK(cpu->clip_scale(&word_want, g, types, sizes, count, clip));
  ok &= CHECK(emu_k_clip_scale(&word_got, g, dtypes, sizes, count, clip, scratch, NULL) == 0,
              "clip_scale of %d gradients: the launch", count);
  ok &= CHECK(fabsf(word_got - word_want) <= TOL_F32 * fabsf(word_want),
              "clip_scale of %d gradients (clip %g): %.9g, want %.9g", count, (double)clip,
              (double)word_got, (double)word_want);
  ok &= CHECK(sumsq == 0 || word_want < 1.0f, "clip_scale: a factor of %g, want one below 1 "
              "(the clip a third of the norm)", (double)word_want);
  /* the factor read where it lies: the scale given beside it is not used */
  ok &= CHECK_OK(cpu->grad_add(acc, g32, L2L_F32, 7.0f, &word_want, n, &flag_want));
  ok &= CHECK(emu_k_grad_add(got, g32, (int)L2L_F32, 7.0f, &word_got, n, &flag_got, NULL) == 0,
              "%s: the clipped add's launch", what);
  ok &= CHECK_CLOSE("grad_add scaled by the clipping factor", got, acc, n, RMS, TOL_F32);
  ok &= CHECK(flag_want == 0 && flag_got == 0, "%s: finite sums set the flags: %d (CPU), %d "
              "(kernel)", what, flag_want, flag_got);

  /* each sum at or past the limit (2^63, an inf, a NaN) sets the flag, and the largest float
     below it does not; an add given no flag (on a copy) reads none */
  static const float sums[] = {0x1p63f, INFINITY, NAN, 0x1.fffffep62f};
  for (int k = 0; k < 4 && n > 0; k++) {
    const int64_t at = check_rand_int(0, n - 1);
    const float kept = g32[at];
    g32[at] = sums[k], acc[at] = got[at] = 0.0f;
    float *spare = copy_of(got, (size_t)n * 4);
    ok &= CHECK(emu_k_grad_add(spare, g32, (int)L2L_F32, 1.0f, NULL, n, NULL, NULL) == 0,
                "%s: the launch with no flag", what);
    ok &= CHECK_OK(cpu->grad_add(acc, g32, L2L_F32, 1.0f, NULL, n, &flag_want));
    ok &= CHECK(emu_k_grad_add(got, g32, (int)L2L_F32, 1.0f, NULL, n, &flag_got, NULL) == 0,
                "%s: the launch with a flag", what);
    const int32_t flag = k < 3;
    ok &= CHECK(flag_want == flag && flag_got == flag, "%s: flags %d (CPU) and %d (kernel) after "
                "a sum of %a at [%lld], want %d", what, flag_want, flag_got, (double)sums[k],
                (long long)at, flag);
    g32[at] = kept, acc[at] = got[at] = 0.0f, flag_want = flag_got = 0;   /* (each case alone) */
    free(spare);
  }
  free(acc), free(g32), free(f), free(g16), free(got), free(scratch);
  return ok;
}

/* Copies of a record: the master p (f32 or bf16) and its state arrays in their precision. */
struct record_copy {
  void *p, *s[2];
};

static struct record_copy record_dup(const struct record_copy *r, size_t p_bytes, size_t s_bytes) {
  struct record_copy c = {copy_of(r->p, p_bytes), {NULL, NULL}};
  for (int a = 0; a < 2; a++)
    if (r->s[a] != NULL) c.s[a] = copy_of(r->s[a], s_bytes);
  return c;
}

static void record_free(struct record_copy *r) { free(r->p), free(r->s[0]), free(r->s[1]); }

/* The kernels' update of (r, grad) by h, as the CUDA backend launches it (cuda_ops.c's
   optim_update_locked: the kernel and its constants from optim_kernel_state and _consts);
   skip as given. */
static bool emulated_update(struct record_copy *r, float *grad, int64_t n,
                            const struct optim_hyper *h, const int32_t *skip) {
  struct k_optim o;
  optim_kernel_consts(&o, h);
  double *scratch = xmalloc(L2L_K_OPTIM_SCRATCH_DOUBLES * sizeof(double));
  for (int i = 0; i < L2L_K_OPTIM_SCRATCH_DOUBLES; i++) scratch[i] = NAN;
  int root[2], status;
  const int precision = optim_kernel_state(h, root);
  if (precision < 0) {
    status = emu_k_optim_update(r->p, r->s[0], r->s[1], grad, n, &o, skip, scratch, NULL);
  } else {
    status = emu_k_optim_update_compact(r->p, r->s[0], r->s[1], precision,
                                        (int64_t)state8_codes_bytes(n), root, grad, n, &o,
                                        optim_code_values(OPTIM_CODE_SIGNED),
                                        optim_code_values(OPTIM_CODE_ROOT), skip, scratch, NULL);
  }
  free(scratch);
  return CHECK(status == 0, "the update's launch: %d", status);
}

/* The updates tested: SGD without momentum (no state), with momentum, with Nesterov
   momentum; AdamW; LAMB. */
enum variant { PLAIN_SGD, MOMENTUM_SGD, NESTEROV_SGD, ADAMW, LAMB, VARIANTS };

/* One update of a record of n elements by `variant` on a master of `master` and state in
   `state`, the kernels' against the CPU backend's; then, its flag set, one that changes
   nothing but the gradient. */
static bool update_case(enum variant variant, l2l_dtype master, l2l_state_precision state,
                        int64_t n) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const bool sgd = variant <= NESTEROV_SGD;
  const l2l_optimizer_kind kind = sgd ? L2L_OPTIMIZER_SGD
                                  : variant == ADAMW ? L2L_OPTIMIZER_ADAMW : L2L_OPTIMIZER_LAMB;
  struct optim_hyper h = {.kind = kind, .lr = (float)(1e-3 * check_rand_int(1, 30)),
                          .weight_decay = (float)(0.01 * check_rand_int(1, 10)),
                          .momentum = variant == PLAIN_SGD ? 0.0f : 0.9f,
                          .nesterov = variant == NESTEROV_SGD, .beta1 = 0.9f, .beta2 = 0.99f,
                          .eps = 1e-6f, .t = check_rand_int(1, 5),
                          .grad_scale = check_rand_int(0, 1) ? 0.5f : 1.0f, .state = state,
                          .master = master, .seed = check_rand_u64(), .stream = check_rand_u64(),
                          .first_draw = check_rand_u64() >> 4};
  const int arrays = sgd ? h.momentum != 0.0f : 2;
  const size_t p_bytes = (size_t)n * l2l_dtype_size(master);
  const size_t s_bytes = (size_t)host_state_bytes(state, n);
  char what[160];
  snprintf(what, sizeof what, "%s, master %s, state %s, n %lld, t %lld, momentum %g, nesterov %d",
           sgd ? "SGD" : kind == L2L_OPTIMIZER_ADAMW ? "AdamW" : "LAMB", l2l_dtype_name(master),
           state == L2L_STATE_F32 ? "f32" : state == L2L_STATE_BF16 ? "bf16" : "8-bit",
           (long long)n, (long long)h.t, (double)h.momentum, h.nesterov);

  struct record_copy want = {NULL, {NULL, NULL}};
  float *p32 = host_normals(n, 1.0);
  want.p = xmalloc(p_bytes > 0 ? p_bytes : 1);
  int64_t unused;
  CHECK_OK(cpu->convert(want.p, master, p32, L2L_F32, n, &unused));
  for (int a = 0; a < arrays; a++) {
    float *f = host_normals(n, 0.1);
    if (a == 1)
      for (int64_t i = 0; i < n; i++) f[i] *= f[i];   /* (a second moment) */
    want.s[a] = xmalloc(s_bytes > 0 ? s_bytes : 1);
    optim_state_encode(want.s[a], n, 0, f, n, state, optim_state_code(kind, a));
    free(f);
  }
  struct record_copy got = record_dup(&want, p_bytes, s_bytes);
  float *g_want = host_normals(n, 1.0), *g_got = copy_of(g_want, (size_t)n * 4);
  const int32_t go = 0;
  bool ok = CHECK_OK(cpu->optim_update(want.p, want.s[0], want.s[1], g_want, n, &h, &go));
  ok &= emulated_update(&got, g_got, n, &h, &go);
  if (master == L2L_BF16)
    ok &= state_neighbours(want.p, got.p, n, L2L_STATE_BF16, OPTIM_CODE_SIGNED, what);
  else if (variant == LAMB && state != L2L_STATE_F32)   /* (its step from the state re-encoded) */
    ok &= lamb_master_close(what, got.p, want.p, p32, got.s, want.s, n, &h);
  else
    ok &= CHECK_CLOSE(what, (const float *)got.p, (const float *)want.p, n, RMS, TOL_F32);
  for (int a = 0; a < arrays; a++)
    ok &= state_neighbours(want.s[a], got.s[a], n, state, optim_state_code(kind, a), what);
  float *zeros = host_floats(n, 0.0f);
  ok &= CHECK(memcmp(g_want, zeros, (size_t)n * 4) == 0 && memcmp(g_got, zeros, (size_t)n * 4) == 0,
              "%s: the gradient not cleared", what);

  /* skipped: the master and the state as they were, the gradient cleared */
  struct record_copy before = record_dup(&got, p_bytes, s_bytes);
  float *g = host_normals(n, 1.0);
  const int32_t skip = (int32_t)check_rand_int(1, 1000);
  ok &= emulated_update(&got, g, n, &h, &skip);
  ok &= CHECK(memcmp(before.p, got.p, p_bytes) == 0, "%s: an update its flag skips moved the master", what);
  for (int a = 0; a < arrays; a++)
    ok &= CHECK(memcmp(before.s[a], got.s[a], s_bytes) == 0,
                "%s: an update its flag skips changed state array %d", what, a);
  ok &= CHECK(memcmp(g, zeros, (size_t)n * 4) == 0, "%s: a skipped update's gradient not cleared", what);
  record_free(&want), record_free(&got), record_free(&before);
  free(p32), free(g_want), free(g_got), free(zeros), free(g);
  return ok;
}

#endif /* L2L_KERNEL_EMULATION */

TEST(optim_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* a few elements, and past three blocks' strides: 768 threads, four state blocks */
  const int64_t sizes[2] = {check_rand_int(1, 40), 3 * L2L_STATE_BLOCK + check_rand_int(1, L2L_STATE_BLOCK)};
  int failed = 0;
  for (int s = 0; s < 2; s++) failed += !adds_case(sizes[s]);
  for (int s = 0; s < 2 && failed < 3; s++)
    for (int master = 0; master < 2; master++)
      for (int st = 0; st <= 2; st++)
        for (int v = 0; v < VARIANTS; v++)
          failed += !update_case((enum variant)v, master ? L2L_BF16 : L2L_F32,
                                 (l2l_state_precision)st, sizes[s]);
#endif
}
