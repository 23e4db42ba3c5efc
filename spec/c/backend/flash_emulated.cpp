/* SPDX-License-Identifier: MIT */
/* flash_emulated.cpp — kernels/attention_flash.cu compiled for the CPU and run there
 * (flash_emulated.h says what that proves and what it cannot).
 *
 * Purpose: the GPU's flash attention kernels are written where no GPU runs them; this
 * runs their source as it is, on kernel_emulation.h's threads. The six PTX helpers the
 * kernel file leaves out under L2L_FLASH_EMULATE are defined here from the PTX ISA's
 * statement of each instruction: a warp's 32 threads post their operands to the warp's
 * exchange, meet, and each takes what the instruction gives its lane; cp.async copies land
 * at their issue or (lazy) at the wait that covers them.
 * Must never: be included by the library, or run where the build has no CUDA headers.
 */
#include "flash_emulated.h"

#if L2L_KERNEL_EMULATION


#include "kernel_emulation.h"

/* ---------------------------------------------------------------- the six PTX helpers */

static void land(const emu::Copy &c) {
  if (c.valid)
    memcpy(c.dst, c.src, 16);
  else
    memset(c.dst, 0, 16);
}

/* cp.async.cg.shared.global, 16 bytes; src-size 0 (!valid) fills zeros and reads nothing.
   Both addresses 16-byte aligned, as the instruction requires. */
static void copy16_async(void *dst, const void *src, bool valid) {
  if ((uintptr_t)dst % 16 != 0 || (valid && (uintptr_t)src % 16 != 0))
    emu::fail("cp.async of 16 bytes at an address not 16-byte aligned");
  const emu::Copy c = {dst, src, valid};
  if (emu::self.lazy)
    emu::self.open.push_back(c);
  else
    land(c);
}
/* cp.async.commit_group: the copies issued since the last commit form a group. */
static void copies_commit() {
  emu::self.groups.push_back(std::move(emu::self.open));
  emu::self.open.clear();
}
/* cp.async.wait_group N: every group but the newest N complete. */
template <int N>
static void copies_wait() {
  while (emu::self.groups.size() > (size_t)N) {
    for (const emu::Copy &c : emu::self.groups.front()) land(c);
    emu::self.groups.erase(emu::self.groups.begin());
  }
}

/* ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: threads 8m .. 8m+7 give the row
   addresses of matrix m; lane l receives, for each matrix, in register m, row l/4's
   elements 2(l%4) and 2(l%4)+1 (the lower in the low half), or with .trans column l/4's
   elements of rows 2(l%4) and 2(l%4)+1. */
static void load_matrices_as(uint32_t (&r)[4], const void *p, bool transposed) {
  const int l = emu::lane(), g = l >> 2, t = l & 3;
  if ((uintptr_t)p % 16 != 0) emu::fail("ldmatrix of a row not 16-byte aligned");
  const emu::Exchange &x = emu::collective([&](emu::Exchange &e) { e.address[l] = p; });
  for (int m = 0; m < 4; m++) {
    uint16_t e[2];
    for (int i = 0; i < 2; i++) {
      const int row = transposed ? 2 * t + i : g, col = transposed ? g : 2 * t + i;
      e[i] = static_cast<const uint16_t *>(x.address[8 * m + row])[col];
    }
    r[m] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
  }
}
static void load_matrices(uint32_t (&r)[4], const void *p) { load_matrices_as(r, p, false); }
static void load_matrices_transposed(uint32_t (&r)[4], const void *p) {
  load_matrices_as(r, p, true);
}

/* The value of one 16-bit element of T. */
template <typename T>
static float element(uint16_t bits) {
  T x;
  memcpy(static_cast<void *>(&x), &bits, 2);
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: lane l = 4g + t holds A's rows g and
   g + 8 at columns 2t, 2t+1 (registers 0, 1) and 2t+8, 2t+9 (registers 2, 3: rows g, g+8),
   B's rows 2t, 2t+1 (register 0) and 2t+8, 2t+9 (register 1) of column g, and C / D's
   rows g (elements 0, 1) and g + 8 (2, 3) at columns 2t, 2t+1. Sums in float, k in order. */
template <typename T>
static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int l = emu::lane();
  const emu::Exchange &w = emu::collective([&](emu::Exchange &e) {
    for (int i = 0; i < 4; i++) e.a[l][i] = a[i];
    e.b[l][0] = b0, e.b[l][1] = b1;
  });
  float A[16][16], B[16][8];
  for (int ln = 0; ln < 32; ln++) {
    const int g = ln >> 2, t = ln & 3;
    for (int i = 0; i < 2; i++) {
      A[g][2 * t + i] = element<T>((uint16_t)(w.a[ln][0] >> (16 * i)));
      A[g + 8][2 * t + i] = element<T>((uint16_t)(w.a[ln][1] >> (16 * i)));
      A[g][2 * t + 8 + i] = element<T>((uint16_t)(w.a[ln][2] >> (16 * i)));
      A[g + 8][2 * t + 8 + i] = element<T>((uint16_t)(w.a[ln][3] >> (16 * i)));
      B[2 * t + i][g] = element<T>((uint16_t)(w.b[ln][0] >> (16 * i)));
      B[2 * t + 8 + i][g] = element<T>((uint16_t)(w.b[ln][1] >> (16 * i)));
    }
  }
  const int g = l >> 2, t = l & 3;
  for (int e = 0; e < 4; e++) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    float sum = c[e];
    for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
    c[e] = sum;
  }
}

/* ---------------------------------------------------------------- the kernels themselves */

#define L2L_FLASH_EMULATE 1
#include "attention_flash.cu"

/* ---------------------------------------------------------------- launching */

namespace {

using namespace k_attention;

/* kernel(args) by `blocks` blocks of 128 threads, with `shared` bytes of dynamic shared
   memory. */
void run_blocks(void (*kernel)(FlashArgs), const FlashArgs &args, int blocks, size_t shared,
                bool lazy) {
  emu::run_grid(dim3((unsigned)blocks), dim3(kThreads), shared, lazy, [&] { kernel(args); });
}

template <typename T, int HD>
void forward_as(const FlashArgs &a, int blocks, bool lazy) {
  run_blocks(flash_forward_kernel<T, HD>, a, blocks, shared_bytes<ForwardSmem<HD>>(a.sh), lazy);
}

template <typename T, int HD>
void backward_as(const FlashArgs &a, int blocks, bool lazy) {
  run_blocks(flash_dq_kernel<T, HD>, a, blocks, shared_bytes<DqSmem<HD>>(a.sh), lazy);
  run_blocks(flash_dkdv_kernel<T, HD>, a, blocks, shared_bytes<DkvSmem<HD>>(a.sh), lazy);
}

template <typename T>
void run_typed(const FlashArgs &a, bool backward, int blocks, bool lazy) {
  const int64_t hd = a.sh.head_dim;
  if (hd <= 32) return backward ? backward_as<T, 32>(a, blocks, lazy) : forward_as<T, 32>(a, blocks, lazy);
  if (hd <= 64) return backward ? backward_as<T, 64>(a, blocks, lazy) : forward_as<T, 64>(a, blocks, lazy);
  return backward ? backward_as<T, 128>(a, blocks, lazy) : forward_as<T, 128>(a, blocks, lazy);
}

/* The launchers' checks (kernels/attention.cu), on the shape's fields; blocks at least 1. */
bool accepted(int dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
              int64_t ld_qkv, int64_t ld_o, float dropout, int blocks) {
  return (dtype == DT_BF16 || dtype == DT_F16) && batch > 0 && heads > 0 && seq > 0 &&
         head_dim > 0 && head_dim <= 128 && head_dim % 8 == 0 && ld_qkv % 8 == 0 &&
         ld_qkv >= heads * head_dim && ld_o >= heads * head_dim && dropout >= 0.0f &&
         dropout < 1.0f && blocks >= 1;
}

AttentionShape shape_of(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                        int64_t ld_qkv, int64_t ld_o, int causal, float scale, float dropout,
                        uint32_t keep_threshold, uint64_t seed, uint64_t stream_id,
                        int64_t first_sample) {
  AttentionShape sh;
  sh.batch = batch, sh.heads = heads, sh.seq = seq, sh.head_dim = head_dim;
  sh.ld_qkv = ld_qkv, sh.ld_o = ld_o, sh.first_sample = first_sample;
  sh.seed = seed, sh.stream = stream_id, sh.scale = scale, sh.dropout = dropout;
  sh.keep_scale = 1.0f / (1.0f - dropout), sh.threshold = keep_threshold;
  sh.causal = causal != 0;
  return sh;
}

} /* namespace */

int flash_emulated_forward(void *o, int o_dtype, float *lse, const void *q, const void *k,
                           const void *v, const uint8_t *key_mask, int64_t batch,
                           int64_t heads, int64_t seq, int64_t head_dim, int64_t ld_qkv,
                           int64_t ld_o, int causal, float scale, float dropout,
                           uint32_t keep_threshold, uint64_t seed, uint64_t stream_id,
                           int64_t first_sample, int dtype, int blocks, bool lazy) {
  if (!accepted(dtype, batch, heads, seq, head_dim, ld_qkv, ld_o, dropout, blocks) ||
      (o_dtype != DT_F32 && o_dtype != dtype))
    return -1;
  FlashArgs a = {};
  a.sh = shape_of(batch, heads, seq, head_dim, ld_qkv, ld_o, causal, scale, dropout,
                  keep_threshold, seed, stream_id, first_sample);
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.key_mask = key_mask;
  a.o16 = o_dtype != DT_F32;
  if (dtype == DT_BF16)
    run_typed<__nv_bfloat16>(a, false, blocks, lazy);
  else
    run_typed<__half>(a, false, blocks, lazy);
  return 0;
}

int flash_emulated_backward(void *dq, void *dk, void *dv, int dqkv_dtype, int64_t ld_dqkv,
                            const void *d_o, int64_t ld_do, const void *o, int o_dtype,
                            const float *lse, const void *q, const void *k, const void *v,
                            const uint8_t *key_mask, int64_t batch, int64_t heads,
                            int64_t seq, int64_t head_dim, int64_t ld_qkv, int64_t ld_o,
                            int causal, float scale, float dropout, uint32_t keep_threshold,
                            uint64_t seed, uint64_t stream_id, int64_t first_sample,
                            int dtype, float *d_rows, int blocks, bool lazy) {
  if (!accepted(dtype, batch, heads, seq, head_dim, ld_qkv, ld_o, dropout, blocks) ||
      (o_dtype != DT_F32 && o_dtype != dtype) || (dqkv_dtype != DT_F32 && dqkv_dtype != dtype) ||
      ld_do % 8 != 0 || ld_do < heads * head_dim || ld_dqkv < heads * head_dim)
    return -1;
  FlashArgs a = {};
  a.sh = shape_of(batch, heads, seq, head_dim, ld_qkv, ld_o, causal, scale, dropout,
                  keep_threshold, seed, stream_id, first_sample);
  a.q = q, a.k = k, a.v = v, a.d_o = d_o, a.ld_do = ld_do, a.o_in = o;
  a.lse = const_cast<float *>(lse);
  a.dq = dq, a.dk = dk, a.dv = dv, a.ld_dqkv = ld_dqkv, a.d_rows = d_rows, a.key_mask = key_mask;
  a.o16 = o_dtype != DT_F32, a.out16 = dqkv_dtype != DT_F32;
  if (dtype == DT_BF16)
    run_typed<__nv_bfloat16>(a, true, blocks, lazy);
  else
    run_typed<__half>(a, true, blocks, lazy);
  return 0;
}

#endif /* L2L_KERNEL_EMULATION */
