/* SPDX-License-Identifier: MIT */
/* spill.c — the EPS's third tier: a spill file on disk, read and written on I/O threads.
 *
 * Purpose: records that do not fit the host budget live in a spill file (issue "Beyond host
 * memory"); this is the file and its I/O, below the EPS's choice of what to spill and when.
 * One file per user (a relay), named l2l-spill-<pid>-<n>.bin in the directory given, so a
 * run that died leaves a file that the next run finds and names (never reuses: it may be
 * another live run's, and it holds nothing a checkpoint needs). A file of this process's
 * own pid that it did not make was left by a dead process that had the pid (a container's
 * pids start again): it is named as left behind too, and the next free <n> is taken.
 * Regions are reserved in 4 KiB-aligned extents and allocated on disk when reserved
 * (posix_fallocate), so a full disk is an error at once, naming the file, and not a failed
 * write half-way through a step. Reads and writes go through io_uring (liburing) where the library was built with
 * it and the kernel allows it: every transfer queued is in flight at once (up to
 * RING_DEPTH), a read ahead beside a write behind, with no thread between the caller and
 * the disk but the one reaping completions; bench/RESULTS.md (issue 32) has the measurement
 * that chose it over the other engine, a small pool of pread/pwrite threads, which serves
 * where io_uring cannot (a build without liburing, a kernel or container that refuses it,
 * or L2L_SPILL_IO=threads). A transfer whose buffer,
 * offset and length are 4 KiB-aligned goes through an O_DIRECT descriptor where the file
 * system allows one (no copy into the page cache, which would otherwise grow by every byte
 * spilled), any other through the buffered one. Linux keeps the two coherent for one file
 * (a direct read writes back dirty cached pages first; a direct write drops them).
 * What is read back is checked against what was written (issue 47: zeros another program
 * wrote over the file were trained on): each transfer's bytes are hashed (XXH3-64, with
 * xxHash, as the checkpoints' checksums are) by the engine's thread as the transfer ends
 * (the ring's reaper, outside its lock, or the pool thread that moved it); the caller
 * keeps a write's hash with its region, and a read whose bytes hash otherwise is
 * L2L_ERR_IO naming the file and the offset. So a read ahead is checked before the update
 * that takes it waits for it, and the hashing (11-19 GB/s here) keeps pace with a disk
 * ten times slower on one thread.
 * The process's files together are counted for l2l_spill_get_stats (l2l.pool_stats("spill")).
 * Must never: write outside a reserved region, leave its file behind after eps_spill_close,
 * delete a file it did not make, finish a transfer before every byte of it is moved, or
 * hand back bytes that are not those written.
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
#include <xxhash.h>

#include "eps.h"
#ifdef L2L_LIBURING
#include <liburing.h>
#endif

/* RING_DEPTH: transfers on the ring at once (its submission entries; completions have
   twice as many, so they never overflow). */
enum { SPILL_EXTENT = 4096, RING_DEPTH = 64 };

static _Atomic int spill_names;        /* the next <n> of a name in this process */
static _Atomic int spill_files_made;   /* this process's files made (for the stats) */

/* This process's open spill files, linked by next_open, under files_lock: a file named
   with its pid is its own only if it is one of them (by device and inode). The lock is
   held from a directory's scan to the new file's place in the list, so that a file
   another thread is making is never taken for one left behind. */
static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;
static struct eps_spill *files_open;

/* Under files_lock: whether the file `name` in the directory d is one of ours. */
static bool file_is_open_here(DIR *d, const char *name) {
  struct stat st;
  if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  for (const struct eps_spill *sp = files_open; sp != NULL; sp = sp->next_open)
    if (sp->dev == (uint64_t)st.st_dev && sp->ino == (uint64_t)st.st_ino) return true;
  return false;
}

/* Under files_lock: sp in the list, or out of it. */
static void file_opened(struct eps_spill *sp) {
  struct stat st;
  sp->dev = sp->ino = 0;
  if (fstat(sp->fd, &st) == 0) sp->dev = (uint64_t)st.st_dev, sp->ino = (uint64_t)st.st_ino;
  sp->next_open = files_open;
  files_open = sp;
}
static void file_closed(struct eps_spill *sp) {
  pthread_mutex_lock(&files_lock);
  for (struct eps_spill **at = &files_open; *at != NULL; at = &(*at)->next_open)
    if (*at == sp) {
      *at = sp->next_open;
      break;
    }
  pthread_mutex_unlock(&files_lock);
}

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

static l2l_status ring_start(struct eps_spill *sp);
static void ring_stop(struct eps_spill *sp);

static uint64_t round_up(uint64_t n) { return (n + SPILL_EXTENT - 1) / SPILL_EXTENT * SPILL_EXTENT; }

/* Under files_lock: files of the spill's name pattern left by a process that no longer
   runs, named in `found` (a message for the user; empty when none): another pid's whose
   process is gone, or one of this pid that this process has not open. */
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
    if (pid <= 0) continue;
    if (pid == (long)getpid() ? file_is_open_here(d, e->d_name)
                              : kill((pid_t)pid, 0) == 0 || errno != ESRCH)
      continue;
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

/* The engine asked for: EPS_SPILL_ENGINE_ANY reads L2L_SPILL_IO (a value it does not know
   is an error naming it, not a silent default). */
static l2l_status engine_chosen(enum eps_spill_engine *engine) {
  if (*engine != EPS_SPILL_ENGINE_ANY) return L2L_OK;
  const char *env = getenv("L2L_SPILL_IO");
  if (env == NULL || env[0] == '\0') return L2L_OK;
  if (strcmp(env, "io_uring") == 0) *engine = EPS_SPILL_ENGINE_RING;
  else if (strcmp(env, "threads") == 0) *engine = EPS_SPILL_ENGINE_THREADS;
  else return core_fail(L2L_ERR_INVALID, "L2L_SPILL_IO is \"%s\": io_uring or threads, or unset "
                        "for io_uring where the kernel allows it", env);
  return L2L_OK;
}

l2l_status eps_spill_open(struct eps_spill *sp, const char *dir, enum eps_spill_engine engine,
                          int threads, char *found, size_t found_len) {
  if (sp == NULL || dir == NULL || dir[0] == '\0')
    return core_fail(L2L_ERR_INVALID, "the spill directory is empty");
  if (threads < 1 || threads > 64)
    return core_fail(L2L_ERR_INVALID, "spill I/O threads must be 1 to 64, got %d", threads);
  TRY(engine_chosen(&engine));
  memset(sp, 0, sizeof *sp);
  sp->fd = sp->fd_direct = -1;
  struct stat st;
  if (stat(dir, &st) != 0)
    return core_fail(L2L_ERR_IO, "spill directory %s: %s (make it, or give another)", dir,
                     strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return core_fail(L2L_ERR_IO, "spill directory %s is not a directory", dir);
  pthread_mutex_lock(&files_lock);
  if (found && found_len) find_left_behind(dir, found, found_len);
  /* a name in use is a file left by a dead process that had this pid (named above; this
     process's own names are never given twice): the next is tried (a bound, so that a
     directory that refuses every new name still ends) */
  for (int tries = 0; tries < 1000; tries++) {
    int n = atomic_fetch_add(&spill_names, 1);
    int w = snprintf(sp->path, sizeof sp->path, "%s/l2l-spill-%ld-%d.bin", dir, (long)getpid(), n);
    if (w < 0 || (size_t)w >= sizeof sp->path) {
      pthread_mutex_unlock(&files_lock);
      return core_fail(L2L_ERR_INVALID, "spill directory %s: the path is too long", dir);
    }
    sp->fd = open(sp->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (sp->fd >= 0 || errno != EEXIST) break;
  }
  if (sp->fd < 0) {
    int err = errno;
    pthread_mutex_unlock(&files_lock);
    return core_fail(L2L_ERR_IO, "spill file %s cannot be made: %s (a writable directory on a "
                     "local disk is needed)", sp->path, strerror(err));
  }
  file_opened(sp);
  pthread_mutex_unlock(&files_lock);
  atomic_fetch_add(&spill_files_made, 1);
  sp->fd_direct = open(sp->path, O_RDWR | O_DIRECT | O_CLOEXEC);   /* -1: buffered only */
  l2l_status status = engine == EPS_SPILL_ENGINE_THREADS ? L2L_ERR_UNSUPPORTED : ring_start(sp);
  if (status != L2L_OK && engine != EPS_SPILL_ENGINE_RING)
    status = queue_start(&sp->io, threads, 0, "spill I/O");
  if (status != L2L_OK) {
    file_closed(sp);
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
  if (sp->ring) ring_stop(sp);
  else queue_stop(&sp->io);
  file_closed(sp);
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
    return core_fail(L2L_ERR_INVALID, "the spill file is not open");
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
    return core_fail(L2L_ERR_IO, "spill file %s: no room for %s more (%s in the file): %s; free "
                     "space on that disk or give a spill directory on another%s",
                     sp->path, core_human_bytes(want, sizeof want, size),
                     core_human_bytes(have, sizeof have, used), strerror(err),
                     err == EFBIG ? ", or raise the file size limit (ulimit -f)" : "");
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

/* ------------------------------------------------------------ transfers, either engine */

static bool aligned_transfer(const struct eps_spill *sp, const void *buffer, uint64_t offset,
                             uint64_t bytes) {
  return sp->fd_direct >= 0 && (uintptr_t)buffer % SPILL_EXTENT == 0 &&
         offset % SPILL_EXTENT == 0 && bytes % SPILL_EXTENT == 0;
}

/* The outcome of one read or write of io's remaining bytes: n moved, or -errno. True when
   the transfer goes on (more bytes, or the same again: interrupted, or O_DIRECT refused
   after all); else it is over, its status in the job. */
static bool transfer_step(struct eps_spill_io *io, int64_t n) {
  struct eps_spill *sp = io->spill;
  if (n == -EINTR || n == -EAGAIN) return true;
  if (n == -EINVAL && io->direct) {   /* O_DIRECT refused this transfer after all */
    io->direct = false;
    return true;
  }
  if (n < 0) {
    job_fail(&io->job, core_fail(L2L_ERR_IO, "spill file %s: %s %llu bytes at %llu: %s",
                                 sp->path, io->write ? "writing" : "reading",
                                 (unsigned long long)io->bytes,
                                 (unsigned long long)io->offset, strerror((int)-n)));
    return false;
  }
  if (n == 0) {
    job_fail(&io->job, core_fail(L2L_ERR_IO, "spill file %s: short %s at %llu (%llu of %llu "
                                 "bytes): the file was cut short by another program",
                                 sp->path, io->write ? "write" : "read",
                                 (unsigned long long)io->offset, (unsigned long long)io->moved,
                                 (unsigned long long)io->bytes));
    return false;
  }
  io->moved += (uint64_t)n;
  if (io->moved < io->bytes) return true;
  atomic_fetch_add(io->write ? &sp->written : &sp->read, io->bytes);
  return false;
}

/* io has ended (on the engine's thread, which alone holds it until it is marked done):
   its bytes hashed, a write's for the read that takes them back, a read's for its wait to
   check (where the message has room for a long path). */
static void transfer_hash(struct eps_spill_io *io) {
  if (io->job.status != L2L_OK) return;
  io->hash = XXH3_64bits(io->buffer, (size_t)io->bytes);
  if (io->write) io->sum = io->hash;
}

/* ---------------------------------------------------------- the pool of pread/pwrite threads */

static void io_run(struct core_job *job, int thread) {
  (void)thread;
  struct eps_spill_io *io = (struct eps_spill_io *)job;
  struct eps_spill *sp = io->spill;
  for (bool more = io->bytes > 0; more;) {
    int fd = io->direct ? sp->fd_direct : sp->fd;
    char *at = (char *)io->buffer + io->moved;
    size_t want = io->bytes - io->moved;
    off_t where = (off_t)(io->offset + io->moved);
    ssize_t n = io->write ? pwrite(fd, at, want, where) : pread(fd, at, want, where);
    more = transfer_step(io, n < 0 ? -(int64_t)errno : (int64_t)n);
  }
  transfer_hash(io);
}

/* ----------------------------------------------------------------------------- io_uring */

#ifdef L2L_LIBURING
static char ring_stop_mark;   /* the completion that tells the reaper to end */

/* Puts io's remaining bytes on the ring (ring_lock held): 0, or -errno. */
static int ring_put(struct eps_spill *sp, struct eps_spill_io *io) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(sp->ring);   /* every entry is submitted at
                                                              once: one is free */
  if (sqe == NULL) return -EBUSY;
  uint64_t left = io->bytes - io->moved;
  unsigned want = left > (1u << 30) ? 1u << 30 : (unsigned)left;   /* a read's count is 32 bits */
  int fd = io->direct ? sp->fd_direct : sp->fd;
  char *at = (char *)io->buffer + io->moved;
  if (io->write) io_uring_prep_write(sqe, fd, at, want, io->offset + io->moved);
  else io_uring_prep_read(sqe, fd, at, want, io->offset + io->moved);
  io_uring_sqe_set_data(sqe, io);
  int n;
  while ((n = io_uring_submit(sp->ring)) == -EINTR) {}
  if (n >= 0) return 0;
  /* not taken: the entry stays in the queue, so it must mean nothing to a later submit */
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data(sqe, NULL);
  return n;
}

/* io is over (ring_lock held): its waiter may go on, and another transfer may take its
   place on the ring. */
static void ring_finish(struct eps_spill *sp, struct eps_spill_io *io) {
  io->job.done = true;
  sp->ring_in_flight--;
  pthread_cond_broadcast(&sp->ring_done);
  pthread_cond_signal(&sp->ring_room);
}

/* Puts io on the ring again for the rest of it, or ends it with the failure. */
static void ring_again(struct eps_spill *sp, struct eps_spill_io *io) {
  for (;;) {
    int err = ring_put(sp, io);
    if (err == 0) return;
    if (!transfer_step(io, err == -EAGAIN ? -EIO : err)) break;   /* (ring_put retries EINTR) */
  }
  ring_finish(sp, io);
}

/* The reaper: each completion moves its transfer on (the rest of it, or the same again
   through the buffered descriptor) or ends it. Under ring_lock, which also orders the
   queuing thread's setting of io before it, for whoever reads io next; a transfer that
   ended is hashed with the lock let go (nobody else touches io until it is marked done),
   so that queuing threads do not wait for the hash. */
static void *ring_reap(void *arg) {
  struct eps_spill *sp = arg;
  for (;;) {
    struct io_uring_cqe *cqe;
    int err = io_uring_wait_cqe(sp->ring, &cqe);
    if (err < 0) continue;   /* interrupted */
    struct eps_spill_io *io = io_uring_cqe_get_data(cqe);
    int n = cqe->res;
    io_uring_cqe_seen(sp->ring, cqe);
    if ((void *)io == &ring_stop_mark) break;
    if (io == NULL) continue;   /* an entry a failed submit left, made nothing */
    pthread_mutex_lock(&sp->ring_lock);
    bool more = transfer_step(io, n);
    if (more) ring_again(sp, io);
    pthread_mutex_unlock(&sp->ring_lock);
    if (more) continue;
    transfer_hash(io);
    pthread_mutex_lock(&sp->ring_lock);
    ring_finish(sp, io);
    pthread_mutex_unlock(&sp->ring_lock);
  }
  return NULL;
}

/* The ring and its reaper, or L2L_ERR_UNSUPPORTED saying why not (nothing made). */
static l2l_status ring_start(struct eps_spill *sp) {
  struct io_uring *ring = calloc(1, sizeof *ring);
  if (ring == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for an io_uring");
  int err = io_uring_queue_init(RING_DEPTH, ring, 0);
  if (err < 0) {
    free(ring);
    return core_fail(L2L_ERR_UNSUPPORTED, "io_uring: %s (the kernel or its sandbox refuses it)",
                     strerror(-err));
  }
  sp->ring = ring;
  pthread_mutex_init(&sp->ring_lock, NULL);
  pthread_cond_init(&sp->ring_room, NULL);
  pthread_cond_init(&sp->ring_done, NULL);
  if (core_thread_create(&sp->reaper, ring_reap, sp) != 0) {
    io_uring_queue_exit(ring);
    free(ring);
    sp->ring = NULL;
    return core_fail(L2L_ERR_NOMEM, "cannot start the spill file's io_uring thread");
  }
  return L2L_OK;
}

/* Waits for the transfers on the ring, then ends the reaper and the ring. */
static void ring_stop(struct eps_spill *sp) {
  pthread_mutex_lock(&sp->ring_lock);
  while (sp->ring_in_flight > 0) pthread_cond_wait(&sp->ring_done, &sp->ring_lock);
  struct io_uring_sqe *sqe = io_uring_get_sqe(sp->ring);
  if (sqe == NULL) {   /* entries a failed submit left: the kernel takes them now */
    io_uring_submit(sp->ring);
    sqe = io_uring_get_sqe(sp->ring);
  }
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data(sqe, &ring_stop_mark);
  while (io_uring_submit(sp->ring) == -EINTR) {}
  pthread_mutex_unlock(&sp->ring_lock);
  pthread_join(sp->reaper, NULL);
  io_uring_queue_exit(sp->ring);
  free(sp->ring);
  sp->ring = NULL;
  pthread_mutex_destroy(&sp->ring_lock);
  pthread_cond_destroy(&sp->ring_room);
  pthread_cond_destroy(&sp->ring_done);
}

/* io on the ring once there is room for it. */
static void ring_queue(struct eps_spill *sp, struct eps_spill_io *io) {
  pthread_mutex_lock(&sp->ring_lock);
  while (sp->ring_in_flight >= RING_DEPTH) pthread_cond_wait(&sp->ring_room, &sp->ring_lock);
  sp->ring_in_flight++;
  io->job.done = false;
  io->job.status = L2L_OK;
  ring_again(sp, io);
  pthread_mutex_unlock(&sp->ring_lock);
}

static l2l_status ring_wait(struct eps_spill *sp, struct eps_spill_io *io) {
  pthread_mutex_lock(&sp->ring_lock);
  while (!io->job.done) pthread_cond_wait(&sp->ring_done, &sp->ring_lock);
  pthread_mutex_unlock(&sp->ring_lock);
  return io->job.status == L2L_OK ? L2L_OK : core_fail(io->job.status, "%s", io->job.message);
}
#else
static l2l_status ring_start(struct eps_spill *sp) {
  (void)sp;
  return core_fail(L2L_ERR_UNSUPPORTED, "io_uring: this libl2l was built without liburing");
}
static void ring_stop(struct eps_spill *sp) { (void)sp; }
static void ring_queue(struct eps_spill *sp, struct eps_spill_io *io) { (void)sp, (void)io; }
static l2l_status ring_wait(struct eps_spill *sp, struct eps_spill_io *io) {
  (void)sp, (void)io;
  return L2L_ERR_UNSUPPORTED;
}
#endif

l2l_status eps_spill_queue(struct eps_spill *sp, struct eps_spill_io *io, bool write, void *buffer,
                           uint64_t offset, uint64_t bytes, uint64_t sum) {
  if (sp == NULL || sp->fd < 0 || io == NULL || (buffer == NULL && bytes > 0))
    return core_fail(L2L_ERR_INVALID, "the spill file is not open, or no buffer");
  pthread_mutex_lock(&sp->lock);
  uint64_t used = sp->used;
  pthread_mutex_unlock(&sp->lock);
  if (offset > used || bytes > used - offset)
    return core_fail(L2L_ERR_INVALID, "spill file %s: %llu bytes at %llu lie beyond its %llu "
                     "reserved", sp->path, (unsigned long long)bytes, (unsigned long long)offset,
                     (unsigned long long)used);
  *io = (struct eps_spill_io){.spill = sp, .write = write, .buffer = buffer, .offset = offset,
                              .bytes = bytes, .sum = write ? 0 : sum,
                              .direct = aligned_transfer(sp, buffer, offset, bytes)};
  if (sp->ring == NULL) {
    io->job.run = io_run;
    queue_push(&sp->io, &io->job);
  } else if (bytes > 0) {
    ring_queue(sp, io);
  } else {
    transfer_hash(io);     /* nothing to move: the hash of no bytes, as the pool's */
    io->job.done = true;
  }
  return L2L_OK;
}

l2l_status eps_spill_wait(struct eps_spill_io *io) {
  struct eps_spill *sp = io->spill;
  TRY(sp->ring ? ring_wait(sp, io) : job_wait(&io->job));
  if (io->write || io->hash == io->sum) return L2L_OK;
  return core_fail(L2L_ERR_IO, "spill file %s: the %llu bytes at %llu are not those written there "
                   "(their XXH3-64 is %016llx, %016llx when written): another program changed "
                   "the file", sp->path, (unsigned long long)io->bytes,
                   (unsigned long long)io->offset, (unsigned long long)io->hash,
                   (unsigned long long)io->sum);
}
