-- SPDX-License-Identifier: MIT
-- l2l.safetensors — safetensors files from Lua, read and written by the C library.
--
--   safetensors.write(path, { {name =, tensor =}, ... } [, metadata = {key = "string"}])
--     (an entry may instead give {name =, shape =, dtype =, produce = function}: produce()
--     returns a host tensor of that shape and dtype when its bytes are written, which the
--     writer frees then: a file larger than memory is written one tensor at a time)
--   local file = safetensors.open(path)      -- header read and checked, data not yet
--   file.names (in the data's order), file.entries[name] = {name =, dtype =, stored_dtype =,
--     shape =, numel =, offset =, bytes =}, file.metadata (key -> string), file.data_start
--     (stored_dtype: the format's name, "F32", "I64", "BOOL", ...; dtype: l2l's that a read
--     gives, the stored one where l2l has it, else "f32" for a float, "u8" for BOOL, "i32"
--     for another integer, nil for the packed F4 and F6 floats and C64, which l2l does not read;
--     shape may hold a 0: an empty tensor, listed and not read)
--   file:read(name [, into]) -> a host tensor of the entry's dtype (into: a host or pinned
--     tensor of its element count: floats read into f32, f16 or bf16, rounded once;
--     integers into i32 or u8 where every value fits, else an error naming the element)
--   file:verify()                            -- every tensor against its checksum
--   file:close()
--
-- Purpose: the front end's door to the format, which the C library alone reads and writes
-- (include/l2l/safetensors.h: l2l_safetensors_open, _read, _create, ...; the checkpoints'
-- own reader and writer): the header's checks, the checksums, the atomic write and every
-- message about a file are C's, so a file the relay's checkpoints accept is one Lua
-- accepts. This module checks what it is given in Lua's terms (tables, names, tensors,
-- callbacks), turns it into the C API's arguments and the file's lists into tables, and
-- makes every NaN read the one quiet NaN (lib.plain_nans: LuaJIT would take a float with
-- a payload for a pointer).
-- Must never: parse or lay out a byte of the format itself, or leave a C handle open
-- past file:close() (or past the collector, for a file forgotten).
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local tensor = require("l2l.tensor")

local C = lib.C
local type, tostring, ipairs, pairs, floor, select = type, tostring, ipairs, pairs, math.floor, select
local too_many = argcheck.too_many

local M = {}

M.max_header = tonumber(C.L2L_SAFETENSORS_MAX_HEADER)   -- the largest header l2l reads or writes
local MAX_DIMS = tonumber(C.L2L_MAX_DIMS)

-- C's last error under fname, at `level` as for error() (0: no position).
local function failed(fname, level) error(fname .. ": " .. lib.last_error(), level == 0 and 0 or level + 1) end

-- Bytes a tensor of `dtype` (l2l's name) and numel elements takes.
local function bytes_of(dtype, numel) return numel * tonumber(C.l2l_dtype_size(lib.dtypes[dtype])) end

-- A string C can take whole (C strings end at the first NUL).
local function c_string(s) return type(s) == "string" and not s:find("\0", 1, true) end

----------------------------------------------------------------- writing

local ENTRY_FIELDS = { name = true, tensor = true, shape = true, dtype = true, produce = true }

-- An entry made when written: its Lua arguments checked now (the sizes' own checks are
-- C's, at l2l_safetensors_create).
local function lazy_entry(e)
  if type(e.produce) ~= "function" then error("produce must be a function", 0) end
  if e.tensor ~= nil then error("give a tensor or produce, not both", 0) end
  if lib.dtypes[e.dtype] == nil then error("dtype must be f32, f16, bf16, i32 or u8, got " .. argcheck.describe(e.dtype), 0) end
  if type(e.shape) ~= "table" or #e.shape > MAX_DIMS then
    error("shape must be a list of 1 to " .. MAX_DIMS .. " sizes", 0)
  end
  for _, v in ipairs(e.shape) do
    if type(v) ~= "number" or v ~= floor(v) or v < -2 ^ 53 or v > 2 ^ 53 then
      error("shape must hold whole sizes >= 1, got " .. argcheck.describe(v), 0)
    end
  end
  return e.shape, e.dtype
end

-- What a lazy entry's produce() returned, checked against what the header said.
local function produced(e)
  local ok, t = pcall(e.produce)
  if not ok then error(("entry '%s': %s"):format(e.name, tostring(t)), 0) end
  local same = tensor.is_tensor(t) and t:pool() == "host" and t:dtype() == e.dtype and #t:shape() == #e.shape
  for k = 1, same and #e.shape or 0 do same = same and t:shape()[k] == e.shape[k] end
  if not same then
    if tensor.is_tensor(t) then t:free() end
    error(("entry '%s': produce must return a host tensor of %s and shape {%s}"):format(
      e.name, e.dtype, table.concat(e.shape, ", ")), 0)
  end
  return t
end

-- The C specs of `entries` (checked in Lua's terms), or an error at `level`.
local function specs_of(entries, fname, level)
  local specs = ffi.new("l2l_safetensors_spec[?]", #entries + 1)
  for i, e in ipairs(entries) do
    if type(e) ~= "table" or not c_string(e.name) or e.name == "" then
      error(("%s: entry %d must have a name (a non-empty string without NUL bytes)"):format(fname, i), level + 1)
    end
    local what = ("entry %d ('%s')"):format(i, e.name)
    argcheck.fields(e, ENTRY_FIELDS, fname, level + 1, what)
    local shape, dtype
    if e.produce ~= nil then
      local ok, s, d = pcall(lazy_entry, e)
      if not ok then error(("%s: %s: %s"):format(fname, what, s), level + 1) end
      shape, dtype = s, d
    else
      if not tensor.is_tensor(e.tensor) then error(("%s: entry '%s' has no tensor"):format(fname, e.name), level + 1) end
      if e.shape ~= nil or e.dtype ~= nil then
        error(("%s: %s: shape and dtype go with produce (a tensor given is written as it is)"):format(fname, what), level + 1)
      end
      shape, dtype = e.tensor:shape(), e.tensor:dtype()
    end
    local s = specs[i - 1]
    s.name, s.dtype, s.ndim = e.name, lib.dtypes[dtype], #shape
    for d, n in ipairs(shape) do s.shape[d - 1] = n end
  end
  return specs
end

-- The metadata as C's key, value array (its strings anchored by `metadata` itself).
local function metadata_of(metadata, fname, level)
  local list = {}
  if metadata ~= nil then
    if type(metadata) ~= "table" then error(fname .. ": metadata must be a table of strings", level + 1) end
    for k, v in pairs(metadata) do
      if type(k) ~= "string" or type(v) ~= "string" then
        error(fname .. ": metadata must map strings to strings (encode other values as JSON)", level + 1)
      end
      if not c_string(k) or not c_string(v) then
        error(("%s: metadata '%s' holds a NUL byte, which a C string cannot carry"):format(fname, k:gsub("%z", "\\0")), level + 1)
      end
      list[#list + 1] = k
      list[#list + 1] = v
    end
  end
  return ffi.new("const char *[?]", #list + 1, list), #list / 2
end

-- Each entry's bytes into the writer, in order; a device tensor goes through the host.
local function put_all(writer, entries)
  for _, e in ipairs(entries) do
    local t, owned = e.tensor, false
    if e.produce ~= nil then
      t, owned = produced(e), true
    elseif t:pool() ~= "host" then
      t, owned = t:to("host"), true
    end
    local status = C.l2l_safetensors_put(writer, t:data(), bytes_of(t:dtype(), t:numel()))
    if owned then t:free() end
    if status ~= 0 then error(lib.last_error(), 0) end
  end
end

function M.write(path, entries, metadata, ...)
  local fname = "safetensors.write"
  if select("#", ...) ~= 0 then too_many(fname, "path, entries, metadata", 2, ...) end
  if not c_string(path) or path == "" then error(fname .. ": path must be a non-empty string", 2) end
  if type(entries) ~= "table" then error(fname .. ": entries must be a list of {name =, tensor =}", 2) end
  local specs = specs_of(entries, fname, 2)
  local meta, pairs_n = metadata_of(metadata, fname, 2)
  local box = ffi.new("l2l_safetensors_writer *[1]")
  if C.l2l_safetensors_create(box, path, 1, specs, #entries, meta, pairs_n) ~= 0 then failed(fname, 2) end
  local writer = box[0]
  local ok, err = pcall(put_all, writer, entries)
  if not ok then
    C.l2l_safetensors_abandon(writer)
    error(fname .. ": " .. tostring(err), 2)
  end
  if C.l2l_safetensors_commit(writer) ~= 0 then failed(fname, 2) end
end

----------------------------------------------------------------- reading

local File = {}
File.__index = File

-- The file's lists as Lua tables: names in the data's order, entries by name, metadata.
local function tables_of(file, handle)
  local info = ffi.new("l2l_safetensors_info")
  assert(C.l2l_safetensors_get_info(info, handle) == 0, "l2l_safetensors_get_info")
  file.data_start = tonumber(info.data_start)
  local e = ffi.new("l2l_safetensors_entry")
  for i = 0, info.tensors - 1 do
    assert(C.l2l_safetensors_get_entry(e, handle, i) == 0, "l2l_safetensors_get_entry")
    local shape = {}
    for d = 0, e.ndim - 1 do shape[d + 1] = tonumber(e.shape[d]) end
    local name = ffi.string(e.name)
    file.names[i + 1] = name
    file.entries[name] = { name = name, dtype = lib.dtype_names[tonumber(e.dtype)], stored_dtype = ffi.string(e.stored_dtype),
                           shape = shape, numel = tonumber(e.numel), offset = tonumber(e.offset), bytes = tonumber(e.bytes) }
  end
  local key, value = ffi.new("const char *[1]"), ffi.new("const char *[1]")
  for i = 0, info.metadata - 1 do
    assert(C.l2l_safetensors_get_metadata(key, value, handle, i) == 0, "l2l_safetensors_get_metadata")
    file.metadata[ffi.string(key[0])] = ffi.string(value[0])
  end
end

-- A file opened, checked and listed; errors under fname, raised at level (0: no position).
-- caller: the name its methods' errors go under too (nil: their own).
local function open_file(path, fname, level, caller)
  if not c_string(path) or path == "" then error(fname .. ": path must be a non-empty string", level) end
  local box = ffi.new("l2l_safetensors *[1]")
  if C.l2l_safetensors_open(box, path) ~= 0 then failed(fname, level) end
  local handle = ffi.gc(box[0], C.l2l_safetensors_close)   -- closed by file:close(), or the collector
  local file = setmetatable({ path = path, handle = handle, entries = {}, names = {}, metadata = {},
                              caller = caller }, File)
  tables_of(file, handle)
  return file
end

-- Opens and checks a file; raises "safetensors.open: <path>: <what is wrong>".
function M.open(path, ...)
  if select("#", ...) ~= 0 then too_many("safetensors.open", "path", 2, ...) end
  local file = open_file(path, "safetensors.open", 3)   -- not a tail call: the levels count this frame
  return file
end

-- The same for a loader of the front end (l2l.load, l2l.import_gpt2): the file's errors,
-- its reads' and checks' too, are the loader's words ("l2l.load: <path>: ..."), raised
-- with no position, as the loader raises its own.
function M.open_as(fname, path, ...)
  if select("#", ...) ~= 0 then too_many("safetensors.open_as", "fname, path", 2, ...) end
  if not c_string(fname) or fname == "" then
    error("safetensors.open_as: fname must be a non-empty string (the loader's name)", 2)
  end
  return open_file(path, fname, 0, fname)
end

-- The name a method's errors go under and the level they are raised at: the opener's, at
-- no position, for a file open_as opened; else the method's own, at its caller's line.
local function named(self, method)
  if getmetatable(self) == File and self.caller then return self.caller, 0 end
  return method, 2
end

local function open_self(self, fname, level)
  level = level == 0 and 0 or level + 1
  if getmetatable(self) ~= File then error(fname .. ": self must be an open file", level) end
  if self.handle == nil then error(fname .. ": the file was closed", level) end
end

-- file:read(name [, into]) -> the tensor, in the host pool; `into` (a host or pinned
-- tensor of the entry's element count; f32, f16 or bf16 for a float entry) receives it
-- instead of a new one.
function File:read(name, into, ...)
  local fname, level = named(self, "file:read")
  if select("#", ...) ~= 0 then too_many(fname, "name, into", 2, ...) end
  open_self(self, fname, level)
  local e = self.entries[name]
  if e == nil then error(("%s: %s has no tensor '%s'"):format(fname, self.path, tostring(name)), level) end
  if e.numel == 0 then
    error(("%s: '%s' of %s is empty (shape {%s}): an l2l tensor holds at least one element"):format(
      fname, name, self.path, table.concat(e.shape, ", ")), level)
  end
  if e.dtype == nil then
    error(("%s: '%s' of %s is %s, which l2l does not read"):format(fname, name, self.path, e.stored_dtype), level)
  end
  local t = into
  if t == nil then
    t = tensor.empty(#e.shape > 0 and e.shape or { 1 }, { dtype = e.dtype })
  elseif not tensor.is_tensor(t) or t:numel() ~= e.numel or (t:pool() ~= "host" and t:pool() ~= "pinned") then
    error(("%s: into must be a host tensor of %d elements for '%s'"):format(fname, e.numel, name), level)
  end
  if C.l2l_safetensors_read(t:data(), lib.dtypes[t:dtype()], e.numel, self.handle, name) ~= 0 then
    local why = lib.last_error()
    if into == nil then t:free() end
    error(fname .. ": " .. why, level)
  end
  lib.plain_nans(t)
  return t
end

-- file:verify(): every tensor that has a checksum against it (read in pieces, no tensor
-- made): an error naming the first damaged one.
function File:verify(...)
  local fname, level = named(self, "file:verify")
  if select("#", ...) ~= 0 then too_many(fname, "", 2, ...) end
  open_self(self, fname, level)
  if C.l2l_safetensors_verify(self.handle) ~= 0 then failed(fname, level) end
end

function File:close(...)
  if select("#", ...) ~= 0 then too_many("file:close", "", 2, ...) end
  if self.handle ~= nil then
    C.l2l_safetensors_close(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

M.File = File

return M
