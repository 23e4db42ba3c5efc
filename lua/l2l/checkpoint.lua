-- SPDX-License-Identifier: MIT
-- l2l.checkpoint — run:save(path [, extra]) and l2l.load(path [, overrides]): a training
-- run in one file, resumed exactly; l2l.load_weights(model, path) for weights alone.
--
-- The file is safetensors (l2l.safetensors): the tensors, and under the header's
-- __metadata__ key "l2l" one JSON document describing the rest:
--   { format = "l2l-checkpoint", version = 1, l2l = <library version>,
--     layers = { {kind =, options = {constructor options}, rng_id =, frozen =, inner =,
--                 stash = (the policy of the boundary entering it, from layer 2 on),
--                 custom = <kind name>} ... },
--     records = { {name = "<layer>.<param>", updates = t, state = <arrays saved>,
--                  grad = <saved: true mid-accumulation>} ... },
--     relay = {every option of l2l.Relay but the model (relay_options.OPTIONS, the one
--              list: precision, host_budget, spill, dist and the rest), optimizer = {...},
--              schedule = {...}, plan = "auto" or absent},
--     progress = {steps =, updates =}, extra = <the caller's table> }
-- Tensor names: "<layer>.<param>" for each parameter record's fp32 master (a record
-- shared by two layers, the tied embedding, is saved once under its first layer),
-- "<name>.m" / "<name>.v" for its optimizer state in the run's precision (f32 or bf16 in
-- the parameter's shape, 8bit as a u8 vector of codes and scales: include/l2l/relay.h,
-- "optimizers"; v is kept as sqrt(v) there), "<name>.grad" for a gradient
-- accumulated part way through `accumulate` minibatches.
-- Purpose: a resumed run produces bit for bit the losses the uninterrupted one would: the
-- weights, the optimizer state and each record's update count (bias correction), the
-- steps and updates done (the schedule's position and the dropout draws, which are a
-- function of seed, step and each layer's rng id), every policy and option. Data order
-- is the script's: draw batches as a function of (seed, step) and it resumes too.
-- The tensors are written and read by the C API (l2l_relay_save, l2l_relay_load in
-- src/relay/checkpoint.c, on the core's safetensors files): a C program's checkpoints and
-- a script's are one format, checked once. This module describes what only the front end
-- knows (each layer's constructor options, custom layers' included; the settings as
-- l2l.Relay was given them) and, loading, rebuilds the model and the relay from the
-- description before C restores the rest into it. Loading checks the description and
-- every tensor the described model would have (present, its shape) before anything is
-- built, and C checks the whole file (every checksum, every state array) before anything
-- is read into the relay, so a damaged or mismatched file is an error and no half-loaded
-- run is returned. l2l.load_model and l2l.load_weights read weights alone, through
-- l2l.safetensors.
-- Must never: write a checkpoint but through l2l_relay_save (atomic), or return a run
-- whose state differs from the one saved.
local ffi = require("ffi")
local cjson = require("cjson").new()
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local layers = require("l2l.layers")
local model_mod = require("l2l.model")
local optim = require("l2l.optim")
local relay = require("l2l.relay")
local relay_options = require("l2l.relay_options")
local option_table = require("l2l.option_table")
local safetensors = require("l2l.safetensors")
local custom = require("l2l.custom")

local C = lib.C
local type, tostring, ipairs, pairs, next, select = type, tostring, ipairs, pairs, next, select
local too_many = argcheck.too_many

cjson.encode_sparse_array(false)

-- lua-cjson writes numbers with at most 14 significant digits, which can change an lr or
-- a dropout rate in its last bits. A number that 14 digits do not give back exactly is
-- written as {__f64 = "<17 digits>"} and read back by `exact_numbers`.
local EXACT = "__f64"
local function exact_json(v)
  if type(v) == "number" then
    if v == v and tonumber(("%.14g"):format(v)) ~= v then return { [EXACT] = ("%.17g"):format(v) } end
    return v
  elseif type(v) == "table" then
    local out = {}
    for k, x in pairs(v) do out[k] = exact_json(x) end
    return out
  end
  return v
end

local function exact_numbers(v)
  if type(v) ~= "table" then return v end
  if type(v[EXACT]) == "string" and next(v, next(v)) == nil then return tonumber(v[EXACT]) end
  for k, x in pairs(v) do v[k] = exact_numbers(x) end
  return v
end

local M = {}
local FORMAT, VERSION = "l2l-checkpoint", 1

----------------------------------------------------------------- describing

-- A built-in layer is described by the constructor options that rebuild it (its kind's
-- `saved` in layers.kinds; the weights come from the file), a custom one by its kind's
-- name and its own options.
local function describe_layer(layer, i, fname)
  local d = { kind = layer.kind }   -- (its rng id, frozen flag and policies: the relay's, l2l_relay_save's)
  local kind = layers.kinds[layer.kind]
  if kind.saved == nil then
    d.custom = layer:label()
    local ok, json = pcall(cjson.encode, layer.options or {})
    if not ok then
      error(("%s: layer %d (%s): its options cannot be written as JSON (%s)"):format(fname, i, d.custom, json), 0)
    end
    d.options = layer.options or {}
    return d
  end
  local c = layer:config()
  d.options = {}
  for _, k in ipairs(kind.saved) do d.options[k] = c[k] end
  if layer.tied_to then d.options.tie = true end
  return d
end

-- The optimizer's and schedule's settings a file keeps: their rows of the option table,
-- each under its option's name (the kind's row, "optimizer" / "schedule", as "kind").
local function group_keys(group)
  local keys = {}
  for _, row in ipairs(option_table.ROWS) do
    if row.group == group then keys[#keys + 1] = row.field == "kind" and "kind" or row.name end
  end
  return keys
end
local OPTIMIZER_KEYS, SCHEDULE_KEYS = group_keys("optimizer"), group_keys("schedule")
-- The relay's settings a file keeps: every option but those kept in their own forms (the
-- relay's one list, so a new option is saved and restored without a second list here).
local RELAY_KEYS = relay_options.option_names({ run = true, load = true })

local function pick(t, keys)
  local out = {}
  for _, k in ipairs(keys) do out[k] = t[k] end
  return out
end

-- What the library's functions raise for their caller carries the caller's position,
-- which inside save or load is a line of the library itself: gone (the user called
-- run:save or l2l.load, and the message says so).
-- (A scan, not one gsub: a pattern that starts with [^%s:]* backtracks over every start
-- in a long word, and a file's 90 KB string in a message made that minutes.)
local function without_positions(message)
  message = tostring(message)
  local out, at = {}, 1
  while true do
    local s, e = message:find("%.lua:%d+: ", at)
    if s == nil then break end
    local from = s   -- back to the start of the path: the last blank, or where we are
    while from > at and not message:sub(from - 1, from - 1):find("%s") do from = from - 1 end
    local ours = message:sub(from, s + 3):find("/l2l/[%w_]+%.lua$") ~= nil
    out[#out + 1] = message:sub(at, ours and from - 1 or e)
    at = e + 1
  end
  out[#out + 1] = message:sub(at)
  return table.concat(out)
end

-- run:save(path [, extra]): extra is any JSON-encodable table, returned as run.extra.
-- The file is written by the C API (l2l_relay_save: the tensors one record at a time, each
-- state array checked as a load would check it, atomically; with ranks every rank calls it,
-- the state gathered from the shards, rank 0 writing): what only the front end knows goes
-- with it as JSON, each layer's kind and constructor options (a custom layer's are its
-- own) and the relay's settings as l2l.Relay was given them (the numbers as Lua holds them,
-- and plan = "auto").
function M.save(run, path, extra)
  local fname = "run:save"
  local r = relay.c_relay(run, fname, 2)
  if type(path) ~= "string" or path == "" then error(fname .. ": path must be a non-empty string", 2) end
  if extra ~= nil and type(extra) ~= "table" then error(fname .. ": extra must be a table or nil", 2) end
  local s = relay.settings(run)
  local described = {}
  for i, layer in ipairs(run.model) do
    local ok, d = pcall(describe_layer, layer, i, fname)
    if not ok then error(d, 2) end
    described[i] = d
  end
  local settings = pick(s, RELAY_KEYS)
  -- plan = "auto" goes on planning after a load; a plan made by hand is the layers' own
  -- policies and micro-batch, which the file keeps anyway
  if s.plan == "auto" then settings.plan = "auto" end
  settings.optimizer = pick(s.optimizer, OPTIMIZER_KEYS)
  settings.schedule = pick(s.schedule, SCHEDULE_KEYS)
  local okx, extra_json = pcall(cjson.encode, exact_json(extra))
  if not okx then error(fname .. ": extra cannot be written as JSON: " .. tostring(extra_json), 2) end
  local texts = { layers = cjson.encode(exact_json(described)), relay = cjson.encode(exact_json(settings)),
                  extra = extra ~= nil and extra_json or nil }
  local opts = ffi.new("l2l_save_options", { replace = 1, extra = texts.extra, layers = texts.layers,
                                             relay = texts.relay })
  local status = C.l2l_relay_save(r, path, opts)
  texts = nil   -- (the strings stayed referenced while C read them)
  if status ~= 0 then error(fname .. ": " .. relay_options.lua_message(), 2) end   -- (in Lua's terms: layers from 1)
end

----------------------------------------------------------------- loading

local function rebuild_optimizer(o)
  if type(o) ~= "table" then error("relay: optimizer is not a table", 0) end
  if o.kind == "sgd" then
    return optim.SGD{ lr = o.lr, momentum = o.momentum, nesterov = o.nesterov,
                      weight_decay = o.weight_decay, decay_all = o.decay_all, state = o.state }
  end
  local make = o.kind == "adamw" and optim.AdamW or o.kind == "lamb" and optim.LAMB
  if not make then error("unknown optimizer kind " .. tostring(o.kind), 0) end
  return make{ lr = o.lr, betas = { o.beta1, o.beta2 }, eps = o.eps, weight_decay = o.weight_decay,
               decay_all = o.decay_all, state = o.state }
end

local function rebuild_schedule(o)
  if type(o) ~= "table" then error("relay: schedule is not a table", 0) end
  if o.kind == "constant" then return optim.ConstantLR{ warmup = o.warmup } end
  local make = o.kind == "cosine" and optim.CosineLR or o.kind == "linear" and optim.LinearLR
  if not make then error("unknown schedule kind " .. tostring(o.kind), 0) end
  return make{ warmup = o.warmup, total = o.total, final_ratio = o.final_ratio }
end

-- An integer count or id from the file, in [0, max]: checked here, before anything
-- converts it (a C integer would take 2^32 + 5 as 5, and 1.5 as 1).
local function count_of(v, max, what)
  if type(v) ~= "number" or v ~= math.floor(v) or v < 0 or v > max then
    error(("%s must be an integer from 0 to %.17g, got %s"):format(what, max,
          type(v) == "string" and argcheck.describe(v) or tostring(v)), 0)   -- (a long string shortened)
  end
  return v
end
local EXACT_MAX = argcheck.EXACT_MAX   -- the last integer a JSON number read into Lua holds exactly

-- The constructor of a described layer, and the function that lists the records it
-- would make (layers.records, custom.records) without making them.
local function constructor_of(d, i, kinds)
  if type(d) ~= "table" or type(d.options) ~= "table" then error(("layer %d: no description"):format(i), 0) end
  local kind = type(d.kind) == "string" and layers.kinds[d.kind] or nil
  if kind and kind.constructor == nil then
    local make = kinds and kinds[d.custom]
    if make == nil then
      error(("layer %d is of the custom kind '%s': pass its constructor as kinds = {%s = ...} (from l2l.layer_kind)"):format(
        i, tostring(d.custom), tostring(d.custom)), 0)
    end
    return make, function(o) return custom.records(make, o) end
  elseif kind == nil then
    error(("layer %d has the unknown kind %s"):format(i, tostring(d.kind)), 0)
  end
  return layers[kind.constructor], layers.records[d.kind]
end

local function shape_text(shape) return table.concat(shape, ",") end

local function layer_error(i, d, message)
  error(("layer %d (%s): %s"):format(i, tostring(d.custom or d.kind), tostring(message)), 0)
end

-- The file's f32 tensor `name` of shape `want`, for layer i (label): present and shaped.
local function entry_for(file, name, want, i, label, fname)
  local e = file.entries[name]
  if e == nil then error(("%s: %s has no tensor '%s' for layer %d (%s)"):format(fname, file.path, name, i, label), 0) end
  -- f32, or a relay's bf16 master (master = "bf16"): either loads into either
  if (e.stored_dtype ~= "F32" and e.stored_dtype ~= "BF16") or shape_text(e.shape) ~= shape_text(want) then
    local stored = e.dtype and e.dtype:upper() == e.stored_dtype and e.dtype or e.stored_dtype   -- l2l's name where it has one
    error(("%s: %s: '%s' is %s (%s) but layer %d (%s) needs f32 or bf16 (%s)"):format(fname, file.path, name,
          stored, shape_text(e.shape), i, label, shape_text(want)), 0)
  end
  return e
end

-- Every tensor the description's layers would have, present in the file with the same
-- shape, checked before anything is built: a few bytes of metadata may describe a model
-- of terabytes, and building it first would allocate (and initialize) all of it. A file
-- that passes holds every parameter's data, so what loading builds is bounded by the
-- file's own size. A tied LM head's projection is its embedding's table (saved under
-- the embedding): it must match that table.
local function check_described_records(desc, file, kinds, fname)
  local first_embedding
  for i, d in ipairs(desc.layers) do
    local _, records_of = constructor_of(d, i, kinds)
    local ok, records = pcall(records_of, d.options)
    if not ok or records == nil then layer_error(i, d, records or "not a constructor from l2l.layer_kind") end
    local tied = d.kind == "lm_head" and d.options.tie == true
    for _, r in ipairs(records) do
      local name = i .. "." .. r.name
      if tied and r.name == "proj.weight" then
        name = first_embedding and first_embedding .. ".wte"
        if name == nil then error(("layer %d wants tie = true but no Embedding comes before it"):format(i), 0) end
      end
      entry_for(file, name, r.shape, i, tostring(d.custom or d.kind), fname)
    end
    if d.kind == "embedding" and first_embedding == nil then first_embedding = i end
  end
end

local function rebuild_layer(d, i, kinds)
  local make = constructor_of(d, i, kinds)
  local ok, layer = pcall(make, d.options)
  if not ok then layer_error(i, d, layer) end
  if d.rng_id ~= nil then layer:rng_id(count_of(d.rng_id, 2 ^ 24 - 1, ("layer %d: rng_id"):format(i))) end
  return layer
end

-- The model a description describes: its layers rebuilt, the frozen ones frozen.
local function model_of(desc, kinds)
  local list = {}
  local ok, err = pcall(function()
    for i, d in ipairs(desc.layers) do list[i] = rebuild_layer(d, i, kinds) end
  end)
  if not ok then   -- the layers made so far go at once (a refused load keeps nothing)
    for _, layer in ipairs(list) do layer:free() end
    error(err, 0)
  end
  local model = model_mod.Sequential(list)
  for i, d in ipairs(desc.layers) do
    if d.frozen then model:freeze(i) end
  end
  return model
end

-- Every checksum first (a damaged tensor changes nothing), then each record's weights
-- into its parameter, f32 and bf16 converted either way by the write (to nearest even, or
-- exactly; a bf16 master lives in the pinned pool), its value not handed out (a relay's
-- EPS then writes the record's 16-bit staging copy as it updates). The file was opened as
-- the loader's (opened): its errors are the loader's words.
local function read_weights(file, records)
  file:verify()
  for _, rec in ipairs(records) do
    local t = file:read(rec.name)
    local ok, err = pcall(rec.param.write, rec.param, t)
    t:free()
    if not ok then error(err, 0) end
  end
end

-- Every record of the model with the file's entry for it, shapes checked.
-- (list: where they go, given by a caller that frees their views whatever happens)
local function match_records(model, file, fname, list)
  list = list or {}
  local seen = {}
  for i, layer in ipairs(model) do
    for _, p in ipairs(layer:params()) do
      if not seen[p.id] then
        seen[p.id] = true
        local name = i .. "." .. p.name
        list[#list + 1] = { name = name, param = p }
        entry_for(file, name, p.shape, i, layer:label(), fname)
      else   -- a tied record's second views: not needed
        for _, key in ipairs { "value", "grad" } do   -- (each made only when read)
          if rawget(p, key) then p[key]:free() end
        end
      end
    end
  end
  return list
end

local function decode_description(file, fname)
  local text = file.metadata.l2l
  if text == nil then
    error(("%s: %s is a safetensors file but not an l2l checkpoint (no l2l metadata; for weights alone see l2l.load_weights)"):format(
      fname, file.path), 0)
  end
  local ok, desc = pcall(cjson.decode, text)
  if ok then desc = exact_numbers(desc) end
  if not ok or type(desc) ~= "table" or desc.format ~= FORMAT then
    error(("%s: %s: the l2l metadata is damaged"):format(fname, file.path), 0)
  end
  if desc.version ~= VERSION then
    error(("%s: %s: checkpoint version %s, this l2l reads version %d"):format(fname, file.path, tostring(desc.version), VERSION), 0)
  end
  if type(desc.layers) ~= "table" or #desc.layers == 0 or type(desc.records) ~= "table"
     or type(desc.relay) ~= "table" or type(desc.progress) ~= "table" then
    error(("%s: %s: the l2l metadata is incomplete"):format(fname, file.path), 0)
  end
  return desc
end

local function opened(path, fname)
  if type(path) ~= "string" or path == "" then error(fname .. ": path must be a non-empty string", 0) end
  return safetensors.open_as(fname, path)
end

-- What l2l.load may be given: the relay's options that are the machine's (relay_options'
-- "load" kind), the state's precision, and the constructors of layers written in Lua.
local AT_LOAD = relay_options.option_names({ load = true })
local LOAD_OVERRIDES = { kinds = true, state = true }
for _, k in ipairs(AT_LOAD) do LOAD_OVERRIDES[k] = true end

local function load(path, overrides)
  local fname = "l2l.load"
  overrides = argcheck.options(overrides, LOAD_OVERRIDES, fname, 0, "overrides")
  local file = opened(path, fname)
  local built = {}   -- what a refused load made, freed before it says so
  local ok, run = pcall(function()
    local desc = decode_description(file, fname)
    -- 1. the model and the relay, as described (nothing read from the data yet), once the
    -- file is known to hold every tensor the description asks for
    check_described_records(desc, file, overrides.kinds, fname)
    local model = model_of(desc, overrides.kinds)
    built.model = model
    local o = {}
    for k, v in pairs(desc.relay) do o[k] = v end
    -- worker threads are this machine's to give: a file's count beyond its cores (it may
    -- come from a bigger machine, or be anything) gives way to one per core
    if type(o.optimizer_threads) == "number" and o.optimizer_threads > C.l2l_get_threads() then
      o.optimizer_threads = 0
    end
    -- A file saved by a data-parallel run does not start MPI by itself: whoever loads it
    -- says whether this process is one rank of a job or trains alone.
    if o.dist == "mpi" and overrides.dist == nil then
      error(("%s: %s was saved by a data-parallel run (dist = \"mpi\"): load it with {dist = \"mpi\"} "
             .. "in each rank of an mpirun job, or {dist = \"none\"} to train in one process"):format(fname, path), 0)
    end
    for _, k in ipairs(AT_LOAD) do   -- (spill = false: no spill file, where the run had one)
      if overrides[k] ~= nil then o[k] = overrides[k] end
    end
    if overrides.spill == false then o.spill = nil end
    -- the state's precision may change on load (overrides.state): the arrays are converted
    local saved_optimizer = desc.relay.optimizer or {}
    if overrides.state ~= nil and type(saved_optimizer) == "table" then saved_optimizer.state = overrides.state end
    o.optimizer = rebuild_optimizer(saved_optimizer)
    o.schedule = rebuild_schedule(desc.relay.schedule or {})
    o.model = model
    -- the description's progress, read before anything is made of it
    count_of(desc.progress.steps, EXACT_MAX, "progress: steps")
    -- 2. the relay, with the file's policies (in the front end's words when they are wrong)
    local okr, new = pcall(relay.Relay, o)
    if not okr then   -- a spill folder the file names may not be on this machine
      local msg = tostring(new)
      if o.spill ~= nil and overrides.spill == nil and msg:find("spill directory", 1, true) then
        msg = msg:gsub(" %(make it, or give another%)", "") .. " (the run's own, which its file keeps: "
              .. "make it, or load with {spill = <a folder>}, or {spill = false} for none)"
      end
      error(msg, 0)
    end
    built.run = new
    for i, d in ipairs(desc.layers) do
      if d.inner then new:set_inner(i, d.inner) end
      if i >= 2 and d.stash then new:set_stash(i, d.stash) end
    end
    -- 3. the rest by the C API (l2l_relay_load): every record's tensors, names, shapes and
    -- checksums and every state array checked, then the weights, the optimizer state in
    -- the run's precision, the update counts, a gradient saved mid-accumulation (with ranks
    -- on rank 0), the progress and the loss scale restored
    if C.l2l_relay_load(relay.c_relay(new, fname, 2), path) ~= 0 then
      error(fname .. ": " .. relay_options.lua_message(), 0)
    end
    new.extra = desc.extra
    return new
  end)
  file:close()
  if not ok then
    -- nothing it made outlives a refusal: the relay (its EPS's memory, its spill file) and
    -- the layers go now, not when the collector comes round
    if built.run then built.run:free() end
    for _, layer in ipairs(built.model or {}) do layer:free() end
    local msg = without_positions(run)
    if not msg:find("^" .. fname:gsub("%.", "%%.")) then msg = ("%s: %s: %s"):format(fname, path, msg) end
    error(msg, 0)
  end
  return run
end

-- l2l.load(path [, {micro_batch =, optimizer_threads =, device_budget =, host_budget =,
-- spill =, dist =, state =, kinds = {name = constructor}}]) -> a run (run.model its model,
-- run.extra what run:save was given). With spill, the optimizer state goes to the spill file
-- record by record as it is read. state ("f32", "bf16", "8bit"): the run keeps its optimizer
-- state in that precision, the saved state converted as it is read.
function M.load(path, overrides, ...)
  if select("#", ...) ~= 0 then too_many("l2l.load", "path, overrides", 2, ...) end
  local ok, run = pcall(load, path, overrides)
  if not ok then error(run, 2) end
  return run
end

-- l2l.checkpoint_info(path) -> {steps =, updates =, layers = n, extra = the table run:save
-- was given}: what a checkpoint holds, from its header alone (no tensor is read), to decide
-- before loading or overwriting it.
function M.describe(path, ...)
  local fname = "l2l.checkpoint_info"
  if select("#", ...) ~= 0 then too_many(fname, "path", 2, ...) end
  local ok, info = pcall(function()
    local file = opened(path, fname)
    local okd, desc = pcall(decode_description, file, fname)
    file:close()
    if not okd then error(desc, 0) end
    return { steps = desc.progress.steps, updates = desc.progress.updates, layers = #desc.layers,
             extra = type(desc.extra) == "table" and desc.extra or {} }
  end)
  if not ok then error(without_positions(info), 2) end
  return info
end

-- l2l.load_model(path [, {kinds = {Name = constructor}}]) -> the checkpoint's model alone:
-- its layers rebuilt as described, frozen flags and the weights read (every checksum
-- checked first); no relay, no optimizer state (to sample from or evaluate a trained
-- model: l2l sample, l2l eval).
function M.load_model(path, opts, ...)
  local fname = "l2l.load_model"
  if select("#", ...) ~= 0 then too_many(fname, "path, opts", 2, ...) end
  local ok, model = pcall(function()
    opts = argcheck.options(opts, { kinds = true }, fname, 0, "opts")
    local file = opened(path, fname)
    local okb, built = pcall(function()
      local desc = decode_description(file, fname)
      check_described_records(desc, file, opts.kinds, fname)
      local m = model_of(desc, opts.kinds)
      read_weights(file, match_records(m, file, fname))
      return m
    end)
    file:close()
    if not okb then error(built, 0) end
    return built
  end)
  if not ok then error(without_positions(model), 2) end
  return model
end

-- l2l.load_weights(model, path): the weights of a checkpoint (or of any safetensors file
-- with l2l's names, "<layer>.<param>") into a model of the same shapes; nothing changes
-- unless every tensor matches.
function M.load_weights(model, path, ...)
  local fname = "l2l.load_weights"
  if select("#", ...) ~= 0 then too_many(fname, "model, path", 2, ...) end
  if not model_mod.is_sequential(model) then error(fname .. ": model must be an l2l.Sequential", 2) end
  local ok, err = pcall(function()
    local file = opened(path, fname)
    local okr, e = pcall(function()
      read_weights(file, match_records(model, file, fname))
    end)
    file:close()
    if not okr then error(e, 0) end
  end)
  if not ok then error(without_positions(err), 2) end
end

relay.set_saver(M.save)
return M
