-- SPDX-License-Identifier: MIT
-- spec/spill/rss.lua — what spec/l2l/relay_spill_spec.lua runs in a process of its own: a GPT of 25 M
-- parameters trained a few steps on the CPU backend, its EPS in memory or with its
-- optimizer state spilled under a host budget a little above the smallest the planner
-- names; then the process's resident memory (its peak, VmHWM, and where it was before
-- the model was made) and the EPS's bytes, as JSON on stdout.
-- Usage: l2l spec/spill/rss.lua DIR memory|spill
local l2l = require("l2l")
local cjson = require("cjson")
local text_mod = require("l2l.text")

local dir, mode = arg[1], arg[2]
local function status(key)
  local f = assert(io.open("/proc/self/status"))
  local t = f:read("*a")
  f:close()
  return tonumber(t:match(key .. ":%s*(%d+) kB")) * 1024
end

local text = {}
for i = 1, 20000 do text[i] = string.char(32 + (i * 7919 + math.floor(i / 7)) % 90) end
text = table.concat(text)
local function model_of(dim, blocks)
  local list = { l2l.Embedding { vocab = 256, dim = dim, max_seq = 16, seed = 1 } }
  for b = 1, blocks do list[#list + 1] = l2l.Block { dim = dim, heads = 4, seed = 1 + b } end
  list[#list + 1] = l2l.LMHead { vocab = 256, dim = dim, tie = true }
  return l2l.Sequential(list)
end
-- every code path warmed on a small model first (the libraries' buffers, the allocator's
-- arenas, the planner's rates), so that the baseline holds them
do
  local small = model_of(64, 1)
  local run = l2l.Relay { model = small, micro_batch = 1, spill = dir, host_budget = 2 ^ 30 }
  for s = 1, 2 do run:step(text_mod.batch(text, 1, 16, 1, s)) end
  run:free()
end
collectgarbage()
local base = status("VmRSS")
local model = model_of(512, 8)
local options = { model = model, micro_batch = 1, optimizer = l2l.AdamW { lr = 1e-4 } }
local budget = 0
if mode == "spill" then
  local plan = l2l.plan { model = model, batch = 1, seq = 16, device_budget = 2 ^ 40, placement = "host", spill = dir,
                          rates = { flops = 1e11, h2d = 1e10, d2h = 1e10, optimizer = 1e9, disk_read = 1e9, disk_write = 1e9 } }
  budget = plan.host_budget_smallest + 16 * 2 ^ 20
  options.spill, options.host_budget = dir, budget
end
local run = l2l.Relay(options)
for s = 1, 4 do
  run:step(text_mod.batch(text, 1, 16, 1, s))
  run:sync()
end
local st = run:stats()
print(cjson.encode({ base = base, peak = status("VmHWM"), eps = st.host_eps_bytes, budget = budget,
                     params = model:nparams(), disk = st.spill_read_bytes }))
