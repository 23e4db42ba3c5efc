/* SPDX-License-Identifier: MIT */
/* cudnn_graph_build.h — the attention graphs as cuDNN backend descriptors (private to
 * backend/cuda/; built with L2L_CUDNN_HEADERS only).
 *
 * Purpose: cudnn_graph_build.c makes every tensor and operation descriptor of the forward
 * or backward SDPA graph (cudnn_sdpa.c says which pattern), finalizing each as it goes (a
 * well-formed graph needs no GPU this far), then, given a handle, the operation graph,
 * the heuristics' engine configurations and the first execution plan that finalizes.
 * Must never: be included outside backend/cuda/.
 */
#ifndef L2L_CUDA_CUDNN_GRAPH_BUILD_H
#define L2L_CUDA_CUDNN_GRAPH_BUILD_H

#include "cudnn_sdpa.h"

/* The real tensors' unique ids: accelerators.h's enum backend_sdpa_uid. */

struct sdpa_graph;

/* The forward (backward = 0) or backward graph's descriptors, each finalized, and their
   wiring checked; NULL with the failing node and cuDNN's (or the wiring check's) words in
   why. miswire builds it wrongly on purpose, the check's proof that a refusal shows: 1, V
   with half the head dim (cuDNN refuses the matmul); 2, a node reading a tensor nothing
   writes (forward: P V from a stray P) or leaving one unread (backward: dS from dP - Dsum,
   P unused there). */
CUDA_INTERNAL struct sdpa_graph *sdpa_graph_build(const struct backend_attention_shape *sh,
                                                  int backward, int miswire, char *why,
                                                  size_t len);
/* The operation graph (from cuDNN 9.8 on, h may be NULL: no GPU needed); false with why
   when cuDNN refuses it. */
CUDA_INTERNAL bool sdpa_graph_finalize(struct sdpa_graph *g, cudnnHandle_t h, char *why,
                                       size_t len);
/* The operation graph, engine heuristics and an execution plan on `h` (a GPU's); false
   with why when cuDNN refuses them. */
CUDA_INTERNAL bool sdpa_graph_plan(struct sdpa_graph *g, cudnnHandle_t h, char *why, size_t len);
CUDA_INTERNAL int64_t sdpa_graph_workspace(const struct sdpa_graph *g);  /* bytes, once planned */
/* Queues the plan on h's stream with the tensors uids[i] at ptrs[i]. */
CUDA_INTERNAL bool sdpa_graph_execute(struct sdpa_graph *g, cudnnHandle_t h, const int64_t *uids,
                                      void **ptrs, int n, void *workspace, char *why, size_t len);
CUDA_INTERNAL void sdpa_graph_counts(const struct sdpa_graph *g, int *tensors, int *ops);
CUDA_INTERNAL void sdpa_graph_describe(const struct sdpa_graph *g, struct backend_sdpa_view *out);
CUDA_INTERNAL void sdpa_graph_free(struct sdpa_graph *g);   /* NULL: nothing */
/* The masked scores' value: -inf from cuDNN 9.10 on, the lowest float before (as
   cudnn-frontend chooses). */
CUDA_INTERNAL float sdpa_hidden_value(void);

#endif /* L2L_CUDA_CUDNN_GRAPH_BUILD_H */
