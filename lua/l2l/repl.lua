-- SPDX-License-Identifier: MIT
-- l2l.repl — what the l2l executable's prompt shows for values, and its tab completion
-- (src/runner/main.c calls show and complete; nothing else needs this module).
--
-- Purpose: a value typed at the prompt reads as what it is. Tensors, models and optimizers
-- print through their own __tostring (dtype, shape, values; the table of layers), a layer
-- or a relay as a one-line summary, a plain table as a short listing of its keys and
-- values (array part in order, then the other keys sorted) instead of "table: 0x...",
-- and integral numbers in full (byte counts read as 140089185689600, not 1.4008918568e+14).
-- The module stands alone: it does not load l2l, and uses it only when the session has
-- (l2l.argcheck is loaded only to word a refusal).
-- Must never: print an unbounded amount for a big table (listings stop after MAX_ITEMS
-- entries, strings after MAX_STRING bytes), follow a table into itself, or run code
-- while completing a name (only raw fields and __index tables are looked at: no
-- __index functions, no __tostring).
local M = {}

local type, next, rawget, tostring, select = type, next, rawget, tostring, select
local getmetatable, pcall, ipairs = getmetatable, pcall, ipairs
local floor, abs = math.floor, math.abs
local concat, sort = table.concat, table.sort

local MAX_ITEMS = 30    -- entries shown of one table
local MAX_STRING = 60   -- bytes shown of a string inside a listing
local MAX_INLINE = 100  -- a listing longer than this goes one entry per line
local MAX_DEPTH = 2     -- nested plain tables shown inline down to this depth

local keywords = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or
            repeat return then true until while]]):gmatch("%a+") do keywords[w] = true end

local function number(n)
  -- %.14g would write 2^40 bytes as 1.099511627776e+12; below 2^53 an integral double is exact
  if n == floor(n) and abs(n) < 2 ^ 53 then return ("%d"):format(n) end
  return tostring(n)
end

local function quote(s)
  local cut = #s > MAX_STRING
  -- %q escapes a newline as a backslash and a real newline: the listing stays one line
  local q = ("%q"):format(cut and s:sub(1, MAX_STRING) or s):gsub("\\\n", "\\n")
  return cut and q .. "..." or q
end

local function first_line(s)
  local line = s:match("^[^\n]*")
  return #line < #s and line .. " ..." or line
end

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

-- tostring that cannot raise: a __tostring that fails shows its error instead.
local function safe_tostring(v)
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return ("<%s: __tostring failed: %s>"):format(type(v), tostring(s))
end

-- One line for the objects of l2l that have no __tostring of their own; nil for others.
local function summary(v)
  local l2l = package.loaded.l2l
  if type(l2l) ~= "table" or type(v) ~= "table" then return nil end
  if l2l.is_layer and l2l.is_layer(v) then
    local ok, s = pcall(function() return ("layer %s: %d parameters"):format(v:label(), v:nparams()) end)
    return ok and s or "layer (freed)"
  end
  if l2l.is_relay and l2l.is_relay(v) then
    local ok, s = pcall(function()
      local model = safe_tostring(v.model):match("^[^\n]*")
      return ("l2l.Relay over %s; %d steps"):format(model, v:stats().steps)
    end)
    return ok and s or "l2l.Relay (freed)"
  end
  return nil
end

-- Keys in the order shown: numbers, then strings, then the rest, each group sorted.
local rank = { number = 1, string = 2, boolean = 3 }
local function before(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return (rank[ta] or 4) < (rank[tb] or 4) end
  if ta == "number" or ta == "string" then return a < b end
  if ta == "boolean" then return not a and b end
  return tostring(a) < tostring(b)
end

-- The length of t's array part (1..n without holes) and its other keys, sorted.
local function entries(t)
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  local keys = {}
  for k in next, t do
    if not (type(k) == "number" and k >= 1 and k <= n and k == floor(k)) then keys[#keys + 1] = k end
  end
  sort(keys, before)
  return n, keys
end

local short

local function key(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") and not keywords[k] then return k end
  return "[" .. short(k, MAX_DEPTH, {}) .. "]"
end

-- The entries of t as strings ("v" for the array part, "k = v" for the rest), at most
-- MAX_ITEMS of them and then "... (N more)".
local function items(t, depth, seen)
  local n, keys = entries(t)
  local out, total = {}, n + #keys
  for i = 1, n do
    if #out == MAX_ITEMS then break end
    out[#out + 1] = short(rawget(t, i), depth, seen)
  end
  for _, k in ipairs(keys) do
    if #out == MAX_ITEMS then break end
    out[#out + 1] = key(k) .. " = " .. short(rawget(t, k), depth, seen)
  end
  if total > #out then out[#out + 1] = ("... (%d more)"):format(total - #out) end
  return out
end

-- One line for a value inside a listing; `seen` holds the tables being listed.
function short(v, depth, seen)
  local tv = type(v)
  if tv == "string" then return quote(v) end
  if tv == "number" then return number(v) end
  local s = summary(v)
  if s then return s end
  if has_tostring(v) or tv == "cdata" then return first_line(safe_tostring(v)) end
  if tv ~= "table" then return tostring(v) end
  if next(v) == nil then return "{}" end
  if seen[v] or depth >= MAX_DEPTH then return "{...}" end
  seen[v] = true
  local list = items(v, depth + 1, seen)
  seen[v] = nil
  return "{ " .. concat(list, ", ") .. " }"
end

-- argcheck.too_many, loaded only when an extra argument is refused.
local function too_many(fname, params, ...)
  require("l2l.argcheck").too_many(fname, params, 3, ...)
end

-- repl.format(v): the text shown for one value at the prompt (several lines for a long table).
function M.format(v, ...)
  if select("#", ...) ~= 0 then too_many("repl.format", "v", ...) end
  local tv = type(v)
  if tv == "string" then return v end   -- as print shows it
  if tv == "number" then return number(v) end
  local s = summary(v)
  if s then return s end
  if tv ~= "table" or has_tostring(v) then return safe_tostring(v) end
  if next(v) == nil then return "{}" end
  local seen = { [v] = true }
  local list = items(v, 1, seen)
  local line = "{ " .. concat(list, ", ") .. " }"
  if #line <= MAX_INLINE then return line end
  return "{\n  " .. concat(list, ",\n  ") .. "\n}"
end

-- Prints the values of an expression, tab-separated like print (a nil as nil).
function M.show(...)
  local out = {}
  for i = 1, select("#", ...) do out[i] = M.format((select(i, ...))) end
  io.stdout:write(concat(out, "\t"), "\n")
end

----------------------------------------------------------------- completion

-- The table whose fields complete `v.` or `v:`: v itself, or for a string the string
-- library, for a tensor its methods; nil for anything else.
local function fields_of(v)
  if type(v) == "table" then return v end
  if type(v) == "string" then return string end
  local l2l, tensor = package.loaded.l2l, package.loaded["l2l.tensor"]
  if type(l2l) == "table" and l2l.is_tensor and l2l.is_tensor(v) and type(tensor) == "table" then
    return tensor.Tensor
  end
  return nil
end

-- rawget along the __index chain (tables only: an __index function is code).
local function lookup(t, name)
  for _ = 1, 16 do
    if type(t) ~= "table" then return nil end
    local v = rawget(t, name)
    if v ~= nil then return v end
    local mt = getmetatable(t)
    t = type(mt) == "table" and rawget(mt, "__index") or nil
  end
  return nil
end

-- Every name that completes `text` ("l2l.Seq" -> "l2l.Sequential", "model:ins" ->
-- "model:insert", "pri" -> "print"), sorted; an empty list when there is none.
function M.complete(text, ...)
  if select("#", ...) ~= 0 then too_many("repl.complete", "text", ...) end
  if type(text) ~= "string" then error("repl.complete: text must be a string, got " .. type(text), 2) end
  local path, sep, part = text:match("^(.-)([.:]?)([%w_]*)$")
  if path == nil or (path ~= "" and sep == "") then return {} end
  local obj = _G
  if path ~= "" then
    for name in (path .. "."):gmatch("([^.]*)%.") do
      if not name:match("^[%a_][%w_]*$") then return {} end   -- a ':' or an empty name
      obj = lookup(fields_of(obj), name)
      if obj == nil then return {} end
    end
  end
  local found, taken = {}, {}
  local t = fields_of(obj)
  for _ = 1, 16 do
    if type(t) ~= "table" then break end
    for k, v in next, t do
      if type(k) == "string" and not taken[k] and k:sub(1, #part) == part
         and k:match("^[%a_][%w_]*$") and (sep ~= ":" or type(v) == "function") then
        taken[k] = true
        found[#found + 1] = path .. sep .. k
      end
    end
    local mt = getmetatable(t)
    t = type(mt) == "table" and rawget(mt, "__index") or nil
  end
  sort(found)
  return found
end

return M
