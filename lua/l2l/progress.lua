-- SPDX-License-Identifier: MIT
-- l2l.progress — a training run's progress display: one updating line on a terminal,
-- plain lines elsewhere, with human units for bytes, counts and durations.
--
--   local progress = require("l2l.progress")
--   local bar = progress.new{ total = 300, first = 0, every = 25 }
--   bar:update(step, { loss = 2.31, tokens_per_s = 5120, device_peak = 9e6, host = 4e7 })
--   bar:print("step 100  val loss 2.12")     -- a line that stays (clears the updating one)
--   bar:finish()
--
-- Purpose: show a long loop's state without flooding the output. On a terminal the line
-- is redrawn in place ("\r" then the line then "ESC[K" to clear what a longer line left);
-- when the output is a file or a pipe (make's log, a spec reading it) the same fields go
-- out as plain lines every `every` steps and at the last step, so logs stay readable.
-- Whether stdout is a terminal comes from isatty(1); L2L_PROGRESS=tty or =plain
-- overrides it (for scripts under a pseudo-terminal, and to test both modes).
-- The ETA is the remaining steps times the mean time per step of this run so far (steps
-- done before a resume are not timed, so they do not count). On a terminal the line fits
-- its width: the fields kept least are left out first (the ranks, disk, host, device
-- peak, tokens a second, validation loss, loss, in that order); the step and the ETA stay.
-- Must never: write "\r" or escape sequences when the output is not a terminal, or
-- raise on a missing field (a field that is nil is simply left out of the line; a field
-- it does not know is refused, as every public function refuses what it does not know).
local ffi = require("ffi")
local argcheck = require("l2l.argcheck")

local type, tostring, floor, format, concat = type, tostring, math.floor, string.format, table.concat
local select, too_many = select, argcheck.too_many

local M = {}
local Bar = {}
Bar.__index = Bar

-- One declaration at a time: another module may have declared a libc function already
-- (a second declaration is an error that would stop the ones after it).
for _, decl in ipairs({
  "int isatty(int fd);",
  "struct l2l_progress_timespec { long tv_sec; long tv_nsec; };",
  "int clock_gettime(int clock_id, struct l2l_progress_timespec *tp);",
  "struct l2l_progress_winsize { unsigned short rows, cols, xpixel, ypixel; };",
  "int ioctl(int fd, unsigned long request, ...);",
}) do pcall(ffi.cdef, decl) end

----------------------------------------------------------------- clocks and terminals

local ts = ffi.new("struct l2l_progress_timespec")
local CLOCK_MONOTONIC = 1

-- Seconds on a monotonic clock (wall time: os.clock() counts CPU time of every thread,
-- which overstates a multi-threaded step).
local function monotonic()
  if ffi.C.clock_gettime(CLOCK_MONOTONIC, ts) ~= 0 then error("clock_gettime failed") end
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
-- (If clock_gettime was declared elsewhere with another struct, whole seconds it is.)
local now = pcall(monotonic) and monotonic or function() return os.time() end

-- progress.now() -> seconds on a monotonic clock.
function M.now(...)
  if select("#", ...) ~= 0 then too_many("progress.now", "", 2, ...) end
  return now()
end

-- true when the progress line should update in place: L2L_PROGRESS=tty|plain decides,
-- else whether file descriptor 1 is a terminal.
function M.is_terminal(...)
  if select("#", ...) ~= 0 then too_many("progress.is_terminal", "", 2, ...) end
  local forced = os.getenv("L2L_PROGRESS")
  if forced == "tty" then return true end
  if forced == "plain" then return false end
  local ok, r = pcall(function() return ffi.C.isatty(1) end)
  return ok and r == 1
end

-- Columns of the terminal on stdout: $COLUMNS if exported, else the terminal's own size
-- (ioctl TIOCGWINSZ, Linux's number), else 80. A line longer than this would wrap, and
-- "\r" would then redraw only its last row.
local TIOCGWINSZ = 0x5413
function M.columns(...)
  if select("#", ...) ~= 0 then too_many("progress.columns", "", 2, ...) end
  local env = tonumber(os.getenv("COLUMNS"))
  if env and env >= 20 then return env end
  local ok, cols = pcall(function()
    local ws = ffi.new("struct l2l_progress_winsize")
    if ffi.os == "Linux" and ffi.C.ioctl(1, TIOCGWINSZ, ws) == 0 then return ws.cols end
    return 0
  end)
  if ok and cols >= 20 then return cols end
  return 80
end

----------------------------------------------------------------- human units

-- 1536 -> "1.5 KiB", 3.2e7 -> "30.5 MiB" (binary units, as the pools count).
function M.bytes(n, ...)
  if select("#", ...) ~= 0 then too_many("progress.bytes", "n", 2, ...) end
  if type(n) ~= "number" then error("progress.bytes: n must be a number, got " .. type(n), 2) end
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local u, v = 1, n
  while math.abs(v) >= 1024 and u < #units do v, u = v / 1024, u + 1 end
  if u == 1 then return format("%d B", v) end
  return format(v >= 100 and "%.0f %s" or v >= 10 and "%.1f %s" or "%.2f %s", v, units[u])
end

-- 950 -> "950", 12345 -> "12.3k", 4.2e6 -> "4.20M" (decimal units, for tokens).
function M.count(n, ...)
  if select("#", ...) ~= 0 then too_many("progress.count", "n", 2, ...) end
  if type(n) ~= "number" then error("progress.count: n must be a number, got " .. type(n), 2) end
  local a = math.abs(n)
  if a < 1e3 then return format("%.0f", n) end
  local v, s
  if a < 1e6 then v, s = n / 1e3, "k" elseif a < 1e9 then v, s = n / 1e6, "M" else v, s = n / 1e9, "G" end
  return format(math.abs(v) >= 100 and "%.0f%s" or math.abs(v) >= 10 and "%.1f%s" or "%.2f%s", v, s)
end

-- 7.3 -> "7.3s", 95 -> "1m35s", 7300 -> "2h01m".
function M.duration(s, ...)
  if select("#", ...) ~= 0 then too_many("progress.duration", "s", 2, ...) end
  if type(s) ~= "number" then error("progress.duration: s must be a number, got " .. type(s), 2) end
  if s ~= s or s == math.huge then return "?" end
  if s < 60 then return format("%.1fs", s) end
  s = floor(s + 0.5)
  if s < 3600 then return format("%dm%02ds", floor(s / 60), s % 60) end
  return format("%dh%02dm", floor(s / 3600), floor(s % 3600 / 60))
end

----------------------------------------------------------------- the bar

-- progress.new{total =, first = 0 (steps already done: a resumed run), every = 10 (plain
-- lines: one per `every` steps), tty = (default M.is_terminal()), out = io.stdout,
-- width = (columns; default: the terminal's, see M.columns), ranks = 1 (data parallel:
-- more than 1 is shown in the line)}
local OPTIONS = { total = true, first = true, every = true, tty = true, out = true, width = true, ranks = true }

function M.new(o, ...)
  if select("#", ...) ~= 0 then too_many("progress.new", "options", 2, ...) end
  o = argcheck.options(o, OPTIONS, "progress.new", 2)
  local function int(key, default, min)
    local v = o[key]
    if v == nil then return default end
    if type(v) ~= "number" or v ~= floor(v) or v < min then
      error(("progress.new: option '%s' must be an integer >= %d, got %s"):format(key, min, tostring(v)), 3)
    end
    return v
  end
  local self = setmetatable({}, Bar)
  self.total = int("total", nil, 1)
  if self.total == nil then error("progress.new: option 'total' is required", 2) end
  self.first = int("first", 0, 0)
  self.every = int("every", 10, 1)
  self.width = int("width", nil, 20)
  self.ranks = int("ranks", 1, 1)
  if o.tty ~= nil and type(o.tty) ~= "boolean" then error("progress.new: option 'tty' must be true or false", 2) end
  self.tty = o.tty
  if self.tty == nil then self.tty = M.is_terminal() end
  self.out = o.out or io.stdout
  if self.width == nil then self.width = self.tty and M.columns() or 1000 end
  self.start = now()
  self.drawn = false   -- an updating line is on the screen
  return self
end

local function bar_of(self, fname)
  if getmetatable(self) ~= Bar then error(fname .. ": self must be a progress bar (from progress.new)", 3) end
end

local function step_of(step, fname)
  if type(step) ~= "number" then error(fname .. ": step must be a number, got " .. argcheck.describe(step), 3) end
end

-- Seconds left: the mean time per step of this run times the steps to go.
local function eta(self, step)
  local done = step - self.first
  if done <= 0 then return math.huge end
  return (now() - self.start) / done * (self.total - step)
end

function Bar:eta(step, ...)
  if select("#", ...) ~= 0 then too_many("bar:eta", "step", 2, ...) end
  bar_of(self, "bar:eta")
  step_of(step, "bar:eta")
  local seconds = eta(self, step)
  return seconds
end

local FIELDS = { loss = true, val_loss = true, tokens_per_s = true, device_peak = true, device_budget = true,
                 host = true, disk = true }

-- The parts of the line for `step` with fields f: loss, val_loss, tokens_per_s,
-- device_peak, device_budget, host (bytes), disk (bytes the step moved to and from its
-- spill file); each with the rank it keeps when the line must shrink (higher: kept longer).
local function parts_of(self, step, f, fname)
  f = argcheck.options(f, FIELDS, fname, 4, "fields")
  local digits = #tostring(self.total)
  local parts = { { format("step %" .. digits .. "d/%d", step, self.total), 9 } }
  local function add(text, keep) parts[#parts + 1] = { text, keep } end
  if self.ranks > 1 then add(format("%d ranks", self.ranks), 1) end
  if f.loss then add(format("loss %.3f", f.loss), 7) end
  if f.val_loss then add(format("val %.3f", f.val_loss), 6) end
  if f.tokens_per_s then add(M.count(f.tokens_per_s) .. " tok/s", 5) end
  if f.device_peak then
    add("dev peak " .. M.bytes(f.device_peak) ..
        (f.device_budget and f.device_budget > 0 and ("/" .. M.bytes(f.device_budget)) or ""), 4)
  end
  if f.host then add("host " .. M.bytes(f.host), 3) end
  if f.disk then add("disk " .. M.bytes(f.disk) .. "/step", 2) end
  add((step >= self.total and "took " .. M.duration(now() - self.start)) or "ETA " .. M.duration(eta(self, step)), 8)
  return parts
end

-- The parts joined, dropping the ones kept least until the line has at most `width`
-- characters (the step's part alone may still be longer).
local function fit(parts, width)
  local function joined()
    local texts = {}
    for i, p in ipairs(parts) do texts[i] = p[1] end
    return concat(texts, "  ")
  end
  local text = joined()
  while #text > width and #parts > 1 do
    local least = 2
    for i = 3, #parts do if parts[i][2] < parts[least][2] then least = i end end
    table.remove(parts, least)
    text = joined()
  end
  return text
end

-- The whole line (plain output), or on a terminal the line that fits its width (the
-- cursor's column is the last: width - 1).
local function line(self, step, f, fname)
  return fit(parts_of(self, step, f, fname), self.tty and self.width - 1 or math.huge)
end

function Bar:line(step, fields, ...)
  if select("#", ...) ~= 0 then too_many("bar:line", "step, fields", 2, ...) end
  bar_of(self, "bar:line")
  step_of(step, "bar:line")
  local text = line(self, step, fields, "bar:line")
  self.made_text, self.made_step = text, step   -- (print knows its step by this)
  return text
end

-- Shows step `step` (on a terminal: redraws the line; otherwise a plain line every
-- `every` steps, at the first step of the run and at the last).
function Bar:update(step, fields, ...)
  if select("#", ...) ~= 0 then too_many("bar:update", "step, fields", 2, ...) end
  bar_of(self, "bar:update")
  step_of(step, "bar:update")
  local text = line(self, step, fields, "bar:update")
  if self.tty then
    if #text > self.width - 1 then text = text:sub(1, self.width - 1) end   -- (a narrow terminal)
    self.out:write("\r", text, "\27[K")
    self.drawn, self.drawn_step = true, step
  elseif step == self.first + 1 or step % self.every == 0 or step >= self.total then
    self.out:write(text, "\n")
  end
  self.out:flush()
end

-- A line that stays: on a terminal the updating line is cleared first (it is redrawn at
-- the next update).
function Bar:print(text, ...)
  if select("#", ...) ~= 0 then too_many("bar:print", "text", 2, ...) end
  bar_of(self, "bar:print")
  if self.tty and self.drawn then self.out:write("\r\27[K") ; self.drawn = false end
  self.out:write(tostring(text), "\n")
  self.printed_step = text == self.made_text and self.made_step or nil
  self.out:flush()
end

-- Ends the updating line (a newline after it on a terminal), or clears it where it is of
-- the step whose line (from bar:line) was printed last: a step is shown once (a last
-- evaluation's line is printed, then drawn; Ctrl-C's stop step showed twice).
function Bar:finish(...)
  if select("#", ...) ~= 0 then too_many("bar:finish", "", 2, ...) end
  bar_of(self, "bar:finish")
  if self.tty and self.drawn then
    self.out:write(self.drawn_step == self.printed_step and "\r\27[K" or "\n")
    self.drawn = false
  end
  self.out:flush()
end

return M
