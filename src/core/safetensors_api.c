/* SPDX-License-Identifier: MIT */
/* safetensors_api.c — the public face of the core's safetensors files (l2l/safetensors.h):
 * open, list, read with conversion, verify; create, put, commit.
 *
 * Purpose: let a C program, and the front end's l2l.safetensors through the FFI, read and
 * write the format through the one reader (safetensors.c) and writer (safetensors_write.c)
 * the relay's checkpoints use, so that the format is read and written in one place. Each
 * function checks its arguments before it does anything and names itself in its message;
 * the file's own checks (the header, the ranges, the checksums) are the reader's and the
 * writer's. A read converts among the float dtypes on the way (F16 or BF16 weights of an
 * imported model into f32 parameters, say; another tool's I64 ids into i32: the rules are
 * safetensors_convert.c's), after the bytes as stored were checked against their checksum.
 * Must never: report a read done whose bytes differ from the file's checksum, or convert
 * bytes before they were checked.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

/* The magic numbers first, so that bytes that are no handle, or a handle of another kind
   (whose own magic comes first too), are refused; a freed handle's is cleared. */
#define FILE_MAGIC 0x6c326c73u     /* "l2ls" */
#define WRITER_MAGIC 0x6c326c77u   /* "l2lw" */

struct l2l_safetensors {
  uint32_t magic;
  struct safetensors_file *file;
};

struct l2l_safetensors_writer {
  uint32_t magic;
  struct safetensors_writer *writer;
};

static bool is_file(const l2l_safetensors *f) { return f != NULL && f->magic == FILE_MAGIC; }
static bool is_writer(const l2l_safetensors_writer *w) { return w != NULL && w->magic == WRITER_MAGIC; }

static l2l_status not_a_file(const char *func, const l2l_safetensors *file) {
  return core_fail_in(func, L2L_ERR_INVALID, "file is %s", file ? "not an open safetensors file" : "NULL");
}

/* ---------------------------------------------------------------- reading */

l2l_status l2l_safetensors_open(l2l_safetensors **out, const char *path) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (path == NULL || path[0] == '\0') return FAIL(L2L_ERR_INVALID, "path must be a non-empty string");
  l2l_safetensors *h = calloc(1, sizeof *h);
  if (h == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to open %s", path);
  l2l_status status = safetensors_open(&h->file, path);
  if (status != L2L_OK) {
    free(h);
    return error_as(__func__, status);
  }
  h->magic = FILE_MAGIC;
  *out = h;
  return L2L_OK;
}

void l2l_safetensors_close(l2l_safetensors *file) {
  if (!is_file(file)) return;
  file->magic = 0;
  safetensors_close(file->file);
  free(file);
}

l2l_status l2l_safetensors_get_info(l2l_safetensors_info *out, const l2l_safetensors *file) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!is_file(file)) return not_a_file(__func__, file);
  const struct safetensors_file *f = file->file;
  uint64_t data = 0;
  for (int i = 0; i < f->count; i++) data += f->entries[i].bytes;   /* end to end: the whole data */
  *out = (l2l_safetensors_info){.tensors = f->count, .metadata = f->nmeta, .data_start = f->data_start,
                                .data_bytes = data};
  return L2L_OK;
}

static void entry_out(l2l_safetensors_entry *out, const struct safetensors_entry *e) {
  *out = (l2l_safetensors_entry){.name = e->name, .dtype = e->stored->reads_as, .stored_dtype = e->stored->name,
                                 .ndim = e->ndim, .numel = e->numel, .offset = e->offset, .bytes = e->bytes,
                                 .summed = e->summed ? 1 : 0};
  for (int d = 0; d < e->ndim; d++) out->shape[d] = e->shape[d];
}

l2l_status l2l_safetensors_get_entry(l2l_safetensors_entry *out, const l2l_safetensors *file, int index) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!is_file(file)) return not_a_file(__func__, file);
  if (index < 0 || index >= file->file->count)
    return FAIL(L2L_ERR_INVALID, "index %d is outside [0, %d): %s has %d tensors", index, file->file->count,
                file->file->path, file->file->count);
  entry_out(out, &file->file->entries[index]);
  return L2L_OK;
}

l2l_status l2l_safetensors_find(l2l_safetensors_entry *out, const l2l_safetensors *file, const char *name) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!is_file(file)) return not_a_file(__func__, file);
  if (name == NULL) return FAIL(L2L_ERR_INVALID, "name is NULL");
  const struct safetensors_entry *e = safetensors_find(file->file, name);
  if (e == NULL) return FAIL(L2L_ERR_INVALID, "%s has no tensor '%s'", file->file->path, name);
  entry_out(out, e);
  return L2L_OK;
}

l2l_status l2l_safetensors_get_metadata(const char **key, const char **value, const l2l_safetensors *file,
                                        int index) {
  if (key == NULL || value == NULL) return FAIL(L2L_ERR_INVALID, "%s is NULL", key == NULL ? "key" : "value");
  if (!is_file(file)) return not_a_file(__func__, file);
  if (index < 0 || index >= file->file->nmeta)
    return FAIL(L2L_ERR_INVALID, "index %d is outside [0, %d): %s has %d metadata pairs", index,
                file->file->nmeta, file->file->path, file->file->nmeta);
  *key = file->file->meta[2 * index];
  *value = file->file->meta[2 * index + 1];
  return L2L_OK;
}

l2l_status l2l_safetensors_read(void *dst, l2l_dtype dtype, int64_t numel, const l2l_safetensors *file,
                                const char *name) {
  if (dst == NULL && numel != 0) return FAIL(L2L_ERR_INVALID, "dst is NULL");
  if (l2l_dtype_size(dtype) == 0) return FAIL(L2L_ERR_INVALID, "dtype %d is not an l2l dtype", (int)dtype);
  if (!is_file(file)) return not_a_file(__func__, file);
  if (name == NULL) return FAIL(L2L_ERR_INVALID, "name is NULL");
  const struct safetensors_file *f = file->file;
  const struct safetensors_entry *e = safetensors_find(f, name);
  if (e == NULL) return FAIL(L2L_ERR_INVALID, "%s has no tensor '%s'", f->path, name);
  if (numel != e->numel)
    return FAIL(L2L_ERR_INVALID, "numel is %lld but '%s' of %s has %lld elements", (long long)numel, name,
                f->path, (long long)e->numel);
  if (dtype == e->dtype) return error_as(__func__, safetensors_read(f, e, dst));
  if (!safetensors_reads_into(e, dtype)) {
    const char *targets = safetensors_read_targets(e);
    if (targets == NULL)
      return FAIL(L2L_ERR_UNSUPPORTED, "'%s' of %s is %s, which l2l does not read", name, f->path,
                  e->stored->name);
    return FAIL(L2L_ERR_INVALID, "'%s' of %s is %s, which reads into %s, not %s", name, f->path, e->stored->name,
                targets, l2l_dtype_name(dtype));
  }
  void *stored = malloc(e->bytes + 1);   /* (numel) as the file holds it, checked before dst is touched */
  if (stored == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to read '%s' of %s", name, f->path);
  l2l_status status = safetensors_read(f, e, stored);
  if (status == L2L_OK) status = safetensors_convert(dst, dtype, stored, f, e);
  free(stored);
  return error_as(__func__, status);
}

l2l_status l2l_safetensors_verify(const l2l_safetensors *file) {
  if (!is_file(file)) return not_a_file(__func__, file);
  for (int i = 0; i < file->file->count; i++) {
    l2l_status status = safetensors_check(file->file, &file->file->entries[i]);
    if (status != L2L_OK) return error_as(__func__, status);
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- writing */

l2l_status l2l_safetensors_create(l2l_safetensors_writer **out, const char *path, int replace,
                                  const l2l_safetensors_spec *entries, int count,
                                  const char *const *metadata, int pairs) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (path == NULL || path[0] == '\0') return FAIL(L2L_ERR_INVALID, "path must be a non-empty string");
  if (replace != 0 && replace != 1) return FAIL(L2L_ERR_INVALID, "replace must be 0 or 1, got %d", replace);
  if (count < 0 || (count > 0 && entries == NULL))
    return FAIL(L2L_ERR_INVALID, "entries must hold count >= 0 tensors (count %d, entries %s)", count,
                entries ? "given" : "NULL");
  if (pairs < 0 || (pairs > 0 && metadata == NULL))
    return FAIL(L2L_ERR_INVALID, "metadata must hold 2 * pairs strings, pairs >= 0 (pairs %d, metadata %s)",
                pairs, metadata ? "given" : "NULL");
  for (int i = 0; i < 2 * pairs; i++)
    if (metadata[i] == NULL)
      return FAIL(L2L_ERR_INVALID, "metadata[%d] (the %s of pair %d) is NULL", i, i % 2 ? "value" : "key", i / 2);
  l2l_safetensors_writer *h = calloc(1, sizeof *h);
  struct safetensors_spec *specs = calloc((size_t)count + 1, sizeof *specs);
  if (h == NULL || specs == NULL) {
    free(h);
    free(specs);
    return FAIL(L2L_ERR_NOMEM, "no memory to write %s", path);
  }
  for (int i = 0; i < count; i++) {
    specs[i] = (struct safetensors_spec){.name = entries[i].name, .dtype = entries[i].dtype,
                                         .ndim = entries[i].ndim};
    for (int d = 0; d < L2L_MAX_DIMS; d++) specs[i].shape[d] = entries[i].shape[d];
  }
  l2l_status status = safetensors_create(&h->writer, path, replace == 1, specs, count, metadata, pairs);
  free(specs);
  if (status != L2L_OK) {
    free(h);
    return error_as(__func__, status);
  }
  h->magic = WRITER_MAGIC;
  *out = h;
  return L2L_OK;
}

l2l_status l2l_safetensors_put(l2l_safetensors_writer *writer, const void *data, uint64_t bytes) {
  if (!is_writer(writer)) return FAIL(L2L_ERR_INVALID, "writer is %s", writer ? "not a writer" : "NULL");
  if (data == NULL && bytes > 0) return FAIL(L2L_ERR_INVALID, "data is NULL");
  return error_as(__func__, safetensors_put(writer->writer, data, bytes));
}

l2l_status l2l_safetensors_commit(l2l_safetensors_writer *writer) {
  if (!is_writer(writer)) return FAIL(L2L_ERR_INVALID, "writer is %s", writer ? "not a writer" : "NULL");
  writer->magic = 0;
  l2l_status status = safetensors_commit(writer->writer);
  free(writer);
  return error_as(__func__, status);
}

void l2l_safetensors_abandon(l2l_safetensors_writer *writer) {
  if (!is_writer(writer)) return;
  writer->magic = 0;
  safetensors_abandon(writer->writer);
  free(writer);
}
