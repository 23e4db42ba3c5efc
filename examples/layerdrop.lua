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
-- Run:  build/l2l examples/layerdrop.lua [--steps 300] [--p 0.5] [--seed 1] [--data FILE]
-- (text: the C headers in /usr/include, or FILE; --seed: the batches and the skips)
local l2l = require("l2l")
local text = require("l2l.text")

local opt = { steps = 300, p = 0.5, seed = 1, data = "" }
for i = 1, #arg, 2 do
  local key, value = (arg[i]:match("^%-%-(%w+)$")), arg[i + 1]
  if opt[key] == nil or value == nil then error("unknown flag or missing value: " .. arg[i], 0) end
  opt[key] = type(opt[key]) == "number" and assert(tonumber(value), "--" .. key .. " takes a number") or value
end
math.randomseed(opt.seed)

local D, S, B, L = 64, 64, 16, 6   -- width, sequence length, sequences per step, blocks
local corpus = text.load(opt.data ~= "" and opt.data or nil)
local train, valid = text.split(corpus, 0.1)
local vtok, vtgt = text.batch(valid, 32, S, opt.seed + 1, 0)   -- one fixed validation batch

local model = l2l.Sequential { l2l.Embedding { vocab = 256, dim = D, max_seq = S } }
for _ = 1, L do model:add(l2l.Block { dim = D, heads = 4, causal = true }) end
model:add(l2l.LMHead { vocab = 256, dim = D, tie = true })
local run = l2l.Relay { model = model, micro_batch = 8, stash = "host", seed = opt.seed,
                        optimizer = l2l.AdamW { lr = 2e-3, weight_decay = 0.01 },
                        schedule = l2l.Constant { warmup = 20 } }

print(("layerdrop: %d bytes of text, %d blocks of dim %d, block l skipped with probability %.2f * l / %d"):format(
  #corpus, L, D, opt.p, L))
local skipped = 0
for step = 1, opt.steps do
  local skip = {}
  for l = 1, L do
    if math.random() < opt.p * l / L then skip[#skip + 1] = l + 1 end   -- block l is layer l + 1
  end
  skipped = skipped + #skip
  local tokens, targets = text.batch(train, B, S, opt.seed, step)
  local loss = run:step(tokens, targets, { skip = skip })
  if step == 1 or step % 25 == 0 or step == opt.steps then
    print(("step %4d  train loss %.3f (%d of %d blocks)  valid loss %.3f (all blocks)"):format(
      step, loss, L - #skip, L, run:evaluate(vtok, vtgt)))
  end
end
print(("done: %.2f blocks skipped per step on average, final valid loss %.3f"):format(
  skipped / opt.steps, run:evaluate(vtok, vtgt)))
