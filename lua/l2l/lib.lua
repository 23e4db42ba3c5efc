-- l2l.lib — finds libl2l and declares its C API to the FFI.
--
-- Purpose: one place that knows how the library gets into the process. Inside the `l2l`
-- executable (and any C program linking libl2l) the symbols are already there (ffi.C).
-- From plain `luajit` the shared library is loaded with ffi.load from $L2L_LIB, else
-- build/libl2l.so beside this checkout. Debian's jemalloc cannot be dlopen'ed into a
-- running process (static TLS), so plain luajit needs GLIBC_TUNABLES or LD_PRELOAD; the
-- error says exactly that. Also turns C statuses into Lua errors.
-- Must never: declare C functions by hand (they come from src/l2l.h via l2l.cdef).
local ffi = require("ffi")

ffi.cdef(require("l2l.cdef"))

local M = {}

local function module_dir()
  local source = debug.getinfo(1, "S").source
  return source:sub(1, 1) == "@" and source:sub(2):match("^(.*)/[^/]*$") or "."
end

local TLS_HINT = [[
Debian's libjemalloc.so.2 uses initial-exec TLS and cannot be loaded into a running
luajit. Use the l2l executable (build/l2l script.lua), or start luajit with either
  GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 luajit script.lua
  LD_PRELOAD=libjemalloc.so.2 luajit script.lua   (jemalloc then also serves malloc)]]

local function load_library()
  if pcall(function() return ffi.C.l2l_version end) then return ffi.C, "(linked in)" end
  local env = os.getenv("L2L_LIB")
  local candidates = (env and env ~= "") and { env } or { module_dir() .. "/../../build/libl2l.so" }
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
  error("l2l: cannot load libl2l (build it with `make`, or set L2L_LIB):\n  " .. detail, 0)
end

M.C, M.path = load_library()
local C = M.C

-- The last C error, without the C function's name (Lua callers get their own name).
function M.last_error()
  return (ffi.string(C.l2l_last_error()):gsub("^l2l_[%w_]+: ", ""))
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
