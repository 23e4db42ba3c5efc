-- SPDX-License-Identifier: MIT
-- bench/compact_curves.lua — loss curves with the optimizer state in f32, bf16 and 8 bits,
-- and bf16 masters (issue 33): examples/train_gpt.lua run for each configuration and seed, the final
-- validation losses in a table (each precision's mean against f32's, and whether it lies
-- within f32's own seed-to-seed spread or 1 % of its mean, whichever is larger), and the
-- validation curves in one picture.
-- Two runs: "demo" (make demo's 4-block byte-level GPT, 400 steps) and "tokens" (a
-- 12-block GPT over GPT-2's tokens, dim 64, 150 steps of 8 x 64 tokens). Validation
-- losses over 8 minibatches, the same ones for every precision of a seed.
-- Run: build/l2l bench/compact_curves.lua [--runs demo,tokens] [--seeds 3] [--out DIR]
--        [--configs f32,bf16,8bit,8bit+bf16-master,bf16-master] [--report yes: the runs already
--        made alone, none started; a seed missing is "-" and the mean is of the others]
--   (on 2 cores: the demo about 4 minutes a run, the tokens one about 3; 9 runs each)
local plot = require("l2l.plot")

local args = { runs = "demo,tokens", seeds = 3, out = "build/compact_curves",
               configs = "f32,bf16,8bit,8bit+bf16-master", report = "no" }
local i = 1
while i <= #arg do
  local k = arg[i]:match("^%-%-(.+)$")
  if k == nil or args[k] == nil or arg[i + 1] == nil then
    io.stderr:write("usage: bench/compact_curves.lua [--runs demo,tokens] [--seeds N] [--out DIR] [--configs LIST] "
                    .. "[--report yes]\n")
    os.exit(2)
  end
  args[k] = type(args[k]) == "number" and tonumber(arg[i + 1]) or arg[i + 1]
  i = i + 2
end

local RUNS = {
  demo = { title = "demo: 4 blocks over bytes, 400 steps", flags = "" },
  tokens = { title = "12 blocks over GPT-2 tokens, dim 64, 150 steps",
             flags = "--tokenizer gpt2 --layers 12 --dim 64 --heads 4 --steps 150 --batch 8 --micro-batch 4 " ..
                     "--seq 64 --lr 3e-3 --warmup 10" },
}
-- The configurations: AdamW's state precision, and bf16 masters (precision bf16 with them).
-- f32 is the reference every other is held against; a run's folder is kept, so a second
-- call with other configs reuses the f32 runs already made (and any other).
local CONFIGS = { f32 = "--state f32", bf16 = "--state bf16", ["8bit"] = "--state 8bit",
                  ["8bit+bf16-master"] = "--state 8bit --master bf16",
                  ["bf16-master"] = "--state f32 --master bf16" }
local STATES = {}
for c in ("f32," .. args.configs):gmatch("[^,]+") do
  assert(CONFIGS[c], "unknown config " .. c)
  local seen = false
  for _, x in ipairs(STATES) do seen = seen or x == c end
  if not seen then STATES[#STATES + 1] = c end
end
local exe = arg[-1] or "build/l2l"

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("*a")
  local ok = p:close()
  return ok, out
end

local panels, lines = {}, {}
for name in args.runs:gmatch("[^,]+") do
  local run = assert(RUNS[name], "unknown run " .. name)
  local final, series = {}, {}
  for _, st in ipairs(STATES) do
    final[st] = {}
    for seed = 1, args.seeds do
      local dir = ("%s/%s-%s-%d"):format(args.out, name, st, seed)
      local cmd = ("%s examples/train_gpt.lua %s %s --seed %d --out %s --sample 0 --plot none --eval-batches 8"):format(
        exe, run.flags, CONFIGS[st], seed, dir)
      local t0 = os.time()
      local done = io.open(dir .. "/done")
      if done then done:close() elseif args.report == "yes" then   -- what is there, no more
        goto next_seed
      else
        local ok, out = sh(cmd)
        if not ok then error(cmd .. "\n" .. out) end
        io.open(dir .. "/done", "w"):close()
      end
      local records = plot.read_metrics(dir .. "/metrics.jsonl")
      local xs, ys = {}, {}
      for _, r in ipairs(records) do
        if r.val_loss then xs[#xs + 1], ys[#ys + 1] = r.step, r.val_loss end
      end
      final[st][seed] = ys[#ys]
      series[#series + 1] = { name = ("%s seed %d"):format(st, seed), x = xs, y = ys }
      io.stderr:write(("%s %s seed %d: final validation %.4f (%d s)\n"):format(name, st, seed, ys[#ys], os.time() - t0))
      ::next_seed::
    end
  end
  local function mean(t) local s = 0 for _, v in ipairs(t) do s = s + v end return s / #t end
  local f = final.f32
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(f) do lo, hi = math.min(lo, v), math.max(hi, v) end
  local allowed = math.max(hi - lo, 0.01 * mean(f))
  lines[#lines + 1] = ("\n%s (%d seeds; f32's spread %.4f, 1 %% of its mean %.4f: allowed %.4f)\n"):format(
    run.title, args.seeds, hi - lo, 0.01 * mean(f), allowed)
  lines[#lines + 1] = "| state | final validation loss per seed | mean | - f32's (by seed) | within |"
  lines[#lines + 1] = "|---|---|---:|---:|---|"
  for _, st in ipairs(STATES) do
    -- the difference paired by seed (the same data and validation batches), over the seeds
    -- both have: with every seed, the difference of the means
    local vals, got, diffs = {}, {}, {}
    for s = 1, args.seeds do
      vals[s] = final[st][s] and ("%.4f"):format(final[st][s]) or "-"
      got[#got + 1] = final[st][s]
      if final[st][s] and f[s] then diffs[#diffs + 1] = final[st][s] - f[s] end
    end
    final[st] = got
    if #diffs == 0 then
      lines[#lines + 1] = ("| %s | %s | - | - | not run |"):format(st, table.concat(vals, ", "))
      goto next_state
    end
    local d = mean(diffs)
    lines[#lines + 1] = ("| %s | %s | %.4f | %+.4f | %s |"):format(st, table.concat(vals, ", "), mean(final[st]), d,
      st == "f32" and "-" or (math.abs(d) <= allowed and "yes" or "no") .. (#diffs < args.seeds and
      (" (%d seed%s)"):format(#diffs, #diffs == 1 and "" or "s") or ""))
    ::next_state::
  end
  panels[#panels + 1] = { title = run.title .. ": validation loss", xlabel = "step", ylabel = "loss (nats)",
                          series = series }
  -- the second half again, where the runs would part if they did
  local late = {}
  for i, sr in ipairs(series) do
    local last = sr.x[#sr.x]
    late[i] = { name = sr.name, x = {}, y = {} }
    for j = 1, #sr.x do
      if sr.x[j] >= last / 2 then late[i].x[#late[i].x + 1], late[i].y[#late[i].y + 1] = sr.x[j], sr.y[j] end
    end
  end
  panels[#panels + 1] = { title = run.title .. ": the second half", xlabel = "step", ylabel = "loss (nats)",
                          series = late }
end
print(table.concat(lines, "\n"))
if #panels > 0 then
  local path = plot.write(args.out .. "/compact_curves", { title = "AdamW: f32 against compact state and bf16 masters",
                                                           panels = panels }, { format = "svg" })
  print("\npicture: " .. tostring(path))
end
