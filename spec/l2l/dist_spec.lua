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
-- never stopped. (What ends a job, and two hosts: dist_faults_spec.lua; the runs and
-- comparisons both use: spec/dist/runs.lua.) Without MPI built, the cases that need it
-- say so and are skipped; what a program that never asks for MPI loads is checked either way.
local dist = setfenv(assert(loadfile("spec/dist/runs.lua")), getfenv(1))()
local support, exe, seed, dir, train, num = dist.support, dist.exe, dist.seed, dist.dir, dist.train, dist.num
local have_plugin, sanitizer_env, mpirun, need_mpi = dist.have_plugin, dist.sanitizer_env, dist.mpirun, dist.need_mpi
local assert_close, assert_same_params = dist.assert_close, dist.assert_same_params
local assert_ranks_agree, assert_equivalent = dist.assert_ranks_agree, dist.assert_equivalent
local cjson = require("cjson")
local l2l = require("l2l")

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
    -- same losses to 1e-4, and every array within 2 bf16 ulps of its largest magnitude.
    -- (The exchange itself is checked to f32's tolerance above; here its 16-bit all-gather.)
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
        -- (seen in 24 runs, 2026-11-27: no weight by more than 0.0065 of its array's
        -- largest. How many differ is no measure: it grows with the steps, as each flip moves
        -- the next steps' gradients, to 33 % of one array after 5 steps, seed 360543585.
        -- That a shard draws what the whole record draws, by element, is checked to the bit
        -- by the device placement's cases above, where each rank updates whole records.)
        local bound = from_zero and 2 * reach(#w.value) or 2 * 2 ^ -7 * size
        local ok = diff <= bound
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
end)

describe("l2l.dist.sum under mpirun", function()
  it("gives every rank the sum over the ranks, of a number and of a list", function()
    if not need_mpi() then return end
    local n = 3
    local status, out = support.sh(("timeout 120 %s %s -e '%s'"):format(mpirun(n), exe, [[
      local l2l = require("l2l")
      local r = l2l.dist.rank()
      local s = l2l.dist.sum({ r + 0.5, r * r, -1 })
      print(("rank %d: %.17g %.17g %.17g %.17g"):format(r, s[1], s[2], s[3], l2l.dist.sum(2 ^ -40 * (r + 1))))]]))
    assert.are.equal(0, status, out)
    local want_half, want_squares, want_scalar = 0, 0, 0   -- float64 sums of what each rank gave
    for r = 0, n - 1 do
      want_half, want_squares, want_scalar = want_half + r + 0.5, want_squares + r * r, want_scalar + 2 ^ -40 * (r + 1)
    end
    for r = 0, n - 1 do
      local a, b, c, d = out:match(("rank %d: (%%S+) (%%S+) (%%S+) (%%S+)"):format(r))
      assert.is_truthy(a, ("rank %d printed nothing:\n%s"):format(r, out))
      assert.are.same({ want_half, want_squares, -n, want_scalar }, { tonumber(a), tonumber(b), tonumber(c), tonumber(d) }, out)
    end
  end)
end)

-- A data-parallel run stops as one process does (relay_interrupt_spec): after the step, its
-- checkpoint written. Every rank must stop after the same step: a rank that stopped alone
-- would leave the others waiting in the next step's collectives (until L2L_DIST_TIMEOUT,
-- 60 s here, ends the job), so train_gpt's ranks agree after each step whether any was
-- signalled. Both ways a stop comes: a signal to one rank alone (a scheduler's, a user's
-- kill), and SIGUSR1 to mpirun, which passes it on to every rank. Each rank's spill file is
-- removed on the way out (MPI is finalized, which every rank reaches after closing its
-- relay, before the first one ends by the signal).
describe("stopping a data-parallel run", function()
  -- train_gpt on 2 ranks, until a watcher sends `sig` once step 3 is in the metrics (while
  -- the job runs): to rank 1 alone (who = "rank 1": the process whose environment says so
  -- and whose command names out_dir) or to mpirun; a watchdog ends the job two minutes on.
  local function stopped_run(name, sig, who)
    local out_dir = ("%s/stop-%s"):format(dir, name)
    local ckpt = out_dir .. "/run.safetensors"
    assert(os.execute("mkdir -p " .. out_dir .. "/spill") == 0)
    local target = who == "rank 1"
      and ("$(for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && " ..
           "tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qF -- '%s/' && echo ${p#/proc/}; done)"):format(out_dir)
      or "$$"
    local watcher = ("n=0; until grep -q '\"step\":3,' '%s/metrics.jsonl' 2>/dev/null || ! kill -0 $$ 2>/dev/null || " ..
                     "[ $n -ge 2400 ]; do sleep 0.05; n=$((n+1)); done; kill -0 $$ 2>/dev/null && kill -%s %s; " ..
                     "n=0; while kill -0 $$ 2>/dev/null && [ $n -lt 2400 ]; do sleep 0.05; n=$((n+1)); done; " ..
                     "kill -KILL $$ 2>/dev/null"):format(out_dir, sig, target)
    local command = ("%s -x L2L_PROGRESS -x L2L_DIST_TIMEOUT %s examples/train_gpt.lua --dist mpi --steps 100000 " ..
                     "--layers 1 --dim 32 --heads 2 --seq 32 --batch 6 --eval-every 1000 --eval-batches 1 " ..
                     "--max-bytes 100000 --plot none --sample 20 --seed %d --out %s --checkpoint %s --spill %s/spill"):format(
                     mpirun(2), exe, seed, out_dir, ckpt, out_dir)
    local script = support.write_temp(("(%s) >/dev/null 2>&1 &\nL2L_PROGRESS=plain L2L_DIST_TIMEOUT=60 exec %s\n"):format(
      watcher, command))
    local status, out = support.sh(("sh -c 'sh %s; exit $?' 2>&1"):format(script))
    os.remove(script)
    return status, out, ckpt, out_dir
  end

  for _, case in ipairs({ { "term-rank1", "TERM", "SIGTERM", "rank 1" }, { "usr1-mpirun", "USR1", "SIGUSR1", "mpirun" } }) do
    local name, sig, shown, who = case[1], case[2], case[3], case[4]
    it(("stops every rank after the same step on %s to %s, and saves the checkpoint at it"):format(shown, who), function()
      if not need_mpi() then return end
      local status, out, ckpt, out_dir = stopped_run(name, sig, who)
      local context = ("seed %d, status %s, output:\n%s"):format(seed, tostring(status), out)
      assert.are.equal(support.killed_by(sig), status, context)   -- mpirun ends as its ranks did
      local stopped = tonumber(out:match(("\nstopped at step (%%d+) of 100000 %%(%s%%)\n"):format(shown)))
      assert.is_truthy(stopped, context)
      assert.is_true(stopped >= 3, context)
      local _, lines = out:gsub("\nstopped at step ", "")
      assert.are.equal(1, lines, "only rank 0 prints: " .. context)
      -- rank 0 says why once: the signal's line where it got one, else whose it was
      local said = who == "rank 1" and ("train_gpt: %s on 1 other rank: stopping after this step"):format(shown)
                   or ("train_gpt: %s: stopping after this step (a second signal stops at once)"):format(shown)
      local _, says = out:gsub(said:gsub("%p", "%%%0"), "")
      assert.are.equal(1, says, ("%q once: %s"):format(said, context))
      local _, stopping = out:gsub("stopping after this step", "")
      assert.are.equal(1, stopping, "one line says it stops: " .. context)
      assert.is_truthy(out:find(("checkpoint: %s (step %d): --resume continues from it"):format(ckpt, stopped), 1, true), context)
      assert.is_truthy(out:find(("sample: none (stopped by %s)"):format(shown), 1, true), context)
      assert.is_falsy(out:find("timed out", 1, true), context)
      -- every rank closed its relay before mpirun saw one end: no spill file is left
      assert.is_truthy(out:find("\nspill: ", 1, true), context)
      local _, left = support.sh("ls -A " .. out_dir .. "/spill")
      assert.are.equal("", left, "the spill folder after the stop holds: " .. left .. "\n" .. context)
      local last
      for line in io.lines(out_dir .. "/metrics.jsonl") do last = cjson.decode(line) end
      assert.are.equal(stopped, last and last.step, context)
      -- the file is the 2 ranks' whole run at that step: it loads in one process
      local info = l2l.checkpoint_info(ckpt)
      assert.are.equal(stopped, info.steps, context)
      local run = l2l.load(ckpt, { dist = "none" })
      assert.are.equal(stopped, run:stats().steps, context)
      run:free()
    end)
  end
end)

describe("a data-parallel stop's end", function()
  -- A script on each rank whose loop asks the ranks once a turn whether to stop; rank 0
  -- raises SIGTERM at its fifth turn. With `marker`, rank 1 holds a finalizer that takes
  -- 3 s (as closing a large relay may) and then writes the marker file.
  local function raising_script(marker)
    return support.write_temp(([[
      local l2l = require("l2l")
      local progress = require("l2l.progress")
      local ffi = require("ffi")
      ffi.cdef("int raise(int sig);")
      local rank, marker = l2l.dist.rank(), %s
      if rank == 1 and marker then
        slow = newproxy(true)   -- (a global: freed only when the state closes)
        getmetatable(slow).__gc = function()
          local t = progress.now()
          while progress.now() - t < 3 do end
          local f = assert(io.open(marker, "w"))
          f:write("closed\n")
          f:close()
        end
      end
      local stop = require("l2l.cli").interrupt { dist = "mpi" }
      for i = 1, 1000000 do
        if i == 5 and rank == 0 then ffi.C.raise(15) end
        if stop:requested() then break end
      end
      print(("rank %%d stops on %%s"):format(rank, stop:signal()))
      io.stdout:flush()
      stop:finish()
      print("not reached")
    ]]):format(marker and ("%q"):format(marker) or "nil"))
  end

  -- The ranks' end: status, and each rank said why it stops and nothing after.
  local function assert_stopped(status, out)
    local context = ("status %s, output:\n%s"):format(tostring(status), out)
    assert.are.equal(143, status, context)
    assert.is_truthy(out:find("rank 0 stops on SIGTERM", 1, true), context)
    assert.is_truthy(out:find("rank 1 stops on SIGTERM", 1, true), context)
    assert.is_falsy(out:find("not reached", 1, true), context)
    assert.is_falsy(out:find("MPI_ABORT", 1, true), context)
    return context
  end

  -- Each rank closes its Lua state (its relay, its spill file) and finalizes MPI before it
  -- ends by the signal, so a rank whose closing takes a while is not cut short: mpirun ends
  -- the others itself (SIGTERM a second on) once a rank is gone without finalizing.
  it("lets every rank close before any ends", function()
    if not need_mpi() then return end
    local marker = dir .. "/closed-rank1"
    os.remove(marker)
    local script = raising_script(marker)
    local status, out = support.sh(("sh -c 'timeout 120 %s %s %s; exit $?' 2>&1"):format(mpirun(2), exe, script))
    os.remove(script)
    local context = assert_stopped(status, out)
    assert.is_truthy(out:find("SIGTERM: stopping after this step", 1, true), context)
    assert.are.equal("closed\n", support.read_file(marker), "rank 1 was ended before it closed: " .. context)
  end)

  -- A rank whose parent had it ignore the signal another rank got cannot end by it: it
  -- ends with that signal's status instead (128 + 15), not with an error that aborts the job.
  it("ends a rank that ignores the agreed signal with its status", function()
    if not need_mpi() then return end
    local script = raising_script(nil)
    local status, out = support.sh(("sh -c 'timeout 120 %s %s %s : -np 1 env --ignore-signal=TERM %s %s; exit $?' 2>&1"):format(
      mpirun(1), exe, script, exe, script))
    os.remove(script)
    local context = assert_stopped(status, out)
    assert.is_falsy(out:find("interrupted", 1, true), context)
  end)
end)
