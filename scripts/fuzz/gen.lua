-- SPDX-License-Identifier: MIT
-- scripts/fuzz/gen.lua — the loader fuzzer's raw material (scripts/fuzz_load.lua loads it):
-- a JSON writer that can write what cjson will not, a base checkpoint taken apart, the
-- random choices, hostile values, and the state a case's mutations edit.
--
-- Purpose: everything scripts/fuzz/mutations.lua builds its damaged files from, in one
-- place, deterministic given math.random's seed (case K of seed S is the same file in
-- every run).
-- Must never: call l2l (the parent builds files only; loading them is the children's),
-- or draw randomness from anything but math.random.
local cjson = require("cjson").new()

local floor, huge = math.floor, math.huge

----------------------------------------------------------------- JSON, written by hand

-- cjson cannot write what a hostile file holds (duplicate keys, raw number text, bytes
-- that are not UTF-8, nesting past its limit): this writer can. raw(text) is written as
-- it is; array(t) is an array even when empty; dups[object] = { {key, value, first}, ... }
-- adds keys that the object already has; DESC_SLOT stands for the l2l description text.
local RAW_MT, ARRAY_MT = {}, {}
local function raw(text) return setmetatable({ text = text }, RAW_MT) end
local function array(t) return setmetatable(t or {}, ARRAY_MT) end
local dups = setmetatable({}, { __mode = "k" })
local DESC_SLOT = {}
local null = cjson.null

local function jstring(s)
  return '"' .. s:gsub('[%c"\\]', function(ch)
    if ch == '"' then return '\\"' elseif ch == "\\" then return "\\\\" end
    return ("\\u%04x"):format(ch:byte())
  end) .. '"'
end

local function jnumber(v)
  if v ~= v then return "nan" end
  if v == huge then return "1e999" elseif v == -huge then return "-1e999" end
  if v == floor(v) and math.abs(v) < 2 ^ 63 then return ("%.0f"):format(v) end
  return ("%.17g"):format(v)
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local function is_array(t)
  if getmetatable(t) == ARRAY_MT then return true end
  local n, count = #t, 0
  if n == 0 then return false end
  for _ in pairs(t) do count = count + 1 end
  return count == n
end

local function encode(v, out, desc_text)
  local tv = type(v)
  if v == nil or v == null then out[#out + 1] = "null"
  elseif tv == "boolean" then out[#out + 1] = tostring(v)
  elseif tv == "number" then out[#out + 1] = jnumber(v)
  elseif tv == "string" then out[#out + 1] = jstring(v)
  elseif v == DESC_SLOT then out[#out + 1] = jstring(desc_text)
  elseif tv == "table" and getmetatable(v) == RAW_MT then out[#out + 1] = v.text
  elseif tv == "table" and is_array(v) then
    out[#out + 1] = "["
    for i = 1, table.maxn(v) do
      if i > 1 then out[#out + 1] = "," end
      encode(v[i], out, desc_text)
    end
    out[#out + 1] = "]"
  elseif tv == "table" then
    out[#out + 1] = "{"
    local first = true
    local function member(k, x)
      if not first then out[#out + 1] = "," end
      first = false
      out[#out + 1] = getmetatable(k) == RAW_MT and k.text or jstring(tostring(k))
      out[#out + 1] = ":"
      encode(x, out, desc_text)
    end
    local extra = dups[v] or {}
    for _, d in ipairs(extra) do if d[3] then member(d[1], d[2]) end end
    for _, k in ipairs(sorted_keys(v)) do member(k, v[k]) end
    for _, d in ipairs(extra) do if not d[3] then member(d[1], d[2]) end end
    out[#out + 1] = "}"
  else
    out[#out + 1] = jstring(tostring(v))
  end
end

local function json(v, desc_text)
  local out = {}
  encode(v, out, desc_text)
  return table.concat(out)
end

local function show(v)
  local ok, s = pcall(json, v, "<desc>")
  s = ok and s or tostring(v)
  s = s:gsub("[%z\1-\31\127-\255]", function(ch) return ("\\x%02x"):format(ch:byte()) end)
  if #s > 70 then s = s:sub(1, 60) .. "...(" .. #s .. " chars)" end
  return s
end

local function deepcopy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deepcopy(x) end
  return setmetatable(out, getmetatable(v))
end

----------------------------------------------------------------- bytes

local function le64(n)
  local bytes = {}
  for i = 1, 8 do
    bytes[i] = string.char(n % 256)
    n = floor(n / 256)
  end
  return table.concat(bytes)
end

local function read_le64(s)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + (s:byte(i) or 0) end
  return n
end

-- A base file taken apart: header text and table, data, each tensor's bytes, description.
local function parse_base(bytes)
  local n = read_le64(bytes)
  local b = { bytes = bytes, n = n, text = bytes:sub(9, 8 + n), data = bytes:sub(9 + n), blobs = {} }
  local header = cjson.decode(b.text)
  for name, e in pairs(header) do
    if name ~= "__metadata__" then
      b.blobs[name] = b.data:sub(e.data_offsets[1] + 1, e.data_offsets[2])
    end
  end
  b.desc_text = type(header.__metadata__) == "table" and header.__metadata__.l2l or nil   -- (a GPT-2 file: none)
  return b
end

----------------------------------------------------------------- randomness

-- math.random, seeded per case from (seed, case): a case is the same whatever came before.
local function rint(a, b) return math.random(a, b) end
local function chance(p) return math.random() < p end
local function pick(list) return list[math.random(1, #list)] end
local function random_bytes(n)
  local t = {}
  for i = 1, n do t[i] = string.char(rint(0, 255)) end
  return table.concat(t)
end

local BIG = {
  0, -1, 1, 2, 3, 0.5, 1.5, -0.5, 2 ^ 20, 2 ^ 24 - 1, 2 ^ 24, 2 ^ 31 - 1, 2 ^ 31, 2 ^ 32, 2 ^ 32 + 5,
  2 ^ 40, 2 ^ 53 - 1, 2 ^ 53, 2 ^ 53 + 2, 2 ^ 63, 2 ^ 64, 1e308, -2 ^ 31, -2 ^ 53, -2 ^ 63, 1e-300,
}
local RAW_NUMBERS = {
  "1e999", "-1e999", "nan", "-nan", "inf", "-0", "0x10", "0x7fffffffffffffff", "1e-400",
  "18446744073709551615", "18446744073709551617", "123456789012345678901234567890", "5e-324",
  "1.0", "1E2", "01", "+1", "Infinity", ".5", "1.", "-", "9007199254740993",
}
local function hostile_number()
  local r = math.random()
  if r < 0.6 then return pick(BIG) elseif r < 0.9 then return raw(pick(RAW_NUMBERS)) end
  return rint(-1000, 100000)
end

local function nest(depth, object)
  if object then return raw(('{"a":'):rep(depth) .. "1" .. ("}"):rep(depth)) end
  return raw(("["):rep(depth) .. ("]"):rep(depth))
end
local DEPTHS = { 3, 100, 998, 999, 1000, 1001, 5000, 100000 }

local F64_TEXTS = { "nan", "inf", "1e999", "-1e999", "0x10", " 5", "5 ", "5abc", "", "1e-400", "-0",
                    "2^53", "99999999999999999999", "1/0", "0x1p-1080", "-1", "1.5", "9007199254740993" }
local function f64_wrapper()
  local r = rint(1, 6)
  if r <= 3 then return { __f64 = pick(F64_TEXTS) }
  elseif r == 4 then return { __f64 = hostile_number() }
  elseif r == 5 then return { __f64 = pick(F64_TEXTS), extra = 1 }
  end
  return { __f64 = { __f64 = pick(F64_TEXTS) } }
end

local STRINGS = { "", "16", "x", "f32", "F32", "nan", "1e999", "\255\254", "\192\128", "\237\160\128",
                  "\0", "a\0b", "__f64", "__metadata__" }
local function hostile_value()
  local r = rint(1, 13)
  if r <= 4 then return hostile_number()
  elseif r == 5 then return null
  elseif r == 6 then return chance(0.5)
  elseif r == 7 then return chance(0.1) and ("A"):rep(rint(1000, 100000)) or pick(STRINGS)
  elseif r == 8 then return raw(pick({ "{}", "[]", "{ }", "[null]", "[[]]" }))
  elseif r == 9 then return array({ hostile_number(), hostile_number() })
  elseif r == 10 then return nest(pick(DEPTHS), chance(0.5))
  elseif r == 11 then return f64_wrapper()
  elseif r == 12 then return { junk = hostile_number(), [""] = null }
  end
  return raw(pick({ "tru", "nul", '"\\ud800"', '"\\udc00\\ud800"', '"\\u0000"', '"\\x41"', "'x'", "[1,]", "{,}" }))
end

----------------------------------------------------------------- the case's state

-- A case is built on a state: the base's header and description as tables, each tensor's
-- bytes; mutations edit them; assemble() writes the file. relayout: offsets recomputed
-- from the tensors' bytes (a valid layout for changed shapes); desc_raw / header_raw:
-- text instead of the table; text_edit: a function of the header text before padding;
-- pad: the padding byte; no_pad; len: the header length field (a number or 8 bytes).
local function new_state(base)
  local header = cjson.decode(base.text)
  if base.desc_text then header.__metadata__.l2l = DESC_SLOT end
  local blobs = {}
  for k, v in pairs(base.blobs) do blobs[k] = v end
  return { base = base, header = header, desc = base.desc_text and cjson.decode(base.desc_text), blobs = blobs }
end

local function entry_names(st)
  local list = {}
  if type(st.header) ~= "table" then return list end
  for _, k in ipairs(sorted_keys(st.header)) do
    if k ~= "__metadata__" and type(st.header[k]) == "table" and getmetatable(st.header[k]) == nil then
      list[#list + 1] = k
    end
  end
  return list
end

local function assemble(st)
  local data = st.data or st.base.data
  if st.relayout and type(st.header) == "table" then
    local parts, at = {}, 0
    for _, name in ipairs(entry_names(st)) do
      local blob = st.blobs[name]
      if blob then
        st.header[name].data_offsets = array({ at, at + #blob })
        parts[#parts + 1] = blob
        at = at + #blob
      end
    end
    data = table.concat(parts)
  end
  local desc_text = st.desc_raw or (st.desc ~= nil and json(st.desc) or nil)
  local text = st.header_raw or json(st.header, desc_text)
  if st.text_edit then text = st.text_edit(text) end
  if not st.no_pad then text = text .. (st.pad or " "):rep((8 - #text % 8) % 8) end
  local len = st.len or #text
  return (type(len) == "string" and len or le64(len)) .. text .. data, #text
end

return {
  raw = raw, array = array, dups = dups, null = null, json = json, jnumber = jnumber, show = show,
  sorted_keys = sorted_keys, is_array = is_array, deepcopy = deepcopy, le64 = le64, read_le64 = read_le64,
  parse_base = parse_base, rint = rint, chance = chance, pick = pick, random_bytes = random_bytes,
  hostile_number = hostile_number, hostile_value = hostile_value, nest = nest, DEPTHS = DEPTHS,
  f64_wrapper = f64_wrapper, new_state = new_state, entry_names = entry_names, assemble = assemble,
}
