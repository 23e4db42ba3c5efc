-- SPDX-License-Identifier: MIT
-- bench/tokenizer.lua — l2l.tokenizer's GPT-2 encoding against js-tiktoken's (node), in
-- tokens per second, on the same texts in the same run; the ids must agree.
--
-- Usage: build/l2l bench/tokenizer.lua [--mib N] [--reps N] [FILE...]
--   Texts: FILE... (each its own row), else three: C headers (/usr/include/*.h), English
--   prose (vim's documentation, else the licences in /usr/share/common-licenses) and
--   text in 30-odd languages (vim's tutor in each), N MiB of each at most (default 2).
--   Each side encodes each text --reps times (default 3): the first pass (l2l: a tokenizer
--   loaded afresh, its cache of pieces empty; js-tiktoken: its first call, before node's
--   JIT has warmed up) and the best pass are both reported, in CPU time (each process's,
--   all its threads: what other jobs on a shared machine disturb least), and the best
--   pass in wall time too. Loading the vocabulary is timed apart. Needs GPT-2's files (scripts/gpt2-vocab.sh) and node + npm
--   (scripts/js-tiktoken.sh installs the reference into l2l's cache).
-- Results and the machine they came from: bench/RESULTS.md.
local l2l = require("l2l")
local T = l2l.tokenizer

local args, mib, reps = {}, 2, 3
do
  local i = 1
  while i <= #arg do
    if arg[i] == "--mib" then mib, i = tonumber(arg[i + 1]), i + 2
    elseif arg[i] == "--reps" then reps, i = tonumber(arg[i + 1]), i + 2
    else args[#args + 1], i = arg[i], i + 1 end
  end
end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  local ok = p:close()
  return out, ok
end
local function files(pattern)
  local list = {}
  for line in sh("ls -1 " .. pattern .. " 2>/dev/null"):gmatch("[^\n]+") do list[#list + 1] = line end
  table.sort(list)
  return list
end
local function read(list, limit)
  local parts, size = {}, 0
  for _, path in ipairs(list) do
    if size >= limit then break end
    local f = io.open(path, "rb")
    if f then
      local s = f:read(limit - size) or ""
      f:close()
      parts[#parts + 1], size = s, size + #s
    end
  end
  return table.concat(parts)
end

local limit = math.floor(mib * 2 ^ 20)
local texts = {}
if #args > 0 then
  for _, path in ipairs(args) do texts[#texts + 1] = { name = path, text = read({ path }, limit) } end
else
  texts[1] = { name = "C headers (/usr/include/*.h)", text = read(files("/usr/include/*.h"), limit) }
  local prose = files("/usr/share/vim/vim9*/doc/*.txt")
  texts[2] = #prose > 0 and { name = "English prose (vim's doc/*.txt)", text = read(prose, limit) }
             or { name = "English prose (/usr/share/common-licenses)", text = read(files("/usr/share/common-licenses/*"), limit) }
  local tutor = files("/usr/share/vim/vim9*/tutor/tutor.*.utf-8")
  if #tutor > 0 then texts[3] = { name = ("%d languages (vim's tutor.*.utf-8)"):format(#tutor), text = read(tutor, limit) } end
end

local reference = sh("bash scripts/js-tiktoken.sh"):match("([^\n]+)%s*$")
assert(reference and reference:sub(1, 1) == "/", "no reference: " .. tostring(reference))
local cache = T.cache_dir()

-- The digest gpt2-reference.js computes too.
local function digest(ids)
  local d = 0
  for i = 1, #ids do d = (d + ((i - 1) % 65521 + 1) * ids[i]) % 4294967296 end
  return d
end

local clock = require("l2l.progress").now
local t0 = clock()
local tok = T.load(cache .. "/encoder.json", cache .. "/vocab.bpe")
local load_s = clock() - t0

local load_avg = sh("cat /proc/loadavg"):match("^(%S+ %S+ %S+)")
print(("l2l %s, LuaJIT %s; node %s with js-tiktoken %s; %d passes each"):format(l2l.version, jit.version,
      sh("node --version"):gsub("%s+$", ""), reference:match("js%-tiktoken%-([%d.]+)") or "?", reps))
print(("machine: %s, %s cores, load average %s at the start"):format(
      (sh("grep -m1 'model name' /proc/cpuinfo"):match(":%s*(.-)%s*$") or "?"), sh("nproc"):gsub("%s+$", ""), load_avg))
print(("vocabulary load: l2l %.0f ms"):format(load_s * 1000))
print()
print("tokens per second (M/s); first and best passes in CPU time, then the best in wall time")
print(("%-34s %5s %7s | %6s %6s %6s | %6s %6s %6s | %6s %6s"):format("text", "MiB", "tokens", "l2l 1st", "best",
      "wall", "js 1st", "best", "wall", "x cpu", "x wall"))

local tmp = os.tmpname()
for _, t in ipairs(texts) do
  local f = assert(io.open(tmp, "wb"))
  f:write(t.text)
  f:close()
  local js_out = sh(("node scripts/gpt2-reference.js '%s' bench '%s' %d"):format(reference, tmp, reps))
  local js = require("cjson").decode(js_out:match("{.*}") or error("the reference failed: " .. js_out))
  local fresh = T.load(cache .. "/encoder.json", cache .. "/vocab.bpe")   -- an empty cache
  local first, best, wall, ids = 0, math.huge, math.huge, nil
  for r = 1, reps do
    collectgarbage()
    local s, c = clock(), os.clock()
    ids = fresh:encode(t.text)
    local dt = os.clock() - c
    wall = math.min(wall, clock() - s)
    if r == 1 then first = dt end
    best = math.min(best, dt)
  end
  assert(#ids == js.tokens and digest(ids) == js.digest,
         ("%s: l2l gives %d tokens (digest %d), js-tiktoken %d (digest %d)"):format(t.name, #ids, digest(ids), js.tokens, js.digest))
  assert(fresh:decode(ids) == t.text, t.name .. ": decode(encode(text)) differs from the text")
  local n = #ids
  local function rate(s) return ("%6.2f"):format(n / s / 1e6) end
  print(("%-34s %5.2f %7d | %7s %6s %6s | %6s %6s %6s | %5.1fx %5.1fx"):format(t.name:sub(1, 34), #t.text / 2 ^ 20, n,
        rate(first), rate(best), rate(wall), rate(js.first), rate(js.best), rate(js.wall), js.best / best, js.wall / wall))
end
os.remove(tmp)
print()
print(("ids identical on every text; load average %s at the end"):format(sh("cat /proc/loadavg"):match("^(%S+ %S+ %S+)")))
