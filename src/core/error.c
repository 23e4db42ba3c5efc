/* SPDX-License-Identifier: MIT */
/* error.c — the per-thread last-error message and the status names.
 *
 * Purpose: give every failing call a place to say, in words, what was wrong (shape,
 * dtype, pool, bytes requested / in use / budget). It must never print, exit or abort:
 * reporting is the caller's choice.
 */
#include <stdarg.h>
#include <stdio.h>

#include "core.h"

enum { MESSAGE_CAPACITY = 1024 };
static _Thread_local char last_message[MESSAGE_CAPACITY];

/* what the message names, set by the failing check after its l2l_fail (l2l_error_note_*) */
static _Thread_local l2l_error_detail last_detail = {.layer = -1};

const char *l2l_last_error(void) { return last_message; }

void l2l_clear_error(void) {
  last_message[0] = '\0';
  last_detail = (l2l_error_detail){.layer = -1};
}

l2l_status l2l_last_error_detail(l2l_error_detail *out) {
  if (out == NULL) return l2l_fail_in(__func__, L2L_ERR_INVALID, "out is NULL");
  *out = last_detail;
  return L2L_OK;
}

l2l_status l2l_error_note_layer(l2l_status status, int layer) {
  last_detail.layer = layer;
  return status;
}

l2l_status l2l_error_note_needed(l2l_status status, uint64_t bytes) {
  last_detail.needed_bytes = bytes;
  return status;
}

l2l_status l2l_error_note_field(l2l_status status, const char *field) {
  snprintf(last_detail.field, sizeof last_detail.field, "%s", field);
  return status;
}

static l2l_status record(const char *prefix, l2l_status status, const char *fmt, va_list ap) {
  last_detail = (l2l_error_detail){.layer = -1};
  int used = prefix ? snprintf(last_message, MESSAGE_CAPACITY, "%s: ", prefix) : 0;
  if (used < 0 || used >= MESSAGE_CAPACITY) used = 0;
  vsnprintf(last_message + used, MESSAGE_CAPACITY - (size_t)used, fmt, ap);
  return status;
}

l2l_status l2l_fail(l2l_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(NULL, status, fmt, ap);
  va_end(ap);
  return status;
}

l2l_status l2l_fail_in(const char *func, l2l_status status, const char *fmt, ...) {
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

const char *l2l_human_bytes(char *buf, size_t len, uint64_t bytes) {
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
