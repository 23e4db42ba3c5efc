-- SPDX-License-Identifier: MIT
-- repl_spec — the l2l executable's interactive prompt (src/runner/main.c, lua/l2l/repl.lua), used
-- as a person would: through a pipe with `l2l -i` (build a model, train it, print it,
-- insert a layer, train again, make mistakes and carry on), and through a pseudo-terminal
-- with `script` from util-linux, where libedit edits lines, completes names, keeps the
-- history in a file and Ctrl-C stops what runs without ending the session.
local support = dofile("spec/support.lua")
local sh, build = support.sh, support.build
local exe = build .. "/l2l"

local write_temp = support.write_temp

local slurp = support.read_file

-- Runs `l2l -i <args>` on the lines through a pipe; returns the exit status, standard
-- output (the values and what the session printed) and standard error (banner, prompts,
-- errors).
local function session(lines, args)
  local input = write_temp(table.concat(lines, "\n") .. "\n")
  local out, err = os.tmpname(), os.tmpname()
  local status = sh(("%s -i %s < %s > %s 2> %s"):format(exe, args or "", input, out, err))
  local o, e = slurp(out), slurp(err)
  os.remove(input); os.remove(out); os.remove(err)
  return status, o, e
end

local function lines_of(text)
  local t = {}
  for line in text:gmatch("([^\n]*)\n") do t[#t + 1] = line end
  return t
end

-- The rows of print(model): { {index, kind, params}, ... } and the header's totals.
local function model_table(text)
  local n, total = text:match("Sequential: (%d+) layers, (%d+) parameters")
  local rows = {}
  for _, line in ipairs(lines_of(text)) do
    -- columns are two or more spaces apart; the shape has single spaces inside
    local i, kind, params = line:match("^%s+(%d+)%s%s+(%S+)%s%s+.-%s%s+(%d+)%s")
    if i then rows[#rows + 1] = { tonumber(i), kind, tonumber(params) } end
  end
  return tonumber(n), tonumber(total), rows
end

describe("l2l -i through a pipe", function()
  local model_session = {
    'model = l2l.Sequential{ l2l.Embedding{ vocab = 8, dim = 16, max_seq = 6 }, '
      .. 'l2l.Block{ dim = 16, heads = 2, causal = true }, l2l.LMHead{ vocab = 8, dim = 16, tie = true } }',
    'run = l2l.Relay{ model = model, micro_batch = 2, optimizer = l2l.AdamW{ lr = 1e-2 }, seed = 1 }',
    'tok, tgt = l2l.zeros({ 4, 6 }, { dtype = "i32" }), l2l.zeros({ 4, 6 }, { dtype = "i32" })',
    -- learn to count: the next token is (t + 1) mod 8
    'for b = 1, 4 do for s = 1, 6 do tok:set(b, s, (b + s) % 8); tgt:set(b, s, (b + s + 1) % 8) end end',
    'for step = 1, 3 do',
    '  print(("step %d loss %.4f"):format(step,',
    '    run:step(tok, tgt)))',
    'end',
    '"== print(model)"',
    'print(model)',
    '"== insert"',
    'model:insert(3, l2l.Block{ dim = 16, heads = 2, causal = true })',
    '"== model"',
    'model',
    '"== after insert"',
    'run:step(tok, tgt)',
    '1+1',
    'error("boom")',
    'nil_function()',
    '"still here"',
    'l2l.tensor{ { 1, 2 }, { 3, 4 } }',
    'run',
    '"== end"',
  }

  local status, out, err
  setup(function() status, out, err = session(model_session) end)

  it("ends with status 0 at the end of input, errors in entries or not", function()
    assert.are.equal(0, status, (out or "") .. (err or ""))
    assert.is_truthy(err:find("l2l %d+%.%d+%.%d+ %(LuaJIT"), err)
  end)

  it("trains a model typed over several lines and prints the losses", function()
    local losses = {}
    for step, loss in out:gmatch("step (%d) loss (%d+%.%d+)\n") do losses[tonumber(step)] = tonumber(loss) end
    assert.are.equal(3, #losses, out)
    assert.is_true(losses[3] < losses[1], out)   -- the same batch three times: the loss goes down
    assert.is_truthy(err:find("> >> >> >> ", 1, true), err)   -- the `for` took three more lines
  end)

  it("prints the model as a table of layers, and again after an insertion", function()
    local before = out:match("== print%(model%)\n(.-)== insert\n")
    assert.is_truthy(before, out)
    local n, total, rows = model_table(before)
    assert.are.equal(3, n, before)
    assert.are.same({ 1, "embedding" }, { rows[1][1], rows[1][2] })
    assert.are.same({ 2, "block" }, { rows[2][1], rows[2][2] })
    assert.are.same({ 3, "lm_head" }, { rows[3][1], rows[3][2] })
    -- the head's row counts the embedding table it is tied to; the total counts it once
    assert.are.equal(total + 8 * 16, rows[1][3] + rows[2][3] + rows[3][3], before)
    for _, column in ipairs({ "kind", "shape", "params", "frozen", "memory" }) do
      assert.is_truthy(before:find(column, 1, true), before)
    end
    assert.is_truthy(before:find("(tied)", 1, true), before)

    -- `model` as an expression prints the same table, now with four layers
    local after = out:match("== model\n(.-)== after insert")
    assert.is_truthy(after, out)
    local n2, total2, rows2 = model_table(after)
    assert.are.equal(4, n2, after)
    assert.are.same({ "embedding", "block", "block", "lm_head" },
                    { rows2[1][2], rows2[2][2], rows2[3][2], rows2[4][2] })
    assert.are.equal(total + rows2[3][3], total2, after)
  end)

  it("trains again after the insertion and prints the loss as a number", function()
    local loss = out:match("== after insert\n([^\n]*)\n")
    assert.is_truthy(tonumber(loss), out)
    assert.is_true(tonumber(loss) > 0 and tonumber(loss) < 10, loss)
  end)

  it("prints values, reports errors with their line and goes on", function()
    local after = out:match("== after insert\n[^\n]*\n(.*)$")
    assert.is_truthy(after, out)
    local l = lines_of(after)
    assert.are.equal("2", l[1])
    assert.are.equal("still here", l[2])   -- the two errors did not end the session
    assert.are.equal("tensor f32 (2,2) host", l[3])
    assert.are.equal("[[1, 2],", l[4])
    assert.are.equal(" [3, 4]]", l[5])
    assert.is_truthy(l[6]:find("^l2l%.Relay over Sequential: 4 layers, %d+ parameters; 4 steps$"), l[6])
    assert.are.equal("== end", l[7])
    assert.is_truthy(err:find("l2l: stdin:1: boom\nstack traceback:", 1, true), err)
    assert.is_truthy(err:find("l2l: stdin:1: attempt to call global 'nil_function' (a nil value)", 1, true), err)
  end)
end)

describe("the prompt's values", function()
  it("prints several values tab-separated, nil as nil, nothing for a statement", function()
    local status, out, err = session({
      '1, nil, "s", true', 'x = 5', 'x', '=x + 1', 'nil', 'print("p")', '2^40', '0.5', '"a\\tb"', '-- a comment',
      '', 'local y = 3', 'y', '1 +', '2', 'x *', '', '3',
    })
    assert.are.equal(0, status, err)
    -- an expression cut short (`1 +`) continues on the next lines, blank ones too
    assert.are.equal("1\tnil\ts\ttrue\n5\n6\nnil\np\n1099511627776\n0.5\na\tb\nnil\n3\n15\n", out)
  end)

  it("lists tables: array part, then the other keys sorted; nested, shortened, cut", function()
    local status, out, err = session({
      '{ b = 2, a = "x", 1, 2, [10] = true, ["end"] = 0, t = { 1, { deep = 1 } }, e = {} }',
      '{}',
      's = {} s.self = s',
      's',
      'big = {} for i = 1, 100 do big[("k%03d"):format(i)] = i end',
      'big',
      '{ ("x"):rep(100) }',
      '{ l2l.ones({ 2 }), f = print }',
    })
    assert.are.equal(0, status, err)
    local l = lines_of(out)
    assert.are.equal('{ 1, 2, [10] = true, a = "x", b = 2, e = {}, ["end"] = 0, t = { 1, {...} } }', l[1])
    assert.are.equal("{}", l[2])
    assert.are.equal("{ self = {...} }", l[3])
    -- a long listing: one entry per line, 30 of them, then how many more
    assert.are.equal("{", l[4])
    assert.are.equal("  k001 = 1,", l[5])
    assert.are.equal("  k030 = 30,", l[34])
    assert.are.equal("  ... (70 more)", l[35])
    assert.are.equal("}", l[36])
    assert.are.equal('{ "' .. ("x"):rep(60) .. '"... }', l[37])
    assert.is_truthy(l[38]:find('^{ tensor f32 %(2%) host %.%.%., f = builtin: ') or
                     l[38]:find('^{ tensor f32 %(2%) host %.%.%., f = function: '), l[38])
    assert.are.equal(38, #l, out)
  end)
end)

describe("the prompt's input", function()
  it("keeps stdout and stderr in order when both go to one pipe", function()
    local input = write_temp('print("first")\nerror("second")\nprint("third")\n')
    local status, both = sh(("%s -i < %s"):format(exe, input))
    os.remove(input)
    assert.are.equal(0, status, both)
    local a, b, c = both:find("first", 1, true), both:find("second", 1, true), both:find("third", 1, true)
    assert.is_truthy(a and b and c, both)
    assert.is_true(a < b and b < c, both)
  end)

  it("reports an entry that the input ended in the middle of", function()
    local status, out, err = session({ 'for i = 1, 2 do', '  print(i)' })
    assert.are.equal(0, status, err)
    assert.are.equal("", out)
    assert.is_truthy(err:find("l2l: stdin:2: 'end' expected (to close 'for' at line 1) near '<eof>'", 1, true), err)
  end)

  it("runs -e code and a script first; their globals are there, a failure sets the status", function()
    local script = write_temp("answer = 6 * 7\n")
    local status, out, err = session({ "answer", "early" }, "-e 'early = 1' " .. script)
    assert.are.equal(0, status, err)
    assert.are.equal("42\n1\n", out)
    status, out, err = session({ "early", '"alive"' }, [[-e 'early = 2; error("failed early")']])
    os.remove(script)
    assert.are.equal(1, status, err)   -- the REPL came, and the status still says -e failed
    assert.are.equal("2\nalive\n", out)
    assert.is_truthy(err:find("failed early", 1, true), err)
  end)

  it("still works as plain LuaJIT when lua/ is not found, and says so", function()
    local input = write_temp("1 + 1\n{ 1 }\n")
    local out = os.tmpname()
    local status, err = sh(("L2L_LUA_DIR=/nonexistent %s -i < %s > %s"):format(exe, input, out))
    local printed = slurp(out)
    os.remove(input); os.remove(out)
    assert.are.equal(0, status, err)
    assert.is_truthy(printed:find("^2\ntable: "), printed)   -- plain print: no listing
    assert.is_truthy(err:find("l2l: module 'l2l' not found; is L2L_LUA_DIR", 1, true), err)
  end)

  it("documents -i, and without it a piped standard input is still a script", function()
    local status, out = sh(exe .. " -h")
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("\n  -i ", 1, true), out)
    status, out = sh("echo '1+1' | " .. exe)   -- not a statement: a script's syntax error
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("syntax error", 1, true) or out:find("unexpected symbol", 1, true), out)
  end)
end)

describe("l2l in a terminal (a pseudo-terminal from script)", function()
  -- `script` may be missing, or there may be no pseudo-terminals to open (a container
  -- without /dev/pts): the part below then shows as pending, with the reason
  local has_script = sh("script -qec true /dev/null < /dev/null") == 0
  local why = "`script` (util-linux) is missing or cannot open a pseudo-terminal: the terminal part is not run"

  -- Keys are typed when the screen shows what they need, never after a guessed delay: a
  -- busy or sanitized l2l may take seconds to start or to read a line. { shows = text }
  -- waits until the screen holds `text`: the first prompt (START: a Ctrl-C typed before
  -- the REPL is up kills l2l, and keys typed before libedit runs are echoed twice), or a
  -- line's echo before a Ctrl-C meant for it, or what an entry prints once it runs
  -- before the Ctrl-C that must stop it (a Ctrl-C still in the terminal's queue behind
  -- an unread line would clear the prompt and leave that line to run). The pauses
  -- between plain lines only pace the typing: the terminal keeps keys in order.
  local START = { shows = "> " }

  -- Types the keys (a string: printf escapes; a number: a pause of that many seconds; a
  -- table: a wait, above) into `l2l` on a pseudo-terminal, with L2L_HISTORY unset and
  -- then the `env` assignments; returns the exit status and what the terminal showed. A
  -- wait gives up after a minute, when timeout(1) ends l2l anyway.
  local function terminal(keys, env)
    local screen = os.tmpname()
    local feed = {}
    for _, k in ipairs(keys) do
      if type(k) == "number" then
        feed[#feed + 1] = ("sleep %g"):format(k)
      elseif type(k) == "table" then
        assert(not k.shows:find("'", 1, true), "a wait's text has no quote")
        feed[#feed + 1] = ("n=0; until grep -qF -- '%s' '%s' || [ $n -ge 1200 ]; do sleep 0.05; n=$((n+1)); done")
                          :format(k.shows, screen)
      else
        feed[#feed + 1] = ("printf '%s'"):format(k)
      end
    end
    -- `exec`: script runs the command through $SHELL, and a shell left waiting (dash does
    -- not exec a lone command) takes the Ctrl-C too and dies of it, exit status 130; -f
    -- writes the screen's file as it goes, for the waits
    local cmd = ("(%s) | env -u L2L_HISTORY TERM=xterm SHELL=/bin/sh %s timeout 60 script -qfec 'exec %s' '%s' >/dev/null; " ..
                 "status=$?; cat '%s'; exit $status"):format(table.concat(feed, "; "), env or "", exe, screen, screen)
    local status, out = sh(cmd)
    os.remove(screen)
    -- the file's first and last lines are script's own ("Script started on ...")
    out = out:gsub("^Script started[^\n]*\n", ""):gsub("\nScript done[^\n]*\n?$", "\n")
    return status, out
  end

  it("edits lines with libedit, completes names and keeps the history in a file", function()
    if not has_script then
      pending(why)
      return
    end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0)
    local hist = dir .. "/history"
    local status, screen = terminal({
      START, "1+1\\n", 0.3,
      "for i = 1, 2 do\\n", 0.2, "print(i * 10) end\\n", 0.3,
      "l2l.Seq\\t{}\\n", 0.5,                          -- Tab completes l2l.Sequential
      "\"wrong\"\\001\"left\" .. \\n", 0.3,              -- Ctrl-A: to the start of the line
      "\"marker\" .. 40 + 2\\n", 0.3, "\\004",
    }, "L2L_HISTORY=" .. hist)
    assert.are.equal(0, status, screen)
    assert.is_truthy(screen:find("\n2\r\n", 1, true), screen)
    assert.is_truthy(screen:find("10\r\n20\r\n", 1, true), screen)
    assert.is_truthy(screen:find(">> ", 1, true), screen)
    assert.is_truthy(screen:find("Sequential: 0 layers, 0 parameters", 1, true), screen)
    assert.is_truthy(screen:find("leftwrong", 1, true), screen)
    assert.is_truthy(screen:find("marker42", 1, true), screen)
    local saved = slurp(hist)
    assert.is_truthy(saved and saved:find("1+1\n", 1, true), saved)
    assert.is_truthy(saved:find("l2l.Sequential{}", 1, true), saved)

    -- a new session finds the last entry with the up arrow
    status, screen = terminal({ START, "\\033[A\\n", 0.5, "\\004" }, "L2L_HISTORY=" .. hist)
    assert.are.equal(0, status, screen)
    local _, count = screen:gsub("marker42", "")
    assert.are.equal(1, count, screen)
    os.execute("rm -rf " .. dir)
  end)

  it("survives Ctrl-C at the prompt and stops running code with it", function()
    if not has_script then
      pending(why)
      return
    end
    local status, screen = terminal({
      START, "half a line", { shows = "half a line" }, "\\003", 0.3, "\"after ^C\"\\n", 0.3,
      "n = 0 io.write(\"spin\" .. \"ning\\\\n\") while true do n = n + 1 os.time() end\\n", { shows = "spinning" },
      "\\003", 0.5, "n > 0\\n", 0.3, "\\004",
    }, "L2L_HISTORY=")
    assert.are.equal(0, status, screen)
    assert.is_truthy(screen:find("after ^C\r\n", 1, true), screen)
    assert.is_falsy(screen:find("half a line\"after", 1, true), screen)
    assert.is_truthy(screen:find("interrupted (Ctrl-C)", 1, true), screen)
    assert.is_truthy(screen:find("true\r\n", 1, true), screen)
  end)

  it("stops train_gpt's sample with Ctrl-C, and goes on", function()
    if not has_script then
      pending(why)
      return
    end
    -- the training done and written, the sample (long here) is what Ctrl-C stops; the
    -- program must let the REPL's "interrupted" through, not end the session as a failure
    local out = os.tmpname()
    os.remove(out)
    local status, screen = terminal({
      START, ("arg = { [0] = \"train_gpt\", \"--steps\", \"2\", \"--layers\", \"1\", \"--dim\", \"32\", \"--heads\", " ..
              "\"2\", \"--seq\", \"32\", \"--batch\", \"4\", \"--eval-batches\", \"1\", \"--max-bytes\", \"100000\", " ..
              "\"--plot\", \"none\", \"--sample\", \"100000000\", \"--out\", \"%s\" } dofile(\"examples/train_gpt.lua\")\n"):format(out),
      { shows = "metrics: " }, 0.5, "\003", { shows = "interrupted (Ctrl-C)" }, "\"after \" .. 6 * 7\n", 0.3, "\004",
    }, "L2L_HISTORY=")
    os.execute("rm -rf '" .. out .. "'")
    assert.are.equal(0, status, screen)
    assert.is_truthy(screen:find("interrupted (Ctrl-C)", 1, true), screen)
    assert.is_falsy(screen:find("train_gpt: sample:", 1, true), screen)
    assert.is_truthy(screen:find("after 42\r\n", 1, true), screen)
  end)

  it("stops a pure-Lua loop (one LuaJIT would compile) with the first Ctrl-C, and goes on", function()
    if not has_script then
      pending(why)
      return
    end
    -- each loop first prints a word its echo does not show ("loop" .. "ing 1"), and the
    -- Ctrl-C comes once the screen shows it
    local status, screen = terminal({
      START, "io.write(\"loop\" .. \"ing 1\\\\n\") while true do end\n", { shows = "looping 1" }, "\003", 0.5,
      "\"first \" .. 6 * 7\n", 0.3,
      "function spin() io.write(\"loop\" .. \"ing 2\\\\n\") local n = 0 while true do n = n + 1 end end\n", 0.2,
      "spin()\n", { shows = "looping 2" }, "\003", 0.5, "\"second \" .. 7 * 8\n", 0.3,
      -- a training loop's Ctrl-C handling left in place by an entry is put back after it
      "stop = require(\"l2l.cli\").interrupt()\n", 0.3,
      "io.write(\"loop\" .. \"ing 3\\\\n\") while true do end\n", { shows = "looping 3" }, "\003", 0.5,
      "\"third \" .. 8 * 9\n", 0.3, "\004",
    }, "L2L_HISTORY=")
    assert.are.equal(0, status, screen)
    local _, stops = screen:gsub("interrupted %(Ctrl%-C%)", "")
    assert.are.equal(3, stops, screen)
    assert.is_truthy(screen:find("in function 'spin'", 1, true), screen)
    for _, want in ipairs({ "first 42\r\n", "second 56\r\n", "third 72\r\n" }) do
      assert.is_truthy(screen:find(want, 1, true), want .. " missing from\n" .. screen)
    end
  end)

  it("goes on when the history file cannot be read or written", function()
    if not has_script then
      pending(why)
      return
    end
    local home = os.tmpname()
    os.remove(home)
    assert(os.execute("mkdir -p " .. home) == 0)
    for _, case in ipairs({
      { env = "L2L_HISTORY=/nonexistent/dir/history", says = "cannot write the history file /nonexistent/dir/history" },
      { env = "L2L_HISTORY=" .. home, says = "cannot read the history file " .. home },   -- a folder
    }) do
      local status, screen = terminal({ START, "6 * 7\\n", 0.3, "7 * 8\\n", 0.3, "\\004" }, case.env)
      assert.are.equal(0, status, screen)
      assert.is_truthy(screen:find(case.says, 1, true), screen)
      local _, warnings = screen:gsub("history will not be saved", "")
      assert.are.equal(1, warnings, screen)   -- said once, not at every line
      assert.is_truthy(screen:find("42\r\n", 1, true) and screen:find("56\r\n", 1, true), screen)
    end
    -- an empty L2L_HISTORY keeps none; without it, ~/.l2l_history
    local status, screen = terminal({ START, "1\\n", 0.3, "\\004" }, ("HOME=%s L2L_HISTORY="):format(home))
    assert.are.equal(0, status, screen)
    assert.is_nil(slurp(home .. "/.l2l_history"))
    status, screen = terminal({ START, "1\\n", 0.3, "\\004" }, "HOME=" .. home)
    assert.are.equal(0, status, screen)
    assert.is_truthy((slurp(home .. "/.l2l_history") or ""):find("\n1\n", 1, true), screen)
    os.execute("rm -rf " .. home)
  end)
end)
