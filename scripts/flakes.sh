#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# flakes.sh — the flake hunt: runs the whole suite many times, each with a fresh seed, and
# lists every assertion that failed in any run, with the seed it drew and the command that
# replays it. A test that fails here without a code change is a flake, and costs a landing.
# It also lists the numeric comparisons that came nearest their tolerances (error /
# tolerance, recorded through L2L_TEST_MARGINS: the C tests' check.h check_margin, the
# specs' spec/support.lua within), so that a tolerance too tight for some draws shows
# before a run fails on it.
# Usage: scripts/flakes.sh N LOADED SANITIZED THREADED
#        (`make flakes N=20 LOADED=3 SANITIZED=3 THREADED=3`)
#   N          runs of `make test`, as CI runs it;
#   LOADED     runs of `make test` while a parallel build of the library in a scratch folder
#              keeps every core busy (timings and thread interleavings shift most there);
#   SANITIZED  runs of `make test SANITIZE=1` (slower: it shifts timings too);
#   THREADED   runs of `make test TSAN=1`, as CI runs it too (its build rounds differently:
#              a tolerance can fail there alone).
# Each run's log is kept in build/flakes/ (plain-3.log, ...), its margins beside it
# (plain-3.margins); the report, printed at the end, is build/flakes/report.txt. Exits
# non-zero when any run failed anything.
#        scripts/flakes.sh --report [DIR]
#   prints the report of the runs whose logs and margins are in DIR (default build/flakes)
#   and runs nothing: a hunt stopped part way shows what it found.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
report_only=0 out=build/flakes
if [[ ${1:-} == --report ]]; then report_only=1 out=${2:-$out}; set --; fi
plain=${1:-20} loaded=${2:-3} sanitized=${3:-3} threaded=${4:-3}
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

# The build folder and environment a run of a kind used (test.sh's, for TSan).
build_of() { case $1 in sanitized) echo build-san ;; threaded) echo build-tsan ;; *) echo build ;; esac; }
env_of() {
  local kind=$1 seed=$2
  printf 'L2L_SEED=%s L2L_DEVICE=cpu L2L_BUILD=%s' "$seed" "$(build_of "$kind")"
  if [[ $kind == threaded ]]; then
    printf ' TSAN_OPTIONS=suppressions=scripts/tsan.supp OMP_NUM_THREADS=1 L2L_THREADS=1'
  fi
}

# The failures one log shows, one line each: kind, test, first line of its message, and
# the command that replays it. C tests print "  FAIL name (k checks)" after their failed
# checks ("  FAIL file:line: expr: why"); busted prints "Failure -> spec/x.lua @ line",
# the test's name and its message. Replaying a spec file alone draws what the run drew
# (spec/support.lua seeds each file afresh); a C test alone is seeded as in the run.
failures_of() {
  local log=$1 seed=$2 kind=$3 build env knob
  build=$(build_of "$kind") env=$(env_of "$kind" "$seed")
  knob=$(case $kind in sanitized) echo " SANITIZE=1" ;; threaded) echo " TSAN=1" ;; esac)
  awk -v env="$env" -v build="$build" -v busted="$busted" -v knob="$knob" '
    /^  FAIL [^ ]+:[0-9]+: / { if (why == "") why = substr($0, 8); next }
    /^  FAIL [A-Za-z0-9_]+ \([0-9]+ checks\)$/ {
      printf "ctest\t%s\t%s\t%s %s/l2l_ctest %s\n", $2, why, env, build, $2; why = ""; next }
    /^(Failure|Error) -> / { file = $3; at = $5; getline name; getline msg
      printf "spec\t%s @ %s: %s\t%s\t%s %s/l2l %s -o plainTerminal %s\n", file, at, name, msg, env, build, busted, file
      next }
    /^test: / { printf "runner\t%s\t\t%s make test%s\n", substr($0, 7), env, knob }
  ' "$log"
}

total=$((plain + loaded + sanitized + threaded)) k=0 failed_runs=0 t_all=$SECONDS
run_one() {
  local kind=$1 i=$2 seed log t rc summary knob=()
  seed=$(fresh_seed)
  log=$out/$kind-$i.log
  k=$((k + 1))
  [[ $kind == sanitized ]] && knob=(SANITIZE=1)
  [[ $kind == threaded ]] && knob=(TSAN=1)
  [[ $kind == loaded ]] && load_start
  t=$SECONDS
  printf '#seed\t%s\n' "$seed" >"$out/$kind-$i.margins"
  L2L_SEED=$seed L2L_TEST_MARGINS=$PWD/$out/$kind-$i.margins make test "${knob[@]}" >"$log" 2>&1
  rc=$?
  load_stop
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  printf 'flakes: run %d/%d (%s, seed %s): %s, exit %d, %d s\n' "$k" "$total" "$kind" "$seed" \
    "${summary:-no summary}" "$rc" $((SECONDS - t))
  if ((rc != 0)) || [[ -z $summary ]]; then
    failed_runs=$((failed_runs + 1))
    local lines
    lines=$(failures_of "$log" "$seed" "$kind")
    [[ -n $lines ]] || lines=$(printf 'runner\texit %d with no failure found in the log\t\t%s\n' "$rc" "see $log")
    while IFS= read -r line; do printf '%s\t%s\t%s\t%s\n' "$kind" "$seed" "$log" "$line"; done \
      <<<"$lines" >>"$out/failures.tsv"
  fi
}

# The comparisons that came nearest their tolerances, the largest error / tolerance of each
# (file:line) over every run's margins: the 12 nearest, each with its run and replay.
nearest_margins() {
  local f kind seed
  for f in "$out"/*.margins; do
    [[ -f $f ]] || continue
    kind=$(basename "$f" .margins) kind=${kind%-*}
    seed=$(sed -n '1s/^#seed\t//p' "$f")
    awk -F'\t' -v kind="$kind" -v seed="$seed" -v env="$(env_of "$kind" "$seed")" \
      -v build="$(build_of "$kind")" -v busted="$busted" '
      !/^#/ && NF >= 3 {
        replay = $3 ~ /\.lua$/ ? build "/l2l " busted " -o plainTerminal " $3 : build "/l2l_ctest --exact " $3
        printf "%s\t%s\t%s\t%s\t%s run, seed %s\t%s %s\n", $2, $1, $3, $4, kind, seed, env, replay }' "$f"
  done | sort -t$'\t' -k2,2 -k1,1gr | awk -F'\t' '$2 != last { last = $2; print }' |
    sort -t$'\t' -k1,1gr | awk -F'\t' -v all="$(cat "$out"/*.margins 2>/dev/null | grep -cv '^#')" '
      NR == 1 { printf "\nnearest their tolerances (error / tolerance: 1 fails; the largest at each place, of %d comparisons):\n", all }
      NR <= 12 { printf "  %-7.3g %s  %s: %s (%s)\n    replay: %s\n", $1, $2, $3, $4, $5, $6 }'
}

# The failing tests (failures.tsv), then the margins.
report() {
  if [[ -s $out/failures.tsv ]]; then
    # one entry per failing test: how many runs it failed, then each run's seed, message
    # and replay command
    sort -t$'\t' -k5,5 -k4,4 -s "$out/failures.tsv" | awk -F'\t' '
      $5 != last { if (last != "") print ""; last = $5; printf "%s %s\n", $4, $5 }
      { printf "  %s run, seed %s (%s): %s\n    replay: %s\n", $1, $2, $3, $6, $7 }'
  fi
  nearest_margins
}
if ((report_only)); then
  [[ -d $out ]] || { echo "flakes: no folder $out" >&2; exit 1; }
  printf 'flakes: the report of %s (%d runs logged)\n' "$out" "$(find "$out" -maxdepth 1 -name '*.log' | wc -l)"
  report
  [[ ! -s $out/failures.tsv ]]
  exit
fi
mkdir -p "$out" || exit 1
rm -f "$out"/*.log "$out"/*.margins "$out"/failures.tsv "$out"/report.txt

make all >/dev/null || { echo "flakes: make all failed" >&2; exit 1; }
if ((sanitized)); then make all SANITIZE=1 >/dev/null || { echo "flakes: make all SANITIZE=1 failed" >&2; exit 1; }; fi
if ((threaded)); then make all TSAN=1 >/dev/null || { echo "flakes: make all TSAN=1 failed" >&2; exit 1; }; fi
for ((i = 1; i <= plain; i++)); do run_one plain "$i"; done
for ((i = 1; i <= loaded; i++)); do run_one loaded "$i"; done
for ((i = 1; i <= sanitized; i++)); do run_one sanitized "$i"; done
for ((i = 1; i <= threaded; i++)); do run_one threaded "$i"; done

{
  printf 'flakes: %d runs (%d plain, %d loaded, %d sanitized, %d threaded) in %d s: %d failed\n' \
    "$total" "$plain" "$loaded" "$sanitized" "$threaded" $((SECONDS - t_all)) "$failed_runs"
  report
} | tee "$out/report.txt"
((failed_runs == 0))
