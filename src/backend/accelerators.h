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
int cuda_probe(char *why, size_t len);
const struct backend_ops *cuda_ops(void);
/* The device pool's memory on the GPU through a caching allocator (a training step's
   steady state makes no cudaMalloc or cudaFree calls), pinned memory from cudaHostAlloc,
   copy lanes' marks and stamps as events. */
extern const struct device_ops cuda_device;
/* What l2l_cuda_set_tf32 and l2l_cuda_get_info (api.c) do once their arguments are
   checked and CUDA is known to run. */
void cuda_use_tf32(int enable);
l2l_status cuda_fill_info(l2l_cuda_info *out);

/* cuDNN, which the CUDA backend's attention uses where it can (cuda/cudnn_load.c,
   cuda/cudnn_sdpa.c). The loaded libcudnn's version (91900 is 9.19.0), opened on the first
   call, GPU or not, with "cuDNN 9.19.0 from PATH" in about; 0 with why it is not loaded
   (no CUDA or no cuDNN in this build, L2L_CUDNN, no library found). about may be NULL. */
int cudnn_probe(char *about, size_t len);
/* Whether the CUDA backend runs this attention call through cuDNN: bf16 / f16 products,
   no dropout, no key mask, nothing kept but lse, head_dim a multiple of 8 up to 128, and
   cuDNN's plans for the shape built on this GPU (made and cached at the first ask). The
   one predicate the forward, the backward and the profile ask. */
bool cudnn_routes(const struct backend_attention_shape *shape, const void *probs,
                  const void *dropped, const void *mask, const void *key_mask);
/* Builds the forward (backward = 0) or backward SDPA graph's tensor and operation
   descriptors, finalizing each (no GPU needed), and, where a GPU runs, its operation graph
   and execution plan; report gets the counts and what became of the plan (or why it was
   skipped). miswire != 0 builds a wrong graph on purpose, which must be refused.
   L2L_ERR_UNSUPPORTED when cuDNN is not loaded; L2L_ERR_BACKEND naming the node refused. */
l2l_status cudnn_check_graphs(const struct backend_attention_shape *shape, int backward,
                              int miswire, char *report, size_t len);
/* The graph cudnn_check_graphs builds, in plain C: its tensors (uid, dims, strides:
   element (i0..i3) at sum i_n strides[n] of its memory) and its nodes in order, so that a
   test can evaluate it on the CPU with cuDNN's meanings: MATMUL c = a b over the last two
   dims per (dim 0, dim 1); REDUCE_* into the output's dims of 1; RESHAPE y = x's memory
   read with y's strides; POINTWISE y = mode(in[0], in[1], in[2]) with dims of 1 broadcast
   (GEN_INDEX: the index along `axis`; SELECT: in[2] ? in[0] : in[1]). A 16-bit output is
   rounded to its type. */
/* The unique ids of the graphs' real tensors: what a variant pack names. Q, K (seen as
   K^T), V (the backward sees V^T), O, dO, dQ, dK, dV: 16-bit, packed [B, S, H, D] seen as
   [B, H, S, D]; STATS: f32 [B, H, S, 1] (l2l's lse); SCALE, HIDDEN (the masked score: causal
   graphs only), ONE: f32 scalars passed by value (host pointers); DSUM: f32 [B, H, S, 1]
   and DQ_ACC: f32 [B, H, S, D], both in the scratch. */
enum backend_sdpa_uid {
  SDPA_Q = 1, SDPA_K, SDPA_V, SDPA_O, SDPA_STATS, SDPA_SCALE, SDPA_HIDDEN,
  SDPA_DO, SDPA_DQ, SDPA_DK, SDPA_DV, SDPA_ONE, SDPA_DSUM, SDPA_DQ_ACC
};
enum backend_sdpa_kind { L2L_SDPA_MATMUL, L2L_SDPA_REDUCE_MAX, L2L_SDPA_REDUCE_ADD, L2L_SDPA_RESHAPE,
                     L2L_SDPA_POINTWISE };
enum backend_sdpa_pw { L2L_SDPA_IDENTITY, L2L_SDPA_ADD, L2L_SDPA_SUB, L2L_SDPA_MUL, L2L_SDPA_DIV,
                   L2L_SDPA_EXP, L2L_SDPA_LOG, L2L_SDPA_GEN_INDEX, L2L_SDPA_CMP_GE,
                   L2L_SDPA_SELECT };
enum backend_sdpa_type { L2L_SDPA_F32, L2L_SDPA_BF16, L2L_SDPA_F16, L2L_SDPA_I32, L2L_SDPA_BOOL };
struct backend_sdpa_tensor {
  int64_t uid, dims[4], strides[4];
  enum backend_sdpa_type type;
  bool is_virtual, by_value;
  char name[40];
};
struct backend_sdpa_node {
  enum backend_sdpa_kind kind;
  enum backend_sdpa_pw mode;   /* POINTWISE */
  int64_t axis;            /* GEN_INDEX */
  int in[3], inputs, out;  /* indices into the view's tensors */
};
struct backend_sdpa_view {
  int tensors, nodes;
  struct backend_sdpa_tensor tensor[64];
  struct backend_sdpa_node node[48];
};
/* The forward (backward = 0) or backward graph as l2l builds it for `shape` (with cuDNN
   loaded: its descriptors are made and finalized on the way). */
l2l_status cudnn_describe(const struct backend_attention_shape *shape, int backward,
                          struct backend_sdpa_view *out);
/* Tests' switch: 0 keeps every attention call on the own kernels (default 1); and how many
   attention calls cuDNN has run. */
void cudnn_enable(int on);
int64_t cudnn_runs(void);
/* Tests' switches: the next n plans cuDNN is asked to run are refused as if cuDNN had failed
   to run them (the path a real refusal takes: the call, and its shape's later ones, on the
   own kernels); and every cached plan forgotten (a shape so retired is routed to cuDNN
   again). */
void cudnn_refuse_next(int n);
void cudnn_forget_plans(void);
/* How many attention calls (forwards and backwards) l2l's flash kernels on tensor cores
   have run (cuda/attention_ops.c; 0 without CUDA). */
int64_t flash_attention_runs(void);

/* cuBLASLt, which the CUDA backend's gemm_bias uses where it can (cuda/cublaslt.c): 1 when
   libcublasLt is open (opening it at the first ask), with "cuBLASLt 13.x.y from PATH" in
   about; 0 with why not (no CUDA, L2L_CUBLASLT=0, no library). Tests' switch (0 keeps
   gemm_bias on the GEMM and the bias kernel; default 1) and the count of its runs. */
int cublaslt_probe(char *about, size_t len);
void cublaslt_enable(int on);
int64_t cublaslt_runs(void);

#endif /* L2L_BACKEND_ACCELERATORS_H */
