/* SPDX-License-Identifier: MIT */
/* l2l.h — the one public header of libl2l.
 *
 * Purpose: everything a C program, or LuaJIT's FFI, needs to use l2l: status codes and
 * the per-thread error message, compute threads, memory pools, tensors, the counter-based
 * random generator and the tensor ops of the backends. It must never expose a backend's
 * internals, include a CUDA header, or declare anything a user cannot call.
 *
 * Conventions, stated once for every function below:
 *  - Fallible calls return l2l_status. On failure l2l_last_error() (per thread) names what
 *    was wrong, and no output tensor or statistic has been changed: arguments are checked
 *    in full before anything is written.
 *  - Constructors return their object through `T **out`, which comes first; op arguments
 *    come outputs first, then inputs, then parameters, then sizes. Destructors accept NULL.
 *    A handle is valid until its destructor: a freed one must not be passed again (its
 *    memory is gone; a check may catch it, but that is not promised).
 *  - Tensors are contiguous and row-major with 1 to 4 dims, each at least 1. Where an op
 *    treats a tensor as a matrix, its columns are the last dim and its rows are the product
 *    of the others ("rows" below).
 *  - Parameter gradients accumulate (+=); activation gradients are written (=).
 *  - Threads. What is process-wide (the pools, the compute threads, the device, MPI) may
 *    be used from any thread. A tensor, layer, parameter or plan is used by one thread at
 *    a time while it changes: threads may read one object together, but one that changes
 *    it must be alone (l2l does not check this). A relay checks: it takes one call at a
 *    time from any thread, and a call that overlaps another on the same relay (from
 *    another thread, or from a callback of its own layers inside its step) is refused
 *    with L2L_ERR_STATE and changes nothing; its queries then answer -1 or NULL, and
 *    l2l_relay_free leaves it whole. Relays that share no layer run on threads at once.
 *  - All tensors of one op live in one backend: the host and pinned pools belong to the
 *    CPU; the device pool belongs to the accelerator (on a CPU-only build, to the CPU too,
 *    but mixing it with host tensors is still refused, so that what runs on a CPU-only
 *    build runs unchanged on a GPU build).
 *
 * The block between L2L_FFI_BEGIN and L2L_FFI_END is plain C that LuaJIT's ffi.cdef
 * accepts (L2L_API aside, which the generator drops); lua/l2l/cdef.lua is generated from
 * it (make) and a spec fails if they drift. Keep includes and macros outside it.
 */
#ifndef L2L_H
#define L2L_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's surface: libl2l is built with hidden visibility, so the functions marked
   L2L_API here are exactly what libl2l.so exports (a spec compares them with nm's list);
   everything else inside is the parts' business. */
#if defined(__GNUC__)
#define L2L_API __attribute__((visibility("default")))
#else
#define L2L_API
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- status and errors */

typedef enum l2l_status {
  L2L_OK = 0,
  L2L_ERR_INVALID = 1,     /* a bad argument: NULL, shape, dtype, pool, value out of range */
  L2L_ERR_NOMEM = 2,       /* the system could not provide memory */
  L2L_ERR_BUDGET = 3,      /* a pool's byte budget would be exceeded */
  L2L_ERR_STATE = 4,       /* not possible in the object's present state */
  L2L_ERR_UNSUPPORTED = 5, /* a valid request this build cannot serve */
  L2L_ERR_BACKEND = 6,     /* a library below (BLAS, CUDA) failed */
  L2L_ERR_IO = 7           /* a file could not be made, read or written (the message names
                              it and why: a full disk, a missing directory, a file cut
                              short by another program) */
} l2l_status;

enum { L2L_MAX_DIMS = 4, L2L_ALIGN = 64, L2L_MAX_PARAMS = 12, L2L_PARAM_NAME_MAX = 24 };

/* The message of this thread's last failed call ("" if none). Valid until the next call
   into l2l on this thread. */
L2L_API const char *l2l_last_error(void);
L2L_API void l2l_clear_error(void);
L2L_API const char *l2l_status_name(l2l_status status);
L2L_API const char *l2l_version(void);

/* ---------------------------------------------------------------- compute threads */

/* Threads used by the CPU backend's loops and by OpenBLAS (never nested in each other).
   Default: the L2L_THREADS environment variable, else every core. */
L2L_API l2l_status l2l_set_threads(int threads);
L2L_API int l2l_get_threads(void);

/* ---------------------------------------------------------------- memory pools */

/* host:   jemalloc, called explicitly (mallocx/dallocx in an arena of l2l's own;
           jemalloc never replaces malloc).
   pinned: host memory for transfers: page-locked (cudaHostAlloc) when CUDA serves the
           device pool, plain host memory otherwise; kept for reuse up to a cap
           (l2l_pinned_set_cap), past which it falls back to pageable memory.
   device: the accelerator's memory; on a CPU-only build a host-backed pool with the same
           budget and accounting, so device-memory claims are testable without a GPU.
   Every allocation is counted as its size rounded up to L2L_ALIGN bytes. */
typedef enum l2l_pool_kind {
  L2L_POOL_HOST = 0,
  L2L_POOL_PINNED = 1,
  L2L_POOL_DEVICE = 2
} l2l_pool_kind;

typedef struct l2l_pool_stats {
  uint64_t current;  /* bytes in use now */
  uint64_t peak;     /* most bytes in use since start or the last reset_peak */
  uint64_t budget;   /* 0: no budget. The host pool's starts at the machine's memory, so
                        an allocation that can never succeed is refused at once */
  uint64_t allocs;   /* allocations served */
  uint64_t frees;
  uint64_t refused;  /* allocations refused (budget or out of memory) */
  uint64_t reserved;       /* bytes held from the system: current, plus what is kept
                              for reuse (freed pages; the CUDA device pool's and the
                              pinned pool's cached blocks) */
  uint64_t system_allocs;  /* calls to the system allocator (cudaMalloc on CUDA,
                              cudaHostAlloc for pinned): flat in a training loop's steady
                              state */
  uint64_t cap;            /* pinned: the most it holds page-locked (0: no cap) */
  uint64_t fallback;       /* pinned: bytes in use that came from pageable memory because
                              the cap was reached or the system refused to lock more */
  uint64_t fallback_allocs;
  uint64_t backend;        /* device: bytes the backend keeps for itself (CUDA: its scratch
                              and cuBLAS's workspace), in reserved and counted against the
                              budget: tensors get budget - backend - current */
} l2l_pool_stats;

L2L_API l2l_status l2l_pool_get_stats(l2l_pool_stats *out, l2l_pool_kind pool);
/* The spill files of every relay in this process (l2l_relay_config.spill_dir) in the same
   form: current (and peak) the bytes of regions that hold optimizer state, reserved the
   files' sizes (regions given back stay in a file for the next to reuse), allocs and frees
   the regions reserved and given back, system_allocs the files made; the rest 0. */
L2L_API l2l_status l2l_spill_get_stats(l2l_pool_stats *out);
/* 0 removes the budget; a budget below the bytes now in use is refused. */
L2L_API l2l_status l2l_pool_set_budget(l2l_pool_kind pool, uint64_t bytes);
L2L_API l2l_status l2l_pool_reset_peak(l2l_pool_kind pool);  /* peak := current */
/* The pinned pool holds at most `bytes` from the system (blocks in use and blocks kept
   for reuse; 0: no cap). Default: a quarter of the machine's memory. Past the cap a
   pinned allocation still succeeds, from pageable memory (copies from it are slower),
   and l2l warns on stderr the first time; stats.fallback counts those bytes. A lower cap
   gives cached blocks back at once; blocks in use stay until freed. */
L2L_API l2l_status l2l_pinned_set_cap(uint64_t bytes);
L2L_API const char *l2l_pool_name(l2l_pool_kind pool);      /* "host", "pinned", "device"; NULL if invalid */

/* ---------------------------------------------------------------- the device

   The device pool's memory and ops belong to one backend, chosen on first use: "cuda"
   (GPU memory through a caching allocator, CUDA kernels and cuBLAS) when this build has
   CUDA and a GPU is present, else "cpu" (host memory with the device pool's budget and
   accounting). The environment variable L2L_DEVICE=cpu|cuda overrides the choice. */
L2L_API const char *l2l_device_backend(void);               /* "cpu" or "cuda" */
/* Serve the device pool from `backend` ("cpu" or "cuda") from now on. Refused while
   device tensors exist, and for "cuda" when it cannot run here (the message says why). */
L2L_API l2l_status l2l_device_use(const char *backend);
/* 1 if the CUDA backend can run here; else 0, with the reason (built without CUDA, no
   GPU, driver too old, ...) in why[0..len) when why is not NULL. */
L2L_API int l2l_cuda_available(char *why, size_t len);

typedef struct l2l_cuda_info {
  char name[256];          /* e.g. "NVIDIA H100 80GB HBM3" */
  int major, minor;        /* compute capability */
  int multiprocessors;
  uint64_t total_bytes, free_bytes;
  int runtime_version, driver_version;  /* as CUDA encodes them: 13000 is 13.0 */
} l2l_cuda_info;
L2L_API l2l_status l2l_cuda_get_info(l2l_cuda_info *out);
/* f32 GEMMs on the GPU through TF32 tensor cores (about 1e-3 relative error instead of
   fp32's 1e-6; off by default). */
L2L_API l2l_status l2l_cuda_set_tf32(int enable);
/* Waits for all queued GPU work; a failure of that work is reported here. The CPU
   device backend has nothing queued: always L2L_OK. */
L2L_API l2l_status l2l_device_synchronize(void);
/* Returns the memory that freed tensors left cached, in every pool, to the system: the
   device cache (cudaFree) and the host-side arenas' pages. */
L2L_API l2l_status l2l_device_release_cache(void);

/* ---------------------------------------------------------------- tensors */

typedef enum l2l_dtype {
  L2L_F32 = 0,
  L2L_F16 = 1,
  L2L_BF16 = 2,
  L2L_I32 = 3,   /* token ids, targets */
  L2L_U8 = 4     /* masks, packed bits */
} l2l_dtype;

typedef struct l2l_tensor l2l_tensor;

L2L_API size_t l2l_dtype_size(l2l_dtype dtype);        /* 0 if invalid */
L2L_API const char *l2l_dtype_name(l2l_dtype dtype);   /* "f32", ...; NULL if invalid */

/* A new tensor with fresh storage from `pool`; its contents are undefined. */
L2L_API l2l_status l2l_tensor_new(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype, int ndim,
                                  const int64_t *shape);
/* Releases the handle; the storage goes when its last view goes. NULL is fine. */
L2L_API void l2l_tensor_free(l2l_tensor *t);
/* A view of rows [first, first+count) along dim 0: same storage, no copy. */
L2L_API l2l_status l2l_tensor_view_rows(l2l_tensor **out, const l2l_tensor *t, int64_t first,
                                        int64_t count);
/* A view with another shape of the same number of elements. */
L2L_API l2l_status l2l_tensor_reshape(l2l_tensor **out, const l2l_tensor *t, int ndim,
                                      const int64_t *shape);

/* Accessors never fail: for a NULL tensor (or a pointer that is no tensor) -1 / NULL. */
L2L_API int l2l_tensor_ndim(const l2l_tensor *t);
L2L_API int64_t l2l_tensor_dim(const l2l_tensor *t, int axis);
L2L_API int64_t l2l_tensor_numel(const l2l_tensor *t);
L2L_API int l2l_tensor_dtype(const l2l_tensor *t);
L2L_API int l2l_tensor_pool(const l2l_tensor *t);
L2L_API void *l2l_tensor_data(const l2l_tensor *t);
L2L_API int64_t l2l_tensor_offset(const l2l_tensor *t);        /* first element's index in its storage */
L2L_API int l2l_tensor_storage_refs(const l2l_tensor *t);      /* handles sharing the storage */

/* dst := src, same dtype and number of elements; any pools (a transfer). */
L2L_API l2l_status l2l_tensor_copy(l2l_tensor *dst, const l2l_tensor *src);
/* dst := src converted among f32, f16, bf16 and i32 (round to nearest even). A float to
   i32 cast refuses, before writing, any value that is not an integer within int32 range.
   dst and src in pools of one backend. */
L2L_API l2l_status l2l_tensor_cast(l2l_tensor *dst, const l2l_tensor *src);
/* Every element := value (converted to t's dtype; integer dtypes need an integer value
   within their range). */
L2L_API l2l_status l2l_tensor_fill(l2l_tensor *t, double value);

/* ---------------------------------------------------------------- random numbers */

/* Philox4x32-10 (Salmon et al., SC 2011): out = 10 rounds of the bijection of `counter`
   keyed by `key`. Every random number in l2l is a function of (seed, stream, index), so
   splitting a batch into micro-batches never changes a draw. */
L2L_API l2l_status l2l_philox4x32(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2);

/* Element i of t gets the draw with index first+i of (seed, stream). Pass the element's
   position in the whole batch as `first` and any split gives the same numbers. */
L2L_API l2l_status l2l_tensor_uniform(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                                      double lo, double hi);
L2L_API l2l_status l2l_tensor_normal(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                                     double mean, double std);

/* Scalar conversions with round to nearest even (NaN stays NaN, overflow gives inf). */
L2L_API uint16_t l2l_f32_to_bf16(float x);
L2L_API float l2l_bf16_to_f32(uint16_t x);
L2L_API uint16_t l2l_f32_to_f16(float x);
L2L_API float l2l_f16_to_f32(uint16_t x);

/* ---------------------------------------------------------------- ops
   f32 tensors unless stated. Shapes in comments: R = rows, C = columns. */

/* c = alpha * op(a) @ op(b) + beta * c, op(x) = x^T when trans_x is 1, x when 0 (other
   values are refused). As matrices: op(a) (M,K), op(b) (K,N), c (M,N); alpha and beta
   finite. With beta = 0, c is not read (NaN in c does not propagate). a and b may both
   be f16 or both bf16 (mixed precision): products accumulate in f32 into c (f32). */
L2L_API l2l_status l2l_gemm(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b, int trans_a,
                            int trans_b, float alpha, float beta);
/* The same for a batch of matrices: each tensor is (batch..., rows, cols) with the batch
   dims (all but the last two) multiplied into one count that must agree. */
L2L_API l2l_status l2l_gemm_batched(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b,
                                    int trans_a, int trans_b, float alpha, float beta);

L2L_API l2l_status l2l_bias_add(l2l_tensor *y, const l2l_tensor *bias);          /* y (R,C) += bias (C) */
L2L_API l2l_status l2l_bias_backward(l2l_tensor *dbias, const l2l_tensor *dy);   /* dbias (C) += sum_r dy */
/* out = a + b (the residual add); out may be a or b. */
L2L_API l2l_status l2l_add(l2l_tensor *out, const l2l_tensor *a, const l2l_tensor *b);

/* GELU, tanh form: y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). y may be x. */
L2L_API l2l_status l2l_gelu_forward(l2l_tensor *y, const l2l_tensor *x);
L2L_API l2l_status l2l_gelu_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *x);

/* LayerNorm over the last dim: y = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var+eps)
   with the biased variance; eps finite and > 0. mean and rstd (R) are saved for backward
   (NULL to skip). */
L2L_API l2l_status l2l_layernorm_forward(l2l_tensor *y, l2l_tensor *mean, l2l_tensor *rstd,
                                         const l2l_tensor *x, const l2l_tensor *weight,
                                         const l2l_tensor *bias, float eps);
/* dx written; dweight, dbias accumulated (either may be NULL). */
L2L_API l2l_status l2l_layernorm_backward(l2l_tensor *dx, l2l_tensor *dweight, l2l_tensor *dbias,
                                          const l2l_tensor *dy, const l2l_tensor *x,
                                          const l2l_tensor *weight, const l2l_tensor *mean,
                                          const l2l_tensor *rstd);

/* Row softmax of scale * x over the last dim (Tk), x (..., Tq, Tk). causal is 0 or 1; 1
   hides key j from query i when j > i + (Tk - Tq). key_mask (B, Tk) u8, 1 = real token,
   0 = padding, hides padded keys of sample b, where b is x's first index (x needs at least
   3 dims); NULL for none. A row whose keys are all hidden is all zeros. y may be x. */
L2L_API l2l_status l2l_softmax_forward(l2l_tensor *y, const l2l_tensor *x, const l2l_tensor *key_mask,
                                       int causal, float scale);
/* dx = scale * y * (dy - sum(dy * y)) per row; masked entries (y = 0) get 0. */
L2L_API l2l_status l2l_softmax_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *y,
                                        float scale);

/* out (N..., C) = table (V, C) rows picked by ids (N...) i32. The table may also be f16 or
   bf16 (widened exactly into out). Ids outside [0, V) are refused before anything is
   written. */
L2L_API l2l_status l2l_embedding_forward(l2l_tensor *out, const l2l_tensor *ids, const l2l_tensor *table);
/* dtable[ids[n]] += dout[n] (scatter-add; repeated ids sum). */
L2L_API l2l_status l2l_embedding_backward(l2l_tensor *dtable, const l2l_tensor *dout,
                                          const l2l_tensor *ids);

/* losses (R) = -log softmax(logits (R,V))[target] per row; rows whose target equals
   ignore_index get 0. Other targets outside [0, V) are refused. */
L2L_API l2l_status l2l_cross_entropy_forward(l2l_tensor *losses, const l2l_tensor *logits,
                                             const l2l_tensor *targets, int32_t ignore_index);
/* dlogits = scale * (softmax(logits) - onehot(target)); ignored rows get 0. For the mean
   over real tokens, scale = 1 / (number of real tokens in the whole batch). */
L2L_API l2l_status l2l_cross_entropy_backward(l2l_tensor *dlogits, const l2l_tensor *logits,
                                              const l2l_tensor *targets, int32_t ignore_index,
                                              float scale);

/* Inverted dropout: element i is kept when uniform draw first+i of (seed, stream) is below
   1 - p; y = x * kept / (1 - p). mask (ceil(numel/8)) u8 gets the kept bits, bit i%8 of
   byte i/8. 0 <= p < 1; y may be x. */
L2L_API l2l_status l2l_dropout_forward(l2l_tensor *y, l2l_tensor *mask, const l2l_tensor *x, float p,
                                       uint64_t seed, uint64_t stream, int64_t first);
L2L_API l2l_status l2l_dropout_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *mask,
                                        float p);

/* Reductions over every element, accumulated in double. */
L2L_API l2l_status l2l_sum(double *out, const l2l_tensor *x);
L2L_API l2l_status l2l_max_abs(double *out, const l2l_tensor *x);
L2L_API l2l_status l2l_norm2(double *out, const l2l_tensor *x);   /* sqrt(sum x^2) */

/* AdamW (Loshchilov & Hutter), one step t >= 1, bias-corrected, decoupled weight decay:
   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
   p -= lr * ( m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + weight_decay * p ).
   Refused: lr < 0, beta outside [0, 1), eps <= 0, weight_decay < 0, anything not finite. */
typedef struct l2l_adamw_config { float lr, beta1, beta2, eps, weight_decay; } l2l_adamw_config;
L2L_API l2l_status l2l_adamw_update(l2l_tensor *param, l2l_tensor *m, l2l_tensor *v,
                                    const l2l_tensor *grad, const l2l_adamw_config *config, int64_t step);

/* ---------------------------------------------------------------- layers
   A layer is a self-contained unit the relay can run one at a time: its parameters, a
   forward, a backward and an exact account of what the forward keeps for the backward.
   Shapes: B samples (a micro-batch), S positions, D = dim, H heads, F = MLP width,
   V = vocab, N = B*S rows. Every layer's forward and backward run on the backend of the
   tensors passed in; the layer's parameters must live in a pool of that backend. */

typedef enum l2l_layer_kind {
  L2L_LAYER_EMBEDDING = 0,  /* tokens (B,S) -> (B,S,D) */
  L2L_LAYER_BLOCK = 1,      /* (B,S,D) -> (B,S,D) */
  L2L_LAYER_LM_HEAD = 2,    /* (B,S,D) + targets (B,S) -> per-token losses (B,S) */
  L2L_LAYER_CLASSIFIER = 3, /* (B,S,D) + targets (B) -> per-sample losses (B) */
  L2L_LAYER_CUSTOM = 4      /* (B,S,D) -> (B,S,D), written elsewhere (l2l_layer_new_custom) */
} l2l_layer_kind;

/* What a block keeps for its backward (see the README's layer section):
   standard: what a textbook backward reads: LayerNorm inputs with mean and rstd, the GELU
             input and output, the S x S attention probabilities (after softmax and after
             dropout) and dropout masks as bits.
   frugal:   strictly less, same gradients: LayerNorm output and rstd (x^ = (y - b)/w in
             backward), GELU output plus one bit per element (which side of the tanh-form
             GELU's minimum, x = -0.7525, the input was on), attention's row log-sum-exp
             instead of any S x S matrix (recomputed tile by tile in backward), no dropout
             masks (regenerated from the counter-based generator). A LayerNorm whose
             weight has a channel with |w| < 1e-6 or |w| < |b|/64, where x^ cannot be
             recovered from y to float precision, falls back to standard for that
             LayerNorm in that call. The LM head's LayerNorm follows its layer's mode too. */
typedef enum l2l_memory_mode {
  L2L_MEMORY_STANDARD = 0,
  L2L_MEMORY_FRUGAL = 1
} l2l_memory_mode;

/* Fields a kind does not use are ignored. Parameter shapes (row-major, inputs first so
   that y = x @ W):
   embedding:  wte (V,D), wpe (max_seq,D), wtt (type_vocab,D) when type_vocab > 0.
   block:      ln1.weight, ln1.bias (D); attn.qkv.weight (D,3D), attn.qkv.bias (3D) with
               columns [q | k | v], head h using columns h*D/H .. (h+1)*D/H - 1 of each;
               attn.proj.weight (D,D), attn.proj.bias (D); ln2.weight, ln2.bias (D);
               mlp.fc.weight (D,F), mlp.fc.bias (F); mlp.proj.weight (F,D), mlp.proj.bias
               (D). Biases of linear maps only when bias = 1. Pre-LN (GPT-2):
               h = x + drop(attn(ln1(x))); y = h + drop(mlp(ln2(h))). Post-LN (BERT):
               h = ln1(x + drop(attn(x))); y = ln2(h + drop(mlp(h))).
   LM head:    ln.weight, ln.bias (D) when final_ln = 1; proj.weight (V,D), logits =
               ln(x) @ proj.weight^T (no bias), unless tied to an embedding's wte.
   classifier: weight (D,C), bias (C) on the first position's features.
   Initial values: linear weights and embeddings N(0, init_std^2) (the two residual
   projections N(0, resid_std^2), e.g. init_std/sqrt(2 layers) as in GPT-2), biases 0,
   LayerNorm weights 1; drawn from (init_seed, the parameter's place in the list above),
   so layers of one kind and seed start equal. */
typedef struct l2l_layer_config {
  l2l_layer_kind kind;
  int64_t dim;           /* D */
  int64_t heads;         /* block: H, dividing D */
  int64_t mlp;           /* block: F */
  int64_t vocab;         /* embedding, LM head: V */
  int64_t max_seq;       /* embedding: positions */
  int64_t type_vocab;    /* embedding: token types (0: none) */
  int64_t classes;       /* classifier: C */
  int causal;            /* block: 1 hides later positions */
  int post_ln;           /* block: 0 pre-LN (GPT-2), 1 post-LN (BERT) */
  int bias;              /* block: 1 gives the linear maps biases */
  int final_ln;          /* LM head: 1 applies a LayerNorm before the projection */
  float dropout;         /* embedding output, both residual branches; in [0, 1) */
  float attn_dropout;    /* block: attention probabilities; in [0, 1) */
  float eps;             /* LayerNorm epsilon, > 0 */
  l2l_memory_mode memory;
  float init_std;        /* > 0 */
  float resid_std;       /* > 0 */
  uint64_t init_seed;
} l2l_layer_config;

/* A parameter record: the value, its gradient accumulator (same shape, f32) and a name.
   One record may be used by several layers (an LM head tied to the embedding): every user
   adds into the same gradient, so whoever updates the record sees their sum. */
typedef struct l2l_param l2l_param;
typedef struct l2l_layer l2l_layer;
/* What a forward kept for its backward; owned by the caller. */
typedef struct l2l_saved l2l_saved;

/* What a layer call sees beyond its input tensor. Backward must get the same batch (and
   rng fields) as the forward it undoes. Dropout draws are the Philox draws (see
   l2l_tensor_uniform) of (seed, stream, index) with
     stream = step * 2^32 + rng_id * 2^8 + site,
     index  = (first_sample + b) * E + e,
   e the element's place in sample b and E the elements per sample at that site; an
   element is kept when its draw's top 24 bits are below round((1 - p) 2^24). Sites:
   embedding 0 (output, E = S*D); block 0 (attention probabilities, E = H*S*S, e =
   (h*S + i)*S + j), 1 (attention branch, E = S*D), 2 (MLP branch, E = S*D). */
typedef struct l2l_layer_batch {
  const l2l_tensor *tokens;       /* embedding: (B,S) i32 in [0, V) */
  const l2l_tensor *token_types;  /* embedding with type_vocab > 0: (B,S) i32; else NULL */
  const l2l_tensor *targets;      /* LM head (B,S), classifier (B): i32, -1 = ignored.
                                     NULL: the head writes logits instead of losses */
  const l2l_tensor *key_mask;     /* block: (B,S) u8, 1 = real token, 0 = padding; NULL */
  int64_t first_sample;           /* index of this micro-batch's first sample, >= 0 */
  uint64_t seed;
  uint64_t step;
  int training;                   /* 0: no dropout */
  float loss_scale;               /* heads' backward: d(loss)/d(each loss), e.g.
                                     1/(real targets in the whole minibatch) */
} l2l_layer_batch;

/* Bytes a layer needs for one call on B samples of S positions (f32, this build's
   threads). The forward allocates `saved` (kept until l2l_saved_free) and `work_forward`
   (freed before it returns) from the pool of its output; the backward allocates
   `work_backward`. So beyond x, y, dy, dx and the parameters the pool holds at most
   peak = saved + max(work_forward, work_backward) during a forward and backward.
   input_kept / output_kept: bytes of x / y the saved state holds by reference (the caller
   must not change them before the backward). */
typedef struct l2l_layer_memory {
  uint64_t params;
  uint64_t saved;
  uint64_t input_kept;
  uint64_t output_kept;
  uint64_t work_forward;
  uint64_t work_backward;
  uint64_t peak;
} l2l_layer_memory;

/* A layer with freshly initialized parameters (and zero gradients) in `pool`. */
L2L_API l2l_status l2l_layer_new(l2l_layer **out, const l2l_layer_config *config, l2l_pool_kind pool);
/* The records l2l_layer_new would make for `config` (same checks, same order), without
   allocating: a loader checks a file against a description (a few bytes may describe
   terabytes) before it builds. *count: their number; out has room for `capacity`. Not
   for the custom kind (its records are its caller's list). */
typedef struct l2l_param_info { char name[L2L_PARAM_NAME_MAX]; int ndim; int64_t shape[L2L_MAX_DIMS]; int decays; } l2l_param_info;
L2L_API l2l_status l2l_layer_config_params(l2l_param_info *out, int capacity, int *count,
                                           const l2l_layer_config *config);
/* Frees the layer; one a relay holds goes on working until the relay lets it go
   (l2l_relay_remove, l2l_relay_replace, l2l_relay_free), which then frees it. */
L2L_API void l2l_layer_free(l2l_layer *layer);
/* A deep copy: new parameter records (values copied, gradients zero) and a new rng id. */
L2L_API l2l_status l2l_layer_clone(l2l_layer **out, const l2l_layer *layer);
/* The LM head's projection becomes the embedding's wte record (same D and V needed). */
L2L_API l2l_status l2l_layer_tie(l2l_layer *head, l2l_layer *embedding);
L2L_API l2l_status l2l_layer_get_config(l2l_layer_config *out, const l2l_layer *layer);
/* Switches a block between standard and frugal (parameters unchanged). */
L2L_API l2l_status l2l_layer_set_memory(l2l_layer *layer, l2l_memory_mode memory);
/* The id that keys this layer's dropout draws: unique per process by default, < 2^24. */
L2L_API uint32_t l2l_layer_rng_id(const l2l_layer *layer);
L2L_API l2l_status l2l_layer_set_rng_id(l2l_layer *layer, uint32_t rng_id);

L2L_API int l2l_layer_param_count(const l2l_layer *layer);              /* -1 if not a layer */
L2L_API l2l_param *l2l_layer_param(const l2l_layer *layer, int index);  /* NULL if out of range */
L2L_API int64_t l2l_layer_nparams(const l2l_layer *layer);              /* scalars, tied ones included */
L2L_API l2l_status l2l_layer_zero_grad(l2l_layer *layer);
L2L_API l2l_status l2l_layer_memory_use(l2l_layer_memory *out, const l2l_layer *layer,
                                        int64_t micro_batch, int64_t seq);

L2L_API const char *l2l_param_name(const l2l_param *param);
L2L_API l2l_tensor *l2l_param_value(const l2l_param *param);   /* borrowed: do not free */
L2L_API l2l_tensor *l2l_param_grad(const l2l_param *param);    /* borrowed: do not free */
L2L_API int l2l_param_users(const l2l_param *param);            /* layers using this record */
/* 1 for the weights of linear maps (weight decay applies by default); 0 for biases,
   LayerNorm and embedding tables. */
L2L_API int l2l_param_decays(const l2l_param *param);

/* y := layer(x). x is NULL for the embedding (it reads batch->tokens); y is (B,S,D), or for
   a head the losses ((B,S) or (B)), or with batch->targets NULL the logits ((B,S,V) or
   (B,C)). saved NULL: inference, nothing kept. Otherwise *saved gets what the backward
   needs (NULL for a head called without targets). */
L2L_API l2l_status l2l_layer_forward(l2l_saved **saved, l2l_layer *layer, l2l_tensor *y,
                                     const l2l_tensor *x, const l2l_layer_batch *batch);
/* dx := d(loss)/dx (NULL for the embedding) and every parameter gradient += its share,
   given dy = d(loss)/dy (NULL for heads: batch->loss_scale is used). Consumes `saved`'s
   contents: a saved state serves one backward. */
L2L_API l2l_status l2l_layer_backward(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                      l2l_saved *saved, const l2l_layer_batch *batch);
L2L_API void l2l_saved_free(l2l_saved *saved);
L2L_API uint64_t l2l_saved_bytes(const l2l_saved *saved);   /* pool bytes it holds; 0 for NULL */

/* ---------------------------------------------------------------- layers written elsewhere
   A custom layer kind (e.g. written in Lua with l2l's ops): (B,S,D) -> (B,S,D), with
   parameter records like a built-in kind. The relay streams, stashes, recomputes and
   updates it like any block. Its forward keeps nothing but a reference to x: its backward
   gets x again and recomputes what it needs. The functions are called on the thread that
   called l2l (never on a copy or optimizer thread), with the layer's parameters bound to
   tensors in the pool of x (l2l_param_value / l2l_param_grad return those during the
   call). They return 0 on success; anything else fails the l2l call with
   L2L_ERR_BACKEND, naming the layer (the caller keeps its own message). */
typedef int (*l2l_custom_forward_fn)(void *user, l2l_layer *layer, l2l_tensor *y,
                                     const l2l_tensor *x, const l2l_layer_batch *batch);
typedef int (*l2l_custom_backward_fn)(void *user, l2l_layer *layer, l2l_tensor *dx,
                                      const l2l_tensor *dy, const l2l_tensor *x,
                                      const l2l_layer_batch *batch);
typedef struct l2l_custom_param {
  const char *name;        /* < 24 bytes */
  int ndim;
  int64_t shape[4];
  float init_std;          /* > 0: N(0, init_std^2); 0: the constant init_value */
  float init_value;
  int decays;              /* 1: weight decay applies by default */
} l2l_custom_param;
/* kind is L2L_LAYER_CUSTOM in l2l_layer_get_config; config.dim = dim. At most 12
   parameters. */
L2L_API l2l_status l2l_layer_new_custom(l2l_layer **out, const char *name, int64_t dim,
                                        const l2l_custom_param *params, int nparams,
                                        l2l_custom_forward_fn forward, l2l_custom_backward_fn backward,
                                        void *user, uint64_t init_seed, l2l_pool_kind pool);
/* The name given to l2l_layer_new_custom, or the kind's name ("block", ...). */
L2L_API const char *l2l_layer_name(const l2l_layer *layer);

/* ---------------------------------------------------------------- optimizers
   Host optimizers of the EPS, applied per parameter record in fp32 on worker threads.
   g below is the gradient after accumulation and clipping; t counts updates from 1.
   SGD:   b = momentum b + g (b = g at t = 1); p -= lr (g + momentum b) with nesterov,
          else lr b; weight decay (decoupled): p -= lr weight_decay p first.
   AdamW: as l2l_adamw_update.
   LAMB:  r = m^/(sqrt(v^) + eps) + weight_decay p (m^, v^ as AdamW);
          p -= lr * trust * r, trust = |p| / |r| (1 when either norm is 0), per record.
   Weight decay applies to the records l2l_param_decays marks (linear weights) unless
   decay_all = 1. */
typedef enum l2l_optimizer_kind {
  L2L_OPTIMIZER_SGD = 0,
  L2L_OPTIMIZER_ADAMW = 1,
  L2L_OPTIMIZER_LAMB = 2
} l2l_optimizer_kind;

typedef struct l2l_optimizer_config {
  l2l_optimizer_kind kind;
  float lr;              /* >= 0, the base rate the schedule scales */
  float momentum;        /* SGD, in [0, 1) */
  int nesterov;          /* SGD, 0 or 1 (needs momentum > 0) */
  float beta1, beta2;    /* AdamW, LAMB: in [0, 1) */
  float eps;             /* AdamW, LAMB: > 0 */
  float weight_decay;    /* >= 0 */
  int decay_all;         /* 1: decay biases, LayerNorm and embeddings too */
} l2l_optimizer_config;

/* The optimizer state arrays a record keeps from its first update on, each the size of
   its parameter: SGD 1 with momentum > 0, else 0; AdamW and LAMB 2. The config is
   checked first. */
L2L_API l2l_status l2l_optimizer_state_arrays(int *out, const l2l_optimizer_config *config);

/* Learning rate at update t (1-based): base * factor(t).
   constant: 1 after warm-up. cosine: after warm-up, from 1 down to final_ratio at t =
   total along half a cosine. linear: likewise along a straight line. Warm-up: factor
   t / warmup for t <= warmup. After total: final_ratio. */
typedef enum l2l_schedule_kind {
  L2L_SCHEDULE_CONSTANT = 0,
  L2L_SCHEDULE_COSINE = 1,
  L2L_SCHEDULE_LINEAR = 2
} l2l_schedule_kind;

typedef struct l2l_schedule_config {
  l2l_schedule_kind kind;
  int64_t warmup;        /* >= 0 updates */
  int64_t total;         /* cosine, linear: > warmup */
  float final_ratio;     /* in [0, 1] */
} l2l_schedule_config;

L2L_API l2l_status l2l_schedule_lr(double *out, const l2l_schedule_config *schedule, double base_lr,
                                   int64_t t);

/* ---------------------------------------------------------------- the relay and the EPS
   A relay trains a list of layers whose parameters live in the host pool: the eager
   parameter server (EPS) keeps, per parameter record, the fp32 master (the record's value
   tensor), the gradient accumulator (the record's grad tensor), the optimizer state and
   a staging copy in the pinned pool. A step runs the layers one at a time on the device
   pool's backend: forward over layers with a micro-batch inner loop, then backward in
   reverse; each layer's parameters are copied into one of two device slots while the
   previous layer computes; when a layer's gradient is complete for the minibatch, its
   update runs on the optimizer threads while the device goes on with earlier layers.
   The next step's forward of a layer waits only for that layer's update.
   A layer may be in one relay at a time; freed while there, it is freed when the relay
   lets it go. Between steps the model may change (insert, remove,
   replace, freeze); every other record keeps its weights and optimizer state.
   Result: the same as plain whole-batch training (one pass, every activation kept) to
   float rounding, for any micro-batch size and any policy. */
typedef struct l2l_relay l2l_relay;

/* Where the activations at a layer boundary (the input of layer l, l >= 1) wait for the
   backward: device (memory grows with depth), host (copied out and back, overlapped:
   device memory constant in depth), or recompute (dropped; rebuilt in backward from the
   nearest earlier boundary that is kept). The gradient crossing a host boundary goes
   through the host too. */
typedef enum l2l_stash_policy {
  L2L_STASH_DEVICE = 0,
  L2L_STASH_HOST = 1,
  L2L_STASH_RECOMPUTE = 2
} l2l_stash_policy;

/* What a layer's backward needs from its forward: recompute (rerun the forward from the
   stashed input, L2L's default), keep (the saved state stays in the device pool from
   forward to backward), swap (the saved state goes to the host after forward and comes
   back before backward, overlapped with other work: KARMA's swap). */
typedef enum l2l_inner_policy {
  L2L_INNER_RECOMPUTE = 0,
  L2L_INNER_KEEP = 1,
  L2L_INNER_SWAP = 2
} l2l_inner_policy;

/* Data parallel (see "data parallel" below). */
typedef enum l2l_dist_mode { L2L_DIST_NONE = 0, L2L_DIST_MPI = 1 } l2l_dist_mode;

typedef struct l2l_relay_config {
  int64_t micro_batch;          /* samples per micro-batch, >= 1; the last may be smaller */
  l2l_stash_policy stash;       /* every boundary's policy to begin with */
  int recompute_every;          /* stash = recompute: boundaries k, 2k, ... stay on the
                                   device, the others are rebuilt; >= 1 */
  l2l_inner_policy inner;       /* every layer's policy to begin with */
  l2l_optimizer_config optimizer;
  l2l_schedule_config schedule;
  float clip_global_norm;       /* > 0: scale all gradients to this global norm at most;
                                   updates then wait for the end of backward. 0: off */
  float clip_layer_norm;        /* > 0: each layer's gradient (its visit's contribution)
                                   to this norm at most; updates stay eager. 0: off */
  int accumulate;               /* minibatches whose mean gradient makes one update, >= 1 */
  int optimizer_threads;        /* EPS worker threads, >= 1; 0: the number of cores */
  uint64_t seed;                /* dropout draws (l2l_layer_batch.seed) */
  int param_slots;              /* device buffers for layer parameters, each the size of the
                                   largest layer: 2 (L2L's double buffer: the visit's and
                                   the next one's; 0 means 2) to 4096. Each more one keeps
                                   one more of the forward's last layers on the device for
                                   their backward, which then copies nothing for them;
                                   slots >= layers copy each layer in once a step. */
  float loss_scale;             /* > 0: dynamic loss scaling (for 16-bit gradients; works on
                                   any device) starting at this scale: the loss gradient is
                                   multiplied by it and the update divides it out; a
                                   minibatch whose gradients hold an inf or NaN anywhere
                                   updates nothing (stats.skipped_updates) and halves the
                                   scale, loss_scale_window updates in a row without one
                                   double it (within 2^-64 .. 2^100). Updates then wait for
                                   the end of backward. 0: off */
  int loss_scale_window;        /* updates without overflow before the scale doubles,
                                   >= 1 (the default: 2000; 0 means 2000 too) */
  l2l_dtype precision;          /* the device's weights: f32, or bf16 / f16 ("cross mixed
                                   precision"; l2l_relay_config_default picks bf16 when the
                                   device pool is a GPU's, f32 on the CPU backend): the
                                   masters and optimizer
                                   state stay f32 on the host; each GEMM weight and token
                                   table has a 16-bit staging copy the EPS workers rewrite
                                   at every step's start, so transfers move 16-bit weights
                                   and the layers' GEMMs read 16-bit weights and 16-bit-
                                   rounded activations, accumulating in f32 (so do the
                                   attention products on a GPU). f16 wants loss_scale. */
  l2l_dtype grad_precision;     /* gradients out of the device: f32 (0, the default), or
                                   bf16 / f16: the gradient of each GEMM weight and token
                                   table (the parameters `precision` makes 16-bit, whatever
                                   `precision` is) still accumulates over the visit's
                                   micro-batches in f32 on the device, is rounded once to
                                   16 bits and crosses at half the bytes; the host widens
                                   it and accumulates in f32. Other gradients stay f32. f16
                                   needs loss_scale, which keeps gradients in f16's range and
                                   skips a step where one became inf. */
  l2l_dist_mode dist;           /* L2L_DIST_NONE (0): this process alone. L2L_DIST_MPI: data
                                   parallel across the ranks of MPI_COMM_WORLD (see "data
                                   parallel"); every rank makes the same relay over the
                                   same model and steps it with its own slice of each
                                   minibatch */
  int nonfinite_error;          /* a record whose gradient holds an inf or NaN is not updated
                                   (with loss scaling or global clipping: no record is). 0: said
                                   once on stderr; 1: the step then returns L2L_ERR_STATE */
  uint64_t device_budget;       /* > 0: the device bytes this relay's steps and evaluations
                                   may hold at their peak (its slots, activations and
                                   working memory: the planner's replay of the step, checked
                                   before it runs, which refuses a step over it with the
                                   smallest budget that works). Two relays may hold
                                   different budgets. 0: none of its own. The device pool's
                                   budget (l2l_pool_set_budget) is the process's cap over
                                   every relay and tensor, checked too */
  uint64_t host_budget;         /* > 0: the host bytes this relay's EPS may hold (masters,
                                   gradient accumulators, staging copies, optimizer state
                                   in memory and read ahead), checked before each training
                                   step: with spill_dir the optimizer state of the records
                                   beyond it lives in the spill file, else a step over it
                                   is refused, naming the smallest that works. 0: none */
  const char *spill_dir;        /* NULL: the EPS lives in host memory. A directory (which
                                   must exist, on a local disk): the relay's spill file
                                   (l2l-spill-<pid>-<n>.bin) is made there, and the
                                   optimizer state of every record host_budget does not
                                   keep in memory lives in it between its updates, read
                                   ahead of its update in the schedule's order and written
                                   back behind it; the numbers are the same to the bit.
                                   The file is removed with the relay; one a crashed run
                                   left is named on stderr, never reused. Copied. With
                                   dist each rank spills its own shard's state. Under a
                                   host_budget too small for them all, the gradient
                                   accumulators, zero between updates, give their pages
                                   back then (stats.spill_grad_waits) */
} l2l_relay_config;

/* AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), constant schedule, micro-
   batch 1, stash host, every 1, inner recompute, no clipping, accumulate 1, threads 0,
   param slots 2, precision bf16 when the device pool is on a GPU (f32 on the CPU backend),
   grad_precision f32. */
L2L_API void l2l_relay_config_default(l2l_relay_config *out);

/* What one step (or evaluation) gets. tokens (B,S) i32 in [0, V) and targets ((B,S) for an
   LM head, (B) for a classifier; i32, -1 = ignored) in the host or pinned pool; optional
   token_types (B,S) i32 and key_mask (B,S) u8 likewise. skip: NULL, or one byte per layer,
   1 = skip that block this step (LayerDrop: it acts as the identity and is not updated;
   only blocks and custom layers can be skipped). */
typedef struct l2l_relay_batch {
  const l2l_tensor *tokens;
  const l2l_tensor *targets;
  const l2l_tensor *token_types;
  const l2l_tensor *key_mask;
  const uint8_t *skip;
} l2l_relay_batch;

/* Work the relay records for a timeline: every unit of work with its layer (-1: none),
   micro-batch (-1: none), phase, thread (0 the calling thread, 1 the host-to-device copy
   thread, 2 the device-to-host copy thread, 3.. optimizer workers) and times in seconds
   since the relay was made. */
typedef enum l2l_relay_phase {
  L2L_PHASE_FORWARD = 0,
  L2L_PHASE_BACKWARD = 1,     /* includes the forward rerun of inner = recompute */
  L2L_PHASE_REBUILD = 2,      /* a dropped boundary rebuilt by rerunning forward */
  L2L_PHASE_PARAMS_IN = 3,    /* parameters into a device slot */
  L2L_PHASE_GRADS_OUT = 4,    /* a layer's gradient out of the device */
  L2L_PHASE_STASH_OUT = 5,    /* boundary activations or gradients to the host */
  L2L_PHASE_STASH_IN = 6,
  L2L_PHASE_SWAP_OUT = 7,     /* a saved state to the host */
  L2L_PHASE_SWAP_IN = 8,
  L2L_PHASE_UPDATE = 9,       /* the optimizer on one parameter record */
  L2L_PHASE_WAIT_COPY = 10,   /* the calling thread waited for a copy */
  L2L_PHASE_WAIT_UPDATE = 11, /* the calling thread waited for an update */
  L2L_PHASE_REDUCE_SCATTER = 12,  /* data parallel: a record's gradient summed across ranks
                                     (from posting to completion, on the communication
                                     thread's lane: 3 + optimizer_threads) */
  L2L_PHASE_ALL_GATHER = 13   /* data parallel: a record's updated master gathered */
} l2l_relay_phase;

typedef struct l2l_relay_event {
  int32_t layer;
  int32_t micro_batch;
  int32_t phase;
  int32_t thread;
  double start, end;
} l2l_relay_event;

/* After each step (figures of that step unless "total"). Seconds are wall time on the
   thread that did the work. */
typedef struct l2l_relay_stats {
  int64_t steps;                /* total steps run */
  int64_t updates;              /* total optimizer updates (of the whole model) */
  double loss;                  /* the last step's loss */
  double lr;                    /* the rate of the last update */
  double grad_norm;             /* global gradient norm before clipping, computed with global
                                   clipping or loss scaling (inf or NaN: an overflow; -1:
                                   not computed) */
  int updates_deferred;         /* 1: updates waited for the end of backward (global
                                   clipping, loss scaling) */
  uint64_t device_peak;         /* the step's device peak: the device pool's bytes in use when
                                   it began plus the most its own allocations added (those
                                   of relays stepping at once on other threads do not count;
                                   the pool's own peak is the process's, left to the user) */
  uint64_t device_current;      /* in use after it */
  uint64_t host_eps_bytes;      /* EPS: masters, accumulators, optimizer state, staging */
  uint64_t host_stash_peak;     /* most host bytes holding stashed activations or states */
  uint64_t h2d_bytes, d2h_bytes;
  double step_seconds;          /* the call, from its checks to its return: every time below
                                   spent on the calling or a copy thread lies within it */
  double compute_seconds;       /* layers' forward and backward: on the CPU backend the
                                   calling thread's time in them, on a GPU the device's
                                   (timed by events on its compute stream) */
  double wait_copy_seconds;     /* the calling thread waiting for copies (on a GPU the
                                   device may still be computing meanwhile) */
  double exposed_copy_seconds;  /* the copy time compute did not hide: compute idle until
                                   parameters or activations it needed were in (on the CPU
                                   backend the calling thread's waits for them, on a GPU
                                   the device's idle time before those copies ended) */
  double wait_update_seconds;   /* the calling thread waiting for updates: the optimizer
                                   time compute did not hide */
  double optimizer_seconds;     /* summed over optimizer threads */
  double h2d_seconds, d2h_seconds;  /* busy on each copy thread (its bytes / its seconds:
                                       the rate that direction reached) */
  int64_t events;               /* events recorded in the step (l2l_relay_events) */
  double loss_scale;            /* dynamic loss scaling: the scale the next step uses (0:
                                   off) */
  int64_t loss_scale_good;      /* updates without overflow since the scale last changed */
  int64_t skipped_updates;      /* total steps whose update was skipped for an inf or NaN:
                                   in whole (overflow) or for some records (skipped_records) */
  int overflow;                 /* 1: the last step's gradients overflowed (no update) */
  int64_t skipped_records;      /* last step: records whose inf or NaN gradient was dropped
                                   and their update skipped (see nonfinite_error) */
  int dist_ranks;               /* data parallel: the ranks (1: this process alone) */
  uint64_t dist_sent_bytes;     /* the last update's exchanges: what this rank's collectives */
  uint64_t dist_received_bytes; /* send and receive, as a ring moves them ((N - 1) / N of each
                                   record's f32 gradient by reduce-scatter, as much again by
                                   all-gather; none for a skipped record; not counted on
                                   the wire) */
  uint64_t spill_read_bytes;    /* the spill file (config.spill_dir), since the last step
                                   began: bytes read back and written out (a step's updates
                                   may end after it returns: read the stats after
                                   l2l_relay_sync for a step's whole) */
  uint64_t spill_written_bytes;
  int64_t spill_late_reads;     /* of them, records whose state was read at their update
                                   rather than ahead of it (the read-ahead window was full) */
  int64_t spill_grad_waits;     /* gradient arrivals that waited for room among the passing
                                   accumulators (in memory from their arrival to their
                                   update: with a spill file every gradient accumulator
                                   is zero between updates and gives its pages back; see
                                   host_budget) */
  uint64_t spill_file_bytes;    /* the spill file's size */
  double exposed_comm_seconds;  /* last step: the calling thread waiting for MPI: the
                                   exchanges of counts and losses, and records whose
                                   exchange was not done when it needed them */
} l2l_relay_stats;

/* A relay over layers[0..nlayers) (the list may be empty only until the first step):
   checks the config and the layers (parameters in the host pool, f32; a layer's output
   dim matches the next one's input) and makes the EPS records. */
L2L_API l2l_status l2l_relay_new(l2l_relay **out, l2l_layer *const *layers, int nlayers,
                                 const l2l_relay_config *config);
/* The checks l2l_relay_new makes of a config, alone (l2l.plan asks them of the settings it
   plans for, so that a plan is never made for a relay that would be refused). */
L2L_API l2l_status l2l_relay_config_check(const l2l_relay_config *config);
/* Waits for pending work, then frees the EPS's state (not the layers, but those freed while
   it held them). NULL is fine. A relay in another call (see "Threads" above) is not freed:
   l2l_last_error says so. */
L2L_API void l2l_relay_free(l2l_relay *run);

L2L_API int l2l_relay_layer_count(const l2l_relay *run);  /* -1 if not a relay or in another call */
L2L_API l2l_layer *l2l_relay_layer(const l2l_relay *run, int index);    /* NULL if out of range */
/* The relay holding the layer: NULL if none (or not a layer). */
L2L_API l2l_relay *l2l_layer_relay(const l2l_layer *layer);
/* Dynamic architecture, between steps. insert: the layer goes to position index (0..n),
   its new records start with fresh optimizer state. remove: the layer leaves the relay
   (not freed, unless l2l_layer_free was called while it was there); records nobody else
   uses leave the EPS. replace: remove + insert. */
L2L_API l2l_status l2l_relay_insert(l2l_relay *run, int index, l2l_layer *layer);
L2L_API l2l_status l2l_relay_remove(l2l_relay *run, int index);
L2L_API l2l_status l2l_relay_replace(l2l_relay *run, int index, l2l_layer *layer);
/* A frozen layer still passes gradients back but its records are not updated (a record
   shared with a trainable layer is updated from that layer's gradient alone). */
L2L_API l2l_status l2l_relay_set_frozen(l2l_relay *run, int index, int frozen);
L2L_API int l2l_relay_frozen(const l2l_relay *run, int index);           /* -1 if out of range */
/* Boundary b is the input of layer b, 1 <= b < layers. Policies follow their boundary or
   layer through insertions and removals; new ones get the config's default. */
L2L_API l2l_status l2l_relay_set_stash(l2l_relay *run, int boundary, l2l_stash_policy policy);
L2L_API l2l_status l2l_relay_set_inner(l2l_relay *run, int index, l2l_inner_policy policy);
L2L_API l2l_status l2l_relay_set_micro_batch(l2l_relay *run, int64_t micro_batch);
/* config.device_budget from the next step on (0: none of its own). */
L2L_API l2l_status l2l_relay_set_device_budget(l2l_relay *run, uint64_t bytes);
/* config.host_budget from the next training step on (0: none). */
L2L_API l2l_status l2l_relay_set_host_budget(l2l_relay *run, uint64_t bytes);
/* The policy of a boundary or layer (an l2l_stash_policy / l2l_inner_policy), -1 if out
   of range. */
L2L_API int l2l_relay_stash(const l2l_relay *run, int boundary);
L2L_API int l2l_relay_inner(const l2l_relay *run, int index);

/* One training step on a minibatch: *loss = mean loss over all real targets. The update
   (on the last of `accumulate` minibatches) may still be running on the optimizer threads
   when this returns; the next step, l2l_relay_sync and reading a parameter through the
   relay's functions wait for it. */
L2L_API l2l_status l2l_relay_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch);
/* Forward only, no dropout, nothing stashed, no update: the mean loss. */
L2L_API l2l_status l2l_relay_evaluate(double *loss, l2l_relay *run, const l2l_relay_batch *batch);
/* *peak: the device bytes a training step of a (batch, seq) minibatch needs at its peak
   with the relay's layers, policies and settings as they are (every layer active),
   whatever values the weights take as training goes on (the frugal modes keep more for a
   LayerNorm whose weight gets tiny): the planner's replay of the step, exact to the byte
   for the weights that need the most (with swap, the bound that holds whatever the
   copies' timing). A relay device_budget of this runs every such step (so does a device
   pool budget of the bytes in use plus this).
   token_types, key_mask: 0 or 1, whether the batch has them. */
L2L_API l2l_status l2l_relay_step_peak(uint64_t *peak, const l2l_relay *run, int64_t batch, int64_t seq,
                                       int token_types, int key_mask);
/* Waits until every queued update is done (parameters readable and stable). */
L2L_API l2l_status l2l_relay_sync(l2l_relay *run);

L2L_API l2l_status l2l_relay_get_stats(l2l_relay_stats *out, const l2l_relay *run);
/* Copies events first .. first+count-1 of the last step (count <= stats.events - first). */
L2L_API l2l_status l2l_relay_events(l2l_relay_event *out, const l2l_relay *run, int64_t first,
                                    int64_t count);
/* The optimizer state of a record in the relay: which = 0 the first moment (SGD: the
   momentum buffer), 1 the second moment. *out is borrowed (NULL while the record has none
   yet, e.g. before its first update) until the next step, or until this is asked of
   another record (a copy read from the spill file or gathered from the ranks is freed
   then: a checkpoint holds one record's state at a time). Waits for pending updates. */
L2L_API l2l_status l2l_relay_param_state(l2l_tensor **out, l2l_relay *run, const l2l_param *param,
                                         int which);

/* Checkpoints: what a relay holds beyond its layers' parameters, read and restored, so a
   run rebuilt from saved layers continues exactly. A record's update count is the t of its
   last update (0 before the first); l2l_relay_restore_param gives a record that count and
   copies of its optimizer state (first, second: f32 with the parameter's element count,
   NULL for arrays the optimizer does not keep, both NULL when updates is 0).
   l2l_relay_restore_progress sets the steps and updates done, which place the schedule and
   the dropout draws; l2l_relay_restore_loss_scale the dynamic loss scale, its count of good
   updates and the skipped updates (as stats report them; the relay must scale its loss).
   All wait for pending updates; a refused call changes nothing. */
L2L_API l2l_status l2l_relay_param_updates(int64_t *out, l2l_relay *run, const l2l_param *param);
L2L_API l2l_status l2l_relay_restore_param(l2l_relay *run, const l2l_param *param, int64_t updates,
                                           const l2l_tensor *first, const l2l_tensor *second);
L2L_API l2l_status l2l_relay_restore_progress(l2l_relay *run, int64_t steps, int64_t updates);
L2L_API l2l_status l2l_relay_restore_loss_scale(l2l_relay *run, double scale, int64_t good,
                                                int64_t skipped);

/* ---------------------------------------------------------------- data parallel
   One process per device (or CPU socket) under mpirun, on the system's OpenMPI, which
   libl2l opens (a plugin beside the library, libl2l-mpi.so) only when a program asks for
   it: a program that never does needs no mpirun and loads no MPI. A relay with dist =
   L2L_DIST_MPI on every rank trains one model: each rank steps its own slice of every
   minibatch; the loss is the mean over every real target of the whole minibatch, the same
   on every rank; dropout draws follow the global sample index (the ranks' slices in rank
   order), so N ranks draw what one process draws for the whole minibatch. As soon as a
   record's gradient is complete on a rank it is reduce-scattered; each rank updates its
   shard of the master and of the optimizer state (which it alone keeps: host memory for
   optimizer state falls as 1/N), then an all-gather brings the updated master to every
   rank before the record's next forward; all of it overlaps backward. Global clipping,
   loss scaling, non-finite skips, accumulation and dynamic architecture behave as on one
   process, every rank deciding alike. MPI runs on one communication thread; every wait
   has a deadline (l2l_dist_set_timeout; default 300 s, or L2L_DIST_TIMEOUT in seconds)
   after which the rank says what it waited for (step, layer, operation, bytes, sequence)
   and ends the job with MPI_Abort; a step that fails on a rank once the ranks have
   exchanged their sizes ends the job the same way, with its message (the others would
   wait on collectives it never posts). Every rank must make the same calls in the same order:
   the relay's steps and changes, l2l_dist_barrier, and l2l_relay_param_state (which
   gathers the whole state from every rank's shard). */
/* Starts MPI (opening the plugin) on its communication thread; later calls do nothing.
   L2L_ERR_UNSUPPORTED when libl2l was built without MPI or the plugin cannot be opened
   (the message says why); L2L_ERR_STATE after l2l_dist_finalize. */
L2L_API l2l_status l2l_dist_init(void);
/* This process's rank and the number of ranks (starting MPI if needed). */
L2L_API l2l_status l2l_dist_rank(int *out);
L2L_API l2l_status l2l_dist_size(int *out);
/* Returns when every rank has called it (within the timeout). */
L2L_API l2l_status l2l_dist_barrier(void);
/* The deadline of every MPI wait, in seconds, 0 < seconds <= 1e6. */
L2L_API l2l_status l2l_dist_set_timeout(double seconds);
/* Waits for the exchanges in flight and finalizes MPI; nothing when it never started.
   Call it before a program that started MPI exits (the l2l executable does). */
L2L_API l2l_status l2l_dist_finalize(void);
/* Ends every rank of the job at once (MPI_Abort) after printing message (may be NULL)
   with this rank; returns only when MPI is not running. For a program that cannot go on:
   the other ranks would otherwise wait out their timeout. */
L2L_API void l2l_dist_abort(const char *message);

/* ---------------------------------------------------------------- the planner
   A cost model of the relay (KARMA's idea, over everything the relay can do): for a
   device budget it chooses the micro-batch and, per layer, inner (keep / swap /
   recompute) and the stash of its input boundary, minimising the predicted step time
   with the predicted device peak within the budget. The peak is replayed from the
   layers' memory statements in the relay's order (on the CPU backend it is the pool's
   peak to the byte; with swap, a bound). Times come from rates measured on this machine
   (layers timed at their own shapes, copies, the host optimizer; cached per machine and
   backend) or given by the caller. A visit costs the most of its channels (compute,
   copies in, copies out), as the relay overlaps them. */
typedef struct l2l_plan_rates {
  double flops;       /* device FLOP/s for layers not timed at their shape */
  double h2d, d2h;    /* copy bytes/s: host (pinned) to device, device to host */
  double optimizer;   /* master bytes/s the host optimizer updates (all its threads) */
  double visit;       /* fixed seconds of a layer visit */
  int timed;          /* 1: time layers at their shapes here (calibrated rates) */
  int shared;         /* 1: copies and the host optimizer run on the cores that compute
                         (the CPU backend): their time adds to compute's, not hidden */
  double disk_read, disk_write;   /* bytes/s the config's spill directory reads and writes
                                     sequentially (0: measured there when the config has
                                     one, and cached with the machine's rates) */
} l2l_plan_rates;

typedef struct l2l_plan_request {
  int64_t batch, seq;           /* the minibatch's shape */
  uint64_t device_budget;       /* > 0: the bytes the step may hold on the device at its
                                   peak, as l2l_relay_config.device_budget counts them (the
                                   GPU backend's own bytes, shared by every relay, are not
                                   the step's) */
  int token_types, key_mask;    /* 1: the batches carry them */
  const uint8_t *frozen;        /* one byte per layer, 1 = frozen; NULL: none */
  const l2l_plan_rates *rates;  /* NULL: this machine's (l2l_plan_calibrate) */
} l2l_plan_request;

typedef struct l2l_plan l2l_plan;
typedef struct l2l_plan_summary {
  int nlayers;
  int64_t micro_batch;
  double step_seconds;       /* predicted */
  uint64_t device_peak;      /* predicted: the step's own bytes at its peak */
  uint64_t h2d_bytes, d2h_bytes;   /* predicted: bytes the step copies to the device and
                                      back (as l2l_relay_stats counts them) */
  double streaming_tokens;   /* tokens per layer visit above which a block's weights stream
                                in under its compute (device FLOP/s over h2d bytes/s) */
  /* The host and the disk (config.host_budget, spill_dir), for a relay made over the model
     as it is (its records in layer order): */
  uint64_t host_eps_bytes;   /* the EPS's host bytes between steps (stats.host_eps_bytes) */
  uint64_t host_budget_smallest;   /* the smallest config.host_budget that works */
  uint64_t disk_bytes;       /* what a step's updates read from the spill file, and as much
                                again written back (stats.spill_read_bytes and
                                spill_written_bytes of a step after the first) */
  double disk_seconds;       /* those bytes at the directory's rates, a step's share (with
                                accumulation, an update's over its steps): step_seconds is
                                at least this (the disk works under compute) */
} l2l_plan_summary;
typedef struct l2l_plan_layer {
  l2l_inner_policy inner;
  l2l_stash_policy stash;    /* of the layer's input boundary (layer 0: device) */
  uint64_t kept_bytes;       /* device bytes it keeps from forward to backward */
  double seconds;            /* predicted time of its visits in a step */
} l2l_plan_layer;

/* Plans `layers` under a relay `config` (its param_slots, precisions and optimizer
   threads count; micro_batch, stash and inner are what the plan chooses). Refused with
   L2L_ERR_BUDGET, naming the smallest budget any plan needs and what needs it, when none
   fits. */
L2L_API l2l_status l2l_plan_new(l2l_plan **out, l2l_layer *const *layers, int nlayers,
                                const l2l_relay_config *config, const l2l_plan_request *request);
L2L_API l2l_status l2l_plan_get(l2l_plan_summary *out, const l2l_plan *plan);
L2L_API l2l_status l2l_plan_get_layer(l2l_plan_layer *out, const l2l_plan *plan, int index);
L2L_API void l2l_plan_free(l2l_plan *plan);
/* This machine's rates for the device backend in use and this many threads: from the
   cache ($XDG_CACHE_HOME/l2l/, else ~/.cache/l2l/), measured when missing or when
   remeasure is 1: copies each way, the host optimizer, and a visit's fixed cost (a small
   model trained a few steps). Layers are timed (and cached) when first planned. Until
   this has run once, plans with rates NULL count no visit cost. */
L2L_API l2l_status l2l_plan_calibrate(l2l_plan_rates *out, int remeasure);
/* The plan's micro-batch and per-layer policies into the relay (same layers, in order). */
L2L_API l2l_status l2l_relay_apply_plan(l2l_relay *run, const l2l_plan *plan);

/* L2L_FFI_END */

#ifdef __cplusplus
}
#endif
#endif /* L2L_H */
