#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test.sh — run the architecture check, every C test and every spec; end with one line
# "N passed, M failed".
# Usage: scripts/test.sh BUILD_DIR   (called by `make test`; BUILD_DIR holds l2l, l2l_ctest)
# L2L_TEST_JOBS=N: how many test processes run at once (below; default: the cores).
# L2L_TEST_ONLY=NAME (make test T=NAME): one spec file (spec/*/NAME_spec.lua, or a path to
# one) alone; else the C tests whose names start with NAME and the specs whose
# descriptions hold it; the architecture check is left out either way.
# One seed drives every random draw of the run, the C tests' and the specs': L2L_SEED, or
# a fresh one, printed first; `L2L_SEED=s make test` replays the run.
# The specs run under the l2l executable, which has jemalloc loaded from the start; it runs
# busted's script itself (`busted --lua` would need a `lua` on the PATH for the launcher,
# which a machine with only the carried packages lacks). A runner that dies before
# printing its summary counts as one failure, so a crash can never look like a pass.
# Skipped (pending) specs are reported, not passed.
set -uo pipefail
build=${1:-build}
export L2L_BUILD=$build
# The suites run the device pool on the CPU backend: their checks read device tensors'
# memory from the CPU. The GPU tests (spec/c/backend/test_cuda*.c) switch to CUDA themselves
# where a GPU is present, and report themselves skipped, with the reason, where not.
export L2L_DEVICE=cpu
if [[ -z ${L2L_SEED:-} ]]; then
  L2L_SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  L2L_SEED=$((L2L_SEED % 1000000000 + 1))
fi
export L2L_SEED
knob=$( [[ ${L2L_SANITIZE:-0} == 1 ]] && echo " SANITIZE=1"; [[ ${L2L_TSAN:-0} == 1 ]] && echo " TSAN=1")
echo "== seed $L2L_SEED (L2L_SEED=$L2L_SEED make test$knob replays this run)"

# ThreadSanitizer (make test TSAN=1): the parts that run threads (and the GPU's kernels run
# as fibers by spec/c/backend/*_emulated.cpp: the *_kernels_emulated tests), with one
# OpenMP thread (libgomp is not built for TSan; l2l's own threads are what is checked) and
# OpenMPI's internals suppressed (scripts/tsan.supp). A report makes a program exit with status 66:
# a child's fails its spec, a runner's counts as a failure below.
ctest_only=() specs=(spec) filter=() only=${L2L_TEST_ONLY:-}
if [[ ${L2L_TSAN:-0} == 1 ]]; then
  export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp ${TSAN_OPTIONS:-}"
  export OMP_NUM_THREADS=1 L2L_THREADS=1
  ctest_only=(relay_ misuse_errors_threads pool_ pinned_pool spill_ eps_gives eps_held_gradients_given eps_deferred
              flash_kernels_emulated attention_fp32_kernels_emulated norm_kernels_emulated
              softmax_kernels_emulated cross_entropy_kernels_emulated gelu_kernels_emulated
              reduce_kernels_emulated elementwise_kernels_emulated optim_kernels_emulated)
  specs=(spec/l2l/relay_running_spec.lua spec/l2l/relay_spec.lua spec/l2l/dist_spec.lua spec/l2l/dist_faults_spec.lua spec/l2l/relay_interrupt_spec.lua)
fi
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

passed=0 failed=0 skipped=0

# A runner that reported no failures but exited non-zero (a sanitizer's leak or error
# report comes after the summary) counts one failure.
exited_badly() {
  local what=$1 rc=$2 reported=$3
  if ((rc != 0 && reported == 0)); then
    echo "test: the $what exited with status $rc after reporting no failures (sanitizer report above?)"
    failed=$((failed + 1))
  fi
}

run_ctests=1
if [[ -n $only ]]; then
  spec_file=$only
  if [[ ! -f $spec_file ]]; then
    for f in spec/*/"${only}"_spec.lua; do [[ -f $f ]] && spec_file=$f; done
  fi
  if [[ -f $spec_file ]]; then specs=("$spec_file") run_ctests=0
  else ctest_only=("$only") filter=(--filter "$only"); fi
fi

if [[ -z $only ]]; then
  echo "== architecture (scripts/archcheck under $build/l2l)"
  if "$build/l2l" scripts/archcheck --objects "$build"; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "test: the architecture check failed (scripts/archcheck)"; fi
fi

# The C tests and each spec file run as separate processes, L2L_TEST_JOBS at a time (the
# machine's cores unless set; 1 runs them one after another): one process at a time left a
# core idle for much of a run (bench/RESULTS.md, "the sanitized specs"). Each one's output
# is printed whole when it ends, headed by its name and seconds. A filter (T=NAME) runs the
# specs as one busted process. The specs that run make in the checkout (install_spec,
# doc_spec, gpu-check's dry run) build only targets no other builds (`make test` built
# `all` first), so they may run at the same time.
# (nproc follows OMP_NUM_THREADS, which the TSan run sets to 1 for the tests: the cores are
# counted without it)
jobs=${L2L_TEST_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "test: L2L_TEST_JOBS must be a positive whole number, not '$jobs'"; exit 2; }
busted=$(command -v busted) || busted=
units=()   # "ctest" or a list of spec files (space-separated) for one busted process
((run_ctests)) && units+=(ctest)
if ((${#filter[@]})); then units+=("${specs[*]}")
else
  # each spec file, the largest first (a rough guide to the longest, so that a long one
  # does not start last)
  files=$(find "${specs[@]}" -name '*_spec.lua' -printf '%s %p\n' | sort -k1,1nr -k2 | cut -d' ' -f2-)
  for f in $files; do units+=("$f"); done
fi

# Runs unit i; its output goes to $log/i, its exit status to $log/i.rc, its seconds to $log/i.s.
run_unit() {
  local i=$1 unit=$2 start=$SECONDS rc
  if [[ $unit == ctest ]]; then "$build/l2l_ctest" "${ctest_only[@]}" > "$log/$i" 2>&1
  elif [[ -z $busted ]]; then echo "test: busted is not on the PATH (scripts/deps.sh installs it)" > "$log/$i"; false
  else
    # shellcheck disable=SC2086 # a unit is a list of files without spaces
    "$build/l2l" "$busted" -o plainTerminal "${filter[@]}" $unit > "$log/$i" 2>&1
  fi
  rc=$?
  echo $((SECONDS - start)) > "$log/$i.s"
  echo "$rc" > "$log/$i.rc"
}

# Adds unit i's summary to the counts and prints its output. (No process substitution
# here or above: `wait -n` would take its end for a unit's.)
tally_unit() {
  local i=$1 unit=${units[$1]} rc summary p f e k
  rc=$(cat "$log/$i.rc" 2>/dev/null || echo 1)
  if [[ $unit == ctest ]]; then echo "== C tests ($build/l2l_ctest, $(cat "$log/$i.s") s)"
  else echo "== specs: $unit (busted under $build/l2l, $(cat "$log/$i.s") s)"; fi
  cat "$log/$i"
  if [[ $unit == ctest ]]; then
    summary=$(grep -E '^ctest: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log/$i" | tail -n 1)
    if [[ -n $summary ]]; then
      read -r p f k <<<"$(sed -E 's/^ctest: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/' <<<"$summary")"
      passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
      exited_badly "C tests" "$rc" "$f"
    else
      echo "test: the C tests stopped before their summary (crash?)"
      failed=$((failed + 1))
    fi
    return
  fi
  summary=$(grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' \
            "$log/$i" | tail -n 1)
  if [[ -n $summary ]]; then
    read -r p f e k <<<"$(sed -E 's#^([0-9]+) success(es)? / ([0-9]+) failures? / ([0-9]+) errors? / ([0-9]+) pending.*#\1 \3 \4 \5#' <<<"$summary")"
    passed=$((passed + p)) failed=$((failed + f + e)) skipped=$((skipped + k))
    exited_badly "specs ($unit)" "$rc" "$((f + e))"
  else
    echo "test: the specs ($unit) stopped before their summary (crash?)"
    failed=$((failed + 1))
  fi
}

# Waits for one running unit to end and tallies it.
declare -A unit_of_pid=()
tally_one_ended() {
  local done_pid= pid
  if ! wait -n -p done_pid && [[ -z $done_pid ]]; then   # none left to wait for: all ended
    for pid in "${!unit_of_pid[@]}"; do tally_unit "${unit_of_pid[$pid]}"; unset "unit_of_pid[$pid]"; done
    return 0
  fi
  [[ -n ${unit_of_pid[$done_pid]:-} ]] || return 0
  tally_unit "${unit_of_pid[$done_pid]}"
  unset "unit_of_pid[$done_pid]"
}
for i in "${!units[@]}"; do
  while ((${#unit_of_pid[@]} >= jobs)); do tally_one_ended; done
  run_unit "$i" "${units[$i]}" &
  unit_of_pid[$!]=$i
done
while ((${#unit_of_pid[@]})); do tally_one_ended; done

if ((skipped)); then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
((failed == 0 && passed > 0))
