-- SPDX-License-Identifier: MIT
-- plan_spec — the planner from Lua (l2l.plan, plan = "auto"): plans that fit and say so,
-- the relay reaching the peak the plan predicted (to the byte on the CPU backend), plans
-- made again when the model or the batch's shape changes, a budget too small for any
-- plan named with the smallest that would do, and, on rates shaped like a GPU on PCIe,
-- the rule of thumb (weight streaming hides under compute only past a number of tokens
-- per layer visit) coming out of the model. The search's optimality and the peak's
-- exactness on random chains are test_plan.c's.
local support = dofile("spec/support.lua")
local l2l = require("l2l")

local V, S = 16, 12

local function tiny_gpt(blocks, dim, max_seq)
  dim = dim or 32
  local list = { l2l.Embedding { vocab = V, dim = dim, max_seq = max_seq or S, seed = 1 } }
  for b = 1, blocks do
    list[#list + 1] = l2l.Block { dim = dim, heads = 4, causal = true, dropout = 0.1, seed = 1 + b,
                                  memory = b % 2 == 0 and "frugal" or "standard" }
  end
  list[#list + 1] = l2l.LMHead { vocab = V, dim = dim, tie = true, seed = 99 }
  return l2l.Sequential(list)
end

local function batch(B, seq)
  local tok, tgt = l2l.zeros({ B, seq or S }, { dtype = "i32" }), l2l.zeros({ B, seq or S }, { dtype = "i32" })
  for b = 1, B do
    for s = 1, seq or S do
      local t = support.int(0, V - 1)
      tok:set(b, s, t)
      tgt:set(b, s, (t + 1) % V)
    end
  end
  return tok, tgt
end

-- The measured peak is the predicted one to the byte, but where a layer swaps: swap
-- moves run on the copy threads, and the prediction is the bound whatever their timing.
local function reaches_predicted_peak(st, plan, what)
  local swaps = false
  for _, l in ipairs(plan.layers) do swaps = swaps or l.inner == "swap" end
  if swaps then
    assert.is_true(st.device_peak <= st.predicted_device_peak,
                   ("%s: peak %d above the bound %d"):format(what, st.device_peak, st.predicted_device_peak))
  else
    assert.are.equal(st.predicted_device_peak, st.device_peak, what)
  end
  -- the time model walks the relay's schedule: what it copies each way, to the byte
  assert.are.equal(plan.h2d_bytes, st.h2d_bytes, what .. ": bytes to the device")
  assert.are.equal(plan.d2h_bytes, st.d2h_bytes, what .. ": bytes back")
end

-- rates shaped like a GPU on PCIe: layers cost their FLOPs, no layer is timed here
local GPU = { flops = 4e14, h2d = 2.5e10, d2h = 2.5e10, optimizer = 2e10, visit = 5e-6 }

describe("l2l.plan (seed " .. support.seed .. ")", function()
  it("plans within the budget, and the relay reaches the predicted peak (to the byte without swap)", function()
    math.randomseed(support.seed)
    local model = tiny_gpt(support.int(2, 4))
    local B = support.int(3, 9)
    -- from the leanest plan's needs up to everything kept
    local lean = l2l.plan { model = model, batch = B, seq = S, device_budget = 2 ^ 40, rates = GPU }
    for _, budget in ipairs({ 2 ^ 40, support.int(200, 600) * 2 ^ 10, support.int(120, 200) * 2 ^ 10 }) do
      local ok, plan = pcall(l2l.plan, { model = model, batch = B, seq = S, device_budget = budget })
      if ok then
        assert.is_true(plan.device_peak <= budget, ("peak %d over the budget %d"):format(plan.device_peak, budget))
        assert.is_true(plan.micro_batch >= 1 and plan.micro_batch <= B)
        assert.are.equal(#model, #plan.layers)
        local text = tostring(plan)
        assert.is_truthy(text:find("predicted", 1, true), text)
        local run = l2l.Relay { model = model, plan = plan, optimizer_threads = 1 }
        for _ = 1, 2 do run:step(batch(B)) end
        local st = run:stats()
        reaches_predicted_peak(st, plan, "budget " .. budget)
        assert.are.equal(plan.step_seconds, st.predicted_step_seconds)
        local report = run:plan_report()
        assert.are.equal(#model, #report.layers)
        for i, l in ipairs(report.layers) do
          assert.is_true(l.measured > 0, ("layer %d: no measured time"):format(i))
          assert.are.equal(plan.layers[i].seconds, l.predicted)
        end
        run:free()
      else
        assert.is_truthy(tostring(plan):find("no plan fits", 1, true), plan)
      end
    end
    assert.is_true(lean.device_peak > 0)
  end)

  it("plans with the records on the device, and the relay holds what it predicts", function()
    -- placement device: no record's bytes on the host or across the link, the records'
    -- device bytes (the plan's count) the relay's, and the step's peak reached as above
    local model = tiny_gpt(support.int(2, 3))
    local B = support.int(2, 6)
    local plan = l2l.plan { model = model, batch = B, seq = S, device_budget = 2 ^ 40, rates = GPU,
                            placement = "device" }
    assert.is_true(plan.device_records_bytes > 0 and plan.host_eps_bytes == 0)
    assert.is_truthy(tostring(plan):find("beside the records placed on the device", 1, true), tostring(plan))
    local run = l2l.Relay { model = model, plan = plan, placement = "device", optimizer_threads = 1 }
    for _ = 1, 2 do run:step(batch(B)) end
    local st = run:stats()
    reaches_predicted_peak(st, plan, "placement device")
    local report = run:plan_report()
    assert.are.equal(plan.device_records_bytes, report.predicted_device_records_bytes)
    assert.are.equal(plan.device_records_bytes, report.device_records_bytes)
    assert.are.equal(0, report.host_eps_bytes)
    assert.are.equal(plan.h2d_bytes, st.h2d_bytes)
    assert.is_truthy(tostring(report):find("records on the device: predicted", 1, true), tostring(report))
    run:free()
    -- a plan made for the records on the host is not a relay's that keeps them on the device
    local host_plan = l2l.plan { model = model, batch = B, seq = S, device_budget = 2 ^ 40, placement = "host", rates = GPU }
    local ok, err = pcall(l2l.Relay, { model = model, plan = host_plan, placement = "device" })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("placement", 1, true), tostring(err))
  end)

  it("measures this machine's rates and its layers outside the pools' high-water marks", function()
    -- A measurement's buffers (copies of up to 32 MiB each way, the host optimizer's 64 MiB,
    -- a small relay for a visit's cost, each layer's twin) are not the program's: under a
    -- fresh cache everything is measured, and each pool's peak is what it was before (or
    -- what is in use now, where that is more).
    local ffi = require("ffi")
    pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
    local was = os.getenv("XDG_CACHE_HOME")
    ffi.C.setenv("XDG_CACHE_HOME", support.tmpdir(), 1)
    local model = tiny_gpt(2, 4 * support.int(8, 24))
    local kinds, before = { "host", "pinned", "device" }, {}
    for _, k in ipairs(kinds) do
      l2l.reset_peak(k)
      before[k] = l2l.pool_stats(k).peak
    end
    local ok, err = pcall(function()
      local rates = l2l.calibrate { remeasure = true }
      assert.is_true(rates.h2d > 0 and rates.optimizer > 0 and rates.visit >= 0)
      local plan = l2l.plan { model = model, batch = 4, seq = S, device_budget = 2 ^ 30 }
      assert.is_true(plan.step_seconds > 0)
    end)
    if was then ffi.C.setenv("XDG_CACHE_HOME", was, 1) else ffi.C.unsetenv("XDG_CACHE_HOME") end
    assert(ok, err)
    for _, k in ipairs(kinds) do
      local s = l2l.pool_stats(k)
      assert.are.equal(math.max(before[k], s.current), s.peak, k)
    end
  end)

  it("names the smallest budget when none fits, and what needs it", function()
    local model = tiny_gpt(2)
    local ok, err = pcall(l2l.plan, { model = model, batch = 4, seq = S, device_budget = 1000, rates = GPU })
    assert.is_false(ok)
    local need = tonumber(err:match("the smallest needs (%d+) bytes"))
    assert.is_truthy(need, err)
    assert.is_truthy(err:find("parameter slots", 1, true), err)
    -- that budget does fit, and a byte less does not
    local plan = l2l.plan { model = model, batch = 4, seq = S, device_budget = need, rates = GPU }
    assert.is_true(plan.device_peak <= need)
    assert.has_error(function() l2l.plan { model = model, batch = 4, seq = S, device_budget = need - 1, rates = GPU } end)
  end)

  it("plans again, as plan = \"auto\", when the model or the batch's shape changes", function()
    math.randomseed(support.seed)
    local model = tiny_gpt(2)
    local budget = 2 ^ 20
    local run = l2l.Relay { model = model, plan = "auto", device_budget = budget, optimizer_threads = 1 }
    run:step(batch(4))
    local first = run.plan
    assert.is_truthy(first)
    assert.are.equal(#model, #first.layers)
    run:step(batch(4))
    assert.are.equal(first, run.plan, "same model and shape: no new plan")
    model:insert(3, l2l.Block { dim = 32, heads = 4, causal = true, seed = 7 })
    run:step(batch(4))
    assert.are_not.equal(first, run.plan)
    assert.are.equal(#model, #run.plan.layers)
    local second = run.plan
    model:clone(2)
    run:step(batch(4))
    assert.are.equal(#model, #run.plan.layers)
    local third = run.plan
    run:step(batch(6, 8))
    assert.are_not.equal(third, run.plan)
    assert.are.equal(6, run.plan.batch)
    assert.are.equal(8, run.plan.seq)
    assert.are_not.equal(second, third)
    reaches_predicted_peak(run:stats(), run.plan, "after a new batch shape")
    local fourth = run.plan
    run:set_device_budget(budget - 1)   -- another budget: planned again, within it
    run:step(batch(6, 8))
    assert.are_not.equal(fourth, run.plan)
    assert.is_true(run.plan.device_peak <= budget - 1)
    run:free()
  end)

  it("weighs a record on the device against the room it takes from the step (placement auto), and the relay follows", function()
    -- A quick host: a record's copies and host update cost little. In a budget that holds
    -- every record beside the leanest step but not beside one that keeps, auto keeps
    -- records home where the step is faster for the room (it keeps what it would
    -- recompute): its step is predicted no slower than either placement alone; with slow
    -- arithmetic (recomputing costs much) much faster than every record on the device, and
    -- with quicker arithmetic some records on the device and some home. A relay given the
    -- plan places the records where it says, and reaches the predicted peak.
    local model = tiny_gpt(4)
    for _, case in ipairs { { flops = 1e9, fifths = 1, faster = true }, { flops = 1e10, fifths = 2, mixed = true } } do
      local rates = { flops = case.flops, h2d = 1e10, d2h = 1e10, optimizer = 1e12, visit = 0 }
      local function plan_of(placement, budget)
        return l2l.plan { model = model, batch = 8, seq = S, device_budget = budget, placement = placement, rates = rates }
      end
      local keeps = plan_of("device", 2 ^ 40)   -- the records and a step that keeps
      local budget = keeps.device_records_bytes + math.floor(keeps.device_peak * case.fifths / 5)
      local host, device, auto = plan_of("host", budget), plan_of("device", budget), plan_of("auto", budget)
      local what = ("flops %g, budget %d: auto %.6g s, host %.6g s, device %.6g s"):format(
        case.flops, budget, auto.step_seconds, host.step_seconds, device.step_seconds)
      assert.is_true(auto.step_seconds <= host.step_seconds * (1 + 1e-9), what)
      assert.is_true(auto.step_seconds <= device.step_seconds * (1 + 1e-9), what)
      if case.faster then assert.is_true(auto.step_seconds < 0.9 * device.step_seconds, what) end
      local home = 0
      for _, l in ipairs(auto.layers) do home = home + (l.on_device and 0 or 1) end
      assert.is_true(home > 0, what)
      if case.mixed then assert.is_true(home < #model, what) end
      local _, printed = (tostring(auto) .. "\n"):gsub("  host\n", "")   -- (its records column)
      assert.are.equal(home, printed, what)
      local run = l2l.Relay { model = model, plan = auto, optimizer_threads = 1 }
      run:step(batch(8))
      for i = 1, #model do
        for _, p in ipairs(model[i]:params()) do
          assert.are.equal(auto.layers[i].on_device and "device" or "host", p.value:pool(),
                           ("%s: layer %d's %s"):format(what, i, p.name))
        end
      end
      reaches_predicted_peak(run:stats(), auto, what)
      run:free()
    end
  end)

  it("on a GPU's rates, hides weight streaming only past device FLOP/s over link bytes/s", function()
    -- a block's weights cross the link once per visit; its arithmetic grows with the
    -- tokens of the visit: below the threshold the step is the copies' and stays put as
    -- the batch grows, above it the step grows with the batch
    local model = tiny_gpt(4, 256, 64)
    local plan = l2l.plan { model = model, batch = 1, seq = 64, device_budget = 2 ^ 40, placement = "host", rates = GPU, precision = "bf16" }
    local threshold = plan.streaming_tokens
    -- bf16 weights: 2 bytes a parameter; forward and backward 6 FLOPs per parameter and
    -- token: the threshold is FLOP/s / (3 link bytes/s), within what attention adds
    local expected = GPU.flops / GPU.h2d / 3
    assert.is_true(threshold > 0.8 * expected and threshold < 1.25 * expected,
                   ("threshold %g tokens, expected about %g"):format(threshold, expected))
    local function step(B) return l2l.plan { model = model, batch = B, seq = 64, device_budget = 2 ^ 40, placement = "host",
                                            rates = GPU, precision = "bf16" }.step_seconds end
    local few, more = math.max(1, math.floor(threshold / 64 / 8)), math.floor(threshold / 64 / 4)
    local many = math.floor(threshold / 64 * 8)
    assert.is_true(step(more) < 1.1 * step(few), "below the threshold the step is the copies'")
    local big, bigger = step(many), step(2 * many)
    assert.is_true(bigger > 1.7 * big, ("past the threshold the step grows with the batch: %g then %g"):format(big, bigger))
  end)

  it("names a step's channels at the rates and the one that limits it", function()
    -- copies each way: their bytes at the link's rates; the host optimizer: every record's
    -- f32 master at its rate (nothing frozen); the limit: the largest, in words in print()
    local model = tiny_gpt(4, 256, 64)
    local masters = 0
    for _, p in ipairs(model:params()) do masters = masters + 4 * p.value:numel() end
    local function close(got, want, what)
      assert.is_true(math.abs(got - want) <= 1e-12 * want, ("%s: %.17g, want %.17g"):format(what, got, want))
    end
    for _, optimizer in ipairs({ GPU.optimizer, GPU.optimizer / 1000 }) do
      local rates = { flops = GPU.flops, h2d = GPU.h2d, d2h = GPU.d2h, optimizer = optimizer, visit = GPU.visit }
      local plan = l2l.plan { model = model, batch = 2, seq = 64, device_budget = 2 ^ 40, placement = "host", rates = rates,
                              precision = "bf16" }
      local c = plan.channels
      close(c.copies_in, plan.h2d_bytes / rates.h2d, "copies to the device")
      close(c.copies_out, plan.d2h_bytes / rates.d2h, "copies back")
      close(c.updates, masters / optimizer, "the host optimizer")
      assert.is_true(c.compute > 0 and c.disk == 0, "compute and no disk")
      local largest, name = -1, nil
      for _, k in ipairs({ "compute", "copies_in", "copies_out", "updates" }) do
        if c[k] > largest then largest, name = c[k], k end
      end
      assert.are.equal(name, plan.limit)
      if optimizer < GPU.optimizer then
        assert.are.equal("updates", plan.limit, "a slow host optimizer limits the step")
        assert.is_truthy(tostring(plan):find("the limit: the host optimizer", 1, true), tostring(plan))
      end
      if plan.limit == "updates" then
        -- from the accumulation it names, the updates hide: a plan made with it has
        -- another limit, and one less would not hide them
        local k = plan.hiding_accumulate
        assert.is_true(k ~= nil and k > 1, "a host optimizer that limits names an accumulation to hide it")
        assert.is_truthy(tostring(plan):find(("from accumulate = %d"):format(k), 1, true), tostring(plan))
        local at = function(a)
          return l2l.plan { model = model, batch = 2, seq = 64, device_budget = 2 ^ 40, placement = "host", rates = rates,
                            precision = "bf16", accumulate = a }
        end
        local hidden, short = at(k), at(k - 1)
        assert.are_not.equal("updates", hidden.limit, "accumulate " .. k)
        assert.is_nil(hidden.hiding_accumulate)
        assert.are.equal("updates", short.limit, "accumulate " .. (k - 1))
      else
        assert.is_nil(plan.hiding_accumulate, "the updates hide already")
      end
    end
  end)

  it("chooses the accumulation from which the host optimizer hides (accumulate = \"auto\"), and its relay takes it", function()
    local model = tiny_gpt(4, 256, 64)
    -- a host optimizer 100 times the GPU table's (it hides at 1), and one 1.5 to 4 times
    -- slower than it (it limits the step until an accumulation of a few: the relay below
    -- takes that many steps)
    local slow = GPU.optimizer / support.uniform(1.5, 4)
    for _, optimizer in ipairs({ 100 * GPU.optimizer, slow }) do
      local rates = { flops = GPU.flops, h2d = GPU.h2d, d2h = GPU.d2h, optimizer = optimizer, visit = GPU.visit }
      local function at(a)
        return l2l.plan { model = model, batch = 2, seq = 64, device_budget = 2 ^ 40, placement = "host", rates = rates,
                          precision = "bf16", accumulate = a }
      end
      local chosen, named = at("auto"), at(1).hiding_accumulate
      local what = ("optimizer at %.3g B/s: accumulate %d chosen, %s named at 1"):format(optimizer,
        chosen.accumulate, tostring(named))
      assert.is_true(chosen.accumulate_chosen, what)
      -- the smallest that hides: hidden at it, not one less
      assert.is_nil(chosen.hiding_accumulate, what)
      assert.are_not.equal("updates", chosen.limit, what)
      if chosen.accumulate > 1 then assert.are.equal("updates", at(chosen.accumulate - 1).limit, what) end
      assert.are.equal(named or 1, chosen.accumulate, what)   -- (the plan at 1 names it)
      assert.is_truthy(tostring(chosen):find(("accumulate %d, chosen"):format(chosen.accumulate), 1, true), tostring(chosen))
      assert.are.equal(optimizer == slow, chosen.accumulate > 1, what)
      -- a relay made with the plan takes its accumulation: one update every that many steps
      local run = l2l.Relay { model = model, plan = chosen, precision = "bf16", optimizer_threads = 1 }
      assert.are.equal(chosen.accumulate, run.options.accumulate, what)
      for step = 1, chosen.accumulate do
        run:step(batch(2, 64))
        assert.are.equal(step == chosen.accumulate and 1 or 0, run:stats().updates, what .. ", step " .. step)
      end
      run:free()
    end
    -- "auto" is the plan's to choose: a relay refuses it naming the option
    local ok, err = pcall(l2l.Relay, { model = tiny_gpt(4, 256, 64), accumulate = "auto" })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("accumulate", 1, true), tostring(err))
  end)

  it("predicts the EPS's host bytes, the spill file's bytes and the smallest host budget, to the byte", function()
    math.randomseed(support.seed)
    local dir = support.tmpdir()
    -- each with its state in a precision drawn (the compact forms' bytes, in memory and on disk)
    local state = ({ "f32", "bf16", "8bit" })[support.int(1, 3)]
    -- and the masters in f32 or bf16 (no staging copies then, and precision bf16)
    local master = ({ "f32", "bf16" })[support.int(1, 2)]
    local precision = master == "bf16" and "bf16" or ({ "f32", "bf16" })[support.int(1, 2)]
    local makers = { function() return l2l.AdamW { lr = 1e-3, state = state } end,
                     function() return l2l.LAMB { lr = 1e-3, state = state } end,
                     function() return l2l.SGD { lr = 0.05, momentum = 0.9, state = state } end }
    for o, make in ipairs(makers) do
      local model = tiny_gpt(support.int(1, 3))
      if support.int(0, 1) == 1 then model:freeze(2) end   -- a frozen block keeps no state
      local B = support.int(2, 5)
      local disk = { disk_read = 1e9, disk_write = 5e8 }
      local rates = {}
      for k, v in pairs(GPU) do rates[k] = v end
      for k, v in pairs(disk) do rates[k] = v end
      local function plan_for(budget)
        return l2l.plan { model = model, batch = B, seq = S, device_budget = 2 ^ 40, placement = "host", rates = rates,
                          optimizer = make(), spill = dir, host_budget = budget, master = master,
                          precision = precision }
      end
      -- the smallest budget any relay over this model needs, then one between it and all
      -- in memory (some records keep their state, the others spill)
      local smallest = plan_for(nil).host_budget_smallest
      local in_memory = l2l.plan { model = model, batch = B, seq = S, device_budget = 2 ^ 40, placement = "host", rates = rates,
                                   optimizer = make(), master = master, precision = precision }.host_eps_bytes
      local budget = support.int(smallest, math.max(smallest, in_memory))
      local plan = plan_for(budget)
      local what = ("optimizer %d, state %s, master %s, precision %s, budget %d (smallest %d, in memory %d)"):format(
        o, state, master, precision, budget, smallest, in_memory)
      local run = l2l.Relay { model = model, micro_batch = plan.micro_batch, optimizer = make(), spill = dir,
                              host_budget = budget, seed = 3, master = master, precision = precision }
      for step = 1, 3 do
        run:step(batch(B))
        run:sync()
        local st = run:stats()
        assert.are.equal(plan.host_eps_bytes, st.host_eps_bytes, what .. ": host bytes, step " .. step)
        if step >= 2 then   -- (the first update starts from zero: nothing to read)
          assert.are.equal(plan.disk_bytes, st.spill_read_bytes, what .. ": bytes read, step " .. step)
          assert.are.equal(plan.disk_bytes, st.spill_written_bytes, what .. ": bytes written, step " .. step)
        end
      end
      -- the disk's time: its bytes at the rates given, and the step at least that
      local want = plan.disk_bytes / disk.disk_read + plan.disk_bytes / disk.disk_write
      assert.is_true(math.abs(plan.disk_seconds - want) <= 1e-12 * math.max(1, want), what)
      assert.is_true(plan.step_seconds >= plan.disk_seconds, what)
      -- the smallest works and a byte less is refused, by the relay and by the planner
      run:set_host_budget(smallest - 1)
      local ok, err = pcall(run.step, run, batch(B))
      assert.is_false(ok, what)
      assert.are.equal(smallest, tonumber(tostring(err):match("is below the (%d+)")), what .. ": " .. tostring(err))
      run:set_host_budget(smallest)
      run:step(batch(B))
      run:free()
      ok, err = pcall(plan_for, smallest - 1)
      assert.is_truthy(not ok and tostring(err):find("no plan fits a host budget"), tostring(err))
      -- without a spill directory the smallest is everything in memory
      ok, err = pcall(l2l.plan, { model = model, batch = B, seq = S, device_budget = 2 ^ 40, placement = "host", rates = rates,
                                  optimizer = make(), host_budget = in_memory - 1, master = master,
                                  precision = precision })
      assert.is_truthy(not ok and tostring(err):find("a spill directory (option 'spill') keeps", 1, true), tostring(err))
    end
    os.execute("rm -rf " .. dir)
  end)

  it("refuses what it does not understand", function()
    local model = tiny_gpt(1)
    assert.has_error(function() l2l.plan { model = model, batch = 2, seq = S } end)
    assert.has_error(function() l2l.plan { model = {}, batch = 2, seq = S, device_budget = 1 } end)
    assert.has_error(function() l2l.plan { model = model, batch = 0, seq = S, device_budget = 2 ^ 20 } end)
    assert.has_error(function() l2l.plan { model = model, batch = 2, seq = S, device_budget = 2 ^ 20, rates = { h2d = -1 } } end)
    assert.has_error(function() l2l.plan { model = model, batch = 2, seq = S, device_budget = 2 ^ 20, rates = { bogus = 1 } } end)
    assert.has_error(function() l2l.Relay { model = model, plan = "fast" } end)
    local plan = l2l.plan { model = model, batch = 2, seq = S, device_budget = 2 ^ 30, rates = GPU }
    assert.has_error(function() l2l.Relay { model = tiny_gpt(2), plan = plan } end)
  end)
end)
