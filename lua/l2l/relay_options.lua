-- SPDX-License-Identifier: MIT
-- l2l.relay_options — the relay's options, read and checked, as the C relay's config
-- (l2l_relay_config); and the C relay's messages in Lua's terms.
--
-- Purpose: one reading of the options that l2l.Relay takes and l2l.plan plans for (the
-- ones that change memory and time), so that both refuse a bad option with one message
-- naming it; below both modules, so neither requires the other for it.
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
local nonfinite_ids = { skip = 0, error = 1 }
local dist_ids = { none = 0, mpi = 1 }

local function fail(msg) error(msg, 0) end
M.fail = fail
local function finite(v) return type(v) == "number" and v == v and v > -huge and v < huge end

-- The largest integers the options' C fields take exactly: an int's, and for 64-bit
-- fields the last integer a Lua number holds exactly (the FFI would truncate the rest).
local INT_MAX, EXACT_MAX = 2 ^ 31 - 1, 2 ^ 53 - 1

-- An integer option >= min and <= max (EXACT_MAX where none is given).
local function int_option(o, key, default, min, fname, max)
  local v = o[key]
  if v == nil then return default end
  max = max or EXACT_MAX
  if not finite(v) or v ~= floor(v) or v < min then
    fail(("%s: option '%s' must be an integer >= %d, got %s"):format(fname, key, min, tostring(v)))
  end
  if v > max then
    fail(("%s: option '%s' must be at most %d, got %s"):format(fname, key, max, tostring(v)))
  end
  return v
end

-- A float of the C config: checked as the f32 C keeps too.
local function nonneg_option(o, key, fname)
  local v = o[key]
  if v == nil then return 0 end
  local function ok(x) return finite(x) and x >= 0 end
  if not ok(v) then
    fail(("%s: option '%s' must be a finite number >= 0, got %s"):format(fname, key, tostring(v)))
  end
  local trouble = lib.f32_trouble(v, ok)
  if trouble then fail(("%s: option '%s' is %s, which %s"):format(fname, key, tostring(v), trouble)) end
  return v
end

-- C's default precision: bf16 when the device pool is on a GPU, f32 on the CPU backend.
local function default_precision()
  local c = ffi.new("l2l_relay_config")
  C.l2l_relay_config_default(c)
  for name, id in pairs(precision_ids) do
    if id == c.precision then return name end
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

-- Every option but the model and the plan: checked, with their defaults (l2l.plan reads
-- the ones that set memory and time through it too: config_for below).
function M.read_settings(o, fname)
  local s = {}
  s.micro_batch = int_option(o, "micro_batch", 1, 1, fname)
  s.stash = enum_option(o, "stash", stash_ids, "host", fname)
  s.recompute_every = int_option(o, "recompute_every", 1, 1, fname, INT_MAX)
  s.inner = enum_option(o, "inner", inner_ids, "recompute", fname)
  s.optimizer = o.optimizer or optim.AdamW{}
  if not optim.is_optimizer(s.optimizer) then
    fail(fname .. ": option 'optimizer' must be l2l.SGD{...}, l2l.AdamW{...} or l2l.LAMB{...}, got " .. tostring(o.optimizer))
  end
  s.schedule = o.schedule or optim.Constant{}
  if not optim.is_schedule(s.schedule) then
    fail(fname .. ": option 'schedule' must be l2l.Constant{...}, l2l.Cosine{...} or l2l.Linear{...}, got " .. tostring(o.schedule))
  end
  s.clip_global_norm = nonneg_option(o, "clip_global_norm", fname)
  s.clip_layer_norm = nonneg_option(o, "clip_layer_norm", fname)
  s.accumulate = int_option(o, "accumulate", 1, 1, fname, INT_MAX)
  s.optimizer_threads = int_option(o, "optimizer_threads", 0, 0, fname, 1024)
  s.seed = int_option(o, "seed", 0, 0, fname)
  s.param_slots = int_option(o, "param_slots", 2, 2, fname, 4096)
  s.loss_scale = nonneg_option(o, "loss_scale", fname)
  if s.loss_scale > 0 and (s.loss_scale < 2 ^ -64 or s.loss_scale > 2 ^ 100) then
    fail(("%s: option 'loss_scale' must be 0 (off) or 2^-64 to 2^100, got %s"):format(fname, tostring(s.loss_scale)))
  end
  s.loss_scale_window = int_option(o, "loss_scale_window", 2000, 1, fname, INT_MAX)
  s.device_budget = int_option(o, "device_budget", nil, 0, fname)
  s.precision = enum_option(o, "precision", precision_ids, default_precision(), fname)
  s.grad_precision = enum_option(o, "grad_precision", precision_ids, "f32", fname)
  s.nonfinite = enum_option(o, "nonfinite", nonfinite_ids, "skip", fname)
  s.dist = enum_option(o, "dist", dist_ids, "none", fname)
  return s
end

-- The C config of relay options without a model (plain errors naming fname): what
-- l2l.plan plans for.
function M.config_for(o, fname)
  local c = M.config_of(M.read_settings(o, fname))
  if C.l2l_relay_config_check(c) ~= 0 then fail(fname .. ": " .. M.lua_message(lib.last_error())) end
  return c
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
  c.grad_precision = precision_ids[s.grad_precision]
  c.nonfinite_error = nonfinite_ids[s.nonfinite]
  c.dist = dist_ids[s.dist]
  return c
end

----------------------------------------------------------------- C's messages in Lua's terms
-- The C relay counts layers, boundaries and micro-batches from 0 and names the fields of
-- l2l_relay_batch; a Lua user counts from 1 and passed tokens, targets and opts. Its
-- messages are rewritten accordingly (and an internal function's name in front of a
-- message, e.g. "check_step: ", is dropped).

local function plus_one(d) return tostring(tonumber(d) + 1) end

function M.lua_message(msg)
  msg = msg:gsub("^[%l%d]+_[%l%d_]+: ", "")
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
