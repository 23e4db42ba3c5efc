# Makefile — builds libl2l (shared and static), the l2l executable, the C tests and the
# benchmarks, and runs them. The two commands a user needs: `make demo` and `make test`.
# `make fuzz N=20000 SEED=s` runs the loader fuzzer (scripts/fuzz_load.lua; N defaults to
# 1000, the seed to a fresh one). Targets that need system packages first run
# scripts/deps.sh, which installs what is missing. Knobs: SANITIZE=1 (AddressSanitizer +
# UBSan build in build-san/), ARCH=<gcc -march> (default native: l2l is built where it
# runs), NO_CUDA=1, CUDA_ARCH="80 90", L2L_THREADS=<n>.

SANITIZE ?= 0
ARCH ?= native
ifeq ($(SANITIZE),1)
  BUILD ?= build-san
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
  OPT := -O1 -DL2L_SANITIZE
else
  BUILD ?= build
  SANFLAGS :=
  OPT := -O3
endif

CC ?= cc
LUAJIT_CFLAGS := -I/usr/include/luajit-2.1
# -ffp-contract=fast: -std=c11 would otherwise forbid fused multiply-add (2x on GELU);
# -fno-math-errno lets sqrtf vectorize; 512-bit vectors pay off where AVX-512 exists.
CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -g -march=$(ARCH) -fPIC -fopenmp -fno-math-errno \
          -fno-trapping-math -ffp-contract=fast -mprefer-vector-width=512 -Wall -Wextra -Wshadow -Wstrict-prototypes -Isrc $(SANFLAGS) \
          $(EXTRA_CFLAGS)
LDFLAGS := -fopenmp $(SANFLAGS)
# OpenBLAS's OpenMP build (Debian's libopenblas0-openmp), not the default pthread one: with
# one OpenMP thread pool for BLAS and l2l's loops, neither spins on the cores the other
# needs (with both pools, a tiny model ran 11x slower on 2 threads than on 1), and BLAS
# called inside an OpenMP region runs single-threaded by itself. BLAS_DIR is that build's
# folder (scripts/gpu-host.sh points it at packages unpacked where none can be installed).
BLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS := -L$(BLAS_DIR) -l:libopenblas.so.0 -Wl,-rpath,$(BLAS_DIR)
LIB_LIBS := $(BLAS_LIBS) -ljemalloc -lm -lpthread
# The executable and test programs link libl2l.so from their own folder.
RPATH := -Wl,-rpath,'$$ORIGIN' -Wl,--no-as-needed

# The CUDA backend is built wherever nvcc is found (a GPU is only needed to run it);
# NO_CUDA=1 leaves it out, and so does the sanitizer build (AddressSanitizer and the CUDA
# runtime do not mix). A CPU-only build is complete. CUDA_ARCH lists the GPU generations
# to build machine code for; PTX for the last one lets newer GPUs compile it at load.
ifeq ($(SANITIZE),1)
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
  NVCC_FLAGS := -std=c++17 -O3 -g -lineinfo -Xcompiler -fPIC,-Wall,-Wextra -Ikernels -Isrc \
                $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH)) \
                $(EXTRA_NVCC_FLAGS)
  KERNEL_OBJ := $(patsubst kernels/%.cu,$(BUILD)/kernels/%.o,$(wildcard kernels/*.cu))
  # cuBLAS is opened at run time (backend_cuda.c says why), from the toolkit's folder.
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -ldl -lstdc++
  $(BUILD)/obj/backend/cuda/%.o: CFLAGS += -DL2L_CUDA -I$(CUDA_HOME)/include -I. \
                                          -DL2L_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
endif

# One source list per part (src/<part>/, see README.md's layout); the parts build the
# library together. src/main.c is the l2l executable.
CORE_SRC := $(wildcard src/core/*.c)
BACKEND_SRC := $(wildcard src/backend/*.c src/backend/cpu/*.c src/backend/cuda/*.c)
LAYERS_SRC := $(wildcard src/layers/*.c)
EPS_SRC := $(wildcard src/eps/*.c)
PLAN_SRC := $(wildcard src/plan/*.c)
RELAY_SRC := $(wildcard src/relay/*.c)
LIB_SRC := $(CORE_SRC) $(BACKEND_SRC) $(LAYERS_SRC) $(EPS_SRC) $(PLAN_SRC) $(RELAY_SRC)
LIB_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o) $(KERNEL_OBJ)
CTEST_SRC := $(wildcard spec/c/*.c)
CTEST_OBJ := $(CTEST_SRC:spec/c/%.c=$(BUILD)/ctest/%.o)
DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all deps test demo bench vecreport clean fuzz
all: $(BUILD)/libl2l.so $(BUILD)/libl2l.a $(BUILD)/l2l $(BUILD)/l2l_ctest $(BUILD)/hello \
     $(BUILD)/embed $(BUILD)/embed_lua \
     lua/l2l/cdef.lua

deps: $(DEPS_STAMP)
$(DEPS_STAMP): scripts/deps.sh
	@bash scripts/deps.sh
	@mkdir -p $(BUILD) && touch $@

$(BUILD)/obj/%.o: src/%.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.cuh kernels/*.h) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/libl2l.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LIB_LIBS) $(CUDA_LIBS)

$(BUILD)/libl2l.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/main.o: src/main.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUAJIT_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/l2l: $(BUILD)/obj/main.o $(BUILD)/libl2l.so
	$(CC) -o $@ $< $(LDFLAGS) $(RPATH) -L$(BUILD) -ll2l -lluajit-5.1 -ledit -ljemalloc -lm -ldl

$(BUILD)/ctest/%.o: spec/c/%.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/l2l_ctest: $(CTEST_OBJ) $(BUILD)/libl2l.so
	$(CC) -o $@ $(CTEST_OBJ) $(LDFLAGS) $(RPATH) -L$(BUILD) -ll2l $(BLAS_LIBS) -lm

# The C examples, built as a user would build them (only src/l2l.h, -ll2l and LuaJIT).
$(BUILD)/hello: examples/hello.c src/l2l.h $(BUILD)/libl2l.so
	$(CC) -std=c11 -Wall -Wextra $(SANFLAGS) -Isrc -o $@ $< $(RPATH) -L$(BUILD) -ll2l
$(BUILD)/embed: examples/embed.c src/l2l.h $(BUILD)/libl2l.so
	$(CC) -std=c11 -Wall -Wextra $(SANFLAGS) -Isrc -o $@ $< $(RPATH) -L$(BUILD) -ll2l
# embed_lua finds this checkout's lua/ through a path compiled in (the environment
# variable L2L_LUA_DIR overrides it).
$(BUILD)/embed_lua: examples/embed_lua.c src/l2l.h $(BUILD)/libl2l.so
	$(CC) -std=c11 -Wall -Wextra $(SANFLAGS) -Isrc $(LUAJIT_CFLAGS) -DL2L_LUA_DIR='"$(CURDIR)/lua"' \
	  -o $@ $< $(RPATH) -L$(BUILD) -ll2l -lluajit-5.1

# The FFI declarations are generated from the public header (and checked by a spec).
lua/l2l/cdef.lua: src/l2l.h scripts/gen_cdef.lua | $(DEPS_STAMP)
	luajit scripts/gen_cdef.lua src/l2l.h $@

# Passive OpenMP waiting for the test and benchmark programs (see src/main.c: spinning
# threads starve each other when the machine is busy); a policy set by the caller wins.
export OMP_WAIT_POLICY ?= PASSIVE

test: all
	@L2L_SANITIZE=$(SANITIZE) bash scripts/test.sh $(BUILD)

# The loader fuzzer: N mutated checkpoints, each loaded in a child process; crashing,
# hanging and unclean cases are kept in $(BUILD)/fuzz/ (the script's header explains).
# KNOWN_OK=1 lets defects the script lists as known (none now) pass.
N ?= 1000
fuzz: $(BUILD)/l2l
	@L2L_SANITIZE=$(SANITIZE) $(BUILD)/l2l scripts/fuzz_load.lua --l2l $(BUILD)/l2l --n $(N) \
	  $(if $(SEED),--seed $(SEED)) $(if $(JOBS),--jobs $(JOBS)) $(if $(KNOWN_OK),--known-ok)

demo: all
	$(BUILD)/l2l examples/train_gpt.lua --out $(BUILD)/demo

$(BUILD)/bench_%: bench/%.c bench/bench.h $(BUILD)/libl2l.so
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(RPATH) -L$(BUILD) -ll2l $(BLAS_LIBS) -lm

bench: $(BUILD)/bench_ops $(BUILD)/bench_layers $(BUILD)/bench_optim $(BUILD)/bench_relay
	$(BUILD)/bench_ops
	$(BUILD)/bench_layers
	$(BUILD)/bench_optim
	$(BUILD)/bench_relay

# Which loops of the CPU backend GCC vectorized (the hot loops must all appear).
vecreport: | $(DEPS_STAMP)
	@for f in src/backend/cpu/*.c; do $(CC) $(CFLAGS) -fopt-info-vec-optimized -c $$f -o /dev/null 2>&1 | \
	  grep -E "^$$f:[0-9]+" | sed -E 's/:[0-9]+: optimized://' | sort -t: -k2 -n -u; done

clean:
	rm -rf build build-san

-include $(LIB_OBJ:.o=.d) $(CTEST_OBJ:.o=.d) $(BUILD)/obj/main.d
