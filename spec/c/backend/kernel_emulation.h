/* SPDX-License-Identifier: MIT */
/* kernel_emulation.h — what a kernel file of kernels/ needs to compile for the CPU and run
 * there: a fiber per GPU thread, blocks one after another, CUDA's names given the host's
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
 * 227 KiB of opt-in shared memory). K_LAUNCH runs a whole grid before it returns.
 * The GPU threads are fibers on the launching thread, each run until it waits, in an order
 * drawn afresh each round from the test's generator: a barrier missing between two
 * threads' accesses to shared memory gives whichever of them runs first stale or poisoned
 * values; under make test TSAN=1, ThreadSanitizer checks every access against the
 * barriers. A round in which no thread moves is a deadlock (a __syncthreads some thread
 * never reaches hangs a GPU): the process ends with a message at once; a watchdog ends it
 * when no barrier completes for a minute (a thread that loops forever). What this cannot
 * show: the hardware's own arithmetic (no fused multiply-add here, f32 sums in program
 * order), timing, or what only a GPU's memory model allows (a write seen late by another
 * warp without a fence).
 * Must never: be included by the library, or before the CUDA headers it redefines names of.
 */
#ifndef L2L_KERNEL_EMULATION_H
#define L2L_KERNEL_EMULATION_H

#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#include <sanitizer/tsan_interface.h>
#endif

#include <boost/context/detail/fcontext.hpp>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* The running test's generator (spec/c/check.h). */
extern "C" uint64_t check_rand_u64(void);

namespace emu {

/* Barriers completed and threads ended, for the watchdog. */
inline std::atomic<uint64_t> progress{0};

[[noreturn]] inline void fail(const char *message);

/* ---------------------------------------------------------------- a GPU thread: a fiber
   A launch's GPU threads are fibers on the launching thread (Boost.Context's
   make_fcontext and jump_fcontext: a switch saves and loads a few registers, in
   nanoseconds, where an operating system's thread per GPU thread cost a futex wake and
   sleep at every barrier and shuffle, and glibc's swapcontext a system call a switch).
   One runs until it waits at a barrier, then the next runs. AddressSanitizer is told of
   every switch (its fake stacks and stack bounds follow the fiber), and so is
   ThreadSanitizer: each fiber is its own thread to it, a switch orders nothing, a barrier
   orders what its arrivals did before what its departures do (as on a GPU), and a
   thread's last switch all it did before what follows its launch. Between telling a
   sanitizer of a switch and making it, nothing but locals is touched. */
namespace fc = boost::context::detail;
struct Thread;
constexpr size_t kStackBytes = 512 * 1024;
struct Fiber {
  fc::fcontext_t context = nullptr; /* resumes it (the launcher's to touch) */
  fc::fcontext_t back = nullptr;    /* resumes the launcher (its own to touch) */
  unsigned char *stack = nullptr;   /* its lowest byte; kStackBytes */
  Thread *thread = nullptr;
  std::atomic<bool> done{false};
  bool started = false; /* (the launcher's to touch) */
  void *tsan = nullptr; /* ThreadSanitizer's fiber */
};

/* The launch being run: its fibers and the one running. */
struct Team {
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::atomic<Fiber *> running{nullptr};
  void (*body)(void *) = nullptr; /* what each fiber runs */
  void *body_argument = nullptr;
  std::atomic<uint64_t> changes{0}; /* arrivals at barriers and threads ended: a deadlock's test */
  const void *launcher_stack = nullptr; /* AddressSanitizer: the launching thread's stack */
  size_t launcher_stack_bytes = 0;
  void *launcher_tsan = nullptr;
};
inline Team *team = nullptr;
inline Fiber &running() { return *team->running.load(std::memory_order_relaxed); }

/* What a fiber runs on, kept from launch to launch: its stack (a mapping each, a guard page
   below it, its pages left mapped) and ThreadSanitizer's fiber (its creation and
   destruction map and unmap its history). */
struct Spare {
  unsigned char *stack;
  void *tsan;
};
struct Spares {
  std::vector<Spare> free;
  static size_t page() { return (size_t)sysconf(_SC_PAGESIZE); }
  Spare take() {
    Spare s;
    if (!free.empty()) {
      s = free.back();
      free.pop_back();
    } else {
      void *m = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) fail("could not map a GPU thread's stack");
      if (mprotect(m, page(), PROT_NONE) != 0) fail("could not protect a stack's guard page");
      s.stack = static_cast<unsigned char *>(m) + page();
      s.tsan = nullptr;
#if EMU_TSAN
      s.tsan = __tsan_create_fiber(0);
#endif
    }
#if EMU_ASAN
    __asan_unpoison_memory_region(s.stack, kStackBytes); /* (what its last fiber left poisoned) */
#endif
    return s;
  }
  ~Spares() {
    for (const Spare &s : free) {
      munmap(s.stack - page(), kStackBytes + page());
#if EMU_TSAN
      __tsan_destroy_fiber(s.tsan);
#endif
    }
  }
};
inline Spares spares;

#if EMU_ASAN
inline void asan_switching(void **fake_stack, const void *stack, size_t bytes) {
  __sanitizer_start_switch_fiber(fake_stack, stack, bytes);
}
inline void asan_switched(void *fake_stack, const void **old_stack, size_t *old_bytes) {
  __sanitizer_finish_switch_fiber(fake_stack, old_stack, old_bytes);
}
#else
inline void asan_switching(void **, const void *, size_t) {}
inline void asan_switched(void *, const void **, size_t *) {}
#endif
#if EMU_TSAN
inline void tsan_switching(void *fiber, bool orders) {
  __tsan_switch_to_fiber(fiber, orders ? 0 : __tsan_switch_to_fiber_no_sync);
}
inline void tsan_release(void *at) { __tsan_release(at); }
inline void tsan_acquire(void *at) { __tsan_acquire(at); }
#else
inline void tsan_switching(void *, bool) {}
inline void tsan_release(void *) {}
inline void tsan_acquire(void *) {}
#endif

/* From the launching thread to fiber f, until f waits or ends. */
inline void resume(Fiber &f) {
  team->running.store(&f, std::memory_order_relaxed);
  const fc::fcontext_t to = f.context;
  void *fake = nullptr, *const tsan = f.tsan;
  unsigned char *const stack = f.stack;
  const bool first = !f.started; /* (it orders what the launcher did before: the inputs) */
  f.started = true;
  tsan_switching(tsan, first);
  asan_switching(&fake, stack, kStackBytes);
  const fc::transfer_t from = fc::jump_fcontext(to, &f); /* (the fiber, for its start) */
  asan_switched(fake, nullptr, nullptr);
  f.context = from.fctx;
}

/* From the running fiber f back to the launching thread; `last`: f has ended (its fake
   stack goes; all it did is ordered before what the launcher does next). */
inline void suspend(Fiber &f, bool last) {
  const fc::fcontext_t to = f.back;
  void *fake = nullptr, *const tsan = team->launcher_tsan;
  const void *const stack = team->launcher_stack;
  const size_t bytes = team->launcher_stack_bytes;
  tsan_switching(tsan, last);
  asan_switching(last ? nullptr : &fake, stack, bytes);
  const fc::transfer_t from = fc::jump_fcontext(to, nullptr);
  asan_switched(fake, &team->launcher_stack, &team->launcher_stack_bytes);
  f.back = from.fctx;
}

/* Where every fiber starts: `from` is the launcher's context, its data the fiber. */
inline void fiber_main(fc::transfer_t from) {
  asan_switched(nullptr, &team->launcher_stack, &team->launcher_stack_bytes);
  Fiber &f = *static_cast<Fiber *>(from.data);
  f.back = from.fctx;
  team->body(team->body_argument);
  f.done.store(true, std::memory_order_relaxed);
  team->changes.fetch_add(1, std::memory_order_relaxed);
  progress.fetch_add(1, std::memory_order_relaxed);
  suspend(f, true);
  fail("an ended GPU thread resumed");
}

/* body(argument) run by `threads` fibers, each with *thread[i] as its own: each in turn
   until it waits, until all have ended. A round in which none arrived at a barrier nor
   ended is a deadlock: some barrier that a thread waits at is never reached by another. */
inline void run_fibers(int threads, Thread *const *thread, void (*body)(void *), void *argument) {
  if (team != nullptr) fail("a launch from inside a launch, or from two threads at once");
  Team t;
  t.body = body, t.body_argument = argument;
#if EMU_TSAN
  t.launcher_tsan = __tsan_get_current_fiber();
#endif
  team = &t;
  for (int i = 0; i < threads; i++) {
    std::unique_ptr<Fiber> f(new Fiber);
    f->thread = thread[i];
    const Spare spare = spares.take();
    f->stack = spare.stack, f->tsan = spare.tsan;
    f->context = fc::make_fcontext(f->stack + kStackBytes, kStackBytes, fiber_main);
    t.fibers.push_back(std::move(f));
  }
  /* each round in an order drawn afresh (from the test's generator: its seed replays it),
     so that a missing barrier between two threads shows whichever of them runs first */
  uint64_t draw = check_rand_u64();
  std::vector<Fiber *> order;
  for (;;) {
    const uint64_t before = t.changes.load(std::memory_order_relaxed);
    order.clear();
    for (auto &f : t.fibers)
      if (!f->done.load(std::memory_order_relaxed)) order.push_back(f.get());
    if (order.empty()) break;
    for (size_t i = order.size() - 1; i > 0; i--) {
      draw = draw * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(order[i], order[(size_t)((draw >> 33) % (i + 1))]);
    }
    for (Fiber *f : order) resume(*f);
    if (t.changes.load(std::memory_order_relaxed) == before)
      fail("deadlock: every GPU thread left waits at a barrier or warp collective that some "
           "other thread never reaches");
  }
  team = nullptr;
  for (auto &f : t.fibers) spares.free.push_back({f->stack, f->tsan});
}

/* A barrier of n fibers: each arrival waits until the n-th. */
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    const uint64_t g = generation_.load(std::memory_order_relaxed);
    tsan_release(&order_[g & 1]);
    team->changes.fetch_add(1, std::memory_order_relaxed);
    if (arrived_.fetch_add(1, std::memory_order_relaxed) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(g + 1, std::memory_order_relaxed);
      progress.fetch_add(1, std::memory_order_relaxed);
    } else {
      while (generation_.load(std::memory_order_relaxed) == g) suspend(running(), false);
    }
    /* (two places to order through, used in turn: a thread past this barrier may arrive at
       the next before a slower one leaves this one) */
    tsan_acquire(&order_[g & 1]);
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  char order_[2] = {0, 0};
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
/* The running GPU thread's own. */
inline Thread &self() { return *running().thread; }

inline uint3 thread_index() {
  const dim3 d = self().block->dim;
  const unsigned id = (unsigned)self().id;
  return make_uint3(id % d.x, id / d.x % d.y, id / (d.x * d.y));
}
inline uint3 block_index() { return make_uint3(self().block->index.x, self().block->index.y, self().block->index.z); }
inline dim3 grid_dim() { return self().block->grid; }
inline dim3 block_dim() { return self().block->dim; }
inline int lane() { return self().id & 31; }
/* The lanes of this thread's warp: 32, or fewer in a block's last warp. */
inline int warp_lanes() {
  const dim3 d = self().block->dim;
  const int rest = (int)(d.x * d.y * d.z) - (self().id & ~31);
  return rest < 32 ? rest : 32;
}
inline Warp &warp() { return *self().block->warps[self().id >> 5]; }
inline void syncthreads() { self().block->all.wait(); }
inline void syncwarp() { warp().meet.wait(); }
inline unsigned char *dynamic_shared() { return self().block->dynamic; }
inline int last_error() { return 0; }

/* The exchange of this lane's next collective, once every lane has posted to it: post(x)
   fills this lane's part, then the warp meets. */
template <typename Post>
inline Exchange &collective(Post post) {
  Warp &w = warp();
  Exchange &x = w.exchange[self().collectives++ & 1];
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
   one block after another by one team of fibers; `shared` bytes of dynamic shared memory,
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
  struct Launch {
    Block block;
    unsigned blocks;
    size_t shared;
    Fn *fn;
  } launch{Block(threads), grid.x * grid.y * grid.z, shared, &fn};
  launch.block.grid = grid, launch.block.dim = block, launch.block.dynamic = dynamic.get();
  std::vector<Thread> own(threads);
  std::vector<Thread *> of(threads);
  for (int t = 0; t < threads; t++) {
    own[t].id = t, own[t].block = &launch.block, own[t].lazy = lazy;
    of[t] = &own[t];
  }
  run_fibers(threads, of.data(), [](void *argument) {
    Launch &l = *static_cast<Launch *>(argument);
    Block &blk = l.block;
    for (unsigned b = 0; b < l.blocks; b++) {
      if (self().id == 0) {
        const dim3 g = blk.grid;
        blk.index = dim3(b % g.x, b / g.x % g.y, b / (g.x * g.y));
        memset(blk.dynamic, 0xff, l.shared);
        memset(static_shared_area, 0xff, kStaticSharedBytes);
      }
      blk.all.wait(); /* the block's index and poisoned memory, for every thread */
      (*l.fn)();
      if (!self().open.empty() || !self().groups.empty()) fail("a thread ended with copies not waited for");
      blk.all.wait(); /* the block is done before the next one is set up */
    }
  }, &launch);
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
