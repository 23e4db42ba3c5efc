-- train_gpt.lua — what `make demo` runs: a byte-level GPT trained with the relay on real
-- text, in less device memory than its parameters and optimizer state take.
--
--   build/l2l examples/train_gpt.lua [--steps 400 --layers 4 --dim 128 ...]   (--help)
--
-- The defaults (4 blocks of width 128, context 64, 32 sequences per step, 400 steps) put
-- 12.7 MiB of parameters and optimizer state behind a 6 MiB device budget; on 2 cores
-- they take 1.5 to 3 minutes (as busy as the machine is) and the held-out loss falls
-- from 5.7 to about 1.9 nats per byte.
-- The text is the C headers under /usr/include (several MB of real code on any machine
-- with a C toolchain; l2l's own sources when there are none), or the files and folders
-- given with --data. Files are taken in an order fixed by a hash of their paths (so a
-- capped corpus still mixes many kinds of header) up to --max-bytes; the last
-- --val-fraction of it, cut at a file boundary, is held out for the validation loss.
--
-- What it shows: the model lives in host memory (the EPS holds fp32 weights, gradients
-- and AdamW state: 16 bytes per parameter), the device pool gets a budget well below
-- that, and the relay trains it layer by layer with the boundary activations stashed on
-- the host. A terminal gets one updating progress line; a pipe or file gets plain lines.
-- At the end: a summary, a metrics log (JSON lines), a picture of the loss curves and of
-- memory over steps, and a sample of text the model generates.
--
-- Repeatability: layer initialisation, the batches (positions drawn from l2l's counter-
-- based generator keyed by (seed, step)) and the sample all follow from --seed, so a run
-- resumed from --checkpoint sees exactly the batches the uninterrupted run would.
-- Must never: read the validation part while training, or leave the terminal's line
-- half-drawn on an error (errors end the progress line before they are printed).
local l2l = require("l2l")
local progress = require("l2l.progress")
local plot = require("l2l.plot")
local text = require("l2l.text")
local cjson = require("cjson")
local bit = require("bit")

local floor, format, concat = math.floor, string.format, table.concat

----------------------------------------------------------------- flags

-- {name, default, kind, help}; kind: "int" (with a minimum), "number", "string",
-- "choice" (one of a list), "flag" (no value), "list" (repeatable).
local FLAGS = {
  { "data", {}, "list", "a file or folder to train on (repeat for more; default: the C headers under /usr/include)", meta = "PATH" },
  { "max-bytes", 4 * 2 ^ 20, "int", "read at most this many bytes of text", min = 1024 },
  { "val-fraction", 0.1, "number", "fraction of the text held out for the validation loss", lo = 0.001, hi = 0.5 },
  { "layers", 4, "int", "transformer blocks", min = 1 },
  { "dim", 128, "int", "model width", min = 8 },
  { "heads", 4, "int", "attention heads (must divide --dim)", min = 1 },
  { "mlp", 0, "int", "hidden width of each block's MLP (0: 4 x dim)", min = 0 },
  { "seq", 64, "int", "context length in bytes", min = 2 },
  { "batch", 32, "int", "sequences per step (minibatch)", min = 1 },
  { "micro-batch", 2, "int", "sequences per micro-batch on the device", min = 1 },
  { "steps", 400, "int", "training steps (the total, also when resuming)", min = 1 },
  { "lr", 4e-3, "number", "peak learning rate (AdamW, cosine decay to 10 %)", lo = 0, hi = 1 },
  { "warmup", 20, "int", "warm-up steps of the schedule", min = 0 },
  { "weight-decay", 0.1, "number", "AdamW weight decay", lo = 0, hi = 10 },
  { "dropout", 0, "number", "dropout rate in the blocks", lo = 0, hi = 0.9 },
  { "init-std", 0.06, "number", "standard deviation of the initial weights", lo = 1e-6, hi = 1 },
  { "stash", "host", "choice", "where activations wait for the backward", choices = { "host", "device", "recompute" } },
  { "device-budget", "auto", "string", "device pool budget in MiB, 'auto' (the largest layer's working set + 25 %) or 0 (none)", meta = "MIB|auto" },
  { "threads", 0, "int", "compute threads (0: l2l's default)", min = 0 },
  { "seed", 1, "int", "seed of initialisation, batches and the sample", min = 0 },
  { "eval-every", 25, "int", "steps between validation losses", min = 1 },
  { "eval-batches", 4, "int", "minibatches in each validation loss", min = 1 },
  { "checkpoint", "", "string", "save the run to this file (every --save-every steps and at the end)", meta = "PATH" },
  { "save-every", 100, "int", "steps between checkpoints (0: only at the end)", min = 0 },
  { "resume", false, "flag", "continue from --checkpoint if the file exists" },
  { "stop-at", 0, "int", "stop after this step as if interrupted, saving the checkpoint (to try --resume; 0: no)", min = 0, meta = "STEP" },
  { "out", "build/demo", "string", "folder for metrics.jsonl and the picture (curves.png or .svg)", meta = "DIR" },
  { "plot", "auto", "choice", "picture format: png through gnuplot when installed, else svg", choices = { "auto", "png", "svg", "none" } },
  { "sample", 300, "int", "bytes of text to generate at the end (0: none)", min = 0 },
  { "prompt", "#include <", "string", "the start of the generated sample", meta = "TEXT" },
  { "temperature", 0.5, "number", "sampling temperature (0: always the likeliest byte)", lo = 0, hi = 100 },
  { "top-k", 10, "int", "sample among the k likeliest bytes", min = 1 },
  { "help", false, "flag", "print this help and exit" },
}

local function usage()
  local lines = {
    "usage: l2l examples/train_gpt.lua [flags]",
    "",
    "Trains a byte-level GPT with the l2l relay: parameters and optimizer state in host",
    "memory, one layer at a time on the device within a memory budget.",
    "",
    "flags (--name value or --name=value):",
  }
  for _, f in ipairs(FLAGS) do
    local name, default, kind, help = f[1], f[2], f[3], f[4]
    local meta = f.meta or (f.choices and concat(f.choices, "|")) or
                 (kind == "int" and "N") or (kind == "number" and "X") or ""
    local left = "  --" .. name .. (meta ~= "" and " " .. meta or "")
    if kind ~= "flag" and kind ~= "list" then
      help = ("%s (default: %s)"):format(help, default == "" and "none" or tostring(default))
    end
    -- the help text wrapped at 96 columns, continuation lines under its start
    local width, rest, first = 96 - 32, help, true
    while #rest > 0 do
      local piece = rest
      if #rest > width then
        local cut = rest:sub(1, width):match("^.*() ")
        piece = rest:sub(1, (cut or width + 1) - 1)
      end
      lines[#lines + 1] = ("%-31s %s"):format(first and left or "", piece)
      rest, first = rest:sub(#piece + 1):gsub("^ +", ""), false
    end
  end
  return concat(lines, "\n")
end

-- Flag errors: a message naming the flag, exit status 2 (the usual status for bad usage).
local function usage_error(msg)
  io.stderr:write("train_gpt: ", msg, "\n(l2l examples/train_gpt.lua --help lists the flags)\n")
  os.exit(2, true)   -- true: close the Lua state, so finalizers free what C libraries hold
end

local function parse_flags(args)
  local spec, o = {}, {}
  for _, f in ipairs(FLAGS) do
    spec[f[1]] = f
    o[f[1]] = type(f[2]) == "table" and {} or f[2]
  end
  local i = 1
  while i <= #args do
    local a = args[i]
    local name, value = a:match("^%-%-([%w%-]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w%-]+)$") end
    if not name then usage_error(("unexpected argument '%s' (flags start with --)"):format(a)) end
    local f = spec[name]
    if f == nil then usage_error(("unknown flag --%s"):format(name)) end
    local kind = f[3]
    if kind == "flag" then
      if value ~= nil then usage_error(("--%s takes no value"):format(name)) end
      o[name] = true
    else
      if value == nil then
        i = i + 1
        value = args[i]
        if value == nil then usage_error(("--%s needs a value"):format(name)) end
      end
      if kind == "int" then
        local v = tonumber(value)
        if v == nil or v ~= floor(v) or v < f.min then
          usage_error(("--%s must be an integer >= %d, got '%s'"):format(name, f.min, value))
        end
        o[name] = v
      elseif kind == "number" then
        local v = tonumber(value)
        if v == nil or v ~= v or v < f.lo or v > f.hi then
          usage_error(("--%s must be a number in [%g, %g], got '%s'"):format(name, f.lo, f.hi, value))
        end
        o[name] = v
      elseif kind == "choice" then
        local okc = false
        for _, c in ipairs(f.choices) do okc = okc or c == value end
        if not okc then usage_error(("--%s must be one of %s, got '%s'"):format(name, concat(f.choices, ", "), value)) end
        o[name] = value
      elseif kind == "list" then
        local list = o[name]
        list[#list + 1] = value
      else
        o[name] = value
      end
    end
    i = i + 1
  end
  return o
end

local opt = parse_flags(arg or {})
if opt.help then
  print(usage())
  os.exit(0, true)
end
if opt.dim % opt.heads ~= 0 then usage_error(("--heads (%d) must divide --dim (%d)"):format(opt.heads, opt.dim)) end
if opt.resume and opt.checkpoint == "" then usage_error("--resume needs --checkpoint PATH") end
local budget_mib
if opt["device-budget"] ~= "auto" then
  budget_mib = tonumber(opt["device-budget"])
  if budget_mib == nil or budget_mib < 0 then
    usage_error(("--device-budget must be a number of MiB >= 0 or 'auto', got '%s'"):format(opt["device-budget"]))
  end
end
if opt.threads > 0 then l2l.threads(opt.threads) end

----------------------------------------------------------------- the text

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Regular files under `root` (a file or a folder) with their sizes: {{path, size} ...}.
local function files_under(root, pattern)
  local cmd = ("find %s -type f %s -printf '%%s %%p\\n' 2>/dev/null"):format(shell_quote(root),
              pattern and ("-name " .. shell_quote(pattern)) or "")
  local p = io.popen(cmd)
  local list = {}
  for line in p:lines() do
    local size, path = line:match("^(%d+) (.+)$")
    if size and tonumber(size) > 0 then list[#list + 1] = { path = path, size = tonumber(size) } end
  end
  p:close()
  return list
end

-- 32-bit FNV-1a of a string: an order for files that does not depend on how a folder
-- lists them, and mixes folders (sorted order would read linux/ for megabytes).
-- (The product by the prime 2^24 + 403 is split so that no intermediate exceeds 2^53.)
local function fnv1a(s)
  local h = 2166136261
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i)) % 4294967296          -- bxor gives a signed 32-bit value
    h = (h * 403 + (h % 256) * 16777216) % 4294967296
  end
  return h
end

-- The folder this script is in ("examples/"), to find l2l's own sources as a fallback.
local function project_root()
  local script = arg and arg[0] or ""
  local dir = script:match("^(.*)/[^/]*$") or "."
  return dir .. "/.."
end

-- The corpus: {text =, files = n, description =, boundaries = {end offset of each file}}.
local function load_corpus()
  local list, description = {}, nil
  if #opt.data > 0 then
    for _, root in ipairs(opt.data) do
      local found = files_under(root)
      if #found == 0 then usage_error(("--data %s: no readable non-empty file there"):format(root)) end
      for _, f in ipairs(found) do list[#list + 1] = f end
    end
    description = concat(opt.data, ", ")
  else
    list = files_under("/usr/include", "*.h")
    description = "C headers under /usr/include"
    if #list == 0 then
      local root = project_root()
      for _, sub in ipairs({ "src", "lua", "spec", "examples" }) do
        for _, f in ipairs(files_under(root .. "/" .. sub)) do list[#list + 1] = f end
      end
      description = "l2l's own sources (no C headers under /usr/include)"
    end
  end
  for _, f in ipairs(list) do f.key = fnv1a(f.path) end
  table.sort(list, function(a, b)
    if a.key ~= b.key then return a.key < b.key end
    return a.path < b.path
  end)
  local parts, ends, total = {}, {}, 0
  for _, f in ipairs(list) do
    if total >= opt["max-bytes"] then break end
    local fh = io.open(f.path, "rb")
    if fh then
      local s = fh:read(opt["max-bytes"] - total) or ""
      fh:close()
      if #s > 0 then
        parts[#parts + 1] = s
        total = total + #s
        ends[#ends + 1] = total
      end
    end
  end
  return { text = concat(parts), files = #parts, description = description, ends = ends }
end

-- Train and validation text: the validation part starts at the file boundary nearest to
-- (1 - val_fraction) of the text, or at that byte when the boundary would leave either
-- part too short for a sequence (or there is a single file).
local function split(corpus, fraction, need)
  local n = #corpus.text
  local cut = floor(n * (1 - fraction))
  local best
  for _, e in ipairs(corpus.ends) do
    if e < n and (best == nil or math.abs(e - cut) < math.abs(best - cut)) then best = e end
  end
  if best and best >= need and n - best >= need and math.abs(best - cut) <= n * fraction / 2 then cut = best end
  return corpus.text:sub(1, cut), corpus.text:sub(cut + 1)
end

----------------------------------------------------------------- batches

-- Batches come from l2l.text.batch: windows at positions drawn from l2l.rand keyed by
-- (seed, stream), so a batch is a function of them alone (a resumed run sees the same).
local function fill_batch(tokens, targets, s, seed, stream, first)
  text.batch(s, tokens:dim(1), tokens:dim(2), seed, stream, { first = first, tokens = tokens, targets = targets })
end

-- The validation batches' stream: far above any step number, so never a training batch's.
local VAL_STREAM = 2 ^ 40

----------------------------------------------------------------- the model and the run

local function mib(bytes) return bytes / 2 ^ 20 end

local function build_model()
  local D, L = opt.dim, opt.layers
  local list = { l2l.Embedding{ vocab = 256, dim = D, max_seq = opt.seq, init_std = opt["init-std"],
                                seed = opt.seed * 1000 + 1 } }
  for i = 1, L do
    list[#list + 1] = l2l.Block{ dim = D, heads = opt.heads, mlp = opt.mlp > 0 and opt.mlp or 4 * D,
                                 causal = true, memory = "frugal", dropout = opt.dropout,
                                 init_std = opt["init-std"],
                                 -- GPT-2: residual projections scaled by 1/sqrt(2 L)
                                 resid_std = opt["init-std"] / math.sqrt(2 * L),
                                 seed = opt.seed * 1000 + 1 + i }
  end
  -- the head's projection is the embedding's table (tied), as in GPT-2
  list[#list + 1] = l2l.LMHead{ vocab = 256, dim = D, tie = true, memory = "frugal" }
  return l2l.Sequential(list)
end

-- 'auto' budget: the largest layer's visit on the device — parameters and gradients of
-- the layer running and the next (two slots each), its working memory at the micro-batch
-- size, four micro-batch activations (input, output, their gradients) — plus 25 % for
-- what this estimate leaves out, rounded up to whole MiB.
local function auto_budget(model, micro, seq)
  local worst = 0
  for _, layer in ipairs(model) do
    local m = layer:memory(micro, seq)
    local act = micro * seq * opt.dim * 4
    worst = math.max(worst, 4 * m.params + m.peak + 4 * act)
  end
  return math.ceil(mib(worst * 1.25)) * 2 ^ 20
end

local function host_bytes()
  return l2l.pool_stats("host").current + l2l.pool_stats("pinned").current
end

-- Resident memory of the whole process (LuaJIT, the text, libraries), from /proc.
local function rss_bytes()
  local f = io.open("/proc/self/statm")
  if not f then return nil end
  local _, resident = f:read("*n", "*n")
  f:close()
  return resident and resident * 4096 or nil
end

local function fail(msg, bar)
  if bar then bar:finish() end
  io.stderr:write("train_gpt: ", msg, "\n")
  os.exit(1, true)
end

----------------------------------------------------------------- main

local t_start = progress.now()
local corpus = load_corpus()
local B, S = opt.batch, opt.seq
if #corpus.text < 4 * (S + 1) then
  fail(("%s: only %d bytes of text, need at least %d for --seq %d"):format(corpus.description, #corpus.text, 4 * (S + 1), S))
end

local run, model, start_step, resumed = nil, nil, 0, false
local checkpoints = opt.checkpoint ~= ""
if opt.resume then
  local fh = io.open(opt.checkpoint, "rb")
  if fh then
    fh:close()
    if l2l.load == nil then
      print("checkpoints not available in this build: starting afresh (l2l.load is missing)")
    else
      local ok, r = pcall(l2l.load, opt.checkpoint)
      if not ok then fail("--resume: " .. tostring(r)) end
      run, model, resumed = r, r.model, true
      start_step = run:stats().steps
      -- the data order depends on seed, batch and context: the saved ones win
      local x = run.extra or {}
      for _, k in ipairs({ "seed", "batch", "seq", "layers", "dim", "heads", "mlp" }) do
        if x[k] ~= nil and x[k] ~= opt[k] then opt[k] = x[k] end
      end
      B, S = opt.batch, opt.seq
      if run.options then opt.stash, opt["micro-batch"] = run.options.stash, run.options.micro_batch end
    end
  else
    print(("no checkpoint at %s yet: starting afresh"):format(opt.checkpoint))
  end
end

if model == nil then model = build_model() end
local nparams = model:nparams()
local state_bytes = nparams * 16   -- fp32 weights, gradients, AdamW m and v
local budget
if budget_mib ~= nil then
  budget = floor(budget_mib * 2 ^ 20)
elseif resumed then
  budget = l2l.pool_stats("device").budget   -- the one saved with the run (l2l.load set it)
else
  budget = auto_budget(model, math.min(opt["micro-batch"], B), S)
end

local train_text, val_text = split(corpus, opt["val-fraction"], S + 1)
if #train_text < S + 1 or #val_text < S + 1 then
  fail(("the text is too short for --seq %d: %d bytes for training, %d for validation"):format(S, #train_text, #val_text))
end

print(("l2l %s: a byte-level GPT trained layer to layer (%d compute threads)"):format(l2l.version, l2l.threads()))
print(("text: %s, %.2f MiB in %d files: %.2f MiB to train on, %.2f MiB held out"):format(corpus.description,
  mib(#corpus.text), corpus.files, mib(#train_text), mib(#val_text)))
print(("model: %d block%s, dim %d, %d heads, context %d bytes, %.2f M parameters (frugal blocks)"):format(
  #model - 2, #model == 3 and "" or "s", opt.dim, opt.heads, S, nparams / 1e6))
print(("model+optimizer state %.1f MiB, device budget %s (stash %s, micro-batch %d of %d)"):format(
  mib(state_bytes), budget > 0 and format("%.1f MiB", mib(budget)) or "none", opt.stash,
  math.min(opt["micro-batch"], B), B))

if run == nil then
  local ok, r = pcall(l2l.Relay, {
    model = model, micro_batch = opt["micro-batch"], stash = opt.stash, seed = opt.seed,
    optimizer = l2l.AdamW{ lr = opt.lr, betas = { 0.9, 0.99 }, weight_decay = opt["weight-decay"] },
    schedule = l2l.Cosine{ warmup = math.min(opt.warmup, opt.steps - 1), total = opt.steps, final_ratio = 0.1 },
    device_budget = budget > 0 and budget or nil,
  })
  if not ok then fail(tostring(r)) end
  run = r
elseif budget_mib ~= nil then
  l2l.set_budget("device", budget)
end
if checkpoints and run.save == nil then
  print("checkpoints not available in this build: --checkpoint is ignored (run.save is missing)")
  checkpoints = false
end
if resumed then
  print(("resuming from %s at step %d of %d (model, optimizer, schedule, seed, batch and context as saved)"):format(
    opt.checkpoint, start_step, opt.steps))
else
  print(("training %d steps of %d x %d bytes: AdamW, lr %g with %d warm-up steps and cosine decay, seed %d"):format(
    opt.steps, B, S, opt.lr, opt.warmup, opt.seed))
end
-- the last step this process runs (--stop-at: an interruption on purpose)
local last_step = opt.steps
if opt["stop-at"] > 0 and opt["stop-at"] < opt.steps then last_step = math.max(opt["stop-at"], start_step) end

-- output folder and metrics log (a resumed run keeps the lines up to its step)
os.execute("mkdir -p " .. shell_quote(opt.out))
local metrics_path = opt.out .. "/metrics.jsonl"
local history = {}
if resumed then
  local fh = io.open(metrics_path)
  if fh then
    for line in fh:lines() do
      local ok, rec = pcall(cjson.decode, line)
      if ok and type(rec) == "table" and type(rec.step) == "number" and rec.step <= start_step then
        history[#history + 1] = rec
      end
    end
    fh:close()
  end
end
local log, err = io.open(metrics_path, "w")
if not log then fail(("cannot write %s: %s"):format(metrics_path, tostring(err))) end
for _, rec in ipairs(history) do log:write(cjson.encode(rec), "\n") end
log:flush()

local tokens = l2l.zeros({ B, S }, { dtype = "i32" })
local targets = l2l.zeros({ B, S }, { dtype = "i32" })

local bar   -- the progress display, once training starts

-- run:step or run:evaluate; a failure ends the program with the relay's message, and
-- with what to do when it is the device budget that was too small.
local function relay_call(method, tok, tgt)
  local ok, loss = pcall(method, run, tok, tgt)
  if ok then return loss end
  local msg = tostring(loss)
  if msg:find("budget", 1, true) or msg:find("device pool", 1, true) then
    msg = msg .. ("\nthe device budget (%.1f MiB) is too small for this configuration: give a larger --device-budget (MiB)"):format(mib(budget))
  end
  fail(msg, bar)
end

-- Mean validation loss over the fixed held-out batches.
local function validation_loss()
  local sum = 0
  for k = 0, opt["eval-batches"] - 1 do
    fill_batch(tokens, targets, val_text, opt.seed, VAL_STREAM, k * B)
    sum = sum + relay_call(run.evaluate, tokens, targets)
  end
  return sum / opt["eval-batches"]
end

local NULL = cjson.null
local function record(rec)
  history[#history + 1] = rec
  log:write(cjson.encode(rec), "\n")
  log:flush()
end

-- Memory figures of the last step or evaluation (s: run:stats() taken right after it).
local function memory_fields(rec, s)
  rec.device_peak, rec.device_current = s.device_peak, s.device_current
  rec.device_budget, rec.host_bytes, rec.eps_bytes = budget, host_bytes(), s.host_eps_bytes
  rec.h2d_bytes, rec.d2h_bytes = s.h2d_bytes, s.d2h_bytes
  return rec
end

local function save_checkpoint(step)
  local ok, e = pcall(run.save, run, opt.checkpoint, {
    seed = opt.seed, batch = B, seq = S, layers = opt.layers, dim = opt.dim, heads = opt.heads,
    mlp = opt.mlp, steps = opt.steps, step = step,
  })
  if not ok then return "checkpoint not written: " .. tostring(e) end
  return nil
end

-- the validation loss before training (a fresh run's point 0)
local first_val
local last_val = nil
if start_step == 0 then
  first_val = validation_loss()
  last_val = first_val
  record(memory_fields({ step = 0, loss = NULL, val_loss = first_val, lr = 0, tokens_per_s = NULL,
                         tokens = 0, seconds = progress.now() - t_start }, run:stats()))
  print(("step 0: validation loss %.3f (a uniform guess over 256 bytes: %.3f)"):format(first_val, math.log(256)))
else
  for _, rec in ipairs(history) do
    if type(rec.val_loss) == "number" then
      first_val = first_val or rec.val_loss
      last_val = rec.val_loss
    end
  end
end

bar = progress.new{ total = opt.steps, first = start_step, every = opt["eval-every"] }
local smoothed_rate, last_loss = nil, nil
local peak_seen, h2d_total, d2h_total = 0, 0, 0   -- over this run's steps (stats are per step)
local t_train = progress.now()
for step = start_step + 1, last_step do
  local t0 = progress.now()
  fill_batch(tokens, targets, train_text, opt.seed, step)
  local loss = relay_call(run.step, tokens, targets)
  local dt = progress.now() - t0
  local s = run:stats()   -- this step's figures (an evaluation would replace them)
  last_loss = loss
  peak_seen = math.max(peak_seen, s.device_peak)
  h2d_total, d2h_total = h2d_total + s.h2d_bytes, d2h_total + s.d2h_bytes
  local rate = B * S / dt
  smoothed_rate = smoothed_rate and (0.8 * smoothed_rate + 0.2 * rate) or rate
  local val = NULL
  if step % opt["eval-every"] == 0 or step == last_step then
    val = validation_loss()
    last_val = val
  end
  local rec = memory_fields({ step = step, loss = loss, val_loss = val, lr = s.lr, tokens_per_s = rate,
                              tokens = step * B * S, seconds = progress.now() - t_start }, s)
  record(rec)
  local fields = { loss = loss, val_loss = last_val, tokens_per_s = smoothed_rate, device_peak = peak_seen,
                   device_budget = budget, host = rec.host_bytes }
  if val ~= NULL and bar.tty then bar:print(bar:line(step, fields)) end
  bar:update(step, fields)
  if checkpoints and opt["save-every"] > 0 and step % opt["save-every"] == 0 and step < last_step then
    local e = save_checkpoint(step)
    if e then bar:print(e) end
  end
end
bar:finish()
local wall = progress.now() - t_train
log:close()

----------------------------------------------------------------- the end

run:sync()   -- every update done: the layers hold the trained weights
local s = run:stats()
local done = last_step - start_step
print()
if done > 0 then
  print(("done: %d steps, %s tokens in %s (%s tokens/s)"):format(done, progress.count(done * B * S),
    progress.duration(wall), progress.count(done * B * S / wall)))
  print(("loss: train %.3f, validation %.3f (validation at the start %.3f; a uniform guess %.3f)"):format(
    last_loss, last_val, first_val or 0 / 0, math.log(256)))
else
  print(("nothing to train: the checkpoint is at step %d of %d"):format(start_step, opt.steps))
end
if last_step < opt.steps then
  print(("stopped at step %d of %d (--stop-at): --resume continues from the checkpoint"):format(last_step, opt.steps))
end
-- the device pool's own high-water mark: every step and evaluation of this process
local pool_peak = l2l.pool_stats("device").peak
print(("device: peak %s %s; model+optimizer state %s in host memory (EPS %s)"):format(
  progress.bytes(math.max(pool_peak, peak_seen)),
  budget > 0 and "within a budget of " .. progress.bytes(budget) or "(no budget)",
  progress.bytes(state_bytes), progress.bytes(s.host_eps_bytes)))
print(("transfers: host->device %s, device->host %s (%s and %s per step); process resident memory %s"):format(
  progress.bytes(h2d_total), progress.bytes(d2h_total), progress.bytes(done > 0 and h2d_total / done or 0),
  progress.bytes(done > 0 and d2h_total / done or 0), progress.bytes(rss_bytes() or 0)))

print("metrics: " .. metrics_path)
if opt.plot ~= "none" then
  local xs, train_y, vx, vy, peak, host = {}, {}, {}, {}, {}, {}
  for _, rec in ipairs(history) do
    if type(rec.loss) == "number" then xs[#xs + 1], train_y[#train_y + 1] = rec.step, rec.loss end
    if type(rec.val_loss) == "number" then vx[#vx + 1], vy[#vy + 1] = rec.step, rec.val_loss end
  end
  local mx = {}
  for _, rec in ipairs(history) do
    mx[#mx + 1] = rec.step
    peak[#peak + 1] = mib(rec.device_peak or 0)
    host[#host + 1] = mib(rec.host_bytes or 0)
  end
  local hlines = {}
  if budget > 0 then hlines[1] = { name = "device budget", y = mib(budget) } end
  local fig = {
    title = ("byte-level GPT, %d blocks x dim %d, %.2f M parameters"):format(#model - 2, opt.dim, nparams / 1e6),
    panels = {
      { title = "loss (nats per byte)", xlabel = "step", ylabel = "loss", ymin = 0,
        series = { { name = "train", x = xs, y = train_y }, { name = "validation", x = vx, y = vy, marks = true } } },
      { title = "memory", xlabel = "step", ylabel = "MiB", ymin = 0,
        series = { { name = "device peak", x = mx, y = peak },
                   { name = "host (EPS: weights, gradients, AdamW state)", x = mx, y = host } },
        hlines = hlines },
    },
  }
  local ok, path, _, note = pcall(plot.write, opt.out .. "/curves", fig, { format = opt.plot })
  if ok then
    print("picture: " .. path .. (note and (" (" .. note .. ")") or ""))
  else
    print("picture not written: " .. tostring(path))
  end
end
if checkpoints then
  local e = save_checkpoint(last_step)
  print(e or ("checkpoint: " .. opt.checkpoint .. (" (step %d)"):format(s.steps)))
end

if opt.sample > 0 then
  local ok, text = pcall(model.generate, model, opt.prompt, opt.sample,
                         { temperature = opt.temperature, top_k = math.min(opt["top-k"], 256), seed = opt.seed })
  if not ok then fail("sample: " .. tostring(text)) end
  -- bytes a terminal would act on (carriage returns, escapes) and bytes above 127 (a
  -- partly trained model's UTF-8 is seldom valid) are shown as '?'
  local shown = (opt.prompt .. text):gsub("[%z\1-\8\11-\31\127-\255]", "?")
  print(("\nsample (temperature %g, top-k %d, seed %d): %q continued by the model:"):format(
    opt.temperature, opt["top-k"], opt.seed, opt.prompt))
  print(shown)
end
