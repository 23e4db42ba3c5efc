-- SPDX-License-Identifier: MIT
-- l2l.model — l2l.Sequential: a model as a list of layers, run whole (no relay), and
-- changed between steps (insert, remove, replace, clone, freeze).
--
-- Purpose: the plain reference way to train a model made of l2l layers: one forward over
-- every layer keeping every activation, the loss as the mean over all real (non-ignored)
-- targets, one backward in reverse. The relay must agree with it. An LMHead made with
-- `tie = true` is tied to the model's first Embedding here, so the pair shares one
-- parameter record whose gradient sums both uses. The list is also what l2l.Relay trains:
-- in a relay the model is a view of the C relay's list, each change (insert, add, remove,
-- replace, clone, freeze) made there first and here only once C took it, so the script
-- changes the model, never the relay, and the two never differ.
-- The layers are the model's array part (model[i], also model.layers[i]), so `#model`
-- works without __len (LuaJIT without 5.2 compatibility ignores __len on tables).
-- Dropout draws are keyed by each layer's rng id (include/l2l.h). A model numbers its layers
-- in the order they join it: 1, 2, ... as it is built, and an inserted, added or cloned
-- layer takes one past the highest id in the model. So the same script draws the same
-- masks in any process, whatever was built before it (a process-wide counter made two
-- builds of one model differ), and inserting or removing a layer changes no other
-- layer's draws. An id set by hand (layer:rng_id(n), or by l2l.load) is kept.
-- Must never: count a shared parameter record twice (params(), nparams()), or hold one
-- layer twice (its saved state and its place in a relay are single).
local layers = require("l2l.layers")
local argcheck = require("l2l.argcheck")

local type, ipairs, pairs, tostring, floor, select = type, ipairs, pairs, tostring, math.floor, select
local too_many = argcheck.too_many
local insert, remove, concat = table.insert, table.remove, table.concat

local M = {}
local Sequential = {}
Sequential.__index = Sequential

local function check_layer(layer, index, fname)
  if not layers.is_layer(layer) then
    error(("%s: entry %d is not a layer (got %s)"):format(fname, index, type(layer)), 3)
  end
end

local function highest_rng_id(self)
  local top = 0
  for _, layer in ipairs(self) do top = math.max(top, layer:rng_id()) end
  return top
end

-- The layer joining the model after its other layers takes the next id, unless its id
-- was set by hand or by the model it came from.
local function number_layer(layer, top)
  if layer.rng_fixed then return top end
  layer:rng_id(top + 1)
  return top + 1
end

local function first_embedding(self)
  for _, layer in ipairs(self) do
    if layers.role(layer) == "input" then return layer end
  end
end

function M.Sequential(list, ...)
  local fname = "l2l.Sequential"
  if select("#", ...) ~= 0 then too_many(fname, "list", 2, ...) end
  if type(list) ~= "table" then error(fname .. ": expects a list of layers, got " .. argcheck.describe(list), 2) end
  argcheck.fields(list, {}, fname, 2, "the list of layers", true)
  local self = setmetatable({}, Sequential)
  self.layers = self                                   -- model.layers[i] == model[i]
  self.frozen_set = setmetatable({}, { __mode = "k" }) -- layer -> true (follows the layer)
  self.version = 0                                     -- counts the changes (a plan's key)
  self.relay_link = setmetatable({}, { __mode = "v" }) -- .acts: the relay following it
  local embedding, seen = nil, {}
  for i, layer in ipairs(list) do
    check_layer(layer, i, fname)
    if seen[layer] then error(("%s: entry %d is entry %d again (a layer goes in once)"):format(fname, i, seen[layer]), 2) end
    seen[layer] = i
    if layers.role(layer) == "input" and embedding == nil then embedding = layer end
    if layer.tie and not layer.tied_to then
      if embedding == nil then error(("%s: layer %d wants tie = true but no Embedding comes before it"):format(fname, i), 2) end
      local ok, err = pcall(layer.tie_to, layer, embedding)
      if not ok then error(("%s: layer %d: %s"):format(fname, i, tostring(err):gsub("^[^:]*:%d+: ", "")), 2) end
    end
    self[i] = layer
  end
  -- ids set by hand first, so that the numbers given to the others do not meet them
  local top = 0
  for _, layer in ipairs(self) do
    if layer.rng_fixed then top = math.max(top, layer:rng_id()) end
  end
  for _, layer in ipairs(self) do top = number_layer(layer, top) end
  return self
end

function M.is_sequential(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.is_sequential", "x", 2, ...) end
  return getmetatable(x) == Sequential
end

-- The relay training the model (l2l.relay, above this module) follows it: `acts` makes a
-- change in the C relay (insert(i, layer, fname), remove(i, fname), replace(i, layer,
-- fname), frozen(i, on, fname)) or raises without making it. Held weakly: a relay nobody
-- keeps can be collected, and the model then stands alone.
function M.follow(model, acts) model.relay_link.acts = acts end
function M.unfollow(model, acts)
  if model.relay_link.acts == acts then model.relay_link.acts = nil end
end

-- A change made in the following relay first (errors at the caller of the method).
local function in_relay(self, act, ...)
  local acts = self.relay_link.acts
  if acts ~= nil then
    local ok, err = pcall(acts[act], ...)
    if not ok then error(err, 3) end
  end
  self.version = self.version + 1
end

----------------------------------------------------------------- the list

-- An integer index in [1, n]; `what` names the argument in errors.
local function index_arg(self, i, fname, what, n)
  n = n or #self
  if type(i) ~= "number" or i ~= floor(i) or i < 1 or i > n then
    if n < 1 then error(("%s: the model has no layers (%s = %s)"):format(fname, what, tostring(i)), 3) end
    error(("%s: %s must be an integer in [1, %d], got %s"):format(fname, what, n, tostring(i)), 3)
  end
  return i
end

local function position_of(self, layer)
  for i, l in ipairs(self) do
    if l == layer then return i end
  end
end

-- A layer about to enter the model: a layer, not already in it; an LMHead with tie =
-- true gets tied to the model's first Embedding.
local function admit(self, layer, fname)
  if not layers.is_layer(layer) then error(("%s: layer must be a layer, got %s"):format(fname, type(layer)), 3) end
  local at = position_of(self, layer)
  if at then error(("%s: the layer is already in the model (layer %d)"):format(fname, at), 3) end
  if layer.tie and not layer.tied_to then
    local embedding = first_embedding(self)
    if embedding == nil then error(fname .. ": the layer wants tie = true but the model has no Embedding", 3) end
    local ok, err = pcall(layer.tie_to, layer, embedding)
    if not ok then error(fname .. ": " .. tostring(err):gsub("^[^:]*:%d+: ", ""), 3) end
  end
  number_layer(layer, highest_rng_id(self))
end

function Sequential:layer(i, ...)
  if select("#", ...) ~= 0 then too_many("model:layer", "i", 2, ...) end
  index_arg(self, i, "model:layer", "index")
  return self[i]
end

-- model:insert(index, layer): the layer becomes layer `index` (1 .. #model + 1).
function Sequential:insert(index, layer, ...)
  if select("#", ...) ~= 0 then too_many("model:insert", "index, layer", 2, ...) end
  local fname = "model:insert"
  index_arg(self, index, fname, "index", #self + 1)
  admit(self, layer, fname)
  in_relay(self, "insert", index, layer, fname)
  insert(self, index, layer)
  return layer
end

-- model:add(layer): appends.
function Sequential:add(layer, ...)
  if select("#", ...) ~= 0 then too_many("model:add", "layer", 2, ...) end
  admit(self, layer, "model:add")
  in_relay(self, "insert", #self + 1, layer, "model:add")
  self[#self + 1] = layer
  return layer
end

-- Layer `index` may leave the model (for `incoming`, or nil): not while a layer staying
-- is tied to it (an LM head sharing this embedding's table would keep the table as its
-- own while it says it is tied: a checkpoint no load could read; the relay refuses it
-- alike, for C callers).
local function check_leaving(self, index, incoming, fname)
  local leaving = self[index]
  for j, other in ipairs(self) do
    if j ~= index and other.tied_to == leaving and other ~= incoming then
      error(("%s: layer %d (%s): its token table is also layer %d's (%s, tied to it): remove or replace that "
             .. "layer first"):format(fname, index, leaving:label(), j, other:label()), 3)
    end
  end
end

-- model:remove(index) -> the layer (no longer in the model; not freed).
function Sequential:remove(index, ...)
  if select("#", ...) ~= 0 then too_many("model:remove", "index", 2, ...) end
  index_arg(self, index, "model:remove", "index")
  check_leaving(self, index, nil, "model:remove")
  in_relay(self, "remove", index, "model:remove")
  local layer = remove(self, index)
  self.frozen_set[layer] = nil
  return layer
end

-- model:replace(index, layer) -> the layer that was there.
function Sequential:replace(index, layer, ...)
  if select("#", ...) ~= 0 then too_many("model:replace", "index, layer", 2, ...) end
  local fname = "model:replace"
  index_arg(self, index, fname, "index")
  local old = self[index]
  if layer ~= old then
    check_leaving(self, index, layer, fname)
    admit(self, layer, fname)
    in_relay(self, "replace", index, layer, fname)
    self[index] = layer
    self.frozen_set[old] = nil
  end
  return old
end

-- model:clone(from [, to = from + 1]) -> the copy of layer `from` (same weights, new
-- records: in a relay it starts with fresh optimizer state), inserted as layer `to`.
function Sequential:clone(from, to, ...)
  if select("#", ...) ~= 0 then too_many("model:clone", "from, to", 2, ...) end
  local fname = "model:clone"
  index_arg(self, from, fname, "from")
  if to == nil then to = from + 1 end
  index_arg(self, to, fname, "to", #self + 1)
  local ok, twin = pcall(self[from].clone, self[from])
  if not ok then error(fname .. ": " .. tostring(twin):gsub("^[^:]+:%d+: ", ""), 2) end
  if twin.tie then twin.tied_to = nil end
  admit(self, twin, fname)
  in_relay(self, "insert", to, twin, fname)
  insert(self, to, twin)
  return twin
end

-- A frozen layer passes gradients through but is not updated (by l2l.Relay).
function Sequential:freeze(index, ...)
  if select("#", ...) ~= 0 then too_many("model:freeze", "index", 2, ...) end
  index_arg(self, index, "model:freeze", "index")
  in_relay(self, "frozen", index, true, "model:freeze")
  self.frozen_set[self[index]] = true
end

function Sequential:unfreeze(index, ...)
  if select("#", ...) ~= 0 then too_many("model:unfreeze", "index", 2, ...) end
  index_arg(self, index, "model:unfreeze", "index")
  in_relay(self, "frozen", index, false, "model:unfreeze")
  self.frozen_set[self[index]] = nil
end

function Sequential:frozen(index, ...)
  if select("#", ...) ~= 0 then too_many("model:frozen", "index", 2, ...) end
  index_arg(self, index, "model:frozen", "index")
  return self.frozen_set[self[index]] == true
end

----------------------------------------------------------------- parameters

-- Unique parameter records, in layer order: {name = "<layer>.<param>", value, grad, decays}.
function Sequential:params(...)
  if select("#", ...) ~= 0 then too_many("model:params", "", 2, ...) end
  local seen, list = {}, {}
  for i, layer in ipairs(self) do
    for _, p in ipairs(layer:params()) do
      if not seen[p.id] then
        seen[p.id] = true
        p.name = i .. "." .. p.name
        list[#list + 1] = p
      end
    end
  end
  return list
end

function Sequential:nparams(...)
  if select("#", ...) ~= 0 then too_many("model:nparams", "", 2, ...) end
  local n = 0
  for _, p in ipairs(self:params()) do n = n + p.numel end
  return n
end

function Sequential:zero_grad(...)
  if select("#", ...) ~= 0 then too_many("model:zero_grad", "", 2, ...) end
  for _, layer in ipairs(self) do layer:zero_grad() end
end

----------------------------------------------------------------- forward and backward

-- A model's batch: a layer's (layers.BATCH_FIELDS) but the loss scale, which the model
-- works out itself, and with `skip`.
local BATCH_FIELDS = { skip = true }
for k in pairs(layers.BATCH_FIELDS) do
  if k ~= "loss_scale" then BATCH_FIELDS[k] = true end
end

-- Errors inside a layer name its index (like torch/nn's containers).
local function run_layer(i, layer, f)
  local ok, result = pcall(f)
  if not ok then
    error(("layer %d (%s): %s"):format(i, layer:label(), tostring(result):gsub("^[^:]+:%d+: ", "")), 0)
  end
  return result
end

-- Real targets in batch.targets (those that are not -1).
local function real_targets(targets)
  local n, p = 0, targets:data()
  for i = 0, targets:numel() - 1 do
    if p[i] ~= -1 then n = n + 1 end
  end
  return n
end

-- batch.skip = {indices}: those blocks act as the identity (LayerDrop), as in the relay.
local function skip_set(self, batch, fname)
  if batch.skip == nil then return {} end
  if type(batch.skip) ~= "table" then error(fname .. ": batch.skip must be a list of layer indices", 3) end
  local set = {}
  for _, i in ipairs(batch.skip) do
    if type(i) ~= "number" or i ~= floor(i) or i < 1 or i > #self then
      error(("%s: batch.skip: %s is not a layer index in [1, %d]"):format(fname, tostring(i), #self), 3)
    end
    if layers.role(self[i]) ~= "body" then
      error(("%s: batch.skip: layer %d (%s) cannot be skipped: only blocks and custom layers can"):format(fname, i, self[i].kind), 3)
    end
    set[i] = true
  end
  return set
end

-- loss = model:forward(batch): batch.tokens through every layer; with batch.targets the
-- last layer (a head) gives per-target losses, and the result is their mean over real
-- targets; without targets, the last layer's output (logits) is returned.
function Sequential:forward(batch, ...)
  if select("#", ...) ~= 0 then too_many("model:forward", "batch", 2, ...) end
  argcheck.fields(batch, BATCH_FIELDS, "model:forward", 2, "batch")
  if #self == 0 then error("model:forward: the model has no layers", 2) end
  local skip = skip_set(self, batch, "model:forward")
  local layer_batch = {}   -- what the layers read: the batch without skip
  for k, v in pairs(batch) do
    if k ~= "skip" then layer_batch[k] = v end
  end
  local x
  for i, layer in ipairs(self) do
    if not skip[i] then
      x = run_layer(i, layer, function() return layer:forward(x, layer_batch) end)
    end
  end
  self.skipped = skip
  if batch.targets == nil then return x end
  local count = real_targets(batch.targets)
  self.loss_scale = count > 0 and 1 / count or 0
  local sum = 0
  local p = x:data()
  for i = 0, x:numel() - 1 do sum = sum + p[i] end
  return sum * self.loss_scale
end

-- model:backward(batch): gradients of the mean loss of the last forward into every
-- parameter's grad (accumulating).
function Sequential:backward(batch, ...)
  if select("#", ...) ~= 0 then too_many("model:backward", "batch", 2, ...) end
  if self.loss_scale == nil then error("model:backward: run forward with targets first", 2) end
  argcheck.fields(batch, BATCH_FIELDS, "model:backward", 2, "batch")
  local plain = {}
  for k, v in pairs(batch) do
    if k ~= "skip" then plain[k] = v end
  end
  plain.loss_scale = self.loss_scale
  local skip = self.skipped or {}
  local dy
  for i = #self, 1, -1 do
    local layer = self[i]
    if not skip[i] then
      dy = run_layer(i, layer, function() return layer:backward(dy, plain) end)
    end
  end
  self.loss_scale, self.skipped = nil, nil
end

----------------------------------------------------------------- printing

local function shape_of(layer)
  return layers.kinds[layer.kind].shape(layer:config(), layer)
end

-- The memory mode of the kinds that have one (their constructor takes `memory`).
local function memory_of(layer)
  local options = layers.kinds[layer.kind].options
  return options and options.memory and layer:config().memory or "-"
end

-- print(model): one row per layer (index, kind, shape, parameters, frozen, memory mode).
function Sequential:__tostring()
  local rows = { { "#", "kind", "shape", "params", "frozen", "memory" } }
  for i, layer in ipairs(self) do
    local freed = layer.handle[0] == nil
    rows[#rows + 1] = {
      tostring(i), freed and "(freed)" or layer:label(), freed and "" or shape_of(layer),
      freed and "" or tostring(layer:nparams()), self.frozen_set[layer] and "yes" or "",
      freed and "" or memory_of(layer),
    }
  end
  local widths = {}
  for _, row in ipairs(rows) do
    for c, cell in ipairs(row) do widths[c] = math.max(widths[c] or 0, #cell) end
  end
  local lines = { ("Sequential: %d layers, %d parameters"):format(#self, #self > 0 and self:nparams() or 0) }
  for _, row in ipairs(rows) do
    local cells = {}
    for c, cell in ipairs(row) do
      cells[c] = (c == 1 or c == 4) and (" "):rep(widths[c] - #cell) .. cell or cell .. (" "):rep(widths[c] - #cell)
    end
    lines[#lines + 1] = "  " .. concat(cells, "  "):gsub("%s+$", "")
  end
  return concat(lines, "\n")
end

----------------------------------------------------------------- generating text
-- Sampling continues a prompt one token at a time: each new token comes from the plain
-- whole-model forward (no targets: the head gives logits) over the last max_seq tokens,
-- with training off (no dropout, nothing kept for a backward). The random numbers are
-- l2l's counter-based draws of (opts.seed, GENERATE_STREAM), one per new token, so a
-- seed gives the same text on any machine and whatever else the script drew before.
-- With a relay training this model, call run:sync() first: the layers' parameters are
-- then the updated host masters that this forward reads (it changes none of them).

local GENERATE_STREAM = 0x67656e   -- "gen": a stream of its own for sampling draws
local GENERATE_OPTIONS = { temperature = true, top_k = true, seed = true, tokenizer = true }

-- The first Embedding (for vocab and max_seq), after checking the model can generate.
local function generator_parts(self, fname)
  if #self == 0 then error(fname .. ": the model has no layers", 3) end
  local embedding = first_embedding(self)
  if embedding == nil then error(fname .. ": the model has no Embedding", 3) end
  if self[#self].kind ~= "lm_head" then
    error(("%s: the last layer must be an LMHead (it is layer %d, %s)"):format(fname, #self, self[#self]:label()), 3)
  end
  local c = embedding:config()
  return c.vocab, c.max_seq
end

-- The prompt as a list of token ids, checked against the vocabulary; a string goes
-- through the tokenizer when there is one, else it is bytes.
local function prompt_ids(prompt, vocab, fname, tok)
  local ids = {}
  if type(prompt) == "string" and tok then
    if #prompt == 0 then error(fname .. ": prompt must not be empty", 3) end
    return tok:encode(prompt)   -- ids below tok.vocab <= vocab (generate_options checked)
  elseif type(prompt) == "string" then
    if #prompt == 0 then error(fname .. ": prompt must not be empty", 3) end
    if vocab > 256 then
      error(("%s: prompt: a string prompt needs a byte-level model (vocab <= 256), this one has vocab %d; pass a list of token ids, or a tokenizer (opts.tokenizer, e.g. l2l.tokenizer.gpt2())"):format(fname, vocab), 3)
    end
    for i = 1, #prompt do
      local b = prompt:byte(i)
      if b >= vocab then
        error(("%s: prompt: byte %d at position %d is outside the vocabulary [0, %d)"):format(fname, b, i, vocab), 3)
      end
      ids[i] = b
    end
  elseif type(prompt) == "table" then
    if #prompt == 0 then error(fname .. ": prompt must not be empty", 3) end
    for i, t in ipairs(prompt) do
      if type(t) ~= "number" or t ~= floor(t) or t < 0 or t >= vocab then
        error(("%s: prompt[%d] must be a token id in [0, %d), got %s"):format(fname, i, vocab, tostring(t)), 3)
      end
      ids[i] = t
    end
  else
    error(fname .. ": prompt must be a string or a list of token ids, got " .. type(prompt), 3)
  end
  return ids
end

-- The options, and the ids sampling may pick: 0 .. vocab-1, or the tokenizer's (a model's
-- vocabulary is often padded past its tokenizer's: GPT-2's 50257 to 50304).
local function generate_options(opts, vocab, fname)
  opts = argcheck.options(opts, GENERATE_OPTIONS, fname, 3, "opts")
  local tok = opts.tokenizer
  if tok ~= nil then
    if not require("l2l.tokenizer").is_tokenizer(tok) then
      error(fname .. ": option 'tokenizer' must be a tokenizer (l2l.tokenizer.gpt2() or .load), got " .. argcheck.describe(tok), 3)
    end
    if tok.vocab > vocab then
      error(("%s: option 'tokenizer': its %d ids do not fit the model's vocabulary of %d"):format(fname, tok.vocab, vocab), 3)
    end
    vocab = tok.vocab
  end
  local t = opts.temperature == nil and 1 or opts.temperature
  if type(t) ~= "number" or t ~= t or t < 0 or t == math.huge then
    error(fname .. ": option 'temperature' must be a finite number >= 0 (0: always the likeliest), got " .. tostring(opts.temperature), 3)
  end
  local k = opts.top_k == nil and vocab or opts.top_k
  if type(k) ~= "number" or k ~= floor(k) or k < 1 or k > vocab then
    error(("%s: option 'top_k' must be an integer in [1, %d], got %s"):format(fname, vocab, tostring(opts.top_k)), 3)
  end
  local seed = opts.seed == nil and 0 or opts.seed
  local problem = argcheck.whole_problem(seed)
  if problem then error(("%s: option 'seed' %s, got %s"):format(fname, problem, tostring(opts.seed)), 3) end
  return t, k, seed, tok, vocab
end

-- The next token from one row of logits (p[0 .. vocab-1], the ids it may pick) and a
-- uniform draw u in [0, 1).
-- top_k = 1 or temperature 0 is the argmax (the lowest id among equal maxima); otherwise
-- the k likeliest ids are kept and drawn from softmax(logit / temperature) over them.
local function pick(p, vocab, temperature, top_k, u)
  if top_k == 1 or temperature == 0 then
    local best = 0
    for v = 1, vocab - 1 do
      if p[v] > p[best] then best = v end
    end
    return best
  end
  local order = {}
  for v = 0, vocab - 1 do order[v + 1] = v end
  if top_k < vocab then
    table.sort(order, function(a, b)
      if p[a] ~= p[b] then return p[a] > p[b] end
      return a < b
    end)
  end
  local top = -math.huge
  for i = 1, top_k do
    if p[order[i]] > top then top = p[order[i]] end
  end
  local weights, total = {}, 0
  for i = 1, top_k do
    local w = math.exp((p[order[i]] - top) / temperature)
    weights[i], total = w, total + w
  end
  local target, sum = u * total, 0
  for i = 1, top_k do
    sum = sum + weights[i]
    if target < sum then return order[i] end
  end
  return order[top_k]   -- u * total rounded up to the sum itself
end

-- model:generate(prompt, n [, {temperature = 1, top_k = vocab, seed = 0, tokenizer =}]):
-- n new tokens after the prompt. prompt: a string (byte-level models; returns a string of
-- the n new bytes, then their ids) or a list of token ids (returns the list of the n new
-- ids). With opts.tokenizer (e.g. l2l.tokenizer.gpt2() for an l2l.import_gpt2 model) a
-- string prompt is encoded by it, and the new tokens come back decoded, whatever the
-- prompt: the text, then the ids; sampling picks only ids the tokenizer has. The list of
-- ids prints as its numbers (print(model:generate("a", 3)) shows the text and "ids ...").
-- The ids generate returns: a list that prints as its numbers ("ids 12 7 99").
local Ids = { __tostring = function(t) return "ids " .. concat(t, " ") end }

function Sequential:generate(prompt, n, opts, ...)
  if select("#", ...) ~= 0 then too_many("model:generate", "prompt, n, opts", 2, ...) end
  local fname = "model:generate"
  if getmetatable(self) ~= Sequential then error(fname .. ": self must be a model (use model:generate)", 2) end
  local vocab, max_seq = generator_parts(self, fname)
  local temperature, top_k, seed, tok, pickable = generate_options(opts, vocab, fname)
  local ids = prompt_ids(prompt, vocab, fname, tok)
  if type(n) ~= "number" or n ~= floor(n) or n < 0 then
    error(fname .. ": n must be an integer >= 0, got " .. tostring(n), 2)
  end
  local tensor = require("l2l.tensor")
  local draws = n > 0 and tensor.rand({ n }, { seed = seed, stream = GENERATE_STREAM }) or nil
  local u = draws and draws:data()
  local new = {}
  for step = 1, n do
    local first = math.max(1, #ids - max_seq + 1)
    local width = #ids - first + 1
    local tokens = tensor.empty({ 1, width }, { dtype = "i32" })
    local tp = tokens:data()
    for i = 0, width - 1 do tp[i] = ids[first + i] end
    local ok, logits = pcall(self.forward, self, { tokens = tokens, training = false })
    tokens:free()
    if not ok then error(fname .. ": " .. tostring(logits):gsub("^model:forward: ", ""), 2) end
    local row = logits:data() + (width - 1) * vocab
    local id = pick(row, pickable, temperature, top_k, u[step - 1])
    logits:free()
    ids[#ids + 1], new[step] = id, id
  end
  if draws then draws:free() end
  setmetatable(new, Ids)
  if tok then return tok:decode(new), new end
  if type(prompt) == "string" then
    local chars = {}
    for i, id in ipairs(new) do chars[i] = string.char(id) end
    return concat(chars), new
  end
  return new
end

return M
