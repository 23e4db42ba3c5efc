#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu-check.sh — the whole device check in one command: what a session lent a GPU runs
# (through scripts/gpu-host.sh, carrying .gpudeps) to learn whether the CUDA path works.
# It ends inside its budget (default 530 s) whatever fails: each phase has its own time
# limit, cut short where the budget would run out, and writes one line to summary.txt.
# Phases, in the order of what they teach:
#   facts     the GPU, driver, nvcc, cuBLAS header and library, torch        -> machine.txt
#   build     make -j16 CUDA_ARCH=90; fails loudly when the CUDA backend was not built or
#             l2l.device() does not say CUDA                                  -> build.log
#   ctest     every GPU C test (cuda_*, cudnn_attention*) in its own process (a fault
#             poisons a process's CUDA context), each result in the summary   -> ctest.log
#   sanitize  compute-sanitizer memcheck on the tests that failed (on all of them, in one
#             process, when none failed); then racecheck on the flash attention and row
#             kernels' small tests, in what the phase has left                -> sanitizer.log
#   specs     spec/l2l/init_device_spec.lua and spec/l2l/relay_gpu_spec.lua                -> specs.log
#   kernels   build/bench_cuda: kernels against copy bandwidth and cuBLAS (attention at
#             S = 1k, 4k, 8k, head dims 64 and 128, each path; the row kernels; the linear
#             maps' bias in cuBLASLt's epilogue against the steps)                -> bench.txt
#   profile   the vs_torch step (GPT-2 124M, 8 x 1024 tokens, bf16) op by op: three steps
#             after a warm-up under l2l.profile, the table and the TSV; then the same with
#             cuDNN off (attention on l2l's flash kernels), its attention ms beside  -> bench.txt
#   vs_torch  GPT-2 124M, 8 x 1024 tokens, bf16: l2l (weights streamed from the host EPS,
#             then with every record on the device: placement = "device") against PyTorch
#             eager (bf16 autocast, fused AdamW): tokens/s and device peak, and the share
#             of the step the GPU waited for copies                           -> vs_torch.txt
#   repeat    the same small training twice: are the losses the same bits?   -> bench.txt
# At most these 8 files go to $OUT (default build/gpu-check), each log cut to its last
# 2 MB. On a GPU machine a GPU test that skips is a failure: nothing here can pass because
# nothing ran. --dry-run (on a machine without a GPU) runs each phase's CPU part and
# reports the rest "skipped: no GPU"; spec/project/gpu_check_spec.lua runs it.
# Exit status: 0 when every phase passed (--dry-run: every phase that could run), else 1;
# the last line names what failed and what could not run.
# Usage: scripts/gpu-check.sh [--dry-run] [--budget SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
here=$PWD

# --- one phase, run by the driver below as `gpu-check.sh --phase NAME` under a timeout.
# It prints its key figure as its last stdout line; exit 0 passed, 3 skipped, else failed.
SKIP=3
cut_log() { local f=$1; [[ -f $f ]] || return 0; tail -c 2000000 "$f" > "$f.cut" && mv "$f.cut" "$f"; }
# backtrace LOG CMD...: CMD run again under cuda-gdb, its stack where it dies, into LOG
# (a segfault leaves nothing else to read: the output it buffered dies with it)
backtrace() {
  local log=$1; shift
  if ! command -v cuda-gdb >/dev/null; then echo "(no cuda-gdb here for a backtrace)" >> "$log"; return; fi
  local left=$((phase_end - $(date +%s) - 2))
  ((left > 10)) || { echo "(no time left for a backtrace of $*)" >> "$log"; return; }
  echo "== backtrace (cuda-gdb): $*" >> "$log"
  timeout -k 5 $((left < 120 ? left : 120)) cuda-gdb -q -batch -ex "set pagination off" \
    -ex "set print thread-events off" -ex run -ex "bt 40" --args "$@" 2>&1 |
    grep -v '^\[New Thread\|^\[Thread .* exited' | tail -n 80 >> "$log"
}
in_time() { (( $(date +%s) < phase_end )); }   # room for one more step of this phase
# half of what is left of the phase, in whole seconds, at least 1 (timeout 0 would mean none)
half_left() { local h=$(( (phase_end - $(date +%s)) / 2 )); echo $(( h > 1 ? h : 1 )); }

phase_facts() {
  {
    echo "== date"; date -u
    echo "== GPU"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1
    echo "== nvidia-smi"; nvidia-smi 2>&1
    echo "== nvcc"; command -v nvcc; nvcc --version 2>&1
    local cuda_home; cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")" 2>/dev/null)
    echo "== cuBLAS ($cuda_home)"; ls -l "$cuda_home"/include/cublas_v2.h "$cuda_home"/lib64/libcublas.so* 2>&1
    echo "== host"; uname -a; nproc; free -g; gcc --version | head -n 1
    echo "== torch"; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), "cudnn", torch.backends.cudnn.version())' 2>&1
    echo "== cuDNN (L2L_CUDNN=${L2L_CUDNN:-}, CUDNN_INCLUDE=${CUDNN_INCLUDE:-})"
    find /usr/lib/python3* /usr/local/lib/python3* /opt "$HOME/.local" \( -name 'libcudnn.so*' -o -name cudnn_graph.h \) 2>/dev/null | head -n 8
  } > "$out/machine.txt" 2>&1
  local gpu; gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  local nv; nv=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  local torch; torch=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
  echo "GPU ${gpu:-none}; nvcc ${nv:-none}; torch ${torch:-none}"
  [[ -n $gpu ]] || return $SKIP
}

phase_build() {
  local log=$out/build.log
  make -j16 CUDA_ARCH=90 NO_MPI=1 all build/l2l_ctest build/bench_cuda > "$log" 2>&1 || {
    tail -n 5 "$log" >&2; echo "make failed: see build.log"; return 1; }
  local device
  device=$(build/l2l -e 'local d = l2l.device()
    print((d.cuda and ("cuda " .. d.name .. " " .. d.capability) or ("no cuda: " .. d.why)) ..
          "; " .. (d.cudnn and d.cudnn_about or ("no cudnn: " .. d.cudnn_about)))' 2>&1)
  echo "l2l.device(): $device" >> "$log"
  # the library itself, not leftover objects: the kernels' launchers are in its symbol
  # table or not (hidden, so not in the dynamic one). grep reads all of nm's output (no
  # -q): under pipefail, grep -q quitting at the first match can kill nm by SIGPIPE and
  # fail the pipeline, which read as "not built".
  if ! nm build/libl2l.so 2>/dev/null | grep -E ' [tT] k_add$' >/dev/null; then
    echo "the CUDA backend was NOT built (build/libl2l.so has no kernels: nvcc or cublas_v2.h missing?)"
    ((dry)) && return $SKIP
    return 1
  fi
  if [[ $device != cuda* ]]; then
    echo "built with CUDA; l2l.device(): $device"
    ((dry)) && return $SKIP
    return 1
  fi
  echo "built with CUDA; l2l.device(): $device"
}

phase_ctest() {
  local log=$out/ctest.log names ok=0 bad=() skipped=0
  : > "$log"; : > "$work/failed_ctests"
  # (the GPU tests: cuda_*, and test_cudnn.c's that run attention on the device)
  names=$(build/l2l_ctest --list cuda_ cudnn_attention) || { echo "l2l_ctest --list failed"; return 1; }
  for name in $names; do
    if ! in_time; then echo "$name: not run (phase out of time)" >> "$work/ctests"; bad+=("$name"); continue; fi
    local left=$((phase_end - $(date +%s)))
    L2L_DEVICE=cpu timeout -k 5 $((left < 90 ? left : 90)) build/l2l_ctest --exact "$name" >> "$log" 2>&1
    local rc=$? line
    line=$(grep -E "^  (ok  |FAIL|skip) $name\b" "$log" | tail -n 1)
    case "$line" in
      "  ok   $name"*) ok=$((ok + 1)); echo "$name: ok" >> "$work/ctests" ;;
      "  skip $name"*)
        skipped=$((skipped + 1))
        local why=${line#*: }
        echo "$name: skipped: ${why:0:80}" >> "$work/ctests"
        ((dry)) || { bad+=("$name"); echo "$name" >> "$work/failed_ctests"; } ;;
      *)
        local what="FAIL"; [[ -z $line ]] && what="died (exit $rc$( ((rc == 124 || rc == 137)) && echo ", timed out"))"
        echo "$name: $what" >> "$work/ctests"; bad+=("$name"); echo "$name" >> "$work/failed_ctests"
        [[ -z $line ]] && echo "$name" >> "$work/died_ctests" ;;
    esac
  done
  echo "$ok ok, ${#bad[@]} failed or not run${bad:+ (${bad[*]})}, $skipped skipped"
  ((${#bad[@]} == 0)) || return 1
  ((ok > 0)) || return $SKIP
}

phase_sanitize() {
  local log=$out/sanitizer.log
  : > "$log"
  command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer"; return $SKIP; }
  ((dry)) && { echo "no GPU"; return $SKIP; }
  local failed; failed=$(cat "$work/failed_ctests" 2>/dev/null)
  local args=(--exact $failed) what="the failed tests"
  [[ -z $failed ]] && { args=(cuda_ cudnn_attention); what="every GPU test (none failed)"; }
  echo "== compute-sanitizer memcheck: $what" >> "$log"
  L2L_DEVICE=cpu timeout -k 5 $((phase_end - $(date +%s))) compute-sanitizer --tool memcheck \
    --error-exitcode 3 --print-limit 50 build/l2l_ctest "${args[@]}" >> "$log" 2>&1
  local rc=$?
  local died; died=$(cat "$work/died_ctests" 2>/dev/null)
  for name in $died; do L2L_DEVICE=cpu backtrace "$log" build/l2l_ctest --exact "$name"; done
  local errors; errors=$(grep -E '^========= ERROR SUMMARY' "$log" | tail -n 1)
  local race; race=$(racecheck "$log")
  echo "memcheck on $what: ${errors:-no summary (exit $rc)}; $race"
  [[ $rc == 0 && $race != "racecheck: hazard errors"* ]]
}

# Racecheck (shared memory hazards, which the kernels' CPU emulation cannot show: it orders
# a warp's lanes at each collective, a GPU does not) on a few small tests of the kernels
# that share memory most (the flash attention kernels with a mask and dropout, the row
# kernels), in what the phase has left, 30 s at most. Prints one phrase for the phase's
# line; "racecheck: hazard errors ..." fails the phase.
racecheck() {
  local log=$1 left=$((phase_end - $(date +%s) - 3))
  ((left > 30)) && left=30
  ((left >= 10)) || { echo "racecheck not run (no time left in the phase)"; return; }
  local tests=(cuda_flash_attention_backward_repeats_to_the_bit cuda_layernorm cuda_softmax)
  echo "== compute-sanitizer racecheck: ${tests[*]}" >> "$log"
  L2L_DEVICE=cpu timeout -k 5 "$left" compute-sanitizer --tool racecheck --error-exitcode 3 \
    --print-limit 20 build/l2l_ctest --exact "${tests[@]}" >> "$log" 2>&1
  local rc=$? summary
  summary=$(grep -E 'RACECHECK SUMMARY' "$log" | tail -n 1)
  if ((rc == 124 || rc == 137)); then echo "racecheck cut at $left s (${summary:-no summary before the cut})"
  elif ((rc == 3)); then echo "racecheck: hazard errors: ${summary:-no summary}"
  else echo "racecheck on ${#tests[@]} tests: ${summary:-no summary (exit $rc)}"; fi
}

phase_specs() {
  local log=$out/specs.log busted rc=0 summary=""
  : > "$log"
  busted=$(command -v busted) || { echo "busted is not on the PATH"; return 1; }
  for spec in spec/l2l/init_device_spec.lua spec/l2l/relay_gpu_spec.lua; do
    local left=$((phase_end - $(date +%s)))
    ((left > 5)) || { summary+="$spec: not run (out of time); "; rc=1; continue; }
    echo "== $spec" >> "$log"
    L2L_DEVICE=cpu timeout -k 5 "$left" build/l2l "$busted" -o plainTerminal "$spec" > "$work/spec.out" 2>&1
    local code=$?
    ((code == 0)) || rc=1
    cat "$work/spec.out" >> "$log"
    local counts; counts=$(grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' "$work/spec.out" | tail -n 1)
    counts=${counts% : *}
    summary+="${spec#spec/}: ${counts:-died before its summary (exit $code)}; "
    if [[ -z $counts ]]; then
      rc=1
      L2L_DEVICE=cpu backtrace "$log" build/l2l "$busted" -o plainTerminal "$spec"
    fi
  done
  echo "${summary%; }"
  ((dry)) && return $SKIP
  return $rc
}

phase_kernels() {
  local log=$out/bench.txt
  timeout -k 5 $((phase_end - $(date +%s))) build/bench_cuda > "$log" 2>&1
  local rc=$?
  if grep -q '^bench/cuda: no GPU' "$log"; then echo "no GPU"; ((dry)) && return $SKIP; return 1; fi
  local copy gemm attn
  copy=$(sed -n 's/^device copy .*, \([0-9.]*\) GB\/s.*/\1 GB\/s copy/p' "$log")
  gemm=$(grep -E '^4096 x 4096 x 4096 ' "$log" | awk '{print $NF " TFLOP/s bf16 GEMM 4096^3"}')
  # (the rows' columns are padded: names and sizes apart by one space or more; fwd / bwd
  # TFLOP/s at GPT-2's S = 1024 and at 4096, l2l's flash kernels then cuDNN's)
  attn=$(awk '($1 == "bf16" || $1 == "cudnn") && ($2 == "S=1024" || $2 == "S=4096") {
                r[$1] = r[$1] (r[$1] == "" ? "" : ", ") sprintf("%s %s %s/%s", $2, $3, $6, $10)}
              END {if (r["bf16"] != "") printf "attention fwd/bwd TFLOP/s: l2l flash %s", r["bf16"]
                   if (r["cudnn"] != "") printf "; cuDNN %s", r["cudnn"]}' "$log")
  local visit   # (a block's records on a copy lane: each copy waited, or queued and one wait)
  visit=$(awk '/each waited, small f32/ {w = $(NF - 3)} /queued, the last one waited/ {q = $(NF - 3)}
               END {if (w != "") printf "; a block'"'"'s 12 record copies %s us each waited, %s us queued", w, q}' "$log")
  local head    # (the LM head's GEMMs, forward / dW / dh, its logits' rows packed or padded)
  head=$(awk '/^rows packed/ {p = $(NF - 2) "/" $(NF - 1) "/" $NF} /^rows padded/ {q = $(NF - 2) "/" $(NF - 1) "/" $NF}
              END {if (p != "") printf "; LM head GEMMs fwd/dW/dh %s TFLOP/s packed, %s padded", p, q}' "$log")
  local rows    # (the ops this session's kernels changed, as shares of the copy rate)
  rows=$(awk '$1 == "layernorm_forward" && $2 == "16384x768" {l = $6}
              $1 == "layernorm_backward" && $2 == "16384x768" {b = $6}
              $1 == "gelu_backward_from_output" {g = $6}
              END {if (l != "" || g != "") printf "; of the copy rate: LayerNorm 16384x768 forward %s %%, backward %s %%, GELU from its output %s %%", l, b, g}' "$log")
  local epilogue   # (the qkv map's GEMM with its bias, to bf16: cuBLASLt's epilogue, the steps)
  epilogue=$(awk '$1 == "qkv" && $NF ~ /^[0-9.]+$/ && $(NF - 3) == "bf16" {e = $(NF - 2); s = $(NF - 1)}
                  END {if (e != "") printf "; the qkv map with its bias %s ms by the epilogue, %s ms in steps", e, s}' "$log")
  local ce   # (the head's fused cross-entropy at GPT-2's vocabulary, as a step runs it)
  ce=$(awk '/^head cross-entropy, fused/ {for (i = 1; i <= NF; i++) if ($i == "%") p = $(i - 1)}
            END {if (p != "") printf "; the head'"'"'s cross-entropy %s %% of the copy rate", p}' "$log")
  echo "${copy:-no copy figure}; ${gemm:-no GEMM figure}; ${attn:-no attention figure}$visit$head$rows$epilogue$ce (exit $rc)"
  return $rc
}

phase_vs_torch() {
  local log=$out/vs_torch.txt
  : > "$log"
  ((dry)) && { echo "no GPU"; return $SKIP; }
  export OMP_WAIT_POLICY=PASSIVE
  echo "== torch: python3 bench/torch_gpt.py --layers 12 --dim 768 --batch 8 --steps 6" >> "$log"
  timeout -k 5 "$(half_left)" python3 bench/torch_gpt.py --layers 12 --dim 768 --batch 8 --steps 6 \
    > "$work/torch.json" 2>> "$log"
  cat "$work/torch.json" >> "$log"
  echo "== l2l: build/l2l bench/l2l_gpt.lua layers=12 dim=768 batch=8 micro_batch=4 steps=4" >> "$log"
  local l2l_args=(bench/l2l_gpt.lua layers=12 dim=768 batch=8 micro_batch=4 steps=4)
  # (each l2l run half of what is left, so the second has its share)
  timeout -k 5 "$(half_left)" build/l2l "${l2l_args[@]}" > "$work/l2l.json" 2>> "$log"
  local code=$?
  cat "$work/l2l.json" >> "$log"
  ((code == 0)) || backtrace "$log" build/l2l "${l2l_args[@]}" steps=1
  echo "== l2l, records on the device: build/l2l ${l2l_args[*]} placement=device" >> "$log"
  local left=$((phase_end - $(date +%s)))
  if ((left > 5)); then
    timeout -k 5 "$left" build/l2l "${l2l_args[@]}" placement=device > "$work/l2l_device.json" 2>> "$log"
    code=$?
  else
    echo "(no time left for it)" >> "$log"; : > "$work/l2l_device.json"; code=1
  fi
  cat "$work/l2l_device.json" >> "$log"
  ((code == 0)) || backtrace "$log" build/l2l "${l2l_args[@]}" placement=device steps=1
  python3 - "$work/torch.json" "$work/l2l.json" "$work/l2l_device.json" <<'EOF' | tee -a "$log"
import json, sys
def last(path):
    try:
        lines = [l for l in open(path) if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
t, l, d = last(sys.argv[1]), last(sys.argv[2]), last(sys.argv[3])
ran = lambda r: r is not None and "tokens_per_second" in r
def show(name, r):
    if not ran(r):
        return f"{name}: no result" + (f" ({r})" if r else "")
    return f"{name} {r['tokens_per_second']:.0f} tok/s, peak {r['device_peak'] / 2**30:.2f} GiB"
parts = [show("l2l", l), show("l2l (records on the device)", d), show("torch", t)]
for name, r in (("l2l", l), ("on the device", d)):
    if ran(r) and ran(t):
        parts.append(f"{name}/torch {r['tokens_per_second'] / t['tokens_per_second']:.2f}x speed, "
                     f"{r['device_peak'] / t['device_peak']:.2f}x memory")
if ran(l) and l.get("exposed_copy_seconds") is not None:
    parts.append(f"exposed copy {100 * l['exposed_copy_seconds'] / l['step_seconds']:.0f} % of the step")
print("; ".join(parts))
sys.exit(0 if ran(l) and ran(d) and ran(t) else 1)
EOF
}

# The vs_torch step, op by op (l2l.profile): its table and TSV appended to bench.txt. On a
# machine without a GPU (--dry-run) a small CPU step proves the phase's own part.
phase_profile() {
  local log=$out/bench.txt args
  args=(bench/l2l_gpt.lua layers=12 dim=768 batch=8 micro_batch=4 steps=3 profile="$work/profile.tsv")
  ((dry)) && args=(bench/l2l_gpt.lua layers=2 dim=64 vocab=100 seq=32 batch=4 steps=2 device=cpu
                   precision=f32 grad_precision=f32 profile="$work/profile.tsv")
  echo "== profile: build/l2l ${args[*]}" >> "$log"
  timeout -k 5 $((phase_end - $(date +%s))) build/l2l "${args[@]}" > "$work/profile.json" 2> "$work/profile.err"
  local code=$?
  cat "$work/profile.err" "$work/profile.json" >> "$log"
  echo "== profile TSV" >> "$log"
  cat "$work/profile.tsv" >> "$log" 2>/dev/null
  ((code == 0)) || { backtrace "$log" build/l2l "${args[@]}"; echo "bench/l2l_gpt.lua failed (exit $code)"; return 1; }
  local head syncs waits
  head=$(grep -m 1 '^l2l profile:' "$work/profile.err")
  syncs=$(grep -m 1 '^a step:' "$work/profile.err")
  waits=$(grep -m 1 '^copy waits, ms:' "$work/profile.err")
  echo "${head#l2l profile: }; ${syncs:-no counts}; ${waits:-no copy waits}$( ((dry)) && echo " (no GPU: the CPU part)" || host_paced "$work/profile.tsv")$(profile_own_attention "${args[@]}")"
  ((dry)) && return $SKIP
  return 0
}

# "; ops the host paced ...": the ms a step of the TSV's op rows whose host time in the calls
# (host_ms) came to 90 % of their device time or more (on a GPU: the device idled inside
# them, waiting for the host to queue), and the three largest.
host_paced() {
  awk -F'\t' '$1 == "op" && $12 != "" && $12 >= 0.9 * $5 && $5 > 0 {
      s += $5; n++; if (n <= 3) top = top (n > 1 ? ", " : "") $2 " " sprintf("%.2f", $5) }
    END { if (n) printf "; ops the host paced: %.2f ms a step in %d rows (%s)", s, n, top
          else printf "; no op the host paced" }' "$1"
}

# The same step with cuDNN off (L2L_CUDNN=0: attention on l2l's flash kernels), for the
# attention's ms a step and the step's, side by side with the run above: which path a
# 16-bit step should take where both serve. Prints "; ..." or nothing (no GPU, no time).
attention_ms() { awk -F'\t' '$1 == "op" && $2 ~ /^attention_/ {s += $5} END {printf "%.2f", s}' "$1"; }
profile_own_attention() {
  ((dry)) && return 0
  (( phase_end - $(date +%s) > 30 )) || return 0
  local log=$out/bench.txt own=("${@/#profile=*/profile=$work/profile_own.tsv}")
  echo "== profile, cuDNN off: L2L_CUDNN=0 build/l2l ${own[*]}" >> "$log"
  L2L_CUDNN=0 timeout -k 5 $((phase_end - $(date +%s))) build/l2l "${own[@]}" > /dev/null 2> "$work/profile_own.err"
  cat "$work/profile_own.err" "$work/profile_own.tsv" >> "$log" 2>/dev/null
  local step_own
  step_own=$(grep -m 1 '^l2l profile:' "$work/profile_own.err" | grep -o '[0-9.]* ms a step')
  [[ -n $step_own ]] || return 0
  echo "; attention $(attention_ms "$work/profile.tsv") ms a step as run, $(attention_ms "$work/profile_own.tsv") ms on l2l's flash kernels (cuDNN off: $step_own)"
}

# Two runs of the same small training, their losses side by side: a GPU's atomics (see
# docs/design.md, "Backends") can make them differ in the last bits.
phase_repeat() {
  local log=$out/bench.txt
  ((dry)) && { echo "no GPU"; return $SKIP; }
  local args=(bench/l2l_gpt.lua layers=4 dim=256 seq=256 batch=8 steps=6) a b
  echo "== repeat: build/l2l ${args[*]}, twice" >> "$log"
  a=$(timeout -k 5 $(( (phase_end - $(date +%s)) / 2 )) build/l2l "${args[@]}" 2>> "$log" | tail -n 1)
  b=$(timeout -k 5 $((phase_end - $(date +%s))) build/l2l "${args[@]}" 2>> "$log" | tail -n 1)
  printf '%s\n%s\n' "$a" "$b" >> "$log"
  python3 - "$a" "$b" <<'EOF'
import json, sys
try:
    a, b = (json.loads(x)["loss"] for x in sys.argv[1:3])
except (ValueError, KeyError):
    print("no loss from one of the runs"); sys.exit(1)
print(f"two runs' last loss: {a!r} and {b!r}: " +
      ("the same bits" if a == b else f"differ by {abs(a - b) / abs(a):.2g} of the loss"))
EOF
}

if [[ ${1:-} == --phase ]]; then
  name=$2 out=$3 work=$4 dry=$5 phase_end=$6
  "phase_$name"
  exit $?
fi

# --- the driver
dry=0 budget=530
while (($#)); do
  case $1 in
    --dry-run) dry=1 ;;
    --budget) budget=${2:?--budget needs a number of seconds}; shift ;;
    *) echo "usage: scripts/gpu-check.sh [--dry-run] [--budget SECONDS]" >&2; exit 2 ;;
  esac
  shift
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu-check: --budget takes whole seconds, not '$budget'" >&2; exit 2; }
out=${OUT:-$here/build/gpu-check}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/ctests"
start=$(date +%s)
summary=$out/summary.txt
{
  echo "l2l gpu-check $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')$(git diff --quiet HEAD 2>/dev/null || echo '+changes'), $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${budget} s$( ((dry)) && echo ', dry run (no GPU expected)')"
  printf '%-9s %-8s %5s  %s\n' phase status s figure
} > "$summary"
failed=() not_run=()
# phase NAME LIMIT: runs the phase under min(LIMIT, what is left of the budget)
phase() {
  local name=$1 limit=$2 now left status figure cut=""
  now=$(date +%s); left=$((start + budget - now))
  # a phase the budget cut short says so: its failure may be the cut, not a fault
  ((limit > left)) && cut="given $left of its $limit s by the budget; " limit=$left
  if ((limit < 5)); then
    printf '%-9s %-8s %5s  %s\n' "$name" "not run" 0 "out of budget" >> "$summary"
    not_run+=("$name (out of budget)"); return
  fi
  echo "gpu-check: $name (up to $limit s)" >&2
  timeout -k 10 "$limit" "$here/scripts/gpu-check.sh" --phase "$name" "$out" "$work" "$dry" $((now + limit - 3)) \
    > "$work/$name.out" 2> >(tee -a "$work/stderr" >&2)
  local rc=$?
  figure=$(grep -v '^$' "$work/$name.out" | tail -n 1)
  case $rc in
    0) status=ok ;;
    "$SKIP") status=skipped; not_run+=("$name") ;;
    124|137) status=TIMEOUT; failed+=("$name"); figure="${cut}ran past $limit s; ${figure}" ;;
    *) status=FAIL; failed+=("$name"); figure="${cut}${figure}" ;;
  esac
  printf '%-9s %-8s %5s  %s\n' "$name" "$status" $(($(date +%s) - now)) "$figure" >> "$summary"
}

phase facts 30
phase build 240
phase ctest 150
phase sanitize 90
phase specs 120
phase kernels 90
phase profile 120
phase vs_torch 150
phase repeat 60
{
  echo
  echo "cuda_ C tests, one process each:"
  sed 's/^/  /' "$work/ctests"
  echo
  echo "total $(($(date +%s) - start)) s; failed: ${failed[*]:-none}; not run: ${not_run[*]:-none}"
} >> "$summary"
for f in build.log ctest.log sanitizer.log specs.log bench.txt vs_torch.txt machine.txt; do cut_log "$out/$f"; done
cat "$summary"
if ((${#failed[@]})); then exit 1; fi
if ((!dry && ${#not_run[@]})); then exit 1; fi
exit 0
