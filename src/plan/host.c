/* SPDX-License-Identifier: MIT */
/* host.c — the planner's host and disk channel: what the EPS of a relay over the chain's
 * layers holds in host memory and moves to and from its spill file in a step.
 *
 * Purpose: the relay's host budget and spill directory (l2l_relay_config.host_budget,
 * spill_dir) as the planner sees them: the records in layer order (a relay made over the
 * model as it is holds them so), each record's bytes and the budget's choices by core's
 * host-tier rules (the ones the EPS applies), so the predicted bytes are the relay's to
 * the byte (with ranks, this rank's: its shards); and the spill directory's sequential
 * rates, measured once and cached with the machine's other rates, for the disk's share of
 * a step.
 * Must never: leave a file behind in the spill directory, or plan a step the relay's host
 * budget would refuse.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "plan.h"

l2l_status plan_host(struct plan_host *out, const struct plan_layer *layers, int L,
                     const l2l_relay_config *config) {
  int arrays = 0;
  TRY(l2l_optimizer_state_arrays(&arrays, &config->optimizer));
  /* the records, each once (a tied table is its first user's), trainable when a user is */
  const l2l_layer **list = calloc((size_t)(L > 0 ? L : 1), sizeof *list);
  bool *frozen = calloc((size_t)(L > 0 ? L : 1), sizeof *frozen);
  struct layers_record *recs = NULL;
  int n = 0;
  l2l_status status = list && frozen ? L2L_OK : core_fail_in("l2l_plan_new", L2L_ERR_NOMEM, "no memory for %d layers", L);
  for (int k = 0; status == L2L_OK && k < L; k++) list[k] = layers[k].layer, frozen[k] = layers[k].frozen;
  if (status == L2L_OK) status = layers_records(&recs, &n, list, frozen, L);
  free(list), free(frozen);
  TRY(status);
  struct host_record *bytes = calloc((size_t)(n > 0 ? n : 1), sizeof *bytes);
  if (bytes == NULL) {
    free(recs);
    return core_fail_in("l2l_plan_new", L2L_ERR_NOMEM, "no memory for %d records", n);
  }
  /* with a spill file a frozen record's accumulator is never in memory (it holds nothing:
     its pages are given back), and the others pass when the budget cannot hold them all
     (the tier's choice): a passing one is in memory from its arrival to its update (the
     window's), none between steps; one that cannot pass (tied, accumulating over steps)
     is in memory through the step */
  bool spill = config->spill_dir != NULL, dist = config->dist != L2L_DIST_NONE;
  /* with ranks, this rank's: its shards of the reduced gradients and the state */
  int ranks = dist ? dist_size_now() : 1, rank = dist ? dist_rank_now() : 0;
  bool defer = config->clip_global_norm > 0 || config->loss_scale > 0, every = config->accumulate <= 1;
  uint64_t base = 0, fixed = 0, state = 0, largest = 0, passing = 0, passing_total = 0, grads = 0,
           device = 0;
  int on_device = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = l2l_tensor_numel(param_value(recs[i].param));
    /* a low-precision record has a 16-bit staging copy, or a bf16 master that is it */
    struct layers_record_dtypes held =
        layers_record_dtypes(recs[i].param, config->precision, config->master);
    int64_t begin, shard_n;
    host_shard(numel, ranks, rank, host_shard_align(config->optimizer.state), &begin,
               &shard_n);
    if (layers[recs[i].layer].on_device >> recs[i].place & 1) {   /* (on the host: with
                                                                     ranks, its exchange's) */
      device += device_record_bytes(numel, held.master, arrays, config->optimizer.state,
                                    held.staging);
      on_device++;
      uint64_t exchange = dist ? device_record_host_bytes(numel, shard_n) : 0;
      base += exchange, fixed += exchange;
      continue;
    }
    host_record_bytes(&bytes[i], numel, shard_n, arrays, config->optimizer.state,
                      held.master, held.staging, dist);
    bool trained = recs[i].trained;
    if (!trained) bytes[i].state = bytes[i].moved = 0;   /* never updated: no state */
    base += bytes[i].fixed;
    fixed += bytes[i].fixed;
    grads += !spill || trained ? bytes[i].grad : 0;
    if (host_grad_passes(spill, defer, every, recs[i].users, trained ? 1 : 0)) {
      passing = bytes[i].grad > passing ? bytes[i].grad : passing;
      passing_total += bytes[i].grad;
    } else if (!spill || trained) {
      fixed += bytes[i].grad;
    }
    state += bytes[i].state;
    largest = bytes[i].state > largest ? bytes[i].state : largest;
  }
  struct host_tier tier;
  host_tier_plan(&tier, fixed, state, largest, passing, passing_total, config->host_budget, spill);
  /* between steps: the masters and staging copies, and the accumulators unless they pass */
  uint64_t between = base + (tier.grads_pass ? 0 : grads);
  *out = (struct plan_host){.smallest_budget = tier.need, .eps_bytes = between,
                            .device_bytes = device + device_words_bytes(on_device)};
  uint64_t kept = 0;
  for (int i = 0; i < n; i++) {
    if (!spill || host_tier_keeps(&tier, &kept, bytes[i].state)) out->eps_bytes += bytes[i].state;
    else out->disk_bytes += bytes[i].moved;   /* read before its update, written after */
  }
  free(recs), free(bytes);
  return L2L_OK;
}

/* One direction through a file in `dir`: `total` bytes in 8 MiB transfers, around the page
   cache where the file system allows it. */
static l2l_status disk_pass(double *seconds, int fd, char *buffer, uint64_t total, bool write,
                            const char *dir) {
  enum { CHUNK = 8 << 20 };
  double t0 = core_now();
  for (uint64_t done = 0; done < total;) {
    ssize_t got = write ? pwrite(fd, buffer, CHUNK, (off_t)done) : pread(fd, buffer, CHUNK, (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return core_fail_in("l2l_plan_new", L2L_ERR_IO, "measuring the spill directory %s: %s", dir,
                      got < 0 ? strerror(errno) : "a read came back short");
    done += (uint64_t)got;
  }
  if (write && fdatasync(fd) != 0)
    return core_fail_in("l2l_plan_new", L2L_ERR_IO, "measuring the spill directory %s: %s", dir, strerror(errno));
  *seconds = core_now() - t0;
  return L2L_OK;
}

l2l_status plan_disk_rates(double *read, double *write, const char *dir) {
  /* cached under the directory's name (one too long for the cache's lines: measured each
     time) */
  char key[400] = "disk256 ";
  size_t at = strlen(key);
  bool cached = strlen(dir) + at < sizeof key;
  for (const char *c = dir; cached && *c; c++) key[at++] = *c == ' ' ? '_' : *c;
  key[at] = '\0';
  double v[2];
  if (cached && plan_cache_get(key, v, 2) && v[0] > 0 && v[1] > 0) {
    *read = v[0], *write = v[1];
    return L2L_OK;
  }
  /* as much as a step of a large model moves: a smaller pass ends in the disk's (or the
     virtual machine's host's) write cache and reads back from it (64 MiB measured twice
     the rate of 256 MiB on this machine's virtio disk) */
  enum { TOTAL = 256 << 20 };
  char path[4200];
  snprintf(path, sizeof path, "%s/l2l-rates-XXXXXX", dir);
  int fd = mkstemp(path);
  if (fd < 0)
    return core_fail_in("l2l_plan_new", L2L_ERR_IO, "the spill directory %s cannot be measured: %s", dir,
                    strerror(errno));
  int direct = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
  unlink(path);   /* the descriptors keep it until closed: nothing is left behind */
  void *buffer = NULL;
  l2l_status status = posix_memalign(&buffer, 4096, 8 << 20) == 0
                          ? L2L_OK : core_fail_in("l2l_plan_new", L2L_ERR_NOMEM, "no memory to measure a disk");
  /* the file allocated first, as a spill file's regions are (posix_fallocate), so the
     writes overwrite as the spill's do (allocating writes run slower); then three passes
     each way, the median kept: a virtual machine's disk moves by a third between passes,
     and the value is cached for good */
  enum { PASSES = 3 };
  double reads[PASSES], writes[PASSES];
  int use = direct >= 0 ? direct : fd;
  if (status == L2L_OK) memset(buffer, 0x5a, 8 << 20);
  if (status == L2L_OK && posix_fallocate(fd, 0, TOTAL) != 0)
    status = core_fail_in("l2l_plan_new", L2L_ERR_IO, "the spill directory %s has no room for a 256 MiB "
                      "measuring file", dir);
  for (int i = 0; i < PASSES && status == L2L_OK; i++) {
    status = disk_pass(&writes[i], use, buffer, TOTAL, true, dir);
    if (status == L2L_OK && direct < 0) posix_fadvise(fd, 0, TOTAL, POSIX_FADV_DONTNEED);
    if (status == L2L_OK) status = disk_pass(&reads[i], use, buffer, TOTAL, false, dir);
  }
  free(buffer);
  if (direct >= 0) close(direct);
  close(fd);
  if (status != L2L_OK) return status;
  double r = plan_median(reads, PASSES), w = plan_median(writes, PASSES);
  v[0] = TOTAL / (r > 1e-6 ? r : 1e-6);
  v[1] = TOTAL / (w > 1e-6 ? w : 1e-6);
  if (cached) plan_cache_put(key, v, 2);
  *read = v[0], *write = v[1];
  return L2L_OK;
}
