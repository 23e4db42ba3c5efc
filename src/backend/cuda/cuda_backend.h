/* cuda_backend.h — what the rest of the backend knows of the CUDA backend (private to
 * src/backend/; no CUDA type appears here).
 *
 * Purpose: the three things dispatch.c registers (the probe, the ops table, the device
 * table it installs in the core) and the settings api.c's public calls reach. Every
 * build has them: with CUDA (L2L_CUDA: runtime.c and ops.c), or without (stub.c, whose
 * probe says why and whose tables are never installed).
 * Must never: include a CUDA header (only runtime.h, inside backend/cuda/, does).
 */
#ifndef L2L_CUDA_BACKEND_H
#define L2L_CUDA_BACKEND_H

#include "backend/backend.h"

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

#endif /* L2L_CUDA_BACKEND_H */
