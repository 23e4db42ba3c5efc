/* SPDX-License-Identifier: MIT */
/* backend.h — the backend's interface: the ops table, and the dispatch from pools to the
 * backend that runs them.
 *
 * Purpose: the only place that knows which device runs an op. Each backend has an ops
 * table (cpu/: OpenBLAS and OpenMP; cuda/: cuBLAS and kernels/, built where nvcc is
 * found) and, for an accelerator, a device table it installs in the core (core.h, "the
 * device"); dispatch.c registers the accelerators (accelerators.h, private to this part).
 * Public functions (public_ops.c, tensor_ops.c) check their tensors, then call the table of the
 * backend that owns the tensors' pool with raw pointers and sizes. Entries may assume
 * valid, non-overlapping arguments (except where noted) and must never allocate from a
 * pool, print or exit; they return a status because a GPU launch can fail.
 * Must never: include a header of the parts above it (layers, eps, relay).
 *
 * Sizes: rows/cols describe matrices; n counts elements. Layouts are contiguous.
 */
#ifndef L2L_BACKEND_H
#define L2L_BACKEND_H

#include <math.h>

#include "core/core.h"

enum backend_reduction { L2L_REDUCE_SUM, L2L_REDUCE_MAX_ABS, L2L_REDUCE_SUMSQ };
enum backend_distribution { L2L_UNIFORM, L2L_NORMAL };

/* The x where the tanh-form GELU has its minimum (and that minimum). */
#define L2L_GELU_XMIN (-0.75246142f)
#define L2L_GELU_YMIN (-0.17004075f)

/* GELU's slope from its output y and its side bit (gelu_table.c says how): gelu'(x(y)) at
   GELU_TABLE points of three variables, k = 0 the right branch over t = sqrt(y - Y_MIN),
   1 the left branch over t down to y_left, 2 the far left over w = ln(-y); a variable v is
   at table position (v - origin[k]) * scale[k], interpolated linearly. Built on the first
   call, then never changed. */
#define GELU_TABLE 4096
struct gelu_slopes {
  float slope[3][GELU_TABLE];
  float scale[3], origin[3];
  float y_left;   /* gelu(-3): the left tables' boundary in y */
};
const struct gelu_slopes *gelu_slopes(void);

/* Sizes and random stream of one attention call (see attention_forward). */
struct backend_attention_shape {
  int64_t batch, heads, seq, head_dim;
  int64_t ld_qkv, ld_o;  /* row strides in elements (q, k, v's and dq, dk, dv's; o's and do's) */
  int causal;
  float scale;
  float dropout;         /* p in [0, 1) */
  uint64_t seed, stream;
  int64_t first_sample;
  l2l_dtype precision;   /* f32 (0): fp32 products. bf16 / f16: the products may read q, k,
                            v, P (backward: also do, dS) rounded to it, summing in fp32 (the
                            CUDA backend's tensor cores, kernels/attention.h); the CPU
                            backend computes in fp32 whatever this says */
  l2l_dtype o_dtype;     /* o's: f32 (0), or bf16 / f16 (any backend): the forward writes o
                            rounded to nearest even from its fp32 value, as convert does,
                            and the backward reads it widened (the block keeps attention's
                            output so when its projection reads it in 16 bits anyway) */
  l2l_dtype qkv_dtype;   /* q, k and v's: f32 (0), or bf16 / f16 (any backend): read widened
                            (the block keeps them so on a 16-bit run: the GPU's products
                            read them rounded anyway) */
  l2l_dtype dqkv_dtype;  /* dq, dk and dv's: f32 (0), or bf16 / f16 (any backend): the
                            backward writes them rounded as convert rounds from their fp32
                            values (the block keeps them so on a 16-bit run: the qkv map's
                            GEMMs read them rounded, and cuDNN writes them in 16 bits) */
  l2l_dtype do_dtype;    /* do's: f32 (0), or bf16 / f16 (any backend): read widened (the
                            projection's backward GEMM writes it so on a 16-bit run: cuDNN
                            reads it rounded anyway) */
};

/* Which of `count` GPUs on this machine the process uses: L2L_CUDA_DEVICE when set (an
   index below count, else -1 with the reason in why); otherwise the process's rank on its
   node as the MPI launcher says it (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
   SLURM_LOCALID), modulo count, so that ranks sharing a node take different GPUs; else
   0. (dispatch.c) */
int backend_accelerator_index(int count, char *why, size_t len);

/* layernorm_invertible's thresholds (see there). */
#define L2L_LN_MIN_WEIGHT 1e-6f
#define L2L_LN_BIAS_RATIO 64.0f

/* ---------------------------------------------------------------- the optimizers' arithmetic

   The host kernels of the optimizers (optim_kernels.c): the EPS's workers run them on a
   record kept on the host, a chunk at a time, and the CPU backend's optim_update on a
   record placed on the device, in the same chunks and blocks, so the two placements give
   the same bits. Single-threaded, SIMD-vectorized, on [0, n) of the arrays given: they
   never allocate, take locks, or read anything beyond the n elements. */
/* One update's hyper-parameters, resolved by the EPS for one record
   (its update on the host, or on the device through optim_update below). */
struct optim_hyper {
  l2l_optimizer_kind kind;
  float lr;              /* after the schedule */
  float weight_decay;    /* 0 for a record that does not decay */
  float momentum;        /* SGD */
  int nesterov;          /* SGD */
  float beta1, beta2, eps;
  int64_t t;             /* updates of this record so far, this one included (>= 1) */
  float grad_scale;      /* the kernels use g = grad_scale * grad (accumulation mean,
                            clipping), without writing grad */
  l2l_state_precision state;   /* the state arrays' (the host's kernels take f32 arrays:
                                  the EPS decodes compact state; optim_update below
                                  decodes and encodes it itself) */
  l2l_dtype master;      /* the master's: f32, or bf16 (the relay's master = bf16), which
                            an update widens, steps in f32 and rounds back stochastically:
                            element i of the record (of its shard with ranks) by 16-bit
                            Philox draw first_draw + i of (seed, stream) (core.h's
                            philox_halves), in optim_block */
  uint64_t seed, stream, first_draw;
};

/* SGD on n elements; buf is NULL when momentum = 0 (state arrays start at zero). */
void optim_sgd(float *p, float *buf, const float *grad, int64_t n,
               const struct optim_hyper *h);
/* AdamW on n elements (backend.h's AdamW arithmetic, which l2l_adamw_update also runs). */
void optim_adamw(float *p, float *m, float *v, const float *grad, int64_t n,
                 const struct optim_hyper *h);
/* LAMB in two passes, because its trust ratio needs whole-record norms: moments updates
   m and v of n elements and adds sum p^2 and sum r^2 of them into norms[0] and norms[1];
   apply (after every chunk's moments) does p -= lr * trust * r, r recomputed from m, v, p. */
void optim_lamb_moments(float *m, float *v, const float *p, const float *grad, int64_t n,
                        const struct optim_hyper *h, double norms[2]);
void optim_lamb_apply(float *p, const float *m, const float *v, int64_t n,
                      const struct optim_hyper *h, float trust);
/* The trust ratio from the summed norms: |p| / |r|, 1 when either is 0. */
float optim_lamb_trust(const double norms[2]);
/* h's step as the constants of the GPU's update of a record placed on the device
   (kernels/optim.h's struct k_optim), worked out as the kernels above work them out: the
   CUDA backend's optim_update passes them, and the emulated kernels' test takes the same. */
struct k_optim;
void optim_kernel_consts(struct k_optim *out, const struct optim_hyper *h);
/* Which of those updates serves h: -1, k_optim_update (an f32 master and f32 state); else
   k_optim_update_compact, and this is its precision (0 f32, 1 bf16, 2 8 bits), root[s]
   whether state array s keeps sqrt(v) in the unsigned code. */
int optim_kernel_state(const struct optim_hyper *h, int root[2]);

/* The gradient an update takes: an element of magnitude EPS_GRAD_LIMIT (2^63) or more, as
   the update applies it (unscaled and clipped), counts as non-finite, as an inf or a NaN
   does: the record's update is skipped under the relay's non-finite policy (or the step
   raises). Below it g^2 < 2^126, a factor 4 under f32's largest (2^128), so Adam's second
   moment (a weighted mean of squares) stays finite, and so does SGD's momentum (at most
   1 / (1 - momentum) <= 2^24 gradients' worth): an update never makes optimizer state
   that a checkpoint could not hold. x * EPS_GRAD_OVER is inf exactly when |x| >= 2^63 or x
   is inf or NaN (2^128 / 2^63: the largest float below 2^63 times it is FLT_MAX itself). */
#define EPS_GRAD_LIMIT 0x1p63f
#define EPS_GRAD_OVER 0x1p65f

/* sum x^2 in double (gradient norms for clipping). */
double optim_sumsq(const float *x, int64_t n);
/* The same, and the largest |x| into *most (a NaN aside) in the same pass. */
double optim_sumsq_most(const float *x, int64_t n, float *most);
/* The same over a gradient tensor the host can read: f32, or 16-bit widened exactly; and
   over n elements of x in such a dtype. */
double optim_tensor_sumsq(const l2l_tensor *grad);
double optim_sumsq_of(const void *x, l2l_dtype dtype, int64_t n);
/* Per-layer clipping's factor from a visit's gradients' summed squares: clip / |g| where
   the norm |g| = sqrt(sumsq) is over clip, else 1 (the relay's clip_layer_norm, on the
   host and on a device alike). */
float optim_clip_factor(double sumsq, float clip);
/* Whether x[0, n) is all +0 (every bit zero). */
bool optim_all_zero(const float *x, int64_t n);
/* dst += scale * src (absorbing a gradient into the accumulator); returns whether every
   sum is finite and below EPS_GRAD_LIMIT in magnitude (what an eager update takes). */
bool optim_axpy(float *dst, const float *src, float scale, int64_t n);
/* The same, and src := 0 in the same pass (a gradient slot emptied for its next use). */
bool optim_axpy_drain(float *dst, float *src, float scale, int64_t n);
/* sum x^2 and dst += scale * x for x a 16-bit gradient (dtype bf16 or f16), widened
   exactly to f32 first (the axpy returns as optim_axpy does). */
double optim_sumsq_half(const uint16_t *x, l2l_dtype dtype, int64_t n);
bool optim_axpy_half(float *dst, const uint16_t *src, l2l_dtype dtype, float scale,
                     int64_t n);

/* The optimizer state in its precision (state_codes.c; l2l.h, "optimizers"): the two 8-bit
   codes, a momentum's signed one and the unsigned one of a second moment's square root;
   the value of each code byte (times a block's scale; a root code's squared too); the
   nearest code byte of y / scale (a root code's of a magnitude in [0, 1]). */
enum optim_code { OPTIM_CODE_SIGNED, OPTIM_CODE_ROOT };
/* The code of an optimizer's state array: Adam's second (v: never negative) keeps its
   square root in the unsigned code, every other array is a signed momentum. */
static inline enum optim_code optim_state_code(l2l_optimizer_kind kind, int array) {
  return kind != L2L_OPTIMIZER_SGD && array == 1 ? OPTIM_CODE_ROOT : OPTIM_CODE_SIGNED;
}
const float *optim_code_values(enum optim_code code);
int optim_code_nearest(enum optim_code code, float y);
/* Elements [begin, begin + n) of a state array of array_n elements kept in `state`, decoded
   into out / encoded from in (an 8-bit array: begin a multiple of L2L_STATE_BLOCK, and n
   too unless the range ends the array, since a block's scale covers the whole block). */
void optim_state_decode(float *out, const void *array, int64_t array_n, int64_t begin, int64_t n,
                        l2l_state_precision state, enum optim_code code);
void optim_state_encode(void *array, int64_t array_n, int64_t begin, const float *in, int64_t n,
                        l2l_state_precision state, enum optim_code code);
/* The f32 step of one block in optim_block: p, s0, s1 (NULL beyond the optimizer's count)
   hold the block's k elements, i its first element in the record's arrays. */
typedef void (*optim_block_step)(float *p, float *s0, float *s1, int64_t i, int64_t k,
                                 void *ctx);
/* One block of an update, elements [i, i + k) (i a multiple of L2L_STATE_BLOCK, k at most
   one block) of a master p (h->master: f32, or bf16) and state arrays s0, s1 of n elements
   in h->state's precision, all indexed from the record's element 0 (a shard's, with ranks):
   what is not f32 decoded into scratch on the stack, `step` run on it, the state encoded
   again where writes_state (the first wave: a later one only reads it) and a bf16 master
   rounded back stochastically where moves_master (the wave that moves the weights; core.h's
   half_bf16_stochastic, element j by 16-bit Philox draw h->first_draw + j of (h->seed,
   h->stream)). The EPS's host update and the CPU backend's optim_update run their blocks
   through it, so the two placements give the same bits. */
void optim_block(void *p, void *s0, void *s1, int64_t n, int64_t i, int64_t k,
                 const struct optim_hyper *h, bool writes_state, bool moves_master,
                 optim_block_step step, void *ctx);
/* Where the 8-bit array of n elements keeps its blocks' scales (core.h's layout). */
static inline float *optim_state_scales(void *array, int64_t n) {
  return (float *)((uint8_t *)array + state8_codes_bytes(n));
}

/* The elements of a chunk: an update's work is cut into chunks of this many (a multiple of
   L2L_STATE_BLOCK), and sums over a record (LAMB's norms, a gradient's norm) are each
   chunk's, a block of L2L_STATE_BLOCK at a time, added in the chunks' order, so that the
   EPS's workers and the CPU backend's ops find the same bits. */
enum { L2L_OPTIM_CHUNK = 1 << 18 };
_Static_assert(L2L_OPTIM_CHUNK % L2L_STATE_BLOCK == 0, "a chunk is whole blocks of compact state");
/* The chunks an n-element pass (an update's wave, a gradient's add) is cut into: at least
   one (an empty one ends an empty shard's wave), and where the one from `begin` ends. */
static inline int optim_chunks(int64_t n) {
  return n > 0 ? (int)((n + L2L_OPTIM_CHUNK - 1) / L2L_OPTIM_CHUNK) : 1;
}
static inline int64_t optim_chunk_end(int64_t n, int64_t begin) {
  return n - begin > L2L_OPTIM_CHUNK ? begin + L2L_OPTIM_CHUNK : n > begin ? n : begin;
}
/* *sumsq += sum x^2 and *most = max(*most, |x|) over x[0, n), a block of L2L_STATE_BLOCK
   at a time from x (a chunk's start): the one grouping every norm of a gradient uses. */
void optim_norm_blocks(double *sumsq, float *most, const float *x, int64_t n);

struct backend_ops {
  const char *name;

  /* c[i] = alpha op(a[i]) op(b[i]) + beta c[i] for i < batch; a[i] op'd is (m,k), b[i] op'd
     (k,n), c[i] (m,n); beta = 0 must not read c. a and b are both ab_dtype (f32, f16 or
     bf16); c and the accumulation are f32. lda, ldb, ldc: each stored matrix's row stride
     in elements, at least its stored column count (0: packed, that count; a GPU's GEMMs
     want rows 16-byte aligned: the LM head pads its logits' rows so); matrix i of a batch
     starts i times its stored rows times its stride in. Only the op'd shape is read or
     written, never a row's padding. */
  l2l_status (*gemm_batched)(float *c, const void *a, const void *b, l2l_dtype ab_dtype,
                             int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                             int trans_b, float alpha, float beta, int64_t lda, int64_t ldb,
                             int64_t ldc);
  /* c (m,n; packed) = op(a) op(b) + bias (n; NULL: none), alpha 1, beta 0, as gemm_batched
     then bias_add; or, with c16 given (c16_dtype bf16 / f16), c16 := that sum rounded as
     convert rounds, c then being f32 work the backend may write (its contents after, not
     defined). One pass where the backend can (a GPU's cuBLASLt bias epilogue: the bias added
     to the f32 sums in f32, then rounded, the same arithmetic); the linear maps with a bias
     call it (layers_linear_forward). */
  l2l_status (*gemm_bias)(float *c, void *c16, l2l_dtype c16_dtype, const void *a, const void *b,
                          l2l_dtype ab_dtype, const float *bias, int64_t m, int64_t n, int64_t k,
                          int trans_a, int trans_b);
  /* Shapes below as llm.c writes them; each op is l2l.h's public op of its name. */
  /* y (rows,cols) += bias (cols) per column; or, with y16 given (a 16-bit y16_dtype),
     y16 (rows,cols) := y + bias rounded as convert rounds, y only read (the qkv map's
     output, which only attention reads, in 16 bits) */
  l2l_status (*bias_add)(float *y, void *y16, l2l_dtype y16_dtype, const float *bias,
                         int64_t rows, int64_t cols);
  /* dbias (cols) += the sum over rows of dy (rows,cols) of dy_dtype (f32, or bf16 / f16
     read widened: attention's 16-bit dq, dk, dv), summed in f32 */
  l2l_status (*bias_backward)(float *dbias, const void *dy, l2l_dtype dy_dtype, int64_t rows,
                              int64_t cols);
  /* out (n) = a (n) + b (n); out may be a or b */
  l2l_status (*add)(float *out, const float *a, const float *b, int64_t n);
  /* y (n) = gelu(x (n)); y may be x */
  l2l_status (*gelu_forward)(float *y, const float *x, int64_t n);
  /* dx (n) = dy (n) * gelu'(x (n)); dx may be dy. dx16 as layernorm_forward's y16: the
     16-bit dy of the GEMMs below; either dx or dx16 may be NULL, not both (the block asks
     for dx16 alone on a 16-bit run: its bias's gradient sums it). */
  l2l_status (*gelu_backward)(float *dx, void *dx16, l2l_dtype dx16_dtype, const float *dy,
                              const float *x, int64_t n);
  /* y (rows,cols), mean and rstd (rows; either may be NULL) from x (rows,cols), weight and
     bias (cols). y16 (rows,cols) of y16_dtype (f16 or bf16), when not NULL, gets y rounded
     to nearest even in the same pass (the bits l2l_tensor_cast gives): the 16-bit input of
     the GEMM that reads y. Either y or y16 may be NULL, not both. */
  l2l_status (*layernorm_forward)(float *y, void *y16, l2l_dtype y16_dtype, float *mean,
                                  float *rstd, const float *x, const float *weight,
                                  const float *bias, float eps, int64_t rows, int64_t cols);
  /* dx (rows,cols) written, plus residual (rows,cols; NULL: none) where given: the
     residual branch's gradient added in the same pass (each element once, in f32, as the
     add op would); dx16 (of dx16_dtype; NULL: none) gets dx rounded as layernorm_forward's
     y16 (the 16-bit dy of the GEMMs that read dx next). dweight, dbias (cols; either may be
     NULL) accumulated; from dy, x (rows,cols), weight (cols), mean, rstd (rows). dx may be
     dy, and residual dx or dy. */
  l2l_status (*layernorm_backward)(float *dx, void *dx16, l2l_dtype dx16_dtype, float *dweight,
                                   float *dbias, const float *dy, const float *residual,
                                   const float *x, const float *weight, const float *mean,
                                   const float *rstd, int64_t rows, int64_t cols);
  /* x is (samples, rows_per_sample, tk) and each sample's rows are (heads, tq) with tq
     dividing rows_per_sample; key_mask (samples, tk) or NULL. y may be x. */
  l2l_status (*softmax_forward)(float *y, const float *x, const uint8_t *key_mask, int causal,
                                float scale, int64_t samples, int64_t rows_per_sample,
                                int64_t tq, int64_t tk);
  /* dx, dy, y (rows,cols): dx = scale * y * (dy - sum(dy * y)) per row */
  l2l_status (*softmax_backward)(float *dx, const float *dy, const float *y, float scale,
                                 int64_t rows, int64_t cols);
  /* out (n,cols) = table (vocab,cols) rows picked by ids (n); table is table_dtype: f32, or
     f16 / bf16 (a 16-bit device copy), widened exactly. */
  l2l_status (*embedding_forward)(float *out, const int32_t *ids, const void *table,
                                  l2l_dtype table_dtype, int64_t n, int64_t cols);
  /* dtable (vocab,cols)[ids[i]] += dout (n,cols)[i], ids (n): repeated ids sum */
  l2l_status (*embedding_backward)(float *dtable, const float *dout, const int32_t *ids,
                                   int64_t n, int64_t vocab, int64_t cols);
  /* losses (rows) from logits (rows,vocab) and targets (rows; ignore_index: loss 0). In the
     cross-entropy ops the rows of logits and of dlogits (and dlogits16) are ld >= vocab
     elements apart; a row's padding is neither read nor written. */
  l2l_status (*cross_entropy_forward)(float *losses, const float *logits,
                                      const int32_t *targets, int32_t ignore_index,
                                      int64_t rows, int64_t vocab, int64_t ld);
  /* dlogits (rows,vocab) = scale * (softmax(logits) - onehot(targets (rows))) */
  l2l_status (*cross_entropy_backward)(float *dlogits, const float *logits,
                                       const int32_t *targets, int32_t ignore_index,
                                       float scale, int64_t rows, int64_t vocab, int64_t ld);
  /* y, x (n); mask (ceil(n/8)) bytes, bit i%8 of byte i/8 kept; draws first .. first+n-1 */
  l2l_status (*dropout_forward)(float *y, uint8_t *mask, const float *x, float p,
                                uint64_t seed, uint64_t stream, int64_t first, int64_t n);
  /* dx, dy (n), mask (ceil(n/8)) as dropout_forward wrote it */
  l2l_status (*dropout_backward)(float *dx, const float *dy, const uint8_t *mask, float p,
                                 int64_t n);

  /* ---- memory-frugal pieces and attention, used by the layers (src/layers/) */

  /* y = gelu(x) and bit i%8 of bits[i/8] := (x[i] >= L2L_GELU_XMIN), the side of GELU's
     minimum x was on. y may be x. */
  l2l_status (*gelu_forward_bits)(float *y, uint8_t *bits, const float *x, int64_t n);
  /* dx = dy * gelu'(x), x recovered from y = gelu(x) and its side bit. dx may be dy. dx16
     as gelu_backward's. */
  l2l_status (*gelu_backward_from_output)(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                          const float *dy, const float *y, const uint8_t *bits,
                                          int64_t n);
  /* ---- fused forms (one pass over memory; the same results as the sequences named) */
  /* pre (rows, cols) += bias per column (bias NULL: none; kept: standard mode saves it),
     y = gelu(pre), bits = pre's side bits as gelu_forward_bits, or not written when NULL:
     bias_add then gelu_forward_bits / gelu_forward. y may be pre. y16 as layernorm_forward's
     (y or y16 may be NULL, not both). */
  l2l_status (*bias_gelu_forward)(float *pre, float *y, void *y16, l2l_dtype y16_dtype,
                                  uint8_t *bits, const float *bias, int64_t rows, int64_t cols);
  /* sum = a + b (sum may be a or b), y, mean, rstd = LayerNorm of sum: add then
     layernorm_forward (y16 as there). y must not overlap sum; mean, rstd may be NULL. */
  l2l_status (*add_layernorm_forward)(float *sum, float *y, void *y16, l2l_dtype y16_dtype,
                                      float *mean, float *rstd, const float *a, const float *b,
                                      const float *weight, const float *bias, float eps,
                                      int64_t rows, int64_t cols);
  /* losses and dlogits (either may be NULL) from one log-sum-exp per row:
     cross_entropy_forward and cross_entropy_backward. dlogits may be logits. dlogits16 (of
     dlogits16_dtype; NULL: none) gets dlogits rounded as layernorm_forward's y16 (dlogits
     itself may then be NULL): the 16-bit input of the head's GEMMs. */
  l2l_status (*cross_entropy_fused)(float *losses, float *dlogits, void *dlogits16,
                                    l2l_dtype dlogits16_dtype, const float *logits,
                                    const int32_t *targets, int32_t ignore_index, float scale,
                                    int64_t rows, int64_t vocab, int64_t ld);
  /* LayerNorm backward with x^ = (y - bias) / weight instead of (x - mean) rstd; weight
     must have no zero channel (the layers fall back to the standard backward first, when
     layernorm_invertible says no). */
  l2l_status (*layernorm_backward_from_output)(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                               float *dweight, float *dbias, const float *dy,
                                               const float *residual, const float *y,
                                               const float *weight, const float *bias,
                                               const float *rstd, int64_t rows, int64_t cols);

  /* Multi-head self-attention on heads laid out in columns: for sample b, position i and
     head h, q's row starts at q + (b*seq + i)*ld_qkv + h*head_dim (k, v alike); o, do at
     (b*seq + i)*ld_o + h*head_dim. S = scale q k^T with causal / key_mask hiding as
     l2l_softmax_forward; P = softmax(S) (hidden entries 0; a row with every key hidden is
     0 and its lse -inf); dropout on P as l2l.h's block site 0 (stream, first_sample); o =
     P' v. lse (batch, heads, seq) gets each row's log-sum-exp of its visible scores.
     probs / dropped / mask, when not NULL, get P, P' and the kept bits for every (b, h, i,
     j < seq) (standard mode keeps them; frugal passes NULL and the backward recomputes
     P from q, k and lse tile by tile). workspace: `workspace_floats` floats, at least
     attention_workspace(shape, backward) per thread used. o is of shape->o_dtype, q, k, v
     of shape->qkv_dtype. */
  l2l_status (*attention_forward)(void *o, float *lse, float *probs, float *dropped,
                                  uint8_t *mask, const void *q, const void *k,
                                  const void *v, const uint8_t *key_mask,
                                  const struct backend_attention_shape *shape, float *workspace,
                                  int64_t workspace_floats);
  /* dq, dk, dv (same layout as q, k, v; written; of shape->dqkv_dtype) from do (o's layout,
     of shape->do_dtype), given what the forward kept (probs / dropped / mask, or NULL to
     recompute them from q, k, lse and the generator). */
  l2l_status (*attention_backward)(void *dq, void *dk, void *dv, const void *d_o,
                                   const void *o, const float *lse, const float *probs,
                                   const float *dropped, const uint8_t *mask, const void *q,
                                   const void *k, const void *v, const uint8_t *key_mask,
                                   const struct backend_attention_shape *shape, float *workspace,
                                   int64_t workspace_floats);
  /* Workspace floats one thread needs for a forward (backward = 0) or backward of this
     shape (its seq, head_dim and dtypes). */
  int64_t (*attention_workspace)(const struct backend_attention_shape *shape, int backward);
  /* *out (on the host) = the reduction of x (n), in double */
  l2l_status (*reduce)(double *out, enum backend_reduction kind, const float *x, int64_t n);
  /* param, m, v (n) updated from grad (n): l2l_adamw_update's step */
  l2l_status (*adamw)(float *param, float *m, float *v, const float *grad, int64_t n,
                      const l2l_adamw_config *config, float bias_correction1,
                      float bias_correction2);
  /* A record placed on the device (issue 49), its master p (n, in h->master's dtype), state s0 and s1 (NULL
     beyond the optimizer's count; arrays of n elements in h->state's precision, laid out as
     a host record's: optim_state_decode's) and gradient accumulator grad (n), on the device:
     - optim_update: one update by h (the optimizer's kind, its step's constants, the
       gradient's scale), which leaves grad zero; skip (on the device, may be NULL): where
       *skip is not 0 p and the state stay as they are (grad is still cleared). LAMB's
       whole-record sums in the chunks' order (L2L_OPTIM_CHUNK, above). Compact state is
       decoded a block of L2L_STATE_BLOCK at a time, updated in f32 and encoded again (by
       the first wave: LAMB's second only reads it), as the EPS's host update does; a
       bf16 master widened the same way and rounded back by the wave that moves it.
     - grad_add: acc (n) += s * g (n, f32 or a 16-bit dtype widened exactly), s = *scale_at
       (on the device) or, where scale_at is NULL, scale; and *flag (on the device; NULL:
       none) = 1 where a sum is an inf, a NaN or EPS_GRAD_LIMIT or more (else left as it
       was): the EPS's add, whose flag the update's skip reads.
     - clip_scale: *scale (on the device) = optim_clip_factor of the summed squares of
       the count gradients g[i] (on the device, n[i] elements in dtype[i]: f32 or 16-bit
       widened exactly; the arrays themselves on the host), added gradient after
       gradient in double as the host's eps_clip_scale adds them: per-layer clipping's
       factor for a visit, which its adds then read there (nothing read back).
     - grad_norm: out[0] and out[1] (on the device) = g's (n) sum of squares and largest
       magnitude, a block at a time in chunks as optim_norm_blocks (a deferred update's
       norm, read back with every record's at once). */
  l2l_status (*optim_update)(void *p, void *s0, void *s1, float *grad, int64_t n,
                             const struct optim_hyper *h, const int32_t *skip);
  l2l_status (*grad_add)(float *acc, const void *g, l2l_dtype dtype, float scale,
                         const float *scale_at, int64_t n, int32_t *flag);
  l2l_status (*clip_scale)(float *scale, const void *const *g, const l2l_dtype *dtype,
                           const int64_t *n, int count, float clip);
  l2l_status (*grad_norm)(double *out, const float *g, int64_t n);
  /* First index whose value is outside [lo, hi) and not `except`, or -1 (*index), and
     that value (*value, when found): both on the host, whatever memory values is in. */
  l2l_status (*find_out_of_range)(int64_t *index, int32_t *value, const int32_t *values,
                                  int64_t n, int32_t lo, int32_t hi, int32_t except);

  /* *invertible (on the host, whatever memory weight and bias are in): whether x^ =
     (y - bias) / weight recovers a LayerNorm's normalised input well enough for
     layernorm_backward_from_output: every channel's |weight| >= L2L_LN_MIN_WEIGHT and
     L2L_LN_BIAS_RATIO |weight| >= |bias| (else y - bias cancels to noise). */
  l2l_status (*layernorm_invertible)(bool *invertible, const float *weight, const float *bias,
                                     int64_t n);

  /* Whole-tensor helpers used by tensor_ops.c. */
  /* dst (n) of dtype := value */
  l2l_status (*fill)(void *dst, l2l_dtype dtype, double value, int64_t n);
  /* f32 <-> f16/bf16/i32 and between any of those; *bad gets the first element an f32->i32
     conversion could not represent, or -1, checked before anything is written. */
  l2l_status (*convert)(void *dst, l2l_dtype dst_dtype, const void *src, l2l_dtype src_dtype,
                        int64_t n, int64_t *bad);
  /* dst[i] (n[i] elements of dst_dtype) := src[i] (of src_dtype) for each i < count, as
     convert rounds them, f32 to f16 / bf16 or back, in one call (on a GPU a launch for
     every 64): a visit's 16-bit gradients, the 16-bit copies of the records on the device
     as a step begins. No segment overlaps another. */
  l2l_status (*convert_many)(void *const *dst, l2l_dtype dst_dtype, const void *const *src,
                             l2l_dtype src_dtype, const int64_t *n, int count);
  /* dst (n) of dtype := draws first .. first+n-1 of (seed, stream), dist with a, b */
  l2l_status (*random)(void *dst, l2l_dtype dtype, int64_t n, enum backend_distribution dist,
                       uint64_t seed, uint64_t stream, int64_t first, double a, double b);
  /* dst (bytes) := src (bytes) across pools; returns when done, and with it every copy the
     calling thread queued before (copy_queued: one stream keeps their order) */
  l2l_status (*copy)(void *dst, l2l_pool_kind dst_pool, const void *src,
                     l2l_pool_kind src_pool, uint64_t bytes);
  /* copy, queued behind the calling thread's stream without waiting for it: done when
     that stream's next synchronization (an anchor, a sync) returns, not when this does. The
     host side must stay allocated and unchanged until then; from pinned memory the host
     never waits (pageable memory may make the device's driver wait). */
  l2l_status (*copy_queued)(void *dst, l2l_pool_kind dst_pool, const void *src,
                            l2l_pool_kind src_pool, uint64_t bytes);

  /* Kernels and library calls queued since the process began (NULL: the backend queues
     none; the CPU's ops run when called). For the profile. */
  int64_t (*launches)(void);
};

/* The CPU backend's table (cpu/cpu_ops.c): host and pinned memory, and the device pool when no
   device table is installed. */
extern const struct backend_ops cpu_backend;

/* gemm_bias as its steps on `ops`: the GEMM into c, then the bias added (and rounded into
   c16, where given), or the cast alone: what the CPU backend runs, and the CUDA backend
   where cuBLASLt does not. */
static inline l2l_status backend_gemm_bias_in_steps(const struct backend_ops *ops, float *c,
                                                    void *c16, l2l_dtype c16_dtype,
                                                    const void *a, const void *b,
                                                    l2l_dtype ab_dtype, const float *bias,
                                                    int64_t m, int64_t n, int64_t k,
                                                    int trans_a, int trans_b) {
  l2l_status st = ops->gemm_batched(c, a, b, ab_dtype, 1, m, n, k, trans_a, trans_b, 1.0f, 0.0f,
                                    0, 0, 0);
  if (st != L2L_OK) return st;
  if (bias != NULL) return ops->bias_add(c, c16, c16_dtype, bias, m, n);
  int64_t bad = -1;
  return c16 != NULL ? ops->convert(c16, c16_dtype, c, L2L_F32, m * n, &bad) : L2L_OK;
}

/* ---------------------------------------------------------------- dispatch (dispatch.c) */

/* Sets compute threads from L2L_THREADS or the core count (cpu/threads.c), once; safe
   from any thread. Every public entry that computes calls it (backend_for does). */
void cpu_runtime_init(void);
/* l2l_tensor_copy's checks, then the backend's copy_queued (tensor_ops.c): dst and src
   (their host side pinned, for the host not to wait) must stay allocated and unchanged
   until the calling thread's stream is next synchronized, or a copy of its waits. The
   relay's micro-batch ids and losses, which would otherwise make the host wait for the
   device each call, and a copy lane's copies of a visit's records and gradients, all but
   the last (which waits for them). */
l2l_status backend_tensor_copy_queued(l2l_tensor *dst, const l2l_tensor *src);
/* dst[i] := src[i] for i < count, as l2l_tensor_cast casts (each pair the same elements,
   in one backend's pools; every dst one dtype, every src another, f32 and f16 or bf16),
   by one convert_many call of their backend: what would be count casts (count launches
   on a GPU) is one. */
l2l_status backend_tensors_cast(l2l_tensor *const *dst, const l2l_tensor *const *src, int count);
/* Compute threads for OpenMP loops (cpu/threads.c). */
extern atomic_int cpu_compute_threads;

/* The backend that runs ops on tensors of `pool`: the CPU's for host and pinned memory;
   for the device pool, the backend whose device table is installed (the CPU's when
   none is). */
const struct backend_ops *backend_for(l2l_pool_kind pool);
/* The device pool's own table, never the profile's (which forwards to it). */
const struct backend_ops *backend_device_base(void);
/* Which backend's memory a pool is: pools of one domain can meet in one op. */
int backend_pool_domain(l2l_pool_kind pool);
/* Whether the device pool is host memory the host can read (the CPU backend serves it). */
bool backend_device_is_host(void);

/* ---------------------------------------------------------------- the profile (profile.c)

   l2l.h's "the profile". While one runs, backend_for gives the device pool's ops
   through a table of the same entries (profile_ops.c) that times each call and hands its
   cost here. The relay says where its steps begin and end and when its thread waits. */

/* The profile's table while a profile runs, else `base`. */
const struct backend_ops *profile_wrap(const struct backend_ops *base);
/* A step begins and ends on the calling thread (the relay's): begin says whether the
   profile records it (a training step: evaluations are left out), and end is told so.
   `completed` false: a step refused or failed, left out. The environment's L2L_PROFILE
   starts a profile at the first begin. */
bool profile_step_begin(bool training);
void profile_step_end(bool began, bool completed);
/* The step's thread waited, on the host, from `start` to `end` (core_now's seconds). */
/* What the step's thread waited for: a copy (by what it moves: the summary's idle_copy_*),
   an update, the ranks. */
enum profile_wait {
  L2L_WAIT_COPY_PARAMS, L2L_WAIT_COPY_ACTS_IN, L2L_WAIT_COPY_ACTS_OUT, L2L_WAIT_COPY_GRADS,
  L2L_WAIT_UPDATE, L2L_WAIT_COMM, L2L_PROFILE_WAITS
};
static inline bool profile_wait_is_copy(enum profile_wait cause) { return cause < L2L_WAIT_UPDATE; }
void profile_wait(enum profile_wait cause, double start, double end);

/* One call of an op as profile_ops.c times it: open before the call, close after. */
struct profile_probe {
  bool on;               /* a step is being profiled: close records the call */
  bool step_thread;      /* called on the step's thread (else a lane's) */
  int64_t syncs;         /* device_sync_count() at open */
  struct core_stamp start;
};
enum profile_bound { L2L_BOUND_MEM, L2L_BOUND_LINK, L2L_BOUND_FLOP32, L2L_BOUND_FLOP16 };
void profile_open(struct profile_probe *p);
/* Whether the calling thread runs the step being profiled. */
bool profile_on_step_thread(void);
/* Records the call: its op name, FLOPs, bytes moved, bound, whether it handed a result
   to the host (a sync), and its shape as printf formats it. */
void profile_close(struct profile_probe *p, const char *op, double flops, double bytes,
                   enum profile_bound bound, bool sync, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* The profile's ops table (profile_ops.c). */
extern const struct backend_ops profile_ops;

/* ---------------------------------------------------------------- shared by the backends */

/* bits[i/8] bit i%8 := flags[i] (each 0 or 1) for i < count; the last byte's unused high
   bits 0. The CPU loops decide per element into a byte array (that vectorizes), then pack. */
static inline void backend_pack_bits(uint8_t *bits, const uint8_t *flags, int64_t count) {
  const int64_t full = count / 8;
  for (int64_t b = 0; b < full; b++) {
    const uint8_t *k = flags + 8 * b;
    bits[b] = (uint8_t)(k[0] | k[1] << 1 | k[2] << 2 | k[3] << 3 | k[4] << 4 | k[5] << 5 |
                        k[6] << 6 | k[7] << 7);
  }
  if (count % 8 == 0) return;
  uint8_t last = 0;
  for (int64_t i = full * 8; i < count; i++) last |= (uint8_t)(flags[i] << (i & 7));
  bits[full] = last;
}

/* Dropout keeps an element when the top 24 bits of its draw are below this. */
static inline uint32_t backend_keep_threshold(float p) {
  return (uint32_t)llround((1.0 - (double)p) * 16777216.0);
}

/* ---------------------------------------------------------------- AdamW's arithmetic */

/* One AdamW step of one element: the expression of l2l.h's "optimizers" as the host
   evaluates it. The EPS's optimizer (eps/optim.c, above this part) and the CPU backend's
   entry behind l2l_adamw_update both run this one, so the two agree to the bit given the
   same constants. (The CUDA kernel, kernels/elementwise.cu, writes the same expression
   again: device code cannot call host code.) Inline, so the loops that call it vectorize. */
struct backend_adamw_consts {
  float scale;           /* g = scale * grad: the gradient unscaled before anything squares it */
  float step;            /* lr / (1 - b1^t) */
  float rsb2;            /* 1 / sqrt(1 - b2^t) */
  float b1, c1, b2, c2;  /* moment coefficients: m = b1 m + c1 g, v = b2 v + c2 g^2 */
  float eps;
  float decay;           /* lr * weight_decay: decoupled decay, p -= decay p */
};

/* The constants of a step from lr, the betas, eps, weight decay and the bias corrections
   bc = 1 - b^t, in double and rounded once, so that m^/(sqrt(v^) + eps) becomes
   (m / bc1) / (sqrt(v) rsb2 + eps) with no per-element division by a bias correction.
   grad_scale s (the EPS's loss unscaling and clipping) multiplies each gradient first: it
   must not fold into the coefficients, where (1 - b2) s^2 underflows f32 for a loss scale
   of 2^64 or more while the scaled gradient's square overflows, and 0 x inf is NaN. */
static inline struct backend_adamw_consts backend_adamw_consts(double lr, float beta1, float beta2,
                                                               float eps, float weight_decay,
                                                               double bc1, double bc2,
                                                               double grad_scale) {
  return (struct backend_adamw_consts){
      .scale = (float)grad_scale,
      .step = (float)(lr / bc1),
      .rsb2 = (float)(1.0 / sqrt(bc2)),
      .b1 = beta1,
      .c1 = (float)(1.0 - (double)beta1),
      .b2 = beta2,
      .c2 = (float)(1.0 - (double)beta2),
      .eps = eps,
      .decay = (float)lr * weight_decay,
  };
}

/* The new value of p, with *m and *v moved on by the gradient scale * grad. */
static inline float backend_adamw_element(float p, float grad, float *m, float *v,
                                          const struct backend_adamw_consts *k) {
  float g = k->scale * grad;
  float mi = k->b1 * *m + k->c1 * g;
  float vi = k->b2 * *v + k->c2 * (g * g);
  *m = mi;
  *v = vi;
  return p - k->step * mi / (sqrtf(vi) * k->rsb2 + k->eps) - k->decay * p;
}

#endif /* L2L_BACKEND_H */
