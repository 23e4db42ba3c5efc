-- SPDX-License-Identifier: MIT
-- l2l.relay_options — the relay's options, read and checked, as the C relay's config
-- (l2l_relay_config); and the C relay's messages in Lua's terms.
--
-- Purpose: one list of the options l2l.Relay takes, which a checkpoint keeps (M.OPTIONS:
-- l2l.Relay accepts its names, l2l.checkpoint saves and restores each, so a new option is
-- kept by every save by construction), and one reading of them, which l2l.plan shares for
-- the ones that change memory and time, so that both refuse a bad option with one message
-- naming it; below both modules, so neither requires the other for it. Defaults and
-- bounds are C's (l2l_relay_config_default, l2l_relay_config_check): Lua checks only that
-- a value fits its C field, and shows C's message in the options' names.
-- Must never: read the model or the plan (l2l.Relay checks those), or hold state.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local optim = require("l2l.optim")

local C = lib.C
local type, tostring, pairs, floor, huge = type, tostring, pairs, math.floor, math.huge

local M = {}

M.stash_ids = { device = C.L2L_STASH_DEVICE, host = C.L2L_STASH_HOST, recompute = C.L2L_STASH_RECOMPUTE }
M.inner_ids = { recompute = C.L2L_INNER_RECOMPUTE, keep = C.L2L_INNER_KEEP, swap = C.L2L_INNER_SWAP }
local stash_ids, inner_ids = M.stash_ids, M.inner_ids
local precision_ids = { f32 = C.L2L_F32, bf16 = C.L2L_BF16, f16 = C.L2L_F16 }
local master_ids = { f32 = C.L2L_F32, bf16 = C.L2L_BF16 }
local nonfinite_ids = { skip = 0, error = 1 }
local dist_ids = { none = 0, mpi = 1 }

----------------------------------------------------------------- the options, once
-- Every option of l2l.Relay, and what a checkpoint does with it: "run", a setting of the
-- run, saved and restored as it is; "load", the same, and l2l.load may be given another
-- (what is the machine's rather than the run's: budgets, micro-batch, threads, the spill
-- directory, whether this process is one rank of a job; and the masters' precision, which
-- a load converts); "own", kept in a form of its own (the model as its layers, the
-- optimizer and the schedule as their fields, a plan as "auto" or as the micro-batch and
-- layer policies it set).
M.OPTIONS = {
  model = "own", plan = "own", optimizer = "own", schedule = "own",
  micro_batch = "load", optimizer_threads = "load", device_budget = "load", host_budget = "load",
  spill = "load", dist = "load", master = "load",
  stash = "run", recompute_every = "run", inner = "run", clip_global_norm = "run",
  clip_layer_norm = "run", accumulate = "run", seed = "run", param_slots = "run", loss_scale = "run",
  loss_scale_window = "run", precision = "run", grad_precision = "run", nonfinite = "run",
}

-- The names of the options of `kind`s ({run = true, ...}), sorted (a file's keys in one order).
function M.option_names(kinds)
  local names = {}
  for name, kind in pairs(M.OPTIONS) do
    if kinds[kind] then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

local function fail(msg) error(msg, 0) end
M.fail = fail
local function finite(v) return type(v) == "number" and v == v and v > -huge and v < huge end

-- Integer options as their C fields hold them: an int's range, or for 64-bit fields the
-- integers a Lua number holds exactly (the FFI would truncate the rest). What a value
-- means (>= 1, at most 4096 slots, ...) is C's to say (l2l_relay_config_check), and its
-- message names the option (lua_message below).
local INT_MIN, INT_MAX, EXACT_MAX = -2 ^ 31, 2 ^ 31 - 1, argcheck.EXACT_MAX
local INT, INT64, UINT64 = { INT_MIN, INT_MAX }, { -EXACT_MAX, EXACT_MAX }, { 0, EXACT_MAX }

local function int_option(o, key, default, fname, range)
  local v = o[key]
  if v == nil then return default end
  if not finite(v) or v ~= floor(v) then
    fail(("%s: option '%s' must be an integer, got %s"):format(fname, key, argcheck.describe(v)))
  end
  if v < range[1] then
    fail(("%s: option '%s' must be at least %.0f, got %s"):format(fname, key, range[1], tostring(v)))
  end
  if v > range[2] then
    fail(("%s: option '%s' must be at most %.0f, got %s"):format(fname, key, range[2], tostring(v)))
  end
  return v
end

-- A float option as C's f32 holds it (C says which values it takes).
local function float_option(o, key, default, fname)
  local v = o[key]
  if v == nil then return default end
  if not finite(v) then
    fail(("%s: option '%s' must be a finite number, got %s"):format(fname, key, argcheck.describe(v)))
  end
  local trouble = lib.f32_trouble(v, finite)
  if trouble then fail(("%s: option '%s' is %s, which %s"):format(fname, key, tostring(v), trouble)) end
  return v
end

-- The name of C's value in ids.
local function name_of(ids, value)
  for name, id in pairs(ids) do
    if id == value then return name end
  end
end

local function enum_option(o, key, ids, default, fname)
  local v = o[key]
  if v == nil then v = default end
  if ids[v] == nil then
    local names = {}
    for k in pairs(ids) do names[#names + 1] = '"' .. k .. '"' end
    table.sort(names)
    fail(("%s: option '%s' must be one of %s, got %s"):format(fname, key, table.concat(names, ", "), argcheck.describe(v)))
  end
  return v
end

-- Every option but the model and the plan, with C's defaults (l2l_relay_config_default:
-- the default precision follows the device pool's backend), and C's check of what they
-- mean. l2l.plan reads the ones that set memory and time through it too (config_for).
function M.read_settings(o, fname)
  local d = ffi.new("l2l_relay_config")
  C.l2l_relay_config_default(d)
  local s = {}
  s.micro_batch = int_option(o, "micro_batch", tonumber(d.micro_batch), fname, INT64)
  s.stash = enum_option(o, "stash", stash_ids, name_of(stash_ids, d.stash), fname)
  s.recompute_every = int_option(o, "recompute_every", d.recompute_every, fname, INT)
  s.inner = enum_option(o, "inner", inner_ids, name_of(inner_ids, d.inner), fname)
  s.optimizer = o.optimizer or optim.AdamW{}
  if not optim.is_optimizer(s.optimizer) then
    fail(fname .. ": option 'optimizer' must be l2l.SGD{...}, l2l.AdamW{...} or l2l.LAMB{...}, got " .. tostring(o.optimizer))
  end
  s.schedule = o.schedule or optim.ConstantLR{}
  if not optim.is_schedule(s.schedule) then
    fail(fname .. ": option 'schedule' must be l2l.ConstantLR{...}, l2l.CosineLR{...} or l2l.LinearLR{...}, got " .. tostring(o.schedule))
  end
  s.clip_global_norm = float_option(o, "clip_global_norm", d.clip_global_norm, fname)
  s.clip_layer_norm = float_option(o, "clip_layer_norm", d.clip_layer_norm, fname)
  s.accumulate = int_option(o, "accumulate", d.accumulate, fname, INT)
  s.optimizer_threads = int_option(o, "optimizer_threads", d.optimizer_threads, fname, INT)
  s.seed = int_option(o, "seed", tonumber(d.seed), fname, UINT64)
  s.param_slots = int_option(o, "param_slots", d.param_slots, fname, INT)
  s.loss_scale = float_option(o, "loss_scale", d.loss_scale, fname)
  s.loss_scale_window = int_option(o, "loss_scale_window", d.loss_scale_window, fname, INT)
  s.device_budget = int_option(o, "device_budget", tonumber(d.device_budget), fname, UINT64)
  s.master = enum_option(o, "master", master_ids, name_of(master_ids, d.master), fname)
  -- bf16 masters are what the device reads: precision bf16 unless the options say otherwise
  local precision_default = s.master == "bf16" and "bf16" or name_of(precision_ids, d.precision)
  s.precision = enum_option(o, "precision", precision_ids, precision_default, fname)
  s.grad_precision = enum_option(o, "grad_precision", precision_ids, name_of(precision_ids, d.grad_precision), fname)
  s.nonfinite = enum_option(o, "nonfinite", nonfinite_ids, name_of(nonfinite_ids, d.nonfinite_error), fname)
  s.dist = enum_option(o, "dist", dist_ids, name_of(dist_ids, d.dist), fname)
  s.host_budget = int_option(o, "host_budget", tonumber(d.host_budget), fname, UINT64)
  if o.spill ~= nil and (type(o.spill) ~= "string" or o.spill == "" or o.spill:find("\0", 1, true)) then
    fail(("%s: option 'spill' must be a directory's path, got %s"):format(fname, argcheck.describe(o.spill)))
  end
  s.spill = o.spill
  if C.l2l_relay_config_check(M.config_of(s)) ~= 0 then fail(fname .. ": " .. M.lua_message(lib.last_error())) end
  return s
end

-- The C config of relay options without a model (plain errors naming fname): what
-- l2l.plan plans for.
function M.config_for(o, fname)
  return M.config_of(M.read_settings(o, fname))
end

-- The C config of settings read_settings made.
function M.config_of(s)
  local c = ffi.new("l2l_relay_config")
  C.l2l_relay_config_default(c)
  c.micro_batch = s.micro_batch
  c.stash = stash_ids[s.stash]
  c.recompute_every = s.recompute_every
  c.inner = inner_ids[s.inner]
  s.optimizer:fill(c.optimizer)
  s.schedule:fill(c.schedule)
  c.clip_global_norm = s.clip_global_norm
  c.clip_layer_norm = s.clip_layer_norm
  c.accumulate = s.accumulate
  c.optimizer_threads = s.optimizer_threads
  c.seed = s.seed
  c.param_slots = s.param_slots
  c.loss_scale = s.loss_scale
  c.loss_scale_window = s.loss_scale_window
  c.precision = precision_ids[s.precision]
  c.master = master_ids[s.master]
  c.grad_precision = precision_ids[s.grad_precision]
  c.nonfinite_error = nonfinite_ids[s.nonfinite]
  c.dist = dist_ids[s.dist]
  c.device_budget = s.device_budget
  c.host_budget = s.host_budget
  c.spill_dir = s.spill   -- (s keeps the string alive while c is used)
  return c
end

----------------------------------------------------------------- C's messages in Lua's terms
-- The C relay counts layers, boundaries and micro-batches from 0 and names the fields of
-- l2l_relay_config and l2l_relay_batch; a Lua user counts from 1 and passed options,
-- tokens, targets and opts. Its messages are rewritten accordingly (and an internal
-- function's name in front of a message, e.g. "check_step: ", is dropped).

local function plus_one(d) return tostring(tonumber(d) + 1) end

function M.lua_message(msg)
  msg = msg:gsub("^[%l%d]+_[%l%d_]+: ", "")
  msg = msg:gsub("config%->nonfinite_error", "option 'nonfinite'"):gsub("config%->spill_dir", "option 'spill'")
  msg = msg:gsub("config%->([%w_]+)", "option '%1'")
  -- "layer N" first: the two rewrites below produce "layer N" already counted from 1
  msg = msg:gsub("([Ll]ayer )(%d+)", function(w, d) return w .. plus_one(d) end)
  msg = msg:gsub("layers%[(%d+)%]", function(d) return "layer " .. plus_one(d) end)
  msg = msg:gsub("batch%->skip%[(%d+)%]", function(d) return "opts.skip: layer " .. plus_one(d) end)
  msg = msg:gsub("batch%->tokens", "tokens"):gsub("batch%->targets", "targets")
  msg = msg:gsub("batch%->token_types", "opts.token_types"):gsub("batch%->key_mask", "opts.key_mask")
  msg = msg:gsub("(micro%-batch )(%d+)", function(w, d) return w .. plus_one(d) end)
  msg = msg:gsub("(position )(%d+)", function(w, d) return w .. plus_one(d) end)
  return msg
end

return M
