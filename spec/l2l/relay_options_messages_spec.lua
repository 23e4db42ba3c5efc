-- SPDX-License-Identifier: MIT
-- relay_options_messages_spec — the C relay's refusals in Lua's terms (l2l.relay_options.lua_message).
-- C names what it refuses in C's terms: config->field, batch->tokens[0][3], layer 0,
-- micro-batch 0, with the C function's name in front. The error's detail says what the
-- message names and where (l2l_last_error_detail); Lua puts its own words there. Misuses
-- drawn afresh (the seed is in every message) must come out naming the option, the
-- argument, the element and the layer as a Lua user wrote them, counted from 1, with none
-- of C's naming left in.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local option_table = require("l2l.option_table")

local seed = support.seed
local V, D, MAX_SEQ = 7, 8, 6

local function refusal(f)
  local ok, err = pcall(f)
  assert.is_false(ok, "seed " .. seed .. ": expected a refusal")
  return tostring(err)
end

-- None of C's own naming: a field through a struct pointer, a C function's name in front
-- of the words, a layer list's index.
local function no_c_naming(msg)
  for _, c_words in ipairs { "config%->", "batch%->", "layers%[", ": l2l_%l", "^l2l_%l[%w_]*: ",
                             ": [%l_]+_[%l_]+: " } do
    assert.is_falsy(msg:find(c_words), ("seed %d: C's naming %q left in: %s"):format(seed, c_words, msg))
  end
end

local function says(msg, words)
  assert.is_truthy(msg:find(words, 1, true), ("seed %d: %q not in: %s"):format(seed, words, msg))
  no_c_naming(msg)
end

local function model_of(layers)
  local list = { l2l.Embedding { vocab = V, dim = D, max_seq = MAX_SEQ } }
  for _, layer in ipairs(layers or {}) do list[#list + 1] = layer end
  list[#list + 1] = l2l.LMHead { vocab = V, dim = D }
  return l2l.Sequential(list)
end
local function blocks(n)
  local list = {}
  for i = 1, n do list[i] = l2l.Block { dim = D, heads = 2 } end
  return list
end

local function ids(B, S, value)
  local rows = {}
  for b = 1, B do
    rows[b] = {}
    for s = 1, S do rows[b][s] = value or support.int(0, V - 1) end
  end
  return l2l.tensor(rows, { dtype = "i32" })
end

describe("the relay's refusals in Lua's terms", function()
  it("name an option C refused by the option's name", function()
    -- integer options below their row's least value, and non-negative floats below 0: Lua
    -- lets them through (they fit the C field), C's check refuses them
    local drawn = 0
    for _, row in ipairs(option_table.ROWS) do
      local bad
      if row.group == "relay" and (row.type == "int" or row.type == "int64") and row.min > -2 ^ 31 then
        bad = row.min - support.int(1, 1000)
      elseif row.group == "relay" and row.type == "float" and row.min == 0 then
        bad = -support.uniform(1e-3, 1e3)
      end
      if bad ~= nil then
        drawn = drawn + 1
        local msg = refusal(function() l2l.Relay { model = model_of(), [row.name] = bad } end)
        says(msg, ("l2l.Relay: option '%s' must be"):format(row.name))
        if row.field ~= row.name then assert.is_falsy(msg:find(row.field, 1, true), msg) end
      end
    end
    assert.is_true(drawn >= 6, "rows drawn: " .. drawn)
    -- a rule across two options names the first
    says(refusal(function() l2l.Relay { model = model_of(), master = "bf16", precision = "f32" } end),
         "option 'master' bf16 needs precision bf16")
    -- l2l.plan reads the same options and says the same
    local slots = -support.int(1, 50)
    says(refusal(function()
      l2l.plan { model = model_of(blocks(1)), batch = 2, seq = 2, device_budget = 2 ^ 30, param_slots = slots }
    end), "l2l.plan: option 'param_slots' must be")
  end)

  it("name a misplaced or misfit layer by its place in the model, from 1", function()
    local n = support.int(2, 4)
    local k = support.int(2, n + 1)   -- a head in the middle, at k
    local layers = blocks(n)
    layers[k - 1] = l2l.LMHead { vocab = V, dim = D }
    local msg = refusal(function()
      l2l.plan { model = model_of(layers), batch = 2, seq = 2, device_budget = 2 ^ 30 }
    end)
    says(msg, ("l2l.plan: layer %d is a head but not the last"):format(k))
    local run = l2l.Relay { model = model_of(layers) }
    msg = refusal(function() run:step(ids(2, 3), ids(2, 3)) end)
    says(msg, ("run:step: layer %d (LM head) is between the embedding and the head, where only blocks"):format(k))
    run:free()
    -- a block of another width, at k: the relay refuses it as it joins
    layers = blocks(n)
    layers[k - 1] = l2l.Block { dim = 2 * D, heads = 2 }
    says(refusal(function() l2l.Relay { model = model_of(layers) } end),
         ("l2l.Relay: layer %d: the layer has dim %d but the relay's layers have dim %d"):format(k, 2 * D, D))
  end)

  it("name the batch's arguments as run:step takes them, and an element as :get reads it", function()
    local run = l2l.Relay { model = model_of(blocks(1)) }
    local B, S = support.int(1, 3), support.int(1, MAX_SEQ)
    local b, s, bad = support.int(1, B), support.int(1, S), V + support.int(0, 100)
    local tokens = ids(B, S)
    tokens:set(b, s, bad)
    says(refusal(function() run:step(tokens, ids(B, S)) end),
         ("run:step: tokens:get(%d, %d) = %d is outside [0, %d)"):format(b, s, bad, V))
    local targets = ids(B, S)
    targets:set(b, s, bad)
    says(refusal(function() run:evaluate(ids(B, S), targets) end),
         ("run:evaluate: targets:get(%d, %d) = %d is outside [0, %d) and not -1"):format(b, s, bad, V))
    says(refusal(function() run:step(ids(B, S), ids(B, S, -1)) end), "run:step: targets has no target other than -1")
    says(refusal(function() run:step(ids(B, MAX_SEQ + 1), ids(B, MAX_SEQ + 1)) end),
         ("run:step: tokens: sequence length %d exceeds max_seq %d"):format(MAX_SEQ + 1, MAX_SEQ))
    says(refusal(function() run:step(ids(B, S), ids(B, S), { token_types = ids(B, S, 0) }) end),
         "run:step: opts.token_types given but the embedding has type_vocab 0")
    local mask = l2l.tensor({ { 1, 1 }, { 1, 1 }, { 1, 1 }, { 1, 1 } }, { dtype = "u8" })
    says(refusal(function() run:step(ids(B, S), ids(B, S), { key_mask = mask }) end),
         "run:step: opts.key_mask is u8 (4,2)")
    run:free()
  end)
end)
