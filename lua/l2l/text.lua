-- SPDX-License-Identifier: MIT
-- l2l.text — a byte-level text corpus for the examples: load it, split it, draw batches.
--
--   local text = require("l2l.text")
--   local corpus = text.load()                     -- or text.load({ "notes.txt", "src/" })
--   local train, valid = text.split(corpus, 0.1)   -- the last 10 % for validation
--   local tokens, targets = text.batch(train, 16, 64, seed, step)   -- (16,64) i32 each
--
-- text.files(root [, {pattern =}]) -> { path, ... }: the regular files under `root` (a file
--   or a folder, whose sub-folders are walked), sorted bytewise. Inside a folder, names
--   that start with "." (.git, editor files) and symbolic links are left out (a link can
--   neither loop nor read a file twice); `pattern`, a Lua pattern, keeps the files whose
--   name (not path) matches it. `root` itself may be a link.
-- text.corpus([paths [, {max_bytes = 4 MiB, order = "mixed" | "path", pattern =}]]) ->
--   { text =, files = (how many were read), ends = {end offset of each file read},
--   description = }: the files under each of `paths` (a file or folder, or a list of them),
--   joined in a fixed order up to max_bytes. "mixed" orders them by a hash of their paths
--   (a capped corpus still mixes many folders: bytewise order would read linux/ for
--   megabytes), "path" bytewise. Inside folders, empty files and files with a NUL byte
--   (not text) are skipped; a file named in `paths` is read whatever it holds. Without
--   paths: the C headers under /usr/include, else (a machine without them) l2l's own
--   sources beside this module, so the default works from any folder and any install.
-- text.load([paths [, max_bytes = 400000]]) -> string: text.corpus(paths, {max_bytes =
--   max_bytes}).text.
-- text.split(s, fraction) -> train, valid: the last `fraction` of s is the validation part.
-- text.batch(s, B, S, seed, step [, opts]) -> tokens, targets: B windows of S bytes (s a
--   string) or of S ids (s an i32 tensor of one dimension: a tokenized text) at
--   offsets drawn by l2l's counter-based generator keyed by (seed, step), so a batch
--   depends only on them; targets are the next bytes (targets[b][s] = tokens[b][s + 1]
--   within the text). opts.first: the first draw of the stream to use (several batches
--   from one stream); opts.tokens / opts.targets: (B,S) i32 tensors to fill instead of
--   new ones (a training loop reuses its own; with rank and size, of the slice's rows).
--   opts.rank, opts.size: data parallel (l2l.dist): this rank's rows of the global
--   minibatch of B, floor(rank B / size) up to floor((rank + 1) B / size), the samples
--   one process draws for those rows; B >= size.
-- text.printable(s) -> s for a terminal: what is valid UTF-8 as it is (a prompt's é, a
--   model's →), tabs and newlines too; each byte a terminal would act on (C0 and C1
--   controls: carriage returns, escapes) and each byte that is not valid UTF-8 (a partly
--   trained byte-level model writes many) as '?'.
-- Folders are read with opendir/readdir through the FFI (Linux, 64-bit): no shell, no
-- popen("find ..."), so a path may hold any character.
-- Must never: depend on the order a folder lists its files in, or draw from a generator
-- whose state other code shares (math.random): a run is repeatable from its seed.
local ffi = require("ffi")
local bit = require("bit")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local filesys = require("l2l.filesys")
local tensor = require("l2l.tensor")

local type, tostring, pairs, ipairs, floor, concat = type, tostring, pairs, ipairs, math.floor, table.concat
local select, too_many, describe = select, argcheck.too_many, argcheck.describe

local M = {}

----------------------------------------------------------------- folders

local DT_UNKNOWN, DT_DIR, DT_REG = filesys.DT_UNKNOWN, filesys.DT_DIR, filesys.DT_REG
local list_folder = filesys.list_folder

local function join(folder, name)
  return folder:sub(-1) == "/" and folder .. name or folder .. "/" .. name
end

-- Whether `path` is a regular file that can be opened (a FIFO or device is not read:
-- opening one can wait forever).
local function readable_file(path)
  if not filesys.regular_file(path) then return false end
  local f = io.open(path, "rb")
  if f == nil then return false end
  local ok = f:read(0) ~= nil or f:seek("end") ~= nil
  local _, err = f:read(1)
  f:close()
  return ok and err == nil
end

-- Appends the regular files under folder `path` to `out`; descends into sub-folders.
-- Entries whose type the file system does not give (DT_UNKNOWN) are told apart by trying
-- to open them as folders; a symbolic link is neither.
local function walk(path, pattern, out)
  local entries = list_folder(path)
  if entries == nil then return end
  for _, e in ipairs(entries) do
    if e.name:sub(1, 1) ~= "." then
      local full = join(path, e.name)
      local kind = e.type
      if kind == DT_UNKNOWN then
        kind = list_folder(full) and DT_DIR or (readable_file(full) and DT_REG or DT_UNKNOWN)
      end
      if kind == DT_DIR then
        walk(full, pattern, out)
      elseif kind == DT_REG and (pattern == nil or e.name:find(pattern)) then
        out[#out + 1] = full
      end
    end
  end
end

local FILES_OPTIONS = { pattern = true }

-- The files under root; nil and why when root is neither a readable file nor a folder.
local function files_under(root, pattern)
  if list_folder(root) then
    local out = {}
    walk(root, pattern, out)
    table.sort(out)
    return out, true
  end
  local regular, not_regular = filesys.regular_file(root)
  if not regular then return nil, not_regular end
  local f, why = io.open(root, "rb")
  if f == nil then   -- io.open's message starts with the path: the caller names it
    return nil, (why and why:sub(1, #root + 2) == root .. ": ") and why:sub(#root + 3) or why
  end
  f:close()
  return { root }, false
end

local function check_pattern(pattern, fname, what)
  if pattern ~= nil and (type(pattern) ~= "string" or not pcall(string.find, "", pattern)) then
    error(("%s: %s must be a Lua pattern (a string), got %s"):format(fname, what, describe(pattern)), 3)
  end
end

function M.files(root, opts, ...)
  if select("#", ...) ~= 0 then too_many("text.files", "root, opts", 2, ...) end
  if type(root) ~= "string" or root == "" then
    error("text.files: root must be the path of a file or folder, got " .. describe(root), 2)
  end
  opts = argcheck.options(opts, FILES_OPTIONS, "text.files", 2, "opts")
  check_pattern(opts.pattern, "text.files", "opts.pattern")
  local list, why = files_under(root, opts.pattern)
  if list == nil then error(("text.files: cannot read '%s': %s"):format(root, tostring(why)), 2) end
  return list
end

----------------------------------------------------------------- the corpus

-- 32-bit FNV-1a of a string: an order for files that does not depend on how a folder
-- lists them, and mixes folders. (The product by the prime 2^24 + 403 is split so that no
-- intermediate exceeds 2^53.)
local function fnv1a(s)
  local h = 2166136261
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i)) % 4294967296          -- bxor gives a signed 32-bit value
    h = (h * 403 + (h % 256) * 16777216) % 4294967296
  end
  return h
end

-- The folder of this module (lua/l2l/ of a checkout, or of an install).
-- The default corpus: the C headers under /usr/include, else l2l's own sources (the
-- checkout's src/ when this module is in one, and the Lua modules beside it).
local function default_files()
  local list = files_under("/usr/include", "%.h$")
  if list and #list > 0 then return list, "C headers under /usr/include" end
  local here = lib.dir
  list = {}
  for _, root in ipairs({ here .. "/../../src", here }) do
    for _, f in ipairs(files_under(root, "%.[ch]$") or {}) do list[#list + 1] = f end
    for _, f in ipairs(root == here and files_under(root, "%.lua$") or {}) do list[#list + 1] = f end
  end
  return list, "l2l's own sources (no C headers under /usr/include)"
end

local CORPUS_OPTIONS = { max_bytes = true, order = true, pattern = true }
local CHUNK = 65536

-- Reads up to `limit` bytes of `path`; nil when it cannot, or (`only_text`) when it is
-- empty or holds a NUL byte.
local function read_file(path, limit, only_text)
  if not filesys.regular_file(path) then return nil end
  local f = io.open(path, "rb")
  if f == nil then return nil end
  local parts, n = {}, 0
  while n < limit do
    local s = f:read(math.min(CHUNK, limit - n))
    if s == nil or #s == 0 then break end
    if only_text and s:find("%z") then
      f:close()
      return nil
    end
    parts[#parts + 1], n = s, n + #s
  end
  f:close()
  local s = concat(parts)
  if only_text and #s == 0 then return nil end
  return s
end

-- The corpus for text.corpus and text.load; errors name `fname` at `level`.
local function corpus(fname, paths, opts, level)
  level = level + 1
  local max_bytes = opts.max_bytes or 4 * 2 ^ 20
  if type(max_bytes) ~= "number" or max_bytes < 2 or max_bytes ~= floor(max_bytes) then
    error(("%s: max_bytes must be an integer >= 2, got %s"):format(fname, describe(max_bytes)), level)
  end
  local order = opts.order or "mixed"
  if order ~= "mixed" and order ~= "path" then
    error(('%s: opts.order must be "mixed" or "path", got %s'):format(fname, describe(order)), level)
  end
  check_pattern(opts.pattern, fname, "opts.pattern")
  if type(paths) == "string" then paths = { paths } end
  if paths ~= nil and type(paths) ~= "table" then
    error(("%s: paths must be a file or folder name or a list of them, got %s"):format(fname, describe(paths)), level)
  end
  local list, description = {}, nil
  local named = {}   -- files named in paths: read whatever they hold
  if paths == nil or #paths == 0 then
    list, description = default_files()
  else
    for i, root in ipairs(paths) do
      if type(root) ~= "string" or root == "" then
        error(("%s: paths[%d] must be a file or folder name, got %s"):format(fname, i, describe(root)), level)
      end
      local found, folder = files_under(root, opts.pattern)
      if found == nil then error(("%s: paths: cannot read '%s': %s"):format(fname, root, tostring(folder)), level) end
      if not folder then named[root] = true end
      for _, f in ipairs(found) do list[#list + 1] = f end
    end
    description = concat(paths, ", ")
  end
  if order == "mixed" then
    local key = {}
    for _, f in ipairs(list) do key[f] = fnv1a(f) end
    table.sort(list, function(a, b)
      if key[a] ~= key[b] then return key[a] < key[b] end
      return a < b
    end)
  else
    table.sort(list)
  end
  local parts, ends, total, seen = {}, {}, 0, {}
  for _, path in ipairs(list) do
    if total >= max_bytes then break end
    if not seen[path] then   -- a file under two of the paths is read once
      seen[path] = true
      local s = read_file(path, max_bytes - total, not named[path])
      if s and #s > 0 then
        parts[#parts + 1], total = s, total + #s
        ends[#ends + 1] = total
      elseif s == nil and named[path] then
        error(("%s: paths: cannot read '%s'"):format(fname, path), level)
      end
    end
  end
  local text = concat(parts)
  if #text < 2 then
    error(("%s: no text in %s (empty, or only files that are not text)"):format(fname, description), level)
  end
  return { text = text, files = #parts, ends = ends, description = description }
end

function M.corpus(paths, opts, ...)
  if select("#", ...) ~= 0 then too_many("text.corpus", "paths, opts", 2, ...) end
  opts = argcheck.options(opts, CORPUS_OPTIONS, "text.corpus", 2, "opts")
  return corpus("text.corpus", paths, opts, 2)
end

function M.load(paths, max_bytes, ...)
  if select("#", ...) ~= 0 then too_many("text.load", "paths, max_bytes", 2, ...) end
  local c = corpus("text.load", paths, { max_bytes = max_bytes or 400000 }, 2)
  return c.text
end

function M.split(s, fraction, ...)
  if select("#", ...) ~= 0 then too_many("text.split", "s, fraction", 2, ...) end
  if type(s) ~= "string" then error("text.split: s must be a string", 2) end
  if type(fraction) ~= "number" or fraction <= 0 or fraction >= 1 then
    error("text.split: fraction must be a number in (0, 1), got " .. tostring(fraction), 2)
  end
  local cut = floor(#s * (1 - fraction))
  return s:sub(1, cut), s:sub(cut + 1)
end

local BATCH_OPTIONS = { first = true, tokens = true, targets = true, rank = true, size = true }

local function integer_arg(v, name, min, default)
  if v == nil and default ~= nil then return default end
  local problem = argcheck.whole_problem(v, min)
  if problem then error(("text.batch: %s %s, got %s"):format(name, problem, tostring(v)), 3) end
  return v
end

function M.batch(s, B, S, seed, step, opts, ...)
  if select("#", ...) ~= 0 then too_many("text.batch", "s, B, S, seed, step, opts", 2, ...) end
  local ids = tensor.is_tensor(s)
  if not ids and type(s) ~= "string" then
    error("text.batch: s must be a string or a tokenized text (an i32 tensor of one dimension), got " .. describe(s), 2)
  end
  if ids and (s:dtype() ~= "i32" or s:ndim() ~= 1 or s:pool() == "device") then
    error("text.batch: a tokenized text must be an i32 tensor of one dimension in host memory", 2)
  end
  local length = ids and s:numel() or #s
  opts = argcheck.options(opts, BATCH_OPTIONS, "text.batch", 2, "opts")
  B, S = integer_arg(B, "B", 1), integer_arg(S, "S", 1)
  seed, step = integer_arg(seed, "seed", 0, 0), integer_arg(step, "step", 0, 0)
  local first = opts.first == nil and 0 or opts.first
  if type(first) ~= "number" or first < 0 or first ~= floor(first) then
    error("text.batch: opts.first must be an integer >= 0, got " .. tostring(opts.first), 2)
  end
  -- A rank's slice of the global minibatch of B samples: rows floor(r B / N) up to
  -- floor((r + 1) B / N), the very samples one process draws there (same seed and step).
  if opts.rank ~= nil or opts.size ~= nil then
    local size = opts.size
    if type(size) ~= "number" or size < 1 or size ~= floor(size) then
      error("text.batch: opts.size must be an integer >= 1 (the number of ranks), got " .. tostring(size), 2)
    end
    local rank = opts.rank
    if type(rank) ~= "number" or rank < 0 or rank >= size or rank ~= floor(rank) then
      error(("text.batch: opts.rank must be an integer in [0, %d), got %s"):format(size, tostring(rank)), 2)
    end
    if B < size then
      error(("text.batch: B (%d) must be at least opts.size (%d): every rank needs a sample"):format(B, size), 2)
    end
    local lo, hi = floor(rank * B / size), floor((rank + 1) * B / size)
    first, B = first + lo, hi - lo
  end
  if length < S + 1 then
    error(("text.batch: the text (%d %s) is shorter than S + 1 = %d"):format(length, ids and "ids" or "bytes", S + 1), 2)
  end
  local starts = tensor.rand({ B }, { seed = seed, stream = step, first = first })
  local u = starts:data()
  local tokens, targets = opts.tokens, opts.targets
  for name, t in pairs({ tokens = tokens, targets = targets }) do
    if t ~= nil and not (tensor.is_tensor(t) and t:dtype() == "i32" and t:ndim() == 2 and t:dim(1) == B and t:dim(2) == S) then
      error(("text.batch: opts.%s must be an i32 (%d,%d) tensor"):format(name, B, S), 2)
    end
  end
  tokens = tokens or tensor.empty({ B, S }, { dtype = "i32" })
  targets = targets or tensor.empty({ B, S }, { dtype = "i32" })
  local tk, tg = tokens:data(), targets:data()
  local span = length - S   -- window starts 1 .. span leave room for the last target
  local p = ids and s:data()
  for b = 0, B - 1 do
    local o = math.min(floor(u[b] * span), span - 1)   -- u < 1, but guard the rounding
    if ids then
      for i = 0, S - 1 do
        tk[b * S + i] = p[o + i]
        tg[b * S + i] = p[o + i + 1]
      end
    else
      for i = 0, S - 1 do
        tk[b * S + i] = s:byte(o + i + 1)
        tg[b * S + i] = s:byte(o + i + 2)
      end
    end
  end
  starts:free()
  return tokens, targets
end

----------------------------------------------------------------- printing

-- The length of the valid UTF-8 sequence at s[i] that is not a C1 control (U+0080 to
-- U+009F), or 0: RFC 3629's forms (no overlong one, no surrogate, nothing past U+10FFFF).
local function utf8_at(s, i)
  local c = s:byte(i)
  local len, lo, hi = 0, 0x80, 0xBF   -- (the bounds of the second byte)
  if c >= 0xC2 and c <= 0xDF then len, lo = 2, c == 0xC2 and 0xA0 or 0x80
  elseif c >= 0xE0 and c <= 0xEF then len, lo, hi = 3, c == 0xE0 and 0xA0 or 0x80, c == 0xED and 0x9F or 0xBF
  elseif c >= 0xF0 and c <= 0xF4 then len, lo, hi = 4, c == 0xF0 and 0x90 or 0x80, c == 0xF4 and 0x8F or 0xBF
  end
  for k = 1, len - 1 do
    local b = s:byte(i + k)
    if b == nil or b < (k == 1 and lo or 0x80) or b > (k == 1 and hi or 0xBF) then return 0 end
  end
  return len
end

function M.printable(s, ...)
  if select("#", ...) ~= 0 then too_many("text.printable", "s", 2, ...) end
  if type(s) ~= "string" then error("text.printable: s must be a string, got " .. describe(s), 2) end
  s = s:gsub("[%z\1-\8\11-\31\127]", "?")
  if not s:find("[\128-\255]") then return s end
  local out, i = {}, 1
  while i <= #s do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or utf8_at(s, i)
    out[#out + 1] = len > 0 and s:sub(i, i + len - 1) or "?"
    i = i + math.max(len, 1)
  end
  return concat(out)
end

return M
