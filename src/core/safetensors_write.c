/* SPDX-License-Identifier: MIT */
/* safetensors_write.c — writing a safetensors file atomically, one tensor at a time, with
 * each tensor's checksum (the format and the checksums: safetensors.c).
 *
 * Purpose: l2l's one writer of the format (the front end's l2l.safetensors.write calls it
 * through the public API, safetensors_api.c). The file is written to a temporary beside
 * it ("<path>.tmp.<host>.<pid>", made new with O_CREAT | O_EXCL | O_NOFOLLOW and mode
 * 0600, so that a link or file planted at that predictable name is neither followed nor
 * written: another name beside it is taken), synced, given the mode a plain create gives (0666 less the umask), renamed
 * over the path, and the folder synced: a crash or kill at any moment leaves either the
 * old file or the new one whole, and a failure removes the temporary and leaves the old
 * file as it was. A save's temporaries that a killed process left on this host are swept
 * first. The tensors come one at a time (safetensors_put), so a file larger than memory is
 * written while only one tensor is in memory: the header goes out with placeholder
 * checksums and is written again at the end, the same length. Unless told it may replace
 * one, a file at the path is refused, and the rename that puts the new file there does not
 * replace one that appeared meanwhile (renameat2's RENAME_NOREPLACE, or link and unlink
 * where the file system lacks it). Only a regular file is ever replaced (never a device,
 * a FIFO or a socket); a link to one is written through, the link left in place.
 * Must never: leave a partial file under the final name or a temporary behind it, follow a
 * link at a temporary's name, replace a file without being told it may, or write a header
 * l2l could not read back.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core.h"

struct safetensors_writer {
  char *path, *tmp;
  int fd;
  bool replace;
  json_t *header, *meta, *sums;   /* the header; its __metadata__; the checksums */
  char **names;
  uint64_t *bytes;
  int count, next;
  size_t header_len;              /* the JSON's bytes, padding included */
};

static l2l_status io_error(const char *what, const char *path, int err) {
  return core_fail(L2L_ERR_IO, "%s %s: %s", what, path, strerror(err));
}

/* ---------------------------------------------------------------- the temporary */

/* This host's name as a temporary's name carries it: letters, digits and '-' kept. */
static void host_name(char *out, size_t len) {
  if (gethostname(out, len - 1) != 0) snprintf(out, len, "host");
  out[len - 1] = '\0';
  for (char *c = out; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-'))
      *c = '_';
}

static char *folder_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* Removes what saves to `path` on this host left when they were killed (a kill -9 cannot
   clean up): "<path>.tmp.<host>.<pid>[.<hex>]" whose process is gone. A live process's
   (a save in progress) and other hosts' (a shared folder) are left alone. */
static void sweep_temporaries(const char *path, const char *host) {
  char *folder = folder_of(path);
  DIR *dir = folder ? opendir(folder) : NULL;
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  char prefix[512];
  int plen = snprintf(prefix, sizeof prefix, "%s.tmp.%s.", base, host);
  struct dirent *d;
  while (dir != NULL && plen > 0 && (size_t)plen < sizeof prefix && (d = readdir(dir)) != NULL) {
    if (strncmp(d->d_name, prefix, (size_t)plen) != 0) continue;
    const char *rest = d->d_name + plen, *p = rest;
    while (*p >= '0' && *p <= '9') p++;
    bool ok = p > rest && (*p == '\0' || (*p == '.' && p[1] != '\0' && strspn(p + 1, "0123456789abcdefABCDEF") == strlen(p + 1)));
    long pid = ok ? strtol(rest, NULL, 10) : 0;
    if (!ok || pid <= 0 || pid == (long)getpid() || pid > INT32_MAX) continue;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
      char stale[4096];
      if (snprintf(stale, sizeof stale, "%s/%s", folder, d->d_name) < (int)sizeof stale) unlink(stale);
    }
  }
  if (dir) closedir(dir);
  free(folder);
}

/* The temporary of a save, made new for it alone: O_EXCL | O_NOFOLLOW, mode 0600 until
   it is renamed; where something is at the name already, 8 other names beside it. */
static l2l_status create_temporary(struct safetensors_writer *w, const char *host) {
  size_t len = strlen(w->path) + strlen(host) + 64;
  w->tmp = malloc(len);
  if (w->tmp == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for a file name");
  int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  for (int try = 0; try <= 8; try++) {
    uint32_t r = 0;
    if (try > 0 && getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)(core_now() * 1e9);
    int n = snprintf(w->tmp, len, "%s.tmp.%s.%ld", w->path, host, (long)getpid());
    if (try > 0) snprintf(w->tmp + n, len - (size_t)n, ".%08x", r);
    w->fd = open(w->tmp, flags, 0600);
    if (w->fd >= 0) return L2L_OK;
    if (errno != EEXIST)   /* (named as the caller named it: the temporary is ours) */
      return core_fail(L2L_ERR_IO, "cannot write %s: %s (its temporary %s could not be made)",
                       w->path, strerror(errno), w->tmp);
  }
  snprintf(w->tmp, len, "%s.tmp.%s.%ld", w->path, host, (long)getpid());
  l2l_status status = core_fail(L2L_ERR_IO, "cannot create %s or 8 other names beside it: something "
                                "is there already (a file or link this save did not make); nothing "
                                "was written", w->tmp);
  free(w->tmp);
  w->tmp = NULL;
  return status;
}

/* The mode a plain create gives: 0666 less the process's umask (read, not set: umask(2)
   would change it for every thread while it is asked). */
static mode_t created_mode(void) {
  unsigned mask = 022;
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "Umask: %o", &mask) == 1) break;
  if (f) fclose(f);
  return (mode_t)(0666 & ~mask);
}

static bool write_all(int fd, const void *data, uint64_t n, int64_t at) {
  const uint8_t *p = data;
  while (n > 0) {
    size_t piece = n < (UINT64_C(1) << 30) ? (size_t)n : (size_t)1 << 30;
    ssize_t put = at >= 0 ? pwrite(fd, p, piece, (off_t)at) : write(fd, p, piece);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      if (put == 0) errno = EIO;
      return false;
    }
    p += put, n -= (uint64_t)put;
    if (at >= 0) at += put;
  }
  return true;
}

/* ---------------------------------------------------------------- the header */

/* The header as written: the JSON, then spaces up to a multiple of 8 (every tensor's data
   stays aligned). The checksums' object goes in as a string, as l2l's readers want it. */
static char *header_json(struct safetensors_writer *w, size_t *len) {
  char *sums = json_dumps(w->sums, JSON_COMPACT);
  if (sums == NULL || json_object_set_new(w->meta, SAFETENSORS_CHECKSUMS, json_string(sums)) != 0) {
    free(sums);
    return NULL;
  }
  free(sums);
  char *json = json_dumps(w->header, JSON_COMPACT);
  if (json == NULL) return NULL;
  size_t n = strlen(json), padded = (n + 7) / 8 * 8;
  char *out = realloc(json, padded + 1);
  if (out == NULL) {
    free(json);
    return NULL;
  }
  memset(out + n, ' ', padded - n);
  out[padded] = '\0';
  *len = padded;
  return out;
}

static l2l_status put_header(struct safetensors_writer *w, int64_t at) {
  size_t len = 0;
  char *json = header_json(w, &len);
  if (json == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for the header of %s", w->path);
  l2l_status status = L2L_OK;
  if (at >= 0 && len != w->header_len)   /* the same tables, each sum 16 digits: never */
    status = core_fail(L2L_ERR_STATE, "the header of %s changed length with its checksums", w->path);
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)len >> (8 * i));
  if (status == L2L_OK && (!write_all(w->fd, len8, 8, at) || !write_all(w->fd, json, len, at >= 0 ? 8 : -1)))
    status = io_error("cannot write", w->tmp, errno);
  w->header_len = len;
  free(json);
  return status;
}

/* One entry's line of the header, its name, dtype and shape checked. */
static l2l_status add_entry(struct safetensors_writer *w, const struct safetensors_spec *e,
                            int i, uint64_t *offset) {
  if (e->name == NULL) return core_fail(L2L_ERR_INVALID, "entries[%d].name is NULL", i);
  if (e->name[0] == '\0' || strcmp(e->name, "__metadata__") == 0)
    return core_fail(L2L_ERR_INVALID, "entry '%s': a name must be a non-empty string other than __metadata__",
                     e->name);
  json_t *utf8 = json_string(e->name);   /* (jansson takes UTF-8 names only) */
  if (utf8 == NULL) return core_fail(L2L_ERR_INVALID, "entries[%d]: its name is not a UTF-8 string", i);
  json_decref(utf8);
  if (json_object_get(w->header, e->name) != NULL)
    return core_fail(L2L_ERR_INVALID, "name '%s' appears twice", e->name);
  const char *dtype = safetensors_dtype_name(e->dtype);
  if (dtype == NULL) return core_fail(L2L_ERR_INVALID, "entry '%s': dtype %d is not one l2l writes", e->name, (int)e->dtype);
  if (e->ndim < 1 || e->ndim > L2L_MAX_DIMS)
    return core_fail(L2L_ERR_INVALID, "entry '%s': shape must list 1 to %d sizes, got %d", e->name, L2L_MAX_DIMS, e->ndim);
  json_t *shape = json_array();
  int64_t numel = 1;
  for (int d = 0; d < e->ndim; d++) {
    if (e->shape[d] < 1 || e->shape[d] > (INT64_C(1) << 48) / numel) {
      json_decref(shape);
      return core_fail(L2L_ERR_INVALID, "entry '%s': shape[%d] = %lld is not a size l2l has", e->name, d,
                       (long long)e->shape[d]);
    }
    numel *= e->shape[d];
    json_array_append_new(shape, json_integer(e->shape[d]));
  }
  uint64_t bytes = (uint64_t)numel * l2l_dtype_size(e->dtype);
  json_t *line = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype, "shape", shape, "data_offsets",
                           (json_int_t)*offset, (json_int_t)(*offset + bytes));
  if (line == NULL || json_object_set_new(w->header, e->name, line) != 0 ||
      json_object_set_new(w->sums, e->name, json_string("0000000000000000")) != 0 ||
      (w->names[i] = strdup(e->name)) == NULL)
    return core_fail(L2L_ERR_NOMEM, "no memory for the header of %s", w->path);
  w->bytes[i] = bytes;
  *offset += bytes;
  return L2L_OK;
}

static l2l_status begin(struct safetensors_writer *w, const struct safetensors_spec *entries, int count,
                        const char *const *meta, int nmeta) {
  w->header = json_object(), w->meta = json_object(), w->sums = json_object();
  w->names = calloc((size_t)count + 1, sizeof *w->names);
  w->bytes = calloc((size_t)count + 1, sizeof *w->bytes);
  if (!w->header || !w->meta || !w->sums || !w->names || !w->bytes)
    return core_fail(L2L_ERR_NOMEM, "no memory for the header of %s", w->path);
  uint64_t offset = 0;
  for (w->count = 0; w->count < count; w->count++) TRY(add_entry(w, &entries[w->count], w->count, &offset));
  for (int i = 0; i < nmeta; i++)   /* (the checksums, copied from another file, are replaced) */
    if (json_object_set_new(w->meta, meta[2 * i], json_string(meta[2 * i + 1])) != 0)
      return core_fail(L2L_ERR_INVALID, "metadata '%s' must be a UTF-8 string", meta[2 * i]);
  if (json_object_set(w->header, "__metadata__", w->meta) != 0)
    return core_fail(L2L_ERR_NOMEM, "no memory for the header of %s", w->path);
  size_t len = 0;
  char *json = header_json(w, &len);
  free(json);
  if (json == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for the header of %s", w->path);
  if (len > SAFETENSORS_MAX_HEADER)   /* a file l2l could not read back is not written */
    return core_fail(L2L_ERR_INVALID, "the header of %s would be %zu bytes, over the %d l2l reads (%d tensors)",
                     w->path, len, SAFETENSORS_MAX_HEADER, count);
  /* What is at the path may only be a regular file (or a link to one: found before the file
     is written): never a directory, a device, a FIFO or a socket (as root, renaming over
     /dev/full replaced the device); a link to a regular file is written through, the link
     left as it is. */
  struct stat st, here;   /* (what the path names; here: the path itself, a link or not) */
  if (stat(w->path, &st) == 0 && !S_ISREG(st.st_mode))
    return core_fail(L2L_ERR_INVALID, "%s is %s: nothing was written (the path names the file to "
                     "write)", w->path, safetensors_file_kind(st.st_mode));
  bool exists = lstat(w->path, &here) == 0;
  if (!w->replace && exists)
    return core_fail(L2L_ERR_STATE, "%s exists already: nothing was written (give replace = 1 to "
                     "replace it)", w->path);
  if (exists && S_ISLNK(here.st_mode)) {
    char *target = realpath(w->path, NULL);
    if (target == NULL)
      return core_fail(L2L_ERR_INVALID, "%s is a link to nothing (%s): nothing was written", w->path,
                       strerror(errno));
    free(w->path);
    w->path = target;
  }
  char host[256];
  host_name(host, sizeof host);
  sweep_temporaries(w->path, host);
  TRY(create_temporary(w, host));
  return put_header(w, -1);
}

/* ---------------------------------------------------------------- the writer */

static void writer_free(struct safetensors_writer *w) {
  if (w->fd >= 0) close(w->fd);
  if (w->tmp) unlink(w->tmp);
  json_decref(w->header);
  json_decref(w->meta);
  json_decref(w->sums);
  for (int i = 0; w->names && i < w->count; i++) free(w->names[i]);
  free(w->names);
  free(w->bytes);
  free(w->tmp);
  free(w->path);
  free(w);
}

l2l_status safetensors_create(struct safetensors_writer **out, const char *path, bool replace,
                              const struct safetensors_spec *entries, int count,
                              const char *const *meta, int nmeta) {
  *out = NULL;
  struct safetensors_writer *w = calloc(1, sizeof *w);
  if (w == NULL || (w->path = strdup(path)) == NULL) {
    free(w);
    return core_fail(L2L_ERR_NOMEM, "no memory to write %s", path);
  }
  w->fd = -1;
  w->replace = replace;
  l2l_status status = begin(w, entries, count, meta, nmeta);
  if (status != L2L_OK) {
    writer_free(w);
    return status;
  }
  *out = w;
  return L2L_OK;
}

const char *safetensors_next(const struct safetensors_writer *w) {
  return w->next < w->count ? w->names[w->next] : NULL;
}

l2l_status safetensors_put(struct safetensors_writer *w, const void *data, uint64_t bytes) {
  if (w->next >= w->count)
    return core_fail(L2L_ERR_STATE, "%s: every tensor the header lists is written already", w->path);
  if (bytes != w->bytes[w->next])
    return core_fail(L2L_ERR_INVALID, "%s: tensor '%s' has %llu bytes, its header says %llu", w->path,
                     w->names[w->next], (unsigned long long)bytes, (unsigned long long)w->bytes[w->next]);
  if (!write_all(w->fd, data, bytes, -1)) return io_error("cannot write", w->tmp, errno);
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(data, (size_t)bytes));
  if (json_object_set_new(w->sums, w->names[w->next], json_string(hex)) != 0)
    return core_fail(L2L_ERR_NOMEM, "no memory for the header of %s", w->path);
  w->next++;
  return L2L_OK;
}

/* The file's data on the disk before the rename makes it the file; the folder's entry on
   it after, or a power cut could bring back the old name. */
static l2l_status finish(struct safetensors_writer *w) {
  if (w->next != w->count)
    return core_fail(L2L_ERR_STATE, "%s: %d of the %d tensors the header lists were written", w->path,
                     w->next, w->count);
  TRY(put_header(w, 0));
  if (fchmod(w->fd, created_mode()) != 0) return io_error("cannot set the mode of", w->tmp, errno);
  if (fsync(w->fd) != 0) return io_error("cannot sync", w->tmp, errno);
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) != 0) return io_error("cannot close", w->tmp, errno);
  int renamed = w->replace ? rename(w->tmp, w->path)
                           : renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->path, RENAME_NOREPLACE);
  if (renamed != 0 && !w->replace && (errno == EINVAL || errno == ENOSYS)) {
    renamed = link(w->tmp, w->path);   /* a file system without RENAME_NOREPLACE */
    if (renamed == 0) unlink(w->tmp);
  }
  if (renamed != 0 && errno == EEXIST)
    return core_fail(L2L_ERR_STATE, "%s appeared while it was written: left as it is (give replace "
                     "= 1 to replace it)", w->path);
  if (renamed != 0) return io_error("cannot rename to", w->path, errno);
  free(w->tmp);
  w->tmp = NULL;   /* it is the file now */
  char *folder = folder_of(w->path);
  int dfd = folder ? open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  free(folder);
  return L2L_OK;
}

l2l_status safetensors_commit(struct safetensors_writer *w) {
  l2l_status status = finish(w);
  writer_free(w);   /* a temporary left (a failure) is removed */
  return status;
}

void safetensors_abandon(struct safetensors_writer *w) {
  if (w != NULL) writer_free(w);
}
