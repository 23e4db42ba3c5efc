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

int l2l_cuda_probe(char *why, size_t len) {
  if (why != NULL && len > 0) snprintf(why, len, "%s", no_cuda);
  return 0;
}

const struct l2l_backend_ops *l2l_cuda_ops(void) { return &l2l_cpu_backend; } /* never asked */

const struct l2l_device_ops l2l_cuda_device = {.name = "cuda"};   /* never installed */

void l2l_cuda_use_tf32(int enable) { (void)enable; } /* matters only where CUDA runs */

l2l_status l2l_cuda_fill_info(l2l_cuda_info *out) {
  (void)out;
  return l2l_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

int l2l_cudnn_probe(char *about, size_t len) {
  if (about != NULL && len > 0) snprintf(about, len, "%s", no_cuda);
  return 0;
}

bool l2l_cudnn_routes(const struct l2l_attention_shape *shape, const void *probs,
                      const void *dropped, const void *mask, const void *key_mask) {
  (void)shape, (void)probs, (void)dropped, (void)mask, (void)key_mask;
  return false;
}

l2l_status l2l_cudnn_check_graphs(const struct l2l_attention_shape *shape, int backward,
                                  int miswire, char *report, size_t len) {
  (void)shape, (void)backward, (void)miswire, (void)report, (void)len;
  return l2l_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

l2l_status l2l_cudnn_describe(const struct l2l_attention_shape *shape, int backward,
                              struct l2l_sdpa_view *out) {
  (void)shape, (void)backward, (void)out;
  return l2l_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

void l2l_cudnn_enable(int on) { (void)on; }
int64_t l2l_cudnn_runs(void) { return 0; }

#endif /* !L2L_CUDA */
