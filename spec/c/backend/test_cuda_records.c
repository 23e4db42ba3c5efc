/* SPDX-License-Identifier: MIT */
/* test_cuda_records.c — a record placed on the device (issue 49): the ops its gradient's
 * adds and its updates take (grad_add, clip_scale, optim_update on f32, bf16 and 8-bit
 * state, f32 and bf16 masters), the CUDA
 * backend's against the CPU backend's on the same arrays. test_cuda.c says how the GPU
 * tests test; the harness and the tolerances are cuda_twins.h's. Skipped without a GPU;
 * run in a dry run (L2L_TEST_CUDA_DRY_RUN=1). All test names start with "cuda_".
 * Must never: read a device tensor's memory on the CPU, or leave a device tensor or the
 * CUDA backend switched on behind it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_twins.h"

/* ================================================================ a record on the device */

TEST(cuda_records_on_the_device_update_as_the_cpu) {
  /* The ops a record placed on the device takes (grad_add, clip_scale, optim_update), the
     CUDA backend's against the CPU backend's on the same arrays: two gradients added (f32,
     then bf16 widened), per-layer clipping's factor of the two found on the device and a
     third add scaled by it there, one update, for SGD with Nesterov momentum, AdamW and LAMB (whose trust
     ratio sums the whole record: a size past one chunk). The device contracts products
     into FMAs where the host does not (kernels/optim.cu): within TOL_F32 of the
     parameters' and state's scale. Then the flag: an inf and a 2^63 set it on both sides,
     a NULL flag is left alone, and an update whose flag is set leaves the record as it
     was and clears its gradient. */
  if (!use_gpu()) return;
  const struct backend_ops *sides[2] = {&cpu_backend, backend_for(L2L_POOL_DEVICE)};
  static const int64_t sizes[] = {1, 7 * 13, (1 << 18) + 4099};
  static const l2l_optimizer_kind kinds[] = {L2L_OPTIMIZER_SGD, L2L_OPTIMIZER_ADAMW,
                                             L2L_OPTIMIZER_LAMB};
  for (int s = 0; s < 3; s++)
    for (int o = 0; o < 3; o++) {
      int64_t n = sizes[s];
      bool sgd = kinds[o] == L2L_OPTIMIZER_SGD;
      struct optim_hyper h = {.kind = kinds[o], .lr = 1e-2f, .weight_decay = 0.05f,
                              .momentum = 0.9f, .nesterov = 1, .beta1 = 0.9f, .beta2 = 0.99f,
                              .eps = 1e-6f, .t = 3, .grad_scale = 0.5f};
      struct twin p = twin_of(RANDN(1.0, n)), m = twin_of(RANDN(0.1, n)), g = twin_of(RANDN(0.0, n));
      l2l_tensor *v0 = RANDN(0.1, n);
      for (int64_t i = 0; i < n; i++) fdata(v0)[i] *= fdata(v0)[i];   /* (a second moment) */
      struct twin v = twin_of(v0), g32 = twin_of(RANDN(1.0, n)), flag = twin_of(HOST(L2L_I32, 1));
      struct twin g16 = twin_of(cast_on_host(RANDN(1.0, n), L2L_BF16));
      idata(flag.h)[0] = 0;
      CHECK_OK(l2l_tensor_fill(flag.d, 0.0));
      struct twin word = twin_of(HOST(L2L_F32, 1));   /* (per-layer clipping's factor) */
      double g32_sq = 0;   /* a third of the f32 gradient's norm: at most a third of both's */
      for (int64_t i = 0; i < n; i++) g32_sq += (double)fdata(g32.h)[i] * fdata(g32.h)[i];
      float clip = (float)(sqrt(g32_sq) / 3);
      SIDES {
        const struct backend_ops *ops = sides[side];
        const void *both[2] = {l2l_tensor_data(AT(g32)), l2l_tensor_data(AT(g16))};
        const l2l_dtype dtypes[2] = {L2L_F32, L2L_BF16};
        const int64_t ns[2] = {n, n};
        OK_ON(ops->grad_add(fdata(AT(g)), fdata(AT(g32)), L2L_F32, 1.0f, NULL, n, idata(AT(flag))));
        OK_ON(ops->grad_add(fdata(AT(g)), l2l_tensor_data(AT(g16)), L2L_BF16, 0.25f, NULL, n,
                            idata(AT(flag))));
        OK_ON(ops->clip_scale(fdata(AT(word)), both, dtypes, ns, 2, clip));
        /* (the factor read where it is: the scale given beside it is not used) */
        OK_ON(ops->grad_add(fdata(AT(g)), fdata(AT(g32)), L2L_F32, 7.0f, fdata(AT(word)), n,
                            idata(AT(flag))));
        OK_ON(ops->optim_update(fdata(AT(p)), fdata(AT(m)), sgd ? NULL : fdata(AT(v)), fdata(AT(g)),
                                n, &h, idata(AT(flag))));
      }
      CHECK(fdata(word.h)[0] > 0.0f && fdata(word.h)[0] < 1.0f, "n %lld: a clipping factor of %g "
            "on the host, want one below 1", (long long)n, (double)fdata(word.h)[0]);
      CHECK_TWIN("per-layer clipping's factor", word, RMS, TOL_F32);
      char what[96];
      snprintf(what, sizeof what, "optimizer %d, n %lld: p", (int)kinds[o], (long long)n);
      CHECK_TWIN(what, p, RMS, TOL_F32);
      snprintf(what, sizeof what, "optimizer %d, n %lld: state", (int)kinds[o], (long long)n);
      CHECK_TWIN(what, m, RMS, TOL_F32);
      snprintf(what, sizeof what, "optimizer %d, n %lld: the gradient, cleared", (int)kinds[o], (long long)n);
      CHECK_TWIN_BITS(what, g);
      l2l_tensor *clean = copied_to(flag.d, L2L_POOL_HOST);
      CHECK(idata(flag.h)[0] == 0 && idata(clean)[0] == 0, "n %lld: finite sums set the flags: "
            "%d (host), %d (device)", (long long)n, idata(flag.h)[0], idata(clean)[0]);
      l2l_tensor_free(clean);
      /* the flag: an inf (or 2^63) added sets it; the update it skips changes nothing */
      fdata(g32.h)[n / 2] = s == 1 ? 0x1p63f : INFINITY;
      l2l_tensor_free(g32.d);
      g32.d = copied_to(g32.h, L2L_POOL_DEVICE);
      l2l_tensor *before = copied_to(p.d, L2L_POOL_HOST);
      SIDES {
        const struct backend_ops *ops = sides[side];
        OK_ON(ops->grad_add(fdata(AT(g)), fdata(AT(g32)), L2L_F32, 1.0f, NULL, n, NULL));
        OK_ON(ops->grad_add(fdata(AT(g)), fdata(AT(g32)), L2L_F32, 1.0f, NULL, n, idata(AT(flag))));
        OK_ON(ops->optim_update(fdata(AT(p)), fdata(AT(m)), sgd ? NULL : fdata(AT(v)), fdata(AT(g)),
                                n, &h, idata(AT(flag))));
      }
      l2l_tensor *flag_d = copied_to(flag.d, L2L_POOL_HOST), *after = copied_to(p.d, L2L_POOL_HOST);
      CHECK(idata(flag.h)[0] == 1 && idata(flag_d)[0] == 1, "n %lld: flags %d (host) and %d "
            "(device) after a sum of %g, want 1", (long long)n, idata(flag.h)[0], idata(flag_d)[0],
            (double)fdata(g32.h)[n / 2]);
      CHECK(memcmp(l2l_tensor_data(before), l2l_tensor_data(after), (size_t)n * sizeof(float)) == 0,
            "n %lld: an update its flag skips moved the device's parameters", (long long)n);
      CHECK_TWIN_BITS("a skipped update's gradient, cleared", g);
      l2l_tensor_free(before), l2l_tensor_free(after), l2l_tensor_free(flag_d);
      TWIN_FREE(&p, &m, &v, &g, &g32, &g16, &flag, &word);
    }
  end_gpu();
}

TEST(cuda_records_on_the_device_update_compact_state_as_the_cpu) {
  /* optim_update on bf16 and 8-bit state, and on a bf16 master beside state in any
     precision (the CUDA backend's fused kernel, which decodes a block, steps it in f32,
     encodes it again and rounds the master back stochastically by its Philox draws) against
     the CPU backend's (the host's own decode, kernels, encode and rounding), for SGD with
     Nesterov momentum, AdamW and LAMB, on a record of a few blocks and one past a chunk: an
     f32 master and f32 state within TOL_F32 of their scale (LAMB's master on compact state
     as lamb_master_close says), each bf16 master's and compact
     state's code the host's or its neighbour (state_neighbours, cuda_twins.h: a value an
     ulp apart that the same draw rounds to the next bf16); then an update whose flag is set
     leaves the parameters and every state byte as they were. */
  if (!use_gpu()) return;
  const struct backend_ops *sides[2] = {&cpu_backend, backend_for(L2L_POOL_DEVICE)};
  static const int64_t sizes[] = {3 * L2L_STATE_BLOCK + 77, (1 << 18) + 4099};
  static const l2l_optimizer_kind kinds[] = {L2L_OPTIMIZER_SGD, L2L_OPTIMIZER_ADAMW,
                                             L2L_OPTIMIZER_LAMB};
  for (int bf16 = 0; bf16 < 2; bf16++)
  for (int st = !bf16; st <= 2; st++)   /* (f32 master and state: the test above) */
    for (int s = 0; s < 2; s++)
      for (int o = 0; o < 3; o++) {
        l2l_state_precision state = (l2l_state_precision)st;
        int64_t n = sizes[s];
        int arrays = kinds[o] == L2L_OPTIMIZER_SGD ? 1 : 2;
        struct optim_hyper h = {.kind = kinds[o], .lr = 1e-2f, .weight_decay = 0.05f,
                                .momentum = 0.9f, .nesterov = 1, .beta1 = 0.9f, .beta2 = 0.99f,
                                .eps = 1e-6f, .t = 3, .grad_scale = 0.5f, .state = state,
                                .master = bf16 ? L2L_BF16 : L2L_F32, .seed = check_rand_u64(),
                                .stream = check_rand_u64(), .first_draw = check_rand_u64() >> 4};
        l2l_tensor *p0 = RANDN(1.0, n);
        struct twin p = twin_of(bf16 ? cast_on_host(p0, L2L_BF16) : p0);
        struct twin g = twin_of(RANDN(1.0, n)), flag = twin_of(HOST(L2L_I32, 1));
        struct twin arr[2] = {{0}, {0}};
        int64_t bytes = (int64_t)host_state_bytes(state, n);
        for (int a = 0; a < arrays; a++) {
          l2l_tensor *f = RANDN(0.1, n);
          if (a == 1)
            for (int64_t i = 0; i < n; i++) fdata(f)[i] *= fdata(f)[i];   /* (a second moment) */
          l2l_tensor *coded = bytes_of(bytes, 0);
          optim_state_encode(bdata(coded), n, 0, fdata(f), n, state, optim_state_code(kinds[o], a));
          arr[a] = twin_of(coded);
          l2l_tensor_free(f);
        }
        idata(flag.h)[0] = 0;
        CHECK_OK(l2l_tensor_fill(flag.d, 0.0));
        l2l_tensor *p_start = copied_to(p.h, L2L_POOL_HOST);
        SIDES {
          OK_ON(sides[side]->optim_update(l2l_tensor_data(AT(p)), bdata(AT(arr[0])), bdata(AT(arr[1])),
                                          fdata(AT(g)), n, &h, idata(AT(flag))));
        }
        char what[96];
        snprintf(what, sizeof what, "master %s, state %d, optimizer %d, n %lld",
                 bf16 ? "bf16" : "f32", st, (int)kinds[o], (long long)n);
        if (bf16) {
          l2l_tensor *back = copied_to(p.d, L2L_POOL_HOST);
          state_neighbours(l2l_tensor_data(p.h), l2l_tensor_data(back), n, L2L_STATE_BF16,
                     OPTIM_CODE_SIGNED, what);
          l2l_tensor_free(back);
        } else if (kinds[o] == L2L_OPTIMIZER_LAMB && state != L2L_STATE_F32) {
          /* (its step from the state each side re-encoded: lamb_master_close) */
          l2l_tensor *back = copied_to(p.d, L2L_POOL_HOST);
          l2l_tensor *s_back[2] = {copied_to(arr[0].d, L2L_POOL_HOST), copied_to(arr[1].d, L2L_POOL_HOST)};
          void *const s_got[2] = {bdata(s_back[0]), bdata(s_back[1])};
          void *const s_want[2] = {bdata(arr[0].h), bdata(arr[1].h)};
          lamb_master_close(what, fdata(back), fdata(p.h), fdata(p_start), s_got, s_want, n, &h);
          FREE(back, s_back[0], s_back[1]);
        } else {
          CHECK_TWIN(what, p, RMS, TOL_F32);
        }
        l2l_tensor_free(p_start);
        CHECK_TWIN_BITS("the gradient, cleared", g);
        for (int a = 0; a < arrays; a++) {
          l2l_tensor *back = copied_to(arr[a].d, L2L_POOL_HOST);
          state_neighbours(bdata(arr[a].h), bdata(back), n, state, optim_state_code(kinds[o], a), what);
          l2l_tensor_free(back);
        }
        /* skipped: nothing moves */
        CHECK_OK(l2l_tensor_fill(flag.d, 1.0));
        l2l_tensor *before[3] = {copied_to(p.d, L2L_POOL_HOST), copied_to(arr[0].d, L2L_POOL_HOST),
                                 arrays > 1 ? copied_to(arr[1].d, L2L_POOL_HOST) : NULL};
        CHECK_OK(sides[1]->optim_update(l2l_tensor_data(p.d), bdata(arr[0].d), bdata(arr[1].d),
                                        fdata(g.d), n, &h, idata(flag.d)));
        const l2l_tensor *now[3] = {p.d, arr[0].d, arrays > 1 ? arr[1].d : NULL};
        for (int k = 0; k < 3; k++) {
          if (before[k] == NULL) continue;
          l2l_tensor *after = copied_to(now[k], L2L_POOL_HOST);
          size_t size = (size_t)l2l_tensor_numel(after) * elem_size(after);
          CHECK(memcmp(l2l_tensor_data(before[k]), l2l_tensor_data(after), size) == 0,
                "%s: an update its flag skips changed array %d", what, k);
          l2l_tensor_free(after), l2l_tensor_free(before[k]);
        }
        TWIN_FREE(&p, &g, &flag, &arr[0], &arr[1]);
      }
  end_gpu();
}
