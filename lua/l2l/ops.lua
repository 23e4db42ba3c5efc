-- SPDX-License-Identifier: MIT
-- l2l.ops — the backend's ops, callable from Lua with their backward counterparts.
--
-- Purpose: let layers be written in Lua (Torch style, no autograd): each function is a
-- thin checked call of the C op of the same name in include/l2l.h, same argument order
-- (outputs first, then inputs, then parameters), same accumulation contract (parameter
-- gradients +=, activation gradients =). Optional tensors may be nil. Options that C
-- takes as plain numbers come in a trailing table where there are several. An op refuses
-- arguments beyond its own and options it does not know (argcheck.options, argcheck.too_many: no
-- allocation and no loop on a valid call, as these run per micro-batch).
-- Must never: compute anything in Lua, or let a C failure pass silently.
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local tensor = require("l2l.tensor")

local C, check, handle_of, options, too_many = lib.C, lib.check, tensor.handle_of, argcheck.options, argcheck.too_many
local type, tostring, floor, select = type, tostring, math.floor, select

local M = {}

local function T(x, name, fname) return handle_of(x, name, "l2l.ops." .. fname, 3) end

local function opt_T(x, name, fname)
  if x == nil then return nil end
  return handle_of(x, name, "l2l.ops." .. fname, 3)
end

-- A number argument; nil gives `default`, or an error when there is no default. Errors
-- are raised at the level of the op's caller.
local function number(x, default, name, fname, level)
  level = level or 3
  if x == nil then
    if default == nil then error(("l2l.ops.%s: %s is required"):format(fname, name), level) end
    return default
  end
  if type(x) ~= "number" then
    error(("l2l.ops.%s: %s must be a number, got %s"):format(fname, name, type(x)), level)
  end
  return x
end

local function integer(x, default, name, fname, min)
  x = number(x, default, name, fname, 4)
  local problem = argcheck.whole_problem(x, min)
  if problem then error(("l2l.ops.%s: %s %s, got %s"):format(fname, name, problem, tostring(x)), 3) end
  return x
end

local function flag(x, name, fname)
  if x == nil or x == false then return 0 end
  if x == true then return 1 end
  error(("l2l.ops.%s: %s must be a boolean, got %s"):format(fname, name, type(x)), 3)
end

-- A C failure raised at the op's caller: its message starts with the user's line, not this file's.
local function run(status, fname) check(status, "l2l.ops." .. fname, 3) end

----------------------------------------------------------------- GEMM

-- gemm(c, a, b [, {trans_a=, trans_b=, alpha=1, beta=0}]): c = alpha op(a) op(b) + beta c
local GEMM_OPTIONS = { trans_a = true, trans_b = true, alpha = true, beta = true }
local function gemm(fname, cfunc)
  local full = "l2l.ops." .. fname
  return function(c, a, b, opts, ...)
    if select("#", ...) ~= 0 then too_many(full, "c, a, b, options", 2, ...) end
    opts = options(opts, GEMM_OPTIONS, full, 2)
    local hc, ha, hb = T(c, "c", fname), T(a, "a", fname), T(b, "b", fname)
    run(cfunc(hc, ha, hb, flag(opts.trans_a, "trans_a", fname), flag(opts.trans_b, "trans_b", fname),
              number(opts.alpha, 1, "alpha", fname), number(opts.beta, 0, "beta", fname)), fname)
    return c
  end
end
M.gemm = gemm("gemm", C.l2l_gemm)
M.gemm_batched = gemm("gemm_batched", C.l2l_gemm_batched)

----------------------------------------------------------------- element-wise

function M.bias_add(y, bias, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.bias_add", "y, bias", 2, ...) end
  run(C.l2l_bias_add(T(y, "y", "bias_add"), T(bias, "bias", "bias_add")), "bias_add")
  return y
end

function M.bias_backward(dbias, dy, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.bias_backward", "dbias, dy", 2, ...) end
  run(C.l2l_bias_backward(T(dbias, "dbias", "bias_backward"), T(dy, "dy", "bias_backward")),
      "bias_backward")
  return dbias
end

function M.add(out, a, b, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.add", "out, a, b", 2, ...) end
  run(C.l2l_add(T(out, "out", "add"), T(a, "a", "add"), T(b, "b", "add")), "add")
  return out
end

function M.gelu(y, x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.gelu", "y, x", 2, ...) end
  run(C.l2l_gelu_forward(T(y, "y", "gelu"), T(x, "x", "gelu")), "gelu")
  return y
end

function M.gelu_backward(dx, dy, x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.gelu_backward", "dx, dy, x", 2, ...) end
  local f = "gelu_backward"
  run(C.l2l_gelu_backward(T(dx, "dx", f), T(dy, "dy", f), T(x, "x", f)), f)
  return dx
end

----------------------------------------------------------------- LayerNorm

-- layernorm(y, mean, rstd, x, weight, bias [, eps = 1e-5]); mean and rstd may be nil.
function M.layernorm(y, mean, rstd, x, weight, bias, eps, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.layernorm", "y, mean, rstd, x, weight, bias, eps", 2, ...) end
  local f = "layernorm"
  run(C.l2l_layernorm_forward(T(y, "y", f), opt_T(mean, "mean", f), opt_T(rstd, "rstd", f),
                              T(x, "x", f), T(weight, "weight", f), T(bias, "bias", f),
                              number(eps, 1e-5, "eps", f)), f)
  return y
end

-- layernorm_backward(dx, dweight, dbias, dy, x, weight, mean, rstd); dweight/dbias may be nil.
function M.layernorm_backward(dx, dweight, dbias, dy, x, weight, mean, rstd, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.layernorm_backward", "dx, dweight, dbias, dy, x, weight, mean, rstd", 2, ...) end
  local f = "layernorm_backward"
  run(C.l2l_layernorm_backward(T(dx, "dx", f), opt_T(dweight, "dweight", f),
                               opt_T(dbias, "dbias", f), T(dy, "dy", f), T(x, "x", f),
                               T(weight, "weight", f), T(mean, "mean", f), T(rstd, "rstd", f)), f)
  return dx
end

----------------------------------------------------------------- softmax

-- softmax(y, x [, {key_mask=, causal=false, scale=1}])
local SOFTMAX_OPTIONS = { key_mask = true, causal = true, scale = true }
function M.softmax(y, x, opts, ...)
  local f = "softmax"
  if select("#", ...) ~= 0 then too_many("l2l.ops.softmax", "y, x, options", 2, ...) end
  opts = options(opts, SOFTMAX_OPTIONS, "l2l.ops.softmax", 2)
  run(C.l2l_softmax_forward(T(y, "y", f), T(x, "x", f), opt_T(opts.key_mask, "key_mask", f),
                            flag(opts.causal, "causal", f), number(opts.scale, 1, "scale", f)), f)
  return y
end

function M.softmax_backward(dx, dy, y, scale, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.softmax_backward", "dx, dy, y, scale", 2, ...) end
  local f = "softmax_backward"
  run(C.l2l_softmax_backward(T(dx, "dx", f), T(dy, "dy", f), T(y, "y", f),
                             number(scale, 1, "scale", f)), f)
  return dx
end

----------------------------------------------------------------- embedding

function M.embedding(out, ids, table_, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.embedding", "out, ids, table", 2, ...) end
  local f = "embedding"
  run(C.l2l_embedding_forward(T(out, "out", f), T(ids, "ids", f), T(table_, "table", f)), f)
  return out
end

function M.embedding_backward(dtable, dout, ids, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.embedding_backward", "dtable, dout, ids", 2, ...) end
  local f = "embedding_backward"
  run(C.l2l_embedding_backward(T(dtable, "dtable", f), T(dout, "dout", f), T(ids, "ids", f)), f)
  return dtable
end

----------------------------------------------------------------- cross-entropy

local IGNORE_DEFAULT = -1

-- cross_entropy(losses, logits, targets [, ignore_index = -1])
function M.cross_entropy(losses, logits, targets, ignore_index, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.cross_entropy", "losses, logits, targets, ignore_index", 2, ...) end
  local f = "cross_entropy"
  run(C.l2l_cross_entropy_forward(T(losses, "losses", f), T(logits, "logits", f),
                                  T(targets, "targets", f),
                                  integer(ignore_index, IGNORE_DEFAULT, "ignore_index", f,
                                          -2147483648)), f)
  return losses
end

-- cross_entropy_backward(dlogits, logits, targets [, ignore_index = -1 [, scale = 1]])
function M.cross_entropy_backward(dlogits, logits, targets, ignore_index, scale, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.cross_entropy_backward", "dlogits, logits, targets, ignore_index, scale", 2, ...) end
  local f = "cross_entropy_backward"
  run(C.l2l_cross_entropy_backward(T(dlogits, "dlogits", f), T(logits, "logits", f),
                                   T(targets, "targets", f),
                                   integer(ignore_index, IGNORE_DEFAULT, "ignore_index", f,
                                           -2147483648),
                                   number(scale, 1, "scale", f)), f)
  return dlogits
end

----------------------------------------------------------------- dropout

-- dropout(y, mask, x, p [, {seed=0, stream=0, first=x:offset()}])
local DROPOUT_OPTIONS = { seed = true, stream = true, first = true }
function M.dropout(y, mask, x, p, opts, ...)
  local f = "dropout"
  if select("#", ...) ~= 0 then too_many("l2l.ops.dropout", "y, mask, x, p, options", 2, ...) end
  opts = options(opts, DROPOUT_OPTIONS, "l2l.ops.dropout", 2)
  local hx = T(x, "x", f)
  run(C.l2l_dropout_forward(T(y, "y", f), T(mask, "mask", f), hx, number(p, nil, "p", f),
                            integer(opts.seed, 0, "seed", f, 0),
                            integer(opts.stream, 0, "stream", f, 0),
                            integer(opts.first, tonumber(C.l2l_tensor_offset(hx)), "first", f, 0)),
      f)
  return y
end

function M.dropout_backward(dx, dy, mask, p, ...)
  if select("#", ...) ~= 0 then too_many("l2l.ops.dropout_backward", "dx, dy, mask, p", 2, ...) end
  local f = "dropout_backward"
  run(C.l2l_dropout_backward(T(dx, "dx", f), T(dy, "dy", f), T(mask, "mask", f),
                             number(p, nil, "p", f)), f)
  return dx
end

----------------------------------------------------------------- reductions

local reduce_out = ffi.new("double[1]")
local function reduction(fname, cfunc)
  local full = "l2l.ops." .. fname
  return function(x, ...)
    if select("#", ...) ~= 0 then too_many(full, "x", 2, ...) end
    run(cfunc(reduce_out, T(x, "x", fname)), fname)
    return tonumber(reduce_out[0])
  end
end
M.sum = reduction("sum", C.l2l_sum)
M.max_abs = reduction("max_abs", C.l2l_max_abs)
M.norm2 = reduction("norm2", C.l2l_norm2)

----------------------------------------------------------------- AdamW

-- adamw(param, m, v, grad, {lr=, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0}, step)
local ADAMW_OPTIONS = { lr = true, beta1 = true, beta2 = true, eps = true, weight_decay = true }
function M.adamw(param, m, v, grad, config, step, ...)
  local f = "adamw"
  if select("#", ...) ~= 0 then too_many("l2l.ops.adamw", "param, m, v, grad, config, step", 2, ...) end
  config = options(config, ADAMW_OPTIONS, "l2l.ops.adamw", 2, "config")
  local c = ffi.new("l2l_adamw_config", {
    lr = number(config.lr, nil, "lr", f),
    beta1 = number(config.beta1, 0.9, "beta1", f),
    beta2 = number(config.beta2, 0.999, "beta2", f),
    eps = number(config.eps, 1e-8, "eps", f),
    weight_decay = number(config.weight_decay, 0, "weight_decay", f),
  })
  run(C.l2l_adamw_update(T(param, "param", f), T(m, "m", f), T(v, "v", f), T(grad, "grad", f), c,
                         integer(step, nil, "step", f, 1)), f)
  return param
end

return M
