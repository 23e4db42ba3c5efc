-- SPDX-License-Identifier: MIT
-- relay_running_spec — a relay in the middle of a step refuses every other call on it.
-- A layer written in Lua runs inside the relay's step, on the compute thread, and can
-- reach the relay that runs it (a closure, a global): freeing it there used to free the
-- step's own memory under it (a use after free), a nested step ran inside the outer one,
-- and a save or a state read failed with an internal message. Each call is made here from
-- a layer's forward, through Lua and through the C API directly; each must be refused with
-- a message saying a step is running, and the relay must train on afterwards as if the
-- refused step had been one that failed (nothing changed by the refusal itself).
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local ffi = require("ffi")
local C = require("l2l.lib").C

local V, S, B = 13, 6, 4

-- A layer that passes its input through (with one parameter, so the EPS holds a record)
-- and calls `hook` from its forward.
local hook
local Hook = l2l.layer_kind {
  name = "Hook",
  params = function(o) return { { name = "w", shape = { o.dim }, value = 1 } } end,
  forward = function(self, y, x)
    y:copy(x)
    if hook then hook() end
  end,
  backward = function(self, dx, dy) dx:copy(dy) end,
}

local function batch()
  local tok, tgt = {}, {}
  for b = 1, B do
    tok[b], tgt[b] = {}, {}
    for s = 1, S do tok[b][s], tgt[b][s] = support.int(0, V - 1), support.int(0, V - 1) end
  end
  return l2l.tensor(tok, { dtype = "i32" }), l2l.tensor(tgt, { dtype = "i32" })
end

local function new_run()
  local model = l2l.Sequential {
    l2l.Embedding { vocab = V, dim = 16, max_seq = S, seed = support.int(1, 1e6) },
    Hook { dim = 16 },
    l2l.LMHead { vocab = V, dim = 16, seed = support.int(1, 1e6) },
  }
  return l2l.Relay { model = model, micro_batch = 2, optimizer = l2l.AdamW { lr = 1e-2 } }
end

-- Every value of the model's parameters, in order.
local function weights(run)
  run:sync()
  local out = {}
  for _, p in ipairs(run.model:params()) do
    for _, v in ipairs(support.flatten(p.value:totable())) do out[#out + 1] = v end
  end
  return out
end

describe("a relay running a step", function()
  local tokens, targets = batch()
  local path = os.tmpname()
  after_each(function() hook = nil end)
  teardown(function() os.remove(path) end)

  local calls = {
    free = function(run) run:free() end,
    step = function(run) run:step(tokens, targets) end,
    evaluate = function(run) run:evaluate(tokens, targets) end,
    save = function(run) run:save(path) end,
    state = function(run) run:state(run.model:params()[1], "m") end,
    sync = function(run) run:sync() end,
    stats = function(run) run:stats() end,
    set_micro_batch = function(run) run:set_micro_batch(1) end,
    set_stash = function(run) run:set_stash(2, "host") end,
    set_inner = function(run) run:set_inner(2, "keep") end,
    model_freeze = function(run) run.model:freeze(2) end,
    model_remove = function(run) run.model:remove(2) end,
  }
  for name, call in pairs(calls) do
    it("refuses run:" .. name .. " from a layer inside the step, and trains on after it", function()
      local run = new_run()
      run:step(tokens, targets)
      local before = weights(run)
      local inner_ok, inner_err
      hook = function() inner_ok, inner_err = pcall(call, run) end
      local loss = run:step(tokens, targets)   -- the layer caught the refusal: the step runs
      hook = nil
      assert.is_false(inner_ok, "run:" .. name .. " was not refused inside the step")
      assert.is_truthy(tostring(inner_err):find("run:step is running on this relay", 1, true),
                       tostring(inner_err))
      assert.is_true(loss == loss and loss > 0)
      -- the refused call changed nothing: the step went on with the relay as it was
      assert.are.equal(3, C.l2l_relay_layer_count(run.box[0]))
      assert.are.equal(2, run:stats().steps)
      local after = weights(run)
      local moved = 0
      for i = 1, #before do
        if after[i] ~= before[i] then moved = moved + 1 end
      end
      assert.is_true(moved > 0, "the step updated nothing")
      assert.is_true(run:step(tokens, targets) > 0)
      run:free()
    end)
  end

  it("refuses the C API's calls from inside the step: free, step, changes and queries", function()
    local run = new_run()
    local r = run.box[0]
    local loss = ffi.new("double[1]")
    local seen = {}
    hook = function()
      C.l2l_relay_free(r)   -- returns nothing: refused, it leaves the relay whole
      seen.free = ffi.string(C.l2l_last_error())
      local b = ffi.new("l2l_relay_batch")
      seen.step = C.l2l_relay_step(loss, r, b)
      seen.step_message = ffi.string(C.l2l_last_error())
      seen.insert = C.l2l_relay_remove(r, 1)
      seen.micro = C.l2l_relay_set_micro_batch(r, 1)
      seen.count = C.l2l_relay_layer_count(r)
      seen.sync = C.l2l_relay_sync(r)
    end
    -- the hook's calls return statuses; the step they were made in goes on
    assert.is_true(run:step(tokens, targets) > 0)
    hook = nil
    assert.is_truthy(seen.free:find("l2l_relay_free: l2l_relay_step is running on this relay", 1, true), seen.free)
    assert.are.equal(C.L2L_ERR_STATE, seen.step)
    assert.is_truthy(seen.step_message:find("l2l_relay_step: l2l_relay_step is running", 1, true), seen.step_message)
    assert.are.equal(C.L2L_ERR_STATE, seen.insert)
    assert.are.equal(C.L2L_ERR_STATE, seen.micro)
    assert.are.equal(-1, seen.count)
    assert.are.equal(C.L2L_ERR_STATE, seen.sync)
    -- nothing was removed or changed, and the relay is free to use again
    assert.are.equal(3, C.l2l_relay_layer_count(r))
    assert.are.equal(2, run.options.micro_batch)
    assert.is_true(run:step(tokens, targets) > 0)
    run:free()
    assert.is_true(run.box[0] == nil)
  end)

  it("lets a layer run another relay: only the running one refuses", function()
    -- A layer's callback may run a step of a different relay (its own model): only the
    -- running relay is refused. (Evaluating a small helper model from a custom layer is a
    -- legitimate use.)
    local outer, inner = new_run(), new_run()
    local inner_loss
    hook = function()
      hook = nil   -- the inner relay has a Hook layer too
      inner_loss = inner:evaluate(tokens, targets)
    end
    assert.is_true(outer:step(tokens, targets) > 0)
    assert.is_true(inner_loss ~= nil and inner_loss > 0)
    outer:free()
    inner:free()
  end)
end)
