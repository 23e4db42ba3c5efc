/* SPDX-License-Identifier: MIT */
/* safetensors.c — reading safetensors files: the header read and checked whole before any
 * data, then tensors read (or only hashed) one at a time with their checksums checked.
 *
 * The format (as Hugging Face defines it): an unsigned 64-bit little-endian header length
 * N, N bytes of JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
 * ..., "__metadata__": {"key": "string value"}}, padded with spaces to a multiple of 8,
 * then the raw little-endian data, offsets counted from its start. l2l's checksums: under
 * __metadata__.l2l_xxh3 a JSON object mapping a tensor's name to the 16 hex digits of the
 * XXH3-64 of its bytes (xxHash; written in lower case, read in either: a sum is the number
 * its digits write).
 * Purpose: l2l's one reader of the format (the front end's l2l.safetensors calls it
 * through the public API, safetensors_api.c): the header checked against the file's size
 * before any data is read (at most 16 MiB of it, valid UTF-8 JSON, the format's dtypes,
 * at most L2L_MAX_DIMS dimensions, element counts matching byte ranges, ranges inside the
 * file with no overlap or hole, checksums naming tensors of the file), a regular file only
 * (a FIFO or a folder is refused without waiting). Every dtype of the format is listed
 * (dtypes[]: what each is and what it reads into), so that another tool's file opens
 * whole though it holds a C64 or an empty tensor l2l cannot make a tensor of; such an
 * entry's read is refused, not the file (safetensors_convert.c converts what l2l reads
 * but does not hold, an I64 into i32 say). It lives in the core because the format
 * knows bytes, dtypes and files and nothing of layers or relays: the relay's checkpoints
 * (src/relay/checkpoint.c) build on it, and any part may.
 * JSON goes through jansson (Debian's libjansson), never by hand.
 * Must never: trust a number from a file before checking it, read past an entry's range,
 * or hand out bytes whose checksum differs from the file's.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core.h"

/* The format's own limit on a header; the largest l2l reads is SAFETENSORS_MAX_HEADER
   (decoding costs memory in proportion, and real headers are far smaller: a GPT-2 1.5B's
   is under 100 KB, an l2l checkpoint's about 4 KB a block). */
#define FORMAT_MAX_HEADER (UINT64_C(100) << 20)
#define MAX_NUMEL (INT64_C(1) << 48)   /* l2l's tensors' limit (tensor.c) */
#define EXACT (INT64_C(1) << 53)       /* integers a double holds exactly */

#define NONE SAFETENSORS_NO_DTYPE
#define FLOAT SAFETENSORS_FLOAT
#define INTEGER SAFETENSORS_INTEGER
#define NOT_READ SAFETENSORS_NOT_READ
static const struct safetensors_dtype dtypes[SAFETENSORS_FORMATS] = {
    {SAFETENSORS_BOOL, "BOOL", 8, INTEGER, NONE, L2L_U8},
    {SAFETENSORS_U8, "U8", 8, INTEGER, L2L_U8, L2L_U8},
    {SAFETENSORS_I8, "I8", 8, INTEGER, NONE, L2L_I32},
    {SAFETENSORS_I16, "I16", 16, INTEGER, NONE, L2L_I32},
    {SAFETENSORS_U16, "U16", 16, INTEGER, NONE, L2L_I32},
    {SAFETENSORS_I32, "I32", 32, INTEGER, L2L_I32, L2L_I32},
    {SAFETENSORS_U32, "U32", 32, INTEGER, NONE, L2L_I32},
    {SAFETENSORS_I64, "I64", 64, INTEGER, NONE, L2L_I32},
    {SAFETENSORS_U64, "U64", 64, INTEGER, NONE, L2L_I32},
    {SAFETENSORS_F8_E4M3, "F8_E4M3", 8, FLOAT, NONE, L2L_F32},
    {SAFETENSORS_F8_E5M2, "F8_E5M2", 8, FLOAT, NONE, L2L_F32},
    {SAFETENSORS_F8_E8M0, "F8_E8M0", 8, FLOAT, NONE, L2L_F32},
    {SAFETENSORS_F16, "F16", 16, FLOAT, L2L_F16, L2L_F16},
    {SAFETENSORS_BF16, "BF16", 16, FLOAT, L2L_BF16, L2L_BF16},
    {SAFETENSORS_F32, "F32", 32, FLOAT, L2L_F32, L2L_F32},
    {SAFETENSORS_F64, "F64", 64, FLOAT, NONE, L2L_F32},
    {SAFETENSORS_F4, "F4", 4, NOT_READ, NONE, NONE},
    {SAFETENSORS_F6_E2M3, "F6_E2M3", 6, NOT_READ, NONE, NONE},
    {SAFETENSORS_F6_E3M2, "F6_E3M2", 6, NOT_READ, NONE, NONE},
    {SAFETENSORS_C64, "C64", 64, NOT_READ, NONE, NONE},   /* (two f32: real, imaginary) */
};

const char *safetensors_dtype_name(l2l_dtype dtype) {
  for (int i = 0; i < SAFETENSORS_FORMATS; i++)
    if (dtypes[i].own != SAFETENSORS_NO_DTYPE && dtypes[i].own == dtype) return dtypes[i].name;
  return NULL;
}

/* ---------------------------------------------------------------- checks of the header */

/* Where `text` stops being UTF-8 (a 1-based byte offset), or 0 where it all is: overlong
   forms, surrogates and code points past U+10FFFF refused as RFC 3629 says (jansson
   refuses them too, but without saying where). */
static size_t utf8_error(const unsigned char *text, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = text[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;   /* the bounds of the first continuation byte */
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;   /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;   /* nothing past U+10FFFF */
    } else {
      return i + 1;
    }
    for (size_t k = 1; k < len; k++) {
      if (i + k >= n) return i + 1;
      unsigned b = text[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i + 1;
    }
    i += len;
  }
  return 0;
}

/* A JSON number that is a whole count in [0, 2^53): jansson's integers, or a real with no
   fraction (another writer may print 1e+14). */
static bool json_count(const json_t *v, int64_t *out) {
  double d;
  if (json_is_integer(v)) d = (double)json_integer_value(v);
  else if (json_is_real(v)) d = json_real_value(v);
  else return false;
  if (!(d >= 0 && d < (double)EXACT && d == floor(d))) return false;
  *out = (int64_t)d;
  return true;
}

/* What is wrong with the file, with its path: a damaged or foreign file is refused by
   name (L2L_ERR_INVALID), never read on. */
#define BAD(path, ...) bad_file(path, __VA_ARGS__)
static l2l_status bad_file(const char *path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static l2l_status bad_file(const char *path, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return core_fail(L2L_ERR_INVALID, "%s: %s", path, what);
}

/* One entry of the header, checked. */
static l2l_status entry_of(struct safetensors_entry *e, const char *path, const char *name,
                           const json_t *v, uint64_t data_len) {
  if (!json_is_object(v)) return BAD(path, "entry '%s' is not an object", name);
  const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
  e->stored = NULL;
  for (int i = 0; json_is_string(dt) && i < SAFETENSORS_FORMATS; i++)
    if (strcmp(json_string_value(dt), dtypes[i].name) == 0) e->stored = &dtypes[i];
  if (e->stored == NULL)
    return BAD(path, "entry '%s' has dtype %s, which is not one of the format's that l2l knows", name,
               json_is_string(dt) ? json_string_value(dt) : "(not a string)");
  e->dtype = e->stored->own;
  if (!json_is_array(shape)) return BAD(path, "entry '%s' has no shape list", name);
  int64_t nonzero = 1;   /* the product of the sizes but the empty ones */
  bool empty = false;
  size_t i;
  const json_t *d;
  json_array_foreach(shape, i, d) {
    int64_t n;
    if (!json_count(d, &n)) return BAD(path, "entry '%s': shape[%zu] is not a size", name, i + 1);
    if (n > MAX_NUMEL / nonzero)
      return BAD(path, "entry '%s': its shape has more than 2^48 elements", name);
    if (n > 0) nonzero *= n;
    else empty = true;
    if (i < L2L_MAX_DIMS) e->shape[i] = n;
  }
  e->numel = empty ? 0 : nonzero;
  if (json_array_size(shape) > L2L_MAX_DIMS)
    return BAD(path, "entry '%s' has %zu dimensions; l2l's tensors have at most %d", name,
               json_array_size(shape), L2L_MAX_DIMS);
  e->ndim = (int)json_array_size(shape);
  const json_t *o = json_object_get(v, "data_offsets");
  int64_t b = 0, end = 0;
  if (!json_is_array(o) || json_array_size(o) != 2 || !json_count(json_array_get(o, 0), &b) ||
      !json_count(json_array_get(o, 1), &end) || end < b)
    return BAD(path, "entry '%s' has bad data_offsets", name);
  if ((uint64_t)end > data_len)
    return BAD(path, "entry '%s' ends at byte %lld of the data but the file holds %llu (truncated?)",
               name, (long long)end, (unsigned long long)data_len);
  if ((uint64_t)(end - b) * 8 != (uint64_t)e->numel * (uint64_t)e->stored->bits)
    return BAD(path, "entry '%s': %lld bytes for %lld %s elements", name, (long long)(end - b),
               (long long)e->numel, e->stored->name);
  e->offset = (uint64_t)b;
  e->bytes = (uint64_t)(end - b);
  e->name = strdup(name);
  return e->name ? L2L_OK : core_fail(L2L_ERR_NOMEM, "no memory for a tensor's name");
}

static int by_offset(const void *a, const void *b) {
  const struct safetensors_entry *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

static int by_name(const void *a, const void *b, void *entries) {
  const struct safetensors_entry *e = entries;
  return strcmp(e[*(const int *)a].name, e[*(const int *)b].name);
}

/* The metadata's string values, and the checksums among them. */
static l2l_status metadata_of(struct safetensors_file *f, const json_t *meta) {
  if (!json_is_object(meta)) return BAD(f->path, "__metadata__ is not an object");
  f->meta = calloc(2 * json_object_size(meta) + 1, sizeof *f->meta);
  if (f->meta == NULL) return core_fail(L2L_ERR_NOMEM, "%s: out of memory decoding the header's metadata", f->path);
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)meta, key, v) {
    if (!json_is_string(v)) return BAD(f->path, "__metadata__.%s is not a string", key);
    f->meta[2 * f->nmeta] = strdup(key);
    f->meta[2 * f->nmeta + 1] = strdup(json_string_value(v));
    f->nmeta++;
    if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
      return core_fail(L2L_ERR_NOMEM, "%s: out of memory decoding the header's metadata", f->path);
  }
  return L2L_OK;
}

static l2l_status checksums_of(struct safetensors_file *f) {
  const char *text = safetensors_metadata(f, SAFETENSORS_CHECKSUMS);
  if (text == NULL) return L2L_OK;   /* another tool's file, an import: it still reads */
  json_t *sums = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
  if (!json_is_object(sums)) {
    json_decref(sums);
    return BAD(f->path, "the checksums (__metadata__.%s) are damaged", SAFETENSORS_CHECKSUMS);
  }
  l2l_status status = L2L_OK;
  const char *name;
  json_t *v;
  json_object_foreach(sums, name, v) {
    struct safetensors_entry *e = (struct safetensors_entry *)safetensors_find(f, name);
    const char *h = json_string_value(v);
    char *end = NULL;
    uint64_t sum = h ? strtoull(h, &end, 16) : 0;
    if (e == NULL || h == NULL || strlen(h) != 16 || end != h + 16 || h[0] == '-' || h[0] == '+') {
      status = BAD(f->path, "the checksums (__metadata__.%s) are damaged at '%s'",
                   SAFETENSORS_CHECKSUMS, name);
      break;
    }
    e->summed = true;
    e->sum = sum;
  }
  json_decref(sums);
  return status;
}

/* The tensors of the parsed header: each checked, then laid end to end. */
static l2l_status entries_of(struct safetensors_file *f, json_t *header, uint64_t data_len) {
  f->entries = calloc(json_object_size(header) + 1, sizeof *f->entries);
  f->order = calloc(json_object_size(header) + 1, sizeof *f->order);
  if (f->entries == NULL || f->order == NULL)
    return core_fail(L2L_ERR_NOMEM, "%s: out of memory decoding the header's list of tensors", f->path);
  const char *name;
  json_t *v;
  json_object_foreach(header, name, v) {
    if (strcmp(name, "__metadata__") == 0) {
      TRY(metadata_of(f, v));
      continue;
    }
    TRY(entry_of(&f->entries[f->count], f->path, name, v, data_len));
    f->count++;
  }
  qsort(f->entries, (size_t)f->count, sizeof *f->entries, by_offset);
  uint64_t at = 0;
  for (int i = 0; i < f->count; i++) {
    const struct safetensors_entry *e = &f->entries[i];
    if (e->offset != at)
      return BAD(f->path, "entry '%s' starts at byte %llu of the data, expected %llu (overlap or hole)",
                 e->name, (unsigned long long)e->offset, (unsigned long long)at);
    at += e->bytes;
    f->order[i] = i;
  }
  if (at != data_len)
    return BAD(f->path, "%llu bytes of data after the last tensor", (unsigned long long)(data_len - at));
  qsort_r(f->order, (size_t)f->count, sizeof *f->order, by_name, f->entries);
  return checksums_of(f);
}

/* ---------------------------------------------------------------- opening */

static l2l_status io_error(const char *what, const char *path, int err) {
  return core_fail(L2L_ERR_IO, "%s %s: %s", what, path, strerror(err));
}

/* Reads exactly n bytes at offset (false: the file ended first, or an error: errno). */
static bool read_at(int fd, void *buf, uint64_t n, uint64_t offset) {
  uint8_t *p = buf;
  while (n > 0) {
    size_t piece = n < (UINT64_C(1) << 30) ? (size_t)n : (size_t)1 << 30;
    ssize_t got = pread(fd, p, piece, (off_t)offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got, n -= (uint64_t)got, offset += (uint64_t)got;
  }
  return true;
}

/* The header's bytes (its length checked against the limits and the file's size). */
static l2l_status header_text(char **out, uint64_t *len, const struct safetensors_file *f,
                              uint64_t size) {
  if (size < 8) return BAD(f->path, "%llu bytes: too short to be a safetensors file", (unsigned long long)size);
  uint8_t len8[8];
  if (!read_at(f->fd, len8, 8, 0)) return io_error("cannot read the header length of", f->path, errno);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  if (n < 2) return BAD(f->path, "header length %llu is not plausible: not a safetensors file", (unsigned long long)n);
  if (n > FORMAT_MAX_HEADER)
    return BAD(f->path, "header length %llu is over the format's 100 MiB: not a safetensors file", (unsigned long long)n);
  if (n > SAFETENSORS_MAX_HEADER)
    return BAD(f->path, "header of %llu bytes is over the %d bytes l2l reads (GPT-2 1.5B's is under 100 KB)",
               (unsigned long long)n, SAFETENSORS_MAX_HEADER);
  if (8 + n > size)
    return BAD(f->path, "header of %llu bytes but the file has %llu (truncated)", (unsigned long long)n,
               (unsigned long long)size);
  char *text = malloc((size_t)n + 1);
  if (text == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for the %llu-byte header of %s", (unsigned long long)n, f->path);
  if (!read_at(f->fd, text, n, 8)) {
    free(text);
    return io_error("cannot read the header of", f->path, errno);
  }
  text[n] = '\0';
  *out = text, *len = n;
  return L2L_OK;
}

const char *safetensors_file_kind(unsigned mode) {   /* (lua/l2l/filesys.lua's words) */
  return S_ISREG(mode) ? "a regular file" : S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO (a named pipe)"
         : S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device"
         : S_ISSOCK(mode) ? "a socket" : "something";
}

static l2l_status parse(struct safetensors_file *f) {
  struct stat st;
  if (fstat(f->fd, &st) != 0) return io_error("cannot read", f->path, errno);
  if (S_ISDIR(st.st_mode)) return core_fail(L2L_ERR_IO, "cannot open %s: is a directory", f->path);
  if (!S_ISREG(st.st_mode))
    return core_fail(L2L_ERR_IO, "cannot open %s: is %s, not a regular file", f->path,
                     safetensors_file_kind(st.st_mode));
  char *text = NULL;
  uint64_t n = 0;
  TRY(header_text(&text, &n, f, (uint64_t)st.st_size));
  size_t at = utf8_error((const unsigned char *)text, (size_t)n);
  json_error_t err;
  json_t *header = at ? NULL : json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &err);
  free(text);
  if (at) return BAD(f->path, "the header is not valid UTF-8 (byte %zu of it)", at);
  /* (jansson reports some of its failed allocations with no message at all) */
  if (header == NULL && (json_error_code(&err) == json_error_out_of_memory || err.text[0] == '\0'))
    return core_fail(L2L_ERR_NOMEM, "%s: out of memory decoding the %llu-byte header", f->path,
                     (unsigned long long)n);
  if (!json_is_object(header)) {
    json_decref(header);
    return BAD(f->path, "the header is not a JSON object: not a safetensors file (or damaged)");
  }
  f->data_start = 8 + n;
  l2l_status status = entries_of(f, header, (uint64_t)st.st_size - 8 - n);
  json_decref(header);
  return status;
}

l2l_status safetensors_open(struct safetensors_file **out, const char *path) {
  *out = NULL;
  struct safetensors_file *f = calloc(1, sizeof *f);
  if (f == NULL || (f->path = strdup(path)) == NULL) {
    free(f);
    return core_fail(L2L_ERR_NOMEM, "no memory to open %s", path);
  }
  /* O_NONBLOCK: a FIFO opens at once (and is refused as not a regular file) */
  f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  l2l_status status = f->fd < 0 ? io_error("cannot open", path, errno) : parse(f);
  if (status != L2L_OK) {
    safetensors_close(f);
    return status;
  }
  *out = f;
  return L2L_OK;
}

void safetensors_close(struct safetensors_file *f) {
  if (f == NULL) return;
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; i < f->count; i++) free(f->entries[i].name);
  for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
  free(f->meta);
  free(f->entries);
  free(f->order);
  free(f->path);
  free(f);
}

const struct safetensors_entry *safetensors_find(const struct safetensors_file *f, const char *name) {
  int lo = 0, hi = f->count - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(f->entries[f->order[mid]].name, name);
    if (c == 0) return &f->entries[f->order[mid]];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

const char *safetensors_metadata(const struct safetensors_file *f, const char *key) {
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
  return NULL;
}

/* ---------------------------------------------------------------- reading data */

static l2l_status damaged(const struct safetensors_file *f, const struct safetensors_entry *e,
                          uint64_t got) {
  return core_fail(L2L_ERR_INVALID, "%s: tensor '%s' is damaged: its bytes hash to %016llx, the "
                   "file says %016llx (xxh3-64)", f->path, e->name, (unsigned long long)got,
                   (unsigned long long)e->sum);
}

static l2l_status cannot_read(const struct safetensors_file *f, const struct safetensors_entry *e) {
  if (errno != 0) return core_fail(L2L_ERR_IO, "%s: cannot read '%s': %s", f->path, e->name, strerror(errno));
  return core_fail(L2L_ERR_IO, "%s: cannot read '%s' (the file changed or is damaged)", f->path, e->name);
}

l2l_status safetensors_read(const struct safetensors_file *f, const struct safetensors_entry *e,
                            void *dst) {
  if (!read_at(f->fd, dst, e->bytes, f->data_start + e->offset)) return cannot_read(f, e);
  if (e->summed) {
    uint64_t got = XXH3_64bits(dst, (size_t)e->bytes);
    if (got != e->sum) return damaged(f, e, got);
  }
  return L2L_OK;
}

l2l_status safetensors_check(const struct safetensors_file *f, const struct safetensors_entry *e) {
  if (!e->summed) return L2L_OK;
  enum { PIECE = 4 << 20 };
  uint8_t *buf = malloc(PIECE);
  XXH3_state_t *state = XXH3_createState();
  if (buf == NULL || state == NULL) {
    free(buf);
    XXH3_freeState(state);
    return core_fail(L2L_ERR_NOMEM, "no memory to check %s", f->path);
  }
  XXH3_64bits_reset(state);
  l2l_status status = L2L_OK;
  for (uint64_t at = 0; at < e->bytes && status == L2L_OK;) {
    uint64_t n = e->bytes - at < PIECE ? e->bytes - at : PIECE;
    if (!read_at(f->fd, buf, n, f->data_start + e->offset + at)) status = cannot_read(f, e);
    else XXH3_64bits_update(state, buf, (size_t)n);
    at += n;
  }
  uint64_t got = XXH3_64bits_digest(state);
  free(buf);
  XXH3_freeState(state);
  if (status == L2L_OK && got != e->sum) status = damaged(f, e, got);
  return status;
}

l2l_status safetensors_read_tensor(l2l_tensor **out, const struct safetensors_file *f,
                                   const struct safetensors_entry *e) {
  *out = NULL;
  if (e->dtype == SAFETENSORS_NO_DTYPE || e->numel == 0)
    return core_fail(L2L_ERR_INVALID, "%s: tensor '%s' is %s%s: no tensor of l2l's holds it", f->path, e->name,
                     e->numel == 0 ? "empty, " : "", e->stored->name);
  int64_t one = 1;
  TRY(l2l_tensor_new(out, L2L_POOL_HOST, e->dtype, e->ndim ? e->ndim : 1, e->ndim ? e->shape : &one));
  l2l_status status = safetensors_read(f, e, l2l_tensor_data(*out));
  if (status != L2L_OK) {
    l2l_tensor_free(*out);
    *out = NULL;
  }
  return status;
}
