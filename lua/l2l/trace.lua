-- SPDX-License-Identifier: MIT
-- l2l.trace — the relay's timeline (run:events()) as a Chrome trace, for Perfetto
-- (ui.perfetto.dev) or chrome://tracing. What run:trace(path) writes.
--
--   local trace = require("l2l.trace")
--   local doc = trace.chrome(run:events())          -- a Lua table, ready for cjson.encode
--   trace.write("step.json", run:events())          -- the same, encoded into a file
--
-- One lane (tid) per relay thread, in this order: 0 "compute" (the caller: layers'
-- forward and backward, waits), 1 "copy host→device", 2 "copy device→host", 3.. "optimizer
-- worker k" (k counted from 1); with data parallel, after the workers, "communication (MPI)"
-- (a lane whose events are all reduce-scatters and all-gathers). Each event is a complete ("X") event named like
-- "forward L3 mb2", with cat = its phase, ts and dur in microseconds since the relay was
-- made, and args {layer, micro_batch, phase} (layer and micro_batch 1-based, absent when
-- the event has none). Events from several steps may be passed together: their times are
-- on one clock.
-- Options (opts): name (the process's name, default "l2l relay").
-- Must never: write a partial file on an encoding error (the whole text is made before
-- the file is opened), change the global cjson settings other modules see (a private
-- cjson instance is used), or drop an event silently (a malformed one is an error naming it).
local cjson = require("cjson").new()
local argcheck = require("l2l.argcheck")

local type, tostring, ipairs, pairs, floor, select = type, tostring, ipairs, pairs, math.floor, select
local huge, too_many = math.huge, argcheck.too_many

local M = {}

local PID = 1
local FIXED_LANES = { [0] = "compute", "copy host→device", "copy device→host" }

-- trace.lane_name(t): the name of lane (thread) t.
local function lane_name(t)
  return FIXED_LANES[t] or ("optimizer worker %d"):format(t - 2)
end

function M.lane_name(t, ...)
  if select("#", ...) ~= 0 then too_many("trace.lane_name", "t", 2, ...) end
  if type(t) ~= "number" or t ~= floor(t) or t < 0 then
    error("trace.lane_name: t must be an integer >= 0, got " .. argcheck.describe(t), 2)
  end
  return lane_name(t)
end

-- Whole nanoseconds: finer digits are clock noise and only make the file bigger, and
-- durations as differences of integers carry no rounding residue into the JSON.
local function nanos(seconds) return floor(seconds * 1e9 + 0.5) end

local function finite(v) return type(v) == "number" and v == v and v > -huge and v < huge end

local function check_event(e, i, what, fname)
  local function bad(msg) error(("%s: %s[%d]: %s"):format(fname, what, i, msg), 0) end
  if type(e) ~= "table" then bad("must be an event table {layer, micro_batch, phase, thread, start, finish}") end
  if type(e.phase) ~= "string" then bad("phase must be a string, got " .. tostring(e.phase)) end
  local t = e.thread
  if type(t) ~= "number" or t ~= floor(t) or t < 0 then bad("thread must be an integer >= 0, got " .. tostring(t)) end
  if not finite(e.start) or e.start < 0 then bad("start must be a number >= 0, got " .. tostring(e.start)) end
  if not finite(e.finish) or e.finish < e.start then
    bad(("finish must be a number >= start (%s), got %s"):format(tostring(e.start), tostring(e.finish)))
  end
  for _, k in ipairs({ "layer", "micro_batch" }) do
    local v = e[k]
    if v ~= nil and (type(v) ~= "number" or v ~= floor(v) or v < 1) then
      bad(k .. " must be nil or an integer >= 1, got " .. tostring(v))
    end
  end
end

local function event_name(e)
  local name = e.phase
  if e.layer then name = name .. " L" .. e.layer end
  if e.micro_batch then name = name .. " mb" .. e.micro_batch end
  return name
end

local function metadata(name, tid, args)
  return { name = name, ph = "M", pid = PID, tid = tid, args = args }
end

local OPTIONS = { name = true }

-- The Chrome trace of events; errors are plain messages (level 0) starting with fname,
-- re-raised at the caller by the public functions.
local function chrome(events, opts, fname)
  if type(events) ~= "table" then error(fname .. ": events must be a list of relay events (run:events())", 0) end
  opts = argcheck.options(opts, OPTIONS, fname, 0, "opts")
  local name = opts.name or "l2l relay"
  if type(name) ~= "string" then error(fname .. ": opts.name must be a string, got " .. tostring(name), 0) end

  local out, lanes = {}, { [0] = true, true, true }   -- the three fixed lanes always show
  local exchanges = {}   -- lane -> true while every event on it is an MPI exchange
  for i, e in ipairs(events) do
    check_event(e, i, "events", fname)
    lanes[e.thread] = true
    local exchange = e.phase == "reduce_scatter" or e.phase == "all_gather"
    exchanges[e.thread] = exchange and exchanges[e.thread] ~= false
    local ns, ne = nanos(e.start), nanos(e.finish)
    out[#out + 1] = {
      name = event_name(e), cat = e.phase, ph = "X", pid = PID, tid = e.thread,
      ts = ns / 1e3, dur = (ne - ns) / 1e3,   -- microseconds
      args = { layer = e.layer, micro_batch = e.micro_batch, phase = e.phase },
    }
  end

  -- Metadata first: viewers read lane names and orders wherever they are, but a reader
  -- of the file finds them at the top.
  local meta = {
    metadata("process_name", 0, { name = name }),
    metadata("process_sort_index", 0, { sort_index = 0 }),
  }
  local tids = {}
  for t in pairs(lanes) do tids[#tids + 1] = t end
  table.sort(tids)
  for _, t in ipairs(tids) do
    meta[#meta + 1] = metadata("thread_name", t, { name = exchanges[t] and t > 2 and "communication (MPI)" or lane_name(t) })
    meta[#meta + 1] = metadata("thread_sort_index", t, { sort_index = t })
  end
  local base = #meta
  for i, e in ipairs(out) do meta[base + i] = e end
  return { traceEvents = meta, displayTimeUnit = "ms" }
end

-- trace.chrome(events [, opts]) -> {traceEvents = {...}, displayTimeUnit = "ms"}: the
-- Chrome trace of a list of relay events (run:events(), or several steps' lists joined).
-- Errors name the offending entry ("trace.chrome: events[i]: ...").
function M.chrome(events, opts, ...)
  if select("#", ...) ~= 0 then too_many("trace.chrome", "events, opts", 2, ...) end
  local ok, doc = pcall(chrome, events, opts, "trace.chrome")
  if not ok then error(doc, 2) end
  return doc
end

local function write(path, events, opts, fname)
  if type(path) ~= "string" or path == "" then
    error(fname .. ": path must be a file name (a non-empty string), got " .. tostring(path), 0)
  end
  local text = cjson.encode(chrome(events, opts, fname))
  local f, why = io.open(path, "wb")
  if not f then error(("%s: cannot open '%s' for writing: %s"):format(fname, path, tostring(why)), 0) end
  -- One write of the whole text; a failure (disk full) is reported, never ignored: a
  -- truncated trace would only fail later, in the viewer. The file is not removed then:
  -- `path` may be something other than a file of ours (/dev/stdout).
  local ok, werr = f:write(text)
  local closed, cerr = f:close()
  if not ok or not closed then error(("%s: cannot write '%s': %s"):format(fname, path, tostring(werr or cerr)), 0) end
  return #events
end

-- trace.write(path, events [, opts]) -> the number of events written: the Chrome trace of
-- `events` encoded as JSON into the file `path` (replaced). Errors name the path.
function M.write(path, events, opts, ...)
  if select("#", ...) ~= 0 then too_many("trace.write", "path, events, opts", 2, ...) end
  local ok, n = pcall(write, path, events, opts, "trace.write")
  if not ok then error(n, 2) end
  return n
end

return M
