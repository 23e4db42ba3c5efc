/* SPDX-License-Identifier: MIT */
/* attention_emulated.cpp — kernels/attention.cu and kernels/attention_flash.cu compiled for
 * the CPU and run there (attention_emulated.h says what that proves and what it cannot).
 *
 * Purpose: the GPU's attention kernels are written where no GPU runs them; this runs their
 * source and their launchers as they are, on kernel_emulation.h's threads. The six PTX
 * helpers the flash kernel file leaves out under L2L_FLASH_EMULATE are defined here from
 * the PTX ISA's statement of each instruction: a warp's 32 threads post their operands to
 * the warp's exchange, meet, and each takes what the instruction gives its lane; cp.async
 * copies land at their issue or (lazy) at the wait that covers them.
 * Must never: be included by the library, or run where the build has no CUDA headers.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "attention_emulated.h"

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
  if (emu::self().lazy)
    emu::self().open.push_back(c);
  else
    land(c);
}
/* cp.async.commit_group: the copies issued since the last commit form a group. */
static void copies_commit() {
  emu::self().groups.push_back(std::move(emu::self().open));
  emu::self().open.clear();
}
/* cp.async.wait_group N: every group but the newest N complete. */
template <int N>
static void copies_wait() {
  while (emu::self().groups.size() > (size_t)N) {
    for (const emu::Copy &c : emu::self().groups.front()) land(c);
    emu::self().groups.erase(emu::self().groups.begin());
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

/* ---------------------------------------------------------------- the kernels and launchers */

/* A grid's blocks at most (launch_tiles' and k_blocks_for's cap): emu_attention_launches. */
static int grid_cap = 3;
#define K_GRID_MAX_BLOCKS grid_cap
/* (the kernel files' namespace renamed: its functions must not meet the library's) */
#define k_attention emu_k_attention_files
#define L2L_FLASH_EMULATE 1
#include "attention.cu"
#include "attention_flash.cu"

void emu_attention_launches(int blocks, bool lazy) {
  grid_cap = blocks;
  emu::lazy_copies = lazy;
}

#endif /* L2L_KERNEL_EMULATION */
