-- SPDX-License-Identifier: MIT
-- bench/compact_state.lua — the optimizer state in f32, bf16 and 8 bits (issue 33): the
-- host bytes a parameter the EPS reports (stats.host_eps_bytes, not arithmetic) on a
-- GPT-2 124M-shaped model (12 blocks, dim 768, 50257 tokens, tied head) after one update,
-- for AdamW and SGD with momentum in each precision, and AdamW with bf16 masters (relay
-- master = "bf16", precision bf16) in each.
-- Run: build/l2l bench/compact_state.lua [--steps N]   (about a minute; 2.5 GB of RAM)
local l2l = require("l2l")

local function gpt2_124m()
  local list = { l2l.Embedding { vocab = 50257, dim = 768, max_seq = 1024, seed = 1 } }
  for b = 1, 12 do list[#list + 1] = l2l.Block { dim = 768, heads = 12, causal = true, seed = 1 + b } end
  list[#list + 1] = l2l.LMHead { vocab = 50257, dim = 768, tie = true, seed = 99 }
  return l2l.Sequential(list)
end

local model = gpt2_124m()
local N = model:nparams()
local B, T = 1, 32
local tok = l2l.zeros({ B, T }, { dtype = "i32" })
local tgt = l2l.zeros({ B, T }, { dtype = "i32" })
for t = 1, T do tok:set(1, t, (t * 7919) % 50257); tgt:set(1, t, (t * 104729) % 50257) end

print(("GPT-2 124M-shaped model: %d parameters; EPS host bytes after one update (stats.host_eps_bytes)"):format(N))
print("")
print("| optimizer | masters | state | host bytes | bytes / parameter |")
print("|---|---|---|---:|---:|")
local optimizers = {
  { "AdamW", function(st) return l2l.AdamW { lr = 1e-4, state = st } end, "f32" },
  { "SGD momentum", function(st) return l2l.SGD { lr = 1e-4, momentum = 0.9, state = st } end, "f32" },
  { "AdamW", function(st) return l2l.AdamW { lr = 1e-4, state = st } end, "bf16" },
}
for _, o in ipairs(optimizers) do
  for _, st in ipairs({ "f32", "bf16", "8bit" }) do
    -- (f32 masters with the CPU's f32 precision: no staging copies; bf16 masters are what a
    -- bf16 device reads)
    local run = l2l.Relay { model = model, optimizer = o[2](st), micro_batch = 1, master = o[3] }
    run:step(tok, tgt)
    run:sync()
    local bytes = run:stats().host_eps_bytes
    print(("| %s | %s | %s | %d | %.3f |"):format(o[1], o[3], st, bytes, bytes / N))
    run:free()
    collectgarbage()
  end
end
