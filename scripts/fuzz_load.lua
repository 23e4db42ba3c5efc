-- SPDX-License-Identifier: MIT
-- scripts/fuzz_load.lua — the loader fuzzer: damaged checkpoints fed to l2l.load,
-- l2l.load_weights and l2l.safetensors.open, each in a child process of its own.
--
--   build/l2l scripts/fuzz_load.lua [--n 1000] [--seed S] [--jobs 2] [--timeout 20]
--           [--out build/fuzz] [--l2l build/l2l] [--families a,b] [--known-ok] [--keep]
--   build/l2l scripts/fuzz_load.lua --seed S --case K     one case again, its output shown
--   build/l2l scripts/fuzz_load.lua --replay FILE         a saved case (FILE.txt says how)
--   build/l2l scripts/fuzz_load.lua --self-test           the harness checked against itself
--   build/l2l scripts/fuzz_load.lua --dry-run [--n N]     the cases' mutations, none run
--   (`make fuzz N=20000 SEED=...` runs the first form; spec/project/fuzz_spec.lua runs a few hundred
--   cases and the self-test in `make test`.)
--
-- Purpose: show that no file, however damaged or hostile, makes a loader crash, hang or
-- fail with an internal error. The fuzzer makes small valid checkpoints itself (four
-- bases: tied and untied LM heads, AdamW / LAMB / SGD state (f32, AdamW's in 8 bits, SGD's in
-- bf16), bf16 masters (the LAMB one), one saved part way through
-- an accumulation so that ".grad" tensors exist, one with dynamic loss scaling, one with
-- token types and a classifier head), and three other inputs: a GPT-2 file for
-- l2l.import_gpt2, a tokenizer's two files for l2l.tokenizer.load, and option tables for
-- l2l.plan (scripts/fuzz/inputs.lua); then, from a seed, mutations of them: raw bytes
-- flipped, inserted, deleted, truncated; the header length field; the safetensors header
-- as JSON (offsets, dtypes, shapes, entries, nesting, duplicate keys, invalid UTF-8,
-- padding) and the l2l description inside it (layer options, records, relay options,
-- progress, the __f64 wrapper, structure). Case K of seed S is the same file in every
-- run (the bases are deterministic), so `--seed S --case K` reproduces it.
-- Each case runs as `l2l fuzz_load.lua --child TARGET BASE FILE` under `timeout` and a
-- memory limit (ulimit -v, or the pool budget alone under AddressSanitizer, which needs
-- its large virtual reservations), and is classified:
--   accepted  loaded, and the result works (one training step, with the file's device and
--             host budgets set aside: a relay may be saved with one its step refuses;
--             every tensor read back; the tokenizer gives every byte back; a relay takes
--             the plan)
--   clean     an error whose message starts with the called function's name and is not an
--             internal Lua or FFI error ("attempt to ...", "cannot convert", a position
--             "file.lua:12:" from an error() that was not meant for the user, ...)
--   unclean   an error message that is not clean; load_weights changing the model it then
--             refused; open handing back a tensor unlike its header entry
--   unstep    accepted, but the loaded run or model then cannot take a training step
--   crash     a signal, a sanitizer report, or an exit without the child's result line
--   hang      the time limit passed
-- Crash, hang, unclean and unstep cases are copied to the output folder (SEED-K.safetensors
-- with SEED-K.txt: the target, base, mutation, output and the commands that replay it);
-- any of them makes the exit status 1, except, with --known-ok, those matching a defect
-- listed in KNOWN below (found, reported, not yet fixed). The bases are scripts/fuzz/
-- bases.lua's, a case's child runs scripts/fuzz/child.lua, and the files come from
-- scripts/fuzz/gen.lua (the JSON writer, hostile values) and scripts/fuzz/mutations.lua.
-- Must never: run a case in the parent process (a crash must be one case's, attributed to
-- it alone), leave case files behind except the failing ones it reports, or count a
-- child that died without its result line as anything but a crash.
local floor = math.floor

----------------------------------------------------------------- arguments

local function usage(msg)
  io.stderr:write("fuzz_load: " .. msg .. "\n")
  os.exit(2)
end

local argv = { ... }
local o = {
  n = 1000, jobs = 2, timeout = nil, out = nil, seed = nil, case = nil, replay = nil,
  l2l = nil, families = nil, keep = false, self_test = false, child = nil,
  sanitize = os.getenv("L2L_SANITIZE") == "1",
}
do
  local i = 1
  local function value(name)
    i = i + 1
    if argv[i] == nil then usage(name .. " needs a value") end
    return argv[i]
  end
  local function number(name)
    local v = tonumber(value(name))
    if v == nil or v ~= floor(v) or v < 0 then usage(name .. " needs an integer >= 0") end
    return v
  end
  while i <= #argv do
    local a = argv[i]
    if a == "--n" then o.n = number(a)
    elseif a == "--seed" then o.seed = number(a)
    elseif a == "--case" then o.case = number(a)
    elseif a == "--jobs" then o.jobs = math.max(1, number(a))
    elseif a == "--timeout" then o.timeout = math.max(1, number(a))
    elseif a == "--out" then o.out = value(a)
    elseif a == "--l2l" then o.l2l = value(a)
    elseif a == "--replay" then o.replay = value(a)
    elseif a == "--families" then o.families = value(a)
    elseif a == "--keep" then o.keep = true
    elseif a == "--known-ok" then o.known_ok = true
    elseif a == "--dry-run" then o.dry_run = true
    elseif a == "--sanitize" then o.sanitize = true
    elseif a == "--self-test" then o.self_test = true
    elseif a == "--child" then
      o.child = { target = argv[i + 1], base = tonumber(argv[i + 2]), path = argv[i + 3] }
      i = i + 3
    else usage("unknown argument " .. tostring(a)) end
    i = i + 1
  end
end

local l2l = require("l2l")

----------------------------------------------------------------- the bases and the child

-- The bases, the child's side of a case, the generator and the mutations: beside this file.
local here = (arg and arg[0] or "scripts/fuzz_load.lua"):match("^(.*)/[^/]*$") or "."
local bases_mod = assert(loadfile(here .. "/fuzz/bases.lua"))(l2l)
local BASES, make_base = bases_mod.BASES, bases_mod.make_base
local child_mod = assert(loadfile(here .. "/fuzz/child.lua"))(l2l, bases_mod, usage)
local SELF_TESTS, one_line = child_mod.SELF_TESTS, child_mod.one_line

if o.child then
  child_mod.child(o.child)
  return
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function write_file(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function now()
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("*l"))
  p:close()
  return t or os.time()
end

----------------------------------------------------------------- cases

local G = assert(loadfile(here .. "/fuzz/gen.lua"))()
local S, B = assert(loadfile(here .. "/fuzz/mutations.lua"))(G)
local INPUTS = assert(loadfile(here .. "/fuzz/inputs.lua"))(G)
local tokenizer_fixture = assert(loadfile(here .. "/../spec/tokenizer_fixture.lua"))()
local rint, chance, pick = G.rint, G.chance, G.pick
local new_state, assemble, parse_base = G.new_state, G.assemble, G.parse_base

-- family: weight, kind ("st": a state edit; "bytes": on the file's bytes), targets
local FAMILIES = {
  { "bytes", 8, "bytes" }, { "splice", 5, "bytes" }, { "truncate", 6, "bytes" }, { "length", 5, "bytes" },
  { "tail", 2, "bytes" }, { "text_number", 8, "st" }, { "st_offsets", 8, "st" }, { "st_dtype", 5, "st" },
  { "st_shape", 8, "st" }, { "st_data", 3, "st" }, { "st_entry", 6, "st" }, { "st_header", 5, "st" },
  { "st_metadata", 5, "st" },
  { "l2l_value", 10, "st", true }, { "l2l_layer", 10, "st", true }, { "l2l_record", 6, "st", true },
  { "l2l_relay", 8, "st", true }, { "l2l_progress", 5, "st", true }, { "l2l_f64", 5, "st", true },
  { "l2l_structure", 5, "st", true }, { "combo", 8, "combo" }, { "identity", 1, "identity" },
}
local TARGETS = { "load", "load_weights", "open" }
-- Every target, in the report's order, with the name its row shows.
local TARGET_ROWS = { { "load", "l2l.load" }, { "load_weights", "l2l.load_weights" }, { "open", "safetensors.open" },
                      { "import_gpt2", "l2l.import_gpt2" }, { "tokenizer_encoder", "tokenizer (encoder)" },
                      { "tokenizer_vocab", "tokenizer (vocab)" }, { "plan", "l2l.plan" } }

local function chosen_families()
  local list, total = {}, 0
  local allowed
  if o.families then
    allowed = {}
    for name in o.families:gmatch("[^,]+") do allowed[name] = true end
  end
  for _, f in ipairs(FAMILIES) do
    if not allowed or allowed[f[1]] then
      list[#list + 1] = f
      total = total + f[2]
    end
  end
  if #list == 0 then
    local names = {}
    for i, f in ipairs(FAMILIES) do names[i] = f[1] end
    usage("--families names none of " .. table.concat(names, ", "))
  end
  return list, total
end

local FAMILY_LIST, FAMILY_TOTAL

local function case_seed(seed, k) return (seed * 1000003 + k * 7919) % 2 ^ 52 end

-- Case k of seed: {base =, target =, family =, what =, bytes =}. A base is drawn first: a
-- checkpoint (4 in 7), the GPT-2 file, the tokenizer or the planner (1 in 7 each).
local function make_case(bases, seed, k)
  math.randomseed(case_seed(seed, k))
  local bi = rint(1, #bases)
  local base = bases[bi]
  if base.kind == "tokenizer" then
    local target, bytes, what = INPUTS.tokenizer_case(base, B)
    return { k = k, base = bi, target = target, family = "tokenizer", what = what, bytes = bytes }
  elseif base.kind == "plan" then
    local bytes, what = INPUTS.plan_input()
    return { k = k, base = bi, target = "plan", family = "plan", what = what, bytes = bytes }
  end
  local r, family = math.random() * FAMILY_TOTAL, nil
  for _, f in ipairs(FAMILY_LIST) do
    r = r - f[2]
    -- (the l2l description's families do not apply to a GPT-2 file: it has none)
    if r <= 0 and not (base.kind == "gpt2" and f[4]) then family = f; break end
  end
  family = family or FAMILY_LIST[1]
  local target = base.kind == "gpt2" and (chance(0.8) and "import_gpt2" or "open")
                 or family[4] and (chance(0.8) and "load" or pick({ "load_weights", "open" })) or pick(TARGETS)
  local st = new_state(base)
  local what, bytes
  if family[3] == "bytes" then
    local b0, n = assemble(st)
    bytes, what = B[family[1]](b0, n)
  elseif family[3] == "identity" then
    bytes = assemble(st)
    what = "none (the base written again by this file's JSON writer)"
  else
    local names = family[3] == "combo" and {} or { family[1] }
    if family[3] == "combo" then
      local pool = {}
      for _, f in ipairs(FAMILIES) do if f[3] == "st" then pool[#pool + 1] = f[1] end end
      for i = 1, rint(2, 3) do names[i] = pick(pool) end
    end
    local notes = {}
    for _, name in ipairs(names) do
      local ok, note = pcall(S[name], st)
      -- a mutation that does not apply to what an earlier one left (a header that is no
      -- longer an object) is skipped
      notes[#notes + 1] = name .. ": " .. (ok and tostring(note) or ("(skipped: " .. tostring(note) .. ")"))
    end
    local b0, n = assemble(st)
    if st.note then notes[#notes + 1] = st.note end
    bytes = b0
    if family[3] == "combo" and chance(0.2) then
      local byte_family = pick({ "bytes", "splice", "truncate", "length" })
      local note
      bytes, note = B[byte_family](b0, n)
      notes[#notes + 1] = byte_family .. ": " .. note
    end
    what = table.concat(notes, "; ")
  end
  return { k = k, base = bi, target = target, family = family[1], what = what, bytes = bytes }
end

----------------------------------------------------------------- running children

local SIGNALS = { [1] = "SIGHUP", [2] = "SIGINT", [4] = "SIGILL", [5] = "SIGTRAP", [6] = "SIGABRT",
                  [7] = "SIGBUS", [8] = "SIGFPE", [9] = "SIGKILL", [11] = "SIGSEGV", [13] = "SIGPIPE",
                  [15] = "SIGTERM", [24] = "SIGXCPU", [25] = "SIGXFSZ", [31] = "SIGSYS" }

local RUNNER = [[
# one fuzz case in a child process: K TARGET BASE (written by scripts/fuzz_load.lua)
k=$1 target=$2 base=$3
exec 2>/dev/null   # the shell's own "Segmentation fault": the class says it
t0=$(date +%s%N)
(
  if [ -n "$FUZZ_VLIMIT" ]; then ulimit -v "$FUZZ_VLIMIT" || exit 99; fi
  exec timeout -k 5 "$FUZZ_TIMEOUT" "$FUZZ_L2L" "$FUZZ_SCRIPT" --child "$target" "$base" "$FUZZ_DIR/case-$k.safetensors"
) >"$FUZZ_DIR/case-$k.out" 2>&1 </dev/null
rc=$?
t1=$(date +%s%N)
echo "$rc $(( (t1 - t0) / 1000000 ))" >"$FUZZ_DIR/case-$k.rc"
]]

local env = {}

-- Runs cases (a list of {k, target, base}, their files already in dir) jobs at a time.
local function run_cases(dir, list, timeout)
  local lines = {}
  for _, c in ipairs(list) do lines[#lines + 1] = ("%d %s %d"):format(c.k, c.target, c.base) end
  write_file(dir .. "/list", table.concat(lines, "\n") .. "\n")
  local cmd = ("FUZZ_L2L=%s FUZZ_SCRIPT=%s FUZZ_DIR=%s FUZZ_TIMEOUT=%d FUZZ_VLIMIT=%s ASAN_OPTIONS=%s " ..
               "xargs -P %d -n 3 sh %s < %s"):format(
    q(env.l2l), q(env.script), q(dir), timeout, q(env.vlimit), q(env.asan), o.jobs, q(dir .. "/runner.sh"), q(dir .. "/list"))
  os.execute(cmd)
end

-- The class of a finished case: class, detail, output, and its milliseconds (nil where the
-- runner left no exit status).
local function classify(dir, k, timeout)
  local rcline = read_file(("%s/case-%d.rc"):format(dir, k)) or ""
  local out = read_file(("%s/case-%d.out"):format(dir, k)) or ""
  local rc, ms = rcline:match("^(%d+) (%d+)")
  rc, ms = tonumber(rc), tonumber(ms)
  if rc == nil then return "crash", "the runner left no exit status", out end
  local nan = out:match("FUZZ%-NOTE nan%-payload ([^\n]*)")
  nan = nan and (" after loading a NaN with a payload (" .. nan .. ")") or ""
  if out:find("Sanitizer") or out:find("runtime error:") then
    return "crash", "a sanitizer report" .. nan .. " || " ..
                    (out:match("(ERROR: [^\n]*)") or out:match("([^\n]*runtime error:[^\n]*)") or "?"), out, ms
  end
  if rc == 124 or (rc == 137 and ms >= timeout * 1000 - 50) then
    return "hang", ("no result after %d s"):format(timeout), out, ms
  end
  local class, msg = out:match("FUZZ%-RESULT (%a+) ([^\n]*)")
  if rc == 0 and class then return class, msg, out, ms end
  local why
  if rc > 128 then why = ("killed by signal %d (%s)"):format(rc - 128, SIGNALS[rc - 128] or "?")
  elseif rc == 99 then why = "the memory limit could not be set"
  else why = ("exit status %d without a result"):format(rc) end
  local last = {}
  for line in out:gmatch("[^\n]+") do last[#last + 1] = line end
  return "crash", why .. nan .. " || " .. (last[#last] or ""), out, ms
end

-- What a failure is, without what varies from case to case: the class, the target, why
-- the child's check failed and where (a Lua position in the message, the function named
-- after it, or a Lua runtime error without its operand's type).
local function signature(class, target, detail)
  detail = tostring(detail)
  local why, msg = detail:match("^(.-) || (.*)$")
  why, msg = why or "", msg or detail
  if class == "crash" or class == "hang" then
    -- a crash is told by how the child died, and by the sanitizer's kind of report
    local kind = msg:match("ERROR: (%a+Sanitizer: [%w%-]+)") or msg:match("runtime error: ([%a ]+)") or ""
    return ("%s %s: %s%s"):format(class, target, detail:match("^(.-) || ") or detail, kind ~= "" and (": " .. kind) or "")
      :gsub(" %(([^()]*%d[^()]*)%)", ""):gsub("%d+", "N")
  end
  local site = msg:match("([%w_]+%.lua:%d+):") or ""
  local what = msg:match("(attempt to %a+ [^%(]*)") or msg:match("(cannot convert '[^']*' to '[^']*')")
  if what == nil and site ~= "" then what = msg:match("%.lua:%d+: (%S+)") end
  if what == nil then
    what = msg:gsub("/[^%s:]*%.safetensors", "FILE"):gsub("%d+", "N")
    what = what:sub(1, 90)
  end
  why = why:gsub(" %([^()]*%)$", ""):gsub("%d+", "N"):gsub("%s+$", "")
  return ("%s %s: %s%s%s"):format(class, target, why, site ~= "" and (" at " .. site .. ": ") or ": ", what)
end

-- Bytes as text a terminal shows (and grep reads): others as \xNN.
local function printable(s)
  return (tostring(s):gsub("[%z\1-\8\11-\31\127-\255]", function(ch) return ("\\x%02x"):format(ch:byte()) end))
end

local FAILING = { crash = true, hang = true, unclean = true, unstep = true }
local rss   -- the largest resident memory of a case: {kb =, case =}
local longest   -- the longest case that ended by itself: {ms =, case =} (how near the limit)

-- Defects this fuzzer found that are not fixed yet (issue 21, "Hardening"), matched
-- against a failing case's signature (signature() above). They are reported as known;
-- with --known-ok (spec/project/fuzz_spec.lua passes it) they do not fail the run, while any other
-- failing case does. Remove an entry when its fix lands: the run then fails if it returns.
-- Empty: everything the fuzzer found is fixed (issue 21: payload NaNs made plain, no
-- library positions in l2l.load's messages, tables and bad counts refused in the
-- description, empty dimensions refused at open). A defect goes here only while its fix
-- is pending, with the pattern of its signature and why.
local KNOWN = {}

local function known(sig)
  for _, k in ipairs(KNOWN) do
    if sig:find(k[1]) then return k[2] end
  end
end

local function mkdir(path) os.execute("mkdir -p " .. q(path)) end

local function setup(seed)
  local build = os.getenv("L2L_BUILD") or "build"
  env.l2l = o.l2l or (build .. "/l2l")
  env.script = arg and arg[0] or "scripts/fuzz_load.lua"
  env.out = o.out or (env.l2l:match("^(.*)/[^/]*$") or ".") .. "/fuzz"
  o.timeout = o.timeout or (o.sanitize and 60 or 20)
  -- ASan reserves terabytes of address space: no ulimit there, the pool budget (1 GiB)
  -- and ASan's own allocator limit instead
  env.vlimit = o.sanitize and "" or tostring(4 * 2 ^ 20)   -- KiB
  local asan = os.getenv("ASAN_OPTIONS") or ""
  env.asan = (asan ~= "" and (asan .. ":") or "") .. "allocator_may_return_null=1:max_allocation_size_mb=4096"
  mkdir(env.out)
  local stat = read_file("/proc/self/stat") or ""
  local dir = ("%s/work-%d-%s"):format(env.out, seed, stat:match("^(%d+)") or tostring(os.time()))
  mkdir(dir)
  write_file(dir .. "/runner.sh", RUNNER)
  env.dir = dir
  return dir
end

local function make_bases(dir)
  local bases = {}
  for i, cfg in ipairs(BASES) do
    if cfg.kind == "tokenizer" then
      tokenizer_fixture.write(dir)   -- encoder.json, vocab.bpe; the children read the tok- copies
      bases[i] = { kind = "tokenizer", encoder = read_file(dir .. "/encoder.json"), vocab = read_file(dir .. "/vocab.bpe") }
      write_file(dir .. "/tok-encoder.json", bases[i].encoder)
      write_file(dir .. "/tok-vocab.bpe", bases[i].vocab)
    elseif cfg.kind == "plan" then
      bases[i] = { kind = "plan" }
    else
      local path = ("%s/base-%d.safetensors"):format(dir, i)
      make_base(cfg, path)
      bases[i] = parse_base(read_file(path))
      bases[i].kind = cfg.kind
    end
  end
  return bases
end

local function replay_commands(file, seed, k)
  return ("  %s %s --replay %s\n  %s %s --seed %d --case %d"):format(env.l2l, env.script, file, env.l2l, env.script, seed, k)
end

-- Keeps a failing case: its file and a note beside it.
local function save_case(c, seed, class, detail, out)
  local stem = ("%s/%d-%d"):format(env.out, seed, c.k)
  write_file(stem .. ".safetensors", c.bytes)
  write_file(stem .. ".txt", table.concat({
    "target " .. c.target, "base " .. c.base, "family " .. c.family, "mutation " .. c.what,
    "class " .. class, "detail " .. one_line(detail),
    "replay:", replay_commands(stem .. ".safetensors", seed, c.k), "output:", out }, "\n") .. "\n")
  return stem .. ".safetensors"
end

local function fresh_seed()
  local f = io.open("/dev/urandom", "rb")
  if f then
    local s = f:read(4)
    f:close()
    if s and #s == 4 then return ((s:byte(1) * 256 + s:byte(2)) * 256 + s:byte(3)) * 128 + s:byte(4) % 128 end
  end
  return os.time() % 1000003
end

local function cleanup(dir)
  if not o.keep then os.execute("rm -rf " .. q(dir)) end
end

----------------------------------------------------------------- the modes

local function fuzz()
  local seed = o.seed or fresh_seed()
  math.randomseed(seed)
  local dir = setup(seed)
  FAMILY_LIST, FAMILY_TOTAL = chosen_families()
  print(("fuzz_load: seed %d, %d cases, %d jobs, %d s limit a case%s (L2L_SANITIZE=%s)"):format(
    seed, o.n, o.jobs, o.timeout, o.sanitize and "" or ", 4 GiB of address space", o.sanitize and "1" or "0"))
  io.stdout:flush()
  local t0 = now()
  local bases = make_bases(dir)
  if o.dry_run then
    for k = o.case or 1, o.case or o.n do
      local c = make_case(bases, seed, k)
      print(printable(("case %d: %s, base %d, %d bytes, %s: %s"):format(k, c.target, c.base, #c.bytes, c.family, c.what)))
    end
    cleanup(dir)
    return true
  end
  local counts, by_target, by_family = {}, {}, {}
  rss, longest = { kb = 0, case = 0 }, { ms = 0, case = 0 }
  local failures, signatures, known_count = {}, {}, 0
  local chunk = o.jobs * 24
  local first, last = 1, o.n
  if o.case then first, last = o.case, o.case end
  for from = first, last, chunk do
    local to = math.min(last, from + chunk - 1)
    local list = {}
    for k = from, to do
      local c = make_case(bases, seed, k)
      write_file(("%s/case-%d.safetensors"):format(dir, k), c.bytes)
      list[#list + 1] = c
    end
    run_cases(dir, list, o.timeout)
    for _, c in ipairs(list) do
      local class, detail, out, ms = classify(dir, c.k, o.timeout)
      if class ~= "hang" and (ms or 0) > longest.ms then longest.ms, longest.case = ms, c.k end
      local kb = tonumber(out:match("FUZZ%-RSS (%d+)")) or 0
      if kb > rss.kb then rss.kb, rss.case = kb, c.k end
      counts[class] = (counts[class] or 0) + 1
      by_target[c.target] = by_target[c.target] or {}
      by_target[c.target][class] = (by_target[c.target][class] or 0) + 1
      by_family[c.family] = by_family[c.family] or {}
      by_family[c.family][class] = (by_family[c.family][class] or 0) + 1
      if o.case then
        print(printable(("case %d: target %s, base %d, %s: %s\nclass %s: %s\noutput:\n%s"):format(
          c.k, c.target, c.base, c.family, c.what, class, tostring(detail), out)))
        print("file: " .. save_case(c, seed, class, detail, out))
      elseif FAILING[class] then
        local sig = signature(class, c.target, detail)
        local why_known = known(sig)
        -- a known defect's case is not kept when known defects are allowed (make test
        -- would pile them up); --seed and --case make it again
        local file = (o.known_ok and why_known) and "(a known defect: not kept)"
                     or save_case(c, seed, class, detail, out)
        failures[#failures + 1] = { c = c, class = class, detail = detail, file = file, known = why_known }
        if why_known then known_count = known_count + 1 end
        if not signatures[sig] then
          signatures[sig] = { count = 0, case = c.k, known = why_known }
          signatures[#signatures + 1] = sig
        end
        signatures[sig].count = signatures[sig].count + 1
      end
      os.remove(("%s/case-%d.safetensors"):format(dir, c.k))
      os.remove(("%s/case-%d.out"):format(dir, c.k))
      os.remove(("%s/case-%d.rc"):format(dir, c.k))
    end
  end
  local elapsed = now() - t0
  cleanup(dir)
  local classes = { "accepted", "clean", "unclean", "unstep", "crash", "hang" }
  local function row(label, t)
    local cells = {}
    for i, cl in ipairs(classes) do cells[i] = ("%9d"):format(t[cl] or 0) end
    return ("  %-18s%s"):format(label, table.concat(cells))
  end
  local header = {}
  for i, cl in ipairs(classes) do header[i] = ("%9s"):format(cl) end
  print(("  %-18s%s"):format("", table.concat(header)))
  for _, t in ipairs(TARGET_ROWS) do print(row(t[2], by_target[t[1]] or {})) end
  print(row("all", counts))
  print(("  the largest resident memory of a case: %.1f MiB (case %d)"):format(rss.kb / 1024, rss.case))
  print(("  the longest case: %.1f s of the %d s limit (case %d)"):format(longest.ms / 1000, o.timeout, longest.case))
  local fams = {}
  for _, f in ipairs(FAMILY_LIST) do
    local t = by_family[f[1]]
    if t then
      local n = 0
      for _, v in pairs(t) do n = n + v end
      local bad = {}
      for _, cl in ipairs(classes) do
        if FAILING[cl] and t[cl] then bad[#bad + 1] = cl .. " " .. t[cl] end
      end
      fams[#fams + 1] = ("%s %d%s"):format(f[1], n, #bad > 0 and (" (" .. table.concat(bad, ", ") .. ")") or "")
    end
  end
  print("  by mutation: " .. table.concat(fams, ", "))
  if #signatures > 0 then
    print(("%d failing cases, %d distinct (class, target, why, where):"):format(#failures, #signatures))
    table.sort(signatures, function(a, b)
      if signatures[a].count ~= signatures[b].count then return signatures[a].count > signatures[b].count end
      return a < b
    end)
    for _, sig in ipairs(signatures) do
      local t = signatures[sig]
      print(printable(("  %4dx  %s  (first: case %d)%s"):format(t.count, sig, t.case,
                                                               t.known and ("\n         known: " .. t.known) or "")))
    end
    print("failing cases (saved with a note beside each):")
    for i, f in ipairs(failures) do
      if i > 20 then print(("  ... and %d more in %s"):format(#failures - 20, env.out)); break end
      print(printable(("  case %d [%s] %s, base %d, %s: %s\n    %s\n    %s"):format(f.c.k, f.class, f.c.target,
        f.c.base, f.c.family, f.c.what:sub(1, 300), one_line(f.detail):sub(1, 300), f.file)))
    end
    print("replay one: " .. env.l2l .. " " .. env.script .. " --replay FILE   (or --seed " .. seed .. " --case K)")
  end
  local bad = 0
  for cl in pairs(FAILING) do bad = bad + (counts[cl] or 0) end
  print(("fuzz_load: seed %d: %d cases in %.1f s: %d accepted, %d clean errors, %d unclean, %d unsteppable, " ..
         "%d crashes, %d hangs%s"):format(
    seed, (o.case and 1 or o.n), elapsed, counts.accepted or 0, counts.clean or 0, counts.unclean or 0,
    counts.unstep or 0, counts.crash or 0, counts.hang or 0,
    known_count > 0 and (" (%d failing cases are known defects%s)"):format(known_count,
      o.known_ok and ", allowed by --known-ok" or "") or ""))
  if o.known_ok then bad = bad - known_count end
  return bad == 0
end

local function replay()
  local note = read_file(o.replay:gsub("%.safetensors$", "") .. ".txt") or ""
  local target = note:match("\ntarget (%S+)") or note:match("^target (%S+)")
  local base = tonumber(note:match("\nbase (%d+)"))
  if not target or not base then usage("--replay: no target and base in " .. o.replay:gsub("%.safetensors$", "") .. ".txt") end
  local seed = fresh_seed()
  local dir = setup(seed)
  write_file(dir .. "/case-1.safetensors", read_file(o.replay) or usage("cannot read " .. o.replay))
  run_cases(dir, { { k = 1, target = target, base = base } }, o.timeout)
  local class, detail, out = classify(dir, 1, o.timeout)
  print(printable(("replay of %s: %s, base %d\nclass %s: %s\noutput:\n%s"):format(o.replay, target, base, class,
                                                                                    tostring(detail), out)))
  cleanup(dir)
  return not FAILING[class]
end

-- The harness's own test: children made to crash, hang and fail uncleanly are classified
-- so, and every base, written again by the JSON writer here, is accepted by every target.
local function self_test()
  local seed = o.seed or fresh_seed()
  local dir = setup(seed)
  local bases = make_bases(dir)
  local ok = true
  local function expect(list, timeout, want)
    run_cases(dir, list, timeout)
    for _, c in ipairs(list) do
      local class, detail, out = classify(dir, c.k, timeout)
      local expected = want or SELF_TESTS[c.base].expect
      local good = class == expected
      ok = ok and good
      print(("%s  %s: %s, expected %s (%s)"):format(good and "ok  " or "FAIL", c.what, class, expected, one_line(detail):sub(1, 160)))
      if not good then print(out) end
    end
  end
  local quick, slow = {}, {}
  for i, t in ipairs(SELF_TESTS) do
    local c = { k = i, target = "selftest", base = i, what = t.what }
    write_file(("%s/case-%d.safetensors"):format(dir, i), "")
    if t.expect == "hang" then slow[#slow + 1] = c else quick[#quick + 1] = c end
  end
  expect(quick, o.timeout or 60)
  expect(slow, 2)
  local list = {}
  local function add(bi, target, bytes)
    local k = 100 + #list
    write_file(("%s/case-%d.safetensors"):format(dir, k), bytes)
    list[#list + 1] = { k = k, target = target, base = bi, what = ("base %d written again, %s"):format(bi, target) }
  end
  for bi, base in ipairs(bases) do
    if base.kind == "tokenizer" then
      add(bi, "tokenizer_encoder", base.encoder)
      add(bi, "tokenizer_vocab", base.vocab)
    elseif base.kind == "plan" then
      add(bi, "plan", INPUTS.plan_text({ blocks = 2, dim = 16, batch = 6, seq = 4, device_budget = 2 ^ 30,
                                         rates = { flops = 1e12, h2d = 1e10, d2h = 1e10, optimizer = 1e9 } }))
    else
      local bytes = assemble(new_state(base))
      for _, target in ipairs(base.kind == "gpt2" and { "import_gpt2", "open" } or TARGETS) do add(bi, target, bytes) end
    end
  end
  expect(list, o.timeout or 60, "accepted")
  cleanup(dir)
  print(ok and "fuzz_load: self-test passed" or "fuzz_load: self-test FAILED")
  return ok
end

local ok
if o.self_test then ok = self_test()
elseif o.replay then ok = replay()
else ok = fuzz() end
os.exit(ok and 0 or 1, true)   -- the state closed: its finalizers free what C holds
