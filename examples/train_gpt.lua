-- SPDX-License-Identifier: MIT
-- train_gpt.lua — what `make demo` runs: a byte-level GPT trained with the relay on real
-- text, in less device memory than its parameters and optimizer state take.
--
--   build/l2l examples/train_gpt.lua [--steps 400 --layers 4 --dim 128 ...]   (--help)
--
-- The defaults (4 blocks of width 128, context 64, 32 sequences per step, 400 steps) put
-- 12.7 MiB of parameters and optimizer state behind a 5.13 MiB device budget; on 2 cores
-- they take 1.5 to 3 minutes (as busy as the machine is) and the held-out loss falls
-- from 5.7 to about 1.9 nats per byte.
-- The text is the C headers under /usr/include (several MB of real code on any machine
-- with a C toolchain; l2l's own sources when there are none), or the files and folders
-- given with --data. Files are taken in an order fixed by a hash of their paths (so a
-- capped corpus still mixes many kinds of header) up to --max-bytes; the last
-- --val-fraction of it, cut at a file boundary, is held out for the validation loss.
--
-- What it shows: the model lives in host memory (the EPS holds fp32 weights, gradients
-- and AdamW state: 16 bytes per parameter), the relay gets a device budget well below
-- that, and trains it layer by layer with the boundary activations stashed on
-- the host. A terminal gets one updating progress line; a pipe or file gets plain lines.
-- At the end: a summary, a metrics log (JSON lines), a picture of the loss curves and of
-- memory over steps, and a sample of text the model generates.
--
-- Repeatability: layer initialisation, the batches (positions drawn from l2l's counter-
-- based generator keyed by (seed, step)) and the sample all follow from --seed, so a run
-- resumed from --checkpoint sees exactly the batches the uninterrupted run would.
-- Must never: read the validation part while training, or leave the terminal's line
-- half-drawn on an error (errors end the progress line before they are printed).
local ffi = require("ffi")
local l2l = require("l2l")
local progress = require("l2l.progress")
local plot = require("l2l.plot")
local text = require("l2l.text")
local cli = require("l2l.cli")
local filesys = require("l2l.filesys")
local cjson = require("cjson")

local floor, format = math.floor, string.format

----------------------------------------------------------------- flags

-- Through l2l.cli (Debian's lua-argparse): `--help` lists them, a typo gets a "did you
-- mean", a bad value exits 2. { "--name", default, kind, help, ... } as cli.parser takes
-- them; a script built on this one adds its own lines (or parser:option calls).
local FLAGS = {
  { "--val-fraction", 0.1, "number", "fraction of the text held out for the validation loss", min = 0.001, max = 0.5 },
  { "--layers", 4, "int", "transformer blocks", min = 1 },
  { "--dim", 128, "int", "model width", min = 8 },
  { "--heads", 4, "int", "attention heads (must divide --dim)", min = 1 },
  { "--mlp", 0, "int", "hidden width of each block's MLP (0: 4 x dim)", min = 0 },
  { "--seq", 64, "int", "context length in bytes", min = 2 },
  { "--batch", 32, "int", "sequences per step (minibatch)", min = 1 },
  { "--micro-batch", 2, "int", "sequences per micro-batch on the device", min = 1 },
  { "--steps", 400, "int", "training steps (the total, also when resuming)", min = 1 },
  { "--lr", 4e-3, "number", "peak learning rate: the schedule's (--schedule, by default cosine to --final-ratio 0.1 of it)", min = 0, max = 1 },
  { "--warmup", 20, "int", "warm-up steps of the schedule", min = 0 },
  { "--weight-decay", 0.1, "number", "AdamW weight decay", min = 0, max = 10 },
  { "--state", "f32", "choice", "the precision of AdamW's state: f32, bf16 or 8bit (blockwise; l2l.AdamW's state); " ..
    "with --resume, the saved state is converted to it", choices = { "f32", "bf16", "8bit" } },
  { "--master", "f32", "choice", "the GEMM weights' and token table's masters: f32, or bf16 (rounded stochastically; " ..
    "the device precision bf16 then; l2l.Relay's master); with --resume, the saved ones are converted",
    choices = { "f32", "bf16" } },
  { "--dropout", 0, "number", "dropout rate in the blocks", min = 0, max = 0.9 },
  { "--init-std", 0.06, "number", "standard deviation of the initial weights", min = 1e-6, max = 1 },
  { "--stash", "host", "choice", "where activations wait for the backward", choices = { "host", "device", "recompute" } },
  { "--device-budget", "auto", "string", "the relay's device budget in MiB, 'auto' (what a step needs, whatever the weights become: the planner's replay of it) or 0 (none)", meta = "MIB|auto" },
  { "--host-budget", 0, "number", "the relay's host budget in MiB for its EPS (masters, gradients, optimizer state in memory; 0: none)", min = 0, meta = "MIB" },
  { "--spill", "", "string", "a directory for the spill file: the optimizer state the host budget leaves out lives there", meta = "DIR" },
  { "--plan", "none", "choice", "where the policies come from: none (--stash, recomputing every layer) or auto (l2l.plan " ..
    "picks each layer's within the device budget, for speed)", choices = { "none", "auto" } },
  { "--threads", 0, "int", "compute threads (0: l2l's default)", min = 0 },
  { "--seed", 1, "int", "seed of initialisation, batches and the sample", min = 0 },
  { "--eval-every", 25, "int", "steps between validation losses", min = 1 },
  { "--eval-batches", 4, "int", "minibatches in each validation loss", min = 1 },
  { "--checkpoint", "", "string", "save the run to this file (every --save-every steps, at the end, and when Ctrl-C stops it)", meta = "PATH" },
  { "--save-every", 100, "int", "steps between checkpoints (0: only at the end)", min = 0 },
  { "--keep-last", 1, "int", "checkpoints kept: the last is --checkpoint, each earlier one --checkpoint's path with " ..
    ".step<N> added (the oldest removed past this many)", min = 1, meta = "N" },
  { "--keep-best", nil, "flag", "also keep the run with the best validation loss so far, as --checkpoint's path " ..
    "with .best added (saved at each validation loss that improves on it)" },
  { "--val-data", nil, "list", "a file or folder of text for the validation loss (repeat for more), read as --data " ..
    "is; all of --data is then trained on (default: --val-fraction of --data held out)", meta = "FILE_OR_FOLDER" },
  { "--resume", nil, "flag", "continue the run saved in --checkpoint (an error when there is none)" },
  { "--resume-if-present", nil, "flag", "continue the run in --checkpoint if the file exists, else start one" },
  { "--force", nil, "flag", "start a new run although --checkpoint holds another (replaced at the first save)" },
  { "--stop-at", 0, "int", "stop after this step as if interrupted, saving the checkpoint (to try --resume; 0: no)", min = 0, meta = "STEP" },
  { "--out", "build/demo", "string", "folder for metrics.jsonl and the picture (curves.png or .svg), made if need be; "
    .. "relative to the current folder", meta = "DIR" },
  { "--plot", "auto", "choice", "picture format: png through gnuplot when installed, else svg", choices = { "auto", "png", "svg", "none" } },
  { "--sample", 300, "int", "bytes of text to generate at the end (0: none)", min = 0 },
  { "--prompt", "#include <", "string", "the start of the generated sample", meta = "TEXT" },
  { "--temperature", 0.8, "number", "sampling temperature (0: always the likeliest byte; l2l sample's default too)", min = 0, max = 100 },
  { "--top-k", 10, "int", "sample among the k likeliest bytes (tokens)", min = 1 },
  { "--tokenizer", "bytes", "choice", "what the model reads: bytes (256 symbols) or gpt2 (GPT-2's 50257 BPE tokens; " ..
    "scripts/gpt2-vocab.sh fetches the files); --seq, --sample and the losses then count tokens", choices = { "bytes", "gpt2" } },
  { "--init", "", "string", "start from GPT-2's weights: Hugging Face's model.safetensors of gpt2 (or a fine-tune) " ..
    "or llm.c's gpt2_124M.bin; the model's shape is the file's (needs --tokenizer gpt2)", meta = "PATH" },
  { "--dist", "none", "choice", "data parallel: mpi under `mpirun -np N` (each rank steps its slice of every minibatch; " ..
    "rank 0 prints and writes the files)", choices = { "none", "mpi" } },
  { "--dry-run", nil, "flag", "build the model and the relay, plan, print what a step needs on the device, in host " ..
    "memory and on disk and how long the planner expects it to take, and train nothing" },
}
-- Every other setting of the relay, its optimizer and its schedule: a flag each, made from
-- the option table (src/core/options.def, through cli.option_flags), not given: the
-- library's default, or this program's where it has one (AdamW with betas 0.9/0.99 and a
-- cosine decay to 10 %). The ones above are this program's own (budgets in MiB, --seed
-- for the data too, --warmup and --steps make the schedule's warmup and total).
local OWN_FLAGS = { micro_batch = true, stash = true, seed = true, device_budget = true, host_budget = true,
                    spill = true, dist = true, master = true, lr = true, weight_decay = true, state = true,
                    warmup = true, total = true }
local OPTION_FLAGS = cli.option_flags { skip = OWN_FLAGS,
  defaults = { optimizer = "adamw", beta1 = 0.9, beta2 = 0.99, schedule = "cosine", final_ratio = 0.1 } }
for _, f in ipairs(OPTION_FLAGS) do FLAGS[#FLAGS + 1] = f end

local parser = cli.parser {
  name = arg[0] == "train" and "l2l train" or "train_gpt",   -- (`l2l train` runs this file)
  data = true, max_bytes = 4 * 2 ^ 20, flags = FLAGS,
  description = "Trains a byte-level GPT with the l2l relay: parameters and optimizer state in host memory, " ..
                "one layer at a time on the device within a memory budget.",
  epilog = "Ctrl-C (or SIGTERM, or SIGUSR1) stops after the current step: the checkpoint (with --checkpoint), " ..
           "the summary, the metrics and the picture are written; a second one stops at once. Under mpirun, " ..
           "`kill -USR1 <mpirun's pid>` does the same on every rank (mpirun passes SIGUSR1 on; a Ctrl-C or SIGTERM " ..
           "to mpirun sends the ranks SIGTERM, then SIGKILL, a second apart, or --mca odls_base_sigkill_timeout " ..
           "SECONDS apart).",
}
local opt = cli.parse(parser)

-- The option table's flags (OPTION_FLAGS) that were given, by their options' names, for
-- `group` ("relay", "optimizer" or "schedule").
local ROW = require("l2l.option_table").ROW
local function flag_options(group)
  local o = {}
  for _, f in ipairs(OPTION_FLAGS) do
    local name = f[1]:sub(3):gsub("%-", "_")
    if ROW[name].group == group and opt[name] ~= nil and opt[name] ~= false then o[name] = opt[name] end
  end
  return o
end

if opt.dim % opt.heads ~= 0 then cli.usage_error(("--heads (%d) must divide --dim (%d)"):format(opt.heads, opt.dim)) end
for _, f in ipairs({ "resume", "resume_if_present", "force", "keep_best" }) do
  if opt[f] and opt.checkpoint == "" then cli.usage_error(("--%s needs --checkpoint PATH"):format(f:gsub("_", "-"))) end
end
if cli.given(opt, "keep_last") and opt.checkpoint == "" then cli.usage_error("--keep-last needs --checkpoint PATH") end
if opt.val_data and #opt.val_data > 0 and cli.given(opt, "val_fraction") then
  cli.usage_error("--val-fraction holds out part of --data; --val-data gives the validation text: give one of them")
end
if opt.force and (opt.resume or opt.resume_if_present) then
  cli.usage_error("--force starts a new run, --resume continues one: give one of them")
end
if opt.init ~= "" then   -- the file says what the model is
  for _, k in ipairs({ "layers", "dim", "heads", "mlp" }) do
    if cli.given(opt, k) then cli.usage_error(("--%s: the model's shape comes from --init's file"):format(k)) end
  end
  if opt.tokenizer ~= "gpt2" then cli.usage_error("--init: GPT-2 reads GPT-2's tokens: give --tokenizer gpt2") end
  if opt.resume then cli.usage_error("--init starts from GPT-2's weights, --resume from a checkpoint: give one of them") end
end
local budget_mib
if opt.device_budget ~= "auto" then
  budget_mib = tonumber(opt.device_budget)
  if budget_mib == nil or budget_mib < 0 then
    cli.usage_error(("--device-budget must be a number of MiB >= 0 or 'auto', got '%s'"):format(opt.device_budget))
  end
end
if opt.threads > 0 then l2l.threads(opt.threads) end
local host_budget = opt.host_budget > 0 and floor(opt.host_budget * 2 ^ 20) or nil
local spill = opt.spill ~= "" and opt.spill or nil

-- Data parallel: every rank runs this script; rank 0 speaks for the job (the others print
-- nothing and write no files) and the loss every rank gets is the whole minibatch's.
local rank, ranks = 0, 1
if opt.dist == "mpi" then
  local ok, e = pcall(function() rank, ranks = l2l.dist.rank(), l2l.dist.size() end)
  if not ok then cli.fail("--dist mpi: " .. tostring(e)) end
  if opt.batch < ranks then cli.usage_error(("--batch (%d) must be at least the number of ranks (%d)"):format(opt.batch, ranks)) end
  if rank ~= 0 then print = function() end end
end

----------------------------------------------------------------- the text

-- The corpus: {text =, files = n, description =, ends = {end offset of each file}}, from
-- l2l.text.corpus (files in an order fixed by a hash of their paths, up to --max-bytes).

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
-- With ranks, this rank's rows of the global minibatch (tokens has that many).
local function fill_batch(tokens, targets, s, seed, stream, first)
  text.batch(s, opt.batch, tokens:dim(2), seed, stream, { first = first, tokens = tokens, targets = targets,
                                                          rank = rank, size = ranks })
end

-- The validation batches' stream: far above any step number, so never a training batch's.
local VAL_STREAM = 2 ^ 40

----------------------------------------------------------------- the model and the run

local function mib(bytes) return bytes / 2 ^ 20 end

-- A library error in the flags' words where it names an option the user gave as a flag
-- ("option 'param_slots'" -> "--param-slots"), and whether it did.
local function in_flag_words(message)
  local flagged = false
  local why = tostring(message):gsub("^l2l%.[%w_]+: ", ""):gsub("option '([%w_]+)'", function(name)
    if not cli.given(opt, name) then return nil end
    flagged = true
    return "--" .. name:gsub("_", "-")
  end)
  return why, flagged
end

-- The model's layers as {constructor, kind, options}.
local function model_layers(V)
  local D, L = opt.dim, opt.layers
  local list = { { l2l.Embedding, "embedding", { vocab = V, dim = D, max_seq = opt.seq, init_std = opt.init_std,
                                                 seed = opt.seed * 1000 + 1 } } }
  for i = 1, L do
    list[#list + 1] = { l2l.Block, "block", { dim = D, heads = opt.heads, mlp = opt.mlp > 0 and opt.mlp or 4 * D,
                                              causal = true, memory = "frugal", dropout = opt.dropout,
                                              init_std = opt.init_std,
                                              -- GPT-2: residual projections scaled by 1/sqrt(2 L)
                                              resid_std = opt.init_std / math.sqrt(2 * L),
                                              seed = opt.seed * 1000 + 1 + i } }
  end
  -- the head's projection is the embedding's table (tied), as in GPT-2
  list[#list + 1] = { l2l.LMHead, "lm_head", { vocab = V, dim = D, tie = true, memory = "frugal" } }
  return list
end

-- The model, after what building it takes was found to fit the host pool: every record's
-- f32 weights and gradient (the tied head's own table among them, dropped once tied),
-- counted from the layers' descriptions (l2l.layers.records) before anything is made, so
-- a model too large is refused at once, not after filling the machine's memory.
local function build_model(V)
  local layers, records, params = model_layers(V), require("l2l.layers").records, 0
  for _, l in ipairs(layers) do
    local ok, list = pcall(records[l[2]], l[3])
    if not ok then cli.usage_error((in_flag_words(list))) end
    for _, r in ipairs(list) do
      local n = 1
      for _, d in ipairs(r.shape) do n = n * d end
      params = params + n
    end
  end
  local host = l2l.pool_stats("host")
  if host.budget > 0 and 8 * params > host.budget - host.current then
    cli.usage_error(("the model (--layers %d, --dim %d, --mlp %d) has %.3g parameters: making it takes %.1f GiB "
                     .. "of host memory (f32 weights and gradients), more than the %.1f GiB the host pool has left")
                    :format(opt.layers, opt.dim, opt.mlp > 0 and opt.mlp or 4 * opt.dim, params, 8 * params / 2 ^ 30,
                            (host.budget - host.current) / 2 ^ 30))
  end
  local list = {}
  for i, l in ipairs(layers) do
    local ok, layer = pcall(l[1], l[3])
    if not ok then
      local why, flagged = in_flag_words(layer)
      if flagged then cli.usage_error(why) end
      cli.fail(tostring(layer))
    end
    list[i] = layer
  end
  return l2l.Sequential(list)
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
  cli.fail(msg)
end

----------------------------------------------------------------- main

local t_start = progress.now()
local corpus = cli.corpus(opt)
local B, S = opt.batch, opt.seq
if #corpus.text < 4 * (S + 1) then
  fail(("%s: only %d bytes of text, need at least %d for --seq %d"):format(corpus.description, #corpus.text, 4 * (S + 1), S))
end

-- A run's id: in its checkpoints and in each line of its metrics, so that a resumed run
-- finds its own metrics and never mixes them with another run's.
local function new_run_id()
  local f = io.open("/dev/urandom", "rb")
  local b = f and f:read(6)
  if f then f:close() end
  if b and #b == 6 then return (b:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end
  return ("%x%05x"):format(os.time(), floor(os.clock() * 1e6) % 0x100000)
end

-- (looked at, never opened: opening a FIFO to read waits for a writer)
local function file_exists(path) return filesys.regular_file(path) ~= nil end
-- Whether anything (a file, a folder, a FIFO) is at path.
local function taken(path)
  local regular, why = filesys.regular_file(path)
  return regular or not why:find("No such file", 1, true)
end

-- The flags a checkpoint's run was made with (saved in its extra): given again with
-- another value, they contradict it.
local RUN_FLAGS = { "layers", "dim", "heads", "mlp", "seq", "batch", "seed", "tokenizer", "lr", "warmup",
                    "weight_decay", "dropout", "init_std" }

-- path as one absolute spelling: the current folder's in front of a relative one, no "."
-- parts, no empty ones ("a//b/./c/" and "/cwd/a/b/c" are the same).
pcall(ffi.cdef, "char *getcwd(char *buf, size_t size);")   -- (once: another module may have it)
local function absolute(path)
  local full = path
  if path:sub(1, 1) ~= "/" then
    local buf = ffi.new("char[?]", 4096)
    full = (ffi.C.getcwd(buf, 4096) ~= nil and ffi.string(buf) or ".") .. "/" .. path
  end
  local parts = {}
  for part in full:gmatch("[^/]+") do
    if part ~= "." then parts[#parts + 1] = part end
  end
  return "/" .. table.concat(parts, "/")
end

-- Why a checkpoint could not be written at `path`, found before any step (a save that
-- fails only after hours of training loses them), or nil: a directory, or a folder this
-- process cannot create a file in. `made`: the folder the run makes before its first
-- save (--out): a checkpoint there is written where the nearest folder of it that exists
-- lets one be made.
local function unwritable(path, made)
  local regular, why = filesys.regular_file(path)
  if why == "is a directory" then
    return ("%s is a directory: --checkpoint names a file (for example %s/run.safetensors)"):format(
      path, path:gsub("/+$", ""))
  elseif not regular and why:find("not a regular file", 1, true) then   -- a FIFO, a device, a socket
    return ("%s %s: --checkpoint names a file it writes"):format(path, why)
  end
  local function parent(p)
    local up = p:match("^(.*)/[^/]*$") or "."
    return up == "" and "/" or up
  end
  local folder = parent(path)
  if made and absolute(path) == absolute(made) then
    return ("%s is the folder --out makes: --checkpoint names a file (for example %s/run.safetensors)"):format(
      path, path:gsub("/+$", ""))
  end
  if made and absolute(folder) == absolute(made) then   -- (made by then: probed where it will be)
    while folder ~= "." and folder ~= "/" and not taken(folder) do
      folder = parent(folder)
    end
  end
  local probe = ("%s/.l2l-write-check-%s"):format(folder, new_run_id())
  local out, err = io.open(probe, "wb")
  if not out then
    return ("cannot write a checkpoint in %s (%s): give --checkpoint a path in a folder that exists and "
            .. "this user can write"):format(folder, tostring(err):gsub("^[^:]*: ", ""))
  end
  out:close()
  os.remove(probe)
  return nil
end

local run, model, start_step, resumed = nil, nil, 0, false
local run_id = new_run_id()
local checkpoints = opt.checkpoint ~= ""
if opt.out and rank == 0 then   -- a folder, or none yet (made before the first file is written)
  local regular, why = filesys.regular_file(opt.out)
  if regular or why:find("not a regular file", 1, true) then
    cli.usage_error(("--out: %s %s: --out names a folder for the run's files"):format(opt.out,
                    regular and "is a file" or why))
  end
end
if checkpoints and rank == 0 then   -- (rank 0 writes the files; the others' folders may be other disks)
  local why = unwritable(opt.checkpoint, opt.out)
  if why then cli.usage_error("--checkpoint: " .. why) end
end
if checkpoints and not file_exists(opt.checkpoint) then
  if opt.resume then
    fail(("--resume: there is no checkpoint at %s (--resume-if-present starts a new run when there is none)"):format(
      opt.checkpoint))
  elseif opt.resume_if_present then
    print(("no checkpoint at %s yet: starting a new run"):format(opt.checkpoint))
  end
elseif checkpoints and (opt.resume or opt.resume_if_present) then
  local overrides = { dist = opt.dist, host_budget = host_budget, spill = spill,
                      state = cli.given(opt, "state") and opt.state or nil,
                      master = cli.given(opt, "master") and opt.master or nil }
  -- the option table's flags: the machine's settings apply to the loaded run, the run's are its own
  for _, group in ipairs({ "relay", "optimizer", "schedule" }) do
    for name, v in pairs(flag_options(group)) do
      if ROW[name].keep == "load" then overrides[name] = v
      elseif cli.given(opt, name) then
        cli.usage_error(("--%s: --resume continues the run with the settings it was saved with; leave --%s out, "
                         .. "or start a new run (--force, or another --checkpoint)"):format(
                         name:gsub("_", "-"), name:gsub("_", "-")))
      end
    end
  end
  local ok, r = pcall(l2l.load, opt.checkpoint, overrides)
  if not ok then fail("--resume: " .. tostring(r)) end
  run, model, resumed = r, r.model, true
  require("l2l.use").refuse_non_causal(model)   -- (next-token targets: its attention must not read them)
  start_step = run:stats().steps
  opt.state, opt.master = run.options.optimizer.state, run.options.master
  -- what the run was made with wins; a flag given with another value is an error
  local x = run.extra or {}
  local differ = {}
  for _, k in ipairs(RUN_FLAGS) do
    if x[k] ~= nil and x[k] ~= opt[k] then
      if cli.given(opt, k) then
        differ[#differ + 1] = ("--%s %s (the run's: %s)"):format(k:gsub("_", "-"), tostring(opt[k]), tostring(x[k]))
      end
      opt[k] = x[k]
    end
  end
  if #differ > 0 then
    fail(("--resume: %s holds a run these flags contradict: %s. Leave them out to continue it, or start a new run "
          .. "(--force, or another --checkpoint)"):format(opt.checkpoint, table.concat(differ, ", ")))
  end
  run_id = x.run or run_id   -- (a checkpoint of an older l2l has none: it gets one now)
  B, S = opt.batch, opt.seq
  -- The settings of memory and time: a flag given again applies from here on, else the
  -- run's own (its steps, micro-batch and stash; its host budget and spill folder come
  -- back with the relay, l2l.load, unless given).
  if not cli.given(opt, "steps") and x.steps then opt.steps = x.steps end
  if opt.steps <= start_step then
    cli.usage_error(("--steps %d: the run in %s is at step %d already: give a larger --steps to train it further")
                    :format(opt.steps, opt.checkpoint, start_step))
  end
  if cli.given(opt, "micro_batch") then run:set_micro_batch(opt.micro_batch) else opt.micro_batch = run.options.micro_batch end
  if cli.given(opt, "stash") then
    for b = 2, #model do run:set_stash(b, opt.stash) end
  else
    opt.stash = run.options.stash
  end
  host_budget, spill = run.options.host_budget ~= 0 and run.options.host_budget or nil, run.options.spill
elseif checkpoints and opt.force and not opt.dry_run and file_exists(opt.checkpoint) then
  local ok, info = pcall(l2l.checkpoint_info, opt.checkpoint)
  print(ok and ("--force: this run replaces the checkpoint of run %s at step %d in %s at its first save"):format(
                 info.extra.run or "(no id)", info.steps, opt.checkpoint)
           or ("--force: %s is not a checkpoint; this run replaces it at its first save"):format(opt.checkpoint))
elseif checkpoints and not opt.force then
  local ok, info = pcall(l2l.checkpoint_info, opt.checkpoint)
  if not ok then   -- not a run --resume could continue: say so, and what --force would lose
    fail(("%s is a file that is not a checkpoint l2l reads (%s): give another --checkpoint path, or --force to "
          .. "replace it with this run's at its first save (what it holds now is lost)"):format(
          opt.checkpoint, (tostring(info):gsub("^l2l%.checkpoint_info: ", ""))))
  end
  fail(("%s already holds the checkpoint of run %s at step %d%s: --resume continues it, --force starts a new run "
        .. "that replaces it at its first save, or give another --checkpoint path"):format(
        opt.checkpoint, info.extra.run or "(no id)", info.steps, info.extra.steps and (" of " .. info.extra.steps) or ""))
end

-- What the model reads: the text's bytes, or GPT-2's tokens of it (the text encoded once,
-- train and validation parts apart; text.batch takes either).
local tok, V, unit = nil, 256, "bytes"
if opt.tokenizer == "gpt2" then
  local ok, t = pcall(l2l.tokenizer.gpt2)
  if not ok then fail("--tokenizer gpt2: " .. tostring(t)) end
  tok, V, unit = t, t.vocab, "tokens"
end
local function symbols(s)
  if tok == nil then return s end
  local ids = tok:encode(s)
  if #ids == 0 then return "" end   -- (too short: refused below)
  local t = l2l.empty({ #ids }, { dtype = "i32" })
  local p = t:data()
  for i = 1, #ids do p[i - 1] = ids[i] end
  return t
end
local function length(x) return type(x) == "string" and #x or x:numel() end

if model == nil and opt.init ~= "" then
  local ok, m = pcall(l2l.import_gpt2, opt.init, { max_seq = S, memory = "frugal", dropout = opt.dropout })
  if not ok then fail("--init: " .. tostring(m):gsub("^l2l%.import_gpt2: ", "")) end
  if m[1]:config().vocab ~= V then
    fail(("--init: %s has a vocabulary of %d tokens, GPT-2's tokenizer %d"):format(opt.init, m[1]:config().vocab, V))
  end
  model = m
  local c = model[2]:config()   -- the shape, for the summary and the checkpoint
  opt.layers, opt.dim, opt.heads, opt.mlp = #model - 2, c.dim, c.heads, c.mlp
end
if model == nil then model = build_model(V) end
local nparams = model:nparams()
-- weights (fp32, or about 2 bytes with bf16 masters) and fp32 gradients, AdamW's m and v in
-- --state's precision (8 bits: a byte and a 4-byte scale a block of 2048)
local state_bytes = nparams * ((opt.master == "bf16" and 6 or 8) + ({ f32 = 8, bf16 = 4, ["8bit"] = 2 + 8 / 2048 })[opt.state])
local budget = budget_mib and floor(budget_mib * 2 ^ 20)   -- nil: 'auto', once the run is made

local train_text, val_text
if opt.val_data and #opt.val_data > 0 then   -- the validation text of its own: all of --data to train on
  local ok, val = pcall(text.corpus, opt.val_data, { max_bytes = opt.max_bytes })
  if not ok then cli.usage_error("--val-data: " .. tostring(val):gsub("^.-text%.corpus: ", ""):gsub("^paths: ", "")) end
  train_text, val_text = corpus.text, val.text
else
  train_text, val_text = split(corpus, opt.val_fraction, S + 1)
end
local train_bytes, val_bytes = #train_text, #val_text
train_text, val_text = symbols(train_text), symbols(val_text)
if length(train_text) < S + 1 or length(val_text) < S + 1 then
  fail(("the text is too short for --seq %d: %d %s for training, %d for validation"):format(S, length(train_text),
    unit, length(val_text)))
end

print(("l2l %s: a %s GPT trained layer to layer (%d compute thread%s%s)"):format(l2l.version,
  tok and "GPT-2-token" or "byte-level", l2l.threads(), l2l.threads() == 1 and "" or "s",
  ranks > 1 and (" on each of %d MPI ranks, %s of each minibatch per rank"):format(ranks,
    B % ranks == 0 and ("%d sequence%s"):format(B / ranks, B / ranks == 1 and "" or "s")
                   or ("%d or %d sequences"):format(floor(B / ranks), floor(B / ranks) + 1)) or ""))
print(("text: %s, %.2f MiB in %d files: %.2f MiB to train on, %.2f MiB %s%s"):format(corpus.description,
  mib(#corpus.text), corpus.files, mib(train_bytes), mib(val_bytes),
  opt.val_data and #opt.val_data > 0 and "of --val-data to validate on" or "held out",
  tok and (" (%d and %d GPT-2 tokens)"):format(length(train_text), length(val_text)) or ""))
print(("model: %s%d block%s, dim %d, %d heads, context %d %s, %.2f M parameters (frugal blocks)"):format(
  opt.init ~= "" and ("GPT-2 weights from %s: "):format(opt.init) or "",
  #model - 2, #model == 3 and "" or "s", opt.dim, opt.heads, S, unit, nparams / 1e6))
-- What asks for less device memory, in this program's flags (those not in use already).
local function less_memory()
  local ways = {}
  if opt.micro_batch > 1 then ways[#ways + 1] = "a smaller --micro-batch" end
  if opt.stash ~= "host" then ways[#ways + 1] = "--stash host" end
  if opt.plan ~= "auto" then ways[#ways + 1] = "--plan auto (the planner's choice of what to keep)" end
  if #ways == 0 then return "" end
  local text = table.concat(ways, ", "):gsub(", ([^,]*)$", " or %1")
  return text:sub(1, 1):upper() .. text:sub(2) .. " needs less."
end
-- The samples of each minibatch this rank steps on.
local function rows_of_rank() return floor((rank + 1) * B / ranks) - floor(rank * B / ranks) end
-- The optimizer and the learning-rate schedule the flags ask for (the schedule counts
-- updates: --steps over --accumulate).
local OPTIMIZERS = { sgd = l2l.SGD, adamw = l2l.AdamW, lamb = l2l.LAMB }
local updates = math.ceil(opt.steps / (opt.accumulate or 1))
-- the warm-up a run shorter than --warmup gets: all but its last update
local warmup_used = math.min(opt.warmup, updates - 1)
local SCHEDULES = { constant = l2l.ConstantLR, cosine = l2l.CosineLR, linear = l2l.LinearLR }
local function optimizer_and_schedule()
  local o = { lr = opt.lr, weight_decay = opt.weight_decay, state = opt.state }
  for name, v in pairs(flag_options("optimizer")) do
    local row, adam = ROW[name], opt.optimizer ~= "sgd"
    if name ~= "optimizer" and not (row.flags.sgd and adam or row.flags.adam and not adam) then
      o[name] = v
    elseif name ~= "optimizer" and cli.given(opt, name) then
      cli.usage_error(("--%s is not a setting of %s"):format(name:gsub("_", "-"), opt.optimizer))
    end
  end
  local sc = { warmup = warmup_used }
  if opt.schedule ~= "constant" then sc.total, sc.final_ratio = updates, opt.final_ratio end
  local ok, optimizer = pcall(OPTIMIZERS[opt.optimizer], o)
  if not ok then cli.usage_error(tostring(optimizer)) end
  local schedule
  ok, schedule = pcall(SCHEDULES[opt.schedule], sc)
  if not ok then cli.usage_error(tostring(schedule)) end
  return optimizer, schedule
end

local function new_run(plan)
  local o = { model = model, micro_batch = opt.micro_batch, stash = opt.stash, seed = opt.seed,
              device_budget = budget and budget > 0 and budget or nil, dist = opt.dist, plan = plan,
              host_budget = host_budget, spill = spill, master = opt.master }
  for k, v in pairs(flag_options("relay")) do o[k] = v end
  o.optimizer, o.schedule = optimizer_and_schedule()
  local ok, r = pcall(l2l.Relay, o)
  if not ok then   -- an option the user gave as a flag: named as the flag, a usage error
    local why, flagged = in_flag_words(r)
    if flagged then cli.usage_error(why) end
    fail(tostring(r))
  end
  return r
end
-- 'auto': the budget every step of this shape needs with the flags' policies, whatever
-- the weights become (the planner's replay); with --plan auto the planner then picks the
-- fastest policies within it. A resumed run's is found again the same way, or given.
if run == nil and (budget ~= nil or opt.plan ~= "auto") then run = new_run(opt.plan == "auto" and "auto" or nil) end
if budget == nil then
  local probe = run or new_run(nil)
  local ok, peak = pcall(probe.step_peak, probe, rows_of_rank(), S)
  if not ok then fail(tostring(peak)) end
  budget = peak
  if probe ~= run then probe:free() end
end
if run == nil then run = new_run("auto") else run:set_device_budget(budget) end
-- A budget given: what a training step needs is known before anything runs (evaluation
-- needs less), so a budget too small is named once, with the smallest that works for both.
if budget_mib ~= nil and budget > 0 and opt.plan ~= "auto" then
  local ok, peak = pcall(run.step_peak, run, rows_of_rank(), S)
  if not ok then fail(tostring(peak)) end
  if peak > budget then
    fail(("--device-budget %.2f MiB is too small for a training step of this configuration: it needs %.2f MiB "
          .. "(%d bytes) at its peak, whatever the weights become (evaluation needs less): give --device-budget "
          .. "%.2f or more, or auto. %s"):format(budget_mib, mib(peak), peak, math.ceil(mib(peak) * 100) / 100,
          less_memory()))
  end
end
print(("model+optimizer state %.1f MiB, device budget %s (%s, micro-batch %d of %d)"):format(
  mib(state_bytes), budget > 0 and format("%.2f MiB", mib(budget)) or "none",
  opt.plan == "auto" and "policies planned" or "stash " .. opt.stash, math.min(opt.micro_batch, B), B))
if budget >= state_bytes and budget_mib == nil then
  print("(a step needs more device memory than the whole model and its optimizer state: at this size its "
        .. "activations and the copies of its largest layers outweigh the weights; a larger model shows the saving)")
end
if checkpoints and run.save == nil then
  print("checkpoints not available in this build: --checkpoint is ignored (run.save is missing)")
  checkpoints = false
end

-- --dry-run: what a step will need and take, from the relay's replay (the device) and the
-- planner (host memory, disk, time; with --plan none, for the policies it would choose),
-- then nothing trained and nothing written.
if opt.dry_run then
  local ok, peak = pcall(run.step_peak, run, rows_of_rank(), S)
  if not ok then fail(tostring(peak)) end
  local settings = require("l2l.relay_options").config_of(run.options)
  local plan
  ok, plan = pcall(require("l2l.plan").make, model, settings,
                   { batch = rows_of_rank(), seq = S, device_budget = budget > 0 and budget or peak }, "--dry-run")
  if not ok then fail(tostring(plan)) end
  print(("dry run: device: a training step needs %.2f MiB at its peak (budget: %s)"):format(
    mib(peak), budget > 0 and format("%.2f MiB", mib(budget)) or "none"))
  print(("dry run: host: the EPS holds %.2f MiB (the smallest --host-budget that works: %.2f MiB)"):format(
    mib(plan.host_eps_bytes), mib(plan.host_budget_smallest)))
  print(("dry run: disk: %s"):format(spill and format("%.2f MiB read and written a step in %s", mib(plan.disk_bytes), spill)
                                     or "nothing (no --spill)"))
  print(("dry run: a step of %d x %d takes about %.3f s (the planner's estimate%s), %d steps about %.0f s"):format(
    B, S, plan.step_seconds, opt.plan == "auto" and "" or ", for the policies it would choose",
    opt.steps - start_step, plan.step_seconds * (opt.steps - start_step)))
  print("dry run: nothing trained, nothing written")
  os.exit(0, true)
end
if resumed then
  print(("resuming from %s at step %d of %d (model, optimizer, schedule, seed, batch and context as saved)"):format(
    opt.checkpoint, start_step, opt.steps))
else
  print(("training %d steps of %d x %d " .. unit .. ": %s%s, lr %g with %d warm-up step%s and %s schedule, seed %d"):format(
    opt.steps, B, S, ({ sgd = "SGD", adamw = "AdamW", lamb = "LAMB" })[opt.optimizer],
    (opt.state == "f32" and "" or (" (state in %s)"):format(opt.state)) ..
    (opt.master == "f32" and "" or ", bf16 masters"), opt.lr, warmup_used, warmup_used == 1 and "" or "s",
    opt.schedule, opt.seed))
end
print("progress: dev peak = a step's most device memory (/ its budget); host = l2l's host and pinned pools " ..
      "(EPS, stashes, copy buffers; --host-budget bounds the EPS alone)" ..
      (spill and "; disk = spill-file bytes a step" or ""))
-- the last step this process runs (--stop-at: an interruption on purpose; Ctrl-C moves it)
local last_step = opt.steps
if opt.stop_at > 0 and opt.stop_at < opt.steps then last_step = math.max(opt.stop_at, start_step) end

-- Output folder and metrics log. metrics.jsonl in --out is one run's (each line names
-- it): another run's file there is moved aside to metrics-<its id>.jsonl, never
-- overwritten, and a resumed run takes its own back from there, keeping its lines up to
-- the checkpoint's step.
if rank ~= 0 then opt.out, opt.plot = nil, "none" end   -- rank 0 writes the files
local made_out = opt.out and os.execute("mkdir -p -- '" .. opt.out:gsub("'", "'\\''") .. "'")
if opt.out and made_out ~= 0 and made_out ~= true then   -- (LuaJIT: 0; with Lua 5.2's semantics: true)
  fail(("--out: cannot make the folder %s"):format(opt.out))
end
local metrics_path = opt.out and opt.out .. "/metrics.jsonl" or "/dev/null"

-- The run id of a metrics file's lines ("" for lines without one), or nil with no file.
local function run_of_metrics(path)
  local fh = file_exists(path) and io.open(path)
  if not fh then return nil end
  local id = ""
  for line in fh:lines() do
    local ok, rec = pcall(cjson.decode, line)
    if ok and type(rec) == "table" and type(rec.run) == "string" then id = rec.run break end
  end
  fh:close()
  return id
end

local history = {}
if opt.out then
  local holder = run_of_metrics(metrics_path)
  if holder ~= nil and holder ~= run_id then
    local aside, n = ("%s/metrics-%s.jsonl"):format(opt.out, holder ~= "" and holder or "earlier"), 1
    while taken(aside) do   -- never over anything
      n = n + 1
      aside = ("%s/metrics-%s-%d.jsonl"):format(opt.out, holder ~= "" and holder or "earlier", n)
    end
    local ok, e = os.rename(metrics_path, aside)
    if not ok then fail(("%s holds another run's metrics and cannot be moved aside: %s"):format(metrics_path, tostring(e))) end
    print(("metrics of %s moved to %s"):format(holder ~= "" and ("run " .. holder) or "an earlier run", aside))
  end
  local own = ("%s/metrics-%s.jsonl"):format(opt.out, run_id)
  if resumed and holder ~= run_id and file_exists(own) then os.rename(own, metrics_path) end
end
if resumed then
  local fh = file_exists(metrics_path) and io.open(metrics_path)
  if fh then
    for line in fh:lines() do
      local ok, rec = pcall(cjson.decode, line)
      if ok and type(rec) == "table" and rec.run == run_id and type(rec.step) == "number" and rec.step <= start_step then
        history[#history + 1] = rec
      end
    end
    fh:close()
  end
end
local log, err = io.open(metrics_path, "w")
if not log then fail(("cannot write %s: %s"):format(metrics_path, tostring(err))) end
for _, rec in ipairs(history) do log:write(plot.metrics_line(rec), "\n") end
log:flush()

local rows = rows_of_rank()   -- this rank's slice
local tokens = l2l.zeros({ rows, S }, { dtype = "i32" })
local targets = l2l.zeros({ rows, S }, { dtype = "i32" })

local bar   -- the progress display, once training starts

-- An error that is the REPL's Ctrl-C (a second one, the first having asked the loop to
-- stop, or one after the stop let go) goes on as it is: the REPL stops the entry.
local function pass_interruption(e)
  if type(e) == "string" and e:find("interrupted %(Ctrl%-C%)$") then error(e, 0) end
end

-- run:step or run:evaluate; a failure ends the program with the relay's message, and
-- with what to do when it is a budget that was too small.
local function relay_call(method, tok, tgt)
  local ok, loss = pcall(method, run, tok, tgt)
  if ok then return loss end
  pass_interruption(loss)
  local msg = tostring(loss)
  if msg:find("host budget", 1, true) then
    msg = msg .. ("\nthe host budget (%.1f MiB) is too small for this model: give a larger --host-budget (MiB)%s"):format(
      mib(host_budget), spill and "" or ", or a spill directory (--spill DIR)")
  elseif msg:find("budget", 1, true) or msg:find("device pool", 1, true) then
    -- (the relay's advice names its options; here, the flags)
    msg = msg:gsub(" A smaller micro%-batch[^\n]*$", "") ..
          ("\nthe device budget (%.2f MiB) is too small for this configuration: give a larger --device-budget (MiB). %s")
          :format(mib(budget), less_memory())
  end
  fail(msg, bar)
end

-- Mean validation loss over the fixed held-out batches.
local function validation_loss()
  local sum = 0
  for k = 0, opt.eval_batches - 1 do
    fill_batch(tokens, targets, val_text, opt.seed, VAL_STREAM, k * B)
    sum = sum + relay_call(run.evaluate, tokens, targets)
  end
  return sum / opt.eval_batches
end

local NULL = cjson.null
local function record(rec)
  rec.run = run_id
  history[#history + 1] = rec
  log:write(plot.metrics_line(rec), "\n")   -- (a NaN loss is written as "nan")
  log:flush()
end

-- Memory figures of the last step or evaluation (s: run:stats() taken right after it).
local function memory_fields(rec, s)
  rec.device_peak, rec.device_current = s.device_peak, s.device_current
  rec.device_budget, rec.host_bytes, rec.eps_bytes = budget, host_bytes(), s.host_eps_bytes
  rec.h2d_bytes, rec.d2h_bytes = s.h2d_bytes, s.d2h_bytes
  rec.disk_bytes = s.spill_read_bytes + s.spill_written_bytes
  return rec
end

-- The run into `path` (default --checkpoint), its extra naming what made it; nil, or
-- why it was not written.
local function save_checkpoint(step, path, val_loss)
  local ok, e = pcall(run.save, run, path or opt.checkpoint, {
    run = run_id, seed = opt.seed, batch = B, seq = S, layers = opt.layers, dim = opt.dim, heads = opt.heads,
    mlp = opt.mlp, steps = opt.steps, step = step, tokenizer = opt.tokenizer, lr = opt.lr, warmup = opt.warmup,
    weight_decay = opt.weight_decay, dropout = opt.dropout, init_std = opt.init_std, val_loss = val_loss,
  })
  if not ok then return "checkpoint not written: " .. tostring(e) end
  return nil
end

-- --keep-last: before --checkpoint is written again, the one there becomes <path>.step<N>
-- (this run's: its step); past keep_last files in all, the oldest are removed.
local function keep_earlier(step)
  if opt.keep_last <= 1 or not file_exists(opt.checkpoint) then return nil end
  local ok, info = pcall(l2l.checkpoint_info, opt.checkpoint)
  -- (another run's is replaced as before; this run's at this step is written again)
  if not ok or info.extra.run ~= run_id or info.steps >= step then return nil end
  local ok2, e = os.rename(opt.checkpoint, ("%s.step%d"):format(opt.checkpoint, info.steps))
  if not ok2 then return "checkpoint not kept: " .. tostring(e) end
  local folder, base = opt.checkpoint:match("^(.*)/([^/]*)$")
  folder, base = folder or ".", base or opt.checkpoint
  local steps = {}
  for _, entry in ipairs(filesys.list_folder(folder) or {}) do
    local n = entry.name:sub(1, #base + 5) == base .. ".step" and tonumber(entry.name:sub(#base + 6):match("^%d+$"))
    if n then steps[#steps + 1] = n end
  end
  table.sort(steps)
  for i = 1, #steps - (opt.keep_last - 1) do os.remove(("%s/%s.step%d"):format(folder, base, steps[i])) end
  return nil
end

-- --keep-best: the best validation loss this run has saved (from <path>.best when it is
-- this run's), and the save of a better one.
local best_path = opt.checkpoint .. ".best"
local best_val = math.huge
if opt.keep_best and file_exists(best_path) then
  local ok, info = pcall(l2l.checkpoint_info, best_path)
  if ok and info.extra.run == run_id and type(info.extra.val_loss) == "number" then best_val = info.extra.val_loss end
end
local function keep_best(step, val)
  if not (checkpoints and opt.keep_best and val < best_val) then return nil end
  best_val = val
  return save_checkpoint(step, best_path, val)
end

-- the validation loss before training (a fresh run's point 0)
local first_val
local last_val = nil
if start_step == 0 then
  first_val = validation_loss()
  last_val = first_val
  record(memory_fields({ step = 0, loss = NULL, val_loss = first_val, lr = 0, tokens_per_s = NULL,
                         tokens = 0, seconds = progress.now() - t_start }, run:stats()))
  print(("step 0: validation loss %.3f (a uniform guess over %d %s: %.3f)"):format(first_val, V, unit, math.log(V)))
else
  for _, rec in ipairs(history) do
    if type(rec.val_loss) == "number" then
      first_val = first_val or rec.val_loss
      last_val = rec.val_loss
    end
  end
end

-- From here the first Ctrl-C (or SIGTERM, or SIGUSR1: what mpirun passes on to its ranks)
-- ends the loop after its step (see the end), a second one at once. Under mpirun the ranks
-- agree after each step whether any was signalled, so all stop after the same one.
local stop = cli.interrupt{ dist = opt.dist }
local quiet = rank ~= 0 and io.open("/dev/null", "w") or nil   -- the other ranks' progress
bar = progress.new{ total = opt.steps, first = start_step, every = opt.eval_every, ranks = ranks,
                    out = quiet or io.stdout, tty = (quiet == nil and progress.is_terminal()) }
local smoothed_rate, last_loss = nil, nil
local peak_seen, h2d_total, d2h_total, disk_total = 0, 0, 0, 0   -- over this run's steps (stats are per step)
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
  disk_total = disk_total + s.spill_read_bytes + s.spill_written_bytes
  local rate = B * S / dt
  smoothed_rate = smoothed_rate and (0.8 * smoothed_rate + 0.2 * rate) or rate
  if step < last_step and stop:requested() then last_step = step end   -- stopped: this is the last
  local val = NULL
  if step % opt.eval_every == 0 or step == last_step then
    val = validation_loss()
    last_val = val
    local e = keep_best(step, val)
    if e then bar:print(e) end
  end
  local rec = memory_fields({ step = step, loss = loss, val_loss = val, lr = s.lr, tokens_per_s = rate,
                              tokens = step * B * S, seconds = progress.now() - t_start }, s)
  record(rec)
  local fields = { loss = loss, val_loss = last_val, tokens_per_s = smoothed_rate, device_peak = peak_seen,
                   device_budget = budget, host = rec.host_bytes, disk = spill and rec.disk_bytes or nil }
  if val ~= NULL and bar.tty then bar:print(bar:line(step, fields)) end
  bar:update(step, fields)
  if step == last_step and step < opt.steps and not bar.tty and step % opt.eval_every ~= 0 and step > start_step + 1 then
    bar:print(bar:line(step, fields))   -- plain output: the step it stopped at, which update left out
  end
  if checkpoints and opt.save_every > 0 and step % opt.save_every == 0 and step < last_step then
    local e = keep_earlier(step) or save_checkpoint(step)
    if e then bar:print(e) end
  end
  if step == last_step then break end
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
  print(("loss: train %.3f, validation %.3f (validation at the start %s; a uniform guess %.3f)"):format(
    last_loss, last_val, first_val and format("%.3f", first_val) or "not in this run's metrics", math.log(V)))
else
  print(("nothing to train: the checkpoint is at step %d of %d"):format(start_step, opt.steps))
end
local interrupted = stop:signal()   -- what stopped the loop ("Ctrl-C", "SIGTERM", "SIGUSR1"), or nil
if last_step < opt.steps then
  print(("stopped at step %d of %d (%s)"):format(last_step, opt.steps, interrupted or "--stop-at"))
end
-- the device pool's own high-water mark: every step and evaluation of this process
local pool_peak = l2l.pool_stats("device").peak
print(("device: peak %s %s; model+optimizer state %s; the EPS holds %s in host memory"):format(
  progress.bytes(math.max(pool_peak, peak_seen)),
  budget > 0 and "within a budget of " .. progress.bytes(budget) or "(no budget)",
  progress.bytes(state_bytes), progress.bytes(s.host_eps_bytes)))
print(("transfers: host->device %s, device->host %s (%s and %s per step); process resident memory %s"):format(
  progress.bytes(h2d_total), progress.bytes(d2h_total), progress.bytes(done > 0 and h2d_total / done or 0),
  progress.bytes(done > 0 and d2h_total / done or 0), progress.bytes(rss_bytes() or 0)))
if spill then
  print(("spill: the optimizer state beyond the host budget%s in a %s file in %s; %s to and from it (%s per step)"):format(
    host_budget and (" (%s)"):format(progress.bytes(host_budget)) or "", progress.bytes(run:stats().spill_file_bytes),
    spill, progress.bytes(disk_total), progress.bytes(done > 0 and disk_total / done or 0)))
end

if opt.plan == "auto" and run.plan and done > 0 then print("\nthe plan, predicted against measured (the training steps after the first):\n" ..
                                                           tostring(run:plan_report())) end
print("metrics: " .. metrics_path)
if opt.plot ~= "none" then
  local fig = plot.metrics_figure(history, {
    title = ("%s GPT, %d blocks x dim %d, %.2f M parameters"):format(tok and "GPT-2-token" or "byte-level",
                                                                     #model - 2, opt.dim, nparams / 1e6) })
  local ok, path, _, note = pcall(plot.write, opt.out .. "/curves", fig, { format = opt.plot })
  if ok then
    print("picture: " .. path .. (note and (" (" .. note .. ")") or ""))
  else
    print("picture not written: " .. tostring(path))
  end
end
local final_save_failed = nil   -- the run's last checkpoint not written: the process fails, after the sample
if checkpoints then
  local e = keep_earlier(s.steps) or save_checkpoint(last_step)
  final_save_failed = e
  print(e or ("checkpoint: %s (step %d)%s"):format(opt.checkpoint, s.steps,
                                                  last_step < opt.steps and ": --resume continues from it" or ""))
  if opt.keep_best and best_val < math.huge then print(("best: %s (validation loss %.4f)"):format(best_path, best_val)) end
end

-- Everything is written: from here a stop signal ends the process at once (a sample is
-- not worth waiting for), and one that came before (since the loop) means no sample.
io.stdout:flush()
stop:release()
interrupted = stop:signal()
if opt.sample > 0 and interrupted then
  print(("\nsample: none (stopped by %s)"):format(interrupted))
elseif opt.sample > 0 and rank == 0 then
  print(("\nsample (temperature %g, top-k %d, seed %d): %q continued by the model:"):format(
    opt.temperature, opt.top_k, opt.seed, opt.prompt))
  local ok, written = pcall(model.generate, model, opt.prompt, opt.sample,
                            { temperature = opt.temperature, top_k = math.min(opt.top_k, V), seed = opt.seed,
                              tokenizer = tok })
  if not ok then pass_interruption(written) fail("sample: " .. tostring(written)) end
  -- bytes a terminal would act on (carriage returns, escapes) and bytes that are not
  -- valid UTF-8 (a partly trained model writes many) are shown as '?'
  print(text.printable(opt.prompt .. written))
end

-- After a stop signal the process ends as that signal ends a program (Ctrl-C: status 130),
-- everything written.
stop:finish()
if final_save_failed then fail(final_save_failed) end
