/* SPDX-License-Identifier: MIT */
/* spill.c — the EPS's third tier: a spill file on disk, read and written on I/O threads.
 *
 * Purpose: records that do not fit the host budget live in a spill file (issue "Beyond host
 * memory"); this is the file and its I/O, below the EPS's choice of what to spill and when.
 * One file per user (a relay), named l2l-spill-<pid>-<n>.bin in the directory given, so a
 * run that died leaves a file that the next run finds and names (never reuses: it may be
 * another live run's, and it holds nothing a checkpoint needs). Regions are reserved in
 * 4 KiB-aligned extents and allocated on disk when reserved (posix_fallocate), so a full
 * disk is an error at once, naming the file, and not a failed write half-way through a
 * step. Reads and writes run on a small pool of threads (pread / pwrite: every file system
 * has them, and several in flight keep an NVMe queue busy); a transfer whose buffer,
 * offset and length are 4 KiB-aligned goes through an O_DIRECT descriptor where the file
 * system allows one (no copy into the page cache, which would otherwise grow by every byte
 * spilled), any other through the buffered one. Linux keeps the two coherent for one file
 * (a direct read writes back dirty cached pages first; a direct write drops them).
 * The process's files together are counted for l2l_spill_get_stats (l2l.pool_stats("spill")).
 * Must never: write outside a reserved region, leave its file behind after eps_spill_close,
 * or delete a file it did not make.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eps.h"

enum { SPILL_EXTENT = 4096 };

static _Atomic int spill_files_made;   /* this process's files: the <n> of their names */

/* Every spill file of the process, for l2l_spill_get_stats: bytes in regions holding
   state (current, and its peak), the files' sizes (reserved), regions reserved and given
   back. Under totals_lock. */
static pthread_mutex_t totals_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t total_in_use, total_peak, total_files, total_reserves, total_releases;

static void totals_add(int64_t in_use, int64_t files, int reserves, int releases) {
  pthread_mutex_lock(&totals_lock);
  total_in_use += (uint64_t)in_use;
  total_files += (uint64_t)files;
  total_reserves += (uint64_t)reserves;
  total_releases += (uint64_t)releases;
  if (total_in_use > total_peak) total_peak = total_in_use;
  pthread_mutex_unlock(&totals_lock);
}

l2l_status l2l_spill_get_stats(l2l_pool_stats *out) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  pthread_mutex_lock(&totals_lock);
  *out = (l2l_pool_stats){.current = total_in_use, .peak = total_peak, .reserved = total_files,
                          .allocs = total_reserves, .frees = total_releases,
                          .system_allocs = (uint64_t)atomic_load(&spill_files_made)};
  pthread_mutex_unlock(&totals_lock);
  return L2L_OK;
}

static uint64_t round_up(uint64_t n) { return (n + SPILL_EXTENT - 1) / SPILL_EXTENT * SPILL_EXTENT; }

/* Files of the spill's name pattern left by a process that no longer runs, named in `found`
   (a message for the user; empty when none). */
static void find_left_behind(const char *dir, char *found, size_t found_len) {
  found[0] = '\0';
  DIR *d = opendir(dir);
  if (d == NULL) return;
  size_t used = 0;
  int count = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    long pid = 0;
    int n = 0, end = 0;
    if (sscanf(e->d_name, "l2l-spill-%ld-%d.bin%n", &pid, &n, &end) != 2 || e->d_name[end] != '\0')
      continue;
    if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    count++;
    if (used < found_len) {
      int w = snprintf(found + used, found_len - used, "%s%s/%s", count > 1 ? ", " : "", dir,
                       e->d_name);
      used += w > 0 ? (size_t)w : 0;
    }
  }
  closedir(d);
  if (count > 0 && used < found_len)
    snprintf(found + used, found_len - used,
             ": spill file%s left by a run that ended without removing %s (its process is "
             "gone); remove %s once no run of yours uses the directory",
             count > 1 ? "s" : "", count > 1 ? "them" : "it", count > 1 ? "them" : "it");
}

l2l_status eps_spill_open(struct eps_spill *sp, const char *dir, int threads, char *found,
                          size_t found_len) {
  if (sp == NULL || dir == NULL || dir[0] == '\0')
    return l2l_fail(L2L_ERR_INVALID, "the spill directory is empty");
  if (threads < 1 || threads > 64)
    return l2l_fail(L2L_ERR_INVALID, "spill I/O threads must be 1 to 64, got %d", threads);
  memset(sp, 0, sizeof *sp);
  sp->fd = sp->fd_direct = -1;
  struct stat st;
  if (stat(dir, &st) != 0)
    return l2l_fail(L2L_ERR_IO, "spill directory %s: %s (make it, or give another)", dir,
                    strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return l2l_fail(L2L_ERR_IO, "spill directory %s is not a directory", dir);
  if (found && found_len) find_left_behind(dir, found, found_len);
  int n = atomic_fetch_add(&spill_files_made, 1);
  int w = snprintf(sp->path, sizeof sp->path, "%s/l2l-spill-%ld-%d.bin", dir, (long)getpid(), n);
  if (w < 0 || (size_t)w >= sizeof sp->path)
    return l2l_fail(L2L_ERR_INVALID, "spill directory %s: the path is too long", dir);
  sp->fd = open(sp->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (sp->fd < 0)
    return l2l_fail(L2L_ERR_IO, "spill file %s cannot be made: %s (a writable directory on a "
                    "local disk is needed)", sp->path, strerror(errno));
  sp->fd_direct = open(sp->path, O_RDWR | O_DIRECT | O_CLOEXEC);   /* -1: buffered only */
  l2l_status status = l2l_queue_start(&sp->io, threads, 0, "spill I/O");
  if (status != L2L_OK) {
    if (sp->fd_direct >= 0) close(sp->fd_direct);
    close(sp->fd);
    unlink(sp->path);
    sp->fd = sp->fd_direct = -1;
    return status;
  }
  pthread_mutex_init(&sp->lock, NULL);
  return L2L_OK;
}

void eps_spill_close(struct eps_spill *sp) {
  if (sp == NULL || sp->fd < 0) return;
  l2l_queue_stop(&sp->io);
  if (sp->fd_direct >= 0) close(sp->fd_direct);
  close(sp->fd);
  unlink(sp->path);   /* gone already (the directory removed under it): nothing to do */
  totals_add(-(int64_t)sp->in_use, -(int64_t)sp->used, 0, 0);
  sp->fd = sp->fd_direct = -1;
  free(sp->free_list);
  sp->free_list = NULL;
  sp->free_n = sp->free_cap = 0;
  pthread_mutex_destroy(&sp->lock);
}

l2l_status eps_spill_reserve(struct eps_spill *sp, uint64_t bytes, uint64_t *offset) {
  if (sp == NULL || sp->fd < 0 || offset == NULL)
    return l2l_fail(L2L_ERR_INVALID, "the spill file is not open");
  uint64_t size = round_up(bytes > 0 ? bytes : 1);
  pthread_mutex_lock(&sp->lock);
  /* a region given back fits first (the smallest that does): a model whose layers are
     removed and added between steps keeps its file's size */
  int best = -1;
  for (int i = 0; i < sp->free_n; i++)
    if (sp->free_list[i].bytes >= size && (best < 0 || sp->free_list[i].bytes < sp->free_list[best].bytes))
      best = i;
  if (best >= 0) {
    *offset = sp->free_list[best].at;
    sp->in_use += size;   /* (a larger region's tail is lost to reuse, as its release says) */
    totals_add((int64_t)size, 0, 1, 0);
    sp->free_list[best] = sp->free_list[--sp->free_n];
    pthread_mutex_unlock(&sp->lock);
    return L2L_OK;
  }
  uint64_t used = sp->used;
  int err = size > (uint64_t)INT64_MAX - used ? EFBIG
                                              : posix_fallocate(sp->fd, (off_t)used, (off_t)size);
  if (err == 0) {
    sp->used = used + size;
    sp->in_use += size;
    totals_add((int64_t)size, (int64_t)size, 1, 0);
  }
  pthread_mutex_unlock(&sp->lock);
  if (err != 0) {
    char have[32], want[32];
    return l2l_fail(L2L_ERR_IO, "spill file %s: no room for %s more (%s in the file): %s; free "
                    "space on that disk or give a spill directory on another",
                    sp->path, l2l_human_bytes(want, sizeof want, size),
                    l2l_human_bytes(have, sizeof have, used), strerror(err));
  }
  *offset = used;
  return L2L_OK;
}

void eps_spill_release(struct eps_spill *sp, uint64_t offset, uint64_t bytes) {
  if (sp == NULL || sp->fd < 0) return;
  pthread_mutex_lock(&sp->lock);
  if (sp->free_n == sp->free_cap) {
    int cap = sp->free_cap ? 2 * sp->free_cap : 64;
    void *grown = realloc(sp->free_list, (size_t)cap * sizeof *sp->free_list);
    if (grown != NULL) sp->free_list = grown, sp->free_cap = cap;
  }
  /* (no memory for the list: the region stays unused, the file as large as it was) */
  uint64_t size = round_up(bytes > 0 ? bytes : 1);
  if (sp->free_n < sp->free_cap) sp->free_list[sp->free_n++] = (struct eps_spill_region){offset, size};
  sp->in_use -= size;
  totals_add(-(int64_t)size, 0, 0, 1);
  pthread_mutex_unlock(&sp->lock);
}

/* The whole transfer, through partial reads and writes and interruptions. */
static l2l_status transfer(struct eps_spill *sp, struct eps_spill_io *io) {
  bool aligned = sp->fd_direct >= 0 && (uintptr_t)io->buffer % SPILL_EXTENT == 0 &&
                 io->offset % SPILL_EXTENT == 0 && io->bytes % SPILL_EXTENT == 0;
  int fd = aligned ? sp->fd_direct : sp->fd;
  uint64_t done = 0;
  while (done < io->bytes) {
    char *at = (char *)io->buffer + done;
    size_t want = io->bytes - done;
    ssize_t n = io->write ? pwrite(fd, at, want, (off_t)(io->offset + done))
                          : pread(fd, at, want, (off_t)(io->offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && aligned && errno == EINVAL) {   /* O_DIRECT refused this transfer after all */
      fd = sp->fd, aligned = false;
      continue;
    }
    if (n < 0)
      return l2l_fail(L2L_ERR_IO, "spill file %s: %s %llu bytes at %llu: %s", sp->path,
                      io->write ? "writing" : "reading", (unsigned long long)io->bytes,
                      (unsigned long long)io->offset, strerror(errno));
    if (n == 0)
      return l2l_fail(L2L_ERR_IO, "spill file %s: short %s at %llu (%llu of %llu bytes): the "
                      "file was cut short by another program",
                      sp->path, io->write ? "write" : "read", (unsigned long long)io->offset,
                      (unsigned long long)done, (unsigned long long)io->bytes);
    done += (uint64_t)n;
  }
  atomic_fetch_add(io->write ? &sp->written : &sp->read, io->bytes);
  return L2L_OK;
}

static void io_run(struct l2l_job *job, int thread) {
  (void)thread;
  struct eps_spill_io *io = (struct eps_spill_io *)job;
  l2l_status status = transfer(io->spill, io);
  if (status != L2L_OK) l2l_job_fail(job, status);
}

l2l_status eps_spill_queue(struct eps_spill *sp, struct eps_spill_io *io, bool write, void *buffer,
                           uint64_t offset, uint64_t bytes) {
  if (sp == NULL || sp->fd < 0 || io == NULL || (buffer == NULL && bytes > 0))
    return l2l_fail(L2L_ERR_INVALID, "the spill file is not open, or no buffer");
  pthread_mutex_lock(&sp->lock);
  uint64_t used = sp->used;
  pthread_mutex_unlock(&sp->lock);
  if (offset > used || bytes > used - offset)
    return l2l_fail(L2L_ERR_INVALID, "spill file %s: %llu bytes at %llu lie beyond its %llu "
                    "reserved", sp->path, (unsigned long long)bytes, (unsigned long long)offset,
                    (unsigned long long)used);
  *io = (struct eps_spill_io){.spill = sp, .write = write, .buffer = buffer, .offset = offset,
                              .bytes = bytes};
  io->job.run = io_run;
  l2l_queue_push(&sp->io, &io->job);
  return L2L_OK;
}

l2l_status eps_spill_wait(struct eps_spill_io *io) { return l2l_job_wait(&io->job); }
