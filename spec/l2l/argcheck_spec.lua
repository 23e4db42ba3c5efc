-- SPDX-License-Identifier: MIT
-- argcheck_spec — every public Lua function refuses what it does not understand (issue
-- 21, defect 12: `l2l.tensor(t, "i32")` gave an f32 tensor without a word): arguments
-- beyond those it takes, an option it does not know (a near miss names the option meant,
-- anything else lists the known ones) and a non-table where its options go. Each error
-- names the function and the argument and points at the caller (error level 2).
--
-- The spec finds the public functions itself: the functions of the `l2l` table, of its
-- tables l2l.ops, l2l.safetensors, l2l.dist and l2l.profile, the tensor methods
-- (l2l.Tensor), the functions of the user-facing modules l2l.text, l2l.trace,
-- l2l.progress, l2l.plot, l2l.repl and l2l.cli, and the methods of every kind of object a user holds (optimizer, schedule,
-- relay, progress bar, model, layer, safetensors file, a custom layer's call context,
-- cli.interrupt's stop, tokenizer), and the functions of l2l.tokenizer. Each must have a
-- case in `cases` below, which says how to call it validly; a public function without
-- one fails the first test. (l2l.optim, l2l.relay, l2l.gpt2 and l2l.tensor hand their
-- public functions to `l2l`, where they are found.) Every case makes a valid call first,
-- so that a refusal can only come from the one thing the test changed.
local support = dofile("spec/support.lua")
local ffi = require("ffi")
local l2l = require("l2l")
local text = require("l2l.text")
local trace = require("l2l.trace")
local progress = require("l2l.progress")
local plot = require("l2l.plot")
local repl = require("l2l.repl")
local cli = require("l2l.cli")

local function pack(...) return { n = select("#", ...), ... } end
local unpack = unpack or table.unpack

-- The deprecated schedule names warn once a process (optim_spec reads that from a child):
-- taken here, so that calling them below writes nothing into the run's output.
support.quietly(function() l2l.Constant {}; l2l.Cosine { total = 2 }; l2l.Linear { total = 2 } end)

----------------------------------------------------------------- fixtures
-- Small and fresh for every call: a case may free or change what it is given.

local T = function(shape, opts) return l2l.zeros(shape, opts) end
local function ids(shape, v) return l2l.full(shape, v or 1, { dtype = "i32" }) end

local function model()
  return l2l.Sequential {
    l2l.Embedding { vocab = 8, dim = 8, max_seq = 4, seed = 1 },
    l2l.Block { dim = 8, heads = 2, seed = 2 },
    l2l.LMHead { vocab = 8, dim = 8, seed = 3 },
  }
end
local function batch() return { tokens = ids({ 2, 4 }, 3), targets = ids({ 2, 4 }, 5) } end
-- rates shaped like a GPU's, so that planning times no layer here
local RATES = { flops = 1e12, h2d = 1e10, d2h = 1e10, optimizer = 1e9 }
local function relay() return l2l.Relay { model = model(), micro_batch = 1, optimizer_threads = 1 } end
local function stepped()
  local run = relay()
  run:step(ids({ 2, 4 }, 3), ids({ 2, 4 }, 5))
  run:sync()
  return run
end

local SINK = { write = function() end, flush = function() end }
local function bar() return progress.new { total = 3, tty = false, out = SINK } end
local function figure() return { panels = { { series = { { x = { 1, 2 }, y = { 3, 4 } } } } } } end
local function events() return { { layer = 1, phase = "forward", thread = 0, start = 0, finish = 1 } } end

local scratch = support.tmpdir()   -- a folder for the files cases write
local function path(name) return scratch .. "/" .. name end

local corpus = path("corpus.txt")
do
  local f = assert(io.open(corpus, "w"))
  f:write(("the quick brown fox jumps over the lazy dog. "):rep(20))
  f:close()
end
local CORPUS = ("the quick brown fox jumps over the lazy dog. "):rep(20)

-- A GPT-2 of dim 4, one block, vocabulary 8, 4 positions, as Hugging Face names it.
local gpt2_file = path("gpt2.safetensors")
do
  local shapes = {
    ["wte.weight"] = { 8, 4 }, ["wpe.weight"] = { 4, 4 }, ["ln_f.weight"] = { 4 }, ["ln_f.bias"] = { 4 },
    ["h.0.ln_1.weight"] = { 4 }, ["h.0.ln_1.bias"] = { 4 }, ["h.0.ln_2.weight"] = { 4 }, ["h.0.ln_2.bias"] = { 4 },
    ["h.0.attn.c_attn.weight"] = { 4, 12 }, ["h.0.attn.c_attn.bias"] = { 12 },
    ["h.0.attn.c_proj.weight"] = { 4, 4 }, ["h.0.attn.c_proj.bias"] = { 4 },
    ["h.0.mlp.c_fc.weight"] = { 4, 16 }, ["h.0.mlp.c_fc.bias"] = { 16 },
    ["h.0.mlp.c_proj.weight"] = { 16, 4 }, ["h.0.mlp.c_proj.bias"] = { 4 },
  }
  local entries = {}
  for name, shape in pairs(shapes) do
    entries[#entries + 1] = { name = name, tensor = l2l.randn(shape, { seed = support.seed, std = 0.02 }) }
  end
  l2l.safetensors.write(gpt2_file, entries)
end

-- A small vocabulary in GPT-2's file format (GPT-2's own needs npm).
local vocab_dir = dofile("spec/tokenizer_fixture.lua").write(path("vocab"))
local function tokenizer() return l2l.tokenizer.load(vocab_dir .. "/encoder.json", vocab_dir .. "/vocab.bpe") end

local metrics_file = path("metrics.jsonl")
do
  local f = assert(io.open(metrics_file, "w"))
  f:write('{"step":0,"val_loss":5.5,"loss":null}\n{"step":1,"loss":5.2,"device_peak":1024,"host_bytes":2048}\n')
  f:close()
end

local checkpoint_file = path("run.safetensors")
stepped():save(checkpoint_file)

local weights_file = path("w.safetensors")
l2l.safetensors.write(weights_file, { { name = "w", tensor = T { 2, 3 } } })

-- A layer kind written in Lua, and the context its calls get (captured in a forward).
local ArgsKind = l2l.layer_kind {
  name = "ArgsKind", options = { "width" },
  params = function(o) return { { name = "w", shape = { o.dim }, value = 1 } } end,
  forward = function(self, y, x) y:copy(x) end,
  backward = function(self, dx, dy) dx:copy(dy) end,
}
local context
do
  local Probe = l2l.layer_kind {
    name = "ArgsProbe",
    params = function(o) return { { name = "w", shape = { o.dim }, value = 1 } } end,
    forward = function(self, y, x) context = self; y:copy(x) end,
    backward = function(self, dx, dy) dx:copy(dy) end,
  }
  Probe { dim = 8 }:forward(T { 1, 2, 8 }, { training = false })
end

----------------------------------------------------------------- the cases
-- cases[name] = {
--   file = the front-end file that defines it,
--   n = how many arguments it takes (after self, for a method),
--   self = function() -> the object (methods),
--   args = function(self) -> pack(...) a valid call's arguments (default: none),
--   options = the index of its options argument, option = one option it knows,
--   options_name = what its errors call that argument (default "options"),
--   varargs = why it takes any number of arguments (no test of an extra one),
--   valid = false when no valid call can be made here (why, in a comment),
--   fname = the name its errors give (default: the case's name),
--   refusals = { {what, function(f, self) ... end (must raise), text expected}, ... }
-- }
local cases = {}
local function add(file, list)
  for name, case in pairs(list) do
    assert(cases[name] == nil, "two cases for " .. name)
    case.file = file
    cases[name] = case
  end
end

add("lua/l2l/tensor.lua", {
  ["l2l.tensor"] = { n = 2, args = function() return pack({ 1, 2 }) end, options = 2, option = "dtype",
    refusals = {
      { "a misspelt option inside the data", function(f) f { 1, 2, dtpye = "i32" } end,
        "l2l.tensor: data: unknown field 'dtpye' (did you mean 'dtype'?)" },
      { "a dtype where the options go, saying how to write it", function(f) f({ 1, 2 }, "i32") end,
        'l2l.tensor: options must be a table, got string "i32" (write { dtype = "i32" })' },
    } },
  ["l2l.empty"] = { n = 2, args = function() return pack({ 2, 3 }) end, options = 2, option = "dtype" },
  ["l2l.zeros"] = { n = 2, args = function() return pack({ 2, 3 }) end, options = 2, option = "dtype",
    refusals = { { "a pool where the options go", function(f) f({ 2 }, "device") end,
                   'l2l.zeros: options must be a table, got string "device" (write { pool = "device" })' } } },
  ["l2l.ones"] = { n = 2, args = function() return pack({ 2, 3 }) end, options = 2, option = "pool" },
  ["l2l.full"] = { n = 3, args = function() return pack({ 2 }, 7) end, options = 3, option = "dtype" },
  ["l2l.rand"] = { n = 2, args = function() return pack({ 2 }) end, options = 2, option = "seed",
    refusals = { { "a non-number bound", function(f) f({ 2 }, { hi = "1" }) end,
                   'l2l.rand: hi must be a number, got string "1"' } } },
  ["l2l.randn"] = { n = 2, args = function() return pack({ 2 }) end, options = 2, option = "std" },
  ["l2l.is_tensor"] = { n = 1, args = function() return pack(T { 1 }) end },
})

local function tensor_method(n, args, more)
  local case = { n = n, self = function() return T { 2, 3 } end, args = args }
  for k, v in pairs(more or {}) do case[k] = v end
  return case
end
add("lua/l2l/tensor.lua", {
  ["tensor:totable"] = tensor_method(0), ["tensor:data"] = tensor_method(0),
  ["tensor:ndim"] = tensor_method(0), ["tensor:shape"] = tensor_method(0),
  ["tensor:numel"] = tensor_method(0), ["tensor:dtype"] = tensor_method(0),
  ["tensor:pool"] = tensor_method(0), ["tensor:offset"] = tensor_method(0),
  ["tensor:is_freed"] = tensor_method(0), ["tensor:clone"] = tensor_method(0),
  ["tensor:free"] = tensor_method(0),
  ["tensor:dim"] = tensor_method(1, function() return pack(2) end),
  ["tensor:view"] = tensor_method(2, function() return pack(1, 1) end),
  ["tensor:reshape"] = tensor_method(1, function() return pack({ 3, 2 }) end),
  ["tensor:copy"] = tensor_method(1, function() return pack(T { 2, 3 }) end),
  ["tensor:to"] = tensor_method(1, function() return pack("pinned") end),
  ["tensor:cast"] = tensor_method(1, function() return pack("bf16") end),
  ["tensor:fill"] = tensor_method(1, function() return pack(2) end),
  ["tensor:uniform"] = tensor_method(3, function() return pack(-1, 1) end, { options = 3, option = "stream" }),
  ["tensor:normal"] = tensor_method(3, function() return pack(0, 2) end, { options = 3, option = "first" }),
  ["tensor:get"] = tensor_method(nil, function() return pack(1, 2) end,
    { varargs = "one index per dimension; a count that differs is refused (tensor_spec)" }),
  ["tensor:set"] = tensor_method(nil, function() return pack(1, 2, 5) end,
    { varargs = "one index per dimension, then the value; a count that differs is refused (tensor_spec)" }),
})

add("lua/l2l/init.lua", {
  ["l2l.pool_stats"] = { n = 1, args = function() return pack("host") end },
  ["l2l.set_pinned_cap"] = { n = 1, args = function() return pack(l2l.pool_stats("pinned").cap) end },
  ["l2l.device"] = { n = 0 },
  -- switching the device pool's backend needs every device tensor freed: not in a spec
  -- whose fixtures hold some
  ["l2l.device_use"] = { n = 1, args = function() return pack(l2l.device().backend) end, valid = false },
  ["l2l.synchronize"] = { n = 0 },
  ["l2l.cuda_tf32"] = { n = 1, args = function() return pack(false) end },
  ["l2l.set_budget"] = { n = 2, args = function() return pack("pinned", l2l.pool_stats("pinned").budget) end },
  ["l2l.reset_peak"] = { n = 1, args = function() return pack("host") end },
  ["l2l.threads"] = { n = 1 },
})

local GEMM = function() return pack(T { 2, 2 }, T { 2, 3 }, T { 3, 2 }) end
local LN = function()
  local y, mean, rstd, x = T { 2, 4 }, T { 2 }, T { 2 }, l2l.randn({ 2, 4 }, { seed = 1 })
  l2l.ops.layernorm(y, mean, rstd, x, l2l.ones { 4 }, T { 4 })
  return y, mean, rstd, x
end
local function op(n, args, more)
  local case = { n = n, args = args }
  for k, v in pairs(more or {}) do case[k] = v end
  return case
end
add("lua/l2l/ops.lua", {
  ["l2l.ops.gemm"] = op(4, GEMM, { options = 4, option = "trans_a" }),
  ["l2l.ops.gemm_batched"] = op(4, function() return pack(T { 2, 2, 2 }, T { 2, 2, 3 }, T { 2, 3, 2 }) end,
                                { options = 4, option = "alpha" }),
  ["l2l.ops.bias_add"] = op(2, function() return pack(T { 2, 3 }, T { 3 }) end),
  ["l2l.ops.bias_backward"] = op(2, function() return pack(T { 3 }, T { 2, 3 }) end),
  ["l2l.ops.add"] = op(3, function() return pack(T { 2, 3 }, T { 2, 3 }, T { 2, 3 }) end),
  ["l2l.ops.gelu"] = op(2, function() return pack(T { 2, 3 }, T { 2, 3 }) end),
  ["l2l.ops.gelu_backward"] = op(3, function() return pack(T { 2, 3 }, T { 2, 3 }, T { 2, 3 }) end),
  ["l2l.ops.layernorm"] = op(7, function() return pack(T { 2, 4 }, nil, nil, T { 2, 4 }, l2l.ones { 4 }, T { 4 }) end),
  ["l2l.ops.layernorm_backward"] = op(8, function()
    local _, mean, rstd, x = LN()
    return pack(T { 2, 4 }, T { 4 }, T { 4 }, T { 2, 4 }, x, l2l.ones { 4 }, mean, rstd)
  end),
  ["l2l.ops.softmax"] = op(3, function() return pack(T { 1, 1, 3, 3 }, T { 1, 1, 3, 3 }) end,
                           { options = 3, option = "causal" }),
  ["l2l.ops.softmax_backward"] = op(4, function()
    return pack(T { 1, 1, 3, 3 }, T { 1, 1, 3, 3 }, l2l.full({ 1, 1, 3, 3 }, 1 / 3))
  end),
  ["l2l.ops.embedding"] = op(3, function() return pack(T { 2, 4 }, ids({ 2 }), T { 5, 4 }) end),
  ["l2l.ops.embedding_backward"] = op(3, function() return pack(T { 5, 4 }, T { 2, 4 }, ids({ 2 })) end),
  ["l2l.ops.cross_entropy"] = op(4, function() return pack(T { 2 }, T { 2, 5 }, ids({ 2 })) end),
  ["l2l.ops.cross_entropy_backward"] = op(5, function() return pack(T { 2, 5 }, T { 2, 5 }, ids({ 2 })) end),
  ["l2l.ops.dropout"] = op(5, function() return pack(T { 8 }, T({ 1 }, { dtype = "u8" }), T { 8 }, 0.5) end,
                           { options = 5, option = "seed" }),
  ["l2l.ops.dropout_backward"] = op(4, function() return pack(T { 8 }, T { 8 }, T({ 1 }, { dtype = "u8" }), 0.5) end),
  ["l2l.ops.sum"] = op(1, function() return pack(T { 3 }) end),
  ["l2l.ops.max_abs"] = op(1, function() return pack(T { 3 }) end),
  ["l2l.ops.norm2"] = op(1, function() return pack(T { 3 }) end),
  ["l2l.ops.adamw"] = op(6, function() return pack(T { 3 }, T { 3 }, T { 3 }, T { 3 }, { lr = 0.1 }, 1) end,
                         { options = 5, option = "beta1", options_name = "config" }),
})

local function constructor(args, option) return { n = 1, args = args, options = 1, option = option } end
add("lua/l2l/optim.lua", {
  ["l2l.SGD"] = constructor(function() return pack({ lr = 0.1 }) end, "momentum"),
  ["l2l.AdamW"] = constructor(nil, "weight_decay"),
  ["l2l.LAMB"] = constructor(nil, "eps"),
  ["l2l.ConstantLR"] = constructor(nil, "warmup"),
  ["l2l.CosineLR"] = constructor(function() return pack({ total = 10 }) end, "final_ratio"),
  ["l2l.LinearLR"] = constructor(function() return pack({ total = 10 }) end, "warmup"),
  -- the old names, deprecated (their one warning each is taken quietly below)
  ["l2l.Constant"] = constructor(nil, "warmup"),
  ["l2l.Cosine"] = constructor(function() return pack({ total = 10 }) end, "final_ratio"),
  ["l2l.Linear"] = constructor(function() return pack({ total = 10 }) end, "warmup"),
  ["l2l.is_optimizer"] = { n = 1, args = function() return pack(l2l.SGD {}) end },
  ["l2l.is_schedule"] = { n = 1, args = function() return pack(l2l.ConstantLR {}) end },
  ["optimizer:fill"] = { n = 1, self = function() return l2l.AdamW {} end,
                         args = function() return pack(ffi.new("l2l_optimizer_config")) end },
  ["optimizer:config"] = { n = 0, self = function() return l2l.SGD {} end },
  ["schedule:fill"] = { n = 1, self = function() return l2l.CosineLR { total = 5 } end,
                        args = function() return pack(ffi.new("l2l_schedule_config")) end },
  ["schedule:config"] = { n = 0, self = function() return l2l.LinearLR { total = 5 } end },
  ["schedule:lr"] = { n = 2, self = function() return l2l.CosineLR { total = 5 } end,
                      args = function() return pack(0.1, 2) end },
})

local function run_method(n, args, more)
  local case = { n = n, self = relay, args = args }
  for k, v in pairs(more or {}) do case[k] = v end
  return case
end
add("lua/l2l/relay.lua", {
  ["l2l.Relay"] = constructor(function() return pack({ model = model() }) end, "micro_batch"),
  ["l2l.is_relay"] = { n = 1, args = function() return pack({}) end },
  ["run:free"] = run_method(0),
  ["run:step"] = run_method(3, function() return pack(ids({ 2, 4 }, 3), ids({ 2, 4 }, 5)) end,
                            { options = 3, option = "skip", options_name = "opts" }),
  ["run:evaluate"] = run_method(3, function() return pack(ids({ 2, 4 }, 3), ids({ 2, 4 }, 5)) end,
                                { options = 3, option = "key_mask", options_name = "opts" }),
  ["run:sync"] = run_method(0),
  ["run:set_stash"] = run_method(2, function() return pack(2, "device") end),
  ["run:set_inner"] = run_method(2, function() return pack(2, "keep") end),
  ["run:set_micro_batch"] = run_method(1, function() return pack(2) end),
  ["run:set_device_budget"] = run_method(1, function() return pack(2 ^ 30) end),
  ["run:set_host_budget"] = run_method(1, function() return pack(2 ^ 30) end),
  ["run:stats"] = run_method(0),
  ["run:step_peak"] = run_method(3, function() return pack(2, 4) end,
                                 { options = 3, option = "token_types", options_name = "opts" }),
  ["run:events"] = run_method(0),
  ["run:trace"] = run_method(2, function() return pack(path("trace.json")) end,
                             { options = 2, option = "name", options_name = "opts" }),
  ["run:state"] = { n = 2, self = stepped, args = function(run) return pack(run.model:params()[1], "v") end },
  ["run:save"] = run_method(2, function() return pack(path("saved.safetensors"), { note = "x" }) end),
  ["run:plan_report"] = { n = 0, self = function()
    local m = model()
    local run = l2l.Relay { model = m, optimizer_threads = 1, plan = l2l.plan { model = m, batch = 2, seq = 4,
                            device_budget = 2 ^ 30, rates = RATES } }
    run:step(ids({ 2, 4 }, 3), ids({ 2, 4 }, 5))
    return run
  end },
})

add("lua/l2l/plan.lua", {
  ["l2l.plan"] = constructor(function()
    return pack({ model = model(), batch = 2, seq = 4, device_budget = 2 ^ 30, rates = RATES })
  end, "device_budget"),
  ["l2l.calibrate"] = { n = 1, args = function() return pack({ remeasure = false }) end, options = 1,
                        option = "remeasure" },
})

-- Their valid calls would start MPI in the spec runner: spec/l2l/dist_spec.lua makes them
-- under mpirun. What is checked here comes before MPI is asked for.
add("lua/l2l/dist.lua", {
  ["l2l.dist.init"] = { n = 0, valid = false },
  ["l2l.dist.rank"] = { n = 0, valid = false },
  ["l2l.dist.size"] = { n = 0, valid = false },
  ["l2l.dist.barrier"] = { n = 0, valid = false },
  ["l2l.dist.sum"] = { n = 1, valid = false, args = function() return pack({ 1, 2 }) end,
    refusals = { { "a string", function(f) f("1") end, "l2l.dist.sum: x must be a number or a list of numbers, got string" },
                 { "an empty list", function(f) f({}) end, "l2l.dist.sum: x must hold 1 to 2^24 numbers, got 0" },
                 { "a list with a string in it", function(f) f({ 1, "2" }) end, "l2l.dist.sum: x[2] must be a number, got string \"2\"" } } },
  ["l2l.dist.set_timeout"] = { n = 1, args = function() return pack(300) end },
  ["l2l.dist.abort"] = { n = 1, valid = false, args = function() return pack("message") end },
})

-- A valid start starts a profile: each call's arguments stop the last one first.
add("lua/l2l/profile.lua", {
  ["l2l.profile.start"] = { n = 1, args = function() l2l.profile.stop(); return pack({ skip = 0 }) end,
                            options = 1, option = "skip" },
  ["l2l.profile.stop"] = { n = 0 },
  ["l2l.profile.report"] = { n = 0 },
  ["l2l.profile.write"] = { n = 2, args = function() return pack(path("profile.tsv"), { overwrite = true }) end,
                            options = 2, option = "overwrite" },
  ["l2l.profile.table"] = { n = 1, args = function() return pack(80) end },
})

add("lua/l2l/gpt2.lua", {
  ["l2l.import_gpt2"] = { n = 2, args = function() return pack(gpt2_file, { heads = 1 }) end, options = 2,
                          option = "max_seq", options_name = "opts" },
})

add("lua/l2l/tokenizer.lua", {
  ["l2l.tokenizer.load"] = { n = 2, args = function() return pack(vocab_dir .. "/encoder.json", vocab_dir .. "/vocab.bpe") end },
  ["l2l.tokenizer.gpt2"] = { n = 1, args = function() return pack({ dir = vocab_dir }) end, options = 1,
                             option = "fetch", options_name = "opts" },
  ["l2l.tokenizer.is_tokenizer"] = { n = 1, args = function() return pack({}) end },
  ["l2l.tokenizer.cache_dir"] = { n = 0 },
  ["tok:encode"] = { n = 1, self = tokenizer, args = function() return pack("hello world") end },
  ["tok:decode"] = { n = 1, self = tokenizer, args = function() return pack({ 1, 2 }) end },
})

add("lua/l2l/text.lua", {
  ["text.files"] = { n = 2, args = function() return pack(scratch, { pattern = "%.txt$" }) end, options = 2,
                     option = "pattern", options_name = "opts",
    refusals = { { "a pattern that is no Lua pattern", function(f) f(scratch, { pattern = "[" }) end,
                   "text.files: opts.pattern must be a Lua pattern" } } },
  ["text.corpus"] = { n = 2, args = function() return pack({ corpus }, { max_bytes = 100 }) end, options = 2,
                      option = "max_bytes", options_name = "opts",
    refusals = { { "an order it does not know", function(f) f({ corpus }, { order = "random" }) end,
                   'text.corpus: opts.order must be "mixed" or "path", got string "random"' } } },
  ["text.load"] = { n = 2, args = function() return pack({ corpus }, 100) end },
  ["text.split"] = { n = 2, args = function() return pack(CORPUS, 0.1) end },
  ["text.printable"] = { n = 1, args = function() return pack("caf\xc3\xa9\r") end },
  ["text.batch"] = { n = 6, args = function() return pack(CORPUS, 2, 4, 1, 1) end, options = 6, option = "first",
                     options_name = "opts",
                     refusals = { { "a seed that is not an integer", function(f) f(CORPUS, 2, 4, "1", 1) end,
                                    "text.batch: seed must be an integer >= 0, got 1" } } },
})

add("lua/l2l/trace.lua", {
  ["trace.lane_name"] = { n = 1, args = function() return pack(3) end },
  ["trace.chrome"] = { n = 2, args = function() return pack(events()) end, options = 2, option = "name",
                       options_name = "opts" },
  ["trace.write"] = { n = 3, args = function() return pack(path("t.json"), events()) end, options = 3,
                      option = "name", options_name = "opts" },
})

local function bar_method(n, args, more)
  local case = { n = n, self = bar, args = args }
  for k, v in pairs(more or {}) do case[k] = v end
  return case
end
add("lua/l2l/progress.lua", {
  ["progress.now"] = { n = 0 },
  ["progress.is_terminal"] = { n = 0 },
  ["progress.columns"] = { n = 0 },
  ["progress.bytes"] = { n = 1, args = function() return pack(1536) end },
  ["progress.count"] = { n = 1, args = function() return pack(12345) end },
  ["progress.duration"] = { n = 1, args = function() return pack(95) end },
  ["progress.new"] = constructor(function() return pack({ total = 3, tty = false, out = SINK }) end, "every"),
  ["bar:eta"] = bar_method(1, function() return pack(1) end),
  ["bar:line"] = bar_method(2, function() return pack(1, { loss = 2 }) end,
                            { options = 2, option = "val_loss", options_name = "fields" }),
  ["bar:update"] = bar_method(2, function() return pack(1, { loss = 2 }) end,
                              { options = 2, option = "tokens_per_s", options_name = "fields" }),
  ["bar:print"] = bar_method(1, function() return pack("a line") end),
  ["bar:finish"] = bar_method(0),
})

local function figure_with(edit)
  local fig = figure()
  edit(fig)
  return fig
end
add("lua/l2l/plot.lua", {
  ["plot.axis"] = { n = 3, args = function() return pack(0, 40, 8) end },
  ["plot.have_gnuplot"] = { n = 0 },
  ["plot.svg"] = { n = 2, args = function() return pack(figure()) end, options = 2, option = "width",
                   options_name = "opts",
    refusals = {
      { "a misspelt field of the figure", function(f) f(figure_with(function(g) g.titel = "x" end)) end,
        "plot.svg: figure: unknown field 'titel' (did you mean 'title'?)" },
      { "a misspelt field of a panel", function(f) f(figure_with(function(g) g.panels[1].ylable = "x" end)) end,
        "plot.svg: figure.panels[1]: unknown field 'ylable' (did you mean 'ylabel'?)" },
      { "a misspelt field of a series",
        function(f) f(figure_with(function(g) g.panels[1].series[1].color = "#000000" end)) end,
        "plot.svg: figure.panels[1].series[1]: unknown field 'color' (did you mean 'colour'?)" },
      { "an unknown field of a reference line",
        function(f) f(figure_with(function(g) g.panels[1].hlines = { { y = 1, dashed = true } } end)) end,
        "plot.svg: figure.panels[1].hlines[1]: unknown field 'dashed' (known fields: name, y)" },
    } },
  ["plot.write"] = { n = 3, args = function() return pack(path("fig"), figure(), { format = "svg" }) end,
                     options = 3, option = "format", options_name = "opts" },
  ["plot.read_metrics"] = { n = 1, args = function() return pack(metrics_file) end },
  ["plot.metrics_line"] = { n = 1, args = function() return pack({ step = 1, loss = 0 / 0 }) end },
  ["plot.metrics_figure"] = { n = 2, args = function() return pack({ { step = 1, loss = 2 } }, { title = "t" }) end,
                              options = 2, option = "title", options_name = "opts" },
  ["plot.main"] = { n = 1, args = function() return pack({ metrics_file, path("curves.svg") }) end },
})

add("lua/l2l/cli.lua", {
  ["cli.parser"] = { n = 1, args = function() return pack({ name = "args", flags = { { "--steps", 3, "int", "steps" } } }) end,
                     options = 1, option = "flags",
    refusals = { { "a misspelt field of a flag", function(f) f { name = "x", flags = { { "--n", 1, "int", "n", mni = 1 } } } end,
                   "cli.parser: flags[1]: unknown field 'mni' (did you mean 'min'?)" },
                 { "a kind it does not know", function(f) f { name = "x", flags = { { "--n", 1, "integer", "n" } } } end,
                   "cli.parser: flags[1][3] (--n) must be int, number, string, choice, flag or list" } } },
  ["cli.option_flags"] = { n = 1, args = function() return pack({ skip = { seed = true }, defaults = { lr = 0.1 } }) end,
                           options = 1, option = "skip" },
  ["cli.parse"] = { n = 2, args = function() return pack(cli.parser { name = "args" }, {}) end },
  ["cli.given"] = { n = 2, args = function() return pack(cli.parse(cli.parser { name = "args" }, {}), "steps") end },
  -- these end the process: no valid call here (examples_spec runs them)
  ["cli.usage_error"] = { n = 1, args = function() return pack("wrong") end, valid = false },
  ["cli.fail"] = { n = 1, args = function() return pack("failed") end, valid = false },
  ["cli.corpus"] = { n = 1, args = function() return pack({ data = { corpus }, max_bytes = 100 }) end },
  ["cli.interrupt"] = { n = 1, args = function() return pack("stopping") end,
    refusals = { { "a misspelt option", function(f) f { dsit = "mpi" } end,
                   "cli.interrupt: options: unknown field 'dsit' (did you mean 'dist'?)" },
                 { "a dist it does not know", function(f) f { dist = "nccl" } end,
                   "cli.interrupt: dist must be 'mpi' or 'none', got string \"nccl\"" },
                 { "a message that is not a string", function(f) f { message = 3 } end,
                   "cli.interrupt: message must be a string, got number 3" } } },
  ["stop:requested"] = { n = 0, self = function() return cli.interrupt() end },
  ["stop:signal"] = { n = 0, self = function() return cli.interrupt() end },
  ["stop:release"] = { n = 0, self = function() return cli.interrupt() end },
  ["stop:finish"] = { n = 0, self = function() return cli.interrupt() end },
})

add("lua/l2l/repl.lua", {
  ["repl.format"] = { n = 1, args = function() return pack({ 1, 2 }) end },
  ["repl.complete"] = { n = 1, args = function() return pack("l2l.ze") end },
  ["repl.show"] = { varargs = "prints every value it is given, like print" },
})

local function layer_ctor(args, option) return { n = 1, args = args, options = 1, option = option } end
add("lua/l2l/layers.lua", {
  ["l2l.Embedding"] = layer_ctor(function() return pack({ vocab = 8, dim = 8, max_seq = 4 }) end, "max_seq"),
  ["l2l.Block"] = layer_ctor(function() return pack({ dim = 8, heads = 2 }) end, "heads"),
  ["l2l.LMHead"] = layer_ctor(function() return pack({ vocab = 8, dim = 8 }) end, "vocab"),
  ["l2l.Classifier"] = layer_ctor(function() return pack({ dim = 8, classes = 3 }) end, "classes"),
  ["l2l.is_layer"] = { n = 1, args = function() return pack({}) end },
})
local function block() return l2l.Block { dim = 8, heads = 2 } end
local function layer_method(n, args, more)
  local case = { n = n, self = block, args = args }
  for k, v in pairs(more or {}) do case[k] = v end
  return case
end
local function forwarded(layer)
  local x = T { 2, 4, 8 }
  layer:forward(x, {})
  return x
end
add("lua/l2l/layers.lua", {
  ["layer:label"] = layer_method(0), ["layer:name"] = layer_method(0), ["layer:free"] = layer_method(0),
  ["layer:config"] = layer_method(0), ["layer:nparams"] = layer_method(0), ["layer:params"] = layer_method(0),
  ["layer:zero_grad"] = layer_method(0), ["layer:clone"] = layer_method(0),
  ["layer:rng_id"] = layer_method(1, function() return pack(7) end),
  ["layer:set_memory"] = layer_method(1, function() return pack("frugal") end),
  ["layer:memory"] = layer_method(2, function() return pack(2, 4) end),
  ["layer:saved_bytes"] = layer_method(2, function() return pack(2, 4) end),
  ["layer:tie_to"] = { n = 1, self = function() return l2l.LMHead { vocab = 8, dim = 8 } end,
                       args = function() return pack(l2l.Embedding { vocab = 8, dim = 8, max_seq = 4 }) end },
  ["layer:forward"] = layer_method(2, function() return pack(T { 2, 4, 8 }, { seed = 1 }) end,
    { refusals = { { "a misspelt field of the batch", function(f, self) f(self, T { 2, 4, 8 }, { sede = 1 }) end,
                     "did you mean 'seed'" } } }),
  ["layer:backward"] = layer_method(2, function(self) forwarded(self); return pack(T { 2, 4, 8 }, {}) end),
})

add("lua/l2l/model.lua", {
  ["l2l.Sequential"] = { n = 1, args = function() return pack({ block() }) end,
    refusals = { { "a named field in the list of layers", function(f) f { block(), micro_batch = 2 } end,
                   "unknown field 'micro_batch'" } } },
  ["l2l.is_sequential"] = { n = 1, args = function() return pack({}) end },
})
local function model_method(n, args, more)
  local case = { n = n, self = model, args = args }
  for k, v in pairs(more or {}) do case[k] = v end
  return case
end
add("lua/l2l/model.lua", {
  ["model:layer"] = model_method(1, function() return pack(2) end),
  ["model:insert"] = model_method(2, function() return pack(2, block()) end),
  ["model:add"] = model_method(1, function() return pack(block()) end),
  ["model:remove"] = model_method(1, function() return pack(2) end),
  ["model:replace"] = model_method(2, function() return pack(2, block()) end),
  ["model:clone"] = model_method(2, function() return pack(2, 3) end),
  ["model:freeze"] = model_method(1, function() return pack(2) end),
  ["model:unfreeze"] = model_method(1, function() return pack(2) end),
  ["model:frozen"] = model_method(1, function() return pack(2) end),
  ["model:params"] = model_method(0), ["model:nparams"] = model_method(0), ["model:zero_grad"] = model_method(0),
  ["model:forward"] = model_method(1, function() return pack(batch()) end,
    { refusals = { { "a misspelt field of the batch", function(f, self)
                       local b = batch(); b.targest, b.targets = b.targets, nil; f(self, b) end,
                     "did you mean 'targets'" } } }),
  ["model:backward"] = model_method(1, function(m) local b = batch(); m:forward(b); return pack(b) end),
  ["model:generate"] = model_method(3, function() return pack({ 1, 2 }, 2) end,
                                    { options = 3, option = "top_k", options_name = "opts" }),
})

add("lua/l2l/custom.lua", {
  ["l2l.layer_kind"] = { n = 1, args = function()
    return pack { name = "ArgsKind2", params = function() return {} end, forward = function() end,
                  backward = function() end }
  end },
  -- a kind's constructor (l2l.layer_kind's result); errors carry the kind's name
  ["ArgsKind"] = { generated = true, n = 1, args = function() return pack({ dim = 8, width = 2 }) end,
                   options = 1, option = "width" },
})
-- The call context exists only during a custom layer's forward or backward: no valid
-- call here; the refusals come before anything is read.
local function context_method(n, args)
  return { n = n, self = function() return context end, args = args, valid = false }
end
add("lua/l2l/custom.lua", {
  ["self:borrow"] = context_method(1, function() return pack(nil) end),
  ["self:param"] = context_method(1, function() return pack("w") end),
  ["self:grad"] = context_method(1, function() return pack("w") end),
  ["self:empty"] = context_method(1, function() return pack({ 2 }) end),
  ["self:zeros"] = context_method(1, function() return pack({ 2 }) end),
  ["self:reshape"] = context_method(2, function() return pack(T { 2, 3 }, { 3, 2 }) end),
  ["self:view"] = context_method(3, function() return pack(T { 2, 3 }, 1, 1) end),
})

add("lua/l2l/checkpoint.lua", {
  ["l2l.load"] = { n = 2, args = function() return pack(checkpoint_file) end, options = 2, option = "micro_batch",
                   options_name = "overrides" },
  ["l2l.load_weights"] = { n = 2, args = function() return pack(model(), checkpoint_file) end },
  ["l2l.checkpoint_info"] = { n = 1, args = function() return pack(checkpoint_file) end },
  ["l2l.load_model"] = { n = 2, args = function() return pack(checkpoint_file) end, options = 2, option = "kinds",
                         options_name = "opts" },
})

add("lua/l2l/safetensors.lua", {
  ["l2l.safetensors.open"] = { n = 1, fname = "safetensors.open", args = function() return pack(weights_file) end },
  ["l2l.safetensors.open_as"] = { n = 2, fname = "safetensors.open_as",
    args = function() return pack("l2l.load", weights_file) end,
    refusals = {
      { "a loader's name that is no string", function(f) return f(7, weights_file) end,
        "safetensors.open_as: fname must be a non-empty string" },
      { "a missing file, in the loader's words with no position",
        function(f)   -- the message as it starts
          local _, err = pcall(f, "my.loader", scratch .. "/no-such-file")
          error("[" .. tostring(err):sub(1, 11) .. "]", 0)
        end, "[my.loader: ]" },
    } },
  ["l2l.safetensors.write"] = { n = 3, fname = "safetensors.write",
    args = function() return pack(path("x.safetensors"), { { name = "w", tensor = T { 2 } } }) end,
    refusals = { { "an unknown field of an entry", function(f)
                     f(path("y.safetensors"), { { name = "w", tensor = T { 2 }, dtpye = "f16" } }) end,
                   "unknown field 'dtpye'" },
                 { "a dtype beside a tensor (it would not convert)", function(f)
                     f(path("y.safetensors"), { { name = "w", tensor = T { 2 }, dtype = "f16" } }) end,
                   "shape and dtype go with produce" } } },
  ["file:read"] = { n = 2, self = function() return l2l.safetensors.open(weights_file) end,
                    args = function() return pack("w") end },
  ["file:verify"] = { n = 0, self = function() return l2l.safetensors.open(weights_file) end },
  ["file:close"] = { n = 0, self = function() return l2l.safetensors.open(weights_file) end },
})

----------------------------------------------------------------- finding the public functions

local public = {}   -- name -> function

local function functions_of(prefix, t)
  for k, v in pairs(t) do
    if type(k) == "string" and type(v) == "function" and not k:match("^__") then public[prefix .. k] = v end
  end
end

for k, v in pairs(l2l) do
  if type(v) == "function" then
    public["l2l." .. k] = v
  elseif k == "ops" then
    functions_of("l2l.ops.", v)
  elseif k == "safetensors" then
    functions_of("l2l.safetensors.", v)
    functions_of("file:", v.File)
  elseif k == "Tensor" then
    functions_of("tensor:", v)
  elseif k == "tokenizer" then
    functions_of("l2l.tokenizer.", v)
  elseif k == "dist" then
    functions_of("l2l.dist.", v)
  elseif k == "profile" then
    functions_of("l2l.profile.", v)
  elseif type(v) == "table" then
    public["l2l." .. k .. " (a table of functions: teach this spec to look inside)"] = v
  end
end
functions_of("text.", text)
functions_of("trace.", trace)
functions_of("progress.", progress)
functions_of("plot.", plot)
functions_of("repl.", repl)
functions_of("cli.", cli)
local function methods_of(prefix, object) functions_of(prefix, getmetatable(object).__index) end
methods_of("optimizer:", l2l.AdamW {})
methods_of("schedule:", l2l.ConstantLR {})
methods_of("run:", relay())
methods_of("bar:", bar())
methods_of("model:", model())
methods_of("layer:", block())
methods_of("self:", context)
methods_of("tok:", tokenizer())
methods_of("stop:", cli.interrupt())
public.ArgsKind = ArgsKind

----------------------------------------------------------------- calling

local SOURCE = debug.getinfo(1, "S").short_src

-- Calls f as a user does, from this file (no tail call: the error must point here), with
-- self first for a method; returns false and the message when it raises.
local function call(f, self, args)
  local all = args
  if self ~= nil then all = pack(self, unpack(args, 1, args.n)) end
  local line
  local ok, err = pcall(function()
    line = debug.getinfo(1, "l").currentline + 1
    local result = f(unpack(all, 1, all.n))
    return result
  end)
  return ok, tostring(err), line
end

local function arguments(case, self)
  if case.args == nil then return pack() end
  return case.args(self)
end

local function make_valid_call(name, case, f)
  if case.valid == false then return end
  local self = case.self and case.self()
  local ok, err = call(f, self, arguments(case, self))
  assert(ok, "the case's valid call of " .. name .. " failed (fix the case): " .. err)
end

-- The message of a refused call, checked to start with this file's position of the call
-- and the function's name.
local function refused(name, case, f, self, args)
  local ok, err, line = call(f, self, args)
  assert(not ok, name .. " accepted it")
  local fname = case.fname or name
  local prefix = ("%s:%d: %s: "):format(SOURCE, line, fname)
  assert(err:sub(1, #prefix) == prefix,
         ("the error must point at the caller (%s:%d) and name %s:\n  %s"):format(SOURCE, line, fname, err))
  return err:sub(#prefix + 1)
end

local function contains(message, want)
  assert(message:find(want, 1, true), ("expected %q in the message:\n  %s"):format(want, message))
end

-- A near miss of an option name: two neighbouring letters swapped (or one dropped).
local function misspell(word)
  local i = math.max(1, math.floor(#word / 2))
  local s = word:sub(1, i - 1) .. word:sub(i + 1, i + 1) .. word:sub(i, i) .. word:sub(i + 2)
  if s == word then s = word:sub(1, i - 1) .. word:sub(i + 1) end
  return s
end

-- The valid arguments with the options argument replaced by `value`, or by a copy of the
-- valid options with `key` added.
local function with_options(case, self, value, key)
  local args = arguments(case, self)
  local i = case.options
  if key ~= nil then
    local o = {}
    for k, v in pairs(args[i] or {}) do o[k] = v end
    o[key] = 1
    value = o
  end
  args[i] = value
  args.n = math.max(args.n, i)
  return args
end

----------------------------------------------------------------- the tests

local names = {}
for name in pairs(cases) do names[#names + 1] = name end
table.sort(names)

describe("arguments: every public Lua function (seed " .. support.seed .. ")", function()
  teardown(function()
    l2l.profile.stop()
    os.execute("rm -rf " .. scratch)
    cli.interrupt():release()   -- the cases caught the stop signals: let go of them
  end)

  it("has a case in arguments_spec.lua, and every case is a public function", function()
    local missing, stale = {}, {}
    for name in pairs(public) do
      if cases[name] == nil then missing[#missing + 1] = name end
    end
    for name, case in pairs(cases) do
      if public[name] == nil then stale[#stale + 1] = name end
      if case.varargs == nil and type(case.n) ~= "number" then stale[#stale + 1] = name .. " (no n)" end
    end
    table.sort(missing)
    table.sort(stale)
    assert(#missing == 0, "public functions without a case: " .. table.concat(missing, ", "))
    assert(#stale == 0, "cases that are no public function: " .. table.concat(stale, ", "))
  end)

  for _, name in ipairs(names) do
    local case = cases[name]
    local f = public[name]
    local test = it

    if not case.varargs then
      local n = case.n
      local takes = n == 0 and "no arguments" or n == 1 and "1 argument (" or n .. " arguments ("
      test(("%s refuses an argument beyond its %d"):format(name, n), function()
        make_valid_call(name, case, f)
        local self = case.self and case.self()
        local args = arguments(case, self)
        args[n + 1], args.n = "stray", n + 1
        local msg = refused(name, case, f, self, args)
        contains(msg, "takes " .. takes)
        contains(msg, ", got " .. (n + 1))
      end)
    end

    if case.options then
      local option, what = case.option, case.options_name or "options"
      local near = misspell(option)
      test(("%s refuses a misspelt option ('%s'), naming the one meant"):format(name, near), function()
        make_valid_call(name, case, f)
        local self = case.self and case.self()
        local msg = refused(name, case, f, self, with_options(case, self, nil, near))
        contains(msg, ("unknown option '%s' (did you mean '%s'?)"):format(near, option))
      end)
      test(name .. " refuses an unknown option, listing the known ones", function()
        local self = case.self and case.self()
        local msg = refused(name, case, f, self, with_options(case, self, nil, "no_such_option"))
        contains(msg, "unknown option 'no_such_option' (known options: ")
        local list = msg:match("%(known options: ([^)]*)%)")
        local listed = {}
        for k in list:gmatch("[^, ]+") do listed[k] = true end
        assert(listed[option], ("'%s' is not among the known options listed: %s"):format(option, msg))
      end)
      test(("%s refuses a string where its %s go"):format(name, what), function()
        local self = case.self and case.self()
        local msg = refused(name, case, f, self, with_options(case, self, "i32"))
        contains(msg, what .. ' must be a table, got string "i32"')
      end)
    end

    for _, r in ipairs(case.refusals or {}) do
      local what, attempt, want = r[1], r[2], r[3]
      test(("%s refuses %s"):format(name, what), function()
        local self = case.self and case.self()
        local ok, err = pcall(attempt, f, self)
        assert(not ok, name .. " accepted " .. what)
        contains(tostring(err), want)
      end)
    end
  end
end)

describe("arguments: l2l.argcheck's checks", function()
  local argcheck = require("l2l.argcheck")
  it("leave a valid call as it was: the options table itself comes back, an empty one for nil", function()
    local o = { dtype = "f32" }
    assert.are.equal(o, argcheck.options(o, { dtype = true }, "f", 2))
    local none = argcheck.options(nil, { dtype = true }, "f", 2)
    assert.are.equal(nil, next(none))
    assert.has_error(function() none.dtype = "i32" end)   -- shared: read-only
  end)

  it("find an unknown key among many (past the four looked at without a loop)", function()
    local known = { a = true, b = true, c = true, d = true, e = true, f = true }
    local o = { a = 1, b = 2, c = 3, d = 4, e = 5, f = 6 }
    assert.are.equal(o, argcheck.options(o, known, "f", 2))
    o.g = 7
    local ok, err = pcall(argcheck.options, o, known, "f", 0)
    assert.is_false(ok)
    assert.are.equal("f: unknown option 'g' (known options: a, b, c, d, e, f)", err)
    ok, err = pcall(argcheck.options, { [1] = "i32" }, known, "f", 0)
    assert.are.equal("f: unknown option [1] (known options: a, b, c, d, e, f)", err)
  end)

  it("count the arguments a function takes in its message", function()
    local function message(params, ...)
      local ok, err = pcall(argcheck.too_many, "f", params, 0, ...)
      assert.is_false(ok)
      return err
    end
    assert.are.equal("f: takes no arguments, got 1", message("", 1))
    assert.are.equal("f: takes 1 argument (x), got 3", message("x", nil, nil))
    assert.are.equal("f: takes 2 arguments (shape, options), got 3", message("shape, options", "x"))
  end)
end)
