-- SPDX-License-Identifier: MIT
-- l2l.layers — layer constructors (Embedding, Block, LMHead, Classifier) and their methods.
--
-- Purpose: the C layers of include/l2l/layers.h as Lua objects, Torch style: `y = layer:forward(x,
-- batch)` keeps what the backward needs inside the layer; `dx = layer:backward(dy, batch)`
-- uses it (once) and adds into the parameter gradients. Options are tables with defaults
-- a GPT-2 user would expect; misuse raises an error naming the option.
-- A batch is a table: tokens, targets, token_types, key_mask (tensors), seed, step,
-- first_sample, training (boolean, default true), loss_scale (heads' backward).
-- Layers written in Lua (l2l.layer_kind, lua/l2l/custom.lua) are Layers of kind "custom"
-- made here too; a C call that may run their Lua code goes through check_call, which
-- re-raises the Lua error a callback saved.
-- Must never: keep a C object without a finalizer, or let a failed C call pass silently.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local tensor = require("l2l.tensor")

local C, check, handle_of, too_many = lib.C, lib.check, tensor.handle_of, argcheck.too_many
local jit = require("jit")
local type, tostring, pairs, ipairs, floor, unpack, select = type, tostring, pairs, ipairs, math.floor, unpack, select

local M = {}

local Layer = {}
Layer.__index = Layer
M.Layer = Layer

local memory_modes = { standard = C.L2L_MEMORY_STANDARD, frugal = C.L2L_MEMORY_FRUGAL }
local memory_names = { [0] = "standard", [1] = "frugal" }

local function saved_gc(box) C.l2l_saved_free(box[0]) end

----------------------------------------------------------------- lifetime
-- When a relay and its layers become garbage in the same cycle their finalizers run in no
-- fixed order: a layer freed while a relay holds it is freed by C when the relay lets it
-- go (l2l_layer_free). Tables are keyed by the layer's address (a number), never by Lua
-- objects, so nothing here keeps a layer alive.

local function address(p) return tonumber(ffi.cast("intptr_t", p)) end
M.address = address

M.custom_info = {}   -- address -> {def =, names = {param name -> index}, options =} (custom.lua)
M.objects = setmetatable({}, { __mode = "v" })   -- address -> Lua layer object (weak)

local function free_now(p)
  local a = address(p)
  M.custom_info[a], M.objects[a] = nil, nil
  C.l2l_layer_free(p)
end

local function layer_gc(box)
  if box[0] ~= nil then free_now(box[0]) end
end

-- A Lua layer object around a new C layer (out: a fresh l2l_layer *[1] box).
local function wrap(out, kind, fields)
  local layer = fields or {}
  layer.kind, layer.handle = kind, ffi.gc(out, layer_gc)
  M.objects[address(out[0])] = layer
  return setmetatable(layer, Layer)
end
M.wrap = wrap

----------------------------------------------------------------- callbacks' errors
-- A layer written in Lua runs inside a C call; its Lua error cannot cross the C frames, so
-- the callback saves it here and returns nonzero; check_call raises it once C returns.

local callback = { message = nil, layer = nil }
function M.set_callback_error(message, layer_address)
  if callback.message == nil then callback.message, callback.layer = message, layer_address end
end
function M.clear_callback_error() callback.message, callback.layer = nil, nil end

-- Like lib.check, but a saved callback error wins over C's own message. With `locate`,
-- locate(layer_address) may return a prefix such as "layer 3 (GatedMLP): "; `words()`
-- gives C's last error in the caller's terms (default lib.last_error).
function M.check_call(status, fname, level, locate, words)
  local message, where = callback.message, callback.layer
  callback.message, callback.layer = nil, nil
  if status == 0 then return end
  local prefix = (locate and where) and locate(where) or ""
  if message ~= nil then error(fname .. ": " .. prefix .. message, level + 1) end
  error(fname .. ": " .. (words or lib.last_error)(), level + 1)
end
local check_call = M.check_call

----------------------------------------------------------------- options

-- (level: where errors point, 4 = the constructor's caller when called from a reader)
local function opt_number(o, key, default, fname, ok, what, level)
  level = level or 4
  local v = o[key]
  if v == nil then v = default end
  if v == nil then error(("%s: option '%s' is required"):format(fname, key), level) end
  if type(v) ~= "number" or not ok(v) then
    error(("%s: option '%s' must be %s, got %s"):format(fname, key, what, tostring(v)), level)
  end
  return v
end
local function positive_int(o, key, default, fname)
  return opt_number(o, key, default, fname, function(v) return v >= 1 and v == floor(v) and v < 2 ^ 53 end,
                    "an integer >= 1")
end
-- A setting C keeps in a float: it must hold as an f32 too (1e-46 is 0 there).
local function f32_number(o, key, default, fname, ok, what)
  local v = opt_number(o, key, default, fname, ok, what, 5)
  local trouble = lib.f32_trouble(v, ok)
  if trouble then
    error(("%s: option '%s' must be %s, got %s, which %s"):format(fname, key, what, tostring(v), trouble), 4)
  end
  return v
end
local function rate(o, key, default, fname)
  return f32_number(o, key, default, fname, function(v) return v >= 0 and v < 1 end, "in [0, 1)")
end
local function positive(o, key, default, fname)
  return f32_number(o, key, default, fname, function(v) return v > 0 and v < math.huge end,
                    "a finite number > 0")
end
local function flag(o, key, default, fname)
  local v = o[key]
  if v == nil then v = default end
  if type(v) ~= "boolean" then
    error(("%s: option '%s' must be true or false, got %s"):format(fname, key, tostring(v)), 4)
  end
  return v and 1 or 0
end

local seed_counter = 0
function M.next_seed()   -- distinct layers differ even without seeds
  seed_counter = seed_counter + 1
  return seed_counter
end

----------------------------------------------------------------- the kinds

-- The layer kinds, one entry each (the C side's registry is src/layers/registry.c): its
-- C number; its role (the C kind's: "input" reads the tokens, "body" maps (B,S,D) to
-- (B,S,D), "head" gives losses or logits); the constructor's name in l2l; the options it
-- takes, and those a checkpoint keeps to rebuild it (the weights come from the file); the
-- fields of its config filled from the options (beyond those every kind has); the shape
-- print(model) shows; its output's shape (a body's is x's). model.lua, relay.lua and
-- checkpoint.lua ask this table, never a kind's name. Adding a kind: its entry here and
-- its C file (see src/layers/kind.h).
local COMMON = { dim = 1, init_std = 1, seed = 1, pool = 1 }
local function with_common(t)
  for k in pairs(COMMON) do t[k] = 1 end
  return t
end

-- A field: the config's name, the check of its option, and its default (a function of
-- the options, dim and init_std where it depends on them).
local function count(o, key, default, fname)
  return opt_number(o, key, default, fname, function(v) return v >= 0 and v == floor(v) and v < 2 ^ 53 end,
                    "an integer >= 0")
end

local KINDS = {
  embedding = {
    id = C.L2L_LAYER_EMBEDDING, role = "input", constructor = "Embedding",
    options = with_common { vocab = 1, max_seq = 1, type_vocab = 1, dropout = 1 },
    saved = { "vocab", "dim", "max_seq", "type_vocab", "dropout" },
    fields = { { "vocab", positive_int }, { "max_seq", positive_int }, { "type_vocab", count, 0 },
               { "dropout", rate, 0 } },
    shape = function(c)
      return ("vocab %d -> dim %d, max_seq %d%s"):format(c.vocab, c.dim, c.max_seq,
             c.type_vocab > 0 and (", types " .. c.type_vocab) or "")
    end,
  },
  block = {
    id = C.L2L_LAYER_BLOCK, role = "body", constructor = "Block",
    options = with_common { heads = 1, mlp = 1, causal = 1, post_ln = 1, bias = 1, dropout = 1,
                            attn_dropout = 1, eps = 1, memory = 1, resid_std = 1 },
    saved = { "dim", "heads", "mlp", "causal", "post_ln", "bias", "dropout", "attn_dropout", "eps",
              "memory" },
    fields = { { "heads", positive_int }, { "mlp", positive_int, function(_, dim) return 4 * dim end },
               { "causal", flag, false }, { "post_ln", flag, false }, { "bias", flag, true },
               { "dropout", rate, 0 },
               { "attn_dropout", rate, function(o) return o.dropout or 0 end },
               { "resid_std", positive, function(_, _, init_std) return init_std end } },
    shape = function(c)
      return ("dim %d, heads %d, mlp %d, %s, %s"):format(c.dim, c.heads, c.mlp,
             c.causal and "causal" or "bidirectional", c.post_ln and "post-LN" or "pre-LN")
    end,
  },
  lm_head = {
    id = C.L2L_LAYER_LM_HEAD, role = "head", constructor = "LMHead",
    options = with_common { vocab = 1, final_ln = 1, tie = 1, eps = 1, memory = 1 },
    saved = { "vocab", "dim", "final_ln", "eps", "memory" },
    fields = { { "vocab", positive_int }, { "final_ln", flag, true } },
    shape = function(c, layer)
      return ("dim %d -> vocab %d%s"):format(c.dim, c.vocab, layer.tied_to and " (tied)" or "")
    end,
    -- per-position losses, or logits over the vocabulary
    output = function(c, B, S, targets) return targets and { B, S } or { B, S, c.vocab } end,
  },
  classifier = {
    id = C.L2L_LAYER_CLASSIFIER, role = "head", constructor = "Classifier",
    options = with_common { classes = 1 },
    saved = { "dim", "classes" },
    fields = { { "classes", positive_int } },
    shape = function(c) return ("dim %d -> classes %d"):format(c.dim, c.classes) end,
    output = function(c, B, _, targets) return targets and { B } or { B, c.classes } end,
  },
  -- made by l2l.layer_kind (custom.lua); its options are its own
  custom = { id = C.L2L_LAYER_CUSTOM, role = "body",
             shape = function(c) return ("dim %d"):format(c.dim) end },
}
M.kinds = KINDS
local kind_names = {}
for name, k in pairs(KINDS) do kind_names[tonumber(k.id)] = name end

-- A layer of `kind` made from the options o, or with `describe` only the records it
-- would have ({name =, shape =} each, as l2l_layer_config_params says), nothing allocated.
local function new_layer(kind, fname, o, describe)
  local k = KINDS[kind]
  o = argcheck.options(o, k.options, fname, 3)
  local c = ffi.new("l2l_layer_config")
  c.kind = k.id
  local dim, init_std = positive_int(o, "dim", nil, fname), positive(o, "init_std", 0.02, fname)
  c.dim, c.init_std = dim, init_std
  c.eps = positive(o, "eps", 1e-5, fname)
  local mem = o.memory or "standard"
  if memory_modes[mem] == nil then
    error(("%s: option 'memory' must be \"standard\" or \"frugal\", got %s"):format(fname, tostring(mem)), 3)
  end
  c.memory = memory_modes[mem]
  local problem = o.seed ~= nil and argcheck.whole_problem(o.seed)
  if problem then error(("%s: option 'seed' %s, got %s"):format(fname, problem, tostring(o.seed)), 3) end
  c.init_seed = o.seed or (describe and 0 or M.next_seed())   -- (a description draws no seed)
  for _, f in ipairs(k.fields) do
    local name, read, default = f[1], f[2], f[3]
    if type(default) == "function" then default = default(o, dim, init_std) end
    c[name] = read(o, name, default, fname)
  end
  local pool = lib.pool_id(o.pool or "host", fname, 3)
  if describe then
    local infos, count = ffi.new("l2l_param_info[?]", C.L2L_MAX_PARAMS), ffi.new("int[1]")
    check(C.l2l_layer_config_params(infos, C.L2L_MAX_PARAMS, count, c), fname, 3)
    local records = {}
    for i = 0, count[0] - 1 do
      local shape = {}
      for d = 0, infos[i].ndim - 1 do shape[d + 1] = tonumber(infos[i].shape[d]) end
      records[i + 1] = { name = ffi.string(infos[i].name), shape = shape }
    end
    return records
  end
  local out = ffi.new("l2l_layer *[1]")
  check(C.l2l_layer_new(out, c, pool), fname, 3)
  -- handle: a one-element box; its finalizer frees the content (layer_gc)
  return wrap(out, kind, { tie = k.options.tie and o.tie or nil })
end

-- M.records[kind](options): the records a layer made with these options would have,
-- without making it (checkpoint.lua compares them with a file before building anything).
M.records = {}
for kind, k in pairs(KINDS) do
  if k.constructor then
    local fname = "l2l." .. k.constructor
    -- not tail calls: new_layer's errors name the caller of these (level 3)
    M[k.constructor] = function(o, ...)
      if select("#", ...) ~= 0 then too_many(fname, "options", 2, ...) end
      local layer = new_layer(kind, fname, o)
      return layer
    end
    M.records[kind] = function(o)
      local records = new_layer(kind, fname, o, true)
      return records
    end
  end
end

-- The role of a layer's kind: "input", "body" or "head".
function M.role(layer) return KINDS[layer.kind].role end

function M.is_layer(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.is_layer", "x", 2, ...) end
  return getmetatable(x) == Layer
end

----------------------------------------------------------------- methods

local function H(layer, fname)
  if getmetatable(layer) ~= Layer then error(fname .. ": self must be a layer", 3) end
  local h = layer.handle[0]
  if h == nil then error(fname .. ": the layer was freed", 3) end
  return h
end
M.H = H

-- "block", "lm_head", ... or a custom kind's name ("GatedMLP").
function Layer:label(...)
  if select("#", ...) ~= 0 then too_many("layer:label", "", 2, ...) end
  if self.kind == "custom" then
    return self.custom and self.custom.name or ffi.string(C.l2l_layer_name(H(self, "layer:label")))
  end
  return self.kind
end

-- The layer's C name (l2l_layer_name): the kind's name, or a custom kind's own.
function Layer:name(...)
  if select("#", ...) ~= 0 then too_many("layer:name", "", 2, ...) end
  local p = C.l2l_layer_name(H(self, "layer:name"))
  return p ~= nil and ffi.string(p) or self:label()
end

-- The id that keys this layer's dropout draws; layer:rng_id(n) sets it (two layers with
-- one id and one seed draw the same masks), and then a model keeps it (model.lua numbers
-- the layers whose id nobody set).
function Layer:rng_id(id, ...)
  if select("#", ...) ~= 0 then too_many("layer:rng_id", "id", 2, ...) end
  local h = H(self, "layer:rng_id")
  if id ~= nil then
    if type(id) ~= "number" or id ~= floor(id) or id < 0 or id >= 2 ^ 24 then
      error("layer:rng_id: id must be an integer from 0 to 2^24 - 1, got " .. tostring(id), 2)
    end
    check(C.l2l_layer_set_rng_id(h, id), "layer:rng_id", 2)
    self.rng_fixed = true
  end
  return tonumber(C.l2l_layer_rng_id(h))
end

-- Frees the C layer now (safe twice). A layer inside a relay cannot be freed: remove it
-- from the model (and let a step or run:free() take it out of the relay) first.
function Layer:free(...)
  if select("#", ...) ~= 0 then too_many("layer:free", "", 2, ...) end
  local h = self.handle[0]
  if h == nil then return end
  if C.l2l_layer_relay(h) ~= nil then
    error("layer:free: the layer is in a relay; remove it from the model, or free the relay, first", 2)
  end
  self.handle[0] = nil
  free_now(h)
end

function Layer:config(...)
  if select("#", ...) ~= 0 then too_many("layer:config", "", 2, ...) end
  local c = ffi.new("l2l_layer_config")
  check(C.l2l_layer_get_config(c, H(self, "layer:config")), "layer:config", 2)
  return {
    kind = kind_names[tonumber(c.kind)], name = self:name(), dim = tonumber(c.dim), heads = tonumber(c.heads),
    mlp = tonumber(c.mlp), vocab = tonumber(c.vocab), max_seq = tonumber(c.max_seq),
    type_vocab = tonumber(c.type_vocab), classes = tonumber(c.classes),
    causal = c.causal == 1, post_ln = c.post_ln == 1, bias = c.bias == 1,
    final_ln = c.final_ln == 1, dropout = c.dropout, attn_dropout = c.attn_dropout,
    eps = c.eps, memory = memory_names[tonumber(c.memory)],
  }
end

function Layer:nparams(...)
  if select("#", ...) ~= 0 then too_many("layer:nparams", "", 2, ...) end
  return tonumber(C.l2l_layer_nparams(H(self, "layer:nparams")))
end

-- An entry's value and grad are made when first read: l2l_param_value and l2l_param_grad
-- hand the master and the accumulator out (a script may write them at any time from then
-- on), so a relay's EPS rewrites the record's staging copy every step and reads its
-- accumulator at every update; an entry whose tensors are never read leaves the EPS free
-- to write the staging copy as it updates and to take the accumulator it cleared itself
-- as zero (include/l2l/layers.h). Read then, the record must still be its layer's (not
-- freed, not replaced by a tie).
local handed = { value = C.l2l_param_value, grad = C.l2l_param_grad }

-- The entry's record, still its layer's (not freed, not replaced by a tie), else an error
-- at `level` from fname's caller.
local function held_record(entry, fname, level)
  local h = H(entry.layer, fname)
  local held = false
  for i = 0, C.l2l_layer_param_count(h) - 1 do held = held or C.l2l_layer_param(h, i) == entry.handle end
  if not held then error(fname .. ": the record " .. entry.name .. " is no longer its layer's", level + 1) end
  return entry.handle
end

-- p:write(t): t's values into the record (its shape; f32, f16 or bf16, rounded to the
-- record's dtype or widened), without handing its value out (l2l_param_write): how the
-- loaders write weights, leaving a relay's EPS to write the 16-bit staging copy as it
-- updates. Between steps, after run:sync(), as through p.value.
local function write(entry, t, ...)
  local fname = "p:write"
  if select("#", ...) ~= 0 then too_many(fname, "t", 2, ...) end
  local p = held_record(entry, fname, 2)
  check(C.l2l_param_write(p, handle_of(t, "t", fname, 2)), fname, 2)
end

local lazy_tensors = {
  __index = function(entry, key)
    if key == "write" then return write end
    local hand = handed[key]
    if hand == nil then return nil end
    local fname = "p." .. key
    local t, out = hand(held_record(entry, fname, 2)), ffi.new("l2l_tensor *[1]")
    check(C.l2l_tensor_view_rows(out, t, 0, C.l2l_tensor_dim(t, 0)), fname, 2)
    t = tensor.wrap(out[0])
    rawset(entry, key, t)
    return t
  end,
}

-- {name=, value=, grad=, numel=, shape=, decays=, users=, id=, handle=, layer=} per
-- parameter record, and p:write(t) (above); value and grad are tensors sharing the
-- record's storage (made when first read: pairs() lists them only from then), numel and
-- shape (a list of dims) theirs. `id` identifies the record
-- (tied layers share it); `handle` is its l2l_param * (valid while `layer` lives, which
-- the record keeps alive).
function Layer:params(...)
  if select("#", ...) ~= 0 then too_many("layer:params", "", 2, ...) end
  local h = H(self, "layer:params")
  local list = {}
  local dims = ffi.new("int64_t[?]", C.L2L_MAX_DIMS)
  for i = 0, C.l2l_layer_param_count(h) - 1 do
    local p = C.l2l_layer_param(h, i)
    local shape = {}
    for d = 0, C.l2l_param_shape(p, dims) - 1 do shape[d + 1] = tonumber(dims[d]) end
    list[#list + 1] = setmetatable({
      name = ffi.string(C.l2l_param_name(p)), numel = tonumber(C.l2l_param_numel(p)), shape = shape,
      decays = C.l2l_param_decays(p) == 1, users = C.l2l_param_users(p),
      id = tonumber(ffi.cast("intptr_t", p)), handle = p, layer = self,
    }, lazy_tensors)
  end
  return list
end

function Layer:zero_grad(...)
  if select("#", ...) ~= 0 then too_many("layer:zero_grad", "", 2, ...) end
  check(C.l2l_layer_zero_grad(H(self, "layer:zero_grad")), "layer:zero_grad", 2)
end

function Layer:set_memory(mode, ...)
  if select("#", ...) ~= 0 then too_many("layer:set_memory", "mode", 2, ...) end
  if memory_modes[mode] == nil then
    error("layer:set_memory: mode must be \"standard\" or \"frugal\", got " .. tostring(mode), 2)
  end
  check(C.l2l_layer_set_memory(H(self, "layer:set_memory"), memory_modes[mode]), "layer:set_memory", 2)
end

-- Bytes for a micro-batch of B samples of S positions: {params, saved, input_kept,
-- output_kept, work_forward, work_backward, peak}.
function Layer:memory(micro_batch, seq, ...)
  if select("#", ...) ~= 0 then too_many("layer:memory", "micro_batch, seq", 2, ...) end
  local m = ffi.new("l2l_layer_memory")
  check(C.l2l_layer_memory_use(m, H(self, "layer:memory"), micro_batch or 0, seq or 0), "layer:memory", 2)
  return {
    params = tonumber(m.params), saved = tonumber(m.saved), input_kept = tonumber(m.input_kept),
    output_kept = tonumber(m.output_kept), work_forward = tonumber(m.work_forward),
    work_backward = tonumber(m.work_backward), peak = tonumber(m.peak),
  }
end

-- Bytes this layer's backward holds from its forward: its saved state plus its input
-- when it reads it (the output belongs to the next layer as its input).
function Layer:saved_bytes(micro_batch, seq, ...)
  if select("#", ...) ~= 0 then too_many("layer:saved_bytes", "micro_batch, seq", 2, ...) end
  local m = self:memory(micro_batch, seq)
  return m.saved + m.input_kept
end

-- A deep copy: the same values in new records (gradients zero), a new rng id. A custom
-- layer's copy keeps its kind and options.
function Layer:clone(...)
  if select("#", ...) ~= 0 then too_many("layer:clone", "", 2, ...) end
  local h = H(self, "layer:clone")
  -- The relay holding the layer may still be updating it (or, with ranks, gathering its
  -- updated weights): the copy waits for that, as reading through the relay does.
  local owner = C.l2l_layer_relay(h)
  if owner ~= nil then check(C.l2l_relay_sync(owner), "layer:clone", 2) end
  local out = ffi.new("l2l_layer *[1]")
  check(C.l2l_layer_clone(out, h), "layer:clone", 2)
  local twin = wrap(out, self.kind, { tie = self.tie, custom = self.custom, options = self.options })
  local info = M.custom_info[address(h)]
  if info ~= nil then M.custom_info[address(out[0])] = info end
  return twin
end

-- head:tie_to(embedding): the LM head's projection becomes the embedding's table.
function Layer:tie_to(embedding, ...)
  if select("#", ...) ~= 0 then too_many("layer:tie_to", "embedding", 2, ...) end
  if not M.is_layer(embedding) then error("layer:tie_to: embedding must be a layer", 2) end
  check(C.l2l_layer_tie(H(self, "layer:tie_to"), embedding.handle[0]), "layer:tie_to", 2)
  self.tied_to = embedding   -- keeps the embedding's record alive as long as the head
end

----------------------------------------------------------------- forward and backward

local function opt_handle(t, name, fname)
  if t == nil then return nil end
  return handle_of(t, name, fname, 4)
end

-- The fields a layer's batch may have (include/l2l/layers.h's l2l_layer_batch); l2l.model adds its own.
local BATCH_FIELDS = { tokens = true, token_types = true, targets = true, key_mask = true, first_sample = true,
                       seed = true, step = true, training = true, loss_scale = true }
M.BATCH_FIELDS = BATCH_FIELDS

local function batch_struct(b, fname)
  argcheck.fields(b, BATCH_FIELDS, fname, 3, "batch")
  local s = ffi.new("l2l_layer_batch")
  s.tokens = opt_handle(b.tokens, "batch.tokens", fname)
  s.token_types = opt_handle(b.token_types, "batch.token_types", fname)
  s.targets = opt_handle(b.targets, "batch.targets", fname)
  s.key_mask = opt_handle(b.key_mask, "batch.key_mask", fname)
  s.first_sample = b.first_sample or 0
  s.seed = b.seed or 0
  s.step = b.step or 0
  if b.training ~= nil and type(b.training) ~= "boolean" then
    error(fname .. ": batch.training must be true or false", 3)
  end
  s.training = b.training == false and 0 or 1
  s.loss_scale = b.loss_scale or 1
  return s
end

-- The output shape for input x (or tokens) and the batch.
local function output_shape(self, x, b)
  local c, k = self:config(), KINDS[self.kind]
  local ref = k.role == "input" and b.tokens or x
  local B, S = ref:dim(1), ref:dim(2)
  if k.output then return k.output(c, B, S, b.targets ~= nil) end
  return { B, S, c.dim }
end

-- y = layer:forward(x, batch): x nil for an embedding; heads return per-token (or per-
-- sample) losses, or logits when batch.targets is nil. Keeps what backward needs unless
-- batch.training is false.
function Layer:forward(x, batch, ...)
  if select("#", ...) ~= 0 then too_many("layer:forward", "x, batch", 2, ...) end
  local fname = "layer:forward"
  local h = H(self, fname)
  local s = batch_struct(batch, fname)
  local xh = x ~= nil and handle_of(x, "x", fname, 2) or nil
  local input = KINDS[self.kind].role == "input"
  local ref = input and batch.tokens or x
  if ref == nil then error(fname .. (input and ": batch.tokens is required" or ": x is required"), 2) end
  handle_of(ref, input and "batch.tokens" or "x", fname, 2)
  local y = tensor.empty(output_shape(self, x, batch), { pool = ref:pool() })
  local keep = batch.training ~= false
  local saved = keep and ffi.gc(ffi.new("l2l_saved *[1]"), saved_gc) or nil
  M.clear_callback_error()
  check_call(C.l2l_layer_forward(saved, h, handle_of(y, "y", fname, 2), xh, s), fname, 2)
  self.saved = saved
  self.saved_x = keep and x or nil   -- what the saved state may refer to stays alive
  self.saved_input = { ref:dim(1), ref:dim(2), ref:pool() }   -- for dx's shape
  return y
end

-- dx = layer:backward(dy, batch): dy nil for heads (batch.loss_scale scales the losses'
-- gradient); dx nil for the embedding. Parameter gradients accumulate.
function Layer:backward(dy, batch, ...)
  if select("#", ...) ~= 0 then too_many("layer:backward", "dy, batch", 2, ...) end
  local fname = "layer:backward"
  local h = H(self, fname)
  local s = batch_struct(batch, fname)
  if self.saved == nil or self.saved[0] == nil then
    error(fname .. ": no saved state (run forward with training first)", 2)
  end
  local dx
  if KINDS[self.kind].role ~= "input" then
    local B, S, pool = unpack(self.saved_input)
    dx = tensor.empty({ B, S, self:config().dim }, { pool = pool })
  end
  M.clear_callback_error()
  local status = C.l2l_layer_backward(h, dx and handle_of(dx, "dx", fname, 2) or nil,
                                      dy ~= nil and handle_of(dy, "dy", fname, 2) or nil,
                                      self.saved[0], s)
  C.l2l_saved_free(self.saved[0])
  self.saved[0], self.saved_x = nil, nil
  check_call(status, fname, 2)
  return dx
end

-- l2l_layer_forward and l2l_layer_backward may call back into Lua (layers written in Lua,
-- custom.lua). LuaJIT cannot enter a callback from a C call made by JIT-compiled code (it
-- fails with "bad callback"), so these two functions always run in the interpreter: a
-- trace that reaches them stops there. Their cost is the C call, not the Lua around it.
jit.off(Layer.forward)
jit.off(Layer.backward)

return M
