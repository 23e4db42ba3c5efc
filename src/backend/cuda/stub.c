/* SPDX-License-Identifier: MIT */
/* stub.c — the CUDA backend of a build without CUDA (NO_CUDA=1, SANITIZE=1, or no nvcc).
 *
 * Purpose: answer every question accelerators.h asks of the CUDA backend truthfully: the
 * probe says why CUDA cannot run, so dispatch.c never installs these tables.
 * Must never: pretend to run anything.
 */
#ifndef L2L_CUDA

#include <stdio.h>

#include "backend/accelerators.h"

static const char no_cuda[] =
    "this build of l2l has no CUDA backend (built with NO_CUDA=1 or SANITIZE=1, or without "
    "nvcc)";

int cuda_probe(char *why, size_t len) {
  if (why != NULL && len > 0) snprintf(why, len, "%s", no_cuda);
  return 0;
}

const struct backend_ops *cuda_ops(void) { return &cpu_backend; } /* never asked */

const struct device_ops cuda_device = {.name = "cuda"};   /* never installed */

void cuda_use_tf32(int enable) { (void)enable; } /* matters only where CUDA runs */

l2l_status cuda_fill_info(l2l_cuda_info *out) {
  (void)out;
  return core_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

int cudnn_probe(char *about, size_t len) {
  if (about != NULL && len > 0) snprintf(about, len, "%s", no_cuda);
  return 0;
}

bool cudnn_routes(const struct backend_attention_shape *shape, const void *probs,
                  const void *dropped, const void *mask, const void *key_mask) {
  (void)shape, (void)probs, (void)dropped, (void)mask, (void)key_mask;
  return false;
}

l2l_status cudnn_check_graphs(const struct backend_attention_shape *shape, int backward,
                              int miswire, char *report, size_t len) {
  (void)shape, (void)backward, (void)miswire, (void)report, (void)len;
  return core_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

l2l_status cudnn_describe(const struct backend_attention_shape *shape, int backward,
                          struct backend_sdpa_view *out) {
  (void)shape, (void)backward, (void)out;
  return core_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

void cudnn_enable(int on) { (void)on; }
int64_t cudnn_runs(void) { return 0; }
void cudnn_refuse_next(int n) { (void)n; }
void cudnn_forget_plans(void) {}
int64_t flash_attention_runs(void) { return 0; }

int cublaslt_probe(char *about, size_t len) {
  if (about != NULL && len > 0) snprintf(about, len, "%s", no_cuda);
  return 0;
}
void cublaslt_enable(int on) { (void)on; }
int64_t cublaslt_runs(void) { return 0; }

#endif /* !L2L_CUDA */
