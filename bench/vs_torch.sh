#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# vs_torch.sh — l2l against PyTorch on the same GPU in one run (CUDA part 2's benchmark):
# GPT-2 shapes, sequence length 1024, bf16, AdamW, random tokens.
#   1. Fits on the GPU (124M and 350M): tokens/s and peak device memory, PyTorch eager with
#      everything on the GPU against l2l streaming weights from the EPS, and against l2l
#      given half of PyTorch's measured peak as its device budget with placement = "auto"
#      and plan = "auto" (the records that fit there live and are updated on the device).
#      Target: l2l >= 0.9x PyTorch's tokens/s with at most half its device memory.
#   2. Does not fit: the largest width-4096 GPT-2 shape whose EPS (fp32 masters, gradients,
#      AdamW state, bf16 staging: 18 bytes a parameter) fits in 80 % of host memory, at the
#      accumulation its plan asks for (accumulate=auto: the host optimizer hidden): l2l's
#      tokens/s and MFU (6 N tokens/s over the measured bf16 GEMM rate; target >= 40 %), and
#      PyTorch's result for the same model (out of memory, or its rate if it fits).
#   3. A 7 B model (32 blocks of width 4096) with 8-bit AdamW state and bf16 masters,
#      placement = "auto" (the records that fit beside the step on the device, the rest on
#      the host): tokens/s, MFU, host memory a parameter (target >= 272 TFLOP/s of model
#      FLOPs with <= 6 GB of host memory a billion parameters).
#   4. The crossover: the exposed copy time of a 1.3B model against tokens per minibatch,
#      beside the prediction T* = (h2d bytes a parameter a step) x GEMM rate / (6 x h2d
#      bandwidth), where streaming the weights in takes as long as computing with them.
# Prints markdown tables for bench/RESULTS.md; raw JSON lines go to $OUT/vs_torch.jsonl (or /tmp),
# what the cases print on stderr to vs_torch.jsonl.err beside it.
# Usage: bench/vs_torch.sh [--quick | --large]   (needs a GPU, python3 with torch, and the build)
#   --quick: every part, the large shapes at 4 blocks; --large: parts 2 and 3 alone, full
#   size (the two rows one window may have no time left for after the others)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
quick=0 large=0
case ${1:-} in
  --quick) quick=1 ;;
  --large) large=1 ;;
  "") ;;
  *) echo "usage: bench/vs_torch.sh [--quick | --large]" >&2; exit 2 ;;
esac
log=${OUT:-/tmp}/vs_torch.jsonl
: > "$log"

make -j"$(nproc)" all >/dev/null || exit 1
export OMP_WAIT_POLICY=PASSIVE

# run NAME CMD...: one JSON line, tagged with NAME, appended to the log; what the case
# says on stderr goes to one file beside it ($OUT brings back only a few files)
: > "$log.err"
run() {
  local name=$1
  shift
  local line
  echo "== $name: $*" >> "$log.err"
  line=$("$@" 2>>"$log.err" | tail -n 1)
  [[ $line == \{* ]] || line="{\"failed\": true, \"error\": \"see $name in $log.err\"}"
  echo "{\"case\": \"$name\", \"result\": $line}" >> "$log"
  echo "$name: $line" >&2
}

run probe python3 bench/torch_gpt.py --probe

((large)) || for shape in "124M 12 768" "350M 24 1024"; do
  read -r name layers dim <<< "$shape"
  run "torch-$name" python3 bench/torch_gpt.py --layers "$layers" --dim "$dim" --batch 8
  run "l2l-$name" build/l2l bench/l2l_gpt.lua layers="$layers" dim="$dim" batch=8 micro_batch=4
  half=$(python3 -c "import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r['case'] == 'torch-$name': print(int(r['result'].get('device_peak', 0) // 2))" "$log")
  [[ ${half:-0} -gt 0 ]] &&
    run "l2l-auto-$name" build/l2l bench/l2l_gpt.lua layers="$layers" dim="$dim" batch=8 \
      micro_batch=4 placement=auto device_budget="$half" plan=auto
done

# The largest width-4096 model whose EPS fits in 80 % of host memory.
host_bytes=$(awk '/MemTotal/ {print $2 * 1024}' /proc/meminfo)
big_layers=$(python3 -c "d=4096; print(max(1, int((0.8*$host_bytes/18 - 51200*d) // (12*d*d + 13*d))))")
((quick)) && big_layers=4
run "l2l-big" build/l2l bench/l2l_gpt.lua layers="$big_layers" dim=4096 batch=16 micro_batch=4 steps=3 \
  accumulate=auto
run "torch-big" python3 bench/torch_gpt.py --layers "$big_layers" --dim 4096 --batch 16 --steps 3
seven_layers=32
((quick)) && seven_layers=4
run "l2l-7b" build/l2l bench/l2l_gpt.lua layers="$seven_layers" dim=4096 batch=16 micro_batch=4 \
  steps=3 state=8bit master=bf16 placement=auto accumulate=auto

((large)) || for batch in 1 2 4 8 16 32; do
  run "cross-$batch" build/l2l bench/l2l_gpt.lua layers=24 dim=2048 batch="$batch" \
    micro_batch=$((batch < 4 ? batch : 4)) steps=3
done

python3 - "$log" "$big_layers" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["case"]] = r["result"]
probe = rows.get("probe", {})
R, bw = probe.get("bf16_gemm_flops", float("nan")), probe.get("h2d_bytes_per_second", float("nan"))
gib = lambda b: "%.2f GiB" % (b / 2**30) if isinstance(b, (int, float)) else "-"
print("GPU: %s, PyTorch %s; bf16 GEMM (8192^3) %.0f TFLOP/s; pinned h2d %.1f GB/s, d2h %.1f GB/s\n"
      % (probe.get("gpu"), probe.get("torch"), R / 1e12, bw / 1e9,
         probe.get("d2h_bytes_per_second", float("nan")) / 1e9))
print("| model | PyTorch tokens/s | PyTorch peak | l2l tokens/s | l2l peak | l2l / PyTorch speed | l2l / PyTorch memory |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in ("124M", "350M", "auto-124M", "auto-350M"):
    t, l = rows.get("torch-" + name.replace("auto-", ""), {}), rows.get("l2l-" + name, {})
    ts, ls = t.get("tokens_per_second"), l.get("tokens_per_second")
    tm, lm = t.get("device_peak"), l.get("device_peak")
    print("| GPT-2 %s | %s | %s | %s | %s | %s | %s |" % (
        name.replace("auto-", "") + (" (l2l: placement auto, half the peak)" if "auto" in name else ""),
        "%.0f" % ts if ts else "-", gib(tm), "%.0f" % ls if ls else "-", gib(lm),
        "%.2f" % (ls / ts) if ts and ls else "-", "%.2f" % (lm / tm) if tm and lm else "-"))
big, tbig = rows.get("l2l-big", {}), rows.get("torch-big", {})
if "tokens_per_second" in big:
    mfu = 6 * big["params"] * big["tokens_per_second"] / R
    print("\nDoes not fit: %d blocks of width 4096, %.2f B parameters, EPS %s on the host (peak resident %s), "
          "accumulate %s (the plan's): l2l %.0f tokens/s, MFU %.1f %%, device peak %s; PyTorch: %s" % (
              int(sys.argv[2]), big["params"] / 1e9, gib(big["host_eps_bytes"]),
              gib(big.get("host_peak_resident")), big.get("accumulate"),
              big["tokens_per_second"],
              100 * mfu, gib(big["device_peak"]),
              "out of memory" if tbig.get("oom") else
              "%.0f tokens/s, peak %s" % (tbig["tokens_per_second"], gib(tbig["device_peak"]))
              if "tokens_per_second" in tbig else "failed"))
seven = rows.get("l2l-7b", {})
if "tokens_per_second" in seven:
    flops = 6 * seven["params"] * seven["tokens_per_second"]
    print("\n7 B shape (32 x 4096 when not --quick), 8-bit AdamW state, bf16 masters, placement auto, "
          "accumulate %s (the plan's): %.2f B parameters, l2l %.0f tokens/s, %.0f TFLOP/s of model FLOPs "
          "(MFU %.1f %%), host EPS %.2f GB a billion parameters (the process's peak resident memory %s), "
          "%s of records on the device, device peak %s" % (
              seven.get("accumulate"), seven["params"] / 1e9, seven["tokens_per_second"], flops / 1e12, 100 * flops / R,
              seven["host_eps_bytes"] / seven["params"],
              "%.2f GB a billion" % (seven["host_peak_resident"] / seven["params"])
              if seven.get("host_peak_resident") else "not read",
              gib(seven["device_records_bytes"]), gib(seven["device_peak"])))
print("\n| tokens per minibatch | step | exposed copy | exposed share | predicted crossover |")
print("|---:|---:|---:|---:|---:|")
for batch in (1, 2, 4, 8, 16, 32):
    c = rows.get("cross-%d" % batch, {})
    if "step_seconds" not in c:
        print("| %d | - | - | - | - |" % (batch * 1024))
        continue
    predicted = c["h2d_bytes"] / c["params"] * R / (6 * bw)
    print("| %d | %.3f s | %.3f s | %.0f %% | %.0f tokens |" % (
        batch * 1024, c["step_seconds"], c["exposed_copy_seconds"],
        100 * c["exposed_copy_seconds"] / c["step_seconds"], predicted))
EOF
