-- SPDX-License-Identifier: MIT
-- layerdrop.lua — stochastic depth (Huang et al., 2016) / LayerDrop (Fan et al., 2019):
-- every training step skips a random subset of the blocks, so the step is cheaper and
-- the model learns not to lean on any one block; evaluation uses every block.
--
-- A skipped block acts as the identity for that step and gets no update; the relay
-- neither copies its parameters to the device nor runs it. Deeper blocks are dropped more
-- often: block l of L is skipped with probability p * l / L (Huang et al.'s linear rule).
-- Printed: the training loss (of the thinned model), the full-depth validation loss, and
-- how many blocks the steps skipped on average.
--
-- Run:  build/l2l examples/layerdrop.lua [--steps 300] [--p 0.5] [--seed 1] [--data FILE_OR_FOLDER]
-- (--help lists the flags; text: the C headers under /usr/include, or --data; --seed: the
-- batches and the skips). Ctrl-C stops after the current step; a second one at once.
local l2l = require("l2l")
local text = require("l2l.text")
local cli = require("l2l.cli")

local opt = cli.parse(cli.parser {
  name = "layerdrop", data = true, max_bytes = 400000,
  description = "Stochastic depth (LayerDrop): every training step skips a random subset of the blocks; " ..
                "evaluation uses all of them.",
  flags = {
    { "--steps", 300, "int", "training steps", min = 1 },
    { "--p", 0.5, "number", "block l of L is skipped with probability p * l / L", min = 0, max = 1 },
    { "--seed", 1, "int", "seed of the batches and of the skips", min = 0 },
  },
})
math.randomseed(opt.seed)

local D, S, B, L = 64, 64, 16, 6   -- width, sequence length, sequences per step, blocks
local corpus = cli.corpus(opt).text
local train, valid = text.split(corpus, 0.1)
local vtok, vtgt = text.batch(valid, 32, S, opt.seed + 1, 0)   -- one fixed validation batch

local model = l2l.Sequential { l2l.Embedding { vocab = 256, dim = D, max_seq = S } }
for _ = 1, L do model:add(l2l.Block { dim = D, heads = 4, causal = true }) end
model:add(l2l.LMHead { vocab = 256, dim = D, tie = true })
local run = l2l.Relay { model = model, micro_batch = 8, stash = "host", seed = opt.seed,
                        optimizer = l2l.AdamW { lr = 2e-3, weight_decay = 0.01 },
                        schedule = l2l.ConstantLR { warmup = 20 } }

print(("layerdrop: %d bytes of text, %d blocks of dim %d, block l skipped with probability %.2f * l / %d"):format(
  #corpus, L, D, opt.p, L))
local skipped, steps = 0, 0
local stop = cli.interrupt()
for step = 1, opt.steps do
  local skip = {}
  for l = 1, L do
    if math.random() < opt.p * l / L then skip[#skip + 1] = l + 1 end   -- block l is layer l + 1
  end
  skipped = skipped + #skip
  local tokens, targets = text.batch(train, B, S, opt.seed, step)
  local loss = run:step(tokens, targets, { skip = skip })
  steps = step
  local last = step == opt.steps or stop:requested()
  if step == 1 or step % 25 == 0 or last then
    print(("step %4d  train loss %.3f (%d of %d blocks)  valid loss %.3f (all blocks)"):format(
      step, loss, L - #skip, L, run:evaluate(vtok, vtgt)))
  end
  if last then
    if step < opt.steps then print(("stopped at step %d of %d (%s)"):format(step, opt.steps, stop:signal())) end
    break
  end
end
print(("done: %.2f blocks skipped per step on average, final valid loss %.3f"):format(
  skipped / steps, run:evaluate(vtok, vtgt)))
stop:finish()   -- after a Ctrl-C (SIGTERM, SIGUSR1): the end it gives a program (Ctrl-C: status 130)
