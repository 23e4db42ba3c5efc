-- SPDX-License-Identifier: MIT
-- l2l.option_table — the relay's option table (src/core/options.def) as Lua reads it, once.
--
-- Purpose: the one list of the options of a relay, its optimizer and its schedule, read
-- through l2l_relay_option, for every module that reads or shows an option: the relay's
-- readers (l2l.relay_options), the optimizers' and schedules' (l2l.optim: names, bounds,
-- choices, each kind's defaults), `l2l train`'s flags (l2l.cli). Below all of them, so none requires another for it.
-- Must never: hold an option of its own, or a value (what a row allows is C's).
local ffi = require("ffi")
local lib = require("l2l.lib")

local C = lib.C
local M = {}

-- The option table (src/core/options.def, read through l2l_relay_option): each row's name,
-- C field and group ("relay", "optimizer", "schedule"), type ("int", "int64", "uint64",
-- "float", "choice", "bool", "path"), bounds, flags, what a checkpoint does with it
-- ("run", "load", "own"), choices (names in the order of their values, with ids[name] =
-- value) and a line of help. M.ROWS lists them in the table's order; M.ROW[name] finds one.
local GROUPS = { [0] = "relay", "optimizer", "schedule" }
local TYPES = { [0] = "int", "int64", "uint64", "float", "choice", "bool", "path" }
local KEEPS = { [0] = "run", "load", "own" }
local FLAGS = { agree = 1, step = 2, open_low = 4, open_high = 8, sgd = 16, adam = 32, decay = 64, plan = 128 }

local function read_rows()
  local rows, by_name = {}, {}
  local out = ffi.new("const l2l_option *[1]")
  for i = 0, C.l2l_relay_option_count() - 1 do
    lib.check(C.l2l_relay_option(out, i))
    local o = out[0]
    local row = { name = ffi.string(o.name), field = ffi.string(o.field), group = GROUPS[tonumber(o.group)],
                  type = TYPES[tonumber(o.type)], min = o.min, max = o.max, keep = KEEPS[tonumber(o.keep)],
                  help = ffi.string(o.help), flags = {} }
    for flag, bit in pairs(FLAGS) do row.flags[flag] = math.floor(o.flags / bit) % 2 == 1 end
    if row.type == "choice" then
      row.choices, row.ids = {}, {}
      for k = 0, o.nchoices - 1 do
        local name = ffi.string(o.choice_names[k])
        row.choices[k + 1], row.ids[name] = name, o.choice_values[k]
      end
    end
    row.kind_default = { [0] = o.kind_default[0], o.kind_default[1], o.kind_default[2] }
    rows[#rows + 1], by_name[row.name] = row, row
  end
  return rows, by_name
end
M.ROWS, M.ROW = read_rows()

-- A choice row's names by their values ({[0] = "device", "host", "recompute"} for stash).
function M.names(row)
  local names = {}
  for name, value in pairs(row.ids) do names[value] = name end
  return names
end

-- The kinds of the optimizer's and the schedule's rows (their kind rows' choices, by value)
-- and which of them take a row's option, as its flags say (sgd: SGD's only; adam: AdamW's
-- and LAMB's; decay: a cosine or linear schedule's).
local KIND_ROW = { optimizer = M.ROW.optimizer, schedule = M.ROW.schedule }
local ONLY = { sgd = { sgd = true }, adam = { adamw = true, lamb = true }, decay = { cosine = true, linear = true } }
local function takes(row, kind)
  for flag, kinds in pairs(ONLY) do
    if row.flags[flag] then return kinds[kind] == true end
  end
  return true
end

-- An optimizer's or schedule's row: row.defaults[kind] (kind "sgd", "adamw", "lamb" or
-- "constant", "cosine", "linear") the option's value in a config of that kind made with no
-- options, as Lua holds it (a boolean, a choice's name; nil: that kind must be given it),
-- from the table's kind_default; row.takes[kind], whether that kind takes the option. The
-- kind row itself has neither.
for _, row in ipairs(M.ROWS) do
  local kind_row = KIND_ROW[row.group]
  if kind_row and row ~= kind_row then
    row.defaults, row.takes = {}, {}
    local names = row.type == "choice" and M.names(row)
    for kind, k in pairs(kind_row.ids) do
      local v = row.kind_default[k]
      if v ~= v then v = nil   -- NaN: required
      elseif row.type == "bool" then v = v ~= 0
      elseif names then v = names[v] end
      row.defaults[kind], row.takes[kind] = v, takes(row, kind)
    end
  end
end

-- What a float row takes, in words: "a finite number >= 0", "a finite number > 0", "a
-- number in [0, 1)", as an error says it.
function M.float_range(row)
  if row.max == math.huge then
    return ("a finite number %s %g"):format(row.flags.open_low and ">" or ">=", row.min)
  end
  return ("a number in %s%g, %g%s"):format(row.flags.open_low and "(" or "[", row.min, row.max,
                                          row.flags.open_high and ")" or "]")
end

-- Whether v lies within a float row's bounds.
function M.float_inside(row, v)
  local low = row.flags.open_low and v > row.min or not row.flags.open_low and v >= row.min
  local high = row.flags.open_high and v < row.max or not row.flags.open_high and v <= row.max
  return low and high
end

return M
