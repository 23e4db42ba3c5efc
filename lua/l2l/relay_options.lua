-- SPDX-License-Identifier: MIT
-- l2l.relay_options — the relay's options, read and checked, as the C relay's config
-- (l2l_relay_config); and the C relay's messages in Lua's terms.
--
-- Purpose: the options l2l.Relay takes are the relay's rows of C's option table
-- (src/core/options.def, through l2l_relay_option: M.ROWS), which a checkpoint keeps
-- (M.OPTIONS: l2l.Relay accepts its names, l2l.checkpoint saves and restores each, so a new
-- option is kept by every save by construction) and `l2l train` makes flags of; and one
-- reading of them, which l2l.plan shares for the ones that change memory and time, so that
-- both refuse a bad option with one message naming it; below both modules, so neither
-- requires the other for it. Defaults and bounds are C's (l2l_relay_config_default,
-- l2l_relay_config_check): Lua checks only that a value fits its C field, and shows C's
-- message in the options' names.
-- Must never: read the model or the plan (l2l.Relay checks those), or hold state.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local optim = require("l2l.optim")
local option_table = require("l2l.option_table")

local C = lib.C
local type, tostring, pairs, floor, huge = type, tostring, pairs, math.floor, math.huge

local M = {}

----------------------------------------------------------------- the options, once
-- The option table's rows (l2l.option_table: src/core/options.def through l2l_relay_option).
M.ROWS, M.ROW = option_table.ROWS, option_table.ROW
local ROWS, ROW = M.ROWS, M.ROW

M.stash_ids, M.inner_ids = ROW.stash.ids, ROW.inner.ids

-- Every option of l2l.Relay, and what a checkpoint does with it: "run", a setting of the
-- run, saved and restored as it is; "load", the same, and l2l.load may be given another
-- (what is the machine's rather than the run's: budgets, micro-batch, threads, the spill
-- directory, whether this process is one rank of a job; and the masters' precision, which
-- a load converts); "own", kept in a form of its own (the model as its layers, the
-- optimizer and the schedule as their fields, a plan as "auto" or as the micro-batch and
-- layer policies it set). The relay's rows of the table, and the four of its own.
M.OPTIONS = { model = "own", plan = "own", optimizer = "own", schedule = "own" }
for _, row in ipairs(ROWS) do
  if row.group == "relay" then M.OPTIONS[row.name] = row.keep end
end

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

-- Reads one row's option from o (nil: the default d holds), as its C field holds it.
local RANGES = { int = INT, int64 = INT64, uint64 = UINT64 }
local function read_row(o, row, d, fname, default)
  local t = row.type
  if RANGES[t] then return int_option(o, row.name, tonumber(d[row.field]), fname, RANGES[t]) end
  if t == "float" then return float_option(o, row.name, d[row.field], fname) end
  if t == "choice" then return enum_option(o, row.name, row.ids, default or name_of(row.ids, d[row.field]), fname) end
  local v = o[row.name]   -- a path
  if v ~= nil and (type(v) ~= "string" or v == "" or v:find("\0", 1, true)) then
    fail(("%s: option '%s' must be a directory's path, got %s"):format(fname, row.name, argcheck.describe(v)))
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
  for _, row in ipairs(ROWS) do
    if row.group == "relay" and row.name ~= "precision" then s[row.name] = read_row(o, row, d, fname) end
  end
  -- bf16 masters are what the device reads: precision bf16 unless the options say otherwise
  s.precision = read_row(o, ROW.precision, d, fname, s.master == "bf16" and "bf16" or nil)
  s.optimizer = o.optimizer or optim.AdamW{}
  if not optim.is_optimizer(s.optimizer) then
    fail(fname .. ": option 'optimizer' must be l2l.SGD{...}, l2l.AdamW{...} or l2l.LAMB{...}, got " .. tostring(o.optimizer))
  end
  s.schedule = o.schedule or optim.ConstantLR{}
  if not optim.is_schedule(s.schedule) then
    fail(fname .. ": option 'schedule' must be l2l.ConstantLR{...}, l2l.CosineLR{...} or l2l.LinearLR{...}, got " .. tostring(o.schedule))
  end
  if C.l2l_relay_config_check(M.config_of(s)) ~= 0 then fail(fname .. ": " .. M.lua_message(lib.last_error())) end
  return s
end

-- The C config of relay options without a model (plain errors naming fname): what
-- l2l.plan plans for.
function M.config_for(o, fname)
  return M.config_of(M.read_settings(o, fname))
end

-- The C config of settings read_settings made (a path's string is s's: s keeps it alive
-- while c is used).
function M.config_of(s)
  local c = ffi.new("l2l_relay_config")
  C.l2l_relay_config_default(c)
  for _, row in ipairs(ROWS) do
    if row.group == "relay" then
      local v = s[row.name]
      if row.type == "choice" then v = row.ids[v] end
      c[row.field] = v
    end
  end
  s.optimizer:fill(c.optimizer)
  s.schedule:fill(c.schedule)
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
  for _, row in ipairs(ROWS) do   -- a field named otherwise than its option
    if row.group == "relay" and row.field ~= row.name then
      msg = msg:gsub("config%->" .. row.field .. "%f[^%w_]", "option '" .. row.name .. "'")
    end
  end
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
