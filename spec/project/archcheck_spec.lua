-- SPDX-License-Identifier: MIT
-- archcheck_spec — scripts/archcheck passes on this tree, and fails, naming the file and
-- the line, on each kind of breach added to a copy of it: an include pointing upward, a
-- part reached past its interface, an include cycle between folders, a require cycle
-- between Lua modules, CUDA named above the backend, a source file over 800 lines in any
-- folder of code (include/, src/, lua/, kernels/, spec/c/, scripts/); and, over the build's
-- objects, a call that crosses the parts' arrows the wrong way (an object compiled into a
-- copy of them); a spec outside the folders that mirror the code.
local support = dofile("spec/support.lua")
local sh, build = support.sh, support.build

-- archcheck runs under the l2l executable (LuaJIT), as scripts/test.sh runs it.
local function archcheck(root, objects)
  return sh(("%s scripts/archcheck %s'%s'"):format(build .. "/l2l",
            objects and ("--objects '%s' "):format(objects) or "", root))
end

-- A copy of the tree's folders of code (include/, src/, kernels/, lua/, scripts/, spec/c/)
-- in a fresh folder.
local function copy_tree()
  local dir = os.tmpname()
  os.remove(dir)
  local status, out = sh(("mkdir -p '%s/spec' && cp -R include src kernels lua scripts '%s'/ && cp -R spec/c '%s/spec/'")
                         :format(dir, dir, dir))
  assert.are.equal(0, status, out)
  return dir
end

local function append(path, text)
  local f = assert(io.open(path, "a"))
  f:write(text)
  f:close()
end

-- archcheck on a copy of the tree that `breach(dir)` changed; the copy is removed.
local function archcheck_changed(breach)
  local dir = copy_tree()
  breach(dir)
  local status, out = archcheck(dir)
  sh("rm -rf '" .. dir .. "'")
  return status, out
end

-- A line inserted after the first #include of a file.
local function add_include(path, line)
  local text = assert(support.read_file(path))
  local patched, n = text:gsub('(#include [^\n]*\n)', "%1" .. line .. "\n", 1)
  assert.are.equal(1, n, path)
  support.write_file(path, patched)
end

describe("scripts/archcheck", function()
  it("passes on this tree and its build, and says what it checked", function()
    local status, out = archcheck(".", support.build_dir)
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("parts: backend, cluster, core, eps, kernels, layers, order, plan, public, relay, runner)", 1, true), out)
    assert.is_truthy(out:find("source files of include/, src/, lua/, kernels/, spec/c/, scripts/ within 800 lines", 1, true), out)
    local objects, calls = out:match("calls: (%d+) objects of [^,]*, (%d+) references across parts")
    assert.is_truthy(objects, out)
    assert.is_true(tonumber(objects) >= 40 and tonumber(calls) >= 100, out)
    assert.is_truthy(out:match("archcheck: ok\n$"), out)
  end)

  it("fails on a call that crosses the arrows, which no include shows", function()
    -- Sources planted in a copy of the tree, each including include/l2l.h alone (which every
    -- part may) and calling a function another part defines, compiled beside a copy of
    -- the build's objects.
    local dir = copy_tree()
    local status, out = sh(("mkdir -p '%s/build' && cp -R '%s/obj' '%s/build/'")
                           :format(dir, support.build_dir, dir))
    assert.are.equal(0, status, out)
    for _, p in ipairs {
      { "eps", "planted_eps_calls_layers",
        "const char *planted_name(const l2l_param *p) { return l2l_param_name(p); }" },
      { "core", "planted_core_calls_relay",
        "void *planted_upward(void) { return (void *)&l2l_relay_new; }" },
    } do
      local source = ("%s/src/%s/%s.c"):format(dir, p[1], p[2])
      support.write_file(source, '#include "l2l.h"\n' .. p[3] .. "\n")
      status, out = sh(("cc -std=gnu11 -I'%s/include' -c '%s' -o '%s/build/obj/%s/%s.o'")
                       :format(dir, source, dir, p[1], p[2]))
      assert.are.equal(0, status, out)
    end
    status, out = archcheck(dir, dir .. "/build")
    sh("rm -rf '" .. dir .. "'")
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("obj/eps/planted_eps_calls_layers.o calls l2l_param_name, defined in " ..
                              "the layers part: the eps part may not depend on the layers part", 1, true), out)
    assert.is_truthy(out:find("obj/core/planted_core_calls_relay.o calls l2l_relay_new, defined in " ..
                              "the relay part: the core part may not depend on the relay part", 1, true), out)
    assert.is_truthy(out:find("2 problems", 1, true), out)
  end)

  it("fails on an include that points upward, naming the file and the line", function()
    local status, out = archcheck_changed(function(dir)
      add_include(dir .. "/src/core/tensor.c", '#include "relay/relay.h"')
    end)
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("src/core/tensor.c:%d+: core includes relay/relay.h"), out)
    assert.is_truthy(out:find("the core part may not depend on the relay part", 1, true), out)
  end)

  it("fails on each forbidden arrow between the parts below the relay", function()
    for _, case in ipairs {
      { file = "src/backend/public_ops.c", include = "layers/layers.h", words = "backend part may not depend on the layers part" },
      { file = "src/layers/call.c", include = "eps/eps.h", words = "layers part may not depend on the eps part" },
      { file = "src/eps/eps.c", include = "layers/layers.h", words = "eps part may not depend on the layers part" },
      { file = "src/eps/optim.c", include = "relay/relay.h", words = "eps part may not depend on the relay part" },
    } do
      local status, out = archcheck_changed(function(dir)
        add_include(dir .. "/" .. case.file, ('#include "%s"'):format(case.include))
      end)
      assert.are_not.equal(0, status, case.file .. ": " .. out)
      assert.is_truthy(out:find(case.words, 1, true), out)
    end
  end)

  it("fails on a part reached past its interface header", function()
    local status, out = archcheck_changed(function(dir)
      add_include(dir .. "/src/relay/visits.c", '#include "layers/kind.h"')
    end)
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("inside the layers part: other parts include only its interface, " ..
                              "src/layers/layers.h", 1, true), out)
  end)

  it("fails on an include cycle between folders", function()
    local status, out = archcheck_changed(function(dir)
      -- core.h including a header of src/ that includes core.h back: src/core <-> src
      support.write_file(dir .. "/src/loop.h", '#include "core/core.h"\n')
      add_include(dir .. "/src/core/core.h", '#include "loop.h"')
    end)
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("include cycle between folders: src/core -> src -> src/core", 1, true)
                     or out:find("include cycle between folders: src -> src/core -> src", 1, true), out)
  end)

  it("fails on a require cycle between lua/l2l modules, even a lazy one, not on a comment", function()
    local dir = copy_tree()
    append(dir .. "/lua/l2l/plan.lua", '-- local relay = require("l2l.relay")  (a comment)\n')
    local status, out = archcheck(dir)
    assert.are.equal(0, status, out)
    append(dir .. "/lua/l2l/plan.lua", 'local function later() return require("l2l.relay") end\n')
    status, out = archcheck(dir)
    sh("rm -rf '" .. dir .. "'")
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("require cycle between lua/l2l modules: l2l.plan -> l2l.relay -> l2l.plan", 1, true)
                     or out:find("require cycle between lua/l2l modules: l2l.relay -> l2l.plan -> l2l.relay", 1, true), out)
  end)

  it("fails on CUDA named in the code of a part above the backend, not in its comments", function()
    local dir = copy_tree()
    append(dir .. "/src/relay/step.c", "/* a comment may say why CUDA matters */\n")
    local status, out = archcheck(dir)
    assert.are.equal(0, status, out)
    append(dir .. "/src/relay/step.c", "static int uses_cuda_here(void) { return 1; }\n")
    add_include(dir .. "/src/eps/eps.c", "#include <cuda_runtime_api.h>")
    status, out = archcheck(dir)
    sh("rm -rf '" .. dir .. "'")
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("src/relay/step.c: names uses_cuda_here in code", 1, true), out)
    assert.is_truthy(out:find("src/eps/eps.c:%d+: includes <cuda_runtime_api.h>"), out)
  end)

  it("fails on a file of src/ or lua/ over 800 lines, and leaves generated files alone", function()
    local dir = copy_tree()
    append(dir .. "/lua/l2l/cdef.lua", string.rep("-- generated\n", 900))
    local status, out = archcheck(dir)
    assert.are.equal(0, status, out)
    -- 800 lines and the licence's SPDX line: within the limit
    local lines = { "-- SPDX-License-Identifier: MIT" }
    for i = 1, 800 do lines[i + 1] = "-- line " .. i end
    support.write_file(dir .. "/lua/l2l/long.lua", table.concat(lines, "\n") .. "\n")
    status, out = archcheck(dir)
    assert.are.equal(0, status, out)
    lines = {}
    for i = 1, 801 do lines[i] = "-- line " .. i end
    support.write_file(dir .. "/lua/l2l/long.lua", table.concat(lines, "\n") .. "\n")
    status, out = archcheck(dir)
    sh("rm -rf '" .. dir .. "'")
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("lua/l2l/long.lua has 801 lines (at most 800", 1, true), out)
  end)

  it("fails on a source file over 800 lines in kernels/, spec/c/ and scripts/ too, not on their other files", function()
    local dir = copy_tree()
    local long = {}
    for i = 1, 801 do long[i] = "// line " .. i end
    local text = table.concat(long, "\n") .. "\n"
    -- what is not code: a suppression list and a README may be long
    support.write_file(dir .. "/scripts/long.supp", text)
    support.write_file(dir .. "/kernels/LONG.md", text)
    local status, out = archcheck(dir)
    assert.are.equal(0, status, out)
    support.write_file(dir .. "/kernels/long.cu", text)
    support.write_file(dir .. "/kernels/long.cuh", text)
    support.write_file(dir .. "/spec/c/relay/test_long.c", text)
    support.write_file(dir .. "/scripts/long.sh", text)
    support.write_file(dir .. "/scripts/fuzz/long.lua", text)
    support.write_file(dir .. "/scripts/longtool", "#!/bin/sh\n" .. text)   -- a script without an extension
    status, out = archcheck(dir)
    sh("rm -rf '" .. dir .. "'")
    assert.are_not.equal(0, status, out)
    for _, path in ipairs { "kernels/long.cu", "kernels/long.cuh", "spec/c/relay/test_long.c", "scripts/long.sh",
                            "scripts/fuzz/long.lua" } do
      assert.is_truthy(out:find(path .. " has 801 lines (at most 800", 1, true), out)
    end
    assert.is_truthy(out:find("scripts/longtool has 802 lines (at most 800", 1, true), out)
    assert.is_truthy(out:find("6 problems", 1, true), out)
    assert.is_falsy(out:find("long.supp", 1, true), out)
    assert.is_falsy(out:find("LONG.md", 1, true), out)
  end)

  it("fails on a spec outside the folders that mirror the code, naming it", function()
    local dir = copy_tree()
    local status, out = archcheck(dir)
    assert.are.equal(0, status, out)
    local stray = { "spec/stray_spec.lua", "spec/l2l/nomodule_spec.lua", "spec/c/test_stray.c",
                    "spec/c/nopart/test_x.c" }
    for _, path in ipairs(stray) do
      sh(("mkdir -p '%s/%s'"):format(dir, path:match("^(.*)/")))
      support.write_file(dir .. "/" .. path, "-- a test\n")
    end
    -- named for a module, or for a module and more words: at home
    sh(("mkdir -p '%s/spec/project'"):format(dir))
    support.write_file(dir .. "/spec/l2l/relay_more_words_spec.lua", "-- a test\n")
    support.write_file(dir .. "/spec/project/anything_spec.lua", "-- a test\n")
    status, out = archcheck(dir)
    sh("rm -rf '" .. dir .. "'")
    assert.are_not.equal(0, status, out)
    for _, path in ipairs(stray) do assert.is_truthy(out:find(path .. ":", 1, true), out) end
    assert.is_truthy(out:find("4 problems", 1, true), out)
  end)
end)
