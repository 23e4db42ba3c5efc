/* SPDX-License-Identifier: MIT */
/* api.c — the public CUDA calls of l2l.h, the same on every build.
 *
 * Purpose: check the arguments, then ask the CUDA backend (runtime.c, or stub.c in a
 * build without CUDA), which says why when it cannot run.
 * Must never: start CUDA for a call that only sets something (tf32 is kept for later).
 */
#include "backend/accelerators.h"

int l2l_cuda_available(char *why, size_t len) { return cuda_probe(why, len); }

int l2l_cudnn_available(char *about, size_t len) {
  return cudnn_probe(len > 0 ? about : NULL, len);
}

l2l_status l2l_cuda_get_info(l2l_cuda_info *out) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  char why[256];
  if (!cuda_probe(why, sizeof why))
    return FAIL(L2L_ERR_UNSUPPORTED, "CUDA cannot run here: %s", why);
  TRY(cuda_fill_info(out));
  out->cudnn_version = cudnn_probe(NULL, 0);
  return L2L_OK;
}

/* Accepted on any build: the setting matters only where CUDA runs. */
l2l_status l2l_cuda_set_tf32(int enable) {
  if (enable != 0 && enable != 1)
    return FAIL(L2L_ERR_INVALID, "enable must be 0 or 1, got %d", enable);
  cuda_use_tf32(enable);
  return L2L_OK;
}
