-- SPDX-License-Identifier: MIT
-- l2l.lib — finds libl2l and declares its C API to the FFI.
--
-- Purpose: one place that knows how the library gets into the process. Inside the `l2l`
-- executable (and any C program linking libl2l) the symbols are already there (ffi.C).
-- From plain `luajit` the shared library is loaded with ffi.load from $L2L_LIB when it is
-- set; else from build/libl2l.so beside this checkout, then by its soname (libl2l.so.0)
-- through the system's search path, where `make install` puts it. Debian's jemalloc
-- cannot be dlopen'ed into a running process (static TLS), so plain luajit needs
-- GLIBC_TUNABLES or LD_PRELOAD; the error says exactly that. Also turns C statuses into Lua errors, and holds the argument
-- checks every public function shares (see "arguments" below).
-- Must never: declare C functions by hand (they come from src/l2l.h via l2l.cdef).
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

----------------------------------------------------------------- folders and files
-- Read through the FFI (opendir / readdir64 and statx: Linux glibc, whose records have
-- these layouts on every architecture), never through a shell, so a path may hold any
-- character.

for _, decl in ipairs({   -- one at a time: another module may have declared one already
  "void *opendir(const char *name);",
  "int closedir(void *dir);",
  "struct l2l_dirent64 { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };",
  "struct l2l_dirent64 *readdir64(void *dir);",
  "int *__errno_location(void);",
  "char *strerror(int errnum);",
  -- statx's record is the same on every architecture (struct stat's is not): 256 bytes,
  -- the file type in the top bits of stx_mode.
  [[struct l2l_statx { uint32_t mask, blksize; uint64_t attributes; uint32_t nlink, uid, gid;
     uint16_t mode, pad; uint64_t ino, size, blocks, attributes_mask; uint8_t rest[192]; };]],
  "int statx(int dirfd, const char *path, int flags, unsigned int mask, struct l2l_statx *out);",
}) do pcall(ffi.cdef, decl) end
M.DT_UNKNOWN, M.DT_DIR, M.DT_REG = 0, 4, 8

local AT_FDCWD, STATX_TYPE, STATX_SIZE, S_IFMT = -100, 0x1, 0x200, 0xF000
local file_types = { [0x1000] = "a FIFO (a named pipe)", [0x2000] = "a character device",
                     [0x4000] = "a directory", [0x6000] = "a block device", [0xC000] = "a socket" }

-- true and its size when `path` names a regular file (through symbolic links), else nil
-- and why ("is a directory", "is a FIFO (a named pipe), not a regular file", or the
-- system's reason).
-- It only looks (statx), never opens: opening a FIFO to read waits for a writer, which
-- is how a loader used to block forever. Every loader asks before it opens.
function M.regular_file(path)
  local st = ffi.new("struct l2l_statx")
  if ffi.C.statx(AT_FDCWD, path, 0, STATX_TYPE + STATX_SIZE, st) ~= 0 then
    return nil, ffi.string(ffi.C.strerror(ffi.C.__errno_location()[0]))
  end
  local kind = bit.band(st.mode, S_IFMT)
  if kind == 0x8000 then return true, tonumber(st.size) end
  local what = file_types[kind] or "not a regular file"
  return nil, kind == 0x4000 and "is a directory" or ("is %s, not a regular file"):format(what)
end

-- The entries of folder `path` ({name =, type = d_type} each, without "." and ".."), or
-- nil and why when it cannot be opened (not a folder, not readable).
function M.list_folder(path)
  local dir = ffi.C.opendir(path)
  if dir == nil then return nil, ffi.string(ffi.C.strerror(ffi.C.__errno_location()[0])) end
  local entries = {}
  while true do
    local e = ffi.C.readdir64(dir)
    if e == nil then break end
    local name = ffi.string(e.d_name)
    if name ~= "." and name ~= ".." then entries[#entries + 1] = { name = name, type = e.d_type } end
  end
  ffi.C.closedir(dir)
  return entries
end

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

-- C names an element of a tensor as C indexes it, from 0: "tokens[2][4] = 300 is outside
-- [0, 256)". A Lua user counts from 1 and reads that element as tokens:get(3, 5), which is
-- what such a message says here ("tokens:get(3, 5) = 300 is outside [0, 256)"). The ids'
-- range stays as it is: token ids count from 0 in C and in Lua alike.
local function lua_position(index)
  local list = {}
  for d in index:gmatch("%d+") do list[#list + 1] = tostring(tonumber(d) + 1) end
  return ":get(" .. table.concat(list, ", ") .. ")"
end

function M.lua_indexing(msg)
  return (msg:gsub("(%[[%d%]%[]*%])( = %-?%d+ is outside %[)", function(index, rest)
    return lua_position(index) .. rest
  end))
end

-- The last C error, without the C function's name (Lua callers get their own name), in
-- Lua's indexing (above).
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

function M.last_error()
  return M.lua_indexing((ffi.string(C.l2l_last_error()):gsub("^l2l_[%w_]+: ", "")))
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
--   if select("#", ...) ~= 0 then lib.too_many("l2l.zeros", "shape, options", 2, ...) end
-- (its parameter list ends in `...`), which costs nothing when the count is right.

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

-- lib.suggest(word, known) -> the name of `known` (a set: name -> true) nearest to `word`
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

-- lib.options(o, known, fname, level [, name = "options"]) -> o, or an empty table for
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

-- lib.fields(t, known, fname, level, name [, list]) -> t: a table with named fields (part
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

-- lib.too_many(fname, params, level, ...): raises "fname: takes 2 arguments (shape,
-- options), got 3"; `params` names the parameters (after self for a method), `...` are
-- the arguments beyond them. Call it only when select("#", ...) ~= 0.
function M.too_many(fname, params, level, ...)
  local taken = params == "" and 0 or select(2, params:gsub(",", ",")) + 1
  local takes = taken == 0 and "no arguments" or taken == 1 and ("1 argument (%s)"):format(params)
                or ("%d arguments (%s)"):format(taken, params)
  raise(("%s: takes %s, got %d"):format(fname, takes, taken + select("#", ...)), level)
end

return M
