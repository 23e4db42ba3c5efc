#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# flakes.sh — the flake hunt: runs the whole suite many times, each with a fresh seed, and
# lists every assertion that failed in any run, with the seed it drew and the command that
# replays it. A test that fails here without a code change is a flake, and costs a landing.
# Usage: scripts/flakes.sh N LOADED SANITIZED   (`make flakes N=20 LOADED=3 SANITIZED=3`)
#   N          runs of `make test`, as CI runs it;
#   LOADED     runs of `make test` while a parallel build of the library in a scratch folder
#              keeps every core busy (timings and thread interleavings shift most there);
#   SANITIZED  runs of `make test SANITIZE=1` (slower: it shifts timings too).
# Each run's log is kept in build/flakes/ (plain-3.log, ...); the report, printed at the
# end, is build/flakes/report.txt. Exits non-zero when any run failed anything.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
plain=${1:-20} loaded=${2:-3} sanitized=${3:-3}
out=build/flakes
mkdir -p "$out" || exit 1
rm -f "$out"/*.log "$out"/failures.tsv "$out"/report.txt
busted=$(command -v busted || echo busted)

fresh_seed() { echo $(($(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 1000000000 + 1)); }

# The load: the library built again and again with -j<cores> in a scratch folder.
load_pid=
load_start() {
  local scratch=$out/load-build
  (while :; do rm -rf "$scratch"; make -s -j"$(nproc)" BUILD="$scratch" NO_CUDA=1 all >/dev/null 2>&1; done) &
  load_pid=$!
}
load_stop() {
  [[ -n $load_pid ]] || return 0
  kill -- "$load_pid" 2>/dev/null
  pkill -P "$load_pid" 2>/dev/null
  wait "$load_pid" 2>/dev/null
  load_pid=
  rm -rf "$out/load-build"
}
trap 'load_stop' EXIT
trap 'exit 130' INT TERM

# The failures one log shows, one line each: kind, test, first line of its message, and
# the command that replays it. C tests print "  FAIL name (k checks)" after their failed
# checks ("  FAIL file:line: expr: why"); busted prints "Failure -> spec/x.lua @ line",
# the test's name and its message. Replaying a spec file alone draws what the run drew
# (spec/support.lua seeds each file afresh); a C test alone is seeded as in the run.
failures_of() {
  local log=$1 seed=$2 san=$3 build=build env
  ((san)) && build=build-san
  env="L2L_SEED=$seed L2L_DEVICE=cpu L2L_BUILD=$build"
  awk -v env="$env" -v build="$build" -v busted="$busted" -v san="$san" '
    /^  FAIL [^ ]+:[0-9]+: / { if (why == "") why = substr($0, 8); next }
    /^  FAIL [A-Za-z0-9_]+ \([0-9]+ checks\)$/ {
      printf "ctest\t%s\t%s\t%s %s/l2l_ctest %s\n", $2, why, env, build, $2; why = ""; next }
    /^(Failure|Error) -> / { file = $3; at = $5; getline name; getline msg
      printf "spec\t%s @ %s: %s\t%s\t%s %s/l2l %s -o plainTerminal %s\n", file, at, name, msg, env, build, busted, file
      next }
    /^test: / { printf "runner\t%s\t\t%s make test%s\n", substr($0, 7), env, san ? " SANITIZE=1" : "" }
  ' "$log"
}

total=$((plain + loaded + sanitized)) k=0 failed_runs=0 t_all=$SECONDS
run_one() {
  local kind=$1 i=$2 seed log t rc summary san=0
  seed=$(fresh_seed)
  log=$out/$kind-$i.log
  k=$((k + 1))
  [[ $kind == sanitized ]] && san=1
  [[ $kind == loaded ]] && load_start
  t=$SECONDS
  if ((san)); then L2L_SEED=$seed make test SANITIZE=1 >"$log" 2>&1
  else L2L_SEED=$seed make test >"$log" 2>&1; fi
  rc=$?
  load_stop
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  printf 'flakes: run %d/%d (%s, seed %s): %s, exit %d, %d s\n' "$k" "$total" "$kind" "$seed" \
    "${summary:-no summary}" "$rc" $((SECONDS - t))
  if ((rc != 0)) || [[ -z $summary ]]; then
    failed_runs=$((failed_runs + 1))
    local lines
    lines=$(failures_of "$log" "$seed" "$san")
    [[ -n $lines ]] || lines=$(printf 'runner\texit %d with no failure found in the log\t\t%s\n' "$rc" "see $log")
    while IFS= read -r line; do printf '%s\t%s\t%s\t%s\n' "$kind" "$seed" "$log" "$line"; done \
      <<<"$lines" >>"$out/failures.tsv"
  fi
}

make all >/dev/null || { echo "flakes: make all failed" >&2; exit 1; }
if ((sanitized)); then make all SANITIZE=1 >/dev/null || { echo "flakes: make all SANITIZE=1 failed" >&2; exit 1; }; fi
for ((i = 1; i <= plain; i++)); do run_one plain "$i"; done
for ((i = 1; i <= loaded; i++)); do run_one loaded "$i"; done
for ((i = 1; i <= sanitized; i++)); do run_one sanitized "$i"; done

{
  printf 'flakes: %d runs (%d plain, %d loaded, %d sanitized) in %d s: %d failed\n' "$total" "$plain" \
    "$loaded" "$sanitized" $((SECONDS - t_all)) "$failed_runs"
  if [[ -s $out/failures.tsv ]]; then
    # one entry per failing test: how many runs it failed, then each run's seed, message
    # and replay command
    sort -t$'\t' -k5,5 -k4,4 -s "$out/failures.tsv" | awk -F'\t' '
      $5 != last { if (last != "") print ""; last = $5; printf "%s %s\n", $4, $5 }
      { printf "  %s run, seed %s (%s): %s\n    replay: %s\n", $1, $2, $3, $6, $7 }'
  fi
} | tee "$out/report.txt"
((failed_runs == 0))
