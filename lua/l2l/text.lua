-- l2l.text — a byte-level text corpus for the examples: load it, split it, draw batches.
--
--   local text = require("l2l.text")
--   local corpus = text.load()                     -- or text.load({ "a.txt", "b.txt" })
--   local train, valid = text.split(corpus, 0.1)   -- the last 10 % for validation
--   local tokens, targets = text.batch(train, 16, 64, seed, step)   -- (16,64) i32 each
--
-- text.load([paths [, max_bytes = 400000]]) -> string: the files joined, or by default the
--   C headers /usr/include/*.h (sorted by name, so every run reads the same bytes), falling
--   back to l2l's own src/*.c and src/*.h (relative to the current folder) when there are
--   none; stops after max_bytes.
-- text.split(s, fraction) -> train, valid: the last `fraction` of s is the validation part.
-- text.batch(s, B, S, seed, step [, opts]) -> tokens, targets: B windows of S bytes at
--   offsets drawn by l2l's counter-based generator keyed by (seed, step), so a batch
--   depends only on them; targets are the next bytes (targets[b][s] = tokens[b][s + 1]
--   within the text). opts.first: the first draw of the stream to use (several batches
--   from one stream); opts.tokens / opts.targets: (B,S) i32 tensors to fill instead of
--   new ones (a training loop reuses its own).
-- Must never: depend on the order a folder lists its files in, or draw from a generator
-- whose state other code shares (math.random): a run is repeatable from its seed.
local lib = require("l2l.lib")
local tensor = require("l2l.tensor")

local type, tostring, pairs, ipairs, floor, concat = type, tostring, pairs, ipairs, math.floor, table.concat
local select, too_many = select, lib.too_many

local M = {}

-- The files `pattern` (a shell glob) matches, sorted bytewise.
local function glob(pattern)
  local p = io.popen("ls -1 " .. pattern .. " 2>/dev/null")
  local list = {}
  for line in p:lines() do list[#list + 1] = line end
  p:close()
  table.sort(list)
  return list
end

function M.load(paths, max_bytes, ...)
  if select("#", ...) ~= 0 then too_many("text.load", "paths, max_bytes", 2, ...) end
  max_bytes = max_bytes or 400000
  if type(max_bytes) ~= "number" or max_bytes < 2 then
    error("text.load: max_bytes must be a number >= 2, got " .. tostring(max_bytes), 2)
  end
  local explicit = paths ~= nil
  if paths == nil then
    paths = glob("/usr/include/*.h")
    if #paths == 0 then
      paths = glob("src/*.c")
      for _, f in ipairs(glob("src/*.h")) do paths[#paths + 1] = f end
    end
  elseif type(paths) == "string" then
    paths = { paths }
  elseif type(paths) ~= "table" then
    error("text.load: paths must be a file name or a list of them, got " .. type(paths), 2)
  end
  local parts, size = {}, 0
  for i, path in ipairs(paths) do
    if type(path) ~= "string" then error(("text.load: paths[%d] must be a file name, got %s"):format(i, type(path)), 2) end
    if size >= max_bytes then break end
    local f, why = io.open(path, "rb")
    if f then
      local s = f:read(max_bytes - size)
      f:close()
      if s then parts[#parts + 1], size = s, size + #s end
    elseif explicit then
      error("text.load: paths: cannot read '" .. tostring(path) .. "': " .. tostring(why), 2)
    end   -- a default header that vanished or is unreadable is just skipped
  end
  local s = concat(parts)
  if #s < 2 then error("text.load: no text found (give files with --data)", 2) end
  return s
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

local BATCH_OPTIONS = { first = true, tokens = true, targets = true }

local function integer_arg(v, name, min, default)
  if v == nil and default ~= nil then return default end
  if type(v) ~= "number" or v < min or v ~= floor(v) then
    error(("text.batch: %s must be an integer >= %d, got %s"):format(name, min, tostring(v)), 3)
  end
  return v
end

function M.batch(s, B, S, seed, step, opts, ...)
  if select("#", ...) ~= 0 then too_many("text.batch", "s, B, S, seed, step, opts", 2, ...) end
  if type(s) ~= "string" then error("text.batch: s must be a string", 2) end
  opts = lib.options(opts, BATCH_OPTIONS, "text.batch", 2, "opts")
  B, S = integer_arg(B, "B", 1), integer_arg(S, "S", 1)
  seed, step = integer_arg(seed, "seed", 0, 0), integer_arg(step, "step", 0, 0)
  local first = opts.first == nil and 0 or opts.first
  if type(first) ~= "number" or first < 0 or first ~= floor(first) then
    error("text.batch: opts.first must be an integer >= 0, got " .. tostring(opts.first), 2)
  end
  if #s < S + 1 then error(("text.batch: the text (%d bytes) is shorter than S + 1 = %d"):format(#s, S + 1), 2) end
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
  local span = #s - S   -- window starts 1 .. span leave room for the last target
  for b = 0, B - 1 do
    local o = math.min(floor(u[b] * span), span - 1)   -- u < 1, but guard the rounding
    for i = 0, S - 1 do
      tk[b * S + i] = s:byte(o + i + 1)
      tg[b * S + i] = s:byte(o + i + 2)
    end
  end
  starts:free()
  return tokens, targets
end

return M
