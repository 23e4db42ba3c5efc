/* SPDX-License-Identifier: MIT */
/* test_quant.c — compact optimizer state (src/eps/quant.c): the 8-bit codes, the nearest
 * code, blocks encoded and decoded, bf16, and an update run on compact state.
 *
 * What it tests: the two codes' values against l2l.h's rule evaluated in double here (0,
 * 1 exact, ascending); the encoder's nearest code against a search over every code in
 * double, at every midpoint and the floats beside it, random magnitudes over 16 decades,
 * zero, subnormals and values past 1; arrays of awkward sizes (1, 7, a block, a block
 * and one, several, a random one) of several distributions (normal at random scales,
 * magnitudes log-uniform over 12 decades with zeros among them, all zero, a block of
 * subnormals) encoded and decoded: each block's scale its largest magnitude (the square
 * root's for v), each byte's code the nearest of |x| / scale, its sign, the padding
 * zero, nothing written past the array, every value back within half the code's widest
 * gap of its block's scale (the bound l2l.h's code gives); a root code's negatives (-0
 * among them) and NaNs encoded as zeros are, on both paths; bf16 to nearest even;
 * eps_compact_chunk for SGD with momentum, AdamW and LAMB in both precisions against the
 * same f32 kernels run on the decoded state and encoded after (bit for bit; LAMB's trust
 * ratio, summed per block, to rounding), from a chunk that starts blocks into its array,
 * with a later wave leaving the state's bytes untouched; the same with a bf16 master, its
 * update rounded stochastically by the chunk's own Philox draws; stochastic rounding
 * unbiased exactly (over all 2^16 draws a value's mean is the value) and ties of the
 * draws resolved as documented, inf and NaN kept; l2l_state_array_check (the check a save
 * and a restore share) passing finite arrays and naming the element of an inf, a NaN or a
 * negative second moment in each precision.
 * How: inputs drawn fresh from check.h's generator (seed printed); the internal functions
 * called directly (the test links libl2l.a). All names start with "quant_".
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eps/eps.h"

enum { BLOCK = L2L_STATE_BLOCK };

/* ---------------------------------------------------------------- the rule, in double */

/* l2l.h: Mb[0] = 0, then 10^-E (0.1 + 0.9 (k + 1) / 2^(b-1-E)) for E = b-1 .. 0. */
static int ref_magnitudes(double *out, int bits) {
  int n = 0;
  out[n++] = 0.0;
  for (int e = bits - 1; e >= 0; e--) {
    int f = 1 << (bits - 1 - e);
    for (int k = 0; k < f; k++) out[n++] = pow(10.0, -e) * (0.1 + 0.9 * (k + 1) / f);
  }
  return n;
}

static double mag7[128], mag8[256];
static void ref_build(void) {
  CHECK(ref_magnitudes(mag7, 7) == 128, "the signed code has 128 magnitudes");
  CHECK(ref_magnitudes(mag8, 8) == 256, "the unsigned code has 256 magnitudes");
}

/* Whether magnitude index q is a nearest of y among mag[0..count), up to the float
   rounding of y and of the encoder's midpoints. */
static bool is_nearest(double y, int q, const double *mag, int count) {
  double best = INFINITY;
  for (int j = 0; j < count; j++) best = fmin(best, fabs(y - mag[j]));
  double slack = 4.0 * 0x1p-24 * fmax(y, mag[q]) + 1e-45;
  return fabs(y - mag[q]) <= best + slack;
}

/* The widest half gap between neighbouring codes: what a value may move, times its scale. */
static double widest_half_gap(const double *mag, int count) {
  double g = 0.0;
  for (int j = 0; j + 1 < count; j++) g = fmax(g, (mag[j + 1] - mag[j]) / 2.0);
  return g;
}

/* ---------------------------------------------------------------- the codes */

TEST(quant_codes) {
  ref_build();
  const float *s = optim_code_values(OPTIM_CODE_SIGNED), *r = optim_code_values(OPTIM_CODE_ROOT);
  for (int b = 0; b < 256; b++) {
    double want = (b & 128 ? -1.0 : 1.0) * mag7[b & 127];
    CHECK(fabs(s[b] - want) <= 0x1p-24 * fabs(want), "signed byte %d: %.9g, the rule %.9g", b,
          (double)s[b], want);
    CHECK(fabs(r[b] - mag8[b]) <= 0x1p-24 * mag8[b], "unsigned byte %d: %.9g, the rule %.9g", b,
          (double)r[b], mag8[b]);
    if (b > 0 && b < 128) CHECK(s[b] > s[b - 1], "signed magnitudes ascend at %d", b);
    if (b > 0) CHECK(r[b] > r[b - 1], "unsigned magnitudes ascend at %d", b);
  }
  CHECK(s[0] == 0.0f && s[127] == 1.0f && s[255] == -1.0f && r[0] == 0.0f && r[255] == 1.0f,
        "0 and 1 are exact");
  CHECK(fabs(s[1] - 1e-6) < 1e-12 && fabs(r[1] - 1e-7) < 1e-13, "the smallest: 1e-6 and 1e-7");
}

static void nearest_case(enum optim_code code, float y) {
  const double *mag = code == OPTIM_CODE_SIGNED ? mag7 : mag8;
  int count = code == OPTIM_CODE_SIGNED ? 128 : 256;
  int byte = optim_code_nearest(code, y);
  int q = code == OPTIM_CODE_SIGNED ? byte & 127 : byte;
  double ya = fmin(fabs((double)y), 1.0);
  CHECK(byte >= 0 && byte < 256 && is_nearest(ya, q, mag, count),
        "%s code of %.9g: byte %d (%.9g) is not a nearest", code == OPTIM_CODE_SIGNED ? "signed" : "unsigned",
        (double)y, byte, mag[q]);
  if (code == OPTIM_CODE_SIGNED)
    CHECK((byte >> 7) == (q != 0 && y < 0), "signed code of %.9g: byte %d has the wrong sign", (double)y,
          byte);
}

TEST(quant_nearest) {
  ref_build();
  for (int c = 0; c < 2; c++) {
    enum optim_code code = c == 0 ? OPTIM_CODE_SIGNED : OPTIM_CODE_ROOT;
    const double *mag = c == 0 ? mag7 : mag8;
    int count = c == 0 ? 128 : 256;
    for (int j = 0; j + 1 < count; j++) {   /* at each midpoint and two floats either side */
      float y = (float)((mag[j] + mag[j + 1]) / 2.0);
      float lo = y, hi = y;
      for (int k = 0; k < 3; k++) {
        nearest_case(code, lo), nearest_case(code, hi);
        lo = nextafterf(lo, 0.0f), hi = nextafterf(hi, 2.0f);
      }
    }
    for (int i = 0; i < 20000; i++) {
      float y = (float)pow(10.0, check_rand_uniform(-16.0, 0.0));
      nearest_case(code, code == OPTIM_CODE_SIGNED && (i & 1) ? -y : y);
    }
    float specials[] = {0.0f, 1e-45f, 1e-40f, FLT_MIN, 1.0f, nextafterf(1.0f, 2.0f), 1.5f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) nearest_case(code, specials[i]);
  }
}

/* The array encoder's code of every element is optim_code_nearest's of y = |x| / scale
   (sqrt(x) for a root code), whichever path it took (AVX-512's 16 at a time, or one at a
   time for the rest): blocks whose largest magnitude is 1 (scale 1: y is |x| exactly),
   filled with the powers of ten the decades turn at, every midpoint between two codes,
   each with the floats beside them, the magnitudes where fused rounding would choose
   otherwise (FUSED_APART), zeros, subnormals and random magnitudes, in an order drawn
   afresh, and a length past whole vectors. */
/* The magnitudes in [1e-7, 1] where a fused multiply-add in the code's arithmetic (y 10^E -
   0.1, or the position less a half, or both) picks another code than rounding each
   operation: inputs found by scanning every float of that range once (2026-11-29), where
   the encoder's paths could part if one of them fused. */
static const float FUSED_APART[] = {
    0x1.b43524p-19f, 0x1.b43526p-19f, 0x1.040bfep-17f, 0x1.64840ep-16f, 0x1.47ae14p-13f,
    0x1.4fdf3cp-10f, 0x1.851eb8p-9f, 0x1.ced916p-9f, 0x1.560418p-8f, 0x1.19999ap-7f,
    0x1.3e76c8p-7f, 0x1.170a3ep-6f, 0x1.fd70a2p-6f, 0x1.2cccccp-5f, 0x1.b70a3cp-5f,
    0x1.e51eb8p-5f, 0x1.09999ap-4f, 0x1.433334p-4f, 0x1.4eb852p-4f, 0x1.93d70ap-4f,
    0x1.5cf75p-22f, 0x1.5cf752p-22f, 0x1.a0133p-21f, 0x1.bc98a4p-18f, 0x1.0624dep-16f,
    0x1.fc8f32p-15f, 0x1.2d7732p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f, 0x1.f8a092p-13f,
    0x1.374bc6p-12f, 0x1.ad42c4p-12f, 0x1.119cep-11f, 0x1.8793dep-11f, 0x1.a5119cp-11f,
    0x1.fd8adap-11f, 0x1.28f5c2p-9f, 0x1.158106p-8f, 0x1.4cccccp-8f, 0x1.71a9fcp-8f,
    0x1.841894p-8f, 0x1.96872cp-8f, 0x1.bb645ap-8f, 0x1.e04188p-8f, 0x1.f2b022p-8f,
    0x1.0bc6a8p-7f, 0x1.276c8cp-7f, 0x1.e8f5c2p-7f, 0x1.228f5cp-6f, 0x1.39999ap-6f,
    0x1.7eb852p-6f, 0x1.acccccp-6f, 0x1.328f5cp-5f, 0x1.6c28f6p-5f, 0x1.b147aep-5f,
    0x1.bcccccp-5f, 0x1.c851ecp-5f, 0x1.eae148p-5f, 0x1.f66668p-5f, 0x1.00f5c4p-4f,
    0x1.06b852p-4f, 0x1.0c7ae2p-4f, 0x1.4bd70ap-4f, 0x1.51999ap-4f, 0x1.7fae14p-4f,
    0x1.8570a4p-4f, 0x1.8b3334p-4f, 0x1.90f5c2p-4f, 0x1.96b852p-4f};

TEST(quant_encode_paths_agree) {
  enum { N = 2 * BLOCK + 13 };
  float *x = xmalloc(sizeof(float) * N);
  for (int c = 0; c < 2; c++) {
    enum optim_code code = c == 0 ? OPTIM_CODE_SIGNED : OPTIM_CODE_ROOT;
    bool root = code == OPTIM_CODE_ROOT;
    int count = root ? 256 : 128;
    const float *value = optim_code_values(code);
    float y[4 * 256 + 128];   /* the magnitudes y to meet */
    int m = 0;
    for (size_t i = 0; i < sizeof FUSED_APART / sizeof FUSED_APART[0]; i++) y[m++] = FUSED_APART[i];
    for (int j = 0; j + 1 < count; j++) {   /* midpoints, and the floats either side */
      float mid = (value[j] + value[j + 1]) / 2.0f;
      y[m++] = mid, y[m++] = nextafterf(mid, 0.0f), y[m++] = nextafterf(mid, 2.0f);
    }
    for (int e = 1; e < 8; e++) {   /* the decades' turns */
      float t = powf(10.0f, (float)-e);
      y[m++] = t, y[m++] = nextafterf(t, 0.0f), y[m++] = nextafterf(t, 2.0f);
    }
    float specials[] = {0.0f, 1e-45f, 1e-40f, FLT_MIN, 1.0f, 0.5f * value[1],
                        nextafterf(0.5f * value[1], 0.0f), nextafterf(0.5f * value[1], 1.0f)};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) y[m++] = specials[i];
    for (int64_t i = 0; i < N; i++) {   /* each element one of them, or a random one */
      float yi = check_rand_int(0, 3) > 0 ? y[check_rand_int(0, m - 1)]
                                            : (float)pow(10.0, check_rand_uniform(-12.0, 0.0));
      float xi = root ? yi * yi : (check_rand_int(0, 1) ? -yi : yi);
      /* (a root's x is y squared: its sqrt may be y's neighbour; the expectation below
         takes the sqrt the encoder takes) */
      x[i] = i % BLOCK == 7 ? 1.0f : xi;   /* every block's largest: scale 1 */
    }
    uint64_t bytes = host_state_bytes(L2L_STATE_8BIT, N);
    uint8_t *array = xmalloc(bytes);
    optim_state_encode(array, N, 0, x, N, L2L_STATE_8BIT, code);
    int bad = 0;
    for (int64_t i = 0; i < N && bad < 5; i++) {
      float yi = root ? sqrtf(x[i]) : fabsf(x[i]);
      int want = optim_code_nearest(code, root ? yi : x[i]);
      if (array[i] != want)
        bad++, CHECK(false, "%s code, element %lld (x %a, y %a): byte %d, optim_code_nearest %d",
                     root ? "root" : "signed", (long long)i, (double)x[i], (double)yi, array[i], want);
    }
    free(array);
  }
  free(x);
}

/* A root code's array where some x are negative (-0 among them) or NaN: those count as 0
   (code 0, out of the scale), and every other element's code and the block's scale are
   those of the same array with 0 in their places; on each path (a block of 16-wide vectors
   and a tail). */
TEST(quant_root_code_takes_negatives_and_nans_as_zero) {
  enum { N = BLOCK + 37 };
  float *x = xmalloc(sizeof(float) * N), *zeroed = xmalloc(sizeof(float) * N);
  uint64_t bytes = host_state_bytes(L2L_STATE_8BIT, N);
  uint8_t *got = xmalloc(bytes), *want = xmalloc(bytes);
  for (int64_t i = 0; i < N; i++) {
    float v = (float)pow(10.0, check_rand_uniform(-9.0, 0.0));
    int odd = check_rand_int(0, 5);
    x[i] = odd == 0 ? -v : odd == 1 ? NAN : odd == 2 ? -0.0f : v;
  }
  /* a negative past each block's largest */
  x[check_rand_int(0, BLOCK - 1)] = -4.0f, x[BLOCK + check_rand_int(0, 36)] = -4.0f;
  for (int64_t i = 0; i < N; i++) zeroed[i] = x[i] > 0.0f ? x[i] : 0.0f;
  memset(got, 0x5A, bytes), memset(want, 0xA5, bytes);
  optim_state_encode(got, N, 0, x, N, L2L_STATE_8BIT, OPTIM_CODE_ROOT);
  optim_state_encode(want, N, 0, zeroed, N, L2L_STATE_8BIT, OPTIM_CODE_ROOT);
  int64_t bad = -1;
  for (uint64_t b = 0; b < bytes && bad < 0; b++)
    if (got[b] != want[b]) bad = (int64_t)b;
  CHECK(bad < 0, "byte %lld of %llu: %d with negatives and NaNs, %d with zeros in their places",
        (long long)bad, (unsigned long long)bytes, bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
  for (int64_t i = 0; i < N; i++)
    if (!(x[i] > 0.0f)) CHECK(got[i] == 0, "element %lld (x %a): code %d, want 0", (long long)i,
                              (double)x[i], got[i]);
  free(x), free(zeroed), free(got), free(want);
}

/* ---------------------------------------------------------------- arrays */

enum { DIST_NORMAL, DIST_DECADES, DIST_ZERO, DIST_SUBNORMAL, DISTS };

static void draw(float *x, int64_t n, int dist, bool nonnegative) {
  double scale = pow(10.0, check_rand_uniform(-30.0, 30.0));
  for (int64_t i = 0; i < n; i++) {
    double v;
    switch (dist) {
    case DIST_NORMAL: v = scale * check_rand_normal(); break;
    case DIST_DECADES:
      v = check_rand_int(0, 9) == 0 ? 0.0 : pow(10.0, check_rand_uniform(-12.0, 0.0));
      v *= check_rand_int(0, 1) ? -1.0 : 1.0;
      break;
    case DIST_ZERO: v = 0.0; break;
    default: v = (i / BLOCK) % 2 == 0 ? check_rand_uniform(-1.0, 1.0) * 1e-39 : check_rand_normal();
    }
    x[i] = (float)(nonnegative ? fabs(v) : v);
  }
}

static void round_trip(int64_t n, int dist, enum optim_code code) {
  bool root = code == OPTIM_CODE_ROOT;
  const double *mag = root ? mag8 : mag7;
  int count = root ? 256 : 128;
  uint64_t bytes = 0;
  CHECK_OK(l2l_state_array_bytes(&bytes, L2L_STATE_8BIT, n));
  uint64_t codes_bytes = ((uint64_t)n + 3) / 4 * 4, blocks = ((uint64_t)n + BLOCK - 1) / BLOCK;
  CHECK(bytes == codes_bytes + 4 * blocks, "l2l_state_array_bytes(8bit, %lld) = %llu", (long long)n,
        (unsigned long long)bytes);
  uint8_t *array = xmalloc(bytes + 64);
  memset(array, 0xAB, bytes + 64);
  float *x = xmalloc(sizeof(float) * (size_t)n), *back = xmalloc(sizeof(float) * (size_t)n);
  draw(x, n, dist, root);
  for (int64_t i = 0; i < n; i++) back[i] = NAN;
  optim_state_encode(array, n, 0, x, n, L2L_STATE_8BIT, code);
  optim_state_decode(back, array, n, 0, n, L2L_STATE_8BIT, code);
  const float *scales = (const float *)(array + codes_bytes);
  bool ok = true;
  for (uint64_t i = n; i < codes_bytes; i++) ok &= array[i] == 0;
  CHECK(ok, "n=%lld: the padding before the scales is not zero", (long long)n);
  ok = true;
  for (int i = 0; i < 64; i++) ok &= array[bytes + i] == 0xAB;
  CHECK(ok, "n=%lld: written past the array's %llu bytes", (long long)n, (unsigned long long)bytes);
  double gap = widest_half_gap(mag, count);
  for (uint64_t b = 0; b < blocks; b++) {
    int64_t lo = (int64_t)b * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
    double most = 0.0;
    for (int64_t i = lo; i < hi; i++) most = fmax(most, root ? sqrt((double)x[i]) : fabs((double)x[i]));
    double s = scales[b];
    if (!CHECK(fabs(s - most) <= 0x1p-23 * most, "n=%lld dist %d block %llu: scale %.9g, the largest "
               "magnitude %.9g", (long long)n, dist, (unsigned long long)b, s, most))
      break;
    int bad = 0;
    for (int64_t i = lo; i < hi && bad < 3; i++) {
      int byte = array[i], q = root ? byte : byte & 127;
      double y = s > 0 ? (root ? sqrt((double)x[i]) : fabs((double)x[i])) / s : 0.0;
      double want = root ? pow(mag[q] * s, 2) : (byte & 128 ? -1.0 : 1.0) * mag[q] * s;
      /* decoded in float: the code's value rounded once, times the scale (each within
         2^-24 relative), and for a root squared (doubling both) and rounded again; a
         subnormal result within a subnormal ulp (2^-149) a rounding besides */
      double rounding = (root ? 5 : 2) * 0x1p-24;
      /* and exactly the byte's value times the scale in float (squared for a root), on
         whichever path the decode takes (AVX-512's permutes, or the table a load each) */
      float r = optim_code_values(code)[byte] * scales[b], exact = root ? r * r : r;
      bool good = memcmp(&exact, &back[i], sizeof exact) == 0 &&
                  (s == 0 ? byte == 0 && back[i] == 0.0f : is_nearest(y, q, mag, count)) &&
                  (root || (byte >> 7) == (q != 0 && x[i] < 0)) &&
                  fabs(back[i] - want) <= rounding * fabs(want) + 0x1p-148;
      /* the documented bound: the code's value within the widest half gap of the scale
         of the value (of sqrt for v); the decoding's float rounding is checked above */
      double moved = root ? fabs(sqrt(want) - sqrt((double)x[i])) : fabs(want - x[i]);
      good &= moved <= s * (gap + 0x1p-22) + 1e-44;
      if (!good) {
        bad++;
        CHECK(false, "n=%lld dist %d %s: element %lld = %.9g (scale %.9g) -> byte %d -> %.9g",
              (long long)n, dist, root ? "root" : "signed", (long long)i, (double)x[i], s, byte,
              (double)back[i]);
      }
    }
  }
  free(array), free(x), free(back);
}

TEST(quant_round_trip) {
  ref_build();
  int64_t sizes[] = {1, 7, BLOCK, BLOCK + 1, 3 * BLOCK + 5, check_rand_int(2, 5 * BLOCK)};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (int dist = 0; dist < DISTS; dist++) {
      round_trip(sizes[k], dist, OPTIM_CODE_SIGNED);
      round_trip(sizes[k], dist, OPTIM_CODE_ROOT);
    }
}

TEST(quant_bf16) {
  int64_t n = check_rand_int(1, 3 * BLOCK);
  uint64_t bytes = 0;
  CHECK_OK(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, n));
  CHECK(bytes == 2 * (uint64_t)n, "bf16 state: 2 bytes an element");
  float *x = xmalloc(sizeof(float) * (size_t)n), *back = xmalloc(sizeof(float) * (size_t)n);
  uint16_t *h = xmalloc(bytes);
  draw(x, n, DIST_DECADES, false);
  optim_state_encode(h, n, 0, x, n, L2L_STATE_BF16, OPTIM_CODE_SIGNED);
  optim_state_decode(back, h, n, 0, n, L2L_STATE_BF16, OPTIM_CODE_SIGNED);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; i++) {
    /* nearest even in double: the two bf16 neighbours of x, the nearer (tie: even) */
    uint32_t u;
    memcpy(&u, &x[i], 4);
    uint32_t down = u & 0xffff0000u, up = down + 0x10000u;
    float fd, fu;
    memcpy(&fd, &down, 4), memcpy(&fu, &up, 4);
    double dd = fabs((double)x[i] - fd), du = fabs((double)fu - x[i]);
    float want = dd < du ? fd : du < dd ? fu : ((down >> 16) & 1) ? fu : fd;
    if (back[i] != want) {
      bad++;
      CHECK(false, "bf16 of %.9g: %.9g, nearest even %.9g", (double)x[i], (double)back[i], (double)want);
    }
  }
  free(x), free(back), free(h);
}

TEST(quant_refusals) {
  uint64_t bytes = 0;
  CHECK_FAILS(l2l_state_array_bytes(NULL, L2L_STATE_8BIT, 1), L2L_ERR_INVALID, "out");
  CHECK_FAILS(l2l_state_array_bytes(&bytes, (l2l_state_precision)7, 1), L2L_ERR_INVALID, "state 7");
  CHECK_FAILS(l2l_state_array_bytes(&bytes, L2L_STATE_F32, -1), L2L_ERR_INVALID, "n must be");
  CHECK_OK(l2l_state_array_bytes(&bytes, L2L_STATE_8BIT, 0));
  CHECK(bytes == 0, "no elements, no bytes");
  l2l_optimizer_config c = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                            .eps = 1e-8f, .state = (l2l_state_precision)3};
  int arrays = 0;
  CHECK_FAILS(l2l_optimizer_state_arrays(&arrays, &c), L2L_ERR_INVALID, "optimizer state 3");
}

/* ---------------------------------------------------------------- stochastic rounding */

TEST(quant_stochastic_rounding) {
  for (int k = 0; k < 200; k++) {
    /* finite values of every magnitude (normal and subnormal), either sign */
    float x = (float)(pow(2.0, check_rand_uniform(-140.0, 120.0)) * (check_rand_int(0, 1) ? -1 : 1));
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t down = u & 0xffff0000u;
    float lo, hi;
    uint32_t up = down + 0x10000u;
    memcpy(&lo, &down, 4), memcpy(&hi, &up, 4);
    double sum = 0.0;
    int outside = 0;
    for (uint32_t r = 0; r < 65536; r++) {
      float y = half_bf16_to_f32(half_bf16_stochastic(x, r * 0x10001u));   /* high bits ignored */
      outside += y != lo && y != hi;
      sum += y;
    }
    /* up with probability (the low 16 bits of x) / 2^16: the mean is x, exactly */
    CHECK(outside == 0 && sum / 65536.0 == (double)x, "stochastic rounding of %.9g: mean %.17g, %d "
          "results neither neighbour", (double)x, sum / 65536.0, outside);
  }
  CHECK(isinf(half_bf16_to_f32(half_bf16_stochastic(INFINITY, 0xffff))) &&
        isnan(half_bf16_to_f32(half_bf16_stochastic(NAN, 0xffff))), "inf and NaN kept");
}

/* ---------------------------------------------------------------- the update */

/* One wave of an update on compact state against the same f32 kernel run on the decoded
   state, encoded after. */
static void compact_update(l2l_optimizer_kind kind, l2l_state_precision state, bool nesterov,
                           bool bf16_master) {
  const struct optimizer_ops *ops = optimizer_ops(kind);
  l2l_optimizer_config cfg = {.kind = kind, .momentum = 0.9f, .nesterov = nesterov};
  int count = ops->state_count(&cfg);
  int64_t skip = check_rand_int(0, 3) * BLOCK;            /* the chunk starts blocks in */
  int64_t n = check_rand_int(1, 4 * BLOCK), total = skip + n;
  uint64_t bytes = host_state_bytes(state, total);
  struct optim_hyper h = {.kind = kind, .lr = 1e-2f, .weight_decay = 0.1f, .momentum = 0.9f,
                              .nesterov = nesterov, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .t = check_rand_int(2, 50), .grad_scale = 0.5f};
  float *p = xmalloc(4 * (size_t)n), *p_ref = xmalloc(4 * (size_t)n), *g = xmalloc(4 * (size_t)n);
  void *arr[2] = {NULL, NULL}, *ref[2] = {NULL, NULL};
  float *dec[2] = {NULL, NULL};
  uint16_t *ph = xmalloc(2 * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    p[i] = p_ref[i] = (float)check_rand_normal(), g[i] = (float)check_rand_normal();
    if (bf16_master) ph[i] = half_from_f32_bf16(p[i]), p[i] = p_ref[i] = half_bf16_to_f32(ph[i]);
  }
  uint64_t seed = check_rand_u64(), stream = check_rand_u64(), first = check_rand_u64() >> 8;
  h.seed = seed, h.stream = stream, h.first_draw = first;   /* (the record's element 0) */
  h.state = state, h.master = bf16_master ? L2L_BF16 : L2L_F32;
  for (int a = 0; a < count; a++) {
    enum optim_code code = optim_state_code(kind, a);
    float *init = xmalloc(4 * (size_t)total);
    draw(init, total, DIST_NORMAL, code == OPTIM_CODE_ROOT);
    for (int64_t i = 0; i < total; i++) init[i] *= 1e-3f;
    arr[a] = xmalloc(bytes), ref[a] = xmalloc(bytes);
    optim_state_encode(arr[a], total, 0, init, total, state, code);
    memcpy(ref[a], arr[a], bytes);
    dec[a] = xmalloc(4 * (size_t)n);
    optim_state_decode(dec[a], ref[a], total, skip, n, state, code);
    free(init);
  }
  for (int wave = 0; wave < ops->waves; wave++) {
    double sums[2] = {0, 0}, ref_sums[2] = {0, 0};
    static double record_sums[2];
    struct optim_chunk chunk = {.p = p, .grad = g, .n = n, .h = &h, .wave = wave,
                                    .sums = sums, .record_sums = record_sums};
    struct optim_chunk plain = {.p = p_ref, .grad = g, .n = n, .h = &h, .wave = wave,
                                    .sums = ref_sums, .record_sums = record_sums,
                                    .state = {dec[0], dec[1]}};
    uint8_t *before = count > 0 ? xmalloc(bytes) : NULL;
    if (before) memcpy(before, arr[0], bytes);
    struct eps_compact compact = {.state = {arr[0], arr[1]}, .state_n = total,
                                  .master = bf16_master ? ph : NULL};
    if (bf16_master) chunk.p = NULL;
    eps_compact_chunk(ops, &chunk, &compact, skip);
    ops->chunk(&plain);
    if (bf16_master && wave == ops->waves - 1) {
      /* element i rounded by 16-bit draw d = first + skip + i: half d % 2 of draw d / 2 */
      uint64_t d0 = first + (uint64_t)skip;
      uint32_t *draws = xmalloc(4 * (size_t)(n / 2 + 2));
      philox_range(draws, seed, stream, d0 / 2, n / 2 + 2);
      for (int64_t i = 0; i < n; i++) {
        uint64_t d = d0 + (uint64_t)i;
        uint32_t r = draws[d / 2 - d0 / 2] >> (d % 2 ? 16 : 0) & 0xffffu;
        p_ref[i] = half_bf16_to_f32(half_bf16_stochastic(p_ref[i], r));
      }
      for (int64_t i = 0; i < n; i++) p[i] = half_bf16_to_f32(ph[i]);
      free(draws);
    } else if (bf16_master) {   /* a first wave of two leaves the master */
      for (int64_t i = 0; i < n; i++) p[i] = half_bf16_to_f32(ph[i]);
    }
    if (wave == 0) {
      for (int a = 0; a < count; a++) {   /* a later wave reads the state as kept */
        optim_state_encode(ref[a], total, skip, dec[a], n, state, optim_state_code(kind, a));
        optim_state_decode(dec[a], ref[a], total, skip, n, state, optim_state_code(kind, a));
      }
      record_sums[0] = sums[0], record_sums[1] = sums[1];
      if (ops->waves > 1)
        CHECK(fabs(sums[0] - ref_sums[0]) <= 1e-12 * ref_sums[0] &&
              fabs(sums[1] - ref_sums[1]) <= 1e-12 * ref_sums[1],
              "%s wave 0: sums %.17g %.17g, plain %.17g %.17g", ops->name, sums[0], sums[1],
              ref_sums[0], ref_sums[1]);
    } else if (before) {
      CHECK(memcmp(before, arr[0], bytes) == 0, "%s wave %d wrote the state", ops->name, wave);
    }
    free(before);
  }
  for (int a = 0; a < count; a++)
    CHECK(memcmp(arr[a], ref[a], bytes) == 0, "%s %s state %d (n=%lld from %lld): not the plain "
          "kernel's encoded", ops->name, state == L2L_STATE_BF16 ? "bf16" : "8bit", a,
          (long long)n, (long long)skip);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; i++)
    if (p[i] != p_ref[i]) {
      bad++;
      CHECK(false, "%s %s p[%lld] = %.9g, the plain kernel %.9g", ops->name,
            state == L2L_STATE_BF16 ? "bf16" : "8bit", (long long)i, (double)p[i], (double)p_ref[i]);
    }
  for (int a = 0; a < 2; a++) free(arr[a]), free(ref[a]), free(dec[a]);
  free(p), free(p_ref), free(g), free(ph);
}

TEST(quant_compact_update) {
  l2l_state_precision states[] = {L2L_STATE_BF16, L2L_STATE_8BIT};
  for (int k = 0; k < 2; k++)
    for (int master = 0; master < 2; master++) {
      compact_update(L2L_OPTIMIZER_SGD, states[k], false, master);
      compact_update(L2L_OPTIMIZER_SGD, states[k], true, master);
      compact_update(L2L_OPTIMIZER_ADAMW, states[k], false, master);
      compact_update(L2L_OPTIMIZER_LAMB, states[k], false, master);
    }
}

/* ---------------------------------------------------------------- the check save and load share */

/* l2l_state_array_check, which run:save applies to what it writes and which is the very
   check l2l_relay_restore_param makes (quant.c's values_check): a state array of random
   finite values in each precision passes, for AdamW's m and v and SGD's momentum; one
   value made inf, NaN or (v) negative at a random element is refused naming that element
   (8 bits: a block's scale made inf or NaN, named at the block's first element, whose
   decoded value is code * scale, inf or NaN; v's scale so large that its square, the
   decoded v, overflows); nothing is written into the array. */
TEST(quant_state_check) {
  const l2l_state_precision states[] = {L2L_STATE_F32, L2L_STATE_BF16, L2L_STATE_8BIT};
  for (int s = 0; s < 3; s++)
    for (int which = -1; which < 2; which++) {   /* -1: SGD's momentum */
      l2l_optimizer_config c = {.kind = which < 0 ? L2L_OPTIMIZER_SGD : L2L_OPTIMIZER_ADAMW,
                                .lr = 1e-3f, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f,
                                .eps = 1e-8f, .state = states[s]};
      int a = which < 0 ? 0 : which;
      enum optim_code code = which == 1 ? OPTIM_CODE_ROOT : OPTIM_CODE_SIGNED;
      int64_t n = check_rand_int(1, 3 * BLOCK + 5);
      float *x = xmalloc(sizeof(float) * (size_t)n);
      double scale = check_rand_uniform(1e-6, 1e6);
      for (int64_t i = 0; i < n; i++) {
        double v = check_rand_normal() * scale;
        x[i] = (float)(code == OPTIM_CODE_ROOT ? v * v : v);
      }
      l2l_tensor *t = NULL;
      if (states[s] == L2L_STATE_8BIT)
        t = NEW(L2L_POOL_HOST, L2L_U8, (int64_t)host_state_bytes(L2L_STATE_8BIT, n));
      else
        t = NEW(L2L_POOL_HOST, states[s] == L2L_STATE_BF16 ? L2L_BF16 : L2L_F32, n);
      optim_state_encode(l2l_tensor_data(t), n, 0, x, n, states[s], code);
      CHECK_OK(l2l_state_array_check(t, &c, a, n));
      size_t bytes = (size_t)l2l_tensor_numel(t) * (states[s] == L2L_STATE_F32 ? 4 : states[s] == L2L_STATE_BF16 ? 2 : 1);
      unsigned char *keep = xmalloc(bytes);
      memcpy(keep, l2l_tensor_data(t), bytes);
      int64_t at = check_rand_int(0, n - 1);
      int kinds = code == OPTIM_CODE_ROOT ? 3 : 2;
      for (int bad = 0; bad < kinds; bad++) {
        float value = bad == 0 ? INFINITY : bad == 1 ? NAN : -1.0f;
        int64_t named = at;
        if (states[s] == L2L_STATE_F32) {
          ((float *)l2l_tensor_data(t))[at] = value;
        } else if (states[s] == L2L_STATE_BF16) {
          ((uint16_t *)l2l_tensor_data(t))[at] = half_from_f32_bf16(value);
        } else {   /* the scale of at's block (after the codes, padded to 4) */
          int64_t block = at / BLOCK;
          float *scales = (float *)((unsigned char *)l2l_tensor_data(t) + ((n + 3) & ~(int64_t)3));
          if (bad == 2) {   /* v's scale past 2^64: its top code's square is inf */
            ((unsigned char *)l2l_tensor_data(t))[block * BLOCK] = 255;
            value = 0x1p70f;
          }
          scales[block] = value;
          named = block * BLOCK;
        }
        char needle[64];
        snprintf(needle, sizeof needle, "at element %lld", (long long)named);
        memcpy(keep, l2l_tensor_data(t), bytes);
        CHECK_FAILS(l2l_state_array_check(t, &c, a, n), L2L_ERR_INVALID, needle);
        CHECK(memcmp(keep, l2l_tensor_data(t), bytes) == 0, "the check wrote into the array");
        optim_state_encode(l2l_tensor_data(t), n, 0, x, n, states[s], code);   /* whole again */
      }
      free(keep);
      l2l_tensor_free(t);
      free(x);
    }
}
