-- SPDX-License-Identifier: MIT
-- profile_spec — l2l.profile and L2L_PROFILE (issue 46): a step's ops timed and summed on
-- the CPU backend. Drawn GPTs (sizes, micro-batches, memory modes, inner policies) train
-- under a profile. Checked against references the profile does not compute: the GEMM and
-- attention FLOPs of a step from the model's shapes (float64 formulas here), the bytes the
-- relay's own counters say crossed each way, the losses and weights of the same run
-- without a profile (to the bit: a profile changes nothing), and the step's time, which
-- its ops and idle causes add up to (an identity on one thread's clock, to rounding).
local support = dofile("spec/support.lua")
local l2l = require("l2l")

local function gpt(c)
  local layers = { l2l.Embedding { vocab = c.V, dim = c.D, max_seq = c.S, seed = c.seed } }
  for i = 1, c.L do
    layers[#layers + 1] = l2l.Block { dim = c.D, heads = c.H, mlp = c.F, causal = true,
                                      memory = c.memory, bias = c.bias ~= false, seed = c.seed + i }
  end
  layers[#layers + 1] = l2l.LMHead { vocab = c.V, dim = c.D, tie = true, seed = c.seed + 99 }
  return l2l.Sequential(layers)
end

local function draw()
  local H = support.int(1, 4)
  local c = { V = support.int(17, 90), H = H, D = H * support.int(3, 12), S = support.int(4, 19),
              B = support.int(2, 9), L = support.int(1, 3), seed = support.int(1, 10000),
              memory = math.random() < 0.5 and "frugal" or "standard",
              inner = math.random() < 0.5 and "keep" or "recompute",
              stash = math.random() < 0.5 and "host" or "device" }
  c.F = support.int(c.D, 4 * c.D + 3)
  c.micro_batch = support.int(1, c.B)
  return c
end

local function describe_config(c)
  return ("seed %d: V=%d D=%d H=%d F=%d S=%d B=%d micro_batch=%d L=%d %s %s stash %s")
      :format(support.seed, c.V, c.D, c.H, c.F, c.S, c.B, c.micro_batch, c.L, c.memory, c.inner, c.stash)
end

local function batch(c)
  local tok, tgt = l2l.zeros({ c.B, c.S }, { dtype = "i32" }), l2l.zeros({ c.B, c.S }, { dtype = "i32" })
  for b = 1, c.B do
    for s = 1, c.S do tok:set(b, s, support.int(0, c.V - 1)); tgt:set(b, s, support.int(0, c.V - 1)) end
  end
  return tok, tgt
end

-- A relay over a GPT of c (extra: more options of l2l.Relay).
local function relay(c, extra)
  local model = gpt(c)
  local o = { model = model, micro_batch = c.micro_batch, stash = c.stash, inner = c.inner,
              precision = c.precision, optimizer = l2l.AdamW { lr = 1e-3 }, seed = 7 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return l2l.Relay(o), model
end

-- A training step's FLOPs by the profile's rules, from the model's shapes alone. GEMMs:
-- each linear map of a block (D -> 3D, D -> D, D -> F, F -> D) costs 2 in out a token
-- forward and twice that backward (the input's and the weight's gradients), the forward
-- again when inner = recompute; the tied head's projection (D -> V) forward and backward.
-- Attention: 4 d FLOPs a causal (query, key) pair forward, backward 4 products (8 d) with
-- the probabilities kept (standard) or 5 (10 d) recomputing them (frugal).
local function step_flops(c)
  local T = c.B * c.S
  local linear = c.D * 3 * c.D + c.D * c.D + c.D * c.F + c.F * c.D
  local passes = 3 + (c.inner == "recompute" and 1 or 0)
  local gemm = c.L * 2 * linear * T * passes + 3 * 2 * c.D * c.V * T
  local pairs = c.B * c.H * c.S * (c.S + 1) / 2
  local dh = c.D / c.H
  local forward = 4 * dh * pairs
  local backward = (c.memory == "frugal" and 10 or 8) * dh * pairs
  local attention = c.L * (forward * (passes - 2) + backward)
  return gemm, attention
end

local function sum_rows(report, pred)
  local s = 0
  for _, r in ipairs(report.rows) do if pred(r) then s = s + r.flops end end
  return s
end

local function copy_bytes(report, way)
  local s = 0
  for _, r in ipairs(report.rows) do
    if r.op:find("^copy") and r.shape:sub(1, 3) == way then s = s + r.bytes end
  end
  return s
end

describe("l2l.profile", function()
  after_each(function() pcall(l2l.profile.stop) end)

  it("sums a step's ops: FLOPs and bytes as the model and the relay count them, and the parts make the step", function()
    for _ = 1, 3 do
      local c = draw()
      local what = describe_config(c)
      local run = relay(c)
      local tok, tgt = batch(c)
      run:step(tok, tgt)   -- left out by skip
      local steps = support.int(1, 3)
      l2l.profile.start { skip = 1 }
      run:step(tok, tgt)
      local h2d, d2h, jobs = 0, 0, 0
      for _ = 1, steps do
        run:step(tok, tgt)
        local st = run:stats()
        h2d, d2h = h2d + st.h2d_bytes, d2h + st.d2h_bytes
        for _, e in ipairs(run:events()) do   -- the copy threads' jobs that copied
          if e.phase == "params_in" or e.phase == "stash_out" or e.phase == "stash_in" then jobs = jobs + 1 end
        end
      end
      l2l.profile.stop()
      run:step(tok, tgt)   -- after stop: not counted
      local p = l2l.profile.report()
      assert.are.equal(steps, p.steps, what)
      assert.are.equal("cpu", p.backend, what)
      local gemm, attention = step_flops(c)
      -- whole numbers below 2^53: exact in doubles, so equal
      assert.are.equal(steps * gemm, sum_rows(p, function(r) return r.op == "gemm" end), what)
      assert.are.equal(steps * attention, sum_rows(p, function(r) return r.op:find("^attention") end), what)
      assert.are.equal(h2d, copy_bytes(p, "h2d"), what)
      -- on the CPU backend a gradient slot is host memory the copy thread reads, no copy
      -- (counted by the relay as the GPU's transfer it stands for): the copies are the rest
      assert.is_true(copy_bytes(p, "d2h") <= d2h, what)
      local idle = p.idle_copy_seconds + p.idle_update_seconds + p.idle_comm_seconds +
                   p.idle_sync_seconds + p.idle_launch_seconds
      -- ops on one thread are disjoint intervals inside the step: ops and gaps partition
      -- it exactly; each of the (ops + lane ops + a few) sums rounds by at most 2^-52 of
      -- the step's time, twice (an interval is a difference of two offsets)
      local tolerance = 2 * (p.ops + p.lane_ops + 8) * 2 ^ -52 * p.step_seconds
      assert.is_true(math.abs(p.op_seconds + idle - p.step_seconds) <= tolerance,
                     what .. (": ops %.9g + idle %.9g vs step %.9g"):format(p.op_seconds, idle, p.step_seconds))
      -- the copy waits by what they moved make the copy wait (each take added to both)
      local copies = 0
      for _, part in ipairs { "params", "acts_in", "acts_out", "grads" } do
        local v = p["idle_copy_" .. part .. "_seconds"]
        assert.is_true(v >= 0, what .. ": " .. part)
        copies = copies + v
      end
      assert.is_true(math.abs(copies - p.idle_copy_seconds) <= tolerance,
                     what .. (": copy waits by what they moved %.9g, all %.9g"):format(copies, p.idle_copy_seconds))
      local op_seconds, op_calls = 0, 0
      for _, r in ipairs(p.rows) do
        assert.is_true(r.calls >= 1 and r.seconds >= 0 and r.bytes > 0, what .. ": " .. r.op .. " " .. r.shape)
        assert.is_truthy(r.roofline, what .. ": every rate was probed here: " .. r.op)
        -- the host's time in the calls: on the CPU backend the device's clock is the host's,
        -- so it is the calls' time (each a difference of offsets, as above)
        assert.is_true(math.abs(r.host_seconds - r.seconds) <= 2 * (r.calls + 1) * 2 ^ -52 * p.step_seconds,
                       what .. (": %s %s host %.9g s, device %.9g s"):format(r.op, r.shape, r.host_seconds, r.seconds))
        if r.kind == "op" then op_seconds, op_calls = op_seconds + r.seconds, op_calls + r.calls end
      end
      assert.are.equal(p.ops, op_calls, what)
      -- a copy job waits once (its copies queued, the last one waited for): a visit's
      -- records are several copies and one wait (on a GPU each wait costs ~0.1 ms)
      local waits, queued = 0, 0
      for _, r in ipairs(p.rows) do
        if r.kind == "lane" and r.op == "copy" then waits = waits + r.calls end
        if r.kind == "lane" and r.op == "copy_queued" then queued = queued + r.calls end
      end
      assert.are.equal(jobs, waits, what)
      assert.is_true(queued > 0, what)
      assert.is_true(math.abs(op_seconds - p.op_seconds) <= tolerance, what)
      assert.is_true(p.copy_rate > 0 and p.link_rate > 0 and p.gemm_rate_f32 > 0 and p.gemm_rate_16 > 0, what)
      assert.are.equal(0, p.dropped, what)
      -- one wait for the device a step, at its end (counted as a GPU would make them: issue
      -- 46's "at most one device synchronisation a step")
      assert.are.equal(steps, p.syncs, what)
      assert.are.equal(-1, p.launches, what)   -- the CPU queues nothing
      run:free()
    end
  end)

  it("counts one wait a step with the records on the device too, the release's read of their norms, the guard's copies", function()
    -- placement device: each record's add, update and non-finite flag stay on the device;
    -- the flags come back queued behind the step's work, read after its one wait, so a step
    -- waits once, whatever the records (a read a record would count one each); a deferred
    -- release (global clipping) reads every record's norm at once: one more. With frugal
    -- blocks the host copies their LayerNorm guard reads are queued behind the last step's
    -- updates, done by its one wait: none more; once a script may have written a master
    -- (its value handed out), they are made current as each step begins (one wait for all
    -- of them): one more.
    for _, clip in ipairs { 0, 1, 0, 1 } do
      local c = draw()
      local what = describe_config(c) .. (" placement device, clip_global_norm %g"):format(clip)
      local run = relay(c, { placement = "device", clip_global_norm = clip })
      local tok, tgt = batch(c)
      run:step(tok, tgt)
      local steps = support.int(1, 3)
      l2l.profile.start()
      for _ = 1, steps do run:step(tok, tgt) end
      l2l.profile.stop()
      local p = l2l.profile.report()
      assert.are.equal(steps * (1 + (clip > 0 and 1 or 0)), p.syncs, what)
      assert.are.equal(0, run:stats().host_eps_bytes, what)
      for _, q in ipairs(run.model:params()) do   -- a 1-D record (a LayerNorm's) handed out:
        if q.value:ndim() == 1 then break end      -- a script may write it now
      end
      l2l.profile.start()
      run:step(tok, tgt)
      l2l.profile.stop()
      assert.are.equal(1 + (clip > 0 and 1 or 0) + (c.memory == "frugal" and 1 or 0),
                       l2l.profile.report().syncs, what .. ", a master handed out")
      run:free()
    end
  end)

  -- With 16-bit weights a GEMM reads its activation and its dy in 16 bits; the ops that make
  -- LayerNorm's, GELU's and attention's outputs, GELU's backward and the head's logits'
  -- gradient write them so themselves (issue 46's fewer passes), and so do the qkv map's
  -- GEMM with its bias (gemm_bias: q, k, v, which attention reads, with a bias or
  -- without), attention's backward (dq, dk, dv, the qkv map's dy) and LayerNorm 2's
  -- backward (the attention projection's dy, with no dropout between), so a step's casts
  -- are only the GEMM inputs nothing writes in 16 bits, counted here from the block's
  -- structure: per block and micro-batch, in the backward the dy of the MLP's second
  -- projection (the block's incoming gradient);
  -- frugal mode keeps LayerNorm's and GELU's outputs in f32 (its backward reads them), so
  -- their three weight-gradient GEMMs cast them too. The standard head keeps its
  -- LayerNorm's output and the logits' gradient 16-bit: no cast.
  it("with 16-bit weights casts only the GEMM inputs no op writes in 16 bits", function()
    for _, memory in ipairs { "standard", "frugal", support.int(0, 1) == 1 and "frugal" or "standard" } do
      local c = draw()
      c.precision, c.memory, c.bias = "bf16", memory, support.int(0, 1) == 1
      local what = describe_config(c) .. (c.bias and "" or ", no bias")
      local run = relay(c)
      local tok, tgt = batch(c)
      run:step(tok, tgt)
      local steps = support.int(1, 2)
      l2l.profile.start()
      for _ = 1, steps do run:step(tok, tgt) end
      l2l.profile.stop()
      local casts = 0
      for _, r in ipairs(l2l.profile.report().rows) do
        if r.op == "convert" then casts = casts + r.calls end
      end
      local micro_batches = math.ceil(c.B / c.micro_batch)
      local per_block = 1 + (c.memory == "frugal" and 3 or 0)
      assert.are.equal(steps * micro_batches * c.L * per_block, casts, what)
      run:free()
    end
  end)

  it("changes nothing a step computes: losses and weights to the bit", function()
    local c = draw()
    local what = describe_config(c)
    local tok, tgt = batch(c)
    local function train(profiled)
      local run, model = relay(c)
      if profiled then l2l.profile.start() end
      local losses = {}
      for i = 1, 3 do losses[i] = run:step(tok, tgt) end
      if profiled then l2l.profile.stop() end
      run:sync()
      local weights = {}
      for _, param in ipairs(model:params()) do weights[#weights + 1] = param.value:totable() end
      run:free()
      return losses, weights
    end
    local plain_losses, plain_weights = train(false)
    local losses, weights = train(true)
    assert.are.same(plain_losses, losses, what)
    assert.are.same(plain_weights, weights, what)
    assert.is_true(l2l.profile.report().ops > 0, what)
  end)

  it("probes its rates outside the pools' high-water marks: a program's peak is its own", function()
    -- The probe copies 64 MiB twice and runs two GEMMs; a pool's peak after it is what it
    -- was (or what is in use now, where that is more), and a cache of 64 MiB or more the
    -- probe's buffers left in a host-memory arena is given back.
    local kinds, before = { "host", "pinned", "device" }, {}
    for _, k in ipairs(kinds) do
      l2l.reset_peak(k)
      before[k] = l2l.pool_stats(k)
    end
    l2l.profile.start()
    l2l.profile.stop()
    for _, k in ipairs(kinds) do
      local s = l2l.pool_stats(k)
      assert.are.equal(math.max(before[k].peak, s.current), s.peak, k)
    end
    local device = l2l.pool_stats("device")
    assert.is_true(device.reserved < before.device.reserved + 64 * 2 ^ 20,
                   ("device pool: %d bytes reserved, %d before the probe"):format(device.reserved, before.device.reserved))
  end)

  it("writes a TSV and a table, and refuses what it cannot do", function()
    local c = draw()
    local run = relay(c)
    local tok, tgt = batch(c)
    l2l.profile.start()
    run:step(tok, tgt)
    assert.has_error(function() l2l.profile.start() end, "l2l.profile.start: a profile is running: stop it first (l2l_profile_stop)")
    l2l.profile.stop()
    local dir = support.tmpdir()
    local path = dir .. "/step.tsv"
    l2l.profile.write(path)
    local text = support.read_file(path)
    assert.is_truthy(text:find("\nkind\top\tshape\tcalls\tms\tshare\tgflop\tmbytes\trate\tbound\troofline\thost_ms\n", 1, true), text)
    for line in text:gmatch("\n([^\n]+)") do   -- every row has the header's 12 columns
      local _, tabs = line:gsub("\t", "")
      assert.are.equal(11, tabs, line)
    end
    assert.is_truthy(text:find("\nstep\tstep\t", 1, true), text)
    assert.is_truthy(text:find("\ncount\tsyncs\t", 1, true), text)
    for _, row in ipairs { "idle\tcopy", "idle_copy\tparams", "idle_copy\tacts_in",
                           "idle_copy\tacts_out", "idle_copy\tgrads", "idle\tupdate" } do
      assert.is_truthy(text:find("\n" .. row .. "\t", 1, true), row .. "\n" .. text)
    end
    local ok, err = pcall(l2l.profile.write, path)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("pass overwrite to replace it", 1, true), tostring(err))
    l2l.profile.write(path, { overwrite = true })
    for _, width in ipairs { 80, support.int(81, 200) } do
      local tbl = l2l.profile.table(width)
      assert.is_truthy(tbl:find("^l2l profile: cpu, 1 step,"), tbl)
      local lines = 0
      for line in tbl:gmatch("[^\n]+") do
        assert.is_true(#line <= width, ("%d columns: %s"):format(width, line))
        lines = lines + 1
      end
      assert.is_true(lines <= 32, tbl)
    end
    assert.has_error(function() l2l.profile.table(10) end,
                     "l2l.profile.table: width must be a whole number of columns from 80 to 1000, got 10")
    assert.has_error(function() l2l.profile.start { skip = -1 } end,
                     "l2l.profile.start: skip must be a whole number of steps >= 0, got number -1")
    assert.has_error(function() l2l.profile.start { skips = 1 } end)
    assert.has_error(function() l2l.profile.write("") end)
    assert.has_error(function() l2l.profile.write(path, { overwrite = 1 }) end)
    local rows = require("ffi").new("l2l_profile_row[1]")
    assert.are_not.equal(0, l2l.C.l2l_profile_rows(rows, 0, 100000))
    assert.are_not.equal(0, l2l.C.l2l_profile_rows(rows, -1, 1))
    assert.are_not.equal(0, l2l.C.l2l_profile_rows(nil, 0, 1))
    assert.are_not.equal(0, l2l.C.l2l_profile_get_summary(nil))
    run:free()
  end)

  it("profiles a whole program from L2L_PROFILE, leaving out L2L_PROFILE_SKIP steps", function()
    local dir = support.tmpdir()
    local script = dir .. "/three_steps.lua"
    support.write_file(script, [[
local l2l = require("l2l")
local run = l2l.Relay { model = l2l.Sequential {
  l2l.Embedding { vocab = 23, dim = 16, max_seq = 7, seed = 3 },
  l2l.Block { dim = 16, heads = 2, causal = true, seed = 4 },
  l2l.LMHead { vocab = 23, dim = 16, tie = true, seed = 5 } }, micro_batch = 2,
  optimizer = l2l.AdamW { lr = 1e-3 } }
local tok, tgt = l2l.zeros({ 3, 7 }, { dtype = "i32" }), l2l.ones({ 3, 7 }, { dtype = "i32" })
for _ = 1, 3 do run:step(tok, tgt) end
print("trained")
]])
    local tsv = dir .. "/p.tsv"
    local status, out = support.sh(("L2L_PROFILE=%s L2L_PROFILE_SKIP=1 %s/l2l %s 2>&1"):format(tsv, support.build, script))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("trained", 1, true), out)
    assert.is_truthy(out:find("l2l profile: cpu, 2 steps,", 1, true), out)
    local text = support.read_file(tsv)
    assert.is_truthy(text and text:find("^# l2l profile: backend cpu, 2 steps"), text)
    -- the shares of the ops and of the idle causes make the step (each written to 6 places)
    local share, rows = 0, 0
    for kind, s in text:gmatch("\n(%a+)\t[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\t([^\t]*)\t") do
      if kind == "op" or kind == "idle" then share, rows = share + tonumber(s), rows + 1 end
    end
    assert.is_true(rows > 5 and math.abs(share - 1) <= rows * 5e-7 + 1e-9, ("%d rows, shares sum to %.9f"):format(rows, share))
    status, out = support.sh(("L2L_PROFILE=%s L2L_PROFILE_SKIP=x %s/l2l %s 2>&1"):format(tsv, support.build, script))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("L2L_PROFILE_SKIP='x' is not a count of steps", 1, true), out)
  end)
end)
