-- SPDX-License-Identifier: MIT
-- bench/soak.lua — does memory come back? Resident memory (RSS) and the host pool's bytes
-- at the start and the end of two long loops (issue 21):
--   layers: N layers created and dropped to Lua's garbage collector (never freed by hand;
--           then N freed by hand, the path that was always flat, for comparison);
--   steps:  a relay trained for N steps while the model changes every 100 (a block
--           inserted, one cloned, one removed, one replaced, in turn), dropped layers
--           left to the collector.
-- A loop that leaks grows with N; a flat one ends where its steady state began.
-- Run:  build/l2l bench/soak.lua [--layers 10000] [--steps 10000] [--every 100]
-- Must never: free anything by hand that a user would leave to the collector (that is
-- the path under test), or assert: the figures go to bench/RESULTS.md.
local l2l = require("l2l")

local opt = { layers = 10000, steps = 10000, every = 100 }
local i = 1
while i <= #arg do
  local key = arg[i]:match("^%-%-(%a+)$")
  if key == nil or opt[key] == nil or tonumber(arg[i + 1]) == nil then
    error("usage: build/l2l bench/soak.lua [--layers N] [--steps N] [--every N]", 0)
  end
  opt[key] = tonumber(arg[i + 1])
  i = i + 2
end

-- Resident set size in MiB, from /proc/self/statm (pages).
local page = tonumber(io.popen("getconf PAGESIZE"):read("*l"))
local function rss_mib()
  local f = assert(io.open("/proc/self/statm"))
  local _, resident = f:read("*n", "*n")
  f:close()
  return resident * page / 2 ^ 20
end

local function host() return l2l.pool_stats("host") end
local function mib(bytes) return bytes / 2 ^ 20 end

local rows = {}
local function record(what, at, count)
  local h = host()
  rows[#rows + 1] = ("| %-7s | %-5s | %6d | %8.1f | %12.2f | %13.2f |"):format(
    what, at, count, rss_mib(), mib(h.current), mib(h.reserved))
end

----------------------------------------------------------------- layers to the collector

-- Figures at `first` (the start of the steady state), a quarter and a half of a loop of n
-- (its end is recorded after it).
local function at_marks(n, first)
  local marks = { [first] = "start" }
  for _, part in ipairs({ { 4, "1/4" }, { 2, "1/2" } }) do
    local at = math.floor(n / part[1])
    if at > first then marks[at] = part[2] end
  end
  return marks
end

local t0 = os.clock()
local marks = at_marks(opt.layers, 100)   -- after the first arenas exist
for n = 1, opt.layers do
  local layer = l2l.Block { dim = 32, heads = 4 }
  layer:nparams()
  if marks[n] then record("layers", marks[n], n) end
end
collectgarbage()
collectgarbage()
record("layers", "end", opt.layers)
local layer_seconds = os.clock() - t0
-- the same loop with layer:free(), for comparison (the path that was always flat)
for n = 1, opt.layers do l2l.Block { dim = 32, heads = 4 }:free() end
record("freed", "end", opt.layers)

----------------------------------------------------------------- training while the model changes

local V, S, B = 64, 16, 8
local function block() return l2l.Block { dim = 32, heads = 4, causal = true, dropout = 0.1 } end
local model = l2l.Sequential { l2l.Embedding { vocab = V, dim = 32, max_seq = S }, block(), block(),
                               l2l.LMHead { vocab = V, dim = 32, tie = true } }
local run = l2l.Relay { model = model, micro_batch = 4, stash = "host", seed = 1,
                        optimizer = l2l.AdamW { lr = 1e-3 } }
local tokens = l2l.zeros({ B, S }, { dtype = "i32" })
local targets = l2l.zeros({ B, S }, { dtype = "i32" })
local draws = l2l.rand({ opt.steps, B, S }, { seed = 1 })
local function batch(step)
  for b = 1, B do
    for s = 1, S do
      local t = math.floor(draws:get(step, b, s) * V)
      tokens:set(b, s, t)
      targets:set(b, s, (t + 1) % V)
    end
  end
  return tokens, targets
end

-- One change in turn; the model keeps 2 to 4 blocks between its embedding and head.
local changes = {
  function() model:insert(2, block()) end,
  function() model:clone(2) end,
  function() model:remove(2) end,
  function() model:replace(2, block()) end,
  function() model:remove(3) end,
}
t0 = os.clock()
local last_loss
marks = at_marks(opt.steps, opt.every)
for step = 1, opt.steps do
  if step % opt.every == 0 then changes[(step / opt.every - 1) % #changes + 1]() end
  last_loss = run:step(batch(step))
  if marks[step] then record("steps", marks[step], step) end
end
run:sync()
collectgarbage()
collectgarbage()
record("steps", "end", opt.steps)
local step_seconds = os.clock() - t0

print(("soak: %d layers created and collected (%.1f s CPU), %d steps with a change every %d (%.1f s CPU), final loss %.3f, %d blocks")
  :format(opt.layers, layer_seconds, opt.steps, opt.every, step_seconds, last_loss, #model - 2))
print("| loop    | at    | count  | RSS MiB  | host in use MiB | host reserved MiB |")
print("|---------|-------|-------:|---------:|-------------:|--------------:|")
for _, r in ipairs(rows) do print(r) end
run:free()
