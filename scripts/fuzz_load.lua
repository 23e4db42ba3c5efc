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
--   (`make fuzz N=20000 SEED=...` runs the first form; spec/fuzz_spec.lua runs a few hundred
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
--   accepted  loaded, and the result works (one training step; every tensor read back; the
--             tokenizer gives every byte back; a relay takes the plan)
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
-- listed in KNOWN below (found, reported, not yet fixed). The files come from
-- scripts/fuzz/gen.lua (the JSON writer, hostile values) and scripts/fuzz/mutations.lua.
-- Must never: run a case in the parent process (a crash must be one case's, attributed to
-- it alone), leave case files behind except the failing ones it reports, or count a
-- child that died without its result line as anything but a crash.
local ffi = require("ffi")

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

----------------------------------------------------------------- the bases

local V, SEQ, D = 13, 9, 16
local BASES = {
  { what = "1 block, tied LM head, AdamW, 2 updates", blocks = 1, tie = true, optimizer = "adamw", steps = 2 },
  { what = "2 blocks (one frugal, dropout), AdamW with 8-bit state (u8 codes and scales), saved "
           .. "mid-accumulation (.grad tensors)",
    blocks = 2, dropout = 0.1, optimizer = "adamw", state = "8bit", accumulate = 2, steps = 3, policies = true },
  { what = "1 block, tied, LAMB, dynamic loss scaling, layer 2 frozen, bf16 masters", blocks = 1, tie = true,
    optimizer = "lamb", loss_scale = 1024, steps = 2, freeze = 2, master = "bf16" },
  { what = "token types, post-LN block without biases, classifier head, SGD with momentum in bf16",
    blocks = 1, classifier = true, type_vocab = 2, post_ln = true, bias = false, optimizer = "sgd",
    state = "bf16", steps = 2 },
  { what = "a GPT-2 file (Hugging Face's names, no l2l metadata) of 2 blocks", kind = "gpt2", blocks = 2, tie = true },
  { what = "a tokenizer's encoder.json and vocab.bpe", kind = "tokenizer" },
  { what = "options of l2l.plan", kind = "plan" },
}
local GPT2_HEADS = 2   -- (dim 16 is not a multiple of GPT-2's 64-wide heads)

-- The base's model, with fixed seeds: the same shapes (and initial weights) every time.
local function make_model(cfg)
  local list = { l2l.Embedding{ vocab = V, dim = D, max_seq = SEQ, type_vocab = cfg.type_vocab,
                                dropout = cfg.dropout, seed = 11 } }
  for b = 1, cfg.blocks do
    list[#list + 1] = l2l.Block{ dim = D, heads = 2, mlp = 24, causal = not cfg.classifier,
                                 post_ln = cfg.post_ln, bias = cfg.bias, dropout = cfg.dropout,
                                 memory = b == 2 and "frugal" or "standard", seed = 20 + b }
  end
  list[#list + 1] = cfg.classifier and l2l.Classifier{ dim = D, classes = 3, seed = 30 }
                    or l2l.LMHead{ vocab = V, dim = D, tie = cfg.tie, seed = 30 }
  return l2l.Sequential(list)
end

-- A minibatch of B rows that fits whatever model it is given (its first layer's vocabulary,
-- positions and token types; its head's kind): (tokens, targets, opts).
local function batch_for(model, B, step)
  local c1 = model[1]:config()
  local vocab = (c1.vocab or 0) > 0 and c1.vocab or 2
  local S = math.max(1, math.min((c1.max_seq or 0) > 0 and c1.max_seq or 4, 6))
  local tok = l2l.zeros({ B, S }, { dtype = "i32" })
  for b = 1, B do
    for s = 1, S do tok:set(b, s, (b * 5 + s * (step + 2)) % vocab) end
  end
  local last, tgt = model[#model], nil
  if last.kind == "classifier" then
    local classes = last:config().classes
    tgt = l2l.zeros({ B }, { dtype = "i32" })
    for b = 1, B do tgt:set(b, (b + step) % classes) end
  else
    tgt = l2l.zeros({ B, S }, { dtype = "i32" })
    for b = 1, B do
      -- the next token; the last position has none (-1), except in a model of one
      -- position, where a step needs a target somewhere (any token will do)
      for s = 1, S do tgt:set(b, s, s < S and tok:get(b, s + 1) or S == 1 and (b + step) % vocab or -1) end
    end
  end
  local opts
  if (c1.type_vocab or 0) > 0 then
    local types = l2l.zeros({ B, S }, { dtype = "i32" })
    for b = 1, B do
      for s = 1, S do types:set(b, s, s % c1.type_vocab) end
    end
    opts = { token_types = types }
  end
  return tok, tgt, opts
end

-- GPT-2's names of l2l's block records (the importer's map, the other way).
local GPT2_NAMES = {}
for _, pair in ipairs(require("l2l.gpt2").block_names) do GPT2_NAMES[pair[2]] = pair[1] end

-- The GPT-2 base: the model's weights under transformers' names, without metadata.
local function make_gpt2_base(cfg, path)
  local model = make_model(cfg)
  local entries = {}
  for i, layer in ipairs(model) do
    for _, p in ipairs(layer:params()) do
      local name
      if layer.kind == "embedding" then name = p.name .. ".weight"
      elseif layer.kind == "block" then name = ("h.%d.%s"):format(i - 2, GPT2_NAMES[p.name])
      elseif p.name:match("^ln%.") then name = "ln_f." .. p.name:match("^ln%.(.*)$") end
      if name then entries[#entries + 1] = { name = name, tensor = p.value } end
    end
  end
  l2l.safetensors.write(path, entries)
end

local function make_base(cfg, path)
  if cfg.kind == "gpt2" then return make_gpt2_base(cfg, path) end
  local model = make_model(cfg)
  if cfg.freeze then model:freeze(cfg.freeze) end
  local optimizer = cfg.optimizer == "adamw" and l2l.AdamW{ lr = 0.01, weight_decay = 0.1, state = cfg.state }
                    or cfg.optimizer == "lamb" and l2l.LAMB{ lr = 0.01, state = cfg.state }
                    or l2l.SGD{ lr = 0.05, momentum = 0.9, nesterov = true, state = cfg.state }
  local run = l2l.Relay{ model = model, micro_batch = 2, optimizer = optimizer,
                         schedule = l2l.CosineLR{ warmup = 1, total = 20, final_ratio = 0.1 },
                         accumulate = cfg.accumulate, loss_scale = cfg.loss_scale,
                         loss_scale_window = 3, seed = 5, clip_global_norm = 1, master = cfg.master }
  if cfg.policies then
    run:set_stash(3, "recompute")
    run:set_inner(2, "keep")
  end
  for step = 1, cfg.steps do run:step(batch_for(model, 4, step)) end
  run:save(path, { base = cfg.what })
  run:free()
end

----------------------------------------------------------------- the child: one case

-- Messages that show an error the loader did not mean for the user: Lua's and the FFI's
-- own, or a position added by error(msg) without level 0 or 2 somewhere inside.
-- (The runtime errors come first: a message holding one also holds a position.)
local INTERNAL = {
  { "attempt to ", "a Lua runtime error" }, { "table index is nil", "a Lua runtime error" },
  { "invalid key to 'next'", "a Lua runtime error" }, { "no integer representation", "a Lua runtime error" },
  { "bad argument", "a Lua runtime error" }, { "wrong number of arguments", "a Lua runtime error" },
  { "string length overflow", "a Lua runtime error" }, { "table overflow", "a Lua runtime error" },
  { "stack overflow", "a Lua runtime error" }, { "C stack", "a Lua runtime error" },
  { "not enough memory", "LuaJIT out of memory" }, { "bad callback", "an FFI error" },
  { "cannot convert", "an FFI conversion error" }, { "error object is", "an error that is not a string" },
  { "stack traceback", "a traceback in the message" },
  { "%.lua:%d+:", "a Lua position in the message (an error raised at the wrong level)" },
}

local function clean_error(msg, prefixes)
  if type(msg) ~= "string" then return false, "the error is a " .. type(msg) .. " value" end
  local named = false
  for _, p in ipairs(prefixes) do
    if msg:sub(1, #p) == p then named = true end
  end
  if not named then return false, "the message does not start with " .. table.concat(prefixes, " or ") end
  for _, t in ipairs(INTERNAL) do
    if msg:find(t[1]) then return false, t[2] end
  end
  return true
end

local function one_line(s)
  s = tostring(s):gsub("[\r\n]+", " | ")
  if #s > 3000 then s = s:sub(1, 3000) .. " ..." end
  return s
end

-- The most resident memory the child has had (kB), from /proc: the run reports the largest.
local function peak_rss()
  local f = io.open("/proc/self/status", "r")
  local s = f and f:read("*a") or ""
  if f then f:close() end
  return tonumber(s:match("VmHWM:%s*(%d+)")) or 0
end

local function finish(class, msg)
  io.stdout:write(("FUZZ-RSS %d\n"):format(peak_rss()))
  io.stdout:write(("FUZZ-RESULT %s %s\n"):format(class, one_line(msg or "")))
  io.stdout:flush()
  os.exit(0, true)   -- the Lua state closed: every finalizer runs (under ASan, leaks show)
end

-- The model's parameters as bytes, to tell whether a refused load_weights changed them.
local function weights_of(model)
  local out = {}
  for _, p in ipairs(model:params()) do
    out[#out + 1] = ffi.string(ffi.cast("const char *", p.value:data()), p.value:numel() * 4)
  end
  return table.concat(out)
end

-- LuaJIT keeps its values' types in the bits of NaNs and does not make a NaN read through
-- the FFI canonical: a float NaN whose payload survives into a double with the sign bit
-- and the top mantissa bits set reads as a string or a table, and using it crashes. Such
-- NaNs can only come from outside (a file's bytes): a note on stdout says that a model
-- holds one before anything can read it, so that a crash that follows is attributed.
local function note_nan_payloads(model)
  for _, p in ipairs(model:params()) do
    local u = ffi.cast("const uint32_t *", p.value:data())
    for i = 0, p.value:numel() - 1 do
      local b = u[i]
      if bit.band(b, 0x7f800000) == 0x7f800000 and bit.band(b, 0x7fffff) ~= 0
         and bit.band(bit.rshift(b, 18), 0xf) >= 2 then
        io.stdout:write(("FUZZ-NOTE nan-payload %s[%d] = 0x%08x\n"):format(p.name, i, b % 2 ^ 32))
        io.stdout:flush()
        return
      end
    end
  end
end

-- One training step (called straight from pcall, so that no position of this file gets
-- into its message): true, or false and the message.
local function step_once(run)
  local okb, tok, tgt, opts = pcall(batch_for, run.model, 2, 1)
  if not okb then return false, tok end
  local ok, err = pcall(run.step, run, tok, tgt, opts)
  if ok then ok, err = pcall(run.sync, run) end
  return ok, err
end

-- Cases that must be classified as they say (--self-test): the harness's own check.
local SELF_TESTS = {
  [1] = { expect = "crash", what = "a segmentation fault" },
  [2] = { expect = "hang", what = "an endless loop" },
  [3] = { expect = "unclean", what = "an internal error message" },
  [4] = { expect = "crash", what = "a Lua error that ends the child" },
  [5] = { expect = "crash", what = "abort()" },
  [6] = { expect = "unclean", what = "an error not naming the function" },
}

local CHILD_BUDGET = 2 ^ 30   -- bytes of host pool: the bases need well under 1 MiB

local function child(c)
  l2l.set_budget("host", CHILD_BUDGET)
  local target, path = c.target, c.path
  if target == "selftest" then
    if c.base == 1 then ffi.cast("volatile int *", 16)[0] = 1
    elseif c.base == 2 then while true do end
    elseif c.base == 3 then
      local ok, err = pcall(function() local t = nil; return t.x end)
      local okc, why = clean_error("l2l.load: " .. tostring(err), { "l2l.load: " })
      finish(okc and "clean" or "unclean", why .. " || " .. tostring(err))
    elseif c.base == 4 then error("the child fails")
    elseif c.base == 5 then
      ffi.cdef("void abort(void);")
      ffi.C.abort()
    elseif c.base == 6 then
      local okc, why = clean_error("load: no", { "l2l.load: " })
      finish(okc and "clean" or "unclean", why .. " || load: no")
    end
    finish("accepted")
  end
  local cfg = BASES[c.base]
  if cfg == nil or type(path) ~= "string" then usage("--child TARGET BASE FILE") end
  if target == "import_gpt2" then
    local ok, model = pcall(l2l.import_gpt2, path, { heads = GPT2_HEADS })
    if not ok then
      local okc, why = clean_error(model, { "l2l.import_gpt2: " })
      finish(okc and "clean" or "unclean", okc and model or (why .. " || " .. tostring(model)))
    end
    note_nan_payloads(model)
    local run = l2l.Relay{ model = model, micro_batch = 2 }
    local oks, err = step_once(run)
    if not oks then finish("unstep", "l2l.import_gpt2 accepted it, then the step failed || " .. tostring(err)) end
    run:free()
    finish("accepted")
  elseif target == "tokenizer_encoder" or target == "tokenizer_vocab" then
    -- the case's file stands for one of the two; the other is the pristine base's
    local dir = path:match("^(.*)/[^/]*$") or "."
    local encoder = target == "tokenizer_encoder" and path or dir .. "/tok-encoder.json"
    local vocab = target == "tokenizer_vocab" and path or dir .. "/tok-vocab.bpe"
    local ok, tok = pcall(l2l.tokenizer.load, encoder, vocab)
    if not ok then
      local okc, why = clean_error(tok, { "l2l.tokenizer.load: " })
      finish(okc and "clean" or "unclean", okc and tok or (why .. " || " .. tostring(tok)))
    end
    local bytes = {}
    for b = 0, 255 do bytes[#bytes + 1] = string.char(b) end
    local text = table.concat(bytes) .. " hello world, hello\n\t aaaaaaaa ===="
    local oke, back = pcall(function() return tok:decode(tok:encode(text)) end)
    if not oke or back ~= text then
      finish("unstep", "l2l.tokenizer.load accepted it, then a round trip failed || " .. tostring(back):sub(1, 200))
    end
    finish("accepted")
  elseif target == "plan" then
    local f = assert(io.open(path, "rb"))
    local chunk = assert(loadstring(f:read("*a"), "=options"))
    f:close()
    local o = setfenv(chunk, {})()
    local list = { l2l.Embedding{ vocab = V, dim = o.dim, max_seq = 8 } }
    for _ = 1, o.blocks do list[#list + 1] = l2l.Block{ dim = o.dim, heads = 2, causal = true } end
    list[#list + 1] = l2l.LMHead{ vocab = V, dim = o.dim }
    local model = l2l.Sequential(list)
    o.model, o.blocks, o.dim = model, nil, nil
    local ok, plan = pcall(l2l.plan, o)
    if not ok then
      local okc, why = clean_error(plan, { "l2l.plan: " })
      finish(okc and "clean" or "unclean", okc and plan or (why .. " || " .. tostring(plan)))
    end
    if not (plan.micro_batch >= 1 and plan.micro_batch <= o.batch and plan.device_peak <= o.device_budget) then
      finish("unstep", ("l2l.plan gave micro-batch %s of %s, peak %s within %s"):format(
        tostring(plan.micro_batch), tostring(o.batch), tostring(plan.device_peak), tostring(o.device_budget)))
    end
    local settings = { model = model, plan = plan }
    for _, k in ipairs({ "param_slots", "accumulate", "clip_global_norm", "loss_scale", "precision", "grad_precision" }) do
      settings[k] = o[k]
    end
    local okr, run = pcall(l2l.Relay, settings)
    if not okr then finish("unstep", "l2l.plan made a plan the relay it was made for refuses || " .. tostring(run)) end
    run:free()
    finish("accepted")
  elseif target == "load" then
    local ok, run = pcall(l2l.load, path)
    if not ok then
      local okc, why = clean_error(run, { "l2l.load: " })
      finish(okc and "clean" or "unclean", okc and run or (why .. " || " .. tostring(run)))
    end
    -- a device budget from the file is the file's to ask for (and l2l.load checks its
    -- range); whether the run works is asked without it: the relay's own (the file's
    -- device_budget) and the device pool's
    l2l.set_budget("device", 0)
    run:set_device_budget(0)
    note_nan_payloads(run.model)
    local oks, err = step_once(run)
    if not oks then finish("unstep", "l2l.load accepted it, then the step failed || " .. tostring(err)) end
    run:free()
    finish("accepted")
  elseif target == "load_weights" then
    local model = make_model(cfg)
    local before = weights_of(model)
    local ok, err = pcall(l2l.load_weights, model, path)
    if not ok then
      local okc, why = clean_error(err, { "l2l.load_weights: " })
      if not okc then finish("unclean", why .. " || " .. tostring(err)) end
      if weights_of(model) ~= before then finish("unclean", "the model changed although load_weights failed || " .. err) end
      finish("clean", err)
    end
    local run = l2l.Relay{ model = model, micro_batch = 2 }
    note_nan_payloads(model)
    local oks, serr = step_once(run)
    if not oks then finish("unstep", "l2l.load_weights accepted it, then the step failed || " .. tostring(serr)) end
    run:free()
    finish("accepted")
  elseif target == "open" then
    local ok, file = pcall(l2l.safetensors.open, path)
    if not ok then
      local okc, why = clean_error(file, { "safetensors.open: " })
      finish(okc and "clean" or "unclean", okc and file or (why .. " || " .. tostring(file)))
    end
    for _, name in ipairs(file.names) do
      local e = file.entries[name]
      local okr, t = pcall(file.read, file, name)
      if not okr then
        local okc, why = clean_error(t, { "file:read: " })
        file:close()
        finish(okc and "clean" or "unclean", okc and t or (why .. " || " .. tostring(t)))
      end
      local want = #e.shape > 0 and table.concat(e.shape, ",") or "1"
      if t:dtype() ~= e.dtype or table.concat(t:shape(), ",") ~= want then
        finish("unclean", ("file:read gave a tensor unlike its entry || '%s' is %s (%s), the entry %s (%s)"):format(
          name, t:dtype(), table.concat(t:shape(), ","), e.dtype, want))
      end
      t:free()
    end
    file:close()
    finish("accepted")
  end
  usage("unknown target " .. tostring(target))
end

if o.child then
  child(o.child)
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

-- The generator and the mutations, beside this file.
local here = (arg and arg[0] or "scripts/fuzz_load.lua"):match("^(.*)/[^/]*$") or "."
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

-- The class of a finished case: class, detail, output.
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
                    (out:match("(ERROR: [^\n]*)") or out:match("([^\n]*runtime error:[^\n]*)") or "?"), out
  end
  if rc == 124 or (rc == 137 and ms >= timeout * 1000 - 50) then
    return "hang", ("no result after %d s"):format(timeout), out
  end
  local class, msg = out:match("FUZZ%-RESULT (%a+) ([^\n]*)")
  if rc == 0 and class then return class, msg, out end
  local why
  if rc > 128 then why = ("killed by signal %d (%s)"):format(rc - 128, SIGNALS[rc - 128] or "?")
  elseif rc == 99 then why = "the memory limit could not be set"
  else why = ("exit status %d without a result"):format(rc) end
  local last = {}
  for line in out:gmatch("[^\n]+") do last[#last + 1] = line end
  return "crash", why .. nan .. " || " .. (last[#last] or ""), out
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

-- Defects this fuzzer found that are not fixed yet (issue 21, "Hardening"), matched
-- against a failing case's signature (signature() above). They are reported as known;
-- with --known-ok (spec/fuzz_spec.lua passes it) they do not fail the run, while any other
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
  rss = { kb = 0, case = 0 }
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
      local class, detail, out = classify(dir, c.k, o.timeout)
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
