-- SPDX-License-Identifier: MIT
-- flakes_spec — the flake hunt's margins: L2L_TEST_MARGINS makes the C tests' comparisons
-- (check.h's check_margin) and the specs' (spec/support.lua's within) append "file:line,
-- error / tolerance, test (a spec: its file), what" to a file, and
-- `scripts/flakes.sh --report DIR` lists, from the runs' margin files, the twelve places
-- that came nearest their tolerances, each once at its largest, with the run that drew it
-- and the command that replays it (the TSan build's, with its environment, for a TSan run),
-- after the failures the runs logged; it exits non-zero when any run failed.
local support = dofile("spec/support.lua")
local sh, q = support.sh, support.q

local function lines_of(path)
  local out = {}
  for line in (support.read_file(path) or ""):gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

describe("L2L_TEST_MARGINS", function()
  it("records each comparison's error over its tolerance, and the test passes as before", function()
    local path = support.tmpdir() .. "/m.tsv"
    local status, out = sh(("L2L_SEED=%d L2L_TEST_MARGINS=%s %s/l2l_ctest --exact op_softmax_backward")
                           :format(support.seed, q(path), support.build_dir))
    assert.are.equal(0, status, out)
    local lines = lines_of(path)
    assert.is_true(#lines >= 1, "no comparison recorded")
    local largest = 0
    for _, line in ipairs(lines) do
      local site, ratio, test, what = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)\t([^\t]*)$")
      assert.is_truthy(site, line)
      assert.is_truthy(site:match("^spec/c/backend/test_ops_rows%.c:%d+$"), line)
      ratio = tonumber(ratio)
      assert.is_true(ratio ~= nil and ratio >= 0 and ratio <= 1, line) -- the test passed
      assert.are.equal("op_softmax_backward", test)
      assert.are.equal("softmax_backward", what)
      largest = math.max(largest, ratio)
    end
    assert.is_true(largest > 0, "every error recorded as 0: the errors were not measured")
  end)

  it("records a spec's comparisons through support.within: its caller's place, or a helper's caller's", function()
    local ffi = require("ffi")
    pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")
    local path, given = support.tmpdir() .. "/m.tsv", os.getenv("L2L_TEST_MARGINS")
    local function via_helper(err)
      local ok = support.within(err, 4, "through a helper", 2)   -- (a tail call would drop this frame)
      return ok
    end
    local function line() return debug.getinfo(2, "l").currentline end
    ffi.C.setenv("L2L_TEST_MARGINS", path, 1)
    local v, at = {}, {}
    v[1] = support.within(0.25, 1, "a quarter"); at[1] = line()
    v[2] = support.within(3, 2, "past it\tand on"); at[2] = line()
    v[3] = support.within(0 / 0, 1, "NaN"); at[3] = line()
    v[4] = via_helper(1); at[4] = line()
    v[5] = support.within(0, 0, "exact"); at[5] = line()
    ffi.C.unsetenv("L2L_TEST_MARGINS")
    support.within(0.5, 1, "after the name changed")   -- recorded nowhere (not in a hunt's file)
    if given then ffi.C.setenv("L2L_TEST_MARGINS", given, 1) end
    assert.are.same({ true, false, false, true, true }, v)
    local lines = lines_of(path)
    assert.are.equal(5, #lines, table.concat(lines, "\n"))
    local want = { { "0.25", "a quarter" }, { "1.5", "past it and on" }, { nil, "NaN" },
                   { "0.25", "through a helper" }, { "0", "exact" } }
    for i, line in ipairs(lines) do
      local site, ratio, test, what = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)\t([^\t]*)$")
      assert.are.equal("spec/project/flakes_spec.lua:" .. at[i], site, line)
      assert.are.equal("spec/project/flakes_spec.lua", test, line)
      assert.are.equal(want[i][2], what, line)
      if want[i][1] then assert.are.equal(want[i][1], ratio, line) else assert.is_false(tonumber(ratio) == tonumber(ratio), line) end
    end
  end)

  it("names a file it cannot append to, and the test still runs", function()
    local status, out = sh(("L2L_TEST_MARGINS=/nonexistent-folder/m.tsv %s/l2l_ctest --exact op_softmax_backward")
                           :format(support.build_dir))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("L2L_TEST_MARGINS: cannot append to /nonexistent-folder/m.tsv", 1, true), out)
    assert.is_truthy(out:find("1 passed, 0 failed", 1, true), out)
  end)
end)

describe("scripts/flakes.sh --report", function()
  local dir
  before_each(function()
    dir = support.tmpdir()
    -- a plain run and a TSan run: place A nearest in the TSan run, B in the plain one, and
    -- fourteen more places below both, so that the list is cut at twelve
    local plain = { "#seed\t11", "spec/c/x.c:10\t0.2\ttest_a\tA in plain",
                    "spec/c/x.c:20\t0.5\ttest_b\tB in plain" }
    local tsan = { "#seed\t22", "spec/c/x.c:10\t0.9\ttest_a\tA in tsan",
                   "spec/c/x.c:20\t0.05\ttest_b\tB in tsan" }
    for k = 1, 14 do tsan[#tsan + 1] = ("spec/c/y.c:%d\t%g\ttest_c\tfiller"):format(k, k / 1000) end
    support.write_file(dir .. "/plain-1.margins", table.concat(plain, "\n") .. "\n")
    support.write_file(dir .. "/threaded-2.margins", table.concat(tsan, "\n") .. "\n")
    support.write_file(dir .. "/plain-1.log", "")
  end)

  it("lists each place once at its largest, nearest first, twelve of them, with replays", function()
    local status, out = sh("scripts/flakes.sh --report " .. q(dir))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("the report of " .. dir .. " (1 runs logged)", 1, true), out)
    assert.is_truthy(out:find("of 18 comparisons", 1, true), out)
    local entries = {}
    for ratio, site, rest in out:gmatch("\n  (%S+) +(spec/c/%S+)  ([^\n]+)") do
      entries[#entries + 1] = { tonumber(ratio), site, rest }
    end
    assert.are.equal(12, #entries, out)
    assert.are.same({ 0.9, "spec/c/x.c:10" }, { entries[1][1], entries[1][2] })
    assert.is_truthy(entries[1][3]:find("test_a: A in tsan (threaded run, seed 22)", 1, true), out)
    assert.are.same({ 0.5, "spec/c/x.c:20" }, { entries[2][1], entries[2][2] })
    assert.is_truthy(entries[2][3]:find("(plain run, seed 11)", 1, true), out)
    for k = 3, 12 do -- the fillers, largest first: 0.014 down to 0.005
      assert.are.same({ (17 - k) / 1000, ("spec/c/y.c:%d"):format(17 - k) }, { entries[k][1], entries[k][2] })
    end
    assert.is_truthy(out:find("replay: L2L_SEED=22 L2L_DEVICE=cpu L2L_BUILD=build-tsan TSAN_OPTIONS="
                              .. "suppressions=scripts/tsan.supp OMP_NUM_THREADS=1 L2L_THREADS=1 "
                              .. "build-tsan/l2l_ctest --exact test_a", 1, true), out)
    assert.is_truthy(out:find("replay: L2L_SEED=11 L2L_DEVICE=cpu L2L_BUILD=build build/l2l_ctest --exact test_b",
                              1, true), out)
  end)

  it("replays a spec's place by running its spec file", function()
    local spec_dir = support.tmpdir()
    support.write_file(spec_dir .. "/plain-1.margins",
                       "#seed\t11\nspec/l2l/ops_spec.lua:18\t0.7\tspec/l2l/ops_spec.lua\tgelu\n")
    local status, out = sh("scripts/flakes.sh --report " .. q(spec_dir))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("\n  0%.7 +spec/l2l/ops_spec%.lua:18  spec/l2l/ops_spec%.lua: gelu %(plain run, seed 11%)"), out)
    assert.is_truthy(out:find("replay: L2L_SEED=11 L2L_DEVICE=cpu L2L_BUILD=build build/l2l " .. "%S*busted"
                              .. " %-o plainTerminal spec/l2l/ops_spec%.lua"), out)
  end)

  it("puts the failures the runs logged first, and exits non-zero", function()
    support.write_file(dir .. "/failures.tsv", table.concat({ "plain", "11", dir .. "/plain-1.log",
      "ctest", "op_x", "x.c:1: got 2", "L2L_SEED=11 build/l2l_ctest op_x" }, "\t") .. "\n")
    local status, out = sh("scripts/flakes.sh --report " .. q(dir))
    assert.are_not.equal(0, status, out)
    local failure, nearest = out:find("ctest op_x", 1, true), out:find("nearest their tolerances", 1, true)
    assert.is_truthy(failure, out)
    assert.is_truthy(out:find("plain run, seed 11 (" .. dir .. "/plain-1.log): x.c:1: got 2", 1, true), out)
    assert.is_true(nearest ~= nil and failure < nearest, out)
  end)

  it("refuses a folder that is not there", function()
    local status, out = sh("scripts/flakes.sh --report " .. q(dir .. "/none"))
    assert.are_not.equal(0, status)
    assert.is_truthy(out:find("no folder", 1, true), out)
  end)
end)
