/* SPDX-License-Identifier: MIT */
/* safetensors_convert.c — a stored tensor's values into an l2l dtype: the format's floats
 * (F64, F32, F16, BF16 and the 8-bit floats) into f32, f16 or bf16, its integers (BOOL, I8
 * to I64, U8 to U64) into i32 or u8.
 *
 * Purpose: let another tool's file be read though it holds dtypes l2l has no tensor of (a
 * BERT's I64 position ids, an F64 buffer, 8-bit float weights), by rules stated once here:
 * a float is rounded once, to nearest even (an F64 goes to f32 rounded to odd first, from
 * which rounding to bf16 or f16 is the one rounding of the F64 itself: f32 keeps more than
 * two bits beyond theirs); an integer is read exactly or refused, naming the first element
 * the dtype does not hold, before dst is touched. Bit arithmetic only, as core.h's half
 * floats: nothing depends on the rounding mode. safetensors_api.c calls it after the bytes
 * as stored were checked against their checksum.
 * Must never: round twice, wrap an integer, or write dst before every value was checked.
 */
#include <math.h>
#include <stdio.h>

#include "core.h"

bool safetensors_reads_into(const struct safetensors_entry *e, l2l_dtype to) {
  if (e->stored->kind == SAFETENSORS_FLOAT) return to == L2L_F32 || to == L2L_F16 || to == L2L_BF16;
  if (e->stored->kind == SAFETENSORS_INTEGER) return to == L2L_I32 || to == L2L_U8;
  return false;
}

const char *safetensors_read_targets(const struct safetensors_entry *e) {
  if (e->stored->kind == SAFETENSORS_FLOAT) return "f32, f16 or bf16";
  if (e->stored->kind == SAFETENSORS_INTEGER) return "i32 or u8";
  return NULL;
}

/* ---------------------------------------------------------------- floats */

/* An 8-bit float's value, exactly: a sign, e_bits of exponent (bias 2^(e_bits - 1) - 1),
   m_bits of mantissa. ieee: the top exponent holds the infinities and NaNs (E5M2); else
   (E4M3, finite: "fn") only the all-ones pattern is a NaN. */
static double f8_value(unsigned b, int e_bits, int m_bits, bool ieee) {
  int exp = (int)(b >> m_bits) & ((1 << e_bits) - 1), man = (int)b & ((1 << m_bits) - 1);
  int top = (1 << e_bits) - 1, bias = (1 << (e_bits - 1)) - 1;
  double v;
  if (exp == top && (ieee || man == (1 << m_bits) - 1)) v = ieee && man == 0 ? INFINITY : NAN;
  else if (exp == 0) v = ldexp(man, 1 - bias - m_bits);
  else v = ldexp(man + (1 << m_bits), exp - bias - m_bits);
  return b >> (e_bits + m_bits) & 1 ? -v : v;
}

/* Element i of a float tensor as stored, other than F64, as an f32: exact (every one of
   these values is an f32). */
static float float_at(const void *src, enum safetensors_format format, int64_t i) {
  const uint8_t *b = src;
  switch (format) {
    case SAFETENSORS_F8_E4M3: return (float)f8_value(b[i], 4, 3, false);
    case SAFETENSORS_F8_E5M2: return (float)f8_value(b[i], 5, 2, true);
    case SAFETENSORS_F8_E8M0: return b[i] == 0xff ? NAN : (float)ldexp(1, b[i] - 127);   /* 2^(b - 127) */
    case SAFETENSORS_F16: return half_f16_to_f32(((const uint16_t *)src)[i]);
    case SAFETENSORS_BF16: return half_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];   /* F32 */
  }
}

/* x rounded to f32: to nearest even, or (odd) toward zero with the lowest bit set where
   anything was dropped (round to odd). A NaN is the quiet NaN. */
static float f64_to_f32(double x, bool odd) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  uint32_t sign = (uint32_t)(u >> 32) & 0x80000000u;
  uint64_t a = u & UINT64_C(0x7fffffffffffffff);
  if (a > UINT64_C(0x7ff0000000000000)) return bits_float(sign | 0x7fc00000u);
  if (a == UINT64_C(0x7ff0000000000000)) return bits_float(sign | 0x7f800000u);
  int e = (int)(a >> 52);   /* x = m 2^(e - 1075) */
  uint64_t m = a & ((UINT64_C(1) << 52) - 1);
  if (e > 0) m |= UINT64_C(1) << 52;
  else e = 1;
  /* f32's biased exponent is e - 896: a normal keeps m's top 24 bits over that exponent
     less one (the implicit bit adds it back); a subnormal counts units of 2^-149 */
  int shift = e - 896 >= 1 ? 29 : 926 - e;
  uint64_t base = e - 896 >= 1 ? (uint64_t)(e - 897) << 23 : 0;
  uint64_t kept = shift < 64 ? m >> shift : 0, rest = shift < 64 ? m & ((UINT64_C(1) << shift) - 1) : m;
  uint64_t bits = base + kept;
  if (odd) {
    bits |= rest != 0;
  } else if (shift < 64) {
    uint64_t half = UINT64_C(1) << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) bits++;
  }
  /* past the largest: infinity, or (toward zero) the largest, which is odd */
  if (bits >= 0x7f800000u) bits = odd ? 0x7f7fffffu : 0x7f800000u;
  return bits_float(sign | (uint32_t)bits);
}

static void floats_into(void *dst, l2l_dtype to, const void *src, const struct safetensors_entry *e) {
  bool f64 = e->stored->format == SAFETENSORS_F64;
  for (int64_t i = 0; i < e->numel; i++) {
    float x = f64 ? f64_to_f32(((const double *)src)[i], to != L2L_F32) : float_at(src, e->stored->format, i);
    if (to == L2L_F32) ((float *)dst)[i] = x;
    else if (to == L2L_F16) ((uint16_t *)dst)[i] = half_from_f32_f16(x);
    else ((uint16_t *)dst)[i] = half_from_f32_bf16(x);
  }
}

/* ---------------------------------------------------------------- integers */

/* Element i of an integer tensor as stored; false for a U64 past INT64_MAX (*out is then
   INT64_MAX: more than any l2l dtype holds). */
static bool integer_at(int64_t *out, const void *src, enum safetensors_format format, int64_t i) {
  switch (format) {
    case SAFETENSORS_I8: *out = ((const int8_t *)src)[i]; return true;
    case SAFETENSORS_I16: *out = ((const int16_t *)src)[i]; return true;
    case SAFETENSORS_U16: *out = ((const uint16_t *)src)[i]; return true;
    case SAFETENSORS_I32: *out = ((const int32_t *)src)[i]; return true;
    case SAFETENSORS_U32: *out = ((const uint32_t *)src)[i]; return true;
    case SAFETENSORS_I64: *out = ((const int64_t *)src)[i]; return true;
    case SAFETENSORS_U64: {
      uint64_t v = ((const uint64_t *)src)[i];
      *out = v > INT64_MAX ? INT64_MAX : (int64_t)v;
      return v <= INT64_MAX;
    }
    default: *out = ((const uint8_t *)src)[i]; return true;   /* U8, BOOL */
  }
}

/* The first element `to` does not hold (a BOOL neither 0 nor 1), refused by name. */
static l2l_status integers_check(l2l_dtype to, const void *src, const struct safetensors_file *f,
                                 const struct safetensors_entry *e) {
  bool is_bool = e->stored->format == SAFETENSORS_BOOL;
  int64_t lo = to == L2L_U8 || is_bool ? 0 : INT32_MIN, hi = is_bool ? 1 : to == L2L_U8 ? 255 : INT32_MAX;
  for (int64_t i = 0; i < e->numel; i++) {
    int64_t v;
    bool exact = integer_at(&v, src, e->stored->format, i);
    if (exact && v >= lo && v <= hi) continue;
    char at[128], value[32], why[64];
    if (exact) snprintf(value, sizeof value, "%lld", (long long)v);
    else snprintf(value, sizeof value, "%llu", (unsigned long long)((const uint64_t *)src)[i]);
    if (is_bool) snprintf(why, sizeof why, "a BOOL is 0 or 1 (a damaged file?)");
    else snprintf(why, sizeof why, "which %s does not hold", l2l_dtype_name(to));
    int64_t index[L2L_MAX_DIMS];
    return error_note_element(
        core_fail(L2L_ERR_INVALID, "%s: tensor '%s'" L2L_NAMED_ELEMENT "%s" L2L_NAMED_END " (%s) = %s, %s",
                  f->path, e->name, core_shape_index_str(at, sizeof at, e->ndim, e->shape, i),
                  e->stored->name, value, why),
        core_shape_index(index, e->ndim, e->shape, i), index);
  }
  return L2L_OK;
}

l2l_status safetensors_convert(void *dst, l2l_dtype to, const void *stored, const struct safetensors_file *f,
                               const struct safetensors_entry *e) {
  if (e->stored->kind == SAFETENSORS_FLOAT) {
    floats_into(dst, to, stored, e);
    return L2L_OK;
  }
  TRY(integers_check(to, stored, f, e));
  for (int64_t i = 0; i < e->numel; i++) {
    int64_t v;
    integer_at(&v, stored, e->stored->format, i);
    if (to == L2L_I32) ((int32_t *)dst)[i] = (int32_t)v;
    else ((uint8_t *)dst)[i] = (uint8_t)v;
  }
  return L2L_OK;
}
