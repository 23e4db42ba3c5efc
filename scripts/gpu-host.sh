#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu-host.sh — runs a command in a build environment on a lent GPU machine, which has
# CUDA, PyTorch and a compiler but no package access.
#
# The Debian packages the build needs travel in .gpudeps/ (git-ignored), made here by
# `make gpu-deps` (scripts/gpu-deps.sh) and named in the device call's carry. There, from
# the repository root, e.g.:
#   scripts/gpu-host.sh scripts/gpu-check.sh      (the whole device check)
#   scripts/gpu-host.sh make -j16 all build/l2l_ctest build/bench_cuda
# The first call unpacks the packages into /tmp/l2l-deps (scripts/gpu-unpack.sh; kept while
# the machine stays warm), and those of .gpudeps/base whose library the machine lacks
# (libedit needs libbsd and libmd, which a bare image may not have). Every call then loads
# their paths, tells make they are present (scripts/deps.sh asks dpkg, which has never
# heard of them) and points BLAS_DIR at the unpacked OpenMP OpenBLAS.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
prefix=/tmp/l2l-deps
(($#)) || { echo "usage: scripts/gpu-host.sh COMMAND [ARG...]" >&2; exit 2; }

if [[ ! -f $prefix/env.sh ]]; then
  if ! compgen -G ".gpudeps/*.deb" >/dev/null; then
    echo "gpu-host: no packages in .gpudeps/: run \`make gpu-deps\` here and carry .gpudeps" >&2
    exit 2
  fi
  missing=$(mktemp -d)
  for pair in libbsd.so.0:libbsd0 libmd.so.0:libmd0; do
    # no grep -q: quitting early can kill ldconfig by SIGPIPE, failing the pipe (pipefail)
    ldconfig -p | grep "${pair%%:*} " >/dev/null && continue
    cp .gpudeps/base/"${pair#*:}"_*.deb "$missing"/ || exit 2
  done
  # these first: the main unpack then resolves links into them
  if compgen -G "$missing/*.deb" >/dev/null; then
    scripts/gpu-unpack.sh "$missing" "$prefix" >/dev/null || exit 2
  fi
  rm -rf "$missing"
  scripts/gpu-unpack.sh .gpudeps "$prefix" >/dev/null || exit 2
fi
# shellcheck source=/dev/null
. "$prefix/env.sh"
export BLAS_DIR=$prefix/usr/lib/x86_64-linux-gnu/openblas-openmp
mkdir -p build
touch build/.deps-ok
export L2L_DEPS_CARRIED=$prefix   # scripts/deps.sh: present, though dpkg does not know them
# cuDNN: the library is the machine's (PyTorch's wheel, in a virtual environment under
# /opt on the lent H200), which l2l's own search and the Makefile's miss: L2L_CUDNN names
# it, and the build takes the wheel's headers beside it (the Makefile's CUDNN_INCLUDE), or
# those carried in .gpudeps/cudnn where neither the toolkit nor the wheel has them
cudnn_lib=$(find /usr/lib/python3* /usr/local/lib/python3* /opt "$HOME/.local" -name 'libcudnn.so.9' \
              -path '*nvidia*' 2>/dev/null | head -n 1)
[[ -z ${L2L_CUDNN:-} && -n $cudnn_lib ]] && export L2L_CUDNN=$cudnn_lib
if [[ -z ${CUDNN_INCLUDE:-} && ! -f /usr/local/cuda/include/cudnn_graph.h ]]; then
  wheel_include=$(dirname "$(dirname "${cudnn_lib:-/nonexistent/lib/x}")")/include
  if [[ -f $wheel_include/cudnn_graph.h ]]; then export CUDNN_INCLUDE=$wheel_include
  elif [[ -f .gpudeps/cudnn/include/cudnn_graph.h ]]; then export CUDNN_INCLUDE=$PWD/.gpudeps/cudnn/include
  fi
fi
exec "$@"
