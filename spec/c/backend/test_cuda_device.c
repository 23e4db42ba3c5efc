/* SPDX-License-Identifier: MIT */
/* test_cuda_device.c — the GPU itself: l2l_cuda_get_info and switching the device pool, the
 * caching allocator's counters and the device pool's budget, and which GPU a process takes
 * (L2L_CUDA_DEVICE, the launcher's local rank). test_cuda.c says how the GPU tests test;
 * the harness is cuda_twins.h's. Skipped without a GPU; the device info and the caching
 * allocator also in a dry run (L2L_TEST_CUDA_DRY_RUN=1: they need CUDA itself). All test
 * names start with "cuda_".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_twins.h"

/* ================================================================ device and info */

TEST(cuda_get_info_and_device_switch) {
  if (!use_real_gpu()) return;
  l2l_cuda_info info;
  memset(&info, 0, sizeof info);
  if (CHECK_OK(l2l_cuda_get_info(&info))) {
    CHECK(info.name[0] != '\0' && memchr(info.name, '\0', sizeof info.name) != NULL,
          "device name \"%.255s\"", info.name);
    CHECK(info.major >= 8, "compute capability %d.%d, need 8.0 or newer", info.major,
          info.minor);
    CHECK(info.multiprocessors > 0, "%d multiprocessors", info.multiprocessors);
    CHECK(info.total_bytes > 0 && info.free_bytes <= info.total_bytes,
          "memory: %llu free of %llu", (unsigned long long)info.free_bytes,
          (unsigned long long)info.total_bytes);
    CHECK(info.runtime_version > 0 && info.driver_version > 0, "runtime %d, driver %d",
          info.runtime_version, info.driver_version);
  }
  CHECK_FAILS(l2l_cuda_get_info(NULL), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_cuda_set_tf32(2), L2L_ERR_INVALID, "enable");
  CHECK_OK(l2l_device_synchronize());
  /* Switching away is refused while a device tensor lives, and changes nothing. */
  l2l_tensor *t = DEV(L2L_F32, 7);
  CHECK_FAILS(l2l_device_use("cpu"), L2L_ERR_STATE, "free them");
  CHECK(strcmp(l2l_device_backend(), "cuda") == 0, "a refused switch changed the backend to %s",
        l2l_device_backend());
  CHECK_FAILS(l2l_device_use("tpu"), L2L_ERR_INVALID, "backend must be");
  CHECK_OK(l2l_device_use("cuda")); /* already there: fine even with tensors alive */
  FREE(t);
  end_gpu();
  CHECK(strcmp(l2l_device_backend(), "cpu") == 0, "after end_gpu the device is on %s",
        l2l_device_backend());
}

/* ================================================================ the caching allocator */

/* The CUDA backend's own device memory: SCRATCH_BYTES + CUBLAS_WORKSPACE_BYTES of
   src/backend/cuda/runtime.h (32 MiB each), which the tests cannot include. */
#define SCRATCH_AND_WORKSPACE_BYTES (UINT64_C(64) << 20)

TEST(cuda_caching_allocator_and_budget) {
  if (!use_real_gpu()) return;
  /* floats: small and odd, around 1 MiB, and large */
  static const int64_t sizes[] = {1, 7, 129, 1000, 4099, 65536, 262145, 1 << 20, 3000001,
                                  (1 << 24) + 5};
  enum { COUNT = sizeof sizes / sizeof sizes[0] };
  l2l_pool_stats s0 = device_stats();
  CHECK(s0.current == 0, "%llu bytes of device tensors before the test",
        (unsigned long long)s0.current);
  uint64_t system_after_first = 0;
  for (int round = 0; round < 3; round++) { /* three "training steps" */
    l2l_tensor *ts[COUNT];
    for (int i = 0; i < COUNT; i++) ts[i] = DEV(L2L_F32, sizes[i]);
    l2l_pool_stats s = device_stats();
    CHECK(s.reserved >= s.current && s.current > s0.current,
          "round %d, all allocated: reserved %llu, current %llu", round,
          (unsigned long long)s.reserved, (unsigned long long)s.current);
    for (int i = COUNT - 1; i >= 0; i -= 2) l2l_tensor_free(ts[i]); /* another order */
    for (int i = COUNT - 2; i >= 0; i -= 2) l2l_tensor_free(ts[i]);
    s = device_stats();
    CHECK(s.current == s0.current && s.reserved >= s.current,
          "round %d, all freed: reserved %llu, current %llu", round,
          (unsigned long long)s.reserved, (unsigned long long)s.current);
    if (round == 0) system_after_first = s.system_allocs;
    else
      CHECK(s.system_allocs == system_after_first,
            "round %d called the system allocator %llu more times (steady state should reuse "
            "the cached blocks)", round,
            (unsigned long long)(s.system_allocs - system_after_first));
  }
  l2l_pool_stats s = device_stats();
  CHECK(s.reserved > s.current, "the freed blocks are not cached: reserved %llu, current %llu",
        (unsigned long long)s.reserved, (unsigned long long)s.current);
  CHECK_OK(l2l_device_release_cache());
  s = device_stats();
  /* the backend's own blocks (scratch, cuBLAS's workspace) stay: at least their 64 MiB */
  CHECK(s.backend >= SCRATCH_AND_WORKSPACE_BYTES, "the backend keeps %llu bytes, not its "
        "scratch and workspace", (unsigned long long)s.backend);
  CHECK(s.reserved == s.current + s.backend, "after release_cache with no tensor alive: "
        "reserved %llu, current %llu, backend %llu", (unsigned long long)s.reserved,
        (unsigned long long)s.current, (unsigned long long)s.backend);
  /* With tensors alive, release keeps their blocks: reserved exceeds current and the
     backend's bytes only by the rounding of each block (less than 2 MiB apiece). */
  l2l_tensor *live[2] = {DEV(L2L_F32, 1000), DEV(L2L_F32, 3000001)};
  CHECK_OK(l2l_device_release_cache());
  s = device_stats();
  CHECK(s.reserved >= s.current + s.backend &&
            s.reserved - s.current - s.backend < 2 * (UINT64_C(2) << 20),
        "after release_cache with 2 tensors alive: reserved %llu, current %llu, backend %llu",
        (unsigned long long)s.reserved, (unsigned long long)s.current,
        (unsigned long long)s.backend);

  /* The budget: an over-budget tensor is refused as on the CPU, and changes nothing but
     the refused count; the backend's own bytes count against it (a budget below them and
     the tensors is refused). */
  uint64_t old_budget = s.budget;
  CHECK_FAILS(l2l_pool_set_budget(L2L_POOL_DEVICE, s.current + s.backend - 1), L2L_ERR_STATE,
              "the backend keeps for itself");
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, s.current + s.backend + (UINT64_C(1) << 20)));
  l2l_pool_stats before = device_stats();
  l2l_tensor *big = NULL;
  CHECK_FAILS(l2l_tensor_new(&big, L2L_POOL_DEVICE, L2L_F32, DIMS(1 << 20)), L2L_ERR_BUDGET,
              "device pool: cannot allocate 4194304 bytes");
  CHECK(strstr(l2l_last_error(), "the backend keeps for itself), budget") != NULL,
        "budget message: \"%s\"", l2l_last_error());
  l2l_pool_stats after = device_stats();
  CHECK(big == NULL, "a refused tensor_new set *out");
  CHECK(after.current == before.current && after.allocs == before.allocs &&
            after.reserved == before.reserved && after.system_allocs == before.system_allocs &&
            after.peak == before.peak && after.refused == before.refused + 1,
        "a refused allocation changed the stats: current %llu -> %llu, allocs %llu -> %llu, "
        "reserved %llu -> %llu, system allocs %llu -> %llu, refused %llu -> %llu",
        (unsigned long long)before.current, (unsigned long long)after.current,
        (unsigned long long)before.allocs, (unsigned long long)after.allocs,
        (unsigned long long)before.reserved, (unsigned long long)after.reserved,
        (unsigned long long)before.system_allocs, (unsigned long long)after.system_allocs,
        (unsigned long long)before.refused, (unsigned long long)after.refused);
  l2l_tensor *small = DEV(L2L_F32, 1000); /* within the budget: fine */
  FREE(small, live[0], live[1]);
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, old_budget));
  CHECK_OK(l2l_device_release_cache());
  end_gpu();
}

/* ================================================================ which GPU */

/* Needs no GPU: the choice among `count` devices from the environment (ranks on a node
   take different GPUs; L2L_CUDA_DEVICE overrides; a wrong one is refused with a reason). */
TEST(cuda_device_index_from_environment) {
  static const char *const vars[] = {"L2L_CUDA_DEVICE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "MPI_LOCALRANKID", "SLURM_LOCALID"};
  char *saved[4];
  for (int k = 0; k < 4; k++) {
    const char *v = getenv(vars[k]);
    saved[k] = v ? strdup(v) : NULL;
    unsetenv(vars[k]);
  }
  char why[256];
  int count = (int)check_rand_int(1, 16);
  CHECK(backend_accelerator_index(count, why, sizeof why) == 0, "no variable: device 0");
  int rank = (int)check_rand_int(0, 1000);
  setenv("SLURM_LOCALID", "999999", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);   /* not a number: the next one counts */
  char text[16];
  snprintf(text, sizeof text, "%d", rank);
  setenv("MPI_LOCALRANKID", text, 1);
  CHECK(backend_accelerator_index(count, why, sizeof why) == rank % count,
        "local rank %d of %d devices: device %d", rank, count, rank % count);
  snprintf(text, sizeof text, "%d", rank);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", text, 1);   /* OpenMPI's comes first */
  CHECK(backend_accelerator_index(count, why, sizeof why) == rank % count, "OpenMPI's local rank");
  int pick = (int)check_rand_int(0, count - 1);
  snprintf(text, sizeof text, "%d", pick);
  setenv("L2L_CUDA_DEVICE", text, 1);
  CHECK(backend_accelerator_index(count, why, sizeof why) == pick, "L2L_CUDA_DEVICE=%d wins", pick);
  static const char *const bad[] = {"-1", "", "1x", "99999999999", "0.5"};
  for (int k = 0; k < 5; k++) {
    setenv("L2L_CUDA_DEVICE", bad[k], 1);
    why[0] = '\0';
    CHECK(backend_accelerator_index(count, why, sizeof why) == -1 && strstr(why, "L2L_CUDA_DEVICE"),
          "L2L_CUDA_DEVICE='%s' refused with a reason (got '%s')", bad[k], why);
  }
  snprintf(text, sizeof text, "%d", count);
  setenv("L2L_CUDA_DEVICE", text, 1);
  CHECK(backend_accelerator_index(count, why, sizeof why) == -1, "L2L_CUDA_DEVICE=%d of %d devices",
        count, count);
  CHECK(backend_accelerator_index(0, why, sizeof why) == -1, "no devices at all");
  for (int k = 0; k < 4; k++) {
    if (saved[k]) setenv(vars[k], saved[k], 1); else unsetenv(vars[k]);
    free(saved[k]);
  }
}
