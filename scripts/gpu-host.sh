#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu-host.sh — runs a command in a build environment on a lent GPU machine, which has
# CUDA, PyTorch and a compiler but no package access.
#
# The Debian packages the build needs travel in .gpudeps/ (git-ignored: list it in
# .git/info/exclude), made once on a developer machine, as root:
#   ../shared/gpu-host/fetch-debs.sh .gpudeps luajit libluajit-5.1-dev libjemalloc-dev \
#       libopenblas-dev libopenblas0-pthread lua-busted lua-cjson libedit-dev pkg-config
#   (cd .gpudeps && apt-get download libopenblas0-openmp)   # fetch-debs leaves it out
#   cp ../shared/gpu-host/unpack.sh .gpudeps/
#   mkdir .gpudeps/base && (cd .gpudeps/base && apt-get download libbsd0 libmd0)
# and named in the device call's carry. There, from the repository root, e.g.:
#   scripts/gpu-host.sh make -j16 all build/l2l_ctest build/bench_cuda
#   scripts/gpu-host.sh bench/gpu.sh --no-sanitizer
#   scripts/gpu-host.sh bench/vs_torch.sh
# The first call unpacks the packages into /tmp/l2l-deps (kept while the machine stays
# warm), and those of .gpudeps/base whose library the host lacks: fetch-debs counts
# libbsd0 and libmd0 as the base system's, but libedit needs them and a bare image may
# have neither (build/l2l then fails to link). Every call then loads their paths, tells
# make they are present (scripts/deps.sh asks dpkg, which has never heard of them) and
# points BLAS_DIR at the unpacked OpenMP OpenBLAS. A machine's description goes to
# $OUT/machine.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
prefix=/tmp/l2l-deps
(($#)) || { echo "usage: scripts/gpu-host.sh COMMAND [ARG...]" >&2; exit 2; }

if [[ ! -f $prefix/env.sh ]]; then
  if [[ ! -f .gpudeps/unpack.sh ]]; then
    echo "gpu-host: no .gpudeps/unpack.sh: carry .gpudeps (see this file's header)" >&2
    exit 2
  fi
  missing=$(mktemp -d)
  for pair in libbsd.so.0:libbsd0 libmd.so.0:libmd0; do
    ldconfig -p | grep -q "${pair%%:*} " && continue
    cp .gpudeps/base/"${pair#*:}"_*.deb "$missing"/ || exit 2
  done
  # these first: the main unpack then resolves links into them
  if compgen -G "$missing/*.deb" >/dev/null; then
    bash .gpudeps/unpack.sh "$missing" "$prefix" >/dev/null || exit 2
  fi
  rm -rf "$missing"
  bash .gpudeps/unpack.sh .gpudeps "$prefix" >/dev/null || exit 2
fi
# shellcheck source=/dev/null
. "$prefix/env.sh"
export BLAS_DIR=$prefix/usr/lib/x86_64-linux-gnu/openblas-openmp
mkdir -p build
touch build/.deps-ok
if [[ -n ${OUT:-} && ! -f $OUT/machine.txt ]]; then
  { nvidia-smi; nvcc --version; gcc --version | head -n 1; nproc; free -g; } \
    > "$OUT/machine.txt" 2>&1
fi
exec "$@"
