-- SPDX-License-Identifier: MIT
-- trace_spec — run:trace(path): the relay's timeline as Chrome trace JSON (lua/l2l/trace.lua).
-- A small GPT trains through the relay with three micro-batches and host stash; the file
-- must decode as JSON, hold one complete event per run:events() entry with the same times
-- (in microseconds), every layer's forward and backward for every micro-batch, copies on
-- the two copy lanes, updates on optimizer-worker lanes, and named, ordered lanes.
-- Several steps' events join on one clock; a failed write leaves the old file alone; bad
-- arguments raise errors that name the argument.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local cjson = require("cjson")

local V, S, B, MB = 16, 12, 8, 3   -- micro-batches of 3, 3 and 2 samples
local NMB = math.ceil(B / MB)

local function small_gpt(seed)
  return l2l.Sequential {
    l2l.Embedding { vocab = V, dim = 32, max_seq = S, seed = seed },
    l2l.Block { dim = 32, heads = 4, causal = true, seed = seed + 1 },
    l2l.Block { dim = 32, heads = 4, causal = true, memory = "frugal", seed = seed + 2 },
    l2l.Block { dim = 32, heads = 4, causal = true, seed = seed + 3 },
    l2l.LMHead { vocab = V, dim = 32, tie = true, seed = seed + 4 },
  }
end

local function batch()
  local tok, tgt = l2l.zeros({ B, S }, { dtype = "i32" }), l2l.zeros({ B, S }, { dtype = "i32" })
  for b = 1, B do
    local t0 = support.int(0, V - 1)
    for s = 1, S do tok:set(b, s, (t0 + s) % V); tgt:set(b, s, (t0 + s + 1) % V) end
  end
  return tok, tgt
end

local function read(path)
  local text = support.read_file(path)
  assert(text, "cannot read " .. path)
  return text
end

local function fails(pattern, f)
  local ok, err = pcall(f)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern), tostring(err))
end

-- The complete ("X") events and the metadata ("M") events of a decoded trace.
local function split(doc)
  local x, m = {}, {}
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" then x[#x + 1] = e elseif e.ph == "M" then m[#m + 1] = e end
  end
  return x, m
end

describe("run:trace", function()
  local model, run, path

  before_each(function()
    model = small_gpt(support.int(1, 1000))
    run = l2l.Relay { model = model, micro_batch = MB, stash = "host", optimizer_threads = 2, seed = 1 }
    path = os.tmpname()
  end)

  after_each(function()
    run:free()
    os.remove(path)
  end)

  it("writes the last step's events as a Chrome trace with every layer, copy and update", function()
    for _ = 1, 2 do run:step(batch()) end   -- the second step also waits on the first's updates
    local events = run:events()
    local n = run:trace(path)
    assert.are.equal(#events, n)
    local ok, doc = pcall(cjson.decode, read(path))
    assert.is_true(ok, "the file is JSON: " .. tostring(doc))
    assert.are.equal("table", type(doc.traceEvents))
    local x, meta = split(doc)
    assert.are.equal(#events, #x)
    assert.are.equal(#doc.traceEvents, #x + #meta, "only X and M events")

    -- one X event per relay event, in order, with its times in microseconds
    local have = {}   -- "phase layer mb tid" -> true
    for i, e in ipairs(x) do
      local r = events[i]
      assert.are.equal("number", type(e.ts), "ts of " .. tostring(e.name))
      assert.are.equal("number", type(e.dur), "dur of " .. tostring(e.name))
      assert.is_true(e.ts >= 0 and e.dur >= 0, ("ts %s dur %s"):format(e.ts, e.dur))
      assert.is_true(math.abs(e.ts - r.start * 1e6) <= 1e-3, ("ts %.6f for start %.9f"):format(e.ts, r.start))
      assert.is_true(math.abs(e.dur - (r.finish - r.start) * 1e6) <= 2e-3, "dur of " .. e.name)
      assert.are.equal(r.phase, e.cat)
      assert.are.same({ layer = r.layer, micro_batch = r.micro_batch, phase = r.phase }, e.args)
      local want = r.phase .. (r.layer and " L" .. r.layer or "") .. (r.micro_batch and " mb" .. r.micro_batch or "")
      assert.are.equal(want, e.name)
      assert.are.equal(r.thread, e.tid)
      assert.are.equal("number", type(e.pid))
      have[("%s %s %s %d"):format(e.cat, tostring(e.args.layer), tostring(e.args.micro_batch), e.tid)] = true
    end

    -- compute: every layer's backward for every micro-batch, every layer's forward but the
    -- head's (the head runs forward and backward in one visit, shown as its backward)
    for l = 1, #model do
      for u = 1, NMB do
        if l < #model then
          assert.is_true(have[("forward %d %d 0"):format(l, u)], ("forward of layer %d mb %d on compute"):format(l, u))
        end
        assert.is_true(have[("backward %d %d 0"):format(l, u)], ("backward of layer %d mb %d on compute"):format(l, u))
      end
    end
    -- copies on their lanes, updates on worker lanes, for every layer
    local lane_of = { params_in = 1, stash_in = 1, stash_out = 2, grads_out = 2 }
    local count = {}
    for _, e in ipairs(x) do
      count[e.cat] = (count[e.cat] or 0) + 1
      if lane_of[e.cat] then assert.are.equal(lane_of[e.cat], e.tid, e.name .. " lane") end
      if e.cat == "update" then assert.is_true(e.tid >= 3, e.name .. " on lane " .. e.tid) end
    end
    for phase in pairs(lane_of) do assert.is_true((count[phase] or 0) > 0, phase .. " events") end
    for l = 1, #model do
      assert.is_true(have[("params_in %d nil 1"):format(l)], "params_in of layer " .. l)
      assert.is_true(have[("grads_out %d nil 2"):format(l)], "grads_out of layer " .. l)
      local updated = false
      for t = 3, 4 do updated = updated or have[("update %d nil %d"):format(l, t)] == true end
      assert.is_true(updated, "update of layer " .. l .. " on an optimizer worker")
    end

    -- named lanes for every tid in use, sorted by tid; a named process
    local names, order, process = {}, {}, nil
    for _, e in ipairs(meta) do
      if e.name == "thread_name" then names[e.tid] = e.args.name end
      if e.name == "thread_sort_index" then order[e.tid] = e.args.sort_index end
      if e.name == "process_name" then process = e.args.name end
    end
    assert.are.equal("l2l relay", process)
    local want = { [0] = "compute", "copy host→device", "copy device→host" }
    local tids = {}
    for _, e in ipairs(x) do tids[e.tid] = true end
    for t in pairs(want) do tids[t] = true end
    for t in pairs(tids) do
      assert.are.equal(want[t] or ("optimizer worker " .. (t - 2)), names[t], "name of lane " .. t)
      assert.are.equal("number", type(order[t]), "sort index of lane " .. t)
      for u in pairs(tids) do
        if u < t then assert.is_true(order[u] < order[t], ("lane %d before lane %d"):format(u, t)) end
      end
    end
  end)

  it("joins several steps' events on one clock (opts.events) and names the process (opts.name)", function()
    local all, first_count = {}, nil
    for step = 1, 2 do
      run:step(batch())
      for _, e in ipairs(run:events()) do all[#all + 1] = e end
      if step == 1 then first_count = #all end
    end
    assert.are.equal(#all, run:trace(path, { events = all, name = "two steps" }))
    local x, meta = split(cjson.decode(read(path)))
    assert.are.equal(#all, #x)
    local process
    for _, e in ipairs(meta) do if e.name == "process_name" then process = e.args.name end end
    assert.are.equal("two steps", process)
    -- the second step's compute starts after the first's ended
    local first_end, second_start = 0, math.huge
    for i, e in ipairs(x) do
      if e.tid == 0 then
        if i <= first_count then first_end = math.max(first_end, e.ts + e.dur)
        else second_start = math.min(second_start, e.ts) end
      end
    end
    assert.is_true(first_end <= second_start, ("first step ends %.3f, second starts %.3f"):format(first_end, second_start))
  end)

  it("raises errors that name the argument, and keeps the old file when it fails", function()
    fails("run:trace: path must be a file name", function() run:trace() end)
    fails("run:trace: path must be a file name", function() run:trace(42) end)
    fails("run:trace: path must be a file name", function() run:trace("") end)
    run:step(batch())
    fails("run:trace: opts must be a table", function() run:trace(path, 5) end)
    fails("run:trace: unknown option 'steps'", function() run:trace(path, { steps = 2 }) end)
    fails("run:trace: opts.name must be a string", function() run:trace(path, { name = 3 }) end)
    fails("run:trace: opts.events must be a list", function() run:trace(path, { events = "all" }) end)
    fails("run:trace: opts.events%[1%]: thread must be", function()
      run:trace(path, { events = { { phase = "forward", start = 0, finish = 1 } } })
    end)
    fails("run:trace: opts.events%[2%]: finish must be a number >= start", function()
      run:trace(path, { events = { run:events()[1], { phase = "forward", thread = 0, start = 2, finish = 1 } } })
    end)
    fails("run:trace: opts.events%[1%]: start must be a number >= 0", function()
      run:trace(path, { events = { { phase = "forward", thread = 0, start = -1, finish = 1 } } })
    end)
    -- Linux's /dev/full: every write fails with "no space left" (only where it is the device:
    -- a write to a missing one would make a file in /dev)
    if support.sh("test -c /dev/full") == 0 then
      fails("run:trace: cannot write '/dev/full'", function() run:trace("/dev/full") end)
    end
    local dir = os.tmpname()   -- a file, so nothing can be created below it
    fails("run:trace: cannot open '" .. dir .. "/x.json'", function() run:trace(dir .. "/x.json") end)
    os.remove(dir)

    -- a good trace, then failures: the file keeps the good one
    local n = run:trace(path)
    local before = read(path)
    assert.are.equal(n, #split(cjson.decode(before)))
    pcall(run.trace, run, path, { events = { { phase = "x" } } })
    pcall(run.trace, run, path, { name = {} })
    assert.are.equal(before, read(path))

    fails("run:trace: self must be a relay", function() run.trace({}, path) end)
    run:free()
    fails("run:trace: the relay was freed", function() run:trace(path) end)
  end)
end)
