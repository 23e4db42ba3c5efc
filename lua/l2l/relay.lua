-- SPDX-License-Identifier: MIT
-- l2l.relay — l2l.Relay: training a Sequential layer to layer through the eager parameter
-- server (the C relay of include/l2l/relay.h).
--
--   local run = l2l.Relay{ model = model, micro_batch = 8, stash = "host",
--                          optimizer = l2l.AdamW{ lr = 3e-4 }, schedule = l2l.CosineLR{ total = 1000 } }
--   local loss = run:step(tokens, targets)          -- (B,S) i32 host tensors; -1 ignored
--
-- Purpose: options checked in Lua (an error names the option), the C relay kept alive
-- and freed (ffi.gc and run:free()), and the model as a view of the C relay's list: the
-- relay follows its Sequential (model.follow), so each change a script makes between
-- steps (insert, add, remove, replace, clone, freeze) is made in C at once, or refused
-- with C's reason and not made at all. Lua indices are 1-based (layer i is C's layer i-1;
-- boundary i is the input of layer i); errors name the layer.
-- Must never: compute anything of the step in Lua, or keep a list of its own beside C's.
local ffi = require("ffi")
local jit = require("jit")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local tensor = require("l2l.tensor")
local layers = require("l2l.layers")
local model_mod = require("l2l.model")
local optim = require("l2l.optim")
local plan_mod = require("l2l.plan")
local options = require("l2l.relay_options")

local C, check, handle_of, check_call = lib.C, lib.check, tensor.handle_of, layers.check_call
local address, too_many = layers.address, argcheck.too_many
local type, tostring, pairs, ipairs, floor, select = type, tostring, pairs, ipairs, math.floor, select

local M = {}
local Relay = {}
Relay.__index = Relay

local stash_ids, inner_ids = options.stash_ids, options.inner_ids
local phase_names = {
  [0] = "forward", "backward", "rebuild", "params_in", "grads_out", "stash_out", "stash_in",
  "swap_out", "swap_in", "update", "wait_copy", "wait_update", "reduce_scatter", "all_gather",
}
M.phase_names = phase_names

-- The device pool's stats (its budget is the process's cap over every relay).
local function device_pool()
  local pool = ffi.new("l2l_pool_stats")
  C.l2l_pool_get_stats(pool, C.L2L_POOL_DEVICE)
  return pool
end

local function relay_gc(box)
  local r = box[0]
  if r == nil then return end
  box[0] = nil
  C.l2l_relay_free(r)   -- waits for pending updates, frees the EPS and layers freed while held
end

----------------------------------------------------------------- options

local fail, lua_message = options.fail, options.lua_message

local OPTIONS = {}   -- (relay_options.OPTIONS: the one list, which checkpoints keep)
for name in pairs(options.OPTIONS) do OPTIONS[name] = true end

-- The options of l2l.Relay: the model (a Sequential, or a list made one), the plan, and
-- the settings relay_options reads.
local function read_options(o, fname)
  o = argcheck.options(o, OPTIONS, fname, 0)
  if o.accumulate == "auto" then
    fail(fname .. ": option 'accumulate' \"auto\" is the plan's choice: l2l.plan{accumulate = \"auto\", ...}, "
         .. "then l2l.Relay{plan = plan} takes it")
  end
  if plan_mod.is_plan(o.plan) then   -- what the relay does not say: the plan's, its choices
    local given, plan = o, o.plan
    o = { accumulate = plan.accumulate, placement = plan.placement }
    local own = given.device_budget ~= nil and given.device_budget ~= 0   -- (0: none)
    if (given.placement or plan.placement) == "auto" and not own then
      o.device_budget = plan.device_budget   -- (the budget it placed within)
    end
    for k, v in pairs(given) do
      if k ~= "device_budget" or own then o[k] = v end
    end
  end
  local model = o.model
  if model == nil then fail(fname .. ": option 'model' is required (an l2l.Sequential or a list of layers)") end
  if not model_mod.is_sequential(model) then
    if type(model) ~= "table" or layers.is_layer(model) then
      fail(fname .. ": option 'model' must be an l2l.Sequential or a list of layers, got " .. type(model))
    end
    local ok, seq = pcall(model_mod.Sequential, model)
    if not ok then fail(fname .. ": option 'model': " .. tostring(seq):gsub("^l2l%.Sequential: ", "")) end
    model = seq
  end
  local s = options.read_settings(o, fname, o.plan == "auto")
  s.model = model
  if o.plan ~= nil and o.plan ~= "auto" and not plan_mod.is_plan(o.plan) then
    fail(fname .. ": option 'plan' must be a plan from l2l.plan{...} or \"auto\", got " .. argcheck.describe(o.plan))
  end
  if o.plan == "auto" and s.device_budget == 0 and device_pool().budget == 0 then
    fail(fname .. ": plan = \"auto\" plans within a device budget: give option 'device_budget' "
         .. "(or set the device pool's, l2l.set_budget)")
  end
  s.plan = o.plan
  return s
end

-- lib.check for the relay's own calls: the message in Lua's terms.
local function rcheck(status, fname, level)
  if status ~= 0 then error(fname .. ": " .. lua_message(), (level or 2) + 1) end
end

----------------------------------------------------------------- making one

-- A step or evaluation in progress refuses every other call on its relay: a layer's
-- callback inside it must not free, step, save, read or change the relay running it (the C
-- relay refuses too; this names the Lua call).
local function idle(self, fname, level)
  if self.running then
    error(("%s: %s is running on this relay: call this after it returns, not from a layer "
           .. "inside it"):format(fname, self.running), level + 1)
  end
end

-- The C relay; errors at `level` (default 2: the caller of the method calling live).
local function live(self, fname, level)
  level = (level or 2) + 1
  if getmetatable(self) ~= Relay then error(fname .. ": self must be a relay (use run:method)", level) end
  local r = self.box[0]
  if r == nil then error(fname .. ": the relay was freed", level) end
  idle(self, fname, level)
  return r
end

-- The C handle of layer i joining a relay, refused when freed or in a relay already.
local function layer_handle(layer, i, fname)
  local h = layer.handle[0]
  if h == nil then fail(("%s: layer %d (%s) was freed"):format(fname, i, layer.kind)) end
  if C.l2l_layer_relay(h) ~= nil then
    fail(("%s: layer %d (%s) is in another relay (a layer is in one relay at a time)"):format(fname, i, layer:label()))
  end
  return h
end

-- "layer 3 (block): " for the C relay's layer at Lua index i.
local function where(layer, i)
  return ("layer %d (%s): "):format(i, layer:label())
end

local apply_plan   -- (below, with plans)

-- The relay's acts on its model's changes (model.follow): each made in the C relay, or an
-- error naming the model's method, the layer and C's reason, with nothing changed.
local function follower(self)
  local function c_relay(fname)
    if self.running then
      fail(("%s: %s is running on this relay: change the model after it returns, not from a "
            .. "layer inside it"):format(fname, self.running))
    end
    return self.box[0]
  end
  local function c_fail(fname, i, layer, what)
    fail(("%s: %s%s: %s"):format(fname, where(layer, i), what, lua_message()))
  end
  -- A layer joining the relay at i (insert, or replace the one there).
  local function join(cfunc, what)
    return function(i, layer, fname)
      local r = c_relay(fname)
      if cfunc(r, i - 1, layer_handle(layer, i, fname)) ~= 0 then c_fail(fname, i, layer, what) end
    end
  end
  return {
    insert = join(C.l2l_relay_insert, "cannot insert"),
    replace = join(C.l2l_relay_replace, "cannot replace"),
    remove = function(i, fname)
      if C.l2l_relay_remove(c_relay(fname), i - 1) ~= 0 then
        c_fail(fname, i, self.model[i], "cannot remove")
      end
    end,
    frozen = function(i, on, fname)
      if C.l2l_relay_set_frozen(c_relay(fname), i - 1, on and 1 or 0) ~= 0 then
        c_fail(fname, i, self.model[i], "cannot freeze")
      end
    end,
  }
end

-- l2l.Relay{model =, micro_batch = 1, stash = "host", recompute_every = 1, inner =
-- "recompute", optimizer = l2l.AdamW{}, schedule = l2l.ConstantLR{}, clip_global_norm = 0,
-- clip_layer_norm = 0, accumulate = 1 (with a plan: the plan's), optimizer_threads = 0 (every CPU the process may
-- run on), seed = 0, param_slots = 2 (device buffers of layer parameters: each more keeps
-- one more of the forward's last layers on the device for its backward), loss_scale = 0
-- (> 0: dynamic loss scaling from this scale), loss_scale_window = 2000 (updates without
-- overflow before the scale doubles), precision = "bf16" on a GPU, "f32" on the CPU backend
-- ("bf16" or "f16": 16-bit weights on the device, f32 masters and optimizer state on the
-- host), grad_precision = "f32" ("bf16" or
-- "f16": the GEMM weights' and token tables' gradients leave the device rounded to 16
-- bits, at half the bytes, and accumulate in f32 on the host), nonfinite = "skip" (a
-- record whose gradient holds an inf or NaN, or a value of 2^63 or more, which would
-- overflow its optimizer state, is not updated, said once on stderr; "error": the step
-- raises after it is done), device_budget = (bytes this relay's steps may hold
-- on the device at their peak, checked before each; the device pool's budget,
-- l2l.set_budget, stays the process's cap), host_budget = (bytes the relay's EPS may hold
-- in host memory: masters, gradient accumulators, staging copies, optimizer state in memory;
-- checked before each training step), spill = (a directory: the optimizer state that
-- host_budget does not keep in memory lives in a spill file there, read ahead and written
-- back in the schedule's order, with the same numbers to the bit; removed with the relay),
-- dist = "none" ("mpi": data parallel across the ranks of an
-- mpirun job; each rank steps its own slice of every minibatch: see l2l.dist),
-- master = "f32" ("bf16": the GEMM weights' and token tables' masters in bf16, rounded
-- stochastically after each update, and read by the device as they are: 2 bytes a
-- parameter instead of 6; precision bf16 then, unless given; p.value of such a parameter
-- is a bf16 tensor while its layer is in the relay, f32 again when it leaves),
-- placement = "host", or "auto" where a device budget is given (device_budget, a plan
-- or plan = "auto") ("device": every record's master, gradient accumulator and optimizer
-- state live in the device pool and are updated there by the same optimizer as each is
-- complete, for a model whose records fit on the device: nothing of them crosses the
-- link, and on the CPU backend the same bits as "host"; p.value and p.grad are device
-- tensors while the layer is in the relay; the state in its precision and bf16 masters
-- rounded by the same draws as on the host, per-layer clipping's factor found there;
-- with dist each rank updates the whole record from the ranks' reduced gradient; with a
-- spill file the file holds the host's records alone; "auto": before each step, the
-- records that fit beside the step within the device budget go on the device, a layer's
-- at a time (with the layers it shares a record with), the largest first, the rest stay
-- on the host, moved between steps as the shape or the budget changes; with dist the
-- ranks place alike, within what every rank's budget holds)}
function M.Relay(o, ...)
  local fname = "l2l.Relay"
  if select("#", ...) ~= 0 then too_many(fname, "options", 2, ...) end
  local ok, s = pcall(read_options, o, fname)
  if not ok then error(s, 2) end
  local model = s.model
  if model.relay_link.acts ~= nil then
    error(fname .. ": the model is in another relay (a model follows one relay at a time: free that one first)", 2)
  end
  local n = #model
  local list = ffi.new("l2l_layer *[?]", n > 0 and n or 1)
  for i, layer in ipairs(model) do
    if not layers.is_layer(layer) then error(("%s: model entry %d is not a layer"):format(fname, i), 2) end
    local okh, h = pcall(layer_handle, layer, i, fname)
    if not okh then error(h, 2) end
    list[i - 1] = h
  end
  local out = ffi.new("l2l_relay *[1]")
  rcheck(C.l2l_relay_new(out, list, n, options.config_of(s)), fname, 2)
  local box = ffi.gc(out, relay_gc)
  local self = setmetatable({ box = box, model = model, options = s }, Relay)
  local oks, err = pcall(function()
    for i, layer in ipairs(model) do
      if model.frozen_set[layer] then
        rcheck(C.l2l_relay_set_frozen(out[0], i - 1, 1), ("%s: %scannot freeze"):format(fname, where(layer, i)))
      end
    end
    if plan_mod.is_plan(s.plan) then apply_plan(self, s.plan, fname) end
  end)
  if not oks then self:free(); error(err, 2) end
  self.acts = follower(self)
  model_mod.follow(model, self.acts)
  return self
end

----------------------------------------------------------------- plans

-- The plan's micro-batch and per-layer policies into the relay (plain errors).
apply_plan = function(self, plan, fname)
  if #plan.layers ~= #self.model then
    fail(("%s: the plan is for %d layers, the model has %d (plan it again, or use plan = \"auto\")"):format(
      fname, #plan.layers, #self.model))
  end
  if plan.handle == nil then
    fail(fname .. ": option 'plan': a plan = \"auto\" made is its relay's; plan another with l2l.plan{...}")
  end
  if C.l2l_relay_apply_plan(self.box[0], plan.handle[0]) ~= 0 then fail(fname .. ": " .. lua_message()) end
  -- (another plan: its steps are measured afresh for run:plan_report)
  if self.plan ~= plan then self.plan_measured, self.plan_steps = nil, nil end
  self.plan, self.options.micro_batch = plan, plan.micro_batch
end

-- plan = "auto": a plan for this batch's shape and the model as it is, made again when
-- either changed since the last one (a layer inserted, removed, cloned or frozen; another
-- B or S; another relay budget), within the relay's device budget and what the device
-- pool's leaves: C's (l2l_relay_plan_auto), which keeps the plan; Lua reads it.
local plan_out = ffi.new("const l2l_plan *[1]")
local function plan_auto(self, fname, tokens, opts)
  local r = self.box[0]
  local B, S = tokens:dim(1), tokens:dim(2)
  if C.l2l_relay_plan_auto(plan_out, r, B, S, opts and opts.token_types and 1 or 0,
                           opts and opts.key_mask and 1 or 0) ~= 0 then
    fail(fname .. ": plan = \"auto\": " .. lua_message())
  end
  local plan = plan_mod.wrap(plan_out, self.model, options.config_of(self.options),
                             { batch = B, seq = S, device_budget = self.options.device_budget }, true)
  if plan_mod.same(plan, self.plan) then return end
  -- (another plan: its steps are measured afresh for run:plan_report)
  self.plan_measured, self.plan_steps = nil, nil
  self.plan, self.options.micro_batch = plan, plan.micro_batch
end

function M.is_relay(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.is_relay", "x", 2, ...) end
  return getmetatable(x) == Relay
end

-- Frees the C relay now (waiting for pending updates); safe twice. The layers stay.
function Relay:free(...)
  if select("#", ...) ~= 0 then too_many("run:free", "", 2, ...) end
  if getmetatable(self) ~= Relay then error("run:free: self must be a relay", 2) end
  idle(self, "run:free", 2)
  local box = self.box
  if box[0] ~= nil then
    ffi.gc(box, nil)
    relay_gc(box)
  end
  model_mod.unfollow(self.model, self.acts)
end

-- What l2l.checkpoint (above this module) reads of a run: its C relay, live and idle
-- (errors at `level` for fname), and the settings it was made with.
function M.c_relay(run, fname, level)
  level = (level or 2) + 1
  if not M.is_relay(run) then error(fname .. ": self must be a relay (use run:save)", level) end
  return live(run, fname, level)
end
function M.settings(run) return run.options end

-- For check_call: the Lua index of the layer at a C address.
local function locator(self)
  return function(a)
    for i, layer in ipairs(self.model) do
      if layer.handle[0] ~= nil and address(layer.handle[0]) == a then return where(layer, i) end
    end
    return ""
  end
end

----------------------------------------------------------------- steps

local BATCH_OPTIONS = { token_types = true, key_mask = true, skip = true }

local function describe(t)
  return ("%s (%s)"):format(t:dtype(), table.concat(t:shape(), ","))
end

-- The l2l_relay_batch for (tokens, targets, opts), checked; `keep` collects what must
-- stay alive during the C call.
local function batch_of(self, fname, tokens, targets, opts)
  local b = ffi.new("l2l_relay_batch")
  b.tokens = handle_of(tokens, "tokens", fname, 4)
  b.targets = handle_of(targets, "targets", fname, 4)
  if tokens:dtype() ~= "i32" or tokens:ndim() ~= 2 then
    error(("%s: tokens must be i32 (B,S), got %s"):format(fname, describe(tokens)), 4)
  end
  if targets:dtype() ~= "i32" or targets:ndim() > 2 then
    error(("%s: targets must be i32 (B,S) or (B), got %s"):format(fname, describe(targets)), 4)
  end
  local skip
  if opts ~= nil then
    argcheck.options(opts, BATCH_OPTIONS, fname, 4, "opts")
    if opts.token_types ~= nil then b.token_types = handle_of(opts.token_types, "opts.token_types", fname, 4) end
    if opts.key_mask ~= nil then b.key_mask = handle_of(opts.key_mask, "opts.key_mask", fname, 4) end
    if opts.skip ~= nil then
      local n = #self.model
      if type(opts.skip) ~= "table" then error(fname .. ": opts.skip must be a list of layer indices", 4) end
      skip = ffi.new("uint8_t[?]", n > 0 and n or 1)
      for _, i in ipairs(opts.skip) do
        if type(i) ~= "number" or i ~= floor(i) or i < 1 or i > n then
          error(("%s: opts.skip: %s is not a layer index in [1, %d]"):format(fname, tostring(i), n), 4)
        end
        if layers.role(self.model[i]) ~= "body" then
          error(("%s: opts.skip: layer %d (%s) cannot be skipped: only blocks and custom layers can"):format(
            fname, i, self.model[i].kind), 4)
        end
        skip[i - 1] = 1
      end
      b.skip = skip
    end
  end
  return b, skip
end

local loss_out = ffi.new("double[1]")

-- The C call that runs layers (which may be written in Lua). LuaJIT cannot enter a Lua
-- callback from a C call made by JIT-compiled code ("bad callback"), so this function is
-- kept out of traces (jit.off below): a trace that reaches it ends there, and the C call
-- is always made from the interpreter. Its cost is the step, not the Lua around it.
-- (skip: the array b.skip points to, passed along so that it stays alive for the call;
-- the tensors stay alive as the caller's arguments.)
local function run_layers(self, fname, cfunc, r, b, skip)
  layers.clear_callback_error()
  self.running = fname
  local ok, status = pcall(cfunc, loss_out, r, b)
  self.running = nil
  if not ok then error(status, 0) end
  return status, skip
end
jit.off(run_layers)

local function step_or_evaluate(self, fname, cfunc, tokens, targets, opts)
  local r = live(self, fname, 3)
  local b, skip = batch_of(self, fname, tokens, targets, opts)
  if #self.model == 0 then error(fname .. ": the model has no layers", 4) end
  if self.options.plan == "auto" then
    local ok, err = pcall(plan_auto, self, fname, tokens, opts)
    if not ok then error(err, 3) end
  end
  local status = run_layers(self, fname, cfunc, r, b, skip)
  check_call(status, fname, 3, locator(self), lua_message)
  if self.plan and cfunc == C.l2l_relay_step then plan_mod.check_prediction(self) end
  return tonumber(loss_out[0])
end

-- loss = run:step(tokens, targets [, {token_types =, key_mask =, skip = {layer indices}}]):
-- one training step on the minibatch; the mean loss over its real targets.
function Relay:step(tokens, targets, opts, ...)
  if select("#", ...) ~= 0 then too_many("run:step", "tokens, targets, opts", 2, ...) end
  local loss = step_or_evaluate(self, "run:step", C.l2l_relay_step, tokens, targets, opts)
  return loss
end

-- loss = run:evaluate(tokens, targets [, opts]): forward only, no dropout, no update.
function Relay:evaluate(tokens, targets, opts, ...)
  if select("#", ...) ~= 0 then too_many("run:evaluate", "tokens, targets, opts", 2, ...) end
  local loss = step_or_evaluate(self, "run:evaluate", C.l2l_relay_evaluate, tokens, targets, opts)
  return loss
end
jit.off(step_or_evaluate)

-- run:step_peak(batch, seq [, {token_types =, key_mask =}]) -> the device bytes a training step of that shape needs at its peak, whatever the weights become (the planner's replay)
function Relay:step_peak(batch, seq, opts, ...)
  local fname = "run:step_peak"
  if select("#", ...) ~= 0 then too_many(fname, "batch, seq, opts", 2, ...) end
  local r = live(self, fname)
  opts = argcheck.options(opts, { token_types = true, key_mask = true }, fname, 2, "opts")
  for name, v in pairs({ batch = batch, seq = seq }) do   -- (C checks the range)
    if type(v) ~= "number" or v ~= math.floor(v) then error(("%s: %s must be a whole number, got %s"):format(fname, name, argcheck.describe(v)), 2) end
  end
  local out = ffi.new("uint64_t[1]")
  rcheck(C.l2l_relay_step_peak(out, r, batch, seq, opts.token_types and 1 or 0, opts.key_mask and 1 or 0), fname, 2)
  return tonumber(out[0])
end

-- Waits until every queued update is done (parameters readable through the model).
function Relay:sync(...)
  if select("#", ...) ~= 0 then too_many("run:sync", "", 2, ...) end
  rcheck(C.l2l_relay_sync(live(self, "run:sync")), "run:sync", 2)
end

----------------------------------------------------------------- policies

local function policy_arg(ids, value, fname, what)
  if ids[value] == nil then
    local names = {}
    for k in pairs(ids) do names[#names + 1] = '"' .. k .. '"' end
    table.sort(names)
    error(("%s: %s must be one of %s, got %s"):format(fname, what, table.concat(names, ", "), argcheck.describe(value)), 3)
  end
  return ids[value]
end

-- A layer index (1-based) from a number or a layer of the model.
local function layer_index(self, layer, fname, what)
  if layers.is_layer(layer) then
    for i, l in ipairs(self.model) do
      if l == layer then return i end
    end
    error(("%s: %s is not in the model"):format(fname, what), 3)
  end
  local n = #self.model
  if type(layer) ~= "number" or layer ~= floor(layer) or layer < 1 or layer > n then
    error(("%s: %s must be a layer of the model or an index in [1, %d], got %s"):format(fname, what, n, tostring(layer)), 3)
  end
  return layer
end

-- run:set_stash(i, policy): where the activations entering layer i (2 <= i <= #model)
-- wait for the backward: "device", "host" or "recompute".
function Relay:set_stash(boundary, policy, ...)
  local fname = "run:set_stash"
  if select("#", ...) ~= 0 then too_many(fname, "boundary, policy", 2, ...) end
  local r = live(self, fname)
  local id = policy_arg(stash_ids, policy, fname, "policy")
  local n = #self.model
  if type(boundary) ~= "number" or boundary ~= floor(boundary) or boundary < 2 or boundary > n then
    error(("%s: boundary must be an integer in [2, %d] (the input of that layer), got %s"):format(
      fname, n, tostring(boundary)), 2)
  end
  rcheck(C.l2l_relay_set_stash(r, boundary - 1, id), fname, 2)
end

-- run:set_inner(layer, policy): "recompute", "keep" or "swap" for a layer (index or object).
function Relay:set_inner(layer, policy, ...)
  local fname = "run:set_inner"
  if select("#", ...) ~= 0 then too_many(fname, "layer, policy", 2, ...) end
  local r = live(self, fname)
  local id = policy_arg(inner_ids, policy, fname, "policy")
  local i = layer_index(self, layer, fname, "layer")
  rcheck(C.l2l_relay_set_inner(r, i - 1, id), fname, 2)
end

function Relay:set_micro_batch(n, ...)
  local fname = "run:set_micro_batch"
  if select("#", ...) ~= 0 then too_many(fname, "n", 2, ...) end
  local r = live(self, fname)
  if type(n) ~= "number" or n ~= floor(n) or n < 1 then
    error(fname .. ": n must be an integer >= 1, got " .. tostring(n), 2)
  end
  rcheck(C.l2l_relay_set_micro_batch(r, n), fname, 2)
  self.options.micro_batch = n
end

-- One of the relay's budgets from the next step on: bytes checked (an integer 0 to 2^53),
-- given to C's `set` and kept as option `key`. Errors name the method's caller.
local function set_budget(self, fname, key, set, bytes, ...)
  if select("#", ...) ~= 0 then too_many(fname, "bytes", 3, ...) end
  local r = live(self, fname, 3)
  if type(bytes) ~= "number" or bytes ~= floor(bytes) or bytes < 0 or bytes > 2 ^ 53 then
    error(fname .. ": bytes must be an integer 0 to 2^53, got " .. argcheck.describe(bytes), 3)
  end
  rcheck(set(r, bytes), fname, 3)
  self.options[key] = bytes
end

-- run:set_device_budget(bytes): the relay's own device budget from the next step on
-- (0: none), as option device_budget. (Placement auto without any budget, the relay's
-- or the device pool's, l2l.set_budget, places every record on the device.)
function Relay:set_device_budget(bytes, ...)
  set_budget(self, "run:set_device_budget", "device_budget", C.l2l_relay_set_device_budget, bytes, ...)
end

-- run:set_host_budget(bytes): the relay's host budget from the next training step on
-- (0: none), as option host_budget.
function Relay:set_host_budget(bytes, ...)
  set_budget(self, "run:set_host_budget", "host_budget", C.l2l_relay_set_host_budget, bytes, ...)
end

----------------------------------------------------------------- reading back

local STATS = {
  "steps", "updates", "loss", "lr", "grad_norm", "updates_deferred", "device_peak",
  "device_current", "host_eps_bytes", "host_stash_peak", "h2d_bytes", "d2h_bytes",
  "step_seconds", "compute_seconds", "wait_copy_seconds", "exposed_copy_seconds",
  "wait_update_seconds", "optimizer_seconds", "h2d_seconds", "d2h_seconds", "events", "loss_scale",
  "loss_scale_good", "skipped_updates", "overflow", "skipped_records", "dist_ranks",
  "dist_sent_bytes", "dist_received_bytes", "spill_read_bytes", "spill_written_bytes",
  "spill_late_reads", "spill_grad_waits", "spill_file_bytes", "exposed_comm_seconds",
  "host_pass_bytes", "device_records_bytes", "device_start",
}
M.stats_fields = STATS

-- run:stats() -> a table of every l2l_relay_stats field, as numbers (bytes, seconds).
function Relay:stats(...)
  local fname = "run:stats"
  if select("#", ...) ~= 0 then too_many(fname, "", 2, ...) end
  local s = ffi.new("l2l_relay_stats")
  check(C.l2l_relay_get_stats(s, live(self, fname)), fname, 2)
  local out = {}
  for _, k in ipairs(STATS) do out[k] = tonumber(s[k]) end
  if self.plan then   -- the plan's predictions beside the measurements
    out.predicted_step_seconds = self.plan.step_seconds
    out.predicted_device_peak = self.plan.device_peak + out.device_start
  end
  return out
end

-- run:plan_report() -> per layer the predicted and the measured seconds of its visits in
-- the last step, and the step's (l2l.plan's report).
function Relay:plan_report(...)
  if select("#", ...) ~= 0 then too_many("run:plan_report", "", 2, ...) end
  live(self, "run:plan_report")
  if self.plan == nil then
    error("run:plan_report: the relay has no plan " .. (self.options.plan == "auto"
      and "yet (plan = \"auto\" plans at a step, and no step has found one)" or "(give plan = ... to l2l.Relay)"), 2)
  end
  return plan_mod.report(self)
end

-- run:events() -> the last step's work: a list of {layer =, micro_batch = (1-based, nil
-- when none), phase = "forward" | "backward" | "rebuild" | "params_in" | "grads_out" |
-- "stash_out" | "stash_in" | "swap_out" | "swap_in" | "update" | "wait_copy" |
-- "wait_update" | "reduce_scatter" | "all_gather", thread = (0 the caller, 1 host-to-device
-- copies, 2 device-to-host, 3.. optimizer workers, then with dist = "mpi" the
-- communication thread), start =, finish = (seconds since the relay was made)}.
function Relay:events(...)
  local fname = "run:events"
  if select("#", ...) ~= 0 then too_many(fname, "", 2, ...) end
  local r = live(self, fname)
  local s = ffi.new("l2l_relay_stats")
  check(C.l2l_relay_get_stats(s, r), fname, 2)
  local n = tonumber(s.events)
  local list = {}
  if n <= 0 then return list end
  local buf = ffi.new("l2l_relay_event[?]", n)
  check(C.l2l_relay_events(buf, r, 0, n), fname, 2)
  for i = 0, n - 1 do
    local e = buf[i]
    list[i + 1] = {
      layer = e.layer >= 0 and e.layer + 1 or nil,
      micro_batch = e.micro_batch >= 0 and e.micro_batch + 1 or nil,
      phase = phase_names[e.phase] or tostring(e.phase), thread = e.thread,
      start = e.start, finish = e["end"],
    }
  end
  return list
end

local TRACE_OPTIONS = { events = true, name = true }

-- run:trace(path [, {events =, name =}]) -> the number of events written: the last
-- step's timeline (run:events()) as Chrome trace JSON in the file `path` (replaced), to
-- open in Perfetto or chrome://tracing; lua/l2l/trace.lua says what is in it. opts.events:
-- a list to write instead, e.g. several steps' run:events() joined (they share one clock);
-- opts.name: the process's name in the viewer. Required lazily: most runs never trace.
function Relay:trace(path, opts, ...)
  local fname = "run:trace"
  if select("#", ...) ~= 0 then too_many(fname, "path, opts", 2, ...) end
  live(self, fname)
  if type(path) ~= "string" or path == "" then
    error(fname .. ": path must be a file name (a non-empty string), got " .. tostring(path), 2)
  end
  opts = argcheck.options(opts, TRACE_OPTIONS, fname, 2, "opts")
  local events = opts.events
  if events == nil then events = self:events() end
  local ok, n = pcall(require("l2l.trace").write, path, events, { name = opts.name })
  if not ok then
    local msg = tostring(n):gsub("^trace%.write: ", ""):gsub("^events", "opts.events")
    error(fname .. ": " .. msg, 2)
  end
  return n
end

local state_ids = { m = 0, first = 0, momentum = 0, [1] = 0, v = 1, second = 1, [2] = 1 }

-- run:state(record, which) -> a copy (host tensor) of a parameter record's optimizer
-- state in the precision the optimizer keeps it in (f32, bf16, or 8bit's u8 vector of codes
-- and scales: include/l2l/relay.h, "optimizers"), or nil before its first update. record: an entry of model:params() or
-- layer:params(); which: "m" (SGD: "momentum") / 1, or "v" / 2.
function Relay:state(record, which, ...)
  local fname = "run:state"
  if select("#", ...) ~= 0 then too_many(fname, "record, which", 2, ...) end
  local r = live(self, fname)
  if type(record) ~= "table" or record.handle == nil or record.layer == nil then
    error(fname .. ": record must be an entry of model:params() or layer:params()", 2)
  end
  if record.layer.handle[0] == nil then error(fname .. ": the record's layer was freed", 2) end
  local w = state_ids[which == nil and "m" or which]
  if w == nil then error(fname .. ": which must be \"m\" (or \"momentum\", 1) or \"v\" (or 2), got " .. tostring(which), 2) end
  local out = ffi.new("l2l_tensor *[1]")
  rcheck(C.l2l_relay_param_state(out, r, record.handle, w), fname, 2)
  if out[0] == nil then return nil end
  local borrowed = tensor.lend(out[0])
  local ok, copy = pcall(borrowed.to, borrowed, "host")
  borrowed.handle = nil   -- the loan ends: the relay owns it
  if not ok then error(fname .. ": " .. tostring(copy), 2) end
  return copy
end

-- The writer of run:save: l2l.checkpoint's (a module above this one), which registers it
-- here when it loads (require "l2l" loads it).
local saver
function M.set_saver(save) saver = save end

-- run:save(path [, extra]): the whole run in one file, written atomically (l2l.checkpoint;
-- l2l.load(path) brings it back, with `extra` as run.extra).
function Relay:save(path, extra, ...)
  if select("#", ...) ~= 0 then too_many("run:save", "path, extra", 2, ...) end
  if saver == nil then error("run:save: l2l.checkpoint is not loaded (require \"l2l\")", 2) end
  local ok, err = pcall(saver, self, path, extra)
  if not ok then error(err, 2) end
end

function Relay:__tostring()
  local s = self.options
  return ("Relay: %d layers, micro_batch %d, stash %s, inner %s, %s, %s%s"):format(
    #self.model, s.micro_batch, s.stash, s.inner, tostring(s.optimizer), tostring(s.schedule),
    self.box[0] == nil and " (freed)" or "")
end

return M
