-- SPDX-License-Identifier: MIT
-- l2l.profile — where a relay step's time goes, op by op (C: l2l.h, "the profile").
--
--   l2l.profile.start{ skip = 1 }      -- probes the rates, then times every step after `skip`
--   ... run:step(...) ...
--   l2l.profile.stop()
--   local p = l2l.profile.report()     -- {steps=, step_seconds=, ..., rows = {...}}
--   print(l2l.profile.table())         -- one screen
--   l2l.profile.write("step.tsv", { overwrite = true })
--
-- Every op on the device pool inside a relay's step is timed on the device's own clock
-- (CUDA events, or the host clock on the CPU backend) and summed by op and shape, with its
-- FLOPs and bytes and the fraction of the probed rate it reached; the step's time outside
-- the ops is split by cause. L2L_PROFILE=FILE does the same for a whole program, no call
-- needed. Must never: hold figures of its own (the C profile is the one record).
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")

local C, check, too_many, select = lib.C, lib.check, argcheck.too_many, select
local type, tostring, tonumber = type, tostring, tonumber

local M = {}

local START_OPTIONS = { skip = true }

-- l2l.profile.start{ skip = 0 }: starts a profile (clearing the last one); the first
-- `skip` steps are left out (a first step's one-time costs would hide the steady state).
function M.start(options, ...)
  if select("#", ...) ~= 0 then too_many("l2l.profile.start", "options", 2, ...) end
  local o = argcheck.options(options, START_OPTIONS, "l2l.profile.start", 2)
  local skip = o.skip == nil and 0 or o.skip
  if type(skip) ~= "number" or skip < 0 or skip % 1 ~= 0 or skip > 2 ^ 31 - 1 then
    error("l2l.profile.start: skip must be a whole number of steps >= 0, got " .. argcheck.describe(skip), 2)
  end
  check(C.l2l_profile_start(skip), "l2l.profile.start", 2)
end

function M.stop(...)
  if select("#", ...) ~= 0 then too_many("l2l.profile.stop", "", 2, ...) end
  check(C.l2l_profile_stop(), "l2l.profile.stop", 2)
end

local SUMMARY_NUMBERS = { "steps", "step_seconds", "op_seconds", "idle_copy_seconds",
                          "idle_copy_params_seconds", "idle_copy_acts_in_seconds",
                          "idle_copy_acts_out_seconds", "idle_copy_grads_seconds",
                          "idle_update_seconds", "idle_comm_seconds", "idle_sync_seconds",
                          "idle_launch_seconds", "ops", "lane_ops", "syncs", "launches", "dropped",
                          "copy_rate", "link_rate", "gemm_rate_f32", "gemm_rate_16" }

-- l2l.profile.report() -> the summary's fields (totals over the profiled steps: seconds,
-- counts, the probed rates; backend and probe as strings) and rows, slowest first: each
-- {kind = "op" | "lane", op=, shape=, calls=, seconds=, host_seconds = the host's time in
-- the calls (near seconds where the host set their pace), flops=, bytes=, bound = "flop" |
-- "mem" | "link", roofline = the fraction of the probed rate, or nil when not probed}.
function M.report(...)
  if select("#", ...) ~= 0 then too_many("l2l.profile.report", "", 2, ...) end
  local s = ffi.new("l2l_profile_summary")
  check(C.l2l_profile_get_summary(s), "l2l.profile.report", 2)
  local out = { backend = ffi.string(s.backend), probe = ffi.string(s.probe), rows = {} }
  for _, k in ipairs(SUMMARY_NUMBERS) do out[k] = tonumber(s[k]) end
  local n = tonumber(s.rows)
  if n > 0 then
    local rows = ffi.new("l2l_profile_row[?]", n)
    check(C.l2l_profile_rows(rows, 0, n), "l2l.profile.report", 2)
    for i = 0, n - 1 do
      local r = rows[i]
      out.rows[i + 1] = {
        kind = ffi.string(r.kind), op = ffi.string(r.op), shape = ffi.string(r.shape),
        calls = tonumber(r.calls), seconds = r.seconds, host_seconds = r.host_seconds,
        flops = r.flops, bytes = r.bytes,
        bound = ffi.string(r.bound), roofline = r.roofline >= 0 and r.roofline or nil,
      }
    end
  end
  return out
end

local WRITE_OPTIONS = { overwrite = true }

-- l2l.profile.write(path [, { overwrite = false }]): the rows and summary as a TSV file,
-- figures a step; an existing file is refused unless overwrite.
function M.write(path, options, ...)
  if select("#", ...) ~= 0 then too_many("l2l.profile.write", "path, options", 2, ...) end
  if type(path) ~= "string" or path == "" then
    error("l2l.profile.write: path must be a file name, got " .. argcheck.describe(path), 2)
  end
  local o = argcheck.options(options, WRITE_OPTIONS, "l2l.profile.write", 2)
  if o.overwrite ~= nil and type(o.overwrite) ~= "boolean" then
    error("l2l.profile.write: overwrite must be true or false, got " .. argcheck.describe(o.overwrite), 2)
  end
  check(C.l2l_profile_write(path, o.overwrite and 1 or 0), "l2l.profile.write", 2)
end

-- l2l.profile.table([width = 100]) -> the one-screen table as a string.
function M.table(width, ...)
  if select("#", ...) ~= 0 then too_many("l2l.profile.table", "width", 2, ...) end
  width = width == nil and 100 or width
  if type(width) ~= "number" or width % 1 ~= 0 or width < 80 or width > 1000 then
    error("l2l.profile.table: width must be a whole number of columns from 80 to 1000, got " ..
          tostring(width), 2)
  end
  local size = 64 * 1024
  local buf = ffi.new("char[?]", size)
  check(C.l2l_profile_table(buf, size, width), "l2l.profile.table", 2)
  return ffi.string(buf)
end

return M
