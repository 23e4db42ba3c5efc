-- SPDX-License-Identifier: MIT
-- l2l.cli — what command-line training scripts share (every example uses it): flags
-- through one argument parser (Debian's lua-argparse), the text to train on (--data
-- FILE_OR_FOLDER), and a Ctrl-C that ends a training loop gently.
--
--   local cli = require("l2l.cli")
--   local parser = cli.parser{ name = "grow_depth", description = "Progressive stacking ...",
--     data = true, max_bytes = 400000,            -- adds --data (repeatable) and --max-bytes
--     flags = { { "--steps", 300, "int", "training steps", min = 1 },
--               { "--stash", "host", "choice", "where activations wait", choices = { "host", "device" } } } }
--   parser:flag("--verbose")                      -- an argparse parser: anything it offers
--   local opt = cli.parse(parser)                 -- from `arg`: opt.steps, opt.max_bytes, opt.data
--   local corpus = cli.corpus(opt)                -- l2l.text.corpus of --data, or the C headers
--   local stop = cli.interrupt()                  -- Ctrl-C from now on asks the loop to stop
--   for step = 1, opt.steps do ... if stop:requested() then break end end
--   ... the summary, metrics, plot, checkpoint ...
--   stop:finish()                                 -- after a Ctrl-C: end as Ctrl-C ends a program
--
-- cli.parser{name, description [, epilog, usage, flags, data, max_bytes]} -> an argparse
--   parser with --help. `usage` is the command shown (default "l2l " .. arg[0]); each flag
--   is { "--name", default, kind, help [, min =, max =, choices =, meta =] } with kind
--   "int" (an integer >= min, <= max), "number" (in [min, max]), "string", "choice" (one
--   of choices), "flag" (no value: true when given) or "list" (a value each time it is
--   given: a list). The value lands in opt.name, dashes as underscores (opt.max_bytes).
-- cli.parse(parser [, args]) -> opt: `args` default to the script's arguments. --help
--   prints the help and exits 0; a flag it does not know (with a near miss: "did you mean
--   '--steps'?"), a value of the wrong kind or a missing value prints what is wrong and
--   exits 2 (the usual status for bad usage). Standard output becomes line-buffered: a
--   program's log piped through tee shows each line as it comes, in order with stderr's.
-- cli.usage_error(message) says what is wrong with the flags (as cli.parse does) and exits 2.
-- cli.corpus(opt) -> l2l.text.corpus(opt.data, {max_bytes = opt.max_bytes}): files and
--   folders (walked recursively) in a fixed order; without --data, the C headers under
--   /usr/include, else l2l's own sources. A --data that cannot be read exits 2, naming it.
-- cli.fail(message) prints "<name>: message" on stderr and exits 1.
-- cli.interrupt([message | options]) -> stop: from now on the first stop signal makes
--   stop:requested() true, and the loop finishes its step and writes what it writes at its
--   end. The stop signals: Ctrl-C (SIGINT); SIGTERM (kill, timeout(1), a scheduler's
--   preemption or time limit); SIGUSR1 (mpirun passes it on to every rank; Slurm's --signal
--   sends it before a time limit). The first writes a line at once ("<name>: Ctrl-C:
--   stopping after this step (Ctrl-C again stops at once)", the signal named; `message`
--   instead when given). A second one, of any of the three, is the usual signal: a script
--   dies at once, the REPL stops the entry. options: { message =, dist = "mpi" | "none" }:
--   with dist = "mpi" (a data-parallel run) stop:requested() is a collective: every rank
--   calls it at the same points (once a step), and all answer true from the same call on
--   once any rank was signalled, so every rank stops after the same step (only rank 0
--   writes a line: the signal's, or "SIGTERM on 1 other rank: stopping after this step").
--   stop:signal() -> "Ctrl-C", "SIGTERM" or "SIGUSR1": what stopped the loop (nil: nothing;
--   this process's own signal where the ranks have not agreed on one, as after the loop).
--   stop:finish() lets go of the signals and, when one stopped the run, ends the process as
--   that signal does (killed by it: status 130 for Ctrl-C in a shell, which also stops a
--   shell loop around it, 143 for SIGTERM, 138 for SIGUSR1; in the REPL, after a Ctrl-C,
--   an error "interrupted (Ctrl-C)" instead, after SIGTERM or SIGUSR1 the REPL ends); a rank
--   stopped by other ranks' signals alone ends as by the first of Ctrl-C, SIGTERM, SIGUSR1
--   that reached one (with status 128 + its number where its parent had it ignored).
--   stop:release() lets go without ending anything. The gentle stop needs the l2l
--   executable (its module "l2l.stop_signals", see src/runner/stop_signals.c); in plain
--   luajit the signals keep their usual effect, and one ignored by the parent (Ctrl-C in a
--   background job of a shell script) stays ignored.
-- Must never: read a flag it was not told about, or end the process except where said
-- above (cli.parse on bad usage, cli.usage_error, cli.corpus on bad --data, cli.fail,
-- stop:finish).
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")

local type, tostring, ipairs, select, floor, too_many, describe = type, tostring, ipairs, select,
                                                                 math.floor, argcheck.too_many, argcheck.describe

local M = {}

local program = "l2l"     -- the name in messages: the last parser's
local usage_name = "l2l"  -- the command in "try ... --help"

----------------------------------------------------------------- the parser

local function load_argparse()
  local ok, argparse = pcall(require, "argparse")
  if not ok then
    error("l2l.cli: the examples' flags need Debian's lua-argparse, which is not installed " ..
          "(sudo apt-get install lua-argparse, or scripts/deps.sh)", 0)
  end
  return argparse
end

-- The converter of an "int" or "number" flag: a number in range, or nil and the message.
local function numeric(name, kind, min, max)
  return function(s)
    local v = tonumber(s)
    local bad = v == nil or v ~= v or (kind == "int" and v ~= floor(v)) or (min and v < min) or (max and v > max)
    -- an int past 2^53 - 1 would be read as a neighbour (2^64 as 0): refused, whatever max says
    if not bad and kind == "int" and math.abs(v) > argcheck.EXACT_MAX then
      return nil, ("%s must be at most 2^53 - 1 in size (a larger number is not held exactly), got '%s'"):format(name, s)
    end
    if not bad then return v end
    local range = min and max and ("in [%s, %s]"):format(tostring(min), tostring(max))
                  or min and (">= " .. tostring(min)) or max and ("<= " .. tostring(max)) or ""
    return nil, ("%s must be %s %s, got '%s'"):format(name, kind == "int" and "an integer" or "a number", range, s)
  end
end

local FLAG = { [1] = true, [2] = true, [3] = true, [4] = true, min = true, max = true, choices = true, meta = true }
local KINDS = { int = true, number = true, string = true, choice = true, flag = true, list = true }

local function add_flag(p, f, i, level)
  local where = ("flags[%d]"):format(i)
  argcheck.fields(f, FLAG, "cli.parser", level + 1, where)
  local name, default, kind, help = f[1], f[2], f[3], f[4]
  if type(name) ~= "string" or not name:match("^%-%-?[%w][%w%-]*$") then
    error(("cli.parser: %s[1] must be a flag name such as '--steps', got %s"):format(where, describe(name)), level + 1)
  end
  if not KINDS[kind] then
    error(("cli.parser: %s[3] (%s) must be int, number, string, choice, flag or list, got %s"):format(
      where, name, describe(kind)), level + 1)
  end
  if type(help) ~= "string" then
    error(("cli.parser: %s[4] (%s) must be its help text, got %s"):format(where, name, describe(help)), level + 1)
  end
  if kind == "flag" then return p:flag(name, help) end
  local o = p:option(name, help)
  local meta = f.meta or (kind == "int" and "N") or (kind == "number" and "X") or nil
  if meta then o:argname("<" .. meta .. ">") end
  if kind == "list" then return o:count("*") end
  if kind == "choice" then
    if type(f.choices) ~= "table" or #f.choices == 0 then
      error(("cli.parser: %s (%s) needs choices, a list of strings"):format(where, name), level + 1)
    end
    o:choices(f.choices)
  elseif kind == "int" or kind == "number" then
    o:convert(numeric(name, kind, f.min, f.max))
  end
  if default == "" then o:default(""):show_default(false)   -- "none"
  elseif default ~= nil then o:default(tostring(default)) end
  return o
end

local PARSER = { name = true, description = true, epilog = true, usage = true, flags = true, data = true,
                 max_bytes = true }

function M.parser(o, ...)
  if select("#", ...) ~= 0 then too_many("cli.parser", "options", 2, ...) end
  o = argcheck.options(o, PARSER, "cli.parser", 2)
  if type(o.name) ~= "string" or o.name == "" then
    error("cli.parser: option 'name' (the program's name in messages) is required, a string", 2)
  end
  if o.flags ~= nil and type(o.flags) ~= "table" then
    error("cli.parser: option 'flags' must be a list of flags, got " .. describe(o.flags), 2)
  end
  local argparse = load_argparse()
  local script = rawget(_G, "arg") and arg[0]
  local usage = o.usage or (script and ("l2l " .. script)) or o.name
  local p = argparse(usage, o.description, o.epilog):add_help(false)
  p:help_max_width(100)
  -- argparse's own --help exits without closing the Lua state: C libraries' finalizers
  -- (cjson's buffers, l2l's tensors) would not run, and a leak checker would object
  p:flag("-h --help", "Show this help message and exit."):action(function()
    print(p:get_help())
    os.exit(0, true)
  end)
  program, usage_name = o.name, usage
  if o.data then
    add_flag(p, { "--data", nil, "list", "a file or folder of text to train on, read recursively (repeat for " ..
                  "more; default: the C headers under /usr/include)", meta = "FILE_OR_FOLDER" }, 0, 2)
    add_flag(p, { "--max-bytes", o.max_bytes or 4 * 2 ^ 20, "int", "read at most this many bytes of text",
                  min = 1024 }, 0, 2)
  end
  for i, f in ipairs(o.flags or {}) do add_flag(p, f, i, 2) end
  return p
end

----------------------------------------------------------------- the option table's flags

-- The kinds of flag a row of the option table makes (relay_options.ROWS).
local ROW_KINDS = { int = "int", int64 = "int", uint64 = "int", float = "number", choice = "choice",
                    bool = "flag", path = "string" }

-- cli.option_flags{skip = {name = true}, defaults = {name = value}} -> flags in cli.parser's
-- form, one for each option of the relay, its optimizer and its schedule in the option
-- table (src/core/options.def) but those in skip (a program's own flags for them): "--clip-
-- global-norm" for clip_global_norm, of the row's kind, bounds and choices, with its help.
-- A flag not given is nil in opt (the library's default, which its help shows) unless
-- defaults names a value.
function M.option_flags(o, ...)
  if select("#", ...) ~= 0 then too_many("cli.option_flags", "options", 2, ...) end
  o = argcheck.options(o or {}, { skip = true, defaults = true }, "cli.option_flags", 2)
  local skip, defaults = o.skip or {}, o.defaults or {}
  for key, v in pairs({ skip = skip, defaults = defaults }) do
    if type(v) ~= "table" then
      error(("cli.option_flags: option '%s' must be a table of options' names, got %s"):format(key, describe(v)), 2)
    end
  end
  local flags = {}
  for _, row in ipairs(require("l2l.option_table").ROWS) do
    if not skip[row.name] then
      local kind = ROW_KINDS[row.type]
      -- (not given: the library's default, which the help says)
      local given = defaults[row.name] ~= nil
      local default = not given and kind ~= "flag" and require("l2l.relay_options").default_text(row)
      local help = row.help
      if row.group == "relay" then
        help = ("%s (l2l.Relay's %s%s)"):format(help, row.name, default and "; default: " .. default or "")
      elseif default then
        help = ("%s (default: %s)"):format(help, default)
      end
      local f = { "--" .. row.name:gsub("_", "-"), defaults[row.name], kind, help }
      if kind == "int" or kind == "number" then
        f.min = math.max(row.min, -argcheck.EXACT_MAX)
        if row.max < argcheck.EXACT_MAX then f.max = row.max end
      end
      if kind == "choice" then f.choices = row.choices end
      if kind == "string" then f.meta = "DIR" end
      flags[#flags + 1] = f
    end
  end
  return flags
end

----------------------------------------------------------------- parsing

-- The value given to flag `name` in args (the last one), or nil.
local function value_of(name, args)
  local v
  for i, a in ipairs(args) do
    if a == name then v = args[i + 1] or v end
    if a:sub(1, #name + 1) == name .. "=" then v = a:sub(#name + 2) end
  end
  return v
end

-- argparse's "\nDid you mean '--steps'?" as argcheck's " (did you mean '--steps'?)"; a
-- near miss argparse does not see (two letters swapped far apart), and a choice that is
-- not one, found the way argcheck finds options.
local function hint(msg, p, args)
  msg = msg:gsub("\nDid you mean (.-)%?$", " (did you mean %1?)")
  local unknown = msg:match("^unknown option '([^']+)'$")
  if unknown then
    local known = {}
    for _, option in ipairs(p._options or {}) do
      for _, alias in ipairs(option._aliases or {}) do known[alias] = true end
    end
    local suggestion = argcheck.suggest(unknown, known)
    if suggestion then msg = msg .. (" (did you mean '%s'?)"):format(suggestion) end
  end
  local name, choices = msg:match("^argument for option '([^']+)' must be one of (.*)$")
  if name then
    local known = {}
    for c in choices:gmatch("'([^']*)'") do known[c] = true end
    local given = value_of(name, args)
    if given then
      msg = msg .. (", got '%s'"):format(given)
      local suggestion = argcheck.suggest(given, known)
      if suggestion then msg = msg .. (" (did you mean '%s'?)"):format(suggestion) end
    end
  end
  return msg
end

-- The flags of p that take a value ("--lr"), as a set.
local function valued_flags(p)
  local set = {}
  for _, option in ipairs(p._options or {}) do
    if option._maxargs ~= 0 then
      for _, alias in ipairs(option._aliases or {}) do set[alias] = true end
    end
  end
  return set
end

-- Which flags each parse saw on its command line (cli.given), by the table it returned.
local given_flags = setmetatable({}, { __mode = "k" })

function M.parse(p, args, ...)
  if select("#", ...) ~= 0 then too_many("cli.parse", "parser, args", 2, ...) end
  if type(p) ~= "table" or type(p.pparse) ~= "function" then
    error("cli.parse: parser must be an argparse parser (from cli.parser), got " .. describe(p), 2)
  end
  if args == nil then
    args = rawget(_G, "arg") or {}
  elseif type(args) ~= "table" then
    error("cli.parse: args must be a list of strings, got " .. describe(args), 2)
  end
  io.stdout:setvbuf("line")
  -- A negative number after a flag that takes a value is that value (`--lr -1`), not a
  -- flag: argparse reads any word starting with '-' as one. Joined as `--lr=-1`.
  local valued, joined, seen = valued_flags(p), {}, {}
  local i = 1
  while i <= #args do
    local a = args[i]
    local name = type(a) == "string" and a:match("^(%-%-?[^=]+)") or nil
    if valued[a] and type(args[i + 1]) == "string" and args[i + 1]:match("^%-%.?%d") then
      joined[#joined + 1] = a .. "=" .. args[i + 1]
      i = i + 1
    else
      joined[#joined + 1] = a
    end
    if name then seen[(name:gsub("^%-+", ""):gsub("%-", "_"))] = true end
    i = i + 1
  end
  local ok, result = p:pparse(joined)
  if ok then
    given_flags[result] = seen
    return result
  end
  M.usage_error(hint(tostring(result), p, joined))
end

-- cli.given(opt, name) -> whether the command line gave flag `name` (as in opt: "lr",
-- "max_bytes"), rather than its default.
function M.given(opt, name, ...)
  if select("#", ...) ~= 0 then too_many("cli.given", "opt, name", 2, ...) end
  local seen = given_flags[opt]
  if seen == nil then error("cli.given: opt must be a table cli.parse returned, got " .. describe(opt), 2) end
  if type(name) ~= "string" then error("cli.given: name must be a string, got " .. describe(name), 2) end
  return seen[name] == true
end

function M.usage_error(message, ...)
  if select("#", ...) ~= 0 then too_many("cli.usage_error", "message", 2, ...) end
  io.stdout:flush()
  io.stderr:write(("%s: %s\n(`%s --help` lists the flags)\n"):format(program, tostring(message), usage_name))
  os.exit(2, true)
end

----------------------------------------------------------------- the text

function M.corpus(opt, ...)
  if select("#", ...) ~= 0 then too_many("cli.corpus", "opt", 2, ...) end
  if type(opt) ~= "table" then error("cli.corpus: opt must be the table cli.parse returned, got " .. describe(opt), 2) end
  local text = require("l2l.text")
  local ok, corpus = pcall(text.corpus, opt.data, { max_bytes = opt.max_bytes })
  if ok then return corpus end
  M.usage_error("--data: " .. tostring(corpus):gsub("^.-text%.corpus: ", ""):gsub("^paths: ", ""))
end

function M.fail(message, ...)
  if select("#", ...) ~= 0 then too_many("cli.fail", "message", 2, ...) end
  io.stdout:flush()
  io.stderr:write(("%s: %s\n"):format(program, tostring(message)))
  os.exit(1, true)
end

----------------------------------------------------------------- stop signals (Ctrl-C, SIGTERM, SIGUSR1)

local Stop = {}
Stop.__index = Stop

-- The stop signals: the module's names, and how messages name them.
local SIGNALS = { "INT", "TERM", "USR1" }
local SHOWN = { INT = "Ctrl-C", TERM = "SIGTERM", USR1 = "SIGUSR1" }

-- The l2l executable's module; nil in plain luajit (or any other host).
local function stop_signals()
  local ok, mod = pcall(require, "l2l.stop_signals")
  return ok and mod or nil
end

local function stop_of(self, fname)
  if getmetatable(self) ~= Stop then error(fname .. ": self must be what cli.interrupt returned", 3) end
end

local function stderr_is_terminal()
  local ok, ffi = pcall(require, "ffi")
  if not ok then return false end
  pcall(ffi.cdef, "int isatty(int fd);")
  local ok2, r = pcall(function() return ffi.C.isatty(2) end)
  return ok2 and r == 1
end

local INTERRUPT = { message = true, dist = true }

function M.interrupt(options, ...)
  if select("#", ...) ~= 0 then too_many("cli.interrupt", "options", 2, ...) end
  if type(options) == "string" then options = { message = options } end
  if options ~= nil and type(options) ~= "table" then
    error("cli.interrupt: the argument must be a message (a string) or an options table, got " .. describe(options), 2)
  end
  options = options or {}
  argcheck.fields(options, INTERRUPT, "cli.interrupt", 2, "options")
  local message, dist = options.message, options.dist
  if message ~= nil and type(message) ~= "string" then
    error("cli.interrupt: message must be a string, got " .. describe(message), 2)
  end
  if dist ~= nil and dist ~= "mpi" and dist ~= "none" then
    error("cli.interrupt: dist must be 'mpi' or 'none', got " .. describe(dist), 2)
  end
  local self = setmetatable({ mod = stop_signals(), caught = false, dist = dist == "mpi", agreed = nil,
                              quiet = false, lead = stderr_is_terminal() and "\n" or "" }, Stop)
  if self.dist then   -- under mpirun only rank 0 speaks
    local ok, rank = pcall(require("l2l.dist").rank)
    if not ok then error("cli.interrupt: dist = 'mpi': " .. tostring(rank), 2) end
    self.quiet = rank ~= 0
  end
  -- on a terminal the ^C the terminal echoes, or a progress line, is where the cursor was:
  -- a new line first
  local texts = {}
  for i, name in ipairs(SIGNALS) do
    local again = name == "INT" and "Ctrl-C again" or "a second signal"
    texts[i] = self.quiet and "" or self.lead .. (message or ("%s: %s: stopping after this step (%s stops at once)"):format(
      program, SHOWN[name], again)) .. "\n"
  end
  if self.mod then self.caught = self.mod.catch(texts[1], texts[2], texts[3]) end
  return self
end

-- This process's first stop signal ("INT", "TERM", "USR1"), or nil.
local function own_signal(self)
  return self.caught and self.mod.first() or nil
end

function Stop:requested(...)
  if select("#", ...) ~= 0 then too_many("stop:requested", "", 2, ...) end
  stop_of(self, "stop:requested")
  if self.agreed then return true end
  local mine = own_signal(self)
  if not self.dist then return mine ~= nil end
  -- which stop signals reached any rank (a collective): the same answer on every rank
  local reached = {}
  for i, name in ipairs(SIGNALS) do reached[i] = mine == name and 1 or 0 end
  reached = require("l2l.dist").sum(reached)
  for i, name in ipairs(SIGNALS) do
    if reached[i] > 0 and not self.agreed then
      self.agreed = mine or name   -- (a rank that got none ends as by the first of the list that came)
      if not mine and not self.quiet then
        io.stderr:write(("%s%s: %s on %d other rank%s: stopping after this step\n"):format(
          self.lead, program, SHOWN[name], reached[i], reached[i] == 1 and "" or "s"))
      end
    end
  end
  return self.agreed ~= nil
end

function Stop:signal(...)
  if select("#", ...) ~= 0 then too_many("stop:signal", "", 2, ...) end
  stop_of(self, "stop:signal")
  local name = self.agreed or own_signal(self)
  return name and SHOWN[name] or nil
end

function Stop:release(...)
  if select("#", ...) ~= 0 then too_many("stop:release", "", 2, ...) end
  stop_of(self, "stop:release")
  if self.caught then self.mod.release() end
end

function Stop:finish(...)
  if select("#", ...) ~= 0 then too_many("stop:finish", "", 2, ...) end
  stop_of(self, "stop:finish")
  local name = self.agreed or own_signal(self)
  if self.caught then self.mod.release() end
  self.caught = false
  if not name then return end
  io.stdout:flush()
  io.stderr:flush()
  if self.mod then self.mod.die(name) end   -- returns only where the signal is handled by someone else (the REPL's Ctrl-C)
  error(("interrupted (%s)"):format(SHOWN[name]), 2)
end

return M
