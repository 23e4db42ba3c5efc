#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu.sh — the GPU checks in one run: build (with CUDA), the GPU tests (ops, layers, the
# relay), compute-sanitizer's memcheck and racecheck over the op tests, then the kernel
# benchmark (bench/cuda.c), whose table goes into bench/RESULTS.md with the GPU's name and
# the date.
# Usage: bench/gpu.sh [--no-sanitizer]     (from any folder; needs nvcc and a GPU)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
sanitizer=1
[[ ${1:-} == --no-sanitizer ]] && sanitizer=0
status=0

make -j"$(nproc)" all build/bench_cuda || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true

echo "== GPU tests (build/l2l_ctest cuda_)"
# The runner's other tests read device memory from the CPU: only the cuda_ ones here.
L2L_DEVICE=cpu build/l2l_ctest cuda_ || status=1
# busted's script under the l2l executable, as scripts/test.sh runs it (no `lua` needed)
L2L_DEVICE=cpu build/l2l "$(command -v busted)" -o plainTerminal spec/device_spec.lua || status=1
echo "== the relay on the GPU (spec/gpu_relay_spec.lua)"
L2L_DEVICE=cpu build/l2l "$(command -v busted)" -o plainTerminal spec/gpu_relay_spec.lua || status=1

if ((sanitizer)) && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool (GPU tests)"
    L2L_DEVICE=cpu compute-sanitizer --tool "$tool" --error-exitcode 3 \
      build/l2l_ctest cuda_ || status=1
  done
fi

echo "== kernels against the GPU's copy bandwidth and cuBLAS"
build/bench_cuda || status=1
exit $status
