-- SPDX-License-Identifier: MIT
-- l2l.custom — layer kinds written in Lua with l2l's ops: l2l.layer_kind{...}.
--
-- Purpose: let a script define a (B,S,D) -> (B,S,D) layer kind (a gated MLP, an adapter,
-- ...) whose forward and backward are Lua functions, and use it everywhere a built-in
-- block goes: layer:forward/backward, l2l.Sequential and l2l.Relay (which streams,
-- stashes, recomputes and updates it like any block). Underneath it is
-- l2l_layer_new_custom (include/l2l/layers.h, "layers written elsewhere") with one pair of C
-- callbacks for every custom kind; the C `user` pointer carries the kind's number.
--
--   local GatedMLP = l2l.layer_kind{
--     name = "GatedMLP",
--     options = { "mlp" },                       -- accepted beside dim, seed, pool
--     params = function(o) return {
--       { name = "w1", shape = { o.dim, o.mlp }, std = 0.02 },   -- decays (2-D) by default
--       { name = "b1", shape = { o.mlp }, value = 0 },           -- no decay (1-D)
--     } end,
--     forward = function(self, y, x, batch) ... end,       -- write y
--     backward = function(self, dx, dy, x, batch) ... end, -- write dx; grads +=
--   }
--   local layer = GatedMLP{ dim = 64, mlp = 256, seed = 1 }
--
-- Inside forward/backward: self:param(name) is the parameter's value tensor for this call
-- (in the relay, a device-pool copy), self:grad(name) its gradient (add into it: += ),
-- self:empty(shape) / self:zeros(shape) temporaries in x's pool, self:reshape(t, shape)
-- and self:view(t, first, count) views; all of these (and x, y, dx, dy) are valid only
-- during the call and are released when it returns. self.options is the table the layer
-- was made with, self.dim its D, self.layer the Lua layer object (when it still exists).
-- batch: first_sample, seed, step, training (boolean), rng_id, key_mask (tensor or nil).
-- The forward keeps nothing: the backward gets x again and recomputes what it needs.
--
-- Must never: let a Lua error cross a C frame (callbacks catch everything and hand the
-- message to layers.check_call), or leave a tensor handle that outlives its call.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local tensor = require("l2l.tensor")
local layers = require("l2l.layers")

local C = lib.C
local type, tostring, pairs, ipairs, floor, pcall, select = type, tostring, pairs, ipairs, math.floor, pcall, select
local too_many = argcheck.too_many

local M = {}

local MAX_PARAMS = 12     -- l2l_layer_new_custom's limit
local MAX_NAME = 23       -- names are < 24 bytes

local defs = {}           -- kind number -> definition (kinds live as long as the process)
local records_of = setmetatable({}, { __mode = "k" })   -- constructor -> its definition

----------------------------------------------------------------- the call context

local Context = {}
Context.__index = Context

-- A Lua tensor for a handle C lends for the call (tensor:free refuses it); forgotten (not
-- freed) at the end.
function Context:borrow(handle, ...)
  if select("#", ...) ~= 0 then too_many("self:borrow", "handle", 2, ...) end
  if handle == nil then return nil end
  local t = tensor.lend(ffi.cast("l2l_tensor *", handle))
  self.borrowed[#self.borrowed + 1] = t
  return t
end

local function param_index(self, name, fname)
  if type(name) ~= "string" then error(fname .. ": name must be a string, got " .. type(name), 3) end
  local i = self.names and self.names[name]
  if i == nil then   -- no record of this layer's names (cannot happen for layers made here)
    for k = 0, C.l2l_layer_param_count(self.handle) - 1 do
      if ffi.string(C.l2l_param_name(C.l2l_layer_param(self.handle, k))) == name then i = k end
    end
  end
  if i == nil then
    error(("%s: %s has no parameter '%s'"):format(fname, self.kind, name), 3)
  end
  return C.l2l_layer_param(self.handle, i)
end

-- The value of parameter `name` for this call.
function Context:param(name, ...)
  if select("#", ...) ~= 0 then too_many("self:param", "name", 2, ...) end
  local t = self.values[name]
  if t == nil then
    t = self:borrow(C.l2l_param_value(param_index(self, name, "self:param")))
    self.values[name] = t
  end
  return t
end

-- The gradient of parameter `name` for this call (accumulate into it).
function Context:grad(name, ...)
  if select("#", ...) ~= 0 then too_many("self:grad", "name", 2, ...) end
  local t = self.grads[name]
  if t == nil then
    t = self:borrow(C.l2l_param_grad(param_index(self, name, "self:grad")))
    self.grads[name] = t
  end
  return t
end

local function temporary(self, t)
  self.temps[#self.temps + 1] = t
  return t
end

-- A temporary f32 tensor in x's pool (contents undefined), freed when the call returns.
function Context:empty(shape, ...)
  if select("#", ...) ~= 0 then too_many("self:empty", "shape", 2, ...) end
  local t = temporary(self, tensor.empty(shape, { pool = self.pool }))
  return t
end

function Context:zeros(shape, ...)
  if select("#", ...) ~= 0 then too_many("self:zeros", "shape", 2, ...) end
  local t = temporary(self, tensor.zeros(shape, { pool = self.pool }))
  return t
end

-- Views freed when the call returns.
function Context:reshape(t, shape, ...)
  if select("#", ...) ~= 0 then too_many("self:reshape", "t, shape", 2, ...) end
  local v = temporary(self, t:reshape(shape))
  return v
end
function Context:view(t, first, count, ...)
  if select("#", ...) ~= 0 then too_many("self:view", "t, first, count", 2, ...) end
  local v = temporary(self, t:view(first, count))
  return v
end

local function finish(self)
  for _, t in ipairs(self.temps) do t:free() end
  for _, t in ipairs(self.borrowed) do t.handle = nil end
end

local function batch_table(self, b)
  return {
    first_sample = tonumber(b.first_sample), seed = tonumber(b.seed), step = tonumber(b.step),
    training = b.training ~= 0, rng_id = tonumber(C.l2l_layer_rng_id(self.handle)),
    key_mask = self:borrow(b.key_mask),
  }
end

----------------------------------------------------------------- the callbacks
-- One pair for all custom kinds, made once and never freed (LuaJIT has a limited number
-- of callback slots; these two are anchored in this module for the process's life).

local function call(phase, user, layer, a, b, x, batch)
  local def = defs[tonumber(ffi.cast("intptr_t", user))]
  local where = layers.address(layer)
  if def == nil then
    layers.set_callback_error("unknown custom layer kind " .. tostring(user), where)
    return 1
  end
  local info = layers.custom_info[where]
  local self = setmetatable({
    handle = layer, kind = def.name, dim = tonumber(C.l2l_tensor_dim(x, C.l2l_tensor_ndim(x) - 1)),
    options = info and info.options, names = info and info.names,
    layer = layers.objects[where], pool = lib.pool_names[tonumber(C.l2l_tensor_pool(x))],
    values = {}, grads = {}, borrowed = {}, temps = {},
  }, Context)
  local ok, err = pcall(function()
    if phase == "forward" then
      def.forward(self, self:borrow(a), self:borrow(x), batch_table(self, batch))
    else
      def.backward(self, self:borrow(a), self:borrow(b), self:borrow(x), batch_table(self, batch))
    end
  end)
  local ok2, err2 = pcall(finish, self)
  if ok and not ok2 then ok, err = ok2, err2 end
  if ok then return 0 end
  layers.set_callback_error(("%s %s: %s"):format(def.name, phase, tostring(err)), where)
  return 1
end

local forward_cb = ffi.cast("l2l_custom_forward_fn", function(user, layer, y, x, batch)
  return call("forward", user, layer, y, nil, x, batch)
end)
local backward_cb = ffi.cast("l2l_custom_backward_fn", function(user, layer, dx, dy, x, batch)
  return call("backward", user, layer, dx, dy, x, batch)
end)
M.callbacks = { forward_cb, backward_cb }   -- anchors

----------------------------------------------------------------- defining a kind

local function fail(msg) error(msg, 0) end

local function integer(v, min) return type(v) == "number" and v == floor(v) and v >= min end

-- The list params(options) returned, checked, as an l2l_custom_param array.
local function param_specs(list, fname)
  if type(list) ~= "table" then fail(fname .. ": params() must return a list of tables, got " .. type(list)) end
  local n = #list
  if n > MAX_PARAMS then fail(("%s: %d parameters, at most %d"):format(fname, n, MAX_PARAMS)) end
  local specs = ffi.new("l2l_custom_param[?]", n > 0 and n or 1)
  local names, anchors = {}, {}
  for i, p in ipairs(list) do
    local what = ("%s: parameter %d"):format(fname, i)
    if type(p) ~= "table" then fail(what .. " must be a table") end
    if type(p.name) ~= "string" or #p.name == 0 or #p.name > MAX_NAME then
      fail(what .. ": name must be a string of 1 to " .. MAX_NAME .. " bytes, got " .. tostring(p.name))
    end
    what = ("%s: parameter '%s'"):format(fname, p.name)
    if names[p.name] then fail(what .. " appears twice") end
    names[p.name] = i - 1
    local shape = p.shape
    if type(shape) ~= "table" or #shape < 1 or #shape > 4 then
      fail(what .. ": shape must be a table of 1 to 4 sizes")
    end
    for d, size in ipairs(shape) do
      if not integer(size, 1) then fail(("%s: shape[%d] must be an integer >= 1, got %s"):format(what, d, tostring(size))) end
      specs[i - 1].shape[d - 1] = size
    end
    if p.std == nil and p.value == nil then fail(what .. ": give std (normal init) or value (constant)") end
    local std, value = p.std or 0, p.value or 0
    if type(std) ~= "number" or not (std >= 0 and std < math.huge) then
      fail(what .. ": std must be a finite number >= 0, got " .. tostring(std))
    end
    if type(value) ~= "number" or value ~= value or math.abs(value) == math.huge then
      fail(what .. ": value must be a finite number, got " .. tostring(value))
    end
    local decays = p.decays
    if decays == nil then decays = #shape >= 2 end
    if type(decays) ~= "boolean" then fail(what .. ": decays must be true or false") end
    anchors[#anchors + 1] = p.name
    specs[i - 1].name = p.name
    specs[i - 1].ndim = #shape
    specs[i - 1].init_std = std
    specs[i - 1].init_value = value
    specs[i - 1].decays = decays and 1 or 0
  end
  return specs, n, names, anchors
end

local BUILTIN_OPTIONS = { dim = true, seed = true, pool = true }

-- The options checked, and the kind's parameter list for them.
local function described(def, o)
  local fname = def.name
  if type(o) ~= "table" then fail(fname .. ": options must be a table, got " .. argcheck.describe(o)) end
  -- a kind that lists no options of its own takes any: its params() may read them
  if def.allowed then argcheck.options(o, def.allowed, fname, 0) end
  if not integer(o.dim, 1) then fail(("%s: option 'dim' must be an integer >= 1, got %s"):format(fname, tostring(o.dim))) end
  local problem = o.seed ~= nil and argcheck.whole_problem(o.seed)
  if problem then
    fail(("%s: option 'seed' %s, got %s"):format(fname, problem, tostring(o.seed)))
  end
  local pool = lib.pools[o.pool or "host"]
  if pool == nil then fail(("%s: option 'pool' must be host, pinned or device, got %s"):format(fname, tostring(o.pool))) end
  local ok, list = pcall(def.params, o)
  if not ok then fail(fname .. ": params(): " .. tostring(list)) end
  local specs, n, names, anchors = param_specs(list, fname)
  return pool, specs, n, names, anchors
end

local function construct(def, o)
  local pool, specs, n, names, anchors = described(def, o)
  local fname = def.name
  local out = ffi.new("l2l_layer *[1]")
  local status = C.l2l_layer_new_custom(out, def.name, o.dim, specs, n, forward_cb, backward_cb,
                                        ffi.cast("void *", def.id), o.seed or layers.next_seed(), pool)
  if status ~= 0 then fail(fname .. ": " .. lib.last_error()) end
  local layer = layers.wrap(out, "custom", { custom = def, options = o,
                                             anchors = anchors })
  layers.custom_info[layers.address(out[0])] = { def = def, names = names, options = o }
  return layer
end

-- l2l.layer_kind{name =, params =, forward =, backward = [, options = {names...}]} -> a
-- constructor: Kind{dim = D, seed =, pool = "host", <options>} -> a layer.
function M.layer_kind(def, ...)
  local fname = "l2l.layer_kind"
  if select("#", ...) ~= 0 then too_many(fname, "def", 2, ...) end
  if type(def) ~= "table" then error(fname .. ": expects a table", 2) end
  for key in pairs(def) do
    if key ~= "name" and key ~= "params" and key ~= "forward" and key ~= "backward" and key ~= "options" then
      error(("%s: unknown field '%s'"):format(fname, tostring(key)), 2)
    end
  end
  if type(def.name) ~= "string" or not def.name:match("^[%a_][%w_%.%-]*$") or #def.name > MAX_NAME then
    error(fname .. ": name must be an identifier-like string, got " .. tostring(def.name), 2)
  end
  for _, key in ipairs({ "params", "forward", "backward" }) do
    if type(def[key]) ~= "function" then
      error(("%s: %s must be a function, got %s"):format(fname, key, type(def[key])), 2)
    end
  end
  local allowed
  if def.options ~= nil then
    if type(def.options) ~= "table" then error(fname .. ": options must be a list of option names", 2) end
    allowed = {}
    for k, v in pairs(def.options) do
      if type(k) == "number" then allowed[v] = true else allowed[k] = true end
    end
    for k in pairs(BUILTIN_OPTIONS) do allowed[k] = true end
  end
  local kind = { id = #defs + 1, name = def.name, params = def.params, forward = def.forward,
                 backward = def.backward, allowed = allowed }
  defs[kind.id] = kind
  local constructor = function(o, ...)
    if select("#", ...) ~= 0 then too_many(kind.name, "options", 2, ...) end
    local ok, layer = pcall(construct, kind, o)
    if not ok then error(layer, 2) end
    return layer
  end
  records_of[constructor] = kind
  return constructor
end

-- M.records(constructor, options): for a constructor made by l2l.layer_kind, the records
-- its layer would have ({name =, shape =} each), nothing allocated; nil for any other
-- function.
function M.records(constructor, o)
  local def = records_of[constructor]
  if def == nil then return nil end
  local _, specs, n, names = described(def, o)
  local records = {}
  for name, i in pairs(names) do
    local shape = {}
    for d = 0, specs[i].ndim - 1 do shape[d + 1] = tonumber(specs[i].shape[d]) end
    records[i + 1] = { name = name, shape = shape }
  end
  return records
end

return M
