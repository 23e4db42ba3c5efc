-- SPDX-License-Identifier: MIT
-- spdx_spec — scripts/spdx.sh, which checks and adds the licence line atop each source
-- file, on a small tree of every kind of file it knows (and some it must leave alone):
-- --check names each file without the line and fails; --add puts the line first (second
-- after a #! line) in the file's comment syntax, keeps the rest and the file's mode, and
-- changes nothing when run again; --check then passes.
local support = dofile("spec/support.lua")
local sh = support.sh

local q = support.q

local ID = "SPDX-License-Identifier: MIT"
local FILES = {   -- path, content, the line expected (nil: left alone), at which line
  { "src/a.c", "/* a.c — a purpose block */\nint a;\n", "/* " .. ID .. " */", 1 },
  { "src/a.h", "/* a.h */\n", "/* " .. ID .. " */", 1 },
  { "kernels/k.cu", "// k.cu\n", "/* " .. ID .. " */", 1 },
  { "lua/l2l/m.lua", "-- m.lua — a module\nreturn {}\n", "-- " .. ID, 1 },
  { "lua/l2l/cdef.lua", "-- Generated from include/l2l.h\nreturn ''\n", nil },
  { "scripts/tool", "#!/usr/bin/env luajit\n-- tool — a script\nprint(1)\n", "-- " .. ID, 2 },
  { "scripts/run.sh", "#!/usr/bin/env bash\n# run.sh\necho hi\n", "# " .. ID, 2 },
  { "scripts/ci", "#!/bin/sh\necho ci\n", "# " .. ID, 2 },
  { "bench/p.py", '"""p.py"""\n', "# " .. ID, 1 },
  { "Makefile", "# Makefile\nall:\n", "# " .. ID, 1 },
  { "docs/x.1", '.TH X 1\n', '.\\" ' .. ID, 1 },
  { "docs/x.ld", 'project = "x"\n', "-- " .. ID, 1 },
  { "README.md", "# readme\n", nil },
  { "data.json", "{}\n", nil },
}

describe("scripts/spdx.sh", function()
  local dir
  setup(function()
    dir = select(2, sh("mktemp -d")):match("^(%S+)")
    for _, f in ipairs(FILES) do
      local folder = f[1]:match("^(.*)/")
      if folder then sh("mkdir -p " .. q(dir .. "/" .. folder)) end
      support.write_file(dir .. "/" .. f[1], f[2])
    end
    sh(("chmod 755 %s/scripts/tool %s/scripts/run.sh"):format(q(dir), q(dir)))
  end)
  teardown(function() if dir then sh("rm -rf " .. q(dir)) end end)

  it("--check names each source file without the line, and fails", function()
    local status, out = sh(("scripts/spdx.sh --check %s"):format(q(dir)))
    assert.are.equal(1, status, out)
    local n = 0
    for _, f in ipairs(FILES) do
      if f[3] then
        n = n + 1
        assert.is_truthy(out:find(("spdx: %s: line %d is not: %s\n"):format(f[1], f[4], f[3]), 1, true), out)
      else
        assert.is_falsy(out:find(f[1], 1, true), out)
      end
    end
    assert.is_truthy(out:find(("spdx: %d of %d source files lack the line"):format(n, n), 1, true), out)
  end)

  it("--add puts the line in each source file's syntax, once, and keeps the rest", function()
    local status, out = sh(("scripts/spdx.sh --add %s"):format(q(dir)))
    assert.are.equal(0, status, out)
    for _, f in ipairs(FILES) do
      local text = support.read_file(dir .. "/" .. f[1])
      if not f[3] then
        assert.are.equal(f[2], text, f[1])
      elseif f[4] == 2 then
        local shebang, rest = f[2]:match("^(.-\n)(.*)$")
        assert.are.equal(shebang .. f[3] .. "\n" .. rest, text, f[1])
      else
        assert.are.equal(f[3] .. "\n" .. f[2], text, f[1])
      end
    end
    local _, modes = sh(("stat -c '%%a %%n' %s/scripts/tool %s/scripts/run.sh %s/src/a.c"):format(q(dir), q(dir), q(dir)))
    assert.is_truthy(modes:find("755 " .. dir .. "/scripts/tool", 1, true), modes)
    assert.is_truthy(modes:find("755 " .. dir .. "/scripts/run.sh", 1, true), modes)
    assert.is_truthy(modes:find("644 " .. dir .. "/src/a.c", 1, true), modes)

    local before = {}
    for _, f in ipairs(FILES) do before[f[1]] = support.read_file(dir .. "/" .. f[1]) end
    status, out = sh(("scripts/spdx.sh --add %s"):format(q(dir)))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("added the line to 0 of", 1, true), out)
    for _, f in ipairs(FILES) do assert.are.equal(before[f[1]], support.read_file(dir .. "/" .. f[1]), f[1]) end

    status, out = sh(("scripts/spdx.sh --check %s"):format(q(dir)))
    assert.are.equal(0, status, out)
    local n = 0
    for _, f in ipairs(FILES) do if f[3] then n = n + 1 end end
    assert.is_truthy(out:find(("spdx: all %d source files carry: %s"):format(n, ID), 1, true), out)
  end)

  it("finds the line in every source file of this checkout (scripts/spdx.sh --check)", function()
    local status, out = sh("scripts/spdx.sh --check")
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("spdx: all %d+ source files carry"), out)
  end)
end)
