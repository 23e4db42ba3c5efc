-- SPDX-License-Identifier: MIT
-- l2l.plan — the planner from Lua: l2l.plan{...} and l2l.calibrate{...}.
--
--   local plan = l2l.plan{ model = model, batch = 32, seq = 1024, device_budget = 8 * 2^30 }
--   print(plan)            -- per layer inner, stash, bytes kept, predicted ms; the totals
--   plan.micro_batch, plan.step_seconds, plan.device_peak, plan.streaming_tokens,
--   plan.device_records_bytes (placement = "device": the records kept on the device, which
--   the budget holds beside the step's peak),
--   plan.h2d_bytes, plan.d2h_bytes (what a step copies each way),
--   plan.host_eps_bytes, plan.host_budget_smallest (the EPS in host memory, and the
--   smallest host_budget that works), plan.disk_bytes, plan.disk_seconds (what a step's
--   updates read from the spill file and write back, each way, and its time at the
--   directory's rates), plan.channels = {compute =, copies_in =, copies_out =, updates =,
--   disk =} (a step's seconds on each at the rates, as if alone: the device's compute, the
--   copies each way, the host optimizer's updates, the spill file's I/O) and plan.limit
--   (the name of the largest: what a faster part of the machine would have to speed up),
--   plan.hiding_accumulate (when the host optimizer is the limit: the accumulate from
--   which its updates, once every that many steps, take no longer than the rest of a step),
--   plan.accumulate (the plan's: given, or with accumulate = "auto" the plan's choice, the
--   smallest from which the host optimizer hides, 1 if it does already; a relay made
--   with the plan and no accumulate of its own takes it), plan.accumulate_chosen,
--   plan.placement (the plan's: given, else "auto", the planner's within the budget; a
--   relay made with the plan and no placement of its own takes it, and with "auto" and no
--   device_budget of its own the plan's budget),
--   plan.layers[i].inner, plan.layers[i].stash, plan.layers[i].kept_bytes, .seconds,
--   .on_device (its records live on the device: placement "device", or "auto" where the
--   plan weighed them against the room they take from the step and put them there)
--   l2l.Relay{ model = model, plan = plan, ... }  (or plan = "auto": relay.lua)
--
-- Purpose: the C planner (src/plan/, l2l_plan_new) with a model and options in Lua's
-- terms: the relay settings that change memory and time (param_slots, precision,
-- grad_precision, accumulate, clip_global_norm, loss_scale, the optimizer and its state's
-- precision, master) as l2l.Relay takes them, the
-- batch's shape and the budget; rates measured on this machine (cached) unless given.
-- Must never: change the model it plans for.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local layers = require("l2l.layers")
local model_mod = require("l2l.model")
local relay_options = require("l2l.relay_options")

local C, too_many, select = lib.C, argcheck.too_many, select
local type, tostring, ipairs, floor = type, tostring, ipairs, math.floor

local M = {}

local option_table = require("l2l.option_table")
local INNER, STASH = option_table.names(option_table.ROW.inner), option_table.names(option_table.ROW.stash)
local PLACEMENT = option_table.names(option_table.ROW.placement)
M.inner_names, M.stash_names = INNER, STASH

local Plan = {}
Plan.__index = Plan

local function fail(msg) error(msg, 0) end

local function count(o, key, fname, lo, hi)
  local v = o[key]
  if type(v) ~= "number" or v ~= floor(v) or v < lo or v > hi then
    fail(("%s: option '%s' must be an integer from %.17g to %.17g, got %s"):format(fname, key, lo, hi, tostring(o[key])))
  end
  return v
end

local RATE_FIELDS = { flops = true, h2d = true, d2h = true, optimizer = true, visit = true, shared = true, disk_read = true, disk_write = true }

-- A rates table as l2l_plan_rates: {flops =, h2d =, d2h =, optimizer =, visit =, shared =
-- false}; layers cost their FLOPs at `flops` (none is timed here); shared: copies and the
-- host optimizer take the compute's cores (a CPU).
local function rates_of(t, fname)
  argcheck.fields(t, RATE_FIELDS, fname, 0, "option 'rates'")
  local r = ffi.new("l2l_plan_rates")
  if t.shared ~= nil and type(t.shared) ~= "boolean" then
    fail(fname .. ": rates.shared must be true or false, got " .. argcheck.describe(t.shared))
  end
  r.shared = t.shared and 1 or 0
  for _, k in ipairs({ "flops", "h2d", "d2h", "optimizer", "visit", "disk_read", "disk_write" }) do
    local v = t[k]
    if v ~= nil and (type(v) ~= "number" or not (v >= 0 and v < math.huge)) then
      fail(("%s: rates.%s must be a finite number >= 0, got %s"):format(fname, k, tostring(v)))
    end
    r[k] = v or 0
  end
  r.timed = 0
  return r
end

local function rates_table(r)
  return { flops = r.flops, h2d = r.h2d, d2h = r.d2h, optimizer = r.optimizer, visit = r.visit,
           shared = r.shared == 1, disk_read = r.disk_read, disk_write = r.disk_write }
end

-- l2l.calibrate{ remeasure = false } -> this machine's rates (from the cache, measured
-- when missing or asked): {h2d =, d2h = (bytes/s), optimizer = (master bytes/s), ...}.
function M.calibrate(o, ...)
  local fname = "l2l.calibrate"
  if select("#", ...) ~= 0 then too_many(fname, "options", 2, ...) end
  o = argcheck.options(o, { remeasure = true }, fname, 2)
  if o.remeasure ~= nil and type(o.remeasure) ~= "boolean" then
    error(fname .. ": option 'remeasure' must be true or false, got " .. tostring(o.remeasure), 2)
  end
  local r = ffi.new("l2l_plan_rates")
  lib.check(C.l2l_relay_calibrate_plan(r, o.remeasure and 1 or 0), fname, 2)
  return rates_table(r)
end

-- l2l_plan_new, which runs the layers (those written in Lua call back into Lua): kept out
-- of traces, as the relay's calls are (a callback from a C call made by compiled code is
-- "bad callback").
local function plan_new(out, list, n, config, q) return C.l2l_plan_new(out, list, n, config, q) end
jit.off(plan_new)

-- The C plan of `model` (a Sequential) for relay config `config` (an l2l_relay_config),
-- as a Lua plan. request: {batch, seq, device_budget, token_types, key_mask, rates (cdata
-- or nil)}. Errors are plain messages (no position) for the callers to raise.
function M.make(model, config, request, fname)
  local n = #model
  if n < 2 then fail(fname .. ": the model needs an input layer and a head") end
  local list = ffi.new("l2l_layer *[?]", n)
  local frozen = ffi.new("uint8_t[?]", n)
  for i, layer in ipairs(model) do
    local h = layer.handle[0]
    if h == nil then fail(("%s: layer %d (%s) was freed"):format(fname, i, layer:label())) end
    list[i - 1] = h
    frozen[i - 1] = model.frozen_set[layer] and 1 or 0
  end
  local q = ffi.new("l2l_plan_request")
  q.batch, q.seq, q.device_budget = request.batch, request.seq, request.device_budget
  q.token_types, q.key_mask = request.token_types and 1 or 0, request.key_mask and 1 or 0
  local rates = request.rates
  if rates == nil then   -- this machine's, the visit's cost measured once (cached)
    rates = ffi.new("l2l_plan_rates")
    if C.l2l_relay_calibrate_plan(rates, 0) ~= 0 then fail(fname .. ": calibrating: " .. lib.last_error()) end
  end
  q.frozen, q.rates = frozen, rates
  local out = ffi.new("l2l_plan *[1]")
  -- (the plan runs the layers, those written in Lua too: their own error, where one failed)
  layers.clear_callback_error()
  layers.check_call(plan_new(out, list, n, config, q), fname, -1, nil, relay_options.lua_message)
  return M.wrap(ffi.gc(out, function(box) C.l2l_plan_free(box[0]) end), model, config, request)
end

-- A step's channels, each with its words, in the order a tie is named.
local CHANNELS = { { "compute", "the device's compute" }, { "copies_in", "copies to the device" },
                   { "copies_out", "copies back" }, { "updates", "the host optimizer" },
                   { "disk", "the spill file" } }
local CHANNEL_WORDS = {}
for _, c in ipairs(CHANNELS) do CHANNEL_WORDS[c[1]] = c[2] end

-- The name of the channel that takes longest.
local function limit_of(channels)
  local best
  for _, c in ipairs(CHANNELS) do
    if best == nil or channels[c[1]] > channels[best] then best = c[1] end
  end
  return best
end

-- Each channel's milliseconds in words (a disk that moves nothing, or none given, left out).
local function channels_text(channels)
  local parts = {}
  for _, c in ipairs(CHANNELS) do
    local seconds = channels[c[1]]
    if seconds ~= nil and (c[1] ~= "disk" or seconds > 0) then
      parts[#parts + 1] = ("%s %.2f ms"):format(c[2], seconds * 1e3)
    end
  end
  return table.concat(parts, ", ")
end

-- The accumulation (minibatches an update) from which the host optimizer's share of a
-- step, its updates once every `k` steps, is no more than the largest other channel: the
-- updates then hide under the rest (issue 49's "choose the tokens per step so that the
-- host hides"). nil: they hide already, or nothing else takes time. Only the updates'
-- share shrinks with accumulation: a step's copies and compute are the step's.
local function hiding_accumulate(channels, accumulate)
  local other = 0
  for _, c in ipairs(CHANNELS) do
    if c[1] ~= "updates" and (channels[c[1]] or 0) > other then other = channels[c[1]] end
  end
  if other <= 0 or channels.updates <= other then return nil end
  return math.ceil(channels.updates * accumulate / other)
end

-- The channels as a line: each one's milliseconds, and the limit.
local function channels_line(channels, limit)
  return ("channels a step, each alone: %s; the limit: %s"):format(channels_text(channels),
                                                                   CHANNEL_WORDS[limit])
end

-- The Lua plan of a C plan: out[0] the plan, out (a box) kept as its handle, or nil for a
-- plan its relay owns (l2l_relay_plan_auto's: read here, then left to the relay).
function M.wrap(out, model, config, request, owned_by_relay)
  local n = #model
  local s = ffi.new("l2l_plan_summary")
  C.l2l_plan_get(s, out[0])
  local plan = setmetatable({
    handle = not owned_by_relay and out or nil, micro_batch = tonumber(s.micro_batch), step_seconds = s.step_seconds,
    device_peak = tonumber(s.device_peak), streaming_tokens = s.streaming_tokens,
    device_records_bytes = tonumber(s.device_records_bytes),
    h2d_bytes = tonumber(s.h2d_bytes), d2h_bytes = tonumber(s.d2h_bytes),
    host_eps_bytes = tonumber(s.host_eps_bytes), host_budget_smallest = tonumber(s.host_budget_smallest),
    disk_bytes = tonumber(s.disk_bytes), disk_seconds = s.disk_seconds, spill = config.spill_dir ~= nil,
    channels = { compute = s.compute_seconds, copies_in = s.h2d_seconds, copies_out = s.d2h_seconds,
                 updates = s.update_seconds, disk = s.disk_seconds },
    batch = request.batch, seq = request.seq, device_budget = request.device_budget, layers = {},
  }, Plan)
  plan.limit = limit_of(plan.channels)
  plan.accumulate = config.accumulate
  plan.placement = PLACEMENT[tonumber(config.placement)]
  plan.hiding_accumulate = hiding_accumulate(plan.channels, config.accumulate)
  local l = ffi.new("l2l_plan_layer")
  for i = 1, n do
    C.l2l_plan_get_layer(l, out[0], i - 1)
    plan.layers[i] = { kind = model[i]:label(), inner = INNER[tonumber(l.inner)],
                       stash = STASH[tonumber(l.stash)], kept_bytes = tonumber(l.kept_bytes),
                       seconds = l.seconds, on_device = l.on_device ~= 0 }
  end
  return plan
end

-- Whether two plans choose alike (b may be nil): the same shape and budget, micro-batch, predictions
-- and policies of every layer.
function M.same(a, b)
  if b == nil or #a.layers ~= #b.layers then return false end
  for _, k in ipairs({ "batch", "seq", "device_budget", "micro_batch", "step_seconds", "device_peak" }) do
    if a[k] ~= b[k] then return false end
  end
  for i, l in ipairs(a.layers) do
    local m = b.layers[i]
    if l.kind ~= m.kind or l.inner ~= m.inner or l.stash ~= m.stash or l.seconds ~= m.seconds or
       l.on_device ~= m.on_device then return false end
  end
  return true
end

-- The relay's settings l2l.plan takes: the option table's rows marked PLAN, and the optimizer.
local RELAY_SETTINGS = { "optimizer" }
for _, row in ipairs(option_table.ROWS) do
  if row.flags.plan then RELAY_SETTINGS[#RELAY_SETTINGS + 1] = row.name end
end
local PLAN_OPTIONS = { model = true, batch = true, seq = true, device_budget = true, token_types = true,
                       key_mask = true, rates = true }
for _, key in ipairs(RELAY_SETTINGS) do PLAN_OPTIONS[key] = true end

local function plan(o)
  local fname = "l2l.plan"
  o = argcheck.options(o, PLAN_OPTIONS, fname, 0)
  if not model_mod.is_sequential(o.model) then
    fail(fname .. ": option 'model' must be an l2l.Sequential, got " .. argcheck.describe(o.model))
  end
  -- the relay settings, checked as l2l.Relay checks them (accumulate "auto": the plan's
  -- choice, from 1)
  local settings = {}
  for _, key in ipairs(RELAY_SETTINGS) do settings[key] = o[key] end
  local choose = settings.accumulate == "auto"
  if choose then settings.accumulate = nil end
  local c = relay_options.config_for(settings, fname, true)
  for _, key in ipairs({ "token_types", "key_mask" }) do
    if o[key] ~= nil and type(o[key]) ~= "boolean" then
      fail(("%s: option '%s' must be true or false, got %s"):format(fname, key, tostring(o[key])))
    end
  end
  local request = {
    batch = count(o, "batch", fname, 1, 2 ^ 24), seq = count(o, "seq", fname, 1, 2 ^ 24),
    device_budget = count(o, "device_budget", fname, 1, 2 ^ 53 - 1),
    token_types = o.token_types, key_mask = o.key_mask,
    rates = o.rates ~= nil and rates_of(o.rates, fname) or nil,
  }
  local made = M.make(o.model, c, request, fname)
  -- accumulate "auto": planned again at the accumulation from which the host optimizer
  -- hides (its policies may then differ, and with them the other channels: again, a few
  -- times at most, until it hides)
  for _ = 1, choose and 4 or 0 do
    if made.hiding_accumulate == nil then break end
    settings.accumulate = made.hiding_accumulate   -- (more than this plan's: it did not hide)
    made = M.make(o.model, relay_options.config_for(settings, fname, true), request, fname)
  end
  made.accumulate_chosen = choose
  return made
end

-- l2l.plan{model =, batch =, seq =, device_budget = (bytes a step may add to the device
-- pool), token_types = false, key_mask = false, rates = (default: this machine's), and
-- the relay's param_slots, precision, grad_precision, accumulate (or "auto": the plan
-- chooses it), clip_global_norm, loss_scale, optimizer, host_budget, spill, dist ("mpi":
-- this rank's host bytes, its shards of the gradients and state; placement auto as this
-- rank's budget alone places: the ranks' relays may place fewer), master, placement
-- ("auto" unless given)} -> a plan.
function M.plan(o, ...)
  if select("#", ...) ~= 0 then too_many("l2l.plan", "options", 2, ...) end
  local ok, result = pcall(plan, o)
  if not ok then error(result, 2) end
  return result
end

function M.is_plan(x) return getmetatable(x) == Plan end

-- Per layer, the seconds its visits took in the relay's last step: the calling thread's
-- compute events of that layer (forward, rebuild, backward; the head's are "backward").
local function measured_seconds(run)
  local per = {}
  for _, e in ipairs(run:events()) do
    if e.thread == 0 and e.layer and (e.phase == "forward" or e.phase == "backward" or e.phase == "rebuild") then
      per[e.layer] = (per[e.layer] or 0) + (e.finish - e.start)
    end
  end
  return per
end

local Report = {}
Report.__index = Report

-- run:plan_report(): {layers = {{kind, inner, stash, predicted, measured}...},
-- predicted_step_seconds, measured_step_seconds, predicted_device_peak, device_peak,
-- predicted_h2d_bytes, h2d_bytes, predicted_d2h_bytes, d2h_bytes, predicted_host_eps_bytes,
-- host_eps_bytes, predicted_device_records_bytes, device_records_bytes (the records placed
-- on the device), predicted_disk_bytes (each way), disk_read_bytes, disk_written_bytes,
-- predicted_channels and limit (the plan's), measured_channels = {compute =, copies_in =,
-- copies_out =, updates =} (stats' compute_seconds, h2d_seconds, d2h_seconds and
-- optimizer_seconds: the updates summed over the workers, where the plan's are all of them
-- at once)};
-- print() shows it as a table (predicted beside measured, per layer and for the step).
-- Measured: the training steps after the first (which makes lasting buffers), their mean
-- seconds and the last one's bytes (an evaluation in between, a validation pass, is not
-- what the plan predicts); the last step's until a second training step ran.
function M.report(run)
  local plan, m = run.plan, run.plan_measured
  local stats = m and m.stats or run:stats()
  local per = m and m.per or measured_seconds(run)
  local report = { layers = {}, predicted_step_seconds = plan.step_seconds,
                   measured_step_seconds = m and m.step_seconds or stats.step_seconds,
                   predicted_device_peak = stats.predicted_device_peak, device_peak = stats.device_peak,
                   predicted_h2d_bytes = plan.h2d_bytes, h2d_bytes = stats.h2d_bytes,
                   predicted_d2h_bytes = plan.d2h_bytes, d2h_bytes = stats.d2h_bytes,
                   predicted_host_eps_bytes = plan.host_eps_bytes, host_eps_bytes = stats.host_eps_bytes,
                   predicted_device_records_bytes = plan.device_records_bytes,
                   device_records_bytes = stats.device_records_bytes,
                   predicted_disk_bytes = plan.disk_bytes, disk_read_bytes = stats.spill_read_bytes,
                   disk_written_bytes = stats.spill_written_bytes,
                   predicted_channels = plan.channels, limit = plan.limit,
                   measured_channels = { compute = stats.compute_seconds, copies_in = stats.h2d_seconds,
                                         copies_out = stats.d2h_seconds,
                                         updates = stats.optimizer_seconds } }
  for i, l in ipairs(plan.layers) do
    report.layers[i] = { kind = l.kind, inner = l.inner, stash = l.stash, predicted = l.seconds,
                         measured = per[i] or 0 }
  end
  return setmetatable(report, Report)
end

-- After a training step: warns once (stderr) when the measured step is more than 25 % off
-- the plan's prediction: the rates no longer describe the machine (another load, another
-- build). The first step is not judged (it makes lasting buffers and warms caches). Keeps
-- the steps' figures for run:plan_report.
function M.check_prediction(run)
  run.plan_steps = (run.plan_steps or 0) + 1
  if run.plan_steps < 2 then return end
  -- the training steps' figures for run:plan_report (means of the seconds)
  local m = run.plan_measured or { steps = 0, step_seconds = 0, per = {} }
  local stats, per, n = run:stats(), measured_seconds(run), m.steps
  m.stats, m.steps = stats, n + 1
  m.step_seconds = (m.step_seconds * n + stats.step_seconds) / (n + 1)
  for i = 1, #run.plan.layers do m.per[i] = ((m.per[i] or 0) * n + (per[i] or 0)) / (n + 1) end
  run.plan_measured = m
  if run.plan_warned then return end
  local measured, predicted = stats.step_seconds, run.plan.step_seconds
  if predicted > 0 and (measured > 1.25 * predicted or measured < predicted / 1.25) then
    run.plan_warned = true
    io.stderr:write(("l2l: warning: a step took %.3f s, the plan predicted %.3f s (more than 25 %% off): "
      .. "the rates are stale; measure them again with l2l.calibrate{ remeasure = true } and plan again\n"):format(
      measured, predicted))
  end
end

local function mib(bytes) return ("%.2f MiB"):format(bytes / 2 ^ 20) end

-- The plan as a table: a row per layer, then the totals and the rule of thumb.
function Plan:__tostring()
  local rows = { ("%-5s %-12s %-10s %-10s %12s %12s  %s"):format("layer", "kind", "inner", "stash", "kept", "ms/step",
                                                                "records") }
  for i, l in ipairs(self.layers) do
    rows[#rows + 1] = ("%-5d %-12s %-10s %-10s %12s %12.2f  %s"):format(i, l.kind, i == #self.layers and "-" or l.inner,
      i == 1 and "-" or l.stash, mib(l.kept_bytes), l.seconds * 1e3, l.on_device and "device" or "host")
  end
  rows[#rows + 1] = ("micro-batch %d of %d (seq %d): predicted %.1f ms a step, device peak %s of a %s budget"):format(
    self.micro_batch, self.batch, self.seq, self.step_seconds * 1e3, mib(self.device_peak), mib(self.device_budget))
  if self.device_records_bytes > 0 then
    rows[#rows] = rows[#rows] .. (" (beside the records placed on the device: %s)"):format(mib(self.device_records_bytes))
  end
  rows[#rows + 1] = ("copies a step: %s to the device, %s back"):format(mib(self.h2d_bytes), mib(self.d2h_bytes))
  rows[#rows + 1] = channels_line(self.channels, self.limit)
  if self.hiding_accumulate then
    rows[#rows + 1] = ("the host optimizer hides under the rest of the step from accumulate = %d (%d here: %d samples an update)"):format(
      self.hiding_accumulate, self.accumulate, self.hiding_accumulate * self.batch)
  elseif self.accumulate_chosen then
    rows[#rows + 1] = ("accumulate %d, chosen: the host optimizer hides under the rest of the step (%d samples an update)"):format(
      self.accumulate, self.accumulate * self.batch)
  end
  rows[#rows + 1] = ("host: the EPS holds %s between steps (the smallest host budget that works: %s)%s"):format(
    mib(self.host_eps_bytes), mib(self.host_budget_smallest), self.spill and
    (("; the spill file: %s read and %s written a step, %.1f ms at the disk's rates"):format(
      mib(self.disk_bytes), mib(self.disk_bytes), self.disk_seconds * 1e3)) or "")
  if self.streaming_tokens > 0 then
    rows[#rows + 1] = ("weight streaming hides under compute above %.0f tokens per layer visit (%d here)"):format(
      self.streaming_tokens, self.batch * self.seq)
  end
  return table.concat(rows, "\n")
end

function Report:__tostring()
  local rows = { ("%-5s %-12s %-10s %-10s %14s %13s"):format("layer", "kind", "inner", "stash", "predicted ms", "measured ms") }
  local n = #self.layers
  for i, l in ipairs(self.layers) do
    rows[#rows + 1] = ("%-5d %-12s %-10s %-10s %14.2f %13.2f"):format(i, l.kind, i == n and "-" or l.inner,
      i == 1 and "-" or l.stash, l.predicted * 1e3, l.measured * 1e3)
  end
  rows[#rows + 1] = ("step: predicted %.1f ms, measured %.1f ms; device peak: predicted %s, measured %s"):format(
    self.predicted_step_seconds * 1e3, self.measured_step_seconds * 1e3,
    mib(self.predicted_device_peak or 0), mib(self.device_peak))
  rows[#rows + 1] = ("copies: to the device predicted %s, measured %s; back predicted %s, measured %s"):format(
    mib(self.predicted_h2d_bytes), mib(self.h2d_bytes), mib(self.predicted_d2h_bytes), mib(self.d2h_bytes))
  rows[#rows + 1] = ("host: EPS predicted %s, measured %s; disk: predicted %s each way, measured %s read, %s written"):format(
    mib(self.predicted_host_eps_bytes), mib(self.host_eps_bytes), mib(self.predicted_disk_bytes),
    mib(self.disk_read_bytes), mib(self.disk_written_bytes))
  if self.predicted_device_records_bytes > 0 or self.device_records_bytes > 0 then
    rows[#rows + 1] = ("records on the device: predicted %s, measured %s"):format(
      mib(self.predicted_device_records_bytes), mib(self.device_records_bytes))
  end
  rows[#rows + 1] = "predicted " .. channels_line(self.predicted_channels, self.limit)
  rows[#rows + 1] = ("measured: %s (the host optimizer's summed over its workers)"):format(
    channels_text(self.measured_channels))
  return table.concat(rows, "\n")
end

return M
