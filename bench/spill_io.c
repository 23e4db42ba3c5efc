/* SPDX-License-Identifier: MIT */
/* bench/spill_io.c — the spill file's I/O engines (src/eps/spill.c) against the disk.
 *
 * Prints, in one run, the bandwidth of each engine the spill file can have: io_uring
 * (liburing; every transfer queued in flight at once, up to the ring's depth) and the pool
 * of pread/pwrite threads with 1, 4 and 16 threads (a transfer in flight per thread). Each
 * moves TOTAL bytes in transfers of 8 MiB (a block's state array and more: what the tier
 * moves), 1 MiB and 64 KiB (small records), 4 KiB-aligned (around the page cache, O_DIRECT
 * where the file system allows it), and 8 MiB unaligned (through the page cache): written,
 * read, and mixed (the even transfers read while the odd ones are written, as a read ahead
 * meets a write behind). Writes are timed to fdatasync; before the reads the file's cached
 * pages are dropped, so a read comes from the disk. Every transfer is hashed and every read
 * checked against its write's hash, as the tier's are (issue 47): the figures include it. The engines take turns within each of
 * REPEATS rounds (this machine's disk drifts more than the engines differ), and the
 * median is printed, with every round's figure.
 * Run: make build/bench_spill_io && build/bench_spill_io [DIR]   (DIR: the spill directory
 * to measure, default the system's temporary one)
 */
#include <fcntl.h>
#include <string.h>

#include "bench.h"
#include "eps/eps.h"

enum { TOTAL = 512 << 20, REPEATS = 5, ENGINES = 4, SHAPES = 4, WAYS = 3 };

static const struct { enum eps_spill_engine engine; int threads; const char *name; } engines[ENGINES] = {
  {EPS_SPILL_ENGINE_RING, 1, "io_uring"},
  {EPS_SPILL_ENGINE_THREADS, 1, "1 thread"},
  {EPS_SPILL_ENGINE_THREADS, 4, "4 threads"},
  {EPS_SPILL_ENGINE_THREADS, 16, "16 threads"},
};
static const struct { uint64_t bytes; bool aligned; } shapes[SHAPES] = {
  {8 << 20, true}, {1 << 20, true}, {64 << 10, true}, {8 << 20, false}};

/* Seconds to move TOTAL bytes one way (0 write, 1 read, 2 mixed) in transfers of `bytes`
   (less 64 when not aligned); -1 when the engine cannot serve here. */
static double pass(const char *dir, int e, uint64_t bytes, bool aligned, int way, unsigned char **buf) {
  struct eps_spill sp;
  if (eps_spill_open(&sp, dir, engines[e].engine, engines[e].threads, NULL, 0) != L2L_OK) return -1;
  int n = (int)(TOTAL / bytes);
  uint64_t *at = malloc((size_t)n * sizeof *at), *sum = calloc((size_t)n, sizeof *sum);
  struct eps_spill_io *io = malloc((size_t)n * sizeof *io);
  if (at == NULL || sum == NULL || io == NULL) exit(1);
  for (int i = 0; i < n; i++) ok(eps_spill_reserve(&sp, bytes, &at[i]));
  uint64_t len = aligned ? bytes : bytes - 64;
  if (way != 0) {   /* something to read, then out of the page cache */
    for (int i = 0; i < n; i++) ok(eps_spill_queue(&sp, &io[i], true, buf[i], at[i], len, 0));
    for (int i = 0; i < n; i++) ok(eps_spill_wait(&io[i])), sum[i] = io[i].sum;
    fdatasync(sp.fd);
    posix_fadvise(sp.fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  double t0 = now();
  for (int i = 0; i < n; i++)
    ok(eps_spill_queue(&sp, &io[i], way == 0 || (way == 2 && i % 2 == 1), buf[i], at[i], len, sum[i]));
  for (int i = 0; i < n; i++) ok(eps_spill_wait(&io[i]));
  if (way != 1) fdatasync(sp.fd);   /* on the disk, not only in the cache */
  double seconds = now() - t0;
  eps_spill_close(&sp);
  free(at);
  free(sum);
  free(io);
  return seconds;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  printf("bench/spill_io: %d MiB each way in %s; MB/s, median of %d rounds (the rounds)\n",
         TOTAL >> 20, dir, REPEATS);
  printf("| engine | transfer | buffers | write | read | mixed |\n|---|---:|---|---:|---:|---:|\n");
  for (int s = 0; s < SHAPES; s++) {
    uint64_t bytes = shapes[s].bytes;
    int n = (int)(TOTAL / bytes);
    unsigned char **buf = malloc((size_t)n * sizeof *buf);
    if (buf == NULL) return 1;
    for (int i = 0; i < n; i++) {
      buf[i] = aligned_alloc(4096, bytes);
      if (buf[i] == NULL) return 1;
      memset(buf[i], i + 1, bytes);
    }
    double t[ENGINES][WAYS][REPEATS];
    for (int k = 0; k < REPEATS; k++)
      for (int e = 0; e < ENGINES; e++)
        for (int w = 0; w < WAYS; w++) t[e][w][k] = pass(dir, e, bytes, shapes[s].aligned, w, buf);
    for (int e = 0; e < ENGINES; e++) {
      if (t[e][0][0] < 0) {
        printf("| %s | cannot serve here (build or kernel) | | | | |\n", engines[e].name);
        continue;
      }
      printf("| %s | %llu KiB | %s |", engines[e].name, (unsigned long long)(bytes >> 10),
             shapes[s].aligned ? "aligned (O_DIRECT)" : "unaligned (page cache)");
      for (int w = 0; w < WAYS; w++) {
        double rate[REPEATS];
        for (int k = 0; k < REPEATS; k++) rate[k] = (double)TOTAL / 1e6 / t[e][w][k];
        printf(" %.0f (", (double)TOTAL / 1e6 / median(t[e][w], REPEATS));
        for (int k = 0; k < REPEATS; k++) printf("%s%.0f", k ? " " : "", rate[k]);
        printf(") |");
      }
      printf("\n");
      fflush(stdout);
    }
    for (int i = 0; i < n; i++) free(buf[i]);
    free(buf);
  }
  return 0;
}
