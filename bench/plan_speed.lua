-- SPDX-License-Identifier: MIT
-- bench/plan_speed.lua — how long l2l.plan takes, and how much memory, as the batch and
-- the depth grow (hardening 2, item 7: 2 blocks at a batch of 2^20 took 142 s and 516 MB,
-- 2^24 did not finish in 10 minutes; 800 layers took 14.8 s).
--
-- Run:  build/l2l bench/plan_speed.lua [--repeat 3]
-- Each case plans a model of blocks of width 32 (4 heads) at sequence 16, with rates given
-- (nothing timed), under two budgets: everything fits (1 TiB), and 16 MiB (small
-- micro-batches forced, so that many sizes fit). The figure is the fastest of --repeat
-- plans, and the process's peak resident memory after all of them.
-- Must never: assert: the figures go to bench/RESULTS.md.
local l2l = require("l2l")
local ffi = require("ffi")

ffi.cdef [[ struct plan_speed_ts { long s, ns; }; int clock_gettime(int, struct plan_speed_ts *); ]]
local function now()
  local t = ffi.new("struct plan_speed_ts")
  ffi.C.clock_gettime(1, t)
  return tonumber(t.s) + tonumber(t.ns) * 1e-9
end

local repeats = 3
if arg[1] == "--repeat" then repeats = tonumber(arg[2]) or repeats end

local rates = { flops = 1e12, h2d = 1e10, d2h = 1e10, optimizer = 1e9, visit = 1e-5 }
local function model(blocks)
  local list = { l2l.Embedding { vocab = 256, dim = 32, max_seq = 16 } }
  for _ = 1, blocks do list[#list + 1] = l2l.Block { dim = 32, heads = 4, causal = true } end
  list[#list + 1] = l2l.LMHead { vocab = 256, dim = 32, tie = true }
  return l2l.Sequential(list)
end

local cases = {
  { 2, 2 ^ 10 }, { 2, 2 ^ 16 }, { 2, 2 ^ 20 }, { 2, 2 ^ 24 },
  { 48, 8 }, { 48, 64 }, { 48, 1024 }, { 48, 2 ^ 20 },
  { 188, 2 ^ 20 }, { 800, 8 }, { 800, 1024 },
}
print(("%-7s %-9s %-13s %-12s %s"):format("blocks", "batch", "budget", "seconds", "micro-batch"))
for _, c in ipairs(cases) do
  local m = model(c[1])
  for _, budget in ipairs({ 2 ^ 40, 16 * 2 ^ 20 }) do
    local best, mb = math.huge, "-"
    for _ = 1, repeats do
      local t0 = now()
      local ok, p = pcall(l2l.plan, { model = m, batch = c[2], seq = 16, device_budget = budget, rates = rates })
      best = math.min(best, now() - t0)
      mb = ok and tostring(p.micro_batch) or "(none fits)"
    end
    print(("%-7d %-9d %-13s %-12.4f %s"):format(c[1], c[2], budget == 2 ^ 40 and "1 TiB" or "16 MiB", best, mb))
    io.stdout:flush()
  end
end
local f = io.open("/proc/self/status")
local status = f:read("*a")
f:close()
print(("peak resident memory of the process: %.1f MiB"):format(tonumber(status:match("VmHWM:%s*(%d+)")) / 1024))
