#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# deps.sh — install the Debian packages l2l needs, if any are missing.
# Run by the Makefile before the first build. As root it installs with apt-get; otherwise
# it prints the exact command to run and fails. `deps.sh --list` prints the packages, one
# a line, and installs nothing (scripts/gpu-deps.sh fetches them for a GPU machine). CUDA is not a Debian package here: when
# nvcc is found, this only reports whether cuBLAS is beside it (the CUDA backend needs it).
set -euo pipefail

packages=(
  luajit libluajit-5.1-dev   # LuaJIT 2.1: the front end and the l2l executable
  libjemalloc-dev            # host memory pools
  libopenblas-dev            # CPU GEMMs: cblas.h
  libopenblas0-openmp        # OpenBLAS's OpenMP build, which libl2l links (see Makefile)
  lua-busted                 # the spec runner (run under the l2l executable)
  lua-cjson                  # JSON for checkpoints' metadata and the metrics log
  libxxhash0                 # the checksum of each tensor in a checkpoint (XXH3-64)
  libxxhash-dev              # xxhash.h: the spill file's checksum of each region (src/eps/spill.c)
  libjansson4 libjansson-dev # JSON in C: safetensors headers and checkpoints' descriptions (src/core, src/relay)
  liburing-dev               # the spill file's I/O through io_uring (src/eps/spill.c)
  libedit-dev                # line editing and history for the l2l REPL
  lua-argparse               # the examples' command-line flags
  pkg-config                 # l2l.pc: C programs build against an installed libl2l with it
  lua-ldoc                   # `make doc`: the Lua API reference (LDoc)
  groff-base                 # `make doc`: the man page l2l(1) is checked by rendering it
  openmpi-bin libopenmpi-dev # data parallel (dist = "mpi"): mpirun, mpicc and libmpi
  libboost-context-dev       # the tests' fibers, one a GPU thread, that run the kernels' source on the CPU
)

if [[ ${1:-} == --list ]]; then
  printf '%s\n' "${packages[@]}" | grep -v '^#'
  exit 0
fi

# Packages carried and unpacked in a folder (scripts/gpu-host.sh, on a machine without
# package access): there, though dpkg has never heard of them.
if [[ -n ${L2L_DEPS_CARRIED:-} ]]; then
  echo "deps: the packages carried in $L2L_DEPS_CARRIED (scripts/gpu-host.sh), not asked of dpkg"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  [[ $p == \#* ]] && continue
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    echo "deps: installing ${missing[*]}"
    bash -c "$cmd"
  else
    echo "deps: missing packages: ${missing[*]}" >&2
    echo "deps: install them as root with:  sudo sh -c '$cmd'" >&2
    exit 1
  fi
fi

nvcc=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [[ -n $nvcc ]]; then
  cuda=$(dirname "$(dirname "$(readlink -f "$nvcc")")")   # nvcc may be a link in /usr/local/bin
  if ls "$cuda"/include/cublas_v2.h >/dev/null 2>&1; then
    echo "deps: CUDA toolkit at $cuda with cuBLAS: the CUDA backend is built"
  else
    echo "deps: CUDA toolkit at $cuda has no cuBLAS headers: the CUDA backend is left out"
  fi
fi
# GPT-2's tokenizer files (l2l.tokenizer.gpt2()) from npm into the cache: optional.
bash "$(dirname "${BASH_SOURCE[0]}")/gpt2-vocab.sh" || echo "deps: going on without GPT-2's tokenizer files (optional)"
echo "deps: all present"
