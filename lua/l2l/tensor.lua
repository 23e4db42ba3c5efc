-- SPDX-License-Identifier: MIT
-- l2l.tensor — tensors in Lua: an FFI metatype around the C handle.
--
-- Purpose: make C tensors feel like Lua values: build them from nested tables, read them
-- back, print them, view and copy them, with every misuse raising a Lua error that names
-- the argument. A tensor is a small cdata box holding the C handle: the garbage
-- collector frees it (ffi.gc-style __gc), and t:free() frees it now and is safe to call
-- twice (the box forgets the handle, so later use raises "tensor was freed").
-- Indices in Lua are 1-based (rows in t:view, dims in t:dim, elements in t:get/t:set).
-- Must never: hand C a freed handle, or write an element before the whole input was
-- checked.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")

local C, check, too_many = lib.C, lib.check, argcheck.too_many
local floor, type, tostring, select = math.floor, type, tostring, select

ffi.cdef [[
typedef struct l2l_lua_tensor { l2l_tensor *handle; int32_t lent; } l2l_lua_tensor;
]]

local M = {}
local Tensor = {}          -- methods
local TensorCT             -- the metatype, set below

local pointer_types = {
  [tonumber(C.L2L_F32)] = ffi.typeof("float *"),
  [tonumber(C.L2L_F16)] = ffi.typeof("uint16_t *"),
  [tonumber(C.L2L_BF16)] = ffi.typeof("uint16_t *"),
  [tonumber(C.L2L_I32)] = ffi.typeof("int32_t *"),
  [tonumber(C.L2L_U8)] = ffi.typeof("uint8_t *"),
}

-- Element readers and checked writers per dtype (value conversions of 16-bit floats go
-- through the C library's round-to-nearest-even).
local readers = {
  [tonumber(C.L2L_F32)] = function(p, i) return p[i] end,
  [tonumber(C.L2L_F16)] = function(p, i) return C.l2l_f16_to_f32(p[i]) end,
  [tonumber(C.L2L_BF16)] = function(p, i) return C.l2l_bf16_to_f32(p[i]) end,
  [tonumber(C.L2L_I32)] = function(p, i) return p[i] end,
  [tonumber(C.L2L_U8)] = function(p, i) return p[i] end,
}

local function integer_in(v, lo, hi) return v == floor(v) and v >= lo and v <= hi end

-- Returns nil if v can be stored as dtype, else why not.
local function unstorable(dtype, v)
  if type(v) ~= "number" then return "is a " .. type(v) .. ", not a number" end
  if dtype == C.L2L_I32 and not integer_in(v, -2147483648, 2147483647) then
    return "= " .. tostring(v) .. " is not an int32"
  elseif dtype == C.L2L_U8 and not integer_in(v, 0, 255) then
    return "= " .. tostring(v) .. " is not an integer in [0, 255]"
  end
  return nil
end

local writers = {
  [tonumber(C.L2L_F32)] = function(p, i, v) p[i] = v end,
  [tonumber(C.L2L_F16)] = function(p, i, v) p[i] = C.l2l_f32_to_f16(v) end,
  [tonumber(C.L2L_BF16)] = function(p, i, v) p[i] = C.l2l_f32_to_bf16(v) end,
  [tonumber(C.L2L_I32)] = function(p, i, v) p[i] = v end,
  [tonumber(C.L2L_U8)] = function(p, i, v) p[i] = v end,
}

----------------------------------------------------------------- construction

local write_all   -- defined under "reading and writing" (it needs with_host)

function M.is_tensor(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.is_tensor", "x", 2, ...) end
  return ffi.istype(TensorCT, x)
end

local function wrap(handle) return TensorCT(handle, 0) end

-- The C handle of a live tensor, or a Lua error naming the argument.
local function handle_of(t, name, fname, level)
  if not ffi.istype(TensorCT, t) then
    error(("%s: %s must be a tensor, got %s"):format(fname, name, type(t)), level + 1)
  end
  local h = t.handle
  if h == nil then error(("%s: %s was freed"):format(fname, name), level + 1) end
  return h
end
M.handle_of = handle_of
M.wrap = wrap   -- a Lua tensor owning a C handle (for other front-end modules)
-- A Lua tensor for a handle someone else owns and frees (what a custom layer's call is
-- lent: x, y, a parameter, a gradient): tensor:free refuses it and the collector leaves it;
-- the lender sets its handle to nil when the loan ends.
M.lend = function(handle) return TensorCT(handle, 1) end

local function check_shape(shape, fname, level)
  if type(shape) ~= "table" then
    error(("%s: shape must be a table of sizes, got %s"):format(fname, type(shape)), level + 1)
  end
  local n = #shape
  if n < 1 or n > 4 then
    error(("%s: shape must have 1 to 4 sizes, got %d"):format(fname, n), level + 1)
  end
  local dims = ffi.new("int64_t[4]")
  for i = 1, n do
    local d = shape[i]
    if type(d) ~= "number" or d ~= floor(d) or d < 1 or d > argcheck.EXACT_MAX then
      error(("%s: shape[%d] must be an integer >= 1, got %s"):format(fname, i, type(d) == "number" and tostring(d)
                                                                       or argcheck.describe(d)), level + 1)
    end
    dims[i - 1] = d
  end
  return n, dims
end

-- A new tensor of `dtype` in `pool` (names; nil: f32, host).
local function new_tensor(shape, dtype, pool, fname, level)
  local dt = lib.dtype_id(dtype or "f32", fname, level + 1)
  local pl = lib.pool_id(pool or "host", fname, level + 1)
  local n, dims = check_shape(shape, fname, level + 1)
  local out = ffi.new("l2l_tensor *[1]")
  check(C.l2l_tensor_new(out, pl, dt, n, dims), fname, level + 1)
  return wrap(out[0])
end

-- The options of a constructor, checked (argcheck.options); a dtype or pool name given where
-- the options go (l2l.zeros({2, 3}, "i32")) is refused with the way to write it.
local function tensor_options(opts, known, fname, level)
  if type(opts) == "string" and (lib.dtypes[opts] or lib.pools[opts] or opts == "cuda") then
    error(('%s: options must be a table, got string "%s" (write { %s = "%s" })'):format(fname, opts,
          lib.dtypes[opts] and "dtype" or "pool", opts), level + 1)
  end
  local o = argcheck.options(opts, known, fname, level + 1)
  return o
end

local TENSOR_OPTIONS = { dtype = true, pool = true }

-- l2l.empty(shape [, {dtype=, pool=}]): contents undefined.
-- (Results go through a local, never `return f(...)`: a tail call drops a stack frame and
-- would point error levels at the wrong caller.)
function M.empty(shape, opts, ...)
  if select("#", ...) ~= 0 then too_many("l2l.empty", "shape, options", 2, ...) end
  opts = tensor_options(opts, TENSOR_OPTIONS, "l2l.empty", 2)
  local t = new_tensor(shape, opts.dtype, opts.pool, "l2l.empty", 2)
  return t
end

local function filled(shape, value, opts, fname)
  opts = tensor_options(opts, TENSOR_OPTIONS, fname, 3)
  local t = new_tensor(shape, opts.dtype, opts.pool, fname, 3)
  check(C.l2l_tensor_fill(t.handle, value), fname, 3)
  return t
end

function M.zeros(shape, opts, ...)
  if select("#", ...) ~= 0 then too_many("l2l.zeros", "shape, options", 2, ...) end
  local t = filled(shape, 0, opts, "l2l.zeros")
  return t
end

function M.ones(shape, opts, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ones", "shape, options", 2, ...) end
  local t = filled(shape, 1, opts, "l2l.ones")
  return t
end

function M.full(shape, value, opts, ...)
  if select("#", ...) ~= 0 then too_many("l2l.full", "shape, value, options", 2, ...) end
  if type(value) ~= "number" then
    error("l2l.full: value must be a number, got " .. type(value), 2)
  end
  local t = filled(shape, value, opts, "l2l.full")
  return t
end

-- Random fills: seed (default 0), stream (default 0), first (default: the view's offset
-- in its storage, so that filling micro-batch views equals filling the batch).
local function rng_int(v, key, fname, level)
  local problem = v ~= nil and argcheck.whole_problem(v)
  if problem then error(("%s: %s %s, got %s"):format(fname, key, problem, tostring(v)), level + 1) end
  return v
end

local function number_or(v, default, name, fname, level)
  if v == nil then return default end
  if type(v) ~= "number" then
    error(("%s: %s must be a number, got %s"):format(fname, name, argcheck.describe(v)), level + 1)
  end
  return v
end

-- The draws' seed, stream and first element index from opts (first: `first` when not given).
local function rng_of(opts, first, fname, level)
  return rng_int(opts.seed, "seed", fname, level + 1) or 0,
         rng_int(opts.stream, "stream", fname, level + 1) or 0,
         rng_int(opts.first, "first", fname, level + 1) or first
end

-- A new tensor filled by cfill (l2l_tensor_uniform or l2l_tensor_normal); freed on failure.
local function random_tensor(shape, opts, fname, cfill, a, b)
  local seed, stream, first = rng_of(opts, 0, fname, 3)
  local t = new_tensor(shape, opts.dtype, opts.pool, fname, 3)
  local status = cfill(t.handle, seed, stream, first, a, b)
  if status ~= 0 then t:free(); check(status, fname, 3) end
  return t
end

local RAND_OPTIONS = { dtype = true, pool = true, seed = true, stream = true, first = true, lo = true, hi = true }
local RANDN_OPTIONS = { dtype = true, pool = true, seed = true, stream = true, first = true, mean = true,
                        std = true }

-- l2l.rand(shape [, {dtype=, pool=, seed=, stream=, first=, lo = 0, hi = 1}])
function M.rand(shape, opts, ...)
  local fname = "l2l.rand"
  if select("#", ...) ~= 0 then too_many(fname, "shape, options", 2, ...) end
  opts = tensor_options(opts, RAND_OPTIONS, fname, 2)
  local t = random_tensor(shape, opts, fname, C.l2l_tensor_uniform, number_or(opts.lo, 0, "lo", fname, 2),
                          number_or(opts.hi, 1, "hi", fname, 2))
  return t
end

-- l2l.randn(shape [, {dtype=, pool=, seed=, stream=, first=, mean = 0, std = 1}])
function M.randn(shape, opts, ...)
  local fname = "l2l.randn"
  if select("#", ...) ~= 0 then too_many(fname, "shape, options", 2, ...) end
  opts = tensor_options(opts, RANDN_OPTIONS, fname, 2)
  local t = random_tensor(shape, opts, fname, C.l2l_tensor_normal, number_or(opts.mean, 0, "mean", fname, 2),
                          number_or(opts.std, 1, "std", fname, 2))
  return t
end

-- Shape of a nested table (rectangular, 1 to 4 levels) and its numbers in row-major order.
local function flatten(data, fname)
  local shape, node = {}, data
  while type(node) == "table" do
    if #node == 0 then error(fname .. ": empty table (every dim needs a size >= 1)", 4) end
    shape[#shape + 1] = #node
    node = node[1]
  end
  if #shape > 4 then error(fname .. ": more than 4 levels of nesting", 4) end
  local values = {}
  local function walk(x, depth, path)
    if depth > #shape then
      if type(x) ~= "number" then
        error(("%s: element %s is a %s, not a number"):format(fname, path, type(x)), 6)
      end
      values[#values + 1] = x
      return
    end
    if type(x) ~= "table" or #x ~= shape[depth] then
      error(("%s: ragged table: %s has %s entries, expected %d"):format(fname,
            path == "" and "the table" or path, type(x) == "table" and #x or "no", shape[depth]), 6)
    end
    for i = 1, #x do walk(x[i], depth + 1, path .. "[" .. i .. "]") end
  end
  walk(data, 1, "")
  return shape, values
end

-- l2l.tensor{{1, 2}, {3, 4}, dtype = "f32", pool = "host"}  (or options as 2nd argument)
function M.tensor(data, opts, ...)
  local fname = "l2l.tensor"
  if select("#", ...) ~= 0 then too_many(fname, "data, options", 2, ...) end
  if type(data) ~= "table" then
    error("l2l.tensor: data must be a (nested) table of numbers, got " .. type(data), 2)
  end
  argcheck.fields(data, TENSOR_OPTIONS, fname, 2, "data", true)
  opts = tensor_options(opts, TENSOR_OPTIONS, fname, 2)
  local dtype = lib.dtype_id(opts.dtype or data.dtype or "f32", fname, 2)
  local pool = opts.pool or data.pool or "host"
  local shape, values = flatten(data, fname)
  for i = 1, #values do
    local why = unstorable(dtype, values[i])
    if why then error(("l2l.tensor: value %d %s"):format(i, why), 2) end
  end
  local t = new_tensor(shape, lib.dtype_names[tonumber(dtype)], pool, fname, 2)
  write_all(t, values)
  return t
end

----------------------------------------------------------------- reading and writing

-- Runs f(host_handle) on a host-readable tensor with t's contents: t itself unless it
-- lives in device memory (not addressable from the CPU on a GPU build).
local function with_host(t, fname, write_back, f)
  local h = handle_of(t, "self", fname, 3)
  if C.l2l_tensor_pool(h) ~= C.L2L_POOL_DEVICE then return f(h) end
  local copy = t:to("host")
  local ok, result = pcall(f, copy.handle)
  if ok and write_back then check(C.l2l_tensor_copy(h, copy.handle), fname, 3) end
  copy:free()
  if not ok then error(result, 0) end
  return result
end


-- Writes a flat list of checked values into t.
write_all = function(t, values)
  with_host(t, "l2l.tensor", true, function(h)
    local dtype = tonumber(C.l2l_tensor_dtype(h))
    local p, write = ffi.cast(pointer_types[dtype], C.l2l_tensor_data(h)), writers[dtype]
    for i = 1, #values do write(p, i - 1, values[i]) end
  end)
end

function Tensor:totable(...)
  if select("#", ...) ~= 0 then too_many("tensor:totable", "", 2, ...) end
  local result = with_host(self, "tensor:totable", false, function(h)
    local dtype, ndim = tonumber(C.l2l_tensor_dtype(h)), C.l2l_tensor_ndim(h)
    local p, read = ffi.cast(pointer_types[dtype], C.l2l_tensor_data(h)), readers[dtype]
    local index = 0
    local function build(depth)
      local out, n = {}, tonumber(C.l2l_tensor_dim(h, depth))
      for i = 1, n do
        if depth == ndim - 1 then
          out[i] = tonumber(read(p, index)); index = index + 1
        else
          out[i] = build(depth + 1)
        end
      end
      return out
    end
    return build(0)
  end)
  return result
end

-- Flat element index (0-based) from 1-based indices, checked.
local function flat_index(h, fname, ...)
  local ndim = C.l2l_tensor_ndim(h)
  if select("#", ...) ~= ndim then
    error(("%s: need %d indices, got %d"):format(fname, ndim, select("#", ...)), 3)
  end
  local index = 0
  for d = 1, ndim do
    local i, size = select(d, ...), tonumber(C.l2l_tensor_dim(h, d - 1))
    if type(i) ~= "number" or i ~= floor(i) or i < 1 or i > size then
      error(("%s: index %d must be an integer in [1, %d], got %s"):format(fname, d, size,
            tostring(i)), 3)
    end
    index = index * size + (i - 1)
  end
  return index
end

function Tensor:get(...)
  local i = flat_index(handle_of(self, "self", "tensor:get", 2), "tensor:get", ...)
  local value = with_host(self, "tensor:get", false, function(h)
    local dtype = tonumber(C.l2l_tensor_dtype(h))
    return tonumber(readers[dtype](ffi.cast(pointer_types[dtype], C.l2l_tensor_data(h)), i))
  end)
  return value
end

-- t:set(i, j, ..., value)
function Tensor:set(...)
  local n = select("#", ...)
  local value = select(n, ...)
  local h = handle_of(self, "self", "tensor:set", 2)
  local i = flat_index(h, "tensor:set", unpack({ ... }, 1, n - 1))
  local why = unstorable(C.l2l_tensor_dtype(h), value)
  if why then error("tensor:set: value " .. why, 2) end
  with_host(self, "tensor:set", true, function(hh)
    local dtype = tonumber(C.l2l_tensor_dtype(hh))
    writers[dtype](ffi.cast(pointer_types[dtype], C.l2l_tensor_data(hh)), i, value)
  end)
  return self
end

-- A typed pointer to the elements (float*, uint16_t*, int32_t*, uint8_t*), for fast loops
-- in Lua; valid while the tensor lives. Host and pinned tensors only.
function Tensor:data(...)
  if select("#", ...) ~= 0 then too_many("tensor:data", "", 2, ...) end
  local h = handle_of(self, "self", "tensor:data", 2)
  if C.l2l_tensor_pool(h) == C.L2L_POOL_DEVICE then
    error("tensor:data: a device tensor's memory is not addressable here; use t:to('host')", 2)
  end
  return ffi.cast(pointer_types[tonumber(C.l2l_tensor_dtype(h))], C.l2l_tensor_data(h))
end

----------------------------------------------------------------- shape and identity

function Tensor:ndim(...)
  if select("#", ...) ~= 0 then too_many("tensor:ndim", "", 2, ...) end
  return C.l2l_tensor_ndim(handle_of(self, "self", "tensor:ndim", 2))
end

function Tensor:shape(...)
  if select("#", ...) ~= 0 then too_many("tensor:shape", "", 2, ...) end
  local h = handle_of(self, "self", "tensor:shape", 2)
  local out = {}
  for d = 1, C.l2l_tensor_ndim(h) do out[d] = tonumber(C.l2l_tensor_dim(h, d - 1)) end
  return out
end

function Tensor:dim(d, ...)
  if select("#", ...) ~= 0 then too_many("tensor:dim", "d", 2, ...) end
  local h = handle_of(self, "self", "tensor:dim", 2)
  local ndim = C.l2l_tensor_ndim(h)
  if type(d) ~= "number" or d ~= floor(d) or d < 1 or d > ndim then
    error(("tensor:dim: d must be an integer in [1, %d], got %s"):format(ndim, tostring(d)), 2)
  end
  return tonumber(C.l2l_tensor_dim(h, d - 1))
end

function Tensor:numel(...)
  if select("#", ...) ~= 0 then too_many("tensor:numel", "", 2, ...) end
  return tonumber(C.l2l_tensor_numel(handle_of(self, "self", "tensor:numel", 2)))
end

function Tensor:dtype(...)
  if select("#", ...) ~= 0 then too_many("tensor:dtype", "", 2, ...) end
  return lib.dtype_names[tonumber(C.l2l_tensor_dtype(handle_of(self, "self", "tensor:dtype", 2)))]
end

function Tensor:pool(...)
  if select("#", ...) ~= 0 then too_many("tensor:pool", "", 2, ...) end
  return lib.pool_names[tonumber(C.l2l_tensor_pool(handle_of(self, "self", "tensor:pool", 2)))]
end

-- Element offset of this view within its storage (the `first` of a split-invariant fill).
function Tensor:offset(...)
  if select("#", ...) ~= 0 then too_many("tensor:offset", "", 2, ...) end
  return tonumber(C.l2l_tensor_offset(handle_of(self, "self", "tensor:offset", 2)))
end

function Tensor:is_freed(...)
  if select("#", ...) ~= 0 then too_many("tensor:is_freed", "", 2, ...) end
  if not ffi.istype(TensorCT, self) then error("tensor:is_freed: self must be a tensor, got " .. type(self), 2) end
  return self.handle == nil
end

----------------------------------------------------------------- views, copies, casts

-- Rows first .. first+count-1 along dim 1, sharing storage.
function Tensor:view(first, count, ...)
  if select("#", ...) ~= 0 then too_many("tensor:view", "first, count", 2, ...) end
  local h = handle_of(self, "self", "tensor:view", 2)
  if type(first) ~= "number" or type(count) ~= "number" then
    error("tensor:view: first and count must be numbers", 2)
  end
  -- (in the caller's terms: rows count from 1)
  local rows = tonumber(C.l2l_tensor_dim(h, 0))
  if first ~= floor(first) or first < 1 or first > rows then
    error(("tensor:view: first must be a row of dim 1, 1 to %d, got %s"):format(rows, tostring(first)), 2)
  end
  if count ~= floor(count) or count < 1 or first + count - 1 > rows then
    error(("tensor:view: count must be 1 to %d (rows %d to %d of dim 1), got %s"):format(
      rows - first + 1, first, rows, tostring(count)), 2)
  end
  local out = ffi.new("l2l_tensor *[1]")
  check(C.l2l_tensor_view_rows(out, h, first - 1, count), "tensor:view", 2)
  return wrap(out[0])
end

function Tensor:reshape(shape, ...)
  if select("#", ...) ~= 0 then too_many("tensor:reshape", "shape", 2, ...) end
  local h = handle_of(self, "self", "tensor:reshape", 2)
  local n, dims = check_shape(shape, "tensor:reshape", 2)
  local out = ffi.new("l2l_tensor *[1]")
  check(C.l2l_tensor_reshape(out, h, n, dims), "tensor:reshape", 2)
  return wrap(out[0])
end

-- self := src (same dtype and element count; any pools).
function Tensor:copy(src, ...)
  if select("#", ...) ~= 0 then too_many("tensor:copy", "src", 2, ...) end
  local h = handle_of(self, "self", "tensor:copy", 2)
  check(C.l2l_tensor_copy(h, handle_of(src, "src", "tensor:copy", 2)), "tensor:copy", 2)
  return self
end

-- A new tensor in `pool` with the same contents.
function Tensor:to(pool, ...)
  if select("#", ...) ~= 0 then too_many("tensor:to", "pool", 2, ...) end
  local h = handle_of(self, "self", "tensor:to", 2)
  local out = new_tensor(self:shape(), self:dtype(), pool, "tensor:to", 2)
  local status = C.l2l_tensor_copy(out.handle, h)
  if status ~= 0 then out:free(); check(status, "tensor:to", 2) end
  return out
end

function Tensor:clone(...)
  if select("#", ...) ~= 0 then too_many("tensor:clone", "", 2, ...) end
  handle_of(self, "self", "tensor:clone", 2)
  local t = self:to(self:pool())
  return t
end

-- A new tensor of another dtype (round to nearest even), in the same pool.
function Tensor:cast(dtype, ...)
  if select("#", ...) ~= 0 then too_many("tensor:cast", "dtype", 2, ...) end
  local h = handle_of(self, "self", "tensor:cast", 2)
  lib.dtype_id(dtype, "tensor:cast", 2)
  local out = new_tensor(self:shape(), dtype, self:pool(), "tensor:cast", 2)
  local status = C.l2l_tensor_cast(out.handle, h)
  if status ~= 0 then out:free(); check(status, "tensor:cast", 2) end
  return out
end

function Tensor:fill(value, ...)
  if select("#", ...) ~= 0 then too_many("tensor:fill", "value", 2, ...) end
  local h = handle_of(self, "self", "tensor:fill", 2)
  if type(value) ~= "number" then error("tensor:fill: value must be a number", 2) end
  check(C.l2l_tensor_fill(h, value), "tensor:fill", 2)
  return self
end

local RNG_OPTIONS = { seed = true, stream = true, first = true }

-- t:uniform([lo = 0 [, hi = 1 [, {seed = 0, stream = 0, first = t:offset()}]]])
function Tensor:uniform(lo, hi, opts, ...)
  local fname = "tensor:uniform"
  if select("#", ...) ~= 0 then too_many(fname, "lo, hi, options", 2, ...) end
  local h = handle_of(self, "self", fname, 2)
  lo, hi = number_or(lo, 0, "lo", fname, 2), number_or(hi, 1, "hi", fname, 2)
  local seed, stream, first = rng_of(argcheck.options(opts, RNG_OPTIONS, fname, 2), nil, fname, 2)
  check(C.l2l_tensor_uniform(h, seed, stream, first or tonumber(C.l2l_tensor_offset(h)), lo, hi), fname, 2)
  return self
end

-- t:normal([mean = 0 [, std = 1 [, {seed = 0, stream = 0, first = t:offset()}]]])
function Tensor:normal(mean, std, opts, ...)
  local fname = "tensor:normal"
  if select("#", ...) ~= 0 then too_many(fname, "mean, std, options", 2, ...) end
  local h = handle_of(self, "self", fname, 2)
  mean, std = number_or(mean, 0, "mean", fname, 2), number_or(std, 1, "std", fname, 2)
  local seed, stream, first = rng_of(argcheck.options(opts, RNG_OPTIONS, fname, 2), nil, fname, 2)
  check(C.l2l_tensor_normal(h, seed, stream, first or tonumber(C.l2l_tensor_offset(h)), mean, std), fname, 2)
  return self
end

-- Frees the tensor now; safe to call again. Views keep the storage alive.
function Tensor:free(...)
  if select("#", ...) ~= 0 then too_many("tensor:free", "", 2, ...) end
  if not ffi.istype(TensorCT, self) then error("tensor:free: self must be a tensor, got " .. type(self), 2) end
  local h = self.handle
  if h ~= nil and self.lent ~= 0 then
    error("tensor:free: the tensor is lent to this call (a custom layer's x, y, dx, dy, parameter or gradient): " ..
          "its owner frees it", 2)
  end
  if h ~= nil then
    self.handle = nil
    C.l2l_tensor_free(h)
  end
end

----------------------------------------------------------------- printing

local PREVIEW_EDGE = 3   -- elements shown at each end of a long dim

local function format_number(v, integer)
  if integer then return tostring(v) end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
  return ("%.4g"):format(v)
end

local function preview(t)
  return with_host(t, "tostring", false, function(h)
    local dtype, ndim = tonumber(C.l2l_tensor_dtype(h)), C.l2l_tensor_ndim(h)
    local integer = dtype == C.L2L_I32 or dtype == C.L2L_U8
    local p, read = ffi.cast(pointer_types[dtype], C.l2l_tensor_data(h)), readers[dtype]
    local dims, strides = {}, {}
    for d = ndim, 1, -1 do
      dims[d] = tonumber(C.l2l_tensor_dim(h, d - 1))
      strides[d] = d == ndim and 1 or strides[d + 1] * dims[d + 1]
    end
    local function shown(n)  -- indices to show along a dim of size n (0 marks "...")
      if n <= 2 * PREVIEW_EDGE then
        local all = {}
        for i = 1, n do all[i] = i end
        return all
      end
      local s = {}
      for i = 1, PREVIEW_EDGE do s[#s + 1] = i end
      s[#s + 1] = 0
      for i = n - PREVIEW_EDGE + 1, n do s[#s + 1] = i end
      return s
    end
    local function render(d, base, indent)
      local parts = {}
      for _, i in ipairs(shown(dims[d])) do
        if i == 0 then
          parts[#parts + 1] = "..."
        elseif d == ndim then
          parts[#parts + 1] = format_number(tonumber(read(p, base + i - 1)), integer)
        else
          parts[#parts + 1] = render(d + 1, base + (i - 1) * strides[d], indent .. " ")
        end
      end
      local sep = d == ndim and ", " or (",\n" .. indent .. " ")
      return "[" .. table.concat(parts, sep) .. "]"
    end
    return render(1, 0, "")
  end)
end

local function describe(t)
  if t.handle == nil then return "tensor (freed)" end
  return ("tensor %s (%s) %s\n%s"):format(t:dtype(), table.concat(t:shape(), ","), t:pool(),
                                          preview(t))
end

----------------------------------------------------------------- the metatype

TensorCT = ffi.metatype("l2l_lua_tensor", {
  __index = Tensor,
  __tostring = describe,
  __gc = function(t) if t.handle ~= nil and t.lent == 0 then C.l2l_tensor_free(t.handle) end end,
})

M.Tensor = Tensor
return M
