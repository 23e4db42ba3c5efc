-- SPDX-License-Identifier: MIT
-- scripts/fuzz/mutations.lua — the loader fuzzer's mutations (scripts/fuzz_load.lua loads it
-- with the table of scripts/fuzz/gen.lua and gets S, B back).
--
--   S.<name>(state) -> a description: edits a case's state (scripts/fuzz/gen.lua): the
--     safetensors header (st_*: offsets, dtypes, shapes, data values, entries, the header
--     as a whole, __metadata__; text_number: a number in the header's text), the l2l
--     description inside it (l2l_*: any value, layers, records, relay options, progress,
--     the __f64 wrapper, the structure);
--   B.<name>(bytes, header_length) -> bytes, a description: edits a finished file (bytes
--     flipped, spliced, truncated; the header length field; bytes appended).
-- Purpose: the damage a real file can carry, and the hostile values a crafted one can:
-- each mutation chooses with math.random only, so that a (seed, case) pair gives the same
-- file in every run.
-- Must never: call l2l, or read anything but the state and bytes it is given.
local G = ...
local cjson = require("cjson").new()

local floor = math.floor
local raw, array, dups, null, jnumber, show = G.raw, G.array, G.dups, G.null, G.jnumber, G.show
local sorted_keys, is_array, deepcopy, le64, read_le64 = G.sorted_keys, G.is_array, G.deepcopy, G.le64, G.read_le64
local rint, chance, pick, random_bytes = G.rint, G.chance, G.pick, G.random_bytes
local hostile_number, hostile_value, nest, DEPTHS = G.hostile_number, G.hostile_value, G.nest, G.DEPTHS
local f64_wrapper, entry_names = G.f64_wrapper, G.entry_names

----------------------------------------------------------------- mutations of the header

local DTYPE_SIZE = { F32 = 4, F16 = 2, BF16 = 2, I32 = 4, U8 = 1 }

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

local function resized(blob, bytes)
  if bytes <= #blob then return blob:sub(1, bytes) end
  return blob .. random_bytes(bytes - #blob)
end

local function entry(st)
  local names = entry_names(st)
  local name = pick(names)
  return name, st.header[name]
end

local function another(st, name)
  local names = entry_names(st)
  local other = pick(names)
  if other == name and #names > 1 then other = names[(rint(1, #names - 1) + (name == names[1] and 1 or 0))] end
  return other, st.header[other]
end

local S = {}   -- structured mutations: name -> function(st) -> description

function S.st_offsets(st)
  local name, e = entry(st)
  local a, b = e.data_offsets[1], e.data_offsets[2]
  local len = #st.base.data
  local v = rint(1, 9)
  if v == 1 then
    local delta = pick({ 1, -1, 2, -2, 4, -4, 8, -8, 64, -64, len, -len })
    local which = pick({ "both", "begin", "end" })
    if which ~= "end" then e.data_offsets[1] = a + delta end
    if which ~= "begin" then e.data_offsets[2] = b + delta end
    return ("'%s' data_offsets %s moved by %d"):format(name, which, delta)
  elseif v == 2 then
    local other, oe = another(st, name)
    e.data_offsets = array({ oe.data_offsets[1], oe.data_offsets[2] })
    return ("'%s' takes the data_offsets of '%s' (overlap)"):format(name, other)
  elseif v == 3 then
    local other, oe = another(st, name)
    e.data_offsets, oe.data_offsets = oe.data_offsets, e.data_offsets
    return ("'%s' and '%s' swap data_offsets"):format(name, other)
  elseif v == 4 then
    local i, x = rint(1, 2), hostile_value()
    e.data_offsets[i] = x
    return ("'%s' data_offsets[%d] = %s"):format(name, i, show(x))
  elseif v == 5 then
    local x = pick({ array({}), array({ a }), array({ a, b, b }), array({ array({ a }), array({ b }) }),
                     { ["0"] = a, ["1"] = b }, ("%d,%d"):format(a, b), null, raw("[]"), hostile_value() })
    e.data_offsets = x
    return ("'%s' data_offsets = %s"):format(name, show(x))
  elseif v == 6 then
    local x = pick({ array({ 0, 2 ^ 53 }), array({ 2 ^ 53, 2 ^ 53 + 8 }), array({ 2 ^ 64 - 2 ^ 11, 2 ^ 64 }),
                     array({ 2 ^ 63, 2 ^ 63 + (b - a) }), array({ a, a + 2 ^ 32 + (b - a) }),
                     raw("[18446744073709551615,18446744073709551615]"), array({ a + 2 ^ 53, b + 2 ^ 53 }),
                     raw(("[%d,%s]"):format(a, "9007199254740993")) })
    e.data_offsets = x
    return ("'%s' data_offsets = %s (huge)"):format(name, show(x))
  elseif v == 7 then
    e.data_offsets = array({ b, a })
    return ("'%s' data_offsets reversed"):format(name)
  elseif v == 8 then
    local other, oe = another(st, name)
    local start = oe.data_offsets[1] + pick({ 1, 2, 4 })
    e.data_offsets = array({ start, start + (b - a) })
    return ("'%s' starts inside '%s'"):format(name, other)
  end
  local x = pick({ array({ -(b - a), 0 }), array({ -4, b - a - 4 }), array({ a + 0.5, b + 0.5 }), array({ a, b + 0.25 }) })
  e.data_offsets = x
  return ("'%s' data_offsets = %s"):format(name, show(x))
end

function S.st_dtype(st)
  local name, e = entry(st)
  if chance(0.3) then
    -- a dtype of the format that l2l reads, the shape scaled so that the bytes still match:
    -- a valid file whose tensor is not f32
    local to = pick({ "U8", "F16", "BF16", "I32" })
    local k = 4 / DTYPE_SIZE[to]
    if #e.shape > 0 then e.shape[#e.shape] = e.shape[#e.shape] * k end
    e.dtype = to
    return ("'%s' dtype %s, last dimension x%g (bytes unchanged)"):format(name, to, k)
  end
  local to = pick({ "F32", "F16", "BF16", "I32", "U8", "F64", "I64", "BOOL", "F8_E4M3", "F8_E5M2", "I8",
                    "U16", "U32", "U64", "I16", "C64", "f32", "F32 ", "", "F3", "\255" })
  if chance(0.2) then to = hostile_value() end
  e.dtype = to
  return ("'%s' dtype = %s"):format(name, show(to))
end

function S.st_shape(st)
  local name, e = entry(st)
  local shape = e.shape
  local n, size = numel(shape), DTYPE_SIZE[e.dtype] or 4
  local v = rint(1, 10)
  local function relaid(new, what)
    e.shape = new
    st.blobs[name] = resized(st.blobs[name], numel(new) * size)
    st.relayout = true
    return ("'%s' shape %s -> %s%s (data relaid)"):format(name, show(shape), show(new), what or "")
  end
  if v == 1 then
    local dims = pick({ 5, 6, 7, 8, 9, 12, 16, 64 })
    local new = array({})
    for i = 1, dims do new[i] = 1 end
    local at = rint(1, dims - #shape + 1)
    for i, d in ipairs(shape) do new[at + i - 1] = d end
    e.shape = new
    return ("'%s' shape %s -> %s (same elements, %d dimensions)"):format(name, show(shape), show(new), dims)
  elseif v == 2 then
    local new = array(deepcopy(shape))
    table.insert(new, rint(1, #new + 1), 0)
    return relaid(new)
  elseif v == 3 then
    return relaid(array({}), " (a scalar)")
  elseif v == 4 then
    local new = array(deepcopy(pick({ { 2 ^ 32, 2 ^ 32 }, { 2 ^ 53 - 1, 2 ^ 53 - 1 }, { 3037000500, 3037000500 },
                                      { 2 ^ 26, 2 ^ 27 }, { 2 ^ 62, 4 }, { 2 ^ 31, 2 ^ 31, 2 ^ 31 },
                                      { 65536, 65536, 65536, 65536 }, { 2 ^ 52, 2 ^ 52, 16 } })))
    if chance(0.5) then
      table.insert(new, chance(0.5) and 1 or #new + 1, 0)
      return relaid(new, " (no elements, the other dimensions' product overflows)")
    end
    e.shape = new
    return ("'%s' shape -> %s (product overflows)"):format(name, show(new))
  elseif v == 5 then
    local i, x = rint(1, #shape), hostile_value()
    e.shape = array(deepcopy(shape))
    e.shape[i] = x
    return ("'%s' shape[%d] = %s"):format(name, i, show(x))
  elseif v == 6 then
    local x = hostile_value()
    e.shape = x
    return ("'%s' shape = %s"):format(name, show(x))
  elseif v == 7 then
    local new = array({})
    for i = #shape, 1, -1 do new[#new + 1] = shape[i] end
    if #new == 1 then new = array({ 1, shape[1] }) end
    e.shape = new
    return ("'%s' shape %s -> %s (same bytes)"):format(name, show(shape), show(new))
  elseif v == 8 then
    local new = array(deepcopy(shape))
    local i = rint(1, #new)
    new[i] = pick({ new[i] + 1, math.max(new[i] - 1, 1), new[i] * 2, 1 })
    return relaid(new)
  elseif v == 9 then
    local new = array({})
    for i = 1, pick({ 9, 100, 10000 }) do new[i] = 1 end
    new[1] = n
    e.shape = new
    return ("'%s' shape of %d dimensions"):format(name, #new)
  end
  local x = pick({ array({ -n, -1 }), array({ -1, -n }), array({ n / 2, 2 }), array({ n * 2, 0.5 }) })
  e.shape = x
  return ("'%s' shape = %s"):format(name, show(x))
end

function S.st_entry(st)
  local name, e = entry(st)
  local v = rint(1, 7)
  if v == 1 then
    st.header[name] = nil
    st.blobs[name] = nil
    if chance(0.5) then st.relayout = true end
    return ("'%s' removed%s"):format(name, st.relayout and " (data relaid)" or "")
  elseif v == 2 then
    local copy = deepcopy(e)
    local how = rint(1, 4)
    if how == 1 then copy.data_offsets = array({ 0, e.data_offsets[2] - e.data_offsets[1] })
    elseif how == 2 then copy.dtype = "U8"
    elseif how == 3 then copy.shape = array({ 1 })
    else copy = hostile_value() end
    local first = chance(0.5)
    dups[st.header] = { { name, copy, first } }
    return ("'%s' appears twice (%s copy %s)"):format(name, first and "first" or "last", show(copy))
  elseif v == 3 then
    local x = hostile_value()
    st.header[name] = x
    return ("'%s' = %s"):format(name, show(x))
  elseif v == 4 then
    local new = pick({ "", "__metadata__", name .. "\255", name .. "\0", ("x"):rep(100000), name .. ".m",
                       name:upper(), name .. " ", "1.wte", "0.wte", "-1.wte", "99.wte", "1..wte", ".", "nan.wte" })
    local other = st.header[new]
    st.header[new], st.header[name] = e, nil
    st.blobs[new], st.blobs[name] = st.blobs[name], nil
    st.relayout = chance(0.7)
    return ("'%s' renamed %s%s"):format(name, show(new), other ~= nil and " (replacing an entry)" or "")
  elseif v == 5 then
    local new = pick({ "9.extra", "1.extra", "zz", "__metadata", "1.wte.grad", "2.attn_w.m" })
    local n = pick({ 0, 1, 7, 64 })
    if chance(0.6) then
      st.header[new] = { dtype = "F32", shape = array({ n }), data_offsets = array({ 0, 0 }) }
      st.blobs[new] = random_bytes(4 * n)
      st.relayout = true
      return ("extra tensor %s of %d elements (data relaid)"):format(show(new), n)
    end
    local other, oe = another(st, name)
    st.header[new] = { dtype = oe.dtype, shape = deepcopy(oe.shape), data_offsets = deepcopy(oe.data_offsets) }
    return ("extra tensor %s on the data of '%s'"):format(show(new), other)
  elseif v == 6 then
    local field = pick({ "dtype", "shape", "data_offsets", "extra", "DTYPE", "" })
    local x = nil
    if chance(0.5) then x = hostile_value() end
    e[field] = x
    return ("'%s'.%s = %s"):format(name, show(field), x == nil and "(removed)" or show(x))
  end
  local count = pick({ 10, 100, 10000 })
  for i = 1, count do
    st.header["z" .. i] = { dtype = "F32", shape = array({ 0 }), data_offsets = array({ 0, 0 }) }
  end
  return ("%d extra empty tensors"):format(count)
end

local function edit_text(st, f, what)
  local before = st.text_edit
  st.text_edit = function(text)
    if before then text = before(text) end
    return f(text)
  end
  return what
end

function S.st_header(st)
  local v = rint(1, 9)
  if v == 1 then
    local text = pick({ "[]", "[{}]", '"x"', "1", "null", "true", "{}", "", " ", "{", "}", '{"a":}',
                        '{"a":1,}', "{'a':1}", "[" .. st.base.text .. "]" })
    if text == "{}" and chance(0.5) then st.data = "" end
    st.header_raw = text
    return ("the header is %s%s"):format(show(text), st.data == "" and " (no data)" or "")
  elseif v == 2 then
    local depth, object = pick(DEPTHS), chance(0.5)
    st.header["nested"] = nest(depth, object)
    return ("a member nested %d deep (%s)"):format(depth, object and "objects" or "arrays")
  elseif v == 3 then
    local depth = pick(DEPTHS)
    st.header_raw = ("["):rep(depth) .. st.base.text .. ("]"):rep(depth)
    return ("the header inside %d arrays"):format(depth)
  elseif v == 4 then
    local junk = pick({ "x", "\0", "{}", " ]", "\255", ",", '"', "/*", "\n\n" })
    return edit_text(st, function(t) return t .. junk end, ("%s after the JSON"):format(show(junk)))
  elseif v == 5 then
    st.pad = pick({ "\0", "\t", "\n", "\r", "x", "\255", "}", "\f", "\v" })
    return edit_text(st, function(t) return t .. (st.pad):rep(rint(1, 9)) end,
                     ("padded with %s"):format(show(st.pad)))
  elseif v == 6 then
    local lead = pick({ "\239\187\191", " ", "\n", "\0", "x", "//c\n" })
    return edit_text(st, function(t) return lead .. t end, ("%s before the JSON"):format(show(lead)))
  elseif v == 7 then
    local name = entry(st)
    local instead = pick({ name .. "\255", name .. "\\ud800", "\\u0031" .. name:sub(2), name .. "\\u0000",
                           name .. "\192\128", name .. "\\udc00", name .. "\237\160\128" })
    return edit_text(st, function(t)
      local at = t:find('"' .. name .. '"', 1, true)
      if not at then return t end
      return t:sub(1, at) .. instead .. t:sub(at + 1 + #name)
    end, ("'%s' written as %s"):format(name, show(instead)))
  elseif v == 8 then
    local x = pick({ { format = "l2l-checkpoint" }, { l2l = "{}" }, hostile_value(), {} })
    local first = chance(0.5)
    dups[st.header] = { { "__metadata__", x, first } }
    return ("__metadata__ twice (%s: %s)"):format(first and "first" or "last", show(x))
  end
  local spaces = pick({ 2 ^ 16, 2 ^ 20, 3 * 2 ^ 20 + 3 })
  return edit_text(st, function(t) return t .. (" "):rep(spaces) end, ("%d spaces of padding"):format(spaces))
end

function S.st_metadata(st)
  local meta = st.header.__metadata__
  local v = rint(1, 5)
  if v == 1 then
    local x = hostile_value()
    st.header.__metadata__ = x
    return ("__metadata__ = %s"):format(show(x))
  elseif v == 2 then
    local x = pick({ hostile_value(), st.desc, array({ st.desc }), 1, null })
    meta.l2l = x
    return ("__metadata__.l2l = %s (not a string)"):format(x == st.desc and "the description as an object" or show(x))
  elseif v == 3 then
    local key = pick({ "l2l", "format" })
    meta[key] = nil
    if chance(0.5) then meta[key] = pick({ "", "x", "pt", "l2l-checkpoint ", "\255" }) end
    return ("__metadata__.%s = %s"):format(key, meta[key] == nil and "(removed)" or show(meta[key]))
  elseif v == 4 then
    local key, x = pick({ "extra", "", "L2L", "l2l\0" }), chance(0.5) and hostile_value() or "x"
    meta[key] = x
    return ("__metadata__.%s = %s"):format(show(key), show(x))
  end
  local text = st.base.desc_text
  local w = rint(1, 6)
  if w == 1 then
    local cut = rint(0, #text - 1)
    st.desc_raw = text:sub(1, cut)
    return ("the description cut at byte %d of %d"):format(cut, #text)
  elseif w == 2 then
    local at = rint(1, #text)
    local ch = string.char(rint(0, 255))
    st.desc_raw = text:sub(1, at - 1) .. ch .. text:sub(at + 1)
    return ("the description's byte %d = %s"):format(at, show(ch))
  elseif w == 3 then
    local at = rint(1, #text)
    local ins = pick({ "\0", "\255", "\192\128", "\\ud800", " ", "}", "{", "[", '"', ",", "\\" })
    st.desc_raw = text:sub(1, at - 1) .. ins .. text:sub(at)
    return ("%s inserted at byte %d of the description"):format(show(ins), at)
  elseif w == 4 then
    local junk = pick({ "x", "{}", " \0", "\255" })
    st.desc_raw = text .. junk
    return ("%s after the description"):format(show(junk))
  elseif w == 5 then
    st.desc_raw = pick({ "", "null", "[]", "{}", "123", '"x"', "true", "{\"format\":\"l2l-checkpoint\"}" })
    return ("the description is %s"):format(show(st.desc_raw))
  end
  local a = rint(1, #text - 1)
  local b = rint(a, math.min(#text, a + 64))
  st.desc_raw = text:sub(1, a - 1) .. text:sub(b + 1)
  return ("bytes %d to %d of the description removed"):format(a, b)
end

----------------------------------------------------------------- mutations of the description

-- Every path (a list of keys) into a JSON value, in a fixed order.
local function paths_of(v, prefix, out, numbers_only)
  out = out or {}
  prefix = prefix or {}
  if type(v) == "table" and getmetatable(v) == nil then
    for _, k in ipairs(sorted_keys(v)) do
      local p = { unpack(prefix) }
      p[#p + 1] = k
      local x = v[k]
      if not numbers_only or type(x) == "number" then out[#out + 1] = p end
      paths_of(x, p, out, numbers_only)
    end
  end
  return out
end

local function path_text(p)
  local parts = {}
  for i, k in ipairs(p) do parts[i] = type(k) == "number" and ("[%d]"):format(k) or ("." .. tostring(k)) end
  return table.concat(parts)
end

local function parent_of(root, p)
  local t = root
  for i = 1, #p - 1 do t = t[p[i]] end
  return t, p[#p]
end

function S.l2l_value(st)
  local paths = paths_of(st.desc)
  local p = pick(paths)
  local t, k = parent_of(st.desc, p)
  local v = rint(1, 10)
  if v <= 7 then
    local x = hostile_value()
    t[k] = x
    return ("desc%s = %s"):format(path_text(p), show(x))
  elseif v <= 9 then
    if type(k) == "number" then table.remove(t, k) else t[k] = nil end
    return ("desc%s removed"):format(path_text(p))
  end
  local key = pick({ "bogus", "__f64", "", "kind", "1" })
  if type(t) == "table" and not is_array(t) then
    t[key] = hostile_value()
    return ("desc%s gets a key %s"):format(path_text({ unpack(p, 1, #p - 1) }), show(key))
  end
  t[k] = { [key] = t[k] }
  return ("desc%s wrapped in {%s = ...}"):format(path_text(p), show(key))
end

local SIZES = { 2 ^ 20, 2 ^ 24, 2 ^ 30, 2 ^ 31, 2 ^ 32, 2 ^ 40, 2 ^ 53, 2 ^ 64, 0, -1, 1.5, 3, 17, 1e308,
                raw("1e999"), raw("nan"), 2 ^ 31 - 1, 2 ^ 16 + 1 }
local SIZE_KEYS = { "dim", "vocab", "max_seq", "mlp", "heads", "type_vocab", "classes" }
local LAYER_KEYS = { "dim", "vocab", "max_seq", "mlp", "heads", "type_vocab", "classes", "dropout",
                     "attn_dropout", "eps", "causal", "post_ln", "bias", "final_ln", "memory", "tie",
                     "init_std", "seed", "pool", "resid_std", "bogus" }
local ODD = { dropout = { 1, 1.5, -0.1, 0.999999, raw("nan") }, attn_dropout = { 1, 2, -1 },
              eps = { 0, -1, 1e-300, 1e300, raw("nan"), raw("1e999") }, causal = { "yes", 1, null },
              memory = { "x", "FRUGAL", 0 }, tie = { "x", 1, false }, pool = { "device", "pinned", "gpu" },
              init_std = { 0, -1, 1e300 }, seed = { -1, 2 ^ 64, 1.5 } }

-- The edits both lists of the description (layers, records) get: entry i removed (op 1),
-- listed twice (2) or swapped with a random one (3); what was done, naming the list's
-- entries as `what`.
local function edit_list(list, i, op, what)
  if op == 1 then
    table.remove(list, i)
    return ("%s %d removed"):format(what, i)
  elseif op == 2 then
    table.insert(list, i, deepcopy(list[i]))
    return ("%s %d twice"):format(what, i)
  end
  local j = rint(1, #list)
  list[i], list[j] = list[j], list[i]
  return ("%ss %d and %d swapped"):format(what, i, j)
end

function S.l2l_layer(st)
  local layers = st.desc.layers
  local i = rint(1, #layers)
  local d = layers[i]
  local v = rint(1, 10)
  if v <= 3 then
    local key = v == 1 and pick(SIZE_KEYS) or pick(LAYER_KEYS)
    local x
    if v == 1 or not ODD[key] then
      if chance(0.8) then x = pick(SIZES) else x = hostile_value() end
    else
      x = pick(ODD[key])
    end
    d.options[key] = x
    return ("layer %d (%s): option %s = %s"):format(i, tostring(d.kind), key, show(x))
  elseif v == 4 then
    local x = pick({ "embedding", "block", "lm_head", "classifier", "custom", "Block", "", "nope", 1, null })
    d.kind = x
    if x == "custom" and chance(0.5) then d.custom = pick({ "Mix", "", 5 }) end
    return ("layer %d: kind = %s"):format(i, show(x))
  elseif v == 5 then
    local key = pick({ "frozen", "inner", "stash", "rng_id", "custom" })
    local x = chance(0.5) and hostile_value() or pick({ true, "keep", "swap", "device", "recompute", "bogus",
                                                        3, 2 ^ 24, 2 ^ 24 - 1, -1, 0.5 })
    d[key] = x
    return ("layer %d: %s = %s"):format(i, key, show(x))
  elseif v == 6 then
    local x = hostile_value()
    d.options = x
    return ("layer %d: options = %s"):format(i, show(x))
  elseif v == 7 then
    local x = hostile_value()
    layers[i] = x
    return ("layer %d = %s"):format(i, show(x))
  elseif v == 8 then
    local op = rint(1, 6)
    if op <= 3 then return edit_list(layers, i, op, "layer")
    elseif op == 4 then
      local count = pick({ 10, 300, 2000 })
      for _ = 1, count do table.insert(layers, i, deepcopy(d)) end
      return ("layer %d repeated %d more times"):format(i, count)
    elseif op == 5 then
      st.desc.layers = pick({ array({}), { ["1"] = d }, raw("[null]") })
      return ("layers = %s"):format(show(st.desc.layers))
    end
    layers[i] = null
    return ("layer %d = null (a hole)"):format(i)
  elseif v == 9 then
    -- every size in a layer absurd at once
    for _, key in ipairs(SIZE_KEYS) do
      if d.options[key] ~= nil then d.options[key] = pick({ 2 ^ 20, 2 ^ 31, 2 ^ 40 }) end
    end
    return ("layer %d: every size option absurd: %s"):format(i, show(d.options))
  end
  d.options.bogus = hostile_value()
  return ("layer %d: an unknown option"):format(i)
end

function S.l2l_record(st)
  local records = st.desc.records
  local i = rint(1, #records)
  local r = records[i]
  local v = rint(1, 7)
  if v <= 2 then
    local key = pick({ "name", "updates", "state", "grad" })
    local x = hostile_value()
    r[key] = x
    return ("record %d (%s): %s = %s"):format(i, tostring(r.name), key, show(x))
  elseif v == 3 then
    local x = pick({ 3, 4, 2 ^ 31, 1e9, -1, 1.5, 2.5, "2", true, 2 ^ 53, raw("1e999"), raw("nan") })
    r.state = x
    return ("record %d (%s): state = %s"):format(i, tostring(r.name), show(x))
  elseif v == 4 then
    local x = pick({ true, false, "true", 1 })
    r.grad = x
    return ("record %d (%s): grad = %s"):format(i, tostring(r.name), show(x))
  elseif v == 5 then
    local x = pick({ 2 ^ 53 - 1, 2 ^ 31, 2 ^ 32 + 5, 0, -1, 1.5, 2 ^ 53 })
    r.updates = x
    return ("record %d (%s): updates = %s"):format(i, tostring(r.name), show(x))
  elseif v == 6 then
    local x = pick({ "1.wpe", "", "1.wte", "2.ln1_g", "9.w", "1.wte.m" })
    r.name = x
    return ("record %d (%s): name = %s"):format(i, tostring(r.name), show(x))
  end
  local op = rint(1, 5)
  if op <= 3 then return edit_list(records, i, op, "record")
  elseif op == 4 then
    records[#records + 1] = { name = "9.x", updates = 1, state = 2, grad = true }
    return "an extra record"
  end
  st.desc.records = pick({ array({}), { ["1"] = r }, "x" })
  return ("records = %s"):format(show(st.desc.records))
end

local RELAY_INTS = { 0, 1, 2, -1, 1.5, 2 ^ 31 - 1, 2 ^ 31, 2 ^ 53 - 1, 2 ^ 53, 2 ^ 64, 1024, 1025, 4096, 4097 }
local ENUMS = { "host", "device", "recompute", "keep", "swap", "bf16", "f16", "f32", "skip", "error", "bogus", 5 }

function S.l2l_relay(st)
  local relay = st.desc.relay
  local v = rint(1, 6)
  if v <= 2 then
    local key = pick({ "micro_batch", "stash", "recompute_every", "inner", "clip_global_norm", "clip_layer_norm",
                       "accumulate", "optimizer_threads", "seed", "device_budget", "param_slots", "loss_scale",
                       "loss_scale_window", "nonfinite", "precision", "grad_precision", "model", "bogus" })
    local r = rint(1, 3)
    local x = r == 1 and pick(RELAY_INTS) or r == 2 and pick(ENUMS) or hostile_value()
    if key == "loss_scale" and chance(0.5) then x = pick({ 2 ^ -64, 2 ^ -65, 2 ^ 100, 2 ^ 101, 1e-320 }) end
    relay[key] = x
    return ("relay.%s = %s"):format(key, show(x))
  elseif v == 3 then
    local key = pick({ "kind", "lr", "momentum", "nesterov", "beta1", "beta2", "eps", "weight_decay", "decay_all", "bogus" })
    local x = key == "kind" and pick({ "sgd", "adamw", "lamb", "bogus", "", 1 }) or hostile_value()
    if type(relay.optimizer) == "table" then relay.optimizer[key] = x end
    return ("relay.optimizer.%s = %s"):format(key, show(x))
  elseif v == 4 then
    local key = pick({ "kind", "warmup", "total", "final_ratio", "bogus" })
    local x = key == "kind" and pick({ "constant", "cosine", "linear", "bogus", 2 }) or
              (chance(0.5) and pick({ -1, 0, 1.5, 2 ^ 31, 2 ^ 53, 2 ^ 64, 2, -0.5 }) or hostile_value())
    if type(relay.schedule) == "table" then relay.schedule[key] = x end
    return ("relay.schedule.%s = %s"):format(key, show(x))
  elseif v == 5 then
    local key = pick({ "optimizer", "schedule" })
    local x = hostile_value()
    relay[key] = x
    return ("relay.%s = %s"):format(key, show(x))
  end
  local x = hostile_value()
  st.desc.relay = x
  return ("relay = %s"):format(show(x))
end

function S.l2l_progress(st)
  local p = st.desc.progress
  local v = rint(1, 5)
  if v <= 2 then
    local key = pick({ "steps", "updates" })
    local x = chance(0.6) and pick({ -1, 0.5, 1.5, 2 ^ 31, 2 ^ 32 + 1, 2 ^ 53 - 1, 2 ^ 53, 2 ^ 64, 1e308, 3, 1000 })
              or hostile_value()
    p[key] = x
    return ("progress.%s = %s"):format(key, show(x))
  elseif v == 3 then
    local ls = type(p.loss_scale) == "table" and p.loss_scale or { scale = "0x1p+10", good = 1, skipped = 0 }
    p.loss_scale = ls
    local key = pick({ "scale", "good", "skipped" })
    local x = key == "scale" and pick({ "zz", "0x1p+1024", "inf", "nan", "-0x1p+0", "0x0p+0", "0x1p-1080",
                                        "0x1p+100", "0x1p+101", "0x1p-64", "0x1p-65", 1024, "", null })
              or (chance(0.5) and pick({ -1, 1.5, 2 ^ 53, 2 ^ 64, 2 ^ 31 }) or hostile_value())
    ls[key] = x
    return ("progress.loss_scale.%s = %s"):format(key, show(x))
  elseif v == 4 then
    local x = hostile_value()
    p.loss_scale = x
    return ("progress.loss_scale = %s"):format(show(x))
  end
  local x = hostile_value()
  st.desc.progress = x
  return ("progress = %s"):format(show(x))
end

function S.l2l_f64(st)
  local v = rint(1, 4)
  if v <= 2 then
    local paths = paths_of(st.desc, nil, nil, v == 1)
    local p = pick(paths)
    local t, k = parent_of(st.desc, p)
    local x = f64_wrapper()
    t[k] = x
    return ("desc%s = %s"):format(path_text(p), show(x))
  elseif v == 3 then
    local key = pick({ "layers", "records", "relay", "progress", "version", "format" })
    local x = f64_wrapper()
    st.desc[key] = x
    return ("desc.%s = %s"):format(key, show(x))
  end
  st.desc = f64_wrapper()
  return ("the description = %s"):format(show(st.desc))
end

function S.l2l_structure(st)
  local v = rint(1, 6)
  if v == 1 then
    local key = pick({ "format", "version", "l2l" })
    local x = pick({ 2, "1", 0.999999, 1 + 2 ^ -52, 0, "l2l-checkpoint ", "", null })
    if chance(0.3) then x = nil end
    st.desc[key] = x
    return ("desc.%s = %s"):format(key, x == nil and "(removed)" or show(x))
  elseif v == 2 then
    local key = pick({ "layers", "records", "relay", "progress", "extra" })
    local x = nil
    if chance(0.7) then x = hostile_value() end
    st.desc[key] = x
    return ("desc.%s = %s"):format(key, x == nil and "(removed)" or show(x))
  elseif v == 3 then
    local depth = pick(DEPTHS)
    st.desc.extra = nest(depth, chance(0.5))
    return ("desc.extra nested %d deep"):format(depth)
  elseif v == 4 then
    local key = pick({ "layers", "records", "relay", "progress", "format", "version" })
    local x = pick({ hostile_value(), array({}), deepcopy(st.desc.layers), deepcopy(st.desc.records) })
    local first = chance(0.5)
    dups[st.desc] = { { key, x, first } }
    return ("desc.%s twice (%s: %s)"):format(key, first and "first" or "last", show(x))
  elseif v == 5 then
    local x = pick({ array({ st.desc }), "x", 1, null, raw("[]") })
    st.desc = x
    return ("the description = %s"):format(show(x))
  end
  local key = pick({ "format", "l2l" })
  local x = pick({ "l2l-checkpoint\255", "\192\128", "\237\160\128", "\0" })
  st.desc[key] = x
  return ("desc.%s = %s"):format(key, show(x))
end

-- Special float values in a tensor's data: NaNs with payloads (both signs, signalling and
-- quiet), infinities, -0, subnormals, the largest float; one element or all of them.
local FLOAT_BITS = { 0xffae0af0, 0xffffffff, 0x7fffffff, 0xff800001, 0x7f800001, 0xffc00000, 0x7fc00000,
                     0xfffc0000, 0x7f800000, 0xff800000, 0x80000000, 0x00000001, 0x7f7fffff }
function S.st_data(st)
  local name = pick(entry_names(st))
  local blob = st.blobs[name]
  if blob == nil or #blob < 4 then return ("'%s' has no data to change"):format(name) end
  local bits = pick(FLOAT_BITS)
  local word = string.char(bits % 256, floor(bits / 256) % 256, floor(bits / 65536) % 256, floor(bits / 16777216))
  if chance(0.2) then
    st.blobs[name] = word:rep(floor(#blob / 4)) .. blob:sub(floor(#blob / 4) * 4 + 1)
    st.relayout = true
    return ("every element of '%s' = 0x%08x"):format(name, bits)
  end
  local i = rint(0, floor(#blob / 4) - 1)
  st.blobs[name] = blob:sub(1, 4 * i) .. word .. blob:sub(4 * i + 5)
  st.relayout = true
  return ("'%s' element %d = 0x%08x"):format(name, i, bits)
end

function S.text_number(st)
  return edit_text(st, function(text)
    local spots = {}
    for a, b in text:gmatch("()%-?%d+[%.%deE%+%-]*()") do spots[#spots + 1] = { a, b } end
    if #spots == 0 then return text end
    local spot = pick(spots)
    local x = hostile_number()
    local s = type(x) == "table" and x.text or jnumber(x)
    st.note = ("number %s at byte %d of the header -> %s"):format(text:sub(spot[1], spot[2] - 1), spot[1], s)
    return text:sub(1, spot[1] - 1) .. s .. text:sub(spot[2])
  end, "a number in the header text replaced")
end

----------------------------------------------------------------- mutations of the bytes

local B = {}   -- byte mutations: name -> function(bytes, n) -> bytes, description

local function spot(bytes, n, in_header)
  if in_header and n >= 1 then return rint(9, math.min(8 + n, #bytes)) end
  return rint(1, #bytes)
end

function B.bytes(bytes, n)
  local k, notes = pick({ 1, 1, 2, 3, 8, 32 }), {}
  local in_header = chance(0.5)
  for _ = 1, k do
    local at = spot(bytes, n, in_header)
    local old = bytes:byte(at)
    local new = pick({ bit.bxor(old, bit.lshift(1, rint(0, 7))), rint(0, 255), 0, 255,
                       string.byte(pick({ '"', "{", "}", "[", "]", ",", ":", "\\", "-", "9", "e", "." })) })
    bytes = bytes:sub(1, at - 1) .. string.char(new) .. bytes:sub(at + 1)
    notes[#notes + 1] = ("%d:%02x>%02x"):format(at, old, new)
  end
  return bytes, ("bytes changed%s: %s"):format(in_header and " in the header" or "", table.concat(notes, " "))
end

function B.splice(bytes, n)
  local in_header = chance(0.6)
  local at = spot(bytes, n, in_header)
  local fix = in_header and chance(0.5)
  local out, what
  local v = rint(1, 3)
  if v == 1 then
    local ins = random_bytes(pick({ 1, 2, 8, 16 }))
    out, what = bytes:sub(1, at - 1) .. ins .. bytes:sub(at), ("%d bytes inserted at %d"):format(#ins, at)
  elseif v == 2 then
    local len = pick({ 1, 2, 8, 64 })
    out, what = bytes:sub(1, at - 1) .. bytes:sub(at + len), ("%d bytes deleted at %d"):format(len, at)
  else
    local len = pick({ 1, 8, 64 })
    out, what = bytes:sub(1, at + len - 1) .. bytes:sub(at, at + len - 1) .. bytes:sub(at + len),
                ("%d bytes at %d repeated"):format(len, at)
  end
  if fix then
    out = le64(n + #out - #bytes) .. out:sub(9)
    what = what .. ", header length adjusted"
  end
  return out, what
end

function B.truncate(bytes, n)
  local cut = pick({ rint(0, 8), rint(8, 8 + n), 8 + n - rint(0, 8), rint(8 + n, #bytes - 1), #bytes - 1,
                     rint(0, #bytes - 1) })
  cut = math.max(0, math.min(cut, #bytes - 1))
  return bytes:sub(1, cut), ("truncated to %d of %d bytes"):format(cut, #bytes)
end

function B.length(bytes, n)
  local size = #bytes
  local v = rint(1, 3)
  local field
  if v == 1 then
    local len = pick({ 0, 1, 2, 7, 8, n - 1, n - 2, n - 8, n + 1, n + 2, n + 8, n - rint(1, 16), n + rint(1, 16),
                       size - 8, size - 7, size, 2 ^ 31, 2 ^ 32, 2 ^ 32 + n, 2 ^ 40, 100 * 2 ^ 20,
                       100 * 2 ^ 20 + 1, 2 ^ 53, 2 ^ 63 })
    field = le64(math.max(len, 0))
  elseif v == 2 then
    field = pick({ ("\255"):rep(8), ("\0"):rep(7) .. "\128", bytes:sub(1, 7) .. "\1", random_bytes(8) })
  else
    local i = rint(1, 8)
    field = bytes:sub(1, i - 1) .. string.char(bit.bxor(bytes:byte(i), bit.lshift(1, rint(0, 7)))) .. bytes:sub(i + 1, 8)
  end
  return field .. bytes:sub(9), ("header length %.0f -> %.0f"):format(n, read_le64(field))
end

function B.tail(bytes)
  local extra = pick({ random_bytes(rint(1, 64)), ("\0"):rep(8), ("\0"):rep(rint(1, 7)), bytes:sub(9, 16) })
  return bytes .. extra, ("%d bytes appended"):format(#extra)
end

return S, B
