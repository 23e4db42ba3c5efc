-- SPDX-License-Identifier: MIT
-- bert_mlm.lua — a small BERT-style model (bidirectional attention, post-LN blocks)
-- trained by masked-language modelling on bytes (Devlin et al., 2019).
--
-- The vocabulary is the 256 byte values plus [MASK] = 256. In every sequence 15 % of the
-- positions are chosen; a chosen byte is replaced by [MASK] 80 % of the time, by a random
-- byte 10 % of the time, and left as it is 10 % of the time, and the model must predict
-- the original byte there. Every other target is -1, which the loss ignores, so the loss
-- is the mean over the chosen positions only. Printed: that loss, and the accuracy of
-- the most likely byte at the chosen positions of a fixed validation batch.
--
-- Run:  build/l2l examples/bert_mlm.lua [--steps 300] [--seed 1] [--lr 1e-3] [--data FILE_OR_FOLDER]
-- (--help lists the flags; text: the C headers under /usr/include, or --data; --seed: the
-- batches and the masks). Ctrl-C stops after the current step; a second one at once.
local l2l = require("l2l")
local text = require("l2l.text")
local cli = require("l2l.cli")

local opt = cli.parse(cli.parser {
  name = "bert_mlm", data = true, max_bytes = 400000,
  description = "A small BERT-style model (bidirectional, post-LN) trained by masked-language modelling on bytes.",
  flags = {
    { "--steps", 300, "int", "training steps", min = 1 },
    { "--seed", 1, "int", "seed of the batches and of the masks", min = 0 },
    { "--lr", 1e-3, "number", "AdamW's learning rate", min = 0, max = 1 },
  },
})

local D, S, B, V, MASK = 64, 64, 16, 257, 256
local corpus = cli.corpus(opt).text
local train, valid = text.split(corpus, 0.1)

-- (inputs, targets) for a (n,S) batch of bytes: three uniform numbers per position from
-- l2l's counter-based generator keyed by (seed, stream), so a step's masks depend only
-- on them. The bytes' own next-byte targets from text.batch are not used.
local function masked(bytes, seed, stream)
  local n = bytes:numel()
  local inputs, targets = bytes:clone(), l2l.full(bytes:shape(), -1, { dtype = "i32" })
  local u = l2l.rand({ n, 3 }, { seed = seed, stream = stream })
  local x, t, r = inputs:data(), targets:data(), u:data()
  for i = 0, n - 1 do
    if r[3 * i] < 0.15 then   -- chosen: predict the original byte here
      t[i] = x[i]
      local how = r[3 * i + 1]
      if how < 0.8 then x[i] = MASK
      elseif how < 0.9 then x[i] = math.floor(r[3 * i + 2] * 256) end   -- else: unchanged
    end
  end
  return inputs, targets
end

local vinp, vtgt = masked(text.batch(valid, 32, S, opt.seed + 1, 0), opt.seed + 2, 0)

local model = l2l.Sequential { l2l.Embedding { vocab = V, dim = D, max_seq = S } }
for _ = 1, 4 do model:add(l2l.Block { dim = D, heads = 4, causal = false, post_ln = true }) end
model:add(l2l.LMHead { vocab = V, dim = D, tie = true })
local run = l2l.Relay { model = model, micro_batch = 8, stash = "host", seed = opt.seed,
                        optimizer = l2l.AdamW { lr = opt.lr, weight_decay = 0.01 },
                        schedule = l2l.ConstantLR { warmup = 30 } }

-- Accuracy at the chosen positions: the whole model on the host (after run:sync(), the
-- layers hold the updated weights), without targets, gives the logits (n,S,V).
local function accuracy(inputs, targets)
  run:sync()
  local logits = model:forward { tokens = inputs, training = false }
  local z, t = logits:data(), targets:data()
  local right, chosen = 0, 0
  for i = 0, targets:numel() - 1 do
    if t[i] >= 0 then
      local best = 0
      for v = 1, V - 1 do if z[i * V + v] > z[i * V + best] then best = v end end
      chosen = chosen + 1
      if best == t[i] then right = right + 1 end
    end
  end
  logits:free()
  return right / chosen
end

print(("bert_mlm: %d bytes of text, 4 post-LN bidirectional blocks of dim %d, ln(256) = %.3f"):format(
  #corpus, D, math.log(256)))
local stop = cli.interrupt()
for step = 1, opt.steps do
  local inputs, targets = masked(text.batch(train, B, S, opt.seed, step), opt.seed + 2, step)
  local loss = run:step(inputs, targets)
  local last = step == opt.steps or stop:requested()
  if step == 1 or step % 25 == 0 or last then
    print(("step %4d  train masked loss %.3f  valid masked loss %.3f  valid accuracy %.1f%%"):format(
      step, loss, run:evaluate(vinp, vtgt), 100 * accuracy(vinp, vtgt)))
  end
  if last then
    if step < opt.steps then print(("stopped at step %d of %d (%s)"):format(step, opt.steps, stop:signal())) end
    break
  end
end
stop:finish()   -- after a Ctrl-C (SIGTERM, SIGUSR1): the end it gives a program (Ctrl-C: status 130)
