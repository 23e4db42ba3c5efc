-- SPDX-License-Identifier: MIT
-- optim_compact_state_spec — the optimizer state kept in bf16 or 8 bits (the optimizers' `state`
-- option; include/l2l/relay.h, "optimizers"): the option checked; the EPS's host bytes, counted
-- here from the documented layout, fall as they should; the first update moves the weights
-- exactly as f32 state does (it runs in f32 on the decoded zero state; LAMB's second wave
-- reads the state as kept, so not LAMB's) and leaves a state
-- that this file's own decoder, written from the header's rule in double, finds within
-- the code's bound of the f32 run's state (bf16: the nearest even); training learns a batch
-- as f32 state does; checkpoints load into any precision (f32 -> 8bit -> f32 within the bound);
-- a spill file holds the compact form, the same to the bit as in memory. bf16 masters
-- (l2l.Relay's master = "bf16"): the low-precision values bf16 while in the relay and f32
-- again after, the bytes the layout says, the same seed the same bits and another seed
-- other bits (the stochastic rounding's draws), checkpoints between f32 and bf16 masters.
-- (Resume bit for bit in each precision: checkpoint_spec; the codes, the encoder and the
-- fused update against double references: spec/c/eps/test_quant.c.)
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local ffi = require("ffi")

local seed = support.seed
math.randomseed(seed)

local V, n = 37, 6
local S = 2 * n + 1
local BLOCK = 2048
local STATES = { "f32", "bf16", "8bit" }

local function tiny_gpt(s, dim)
  return l2l.Sequential {
    l2l.Embedding { vocab = V, dim = dim, max_seq = S, seed = s },
    l2l.Block { dim = dim, heads = 4, causal = true, seed = s + 1 },
    l2l.LMHead { vocab = V, dim = dim, tie = true, seed = s + 3 },
  }
end

local function batches(count, B) return support.reversal_batches(count, B, n, V) end

local makers = {
  adamw = function(state) return l2l.AdamW { lr = 3e-3, state = state } end,
  lamb = function(state) return l2l.LAMB { lr = 3e-2, state = state } end,
  sgd = function(state) return l2l.SGD { lr = 0.1, momentum = 0.9, state = state } end,
}
-- arrays kept: the first a momentum (signed code), Adam's second its square root's
local ARRAYS = { adamw = { "m", "v" }, lamb = { "m", "v" }, sgd = { "m" } }

-- The code's magnitudes from the header's rule: 0, then 10^-E (0.1 + 0.9 (k + 1) / 2^(b-1-E)).
local function magnitudes(bits)
  local m = { [0] = 0 }
  for e = bits - 1, 0, -1 do
    local f = 2 ^ (bits - 1 - e)
    for k = 0, f - 1 do m[#m + 1] = 10 ^ -e * (0.1 + 0.9 * (k + 1) / f) end
  end
  return m
end
local M7, M8 = magnitudes(7), magnitudes(8)
local function widest_half_gap(m)
  local g = 0
  for j = 1, #m do g = math.max(g, (m[j] - m[j - 1]) / 2) end
  return g
end

-- An 8-bit array (a u8 tensor) of count elements decoded in double, and each element's
-- bound: its block's scale times the code's widest half gap (for v, of sqrt(v)).
local function decode8(t, count, root)
  local bytes = t:data()
  local codes = math.ceil(count / 4) * 4
  local scales = ffi.cast("const float *", bytes + codes)
  local out, scale_of = {}, {}
  for i = 0, count - 1 do
    local s, c = scales[math.floor(i / BLOCK)], bytes[i]
    local v
    if root then v = (M8[c] * s) ^ 2 else v = (c >= 128 and -1 or 1) * M7[c % 128] * s end
    out[i + 1], scale_of[i + 1] = v, s
  end
  return out, scale_of
end

local function values(t)
  local p, out = t:data(), {}
  for i = 0, t:numel() - 1 do out[i + 1] = p[i] end
  return out
end

local function bf16_nearest_even(x)
  local f = ffi.new("float[1]", x)
  local u = ffi.cast("uint32_t *", f)[0]
  local down = bit.band(u, 0xffff0000)
  local lo, hi = ffi.new("uint32_t[1]", down), ffi.new("uint32_t[1]", down + 0x10000)
  local a, b = ffi.cast("float *", lo)[0], ffi.cast("float *", hi)[0]
  local da, db = math.abs(x - a), math.abs(b - x)
  if da < db then return a elseif db < da then return b end
  return bit.band(bit.rshift(down, 16), 1) == 0 and a or b
end

local function same(a, b)
  local x, y = a:data(), b:data()
  for i = 0, a:numel() - 1 do if x[i] ~= y[i] then return false end end
  return true
end

describe("compact optimizer state (seed " .. seed .. ")", function()
  it("is an option of each optimizer, checked", function()
    for _, make in ipairs({ l2l.AdamW, l2l.LAMB, function(o) o.momentum = 0.9; return l2l.SGD(o) end }) do
      for _, st in ipairs(STATES) do
        local o = make { state = st }
        assert.are.equal(st, o.state)
        assert.is_truthy(tostring(o):find(('state = "%s"'):format(st), 1, true))
      end
      assert.are.equal("f32", make {}.state)
      for _, bad in ipairs({ "4bit", "F32", 8, true }) do
        local ok, err = pcall(make, { state = bad })
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find("option 'state' must be \"f32\", \"bf16\" or \"8bit\"", 1, true), err)
      end
    end
  end)

  it("count the host bytes the layout says, and the first update is f32's to the bit", function()
    local dim = ({ 32, 48, 64 })[support.int(1, 3)]
    local data = batches(1, support.int(2, 5))
    for kind, make in pairs(makers) do
      local runs = {}
      for _, st in ipairs(STATES) do
        local model = tiny_gpt(11, dim)
        runs[st] = l2l.Relay { model = model, optimizer = make(st), micro_batch = 2 }
        runs[st]:step(data[1][1], data[1][2])
        runs[st]:sync()
      end
      local what = ("%s dim %d"):format(kind, dim)
      -- bytes: masters and accumulators f32, the arrays in their precision, each allocation
      -- counted rounded up to L2L_ALIGN
      local function acc(b) return math.ceil(b / l2l.C.L2L_ALIGN) * l2l.C.L2L_ALIGN end
      local function array_bytes(st, count)
        if st == "f32" then return 4 * count elseif st == "bf16" then return 2 * count end
        return math.ceil(count / 4) * 4 + 4 * math.ceil(count / BLOCK)
      end
      for _, st in ipairs(STATES) do
        local want = 0
        for _, p in ipairs(runs[st].model:params()) do
          local count = p.value:numel()
          want = want + 2 * acc(4 * count) + #ARRAYS[kind] * acc(array_bytes(st, count))
        end
        assert.are.equal(want, runs[st]:stats().host_eps_bytes, what .. " " .. st)
      end
      local f32 = runs.f32.model:params()
      for _, st in ipairs({ "bf16", "8bit" }) do
        for k, p in ipairs(runs[st].model:params()) do
          -- (LAMB's second wave reads the state as kept: its first step is not f32's)
          assert.is_true(kind == "lamb" or same(f32[k].value, p.value),
                         ("%s %s: %s after the first update"):format(what, st, p.name))
          for a, which in ipairs(ARRAYS[kind]) do
            local want = values(runs.f32:state(f32[k], which))
            local got = runs[st]:state(p, which)
            local count = p.value:numel()
            if st == "bf16" then
              assert.are.equal("bf16", got:dtype())
              local back = got:cast("f32")
              local v = values(back)
              for i = 1, count do
                if v[i] ~= bf16_nearest_even(want[i]) then
                  error(("%s bf16 %s.%s[%d] = %.9g, the nearest even of %.9g"):format(what, p.name, which, i, v[i], want[i]))
                end
              end
            else
              assert.are.equal("u8", got:dtype())
              assert.are.equal(math.ceil(count / 4) * 4 + 4 * math.ceil(count / BLOCK), got:numel())
              local root = which == "v"
              local v, scale = decode8(got, count, root)
              local gap = widest_half_gap(root and M8 or M7)
              for i = 1, count do
                local moved = root and math.abs(math.sqrt(v[i]) - math.sqrt(want[i])) or math.abs(v[i] - want[i])
                if moved > scale[i] * (gap + 2 ^ -20) + 1e-44 then
                  error(("%s 8bit %s.%s[%d] = %.9g, f32 %.9g: beyond the bound (scale %.9g)"):format(
                    what, p.name, which, i, v[i], want[i], scale[i]))
                end
              end
            end
          end
        end
      end
      for _, r in pairs(runs) do r:free() end
    end
  end)

  -- Forty steps on one batch: every optimizer here learns it by heart, its loss falling from
  -- about ln V to under half that, in every precision. (Steps over fresh batches would make
  -- a falling loss a matter of which batches came last, and of a build's rounding: SGD
  -- learns the task slowly, its loss moving less than from one batch to the next.) The
  -- compact state's last loss stays within a quarter of f32's fall from f32's. Over 60
  -- batches drawn (2026-11-30) the last loss was at most 0.28 of the first (LAMB; SGD at
  -- lr 0.3 instead of 0.1 diverged on 4 of 150) and 8-bit state within 0.007 of the fall.
  it("train on to a falling loss, as f32 state does", function()
    local data = batches(1, 8)[1]
    for kind, make in pairs(makers) do
      local fell
      for _, st in ipairs(STATES) do
        local run = l2l.Relay { model = tiny_gpt(5, 32), optimizer = make(st), micro_batch = 4 }
        local first, last
        for i = 1, 40 do
          last = run:step(data[1], data[2])
          assert.is_true(last == last and last < math.huge, ("%s %s step %d: loss %s"):format(kind, st, i, last))
          first = first or last
        end
        assert.is_true(support.within(last, first / 2, kind .. " " .. st .. " loss fell by half") and last < first / 2,
                       ("%s %s: the loss %.4f -> %.4f"):format(kind, st, first, last))
        if st == "f32" then
          fell = { first, last }
        else
          assert.is_true(support.within(math.abs(last - fell[2]), (fell[1] - fell[2]) / 4,
                                        kind .. " " .. st .. " loss against f32's"),
                         ("%s %s: the last loss %.4f, f32's %.4f"):format(kind, st, last, fell[2]))
        end
        run:free()
      end
    end
  end)

  it("load into any precision: f32 -> 8bit -> f32 within the code's bound", function()
    local data = batches(4, 4)
    local run = l2l.Relay { model = tiny_gpt(9, 48), optimizer = makers.adamw("f32"), micro_batch = 2 }
    for i = 1, 3 do run:step(data[i][1], data[i][2]) end
    local path = os.tmpname()
    run:save(path)
    local small = l2l.load(path, { state = "8bit" })
    assert.are.equal("8bit", small.options.optimizer.state)
    local path2 = os.tmpname()
    small:save(path2)
    local back = l2l.load(path2, { state = "f32" })
    assert.are.equal("f32", back.options.optimizer.state)
    local ps, pb, pr = small.model:params(), back.model:params(), run.model:params()
    for k, p in ipairs(pr) do
      assert.is_true(same(p.value, ps[k].value) and same(p.value, pb[k].value), p.name)
      for _, which in ipairs({ "m", "v" }) do
        local root = which == "v"
        local want = values(run:state(p, which))
        local coded, scale = decode8(small:state(ps[k], which), p.value:numel(), root)
        local wide = values(back:state(pb[k], which))
        local gap = widest_half_gap(root and M8 or M7)
        for i = 1, #want do
          local moved = root and math.abs(math.sqrt(coded[i]) - math.sqrt(want[i])) or math.abs(coded[i] - want[i])
          assert.is_true(moved <= scale[i] * (gap + 2 ^ -20) + 1e-44, ("%s.%s[%d]"):format(p.name, which, i))
          -- the f32 run holds the 8-bit values (decoded in f32: within its rounding)
          assert.is_true(math.abs(wide[i] - coded[i]) <= 2 ^ -21 * math.abs(coded[i]) + 1e-44,
                         ("%s.%s[%d]: %.9g, 8-bit %.9g"):format(p.name, which, i, wide[i], coded[i]))
        end
      end
    end
    -- and the converted runs train on
    for _, r in ipairs({ small, back }) do
      local loss = r:step(data[4][1], data[4][2])
      assert.is_true(loss == loss and loss < math.huge)
      r:free()
    end
    run:free()
    os.remove(path)
    os.remove(path2)
  end)

  it("keep bf16 masters while in the relay, count their bytes, round them by the seed's draws", function()
    local data = batches(6, 4)
    for _, bad in ipairs({ { master = "f16" }, { master = true }, { master = "bf16", precision = "f32" } }) do
      bad.model = tiny_gpt(3, 32)
      local ok, err = pcall(l2l.Relay, bad)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("master", 1, true), err)
    end
    local st = STATES[support.int(1, 3)]
    local kind = ({ "adamw", "lamb", "sgd" })[support.int(1, 3)]
    local what = kind .. " state " .. st
    local function train(seed)
      local model = tiny_gpt(7, 64)
      local run = l2l.Relay { model = model, optimizer = makers[kind](st), micro_batch = 2, master = "bf16",
                              seed = seed }
      assert.are.equal("bf16", run.options.precision)
      local losses = {}
      for i = 1, #data do losses[i] = run:step(data[i][1], data[i][2]) end
      run:sync()
      return run, model, losses
    end
    local run, model, losses = train(11)
    local again, model2, losses2 = train(11)
    local other, model3 = train(12)
    local bytes, low = 0, 0
    local function acc(b) return math.ceil(b / l2l.C.L2L_ALIGN) * l2l.C.L2L_ALIGN end
    local array = { f32 = function(c) return 4 * c end, bf16 = function(c) return 2 * c end,
                    ["8bit"] = function(c) return math.ceil(c / 4) * 4 + 4 * math.ceil(c / BLOCK) end }
    local p2, p3, kept, differs = model2:params(), model3:params(), {}, false
    for k, p in ipairs(model:params()) do
      local count, dtype = p.value:numel(), p.value:dtype()
      -- GEMM weights and the token table bf16; the others (LayerNorm, biases, positions) f32
      local gemm = p.name:find("weight$") and not p.name:find("ln", 1, true)
      assert.are.equal((gemm or p.name:find("wte$")) and "bf16" or "f32", dtype, what .. ": " .. p.name)
      if dtype == "bf16" then low = low + 1 end
      bytes = bytes + acc((dtype == "bf16" and 2 or 4) * count) + acc(4 * count) + #ARRAYS[kind] * acc(array[st](count))
      assert.is_true(same(p.value, p2[k].value), what .. ": the same seed, other bits in " .. p.name)
      if dtype == "bf16" then differs = differs or not same(p.value, p3[k].value) end
      kept[k] = p.value:cast("f32")
    end
    assert.is_true(low >= 3, what .. ": bf16 masters")
    assert.is_true(differs, what .. ": another seed rounded to the very same bits")
    assert.are.equal(bytes, run:stats().host_eps_bytes, what)
    for i = 1, #losses do assert.are.equal(losses[i], losses2[i], what .. " step " .. i) end
    -- a checkpoint of bf16 masters loads into f32 masters exactly, and back
    local path = os.tmpname()
    run:save(path)
    local wide = l2l.load(path, { master = "f32", precision = nil })
    for k, p in ipairs(wide.model:params()) do
      assert.are.equal("f32", p.value:dtype())
      assert.is_true(same(kept[k], p.value), what .. ": widened " .. p.name)
    end
    local narrow_path = os.tmpname()
    wide:save(narrow_path)
    local narrow = l2l.load(narrow_path, { master = "bf16" })
    for k, p in ipairs(narrow.model:params()) do
      assert.is_true(same(kept[k], p.value:cast("f32")), what .. ": narrowed again " .. p.name)
    end
    for _, r in ipairs({ wide, narrow, again, other }) do r:free() end
    -- leaving the relay: f32 values equal to the bf16 ones
    run:free()
    for k, p in ipairs(model:params()) do
      assert.are.equal("f32", p.value:dtype())
      assert.is_true(same(kept[k], p.value), what .. ": after the relay " .. p.name)
    end
    os.remove(path)
    os.remove(narrow_path)
  end)

  it("spill the compact form: the same bits as in memory, the compact bytes on disk", function()
    local dir = support.tmpdir()
    local data = batches(4, 4)
    for _, st in ipairs({ "bf16", "8bit" }) do
      local kind = ({ "adamw", "lamb", "sgd" })[support.int(1, 3)]
      local plain = l2l.Relay { model = tiny_gpt(3, 64), optimizer = makers[kind](st), micro_batch = 2 }
      local model = tiny_gpt(3, 64)
      local spilled = l2l.Relay { model = model, optimizer = makers[kind](st), micro_batch = 2,
                                  spill = dir, host_budget = 1 }
      local ok, err = pcall(spilled.step, spilled, data[1][1], data[1][2])
      local smallest = tonumber(tostring(err):match("is below the (%d+)"))
      assert.is_false(ok)
      assert.is_truthy(smallest, err)
      spilled:set_host_budget(smallest)
      local what = kind .. " " .. st
      for i = 1, 4 do
        assert.are.equal(plain:step(data[i][1], data[i][2]), spilled:step(data[i][1], data[i][2]), what .. " step " .. i)
      end
      spilled:sync()
      local st_spill = spilled:stats()
      -- the last step read every record's state (its last update's) in the compact form
      local bytes = 0
      for _, p in ipairs(model:params()) do
        local count = p.value:numel()
        local array = st == "bf16" and 2 * count or math.ceil(count / 4) * 4 + 4 * math.ceil(count / BLOCK)
        bytes = bytes + #ARRAYS[kind] * array
      end
      assert.is_true(st_spill.spill_read_bytes > 0 and st_spill.spill_read_bytes <= bytes,
                     ("%s: read %d bytes, the compact state is %d"):format(what, st_spill.spill_read_bytes, bytes))
      local pp = plain.model:params()
      for k, p in ipairs(model:params()) do
        assert.is_true(same(pp[k].value, p.value), what .. ": " .. p.name)
        for _, which in ipairs(ARRAYS[kind]) do
          assert.is_true(same(plain:state(pp[k], which), spilled:state(p, which)), what .. ": " .. p.name .. "." .. which)
        end
      end
      plain:free()
      spilled:free()
    end
  end)

  it("refuse alike, in every precision, an update whose gradient would overflow the state", function()
    -- A gradient element g of magnitude 2^63 or more (as the update applies it) is what
    -- the relay's non-finite policy refuses, as it refuses an inf or a NaN: Adam's second
    -- moment takes g^2, and below 2^63 that is below 2^126, a factor 4 under f32's largest
    -- (2^128), so the state stays finite; at or above it the record's update is skipped
    -- (or the step raises with nonfinite = "error") and its weights and state keep their
    -- bits. Before, f32 and bf16 state took v = inf (every weight finite, the save then
    -- unloadable) and 8-bit state an inf block scale, decoding 0 * inf = NaN into the
    -- block's 2,047 other weights. The value is planted in one element of one record's
    -- accumulator (what the step adds its gradient to), drawn at or above 2^63, or just
    -- below (which must update, and leave everything finite and loadable).
    local data = batches(4, 4)
    local kinds = { "adamw", "lamb", "sgd" }
    local kind = kinds[support.int(1, 3)]
    local deferred = support.int(0, 1) == 1   -- updates wait for the step's end (loss scaling)
    local mode = ({ "skip", "error" })[support.int(1, 2)]
    local above = support.int(0, 2) > 0
    local magnitude = above and 2 ^ (63 + support.uniform(0, 60)) or 2 ^ (62 + support.uniform(0, 1))
    if support.int(0, 3) == 0 then magnitude = above and 2 ^ 63 or 2 ^ 63 - 2 ^ 39 end   -- the edges themselves
    local value = (support.int(0, 1) == 0 and -1 or 1) * magnitude
    local pick_record, pick_element
    local function finite_bytes(t)   -- every value of a state array or master finite
      if t:dtype() == "u8" then return true end   -- (8 bits: the load below checks what they decode to)
      local v = t:dtype() == "f32" and t or t:cast("f32")
      local x = v:data()
      for i = 0, v:numel() - 1 do
        if not (x[i] == x[i] and math.abs(x[i]) < math.huge) then return false end
      end
      return true
    end
    local function bytes_of(t)
      local size = ({ f32 = 4, bf16 = 2, u8 = 1 })[t:dtype()]
      return ffi.string(t:data(), t:numel() * size)
    end
    for _, st in ipairs(STATES) do
      local what = ("%s %s state, %s, nonfinite = %s, g = %.17g (seed %d)"):format(
        kind, st, deferred and "deferred" or "eager", mode, value, seed)
      local model = tiny_gpt(7, 64)
      local run = l2l.Relay { model = model, optimizer = makers[kind](st), micro_batch = 2, nonfinite = mode,
                              loss_scale = deferred and 1 or 0, loss_scale_window = 1000 }
      run:step(data[1][1], data[1][2])
      run:sync()
      local params = model:params()
      pick_record = pick_record or support.int(1, #params)
      local p = params[pick_record]
      pick_element = pick_element or support.int(0, p.value:numel() - 1)
      local before, state_before = bytes_of(p.value), {}
      for _, which in ipairs(ARRAYS[kind]) do state_before[which] = bytes_of(run:state(p, which)) end
      p.grad:data()[pick_element] = value
      local ok, err = pcall(run.step, run, data[2][1], data[2][2])
      run:sync()
      local stats = run:stats()
      if above then
        if mode == "error" then
          assert.is_false(ok, what)
          assert.is_truthy(tostring(err):find("2^63", 1, true), what .. ": " .. tostring(err))
        else
          assert.is_true(ok, what .. ": " .. tostring(err))
        end
        assert.are.equal(1, stats.skipped_records, what .. ": records skipped")
        assert.are.equal(before, bytes_of(p.value), what .. ": the record's weights kept their bits")
        for _, which in ipairs(ARRAYS[kind]) do
          assert.are.equal(state_before[which], bytes_of(run:state(p, which)), what .. ": its state " .. which)
        end
      else
        assert.is_true(ok, what .. ": " .. tostring(err))
        assert.are.equal(0, stats.skipped_records, what .. ": below 2^63 the update is made")
        assert.are_not.equal(before, bytes_of(p.value), what .. ": the record updated")
      end
      for _, q in ipairs(model:params()) do
        assert.is_true(finite_bytes(q.value), what .. ": weights of " .. q.name)
        for _, which in ipairs(ARRAYS[kind]) do
          assert.is_true(finite_bytes(run:state(q, which)), what .. ": state " .. which .. " of " .. q.name)
        end
      end
      -- what was saved loads (save and load agree), and goes on as the run does
      local path = os.tmpname()
      run:save(path)
      local back = l2l.load(path)
      os.remove(path)
      if above then   -- (below, SGD's weight of order lr 2^62 makes later losses inf)
        local a = run:step(data[3][1], data[3][2])
        local b = back:step(data[3][1], data[3][2])
        assert.are.equal(a, b, what .. ": the loaded run's next loss")
        run:sync()
        assert.are.equal(0, run:stats().skipped_records, what .. ": the next step trains")
        assert.are_not.equal(before, bytes_of(p.value), what .. ": and updates the record")
      end
      back:free()
      run:free()
    end
  end)
end)
