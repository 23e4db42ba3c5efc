-- SPDX-License-Identifier: MIT
-- relay_options_spec — numeric settings are checked as C will hold them (hardening 2, item 9).
-- Lua numbers are doubles; the C configs keep most settings in floats. A value that
-- passes a check as a double can change meaning in f32: clip_global_norm = 1e-46 passed
-- "> 0" and became 0.0f, which turned clipping off; lr = 1e-46 became 0; a beta of
-- 1 - 1e-11 became 1; 1e39 became inf; and an integer option of 1e300 overflowed int64.
-- Each is refused with a message saying what the f32 (or the range) made of it; values
-- that survive the conversion are still taken.
local support = dofile("spec/support.lua")
local l2l = require("l2l")

local function refused(pattern, f)
  local ok, err = pcall(f)
  assert.is_false(ok, "expected a refusal matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern, 1, true), tostring(err))
end

-- A number that is nonzero as a double and 0 in f32: below half the smallest subnormal
-- (2^-150), drawn afresh.
local function vanishing() return support.uniform(1e-60, 6e-46) end
-- A number that is finite as a double and inf in f32: above f32's largest (3.4028e38).
local function overflowing() return support.uniform(3.5e38, 1e300) end

describe("settings kept in C floats", function()
  local model = function()
    return l2l.Sequential { l2l.Embedding { vocab = 5, dim = 8, max_seq = 3 }, l2l.LMHead { vocab = 5, dim = 8 } }
  end

  it("refuse a relay's clipping and loss scale that f32 turns to 0 or inf", function()
    local tiny = vanishing()
    refused("option 'clip_global_norm' is " .. tostring(tiny) .. ", which is 0 in f32",
            function() l2l.Relay { model = model(), clip_global_norm = tiny } end)
    refused("option 'clip_layer_norm' is", function() l2l.Relay { model = model(), clip_layer_norm = vanishing() } end)
    refused("which is inf in f32", function() l2l.Relay { model = model(), clip_global_norm = overflowing() } end)
    -- the smallest f32 subnormal survives, and is taken
    l2l.Relay { model = model(), clip_global_norm = 2 ^ -149 }:free()
  end)

  it("refuse optimizer settings that f32 changes", function()
    refused("option 'lr' must be a finite number >= 0, got", function() l2l.AdamW { lr = vanishing() } end)
    refused("which is 0 in f32", function() l2l.SGD { lr = vanishing() } end)
    refused("which is inf in f32", function() l2l.LAMB { lr = overflowing() } end)
    refused("option 'eps' must be a finite number > 0", function() l2l.AdamW { eps = vanishing() } end)
    refused("option 'weight_decay'", function() l2l.AdamW { weight_decay = vanishing() } end)
    -- in [0, 1) as a double, 1 in f32 (anything above 1 - 2^-25 rounds up)
    local near_one = 1 - support.uniform(1e-12, 2 ^ -26)
    refused("option 'beta1' must be a number in [0, 1), got", function() l2l.AdamW { betas = { near_one, 0.999 } } end)
    refused("which is 1 in f32", function() l2l.SGD { momentum = near_one } end)
    refused("option 'final_ratio'", function() l2l.CosineLR { total = 10, final_ratio = vanishing() } end)
    -- lr = 0 (off) and values f32 keeps are taken
    assert.are.equal(0, l2l.AdamW { lr = 0 }.lr)
    assert.is_true(l2l.AdamW { lr = 1e-30 }.lr > 0)
  end)

  it("refuse layer settings that f32 changes", function()
    refused("option 'dropout' must be in [0, 1), got", function() l2l.Block { dim = 8, heads = 2, dropout = vanishing() } end)
    refused("option 'eps'", function() l2l.Block { dim = 8, heads = 2, eps = vanishing() } end)
    refused("option 'init_std'", function() l2l.Embedding { vocab = 4, dim = 4, max_seq = 2, init_std = overflowing() } end)
  end)

  it("refuse schedule lengths past 2^53 (C's int64, and exact in Lua)", function()
    refused("option 'total' must be an integer from 1 to 2^53", function() l2l.CosineLR { total = 1e300 } end)
    refused("option 'warmup' must be an integer from 0 to 2^53", function() l2l.LinearLR { total = 10, warmup = 2 ^ 60 } end)
  end)
end)

describe("plans are checked against the model they are used with", function()
  local V, S = 13, 8
  local function gpt(dim, heads)
    return l2l.Sequential {
      l2l.Embedding { vocab = V, dim = dim, max_seq = S },
      l2l.Block { dim = dim, heads = heads },
      l2l.LMHead { vocab = V, dim = dim },
    }
  end
  local rates = { flops = 1e10, h2d = 1e10, d2h = 1e10, optimizer = 1e10, visit = 0 }
  local function plan_for(model, o)
    o = o or {}
    return l2l.plan { model = model, batch = 4, seq = o.seq or S, device_budget = 2 ^ 30, rates = rates,
                      precision = o.precision }
  end

  it("refuses a plan made for another model, naming the first layer that differs", function()
    local dim = 8 * support.int(2, 6)
    local p = plan_for(gpt(dim, 2))
    -- the same kinds and count, another width of block: refused, nothing changed
    refused("the plan was made for another model: layer 1 is embedding (dim " .. (dim + 8),
            function() l2l.Relay { model = gpt(dim + 8, 2), plan = p } end)
    -- another head count: the config differs where the description shows it
    refused("layer 2 is block (dim " .. dim .. ", heads 4",
            function() l2l.Relay { model = gpt(dim, 4), plan = p } end)
    -- a frozen layer the plan did not know
    local m = gpt(dim, 2)
    m:freeze(2)
    refused("layer 2 is frozen block", function() l2l.Relay { model = m, plan = p } end)
    -- other relay settings than the plan's
    refused("the plan was made for other relay settings",
            function() l2l.Relay { model = gpt(dim, 2), plan = plan_for(gpt(dim, 2), { precision = "bf16" }), precision = "f32" } end)
    -- the model it was made for (other weights: the seed is not part of a plan) takes it
    local run = l2l.Relay { model = gpt(dim, 2), plan = p }
    assert.are.equal(p.micro_batch, run.options.micro_batch)
    run:free()
  end)

  it("refuses settings the relay would refuse (f16 gradients need loss scaling)", function()
    -- the plan was made, and the relay then refused it (found by the fuzzer: l2l.plan)
    refused("option 'grad_precision' f16 needs loss_scale > 0",
            function() l2l.plan { model = gpt(16, 2), batch = 4, seq = S, device_budget = 2 ^ 30, rates = rates,
                                  precision = "bf16", grad_precision = "f16" } end)
  end)

  it("refuses seq above the embedding's max_seq", function()
    refused("seq " .. (S + 1) .. " is above the embedding's max_seq " .. S,
            function() plan_for(gpt(16, 2), { seq = S + 1 }) end)
  end)
end)
