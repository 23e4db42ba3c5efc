/* SPDX-License-Identifier: MIT */
/* attention_ops.c — the CUDA ops table's attention entries: cuDNN's fused SDPA where it
 * routes the call (cudnn_sdpa.c), else l2l's own kernels (kernels/attention.h): the flash
 * kernels on tensor cores where the products are 16-bit and no standard-mode rows are
 * kept, the fp32 kernels for the rest.
 *
 * Purpose: split from cuda_ops.c along its attention seam. The flash kernels read 16-bit
 * q, k, v and do as they lie (cast or copied into the scratch where they are f32 or not
 * 16-byte aligned) and write o and dq, dk, dv in f32 or 16 bits. The fp32 kernels read
 * and write fp32, so 16-bit tensors go through fp32 rows in the backend's scratch. cuDNN's
 * path takes the scratch for its 16-bit copies and workspace.
 * Must never: take cuda_rt.lock twice (the entries take it once, as cuda_ops.c's ops do).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef L2L_CUDA

#include "runtime.h"
#include "cudnn_sdpa.h"

#include "kernels/attention.h"
#include "kernels/cast_rows.h"
#include "kernels/dtype.h"

/* ---------------------------------------------------------------- attention */

/* The launchers take no per-thread workspace: the backward's row terms D = do . o go to
   the backend's scratch. */
int64_t cuda_attention_workspace(const struct backend_attention_shape *sh, int backward) {
  (void)sh, (void)backward;
  return 0;
}

/* The own kernels read and write an f32 o, read f32 q, k, v and write f32 dq, dk, dv:
   16-bit ones go through fp32 rows in the scratch (their row strides; rounded up to 64
   floats), cast there or back. Three tensors interleaved in one buffer (k and v a
   head-rows' width after q, as the block keeps q, k, v and dq, dk, dv) are cast in one
   kernel and take one region. */
static int64_t up64(int64_t floats) { return (floats + 63) / 64 * 64; }
/* Scratch floats for the fp32 rows of a tensor of o's layout (o, do) when its dtype is
   16-bit (else none). */
static int64_t o_rows_floats(l2l_dtype dtype, const struct backend_attention_shape *sh) {
  return dtype == L2L_F32 ? 0 : up64(sh->batch * sh->seq * sh->ld_o);
}
static bool qkv_interleaved(const void *q, const void *k, const void *v,
                            const struct backend_attention_shape *sh) {
  const int64_t w = sh->heads * sh->head_dim * 2;
  return (const char *)k - (const char *)q == w && (const char *)v - (const char *)k == w &&
         sh->ld_qkv >= 3 * sh->heads * sh->head_dim;
}
/* Scratch floats for the fp32 rows of three tensors x[3] of q, k, v's layout, when
   dtype is 16-bit (else none). */
static int64_t qkv_rows_floats(l2l_dtype dtype, const void *const x[3],
                               const struct backend_attention_shape *sh) {
  if (dtype == L2L_F32) return 0;
  return (qkv_interleaved(x[0], x[1], x[2], sh) ? 1 : 3) * up64(sh->batch * sh->seq * sh->ld_qkv);
}
/* rows[i] := where x[i]'s fp32 rows lie in the scratch from `at`. */
static void qkv_rows(float *rows[3], float *at, const void *const x[3],
                     const struct backend_attention_shape *sh) {
  const bool one = qkv_interleaved(x[0], x[1], x[2], sh);
  const int64_t w = sh->heads * sh->head_dim, region = up64(sh->batch * sh->seq * sh->ld_qkv);
  for (int i = 0; i < 3; i++) rows[i] = at + i * (one ? w : region);
}
/* The three 16-bit tensors x (dtype) widened into their rows, or (back) rounded from them. */
static l2l_status qkv_cast(float *const rows[3], const void *const x[3], l2l_dtype dtype,
                           bool back, const struct backend_attention_shape *sh) {
  const int64_t n = sh->batch * sh->seq, w = sh->heads * sh->head_dim, ld = sh->ld_qkv;
  const bool one = qkv_interleaved(x[0], x[1], x[2], sh);
  for (int i = 0; i < (one ? 1 : 3); i++) {
    const int64_t cols = one ? 3 * w : w;
    if (back)
      LAUNCH(k_cast_rows((void *)x[i], (int)dtype, ld, rows[i], DT_F32, ld, n, cols, cuda_rt.compute));
    else
      LAUNCH(k_cast_rows(rows[i], DT_F32, ld, x[i], (int)dtype, ld, n, cols, cuda_rt.compute));
  }
  return L2L_OK;
}
/* q32 := fp32 q, k, v for the own kernels: the tensors themselves, or widened at `at`. */
static l2l_status qkv_widened(float *q32[3], float *at, const void *const qkv[3],
                              const struct backend_attention_shape *sh) {
  for (int i = 0; i < 3; i++) q32[i] = (float *)qkv[i];
  if (sh->qkv_dtype == L2L_F32) return L2L_OK;
  qkv_rows(q32, at, qkv, sh);
  return qkv_cast(q32, qkv, sh->qkv_dtype, false, sh);
}
static l2l_status o_cast(void *dst, int dst_dtype, const void *src, int src_dtype,
                         const struct backend_attention_shape *sh) {
  LAUNCH(k_cast_rows(dst, dst_dtype, sh->ld_o, src, src_dtype, sh->ld_o, sh->batch * sh->seq,
                     sh->heads * sh->head_dim, cuda_rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- the flash kernels */

static atomic_llong flash_runs;
int64_t flash_attention_runs(void) { return atomic_load(&flash_runs); }

/* Whether the flash kernels take a call: not switched off (L2L_FLASH=0, read at each call:
   the fp32 kernels then take it), 16-bit products, no standard-mode rows (P, P' or bits
   written or read), a head_dim they serve on this GPU, and every tensor f32 or of the
   products' dtype (o and dq, dk, dv are written as they are; q, k, v and do cast). */
static bool flash_takes(const struct backend_attention_shape *sh, bool rows, int backward) {
  const l2l_dtype p = sh->precision;
  const char *env = getenv("L2L_FLASH");
  if (env != NULL && strcmp(env, "0") == 0) return false;
#define F32_OR_PRODUCTS(dt) ((dt) == L2L_F32 || (dt) == p)
  return !rows && p != L2L_F32 && F32_OR_PRODUCTS(sh->qkv_dtype) && F32_OR_PRODUCTS(sh->o_dtype) &&
         (!backward || (F32_OR_PRODUCTS(sh->do_dtype) && F32_OR_PRODUCTS(sh->dqkv_dtype))) &&
         k_attention_flash_serves((int)p, sh->head_dim, backward);
#undef F32_OR_PRODUCTS
}

/* A tensor the flash kernels read as it lies: in the products' dtype, 16-byte aligned
   rows. */
static bool flash_ready(const void *x, l2l_dtype dtype, int64_t ld,
                        const struct backend_attention_shape *sh) {
  return dtype == sh->precision && ((uintptr_t)x & 15) == 0 && ld % 8 == 0;
}
static bool flash_qkv_ready(const void *const qkv[3], const struct backend_attention_shape *sh) {
  for (int i = 0; i < 3; i++)
    if (!flash_ready(qkv[i], sh->qkv_dtype, sh->ld_qkv, sh)) return false;
  return true;
}
/* Scratch floats for (batch * seq) packed rows of `cols` 16-bit elements. */
static int64_t halves_floats(const struct backend_attention_shape *sh, int64_t cols) {
  return up64((sh->batch * sh->seq * cols + 1) / 2);
}
/* dst (rows, cols; dst_ld apart) := src (src_dtype; src_ld apart) in the products' 16 bits:
   cast from f32, or copied. */
static l2l_status rows_as_products(void *dst, int64_t dst_ld, const void *src, l2l_dtype src_dtype,
                                   int64_t src_ld, int64_t cols,
                                   const struct backend_attention_shape *sh) {
  const int64_t rows = sh->batch * sh->seq;
  if (src_dtype == L2L_F32) {
    LAUNCH(k_cast_rows(dst, (int)sh->precision, dst_ld, src, DT_F32, src_ld, rows, cols,
                       cuda_rt.compute));
    return L2L_OK;
  }
  cuda_launched();
  CUDA_TRY(cudaMemcpy2DAsync(dst, (size_t)dst_ld * 2, src, (size_t)src_ld * 2, (size_t)cols * 2,
                             (size_t)rows, cudaMemcpyDeviceToDevice, cuda_rt.compute));
  return L2L_OK;
}
/* in := q, k, v as the flash kernels read them: the tensors themselves where ready
   (flash_qkv_ready), else cast or copied to `at` in the scratch (halves_floats(sh, 3 heads
   head_dim) floats, interleaved as the block keeps them). */
static l2l_status flash_qkv(const void *in[3], bool ready, float *at, const void *const qkv[3],
                            const struct backend_attention_shape *sh) {
  const int64_t w = sh->heads * sh->head_dim;
  for (int i = 0; i < 3; i++) {
    in[i] = ready ? qkv[i] : (const void *)((uint16_t *)at + i * w);
    if (!ready) TRY(rows_as_products((void *)in[i], 3 * w, qkv[i], sh->qkv_dtype, sh->ld_qkv, w, sh));
  }
  return L2L_OK;
}

static l2l_status attention_forward_flash(void *o, float *lse, const void *q, const void *k,
                                          const void *v, const uint8_t *key_mask,
                                          const struct backend_attention_shape *sh) {
  const void *qkv[3] = {q, k, v}, *in[3];
  const int64_t w = sh->heads * sh->head_dim;
  const bool qkv_ready = flash_qkv_ready(qkv, sh);
  float *scratch = NULL;
  TRY(cuda_scratch_floats(&scratch, qkv_ready ? 0 : halves_floats(sh, 3 * w)));
  TRY(flash_qkv(in, qkv_ready, scratch, qkv, sh));
  LAUNCH(k_attention_flash_forward(o, (int)sh->o_dtype, lse, in[0], in[1], in[2], key_mask,
                                   sh->batch, sh->heads, sh->seq, sh->head_dim,
                                   qkv_ready ? sh->ld_qkv : 3 * w, sh->ld_o,
                                   sh->causal, sh->scale, sh->dropout,
                                   backend_keep_threshold(sh->dropout), sh->seed, sh->stream,
                                   sh->first_sample, (int)sh->precision, cuda_rt.compute));
  atomic_fetch_add(&flash_runs, 1);
  return L2L_OK;
}

/* The scratch: D = do . o first, then q, k, v and do where they are cast or copied. */
static l2l_status attention_backward_flash(void *dq, void *dk, void *dv, const void *d_o,
                                           const void *o, const float *lse, const void *q,
                                           const void *k, const void *v,
                                           const uint8_t *key_mask,
                                           const struct backend_attention_shape *sh) {
  const void *qkv[3] = {q, k, v}, *in[3];
  const int64_t w = sh->heads * sh->head_dim;
  const bool qkv_ready = flash_qkv_ready(qkv, sh);
  const bool do_ready = flash_ready(d_o, sh->do_dtype, sh->ld_o, sh);
  const int64_t at_qkv = up64(k_attention_scratch_floats(sh->batch, sh->heads, sh->seq, 1));
  const int64_t at_do = at_qkv + (qkv_ready ? 0 : halves_floats(sh, 3 * w));
  float *scratch = NULL;
  TRY(cuda_scratch_floats(&scratch, at_do + (do_ready ? 0 : halves_floats(sh, w))));
  TRY(flash_qkv(in, qkv_ready, scratch + at_qkv, qkv, sh));
  const void *do16 = d_o;
  if (!do_ready) {
    do16 = scratch + at_do;
    TRY(rows_as_products((void *)do16, w, d_o, sh->do_dtype, sh->ld_o, w, sh));
  }
  cuda_launched(); /* (two kernels: dq, then dk and dv) */
  LAUNCH(k_attention_flash_backward(dq, dk, dv, (int)sh->dqkv_dtype, sh->ld_qkv, do16,
                                    do_ready ? sh->ld_o : w,
                                    o, (int)sh->o_dtype, lse, in[0], in[1], in[2], key_mask,
                                    sh->batch, sh->heads, sh->seq, sh->head_dim,
                                    qkv_ready ? sh->ld_qkv : 3 * w, sh->ld_o, sh->causal,
                                    sh->scale, sh->dropout, backend_keep_threshold(sh->dropout),
                                    sh->seed, sh->stream, sh->first_sample, (int)sh->precision,
                                    scratch, cuda_rt.compute));
  atomic_fetch_add(&flash_runs, 1);
  return L2L_OK;
}

/* The calls cudnn_routes accepts run through cuDNN (cudnn_sdpa.c), forward and
   backward alike, with the scratch (256-byte aligned) for their 16-bit copies and cuDNN's
   workspace; the work they queue counts as cudnn_sdpa_launches says (casts, copies, a
   memset, cuDNN's plan). Where the scratch cannot grow that far (the device pool's budget),
   the call runs on the own kernels instead (*ran stays false): their lse is cuDNN's stats,
   so a forward and a backward that took different paths still agree. Called with
   cuda_rt.lock held. */

/* A cuDNN call's start: its scratch (*out) and the launches it queues counted, *ran true;
   where the scratch cannot grow (L2L_ERR_NOMEM), nothing: *ran stays false. */
static l2l_status cudnn_start(bool *ran, void **out, const struct backend_attention_shape *sh,
                              const struct sdpa_call *c, int backward) {
  float *floats = NULL;
  uint64_t bytes = cudnn_sdpa_scratch_bytes(sh, c, backward) + 256;
  l2l_status st =
      cuda_scratch_floats(&floats, (int64_t)((bytes + sizeof(float) - 1) / sizeof(float)));
  if (st == L2L_ERR_NOMEM) return L2L_OK;
  TRY(st);
  *out = (void *)(((uintptr_t)floats + 255) & ~(uintptr_t)255);
  *ran = true;
  for (int i = 0, n = cudnn_sdpa_launches(sh, c, backward); i < n; i++) cuda_launched();
  return L2L_OK;
}

static l2l_status attention_forward_cudnn(bool *ran, void *o, float *lse, const void *q,
                                          const void *k, const void *v,
                                          const struct backend_attention_shape *sh) {
  void *scratch = NULL;
  const struct sdpa_call c = {q, k, v, o, NULL, NULL, NULL, NULL, lse};
  TRY(cudnn_start(ran, &scratch, sh, &c, 0));
  return *ran ? cudnn_sdpa_forward(ran, o, lse, q, k, v, sh, scratch) : L2L_OK;
}

static l2l_status attention_forward_locked(void *o, float *lse, float *probs, float *dropped,
                                           uint8_t *mask, const void *q, const void *k,
                                           const void *v, const uint8_t *key_mask,
                                           const struct backend_attention_shape *sh) {
  float *scratch = NULL, *o32 = (float *)o, *q32[3];
  const void *qkv[3] = {q, k, v};
  const int64_t o_floats = o_rows_floats(sh->o_dtype, sh);
  TRY(cuda_scratch_floats(&scratch, o_floats + qkv_rows_floats(sh->qkv_dtype, qkv, sh)));
  if (sh->o_dtype != L2L_F32) o32 = scratch;
  TRY(qkv_widened(q32, scratch + o_floats, qkv, sh));
  LAUNCH(k_attention_forward(o32, lse, probs, dropped, mask, q32[0], q32[1], q32[2], key_mask, sh->batch,
                             sh->heads, sh->seq, sh->head_dim, sh->ld_qkv, sh->ld_o,
                             sh->causal, sh->scale, sh->dropout,
                             backend_keep_threshold(sh->dropout), sh->seed, sh->stream,
                             sh->first_sample, NULL, cuda_rt.compute));
  return sh->o_dtype == L2L_F32 ? L2L_OK : o_cast(o, (int)sh->o_dtype, o32, DT_F32, sh);
}

l2l_status cuda_attention_forward(void *o, float *lse, float *probs, float *dropped,
                                  uint8_t *mask, const void *q, const void *k,
                                  const void *v, const uint8_t *key_mask,
                                  const struct backend_attention_shape *sh, float *workspace,
                                  int64_t workspace_floats) {
  (void)workspace, (void)workspace_floats;
  if (cudnn_routes(sh, probs, dropped, mask, key_mask)) {
    bool ran = false;
    pthread_mutex_lock(&cuda_rt.lock);
    l2l_status st = attention_forward_cudnn(&ran, o, lse, q, k, v, sh);
    pthread_mutex_unlock(&cuda_rt.lock);
    if (ran || st != L2L_OK) return st;
  }
  if (flash_takes(sh, probs || dropped || mask, 0))
    WITH_SCRATCH(attention_forward_flash(o, lse, q, k, v, key_mask, sh));
  WITH_SCRATCH(attention_forward_locked(o, lse, probs, dropped, mask, q, k, v, key_mask, sh));
}

static l2l_status attention_backward_locked(void *dq, void *dk, void *dv, const void *d_o,
                                            const void *o, const float *lse, const float *probs,
                                            const float *dropped, const uint8_t *mask,
                                            const void *q, const void *k, const void *v,
                                            const uint8_t *key_mask,
                                            const struct backend_attention_shape *sh) {
  float *scratch = NULL, *q32[3], *g32[3] = {dq, dk, dv};
  const void *qkv[3] = {q, k, v}, *dqkv[3] = {dq, dk, dv};
  const int64_t own = up64(k_attention_scratch_floats(sh->batch, sh->heads, sh->seq, 1));
  const int64_t at_qkv = own + o_rows_floats(sh->o_dtype, sh);
  const int64_t at_dqkv = at_qkv + qkv_rows_floats(sh->qkv_dtype, qkv, sh);
  const int64_t at_do = at_dqkv + qkv_rows_floats(sh->dqkv_dtype, dqkv, sh);
  TRY(cuda_scratch_floats(&scratch, at_do + o_rows_floats(sh->do_dtype, sh)));
  const float *o32 = (const float *)o, *do32 = (const float *)d_o;
  if (sh->o_dtype != L2L_F32) {   /* widened into the scratch past the kernels' own part */
    TRY(o_cast(scratch + own, DT_F32, o, (int)sh->o_dtype, sh));
    o32 = scratch + own;
  }
  if (sh->do_dtype != L2L_F32) {   /* (do's rows are ld_o apart, as o's) */
    TRY(o_cast(scratch + at_do, DT_F32, d_o, (int)sh->do_dtype, sh));
    do32 = scratch + at_do;
  }
  TRY(qkv_widened(q32, scratch + at_qkv, qkv, sh));
  if (sh->dqkv_dtype != L2L_F32) qkv_rows(g32, scratch + at_dqkv, dqkv, sh);
  LAUNCH(k_attention_backward(g32[0], g32[1], g32[2], do32, o32, lse, probs, dropped, mask,
                              q32[0], q32[1], q32[2], key_mask, sh->batch, sh->heads, sh->seq,
                              sh->head_dim, sh->ld_qkv, sh->ld_o, sh->causal, sh->scale,
                              sh->dropout, backend_keep_threshold(sh->dropout), sh->seed,
                              sh->stream, sh->first_sample, scratch, cuda_rt.compute));
  return sh->dqkv_dtype == L2L_F32 ? L2L_OK : qkv_cast(g32, dqkv, sh->dqkv_dtype, true, sh);
}

static l2l_status attention_backward_cudnn(bool *ran, void *dq, void *dk, void *dv,
                                           const void *d_o, const void *o, const float *lse,
                                           const void *q, const void *k, const void *v,
                                           const struct backend_attention_shape *sh) {
  void *scratch = NULL;
  const struct sdpa_call c = {q, k, v, o, d_o, dq, dk, dv, lse};
  TRY(cudnn_start(ran, &scratch, sh, &c, 1));
  return *ran ? cudnn_sdpa_backward(ran, dq, dk, dv, d_o, o, lse, q, k, v, sh, scratch) : L2L_OK;
}

l2l_status cuda_attention_backward(void *dq, void *dk, void *dv, const void *d_o,
                                   const void *o, const float *lse, const float *probs,
                                   const float *dropped, const uint8_t *mask,
                                   const void *q, const void *k, const void *v,
                                   const uint8_t *key_mask,
                                   const struct backend_attention_shape *sh,
                                   float *workspace, int64_t workspace_floats) {
  (void)workspace, (void)workspace_floats;
  if (cudnn_routes(sh, probs, dropped, mask, key_mask)) {
    bool ran = false;
    pthread_mutex_lock(&cuda_rt.lock);
    l2l_status st = attention_backward_cudnn(&ran, dq, dk, dv, d_o, o, lse, q, k, v, sh);
    pthread_mutex_unlock(&cuda_rt.lock);
    if (ran || st != L2L_OK) return st;
  }
  if (flash_takes(sh, probs || dropped || mask, 1))
    WITH_SCRATCH(attention_backward_flash(dq, dk, dv, d_o, o, lse, q, k, v, key_mask, sh));
  WITH_SCRATCH(attention_backward_locked(dq, dk, dv, d_o, o, lse, probs, dropped, mask, q, k, v,
                                         key_mask, sh));
}

#endif /* L2L_CUDA */
