-- SPDX-License-Identifier: MIT
-- spec/dist/runs.lua — what the dist specs (spec/l2l/dist_spec.lua, dist_faults_spec.lua)
-- share: runs of spec/dist/train.lua, alone or under `mpirun -np N`, and the comparisons of
-- their losses, weights and optimizer state. Each spec loads it in its own environment,
-- for busted's assert and pending:
--   local dist = setfenv(assert(loadfile("spec/dist/runs.lua")), getfenv(1))()
-- Each file that loads it gets its own folder for the runs' output.
local support = dofile("spec/support.lua")
local cjson = require("cjson")

local exe = support.build .. "/l2l"
local seed = support.seed % 10007 + 1
local plugin = support.build_dir .. "/libl2l-mpi.so"
local have_plugin = io.open(plugin) ~= nil
local have_mpirun = support.sh("command -v mpirun") == 0
local why_not = not have_plugin and ("this build has no MPI plugin (" .. plugin .. "): mpicc was not found when it was built")
                or not have_mpirun and "mpirun is not installed" or nil

-- Sanitized ranks: leak checking is off in them (and only there). OpenMPI keeps memory
-- to the end of the process by design, allocated from components it unloads at
-- MPI_Finalize, so LeakSanitizer reports it from "<unknown module>" and cannot tell it
-- from l2l's; AddressSanitizer's other checks and UBSan stay on, and every single-process
-- spec checks l2l's own leaks.
local sanitizer_env = os.getenv("L2L_SANITIZE") == "1" and " -x ASAN_OPTIONS=detect_leaks=0" or ""
local function mpirun(n, extra, prefix)
  return ("%smpirun --allow-run-as-root --oversubscribe -np %d%s %s"):format(prefix or "", n, sanitizer_env, extra or "")
end

local dir = support.tmpdir()

-- Runs the training script (under mpirun when n > 0); the table rank r wrote.
local count = 0
local function train(n, flags, mpi_flags, prefix)
  count = count + 1
  local out = ("%s/run%d"):format(dir, count)
  local cmd = ("%s %s spec/dist/train.lua %s %d %s %s"):format(
    n > 0 and mpirun(n, mpi_flags, prefix) or "", exe, out, seed, n > 0 and "dist=mpi" or "", flags)
  local status, text = support.sh("timeout 240 " .. cmd)
  assert.are.equal(0, status, cmd .. "\n" .. text)
  local results = {}
  for r = 0, math.max(n, 1) - 1 do
    local body = support.read_file(out .. "." .. r)
    assert.is_truthy(body, "rank " .. r .. " wrote nothing: " .. cmd .. "\n" .. text)
    results[r] = cjson.decode(body)
  end
  return results, cmd
end

local function num(h) return tonumber(h) end

-- Losses, weights and optimizer state of two runs: the same records, and the numbers
-- within fp32 tolerance. The ranks sum gradients in another order than one process, and
-- a gradient that is mostly cancellation (a bias whose exact gradient is near zero) keeps
-- few correct digits, so each array is compared as a whole: its largest difference
-- against its largest magnitude (a missing or doubled rank's gradient moves the moments
-- by a factor, far beyond this). spec/dist/train.lua's AdamW and LAMB take eps = 1e-3,
-- which bounds how much they magnify a gradient's rounding difference (lr / eps = 3 times
-- a step): at the default 1e-8, entries whose gradient is rounding noise (the key bias,
-- whose exact gradient is zero) step by up to lr either way in each run, and entries
-- whose gradient nearly cancels drift apart: the largest difference reached 1.5e-3 in 45
-- runs, 1.8e-3 (of the 3e-3 allowed) outside the key bias in 200; at 1e-3 it stayed
-- under 4e-5 in 400 runs (2 ranks against one process, dist_spec's first two cases, seeds
-- 1-200, 2026-11-26).
local function assert_close(want, got, what)
  assert.are.equal(#want.losses, #got.losses, what)
  for i = 1, #want.losses do
    local a, b = num(want.losses[i]), num(got.losses[i])
    assert.is_true(support.within(math.abs(a - b), 1e-5 * math.abs(a), "ranks' loss", 2),
                   ("%s: loss of step %d: %.9g, one process %.9g"):format(what, i, b, a))
  end
  assert.are.equal(#want.params, #got.params, what)
  local worst, where = 0, ""
  for i, w in ipairs(want.params) do
    local g = got.params[i]
    assert.are.equal(w.name, g.name, what)
    for _, key in ipairs({ "value", "state1", "state2" }) do
      assert.are.equal(w[key] == nil, g[key] == nil, what .. ": " .. w.name .. " " .. key)
      if w[key] then
        assert.are.equal(#w[key], #g[key], what)
        local diff, size, at = 0, 0, 1
        for j = 1, #w[key] do
          local a, b = num(w[key][j]), num(g[key][j])
          size = math.max(size, math.abs(a))
          if not (math.abs(a - b) <= diff) then diff, at = math.abs(a - b), j end
        end
        local err = diff / math.max(size, 1e-30)
        if not (err <= worst) then
          worst, where = err, ("%s %d.%s %s[%d]: %.9g, one process %.9g (largest magnitude %.3g)"):format(
            what, w.layer, w.name, key, at, num(g[key][at]), num(w[key][at]), size)
        end
      end
    end
  end
  assert.is_true(support.within(worst, 3e-3, "ranks' weights and state", 2) and worst < 3e-3,
                 "largest difference: " .. where)
end

-- Two runs' weights and optimizer state, the very same.
local function assert_same_params(want, got)
  for i, p in ipairs(want.params) do
    assert.are.same(p.value, got.params[i].value, p.name)
    assert.are.same(p.state1, got.params[i].state1, p.name)
    assert.are.same(p.state2, got.params[i].state2, p.name)
  end
end

-- Every rank holds exactly rank 0's numbers (the all-gathers and the agreed steps).
local function assert_ranks_agree(results, what)
  for r = 1, #results do
    assert.are.same(results[0].losses, results[r].losses, what .. ": rank " .. r .. "'s losses")
    for i, p in ipairs(results[0].params) do
      assert.are.same(p.value, results[r].params[i].value, ("%s: rank %d's %d.%s"):format(what, r, p.layer, p.name))
      assert.are.same(p.state1, results[r].params[i].state1, what)
    end
  end
end

-- One process, then `counts` ranks, on `flags`: rank 0 trains as one process does and
-- every rank holds rank 0's numbers; check(ranks, cmd, one, n) looks further.
local function assert_equivalent(flags, counts, mpi_flags, check)
  local one = train(0, flags)[0]
  for _, n in ipairs(counts) do
    local ranks, cmd = train(n, flags, mpi_flags)
    assert_close(one, ranks[0], cmd)
    assert_ranks_agree(ranks, cmd)
    if check then check(ranks, cmd, one, n) end
  end
end

-- false, and the case marked pending with the reason, where MPI cannot run here
local function need_mpi()
  if why_not then pending(why_not) return false end
  return true
end

return {
  support = support, exe = exe, seed = seed, dir = dir, have_plugin = have_plugin, why_not = why_not,
  sanitizer_env = sanitizer_env, mpirun = mpirun, train = train, num = num, need_mpi = need_mpi,
  assert_close = assert_close, assert_same_params = assert_same_params,
  assert_ranks_agree = assert_ranks_agree, assert_equivalent = assert_equivalent,
}
