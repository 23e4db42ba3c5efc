-- SPDX-License-Identifier: MIT
-- scripts/fuzz/bases.lua — the loader fuzzer's bases (scripts/fuzz_load.lua loads it): the
-- small valid inputs every case damages (checkpoints of four models, a GPT-2 file, a
-- tokenizer's files, planner options), the models they are made of, and a minibatch that
-- fits any model a case loads.
--
-- Purpose: one description of the bases for the parent, which writes them, and the child,
-- which rebuilds a base's model (load_weights) and steps what it loaded. Fixed seeds: the
-- same shapes and initial weights every time, so case K of seed S is the same file in
-- every run.
-- Must never: draw randomness, or write anything but the base file it is asked for.
local l2l = ...

local M = {}

local V, SEQ, D = 13, 9, 16
local BASES = {
  { what = "1 block, tied LM head, AdamW, 2 updates", blocks = 1, tie = true, optimizer = "adamw", steps = 2 },
  { what = "2 blocks (one frugal, dropout), AdamW with 8-bit state (u8 codes and scales), saved "
           .. "mid-accumulation (.grad tensors)",
    blocks = 2, dropout = 0.1, optimizer = "adamw", state = "8bit", accumulate = 2, steps = 3, policies = true },
  { what = "1 block, tied, LAMB, dynamic loss scaling, layer 2 frozen, bf16 masters", blocks = 1, tie = true,
    optimizer = "lamb", loss_scale = 1024, steps = 2, freeze = 2, master = "bf16" },
  { what = "token types, post-LN block without biases, classifier head, SGD with momentum in bf16",
    blocks = 1, classifier = true, type_vocab = 2, post_ln = true, bias = false, optimizer = "sgd",
    state = "bf16", steps = 2 },
  { what = "a GPT-2 file (Hugging Face's names, no l2l metadata) of 2 blocks", kind = "gpt2", blocks = 2, tie = true },
  { what = "a tokenizer's encoder.json and vocab.bpe", kind = "tokenizer" },
  { what = "options of l2l.plan", kind = "plan" },
}
local GPT2_HEADS = 2   -- (dim 16 is not a multiple of GPT-2's 64-wide heads)

-- The base's model, with fixed seeds: the same shapes (and initial weights) every time.
local function make_model(cfg)
  local list = { l2l.Embedding{ vocab = V, dim = D, max_seq = SEQ, type_vocab = cfg.type_vocab,
                                dropout = cfg.dropout, seed = 11 } }
  for b = 1, cfg.blocks do
    list[#list + 1] = l2l.Block{ dim = D, heads = 2, mlp = 24, causal = not cfg.classifier,
                                 post_ln = cfg.post_ln, bias = cfg.bias, dropout = cfg.dropout,
                                 memory = b == 2 and "frugal" or "standard", seed = 20 + b }
  end
  list[#list + 1] = cfg.classifier and l2l.Classifier{ dim = D, classes = 3, seed = 30 }
                    or l2l.LMHead{ vocab = V, dim = D, tie = cfg.tie, seed = 30 }
  return l2l.Sequential(list)
end

-- A minibatch of B rows that fits whatever model it is given (its first layer's vocabulary,
-- positions and token types; its head's kind): (tokens, targets, opts).
local function batch_for(model, B, step)
  local c1 = model[1]:config()
  local vocab = (c1.vocab or 0) > 0 and c1.vocab or 2
  local S = math.max(1, math.min((c1.max_seq or 0) > 0 and c1.max_seq or 4, 6))
  local tok = l2l.zeros({ B, S }, { dtype = "i32" })
  for b = 1, B do
    for s = 1, S do tok:set(b, s, (b * 5 + s * (step + 2)) % vocab) end
  end
  local last, tgt = model[#model], nil
  if last.kind == "classifier" then
    local classes = last:config().classes
    tgt = l2l.zeros({ B }, { dtype = "i32" })
    for b = 1, B do tgt:set(b, (b + step) % classes) end
  else
    tgt = l2l.zeros({ B, S }, { dtype = "i32" })
    for b = 1, B do
      -- the next token; the last position has none (-1), except in a model of one
      -- position, where a step needs a target somewhere (any token will do)
      for s = 1, S do tgt:set(b, s, s < S and tok:get(b, s + 1) or S == 1 and (b + step) % vocab or -1) end
    end
  end
  local opts
  if (c1.type_vocab or 0) > 0 then
    local types = l2l.zeros({ B, S }, { dtype = "i32" })
    for b = 1, B do
      for s = 1, S do types:set(b, s, s % c1.type_vocab) end
    end
    opts = { token_types = types }
  end
  return tok, tgt, opts
end

-- GPT-2's names of l2l's block records (the importer's map, the other way).
local GPT2_NAMES = {}
for _, pair in ipairs(require("l2l.gpt2").block_names) do GPT2_NAMES[pair[2]] = pair[1] end

-- The GPT-2 base: the model's weights under transformers' names, without metadata.
local function make_gpt2_base(cfg, path)
  local model = make_model(cfg)
  local entries = {}
  for i, layer in ipairs(model) do
    for _, p in ipairs(layer:params()) do
      local name
      if layer.kind == "embedding" then name = p.name .. ".weight"
      elseif layer.kind == "block" then name = ("h.%d.%s"):format(i - 2, GPT2_NAMES[p.name])
      elseif p.name:match("^ln%.") then name = "ln_f." .. p.name:match("^ln%.(.*)$") end
      if name then entries[#entries + 1] = { name = name, tensor = p.value } end
    end
  end
  l2l.safetensors.write(path, entries)
end

local function make_base(cfg, path)
  if cfg.kind == "gpt2" then return make_gpt2_base(cfg, path) end
  local model = make_model(cfg)
  if cfg.freeze then model:freeze(cfg.freeze) end
  local optimizer = cfg.optimizer == "adamw" and l2l.AdamW{ lr = 0.01, weight_decay = 0.1, state = cfg.state }
                    or cfg.optimizer == "lamb" and l2l.LAMB{ lr = 0.01, state = cfg.state }
                    or l2l.SGD{ lr = 0.05, momentum = 0.9, nesterov = true, state = cfg.state }
  local run = l2l.Relay{ model = model, micro_batch = 2, optimizer = optimizer,
                         schedule = l2l.CosineLR{ warmup = 1, total = 20, final_ratio = 0.1 },
                         accumulate = cfg.accumulate, loss_scale = cfg.loss_scale,
                         loss_scale_window = 3, seed = 5, clip_global_norm = 1, master = cfg.master }
  if cfg.policies then
    run:set_stash(3, "recompute")
    run:set_inner(2, "keep")
  end
  for step = 1, cfg.steps do run:step(batch_for(model, 4, step)) end
  run:save(path, { base = cfg.what })
  run:free()
end

M.BASES, M.V, M.GPT2_HEADS = BASES, V, GPT2_HEADS
M.make_model, M.batch_for, M.make_base = make_model, batch_for, make_base
return M
