/* SPDX-License-Identifier: MIT */
/* cudnn_sdpa.h — cuDNN inside the CUDA backend (private to backend/cuda/; built with
 * L2L_CUDA, and with cuDNN's headers where the toolkit has them: L2L_CUDNN_HEADERS).
 *
 * Purpose: libcudnn.so.9 is opened at run time as cuBLAS is (cudnn_load.c: L2L_CUDNN, the
 * toolkit's folders, PyTorch's wheels, the soname), its functions kept in `cudnn`; its
 * fused scaled-dot-product attention is built through the backend C API as an operation
 * graph per shape (cudnn_sdpa.c) and run by cuda_ops.c for the attention calls
 * cudnn_routes accepts. The 16-bit copies of q, k, v, o, do and the gradients, the
 * softmax row sums and dq's f32 accumulator live in the backend's scratch.
 * Must never: be included outside backend/cuda/.
 */
#ifndef L2L_CUDA_CUDNN_SDPA_H
#define L2L_CUDA_CUDNN_SDPA_H

#include "runtime.h"

#ifdef L2L_CUDNN_HEADERS
#include <cudnn_graph.h>

/* The functions l2l calls, from the library cudnn_load.c opened. */
struct cuda_cudnn {
  __typeof__(cudnnGetVersion) *get_version;
  __typeof__(cudnnGetErrorString) *error_string;
  __typeof__(cudnnGetLastErrorString) *last_error;
  __typeof__(cudnnCreate) *create;
  __typeof__(cudnnSetStream) *set_stream;
  __typeof__(cudnnDestroy) *destroy;
  __typeof__(cudnnBackendCreateDescriptor) *create_descriptor;
  __typeof__(cudnnBackendDestroyDescriptor) *destroy_descriptor;
  __typeof__(cudnnBackendSetAttribute) *set_attribute;
  __typeof__(cudnnBackendGetAttribute) *get_attribute;
  __typeof__(cudnnBackendFinalize) *finalize;
  __typeof__(cudnnBackendExecute) *execute;
};
extern CUDA_INTERNAL struct cuda_cudnn cudnn;
#endif

/* 1 when libcudnn is open (cudnn's functions set), opening it on the first call. */
CUDA_INTERNAL int cudnn_loaded(void);
/* The loaded library's version (91900 is 9.19.0), 0 when not loaded. */
CUDA_INTERNAL int cudnn_loaded_version(void);

/* One call's tensors, as attention_forward and _backward take them (a forward's dq, dk,
   dv NULL): which of them cuDNN reads or writes in place follows from their dtypes and
   alignment. */
struct sdpa_call {
  const void *q, *k, *v, *o, *d_o;
  void *dq, *dk, *dv;
  const float *lse;
};

/* Bytes of scratch cudnn_sdpa_forward (backward = 0) or _backward needs for this call;
   call after cudnn_routes said yes (its plans are then built). */
CUDA_INTERNAL uint64_t cudnn_sdpa_scratch_bytes(const struct backend_attention_shape *sh,
                                                const struct sdpa_call *c, int backward);
/* o and lse as the own kernels write them (lse: each row's natural-log log-sum-exp of the
   scaled visible scores, cuDNN's softmax stats, the same quantity), through cuDNN, with
   `scratch` (cudnn_sdpa_scratch_bytes, 256-byte aligned) held by the caller (cuda_rt.lock).
   *ran (true on the way in) turns false, with L2L_OK and nothing of the caller's written,
   where cuDNN refuses to run the plan it made (its entry then retired) or the entry was
   retired since cudnn_routes said yes: the caller runs the call on the own kernels. */
CUDA_INTERNAL l2l_status cudnn_sdpa_forward(bool *ran, void *o, float *lse, const void *q,
                                            const void *k, const void *v,
                                            const struct backend_attention_shape *sh,
                                            void *scratch);
/* The launches (kernels, copies, memsets and cuDNN's plan) a forward (backward = 0) or
   backward of this call queues, for the backend's count. */
CUDA_INTERNAL int cudnn_sdpa_launches(const struct backend_attention_shape *sh,
                                      const struct sdpa_call *c, int backward);
/* dq, dk, dv as the own kernels write them, through cuDNN; scratch and *ran as the forward's. */
CUDA_INTERNAL l2l_status cudnn_sdpa_backward(bool *ran, void *dq, void *dk, void *dv,
                                             const void *d_o, const void *o, const float *lse,
                                             const void *q, const void *k, const void *v,
                                             const struct backend_attention_shape *sh, void *scratch);

#endif /* L2L_CUDA_CUDNN_SDPA_H */
