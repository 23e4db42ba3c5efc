/* SPDX-License-Identifier: MIT */
/* dispatch.c — which backend serves the device pool, and the dispatch from pools to ops
 * tables.
 *
 * Purpose: the registry of accelerator backends (today one: CUDA) and the choice among
 * them. At load, this file registers the chooser with the core; the core asks it on the
 * first use of the device: L2L_DEVICE=cpu keeps the device pool on the CPU backend (host
 * memory with the device pool's budget and accounting), else the first backend that
 * probes as usable installs its device table. Host and pinned memory always belong to
 * the CPU backend. Adding a backend is one entry in `accelerators` below.
 * Must never: pick a backend without having probed that it runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accelerators.h"

struct accelerator {
  const char *name;
  /* 1 if it can run here; else 0 with the reason in why (may be NULL). */
  int (*probe)(char *why, size_t len);
  const struct device_ops *device;
  const struct backend_ops *(*ops)(void);
};

static const struct accelerator accelerators[] = {
    {"cuda", cuda_probe, &cuda_device, cuda_ops},
};
enum { ACCELERATORS = sizeof accelerators / sizeof accelerators[0] };

/* A whole number of at most 9 digits, or -1. */
static int small_count(const char *s) {
  if (s == NULL || *s == '\0' || strlen(s) > 9) return -1;
  for (const char *p = s; *p; p++)
    if (*p < '0' || *p > '9') return -1;
  return atoi(s);
}

int backend_accelerator_index(int count, char *why, size_t len) {
  if (count < 1) {
    if (why != NULL && len > 0) snprintf(why, len, "no device to choose among");
    return -1;
  }
  const char *chosen = getenv("L2L_CUDA_DEVICE");
  if (chosen != NULL) {
    int i = small_count(chosen);
    if (i >= 0 && i < count) return i;
    if (why != NULL && len > 0)
      snprintf(why, len, "L2L_CUDA_DEVICE='%.40s' is not a device here: this machine has %d "
               "(0 to %d)", chosen, count, count - 1);
    return -1;
  }
  static const char *const local_rank[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                           "SLURM_LOCALID"};
  for (size_t k = 0; k < sizeof local_rank / sizeof local_rank[0]; k++) {
    int rank = small_count(getenv(local_rank[k]));
    if (rank >= 0) return rank % count;
  }
  return 0;
}

/* The first choice: L2L_DEVICE=cpu, or an accelerator named by L2L_DEVICE (one that
   cannot run falls back to the CPU, and the first device allocation then explains why),
   else the first that runs here. */
static const struct device_ops *first_choice(void) {
  const char *env = getenv("L2L_DEVICE");
  if (env != NULL && strcmp(env, "cpu") == 0) return NULL;
  for (int i = 0; i < ACCELERATORS; i++)
    if (accelerators[i].probe(NULL, 0)) return accelerators[i].device;
  return NULL;
}

/* Registering costs nothing at load: the probe waits for the first use of the device. */
__attribute__((constructor)) static void register_chooser(void) {
  device_set_chooser(first_choice);
}

static const struct accelerator *serving(void) {
  const struct device_ops *device = core_device();
  for (int i = 0; device != NULL && i < ACCELERATORS; i++)
    if (accelerators[i].device == device) return &accelerators[i];
  return NULL;
}

const struct backend_ops *backend_device_base(void) {
  const struct accelerator *a = serving();
  return a != NULL ? a->ops() : &cpu_backend;
}

const struct backend_ops *backend_for(l2l_pool_kind pool) {
  cpu_runtime_init();
  return pool == L2L_POOL_DEVICE ? profile_wrap(backend_device_base())
                                 : &cpu_backend;
}

/* The device pool is its own domain even on the CPU backend, so that host/device mixing
   is refused exactly as it is with a GPU. */
int backend_pool_domain(l2l_pool_kind pool) { return pool == L2L_POOL_DEVICE ? 1 : 0; }

bool backend_device_is_host(void) { return core_device() == NULL; }

const char *l2l_device_backend(void) {
  const struct accelerator *a = serving();
  return a != NULL ? a->name : "cpu";
}

l2l_status l2l_device_use(const char *backend) {
  if (backend == NULL) return FAIL(L2L_ERR_INVALID, "backend is NULL (want \"cpu\" or \"cuda\")");
  if (strcmp(backend, "cpu") == 0) return device_switch(NULL, backend);
  for (int i = 0; i < ACCELERATORS; i++) {
    if (strcmp(backend, accelerators[i].name) != 0) continue;
    char why[256];
    if (!accelerators[i].probe(why, sizeof why))
      return FAIL(L2L_ERR_UNSUPPORTED, "cannot use CUDA: %s", why);
    return device_switch(accelerators[i].device, backend);
  }
  return FAIL(L2L_ERR_INVALID, "backend must be \"cpu\" or \"cuda\", got \"%s\"", backend);
}
