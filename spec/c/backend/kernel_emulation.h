/* SPDX-License-Identifier: MIT */
/* kernel_emulation.h — what a kernel file of kernels/ needs to compile for the CPU and run
 * there: a thread per GPU thread, blocks one after another, CUDA's names given the host's
 * meaning. For the C++ files of spec/c/backend/ that run a kernel file's source in make test
 * (*_emulated.cpp).
 *
 * Purpose: the GPU's kernels are written on machines without a GPU; their source, run here
 * against the CPU backend, shows a wrong index, bound, mask, reduction or barrier before a
 * lent GPU's few minutes do. A block's threads meet at __syncthreads (a barrier of them
 * all); a warp's lanes meet for each collective (a shuffle, a vote, or an instruction a
 * file emulates through emu::collective) and take what it gives their lane; atomics are
 * std::atomic_ref's read-modify-writes. Static shared arrays (K_STATIC_SHARED) take places
 * in one area and dynamic shared memory one buffer of exactly the launch's bytes, both
 * poisoned (0xff bytes: NaN as f32 and as 16-bit) before each block; past 48 KiB only to a
 * kernel whose limit cudaFuncSetAttribute raised first (as a GPU gives it; static shared
 * memory is not counted against that limit here). A warp collective here orders memory as
 * __syncwarp would (CUDA's shuffles do not): a missing __syncwarp between warp steps does
 * not show. A launcher asking about the device is told of a Hopper (compute capability 9,
 * 227 KiB of opt-in shared memory). K_LAUNCH runs a whole grid before it returns. A
 * watchdog ends the process with a message when no barrier completes for a minute (a
 * __syncthreads some thread never reaches hangs a GPU; here it fails the test). One team
 * of threads runs a launch's blocks in turn. What this cannot show: the hardware's own arithmetic (no fused multiply-add
 * here, f32 sums in program order), timing, or races that only real concurrency of a GPU
 * shows (ThreadSanitizer, under make test TSAN=1, checks the threads' accesses against the
 * barriers).
 * Must never: be included by the library, or before the CUDA headers it redefines names of.
 */
#ifndef L2L_KERNEL_EMULATION_H
#define L2L_KERNEL_EMULATION_H

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace emu {

/* Barriers completed, for the watchdog. */
inline std::atomic<uint64_t> progress{0};

/* A barrier of n threads (C++20's: a futex on an atomic). */
class Barrier {
 public:
  explicit Barrier(int n) : bar_(n) {}
  void wait() {
    bar_.arrive_and_wait();
    progress.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  std::barrier<> bar_;
};

/* What a warp's threads post for a collective: two exchanges, used in turn, so that one
   barrier a collective suffices (a lane posts to an exchange again only two collectives
   later, past a barrier that every lane reached after reading it). */
struct Exchange {
  const void *address[32];
  uint32_t a[32][4], b[32][2];
  uint64_t value[32]; /* a shuffled value's bytes */
};
struct Warp {
  explicit Warp(int lanes) : meet(lanes) {}
  Barrier meet;
  Exchange exchange[2];
};

struct Block {
  explicit Block(int threads) : all(threads) {
    for (int first = 0; first < threads; first += 32) /* the last one short at times */
      warps.emplace_back(new Warp(threads - first < 32 ? threads - first : 32));
  }
  Barrier all;
  std::vector<std::unique_ptr<Warp>> warps;
  dim3 index, grid, dim;
  unsigned char *dynamic = nullptr;
};

/* Ends the process with a message (once, whichever thread calls first). */
[[noreturn]] inline void fail(const char *message) {
  static std::atomic_flag once = ATOMIC_FLAG_INIT;
  if (!once.test_and_set()) {
    fprintf(stderr, "kernel emulation: %s\n", message);
    fflush(stderr);
  }
  _exit(1);
}

/* Static __shared__ arrays (K_STATIC_SHARED): one area, each declaration's place in it
   taken at its first use, poisoned before each block as dynamic shared memory is. */
constexpr size_t kStaticSharedBytes = 48 * 1024;
alignas(256) inline unsigned char static_shared_area[kStaticSharedBytes];
inline std::atomic<size_t> static_shared_used{0};
inline unsigned char *static_shared(size_t bytes) {
  const size_t at = static_shared_used.fetch_add((bytes + 15) / 16 * 16);
  if (at + bytes > kStaticSharedBytes) fail("static shared arrays past 48 KiB");
  return static_shared_area + at;
}

/* A cp.async copy (the files that emulate it land it at issue or at its wait). */
struct Copy {
  void *dst;
  const void *src;
  bool valid;
};

struct Thread {
  int id = 0;
  unsigned collectives = 0; /* this lane's, for the exchange's turn */
  Block *block = nullptr;
  bool lazy = false;                     /* cp.async copies land at their wait */
  std::vector<Copy> open;                /* issued, not yet committed */
  std::vector<std::vector<Copy>> groups; /* committed, oldest first */
};
inline thread_local Thread self;

inline uint3 thread_index() {
  const dim3 d = self.block->dim;
  const unsigned id = (unsigned)self.id;
  return make_uint3(id % d.x, id / d.x % d.y, id / (d.x * d.y));
}
inline uint3 block_index() { return make_uint3(self.block->index.x, self.block->index.y, self.block->index.z); }
inline dim3 grid_dim() { return self.block->grid; }
inline dim3 block_dim() { return self.block->dim; }
inline int lane() { return self.id & 31; }
/* The lanes of this thread's warp: 32, or fewer in a block's last warp. */
inline int warp_lanes() {
  const dim3 d = self.block->dim;
  const int rest = (int)(d.x * d.y * d.z) - (self.id & ~31);
  return rest < 32 ? rest : 32;
}
inline Warp &warp() { return *self.block->warps[self.id >> 5]; }
inline void syncthreads() { self.block->all.wait(); }
inline void syncwarp() { warp().meet.wait(); }
inline unsigned char *dynamic_shared() { return self.block->dynamic; }
inline int last_error() { return 0; }

/* The exchange of this lane's next collective, once every lane has posted to it: post(x)
   fills this lane's part, then the warp meets. */
template <typename Post>
inline Exchange &collective(Post post) {
  Warp &w = warp();
  Exchange &x = w.exchange[self.collectives++ & 1];
  post(x);
  w.meet.wait();
  return x;
}

template <typename T>
inline T shfl_xor(T v, int offset) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
  const Exchange &x = collective([&](Exchange &e) { memcpy(&e.value[lane()], &v, sizeof v); });
  if ((lane() ^ offset) >= warp_lanes()) fail("a shuffle from a lane past a short warp's end");
  T r;
  memcpy(&r, &x.value[lane() ^ offset], sizeof r);
  return r;
}

/* __ballot_sync: bit l set where lane l's predicate holds (the lanes of a short warp). */
inline unsigned ballot(bool predicate) {
  const Exchange &x = collective([&](Exchange &e) { e.value[lane()] = predicate; });
  unsigned bits = 0;
  for (int l = 0; l < warp_lanes(); l++) bits |= (x.value[l] ? 1u : 0u) << l;
  return bits;
}

/* Atomics, as the GPU's: a read-modify-write no other thread's splits. */
inline unsigned long long atomic_min(unsigned long long *p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline float atomic_add(float *p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

/* Watches `progress` while a grid runs: a minute without a barrier completing ends the
   process with a message. */
class Watchdog {
 public:
  Watchdog() : thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    uint64_t seen = progress.load();
    auto since = std::chrono::steady_clock::now();
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) {
      const uint64_t now = progress.load();
      if (now != seen) {
        seen = now, since = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - since > std::chrono::seconds(60)) {
        fail("no barrier completed for a minute (a __syncthreads or warp collective some "
             "thread never reaches)");
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/* fn() run by every thread of every block of a grid (threads a block a multiple of 32),
   one block after another by one team of threads; `shared` bytes of dynamic shared memory,
   poisoned before each block. `lazy`: the threads' cp.async copies land at their wait. */
template <class Fn>
void run_grid(dim3 grid, dim3 block, size_t shared, bool lazy, Fn fn) {
  const int threads = (int)(block.x * block.y * block.z);
  if (threads <= 0 || threads > 1024) fail("a block's threads: 1 to 1024");
  Watchdog watchdog;
  /* exactly `shared` bytes (a sanitizer sees a read past them), 256-byte aligned */
  std::unique_ptr<unsigned char, void (*)(unsigned char *)> dynamic(
      static_cast<unsigned char *>(::operator new(shared > 0 ? shared : 1, std::align_val_t(256))),
      [](unsigned char *p) { ::operator delete(p, std::align_val_t(256)); });
  unsigned char *base = dynamic.get();
  const unsigned blocks = grid.x * grid.y * grid.z;
  Block blk(threads);
  blk.grid = grid, blk.dim = block, blk.dynamic = base;
  std::vector<std::thread> team;
  for (int t = 0; t < threads; t++)
    try {
      team.emplace_back([&, t] {
      self = Thread();
      self.id = t, self.block = &blk, self.lazy = lazy;
      for (unsigned b = 0; b < blocks; b++) {
        if (t == 0) {
          blk.index = dim3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
          memset(base, 0xff, shared);
          memset(static_shared_area, 0xff, kStaticSharedBytes);
        }
        blk.all.wait(); /* the block's index and poisoned memory, for every thread */
        fn();
        if (!self.open.empty() || !self.groups.empty()) fail("a thread ended with copies not waited for");
        blk.all.wait(); /* the block is done before the next one is set up */
      }
      });
    } catch (const std::system_error &) {
      fail("could not start a thread for every GPU thread of a block (a process limit?)");
    }
  for (std::thread &th : team) th.join();
}

/* Dynamic shared memory past 48 KiB, as a GPU gives it: only to a kernel whose limit
   cudaFuncSetAttribute raised first, and at most Hopper's opt-in limit (227 KiB). */
constexpr size_t kSharedDefault = 48 * 1024, kSharedOptIn = 227 * 1024;
inline std::mutex shared_limits_mutex;
inline std::map<const void *, size_t> shared_limits;
inline cudaError_t set_attribute(const void *kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) fail("an attribute not emulated");
  if (value < 0 || (size_t)value > kSharedOptIn) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(shared_limits_mutex);
  shared_limits[kernel] = (size_t)value;
  return cudaSuccess;
}
inline void check_shared(const void *kernel, size_t shared) {
  if (shared <= kSharedDefault) return;
  std::lock_guard<std::mutex> lock(shared_limits_mutex);
  const auto limit = shared_limits.find(kernel);
  if (limit == shared_limits.end() || shared > limit->second)
    fail("a launch's dynamic shared memory past 48 KiB, beyond what cudaFuncSetAttribute "
         "allowed its kernel");
}

/* The device a launcher asks about: compute capability 9 (Hopper) with its opt-in shared
   memory, and every kernel compiled for it (PTX 9.0). */
inline cudaError_t device_attribute(int *value, cudaDeviceAttr attribute) {
  if (attribute == cudaDevAttrComputeCapabilityMajor)
    *value = 9;
  else if (attribute == cudaDevAttrMaxSharedMemoryPerBlockOptin)
    *value = (int)kSharedOptIn;
  else
    fail("a device attribute not emulated");
  return cudaSuccess;
}
inline cudaError_t function_attributes(cudaFuncAttributes *attributes) {
  memset(attributes, 0, sizeof *attributes);
  attributes->ptxVersion = attributes->binaryVersion = 90;
  return cudaSuccess;
}

/* Whether the launches that follow land their threads' cp.async copies only at the wait
   that covers them (else at their issue); a test sets it between launches. */
inline bool lazy_copies = false;

/* K_LAUNCH's: kernel(args...) over the grid, before it returns; the arguments converted to
   the kernel's parameters first, as a launch converts them (NULL to a pointer). */
template <class Kernel>
struct Launcher;
template <class... Params>
struct Launcher<void (*)(Params...)> {
  dim3 grid, block;
  size_t shared;
  void (*kernel)(Params...);
  void operator()(Params... args) const {
    check_shared(reinterpret_cast<const void *>(kernel), shared);
    run_grid(grid, block, shared, lazy_copies, [&] { kernel(args...); });
  }
};
template <class Kernel>
Launcher<Kernel> launcher(dim3 grid, dim3 block, size_t shared, cudaStream_t stream, Kernel kernel) {
  (void)stream; /* (one stream: a grid runs whole before its launch returns) */
  return {grid, block, shared, kernel};
}

} /* namespace emu */

/* ---------------------------------------------------------------- CUDA's names, the host's */

#undef __global__
#define __global__
#undef __shared__
#define __shared__ static_shared_arrays_are_declared_with_K_STATIC_SHARED
#undef __launch_bounds__
#define __launch_bounds__(...)
#define threadIdx (emu::thread_index())
#define blockIdx (emu::block_index())
#define gridDim (emu::grid_dim())
#define blockDim (emu::block_dim())
#define __syncthreads() emu::syncthreads()
#define __syncwarp(...) emu::syncwarp()
#define __shfl_xor_sync(mask, v, offset) emu::shfl_xor((v), (offset))
#define __ballot_sync(mask, predicate) emu::ballot(predicate)
#define __any_sync(mask, predicate) (emu::ballot(predicate) != 0u)
#define atomicMin(p, v) emu::atomic_min((p), (v))
#define atomicAdd(p, v) emu::atomic_add((p), (v))
#define cudaGetLastError() emu::last_error()
#define cudaMemcpyAsync(dst, src, bytes, kind, stream) (memmove((dst), (src), (bytes)), cudaSuccess)
#define cudaGetDevice(device) (*(device) = 0, cudaSuccess)
#define cudaDeviceGetAttribute(value, attribute, device) emu::device_attribute((value), (attribute))
#define cudaFuncGetAttributes(attributes, ...) emu::function_attributes(attributes)
#define cudaFuncSetAttribute(kernel, attribute, value) \
  emu::set_attribute(reinterpret_cast<const void *>(kernel), (attribute), (value))
#define K_LAUNCH(grid, block, shared, stream, ...) \
  emu::launcher(dim3(grid), dim3(block), (size_t)(shared), (stream), __VA_ARGS__)
#define K_DYNAMIC_SHARED(type, name) type *const name = reinterpret_cast<type *>(emu::dynamic_shared())
#define K_STATIC_SHARED(type, name, dims)                                                  \
  static unsigned char *const name##_at = emu::static_shared(sizeof(type dims));          \
  type(&name) dims = *reinterpret_cast<type(*) dims>(name##_at)

static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((uint64_t)a * (uint64_t)b) >> 32);
}
template <typename T>
static inline T __ldg(const T *p) {
  return *p;
}
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline double __longlong_as_double(long long x) {
  double d;
  memcpy(&d, &x, sizeof d);
  return d;
}
static inline float __fadd_rn(float a, float b) { return a + b; }

#endif /* L2L_KERNEL_EMULATION_H */
