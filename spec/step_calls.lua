-- SPDX-License-Identifier: MIT
-- spec/step_calls.lua — counts the C calls l2l's Lua front end makes for one relay step,
-- for a model of 2 blocks and one of 8 (run by spec/l2l/relay_step_calls_spec.lua in its own process,
-- and by hand against an older tree for a before-and-after figure).
--   build/l2l spec/step_calls.lua     prints: blocks=N calls=M top=name:count,... per model
-- Every function of the C library the front end reaches goes through a counting wrapper:
-- l2l.lib's C namespace is replaced before any other module captures it.
local lib = require("l2l.lib")
local real = lib.C
local counts, counting = {}, false
lib.C = setmetatable({}, {
  __index = function(_, name)
    local v = real[name]
    if type(v) ~= "cdata" then return v end   -- enum constants are numbers
    return function(...)
      if counting then counts[name] = (counts[name] or 0) + 1 end
      return v(...)
    end
  end,
})
local l2l = require("l2l")

local V, S = 16, 8
local function model_of(blocks)
  local list = { l2l.Embedding { vocab = V, dim = 16, max_seq = S, seed = 1 } }
  for b = 1, blocks do list[#list + 1] = l2l.Block { dim = 16, heads = 2, seed = 1 + b } end
  list[#list + 1] = l2l.LMHead { vocab = V, dim = 16, tie = true }
  return l2l.Sequential(list)
end

local ids = {}
for b = 1, 2 do
  ids[b] = {}
  for s = 1, S do ids[b][s] = (b * 7 + s * 3) % V end
end
local tokens = l2l.tensor(ids, { dtype = "i32" })

for _, blocks in ipairs({ 2, 8 }) do
  local model = model_of(blocks)
  model:freeze(2)   -- a frozen layer: the front end once asked C for each layer's flag
  local run = l2l.Relay { model = model, micro_batch = 1 }
  run:step(tokens, tokens)   -- warm: anything made once
  counts, counting = {}, true
  run:step(tokens, tokens)
  counting = false
  local total, list = 0, {}
  for name, n in pairs(counts) do
    total = total + n
    list[#list + 1] = name .. ":" .. n
  end
  table.sort(list)
  print(("blocks=%d calls=%d top=%s"):format(blocks, total, table.concat(list, ",")))
  run:free()
end
