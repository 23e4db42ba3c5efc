-- SPDX-License-Identifier: MIT
-- l2l.lib — finds libl2l and declares its C API to the FFI.
--
-- Purpose: one place that knows how the library gets into the process. Inside the `l2l`
-- executable (and any C program linking libl2l) the symbols are already there (ffi.C).
-- From plain `luajit` the shared library is loaded with ffi.load from $L2L_LIB when it is
-- set; else from build/libl2l.so beside this checkout, then by its soname (libl2l.so.0)
-- through the system's search path, where `make install` puts it. Debian's jemalloc
-- cannot be dlopen'ed into a running process (static TLS), so plain luajit needs
-- GLIBC_TUNABLES or LD_PRELOAD; the error says exactly that. Also turns C statuses into
-- Lua errors (the C message, indexes counted from 1) and names dtypes and pools. The
-- argument checks are l2l.argcheck's; the file system's questions, l2l.filesys's.
-- Must never: declare C functions by hand (they come from include/l2l.h via l2l.cdef).
local ffi = require("ffi")

ffi.cdef(require("l2l.cdef"))

local type, tostring, select, next, pairs, floor = type, tostring, select, next, pairs, math.floor

local M = {}

local function module_dir()
  local source = debug.getinfo(1, "S").source
  return source:sub(1, 1) == "@" and source:sub(2):match("^(.*)/[^/]*$") or "."
end
-- The folder of l2l's Lua modules (every module of l2l is in it).
M.dir = module_dir()

local TLS_HINT = [[
Debian's libjemalloc.so.2 uses initial-exec TLS and cannot be loaded into a running
luajit. Use the l2l executable (l2l script.lua), or start luajit with either
  GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 luajit script.lua
  LD_PRELOAD=libjemalloc.so.2 luajit script.lua   (jemalloc then also serves malloc)]]

-- The installed library's soname: the major number of l2l_version() (the Makefile's
-- SONAME; the install spec loads it by this name).
local SONAME = "libl2l.so.0"

local function load_library()
  if pcall(function() return ffi.C.l2l_version end) then return ffi.C, "(linked in)" end
  local env = os.getenv("L2L_LIB")
  local candidates
  if env and env ~= "" then
    candidates = { env }
  else
    candidates = { SONAME }
    local checkout = M.dir .. "/../../build/libl2l.so"
    local f = io.open(checkout, "rb")
    if f then f:close(); table.insert(candidates, 1, checkout) end
  end
  local failures = {}
  for _, path in ipairs(candidates) do
    local ok, lib = pcall(ffi.load, path)
    if ok then return lib, path end
    failures[#failures + 1] = path .. ": " .. tostring(lib)
  end
  local detail = table.concat(failures, "\n  ")
  if detail:find("static TLS", 1, true) then
    error("l2l: cannot load libl2l:\n  " .. detail .. "\n" .. TLS_HINT, 0)
  end
  error("l2l: cannot load libl2l (build it with `make` or install it with `make install`, " ..
        "or set L2L_LIB):\n  " .. detail, 0)
end

M.C, M.path = load_library()
local C = M.C

-- The value a C float field holds after v is stored in it: settings are checked on this,
-- not on the Lua number (1e-46 passes "> 0" and is 0 in f32; 1e39 is finite and inf).
function M.as_f32(v) return tonumber(ffi.cast("float", v)) end

-- nil when the number v (already checked by ok) keeps ok in a C float, and nonzero
-- stays nonzero; else why not, for a message ("is 0 in f32", "is inf in f32").
function M.f32_trouble(v, ok)
  local f = M.as_f32(v)
  if ok(f) and (f == 0) == (v == 0) then return nil end
  return ("is %s in f32, the type C keeps it in"):format(tostring(f))
end

-- The last C error in Lua's terms. C's message names things as C does: the failing function
-- in front, an element of a tensor from 0 ("tokens[2][4] = 300 is outside [0, 256)"); the
-- error's detail (l2l_last_error_detail) says which of its bytes do. Lua leaves the function
-- out (its callers put their own name), names the element as :get counts it, from 1
-- ("tokens:get(3, 5) = 300 ..."; token ids count from 0 in C and Lua alike), and puts the
-- words spans(detail) gives ({at, bytes, words}, say an option's name) in their places.
-- Nothing here reads the message's words.
local detail = ffi.new("l2l_error_detail")
function M.last_error(spans)
  local message = ffi.string(C.l2l_last_error())
  C.l2l_last_error_detail(detail)
  local list = spans and spans(detail) or {}
  if detail.element_dims > 0 and detail.element_named.bytes > 0 then
    local index = {}
    for i = 0, detail.element_dims - 1 do index[i + 1] = tostring(tonumber(detail.element[i]) + 1) end
    list[#list + 1] = { detail.element_named.at, detail.element_named.bytes,
                        ":get(" .. table.concat(index, ", ") .. ")" }
  end
  table.sort(list, function(x, y) return x[1] < y[1] end)
  local parts, at = {}, detail.text
  for _, span in ipairs(list) do
    if span[1] >= at then
      parts[#parts + 1] = message:sub(at + 1, span[1])
      parts[#parts + 1] = span[3]
      at = span[1] + span[2]
    end
  end
  parts[#parts + 1] = message:sub(at + 1)
  return table.concat(parts)
end

-- lib.plain_nans(t): every NaN among the floats of t (f32, f16, bf16; uint bits) made the one
-- quiet NaN: a file's bytes may spell a NaN with a payload, which LuaJIT, keeping other
-- values inside NaNs' bits, would take for a pointer once such a float reaches Lua (a
-- damaged weight crashed run:step through the loss). exponent: the dtype's exponent bits;
-- quiet: its quiet NaN.
local NAN_BITS = {
  f32 = { "uint32_t *", 0x7f800000, 0x007fffff, 0x7fc00000 },
  f16 = { "uint16_t *", 0x7c00, 0x03ff, 0x7e00 },
  bf16 = { "uint16_t *", 0x7f80, 0x007f, 0x7fc0 },
}
function M.plain_nans(t)
  local spec = NAN_BITS[t:dtype()]
  if spec == nil then return end
  local p, exponent, fraction, quiet = ffi.cast(spec[1], t:data()), spec[2], spec[3], spec[4]
  for i = 0, t:numel() - 1 do
    local b = p[i]
    if bit.band(b, exponent) == exponent and bit.band(b, fraction) ~= 0 then p[i] = quiet end
  end
end

-- Raises a Lua error naming `name` when a C call failed; `level` as for error().
function M.check(status, name, level)
  if status ~= 0 then error(name .. ": " .. M.last_error(), (level or 2) + 1) end
end

M.dtypes = { f32 = C.L2L_F32, f16 = C.L2L_F16, bf16 = C.L2L_BF16, i32 = C.L2L_I32, u8 = C.L2L_U8 }
M.dtype_names = {}
for name, id in pairs(M.dtypes) do M.dtype_names[tonumber(id)] = name end
M.pools = { host = C.L2L_POOL_HOST, pinned = C.L2L_POOL_PINNED, device = C.L2L_POOL_DEVICE }
M.pool_names = {}
for name, id in pairs(M.pools) do M.pool_names[tonumber(id)] = name end

local function enum_error(what, value, names, fname, level)
  local list = {}
  for k in pairs(names) do list[#list + 1] = k end
  table.sort(list)
  error(("%s: %s must be one of %s, got %s"):format(fname, what, table.concat(list, ", "),
        type(value) == "string" and ("'" .. value .. "'") or tostring(value)), level + 1)
end

function M.dtype_id(value, fname, level)
  local id = M.dtypes[value]
  if id == nil then enum_error("dtype", value, M.dtypes, fname, (level or 2) + 1) end
  return id
end

-- "cuda" names the device pool where the CUDA backend serves it, so that t:to("cuda")
-- says what it means (and fails, saying why, where the device is the CPU).
function M.pool_id(value, fname, level)
  if value == "cuda" then
    if ffi.string(C.l2l_device_backend()) == "cuda" then return C.L2L_POOL_DEVICE end
    local why = ffi.new("char[256]")
    local reason = C.l2l_cuda_available(why, 256) == 1
      and "the device pool is on the CPU backend (L2L_DEVICE=cpu); l2l.device_use('cuda') switches it"
      or ffi.string(why)
    error(("%s: pool 'cuda' cannot be used: %s"):format(fname, reason), (level or 2) + 1)
  end
  local id = M.pools[value]
  if id == nil then enum_error("pool", value, M.pools, fname, (level or 2) + 1) end
  return id
end

return M
