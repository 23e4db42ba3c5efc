-- SPDX-License-Identifier: MIT
-- scripts/fuzz/inputs.lua — the fuzzer's inputs beyond checkpoints (scripts/fuzz_load.lua
-- loads it): mutations of a tokenizer's two files (encoder.json, vocab.bpe) and hostile
-- option tables for the planner (l2l.plan), written as Lua text a child reads back. (A
-- GPT-2 file for l2l.import_gpt2 is a safetensors file: the checkpoint mutations serve it.)
--
-- Purpose: the tokenizer and the planner take input from users as the loaders do, so the
-- same classes hold for them: a clean error naming the function, or a result that works;
-- never a crash, a hang (a planner that takes minutes is one) or an internal error.
-- Must never: call l2l (the parent makes inputs; the children use them), or draw
-- randomness from anything but math.random (case K of seed S is the same every run).
local G = ...
local rint, chance, pick = G.rint, G.chance, G.pick

local M = {}

----------------------------------------------------------------- the tokenizer's files

-- Edits of encoder.json's text that keep it JSON-like: an id made hostile, a token
-- doubled or dropped, a non-object, deep nesting, a huge id count.
local IDS = { "-1", "1e999", "0.5", "2147483648", "9007199254740993", "1e308", '"7"', "null", "true",
              "[]", "{}", "-0", "4294967296" }
local function encoder_edit(text)
  local v = rint(1, 7)
  if v == 1 then   -- one id replaced
    local n, at = 0, rint(1, 250)
    local out = text:gsub(": (%d+)", function(id)
      n = n + 1
      if n == at then return ": " .. pick(IDS) end
    end)
    return out, "id " .. at .. " made hostile"
  elseif v == 2 then   -- one token's id given to another token too
    local a, b = rint(0, 300), rint(0, 300)
    return (text:gsub(": " .. a .. "([,}])", ": " .. b .. "%1", 1)), ("id %d given as %d (twice)"):format(a, b)
  elseif v == 3 then   -- an entry removed (a byte token missing, a merge's result missing)
    local at, n = rint(1, 270), 0
    return (text:gsub('"[^"]*": %d+, ', function(e)
      n = n + 1
      if n == at then return "" end
    end)), "entry " .. at .. " removed"
  elseif v == 4 then
    return pick({ "[]", "null", "1", '"x"', "{}", "", "{" .. ("{"):rep(2000) }), "not an object"
  elseif v == 5 then   -- a very long token
    return text:gsub("^{", '{"' .. ("x"):rep(rint(1000, 200000)) .. '": 99999, ', 1), "a long token added"
  elseif v == 6 then   -- many extra entries
    local extra = {}
    for i = 1, rint(100, 5000) do extra[i] = ('"t%d": %d'):format(i, rint(0, 2 ^ 30)) end
    return text:gsub("^{", "{" .. table.concat(extra, ", ") .. ", ", 1), "entries added"
  end
  return text:gsub('"<|endoftext|>": %d+', '"<|endoftext|>": ' .. pick(IDS)), "the end-of-text id made hostile"
end

-- Edits of vocab.bpe: merges of tokens that do not exist, lines of one or three parts,
-- blank and very long lines, the version line gone, duplicate merges.
local function vocab_edit(text)
  local v = rint(1, 7)
  local lines = {}
  for line in text:gmatch("[^\n]*\n?") do if line ~= "" then lines[#lines + 1] = line end end
  local at = rint(1, #lines)
  if v == 1 then
    lines[at] = pick({ "zz qq\n", "\n", "a\n", "a b c\n", " \n", "  \n", "\t\n", "Ġ\n", "\255\254 a\n" })
    return table.concat(lines), "line " .. at .. " replaced"
  elseif v == 2 then
    table.insert(lines, at, lines[rint(1, #lines)])
    return table.concat(lines), "a line doubled at " .. at
  elseif v == 3 then
    lines[1] = pick({ "", "#version: 9\n", "version 0.2\n", "\n" })
    return table.concat(lines), "the version line changed"
  elseif v == 4 then
    lines[at] = ("a"):rep(rint(1000, 500000)) .. " b\n"
    return table.concat(lines), "a long line at " .. at
  elseif v == 5 then
    local extra = {}
    for i = 1, rint(100, 20000) do extra[i] = ("x%d y%d\n"):format(i, i) end
    return table.concat(lines) .. table.concat(extra), "merges of unknown tokens appended"
  elseif v == 6 then
    return text:gsub("\n", "\r\n"), "CRLF line ends"
  end
  return table.concat(lines, "\0"), "NUL between lines"
end

-- A case of the tokenizer: which file is changed, and its text. The byte mutations of
-- scripts/fuzz/mutations.lua apply too (B: bytes, splice, truncate, tail).
function M.tokenizer_case(base, B)
  local which = chance(0.5) and "encoder" or "vocab"
  local text = base[which]
  local what
  if chance(0.6) then
    text, what = (which == "encoder" and encoder_edit or vocab_edit)(text)
  else
    local name = pick({ "bytes", "splice", "truncate", "tail" })
    text, what = B[name](text, 0)
    what = name .. ": " .. what
  end
  return "tokenizer_" .. which, text, which .. ": " .. what
end

----------------------------------------------------------------- the planner's options

local function hostile_lua_number()
  return pick({ 0, -1, 1, 2, 0.5, 1.5, 2 ^ 24, 2 ^ 24 + 1, 2 ^ 31, 2 ^ 32, 2 ^ 53, 2 ^ 53 + 2, 2 ^ 63,
                2 ^ 64, 1e308, -1e308, 1e-300, 1e-46, 0 / 0, math.huge, -math.huge, rint(1, 4096),
                rint(1, 2 ^ 20), "8", true, {} })
end

-- A number, mostly sensible (so that cases get past the first check), sometimes hostile.
local function option_number(sensible)
  if chance(0.75) then return sensible end
  return hostile_lua_number()
end

-- The options of an l2l.plan call: the model's size (blocks, dim, heads: the child builds
-- it), the batch, the budget, rates, relay settings; some keys unknown or mistyped.
function M.plan_case()
  local o = {
    blocks = pick({ 1, 2, 4, 12, 48, rint(1, 64) }),   -- (48 blocks: seconds at most, docs/design.md)
    dim = pick({ 8, 16, 32 }),
    batch = option_number(pick({ 1, 2, 7, 64, 1000, 2 ^ 16, 2 ^ 20, 2 ^ 24, rint(1, 2 ^ 24) })),
    seq = option_number(pick({ 1, 4, 8 })),
    device_budget = option_number(pick({ 1, 2 ^ 10, 2 ^ 20, 2 ^ 26, 2 ^ 30, 2 ^ 40, 2 ^ 53 - 1, rint(1, 2 ^ 30) })),
  }
  o.rates = { flops = 1e12, h2d = 1e10, d2h = 1e10, optimizer = 1e9, visit = 1e-5 }
  if chance(0.3) then
    local k = pick({ "flops", "h2d", "d2h", "optimizer", "visit", "shared", "bogus" })
    o.rates[k] = hostile_lua_number()
  end
  if chance(0.1) then o.rates = hostile_lua_number() end
  for _, k in ipairs({ "param_slots", "accumulate", "clip_global_norm", "loss_scale" }) do
    if chance(0.15) then o[k] = hostile_lua_number() end
  end
  if chance(0.15) then o.precision = pick({ "f32", "bf16", "f16", "f64", "", 1 }) end
  if chance(0.15) then o.grad_precision = pick({ "f32", "bf16", "f16", "x" }) end
  if chance(0.1) then o.token_types = pick({ true, false, 1, "yes" }) end
  if chance(0.05) then o[pick({ "bacth", "budget", "seqs", "" })] = 1 end
  return o
end

-- The options as Lua text (read back by the child with load, in an empty environment).
local function lua_value(v)
  local t = type(v)
  if t == "number" then
    if v ~= v then return "0/0" elseif v == math.huge then return "1/0" elseif v == -math.huge then return "-1/0" end
    return ("%.17g"):format(v)
  elseif t == "string" then return ("%q"):format(v)
  elseif t == "table" then
    local parts = {}
    for k, x in pairs(v) do parts[#parts + 1] = ("[%s] = %s"):format(lua_value(k), lua_value(x)) end
    table.sort(parts)
    return "{ " .. table.concat(parts, ", ") .. " }"
  end
  return tostring(v)
end

function M.plan_text(o) return "return " .. lua_value(o) .. "\n" end

-- A case of the planner: its options as text, and what they are in brief.
function M.plan_input()
  local o = M.plan_case()
  return M.plan_text(o), ("blocks %s, batch %s, seq %s, budget %s"):format(
    tostring(o.blocks), tostring(o.batch), tostring(o.seq), tostring(o.device_budget))
end

return M
