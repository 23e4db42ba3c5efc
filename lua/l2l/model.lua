-- l2l.model — l2l.Sequential: a model as a list of layers, run whole (no relay).
--
-- Purpose: the plain reference way to train a model made of l2l layers: one forward over
-- every layer keeping every activation, the loss as the mean over all real (non-ignored)
-- targets, one backward in reverse. The relay must agree with it. An LMHead made with
-- `tie = true` is tied to the model's first Embedding here, so the pair shares one
-- parameter record whose gradient sums both uses.
-- Must never: count a shared parameter record twice (params(), nparams()).
local layers = require("l2l.layers")

local type, ipairs, pairs, tostring = type, ipairs, pairs, tostring

local M = {}
local Sequential = {}
Sequential.__index = Sequential

local function check_layer(layer, index, fname)
  if not layers.is_layer(layer) then
    error(("%s: entry %d is not a layer (got %s)"):format(fname, index, type(layer)), 3)
  end
end

function M.Sequential(list)
  local fname = "l2l.Sequential"
  if type(list) ~= "table" then error(fname .. ": expects a list of layers", 2) end
  local self = setmetatable({ layers = {} }, Sequential)
  local embedding
  for i, layer in ipairs(list) do
    check_layer(layer, i, fname)
    if layer.kind == "embedding" and embedding == nil then embedding = layer end
    if layer.tie then
      if embedding == nil then error(("%s: layer %d wants tie = true but no Embedding comes before it"):format(fname, i), 2) end
      layer:tie_to(embedding)
    end
    self.layers[i] = layer
  end
  return self
end

function M.is_sequential(x) return getmetatable(x) == Sequential end

function Sequential:__len() return #self.layers end

-- Unique parameter records, in layer order: {name = "<layer>.<param>", value, grad, decays}.
function Sequential:params()
  local seen, list = {}, {}
  for i, layer in ipairs(self.layers) do
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

function Sequential:nparams()
  local n = 0
  for _, p in ipairs(self:params()) do n = n + p.value:numel() end
  return n
end

function Sequential:zero_grad()
  for _, layer in ipairs(self.layers) do layer:zero_grad() end
end

-- Errors inside a layer name its index (like torch/nn's containers).
local function run_layer(i, layer, f)
  local ok, result = pcall(f)
  if not ok then
    error(("layer %d (%s): %s"):format(i, layer.kind, tostring(result):gsub("^[^:]+:%d+: ", "")), 0)
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

-- loss = model:forward(batch): batch.tokens through every layer; with batch.targets the
-- last layer (a head) gives per-target losses, and the result is their mean over real
-- targets; without targets, the last layer's output (logits) is returned.
function Sequential:forward(batch)
  if type(batch) ~= "table" then error("model:forward: batch must be a table", 2) end
  local x
  for i, layer in ipairs(self.layers) do
    x = run_layer(i, layer, function() return layer:forward(x, batch) end)
  end
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
function Sequential:backward(batch)
  if self.loss_scale == nil then error("model:backward: run forward with targets first", 2) end
  local plain = {}
  for k, v in pairs(batch) do plain[k] = v end
  plain.loss_scale = self.loss_scale
  local dy
  for i = #self.layers, 1, -1 do
    local layer = self.layers[i]
    dy = run_layer(i, layer, function() return layer:backward(dy, plain) end)
  end
  self.loss_scale = nil
end

return M
