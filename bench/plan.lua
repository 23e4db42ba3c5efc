-- SPDX-License-Identifier: MIT
-- bench/plan.lua — the planner against the relay it plans for (issue 22): for two model
-- shapes and three device budgets, the plan's predicted step time and device peak beside
-- the measured ones, and the auto plan's measured step beside the best fixed policy that
-- fits, all measured in one run.
--
-- Run:  build/l2l bench/plan.lua [--steps 5] [--only gpt2|deep]
-- Models: a GPT-2 124M-like model (12 blocks of dim 768, 12 heads, vocab 50257, tied head;
-- batch 4 x 64 tokens) and a deep narrow one (48 blocks of dim 256, 4 heads, vocab 1024;
-- batch 8 x 128). Budgets: everything fits (1 TiB); half way between the leanest plan's
-- peak and the peak with every layer kept (about half the activations fit); and 1.15 x
-- the leanest plan's peak (only a few layers fit). Fixed policies: L2L's default (all
-- recompute, host stash), all keep with device stash, all swap; each at the largest
-- micro-batch that fits the budget (tried from B down).
-- Times are medians of --steps steps after one warm-up step. Rates come from the cache
-- (l2l.calibrate measures them once).
-- Must never: assert: the figures go to bench/RESULTS.md.
local l2l = require("l2l")
local ffi = require("ffi")

ffi.cdef [[ struct bench_ts { long s, ns; }; int clock_gettime(int, struct bench_ts *); ]]
local function now()
  local t = ffi.new("struct bench_ts")
  ffi.C.clock_gettime(1, t)
  return tonumber(t.s) + tonumber(t.ns) * 1e-9
end

local opt = { steps = 5, only = "" }
for i = 1, #arg, 2 do
  local key = arg[i]:match("^%-%-(%a+)$")
  if key == nil or opt[key] == nil then error("usage: build/l2l bench/plan.lua [--steps N] [--only gpt2|deep]", 0) end
  opt[key] = type(opt[key]) == "number" and tonumber(arg[i + 1]) or arg[i + 1]
end

local SHAPES = {
  { name = "gpt2", blocks = 12, dim = 768, heads = 12, vocab = 50257, B = 4, S = 64 },
  { name = "deep", blocks = 48, dim = 256, heads = 4, vocab = 1024, B = 8, S = 128 },
}

local function build(shape)
  local list = { l2l.Embedding { vocab = shape.vocab, dim = shape.dim, max_seq = shape.S, seed = 1 } }
  for b = 1, shape.blocks do
    list[#list + 1] = l2l.Block { dim = shape.dim, heads = shape.heads, causal = true, seed = 1 + b }
  end
  list[#list + 1] = l2l.LMHead { vocab = shape.vocab, dim = shape.dim, tie = true, seed = 999 }
  return l2l.Sequential(list)
end

local function batch(shape)
  local tok = l2l.zeros({ shape.B, shape.S }, { dtype = "i32" })
  local tgt = l2l.zeros({ shape.B, shape.S }, { dtype = "i32" })
  local r = l2l.rand({ shape.B, shape.S }, { seed = 7 })
  for b = 1, shape.B do
    for s = 1, shape.S do
      local t = math.floor(r:get(b, s) * shape.vocab)
      tok:set(b, s, t)
      tgt:set(b, s, (t + 1) % shape.vocab)
    end
  end
  return tok, tgt
end

local function median(list)
  table.sort(list)
  return list[math.floor((#list + 1) / 2)]
end

-- Steps the run: the median step seconds and the device peak, or nil and the error.
local function measure(run, tok, tgt)
  local ok, err = pcall(run.step, run, tok, tgt)
  if not ok then return nil, err end
  local times, peak = {}, 0
  for i = 1, opt.steps do
    run:step(tok, tgt)
    local st = run:stats()
    times[i] = st.step_seconds
    peak = math.max(peak, st.device_peak)
  end
  return median(times), peak, run:stats()
end

local function mib(b) return b / 2 ^ 20 end

local function relay_with(model, budget, o)
  o.model, o.device_budget, o.optimizer = model, budget, l2l.AdamW { lr = 1e-4 }
  return l2l.Relay(o)
end

-- A fixed policy at the largest micro-batch that fits: its median step and peak.
local function fixed(model, shape, budget, tok, tgt, stash, inner)
  for mb = shape.B, 1, -1 do
    local run = relay_with(model, budget, { micro_batch = mb, stash = stash, inner = inner })
    local t, peak = measure(run, tok, tgt)
    run:free()
    collectgarbage()
    if t then return t, mb, peak end
  end
end

print(("bench/plan: %d compute threads, %d steps a measurement"):format(l2l.threads(), opt.steps))
print("| model | budget MiB | plan: micro-batch, policies | step s predicted / measured | peak MiB predicted / measured | default / all keep / all swap (s, mb) | auto vs best fixed |")
print("|---|---:|---|---:|---:|---|---:|")
for _, shape in ipairs(SHAPES) do
  if opt.only == "" or opt.only == shape.name then
    local model = build(shape)
    local tok, tgt = batch(shape)
    local roomy = l2l.plan { model = model, batch = shape.B, seq = shape.S, device_budget = 2 ^ 40 }
    -- the leanest plan's peak: plan for a budget a byte too small to learn it
    local ok, err = pcall(l2l.plan, { model = model, batch = shape.B, seq = shape.S, device_budget = 1 })
    local smallest = assert(tonumber(tostring(err):match("the smallest needs (%d+) bytes")), err)
    local budgets = { 2 ^ 40, math.floor((smallest + roomy.device_peak) / 2), math.floor(1.15 * smallest) }
    for _, budget in ipairs(budgets) do
      local t0 = now()
      local plan = l2l.plan { model = model, batch = shape.B, seq = shape.S, device_budget = budget }
      local plan_seconds = now() - t0
      local counts = {}
      for _, l in ipairs(plan.layers) do
        local k = l.inner .. "/" .. l.stash
        counts[k] = (counts[k] or 0) + 1
      end
      local modes = {}
      for k, n in pairs(counts) do modes[#modes + 1] = n .. " " .. k end
      table.sort(modes)
      local run = relay_with(model, budget, { plan = plan })
      local t, peak, st = measure(run, tok, tgt)
      run:free()
      collectgarbage()
      local results, best = {}, math.huge
      for _, policy in ipairs({ { "host", "recompute" }, { "device", "keep" }, { "device", "swap" } }) do
        local ft, fmb = fixed(model, shape, budget, tok, tgt, policy[1], policy[2])
        results[#results + 1] = ft and ("%.3f (%d)"):format(ft, fmb) or "does not fit"
        if ft then best = math.min(best, ft) end
      end
      print(("| %s | %s | %d: %s (planned in %.0f ms) | %.3f / %s | %.2f / %s | %s | %s |"):format(
        shape.name, budget >= 2 ^ 40 and "1 TiB" or ("%.2f"):format(mib(budget)), plan.micro_batch,
        table.concat(modes, ", "), plan_seconds * 1e3, plan.step_seconds, t and ("%.3f"):format(t) or "failed: " .. tostring(peak),
        mib(plan.device_peak), t and ("%.2f"):format(mib(peak - (st.predicted_device_peak - plan.device_peak))) or "-",
        table.concat(results, " / "), (t and best < math.huge) and ("%.3f"):format(t / best) or "-"))
      io.stdout:flush()
    end
  end
end
