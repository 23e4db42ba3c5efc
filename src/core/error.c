/* SPDX-License-Identifier: MIT */
/* error.c — the per-thread last-error message and the status names.
 *
 * Purpose: give every failing call a place to say, in words, what was wrong (shape,
 * dtype, pool, bytes requested / in use / budget), and beside the words what they name
 * (l2l_error_detail: the layer, micro-batch or field, and where the words name each:
 * the spans a message's format marks with L2L_NAMED, found while it is written). It must
 * never print, exit or abort: reporting is the caller's choice.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

enum { MESSAGE_CAPACITY = 1024 };
static _Thread_local char last_message[MESSAGE_CAPACITY];

/* what the message names, set by the failing check after its core_fail (error_note_*) */
#define NO_DETAIL ((l2l_error_detail){.layer = -1, .micro_batch = -1})
static _Thread_local l2l_error_detail last_detail = NO_DETAIL;

const char *l2l_last_error(void) { return last_message; }

void l2l_clear_error(void) {
  last_message[0] = '\0';
  last_detail = NO_DETAIL;
}

l2l_status l2l_last_error_detail(l2l_error_detail *out) {
  if (out == NULL) return core_fail_in(__func__, L2L_ERR_INVALID, "out is NULL");
  *out = last_detail;
  return L2L_OK;
}

l2l_status error_note_layer(l2l_status status, int layer) {
  last_detail.layer = layer;
  return status;
}

l2l_status error_note_needed(l2l_status status, uint64_t bytes) {
  last_detail.needed_bytes = bytes;
  return status;
}

l2l_status error_note_field(l2l_status status, const char *field) {
  snprintf(last_detail.field, sizeof last_detail.field, "%s", field);
  return status;
}

l2l_status error_note_micro_batch(l2l_status status, int64_t micro_batch) {
  last_detail.micro_batch = micro_batch;
  return status;
}

l2l_status error_note_element(l2l_status status, int dims, const int64_t *index) {
  last_detail.element_dims = dims < 0 ? 0 : dims > L2L_MAX_DIMS ? L2L_MAX_DIMS : dims;
  for (int i = 0; i < last_detail.element_dims; i++) last_detail.element[i] = index[i];
  return status;
}

/* The span a mark's kind letter sets (L2L_NAMED_LAYER, ...), or NULL. */
static l2l_error_span *span_of(l2l_error_detail *d, char kind) {
  switch (kind) {
    case 'L': return &d->layer_named;
    case 'M': return &d->micro_batch_named;
    case 'F': return &d->field_named;
    case 'E': return &d->element_named;
    default: return NULL;
  }
}

/* fmt formatted into last_message from byte `at` on, its marks (L2L_NAMED: a start byte and
   a kind letter, an end byte) taken out and the spans they mark set in d, the first of each
   kind. Returns the message's length. */
static int write_marked(l2l_error_detail *d, int at, const char *fmt, va_list ap) {
  char raw[MESSAGE_CAPACITY];
  vsnprintf(raw, sizeof raw, fmt, ap);
  int n = at;
  l2l_error_span *open = NULL;
  for (const char *c = raw; *c != '\0' && n < MESSAGE_CAPACITY - 1; c++) {
    if (*c == L2L_NAMED_START[0] && c[1] != '\0') {
      l2l_error_span *span = span_of(d, *++c);
      open = span && span->bytes == 0 ? span : NULL;
      if (open) open->at = n;
    } else if (*c == L2L_NAMED_END[0]) {
      if (open) open->bytes = n - open->at;
      open = NULL;
    } else {
      last_message[n++] = *c;
    }
  }
  last_message[n] = '\0';
  return n;
}

static l2l_status record(const char *prefix, l2l_status status, const char *fmt, va_list ap) {
  last_detail = NO_DETAIL;
  int used = prefix ? snprintf(last_message, MESSAGE_CAPACITY, "%s: ", prefix) : 0;
  if (used < 0 || used >= MESSAGE_CAPACITY) used = 0;
  last_detail.text = used;
  write_marked(&last_detail, used, fmt, ap);
  return status;
}

static void shift(l2l_error_span *span, int by) {
  if (span->bytes == 0) return;
  span->at += by;
  if (span->at + span->bytes >= MESSAGE_CAPACITY) *span = (l2l_error_span){0, 0};
}

/* The last message with func's name (NULL: none) and fmt's words in front, in place of
   the name it had, and what it named still named (its spans moved behind them). */
static l2l_status rewrap(const char *func, l2l_status status, const char *fmt, va_list ap) {
  char inner[MESSAGE_CAPACITY];
  l2l_error_detail d = last_detail;
  snprintf(inner, sizeof inner, "%s", last_message + d.text);
  int text = func ? snprintf(last_message, MESSAGE_CAPACITY, "%s: ", func) : 0;
  if (text < 0 || text >= MESSAGE_CAPACITY) text = 0;
  l2l_error_detail outer = NO_DETAIL;
  int lead = write_marked(&outer, text, fmt, ap);
  snprintf(last_message + lead, MESSAGE_CAPACITY - (size_t)lead, "%s", inner);
  /* the inner spans, moved; the words' own in front where they name the same */
  l2l_error_span *spans[] = {&d.layer_named, &d.micro_batch_named, &d.field_named, &d.element_named};
  l2l_error_span *outers[] = {&outer.layer_named, &outer.micro_batch_named, &outer.field_named,
                              &outer.element_named};
  for (int i = 0; i < 4; i++) {
    shift(spans[i], lead - d.text);
    if (outers[i]->bytes > 0) *spans[i] = *outers[i];
  }
  d.text = text;
  last_detail = d;
  return status;
}

l2l_status error_wrap(l2l_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rewrap(NULL, status, fmt, ap);
  va_end(ap);
  return status;
}

static l2l_status rename_to(const char *func, l2l_status status, ...) {
  va_list ap;
  va_start(ap, status);
  rewrap(func, status, "%s", ap);
  va_end(ap);
  return status;
}

l2l_status error_rename(const char *func, l2l_status status) { return rename_to(func, status, ""); }

l2l_status error_as(const char *func, l2l_status status) {
  return status == L2L_OK ? status : error_rename(func, status);
}

l2l_status core_fail(l2l_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(NULL, status, fmt, ap);
  va_end(ap);
  return status;
}

l2l_status core_fail_in(const char *func, l2l_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(func, status, fmt, ap);
  va_end(ap);
  return status;
}

const char *l2l_status_name(l2l_status status) {
  switch (status) {
    case L2L_OK: return "ok";
    case L2L_ERR_INVALID: return "invalid argument";
    case L2L_ERR_NOMEM: return "out of memory";
    case L2L_ERR_BUDGET: return "over budget";
    case L2L_ERR_STATE: return "invalid state";
    case L2L_ERR_UNSUPPORTED: return "unsupported";
    case L2L_ERR_BACKEND: return "backend failure";
    case L2L_ERR_IO: return "file I/O failure";
  }
  return "unknown status";
}

const char *core_human_bytes(char *buf, size_t len, uint64_t bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = (double)bytes;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    unit++;
  }
  if (unit == 0) snprintf(buf, len, "%llu B", (unsigned long long)bytes);
  else snprintf(buf, len, "%.2f %s", value, units[unit]);
  return buf;
}
