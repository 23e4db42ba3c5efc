-- SPDX-License-Identifier: MIT
-- scripts/fuzz/child.lua — one fuzz case, in the child process that runs it (scripts/
-- fuzz_load.lua loads it for `--child TARGET BASE FILE`): the target called on the case's
-- file, and what came of it written as the child's result line.
--
-- Purpose: the classes of the fuzzer's header, decided where the case runs: a clean error
-- (the called function's name first, no internal Lua or FFI error), accepted (and the
-- result then works: a training step, a tokenizer round trip, a relay taking the plan),
-- unclean, or unstep; the parent reads "FUZZ-RESULT class message" and the peak memory
-- ("FUZZ-RSS"), and counts a child without them as a crash. The self-test's cases (a
-- segmentation fault, a hang, ...) live here too, to check the parent's classification.
-- Must never: write anything on stdout but its notes and result lines, or return to the
-- parent's code (finish exits).
local l2l, bases, usage = ...
local ffi = require("ffi")
local BASES, V, GPT2_HEADS = bases.BASES, bases.V, bases.GPT2_HEADS
local make_model, batch_for = bases.make_model, bases.batch_for

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
    -- a device or host budget from the file is the file's to ask for (and l2l.load checks
    -- their range; a relay may be saved with a budget its step refuses, which that step
    -- says, naming the smallest that works); whether the run works is asked without them:
    -- the relay's own (the file's device_budget and host_budget) and the device pool's
    l2l.set_budget("device", 0)
    run:set_device_budget(0)
    run:set_host_budget(0)
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

return { child = child, SELF_TESTS = SELF_TESTS, one_line = one_line }
