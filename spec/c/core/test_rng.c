/* SPDX-License-Identifier: MIT */
/* test_rng.c — the core's Philox draws many at a time (rng.c's philox_range) against one
 * block at a time (philox_draws, whose rounds test_tensor.c holds to the published known
 * answers).
 *
 * What it tests: philox_range(out, seed, stream, first, n) is draw first + i of (seed,
 * stream) at out[i] (word (first + i) % 4 of block (first + i) / 4), on whichever path it
 * takes (AVX-512's or AVX2's 64 blocks a call, written straight into out when whole, or the
 * plain loop's), for drawn seeds and streams (with high words set), starts at every word of a
 * block, lengths short of, at and past a call's 256 draws, and blocks whose low word wraps
 * within a call (the carry into the counter's high word). Outputs poisoned first.
 * philox_halves(out, seed, stream, first, n) is 16-bit draw first + i at out[i]: the low
 * half of draw (first + i) / 2 where first + i is even, its high half where odd; for starts
 * at every 16-bit draw of a block and lengths short of, at and past a pass's 512.
 * How: each draw compared with its block from philox_draws. All names start with "rng_".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/core.h"

/* out[0 .. n) against philox_draws, block by block; the first mismatch named. */
static bool draws_match(const uint32_t *out, uint64_t seed, uint64_t stream, uint64_t first,
                        int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t index = first + (uint64_t)i;
    uint32_t block[4];
    philox_draws(block, seed, stream, index >> 2);
    if (!CHECK(out[i] == block[index & 3], "%s: draw %llu (out[%lld]) is %08x, its block's word "
               "%08x", what, (unsigned long long)index, (long long)i, out[i], block[index & 3]))
      return false;
  }
  return true;
}

TEST(rng_philox_range_is_each_block) {
  static const int64_t lengths[] = {1, 3, 255, 256, 257, 1000, 4099};
  uint32_t *out = xmalloc(sizeof(uint32_t) * 4100);
  for (int trial = 0; trial < 12; trial++) {
    uint64_t seed = check_rand_u64(), stream = check_rand_u64();
    /* odd trials start just below a block counter whose low word wraps (2^32 blocks) */
    uint64_t first = trial % 2 ? ((check_rand_u64() >> 8 | 1) << 34) - 4 * (uint64_t)check_rand_int(1, 300)
                               : check_rand_u64() >> 3;
    first += (uint64_t)(trial % 4);   /* every word of a block as the start */
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
      int64_t n = lengths[k];
      memset(out, 0xA5, sizeof(uint32_t) * 4100);
      philox_range(out, seed, stream, first, n);
      char what[96];
      snprintf(what, sizeof what, "trial %d, %lld draws from %llu", trial, (long long)n,
               (unsigned long long)first);
      if (!draws_match(out, seed, stream, first, n, what)) break;
      CHECK(out[n] == 0xA5A5A5A5u, "%s: wrote past the n draws", what);
    }
  }
  free(out);
}

TEST(rng_philox_halves_are_each_words_halves) {
  static const int64_t lengths[] = {1, 2, 7, 511, 512, 513, 1030, 2048, 4099};
  uint16_t *out = xmalloc(sizeof(uint16_t) * 4100);
  for (int trial = 0; trial < 16; trial++) {
    uint64_t seed = check_rand_u64(), stream = check_rand_u64();
    uint64_t first = (check_rand_u64() >> 4) / 8 * 8 + (uint64_t)(trial % 8);   /* every half of a block */
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
      int64_t n = lengths[k];
      memset(out, 0xA5, sizeof(uint16_t) * 4100);
      philox_halves(out, seed, stream, first, n);
      int64_t bad = -1;
      for (int64_t i = 0; i < n && bad < 0; i++) {
        uint64_t index = first + (uint64_t)i, word = index / 2;
        uint32_t block[4];
        philox_draws(block, seed, stream, word / 4);
        uint16_t want = (uint16_t)(index % 2 ? block[word % 4] >> 16 : block[word % 4] & 0xffffu);
        if (out[i] != want) bad = i;
      }
      CHECK(bad < 0, "trial %d, %lld halves from %llu: out[%lld] is not its word's half", trial,
            (long long)n, (unsigned long long)first, (long long)bad);
      CHECK(out[n] == 0xA5A5u, "trial %d, %lld halves from %llu: wrote past the n draws", trial,
            (long long)n, (unsigned long long)first);
    }
  }
  free(out);
}
