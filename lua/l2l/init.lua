-- SPDX-License-Identifier: MIT
-- l2l — the LuaJIT front end: `local l2l = require("l2l")`.
--
-- Purpose: gather the modules into the one table users meet: tensor constructors
-- (l2l.tensor, l2l.zeros, ...), l2l.ops, memory pool statistics and budgets, compute
-- threads, layers (built-in and l2l.layer_kind for layers written in Lua), l2l.Sequential,
-- optimizers and schedules, l2l.Relay, checkpoints (l2l.load) and safetensors files,
-- GPT-2 import and its tokenizer (l2l.tokenizer).
-- Must never: hold logic of its own beyond argument checks of the functions below.
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local tensor = require("l2l.tensor")
local ffi = require("ffi")

local C, check, too_many, select = lib.C, lib.check, argcheck.too_many, select

local l2l = {
  ops = require("l2l.ops"),
  tensor = tensor.tensor,
  empty = tensor.empty,
  zeros = tensor.zeros,
  ones = tensor.ones,
  full = tensor.full,
  rand = tensor.rand,
  randn = tensor.randn,
  is_tensor = tensor.is_tensor,
  Tensor = tensor.Tensor,
  version = ffi.string(C.l2l_version()),
  library = lib.path,   -- where libl2l came from ("(linked in)" inside the l2l executable)
  C = C,                -- the raw C API, for what the Lua layer does not wrap
}

-- Layers and the whole-model container.
local layers, model = require("l2l.layers"), require("l2l.model")
for _, kind in pairs(layers.kinds) do   -- l2l.Embedding, l2l.Block, l2l.LMHead, ...
  if kind.constructor then l2l[kind.constructor] = layers[kind.constructor] end
end
l2l.is_layer = layers.is_layer
l2l.Sequential, l2l.is_sequential = model.Sequential, model.is_sequential
l2l.layer_kind = require("l2l.custom").layer_kind

-- Optimizers, schedules and the relay.
local optim, relay = require("l2l.optim"), require("l2l.relay")
l2l.SGD, l2l.AdamW, l2l.LAMB = optim.SGD, optim.AdamW, optim.LAMB
l2l.ConstantLR, l2l.CosineLR, l2l.LinearLR = optim.ConstantLR, optim.CosineLR, optim.LinearLR
-- the schedules' old names, deprecated: each warns once, and goes in the next release
l2l.Constant, l2l.Cosine, l2l.Linear = optim.Constant, optim.Cosine, optim.Linear
l2l.is_optimizer, l2l.is_schedule = optim.is_optimizer, optim.is_schedule
l2l.Relay, l2l.is_relay = relay.Relay, relay.is_relay
local plan = require("l2l.plan")
l2l.plan, l2l.calibrate = plan.plan, plan.calibrate
l2l.dist = require("l2l.dist")   -- data parallel: rank(), size(), barrier(); MPI on demand
l2l.profile = require("l2l.profile")   -- where a step's time goes, op by op

-- Checkpoints (run:save is a relay method) and safetensors files.
local checkpoint = require("l2l.checkpoint")
l2l.load, l2l.load_weights = checkpoint.load, checkpoint.load_weights
l2l.checkpoint_info, l2l.load_model = checkpoint.describe, checkpoint.load_model
l2l.safetensors = require("l2l.safetensors")
l2l.import_gpt2 = require("l2l.gpt2").import
l2l.tokenizer = require("l2l.tokenizer")   -- GPT-2's tokens: l2l.tokenizer.gpt2(), .load(...)

-- l2l.pool_stats("device") -> {current=, peak=, budget=, allocs=, frees=, refused=,
-- reserved=, system_allocs=, cap=, fallback=, fallback_allocs=, backend=} (bytes and
-- counts; reserved and system_allocs show the caching allocators: memory held from the
-- system, and calls to it; cap and fallback are the pinned pool's: see l2l.set_pinned_cap;
-- backend: the device bytes a GPU backend keeps for itself, counted against the budget).
-- l2l.pool_stats("spill"): every relay's spill file (spill =) together: current and peak
-- the bytes holding optimizer state, reserved the files' sizes, allocs and frees the
-- regions reserved and given back, system_allocs the files made.
local stats = ffi.new("l2l_pool_stats")
function l2l.pool_stats(pool, ...)
  if select("#", ...) ~= 0 then too_many("l2l.pool_stats", "pool", 2, ...) end
  if pool == "spill" then check(C.l2l_spill_get_stats(stats), "l2l.pool_stats", 2)
  else check(C.l2l_pool_get_stats(stats, lib.pool_id(pool, "l2l.pool_stats", 2)), "l2l.pool_stats", 2) end
  return {
    current = tonumber(stats.current), peak = tonumber(stats.peak),
    budget = tonumber(stats.budget), allocs = tonumber(stats.allocs),
    frees = tonumber(stats.frees), refused = tonumber(stats.refused),
    reserved = tonumber(stats.reserved), system_allocs = tonumber(stats.system_allocs),
    cap = tonumber(stats.cap), fallback = tonumber(stats.fallback),
    fallback_allocs = tonumber(stats.fallback_allocs), backend = tonumber(stats.backend),
  }
end

-- l2l.set_pinned_cap(bytes): the most the pinned pool holds (0: no cap; default a quarter
-- of the machine's memory); past it pinned tensors come from pageable memory, with a
-- warning the first time.
function l2l.set_pinned_cap(bytes, ...)
  if select("#", ...) ~= 0 then too_many("l2l.set_pinned_cap", "bytes", 2, ...) end
  if type(bytes) ~= "number" or bytes < 0 or bytes % 1 ~= 0 then
    error("l2l.set_pinned_cap: bytes must be an integer >= 0, got " .. tostring(bytes), 2)
  end
  check(C.l2l_pinned_set_cap(bytes), "l2l.set_pinned_cap", 2)
end

-- l2l.device() -> {backend = "cpu" | "cuda", cuda = bool, why = reason when not, and on
-- CUDA name=, capability= "9.0", memory=, free=, multiprocessors=; cudnn = "9.19.0" or
-- false, cudnn_about = where it was loaded from, or why it was not (l2l_cudnn_available)}
function l2l.device(...)
  if select("#", ...) ~= 0 then too_many("l2l.device", "", 2, ...) end
  local why = ffi.new("char[256]")
  local out = { backend = ffi.string(C.l2l_device_backend()) }
  local about = ffi.new("char[512]")
  local cudnn = C.l2l_cudnn_available(about, 512)
  out.cudnn = cudnn ~= 0 and ("%d.%d.%d"):format(math.floor(cudnn / 10000),
                                                  math.floor(cudnn / 100) % 100, cudnn % 100)
  out.cudnn_about = ffi.string(about)
  out.cuda = C.l2l_cuda_available(why, 256) == 1
  if not out.cuda then
    out.why = ffi.string(why)
    return out
  end
  local info = ffi.new("l2l_cuda_info")
  check(C.l2l_cuda_get_info(info), "l2l.device", 2)
  out.name = ffi.string(info.name)
  out.capability = ("%d.%d"):format(info.major, info.minor)
  out.memory, out.free = tonumber(info.total_bytes), tonumber(info.free_bytes)
  out.multiprocessors = info.multiprocessors
  return out
end

-- l2l.device_use("cpu" | "cuda"): which backend serves the device pool (no device
-- tensors may be alive); l2l.synchronize() waits for queued GPU work.
function l2l.device_use(backend, ...)
  if select("#", ...) ~= 0 then too_many("l2l.device_use", "backend", 2, ...) end
  if type(backend) ~= "string" then
    error("l2l.device_use: backend must be 'cpu' or 'cuda', got " .. tostring(backend), 2)
  end
  check(C.l2l_device_use(backend), "l2l.device_use", 2)
end

function l2l.synchronize(...)
  if select("#", ...) ~= 0 then too_many("l2l.synchronize", "", 2, ...) end
  check(C.l2l_device_synchronize(), "l2l.synchronize", 2)
end

-- l2l.cuda_tf32(true | false): f32 GEMMs on the GPU through TF32 tensor cores (off by
-- default; about 1e-3 relative error instead of fp32's 1e-6).
function l2l.cuda_tf32(on, ...)
  if select("#", ...) ~= 0 then too_many("l2l.cuda_tf32", "on", 2, ...) end
  if type(on) ~= "boolean" then error("l2l.cuda_tf32: on must be true or false, got " .. tostring(on), 2) end
  check(C.l2l_cuda_set_tf32(on and 1 or 0), "l2l.cuda_tf32", 2)
end

-- l2l.set_budget("device", bytes): 0 removes the budget.
function l2l.set_budget(pool, bytes, ...)
  if select("#", ...) ~= 0 then too_many("l2l.set_budget", "pool, bytes", 2, ...) end
  if type(bytes) ~= "number" or bytes < 0 or bytes ~= math.floor(bytes) then
    error("l2l.set_budget: bytes must be an integer >= 0, got " .. tostring(bytes), 2)
  end
  check(C.l2l_pool_set_budget(lib.pool_id(pool, "l2l.set_budget", 2), bytes), "l2l.set_budget", 2)
end

function l2l.reset_peak(pool, ...)
  if select("#", ...) ~= 0 then too_many("l2l.reset_peak", "pool", 2, ...) end
  check(C.l2l_pool_reset_peak(lib.pool_id(pool, "l2l.reset_peak", 2)), "l2l.reset_peak", 2)
end

-- l2l.threads() -> count; l2l.threads(n) sets it.
function l2l.threads(n, ...)
  if select("#", ...) ~= 0 then too_many("l2l.threads", "n", 2, ...) end
  if n ~= nil then
    if type(n) ~= "number" then error("l2l.threads: n must be a number", 2) end
    check(C.l2l_set_threads(n), "l2l.threads", 2)
  end
  return C.l2l_get_threads()
end

return l2l
