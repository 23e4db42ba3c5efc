/* SPDX-License-Identifier: MIT */
/* accelerators.h — the accelerator backends as dispatch.c registers them (private to
 * src/backend/; the other parts see only backend.h).
 *
 * Purpose: what dispatch.c needs of each accelerator (its probe, its ops table, the device
 * table it installs in the core) and what its public calls reach, with no type of the
 * accelerator's own: only the accelerator's folder includes its headers. Today one: CUDA,
 * whose entries every build has: with CUDA (L2L_CUDA: cuda/runtime.c and cuda/cuda_ops.c, the
 * only files that include a CUDA header, through cuda/runtime.h), or without
 * (cuda/stub.c, whose probe says why and whose tables are never installed).
 * Must never: be included outside src/backend/, or include an accelerator's header.
 */
#ifndef L2L_BACKEND_ACCELERATORS_H
#define L2L_BACKEND_ACCELERATORS_H

#include "backend.h"

/* ---------------------------------------------------------------- CUDA (cuda/) */

/* 1 if a GPU can be used (probed once); else 0 with the reason in why (may be NULL). */
int l2l_cuda_probe(char *why, size_t len);
const struct l2l_backend_ops *l2l_cuda_ops(void);
/* The device pool's memory on the GPU through a caching allocator (a training step's
   steady state makes no cudaMalloc or cudaFree calls), pinned memory from cudaHostAlloc,
   copy lanes' marks and stamps as events. */
extern const struct l2l_device_ops l2l_cuda_device;
/* What l2l_cuda_set_tf32 and l2l_cuda_get_info (api.c) do once their arguments are
   checked and CUDA is known to run. */
void l2l_cuda_use_tf32(int enable);
l2l_status l2l_cuda_fill_info(l2l_cuda_info *out);

#endif /* L2L_BACKEND_ACCELERATORS_H */
