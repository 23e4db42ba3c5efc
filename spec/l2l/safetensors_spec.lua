-- SPDX-License-Identifier: MIT
-- safetensors_spec — the one reader and writer of the format (the C library's, through
-- l2l.safetensors and include/l2l/safetensors.h) against an independent one written here:
-- files this spec lays out byte by byte, in every dtype l2l reads, awkward shapes (a
-- scalar, sizes of 1, four dimensions, odd sizes), metadata, header keys and data in
-- shuffled orders and odd padding, read back value for value, converted among the float
-- dtypes as this spec's own rounding says; every other dtype of the format (F64, the 8-bit
-- floats, BOOL and the integers to 64 bits, the packed floats, C64) and empty tensors listed and,
-- where l2l can hold them, read (an F64 rounded once, integers exactly or refused by
-- element); files l2l writes taken apart here; the C API's
-- argument checks; and a GPT-2 of half-precision tensors imported exactly.
-- The reference encodes a number into a float format of E exponent and M mantissa bits
-- with round to nearest even through frexp and floor in doubles (not the bit tricks of
-- src/core/core.h), and decodes bits by powers of two.
local support = dofile("spec/support.lua")
local ffi = require("ffi")
local cjson = require("cjson")
local l2l = require("l2l")
local C = require("l2l.lib").C

local seed = support.seed
math.randomseed(seed)
local dir = support.tmpdir()
local function path(name) return dir .. "/" .. name end
teardown(function() support.sh("rm -rf " .. support.q(dir)) end)

----------------------------------------------------------------- the reference

local FORMATS = {   -- exponent and mantissa bits, bytes
  F32 = { e = 8, m = 23, size = 4, l2l = "f32" },
  F16 = { e = 5, m = 10, size = 2, l2l = "f16" },
  BF16 = { e = 8, m = 7, size = 2, l2l = "bf16" },
  I32 = { size = 4, l2l = "i32" },
  U8 = { size = 1, l2l = "u8" },
}
local BY_L2L = {}
for name, f in pairs(FORMATS) do BY_L2L[f.l2l] = name end

-- The bits of v in format f, rounded to nearest even; a NaN is the quiet NaN with no
-- payload (what l2l hands out for any NaN).
local function encode(v, f)
  local E, M = f.e, f.m
  local bias, all_ones = 2 ^ (E - 1) - 1, 2 ^ E - 1
  if v ~= v then return all_ones * 2 ^ M + 2 ^ (M - 1) end
  local sign = 0
  if v < 0 or (v == 0 and 1 / v < 0) then sign, v = 2 ^ (E + M), -v end
  if v == math.huge then return sign + all_ones * 2 ^ M end
  if v == 0 then return sign end
  local _, e = math.frexp(v)           -- v = m 2^e, 1/2 <= m < 1
  local exp = e - 1 + bias
  local q = exp >= 1 and v / 2 ^ (e - 1) * 2 ^ M or v / 2 ^ (1 - bias - M)   -- exact
  if exp < 1 then exp = 0 end
  local n = math.floor(q)
  local rest = q - n
  if rest > 0.5 or (rest == 0.5 and n % 2 == 1) then n = n + 1 end
  if exp == 0 then return sign + n end   -- a subnormal (n = 2^M: the least normal, the same bits)
  if n == 2 ^ (M + 1) then exp, n = exp + 1, 2 ^ M end
  if exp >= all_ones then return sign + all_ones * 2 ^ M end
  return sign + exp * 2 ^ M + (n - 2 ^ M)
end

-- The number that bits spell in format f (a NaN for any NaN).
local function decode(bits, f)
  local E, M = f.e, f.m
  local bias, all_ones = 2 ^ (E - 1) - 1, 2 ^ E - 1
  local sign = bits >= 2 ^ (E + M) and -1 or 1
  bits = bits % 2 ^ (E + M)
  local exp, man = math.floor(bits / 2 ^ M), bits % 2 ^ M
  if exp == all_ones then return man == 0 and sign * math.huge or 0 / 0 end
  if exp == 0 then return sign * man * 2 ^ (1 - bias - M) end
  return sign * (1 + man / 2 ^ M) * 2 ^ (exp - bias)
end

local function is_nan_bits(bits, f) return decode(bits, f) ~= decode(bits, f) end

-- n little-endian bytes of the unsigned integer u.
local function le(u, n)
  local out = {}
  for i = 1, n do
    out[i] = string.char(u % 256)
    u = math.floor(u / 256)
  end
  return table.concat(out)
end

-- A value of a tensor in `dtype`, drawn: floats as bit patterns of every kind (normal of
-- any exponent, subnormal, zeros, infinities, NaNs with payloads, ties of a narrower
-- format), integers over their whole range.
local function draw(dtype)
  local f = FORMATS[dtype]
  if dtype == "I32" then return support.int(-2 ^ 31, 2 ^ 31 - 1) end
  if dtype == "U8" then return support.int(0, 255) end
  local kind = support.int(1, 10)
  local top = 2 ^ (f.e + f.m + 1)
  if kind == 1 then   -- special: zeros, infinities, a NaN (payload drawn)
    local exp_all = (2 ^ f.e - 1) * 2 ^ f.m
    local pick = ({ 0, 2 ^ (f.e + f.m), exp_all, exp_all + 2 ^ (f.e + f.m),
                    exp_all + support.int(1, 2 ^ f.m - 1) })[support.int(1, 5)]
    return pick % top
  elseif kind == 2 then   -- subnormal
    return support.int(1, 2 ^ f.m - 1) + support.int(0, 1) * 2 ^ (f.e + f.m)
  end
  return support.int(0, top - 1)   -- any bits at all (NaNs among them)
end

-- A safetensors file laid out by this spec: tensors {name, dtype, shape, values (bits or
-- integers)}, their data in the order `data_order` (a permutation of 1..#tensors), the
-- header's keys in another, metadata pairs, `pad` spaces after the JSON.
local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return ("\\u%04x"):format(c:byte()) end) .. '"'
end
local function write_reference(file, tensors, metadata, pad)
  local blobs, ranges, at = {}, {}, 0
  local order = {}
  for i = 1, #tensors do order[i] = i end
  for i = #order, 2, -1 do   -- the data's order: shuffled
    local j = support.int(1, i)
    order[i], order[j] = order[j], order[i]
  end
  for _, i in ipairs(order) do
    local t = tensors[i]
    if t.blob then   -- another tool's dtype: its bytes made by the case
      blobs[#blobs + 1] = t.blob
    else
      local size, parts = FORMATS[t.dtype].size, {}
      for k, v in ipairs(t.values) do parts[k] = le(v % 2 ^ (8 * size), size) end
      blobs[#blobs + 1] = table.concat(parts)
    end
    ranges[i] = { at, at + #blobs[#blobs] }
    at = ranges[i][2]
  end
  local keys = {}
  for i, t in ipairs(tensors) do
    keys[#keys + 1] = ("%s:{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%d,%d]}"):format(
      json_string(t.name), t.dtype, table.concat(t.shape, ","), ranges[i][1], ranges[i][2])
  end
  if metadata then
    local pairs_ = {}
    for k, v in pairs(metadata) do pairs_[#pairs_ + 1] = json_string(k) .. ":" .. json_string(v) end
    keys[#keys + 1] = '"__metadata__":{' .. table.concat(pairs_, ",") .. "}"
  end
  for i = #keys, 2, -1 do
    local j = support.int(1, i)
    keys[i], keys[j] = keys[j], keys[i]
  end
  local json = "{" .. table.concat(keys, ",") .. "}" .. (" "):rep(pad or 0)
  support.write_file(file, le(#json, 8) .. json .. table.concat(blobs))
  return order
end

-- The format's dtypes l2l has no tensor of, as another tool writes them: bits an element,
-- what l2l reads each as unless told another, and for integers their range (I64 and U64 past
-- 2^53 as int64/uint64 cdata).
local OTHER = {
  F64 = { bits = 64, reads = "f32" },
  F8_E5M2 = { bits = 8, reads = "f32", e = 5, m = 2 },                  -- IEEE's layout
  F8_E4M3 = { bits = 8, reads = "f32", e = 4, m = 3, finite = true },   -- "fn": S.1111.111 the one NaN
  F8_E8M0 = { bits = 8, reads = "f32" },                                -- 2^(bits - 127); 255 a NaN
  BOOL = { bits = 8, reads = "u8", lo = 0, hi = 1 },
  I8 = { bits = 8, reads = "i32", lo = -2 ^ 7, hi = 2 ^ 7 - 1 },
  I16 = { bits = 16, reads = "i32", lo = -2 ^ 15, hi = 2 ^ 15 - 1 },
  U16 = { bits = 16, reads = "i32", lo = 0, hi = 2 ^ 16 - 1 },
  U32 = { bits = 32, reads = "i32", lo = 0, hi = 2 ^ 32 - 1 },
  I64 = { bits = 64, reads = "i32", lo = -2 ^ 63, hi = 2 ^ 63 },
  U64 = { bits = 64, reads = "i32", lo = 0, hi = 2 ^ 64 },
  F4 = { bits = 4 }, F6_E2M3 = { bits = 6 }, F6_E3M2 = { bits = 6 },   -- packed: listed, not read
  C64 = { bits = 64 },                                                  -- complex: listed, not read
}

-- F64 values where a rounding goes wrong if it is done twice or at the wrong boundary: ties
-- of f32, f16 and bf16 and values beside them, the least subnormals, the largest finite.
local F64_EDGES = { 2 ^ -149, -2 ^ -149, 2 ^ -150, 2 ^ -150 * (1 + 2 ^ -30), 2 ^ -150 * (1 - 2 ^ -30), 3 * 2 ^ -150,
                    2 ^ -126 * (1 - 2 ^ -25), 2 ^ 128 - 2 ^ 103, -(2 ^ 128 - 2 ^ 103 - 2 ^ 80), 65520,
                    65520 * (1 - 2 ^ -30), 65520 * (1 + 2 ^ -30), 2 ^ -25, 2 ^ -25 * (1 + 2 ^ -30), 2 ^ -134,
                    2 ^ -134 * (1 + 2 ^ -20), 1 + 2 ^ -8 + 2 ^ -40, -(1 + 2 ^ -8 - 2 ^ -40), 1 + 2 ^ -11 + 2 ^ -40 }

-- The value of an 8-bit float's bits in `dtype` (a NaN for its NaNs).
local function f8_value(bits, dtype)
  if dtype == "F8_E8M0" then return bits == 255 and 0 / 0 or 2 ^ (bits - 127) end
  local f = OTHER[dtype]
  local exp, man = math.floor(bits % 128 / 2 ^ f.m), bits % 2 ^ f.m
  if not f.finite or exp < 2 ^ f.e - 1 then return decode(bits, f) end
  if man == 2 ^ f.m - 1 then return 0 / 0 end
  local sign = bits >= 128 and -1 or 1   -- the top exponent holds numbers too
  return sign * (1 + man / 2 ^ f.m) * 2 ^ (exp - (2 ^ (f.e - 1) - 1))
end

-- A drawn F64 as {blob = its 8 bytes, value = the number (a NaN for any NaN)}: bit
-- patterns of every kind, and ties of bf16 and f16 nudged by less than an f32 unit (where
-- rounding through f32 to nearest first would land on the tie and round the wrong way).
local function draw_f64()
  local kind, v = support.int(1, 5)
  if kind == 1 then
    local g = support.int(0, 1) == 0 and FORMATS.BF16 or FORMATS.F16
    local b = support.int(1, (2 ^ g.e - 1) * 2 ^ g.m - 1)   -- positive, finite
    local x = decode(b, g)
    local _, e = math.frexp(x)
    local ulp = 2 ^ math.max(e - 1 - g.m, (1 - (2 ^ (g.e - 1) - 1)) - g.m)
    v = (x + ulp / 2 + (support.int(0, 1) * 2 - 1) * ulp * 2 ^ -support.int(26, 40)) * (support.int(0, 1) * 2 - 1)
  elseif kind == 2 then
    v = ({ 0, -0.0, 1 / 0, -1 / 0, 2 ^ -1074, -3 * 2 ^ -1060, 1e300, 65520, 2 ^ 128 * (1 - 2 ^ -25), 2 ^ -150 })[support.int(1, 10)]
  else
    local words = ffi.new("uint32_t[2]", support.int(0, 2 ^ 32 - 1), support.int(0, 2 ^ 32 - 1))
    local hi = words[1]
    if math.floor(hi / 2 ^ 20) % 2 ^ 11 == 2 ^ 11 - 1 and (hi % 2 ^ 20 ~= 0 or words[0] ~= 0) then
      return { blob = ffi.string(words, 8), value = 0 / 0 }   -- a NaN, its payload never a Lua number
    end
    v = ffi.cast("double *", words)[0]
  end
  return { blob = ffi.string(ffi.new("double[1]", v), 8), value = v }
end

-- The bits (or integers) of a host tensor, element by element.
local CTYPES = { f32 = "uint32_t *", f16 = "uint16_t *", bf16 = "uint16_t *", i32 = "int32_t *", u8 = "uint8_t *" }
local function bits_of(t)
  local p, out = ffi.cast(CTYPES[t:dtype()], t:data()), {}
  for i = 0, t:numel() - 1 do out[i + 1] = tonumber(p[i]) end
  return out
end

-- What reading `bits` of format `from` into format `to` must give: the same bits (a NaN
-- the plain one), or the number rounded.
local function expected(bits, from, to)
  local f, g = FORMATS[from], FORMATS[to]
  if from == to and not g.e then return bits end
  if is_nan_bits(bits, f) then return encode(0 / 0, g) end
  if from == to then return bits end
  return encode(decode(bits, f), g)
end

local function compare(got, want, what)
  assert.are.equal(#want, #got, what .. ": element count")
  for i = 1, #want do
    if got[i] ~= want[i] then
      error(("%s: element %d is %s, expected %s (seed %d)"):format(what, i, tostring(got[i]), tostring(want[i]), seed), 2)
    end
  end
end

-- The shape's index of element k (from 1), as :get counts: "2, 1, 3".
local function get_index(shape, k)
  local index, rest = {}, k - 1
  for d = #shape, 1, -1 do
    index[d] = rest % shape[d] + 1
    rest = math.floor(rest / shape[d])
  end
  return #shape > 0 and table.concat(index, ", ") or "1"
end

-- Integer tensor `name` of file f read into i32 and u8 (tensors poisoned first): the values
-- where each one fits; else a refusal naming the first that does not, the tensor untouched.
-- values: Lua numbers, or int64/uint64 cdata past 2^53.
local function read_integers(f, name, values, shape, stored)
  for _, to in ipairs({ "i32", "u8" }) do
    local lo, hi = to == "u8" and 0 or -2 ^ 31, to == "u8" and 255 or 2 ^ 31 - 1
    if stored == "BOOL" then lo, hi = 0, 1 end
    local into = l2l.full({ #values }, 77, { dtype = to })
    local bad
    for k, v in ipairs(values) do
      if bad == nil and not (v >= lo and v <= hi) then bad = k end
    end
    if bad == nil then
      assert.are.equal(into, f:read(name, into))
      local want = {}
      for k, v in ipairs(values) do want[k] = tonumber(v) end
      compare(bits_of(into), want, ("'%s' (%s) read into %s"):format(name, stored, to))
    else
      local value = tostring(values[bad]):gsub("U?LL$", "")
      local why = stored == "BOOL" and "a BOOL is 0 or 1" or ("which " .. to .. " does not hold")
      support.refused(("tensor '%s':get(%s) (%s) = %s, %s"):format(name, get_index(shape, bad), stored, value, why),
                      f.read, f, name, into)
      for k = 1, #values do assert.are.equal(77, into:get(k), "a refused read wrote into the tensor") end
    end
    into:free()
  end
end

----------------------------------------------------------------- the specs

describe("safetensors through the C reader (seed " .. seed .. ")", function()
  it("the reference rounds as IEEE 754 says, on values with known answers", function()
    -- the reference is checked before it judges l2l: values whose encodings are known
    local F16, BF16, F32 = FORMATS.F16, FORMATS.BF16, FORMATS.F32
    assert.are.equal(0x3c00, encode(1, F16))
    assert.are.equal(0x7bff, encode(65504, F16))
    assert.are.equal(0x7c00, encode(65520, F16))            -- the tie above the largest: to infinity
    assert.are.equal(0x7bff, encode(65519.99, F16))
    assert.are.equal(0x0001, encode(2 ^ -24, F16))          -- the least subnormal
    assert.are.equal(0x0000, encode(2 ^ -25, F16))          -- the tie below it: to even (zero)
    assert.are.equal(0x0002, encode(3 * 2 ^ -25, F16))      -- 1.5 units: to even (2)
    assert.are.equal(0x0400, encode(2 ^ -14, F16))          -- the least normal
    assert.are.equal(0x8000, encode(-0.0, F16))
    assert.are.equal(0x3f80, encode(1, BF16))
    assert.are.equal(0x3f80, encode(1 + 2 ^ -8, BF16))      -- a tie: to even
    assert.are.equal(0x3f82, encode(1 + 3 * 2 ^ -8, BF16))  -- a tie: to even (up)
    assert.are.equal(0x3f800000, encode(1, F32))
    assert.are.equal(0x00000001, encode(2 ^ -149, F32))
    assert.are.equal(0x7fc00000, encode(0 / 0, F32))
    for _ = 1, 2000 do   -- decode then encode is the identity on every non-NaN pattern
      for _, name in ipairs({ "F32", "F16", "BF16" }) do
        local b = draw(name)
        if not is_nan_bits(b, FORMATS[name]) then assert.are.equal(b, encode(decode(b, FORMATS[name]), FORMATS[name])) end
      end
    end
  end)

  it("reads every dtype, awkward shapes and metadata as written, and converts among floats", function()
    local SHAPES = { {}, { 1 }, { 1, 1, 1, 1 }, { 7 }, { 3, 5 }, { 2, 1, 3 }, { 1, 4, 1, 3 }, { 5, 3, 2, 2 }, { 13, 1 } }
    for round = 1, 6 do
      local tensors, names = {}, {}
      local n = support.int(1, 9)
      for i = 1, n do
        local dtype = ({ "F32", "F16", "BF16", "I32", "U8" })[support.int(1, 5)]
        local shape = SHAPES[support.int(1, #SHAPES)]
        local numel = 1
        for _, d in ipairs(shape) do numel = numel * d end
        local values = {}
        for k = 1, numel do values[k] = draw(dtype) end
        -- names of every kind JSON holds: dots, spaces, a quote, non-ASCII
        local name = ({ "w", "h.%d.attn weight", 'q"uote%d', "名前%d", "x/y.%d" })[support.int(1, 5)]:format(i) .. "." .. i
        tensors[i] = { name = name, dtype = dtype, shape = shape, values = values }
        names[name] = tensors[i]
      end
      local metadata = { note = "round " .. round, empty = "", json = '{"a": [1, 2]}', unicode = "ünï ✓" }
      local file = path("ref" .. round .. ".safetensors")
      local order = write_reference(file, tensors, metadata, support.int(0, 9))
      local f = l2l.safetensors.open(file)
      -- the lists: names in the data's order, each entry as written, the metadata
      local at = 0
      for k, i in ipairs(order) do
        local t = tensors[i]
        assert.are.equal(t.name, f.names[k], "the data's order")
        local e = f.entries[t.name]
        local numel = #t.values
        assert.are.same(t.shape, e.shape, t.name)
        assert.are.equal(FORMATS[t.dtype].l2l, e.dtype, t.name)
        assert.are.same({ numel, at, numel * FORMATS[t.dtype].size },
                        { e.numel, e.offset, e.bytes }, t.name .. ": numel, offset, bytes")
        at = at + e.bytes
      end
      assert.are.same(metadata, f.metadata)
      f:verify()   -- no checksums: nothing to check, nothing refused
      -- the values, in the file's dtype and converted into each other float dtype
      for _, t in ipairs(tensors) do
        local got = f:read(t.name)
        assert.are.same(#t.shape > 0 and t.shape or { 1 }, got:shape(), t.name)
        assert.are.equal(FORMATS[t.dtype].l2l, got:dtype())
        local want = {}
        for k, v in ipairs(t.values) do want[k] = expected(v, t.dtype, t.dtype) end
        compare(bits_of(got), want, ("round %d: '%s' (%s)"):format(round, t.name, t.dtype))
        got:free()
        if FORMATS[t.dtype].e then
          for _, to in ipairs({ "f32", "f16", "bf16" }) do
            local pool = support.int(0, 1) == 0 and "host" or "pinned"
            local into = l2l.empty({ #t.values }, { dtype = to, pool = pool })
            assert.are.equal(into, f:read(t.name, into))
            for k, v in ipairs(t.values) do want[k] = expected(v, t.dtype, BY_L2L[to]) end
            compare(bits_of(into), want, ("round %d: '%s' %s read into %s (%s)"):format(round, t.name, t.dtype, to, pool))
            into:free()
          end
        else   -- an integer tensor reads into i32 or u8, where every value fits
          read_integers(f, t.name, t.values, t.shape, t.dtype)
          support.refused("which reads into i32 or u8, not f32", f.read, f, t.name, l2l.empty({ #t.values }))
        end
      end
      support.refused("into must be a host tensor of", f.read, f, tensors[1].name, l2l.empty({ #tensors[1].values + 1 }))
      f:close()
    end
  end)

  it("opens another tool's file of every dtype the format has, and reads what l2l can hold", function()
    local SHAPES = { {}, { 1 }, { 7 }, { 3, 5 }, { 2, 1, 3 }, { 1, 4, 1, 3 } }
    for round = 1, 4 do
      local tensors, want = {}, {}
      for dtype, o in pairs(OTHER) do
        local shape = SHAPES[support.int(1, #SHAPES)]
        local numel = 1
        for _, d in ipairs(shape) do numel = numel * d end
        if o.bits < 8 then   -- packed: a whole number of bytes
          shape = { 4 * support.int(1, 3) }
          numel = shape[1]
        end
        local t = { name = dtype:lower() .. ".w", dtype = dtype, shape = shape, values = {} }
        local parts = {}
        for k = 1, o.bits < 8 and numel * o.bits / 8 or numel do   -- (packed: bytes drawn)
          if dtype == "F64" then
            local d = draw_f64()
            parts[k], t.values[k] = d.blob, d.value
          elseif o.bits == 8 and not o.lo then   -- an 8-bit float: any bits
            t.values[k] = support.int(0, 255)
            parts[k] = string.char(t.values[k])
          elseif o.lo then   -- an integer: within i32 (and within u8 for half the tensors)
            local small = round % 2 == 0
            local lo, hi = math.max(o.lo, small and 0 or -2 ^ 31), math.min(o.hi, small and 255 or 2 ^ 31 - 1)
            local v = support.int(lo, hi)
            t.values[k] = v
            local ctype = ({ [8] = "int8_t", [16] = "int16_t", [32] = "int64_t", [64] = "int64_t" })[o.bits]
            parts[k] = ffi.string(ffi.new(ctype .. "[1]", v), o.bits / 8)   -- (little-endian: the low bytes)
          else   -- not read: any bytes (a packed one's drawn byte by byte)
            local bytes = {}
            for b = 1, math.max(o.bits / 8, 1) do bytes[b] = string.char(support.int(0, 255)) end
            parts[k] = table.concat(bytes)
          end
        end
        t.blob = table.concat(parts)
        tensors[#tensors + 1] = t
        want[t.name] = { dtype = dtype, numel = numel, shape = shape, o = o, values = t.values }
      end
      local edges = { name = "f64.edges", dtype = "F64", shape = { #F64_EDGES }, values = F64_EDGES,
                      blob = ffi.string(ffi.new("double[?]", #F64_EDGES, F64_EDGES), 8 * #F64_EDGES) }
      tensors[#tensors + 1] = edges
      want[edges.name] = { dtype = "F64", numel = #F64_EDGES, shape = edges.shape, o = OTHER.F64, values = F64_EDGES }
      -- empty tensors: a size of 0 anywhere
      for _, dtype in ipairs({ "F32", "I64" }) do
        local shape = ({ { 0 }, { 3, 0 }, { 0, 2, 5 } })[support.int(1, 3)]
        local t = { name = "empty." .. dtype, dtype = dtype, shape = shape, values = {}, blob = "" }
        tensors[#tensors + 1] = t
        want[t.name] = { dtype = dtype, numel = 0, shape = shape }
      end
      local file = path("other" .. round .. ".safetensors")
      write_reference(file, tensors)
      local f = l2l.safetensors.open(file)
      f:verify()
      for name, w in pairs(want) do
        local e = f.entries[name]
        local what = ("round %d: '%s' (%s)"):format(round, name, w.dtype)
        assert.are.same({ w.dtype, w.shape, w.numel, w.numel * (w.o and w.o.bits or 32) / 8 },
                        { e.stored_dtype, e.shape, e.numel, e.bytes }, what)
        if w.numel == 0 then
          assert.are.equal(w.dtype == "F32" and "f32" or "i32", e.dtype, what)
          support.refused("'" .. name .. "' of " .. file .. " is empty", f.read, f, name)
        elseif not w.o.reads then
          assert.is_nil(e.dtype, what)
          support.refused("is " .. w.dtype .. ", which l2l does not read", f.read, f, name)
          support.refused("which l2l does not read", f.read, f, name, l2l.empty({ w.numel }))
        elseif w.o.lo then   -- an integer
          assert.are.equal(w.o.reads, e.dtype, what)
          local got = f:read(name)
          assert.are.same(#w.shape > 0 and w.shape or { 1 }, got:shape(), what)
          assert.are.equal(w.o.reads, got:dtype(), what)
          compare(bits_of(got), w.values, what)
          got:free()
          read_integers(f, name, w.values, w.shape, w.dtype)
          support.refused("is " .. w.dtype .. ", which reads into i32 or u8, not bf16", f.read, f, name,
                          l2l.empty({ w.numel }, { dtype = "bf16" }))
        else   -- a float: into each float dtype, rounded once
          assert.are.equal("f32", e.dtype, what)
          local got = f:read(name)
          assert.are.equal("f32", got:dtype(), what)
          for _, to in ipairs({ "f32", "f16", "bf16" }) do
            local into = got
            if to ~= "f32" then
              into = l2l.empty({ w.numel }, { dtype = to, pool = support.int(0, 1) == 0 and "host" or "pinned" })
              assert.are.equal(into, f:read(name, into))
            end
            local expect = {}
            for k, v in ipairs(w.values) do
              local x = w.dtype == "F64" and v or f8_value(v, w.dtype)
              expect[k] = encode(x, FORMATS[BY_L2L[to]])
            end
            compare(bits_of(into), expect, what .. " read into " .. to)
            into:free()
          end
          support.refused("is " .. w.dtype .. ", which reads into f32, f16 or bf16, not i32", f.read, f, name,
                          l2l.empty({ w.numel }, { dtype = "i32" }))
        end
      end
      -- through C: an empty tensor reads as nothing; a packed one is unsupported
      local out = ffi.new("float[1]", 5)
      assert.are.equal(0, C.l2l_safetensors_read(out, C.L2L_F32, 0, f.handle, "empty.F32"))
      assert.are.equal(5, out[0])
      assert.are.equal(0, C.l2l_safetensors_read(nil, C.L2L_I32, 0, f.handle, "empty.I64"))
      assert.are.equal(C.L2L_ERR_UNSUPPORTED, C.l2l_safetensors_read(out, C.L2L_F32, want["c64.w"].numel, f.handle, "c64.w"))
      assert.are.equal(C.L2L_ERR_UNSUPPORTED, C.l2l_safetensors_read(out, C.L2L_F32, want["f4.w"].numel, f.handle, "f4.w"))
      local entry = ffi.new("l2l_safetensors_entry")
      assert.are.equal(0, C.l2l_safetensors_find(entry, f.handle, "f4.w"))
      assert.are.same({ 0, "F4" }, { tonumber(C.l2l_dtype_size(entry.dtype)), ffi.string(entry.stored_dtype) })
      f:close()
    end
  end)

  it("refuses an integer l2l cannot hold, naming the element, and writes nothing", function()
    local I64, U64 = ffi.typeof("int64_t[1]"), ffi.typeof("uint64_t[1]")
    local cases = {   -- dtype, a value no i32 holds, its bytes
      { "I64", 2 ^ 31, I64 }, { "I64", -2 ^ 31 - 1, I64 }, { "I64", -0x8000000000000000LL, I64 },
      { "I64", 0x7fffffffffffffffLL, I64 }, { "U64", 0x8000000000000000ULL, U64 }, { "U64", 0xffffffffffffffffULL, U64 },
      { "U32", 2 ^ 31, ffi.typeof("uint32_t[1]") }, { "BOOL", 2, ffi.typeof("uint8_t[1]") },
    }
    for i, c in ipairs(cases) do
      local dtype, bad, ctype = c[1], c[2], c[3]
      local shape = { support.int(1, 4), support.int(1, 5) }
      local numel = shape[1] * shape[2]
      local at = support.int(1, numel)
      local values, parts = {}, {}
      for k = 1, numel do
        values[k] = k == at and bad or support.int(0, 1)
        parts[k] = ffi.string(ctype(values[k]), OTHER[dtype].bits / 8)
      end
      local file = path("big" .. i .. ".safetensors")
      write_reference(file, { { name = "ids", dtype = dtype, shape = shape, values = values, blob = table.concat(parts) } })
      local f = l2l.safetensors.open(file)
      read_integers(f, "ids", values, shape, dtype)
      -- C counts the element from 0, in brackets
      local out = ffi.new("int32_t[?]", numel)
      assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_read(out, C.L2L_I32, numel, f.handle, "ids"))
      local index = (("%d][%d"):format(math.floor((at - 1) / shape[2]), (at - 1) % shape[2]))
      local err = ffi.string(C.l2l_last_error())
      assert.is_truthy(err:find("l2l_safetensors_read: " .. file .. ": tensor 'ids'[" .. index .. "] (" .. dtype .. ")", 1, true), err)
      f:close()
    end
  end)

  it("writes what the reference reads: every dtype, the layout, metadata and checksums", function()
    local entries, want = {}, {}
    local dtypes = { "f32", "f16", "bf16", "i32", "u8" }
    for i = 1, support.int(5, 10) do
      local dtype = dtypes[(i - 1) % #dtypes + 1]
      local shape = {}
      for d = 1, support.int(1, 4) do shape[d] = support.int(1, 5) end
      local t = l2l.empty(shape, { dtype = dtype })
      local p = ffi.cast(CTYPES[dtype], t:data())
      local values = {}
      for k = 1, t:numel() do
        local v = draw(BY_L2L[dtype])
        values[k] = v
        p[k - 1] = v
      end
      local name = "t" .. i
      if i % 3 == 0 then   -- made as it is written
        entries[i] = { name = name, shape = shape, dtype = dtype, produce = function() return t end }
      else
        entries[i] = { name = name, tensor = t }
      end
      want[name] = { dtype = BY_L2L[dtype], shape = shape, values = values, size = FORMATS[BY_L2L[dtype]].size }
    end
    local file = path("written.safetensors")
    l2l.safetensors.write(file, entries, { k = "v", unicode = "∀x" })
    local bytes = support.read_file(file)
    local n = 0
    for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
    assert.are.equal(0, (8 + n) % 8, "the data starts 8-byte aligned")
    local header = cjson.decode(bytes:sub(9, 8 + n))
    assert.are.equal("v", header.__metadata__.k)
    assert.are.equal("∀x", header.__metadata__.unicode)
    local sums = cjson.decode(header.__metadata__.l2l_xxh3)
    local data = bytes:sub(9 + n)
    local at = 0
    for i, e in ipairs(entries) do   -- in the entries' order, end to end
      local w, h = want[e.name], header[e.name]
      assert.are.equal(w.dtype, h.dtype)
      assert.are.same(w.shape, h.shape)
      assert.are.same({ at, at + #w.values * w.size }, h.data_offsets, e.name)
      at = h.data_offsets[2]
      assert.is_truthy(type(sums[e.name]) == "string" and sums[e.name]:match("^%x+$") and #sums[e.name] == 16, e.name)
      local got = {}
      for k = 1, #w.values do
        local u = 0
        for b = w.size, 1, -1 do u = u * 256 + data:byte(h.data_offsets[1] + (k - 1) * w.size + b) end
        if w.dtype == "I32" and u >= 2 ^ 31 then u = u - 2 ^ 32 end
        got[k] = u
      end
      compare(got, w.values, ("entry %d '%s' (%s) as written"):format(i, e.name, w.dtype))
    end
    assert.are.equal(#data, at, "no bytes after the last tensor")
    -- a damaged byte of the data: the read names the tensor, verify too
    local k = support.int(1, #data)
    local damaged = bytes:sub(1, 8 + n + k - 1) .. string.char((data:byte(k) + 1) % 256) .. bytes:sub(8 + n + k + 1)
    local bad = path("damaged.safetensors")
    support.write_file(bad, damaged)
    local f = l2l.safetensors.open(bad)
    local hit
    for _, e in ipairs(entries) do
      local h = header[e.name].data_offsets
      if k - 1 >= h[1] and k - 1 < h[2] then hit = e.name end
    end
    support.refused("tensor '" .. hit .. "' is damaged", f.verify, f)
    support.refused("tensor '" .. hit .. "' is damaged", f.read, f, hit)
    f:close()
  end)

  it("the C API checks its arguments and says which", function()
    local file = path("api.safetensors")
    write_reference(file, { { name = "a", dtype = "F16", shape = { 3 }, values = { 0x3c00, 0x4000, 0x4200 } } }, { m = "x" })
    local function err() return ffi.string(C.l2l_last_error()) end
    local box = ffi.new("l2l_safetensors *[1]")
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_open(nil, file))
    assert.are.equal("l2l_safetensors_open: out is NULL", err())
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_open(box, ""))
    assert.are.equal(C.L2L_ERR_IO, C.l2l_safetensors_open(box, path("missing")))
    assert.is_truthy(err():find("^l2l_safetensors_open: cannot open .*missing"), err())
    assert.are.equal(0, C.l2l_safetensors_open(box, file))
    local h = ffi.gc(box[0], C.l2l_safetensors_close)
    local info, entry = ffi.new("l2l_safetensors_info"), ffi.new("l2l_safetensors_entry")
    assert.are.equal(0, C.l2l_safetensors_get_info(info, h))
    assert.are.same({ 1, 1, 6 }, { info.tensors, info.metadata, tonumber(info.data_bytes) })
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_get_info(info, nil))
    assert.are.equal("l2l_safetensors_get_info: file is NULL", err())
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_get_entry(entry, h, 1))
    assert.is_truthy(err():find("l2l_safetensors_get_entry: index 1 is outside [0, 1)", 1, true), err())
    assert.are.equal(0, C.l2l_safetensors_find(entry, h, "a"))
    assert.are.same({ "a", C.L2L_F16, 1, 3, 0 }, { ffi.string(entry.name), entry.dtype, entry.ndim, tonumber(entry.shape[0]), entry.summed })
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_find(entry, h, "b"))
    assert.is_truthy(err():find("has no tensor 'b'", 1, true), err())
    local key, value = ffi.new("const char *[1]"), ffi.new("const char *[1]")
    assert.are.equal(0, C.l2l_safetensors_get_metadata(key, value, h, 0))
    assert.are.same({ "m", "x" }, { ffi.string(key[0]), ffi.string(value[0]) })
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_get_metadata(key, nil, h, 0))
    assert.are.equal("l2l_safetensors_get_metadata: value is NULL", err())
    local out = ffi.new("float[3]", 9, 9, 9)
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_read(out, C.L2L_F32, 2, h, "a"))
    assert.is_truthy(err():find("l2l_safetensors_read: numel is 2 but 'a' of .* has 3 elements"), err())
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_read(out, 9, 3, h, "a"))
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_read(out, C.L2L_I32, 3, h, "a"))
    assert.are.same({ 9, 9, 9 }, { out[0], out[1], out[2] }, "a refused read wrote nothing")
    assert.are.equal(0, C.l2l_safetensors_read(out, C.L2L_F32, 3, h, "a"))
    assert.are.same({ 1, 2, 3 }, { out[0], out[1], out[2] })
    assert.are.equal(0, C.l2l_safetensors_verify(h))
    -- writing: a refusal before anything is made, a short write leaving nothing, an
    -- abandoned one leaving the old file
    local wbox = ffi.new("l2l_safetensors_writer *[1]")
    local spec = ffi.new("l2l_safetensors_spec[1]")
    spec[0].name, spec[0].dtype, spec[0].ndim, spec[0].shape[0] = "w", C.L2L_F32, 1, 2
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_create(wbox, file, 2, spec, 1, nil, 0))
    assert.are.equal("l2l_safetensors_create: replace must be 0 or 1, got 2", err())
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_create(wbox, file, 1, spec, 1, nil, 1))
    assert.are.equal(C.L2L_ERR_STATE, C.l2l_safetensors_create(wbox, file, 0, spec, 1, nil, 0))
    assert.is_truthy(err():find("exists already", 1, true), err())
    local fresh = path("fresh.safetensors")
    assert.are.equal(0, C.l2l_safetensors_create(wbox, fresh, 0, spec, 1, nil, 0))
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_put(wbox[0], ffi.new("float[3]"), 12))
    assert.is_truthy(err():find("tensor 'w' has 12 bytes, its header says 8", 1, true), err())
    assert.are.equal(C.L2L_ERR_STATE, C.l2l_safetensors_commit(wbox[0]))
    assert.is_nil(io.open(fresh, "rb"), "a commit short of tensors left a file")
    assert.are.equal(0, C.l2l_safetensors_create(wbox, file, 1, spec, 1, nil, 0))
    assert.are.equal(0, C.l2l_safetensors_put(wbox[0], ffi.new("float[2]", 5, 6), 8))
    C.l2l_safetensors_abandon(wbox[0])
    local still = l2l.safetensors.open(file)
    assert.are.same({ "a" }, still.names, "an abandoned write left the old file")
    still:close()
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_put(nil, nil, 0))
    assert.are.equal(C.L2L_ERR_INVALID, C.l2l_safetensors_commit(nil))
    C.l2l_safetensors_abandon(nil)
    C.l2l_safetensors_close(nil)
  end)

  it("imports a GPT-2 of F16, BF16 and F64 tensors, each value widened exactly or rounded once", function()
    local V, P, D, M = 11, 6, 8, 12
    local shapes = { ["wte.weight"] = { V, D }, ["wpe.weight"] = { P, D }, ["ln_f.weight"] = { D }, ["ln_f.bias"] = { D } }
    local block = { ["ln_1.weight"] = { D }, ["ln_1.bias"] = { D }, ["attn.c_attn.weight"] = { D, 3 * D },
                    ["attn.c_attn.bias"] = { 3 * D }, ["attn.c_proj.weight"] = { D, D }, ["attn.c_proj.bias"] = { D },
                    ["ln_2.weight"] = { D }, ["ln_2.bias"] = { D }, ["mlp.c_fc.weight"] = { D, M },
                    ["mlp.c_fc.bias"] = { M }, ["mlp.c_proj.weight"] = { M, D }, ["mlp.c_proj.bias"] = { D } }
    for k, s in pairs(block) do shapes["h.0." .. k] = s end
    local tensors, by_name = {}, {}
    for name, shape in pairs(shapes) do
      local dtype = ({ "F16", "BF16", "F32", "F64" })[support.int(1, 4)]
      local f = FORMATS[dtype]
      local numel = 1
      for _, d in ipairs(shape) do numel = numel * d end
      local values, blob = {}, nil
      for k = 1, numel do values[k] = f and encode(support.normal() * 0.5, f) or support.normal() * 0.5 end   -- finite weights
      if dtype == "F64" then blob = ffi.string(ffi.new("double[?]", numel, values), 8 * numel) end
      local t = { name = "transformer." .. name, dtype = dtype, shape = shape, values = values, blob = blob }
      tensors[#tensors + 1] = t
      by_name[name] = t
    end
    local file = path("gpt2_half.safetensors")
    write_reference(file, tensors)
    local model = l2l.import_gpt2(file, { heads = 2 })
    local function check(short, value, rows)
      local t = by_name[short]
      local want, p = {}, value:data()
      local n = rows and rows * D or #t.values
      for k = 1, n do   -- a half widened exactly, an F64 rounded to f32 once
        local f = FORMATS[t.dtype]
        want[k] = f and decode(t.values[k], f) or decode(encode(t.values[k], FORMATS.F32), FORMATS.F32)
      end
      local got = {}
      for k = 1, n do got[k] = p[k - 1] end
      compare(got, want, short .. " (" .. t.dtype .. ")")
    end
    local params = {}
    for i, layer in ipairs(model) do
      params[i] = {}
      for _, p in ipairs(layer:params()) do params[i][p.name] = p.value end
    end
    check("wte.weight", params[1].wte)
    check("wpe.weight", params[1].wpe, P)
    for _, pair in ipairs(require("l2l.gpt2").block_names) do check("h.0." .. pair[1], params[2][pair[2]]) end
    check("ln_f.weight", params[3]["ln.weight"])
    check("ln_f.bias", params[3]["ln.bias"])
  end)
end)
