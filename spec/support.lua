-- SPDX-License-Identifier: MIT
-- spec/support.lua — helpers shared by the specs: fresh random data from a seed that
-- changes every run (printed on failure through the messages that use it), float64
-- comparison and its margin (within), running a shell command, and where the build is.
local M = {}

M.build = os.getenv("L2L_BUILD") or "build"
M.root = (function()
  local p = io.popen("pwd")
  local d = p:read("*l")
  p:close()
  return d
end)()

-- The run's seed: L2L_SEED (scripts/test.sh draws one for the C tests and the specs
-- alike, and prints it), or a fresh one from /dev/urandom when a spec is run by hand.
-- Every spec file seeds the generator again when it loads this file, so running one file
-- with the same L2L_SEED replays its draws.
local function fresh_seed()
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(4)
  f:close()
  return ((b:byte(1) * 256 + b:byte(2)) * 256 + b:byte(3)) * 64 + b:byte(4) % 64
end
M.seed = tonumber(os.getenv("L2L_SEED")) or fresh_seed()
math.randomseed(M.seed)   -- LuaJIT's generator: independent of l2l's Philox
function M.uniform(lo, hi) return lo + (hi - lo) * math.random() end
function M.normal()
  local u1, u2 = 1 - math.random(), math.random()
  return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
end
function M.int(lo, hi) return math.random(lo, hi) end

-- Sequence reversal for B samples: n tokens from [0, V-1), the separator V-1, the n tokens
-- reversed; targets (-1 = ignored) ask only for the answer. Tables of rows (tokens, targets).
function M.reversal(B, n, V)
  local S, SEP = 2 * n + 1, V - 1
  local tok, tgt = {}, {}
  for b = 1, B do
    local t, g = {}, {}
    for i = 1, n do t[i] = M.int(0, SEP - 1) end
    t[n + 1] = SEP
    for i = 1, n do t[n + 1 + i] = t[n + 1 - i] end
    for i = 1, S do g[i] = (i > n and i < S) and t[i + 1] or -1 end
    tok[b], tgt[b] = t, g
  end
  return tok, tgt
end

-- count minibatches of reversal (above) as {tokens, targets} i32 tensors.
function M.reversal_batches(count, B, n, V)
  local tensor = require("l2l").tensor
  local list = {}
  for i = 1, count do
    local tok, tgt = M.reversal(B, n, V)
    list[i] = { tensor(tok, { dtype = "i32" }), tensor(tgt, { dtype = "i32" }) }
  end
  return list
end

-- Nested table of random normals with the given shape.
function M.random_table(shape, depth)
  depth = depth or 1
  local t = {}
  for i = 1, shape[depth] do
    t[i] = depth == #shape and M.normal() or M.random_table(shape, depth + 1)
  end
  return t
end

function M.flatten(t, out)
  out = out or {}
  for _, v in ipairs(t) do
    if type(v) == "table" then M.flatten(v, out) else out[#out + 1] = v end
  end
  return out
end

-- Largest |got - want| / (|want| + floor) over two flat lists.
function M.rel_err(got, want, floor)
  assert(#got == #want, ("lengths differ: %d vs %d"):format(#got, #want))
  local worst = 0
  for i = 1, #got do
    if got[i] ~= got[i] then return math.huge end
    local e = math.abs(got[i] - want[i]) / (math.abs(want[i]) + (floor or 1e-6))
    if e > worst then worst = e end
  end
  return worst
end

-- Whether err <= tol (a NaN err is not); where L2L_TEST_MARGINS names a file, one line
-- appended to it as the C tests' check_margin writes them (spec/c/check.c): the place
-- (file:line of the caller `level` up: 1, the default, is within's caller, 2 a helper's
-- caller, where the helper does not return within's result as a tail call, which drops its
-- frame), err / tol, the spec file (which scripts/flakes.sh replays) and what. The file is
-- opened again when the name changes.
local margins, margins_path = nil, ""
function M.within(err, tol, what, level)
  local path = os.getenv("L2L_TEST_MARGINS") or ""
  if path ~= margins_path then
    if margins then margins:close() end
    margins, margins_path = path ~= "" and io.open(path, "a") or nil, path
  end
  if margins then
    local at = debug.getinfo((level or 1) + 1, "Sl")
    local file = at.short_src:gsub("^%./", "")
    if file:sub(1, #M.root + 1) == M.root .. "/" then file = file:sub(#M.root + 2) end
    local ratio = tol > 0 and err / tol or (err == 0 and 0 or math.huge)
    local note = tostring(what or ""):gsub("[\t\n]", " ")
    margins:write(("%s:%d\t%.4g\t%s\t%s\n"):format(file, at.currentline, ratio, file, note))
    margins:flush()
  end
  return err <= tol
end

-- The build folder as an absolute path (for programs run from another folder).
M.build_dir = M.build:sub(1, 1) == "/" and M.build or (M.root .. "/" .. M.build)

-- A file's bytes, or nil when it cannot be opened; writing a file; a new temporary file
-- holding `text` (its path).
function M.read_file(path)
  local f = io.open(path, "rb")
  if f == nil then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

function M.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function M.write_temp(text)
  local path = os.tmpname()
  M.write_file(path, text)
  return path
end

-- A new empty folder (os.tmpname's name, made a folder); its path.
function M.tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(os.execute("mkdir -p '" .. path .. "'") == 0, "cannot make the folder " .. path)
  return path
end

-- s quoted for a shell command: in single quotes, any quote in it closed and escaped.
function M.q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs a shell command; returns its exit status (0 = success) and combined output.
function M.sh(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1; echo \"__status=$?\"")
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("__status=(%d+)%s*$"))
  return status, (out:gsub("__status=%d+%s*$", ""))
end

-- The exit status a shell reports for a process killed by signal `name` ("TERM", "USR1"):
-- 128 + its number on this system (bash's kill -l: dash's takes no name).
function M.killed_by(name)
  local _, number = M.sh("bash -c 'kill -l " .. name .. "'")
  return 128 + assert(tonumber(number), "kill -l " .. name)
end

-- f(...) with what it writes to io.stderr dropped (a deprecated name's one warning, which
-- a spec reads from a child process instead); f's results.
function M.quietly(f, ...)
  local stderr = io.stderr
  io.stderr = { write = function(self) return self end }
  local result = { pcall(f, ...) }
  io.stderr = stderr
  if not result[1] then error(result[2], 2) end
  return unpack(result, 2, table.maxn(result))
end

-- f(...) must raise an error whose message holds `needle` (plain text); returns it.
function M.refused(needle, f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected a refusal naming: " .. needle)
  assert(tostring(err):find(needle, 1, true), tostring(err))
  return tostring(err)
end

return M
