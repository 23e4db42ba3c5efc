-- SPDX-License-Identifier: MIT
-- l2l.gpt2 — GPT-2 weights as Hugging Face or llm.c store them, imported into an l2l model.
--
--   local model = l2l.import_gpt2("model.safetensors" [, {heads =, max_seq =, memory =,
--                                 dropout =}])        -- or llm.c's "gpt2_124M.bin"
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
-- a copy of wte) are ignored. Tensors may be any float of the format (a half-precision
-- export, say): the C reader (l2l_safetensors_read) widens F16, BF16 and the 8-bit
-- floats exactly into the f32 parameters, and rounds an F64 once.
-- llm.c's model file (gpt2_124M.bin, as its train_gpt2.py writes it) holds the same
-- weights: 256 int32 of header (magic 20240326, version 3 = fp32, max_seq, vocab, layers,
-- heads, dim, the vocab padded), then every tensor in fp32, each kind for all layers in
-- turn (wte padded to the padded vocab, wpe, ln_1 w and b, c_attn w and b, c_proj, ln_2,
-- c_fc, mlp c_proj, ln_f), matrices as PyTorch's Linear keeps them, (out, in). It is read
-- as a file of the names above with the matrices transposed to (in, out), so one importer
-- serves both; its header gives the heads.
-- Must never: guess silently: a missing tensor, a shape that disagrees with wte's width,
-- or a name it does not know is an error naming it.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local filesys = require("l2l.filesys")
local safetensors = require("l2l.safetensors")
local tensor = require("l2l.tensor")
local layers = require("l2l.layers")
local model_mod = require("l2l.model")

local type, tostring, pairs, ipairs, floor, select = type, tostring, pairs, ipairs, math.floor, select

local M = {}

local BLOCK_ORDER = {   -- GPT-2 name inside h.N, l2l's block parameter (checked in this order)
  { "ln_1.weight", "ln1.weight" }, { "ln_1.bias", "ln1.bias" },
  { "attn.c_attn.weight", "attn.qkv.weight" }, { "attn.c_attn.bias", "attn.qkv.bias" },
  { "attn.c_proj.weight", "attn.proj.weight" }, { "attn.c_proj.bias", "attn.proj.bias" },
  { "ln_2.weight", "ln2.weight" }, { "ln_2.bias", "ln2.bias" },
  { "mlp.c_fc.weight", "mlp.fc.weight" }, { "mlp.c_fc.bias", "mlp.fc.bias" },
  { "mlp.c_proj.weight", "mlp.proj.weight" }, { "mlp.c_proj.bias", "mlp.proj.bias" },
}
local BLOCK_NAMES = {}
for _, pair in ipairs(BLOCK_ORDER) do BLOCK_NAMES[pair[1]] = pair[2] end
M.block_names = BLOCK_ORDER   -- (the fuzzer writes GPT-2 files with them)
local IGNORED = { ["attn.bias"] = true, ["attn.masked_bias"] = true }

local OPTIONS = { heads = true, max_seq = true, memory = true, dropout = true }
-- The dtypes a tensor may have: any float of the format (an entry's dtype, what it reads as,
-- is then f32, f16 or bf16): a half-precision export is widened exactly into the model's
-- f32 parameters as it is read, an F64 one rounded once (l2l_safetensors_read converts).
local FLOATS = { f32 = true, f16 = true, bf16 = true }

----------------------------------------------------------------- llm.c's files

local LLMC_MAGIC, LLMC_HEADER = 20240326, 1024
local LlmcFile = {}
LlmcFile.__index = LlmcFile

local function open_llmc(path, fname)
  local f, err = io.open(path, "rb")
  if not f then error(("%s: cannot open %s: %s"):format(fname, path, tostring(err)), 0) end
  local function bad(fmt, ...) f:close(); error(("%s: %s: " .. fmt):format(fname, path, ...), 0) end
  local head = f:read(LLMC_HEADER)
  if head == nil or #head < LLMC_HEADER then bad("too short for llm.c's 1024-byte header") end
  local function i32(k)
    local a, b, c, d = head:byte(4 * k + 1, 4 * k + 4)
    local v = a + b * 256 + c * 65536 + d * 16777216
    return v >= 2 ^ 31 and v - 2 ^ 32 or v
  end
  local version, T, V, L, NH, D, Vp = i32(1), i32(2), i32(3), i32(4), i32(5), i32(6), i32(7)
  if version ~= 3 then
    bad("llm.c file version %d; l2l reads version 3 (fp32 weights, what llm.c's train_gpt2.py writes as gpt2_124M.bin)", version)
  end
  local limits = { { "max_seq", T, 2 ^ 20 }, { "vocab", V, 2 ^ 22 }, { "layers", L, 4096 }, { "heads", NH, 4096 },
                   { "dim", D, 65536 }, { "padded vocab", Vp, 2 ^ 22 } }
  for _, l in ipairs(limits) do
    if l[2] < 1 or l[2] > l[3] then bad("header: %s %d is not plausible (1 to %d)", l[1], l[2], l[3]) end
  end
  if Vp < V or D % NH ~= 0 then bad("header: padded vocab %d below vocab %d, or dim %d not a multiple of heads %d", Vp, V, D, NH) end
  -- llm.c's order: { name (a block's inside h.N), floats per layer, layers, shape as read, stored (out, in) }
  local kinds = {
    { "wte.weight", Vp * D, 1, { V, D } }, { "wpe.weight", T * D, 1, { T, D } },
    { "ln_1.weight", D, L, { D } }, { "ln_1.bias", D, L, { D } },
    { "attn.c_attn.weight", 3 * D * D, L, { D, 3 * D }, true }, { "attn.c_attn.bias", 3 * D, L, { 3 * D } },
    { "attn.c_proj.weight", D * D, L, { D, D }, true }, { "attn.c_proj.bias", D, L, { D } },
    { "ln_2.weight", D, L, { D } }, { "ln_2.bias", D, L, { D } },
    { "mlp.c_fc.weight", 4 * D * D, L, { D, 4 * D }, true }, { "mlp.c_fc.bias", 4 * D, L, { 4 * D } },
    { "mlp.c_proj.weight", 4 * D * D, L, { 4 * D, D }, true }, { "mlp.c_proj.bias", D, L, { D } },
    { "ln_f.weight", D, 1, { D } }, { "ln_f.bias", D, 1, { D } },
  }
  local entries, at = {}, LLMC_HEADER
  for _, k in ipairs(kinds) do
    for layer = 0, k[3] - 1 do
      local global = k[1]:find("^wte") or k[1]:find("^wpe") or k[1]:find("^ln_f")
      local name = global and k[1] or ("h.%d.%s"):format(layer, k[1])
      local numel = 1
      for _, n in ipairs(k[4]) do numel = numel * n end
      entries[name] = { dtype = "f32", shape = k[4], numel = numel, bytes = 4 * numel, offset = at + layer * 4 * k[2],
                        transpose = k[5] and { k[4][2], k[4][1] } or nil }
    end
    at = at + 4 * k[2] * k[3]
  end
  local size = f:seek("end")
  if size ~= at then bad("%d bytes, but its header describes %d (truncated, or not an llm.c model file)", size, at) end
  return setmetatable({ path = path, handle = f, entries = entries, heads = NH }, LlmcFile)
end

-- file:read(name [, into]) as safetensors' (fname "file:read"): an (out, in) matrix comes
-- out (in, out).
function LlmcFile:read(name, into)
  local e = self.entries[name]
  local t = into or tensor.empty(e.shape)
  self.handle:seek("set", e.offset)
  local s = self.handle:read(e.bytes)
  if s == nil or #s ~= e.bytes then error(("file:read: %s: cannot read '%s' (the file changed?)"):format(self.path, name), 0) end
  if e.transpose then
    local rows, cols = e.transpose[1], e.transpose[2]   -- as stored
    local src, dst = ffi.cast("const float *", s), ffi.cast("float *", t:data())
    for r = 0, rows - 1 do
      for c = 0, cols - 1 do dst[c * rows + r] = src[r * cols + c] end
    end
  else
    ffi.copy(t:data(), s, e.bytes)
  end
  lib.plain_nans(t)   -- as safetensors' reader: no NaN payload reaches Lua
  return t
end

function LlmcFile:close() self.handle:close() end

-- llm.c's file or a safetensors file, by the first four bytes (of a regular file: a FIFO
-- would block the read).
local function open_any(path, fname)
  local regular, why = filesys.regular_file(path)
  if not regular then error(("%s: cannot open %s: %s"):format(fname, tostring(path), why), 0) end
  local f = io.open(path, "rb")
  local first = f and f:read(4)
  if f then f:close() end
  if first and #first == 4 then
    local a, b, c, d = first:byte(1, 4)
    if a + b * 256 + c * 65536 + d * 16777216 == LLMC_MAGIC then return open_llmc(path, fname) end
  end
  return safetensors.open_as(fname, path)
end

local function import(path, opts)
  local fname = "l2l.import_gpt2"
  opts = argcheck.options(opts, OPTIONS, fname, 0, "opts")
  local file = open_any(path, fname)
  local okb, model = pcall(function()
    if file.metadata and file.metadata.l2l then
      error(("%s: %s is an l2l checkpoint, not a GPT-2 file: l2l.load (the run) or l2l.load_model (the model) "
             .. "reads it"):format(fname, path), 0)
    end
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
    local heads = opts.heads or file.heads or (D % 64 == 0 and D / 64) or nil
    if type(heads) ~= "number" or heads < 1 or heads ~= floor(heads) or D % heads ~= 0 then
      error(("%s: option 'heads' must be an integer dividing dim %d, got %s"):format(fname, D, tostring(opts.heads)), 0)
    end
    local max_seq = opts.max_seq or P
    if type(max_seq) ~= "number" or max_seq < 1 or max_seq ~= floor(max_seq) or max_seq > P then
      error(("%s: option 'max_seq' must be an integer in [1, %d], got %s"):format(fname, P, tostring(opts.max_seq)), 0)
    end
    if blocks == 0 then error(("%s: %s has no blocks (h.0...)"):format(fname, path), 0) end
    local fc = entry("h.0.mlp.c_fc.weight")
    if #fc.shape ~= 2 then
      error(("%s: %s: h.0.mlp.c_fc.weight must be (dim, mlp), got (%s)"):format(fname, path, table.concat(fc.shape, ",")), 0)
    end
    local mlp = fc.shape[2]
    local dropout, memory = opts.dropout or 0, opts.memory or "standard"
    local emb_options = { vocab = V, dim = D, max_seq = max_seq, dropout = dropout }
    local block_options = { dim = D, heads = heads, mlp = mlp, causal = true, dropout = dropout, memory = memory }
    local head_options = { vocab = V, dim = D, tie = true, memory = memory }

    -- Every tensor the model needs, its shape (as the layers' records will have it) and
    -- its dtype, checked against the file before anything is made: a file that names a
    -- huge wte and one block, or h.99 alone, is refused having allocated nothing.
    local function shapes_of(records)
      local t = {}
      for _, r in ipairs(records) do t[r.name] = r.shape end
      return t
    end
    local emb_shapes = shapes_of(layers.records.embedding(emb_options))
    local block_shapes = shapes_of(layers.records.block(block_options))
    local head_shapes = shapes_of(layers.records.lm_head(head_options))
    local sources = {}   -- { short name, the l2l record it fills ("1.wte": layer 1's wte) }
    local function want(short, layer, record, shape)
      local e, name = entry(short)
      if table.concat(e.shape, ",") ~= table.concat(shape, ",") then
        error(("%s: %s: '%s' is (%s), expected (%s) for a GPT-2 of dim %d"):format(fname, path, name,
              table.concat(e.shape, ","), table.concat(shape, ","), D), 0)
      end
      if not FLOATS[e.dtype] then
        error(("%s: %s: '%s' is %s; l2l imports float tensors (F32, F16, BF16, F64, F8_*)"):format(
          fname, path, name, e.stored_dtype), 0)
      end
      sources[#sources + 1] = { name = name, layer = layer, record = record }
    end
    want("wte.weight", 1, "wte", emb_shapes.wte)
    want("wpe.weight", nil, nil, { P, D })   -- copied in part: its first max_seq rows
    for b = 1, blocks do
      for _, pair in ipairs(BLOCK_ORDER) do
        want(("h.%d.%s"):format(b - 1, pair[1]), 1 + b, pair[2], block_shapes[pair[2]])
      end
    end
    want("ln_f.weight", blocks + 2, "ln.weight", head_shapes["ln.weight"])
    want("ln_f.bias", blocks + 2, "ln.bias", head_shapes["ln.bias"])

    local list = { layers.Embedding(emb_options) }
    for b = 1, blocks do list[#list + 1] = layers.Block(block_options) end
    list[#list + 1] = layers.LMHead(head_options)
    local model = model_mod.Sequential(list)
    local params = {}
    for i, layer in ipairs(model) do
      params[i] = {}
      for _, p in ipairs(layer:params()) do params[i][p.name] = p end
    end
    local emb = params[1]
    -- each tensor read, then written into its record without handing the value out (a
    -- relay's EPS then writes the record's 16-bit staging copy as it updates)
    local function read_into(p, name, rows)
      local t = file:read(name)
      local ok, err = pcall(p.write, p, rows and t:view(1, rows) or t)
      t:free()
      if not ok then error(err, 0) end
    end
    for _, s in ipairs(sources) do
      if s.layer then read_into(params[s.layer][s.record], s.name) end
    end
    read_into(emb.wpe, by_name["wpe.weight"], max_seq)   -- (P, D): its first max_seq rows
    return model
  end)
  file:close()
  if not okb then
    error(model, 0)   -- a read's own words (a damaged tensor, a short file) are under fname already
  end
  return model
end

function M.import(path, opts, ...)
  if select("#", ...) ~= 0 then argcheck.too_many("l2l.import_gpt2", "path, opts", 2, ...) end
  local ok, model = pcall(import, path, opts)
  if not ok then error(model, 2) end
  return model
end

return M
