-- SPDX-License-Identifier: MIT
-- executable_spec — the three ways the README says to run l2l: the l2l executable
-- (scripts, -e, stdin, errors), plain luajit (with the static-TLS workaround, and a clear
-- error without it), and a C program linking libl2l.
local support = dofile("spec/support.lua")
local sh, build = support.sh, support.build
local sanitized = os.getenv("L2L_SANITIZE") == "1"

local write_temp = support.write_temp

describe("the l2l executable", function()
  local exe = build .. "/l2l"

  it("runs a script with its arguments in arg and ...", function()
    local script = write_temp([[
      local a, b = ...
      print(arg[0] ~= nil, arg[1], arg[2], a, b, #arg)
      local l2l = require("l2l")
      print(l2l.library, l2l.ones({ 3 }):numel())
    ]])
    local status, out = sh(("%s %s first 'sec ond'"):format(exe, script))
    os.remove(script)
    assert.are.equal(0, status, out)
    assert.are.equal("true\tfirst\tsec ond\tfirst\tsec ond\t2\n(linked in)\t3\n", out)
  end)

  it("runs -e code, and standard input", function()
    local status, out = sh(exe .. [[ -e 'print(require("l2l").version)']])
    assert.are.equal(0, status, out)
    assert.is_truthy(out:match("^%d+%.%d+%.%d+\n$"), out)
    -- -e code finds `l2l` loaded, as the REPL does; a script does not get the global
    status, out = sh(exe .. [[ -e 'print(l2l.version == require("l2l").version, l2l.ones({ 2 }):numel())']])
    assert.are.equal(0, status, out)
    assert.are.equal("true\t2\n", out)
    local script = write_temp("print(rawget(_G, 'l2l'))\n")
    status, out = sh(exe .. " " .. script)
    os.remove(script)
    assert.are.equal(0, status, out)
    assert.are.equal("nil\n", out)
    status, out = sh("echo 'print(6 * 7)' | " .. exe .. " -")
    assert.are.equal(0, status, out)
    assert.are.equal("42\n", out)
  end)

  it("reports a Lua error with a traceback and exits 1", function()
    local status, out = sh(exe .. [[ -e 'require("l2l").zeros({0})']])
    assert.are.equal(1, status)
    assert.is_truthy(out:find("l2l: (command line):1: l2l.zeros: shape[1] must be an integer >= 1, got 0",
                              1, true), out)
    assert.is_truthy(out:find("stack traceback", 1, true), out)
    status, out = sh(exe .. " /nonexistent/script.lua")
    assert.are.equal(1, status)
    assert.is_truthy(out:find("cannot open /nonexistent/script.lua", 1, true), out)
    status, out = sh(exe .. " -x")
    assert.are.equal(1, status)
    assert.is_truthy(out:find("bad option -x", 1, true), out)
    status, out = sh(exe .. " -e")
    assert.are.equal(1, status)
    assert.is_truthy(out:find("l2l: -e needs Lua code after it", 1, true), out)
    -- a word that is no file and looks like none: a command mistyped, the commands named
    -- a script with no '.' in its name still runs, as does one after --
    local named = support.tmpdir()
    support.write_file(named .. "/myscript", "print(6 * 7)\n")
    local abs = support.q(exe:sub(1, 1) == "/" and exe or support.root .. "/" .. exe)
    status, out = sh(("cd %s && %s myscript && %s -- myscript"):format(support.q(named), abs, abs))
    sh("rm -rf " .. support.q(named))
    assert.are.equal(0, status, out)
    assert.are.equal("42\n42\n", out)
    status, out = sh(exe .. " trian --steps 2")
    assert.are.equal(1, status)
    assert.is_truthy(out:find("l2l: trian is neither a file nor a command; the commands are train, plot, sample and eval", 1, true), out)
  end)

  it("keeps going after an error at the interactive prompt's line reader", function()
    -- Standard input that is not a terminal runs as a script; the prompt itself is
    -- exercised by the REPL's own spec (libedit) in a later issue.
    local status, out = sh("printf 'print(1)\\nerror(\"boom\")\\n' | " .. exe)
    assert.are.equal(1, status)
    assert.is_truthy(out:find("1\n", 1, true) and out:find("boom", 1, true), out)
  end)
end)

describe("l2l plot", function()
  local exe = build .. "/l2l"
  local dir
  before_each(function()
    dir = support.tmpdir()
    -- a run whose losses stay far from 0 (between 2.1 and 3.4), as examples/train_gpt.lua logs them
    local lines = { '{"step":0,"loss":null,"val_loss":3.4,"device_peak":1048576,"host_bytes":4194304,"device_budget":2097152}' }
    for step = 1, 20 do
      lines[#lines + 1] = ('{"step":%d,"loss":%.3f,"val_loss":%s,"device_peak":1048576,"host_bytes":4194304,' ..
                           '"device_budget":2097152}'):format(step, 3.3 - step * 0.06, step % 5 == 0 and "2.9" or "null")
    end
    support.write_file(dir .. "/metrics.jsonl", table.concat(lines, "\n") .. "\n")
  end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  -- The y tick labels of the SVG's panel p, in order.
  local function y_ticks(svg, p)
    local panel = svg:match('<g class="panel" id="panel' .. p .. '">(.-)\n</g>')
    local ticks = {}
    for v in (panel or ""):gmatch('text%-anchor="end">([^<]*)</text>') do ticks[#ticks + 1] = tonumber(v) end
    return ticks
  end

  it("redraws the curves from a metrics log; the loss axis starts near the losses, memory at 0", function()
    local status, out = sh(("%s plot %s/metrics.jsonl %s/again.svg"):format(exe, dir, dir))
    assert.are.equal(0, status, out)
    assert.are.equal(("picture: %s/again.svg (21 records)\n"):format(dir), out)
    local svg = support.read_file(dir .. "/again.svg")
    assert.is_truthy(svg and svg:find("</svg>\n$"), svg)
    assert.is_truthy(svg:find(">" .. dir .. "/metrics.jsonl</text>", 1, true), "the file's name as the title")
    local loss, memory = y_ticks(svg, 1), y_ticks(svg, 2)
    assert.is_true(#loss >= 3, svg)
    assert.is_true(loss[1] >= 1.5 and loss[1] <= 2.1, "the loss axis starts at " .. tostring(loss[1]))
    assert.is_true(loss[#loss] >= 3.4 and loss[#loss] < 4, "the loss axis ends at " .. tostring(loss[#loss]))
    assert.are.equal(0, memory[1], svg)
    -- without OUT: the demo's picture beside the metrics (an SVG: gnuplot is not installed,
    -- or a PNG where it is)
    status, out = sh(("%s plot %s/metrics.jsonl --title 'run 1'"):format(exe, dir))
    assert.are.equal(0, status, out)
    local path = out:match("^picture: (%S+)")
    assert.is_truthy(path == dir .. "/curves.svg" or path == dir .. "/curves.png", out)
    assert.is_truthy(support.read_file(path), out)
  end)

  it("answers --help, and says what is wrong with its arguments", function()
    local status, out = sh(exe .. " plot --help")
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("^Usage: l2l plot "), out)
    for _, case in ipairs({
      { "", 2, "l2l plot: missing argument 'metrics'" },
      { dir .. "/none.jsonl", 1, "l2l plot: cannot read " .. dir .. "/none.jsonl: No such file" },
      { dir .. "/metrics.jsonl " .. dir .. "/out.pdf", 1, "l2l plot: OUT must end in .svg or .png, got '" },
      { dir .. "/metrics.jsonl --titel x", 2, "unknown option '--titel' (did you mean '--title'?)" },
    }) do
      status, out = sh(exe .. " plot " .. case[1])
      assert.are.equal(case[2], status, case[1] .. ": " .. out)
      assert.is_truthy(out:find(case[3], 1, true), case[1] .. ": " .. out)
    end
    support.write_file(dir .. "/bad.jsonl", '{"step":1,"loss":2}\nnot json\n')
    status, out = sh(("%s plot %s/bad.jsonl"):format(exe, dir))
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find(dir .. "/bad.jsonl:2 is not a JSON object", 1, true), out)
    if not require("l2l.plot").have_gnuplot() then
      status, out = sh(("%s plot %s/metrics.jsonl %s/out.png"):format(exe, dir, dir))
      assert.are.equal(1, status, out)
      assert.is_truthy(out:find("gnuplot is not installed", 1, true), out)
    end
  end)
end)

describe("plain luajit", function()
  local lua_path = ("LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;'"):format(support.root, support.root)
  local code = [[-e 'local l2l = require("l2l"); print(l2l.library:match("libl2l.so") ~= nil, l2l.ones({2, 2}):numel())']]

  it("explains the static TLS limit when jemalloc cannot be loaded", function()
    if sanitized then
      pending("an AddressSanitizer build of libl2l cannot be loaded into plain luajit")
      return
    end
    local status, out = sh(("cd /tmp && env -u GLIBC_TUNABLES -u LD_PRELOAD %s luajit %s"):format(lua_path, code))
    assert.are_not.equal(0, status)
    assert.is_truthy(out:find("cannot allocate memory in static TLS block", 1, true), out)
    assert.is_truthy(out:find("GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 luajit", 1, true), out)
  end)

  it("loads libl2l with the glibc tunable or with LD_PRELOAD", function()
    if sanitized then
      pending("an AddressSanitizer build of libl2l cannot be loaded into plain luajit")
      return
    end
    for _, env in ipairs({ "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536",
                           "LD_PRELOAD=libjemalloc.so.2" }) do
      local status, out = sh(("cd /tmp && %s %s luajit %s"):format(env, lua_path, code))
      assert.are.equal(0, status, env .. ": " .. out)
      assert.are.equal("true\t4\n", out)
    end
  end)
end)

describe("a C program linking libl2l", function()
  it("builds tensors, runs an op and gets refusals as messages", function()
    local status, out = sh(build .. "/hello")
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("c = [[1, 4], [3, 10]]", 1, true), out)
    assert.is_truthy(out:match("host pool: %d+ bytes in use"), out)
    assert.is_truthy(out:find("refused: l2l_gemm: inner dims differ", 1, true), out)
    -- cuDNN opened (a C++ library) in a program that did not link jemalloc itself: once
    -- aborted ("free(): invalid pointer"), libl2l's jemalloc lending C++ its operator new
    -- beside glibc's free
    assert.is_truthy(out:find("\ncuDNN: [^\n]+\n$"), out)
  end)
end)
