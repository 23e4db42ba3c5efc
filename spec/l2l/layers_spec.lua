-- SPDX-License-Identifier: MIT
-- layers_spec — the layers from Lua: tiny models built from them learn, the Lua layer API
-- (options, memory reports, parameter records, ties) behaves, and misuse raises errors
-- that name the argument. Gradients against finite differences of float64 references are
-- checked in C (spec/c/layers/test_layers*.c); here the models must learn, which no broken
-- gradient lets them do.
local support = dofile("spec/support.lua")
local l2l = require("l2l")

-- AdamW over a model's unique parameter records (the EPS of a later issue does this on
-- worker threads; a whole-model loop needs only the op).
local function trainer(model, lr)
  local params, state = model:params(), {}
  for i, p in ipairs(params) do
    state[i] = { m = l2l.zeros(p.value:shape()), v = l2l.zeros(p.value:shape()) }
  end
  local step = 0
  return function(batch)
    step = step + 1
    batch.step = step
    model:zero_grad()
    local loss = model:forward(batch)
    model:backward(batch)
    for i, p in ipairs(params) do
      l2l.ops.adamw(p.value, state[i].m, state[i].v, p.grad,
                    { lr = lr, weight_decay = p.decays and 0.01 or 0 }, step)
    end
    return loss
  end
end

-- Learning is claimed on a fixed seed: a claim that a loss falls so far in so many steps
-- holds for most seeds, not all. Weights, dropout streams (rng ids) and data all come
-- from it, so the run does not depend on which specs ran before it in the process. At
-- seed 1 the GPT ends at 0.7 % of its first loss, the BERT at 0.2 %.
local LEARN_SEED = 1

local function mean(list, first, last)
  local s = 0
  for i = first, last do s = s + list[i] end
  return s / (last - first + 1)
end

describe("layers", function()
  it("a tiny GPT (pre-LN, causal, tied head, one frugal block, dropout) learns to reverse sequences", function()
    local V, n, B = 12, 6, 16
    local S, SEP = 2 * n + 1, V - 1
    math.randomseed(LEARN_SEED)
    local model = l2l.Sequential{
      l2l.Embedding{ vocab = V, dim = 32, max_seq = S, seed = LEARN_SEED },
      l2l.Block{ dim = 32, heads = 4, causal = true, memory = "frugal", dropout = 0.05, seed = LEARN_SEED + 1 },
      l2l.Block{ dim = 32, heads = 4, causal = true, seed = LEARN_SEED + 2 },
      l2l.LMHead{ vocab = V, dim = 32, tie = true, seed = LEARN_SEED + 3 },
    }
    for i = 1, #model do model:layer(i):rng_id(1000 + i) end
    local step = trainer(model, 3e-3)
    local losses = {}
    for s = 1, 200 do
      local tok, tgt = {}, {}
      for b = 1, B do
        local t, g = {}, {}
        for i = 1, n do t[i] = support.int(0, SEP - 1) end
        t[n + 1] = SEP
        for i = 1, n do t[n + 1 + i] = t[n + 1 - i] end
        for i = 1, S do g[i] = (i > n and i < S) and t[i + 1] or -1 end   -- only the answer counts
        tok[b], tgt[b] = t, g
      end
      losses[s] = step({ tokens = l2l.tensor(tok, { dtype = "i32" }),
                         targets = l2l.tensor(tgt, { dtype = "i32" }), seed = LEARN_SEED })
    end
    local first, last = mean(losses, 1, 10), mean(losses, 191, 200)
    assert.is_true(first > 2.0, ("starting loss %g should be near ln 11 = 2.4"):format(first))
    assert.is_true(last < 0.2 * first,
                   ("loss fell only from %g to %g (seed %d)"):format(first, last, LEARN_SEED))
  end)

  it("a tiny BERT (post-LN, bidirectional, token types, padding) learns masked tokens", function()
    -- Sample b is n copies of a_b (type 0) then n copies of c_b (type 1), then 0-2 padding
    -- positions hidden by the key mask; three positions are masked and must be recovered
    -- from the unmasked ones of their own half.
    local V, n, B = 12, 5, 16
    local S, MASK, PAD = 2 * n + 2, V - 1, V - 2
    -- The blocks start at init_std 0.1: at the default 0.02 these narrow blocks stalled
    -- near loss 1 for 2 seeds in 31 (0 of 91 at 0.1).
    math.randomseed(LEARN_SEED)
    local model = l2l.Sequential{
      l2l.Embedding{ vocab = V, dim = 32, max_seq = S, type_vocab = 2, seed = LEARN_SEED },
      l2l.Block{ dim = 32, heads = 4, post_ln = true, memory = "frugal", seed = LEARN_SEED + 1,
                 init_std = 0.1 },
      l2l.Block{ dim = 32, heads = 4, post_ln = true, dropout = 0.05, seed = LEARN_SEED + 2,
                 init_std = 0.1 },
      l2l.LMHead{ vocab = V, dim = 32, tie = true, seed = LEARN_SEED + 3 },
    }
    for i = 1, #model do model:layer(i):rng_id(1000 + i) end
    local step = trainer(model, 3e-3)
    local losses = {}
    for s = 1, 400 do
      local tok, typ, tgt, mask = {}, {}, {}, {}
      for b = 1, B do
        local first, second, pad = support.int(0, PAD - 1), support.int(0, PAD - 1), support.int(0, 2)
        local t, y, g, m = {}, {}, {}, {}
        for i = 1, S do
          t[i] = i <= n and first or i <= 2 * n and second or PAD
          y[i] = i <= n and 0 or 1
          g[i] = -1
          m[i] = i <= S - pad and 1 or 0
        end
        for _ = 1, 3 do
          local i = support.int(1, 2 * n)
          g[i], t[i] = t[i] == MASK and g[i] or t[i], MASK
        end
        tok[b], typ[b], tgt[b], mask[b] = t, y, g, m
      end
      losses[s] = step({ tokens = l2l.tensor(tok, { dtype = "i32" }),
                         token_types = l2l.tensor(typ, { dtype = "i32" }),
                         targets = l2l.tensor(tgt, { dtype = "i32" }),
                         key_mask = l2l.tensor(mask, { dtype = "u8" }), seed = LEARN_SEED })
    end
    local first, last = mean(losses, 1, 10), mean(losses, 391, 400)
    assert.is_true(first > 2.0, ("starting loss %g should be near ln 10 = 2.3"):format(first))
    assert.is_true(last < 0.3 * first,
                   ("loss fell only from %g to %g (seed %d)"):format(first, last, LEARN_SEED))
  end)

  it("reports parameters, memory and ties", function()
    local emb = l2l.Embedding{ vocab = 50, dim = 16, max_seq = 9 }
    local block = l2l.Block{ dim = 16, heads = 2, mlp = 40 }
    local head = l2l.LMHead{ vocab = 50, dim = 16, tie = true }
    assert.are.equal(50 * 16 + 9 * 16, emb:nparams())
    assert.are.equal(4 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 40 + 40 + 40 * 16 + 16, block:nparams())
    local model = l2l.Sequential{ emb, block, head }
    -- the tied table is one record with two users and is counted once
    assert.are.equal(emb:nparams() + block:nparams() + 2 * 16, model:nparams())
    local wte = emb:params()[1]
    assert.are.equal(2, wte.users)
    assert.are.equal(wte.id, head:params()[3].id)
    -- frugal keeps strictly less and says how much
    local std = block:saved_bytes(3, 9)
    block:set_memory("frugal")
    local fru = block:saved_bytes(3, 9)
    assert.is_true(fru < std, ("frugal %d bytes, standard %d"):format(fru, std))
    local m = block:memory(3, 9)
    assert.are.equal(fru, m.saved + m.input_kept)
    assert.are.equal(m.saved + math.max(m.work_forward, m.work_backward), m.peak)
    -- clones have their own records with the same values
    local twin = block:clone()
    local a, b = block:params()[3], twin:params()[3]
    assert.are_not.equal(a.id, b.id)
    assert.are.same(a.value:totable(), b.value:totable())
    -- a record's grad is made when first read (it hands the accumulator out): the same
    -- tensor each read, the record's own; read after its layer is freed, refused
    local entry = twin:params()[3]
    assert.is_nil(rawget(entry, "grad"))
    local g = entry.grad
    assert.are.equal(g, entry.grad)
    assert.are.same(a.value:shape(), g:shape())
    local late = twin:params()[3]
    twin:free()
    local ok, err = pcall(function() return late.grad end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("p.grad: the layer was freed", 1, true), tostring(err))
  end)

  it("refuses bad options and batches with errors naming them", function()
    local function fails(pattern, f)
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pattern), tostring(err))
    end
    fails("option 'heads'", function() l2l.Block{ dim = 16, heads = 0 } end)
    fails("heads %(3%) must divide dim", function() l2l.Block{ dim = 16, heads = 3 } end)
    fails("option 'dropout'", function() l2l.Block{ dim = 16, heads = 2, dropout = 1 } end)
    fails("unknown option 'head'", function() l2l.Block{ dim = 16, head = 2 } end)
    fails("option 'memory'", function() l2l.Block{ dim = 16, heads = 2, memory = "tiny" } end)
    fails("no Embedding comes before", function() l2l.Sequential{ l2l.LMHead{ vocab = 5, dim = 4, tie = true } } end)
    fails("entry 2 is not a layer", function() l2l.Sequential{ l2l.Block{ dim = 4, heads = 1 }, 7 } end)
    local emb = l2l.Embedding{ vocab = 5, dim = 4, max_seq = 3 }
    fails("tokens:get%(1, 2%) = 5 is outside %[0, 5%)", function()
      emb:forward(nil, { tokens = l2l.tensor({ { 1, 5 } }, { dtype = "i32" }) })
    end)
    fails("exceeds max_seq", function()
      emb:forward(nil, { tokens = l2l.zeros({ 1, 4 }, { dtype = "i32" }) })
    end)
    local block = l2l.Block{ dim = 4, heads = 2 }
    fails("x is f32 %(2,3,5%), need f32 %(2,3,4%)", function() block:forward(l2l.zeros({ 2, 3, 5 }), {}) end)
    fails("batch.key_mask", function() block:forward(l2l.zeros({ 2, 3, 4 }), { key_mask = 3 }) end)
    fails("no saved state", function() block:backward(l2l.zeros({ 2, 3, 4 }), {}) end)
    local model = l2l.Sequential{ emb, block, l2l.LMHead{ vocab = 5, dim = 4 } }
    fails("layer 3 %(lm_head%).*targets", function()
      model:forward({ tokens = l2l.zeros({ 1, 3 }, { dtype = "i32" }),
                      targets = l2l.tensor({ { 0, 1, 9 } }, { dtype = "i32" }) })
    end)
  end)
end)

describe("layers the garbage collector frees", function()
  it("leave the host pool's cache bounded by what was ever in use at once", function()
    -- Freed in whatever order the collector picks, the pages of a thousand layers used to
    -- stay cached and unreusable (jemalloc does not serve small requests from the large
    -- extents they coalesce into): the cache grew by the whole working set each round.
    -- The pool looks at its cache once per 64 MiB freed and gives it back when in use and
    -- cached pass the most in use at once by more than 64 MiB or a quarter of it
    -- (src/core/pool.c, TRIM_CHECK_BYTES and TRIM_SLACK_BYTES): so the cache is within the
    -- peak and that slack at a look, and 64 MiB more freed since; what is in use is back
    -- at `base` after each round. With the trim taken out the cache reached 700 MiB in the
    -- six rounds against this bound's 225. (The bound was once twice the first round's cache
    -- and 64 MiB: a round can end just after a trim, its cache 1-2 MiB, and a later one at
    -- 153 MiB, within this bound: one run in six failed.)
    local l2l = require("l2l")
    local host = function() return l2l.pool_stats("host") end
    collectgarbage(); collectgarbage()
    local base = host().current
    local worst = 0
    for _ = 1, 6 do
      for _ = 1, 1000 do local _ = l2l.Block { dim = 32, heads = 2 } end
      collectgarbage(); collectgarbage()
      local s = host()
      assert.are.equal(base, s.current)
      worst = math.max(worst, s.reserved)
    end
    local MiB = 2 ^ 20
    local peak = host().peak   -- (the most in use at once, since the process began)
    local bound = base + peak + math.max(peak / 4, 64 * MiB) + 64 * MiB
    assert.is_true(support.within(worst, bound, "the host pool's cache after rounds of freed layers"),
                   ("reserved reached %.1f MiB, the bound %.1f MiB (peak in use %.1f MiB)")
                   :format(worst / MiB, bound / MiB, peak / MiB))
  end)
end)
