/* SPDX-License-Identifier: MIT */
/* bench/spill_io.c — the spill file's I/O (src/eps/spill.c) against the disk it is on.
 *
 * Prints, in one run: the sequential write and read bandwidth of the spill engine over
 * TOTAL bytes in records of RECORD bytes (a block's worth of fp32 state), for 1, 2 and 4 I/O
 * threads, with 4 KiB-aligned buffers (around the page cache, O_DIRECT where the file
 * system allows it) and with unaligned ones (through the page cache), each the median of
 * REPEATS. Before the reads the file's cached pages are dropped (posix_fadvise DONTNEED
 * after fdatasync), so a buffered read comes from the disk, not from memory. These are the
 * figures the issue "Beyond host memory" compares its step times with (the I/O bound).
 * Run: make build/bench_spill_io && build/bench_spill_io [DIR]   (DIR: the spill directory
 * to measure, default the system's temporary one)
 */
#include <fcntl.h>
#include <string.h>

#include "bench.h"
#include "eps/eps.h"

enum { RECORD = 8 << 20, RECORDS = 64, REPEATS = 3 };

/* Seconds to move every record one way, `threads` I/O threads; buffers `aligned` or not. */
static double pass(const char *dir, int threads, bool aligned, bool write, unsigned char **buf) {
  struct eps_spill sp;
  ok(eps_spill_open(&sp, dir, threads, NULL, 0));
  uint64_t at[RECORDS];
  struct eps_spill_io io[RECORDS];
  for (int i = 0; i < RECORDS; i++) ok(eps_spill_reserve(&sp, RECORD, &at[i]));
  uint64_t bytes = aligned ? RECORD : RECORD - 64;   /* an unaligned length too */
  if (!write) {   /* something to read, then out of the page cache */
    for (int i = 0; i < RECORDS; i++) ok(eps_spill_queue(&sp, &io[i], true, buf[i], at[i], bytes));
    for (int i = 0; i < RECORDS; i++) ok(eps_spill_wait(&io[i]));
    fdatasync(sp.fd);
    posix_fadvise(sp.fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  double t0 = now();
  for (int i = 0; i < RECORDS; i++) ok(eps_spill_queue(&sp, &io[i], write, buf[i], at[i], bytes));
  for (int i = 0; i < RECORDS; i++) ok(eps_spill_wait(&io[i]));
  if (write) fdatasync(sp.fd);   /* on the disk, not only in the cache */
  double seconds = now() - t0;
  eps_spill_close(&sp);
  return seconds;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  unsigned char *buf[RECORDS];
  for (int i = 0; i < RECORDS; i++) {
    buf[i] = aligned_alloc(4096, RECORD);
    if (buf[i] == NULL) return 1;
    memset(buf[i], i + 1, RECORD);
  }
  printf("bench/spill_io: %d records of %d MiB in %s, median of %d\n", RECORDS, RECORD >> 20, dir,
         REPEATS);
  printf("| threads | buffers | write MB/s | read MB/s |\n|---:|---|---:|---:|\n");
  for (int threads = 1; threads <= 4; threads *= 2)
    for (int aligned = 1; aligned >= 0; aligned--) {
      double w[REPEATS], r[REPEATS];
      for (int k = 0; k < REPEATS; k++) {
        w[k] = pass(dir, threads, aligned, true, buf);
        r[k] = pass(dir, threads, aligned, false, buf);
      }
      double mb = (double)RECORDS * RECORD / 1e6;
      printf("| %d | %s | %.0f | %.0f |\n", threads,
             aligned ? "aligned (O_DIRECT)" : "unaligned (page cache)", mb / median(w, REPEATS),
             mb / median(r, REPEATS));
    }
  for (int i = 0; i < RECORDS; i++) free(buf[i]);
  return 0;
}
