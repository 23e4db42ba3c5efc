#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu-deps.sh — fills .gpudeps/ with the Debian packages a lent GPU machine lacks (it has
# CUDA, PyTorch and a compiler, but no LuaJIT, OpenBLAS, jemalloc or busted, and no package
# access), so that scripts/gpu-host.sh can unpack them there and build and test l2l.
# `make gpu-deps` runs it; run it on a Debian machine with apt (as root, or it says so).
# Usage: scripts/gpu-deps.sh [DEST]          (DEST defaults to .gpudeps)
#
# What is fetched: l2l's packages and every library they need, minus the base system
# (priority required/important, the C library and toolchain): the GPU machine has its own,
# and two C libraries in one process break it. libbsd0 and libmd0 are base packages to
# Debian but libedit needs them and a bare image may lack them: they go to DEST/base/, and
# scripts/gpu-host.sh unpacks them only where the machine has no libbsd.so.0/libmd.so.0.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.gpudeps}
# What scripts/deps.sh installs, less OpenMPI (one GPU: nothing to run under mpirun; the
# MPI specs say so) and Boost.Context (the kernels' CPU emulation, which the GPU runs for
# real: Boost's headers would take much of what a device call carries), plus make, which a
# bare image may lack.
mapfile -t packages < <(scripts/deps.sh --list |
                        grep -v -e '^openmpi-bin$' -e '^libopenmpi-dev$' -e '^libboost-context-dev$')
packages+=(make)
base=(libbsd0 libmd0)

command -v apt-get >/dev/null || { echo "gpu-deps: needs Debian's apt-get" >&2; exit 2; }
if [[ $(id -u) != 0 ]]; then
  echo "gpu-deps: run as root (apt-get download and the package lists need it)" >&2; exit 2
fi
if ! apt-cache show luajit >/dev/null 2>&1; then apt-get update -qq; fi

rm -rf "$dest.new"
mkdir -p "$dest.new/base"
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances "${packages[@]}" |
          grep -v '^ ' | grep -v '^<' | sort -u)
# each package's priority, from one apt-cache call (its first record's)
declare -A priority
while read -r name prio; do
  [[ -n ${priority[$name]:-} ]] || priority[$name]=$prio
done < <(apt-cache show $closure 2>/dev/null |
         awk -F': ' '/^Package:/ {p = $2} /^Priority:/ {print p, $2}')
keep=()
for p in $closure; do
  case "${priority[$p]:-}" in required|important) continue ;; esac
  case "$p" in
    # the C runtime and toolchain: the machine's own must be used
    libc6|libc6-dev|libgcc-s1|libstdc++6|libc-dev-bin|linux-libc-dev|libcrypt1|libcrypt-dev) continue ;;
    gcc-*|cpp-*|libgcc-*-dev|dpkg|perl*|debconf*|libdebconfclient*) continue ;;
    # base libraries every machine has (same sonames); libbsd0/libmd0 go to base/
    libssl3|libselinux1|libpcre2-*|zlib1g|libzstd1|libtinfo6|libncursesw6|libkrb5*) continue ;;
    libk5crypto3|libkeyutils1|libcom-err2|libgssapi*|libnsl*|libtirpc*|rpcsvc-proto) continue ;;
    libbsd0|libmd0) continue ;;
    # Lua 5.2-5.4 (ldoc runs on 5.1), and the OpenBLAS flavours l2l does not link (OpenMP)
    lua5.[234]*|liblua5.[234]*|libopenblas*pthread*|libopenblas*serial*) continue ;;
  esac
  keep+=("$p")
done
(cd "$dest.new" && apt-get -o APT::Sandbox::User=root download "${keep[@]}" >/dev/null)
(cd "$dest.new/base" && apt-get -o APT::Sandbox::User=root download "${base[@]}" >/dev/null)
# cuDNN's headers from this machine's CUDA toolkit, where it has them: a lent machine's
# PyTorch wheel may hold cuDNN's library without them (scripts/gpu-host.sh points the
# build at these only where the machine has none; the library stays the machine's)
cuda_include=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")/include
if compgen -G "$cuda_include/cudnn*.h" >/dev/null; then
  mkdir -p "$dest.new/cudnn/include"
  cp "$cuda_include"/cudnn*.h "$dest.new/cudnn/include/"
fi
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "gpu-deps: $(ls "$dest"/*.deb | wc -l) packages (+ ${#base[@]} in base/), $(du -sh "$dest" | cut -f1), in $dest"
