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
-- message in the options' names (lua_message, from the error's detail).
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

local default_config   -- C's default config (default_text's), made at the first ask

-- An option's value where none is given, in words (`l2l train --help` shows it): C's
-- default (l2l_relay_config_default), the rule read_settings below applies, or for an
-- optimizer's or schedule's option each kind's that takes it ("1e-08 (adamw), 1e-06
-- (lamb)"; one value when they agree); nil for the kind rows.
local DEFAULT_RULES = { precision = "bf16 on a GPU or with bf16 masters, else f32",
                        placement = "auto within a device budget, else host" }
function M.default_text(row)
  if DEFAULT_RULES[row.name] then return DEFAULT_RULES[row.name] end
  if row.group ~= "relay" then
    if not row.defaults then return nil end
    local names = option_table.names(row.group == "optimizer" and ROW.optimizer or ROW.schedule)
    local parts, values = {}, {}
    for k = 0, #names do
      local kind = names[k]
      if row.takes[kind] then
        local v = row.defaults[kind]
        v = v == nil and "required" or type(v) == "number" and ("%.10g"):format(v) or tostring(v)
        parts[#parts + 1], values[v] = ("%s (%s)"):format(v, kind), true
      end
    end
    local only = next(values)
    return next(values, only) == nil and only or table.concat(parts, ", ")
  end
  if default_config == nil then   -- (once: a parser asks for each row's)
    default_config = ffi.new("l2l_relay_config")
    C.l2l_relay_config_default(default_config)
  end
  local v = default_config[row.field]
  if row.type == "path" then return v == nil and "none" or ffi.string(v) end
  if row.type == "choice" then return name_of(row.ids, v) end
  if row.type == "bool" then return tostring(v ~= 0) end
  return ("%.10g"):format(tonumber(v))
end

-- Every option but the model and the plan, with C's defaults (l2l_relay_config_default:
-- the default precision follows the device pool's backend), and C's check of what they
-- mean. l2l.plan reads the ones that set memory and time through it too (config_for).
-- `budgeted`: a device budget governs what is read (a plan's, or plan = "auto"'s), as
-- option device_budget does: placement is then "auto" unless the options say otherwise.
function M.read_settings(o, fname, budgeted)
  local d = ffi.new("l2l_relay_config")
  C.l2l_relay_config_default(d)
  local s = {}
  for _, row in ipairs(ROWS) do
    if row.group == "relay" and row.name ~= "precision" and row.name ~= "placement" then
      s[row.name] = read_row(o, row, d, fname)
    end
  end
  -- bf16 masters are what the device reads: precision bf16 unless the options say otherwise
  s.precision = read_row(o, ROW.precision, d, fname, s.master == "bf16" and "bf16" or nil)
  -- within a device budget the planner places the records (issue 49: a model that fits
  -- trains as an ordinary GPU trainer, one that does not degrades record by record)
  s.placement = read_row(o, ROW.placement, d, fname,
                         (budgeted or s.device_budget > 0) and "auto" or nil)
  -- given none: C's default config's kinds (options.def), each with its defaults
  s.optimizer = o.optimizer or optim.default_of(option_table.names(ROW.optimizer)[tonumber(d.optimizer.kind)])
  if not optim.is_optimizer(s.optimizer) then
    fail(fname .. ": option 'optimizer' must be l2l.SGD{...}, l2l.AdamW{...} or l2l.LAMB{...}, got " .. tostring(o.optimizer))
  end
  s.schedule = o.schedule or optim.default_of(option_table.names(ROW.schedule)[tonumber(d.schedule.kind)])
  if not optim.is_schedule(s.schedule) then
    fail(fname .. ": option 'schedule' must be l2l.ConstantLR{...}, l2l.CosineLR{...} or l2l.LinearLR{...}, got " .. tostring(o.schedule))
  end
  if C.l2l_relay_config_check(M.config_of(s)) ~= 0 then fail(fname .. ": " .. M.lua_message()) end
  return s
end

-- The C config of relay options without a model (plain errors naming fname): what
-- l2l.plan plans for (within its budget: `budgeted`, read_settings).
function M.config_for(o, fname, budgeted)
  return M.config_of(M.read_settings(o, fname, budgeted))
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
-- C names what a message is about in C's terms: a field of l2l_relay_config or
-- l2l_relay_batch ("config->micro_batch", "batch->tokens[0][3]"), a layer or a
-- micro-batch counted from 0. The error's detail (l2l_last_error_detail) says what the
-- message names and which of its bytes name each; Lua puts its own names there (the
-- option, the argument, the element as :get takes it, counts from 1) and leaves out the
-- C function's name in front. Nothing here reads the message's words.

-- The Lua name of a field C names: an option (the table's rows: the relay's, then its
-- optimizer's and schedule's but their "kind"), or an argument of run:step.
local FIELD_NAMES = { tokens = "tokens", targets = "targets", token_types = "opts.token_types",
                      key_mask = "opts.key_mask", skip = "opts.skip" }
for _, group in ipairs({ "relay", "optimizer", "schedule" }) do
  for _, row in ipairs(ROWS) do
    if row.group == group and row.field ~= "kind" and FIELD_NAMES[row.field] == nil then
      FIELD_NAMES[row.field] = "option '" .. row.name .. "'"
    end
  end
end
M.FIELD_NAMES = FIELD_NAMES

-- The words for each span of the detail d that names something Lua words otherwise, as
-- {at, bytes, words} (lib.last_error puts them in place, and the element's).
local function renamed(d)
  local spans = {}
  local function put(span, known, words)
    if known and span.bytes > 0 then spans[#spans + 1] = { span.at, span.bytes, words } end
  end
  put(d.layer_named, d.layer >= 0, "layer " .. (d.layer + 1))
  put(d.micro_batch_named, d.micro_batch >= 0, "micro-batch " .. tostring(tonumber(d.micro_batch) + 1))
  local field = ffi.string(d.field)
  put(d.field_named, FIELD_NAMES[field] ~= nil, FIELD_NAMES[field])
  return spans
end

-- The last C error in Lua's terms (above).
function M.lua_message() return lib.last_error(renamed) end

return M
