-- SPDX-License-Identifier: MIT
-- l2l.gpt2 — GPT-2 weights as Hugging Face stores them, imported into an l2l model.
--
--   local model = l2l.import_gpt2("model.safetensors" [, {heads =, max_seq =, memory =,
--                                 dropout =}])
--
-- Purpose: let people fine-tune real GPT-2 checkpoints (124M, 355M, ... and their
-- fine-tunes) with l2l. The file's names are those of transformers' GPT2Model, with or
-- without the "transformer." prefix of GPT2LMHeadModel: wte.weight (V,D), wpe.weight
-- (P,D), h.N.ln_1.{weight,bias}, h.N.attn.c_attn.{weight (D,3D), bias}, h.N.attn.c_proj,
-- h.N.ln_2, h.N.mlp.c_fc (D,4D), h.N.mlp.c_proj (4D,D), ln_f. GPT-2's Conv1D stores its
-- weight as (in, out) and computes x W + b, which is l2l's layout, and c_attn's columns
-- are q, k, v one after another with heads contiguous inside each, as l2l's qkv: so every
-- tensor is copied as it is. The model is GPT-2's: pre-LN causal blocks with the tanh
-- GELU, LayerNorm eps 1e-5, learned positions, the LM head tied to wte. The number of
-- heads is not in the weights (it is in config.json): 64-wide heads unless opts.heads.
-- Buffers some files carry (attn.bias, attn.masked_bias) and an lm_head.weight (tied, so
-- a copy of wte) are ignored.
-- Must never: guess silently: a missing tensor, a shape that disagrees with wte's width,
-- or a name it does not know is an error naming it.
local lib = require("l2l.lib")
local safetensors = require("l2l.safetensors")
local layers = require("l2l.layers")
local model_mod = require("l2l.model")

local type, tostring, pairs, ipairs, floor, select = type, tostring, pairs, ipairs, math.floor, select

local M = {}

local BLOCK_NAMES = {   -- GPT-2 name inside h.N -> l2l's block parameter
  ["ln_1.weight"] = "ln1.weight", ["ln_1.bias"] = "ln1.bias",
  ["attn.c_attn.weight"] = "attn.qkv.weight", ["attn.c_attn.bias"] = "attn.qkv.bias",
  ["attn.c_proj.weight"] = "attn.proj.weight", ["attn.c_proj.bias"] = "attn.proj.bias",
  ["ln_2.weight"] = "ln2.weight", ["ln_2.bias"] = "ln2.bias",
  ["mlp.c_fc.weight"] = "mlp.fc.weight", ["mlp.c_fc.bias"] = "mlp.fc.bias",
  ["mlp.c_proj.weight"] = "mlp.proj.weight", ["mlp.c_proj.bias"] = "mlp.proj.bias",
}
local IGNORED = { ["attn.bias"] = true, ["attn.masked_bias"] = true }

local OPTIONS = { heads = true, max_seq = true, memory = true, dropout = true }

local function import(path, opts)
  local fname = "l2l.import_gpt2"
  opts = lib.options(opts, OPTIONS, fname, 0, "opts")
  local ok, file = pcall(safetensors.open, path)
  if not ok then error(fname .. ": " .. tostring(file):gsub("^safetensors%.open: ", ""), 0) end
  local okb, model = pcall(function()
    -- The names, without the prefix; blocks counted from the h.N names.
    local by_name, blocks = {}, 0
    for name in pairs(file.entries) do
      local short = name:gsub("^transformer%.", "")
      local n, rest = short:match("^h%.(%d+)%.(.+)$")
      if n then
        if not BLOCK_NAMES[rest] and not IGNORED[rest] then error(("%s: %s: unknown tensor '%s'"):format(fname, path, name), 0) end
        blocks = math.max(blocks, tonumber(n) + 1)
      elseif short ~= "wte.weight" and short ~= "wpe.weight" and short ~= "ln_f.weight" and short ~= "ln_f.bias"
             and name ~= "lm_head.weight" then
        error(("%s: %s: unknown tensor '%s' (not a GPT-2 file?)"):format(fname, path, name), 0)
      end
      by_name[short] = name
    end
    local function entry(short)
      local name = by_name[short]
      if name == nil then error(("%s: %s has no tensor '%s' (not a GPT-2 file, or truncated)"):format(fname, path, short), 0) end
      return file.entries[name], name
    end
    local wte, wpe = entry("wte.weight"), entry("wpe.weight")
    if #wte.shape ~= 2 or #wpe.shape ~= 2 or wpe.shape[2] ~= wte.shape[2] then
      error(("%s: %s: wte (%s) and wpe (%s) must be (vocab, dim) and (positions, dim)"):format(
        fname, path, table.concat(wte.shape, ","), table.concat(wpe.shape, ",")), 0)
    end
    local V, D, P = wte.shape[1], wte.shape[2], wpe.shape[1]
    local heads = opts.heads or (D % 64 == 0 and D / 64) or nil
    if type(heads) ~= "number" or heads < 1 or heads ~= floor(heads) or D % heads ~= 0 then
      error(("%s: option 'heads' must be an integer dividing dim %d, got %s"):format(fname, D, tostring(opts.heads)), 0)
    end
    local max_seq = opts.max_seq or P
    if type(max_seq) ~= "number" or max_seq < 1 or max_seq ~= floor(max_seq) or max_seq > P then
      error(("%s: option 'max_seq' must be an integer in [1, %d], got %s"):format(fname, P, tostring(opts.max_seq)), 0)
    end
    if blocks == 0 then error(("%s: %s has no blocks (h.0...)"):format(fname, path), 0) end
    local mlp = entry("h.0.mlp.c_fc.weight").shape[2]

    local list = { layers.Embedding{ vocab = V, dim = D, max_seq = max_seq, dropout = opts.dropout or 0 } }
    for b = 1, blocks do
      list[#list + 1] = layers.Block{ dim = D, heads = heads, mlp = mlp, causal = true, dropout = opts.dropout or 0,
                                      memory = opts.memory or "standard" }
    end
    list[#list + 1] = layers.LMHead{ vocab = V, dim = D, tie = true, memory = opts.memory or "standard" }
    local model = model_mod.Sequential(list)

    -- Every target and its source, shapes checked, before anything is read.
    local plan = {}
    local function want(short, param)
      local e, name = entry(short)
      local shape = param.value:shape()
      if table.concat(e.shape, ",") ~= table.concat(shape, ",") then
        error(("%s: %s: '%s' is (%s), expected (%s) for a GPT-2 of dim %d"):format(fname, path, name,
              table.concat(e.shape, ","), table.concat(shape, ","), D), 0)
      end
      plan[#plan + 1] = { name = name, into = param.value }
    end
    local function params_of(layer)
      local t = {}
      for _, p in ipairs(layer:params()) do t[p.name] = p end
      return t
    end
    local emb = params_of(model[1])
    want("wte.weight", emb.wte)
    local e = entry("wpe.weight")
    if e.dtype ~= "f32" then error(("%s: %s: wpe.weight is %s; l2l imports f32 files"):format(fname, path, e.dtype), 0) end
    for b = 1, blocks do
      local p = params_of(model[1 + b])
      for gpt, ours in pairs(BLOCK_NAMES) do want(("h.%d.%s"):format(b - 1, gpt), p[ours]) end
    end
    local head = params_of(model[#model])
    want("ln_f.weight", head["ln.weight"])
    want("ln_f.bias", head["ln.bias"])
    for _, step in ipairs(plan) do
      if file.entries[step.name].dtype ~= "f32" then
        error(("%s: %s: '%s' is %s; l2l imports f32 files"):format(fname, path, step.name, file.entries[step.name].dtype), 0)
      end
    end

    for _, step in ipairs(plan) do file:read(step.name, step.into) end
    local positions = file:read(by_name["wpe.weight"])   -- (P, D): the first max_seq rows
    emb.wpe.value:copy(positions:view(1, max_seq))
    return model
  end)
  file:close()
  if not okb then error(model, 0) end
  return model
end

function M.import(path, opts, ...)
  if select("#", ...) ~= 0 then lib.too_many("l2l.import_gpt2", "path, opts", 2, ...) end
  local ok, model = pcall(import, path, opts)
  if not ok then error(model, 2) end
  return model
end

return M
