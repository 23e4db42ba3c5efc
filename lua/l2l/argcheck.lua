-- SPDX-License-Identifier: MIT
-- l2l.argcheck — the argument checks every public Lua function shares: an options table's
-- keys (with a suggestion for a misspelt one), a description's fields, too many
-- arguments, a value described as an error message shows it, and the one warning a
-- deprecated name gives.
--
-- Purpose: one wording for every refusal, at no cost on a valid call (below).
-- Must never: touch the C library (it is below l2l.lib), or allocate on a valid call.
local ffi = require("ffi")

local type, tostring, select, next, pairs, floor = type, tostring, select, next, pairs, math.floor

local M = {}

----------------------------------------------------------------- arguments
-- Every public function refuses what it does not understand, the same way everywhere:
--   an options table that is not a table:  "l2l.zeros: options must be a table, got string \"i32\""
--   a key it does not know:                "l2l.zeros: unknown option 'dtpye' (did you mean 'dtype'?)"
--   arguments beyond those it takes:       "l2l.zeros: takes 2 arguments (shape, options), got 3"
-- `level` is what the caller would give error() (2: the caller of the public function;
-- 0 inside a pcall that re-raises, so that no position is added twice).
-- On a valid call the checks cost a type test and one lookup per key: no allocation, no
-- closure, and (up to four keys) no loop, so a script's loop that calls an op per
-- micro-batch with options still compiles to one trace (LuaJIT gives up a root trace at
-- an inner loop). A function checks its argument count with, first thing,
--   if select("#", ...) ~= 0 then argcheck.too_many("l2l.zeros", "shape, options", 2, ...) end
-- (its parameter list ends in `...`), which costs nothing when the count is right.

-- The largest whole number a Lua number holds with its neighbours told apart (2^53 - 1):
-- past it, 2^53 + 1 reads as 2^53 and 2^64 as anything a conversion makes of it, so
-- seeds, counts and indexes stop there.
M.EXACT_MAX = 2 ^ 53 - 1

-- What is wrong with v as a whole number in [min, EXACT_MAX] (min defaults to 0), as a
-- message says it ("must be an integer >= 0"), or nil when nothing is.
function M.whole_problem(v, min)
  min = min or 0
  if type(v) ~= "number" or v ~= floor(v) or v < min then return ("must be an integer >= %d"):format(min) end
  if v > M.EXACT_MAX then return "must be at most 2^53 - 1 (a larger number is not held exactly)" end
  return nil
end

-- Whether v is such a whole number.
function M.whole(v, min) return M.whole_problem(v, min) == nil end

-- error() for the helpers below: `level` counts from the function that called the helper.
local function raise(msg, level) error(msg, level == 0 and 0 or level + 2) end

-- A value as an error message shows it: string "i32", number 3, boolean true, tensor,
-- table, nil.
function M.describe(v)
  local tv = type(v)
  if tv == "string" then return ('string "%s"'):format(#v > 40 and v:sub(1, 37) .. "..." or v) end
  if tv == "number" or tv == "boolean" then return tv .. " " .. tostring(v) end
  if tv == "cdata" and tostring(ffi.typeof(v)):find("l2l_lua_tensor", 1, true) then return "tensor" end
  return tv
end

-- Edit distance with transpositions (optimal string alignment), for "did you mean".
local function distance(a, b)
  local prev2, prev, cur = {}, {}, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local d = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        d = math.min(d, prev2[j - 2] + 1)
      end
      cur[j] = d
    end
    prev2, prev = prev, cur
  end
  return prev[#b]
end

local function sorted_names(known)
  local names = {}
  for name in pairs(known) do
    if type(name) == "string" then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

-- argcheck.suggest(word, known) -> the name of `known` (a set: name -> true) nearest to `word`
-- when it is a near miss (at most a third of its letters wrong, or one), else nil.
function M.suggest(word, known)
  if type(word) ~= "string" then return nil end
  local best, best_d
  for _, name in ipairs(sorted_names(known)) do
    local d = distance(word:lower(), name:lower())
    if best_d == nil or d < best_d then best, best_d = name, d end
  end
  if best and best_d <= math.max(1, floor(#best / 3)) and best_d < #word then return best end
  return nil
end

-- " (did you mean 'dtype'?)" for a near miss, else " (known options: dtype, pool)".
local function hint(key, known, word)
  local names = sorted_names(known)
  if #names == 0 then return (" (it takes no %s)"):format(word) end
  local best = M.suggest(key, known)
  if best then return (" (did you mean '%s'?)"):format(best) end
  return (" (known %s: %s)"):format(word, table.concat(names, ", "))
end

local function key_text(k)
  if type(k) == "string" then return "'" .. k .. "'" end
  return "[" .. tostring(k) .. "]"
end

-- The first key of t that `known` lacks, or nil. The first four without a loop (above).
local function unknown_key(t, known)
  local k = next(t)
  if k == nil or not known[k] then return k end
  k = next(t, k)
  if k == nil or not known[k] then return k end
  k = next(t, k)
  if k == nil or not known[k] then return k end
  k = next(t, k)
  if k == nil or not known[k] then return k end
  for key in next, t, k do
    if not known[key] then return key end
  end
  return nil
end

-- The options table of a call, read-only: given for a missing (nil) options argument.
local EMPTY = setmetatable({}, {
  __newindex = function() error("l2l: the shared empty options table is read-only", 2) end,
  __metatable = false,
})
M.EMPTY = EMPTY

-- argcheck.options(o, known, fname, level [, name = "options"]) -> o, or an empty table for
-- nil: an options argument, refused unless it is a table whose keys `known` holds (a set:
-- name -> true). `name` is the argument's name in the message for a non-table.
function M.options(o, known, fname, level, name)
  if o == nil then return EMPTY end
  if type(o) ~= "table" then
    raise(("%s: %s must be a table, got %s"):format(fname, name or "options", M.describe(o)), level)
  end
  local k = unknown_key(o, known)
  if k ~= nil then
    raise(("%s: unknown option %s%s"):format(fname, key_text(k), hint(k, known, "options")), level)
  end
  return o
end

-- argcheck.fields(t, known, fname, level, name [, list]) -> t: a table with named fields (part
-- of an argument: name is its path, as "figure.panels[2]"), refused unless it is a table
-- whose keys `known` holds; with `list`, also the positions 1 .. #t of its array part.
function M.fields(t, known, fname, level, name, list)
  if type(t) ~= "table" then
    raise(("%s: %s must be a table, got %s"):format(fname, name, M.describe(t)), level)
  end
  local n = list and #t or 0
  for k in pairs(t) do
    if not known[k] and not (type(k) == "number" and k >= 1 and k <= n and k == floor(k)) then
      raise(("%s: %s: unknown field %s%s"):format(fname, name, key_text(k), hint(k, known, "fields")), level)
    end
  end
  return t
end

-- argcheck.too_many(fname, params, level, ...): raises "fname: takes 2 arguments (shape,
-- options), got 3"; `params` names the parameters (after self for a method), `...` are
-- the arguments beyond them. Call it only when select("#", ...) ~= 0.
function M.too_many(fname, params, level, ...)
  local taken = params == "" and 0 or select(2, params:gsub(",", ",")) + 1
  local takes = taken == 0 and "no arguments" or taken == 1 and ("1 argument (%s)"):format(params)
                or ("%d arguments (%s)"):format(taken, params)
  raise(("%s: takes %s, got %d"):format(fname, takes, taken + select("#", ...)), level)
end

----------------------------------------------------------------- deprecated names
-- A name kept for one release after it was renamed still works; the first call of it in
-- a process writes one line to standard error naming the new one (each old name once, so
-- a loop that calls it prints nothing more).
local warned = {}

-- argcheck.deprecated(old, new): that line, the first time `old` is used.
function M.deprecated(old, new)
  if warned[old] then return end
  warned[old] = true
  io.stderr:write(("l2l: %s is deprecated: use %s (the old name goes in the next release)\n")
                  :format(old, new))
end

return M
