-- SPDX-License-Identifier: MIT
-- checkpoint_c_spec — the C API's checkpoints (l2l_relay_save, l2l_relay_load) and the front
-- end's (run:save, l2l.load) are one format: a file either writes, the other loads, and the
-- run goes on to the bit. The reference is the run that never stopped; the configuration
-- (optimizer, state precision, masters, accumulation, loss scaling, dropout, a tied head, a
-- frozen layer) is drawn afresh each run, its seed printed in the title.
local l2l = require("l2l")
local ffi = require("ffi")
local cjson = require("cjson").new()
local lib = require("l2l.lib")
local relay = require("l2l.relay")
local support = dofile("spec/support.lua")

local C = lib.C
local seed = support.seed
local V, S = 11, 7

local function tmp_path(tag)
  return ("%s/l2l-ckc-%s-%d-%d.safetensors"):format(os.getenv("TMPDIR") or "/tmp", tag, seed, math.random(1, 1e9))
end

-- A run of configuration cfg, its layers' initial weights from layer_seed.
local function make_run(cfg, layer_seed)
  local D = 8
  local list = { l2l.Embedding{ vocab = V, dim = D, max_seq = S, dropout = cfg.dropout, seed = layer_seed } }
  for b = 1, cfg.blocks do
    list[#list + 1] = l2l.Block{ dim = D, heads = 2, mlp = 16, causal = true, dropout = cfg.dropout,
                                 memory = b % 2 == 0 and "frugal" or "standard", seed = layer_seed + b }
  end
  list[#list + 1] = l2l.LMHead{ vocab = V, dim = D, tie = cfg.tie, seed = layer_seed + 99 }
  local model = l2l.Sequential(list)
  if cfg.freeze then model:freeze(2) end
  local optimizer = ({ l2l.AdamW{ lr = 0.01, weight_decay = 0.1, state = cfg.state },
                       l2l.SGD{ lr = 0.05, momentum = 0.9, nesterov = true, state = cfg.state },
                       l2l.LAMB{ lr = 0.01, state = cfg.state } })[cfg.optimizer]
  return l2l.Relay{ model = model, micro_batch = cfg.micro_batch, optimizer = optimizer,
                    schedule = l2l.Cosine{ warmup = 2, total = 30, final_ratio = 0.1 },
                    accumulate = cfg.accumulate, clip_global_norm = cfg.clip, seed = cfg.seed,
                    loss_scale = cfg.loss_scale, loss_scale_window = 3, master = cfg.master }
end

local function batch_for(step, cfg)
  local tok, tgt = l2l.zeros({ cfg.B, S }, { dtype = "i32" }), l2l.zeros({ cfg.B, S }, { dtype = "i32" })
  local r = l2l.rand({ cfg.B, 2 }, { seed = cfg.data_seed, stream = step })
  for b = 1, cfg.B do
    local t0, stride = math.floor(r:get(b, 1) * V), 1 + math.floor(r:get(b, 2) * 3)
    for s = 1, S do
      tok:set(b, s, (t0 + stride * s) % V)
      tgt:set(b, s, s == 1 and -1 or (t0 + stride * (s + 1)) % V)
    end
  end
  return tok, tgt
end

local function random_config()
  local master = support.int(0, 2) == 0 and "bf16" or nil
  return {
    blocks = support.int(1, 3), dropout = support.int(0, 1) * 0.1, tie = support.int(0, 1) == 1,
    freeze = support.int(0, 3) == 0, optimizer = support.int(1, 3), micro_batch = support.int(1, 3),
    state = ({ "f32", "bf16", "8bit" })[support.int(1, 3)], accumulate = support.int(1, 3),
    clip = support.int(0, 1) * 0.5, seed = support.int(0, 1000), B = support.int(2, 5),
    data_seed = support.int(1, 1e6), loss_scale = support.int(0, 1) * support.int(1, 5000),
    master = master, layer_seed = support.int(1, 1000),
  }
end

-- The uninterrupted run's losses over steps 1..total, and its final weights.
local function uninterrupted(cfg, total)
  local run, want = make_run(cfg, cfg.layer_seed), {}
  for step = 1, total do want[step] = run:step(batch_for(step, cfg)) end
  run:sync()
  local final = {}
  for _, p in ipairs(run.model:params()) do final[#final + 1] = p.value:to("host"):clone() end
  run:free()
  return want, final
end

-- The run's losses from step `from` to total equal want's, and its weights final's.
local function goes_on(run, cfg, from, total, want, final, what)
  for step = from, total do
    assert.are.equal(want[step], run:step(batch_for(step, cfg)), ("%s: step %d"):format(what, step))
  end
  run:sync()
  for k, p in ipairs(run.model:params()) do
    local got, w = p.value:to("host"), final[k]
    assert.are.equal(ffi.string(w:data(), w:numel() * (w:dtype() == "f32" and 4 or 2)),
                     ffi.string(got:data(), got:numel() * (got:dtype() == "f32" and 4 or 2)),
                     ("%s: record %s"):format(what, p.name))
  end
end

describe("checkpoints of the C API and of the front end are one format (seed " .. seed .. ")", function()
  it("a file l2l_relay_save writes, l2l.load loads, and the run goes on to the bit", function()
    for trial = 1, 2 do
      local cfg = random_config()
      local what = ("trial %d: %s"):format(trial, cjson.encode(cfg))
      local total, at = 8, support.int(1, 7)
      local want, final = uninterrupted(cfg, total)
      local run, path = make_run(cfg, cfg.layer_seed), tmp_path("c")
      for step = 1, at do run:step(batch_for(step, cfg)) end
      local extra = '{"at": ' .. at .. ', "by": "C"}'   -- (kept referenced while C reads it)
      local opts = ffi.new("l2l_save_options", { replace = 0, extra = extra })
      assert.are.equal(0, C.l2l_relay_save(relay.c_relay(run, "spec", 1), path, opts), lib.last_error())
      run:free()
      local back = l2l.load(path)
      assert.are.same({ at = at, by = "C" }, back.extra, what)
      assert.are.equal(at, back:stats().steps, what)
      goes_on(back, cfg, at + 1, total, want, final, what)
      back:free()
      os.remove(path)
    end
  end)

  it("a file run:save writes, l2l_relay_load loads into a relay over the same model, and it goes on to the bit", function()
    for trial = 1, 2 do
      local cfg = random_config()
      local what = ("trial %d: %s"):format(trial, cjson.encode(cfg))
      local total, at = 8, support.int(1, 7)
      local want, final = uninterrupted(cfg, total)
      local run, path = make_run(cfg, cfg.layer_seed), tmp_path("lua")
      for step = 1, at do run:step(batch_for(step, cfg)) end
      run:save(path, { at = at })
      run:free()
      -- the same model made again with other weights: the file's come in
      local again = make_run(cfg, cfg.layer_seed + 500)
      assert.are.equal(0, C.l2l_relay_load(relay.c_relay(again, "spec", 1), path), lib.last_error())
      assert.are.equal(at, again:stats().steps, what)
      goes_on(again, cfg, at + 1, total, want, final, what)
      -- a relay whose options change the numbers is refused by name and left as it was
      local cfg2 = {}
      for k, v in pairs(cfg) do cfg2[k] = v end
      cfg2.seed = cfg.seed + 1
      local other = make_run(cfg2, cfg.layer_seed)
      assert.are.equal(C.L2L_ERR_INVALID, C.l2l_relay_load(relay.c_relay(other, "spec", 1), path))
      assert.is_truthy(lib.last_error():find(("'seed' is %d in the file, %d in the relay"):format(cfg.seed, cfg2.seed), 1, true),
                       lib.last_error())
      assert.are.equal(0, other:stats().steps)
      other:free()
      again:free()
      os.remove(path)
    end
  end)
end)
