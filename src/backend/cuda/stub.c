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

#endif /* !L2L_CUDA */
