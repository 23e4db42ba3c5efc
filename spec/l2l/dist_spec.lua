-- SPDX-License-Identifier: MIT
-- dist_spec — data parallel over MPI, run as users run it: `mpirun -np N build/l2l
-- script.lua` on this one machine (as root: --allow-run-as-root; more ranks than cores:
-- --oversubscribe; one case forces TCP over loopback, the stand-in for separate machines).
-- The reference is one process training the whole minibatch (spec/dist/train.lua alone):
-- 2 and 3 ranks must give the same losses, weights and optimizer state after several
-- steps, with dropout, ignored targets, an uneven last micro-batch and uneven slices,
-- accumulation, global clipping, loss scaling, LAMB's whole-record norms, and an insert
-- and a clone between steps. Every rank must hold the same numbers as rank 0. A
-- checkpoint saved on 2 ranks loads on 3 and on 1 process and continues as the run that
-- never stopped; a rank that is killed or hangs ends the job with a message (no hang).
-- Without MPI built, the cases that need it say so and are skipped; what a program that
-- never asks for MPI loads is checked either way.
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
-- under 4e-5 in 400 runs (2 ranks against one process, the first two cases below, seeds
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

describe("a program that never asks for MPI", function()
  it("loads no MPI library and needs no mpirun, with and without a relay", function()
    local status, maps = support.sh(exe .. [[ -e 'local l2l = require("l2l")
      local run = l2l.Relay{ model = { l2l.Embedding{ vocab = 5, dim = 4, max_seq = 3 }, l2l.LMHead{ vocab = 5, dim = 4 } } }
      io.write(io.open("/proc/self/maps"):read("*a"))']])
    assert.are.equal(0, status, maps)
    assert.is_truthy(maps:find("libl2l", 1, true), "the maps name no libl2l: the check reads nothing")
    assert.is_falsy(maps:find("libmpi", 1, true), "libmpi is loaded:\n" .. maps)
    assert.is_falsy(maps:find("libl2l-mpi", 1, true), "the MPI plugin is loaded")
  end)

  it("is told clearly when this build has no MPI, or else gets rank 0 of 1 alone", function()
    local env = sanitizer_env:gsub("^ %-x ", "")   -- (a singleton rank: as under mpirun)
    local status, out = support.sh(env .. " " .. exe .. [[ -e 'local l2l = require("l2l"); print(l2l.dist.rank(), l2l.dist.size())']])
    if have_plugin then
      assert.are.equal(0, status, out)
      assert.is_truthy(out:find("^0\t1\n"), out)
    else
      assert.are_not.equal(0, status, out)
      assert.is_truthy(out:find("built without MPI", 1, true), out)
    end
  end)
end)

describe("data parallel under mpirun", function()
  local function need_mpi()
    if why_not then pending(why_not) return false end
    return true
  end

  it("2 and 3 ranks train as one process does: dropout, clipping, loss scaling, accumulation", function()
    if not need_mpi() then return end
    assert_equivalent("steps=6 accumulate=2 dropout=0.1 clip=0.5 loss_scale=1024", { 2, 3 }, nil, function(ranks, cmd, one, n)
      local st = ranks[0].stats
      assert.are.equal(n, st.dist_ranks, cmd)
      assert.is_true(st.dist_sent_bytes > 0 and st.dist_sent_bytes == st.dist_received_bytes, cmd)
      -- each rank keeps its shard of the optimizer state: less host memory than one process
      assert.is_true(st.host_eps_bytes < one.stats.host_eps_bytes, cmd)
      -- how much of the exchange the step waited for is a time (bench/dist.lua reports
      -- it); here only that it is reported (issue 30: "< step_seconds" failed on a busy
      -- machine, where a step's clock and the exchange's overlap differently)
      assert.is_true(type(st.exposed_comm_seconds) == "number" and st.exposed_comm_seconds >= 0, cmd)
      -- the exchanges on the timeline: one lane after the optimizer worker (threads 0-3)
      local x = ranks[0].exchanges
      assert.is_true(x.reduce_scatter > 0 and x.all_gather > 0, cmd)
      assert.are.equal(4, x.lane, cmd)
      assert.are.equal("communication (MPI)", x.lane_name, cmd)
    end)
  end)

  it("2 and 3 ranks train as one process does with LAMB, layers inserted, cloned, frozen, removed and skipped", function()
    if not need_mpi() then return end
    assert_equivalent("grow=1 optimizer=lamb B=8 mb=3 steps=6", { 2, 3 })
  end)

  -- Rank r of a spilled run against the same run in memory: losses, weights and state
  -- to the bit.
  local function same_bits_as(plain, spilled, r, scmd)
    assert.are.same(plain[r].losses, spilled[r].losses, scmd .. ": rank " .. r .. "'s losses")
    for i, p in ipairs(plain[r].params) do
      local q = spilled[r].params[i]
      local what = ("%s: rank %d's %d.%s"):format(scmd, r, p.layer, p.name)
      assert.are.same(p.value, q.value, what)
      assert.are.same(p.state1, q.state1, what .. " (first state)")
      assert.are.same(p.state2, q.state2, what .. " (second state)")
    end
  end

  it("2 and 3 ranks with the records on the device train to the same bits as on the host", function()
    -- placement device: each rank's accumulator goes out through pinned memory into the
    -- same reduce-scatter and norm as the host's, the reduced gradient comes back whole
    -- (an all-gather of it, not of the master) and every rank updates the whole record on
    -- its device. The reduced gradient is the host's, bit for bit, so are the agreed norm
    -- and skips; AdamW, SGD and 8-bit state update element by element (a block's scale
    -- from its own elements; a bf16 master's draws by element), so the weights and state
    -- are the host's exactly. LAMB's trust ratio is an f32 from whole-record sums in
    -- double, which the device adds chunk by chunk and the host shard by shard: the two
    -- doubles differ by a few of their ulps (2^-52), which flips the f32 (2^-24 apart) with
    -- a chance of about 2^-28 a ratio, a few hundred ratios a run here.
    if not need_mpi() then return end
    local spill = dir .. "/spill_device"   -- (the host's state there; none of the device's)
    assert(os.execute("mkdir -p " .. spill) == 0)
    local value = (support.int(0, 1) == 0 and -1 or 1) * 2 ^ (65 + support.uniform(0, 58))
    local spike = ("steps=3 spike=%.17g spike_rank=%d spike_record=%d spike_at=%d"):format(
      value, support.int(0, 1), support.int(1, 30), support.int(0, 1e6))
    for _, case in ipairs({
      { 2, "optimizer=adamw clip=0.5 dropout=0.1 plan=1" },
      { 3, "optimizer=sgd accumulate=2 grow=1 B=8 mb=3 steps=6 spill=" .. spill },
      { 2, "optimizer=lamb grow=1 B=8 mb=3 steps=6 state=8bit master=bf16" },
      { 3, "optimizer=adamw steps=8 loss_scale=4194304 grad_precision=f16 state=bf16" },
      { 2, spike },
      { 2, spike .. " loss_scale=1" },
    }) do
      local n, flags = case[1], case[2]
      local host = train(n, flags .. " placement=host")
      local device, cmd = train(n, flags .. " placement=device")
      for r = 0, n - 1 do
        same_bits_as(host, device, r, cmd)
        assert.is_true(device[r].stats.device_records_bytes > 0, cmd)
        assert.are.equal(0, host[r].stats.device_records_bytes, cmd)
        -- the same bytes through MPI: the device's gradient all-gathered in f32 where the
        -- host's master is, bf16 masters in 2 bytes (fewer)
        if not flags:find("master=bf16", 1, true) then
          assert.are.equal(host[r].stats.dist_sent_bytes, device[r].stats.dist_sent_bytes, cmd)
        end
        if flags == spike then assert.are.equal(1, device[r].spike_skipped, cmd) end
        -- this rank's host bytes as planned: on the device, its exchange's buffers alone
        for _, run in ipairs({ host[r], device[r] }) do
          if run.plan_eps_bytes then assert.are.equal(run.plan_eps_bytes, run.stats.host_eps_bytes, cmd) end
        end
      end
      assert_ranks_agree(device, cmd)
    end
    -- its checkpoint holds the host run's numbers, and loads on 3 ranks (on the device) and
    -- on one process placed on the host
    local path = dir .. "/device.l2l"
    local flags = "optimizer=adamw state=8bit steps=2"
    train(2, flags .. " placement=device save=" .. path .. " save_at=2")
    local want = train(2, flags .. " placement=host")[0]
    assert_same_params(want, train(3, "steps=0 load=" .. path)[0])
    assert_same_params(want, train(0, "steps=0 load=" .. path .. " load_placement=host")[0])
  end)

  it("2 and 3 ranks with placement auto agree where each record lives, moving records as their budgets change, to the host's bits", function()
    -- Before each step each rank's device budget is its own step with every record on the
    -- host plus a share of every record's device bytes, drawn for each rank and step (the
    -- ranks' budgets differ, and so do their slices' peaks): the ranks place together
    -- (each within its budget, then within what every rank placed, until all place alike),
    -- and records move both ways between steps with their state (to the device the whole
    -- record's, gathered from the ranks' shards; to the host this rank's part of it).
    -- Every rank then holds the same records on the device, and the run is the host's.
    if not need_mpi() then return end
    local spill = dir .. "/spill_auto"
    assert(os.execute("mkdir -p " .. spill) == 0)
    -- every rank's share 1 at steps 1 and 4 (every record fits), rank 0's 0 at step 3
    -- (none does: a record costs more than the slots it spares), the rest drawn: records
    -- move out by step 3 and back in at step 4, their state updated meanwhile
    local function shares(k, first)
      local list = {}
      for i = 1, k do list[i] = ("%.2f"):format(support.uniform(0, 1.1)) end
      list[1], list[4], list[3] = "1", "1", first and "0" or list[3]
      return table.concat(list, ",")
    end
    for _, case in ipairs({
      { 2, "optimizer=adamw clip=0.5 steps=6" },
      { 3, "optimizer=lamb state=8bit master=bf16 grow=1 B=8 mb=3 steps=6" },
      { 2, "optimizer=sgd accumulate=2 steps=6 spill=" .. spill },
      { 3, "optimizer=adamw steps=6 loss_scale=4194304 grad_precision=f16 state=bf16" },
    }) do
      local n, flags = case[1], case[2]
      local host = train(n, flags .. " placement=host")
      local budgets = " shares=" .. shares(6, true)
      for r = 1, n - 1 do budgets = budgets .. (" rank%d_shares=%s"):format(r, shares(6)) end
      local auto, cmd = train(n, flags .. budgets .. " placement=auto")
      local moved_in, moved_out, some = false, false, false
      for i, bytes in ipairs(auto[0].placed) do
        if i > 1 then
          moved_in = moved_in or bytes > auto[0].placed[i - 1]
          moved_out = moved_out or bytes < auto[0].placed[i - 1]
        end
        some = some or bytes > 0
      end
      assert.is_true(moved_in and moved_out and some, cmd .. ": placed " .. table.concat(auto[0].placed, " "))
      for r = 0, n - 1 do
        assert.are.same(auto[0].placed, auto[r].placed, cmd .. ": rank " .. r .. " placed otherwise")
        same_bits_as(host, auto, r, cmd)
      end
    end
  end)

  it("2 ranks with the optimizer state spilled train to the same bits as 2 ranks in memory", function()
    if not need_mpi() then return end
    local spill = dir .. "/spill"
    assert(os.execute("mkdir -p " .. spill) == 0)
    for _, flags in ipairs({ "grow=1 optimizer=adamw B=8 mb=3 steps=6", "grow=1 optimizer=lamb B=8 mb=3 steps=6",
                             "optimizer=sgd steps=5 accumulate=2 clip=0.5" }) do
      local plain, cmd = train(2, flags)
      local spilled, scmd = train(2, flags .. " spill=" .. spill)
      for r = 0, 1 do
        same_bits_as(plain, spilled, r, scmd)
        assert.is_true(spilled[r].stats.spill_file_bytes > 0, scmd)
        assert.is_true(spilled[r].stats.host_eps_bytes < plain[r].stats.host_eps_bytes, cmd)
      end
      local _, left = support.sh("ls -A " .. spill)
      assert.are.equal("", left, "spill files outlived their relays")
    end
  end)

  it("2 ranks train within half their EPS's bytes, the accumulators passing, to the same bits as in memory", function()
    -- each rank at the smallest host budget that works for it, step by step (tight=1: a
    -- step one rank's budget refuses, every rank refuses alike and takes again): the state
    -- spills and each accumulator is in memory from its gradient's arrival to its
    -- reduce-scatter, so arrivals wait for room while the ranks' exchanges run in their
    -- places; the model grows, is frozen in part and shrinks between steps
    if not need_mpi() then return end
    local spill = dir .. "/spill_tight"
    assert(os.execute("mkdir -p " .. spill) == 0)
    -- (LAMB's update holds its room between its waves while it waits for its place on the
    -- ranks' stream of norms: the room goes in the exchanges' order, or it would hang)
    for _, flags in ipairs({ "grow=1 optimizer=adamw B=8 mb=3 steps=6 dim=48 blocks=8",
                             "grow=1 optimizer=lamb B=8 mb=3 steps=6 dim=48 blocks=8",
                             "optimizer=adamw B=6 mb=1 steps=4 dim=48 blocks=8" }) do
      local plain = train(2, flags)
      local tight, tcmd = train(2, flags .. " spill=" .. spill .. " tight=1")
      for r = 0, 1 do
        same_bits_as(plain, tight, r, tcmd)
        -- per rank in memory: masters and accumulators whole, the shard's reduced gradient
        -- and state (AdamW's and LAMB's two arrays): 4 + 4 + 2 + 4 bytes a parameter; at
        -- the smallest budget the masters, the shard's gradients and the windows (twice the
        -- largest record's state, its accumulator), under half of that for 8 blocks
        local in_memory, budget = plain[r].stats.host_eps_bytes, tight[r].host_budget
        assert.is_true(in_memory >= 2 * budget, ("%s: rank %d: %d bytes in memory, budget %d"):format(
          tcmd, r, in_memory, budget))
        assert.is_true(tight[r].host_most <= budget, ("%s: rank %d held %d bytes, budget %d"):format(
          tcmd, r, tight[r].host_most, budget))
        -- the planner counts this rank's shards: its smallest budget is the first step's
        assert.are.equal(tight[r].first_budget, tight[r].plan_smallest, tcmd .. ": rank " .. r .. "'s smallest budget, planned")
      end
      local _, left = support.sh("ls -A " .. spill)
      assert.are.equal("", left, "spill files outlived their relays")
    end
  end)

  it("skips the same steps on every rank when a rank's gradients overflow (f16 gradients, a large loss scale)", function()
    if not need_mpi() then return end
    -- f16 gradients overflow at 2^22 times their size whenever an element passes 65504 /
    -- 2^22, which happens on some rank's visit and not on another's: the agreed
    -- finiteness makes every rank skip those steps and halve the scale alike, then
    -- update alike once the scale is small enough (3 or 4 of 8 steps skipped over seeds)
    local ranks, cmd = train(3, "steps=8 loss_scale=4194304 grad_precision=f16")
    assert_ranks_agree(ranks, cmd)
    for r = 0, #ranks do
      local st = ranks[r].stats
      assert.is_true(st.skipped_updates > 0 and st.updates > 0, cmd .. ": rank " .. r .. ": " .. st.skipped_updates ..
                     " skipped, " .. st.updates .. " applied")
      assert.are.equal(ranks[0].stats.skipped_updates, st.skipped_updates, cmd)
      assert.are.equal(ranks[0].stats.loss_scale, st.loss_scale, cmd)
    end
    assert.is_true(ranks[0].stats.loss_scale < 4194304, cmd)
  end)

  it("skip, on every rank alike, a record whose summed gradient would overflow its state", function()
    if not need_mpi() then return end
    -- One rank's accumulator gets 2^65 to 2^123 in one element before step 2 (one process:
    -- its own): the summed gradient holds it, so its record's update is skipped as an inf's
    -- would be (eps.h, EPS_GRAD_LIMIT), on every rank and in one process alike, eager and
    -- deferred (loss scaling: the ranks decide by the sum of their shards' largest, a bound
    -- within a factor 2 of the largest here, far above the limit either way).
    local value = (support.int(0, 1) == 0 and -1 or 1) * 2 ^ (65 + support.uniform(0, 58))
    for _, extra in ipairs({ "", "loss_scale=1" }) do
      local flags = ("steps=3 spike=%.17g spike_rank=%d spike_record=%d spike_at=%d %s"):format(
        value, support.int(0, 1), support.int(1, 30), support.int(0, 1e6), extra)
      assert_equivalent(flags, { 2 }, nil, function(ranks, cmd, one)
        assert.are.equal(1, one.spike_skipped, "one process: " .. cmd)
        for r = 0, #ranks do assert.are.equal(1, ranks[r].spike_skipped, ("rank %d: %s"):format(r, cmd)) end
      end)
    end
  end)

  it("over TCP (the transport between machines) as over shared memory", function()
    if not need_mpi() then return end
    assert_equivalent("optimizer=sgd steps=4", { 2 }, "--mca btl tcp,self")
  end)

  it("resumes a checkpoint saved on 2 ranks on 3 ranks and on one process", function()
    if not need_mpi() then return end
    local path = dir .. "/two.l2l"
    local whole = train(2, "steps=5 save=" .. path .. " save_at=2")[0]
    -- the file holds the run at step 2 exactly: loaded and not stepped, it is that run
    assert_same_params(train(2, "steps=2")[0], train(3, "steps=0 load=" .. path)[0])
    local tail = { losses = { whole.losses[3], whole.losses[4], whole.losses[5] }, params = whole.params }
    assert_close(tail, train(3, "steps=3 load=" .. path)[0], "3 ranks from the checkpoint")
    assert_close(tail, train(0, "steps=3 load=" .. path)[0], "one process from the checkpoint")
  end)

  it("2 ranks with 8-bit state (and bf16 masters) train as one process does, and resume on 3 ranks and on one", function()
    if not need_mpi() then return end
    -- (8-bit state: the shards hold whole blocks; a checkpoint gathers codes and scales)
    local optimizer = ({ "adamw", "lamb", "sgd" })[seed % 3 + 1]
    local function weights(r)   -- the masters and losses alone: a state's codes are bytes
      local out = { losses = r.losses, params = {} }
      for i, p in ipairs(r.params) do out.params[i] = { layer = p.layer, name = p.name, value = p.value, dtype = p.dtype } end
      return out
    end
    -- bf16 masters round stochastically, and a weight whose f32 update differs by float
    -- rounding between the runs can round to the other neighbour: one bf16 ulp (at most
    -- 2^-7 of it), which then moves every gradient of the steps after it a little. So: the
    -- same losses to 1e-4, and every array within 2 bf16 ulps of its largest magnitude,
    -- a bf16 master's with most weights the very same. (The exchange itself is checked
    -- to f32's tolerance above; here its 16-bit all-gather and the draws by element.)
    -- An array that starts at zero (a bias) has no scale but its updates': its gradient is
    -- mostly cancellation, which a flip elsewhere changes by a large fraction, and AdamW's
    -- and LAMB's normalized steps carry that whole (seen: 2.4 % of a bias's largest, seed
    -- 129250510). Such an array is held to what the optimizer can move a weight from zero
    -- in the run whatever its gradients (`reach`), in each of the two runs.
    local l2l = require("l2l")
    local steps = 5
    local opt = ({ adamw = l2l.AdamW { lr = 3e-3, weight_decay = 0.1, eps = 1e-3 },   -- spec/dist/train.lua's
                   lamb = l2l.LAMB { lr = 3e-3, eps = 1e-3 } })[optimizer]
    -- |m^| / sqrt(v^) after t steps, whatever the gradients: Cauchy-Schwarz over the
    -- weights a_k, b_k the bias-corrected moments give step k's gradient and its square
    local function adam_ratio(t)
      local s = 0
      for k = 1, t do
        local a = (1 - opt.beta1) * opt.beta1 ^ (t - k) / (1 - opt.beta1 ^ t)
        local b = (1 - opt.beta2) * opt.beta2 ^ (t - k) / (1 - opt.beta2 ^ t)
        s = s + a * a / b
      end
      return math.sqrt(s)
    end
    -- 8-bit state: m's code can round it up and sqrt(v)'s round it down, each at most to
    -- its coarsest neighbours' midpoint (the codes as include/l2l/relay.h states them: the
    -- values 10^-E (0.1 + 0.9 (k + 1) / 2^(b-1-E)); sqrt(v) is 0 only where m is): the
    -- codes a step reads, taken once (their compounding over the steps, a factor a step,
    -- is left out: that bound would hold nothing)
    local function code_rounding(b, up)
      local values = {}
      for E = b - 1, 0, -1 do
        for k = 0, 2 ^ (b - 1 - E) - 1 do values[#values + 1] = 10 ^ -E * (0.1 + 0.9 * (k + 1) / 2 ^ (b - 1 - E)) end
      end
      table.sort(values)
      local worst = 1
      for i = 2, #values do
        local lo, hi = values[i - 1], values[i]
        worst = up and math.max(worst, 2 * hi / (lo + hi)) or math.min(worst, 2 * lo / (lo + hi))
      end
      return worst
    end
    local codes = code_rounding(7, true) / code_rounding(8, false)
    -- the largest magnitude P a weight that starts at zero can reach in the run: AdamW
    -- steps by lr (|m^|/sqrt(v^) + wd |p|); LAMB by lr trust |r_i|, r_i = m^/(sqrt(v^)+eps)
    -- + wd p, with trust 1 where the record is zero and ||p|| / ||r|| <= ||p|| / |r_i| elsewhere
    local function reach(n)
      local P = 0
      for t = 1, steps do
        local r = adam_ratio(t) * codes + opt.weight_decay * P
        P = P + opt.lr * (optimizer == "lamb" and math.max(r, math.sqrt(n) * P) or r)
      end
      return P
    end
    local start   -- the weights before the first step
    local function few_flips(want, got, what)
      for i = 1, #want.losses do
        local a, b = num(want.losses[i]), num(got.losses[i])
        assert.is_true(support.within(math.abs(a - b), 1e-4 * math.abs(a), "ranks' 16-bit loss", 2),
                       ("%s: loss of step %d: %.9g, one process %.9g"):format(what, i, b, a))
      end
      for i, w in ipairs(want.params) do
        local differ, diff, size, from_zero = 0, 0, 0, opt ~= nil
        for j = 1, #w.value do
          local a, b = num(w.value[j]), num(got.params[i].value[j])
          size = math.max(size, math.abs(a))
          if a ~= b then differ, diff = differ + 1, math.max(diff, math.abs(a - b)) end
          if num(start.params[i].value[j]) ~= 0 then from_zero = false end
        end
        -- (seen in 24 runs, 2026-11-27: at most 8 % of a bf16 array's weights differed, and
        -- no weight by more than 0.0065 of its array's largest; a stochastic rounding that
        -- drew other numbers than one process's would change about half of them)
        local bf16 = w.dtype == "bf16"
        local bound = from_zero and 2 * reach(#w.value) or 2 * 2 ^ -7 * size
        local ok = diff <= bound and (not bf16 or differ <= 0.25 * #w.value)
        assert.is_true(ok, ("%s: %d.%s (%s): %d of %d weights differ, by up to %.3g of the largest, %.3g (%s %.3g)"):format(
          what, w.layer, w.name, w.dtype, differ, #w.value, diff / math.max(size, 1e-30), size,
          from_zero and "from zero, bound" or "bound", bound))
      end
    end
    -- f32 masters: an 8-bit code that rounds the other way in the two runs (a state whose
    -- f32 value differs by float rounding, across a code boundary) moves that element's
    -- update by up to a code step, 0.9/64 of its block's largest (the signed 7-bit code's
    -- top decade) against bf16's 2^-7: flips as bf16 masters' are, held to the same bound
    -- (seen: 0.43 % of an array's largest, seed 21247752, beyond f32 state's 3e-3)
    local flags = "state=8bit optimizer=" .. optimizer
    start = weights(train(0, "steps=0 " .. flags)[0])
    few_flips(weights(train(0, "steps=5 " .. flags)[0]), weights(train(2, "steps=5 " .. flags)[0]), flags)
    flags = flags .. " master=bf16"
    local path = dir .. "/compact.l2l"
    local one = train(0, "steps=5 " .. flags)[0]
    local ranks, cmd = train(2, "steps=5 save=" .. path .. " save_at=2 " .. flags)
    few_flips(weights(one), weights(ranks[0]), cmd)
    assert_ranks_agree(ranks, cmd)
    -- the file holds the 2 ranks' run at step 2 exactly, state codes and scales included
    assert_same_params(train(2, "steps=2 " .. flags)[0], train(3, "steps=0 load=" .. path)[0])
    local tail = weights({ losses = { ranks[0].losses[3], ranks[0].losses[4], ranks[0].losses[5] },
                           params = ranks[0].params })
    few_flips(tail, weights(train(3, "steps=3 load=" .. path)[0]), "3 ranks from the checkpoint")
    few_flips(tail, weights(train(0, "steps=3 load=" .. path)[0]), "one process from the checkpoint")
  end)

  it("leaves no rank in a gather when rank 0's checkpoint cannot be written, and trains on", function()
    -- each record's state is gathered as the file reaches it: rank 0's file cannot be
    -- made, so it gathers nothing inside its write and the rest after it, with rank 1
    if not need_mpi() then return end
    local path = dir .. "/fails.l2l"
    local failed = train(2, "steps=4 save_at=2 save_fail=1 save=" .. path)
    assert.is_truthy(failed[0].save_error and failed[0].save_error:find("fails.l2l.missing/run.l2l", 1, true),
                     tostring(failed[0].save_error))
    assert.is_nil(failed[1].save_error, "rank 1 wrote nothing and was told nothing")
    assert.is_nil(io.open(path, "rb"), "rank 1 does not write")
    -- the run goes on as one that never saved, to the bit
    local plain = train(2, "steps=4")
    assert.are.same(plain[0].losses, failed[0].losses)
    for i, p in ipairs(plain[1].params) do
      assert.are.same(p.value, failed[1].params[i].value, p.name)
      assert.are.same(p.state1, failed[1].params[i].state1, p.name)
    end
  end)

  it("runs the demo across 2 ranks to one process's numbers: `mpirun -np 2 build/l2l examples/train_gpt.lua --dist mpi`", function()
    if not need_mpi() then return end
    local flags = ("--steps 6 --eval-every 3 --layers 1 --dim 32 --batch 5 --max-bytes 200000 --sample 0 --plot none --seed %d"):format(seed)
    local function last_lines(cmd)
      local status, out = support.sh("L2L_PROGRESS=plain timeout 240 " .. cmd)
      assert.are.equal(0, status, cmd .. "\n" .. out)
      local loss = out:match("\nloss: ([^\n]+)")
      assert.is_truthy(loss, cmd .. "\n" .. out)
      return loss, out
    end
    local one = last_lines(("%s examples/train_gpt.lua %s --out %s/demo1"):format(exe, flags, dir))
    local two, out = last_lines(("%s -x L2L_PROGRESS %s examples/train_gpt.lua --dist mpi %s --out %s/demo2"):format(
      mpirun(2), exe, flags, dir))
    assert.are.equal(one, two, out)
    assert.is_truthy(out:find("on each of 2 MPI ranks", 1, true), out)
    assert.is_truthy(out:find("step 6/6  2 ranks  loss", 1, true), out)
    local _, lines = out:gsub("\nloss: ", "")
    assert.are.equal(1, lines, "only rank 0 prints:\n" .. out)
  end)

  -- A job that must fail: its output, after checking that it ended by itself with a
  -- non-zero status (timeout(1) ends a hung one with 124). How soon it ended is read from
  -- what it says (which rank ended it, and why), never from a clock.
  local function failed_job(flags)
    local cmd = ("timeout 120 %s %s spec/dist/train.lua %s/x %d dist=mpi %s"):format(mpirun(2), exe, dir, seed, flags)
    local status, out = support.sh(cmd)
    assert.are_not.equal(0, status, out)
    assert.are_not.equal(124, status, "the job hung until timeout(1) killed it:\n" .. out)
    return out
  end

  it("refuses, on every rank alike, a step whose ranks hold different models", function()
    if not need_mpi() then return end
    local out = failed_job("extra_layer_rank=1")
    assert.is_truthy(out:find("the ranks differ: on rank 1 number of active layers is 5, on rank 0 4", 1, true), out)
    assert.is_falsy(out:find("(the timeout)", 1, true), out)
  end)

  it("refuses, on every rank alike, a step one rank's host budget cannot hold", function()
    -- whether each rank began the step (its budget's check) is exchanged before any of the
    -- step's collectives: rank 1 names its budget, rank 0 names rank 1; neither posts a
    -- collective the other would not (before, rank 0 went on into the step and waited out
    -- the timeout)
    if not need_mpi() then return end
    local spill = dir .. "/spill_refused"
    assert(os.execute("mkdir -p " .. spill) == 0)
    local out = failed_job("timeout=100 spill=" .. spill .. " rank1_host_budget=1000")
    assert.is_truthy(out:find("host budget of 1000 bytes (1000 B) is below the", 1, true), out)
    assert.is_truthy(out:find("rank 1 of 2 could not begin step 1", 1, true), out)
    assert.is_falsy(out:find("(the timeout)", 1, true), out)
  end)

  -- Hardening 2, item 6: these trained to the end with exit 0 (other heads, learning rate),
  -- or waited out the whole timeout blaming a dead rank (accumulate 2 against 1). Every
  -- rank refuses the first step, each naming the first difference on its side.
  for _, case in ipairs({
    { "rank1_heads=2", "layer 2 (block): heads is 2, on rank 0 3", "layer 2 (block): heads is 3, on rank 1 2" },
    { "rank1_lr=0.004", "optimizer: lr is 0.00400000019, on rank 0 0.00300000003",
      "optimizer: lr is 0.00300000003, on rank 1 0.00400000019" },
    { "rank1_accumulate=2", "accumulate is 2, on rank 0 1", "accumulate is 1, on rank 1 2" },
    { "rank1_clip=0.5", "clip_global_norm is 0.5, on rank 0 0", "clip_global_norm is 0, on rank 1 0.5" },
    -- (a choice by its name; the ranks' exchange differs with the placement)
    { "rank1_placement=device", "placement is device, on rank 0 host", "placement is host, on rank 1 device" },
  }) do
    it("refuses ranks that differ in " .. case[1]:match("_(%w+)=") .. " at the first step, naming it on each side", function()
      if not need_mpi() then return end
      local out = failed_job("timeout=100 " .. case[1])
      assert.is_truthy(out:find("on rank 1 " .. case[2], 1, true), out)
      assert.is_truthy(out:find("on rank 0 " .. case[3], 1, true), out)
      assert.is_falsy(out:find("(the timeout)", 1, true), out)
    end)
  end

  it("ends the job with a message when a rank hangs (the others time out), not never", function()
    if not need_mpi() then return end
    local out = failed_job("timeout=3 hang_rank=1 hang_step=2")
    assert.is_truthy(out:find("rank 0 of 2: waited %d+ s %(the timeout%) for the [%w%- ']+.* at step 2"), out)
    assert.is_truthy(out:find("MPI_Abort", 1, true), out)
  end)

  it("ends the job at once when a rank's script fails, not after the others' timeout", function()
    if not need_mpi() then return end
    local out = failed_job("timeout=100 bad_rank=1 bad_step=2")
    assert.is_truthy(out:find("is outside [0, 96)", 1, true), out)   -- the failing rank's own error
    assert.is_truthy(out:find("rank 1 of 2: the script failed (its error is above); ending the job (MPI_Abort)", 1, true), out)
    -- the failing rank ended the job: rank 0 never waited out its timeout
    assert.is_falsy(out:find("(the timeout)", 1, true), out)
  end)

  it("ends the job when a rank is killed, and the last checkpoint still loads", function()
    if not need_mpi() then return end
    local path = dir .. "/before-kill.l2l"
    local out = failed_job("steps=50 save=" .. path .. " save_at=2 die_rank=1 die_step=4")
    assert.is_truthy(out:lower():find("signal 9", 1, true) or out:find("killed", 1, true), out)
    local resumed = train(0, "steps=1 load=" .. path)[0]
    assert.are.equal(3, resumed.stats.steps)
  end)
end)

-- Issue 47: a second host that really is one. Two network namespaces, each with its own
-- address, joined by a veth pair (spec/dist/hosts.sh): mpirun starts in the first and
-- starts the second's daemon through hosts.sh (its rsh agent, in place of ssh), and the
-- ranks' TCP, OpenMPI's own included, goes over that link alone, which can be cut. The
-- daemons' connections are told to notice a dead link within seconds (TCP keepalive
-- after 1 s idle, 3 probes 1 s apart: the README's advice for several hosts, shortened);
-- OpenMPI's own default notices after about 8 minutes.
describe("data parallel on two hosts joined by a link (network namespaces)", function()
  local name = ("l2l%d"):format(tonumber(select(2, support.sh("echo $PPID"))) % 100000)
  local why_no_hosts
  local hosts = support.root .. "/spec/dist/hosts.sh"
  setup(function()
    if why_not then return end
    local status, out = support.sh(("%s up %s"):format(hosts, name))
    if status ~= 0 then why_no_hosts = "no second host here: " .. out:gsub("\n$", "") end
  end)
  teardown(function() support.sh(("%s down %s"):format(hosts, name)) end)

  local function need_hosts()
    local why = why_not or why_no_hosts
    if why then pending(why) return false end
    return true
  end

  local prefix = ("ip netns exec %s-a env L2L_HOSTS=%s "):format(name, name)
  local link = "--host 10.231.0.1,10.231.0.2 --mca plm_rsh_agent '" .. hosts .. " agent' " ..
               "--mca btl tcp,self --mca btl_tcp_if_include 10.231.0.0/24 --mca oob_tcp_if_include 10.231.0.0/24 " ..
               "--mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3"

  it("trains as one process does, each rank on its own host", function()
    if not need_hosts() then return end
    local one = train(0, "steps=4")[0]
    local ranks, cmd = train(2, "steps=4", link, prefix)
    assert_close(one, ranks[0], cmd)
    assert_ranks_agree(ranks, cmd)
    assert.is_true(ranks[0].stats.dist_sent_bytes > 0, cmd)
  end)

  -- The job under `timeout 90` (124: it hung), its output; while it runs, act() once every
  -- rank said it waits (train.lua's wait_file), then the file is made.
  local function job(flags, act)
    local out, go = ("%s/hosts%d"):format(dir, support.int(1, 1e9)), ("%s/go%d"):format(dir, support.int(1, 1e9))
    local cmd = ("timeout 90 %s %s spec/dist/train.lua %s %d dist=mpi wait_file=%s %s 2>&1; echo \"exit $?\"")
                :format(mpirun(2, link, prefix), exe, out, seed, go, flags)
    local pipe = assert(io.popen(cmd))
    local text, waiting = {}, 0
    for line in pipe:lines() do
      text[#text + 1] = line
      if line:find("^rank %d: waiting for ") then
        waiting = waiting + 1
        if waiting == 2 then act(); assert(io.open(go, "w")):close() end
      end
    end
    pipe:close()
    text = table.concat(text, "\n")
    local status = tonumber(text:match("exit (%d+)$"))
    assert.are_not.equal(0, status, text)
    assert.are_not.equal(124, status, "the job hung until timeout(1) ended it:\n" .. text)
    -- no rank of the job is left on either host within 45 s (the timeout given, and 10 s
    -- after it a rank whose MPI call does not come back ends itself: comm_thread.c's
    -- watchdog; OpenMPI's daemon on a host cut off may outlive the job: hosts.sh down
    -- ends what is left) ([t]: the pattern does not match the shell running it)
    local alive = "pgrep -f 'spec/dist/[t]rain.lua " .. out .. "'"
    local _, left = support.sh("for i in $(seq 450); do " .. alive .. " >/dev/null || exit 0; sleep 0.1; done; " .. alive)
    assert.are.equal("", left, text)
    return text, status
  end

  it("ends on both hosts when the second host's rank is killed, naming the rank, and the last checkpoint loads", function()
    if not need_hosts() then return end
    local path = dir .. "/before-kill2.l2l"
    local text = job("steps=20 save=" .. path .. " save_at=2 wait_step=3 die_rank=1 die_step=4", function() end)
    assert.is_truthy(text:find("rank 1 with PID %d+ on node 10%.231%.0%.2 exited on signal 9"), text)
    local resumed = train(0, "steps=1 load=" .. path)[0]
    assert.are.equal(3, resumed.stats.steps)
  end)

  it("ends on both hosts, naming the host and the cause, when the link is cut mid-run; the last checkpoint loads", function()
    if not need_hosts() then return end
    local path = dir .. "/before-cut.l2l"
    -- (last: the link stays cut) OpenMPI's daemons notice the dead link by its keepalive
    -- (about 4 s here) and end the job, naming the host cut off: l2l's own timeout is set
    -- above that, as the README says to (a rank's MPI_Abort sent before would wait for
    -- TCP to give up on the cut link's unacknowledged data: minutes). A rank whose daemon
    -- died without ending it ends by its own timeout (l2l's, then 10 s of the watchdog's
    -- grace): job() waits for that.
    local text = job("steps=20 timeout=10 save=" .. path .. " save_at=2 wait_step=3", function()
      assert.are.equal(0, support.sh(("%s cut %s"):format(hosts, name)))
    end)
    assert.is_truthy(text:find("ORTE has lost communication with a remote daemon", 1, true), text)
    assert.is_truthy(text:find("Remote daemon: [[%d,]+%],1%] on node 10%.231%.0%.2"), text)
    local resumed = train(0, "steps=1 load=" .. path)[0]
    assert.are.equal(3, resumed.stats.steps)
  end)
end)
