-- SPDX-License-Identifier: MIT
-- l2l.optim — optimizers (SGD, AdamW, LAMB) and learning-rate schedules (ConstantLR,
-- CosineLR, LinearLR) as checked Lua values for l2l.Relay. The schedules' names before
-- they said what they schedule (Constant, Cosine, Linear) still work for one release and
-- warn once (argcheck.deprecated).
--
-- Purpose: turn an options table into the C config the EPS runs (l2l_optimizer_config,
-- l2l_schedule_config in include/l2l/relay.h, "optimizers"), refusing bad values in Lua with an
-- error that names the option, before any C object exists. Which values an option takes
-- (bounds, choices) and each optimizer's and schedule's defaults are its row's in the
-- option table (l2l.option_table: src/core/options.def). The maths lives in C, stated
-- once in l2l.h; schedule:lr(base, t) asks C (l2l_schedule_lr) so Lua never has a second
-- copy of it.
-- Must never: compute an update in Lua, or accept an option it does not know.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local option_table = require("l2l.option_table")

local C, check, too_many = lib.C, lib.check, argcheck.too_many
local ROW, ROWS = option_table.ROW, option_table.ROWS
local type, tostring, floor, huge, select = type, tostring, math.floor, math.huge, select

local M = {}

local Optimizer = {}
Optimizer.__index = Optimizer
local Schedule = {}
Schedule.__index = Schedule

----------------------------------------------------------------- option checks
-- Checks raise plain messages (level 0); each public constructor runs its body under
-- pcall and re-raises at level 2, so the error points at the user's call whatever the
-- depth of the helper that found the problem.

local function fail(msg) error(msg, 0) end

-- f(...) with errors re-raised at the caller of the public function.
local function checked(f, ...)
  local ok, result = pcall(f, ...)
  if not ok then error(result, 3) end
  return result
end

local function finite(v) return type(v) == "number" and v == v and v > -huge and v < huge end

local function option(o, key, default, fname, ok, what)
  local v = o[key]
  if v == nil then v = default end
  if v == nil then fail(("%s: option '%s' is required"):format(fname, key)) end
  if not ok(v) then
    fail(("%s: option '%s' must be %s, got %s"):format(fname, key, what, tostring(v)))
  end
  return v
end

-- A setting C keeps in a float: it must hold as an f32 too.
local function f32_option(o, key, default, fname, ok, what)
  local v = option(o, key, default, fname, ok, what)
  local trouble = lib.f32_trouble(v, ok)
  if trouble then fail(("%s: option '%s' must be %s, got %s, which %s"):format(fname, key, what, tostring(v), trouble)) end
  return v
end
-- A float option as its row of the option table bounds it (l2l.option_table), in f32.
local function row_float(o, key, default, fname)
  local row = ROW[key]
  return f32_option(o, key, default, fname, function(v) return finite(v) and option_table.float_inside(row, v) end,
                    option_table.float_range(row))
end
local function boolean(o, key, default, fname)
  return option(o, key, default, fname, function(v) return type(v) == "boolean" end,
                "true or false")
end
local function count(o, key, default, fname, min)
  return option(o, key, default, fname,
                function(v) return finite(v) and v == floor(v) and v >= min and v <= 2 ^ 53 end,
                ("an integer from %d to 2^53"):format(min))
end

local function known(o, allowed, fname)
  local checked_o = argcheck.options(o, allowed, fname, 0)
  return checked_o
end

-- The value of option `name` that an optimizer or schedule of `kind` ("sgd", "cosine", ...)
-- takes where not given: its row's in the option table (nil: that kind must be given it).
local function default(kind, name) return ROW[name].defaults[kind] end

----------------------------------------------------------------- optimizers

-- betas = {b1, b2} or beta1 = , beta2 = (not both ways at once).
local function betas(o, fname, kind)
  if o.betas ~= nil then
    if o.beta1 ~= nil or o.beta2 ~= nil then
      fail(fname .. ": give option 'betas' or options 'beta1'/'beta2', not both")
    end
    if type(o.betas) ~= "table" or #o.betas ~= 2 then
      fail(fname .. ": option 'betas' must be a table {beta1, beta2}, got " .. tostring(o.betas))
    end
    local b = { beta1 = o.betas[1], beta2 = o.betas[2] }
    return row_float(b, "beta1", nil, fname), row_float(b, "beta2", nil, fname)
  end
  return row_float(o, "beta1", default(kind, "beta1"), fname), row_float(o, "beta2", default(kind, "beta2"), fname)
end

local ADAM_OPTIONS = { lr = 1, betas = 1, beta1 = 1, beta2 = 1, eps = 1, weight_decay = 1, decay_all = 1,
                       state = 1 }

-- The precision of the optimizer state (l2l.h, "optimizers"): "f32", "bf16" or "8bit".
local STATES = ROW.state.ids   -- f32, bf16, 8bit
M.STATES = STATES
local function state_option(o, fname, kind)
  return option(o, "state", default(kind, "state"), fname, function(v) return STATES[v] ~= nil end,
                '"f32", "bf16" or "8bit"')
end

local function adam_like(kind, fname, o)
  o = known(o, ADAM_OPTIONS, fname)
  local self = { kind = kind, lr = row_float(o, "lr", default(kind, "lr"), fname) }
  self.beta1, self.beta2 = betas(o, fname, kind)
  self.eps = row_float(o, "eps", default(kind, "eps"), fname)
  self.weight_decay = row_float(o, "weight_decay", default(kind, "weight_decay"), fname)
  self.decay_all = boolean(o, "decay_all", default(kind, "decay_all"), fname)
  self.state = state_option(o, fname, kind)
  return setmetatable(self, Optimizer)
end

-- l2l.SGD{lr =, momentum =, nesterov =, weight_decay =, decay_all =, state =}
-- (each optimizer's and schedule's defaults: option_table's row.defaults, from options.def)
local function sgd(o)
  local fname = "l2l.SGD"
  o = known(o, { lr = 1, momentum = 1, nesterov = 1, weight_decay = 1, decay_all = 1, state = 1 }, fname)
  local self = { kind = "sgd", lr = row_float(o, "lr", default("sgd", "lr"), fname) }
  self.momentum = row_float(o, "momentum", default("sgd", "momentum"), fname)
  self.nesterov = boolean(o, "nesterov", default("sgd", "nesterov"), fname)
  if self.nesterov and self.momentum == 0 then
    fail(fname .. ": option 'nesterov' needs option 'momentum' > 0")
  end
  self.weight_decay = row_float(o, "weight_decay", default("sgd", "weight_decay"), fname)
  self.decay_all = boolean(o, "decay_all", default("sgd", "decay_all"), fname)
  self.state = state_option(o, fname, "sgd")
  return setmetatable(self, Optimizer)
end
function M.SGD(o, ...)
  if select("#", ...) ~= 0 then too_many("l2l.SGD", "options", 2, ...) end
  local self = checked(sgd, o)
  return self
end

-- l2l.AdamW{lr =, betas = {beta1, beta2} (or beta1 =, beta2 =), eps =, weight_decay =,
--           decay_all =, state =}  (state: "f32", "bf16" or "8bit", the optimizer state's
--           precision)
function M.AdamW(o, ...)
  if select("#", ...) ~= 0 then too_many("l2l.AdamW", "options", 2, ...) end
  local self = checked(adam_like, "adamw", "l2l.AdamW", o)
  return self
end

-- l2l.LAMB{...}: AdamW's options
function M.LAMB(o, ...)
  if select("#", ...) ~= 0 then too_many("l2l.LAMB", "options", 2, ...) end
  local self = checked(adam_like, "lamb", "l2l.LAMB", o)
  return self
end

function M.is_optimizer(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.is_optimizer", "x", 2, ...) end
  return getmetatable(x) == Optimizer
end

-- The fields of group's C config c from obj (an optimizer or a schedule): the kind, then
-- each option obj holds, and for one it does not take, what the table says its kind's
-- field holds.
local function fill_group(c, obj, group)
  for _, row in ipairs(ROWS) do
    if row.group == group and row.defaults == nil then   -- the kind
      c[row.field] = row.ids[obj.kind]
    elseif row.group == group then
      local v = obj[row.name]
      if v == nil then v = row.defaults[obj.kind] end
      if row.type == "bool" then v = v and 1 or 0 elseif row.type == "choice" then v = row.ids[v] end
      c[row.field] = v
    end
  end
  return c
end

-- Fills an l2l_optimizer_config (cdata) from the optimizer.
function Optimizer:fill(c, ...)
  if select("#", ...) ~= 0 then too_many("optimizer:fill", "c", 2, ...) end
  if getmetatable(self) ~= Optimizer then error("optimizer:fill: self must be an optimizer", 2) end
  if not ffi.istype("l2l_optimizer_config", c) then
    error("optimizer:fill: c must be an l2l_optimizer_config, got " .. argcheck.describe(c), 2)
  end
  return fill_group(c, self, "optimizer")
end

function Optimizer:config(...)
  if select("#", ...) ~= 0 then too_many("optimizer:config", "", 2, ...) end
  if getmetatable(self) ~= Optimizer then error("optimizer:config: self must be an optimizer", 2) end
  local c = self:fill(ffi.new("l2l_optimizer_config"))
  return c
end

local NAMES = { sgd = "SGD", adamw = "AdamW", lamb = "LAMB" }
function Optimizer:__tostring()
  if self.kind == "sgd" then
    return ("SGD{lr = %g, momentum = %g, nesterov = %s, weight_decay = %g, decay_all = %s, state = %q}"):format(
      self.lr, self.momentum, tostring(self.nesterov), self.weight_decay, tostring(self.decay_all),
      self.state)
  end
  return ("%s{lr = %g, betas = {%g, %g}, eps = %g, weight_decay = %g, decay_all = %s, state = %q}"):format(
    NAMES[self.kind], self.lr, self.beta1, self.beta2, self.eps, self.weight_decay,
    tostring(self.decay_all), self.state)
end

----------------------------------------------------------------- schedules

-- l2l.ConstantLR{warmup =}: factor t/warmup during warm-up, then 1.
local function constant(fname, o)
  o = known(o, { warmup = 1 }, fname)
  return setmetatable({ kind = "constant", warmup = count(o, "warmup", default("constant", "warmup"), fname, 0),
                        total = default("constant", "total"), final_ratio = default("constant", "final_ratio") },
                      Schedule)
end

local function decaying(kind, fname, o)
  o = known(o, { warmup = 1, total = 1, final_ratio = 1 }, fname)
  local self = { kind = kind, warmup = count(o, "warmup", default(kind, "warmup"), fname, 0),
                 total = count(o, "total", default(kind, "total"), fname, 1) }
  if self.total <= self.warmup then
    fail(("%s: option 'total' (%d) must exceed option 'warmup' (%d)"):format(fname, self.total,
         self.warmup))
  end
  self.final_ratio = row_float(o, "final_ratio", default(kind, "final_ratio"), fname)
  return setmetatable(self, Schedule)
end
-- l2l.CosineLR{warmup =, total = (required), final_ratio =}
local function cosine(fname, o) return decaying("cosine", fname, o) end
-- l2l.LinearLR{warmup =, total = (required), final_ratio =}
local function linear(fname, o) return decaying("linear", fname, o) end

-- The constructor l2l.<name>, building with build(fname, o); errors name the function the
-- user called (an old name's its own). With `new`, the name is an old one: it warns once
-- that l2l.<new> replaces it.
local function schedule_constructor(name, build, new)
  local fname = "l2l." .. name
  return function(o, ...)
    if new then argcheck.deprecated(fname, "l2l." .. new) end
    if select("#", ...) ~= 0 then too_many(fname, "options", 2, ...) end
    local self = checked(build, fname, o)   -- not a tail call: the error's level counts this frame
    return self
  end
end
M.ConstantLR = schedule_constructor("ConstantLR", constant)
M.CosineLR = schedule_constructor("CosineLR", cosine)
M.LinearLR = schedule_constructor("LinearLR", linear)
-- The optimizer or schedule of a kind ("adamw", "constant": the option table's choice
-- names) with that kind's defaults: what a relay given none takes for C's default kinds.
local OF_KIND = { sgd = M.SGD, adamw = M.AdamW, lamb = M.LAMB, constant = M.ConstantLR }
function M.default_of(kind) return OF_KIND[kind]() end

-- Deprecated: the names before they said what they schedule (l2l 0.1), gone in the next release.
M.Constant = schedule_constructor("Constant", constant, "ConstantLR")
M.Cosine = schedule_constructor("Cosine", cosine, "CosineLR")
M.Linear = schedule_constructor("Linear", linear, "LinearLR")

function M.is_schedule(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.is_schedule", "x", 2, ...) end
  return getmetatable(x) == Schedule
end

-- Fills an l2l_schedule_config (cdata) from the schedule.
function Schedule:fill(c, ...)
  if select("#", ...) ~= 0 then too_many("schedule:fill", "c", 2, ...) end
  if getmetatable(self) ~= Schedule then error("schedule:fill: self must be a schedule", 2) end
  if not ffi.istype("l2l_schedule_config", c) then
    error("schedule:fill: c must be an l2l_schedule_config, got " .. argcheck.describe(c), 2)
  end
  return fill_group(c, self, "schedule")
end

function Schedule:config(...)
  if select("#", ...) ~= 0 then too_many("schedule:config", "", 2, ...) end
  if getmetatable(self) ~= Schedule then error("schedule:config: self must be a schedule", 2) end
  local c = self:fill(ffi.new("l2l_schedule_config"))
  return c
end

-- schedule:lr(base, t): the learning rate of update t (1-based) for base rate `base`.
local lr_out = ffi.new("double[1]")
function Schedule:lr(base, t, ...)
  local fname = "schedule:lr"
  if select("#", ...) ~= 0 then too_many(fname, "base, t", 2, ...) end
  if getmetatable(self) ~= Schedule then error(fname .. ": self must be a schedule", 2) end
  if not finite(base) or base < 0 then
    error(fname .. ": base must be a finite number >= 0, got " .. tostring(base), 2)
  end
  if not finite(t) or t ~= floor(t) or t < 1 then
    error(fname .. ": t must be an integer >= 1, got " .. tostring(t), 2)
  end
  check(C.l2l_schedule_lr(lr_out, self:config(), base, t), fname, 2)
  return tonumber(lr_out[0])
end

function Schedule:__tostring()
  if self.kind == "constant" then return ("ConstantLR{warmup = %d}"):format(self.warmup) end
  return ("%s{warmup = %d, total = %d, final_ratio = %g}"):format(
    self.kind == "cosine" and "CosineLR" or "LinearLR", self.warmup, self.total, self.final_ratio)
end

return M
