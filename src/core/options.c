/* SPDX-License-Identifier: MIT */
/* options.c — the relay's options as one table (options.def): the rows, their defaults,
 * the check of each field against its row, and a field read as a word.
 *
 * Purpose: the parts above read what they need of an option from here instead of naming
 * it again: the relay's defaults and checks (relay.c), the optimizer's and schedule's
 * checks (eps/optim.c), the ranks' digest (relay/agree.c), the replay's step key
 * (relay/budget.c); Lua reads the same rows through l2l_relay_option. Rules across two
 * fields (master bf16 needs precision bf16, param_slots 1, a loss scale's range, ...)
 * stay in those checks, after the rows'.
 * Must never: hold a row outside options.def, or check a float's range before its
 * finiteness (NaN is refused as NaN).
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

/* ---------------------------------------------------------------- the choices */
#define CHOICE_LIST(id, ...)                                          \
  static const char *const id##_NAMES[] = {__VA_ARGS__};
#define CHOICE_VALUES(id, ...) static const int id##_VALUES[] = {__VA_ARGS__};
CHOICE_LIST(STASH, "device", "host", "recompute")
CHOICE_VALUES(STASH, L2L_STASH_DEVICE, L2L_STASH_HOST, L2L_STASH_RECOMPUTE)
CHOICE_LIST(INNER, "recompute", "keep", "swap")
CHOICE_VALUES(INNER, L2L_INNER_RECOMPUTE, L2L_INNER_KEEP, L2L_INNER_SWAP)
CHOICE_LIST(DEVICE, "f32", "f16", "bf16")
CHOICE_VALUES(DEVICE, L2L_F32, L2L_F16, L2L_BF16)
CHOICE_LIST(MASTER, "f32", "bf16")
CHOICE_VALUES(MASTER, L2L_F32, L2L_BF16)
CHOICE_LIST(NONFINITE, "skip", "error")
CHOICE_VALUES(NONFINITE, 0, 1)
CHOICE_LIST(PLACEMENT, "host", "device", "auto")
CHOICE_VALUES(PLACEMENT, L2L_PLACE_HOST, L2L_PLACE_DEVICE, L2L_PLACE_AUTO)
CHOICE_LIST(DIST, "none", "mpi")
CHOICE_VALUES(DIST, L2L_DIST_NONE, L2L_DIST_MPI)
CHOICE_LIST(OPTIMIZER, "sgd", "adamw", "lamb")
CHOICE_VALUES(OPTIMIZER, L2L_OPTIMIZER_SGD, L2L_OPTIMIZER_ADAMW, L2L_OPTIMIZER_LAMB)
CHOICE_LIST(STATE, "f32", "bf16", "8bit")
CHOICE_VALUES(STATE, L2L_STATE_F32, L2L_STATE_BF16, L2L_STATE_8BIT)
CHOICE_LIST(SCHEDULE, "constant", "cosine", "linear")
CHOICE_VALUES(SCHEDULE, L2L_SCHEDULE_CONSTANT, L2L_SCHEDULE_COSINE, L2L_SCHEDULE_LINEAR)

/* ---------------------------------------------------------------- the rows */
#define GROUP_RELAY l2l_relay_config
#define GROUP_OPTIMIZER l2l_optimizer_config
#define GROUP_SCHEDULE l2l_schedule_config
#define ROW_CHOICES(id) (int)(sizeof id##_VALUES / sizeof id##_VALUES[0]), id##_NAMES, id##_VALUES
#define ROW_NO_CHOICES 0, NULL, NULL
#define STASH_CHOICES ROW_CHOICES(STASH)
#define INNER_CHOICES ROW_CHOICES(INNER)
#define DEVICE_CHOICES ROW_CHOICES(DEVICE)
#define MASTER_CHOICES ROW_CHOICES(MASTER)
#define NONFINITE_CHOICES ROW_CHOICES(NONFINITE)
#define DIST_CHOICES ROW_CHOICES(DIST)
#define PLACEMENT_CHOICES ROW_CHOICES(PLACEMENT)
#define OPTIMIZER_CHOICES ROW_CHOICES(OPTIMIZER)
#define STATE_CHOICES ROW_CHOICES(STATE)
#define SCHEDULE_CHOICES ROW_CHOICES(SCHEDULE)
#define NO_CHOICES ROW_NO_CHOICES
#define AGREE L2L_OPTION_AGREE
#define STEP L2L_OPTION_STEP
#define OPEN_LOW L2L_OPTION_OPEN_LOW
#define OPEN_HIGH L2L_OPTION_OPEN_HIGH
#define SGD L2L_OPTION_SGD
#define ADAM L2L_OPTION_ADAM
#define DECAY L2L_OPTION_DECAY
#define PLAN L2L_OPTION_PLAN

/* An optimizer's or schedule's row: its value for each kind, by the kind's value. */
_Static_assert(L2L_OPTIMIZER_SGD == 0 && L2L_OPTIMIZER_ADAMW == 1 && L2L_OPTIMIZER_LAMB == 2 &&
                   L2L_SCHEDULE_CONSTANT == 0 && L2L_SCHEDULE_COSINE == 1 && L2L_SCHEDULE_LINEAR == 2,
               "BY_KIND's order is the kinds' values");
#define BY_KIND(a, b, c) {(double)(a), (double)(b), (double)(c)}
#define ALL_KINDS(v) BY_KIND(v, v, v)
#define REQUIRED NAN
#define KINDS_RELAY(...) {0, 0, 0}
#define KINDS_OPTIMIZER(...) __VA_ARGS__   /* (BY_KIND's braces: its commas split arguments) */
#define KINDS_SCHEDULE(...) __VA_ARGS__

const l2l_option options_rows[] = {
#define OPTION(name, group, field, type, dflt, lo, hi, keep, flags, choices, help)              \
  {#name, #field, L2L_OPTION_##group, L2L_OPTION_##type, offsetof(GROUP_##group, field),     \
   (double)(lo), (double)(hi), (flags), L2L_KEEP_##keep, choices, help, KINDS_##group(dflt)},
#include "options.def"
#undef OPTION
};
const int options_count = (int)(sizeof options_rows / sizeof options_rows[0]);

/* The rows' defaults, each written in its field's type (a double would round an int64's):
   the relay's, and AdamW's and the constant schedule's of the others. */
#define FIELDS_RELAY(c) (c)
#define FIELDS_OPTIMIZER(c) (&(c)->optimizer)
#define FIELDS_SCHEDULE(c) (&(c)->schedule)
#define DEFAULT_RELAY(...) (__VA_ARGS__)
#define DEFAULT_OPTIMIZER(...) ((const double[])__VA_ARGS__)[L2L_OPTIMIZER_ADAMW]
#define DEFAULT_SCHEDULE(...) ((const double[])__VA_ARGS__)[L2L_SCHEDULE_CONSTANT]
static void default_fields(l2l_relay_config *c) {
#define OPTION(name, group, field, type, dflt, lo, hi, keep, flags, choices, help) \
  FIELDS_##group(c)->field = (__typeof__(FIELDS_##group(c)->field))(DEFAULT_##group(dflt));
#include "options.def"
#undef OPTION
}

const void *option_base(const l2l_relay_config *c, l2l_option_group group) {
  if (group == L2L_OPTION_OPTIMIZER) return &c->optimizer;
  if (group == L2L_OPTION_SCHEDULE) return &c->schedule;
  return c;
}

void options_default(l2l_relay_config *out) {
  memset(out, 0, sizeof *out);
  default_fields(out);
}

/* ---------------------------------------------------------------- a field as a word */

int64_t option_word(const l2l_option *o, const void *base) {
  const char *at = (const char *)base + o->offset;
  int32_t i32;
  int64_t i64;
  float f;
  switch (o->type) {
    case L2L_OPTION_INT64:
    case L2L_OPTION_UINT64: memcpy(&i64, at, sizeof i64); return i64;
    case L2L_OPTION_FLOAT: memcpy(&f, at, sizeof f); memcpy(&i32, &f, sizeof i32); return (uint32_t)i32;
    case L2L_OPTION_PATH: {
      const char *p;
      memcpy(&p, at, sizeof p);
      return p != NULL;
    }
    default: memcpy(&i32, at, sizeof i32); return i32;   /* int, enum, bool */
  }
}

/* ---------------------------------------------------------------- the checks */

/* Each message leads with "<prefix><field>", marked as naming the field (L2L_NAMED). */
#define FIELD L2L_NAMED_FIELD "%s%s" L2L_NAMED_END

/* "device (0), host (1) or recompute (2)" into buf. */
static const char *choices_text(char *buf, size_t len, const l2l_option *o) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < o->nchoices && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%s (%d)",
                          i == 0 ? "" : i + 1 == o->nchoices ? " or " : ", ", o->choice_names[i],
                          o->choice_values[i]);
  return buf;
}

static bool applies(const l2l_option *o, int optimizer_kind) {
  if (o->flags & L2L_OPTION_SGD) return optimizer_kind == L2L_OPTIMIZER_SGD;
  if (o->flags & L2L_OPTION_ADAM)
    return optimizer_kind == L2L_OPTIMIZER_ADAMW || optimizer_kind == L2L_OPTIMIZER_LAMB;
  return true;
}

static l2l_status check_float(const l2l_option *o, float v, int optimizer_kind, const char *func,
                              const char *prefix) {
  if (!isfinite(v))
    return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be finite, got %g", prefix, o->field, (double)v);
  if (!applies(o, optimizer_kind)) return L2L_OK;
  bool low = o->flags & L2L_OPTION_OPEN_LOW ? v > o->min : v >= o->min;
  bool high = o->flags & L2L_OPTION_OPEN_HIGH ? v < o->max : v <= o->max;
  if (low && high) return L2L_OK;
  if (isinf(o->max) && (o->flags & L2L_OPTION_OPEN_LOW))
    return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be > %g, got %g", prefix, o->field, o->min, (double)v);
  return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be in %c%g, %g%c, got %g", prefix, o->field,
                      o->flags & L2L_OPTION_OPEN_LOW ? '(' : '[', o->min, o->max,
                      o->flags & L2L_OPTION_OPEN_HIGH || isinf(o->max) ? ')' : ']', (double)v);
}

/* An integer field: int64 words compared as such (uint64 as unsigned). */
static l2l_status check_integer(const l2l_option *o, int64_t w, const char *func, const char *prefix) {
  if (o->type == L2L_OPTION_UINT64) {
    uint64_t u = (uint64_t)w;
    if ((double)u >= o->min && (o->max >= 0x1p64 || (double)u <= o->max)) return L2L_OK;
    return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be %.0f to %.0f, got %llu", prefix, o->field,
                        o->min, o->max, (unsigned long long)u);
  }
  bool top = o->type == L2L_OPTION_INT ? o->max >= INT_MAX : o->max >= 0x1p63;
  if ((double)w >= o->min && (top || (double)w <= o->max)) return L2L_OK;
  if (top)
    return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be >= %.0f, got %lld", prefix, o->field,
                        o->min, (long long)w);
  return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be %.0f to %.0f, got %lld", prefix, o->field,
                      o->min, o->max, (long long)w);
}

/* One field against its row. */
static l2l_status check_row(const l2l_option *o, const void *base, int optimizer_kind,
                            const char *func, const char *prefix) {
  int64_t w = option_word(o, base);
  const char *at = (const char *)base + o->offset;
  char text[160];
  switch (o->type) {
    case L2L_OPTION_FLOAT: {
      float f;
      memcpy(&f, at, sizeof f);
      return check_float(o, f, optimizer_kind, func, prefix);
    }
    case L2L_OPTION_CHOICE:
      for (int k = 0; k < o->nchoices; k++)
        if (o->choice_values[k] == (int)w) return L2L_OK;
      return core_fail_in(func, L2L_ERR_INVALID, FIELD " %d is unknown: it must be %s", prefix,
                          o->field, (int)w, choices_text(text, sizeof text, o));
    case L2L_OPTION_BOOL:
      if (w == 0 || w == 1) return L2L_OK;
      return core_fail_in(func, L2L_ERR_INVALID, FIELD " must be 0 or 1, got %d", prefix, o->field, (int)w);
    case L2L_OPTION_PATH: {
      const char *p;
      memcpy(&p, at, sizeof p);
      if (p == NULL || p[0] != '\0') return L2L_OK;
      return core_fail_in(func, L2L_ERR_INVALID, FIELD " is empty (NULL: none)", prefix, o->field);
    }
    default:
      return applies(o, optimizer_kind) ? check_integer(o, w, func, prefix) : L2L_OK;
  }
}

l2l_status options_check(l2l_option_group group, const void *base, int optimizer_kind,
                         const char *func, const char *prefix) {
  for (int i = 0; i < options_count; i++) {
    const l2l_option *o = &options_rows[i];
    l2l_status status = o->group == group ? check_row(o, base, optimizer_kind, func, prefix) : L2L_OK;
    if (status != L2L_OK) return error_note_field(status, o->field);
  }
  return L2L_OK;
}

const char *options_choice_name(const char *name, int value) {
  for (int i = 0; i < options_count; i++) {
    const l2l_option *o = &options_rows[i];
    if (o->group != L2L_OPTION_RELAY || strcmp(o->name, name) != 0) continue;
    for (int c = 0; c < o->nchoices; c++)
      if (o->choice_values[c] == value) return o->choice_names[c];
  }
  return "?";
}
