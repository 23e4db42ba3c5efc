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

local C, check = lib.C, lib.check
local floor, type, tostring, select = math.floor, type, tostring, select

ffi.cdef [[
typedef struct l2l_lua_tensor { l2l_tensor *handle; } l2l_lua_tensor;
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

function M.is_tensor(x) return ffi.istype(TensorCT, x) end

local function wrap(handle) return TensorCT(handle) end

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
    if type(d) ~= "number" or d ~= floor(d) or d < 1 then
      error(("%s: shape[%d] must be an integer >= 1, got %s"):format(fname, i, tostring(d)),
            level + 1)
    end
    dims[i - 1] = d
  end
  return n, dims
end

local function new_tensor(shape, opts, fname, level)
  opts = opts or {}
  local dtype = lib.dtype_id(opts.dtype or "f32", fname, level + 1)
  local pool = lib.pool_id(opts.pool or "host", fname, level + 1)
  local n, dims = check_shape(shape, fname, level + 1)
  local out = ffi.new("l2l_tensor *[1]")
  check(C.l2l_tensor_new(out, pool, dtype, n, dims), fname, level + 1)
  return wrap(out[0])
end

-- l2l.empty(shape [, {dtype=, pool=}]): contents undefined.
-- (Results go through a local, never `return f(...)`: a tail call drops a stack frame and
-- would point error levels at the wrong caller.)
function M.empty(shape, opts)
  local t = new_tensor(shape, opts, "l2l.empty", 2)
  return t
end

local function filled(shape, value, opts, fname)
  local t = new_tensor(shape, opts, fname, 3)
  check(C.l2l_tensor_fill(t.handle, value), fname, 3)
  return t
end

function M.zeros(shape, opts)
  local t = filled(shape, 0, opts, "l2l.zeros")
  return t
end

function M.ones(shape, opts)
  local t = filled(shape, 1, opts, "l2l.ones")
  return t
end
function M.full(shape, value, opts)
  if type(value) ~= "number" then
    error("l2l.full: value must be a number, got " .. type(value), 2)
  end
  local t = filled(shape, value, opts, "l2l.full")
  return t
end

-- A new tensor filled by `method` (Tensor.uniform or Tensor.normal); freed on failure.
local function random_tensor(shape, opts, fname, method, a, b)
  local t = new_tensor(shape, opts, fname, 3)
  local ok, err = pcall(method, t, a, b, opts)
  if not ok then t:free(); error(err, 3) end
  return t
end

-- Random tensors: opts.seed (default 0), opts.stream (default 0), opts.first (default 0).
function M.rand(shape, opts)
  opts = opts or {}
  local t = random_tensor(shape, opts, "l2l.rand", Tensor.uniform, opts.lo or 0, opts.hi or 1)
  return t
end

function M.randn(shape, opts)
  opts = opts or {}
  local t = random_tensor(shape, opts, "l2l.randn", Tensor.normal, opts.mean or 0, opts.std or 1)
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
function M.tensor(data, opts)
  if type(data) ~= "table" then
    error("l2l.tensor: data must be a (nested) table of numbers, got " .. type(data), 2)
  end
  opts = opts or {}
  local dtype = lib.dtype_id(opts.dtype or data.dtype or "f32", "l2l.tensor", 2)
  local pool = opts.pool or data.pool or "host"
  local shape, values = flatten(data, "l2l.tensor")
  for i = 1, #values do
    local why = unstorable(dtype, values[i])
    if why then error(("l2l.tensor: value %d %s"):format(i, why), 2) end
  end
  local t = new_tensor(shape, { dtype = lib.dtype_names[tonumber(dtype)], pool = pool },
                       "l2l.tensor", 2)
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

function Tensor:totable()
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
function Tensor:data()
  local h = handle_of(self, "self", "tensor:data", 2)
  if C.l2l_tensor_pool(h) == C.L2L_POOL_DEVICE then
    error("tensor:data: a device tensor's memory is not addressable here; use t:to('host')", 2)
  end
  return ffi.cast(pointer_types[tonumber(C.l2l_tensor_dtype(h))], C.l2l_tensor_data(h))
end

----------------------------------------------------------------- shape and identity

function Tensor:ndim() return C.l2l_tensor_ndim(handle_of(self, "self", "tensor:ndim", 2)) end

function Tensor:shape()
  local h = handle_of(self, "self", "tensor:shape", 2)
  local out = {}
  for d = 1, C.l2l_tensor_ndim(h) do out[d] = tonumber(C.l2l_tensor_dim(h, d - 1)) end
  return out
end

function Tensor:dim(d)
  local h = handle_of(self, "self", "tensor:dim", 2)
  local ndim = C.l2l_tensor_ndim(h)
  if type(d) ~= "number" or d ~= floor(d) or d < 1 or d > ndim then
    error(("tensor:dim: d must be an integer in [1, %d], got %s"):format(ndim, tostring(d)), 2)
  end
  return tonumber(C.l2l_tensor_dim(h, d - 1))
end

function Tensor:numel() return tonumber(C.l2l_tensor_numel(handle_of(self, "self", "tensor:numel", 2))) end

function Tensor:dtype()
  return lib.dtype_names[tonumber(C.l2l_tensor_dtype(handle_of(self, "self", "tensor:dtype", 2)))]
end

function Tensor:pool()
  return lib.pool_names[tonumber(C.l2l_tensor_pool(handle_of(self, "self", "tensor:pool", 2)))]
end

-- Element offset of this view within its storage (the `first` of a split-invariant fill).
function Tensor:offset() return tonumber(C.l2l_tensor_offset(handle_of(self, "self", "tensor:offset", 2))) end

function Tensor:is_freed() return self.handle == nil end

----------------------------------------------------------------- views, copies, casts

-- Rows first .. first+count-1 along dim 1, sharing storage.
function Tensor:view(first, count)
  local h = handle_of(self, "self", "tensor:view", 2)
  if type(first) ~= "number" or type(count) ~= "number" then
    error("tensor:view: first and count must be numbers", 2)
  end
  local out = ffi.new("l2l_tensor *[1]")
  check(C.l2l_tensor_view_rows(out, h, first - 1, count), "tensor:view", 2)
  return wrap(out[0])
end

function Tensor:reshape(shape)
  local h = handle_of(self, "self", "tensor:reshape", 2)
  local n, dims = check_shape(shape, "tensor:reshape", 2)
  local out = ffi.new("l2l_tensor *[1]")
  check(C.l2l_tensor_reshape(out, h, n, dims), "tensor:reshape", 2)
  return wrap(out[0])
end

-- self := src (same dtype and element count; any pools).
function Tensor:copy(src)
  local h = handle_of(self, "self", "tensor:copy", 2)
  check(C.l2l_tensor_copy(h, handle_of(src, "src", "tensor:copy", 2)), "tensor:copy", 2)
  return self
end

-- A new tensor in `pool` with the same contents.
function Tensor:to(pool)
  local h = handle_of(self, "self", "tensor:to", 2)
  local out = new_tensor(self:shape(), { dtype = self:dtype(), pool = pool }, "tensor:to", 2)
  local status = C.l2l_tensor_copy(out.handle, h)
  if status ~= 0 then out:free(); check(status, "tensor:to", 2) end
  return out
end

function Tensor:clone() return self:to(self:pool()) end

-- A new tensor of another dtype (round to nearest even), in the same pool.
function Tensor:cast(dtype)
  local h = handle_of(self, "self", "tensor:cast", 2)
  lib.dtype_id(dtype, "tensor:cast", 2)
  local out = new_tensor(self:shape(), { dtype = dtype, pool = self:pool() }, "tensor:cast", 2)
  local status = C.l2l_tensor_cast(out.handle, h)
  if status ~= 0 then out:free(); check(status, "tensor:cast", 2) end
  return out
end

function Tensor:fill(value)
  local h = handle_of(self, "self", "tensor:fill", 2)
  if type(value) ~= "number" then error("tensor:fill: value must be a number", 2) end
  check(C.l2l_tensor_fill(h, value), "tensor:fill", 2)
  return self
end

local function rng_opts(opts, fname, t)
  opts = opts or {}
  for _, k in ipairs({ "seed", "stream", "first" }) do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "number" or v ~= floor(v) or v < 0) then
      error(("%s: %s must be an integer >= 0, got %s"):format(fname, k, tostring(v)), 4)
    end
  end
  -- By default a view draws the numbers its elements have in the whole storage, so that
  -- filling micro-batch views equals filling the batch.
  return opts.seed or 0, opts.stream or 0, opts.first or t:offset()
end

function Tensor:uniform(lo, hi, opts)
  local h = handle_of(self, "self", "tensor:uniform", 2)
  local seed, stream, first = rng_opts(opts, "tensor:uniform", self)
  check(C.l2l_tensor_uniform(h, seed, stream, first, lo or 0, hi or 1), "tensor:uniform", 2)
  return self
end

function Tensor:normal(mean, std, opts)
  local h = handle_of(self, "self", "tensor:normal", 2)
  local seed, stream, first = rng_opts(opts, "tensor:normal", self)
  check(C.l2l_tensor_normal(h, seed, stream, first, mean or 0, std or 1), "tensor:normal", 2)
  return self
end

-- Frees the tensor now; safe to call again. Views keep the storage alive.
function Tensor:free()
  local h = self.handle
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
  __gc = function(t) if t.handle ~= nil then C.l2l_tensor_free(t.handle) end end,
})

M.Tensor = Tensor
return M
