# SPDX-License-Identifier: MIT
# Makefile — builds libl2l (shared and static), the l2l executable, the C tests and the
# benchmarks, runs them, installs them and builds the documentation. The two commands a
# user needs: `make demo` and `make test`. Targets that need system packages first run
# scripts/deps.sh, which installs what is missing. Knobs: SANITIZE=1 (AddressSanitizer +
# UBSan build in build-san/), TSAN=1 (ThreadSanitizer build in build-tsan/; `make test
# TSAN=1` runs the threaded parts' tests: scripts/test.sh), ARCH=<gcc -march> (default native: l2l is built where it
# runs; ARCH=x86-64-v3, or any other, for a binary that runs on other machines; ARCH= for
# the compiler's own default), NO_CUDA=1, CUDA_ARCH="80 90", L2L_THREADS=<n>.
# The caller's CFLAGS, CPPFLAGS and LDFLAGS (for a package, `dpkg-buildflags`) are used as
# given: l2l's own flags (language, OpenMP, -march, warnings) come first and the caller's
# after them, so theirs win; CFLAGS defaults to -O3 -g. EXTRA_CFLAGS adds to either.
# `make install` / `make uninstall` honour DESTDIR, PREFIX (default /usr/local), BINDIR,
# LIBDIR, INCLUDEDIR, MANDIR, LUADIR and PKGCONFIGDIR; `make doc` builds the man page and
# the Lua and C references into $(BUILD)/doc.
# `make fuzz N=20000 SEED=s` runs the loader fuzzer (scripts/fuzz_load.lua; N defaults to
# 1000, the seed to a fresh one). `make flakes N=20 LOADED=3 SANITIZED=3 THREADED=3` runs
# `make test` N times with fresh seeds, LOADED times on a machine kept busy, SANITIZED times
# under the sanitizers and THREADED times under TSan, and lists every assertion that failed
# with its seed and replay command, and the comparisons that came nearest their tolerances
# (scripts/flakes.sh; N defaults to 20 there too). `make gpu-deps` fills .gpudeps/ with the
# Debian packages a lent GPU machine lacks (scripts/gpu-deps.sh; scripts/gpu-check.sh is
# the check that machine runs).

# Every core builds (and `make test` builds first) unless the command line's -j says
# otherwise: a -j given there wins over this one. A make run from within make (a spec's)
# takes its parent's jobs instead.
ifeq ($(MAKELEVEL),0)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

SANITIZE ?= 0
TSAN ?= 0
ARCH ?= native
ifeq ($(SANITIZE),1)
  BUILD ?= build-san
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
  SANDEFS := -DL2L_SANITIZE
  OPT := -O1
else ifeq ($(TSAN),1)
  # ThreadSanitizer: the system allocator (as under ASan), and the threaded parts' tests
  # only (scripts/test.sh), with one OpenMP thread: libgomp is not built for TSan, so its
  # barriers would read as races; l2l's own threads (copy threads, EPS workers, the MPI
  # thread, callers' threads) are what is checked.
  BUILD ?= build-tsan
  SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
  SANDEFS := -DL2L_SANITIZE -DL2L_TSAN
  OPT := -O1
else
  BUILD ?= build
  SANFLAGS :=
  SANDEFS :=
  OPT := -O3
endif

# The version is l2l_version()'s, read from its one definition (src/core/version.c), so
# that the library's file name, its soname and pkg-config's Version can never disagree
# with what it reports.
VERSION := $(shell sed -n 's/^const char \*l2l_version(void) { return "\([0-9]*\.[0-9]*\.[0-9]*\)"; }$$/\1/p' src/core/version.c)
ifneq ($(words $(VERSION)),1)
  $(error cannot read the version from l2l_version() in src/core/version.c (found '$(VERSION)'))
endif
SOVERSION := $(firstword $(subst ., ,$(VERSION)))
SONAME := libl2l.so.$(SOVERSION)

CC ?= cc
CFLAGS ?= $(OPT) -g
LUAJIT_CFLAGS := -I/usr/include/luajit-2.1
# -ffp-contract=fast: -std=c11 would otherwise forbid fused multiply-add (2x on GELU);
# -fno-math-errno lets sqrtf vectorize; 512-bit vectors pay off where AVX-512 exists.
L2L_CFLAGS := -std=c11 -D_GNU_SOURCE $(SANDEFS) $(if $(ARCH),-march=$(ARCH)) -fPIC -fopenmp \
              -fno-math-errno -fno-trapping-math -ffp-contract=fast -mprefer-vector-width=512 \
              -Wall -Wextra -Wshadow -Wstrict-prototypes -Iinclude -Isrc $(SANFLAGS)
COMPILE = $(CC) $(L2L_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(EXTRA_CFLAGS)
L2L_LDFLAGS := -fopenmp $(SANFLAGS)
LINK = $(CC) $(L2L_LDFLAGS) $(LDFLAGS)
# OpenBLAS's OpenMP build (Debian's libopenblas0-openmp), not the default pthread one: with
# one OpenMP thread pool for BLAS and l2l's loops, neither spins on the cores the other
# needs (with both pools, a tiny model ran 11x slower on 2 threads than on 1), and BLAS
# called inside an OpenMP region runs single-threaded by itself. BLAS_DIR is that build's
# folder (scripts/gpu-host.sh points it at packages unpacked where none can be installed).
# The library in $(BUILD) and the programs there find it through a RUNPATH; an installed
# libl2l has none (a system folder must not be one) and gets the libopenblas.so.0 that
# Debian's alternatives choose: `make install` says how to choose the OpenMP one.
BLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS := -L$(BLAS_DIR) -l:libopenblas.so.0
BLAS_RPATH := -Wl,-rpath,$(BLAS_DIR)
# xxHash (Debian's libxxhash-dev, which scripts/deps.sh installs): the XXH3-64 checksum of
# each region of a spill file (src/eps/spill.c), and of each tensor of a checkpoint
# (src/core/safetensors.c). jansson (libjansson-dev): the JSON of a safetensors header and
# of a checkpoint's description, read and written in C.
LIB_LIBS := $(BLAS_LIBS) -ljemalloc -lxxhash -ljansson -lm -lpthread
# The spill file's I/O goes through io_uring where liburing is found (scripts/deps.sh
# installs it; NO_LIBURING=1 leaves it out): without it, and wherever the kernel refuses
# io_uring, a pool of pread/pwrite threads serves (src/eps/spill.c).
ifneq ($(NO_LIBURING),1)
  HAVE_LIBURING := $(shell printf '\#include <liburing.h>\n' | $(CC) $(CPPFLAGS) -E -x c - >/dev/null 2>&1 && echo 1)
endif
ifeq ($(HAVE_LIBURING),1)
  LIB_LIBS += -luring
  $(BUILD)/obj/eps/spill.o: L2L_CFLAGS += -DL2L_LIBURING
endif
# The 8-bit codes round each operation on its own (no FMA contraction), as the code's rule
# (kernels/state_code.h) does on the GPU with _rn intrinsics: the host's paths (its vector
# intrinsics are contracted like any product otherwise) and the GPU's pick alike; it
# includes that rule from kernels/ (-I., as the CUDA backend's files do).
$(BUILD)/obj/backend/state_codes.o: L2L_CFLAGS += -ffp-contract=off -I.
# The host kernels work out the GPU update's constants (kernels/optim.h's struct k_optim).
$(BUILD)/obj/backend/optim_kernels.o: L2L_CFLAGS += -I.
# The executable and the examples link libl2l.so from their own folder (the C tests and
# the bench programs link libl2l.a: see WHOLE_LIB).
RPATH := -Wl,-rpath,'$$ORIGIN' -Wl,--no-as-needed

# The CUDA backend is built wherever nvcc is found (a GPU is only needed to run it);
# NO_CUDA=1 leaves it out, and so does the sanitizer build (AddressSanitizer and the CUDA
# runtime do not mix). A CPU-only build is complete. CUDA_ARCH lists the GPU generations
# to build machine code for; PTX for the last one lets newer GPUs compile it at load.
ifneq ($(SANITIZE)$(TSAN),00)
  NO_CUDA := 1
endif
ifneq ($(NO_CUDA),1)
  NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
endif
CUDA_ARCH ?= 80 90
ifneq ($(NVCC),)
  CUDA_HOME ?= $(realpath $(dir $(realpath $(NVCC)))..)
  ifeq ($(wildcard $(CUDA_HOME)/include/cublas_v2.h),)
    NVCC :=   # a toolkit without cuBLAS: no CUDA backend (scripts/deps.sh says so)
  endif
endif
ifneq ($(NVCC),)
  NVCC_FLAGS := -std=c++17 -O3 -g -lineinfo -Xcompiler -fPIC,-Wall,-Wextra,-fvisibility=hidden \
                -Ikernels -Isrc \
                $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH)) \
                $(EXTRA_NVCC_FLAGS)
  KERNEL_OBJ := $(patsubst kernels/%.cu,$(BUILD)/kernels/%.o,$(wildcard kernels/*.cu))
  # cuBLAS is opened at run time (src/backend/cuda/runtime.c says why), from the toolkit's
  # folder. The kernels' objects are C++: a program linking libl2l.a needs libstdc++ (l2l.pc
  # says so). An installed libl2l finds the CUDA runtime through the loader's own paths (the
  # toolkit's /etc/ld.so.conf.d entry), not a RUNPATH.
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart -ldl -lstdc++
  # libstdc++ ahead of jemalloc among libl2l.so's own libraries: Debian's jemalloc exports
  # operator new and delete too, and in a program that does not link jemalloc itself (a C
  # program on libl2l.so) C++ code would then take jemalloc's new beside glibc's free:
  # cuDNN's loading frees one with the other and aborts ("free(): invalid pointer").
  CXX_FIRST := -lstdc++
  CUDA_RPATH := -Wl,-rpath,$(CUDA_HOME)/lib64
  # Where a program linking the installable library finds the CUDA runtime it needs, at
  # link time only (no RUNPATH is written): a toolkit without an ld.so.conf entry.
  CUDA_LINK_PATH := -Wl,-rpath-link,$(CUDA_HOME)/lib64
  $(BUILD)/obj/backend/cuda/%.o: L2L_CFLAGS += -DL2L_CUDA -I$(CUDA_HOME)/include -I. \
                                              -DL2L_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
  # cuDNN is opened at run time too (src/backend/cuda/cudnn_load.c); its headers, from the
  # toolkit or else from PyTorch's wheel (nvidia/cudnn/include), let the attention use it
  # (without them the build says so and the own kernels run every attention call).
  CUDNN_INCLUDE ?= $(firstword $(patsubst %/cudnn_graph.h,%,$(wildcard $(CUDA_HOME)/include/cudnn_graph.h \
                     /usr/lib/python3*/*-packages/nvidia/cudnn/include/cudnn_graph.h \
                     /usr/local/lib/python3*/*-packages/nvidia/cudnn/include/cudnn_graph.h \
                     $(HOME)/.local/lib/python3*/site-packages/nvidia/cudnn/include/cudnn_graph.h)))
  ifneq ($(CUDNN_INCLUDE),)
    $(BUILD)/obj/backend/cuda/%.o: L2L_CFLAGS += -DL2L_CUDNN_HEADERS -I$(CUDNN_INCLUDE)
  endif
endif

# One source list per part (src/<part>/, see README.md's layout); the parts build the
# library together. src/runner/ is the l2l executable.
# The public header: include/l2l.h, which a program includes, and its parts in include/l2l/,
# which it includes (the parts' own headers are src/<part>/<part>.h: no two share a name).
PUBLIC_HEADERS := include/l2l.h $(sort $(wildcard include/l2l/*.h))
CORE_SRC := $(wildcard src/core/*.c)
BACKEND_SRC := $(wildcard src/backend/*.c src/backend/cpu/*.c src/backend/cuda/*.c)
LAYERS_SRC := $(wildcard src/layers/*.c)
EPS_SRC := $(wildcard src/eps/*.c)
ORDER_SRC := $(wildcard src/order/*.c)
PLAN_SRC := $(wildcard src/plan/*.c)
RELAY_SRC := $(wildcard src/relay/*.c)
# src/cluster/mpi_plugin.c, the one file that includes mpi.h, is the MPI plugin (below),
# not libl2l.
CLUSTER_SRC := $(filter-out src/cluster/mpi_plugin.c,$(wildcard src/cluster/*.c))
LIB_SRC := $(CORE_SRC) $(BACKEND_SRC) $(LAYERS_SRC) $(CLUSTER_SRC) $(EPS_SRC) $(ORDER_SRC) $(PLAN_SRC) $(RELAY_SRC)
LIB_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o) $(KERNEL_OBJ)
# The l2l executable (src/runner/): main.c and the module its training loops stop through.
RUNNER_OBJ := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(wildcard src/runner/*.c))
# spec/c/ mirrors src/: a folder of tests per part (spec/c/api: the public header's misuse),
# with the harness and the float64 references shared at its top.
CTEST_SRC := $(wildcard spec/c/*.c spec/c/*/*.c)
# The C++ files beside them (spec/c/backend/*_emulated.cpp) compile a kernel file of
# kernels/ for the CPU, with the CUDA toolkit's headers (found even where NO_CUDA leaves the
# backend out: the sanitizer builds run the kernels' source too) and
# spec/c/backend/kernel_emulation.h; without those headers L2L_KERNEL_EMULATION is not
# defined, they compile to nothing and the tests that use them skip, saying why.
CTEST_CXX_SRC := $(wildcard spec/c/*/*.cpp)
CTEST_OBJ := $(CTEST_SRC:spec/c/%.c=$(BUILD)/ctest/%.o) $(CTEST_CXX_SRC:spec/c/%.cpp=$(BUILD)/ctest/%.o)
# (and Boost.Context, whose fibers run a block's GPU threads, with a C++20 compiler: g++ 11 on)
EMU_CUDA_INCLUDE := $(firstword $(patsubst %/cuda_bf16.h,%,$(wildcard $(CUDA_HOME)/include/cuda_bf16.h \
                      $(dir $(realpath $(shell command -v nvcc 2>/dev/null)))../include/cuda_bf16.h \
                      /usr/local/cuda/include/cuda_bf16.h)))
EMU_FIBERS := $(shell printf '\#include <boost/context/detail/fcontext.hpp>\n' | $(CXX) -std=c++20 -E -x c++ - >/dev/null 2>&1 && echo 1)
EMU_FLAGS := $(if $(and $(EMU_CUDA_INCLUDE),$(EMU_FIBERS)),-DL2L_KERNEL_EMULATION=1 -I.)
EMU_LIBS := $(if $(EMU_FLAGS),-lboost_context)
DEPS_STAMP := $(BUILD)/.deps-ok
# What `make install` copies: the library and l2l linked again without the build tree's
# RUNPATHs (the same objects), in $(DIST).
DIST := $(BUILD)/dist

# Data parallel: the MPI plugin libl2l-mpi.so, built wherever mpicc is found (NO_MPI=1
# leaves it out), beside libl2l, which opens it only when a program asks for MPI; a build
# without it is complete, and asking for MPI there says why it cannot.
ifneq ($(NO_MPI),1)
  MPICC ?= $(shell command -v mpicc 2>/dev/null)
endif
ifneq ($(MPICC),)
  MPI_PLUGIN := $(BUILD)/libl2l-mpi.so
endif

.PHONY: all deps test demo bench vecreport clean fuzz flakes install uninstall doc gpu-deps help archcheck
all: $(BUILD)/libl2l.so $(BUILD)/libl2l.a $(BUILD)/l2l $(BUILD)/l2l_ctest $(BUILD)/hello \
     $(BUILD)/embed $(BUILD)/resume $(BUILD)/embed_lua $(DIST)/libl2l.so.$(VERSION) $(DIST)/l2l \
     lua/l2l/cdef.lua $(MPI_PLUGIN)

# The packages come before anything is decided: what scripts/deps.sh installs (mpicc)
# chooses what this Makefile builds, and make reads that while it parses. The stamp, an
# empty file, is included as a makefile, so that make makes it first and then reads the
# Makefile again with the new tools present (on a fresh machine, the first `make test`
# would otherwise build without the MPI plugin that its install spec then asks for).
deps: $(DEPS_STAMP)
$(DEPS_STAMP): scripts/deps.sh
	@bash scripts/deps.sh
	@mkdir -p $(BUILD) && touch $@
ifeq ($(filter clean uninstall gpu-deps,$(MAKECMDGOALS)),)
  include $(DEPS_STAMP)
endif

# The library's objects: hidden visibility, so that libl2l.so exports exactly the functions
# include/l2l.h marks L2L_API (spec/project/exports_spec.lua holds it to that). Programs that test or
# time the parts from inside link libl2l.a, where every function is within reach.
$(BUILD)/obj/%.o: src/%.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(COMPILE) -fvisibility=hidden -MMD -MP -c $< -o $@

# mpicc gives mpi.h's folder and libmpi; the plugin links nothing of libl2l.
$(BUILD)/libl2l-mpi.so: src/cluster/mpi_plugin.c src/cluster/cluster.h src/core/core.h $(PUBLIC_HEADERS) | $(DEPS_STAMP)
	$(COMPILE) -shared $< -o $@ $(shell $(MPICC) --showme:compile) $(shell $(MPICC) --showme:link) $(L2L_LDFLAGS) $(LDFLAGS)

$(BUILD)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.cuh kernels/*.h) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

# libl2l.so.$(VERSION), with the soname libl2l.so.$(SOVERSION) and the two links a
# library has: the soname's (what programs load) and libl2l.so (what -ll2l finds).
$(BUILD)/libl2l.so.$(VERSION): $(LIB_OBJ)
	$(LINK) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(CXX_FIRST) $(LIB_LIBS) $(CUDA_LIBS) $(BLAS_RPATH) $(CUDA_RPATH)
$(BUILD)/$(SONAME) $(BUILD)/libl2l.so: $(BUILD)/libl2l.so.$(VERSION)
	ln -sfn $(notdir $<) $@

$(BUILD)/libl2l.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/runner/%.o: src/runner/%.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(COMPILE) $(LUAJIT_CFLAGS) -MMD -MP -c $< -o $@

L2L_EXE_LIBS := -lluajit-5.1 -ledit -ljemalloc -lm -ldl
$(BUILD)/l2l: $(RUNNER_OBJ) $(BUILD)/libl2l.so $(BUILD)/$(SONAME)
	$(LINK) -o $@ $(RUNNER_OBJ) $(RPATH) -L$(BUILD) -ll2l $(L2L_EXE_LIBS)

$(DIST)/libl2l.so.$(VERSION): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(LINK) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(CXX_FIRST) $(LIB_LIBS) $(CUDA_LIBS)
$(DIST)/l2l: $(RUNNER_OBJ) $(DIST)/libl2l.so.$(VERSION)
	$(LINK) -o $@ $(RUNNER_OBJ) -Wl,--no-as-needed $(DIST)/libl2l.so.$(VERSION) $(L2L_EXE_LIBS) $(CUDA_LINK_PATH)

$(BUILD)/ctest/%.o: spec/c/%.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(COMPILE) -Ispec/c $(EMU_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/ctest/%.o: spec/c/%.cpp | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 -O2 -g -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas -pthread $(SANFLAGS) $(SANDEFS) \
	  -Ispec/c -Ikernels $(EMU_FLAGS) $(if $(EMU_CUDA_INCLUDE),-I$(EMU_CUDA_INCLUDE)) -MMD -MP -c $< -o $@

# The whole archive: the test program holds what libl2l.so holds (the backend registers
# its chooser from a constructor), with the parts' internal functions callable.
WHOLE_LIB = -Wl,--whole-archive $(BUILD)/libl2l.a -Wl,--no-whole-archive $(LIB_LIBS) $(CUDA_LIBS) \
            $(BLAS_RPATH) $(CUDA_RPATH)
$(BUILD)/l2l_ctest: $(CTEST_OBJ) $(BUILD)/libl2l.a
	$(LINK) -o $@ $(CTEST_OBJ) $(WHOLE_LIB) $(EMU_LIBS) -lstdc++

# The C examples, built as a user would build them (only l2l.h, -ll2l and LuaJIT).
EXAMPLE_CC = $(CC) -std=c11 -Wall -Wextra $(SANFLAGS) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -Iinclude
$(BUILD)/hello: examples/hello.c $(PUBLIC_HEADERS) $(BUILD)/libl2l.so $(BUILD)/$(SONAME)
	$(EXAMPLE_CC) -o $@ $< $(RPATH) -L$(BUILD) -ll2l
$(BUILD)/embed: examples/embed.c $(PUBLIC_HEADERS) $(BUILD)/libl2l.so $(BUILD)/$(SONAME)
	$(EXAMPLE_CC) -o $@ $< $(RPATH) -L$(BUILD) -ll2l
$(BUILD)/resume: examples/resume.c $(PUBLIC_HEADERS) $(BUILD)/libl2l.so $(BUILD)/$(SONAME)
	$(EXAMPLE_CC) -o $@ $< $(RPATH) -L$(BUILD) -ll2l
# embed_lua finds this checkout's lua/ through a path compiled in (the environment
# variable L2L_LUA_DIR overrides it).
$(BUILD)/embed_lua: examples/embed_lua.c $(PUBLIC_HEADERS) $(BUILD)/libl2l.so $(BUILD)/$(SONAME)
	$(EXAMPLE_CC) $(LUAJIT_CFLAGS) -DL2L_LUA_DIR='"$(CURDIR)/lua"' \
	  -o $@ $< $(RPATH) -L$(BUILD) -ll2l -lluajit-5.1

# The FFI declarations are generated from the public header (and checked by a spec).
lua/l2l/cdef.lua: $(PUBLIC_HEADERS) scripts/gen_cdef.lua scripts/public_header.lua | $(DEPS_STAMP)
	luajit scripts/gen_cdef.lua include/l2l.h $@

# Passive OpenMP waiting for the test and benchmark programs (see src/runner/main.c: spinning
# threads starve each other when the machine is busy); a policy set by the caller wins.
export OMP_WAIT_POLICY ?= PASSIVE

# `+`: the install spec runs make itself (install into a temporary DESTDIR), as a sub-make
# that shares this one's job slots and command-line variables. T=NAME runs one test: a
# spec file (spec/*/NAME_spec.lua, or a path), else the C tests whose names start with NAME
# and the specs whose descriptions hold it (scripts/test.sh). L2L_TEST_JOBS=N in the
# environment: N test processes at once (default: the cores; 1: one after another).
test: all
	+@L2L_SANITIZE=$(SANITIZE) L2L_TSAN=$(TSAN) L2L_TEST_ONLY='$(T)' bash scripts/test.sh $(BUILD)

# The architecture check alone (make test runs it first): includes and calls point down.
archcheck: all
	@$(BUILD)/l2l scripts/archcheck --objects $(BUILD)

# What this Makefile does, in one screen.
help:
	@echo "make                 build everything (library, l2l, C tests, examples)"
	@echo "make demo            train the demo's model (examples/train_gpt.lua)"
	@echo "make test            every C test and spec, with the architecture check"
	@echo "make test T=NAME     one spec file (spec/*/NAME_spec.lua), or the C tests and specs named NAME"
	@echo "make test SANITIZE=1 under AddressSanitizer and UBSan (build-san/); TSAN=1: ThreadSanitizer"
	@echo "make archcheck       the architecture check alone (scripts/archcheck)"
	@echo "make flakes          make test N times with fresh seeds, some loaded, sanitized, TSan"
	@echo "make fuzz N=...      the loader fuzzer"
	@echo "make bench           the benchmarks (bench/)"
	@echo "make doc             man page, Lua and C references into build/doc"
	@echo "make install         PREFIX=/usr/local DESTDIR= (BINDIR, LIBDIR, ...); make uninstall"
	@echo "make gpu-deps        .gpudeps/ for a lent GPU machine (scripts/gpu-check.sh runs there)"
	@echo "knobs: ARCH=<-march> NO_CUDA=1 CUDA_ARCH=\"80 90\" NO_MPI=1 L2L_THREADS=<n> CFLAGS= LDFLAGS="

# The loader fuzzer: N mutated checkpoints, each loaded in a child process; crashing,
# hanging and unclean cases are kept in $(BUILD)/fuzz/ (the script's header explains).
# KNOWN_OK=1 lets defects the script lists as known (none now) pass.
N ?= 1000
fuzz: $(BUILD)/l2l
	@L2L_SANITIZE=$(SANITIZE) $(BUILD)/l2l scripts/fuzz_load.lua --l2l $(BUILD)/l2l --n $(N) \
	  $(if $(SEED),--seed $(SEED)) $(if $(JOBS),--jobs $(JOBS)) $(if $(KNOWN_OK),--known-ok)

# The flake hunt (scripts/flakes.sh): N defaults to 20 here, not the fuzzer's 1000.
flakes:
	+@bash scripts/flakes.sh $(if $(filter command line,$(origin N)),$(N),20) $(or $(LOADED),3) $(or $(SANITIZED),3) $(or $(THREADED),3)

# The packages a lent GPU machine lacks (it has no package access), for scripts/gpu-host.sh
# there; needs apt, as root. Not a build input: nothing else depends on it.
gpu-deps:
	bash scripts/gpu-deps.sh .gpudeps

demo: all
	$(BUILD)/l2l examples/train_gpt.lua --out $(BUILD)/demo

$(BUILD)/bench_%: bench/%.c bench/bench.h $(BUILD)/libl2l.a
	$(COMPILE) -o $@ $< $(L2L_LDFLAGS) $(LDFLAGS) $(WHOLE_LIB)

bench: $(BUILD)/bench_ops $(BUILD)/bench_layers $(BUILD)/bench_optim $(BUILD)/bench_relay
	$(BUILD)/bench_ops
	$(BUILD)/bench_layers
	$(BUILD)/bench_optim
	$(BUILD)/bench_relay

# Which loops of the CPU backend GCC vectorized (the hot loops must all appear).
vecreport: | $(DEPS_STAMP)
	@for f in src/backend/cpu/*.c src/backend/optim_kernels.c; do $(COMPILE) -I. -fopt-info-vec-optimized -c $$f -o /dev/null 2>&1 | \
	  grep -E "^$$f:[0-9]+" | sed -E 's/:[0-9]+: optimized://' | sort -t: -k2 -n -u; done

# ------------------------------------------------------------------ install, uninstall
# The layout of the GNU coding standards; Debian's multiarch library folder is
# LIBDIR=/usr/lib/x86_64-linux-gnu. The Lua modules go where LuaJIT's default
# package.path looks (PREFIX/share/lua/5.1), and the installed l2l also looks there,
# relative to its own folder, so a tree installed under any PREFIX (or DESTDIR) runs.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
LUADIR ?= $(DATADIR)/lua/5.1
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL ?= install
# The installed l2l finds libl2l.so.0 in LIBDIR by a RUNPATH relative to its own folder
# ($ORIGIN/../lib), so a tree under any PREFIX runs as it is (and after it is moved),
# except under PREFIX=/usr, a distribution's, whose packages carry none (Debian's policy)
# and whose LIBDIR the loader searches anyway. INSTALL_RUNPATH= leaves it out anywhere.
# (A program of your own built with pkg-config needs LIBDIR at run time too: README,
# "Installing".)
ifeq ($(PREFIX),/usr)
  INSTALL_RUNPATH ?=
else
  INSTALL_RUNPATH ?= $$ORIGIN/$(shell realpath -m --relative-to='$(BINDIR)' '$(LIBDIR)')
endif

# l2l.pc. A program linking the shared library needs -ll2l alone; one linking libl2l.a
# also needs what the library links (pkg-config --static): OpenBLAS, jemalloc, xxHash, jansson, OpenMP
# (libgomp: the objects call it), and with CUDA the runtime and libstdc++ (the kernels are
# C++: without it, an undefined __cxa_guard_acquire). A sanitized build's library needs
# the sanitizer runtimes in the program too.
PC_LIBS_PRIVATE := -lopenblas -ljemalloc -lxxhash -ljansson -lgomp -lm -lpthread $(if $(HAVE_LIBURING),-luring) $(CUDA_LIBS)
pc_dir = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
define L2L_PC
prefix=$(PREFIX)
libdir=$(call pc_dir,$(LIBDIR))
includedir=$(call pc_dir,$(INCLUDEDIR))

Name: l2l
Description: trains transformers layer to layer (libl2l, the C library of l2l)
Version: $(VERSION)
Libs: -L$${libdir} -ll2l$(if $(SANFLAGS), -fsanitize=address$(comma)undefined)
Libs.private: $(strip $(PC_LIBS_PRIVATE))
Cflags: -I$${includedir}
endef
comma := ,
export L2L_PC

install: $(DIST)/libl2l.so.$(VERSION) $(DIST)/l2l $(BUILD)/libl2l.a lua/l2l/cdef.lua docs/l2l.1
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	  $(DESTDIR)$(INCLUDEDIR)/l2l $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(LUADIR)/l2l
	$(if $(INSTALL_RUNPATH),$(LINK) -o $(DIST)/l2l.runpath $(RUNNER_OBJ) -Wl$(comma)--no-as-needed \
	  $(DIST)/libl2l.so.$(VERSION) $(L2L_EXE_LIBS) $(CUDA_LINK_PATH) -Wl$(comma)-rpath$(comma)'$(INSTALL_RUNPATH)' && \
	  $(INSTALL) -m 755 $(DIST)/l2l.runpath $(DESTDIR)$(BINDIR)/l2l,$(INSTALL) -m 755 $(DIST)/l2l $(DESTDIR)$(BINDIR)/l2l)
	$(INSTALL) -m 644 $(DIST)/libl2l.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libl2l.so.$(VERSION)
	ln -sfn libl2l.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sfn $(SONAME) $(DESTDIR)$(LIBDIR)/libl2l.so
	$(INSTALL) -m 644 $(BUILD)/libl2l.a $(DESTDIR)$(LIBDIR)/libl2l.a
	$(if $(MPI_PLUGIN),$(INSTALL) -m 644 $(MPI_PLUGIN) $(DESTDIR)$(LIBDIR)/libl2l-mpi.so)
	$(INSTALL) -m 644 include/l2l.h $(DESTDIR)$(INCLUDEDIR)/l2l.h
	$(INSTALL) -m 644 $(filter include/l2l/%,$(PUBLIC_HEADERS)) $(DESTDIR)$(INCLUDEDIR)/l2l/
	printf '%s\n' "$$L2L_PC" > $(DESTDIR)$(PKGCONFIGDIR)/l2l.pc
	chmod 644 $(DESTDIR)$(PKGCONFIGDIR)/l2l.pc
	$(INSTALL) -m 644 docs/l2l.1 $(DESTDIR)$(MANDIR)/man1/l2l.1
	find lua/l2l -type f -name '*.lua' | LC_ALL=C sort | while read -r f; do \
	  $(INSTALL) -D -m 644 "$$f" "$(DESTDIR)$(LUADIR)/$${f#lua/}" || exit 1; done
	$(INSTALL) -D -m 755 scripts/gpt2-vocab.sh $(DESTDIR)$(DATADIR)/l2l/gpt2-vocab.sh
	for f in examples/*.lua examples/*.c; do \
	  $(INSTALL) -D -m 644 "$$f" "$(DESTDIR)$(DATADIR)/l2l/$$f" || exit 1; done
ifeq ($(DESTDIR),)
	@if [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi
	@blas=$$(readlink -f $(dir $(BLAS_DIR))libopenblas.so.0 2>/dev/null); \
	if [ -n "$$blas" ] && [ "$${blas#$(BLAS_DIR)/}" = "$$blas" ]; then \
	  echo "note: the installed libl2l loads $$blas, which Debian's alternatives chose;"; \
	  echo "      OpenBLAS's OpenMP build is faster with l2l (see the Makefile, BLAS_DIR):"; \
	  echo "      update-alternatives --set libopenblas.so.0-$(notdir $(patsubst %/,%,$(dir $(BLAS_DIR)))) $(BLAS_DIR)/libopenblas.so.0"; \
	fi
endif

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/l2l $(DESTDIR)$(LIBDIR)/libl2l.so.$(VERSION) \
	  $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libl2l.so $(DESTDIR)$(LIBDIR)/libl2l.a \
	  $(DESTDIR)$(LIBDIR)/libl2l-mpi.so \
	  $(DESTDIR)$(INCLUDEDIR)/l2l.h $(DESTDIR)$(PKGCONFIGDIR)/l2l.pc $(DESTDIR)$(MANDIR)/man1/l2l.1
	rm -rf $(DESTDIR)$(LUADIR)/l2l $(DESTDIR)$(DATADIR)/l2l $(DESTDIR)$(INCLUDEDIR)/l2l
ifeq ($(DESTDIR),)
	@if [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi
endif

# ------------------------------------------------------------------ documentation
# The man page is written by hand (docs/l2l.1) and checked by rendering it with groff's
# warnings on; the Lua reference is LDoc's, run on copies of lua/l2l/ whose comments
# scripts/gen_luadoc.lua marks for it (the sources keep their plain `--` comments); the C
# reference is made from the comments of include/l2l.h and its parts by scripts/gen_cdoc.lua.
DOC := $(BUILD)/doc
doc: $(DOC)/man1/l2l.1 $(DOC)/lua/index.html $(DOC)/c-api.md

$(DOC)/man1/l2l.1: docs/l2l.1 | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@warnings=$$(LC_ALL=C.UTF-8 groff -k -man -Tutf8 -ww -z $< 2>&1); \
	if [ -n "$$warnings" ]; then echo "$$warnings" >&2; echo "doc: $< has warnings" >&2; exit 1; fi
	cp $< $@
	LC_ALL=C.UTF-8 groff -k -man -Tutf8 -P-cbou $< > $(DOC)/l2l.1.txt

$(DOC)/lua/index.html: $(wildcard lua/l2l/*.lua) lua/l2l/cdef.lua scripts/gen_luadoc.lua docs/config.ld | $(DEPS_STAMP)
	rm -rf $(DOC)/lua $(DOC)/lua-src
	luajit scripts/gen_luadoc.lua lua/l2l $(DOC)/lua-src/l2l
	ldoc --fatalwarnings --date "for l2l $(VERSION)" -c docs/config.ld -d $(DOC)/lua $(DOC)/lua-src

$(DOC)/c-api.md: $(PUBLIC_HEADERS) scripts/gen_cdoc.lua scripts/public_header.lua | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	luajit scripts/gen_cdoc.lua include/l2l.h $@

clean:
	rm -rf build build-san build-tsan

-include $(LIB_OBJ:.o=.d) $(CTEST_OBJ:.o=.d) $(RUNNER_OBJ:.o=.d)
