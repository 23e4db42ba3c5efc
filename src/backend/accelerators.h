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

/* cuDNN, which the CUDA backend's attention uses where it can (cuda/cudnn_load.c,
   cuda/cudnn_sdpa.c). The loaded libcudnn's version (91900 is 9.19.0), opened on the first
   call, GPU or not, with "cuDNN 9.19.0 from PATH" in about; 0 with why it is not loaded
   (no CUDA or no cuDNN in this build, L2L_CUDNN, no library found). about may be NULL. */
int l2l_cudnn_probe(char *about, size_t len);
/* Whether the CUDA backend runs this attention call through cuDNN: bf16 / f16 products,
   no dropout, no key mask, nothing kept but lse, head_dim a multiple of 8 up to 128, and
   cuDNN's plans for the shape built on this GPU (made and cached at the first ask). The
   one predicate the forward, the backward and the profile ask. */
bool l2l_cudnn_routes(const struct l2l_attention_shape *shape, const void *probs,
                      const void *dropped, const void *mask, const void *key_mask);
/* Builds the forward (backward = 0) or backward SDPA graph's tensor and operation
   descriptors, finalizing each (no GPU needed), and, where a GPU runs, its operation graph
   and execution plan; report gets the counts and what became of the plan (or why it was
   skipped). miswire != 0 builds a wrong graph on purpose, which must be refused.
   L2L_ERR_UNSUPPORTED when cuDNN is not loaded; L2L_ERR_BACKEND naming the node refused. */
l2l_status l2l_cudnn_check_graphs(const struct l2l_attention_shape *shape, int backward,
                                  int miswire, char *report, size_t len);
/* Tests' switch: 0 keeps every attention call on the own kernels (default 1); and how many
   attention calls cuDNN has run. */
void l2l_cudnn_enable(int on);
int64_t l2l_cudnn_runs(void);

#endif /* L2L_BACKEND_ACCELERATORS_H */
