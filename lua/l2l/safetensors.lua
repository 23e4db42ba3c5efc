-- SPDX-License-Identifier: MIT
-- l2l.safetensors — reading and writing tensors in the safetensors format, atomically.
--
--   safetensors.write(path, { {name =, tensor =}, ... } [, metadata = {key = "string"}])
--     (an entry may instead give {name =, shape =, dtype =, produce = function}: produce()
--     returns a host tensor of that shape and dtype when its bytes are written, which the
--     writer frees then: a file larger than memory is written one tensor at a time)
--   local file = safetensors.open(path)      -- header read and checked, data not yet
--   file.names, file.entries[name] = {dtype =, shape =, offset =, bytes =}, file.metadata
--   file:read(name [, into]) -> a host tensor (into: an existing tensor of that shape)
--   file:verify()                            -- every tensor against its checksum
--   file:close()
--
-- The format (as Hugging Face defines it): an unsigned 64-bit little-endian header length
-- N, N bytes of JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
-- ..., "__metadata__": {"key": "string value"}}, then the raw little-endian data, offsets
-- counted from its start. The header is padded with spaces to a multiple of 8 bytes so
-- every tensor's data stays aligned.
-- Purpose: one place that knows the byte layout, for checkpoints (l2l.checkpoint) and
-- imports (l2l.gpt2). Writing goes to a temporary file in the same folder, fsync, rename,
-- fsync of the folder: a crash or kill at any moment leaves either the old file or the
-- new one whole (and the next save to that path removes a killed save's temporary). The
-- temporary is made new (O_CREAT | O_EXCL | O_NOFOLLOW), readable by its owner alone
-- until it is renamed (then it takes the mode a plain create gives, 0666 less the
-- umask): a link or file planted at its name, which is predictable, is never followed or
-- written; the save takes another name beside it instead.
-- Reading checks the whole header against the file's size before any data is read
-- (valid UTF-8 JSON, lengths, offsets inside the file, no overlaps or holes, dtypes and
-- ranks l2l has, element counts matching the byte ranges), so a damaged, truncated or
-- foreign file is a clear error naming the file, never a crash or a read out of bounds.
-- Checksums: write puts an XXH3-64 hash of each tensor's bytes (xxHash, Debian's
-- libxxhash0) in the metadata, under "l2l_xxh3" (a JSON object: name -> 16 hex digits,
-- written in lower case and read in either: always of the tensors written: one given in
-- metadata is replaced);
-- read checks a tensor's bytes against it, and verify checks them all before anything is
-- read into a model, so that damaged data is an error naming the tensor, not a run that
-- goes on with it. A file without checksums (another tool's, an import) still reads.
-- JSON goes through lua-cjson (Debian's lua-cjson), never by hand.
-- Must never: leave a partial file under the final name, or trust a number from a file
-- before checking it.
local ffi = require("ffi")
local cjson = require("cjson").new()   -- a private instance: its settings are ours
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local filesys = require("l2l.filesys")
local tensor = require("l2l.tensor")

local C = ffi.C
local type, tostring, ipairs, pairs, floor, select = type, tostring, ipairs, pairs, math.floor, select
local too_many = argcheck.too_many

-- libc, with FILE kept opaque (other modules may declare FILE differently).
ffi.cdef [[
void *fopen(const char *path, const char *mode);
int fclose(void *stream);
size_t fread(void *ptr, size_t size, size_t n, void *stream);
size_t fwrite(const void *ptr, size_t size, size_t n, void *stream);
int fflush(void *stream);
int fileno(void *stream);
int fseeko(void *stream, int64_t offset, int whence);
int64_t ftello(void *stream);
int fsync(int fd);
int open(const char *path, int flags, ...);
int close(int fd);
int rename(const char *from, const char *to);
int unlink(const char *path);
int getpid(void);
char *strerror(int errnum);
int gethostname(char *name, size_t len);
int kill(int pid, int sig);
]]

for _, decl in ipairs({   -- one at a time: another module may have declared one already
  "void *fdopen(int fd, const char *mode);",
  "int fchmod(int fd, unsigned int mode);",
}) do pcall(ffi.cdef, decl) end

-- xxHash (Debian's libxxhash0), opened at the first checksum.
ffi.cdef [[
typedef struct XXH3_state_s XXH3_state_t;
uint64_t XXH3_64bits(const void *data, size_t len);
XXH3_state_t *XXH3_createState(void);
int XXH3_freeState(XXH3_state_t *state);
int XXH3_64bits_reset(XXH3_state_t *state);
int XXH3_64bits_update(XXH3_state_t *state, const void *data, size_t len);
uint64_t XXH3_64bits_digest(const XXH3_state_t *state);
]]
local xxhash_lib
local function xxhash()
  if xxhash_lib == nil then
    local ok, loaded = pcall(ffi.load, "libxxhash.so.0")
    if not ok then
      error("checksums need xxHash's library (Debian's libxxhash0; scripts/deps.sh installs it): " .. tostring(loaded), 0)
    end
    xxhash_lib = loaded
  end
  return xxhash_lib
end
local function hex64(h) return bit.tohex(h, 16) end
local CHECKSUMS = "l2l_xxh3"   -- the metadata key

local M = {}

-- safetensors dtype <-> l2l dtype and element size. (The format's other dtypes, e.g.
-- F64 or I64, are refused by name when read.)
local DTYPES = { F32 = "f32", F16 = "f16", BF16 = "bf16", I32 = "i32", U8 = "u8" }
local SIZES = { f32 = 4, f16 = 2, bf16 = 2, i32 = 4, u8 = 1 }
local FORMAT_NAMES = {}
for st, l in pairs(DTYPES) do FORMAT_NAMES[l] = st end
M.format_dtype = FORMAT_NAMES

-- The largest header l2l reads or writes: 16 MiB. The format allows 100 MiB, but decoding
-- JSON into Lua tables takes about 32 bytes a byte of header (a 100 MB header cost 3 GB
-- before any check), and real headers are small: GPT-2 1.5B's is under 100 KB, and an l2l
-- checkpoint's about 4 KB a block (404,368 bytes for 100 blocks with AdamW: 16 MiB holds
-- 4,000). 16 MiB bounds a read at about 0.5 GB.
local MAX_HEADER = 16 * 2^20
M.max_header = MAX_HEADER
local MAX_DIMS = 4               -- l2l's tensors (L2L_MAX_DIMS)
local SEEK_SET, SEEK_END = 0, 2
-- open(2)'s flags, which differ between Linux's architectures (x86's, the generic ones of
-- ARM and POWER, MIPS's)
local OPEN_FLAGS = ({
  arm = "generic", arm64 = "generic", arm64be = "generic", ppc = "generic", ppcspe = "generic",
  mips = "mips", mipsel = "mips", mips64 = "mips", mips64el = "mips",
})[ffi.arch] or "x86"
local O = ({
  x86 = { CREAT = 0x40, EXCL = 0x80, NOFOLLOW = 0x20000, DIRECTORY = 0x10000 },
  generic = { CREAT = 0x40, EXCL = 0x80, NOFOLLOW = 0x8000, DIRECTORY = 0x4000 },
  mips = { CREAT = 0x100, EXCL = 0x400, NOFOLLOW = 0x20000, DIRECTORY = 0x10000 },
})[OPEN_FLAGS]
local O_RDONLY, O_WRONLY, O_CLOEXEC, O_DIRECTORY = 0, 1, 0x80000, O.DIRECTORY
local EEXIST = 17

local function os_error(what, path)
  local e = ffi.errno()
  return ("%s %s: %s"):format(what, path, ffi.string(C.strerror(e)))
end

----------------------------------------------------------------- writing

local function u64_le(n)
  local bytes = {}
  for i = 1, 8 do
    bytes[i] = string.char(n % 256)
    n = floor(n / 256)
  end
  return table.concat(bytes)
end

local function folder_of(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local ESRCH = 3   -- kill(pid, 0): no such process

local function host_name()
  local buf = ffi.new("char[256]")
  if C.gethostname(buf, 255) ~= 0 then return "host" end
  return (ffi.string(buf):gsub("[^%w%-]", "_"))
end

-- The temporary name of a save: "<path>.tmp.<host>.<pid>", so that a sweep knows whose it
-- is; where something is there already, "<path>.tmp.<host>.<pid>.<8 random hex digits>".
local function temporary_name(path) return ("%s.tmp.%s.%d"):format(path, host_name(), C.getpid()) end

local function random_hex()
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(4)
  if f then f:close() end
  if bytes == nil or #bytes ~= 4 then   -- (no /dev/urandom: the clock, not the script's math.random)
    return bit.tohex(bit.bxor(math.floor(os.clock() * 1e9), os.time()), 8)
  end
  return bit.tohex(bytes:byte(1) * 2 ^ 24 + bytes:byte(2) * 2 ^ 16 + bytes:byte(3) * 2 ^ 8 + bytes:byte(4), 8)
end

-- The mode a plain create gives: 0666 less the process's umask (read, not set: umask(2)
-- would change it for every thread while it is asked).
local function created_mode()
  local f = io.open("/proc/self/status", "r")
  local text = f and f:read("*a") or ""
  if f then f:close() end
  local mask = tonumber(text:match("\nUmask:%s*(%d+)") or "022", 8)
  return bit.band(438, bit.bnot(mask))   -- 438 = 0666
end

-- The temporary file of a save to `path`, made new for this save alone: its name and an
-- open FILE, or nil and why. O_EXCL | O_NOFOLLOW: a symbolic link (or anything) planted at
-- the name is neither followed nor written; another name is tried beside it. Mode 0600
-- until it is renamed.
local function create_temporary(path)
  local first = temporary_name(path)
  local flags = O_WRONLY + O.CREAT + O.EXCL + O.NOFOLLOW + O_CLOEXEC
  for try = 0, 8 do
    local name = try == 0 and first or ("%s.%s"):format(first, random_hex())
    local fd = C.open(name, flags, ffi.new("unsigned int", 384))   -- 384 = 0600
    if fd >= 0 then
      local f = C.fdopen(fd, "wb")
      if f == nil then
        local why = os_error("cannot open", name)
        C.close(fd)
        C.unlink(name)
        return nil, why
      end
      return name, f, fd
    end
    if ffi.errno() ~= EEXIST then return nil, os_error("cannot create", name) end
  end
  return nil, ("cannot create %s or 8 other names beside it: something is there already (a file or "
               .. "link this save did not make); nothing was written"):format(first)
end

-- Removes what saves to `path` on this host left behind when they were killed (a kill -9
-- cannot clean up): "<path>.tmp.<host>.<pid>[.<hex>]" files whose process is gone. A live
-- process's file (a save in progress elsewhere) and other hosts' files (a shared
-- folder) are left alone.
local function sweep_temporaries(path)
  local folder, base = folder_of(path), path:match("[^/]*$")
  local prefix = ("%s.tmp.%s."):format(base, host_name())
  local stale = {}
  for _, entry in ipairs(filesys.list_folder(folder) or {}) do
    local name = entry.name
    local rest = name:sub(1, #prefix) == prefix and name:sub(#prefix + 1)
    local pid = rest and tonumber(rest:match("^%d+$") or rest:match("^(%d+)%.%x+$"))
    if pid and pid ~= C.getpid() and C.kill(pid, 0) ~= 0 and ffi.errno() == ESRCH then
      stale[#stale + 1] = folder .. "/" .. name
    end
  end
  for _, name in ipairs(stale) do C.unlink(name) end
end

-- The file's data must reach the disk before the rename makes it the file; the folder's
-- entry must reach it after, or a power cut could bring back the old name.
local function sync_folder(folder)
  local fd = C.open(folder, O_RDONLY + O_DIRECTORY)
  if fd >= 0 then
    C.fsync(fd)
    C.close(fd)
  end
end

-- entries: { {name = string, tensor = host or device tensor}, ... } in file order;
-- metadata: a table of string values (or nil).
local ENTRY_FIELDS = { name = true, tensor = true, shape = true, dtype = true, produce = true }

-- An entry made when written: its shape and dtype checked now (d gets them).
local function lazy_entry(e, d)
  if type(e.produce) ~= "function" then error("produce must be a function", 0) end
  if e.tensor ~= nil then error("give a tensor or produce, not both", 0) end
  if SIZES[e.dtype] == nil then error("dtype must be f32, f16, bf16, i32 or u8, got " .. argcheck.describe(e.dtype), 0) end
  if type(e.shape) ~= "table" or #e.shape < 1 or #e.shape > MAX_DIMS then
    error("shape must be a list of 1 to " .. MAX_DIMS .. " sizes", 0)
  end
  local n = 1
  for _, v in ipairs(e.shape) do
    if type(v) ~= "number" or v < 1 or v ~= floor(v) or v >= 2 ^ 53 then
      error("shape must hold whole sizes >= 1, got " .. argcheck.describe(v), 0)
    end
    n = n * v
  end
  d.shape, d.dtype, d.bytes = e.shape, e.dtype, n * SIZES[e.dtype]
end

-- What a lazy entry's produce() returned, checked against what the header said.
local function produced(d, name)
  local ok, t = pcall(d.produce)
  if not ok then error(("entry '%s': %s"):format(name, tostring(t)), 0) end
  local same = tensor.is_tensor(t) and t:pool() == "host" and t:dtype() == d.dtype and #t:shape() == #d.shape
  for k = 1, same and #d.shape or 0 do same = same and t:shape()[k] == d.shape[k] end
  if not same then
    if tensor.is_tensor(t) then t:free() end
    error(("entry '%s': produce must return a host tensor of %s and shape {%s}"):format(
      name, d.dtype, table.concat(d.shape, ", ")), 0)
  end
  return t
end

function M.write(path, entries, metadata, ...)
  local fname = "safetensors.write"
  if select("#", ...) ~= 0 then too_many(fname, "path, entries, metadata", 2, ...) end
  if type(path) ~= "string" or path == "" then error(fname .. ": path must be a non-empty string", 2) end
  if type(entries) ~= "table" then error(fname .. ": entries must be a list of {name =, tensor =}", 2) end
  local header, offset, seen = {}, 0, {}
  local datas = {}
  for i, e in ipairs(entries) do
    if type(e) ~= "table" or type(e.name) ~= "string" or e.name == "" or e.name == "__metadata__" then
      error(("%s: entry %d must have a name (a non-empty string other than __metadata__)"):format(fname, i), 2)
    end
    local what = ("entry %d ('%s')"):format(i, e.name)
    argcheck.fields(e, ENTRY_FIELDS, fname, 2, what)
    if seen[e.name] then error(("%s: name '%s' appears twice"):format(fname, e.name), 2) end
    seen[e.name] = true
    local d = { produce = e.produce }
    if e.produce ~= nil then   -- made when written: its shape and dtype now
      local ok, why = pcall(lazy_entry, e, d)
      if not ok then error(("%s: %s: %s"):format(fname, what, why), 2) end
    else
      local t = e.tensor
      if not tensor.is_tensor(t) then error(("%s: entry '%s' has no tensor"):format(fname, e.name), 2) end
      if e.shape ~= nil or e.dtype ~= nil then
        error(("%s: %s: shape and dtype go with produce (a tensor given is written as it is)"):format(fname, what), 2)
      end
      if t:pool() ~= "host" then t = t:to("host") end
      d.t, d.shape, d.dtype, d.bytes = t, t:shape(), t:dtype(), t:numel() * SIZES[t:dtype()]
    end
    header[e.name] = { dtype = FORMAT_NAMES[d.dtype], shape = d.shape,
                       data_offsets = { offset, offset + d.bytes } }
    datas[#datas + 1] = d
    offset = offset + d.bytes
  end
  local meta = {}
  if metadata ~= nil then
    if type(metadata) ~= "table" then error(fname .. ": metadata must be a table of strings", 2) end
    for k, v in pairs(metadata) do
      if type(k) ~= "string" or type(v) ~= "string" then
        error(fname .. ": metadata must map strings to strings (encode other values as JSON)", 2)
      end
      meta[k] = v   -- (CHECKSUMS, copied from another file, is replaced below)
    end
  end
  local ok_x, x = pcall(xxhash)
  if not ok_x then error(fname .. ": " .. tostring(x), 2) end
  -- A tensor made when written has its sum once it is: the header goes out with 16 zeros
  -- in its place and is written again at the end, the same length (the same tables, each
  -- sum 16 hex digits, so cjson lays them out alike).
  local sums = {}
  for i, e in ipairs(entries) do
    sums[e.name] = datas[i].t and hex64(x.XXH3_64bits(datas[i].t:data(), datas[i].bytes)) or ("0"):rep(16)
  end
  local function header_json()
    meta[CHECKSUMS] = cjson.encode(sums)
    header.__metadata__ = meta
    local json = cjson.encode(header)
    return json .. (" "):rep((8 - #json % 8) % 8)
  end
  local json = header_json()
  if #json > MAX_HEADER then   -- a file l2l could not read back is not written
    error(("%s: the header would be %d bytes, over the %d l2l reads (%d tensors; metadata %s)")
          :format(fname, #json, MAX_HEADER, #entries, metadata and "given" or "none"), 2)
  end

  sweep_temporaries(path)
  local tmp, f, fd = create_temporary(path)
  if tmp == nil then error(fname .. ": " .. f, 2) end
  local ok, err = pcall(function()
    local function put(ptr, n)
      if n > 0 and C.fwrite(ptr, 1, n, f) ~= n then error(os_error("cannot write", tmp), 0) end
    end
    local head = u64_le(#json) .. json
    put(head, #head)
    local lazy = false
    for i, d in ipairs(datas) do
      if d.produce then
        lazy = true
        local t = produced(d, entries[i].name)
        local ok, err = pcall(put, t:data(), d.bytes)
        if ok then sums[entries[i].name] = hex64(x.XXH3_64bits(t:data(), d.bytes)) end
        t:free()
        if not ok then error(err, 0) end
      else
        put(d.t:data(), d.bytes)
      end
    end
    if lazy then
      local again = header_json()
      assert(#again == #json, "the header changed length with its checksums")
      if C.fseeko(f, 0, SEEK_SET) ~= 0 then error(os_error("cannot seek in", tmp), 0) end
      head = u64_le(#again) .. again
      put(head, #head)
    end
    if C.fflush(f) ~= 0 then error(os_error("cannot write", tmp), 0) end
    if C.fchmod(fd, created_mode()) ~= 0 then error(os_error("cannot set the mode of", tmp), 0) end
    if C.fsync(fd) ~= 0 then error(os_error("cannot sync", tmp), 0) end
  end)
  if C.fclose(f) ~= 0 and ok then ok, err = false, os_error("cannot close", tmp) end
  if ok and C.rename(tmp, path) ~= 0 then ok, err = false, os_error("cannot rename to", path) end
  if not ok then
    C.unlink(tmp)
    error(fname .. ": " .. tostring(err), 2)
  end
  sync_folder(folder_of(path))
end

----------------------------------------------------------------- reading

-- Where `text` stops being UTF-8 (a byte offset), or nil when it all is. JSON is UTF-8
-- (RFC 8259), and lua-cjson passes any bytes through: names and metadata read from a
-- file would otherwise carry bytes no UTF-8 reader accepts. Overlong forms, surrogates
-- and code points past U+10FFFF are refused as the standard says.
local function utf8_error(text)
  local i = text:find("[\128-\255]")   -- ASCII runs are skipped by find, not walked
  while i do
    local c = text:byte(i)
    local len, lo, hi = 0, 0x80, 0xBF   -- continuation bytes; lo/hi bound the first one
    if c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
    else return i end
    for k = 1, len - 1 do
      local b = text:byte(i + k)
      if b == nil or b < (k == 1 and lo or 0x80) or b > (k == 1 and hi or 0xBF) then return i end
    end
    i = text:find("[\128-\255]", i + len)
  end
  return nil
end

local File = {}
File.__index = File

-- A non-negative integer that a double holds exactly.
local function count(v) return type(v) == "number" and v >= 0 and v == floor(v) and v < 2^53 end

local function check_entry(name, e, data_len, bad)
  if type(e) ~= "table" then bad("entry '%s' is not an object", name) end
  local dtype = DTYPES[e.dtype]
  if dtype == nil then bad("entry '%s' has dtype %s, which l2l does not read", name, tostring(e.dtype)) end
  if type(e.shape) ~= "table" then bad("entry '%s' has no shape list", name) end
  local numel = 1
  for i, d in ipairs(e.shape) do
    if not count(d) then bad("entry '%s': shape[%d] = %s is not a size", name, i, tostring(d)) end
    if d == 0 then bad("entry '%s': shape[%d] = 0: l2l's tensors have no empty dimension", name, i) end
    numel = numel * d
    if numel > 2 ^ 48 then   -- l2l's tensors' limit (src/core/tensor.c), and exact here
      bad("entry '%s': shape (%s) has more than 2^48 elements", name, table.concat(e.shape, ", ", 1, i))
    end
  end
  if #e.shape > MAX_DIMS then
    bad("entry '%s' has %d dimensions; l2l's tensors have at most %d", name, #e.shape, MAX_DIMS)
  end
  local o = e.data_offsets
  if type(o) ~= "table" or #o ~= 2 or not count(o[1]) or not count(o[2]) or o[2] < o[1] then
    bad("entry '%s' has bad data_offsets", name)
  end
  if o[2] > data_len then
    bad("entry '%s' ends at byte %d of the data but the file holds %d (truncated?)", name, o[2], data_len)
  end
  if o[2] - o[1] ~= numel * SIZES[dtype] then
    bad("entry '%s': %.0f bytes for %.0f %s elements", name, o[2] - o[1], numel, dtype)
  end
  local shape = {}
  for i, d in ipairs(e.shape) do shape[i] = d end
  return { dtype = dtype, shape = shape, numel = numel, offset = o[1], bytes = o[2] - o[1] }
end

-- Opens and checks a file; raises "safetensors.open: <path>: <what is wrong>".
function M.open(path, ...)
  local fname = "safetensors.open"
  if select("#", ...) ~= 0 then too_many(fname, "path", 2, ...) end
  if type(path) ~= "string" or path == "" then error(fname .. ": path must be a non-empty string", 2) end
  local function bad(fmt, ...) error(("%s: %s: " .. fmt):format(fname, path, ...), 0) end
  local regular, why = filesys.regular_file(path)
  if not regular then error(("%s: cannot open %s: %s"):format(fname, path, why), 2) end
  local f = C.fopen(path, "rb")
  if f == nil then error(fname .. ": " .. os_error("cannot open", path), 2) end
  f = ffi.gc(f, C.fclose)   -- closed by file:close(), or by the collector if forgotten
  local ok, result = pcall(function()
    if C.fseeko(f, 0, SEEK_END) ~= 0 then bad("cannot seek") end
    local size = tonumber(C.ftello(f))
    C.fseeko(f, 0, SEEK_SET)
    if size < 8 then bad("%d bytes: too short to be a safetensors file", size) end
    local len8 = ffi.new("uint8_t[8]")
    if C.fread(len8, 1, 8, f) ~= 8 then bad("cannot read the header length") end
    local n = 0
    for i = 7, 0, -1 do n = n * 256 + len8[i] end
    if n < 2 then bad("header length %.0f is not plausible: not a safetensors file", n) end
    if n > 100 * 2^20 then   -- the format's own limit
      bad("header length %.0f is over the format's 100 MiB: not a safetensors file", n)
    end
    if n > MAX_HEADER then
      bad("header of %.0f bytes is over the %d bytes l2l reads (GPT-2 1.5B's is under 100 KB)", n, MAX_HEADER)
    end
    if 8 + n > size then bad("header of %d bytes but the file has %d (truncated)", n, size) end
    local buf = ffi.new("char[?]", n)
    if C.fread(buf, 1, n, f) ~= n then bad("cannot read the header") end
    local text = ffi.string(buf, n)
    local at = utf8_error(text)
    if at then bad("the header is not valid UTF-8 (byte %d of it)", at) end
    local okj, header = pcall(cjson.decode, text)
    if not okj and tostring(header):find("not enough memory", 1, true) then
      bad("out of memory decoding the %d-byte header", n)
    end
    if not okj or type(header) ~= "table" then bad("the header is not a JSON object: not a safetensors file (or damaged)") end
    local file = setmetatable({ path = path, handle = f, data_start = 8 + n, entries = {}, names = {},
                                metadata = {} }, File)
    local data_len = size - 8 - n
    local list = {}
    for name, e in pairs(header) do
      if name == "__metadata__" then
        if type(e) ~= "table" then bad("__metadata__ is not an object") end
        for k, v in pairs(e) do
          if type(v) ~= "string" then bad("__metadata__.%s is not a string", tostring(k)) end
          file.metadata[k] = v
        end
      else
        local entry = check_entry(name, e, data_len, bad)
        entry.name = name
        file.entries[name] = entry
        list[#list + 1] = entry
      end
    end
    -- The data is the entries' byte ranges end to end: no overlaps, no holes.
    table.sort(list, function(a, b) return a.offset < b.offset or (a.offset == b.offset and a.bytes < b.bytes) end)
    local at = 0
    for _, e in ipairs(list) do
      if e.offset ~= at then
        bad("entry '%s' starts at byte %d of the data, expected %d (overlap or hole)", e.name, e.offset, at)
      end
      at = e.offset + e.bytes
      file.names[#file.names + 1] = e.name
    end
    if at ~= data_len then bad("%d bytes of data after the last tensor", data_len - at) end
    local sums = file.metadata[CHECKSUMS]
    if sums ~= nil then
      local okc, decoded = pcall(cjson.decode, sums)
      if not okc or type(decoded) ~= "table" then bad("the checksums (__metadata__.%s) are damaged", CHECKSUMS) end
      for name, h in pairs(decoded) do
        if file.entries[name] == nil or type(h) ~= "string" or not h:match("^%x+$") or #h ~= 16 then
          bad("the checksums (__metadata__.%s) are damaged at '%s'", CHECKSUMS, tostring(name))
        end
        -- a sum is the number its hex digits write, whose case means nothing: one a tool
        -- wrote in capitals is the same sum (compared in write's lower case), not damage
        decoded[name] = h:lower()
      end
      file.checksums = decoded
    end
    return file
  end)
  if not ok then
    C.fclose(ffi.gc(f, nil))
    error(result, 2)
  end
  return result
end

-- The message for a tensor whose bytes are not what was written.
local function damaged(file, name, got, want, fname)
  return ("%s: %s: tensor '%s' is damaged: its bytes hash to %s, the file says %s (xxh3-64)"):format(
    fname, file.path, name, got, want)
end

-- file:read(name [, into]) -> the tensor, in the host pool. `into` (a host tensor of the same dtype and element count) receives it instead of a new one.
function File:read(name, into, ...)
  local fname = "file:read"
  if select("#", ...) ~= 0 then too_many(fname, "name, into", 2, ...) end
  if getmetatable(self) ~= File then error(fname .. ": self must be an open file", 2) end
  if self.handle == nil then error(fname .. ": the file was closed", 2) end
  local e = self.entries[name]
  if e == nil then error(("%s: %s has no tensor '%s'"):format(fname, self.path, tostring(name)), 2) end
  local t = into
  if t == nil then
    t = tensor.empty(#e.shape > 0 and e.shape or { 1 }, { dtype = e.dtype })
  elseif not tensor.is_tensor(t) or t:dtype() ~= e.dtype or t:numel() ~= e.numel or t:pool() ~= "host" then
    error(("%s: into must be a host %s tensor of %d elements for '%s'"):format(
      fname, e.dtype, e.numel, name), 2)
  end
  if e.bytes > 0 then
    if C.fseeko(self.handle, self.data_start + e.offset, SEEK_SET) ~= 0
       or C.fread(t:data(), 1, e.bytes, self.handle) ~= e.bytes then
      error(("%s: %s: cannot read '%s' (the file changed or is damaged)"):format(fname, self.path, name), 2)
    end
  end
  local want = self.checksums and self.checksums[name]
  if want then   -- the bytes as stored, before plain_nans
    local ok_x, x = pcall(xxhash)
    if not ok_x then error(fname .. ": " .. tostring(x), 2) end
    local got = hex64(x.XXH3_64bits(t:data(), e.bytes))
    if got ~= want then error(damaged(self, name, got, want, fname), 2) end
  end
  if e.bytes > 0 then lib.plain_nans(t) end
  return t
end

-- file:verify(): every tensor that has a checksum against it, reading the data in pieces
-- (no tensor is made): an error naming the first damaged one.
function File:verify(...)
  local fname = "file:verify"
  if select("#", ...) ~= 0 then too_many(fname, "", 2, ...) end
  if getmetatable(self) ~= File then error(fname .. ": self must be an open file", 2) end
  if self.handle == nil then error(fname .. ": the file was closed", 2) end
  if self.checksums == nil then return end
  local ok_x, x = pcall(xxhash)
  if not ok_x then error(fname .. ": " .. tostring(x), 2) end
  local state = ffi.gc(x.XXH3_createState(), x.XXH3_freeState)
  local piece = 4 * 2 ^ 20
  local buf = ffi.new("uint8_t[?]", piece)
  for _, name in ipairs(self.names) do
    local want = self.checksums[name]
    if want then
      local e = self.entries[name]
      x.XXH3_64bits_reset(state)
      if C.fseeko(self.handle, self.data_start + e.offset, SEEK_SET) ~= 0 then
        error(("%s: %s: cannot read '%s' (the file changed or is damaged)"):format(fname, self.path, name), 2)
      end
      local left = e.bytes
      while left > 0 do
        local n = left < piece and left or piece
        if C.fread(buf, 1, n, self.handle) ~= n then
          error(("%s: %s: cannot read '%s' (the file changed or is damaged)"):format(fname, self.path, name), 2)
        end
        x.XXH3_64bits_update(state, buf, n)
        left = left - n
      end
      local got = hex64(x.XXH3_64bits_digest(state))
      if got ~= want then error(damaged(self, name, got, want, fname), 2) end
    end
  end
end

function File:close(...)
  if select("#", ...) ~= 0 then too_many("file:close", "", 2, ...) end
  if self.handle ~= nil then
    C.fclose(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

M.File = File

return M
