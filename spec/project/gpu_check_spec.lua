-- SPDX-License-Identifier: MIT
-- gpu_check_spec — scripts/gpu-check.sh, the device check a session lent a GPU runs, tried
-- here with --dry-run: every phase runs its CPU part or says why it could not run, the
-- summary is whole (a line per phase, every cuda_ C test by name, what could not run),
-- and $OUT holds at most the 8 files the device tool brings back.
local support = dofile("spec/support.lua")
local l2l = require("l2l")

local PHASES = { "facts", "build", "ctest", "sanitize", "specs", "kernels", "profile", "vs_torch", "repeat" }
local FILES = { ["summary.txt"] = true, ["machine.txt"] = true, ["build.log"] = true,
                ["ctest.log"] = true, ["sanitizer.log"] = true, ["specs.log"] = true,
                ["bench.txt"] = true, ["vs_torch.txt"] = true }

describe("scripts/gpu-check.sh", function()
  it("runs dry on a machine without a GPU: a whole summary, at most 8 files", function()
    -- It builds and runs the plain build (build/), as on the device.
    if support.build ~= "build" then
      pending("the check builds and runs build/, and this run tests " .. support.build)
      return
    end
    if l2l.device().cuda then
      pending("this machine has a GPU: --dry-run is for machines without one")
      return
    end
    local out = support.tmpdir()
    local status, text = support.sh("OUT='" .. out .. "' scripts/gpu-check.sh --dry-run --budget 400")
    assert.are.equal(0, status, text)
    local summary = assert(support.read_file(out .. "/summary.txt"), "no summary.txt")
    for _, phase in ipairs(PHASES) do
      local state, figure = summary:match("\n" .. phase .. " +(%S+) +%d+  ([^\n]*)")
      assert.is_truthy(state, "no line for phase " .. phase .. " in:\n" .. summary)
      assert.is_truthy(state == "ok" or state == "skipped", phase .. ": " .. state .. " " .. figure)
      assert.is_truthy(#figure > 0, phase .. " says nothing")
    end
    -- the build phase says what the library holds (read here in full, not by the script)
    local _, symbols = support.sh("nm " .. support.build_dir .. "/libl2l.so")
    local built = symbols:find(" [tT] k_add\n") ~= nil   -- (a kernel's launcher)
    local build_figure = summary:match("\nbuild +%S+ +%d+  ([^\n]*)")
    assert.are.equal(built, build_figure:find("built with CUDA", 1, true) ~= nil, build_figure)
    -- every GPU test by name, each skipped with the reason (or run, where it needs no GPU)
    local listed, names = support.sh(support.build_dir .. "/l2l_ctest --list cuda_ cudnn_attention")
    assert.are.equal(0, listed, names)
    local count = 0
    for name in names:gmatch("%S+") do
      count = count + 1
      local result = summary:match("\n  " .. name .. ": ([^\n]*)")
      assert.is_truthy(result, name .. " is not in the summary")
      assert.is_truthy(result == "ok" or result:match("^skipped: no GPU"), name .. ": " .. result)
    end
    assert.is_true(count > 20, ("only %d cuda_ tests listed"):format(count))
    -- the last line names what could not run
    local last = summary:match("\ntotal %d+ s; failed: none; not run: ([^\n]*)\n?$")
    assert.is_truthy(last, "no closing line: " .. summary)
    assert.is_truthy(last:find("vs_torch", 1, true) and last:find("kernels", 1, true), last)
    -- the profile phase ran its CPU part: a profile of two steps on the CPU backend
    local profile = summary:match("\nprofile +skipped +%d+  ([^\n]*)")
    assert.is_truthy(profile and profile:find("^cpu, 2 steps, "), profile or summary)
    assert.is_truthy(profile:find("syncs", 1, true), profile)
    -- what comes back from the device: at most 8 files, the known ones
    local _, listing = support.sh("ls -A '" .. out .. "'")
    local files = 0
    for name in listing:gmatch("%S+") do
      files = files + 1
      assert.is_truthy(FILES[name], "an unexpected file in $OUT: " .. name)
    end
    assert.is_true(files <= 8, ("%d files in $OUT"):format(files))
    support.sh("rm -rf '" .. out .. "'")
  end)

  it("refuses an option it does not know and a budget that is not whole seconds", function()
    local status, text = support.sh("scripts/gpu-check.sh --budget 1.5")
    assert.are.equal(2, status, text)
    assert.is_truthy(text:find("whole seconds", 1, true), text)
    status, text = support.sh("scripts/gpu-check.sh --dry-ran")
    assert.are.equal(2, status, text)
    assert.is_truthy(text:find("usage", 1, true), text)
  end)
end)
