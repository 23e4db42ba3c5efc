/* SPDX-License-Identifier: MIT */
/* rng.c — Philox4x32-10, the counter-based generator behind every random number in l2l.
 *
 * Purpose: make each draw a pure function of (seed, stream, index), so that splitting a
 * batch into micro-batches, recomputing a layer, or running on another backend yields the
 * very same numbers. Layout: draw `index` is word index%4 of the block with counter
 * (index/4 as 64 bits, stream as 64 bits) under key = seed.
 * Must never: keep hidden state between calls.
 */
#include <string.h>

#include "core.h"

enum {
  PHILOX_M0 = 0xD2511F53u,
  PHILOX_M1 = 0xCD9E8D57u,
  PHILOX_W0 = 0x9E3779B9u,
  PHILOX_W1 = 0xBB67AE85u,
};

static void philox_block(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2) {
  uint32_t c0 = counter4[0], c1 = counter4[1], c2 = counter4[2], c3 = counter4[3];
  uint32_t k0 = key2[0], k1 = key2[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out4[0] = c0, out4[1] = c1, out4[2] = c2, out4[3] = c3;
}

l2l_status l2l_philox4x32(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2) {
  if (out4 == NULL || counter4 == NULL || key2 == NULL)
    return FAIL(L2L_ERR_INVALID, "out4, counter4 and key2 must not be NULL");
  philox_block(out4, counter4, key2);
  return L2L_OK;
}

void philox_draws(uint32_t *out4, uint64_t seed, uint64_t stream, uint64_t block) {
  uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                         (uint32_t)(stream >> 32)};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  philox_block(out4, counter, key);
}

/* LANES consecutive blocks at once, one per SIMD lane: the same rounds as philox_block,
   written over arrays so that GCC vectorizes the 32 x 32 -> 64-bit products (vpmuludq).
   words[4 l + w] is word w of block first_block + l. */
enum { LANES = 16 };

static void philox_lanes(uint32_t *words, uint64_t first_block, uint64_t stream, uint64_t seed) {
  uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int l = 0; l < LANES; l++) {
    uint64_t block = first_block + (uint64_t)l;
    c0[l] = (uint32_t)block, c1[l] = (uint32_t)(block >> 32);
    c2[l] = (uint32_t)stream, c3[l] = (uint32_t)(stream >> 32);
  }
  for (int round = 0; round < 10; round++) {
#pragma omp simd
    for (int l = 0; l < LANES; l++) {
      uint64_t p0 = (uint64_t)PHILOX_M0 * c0[l];
      uint64_t p1 = (uint64_t)PHILOX_M1 * c2[l];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
      uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = (uint32_t)p1, c3[l] = (uint32_t)p0;
      c0[l] = n0, c2[l] = n2;
    }
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  for (int l = 0; l < LANES; l++)
    words[4 * l] = c0[l], words[4 * l + 1] = c1[l], words[4 * l + 2] = c2[l],
    words[4 * l + 3] = c3[l];
}

void philox_range(uint32_t *out, uint64_t seed, uint64_t stream, uint64_t first, int64_t n) {
  uint32_t words[4 * LANES];
  uint64_t block = first >> 2;
  int64_t skip = (int64_t)(first & 3), done = 0;
  while (done < n) {
    philox_lanes(words, block, stream, seed);
    int64_t take = 4 * LANES - skip < n - done ? 4 * LANES - skip : n - done;
    memcpy(out + done, words + skip, (size_t)take * sizeof *out);
    done += take;
    block += LANES;
    skip = 0;
  }
}
