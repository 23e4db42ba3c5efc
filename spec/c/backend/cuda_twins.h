/* SPDX-License-Identifier: MIT */
/* cuda_twins.h — the GPU tests' harness (test_cuda*.c): tolerances, host/device twins of
 * a tensor, comparisons of a device result brought back with the host's, and the device
 * pool switched to CUDA for one test (use_gpu ... end_gpu); cuda_twins.c defines them.
 *
 * Purpose: one statement of what a GPU result is held to against the CPU backend's, each
 * tolerance with why it is what it is; test_cuda.c says how the GPU tests test.
 * Must never: read a device tensor's memory on the CPU (results are copied back first).
 */
#ifndef L2L_CUDA_TWINS_H
#define L2L_CUDA_TWINS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "reference.h"

/* ---------------------------------------------------------------- tolerances
   Relative errors |got - want| / (|want| + floor) with the floor at the scale of the
   compared tensor (RMS: the root mean square of the reference's finite elements), so an
   element far below the tensor's scale is held to an absolute error at that scale. Where
   a tensor's own rms can be rounding noise (a 1x1x1 GEMM that cancels, GELU' at its
   minimum, dq of a query that sees one key), the floor is the scale its inputs give it
   instead, stated at the comparison. */

/* fp32 element-wise math on both sides (exp, tanh-form GELU, divisions; a few ulp each,
   in another evaluation order or with FMA contraction): ~1e-6; 1e-5 leaves a margin of
   ten. Any wrong formula, index or missed element is off by far more. */
#define TOL_F32 1e-5
/* f32 sums of more than LONG_SUM terms (column sums, long rows, GEMM inner dims) taken in
   another order (GPU trees and atomics against the CPU's per-thread blocks): their
   rounding grows like sqrt(terms) ulp typically and terms ulp at worst, of the sum's
   size: 1e-4, as test_ops's TOL_REDUCTION. */
#define TOL_LONG_SUM 1e-4
#define LONG_SUM 256
/* TF32 keeps 10 of f32's 23 mantissa bits: each input is off by up to 2^-10 relative
   (truncation; 2^-11 when rounded), a product of two by up to ~2e-3. Summed over K
   random terms, the error relative to the result's scale has an rms of ~3e-4 (rounded
   inputs) to ~8e-4 (truncated: the bias adds up), whatever K; the largest of ~1e5
   elements lies ~5 sigma out. Measured with TF32 emulated on the CPU at this file's
   shapes: normwise 2.9e-4 (rounded) and 7.7e-4 (truncated), elements up to 1.8e-3. So:
   the normwise error ||got - want|| / ||want|| <= 1.5e-3 (l2l.h: "about 1e-3"), every
   element <= 5e-3. An f32-level bug (a wrong transpose, a leaked NaN) is off by O(1). */
#define TOL_TF32_NORM 1.5e-3
#define TOL_TF32_ELEMENT 5e-3
/* 16-bit inputs: both sides multiply the same bf16/f16 values exactly and accumulate in
   f32 (tensor cores with an f32 accumulator of their own order and rounding): a few
   ulp of f32 per partial sum, ~1e-5 at K ~ 1000; 1e-3 is loose on purpose (it checks the
   dtype, layout and beta handling, not the accumulator). Against the f32 GEMM of the
   unrounded inputs: bf16 keeps 8 significant bits, so each input moves by up to 2^-8
   relative, a product by ~2.4e-3 rms: normwise ~3e-3 (<= 1e-2), and the worst of 10^6
   elements lies 5-6 sigma out, ~1.5e-2 (measured on the CPU: 1.53e-2): elements <= 5e-2.
   f16 (11 bits) is 8x closer. */
#define TOL_HALF_SAME_INPUT 1e-3
#define TOL_HALF_VS_F32_NORM 1e-2
#define TOL_HALF_VS_F32_ELEMENT 5e-2
/* GELU' from y = gelu(x), the op alone: both backends read the same slope tables
   (src/backend/gelu_table.c) the same way, and part only by the rounding of a fused
   multiply-add in the interpolation lo + f (hi - lo) and by their logf's last bits on the
   far left branch (there |gelu'| < 0.01 and a table step spans 1/113 of w): a few ulps of
   an O(1) slope, held to TOL_F32 at floor 1. Whole frugal layers keep the margin of the
   GPU's Newton inversion before the tables, which parted from them by up to ~1e-4 near the
   minimum (an ulp of y moves x by ~2.6e-4 there; test_frugal_gelu.c): every gradient
   behind the MLP's GELU sums such factors. */
#define TOL_GELU_SLOPE TOL_F32
#define TOL_GELU_FROM_OUTPUT 5e-4
/* Attention: scores, exp, row sums and the P V / dS K products in tiles of the GPU's own
   shape against the CPU's 64-row tiles and BLAS calls: sums of up to S terms in another
   order, plus exp at a few ulp: 1e-4 of each output's scale. */
#define TOL_ATTENTION 1e-4
/* Attention with 16-bit products (tensor cores): q, k, v, P, do, P' and dS rounded to bf16
   (8 significant bits) or f16 (11), summed in f32, against the CPU's fp32. Sized by
   emulating those roundings in float64 at this file's shapes (8 seeds): bf16 normwise o
   0.004, dv 0.009, lse 0.016, dq and dk 0.063 (a query that sees one key has dS = dP - D,
   rounding noise on the GPU's side, held to a tenth of dv's scale as below); the worst
   element o 0.043, lse 0.015, dv 0.081, dq and dk 0.29; f16 about an eighth of bf16.
   Tolerances: two to two and a half times those for bf16, a quarter of bf16's for f16. A
   wrong tile, mask or index is off by O(1). The same emulation's smallest worst element
   of o is 1.3e-3 (bf16) and 1.9e-4 (f16), so an o within TOL_ATTENTION / 2 of fp32 means
   the fp32 kernels ran instead: that is checked too. */
enum attention_output { ATTN_VALUES /* o, dv */, ATTN_LSE, ATTN_DQK };
static const double TOL_ATTN16_ELEMENT[3] = {0.2, 0.05, 0.6};
static const double TOL_ATTN16_NORM[3] = {0.025, 0.04, 0.15};
/* An attention output (got) against the reference's (want): (rows, cols) with row stride
   ld, floor as compare_at's. fp32 products: TOL_ATTENTION per element. 16-bit products: per
   element and normwise (over want's finite elements, with the floor as the least scale)
   within the kind's TOL_ATTN16. */
bool attention_close(const char *what, const float *got, const float *want, int64_t rows,
                     int64_t cols, int64_t ld, double floor, l2l_dtype precision,
                     enum attention_output kind);
/* Whole layers: a chain of the ops above (GEMMs with K up to the MLP width, LayerNorm,
   softmax or flash attention, GELU): 1e-4 of each output's scale. */
#define TOL_LAYER 1e-4
/* The floor of a comparison: the reference's rms (a negative floor means -floor * rms). */
#define RMS (-1.0)

/* x rounded to the 16-bit t (bf16 or f16) as convert rounds it, and a 16-bit value widened. */
static inline uint16_t round16(float x, l2l_dtype t) {
  return t == L2L_BF16 ? half_from_f32_bf16(x) : half_from_f32_f16(x);
}
static inline float widen16(uint16_t h, l2l_dtype t) {
  return t == L2L_BF16 ? half_bf16_to_f32(h) : half_f16_to_f32(h);
}
/* n floats of malloc (at least one), each `fill`; the caller frees them. */
float *host_floats(int64_t n, float fill);
/* n floats of malloc (at least one), each scale times a normal draw; the caller frees them. */
float *host_normals(int64_t n, double scale);
/* n + 1 elements of `size` bytes, every byte 0xff (NaN as f32 and as 16-bit), of malloc
   (free base); `at` is `shift` elements in (1: f32 data off 16-byte alignment, 16-bit data
   2 bytes off 8). */
struct host_buf {
  char *base;
  void *at;
};
struct host_buf host_poisoned(int64_t n, size_t size, int64_t shift);
/* No element of a (rows, ld) f32 or (half) 16-bit buffer past each row's cols written: all
   still the poison (NaN, 0xffff). */
bool padding_kept(const char *what, const void *x, bool half, int64_t rows, int64_t cols,
                  int64_t ld);
/* Whether two encodings of one optimizer state array (n elements in `state`; a from the
   host, b from a GPU kernel) are the same but for neighbours: a value the two sides
   computed an ulp apart (FMAs) may round to the next bf16 or 8-bit code, never further;
   an 8-bit block's scales within TOL_F32. f32 state:
   within TOL_F32 of the array's largest magnitude. A bf16 value that nearly cancels (a
   momentum and its gradient, about one element in 2^16 of a random array) keeps the
   operands' error, ulps of theirs, not of its own: it may be codes apart, within TOL_F32
   of the array's largest magnitude as f32 state is. And few move: values a few f32 ulps
   apart (2^-22 relative) straddle a rounding edge, or a bf16 master's draw falls between
   them, with a chance of about 2^-22 over the code's relative step (2^-8 for bf16, coarser
   for 8 bits): about 2^-14 an element; at most 1 + n / 1024 may differ (16 times that
   rate and more), where draws or codes taken from the wrong element move a third of them. */
bool state_neighbours(const uint8_t *a, const uint8_t *b, int64_t n, l2l_state_precision state,
                      enum optim_code code, const char *what);
/* LAMB's f32 master after one update on compact state from p0 (n), a GPU kernel's (got, its
   state s_got) against the host's (want, s_want): each side's second wave steps by r
   computed from the state it has just encoded, and where a code moved (state_neighbours)
   so does that element's step, by far more than TOL_F32. So the kernel's master is held,
   within TOL_F32 of p's rms, to p0 - lr T r(the kernel's own state), T the trust ratio
   the host's steps show (p0 - want = lr T r(the host's state), by least squares: exact
   to f32's rounding). A wrong trust, r or step shows as on any other element. */
bool lamb_master_close(const char *what, const float *got, const float *want, const float *p0,
                       void *const s_got[2], void *const s_want[2], int64_t n,
                       const struct optim_hyper *h);
/* The kept bits of a standard-mode attention mask (rows of (S+7)/8 bytes; host memory) for
   the keys each query sees by position (j <= i when causal; every key otherwise, padded
   ones included: their draws are made all the same), a kernel's (got) against the CPU's. */
bool kept_bits_match(const char *what, const uint8_t *got, const uint8_t *want, int64_t rows,
                     int64_t S, int causal);
/* Why a kernel emulation test skips. */
#define NO_KERNEL_EMULATION                                                               \
  "this build found no CUDA toolkit headers (cuda_bf16.h), or no Boost.Context "          \
  "(libboost-context-dev) with a C++20 compiler, to compile the kernels for the CPU with"
/* A kernel's 16-bit output (rows, cols of t, rows ld apart; host memory) bit for bit its f32
   values (the same layout) rounded to t, as convert rounds them. */
bool rounded16_at(const char *file, int line, const char *what, const uint16_t *got,
                  const float *f32, int64_t rows, int64_t cols, int64_t ld, l2l_dtype t);
#define CHECK_ROUNDED16(what, got, f32, rows, cols, ld, t) \
  rounded16_at(__FILE__, __LINE__, (what), (got), (f32), (rows), (cols), (ld), (t))

/* Whether the environment leaves the flash attention kernels on (L2L_FLASH=0 turns them
   off: the tests that count their calls then expect none). */
static inline bool flash_env_on(void) {
  const char *env = getenv("L2L_FLASH");
  return env == NULL || strcmp(env, "0") != 0;
}

static inline double tol_sum(int64_t terms) { return terms > LONG_SUM ? TOL_LONG_SUM : TOL_F32; }

/* The floor of an output that cancels to near 0 where its rows are peaked: softmax's
   backward dx = s y (dy - sum(dy y)) (dy of rms 1), cross-entropy's dlogits s (p - onehot)
   and its losses log(sum exp(x - max)) + max - x_t. Where a row's mass sits on one element
   (in training, on the target whenever the model is right), dy - sum, p_t - 1 and
   log(sum) cancel, and each keeps the row sum's rounding in absolute terms: its relative
   error (what tol_sum(terms) bounds: a few ulp, up to ~sqrt(terms) of them; 7.6e-6 seen at
   15,000 terms) times the output's unit (|s| for dx and dlogits, 1 for a loss), while the
   elements, and the rms of a tensor of such rows, may lie far below that (a
   softmax_backward failed at 1.15e-5 against 1e-5 so, its rms 0.027; with logits raised
   by 10 to 30 at their targets, cross-entropy failed with relative errors up to 51). So
   the floor is the larger of the reference's rms and the unit. A wrong index, scale,
   target or row sum moves the target's element, or every element of a row, by a share
   of the unit. */
double cancelling_floor(const float *want, int64_t rows, int64_t cols, int64_t ld, double unit);
/* The same of a host tensor's f32 elements. */
double cancelling_floor_of(const l2l_tensor *want, double unit);

/* ---------------------------------------------------------------- tensors */

#define HOST(dtype, ...) check_tensor(L2L_POOL_HOST, (dtype), DIMS(__VA_ARGS__))
#define DEV(dtype, ...) check_tensor(L2L_POOL_DEVICE, (dtype), DIMS(__VA_ARGS__))
#define RANDN(scale, ...) fill_normal(HOST(L2L_F32, __VA_ARGS__), (scale))
#define NANS(...) poisoned(HOST(L2L_F32, __VA_ARGS__))

static inline size_t elem_size(const l2l_tensor *t) {
  return l2l_dtype_size((l2l_dtype)l2l_tensor_dtype(t));
}
/* The first element's address: host memory to read, or a device pointer to hand to a
   device backend entry (never dereferenced here). NULL for a NULL tensor. */
static inline float *fdata(const l2l_tensor *t) { return t ? (float *)l2l_tensor_data(t) : NULL; }
static inline uint8_t *bdata(const l2l_tensor *t) { return t ? (uint8_t *)l2l_tensor_data(t) : NULL; }
static inline int32_t *idata(const l2l_tensor *t) { return (int32_t *)l2l_tensor_data(t); }

l2l_tensor *poisoned(l2l_tensor *t);
/* A host u8 tensor of n bytes, all `value`. */
l2l_tensor *bytes_of(int64_t n, uint8_t value);
/* A copy of t in `pool` (a transfer when the pools differ). */
l2l_tensor *copied_to(const l2l_tensor *t, l2l_pool_kind pool);
/* A host tensor of `dtype` holding t's values as the host's l2l_tensor_cast rounds them. */
l2l_tensor *cast_on_host(const l2l_tensor *t, l2l_dtype dtype);
/* "(d0,d1,...)" into buf. */
const char *dims_str(char *buf, size_t len, const l2l_tensor *t);
l2l_pool_stats device_stats(void);

/* ---------------------------------------------------------------- twins
   A host tensor and its device copy. Ops run on both sides in a loop over `side` (0 the
   host, 1 the device), each side's tensors picked with AT(). */

struct twin {
  l2l_tensor *h, *d;
};


static inline struct twin pair(l2l_tensor *h, l2l_tensor *d) { return (struct twin){h, d}; }
/* Takes h; the device side is a copy of it. A NULL h gives a NULL twin. */
struct twin twin_of(l2l_tensor *h);
void twin_free_list(struct twin *const *ts, size_t n);
#define TWIN_FREE(...)                               \
  twin_free_list((struct twin *const[]){__VA_ARGS__}, \
                 sizeof((struct twin *const[]){__VA_ARGS__}) / sizeof(struct twin *))

#define SIDES for (int side = 0; side < 2; side++)
#define AT(tw) (side ? (tw).d : (tw).h)
#define SIDE_NAME (side ? "device" : "host")

/* A call on one side that must succeed. */
#define OK_ON(call)                                                                        \
  check_that((call) == L2L_OK, __FILE__, __LINE__, #call, "failed on the %s: %s", SIDE_NAME, \
             l2l_last_error())

/* A call on one side that must fail with `want` and a message containing `needle`. */
bool fails_on(int side, l2l_status got, l2l_status want, const char *needle, const char *file,
              int line, const char *expr);
#define FAILS_ON(call, status, needle) \
  fails_on(side, (call), (status), (needle), __FILE__, __LINE__, #call)

/* ---------------------------------------------------------------- comparisons */

/* The root mean square of the finite elements of a (rows, cols) matrix with row stride ld. */
double rms_of(const float *v, int64_t rows, int64_t cols, int64_t ld);
double rms_tensor(const l2l_tensor *t);
/* got against want, f32 matrices of (rows, cols) with row stride ld, both in host memory:
   the largest |got - want| / (|want| + floor) over finite elements of want must be at most
   tol; where want is not finite, got must be the same (NaN where NaN, the same infinity).
   floor < 0 means -floor times the rms of want's finite elements. */
bool compare_at(const char *file, int line, const char *what, const float *got,
                const float *want, int64_t rows, int64_t cols, int64_t ld, double floor,
                double tol);
#define CHECK_CLOSE(what, got, want, n, floor, tol) \
  compare_at(__FILE__, __LINE__, (what), (got), (want), 1, (n), (n), (floor), (tol))
#define CHECK_COLS(what, got, want, rows, cols, ld, floor, tol) \
  compare_at(__FILE__, __LINE__, (what), (got), (want), (rows), (cols), (ld), (floor), (tol))
/* The device side of an f32 twin, brought back, against its host side. */
bool twin_close_at(const char *file, int line, const char *what, struct twin t, double floor,
                   double tol);
#define CHECK_TWIN(what, tw, floor, tol) \
  twin_close_at(__FILE__, __LINE__, (what), (tw), (floor), (tol))
/* The device side's bytes against the host side's, element by element. nan_any: where
   the host holds a NaN, any NaN will do (its payload is not compared). */
bool twin_bits_at(const char *file, int line, const char *what, struct twin t, bool nan_any);
#define CHECK_TWIN_BITS(what, tw) twin_bits_at(__FILE__, __LINE__, (what), (tw), false)
#define CHECK_TWIN_BITS_NAN_ANY(what, tw) twin_bits_at(__FILE__, __LINE__, (what), (tw), true)

/* ---------------------------------------------------------------- inputs */

/* x's first elements := the values GELU is hard at (as many as fit). */
void put_gelu_specials(l2l_tensor *x);
/* x ~ 2 N(0,1) + 0.5 (a mean to subtract), weight 1 + 0.3 N, bias 0.3 N. */
void layernorm_inputs(l2l_tensor *x, l2l_tensor *w, l2l_tensor *b);
/* key_mask (B, tk): sample 0 all real, sample 2 (when there is one) all padding, the
   others real with probability 0.7 (at least one real key). */
l2l_tensor *random_key_mask(int64_t B, int64_t tk);

/* ---------------------------------------------------------------- the device for one test */

/* Serves the device pool from CUDA for one test. false: the test was marked skipped (no
   GPU) or failed, and must return right away (nothing to undo). */
bool use_gpu(void);
/* The end of a test that use_gpu() started: nothing left in the device pool, TF32 off,
   the device pool back on the CPU. */
void end_gpu(void);
/* For tests that exercise CUDA itself: skipped in a dry run. */
bool use_real_gpu(void);

#endif /* L2L_CUDA_TWINS_H */
