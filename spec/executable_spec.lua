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
  end)

  it("keeps going after an error at the interactive prompt's line reader", function()
    -- Standard input that is not a terminal runs as a script; the prompt itself is
    -- exercised by the REPL's own spec (libedit) in a later issue.
    local status, out = sh("printf 'print(1)\\nerror(\"boom\")\\n' | " .. exe)
    assert.are.equal(1, status)
    assert.is_truthy(out:find("1\n", 1, true) and out:find("boom", 1, true), out)
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
  end)
end)
