-- SPDX-License-Identifier: MIT
-- grow_depth.lua — progressive stacking: train a shallow byte-level GPT, then double its
-- depth by cloning the trained blocks and keep training (Gong et al., 2019, "Efficient
-- Training of BERT by Progressively Stacking"). The relay follows the model as it grows:
-- the old layers keep their weights and optimizer state, the copies start with the same
-- weights and a fresh optimizer state.
--
-- The validation loss is printed just before and just after each growth: since the new
-- blocks start from trained weights, the deeper model starts near where the shallow one
-- was, instead of from scratch.
--
-- Run:  build/l2l examples/grow_depth.lua [--steps 300] [--every 100] [--seed 1] [--data FILE_OR_FOLDER]
-- (--help lists the flags; text: the C headers under /usr/include, or --data). Ctrl-C
-- stops after the current step and prints the final line; a second one stops at once.
local l2l = require("l2l")
local text = require("l2l.text")
local cli = require("l2l.cli")

local opt = cli.parse(cli.parser {
  name = "grow_depth", data = true, max_bytes = 400000,
  description = "Progressive stacking: trains a shallow byte-level GPT and doubles its depth every --every " ..
                "steps by cloning its trained blocks.",
  flags = {
    { "--steps", 300, "int", "training steps", min = 1 },
    { "--every", 100, "int", "double the depth every this many steps", min = 1 },
    { "--seed", 1, "int", "seed of the batches", min = 0 },
  },
})

local D, S, B = 64, 64, 16   -- width, sequence length, sequences per step
local corpus = cli.corpus(opt).text
local train, valid = text.split(corpus, 0.1)
local vtok, vtgt = text.batch(valid, 32, S, opt.seed + 1, 0)   -- one fixed validation batch

local function block() return l2l.Block { dim = D, heads = 4, causal = true } end
local model = l2l.Sequential {
  l2l.Embedding { vocab = 256, dim = D, max_seq = S },
  block(), block(),
  l2l.LMHead { vocab = 256, dim = D, tie = true },
}
local run = l2l.Relay { model = model, micro_batch = 8, stash = "host", seed = opt.seed,
                        optimizer = l2l.AdamW { lr = 2e-3, weight_decay = 0.01 },
                        schedule = l2l.ConstantLR { warmup = 20 } }
local nblocks = function() return #model - 2 end   -- all but the embedding and the head

print(("grow_depth: %d bytes of text, dim %d, %d blocks at first, doubled every %d steps"):format(
  #corpus, D, nblocks(), opt.every))
local stop = cli.interrupt()
for step = 1, opt.steps do
  local loss = run:step(text.batch(train, B, S, opt.seed, step))
  local last = step == opt.steps or stop:requested()
  if step == 1 or step % 25 == 0 or last then
    print(("step %4d  depth %2d  train loss %.3f  valid loss %.3f"):format(
      step, nblocks(), loss, run:evaluate(vtok, vtgt)))
  end
  if last then
    if step < opt.steps then print(("stopped at step %d of %d (%s)"):format(step, opt.steps, stop:signal())) end
    break
  end
  if step % opt.every == 0 then
    local before, n = run:evaluate(vtok, vtgt), nblocks()
    -- stack a copy of blocks 1..n on top of them (model layers 2..n+1 go to n+2..2n+1)
    for j = 0, n - 1 do model:clone(2 + j, n + 2 + j) end
    print(("growth at step %d: depth %d -> %d, valid loss %.3f before, %.3f after"):format(
      step, n, nblocks(), before, run:evaluate(vtok, vtgt)))
  end
end
run:sync()
print(("done: depth %d, %d parameters, final valid loss %.3f"):format(
  nblocks(), model:nparams(), run:evaluate(vtok, vtgt)))
stop:finish()   -- after a Ctrl-C (SIGTERM, SIGUSR1): the end it gives a program (Ctrl-C: status 130)
