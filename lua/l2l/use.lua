-- SPDX-License-Identifier: MIT
-- l2l.use — using a trained model from the command line: `l2l sample` and `l2l eval`.
--
--   l2l sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]
--   l2l eval CHECKPOINT --data PATH [--max-bytes N] [--batch B]
--
-- Purpose: a checkpoint (run:save, examples/train_gpt.lua --checkpoint) becomes text or a
-- number with one command. The model is rebuilt from the file's weights alone
-- (l2l.load_model: no optimizer state, no relay for sampling); what it reads (bytes or
-- GPT-2's tokens) is the training run's, from the checkpoint's extra (`tokenizer`). eval
-- reads the text as the training examples do (l2l.text.corpus), cuts it into windows of
-- the model's context, and reports the mean loss per token and its perplexity.
-- Must never: write anything, or change the checkpoint.
local cli = require("l2l.cli")
local argcheck = require("l2l.argcheck")
local text = require("l2l.text")

local M = {}

-- A model whose attention sees the positions after a token (a block with causal = false)
-- scores next-token targets by reading them: its loss and its text mean nothing. Refused.
function M.refuse_non_causal(model, ...)
  if select("#", ...) ~= 0 then argcheck.too_many("use.refuse_non_causal", "model", 2, ...) end
  for i = 1, #model do
    local c = model[i]:config()
    if c.kind == "block" and not c.causal then
      cli.fail(("the model's layer %d (a block) is not causal: its attention sees the tokens it is to predict, "
                .. "so next-token loss and sampling mean nothing for it (a causal language model is needed)")
               :format(i))
    end
  end
end
local refuse_non_causal = M.refuse_non_causal

local function checkpoint_parts(path)
  local l2l = require("l2l")
  local ok, info = pcall(l2l.checkpoint_info, path)
  if not ok then cli.fail((tostring(info):gsub("^l2l%.checkpoint_info: ", ""))) end
  local okm, model = pcall(l2l.load_model, path)
  if not okm then cli.fail((tostring(model):gsub("^l2l%.load_model: ", ""))) end
  local tok
  if info.extra.tokenizer == "gpt2" then
    local okt, t = pcall(l2l.tokenizer.gpt2)
    if not okt then cli.fail("the run read GPT-2's tokens, whose files are not here: " .. tostring(t)) end
    tok = t
  end
  refuse_non_causal(model)
  return model, tok, info
end

function M.sample_main(args, ...)
  if select("#", ...) ~= 0 then argcheck.too_many("use.sample_main", "args", 2, ...) end
  if type(args) ~= "table" then error("use.sample_main: args must be a list of strings, got " .. argcheck.describe(args), 2) end
  local parser = cli.parser {
    name = "l2l sample", usage = "l2l sample",
    description = "Continues a prompt with a trained model: the text a checkpoint's model writes.",
    epilog = "The model reads what its training run read (bytes, or GPT-2's tokens for a run with --tokenizer gpt2).",
    flags = {
      { "--prompt", "", "string", "the text to continue (default: a new line)", meta = "TEXT" },
      { "--tokens", 200, "int", "how many tokens (bytes) to write", min = 1, max = 100000, meta = "N" },
      { "--temperature", 0.8, "number", "sampling temperature (0: always the likeliest)", min = 0, max = 100 },
      { "--top-k", 40, "int", "sample among the k likeliest", min = 1 },
      { "--seed", 0, "int", "the draws' seed (the same seed, the same text)", min = 0 },
    },
  }
  parser:argument("checkpoint", "a checkpoint written by run:save (e.g. examples/train_gpt.lua --checkpoint)"):argname("CHECKPOINT")
  local opt = cli.parse(parser, args)
  local model, tok = checkpoint_parts(opt.checkpoint)
  local vocab = tok and tok.vocab or model[1]:config().vocab
  if opt.prompt == "" then opt.prompt = "\n" end
  local ok, written = pcall(model.generate, model, opt.prompt, opt.tokens, {
    temperature = opt.temperature, top_k = math.min(opt.top_k, vocab), seed = opt.seed, tokenizer = tok })
  if not ok then cli.fail((tostring(written):gsub("^model:generate: ", ""))) end
  io.write(text.printable(opt.prompt .. written), "\n")
  return 0
end

function M.eval_main(args, ...)
  if select("#", ...) ~= 0 then argcheck.too_many("use.eval_main", "args", 2, ...) end
  if type(args) ~= "table" then error("use.eval_main: args must be a list of strings, got " .. argcheck.describe(args), 2) end
  local parser = cli.parser {
    name = "l2l eval", usage = "l2l eval",
    description = "The loss and perplexity of a trained model on a text: each window of the model's context " ..
                  "predicts its next tokens, as in training, without dropout.",
    flags = { { "--data", nil, "list", "a file or folder of held-out text, read recursively (repeat for more)",
                meta = "FILE_OR_FOLDER" },
              { "--max-bytes", 2 ^ 20, "int", "read at most this many bytes of text", min = 1 },
              { "--batch", 8, "int", "windows evaluated together", min = 1, max = 4096 } },
  }
  parser:argument("checkpoint", "a checkpoint written by run:save (e.g. examples/train_gpt.lua --checkpoint)"):argname("CHECKPOINT")
  local opt = cli.parse(parser, args)
  if #opt.data == 0 then cli.usage_error("--data PATH names the text to evaluate on (held-out text, not the training text)") end
  local model, tok, info = checkpoint_parts(opt.checkpoint)
  local l2l = require("l2l")
  local corpus = cli.corpus(opt)
  -- the context the run trained at (extra.seq), at most the model's positions
  local max_seq = model[1]:config().max_seq
  local S = info.extra.seq == nil and max_seq or info.extra.seq
  if not argcheck.whole(S, 1) or (max_seq and S > max_seq) then
    cli.fail(("%s: extra.seq (the run's context) is %s, not a whole number from 1 to the model's %s positions")
             :format(opt.checkpoint, argcheck.describe(info.extra.seq), tostring(max_seq or "(unknown)")))
  end
  local ids = {}
  if tok then ids = tok:encode(corpus.text)
  else for i = 1, #corpus.text do ids[i] = corpus.text:byte(i) end end
  local windows = math.floor((#ids - 1) / S)
  if windows < 1 then
    cli.fail(("%s: %d %s, too short for one window of the model's context (%d)"):format(corpus.description, #ids,
      tok and "tokens" or "bytes", S + 1))
  end
  local run = l2l.Relay { model = model, micro_batch = math.min(opt.batch, 8) }
  local sum, count = 0, 0
  local tokens, targets = l2l.zeros({ opt.batch, S }, { dtype = "i32" }), l2l.zeros({ opt.batch, S }, { dtype = "i32" })
  for first = 0, windows - 1, opt.batch do
    local n = math.min(opt.batch, windows - first)
    local tp, gp = tokens:data(), targets:data()
    for b = 0, opt.batch - 1 do
      for s = 0, S - 1 do
        local at = (first + b) * S + s + 1
        local real = b < n
        tp[b * S + s] = real and ids[at] or 0
        gp[b * S + s] = real and ids[at + 1] or -1   -- rows past the text: no targets
      end
    end
    local ok, loss = pcall(run.evaluate, run, tokens, targets)
    if not ok then run:free(); cli.fail(tostring(loss)) end
    sum, count = sum + loss * n * S, count + n * S
  end
  run:free()
  local loss = sum / count
  print(("eval: %s, %d %s in %d windows of %d: loss %.4f nats per %s, perplexity %.3f%s"):format(
    corpus.description, count, tok and "tokens" or "bytes", windows, S, loss, tok and "token" or "byte",
    math.exp(loss), tok and "" or ("; %.3f bits per byte"):format(loss / math.log(2))))
  return 0
end

return M
