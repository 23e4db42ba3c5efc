-- SPDX-License-Identifier: MIT
-- tour.lua — a tour of l2l's tensors and ops from Lua, ending in a small model trained
-- with hand-written backward passes (no autograd: every op has its backward counterpart
-- in l2l.ops). It was the first `make demo`; the demo is now examples/train_gpt.lua (the
-- relay training a GPT), and this stays as the lowest-level example: no layers, no relay.
--
-- The model predicts the next byte of real text (the C headers under /usr/include, else
-- l2l's own sources, from any folder; or --data FILE_OR_FOLDER):
--   e = Embed[byte] -> n = LayerNorm(e) -> h = GELU(n W1 + b1) -> logits = h W2 + b2
-- trained with AdamW on the mean cross-entropy.
-- Run: build/l2l examples/tour.lua [--steps 300] [--data FILE_OR_FOLDER] (--help lists the
-- flags). Ctrl-C stops after the current step; a second one at once.
local l2l = require("l2l")
local cli = require("l2l.cli")
local ops = l2l.ops

local opt = cli.parse(cli.parser {
  name = "tour", data = true, max_bytes = 200000,
  description = "A tour of l2l's tensors and ops, ending in a small byte-level model trained with " ..
                "hand-written backward passes.",
  flags = { { "--steps", 300, "int", "training steps of the small model", min = 1 } },
})
local steps = opt.steps
local corpus = cli.corpus(opt)
local text = corpus.text

print(("l2l %s, %d compute threads, library %s"):format(l2l.version, l2l.threads(), l2l.library))
print(("text: %s, %d bytes"):format(corpus.description, #text))
print()

-- ------------------------------------------------------------ tensors in two minutes
local a = l2l.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
print(a)
local b = l2l.randn({ 3, 2 }, { seed = 1 })
local c = l2l.zeros { 2, 2 }
ops.gemm(c, a, b)                                 -- c = a @ b (cblas_sgemm underneath)
print("a @ randn(3,2) =", c)
print("rows 2..2 of a, a view without a copy:", a:view(2, 1))
print("a in bf16, rounded to nearest even:", l2l.tensor({ 1.00390625, 3.14159 }):cast("bf16"))
print()

-- ------------------------------------------------------------ a byte-level model
local V, D, H = 256, 64, 256                      -- vocabulary, embedding, hidden width
local B = 512                                     -- positions per step
local seed = 7

local function param(shape, std, stream)
  if std == 0 then return l2l.zeros(shape) end
  return l2l.randn(shape, { seed = seed, stream = stream, std = std })
end
local P = {                                       -- parameters, then their gradients
  embed = param({ V, D }, 0.5, 1), gamma = l2l.ones { D }, beta = l2l.zeros { D },
  w1 = param({ D, H }, 1 / math.sqrt(D), 2), b1 = param({ H }, 0, 0),
  w2 = param({ H, V }, 1 / math.sqrt(H), 3), b2 = param({ V }, 0, 0),
}
local G, M, Vs = {}, {}, {}                       -- gradients, AdamW moments
for name, t in pairs(P) do
  G[name], M[name], Vs[name] = l2l.zeros(t:shape()), l2l.zeros(t:shape()), l2l.zeros(t:shape())
end

-- activations for one step (B positions)
local ids, targets = l2l.zeros({ B }, { dtype = "i32" }), l2l.zeros({ B }, { dtype = "i32" })
local e, n, mean, rstd = l2l.empty { B, D }, l2l.empty { B, D }, l2l.empty { B }, l2l.empty { B }
local pre, h, logits, losses = l2l.empty { B, H }, l2l.empty { B, H }, l2l.empty { B, V }, l2l.empty { B }
local dlogits, dh, dpre, dn, de = l2l.empty { B, V }, l2l.empty { B, H }, l2l.empty { B, H },
                                   l2l.empty { B, D }, l2l.empty { B, D }

local ids_p, targets_p = ids:data(), targets:data()
local function sample_batch(step)
  for i = 0, B - 1 do                             -- deterministic positions from the step
    local pos = (step * 7919 + i * 104729) % (#text - 1)
    ids_p[i], targets_p[i] = text:byte(pos + 1), text:byte(pos + 2)
  end
end

local adamw = { lr = 3e-3, weight_decay = 0.01 }
local t0 = os.clock()
local stop = cli.interrupt()
local done = 0
for step = 1, steps do
  sample_batch(step)
  -- forward
  ops.embedding(e, ids, P.embed)
  ops.layernorm(n, mean, rstd, e, P.gamma, P.beta)
  ops.gemm(pre, n, P.w1); ops.bias_add(pre, P.b1)
  ops.gelu(h, pre)
  ops.gemm(logits, h, P.w2); ops.bias_add(logits, P.b2)
  ops.cross_entropy(losses, logits, targets)
  local loss = ops.sum(losses) / B
  -- backward (parameter gradients accumulate, so they start from zero)
  for _, g in pairs(G) do g:fill(0) end
  ops.cross_entropy_backward(dlogits, logits, targets, -1, 1 / B)
  ops.gemm(G.w2, h, dlogits, { trans_a = true }); ops.bias_backward(G.b2, dlogits)
  ops.gemm(dh, dlogits, P.w2, { trans_b = true })
  ops.gelu_backward(dpre, dh, pre)
  ops.gemm(G.w1, n, dpre, { trans_a = true }); ops.bias_backward(G.b1, dpre)
  ops.gemm(dn, dpre, P.w1, { trans_b = true })
  ops.layernorm_backward(de, G.gamma, G.beta, dn, e, P.gamma, mean, rstd)
  ops.embedding_backward(G.embed, de, ids)
  for name, p in pairs(P) do ops.adamw(p, M[name], Vs[name], G[name], adamw, step) end
  done = step
  local last = step == steps or stop:requested()
  if step == 1 or step % 50 == 0 or last then
    print(("step %4d  loss %.3f  (uniform guess: %.3f)  grad norm %.3f"):format(
      step, loss, math.log(V), ops.norm2(G.w2)))
  end
  if last then break end
end
local elapsed = os.clock() - t0

local host = l2l.pool_stats("host")
print(("\n%d steps in %.2f s of CPU time; host pool: %.1f KiB in use, peak %.1f KiB%s"):format(
  done, elapsed, host.current / 1024, host.peak / 1024, done < steps and (" (stopped by %s)"):format(stop:signal()) or ""))
stop:finish()   -- after a Ctrl-C (SIGTERM, SIGUSR1): the end it gives a program (Ctrl-C: status 130)
