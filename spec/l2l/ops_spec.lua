-- SPDX-License-Identifier: MIT
-- ops_spec — every op called from Lua, against float64 references written here on fresh
-- random inputs (small awkward sizes: the C tests cover large ones), outputs poisoned
-- with NaN first; and C errors arriving as Lua errors with the C message.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local ops = l2l.ops

local N = support.normal
local function rand(shape) return l2l.tensor(support.random_table(shape)) end
local function nan(shape) return l2l.full(shape, 0 / 0) end
local function flat(t) return support.flatten(t:totable()) end
-- |got - want| <= tol * (|want| + floor) everywhere. Inputs are O(1), so results that are
-- sums of O(1) terms may cancel to near zero; the floor (default 1) is the size of those
-- terms, and callers whose outputs are scaled down pass a floor of that scale.
local function close(got, want, tol, what, floor)
  local e = support.rel_err(got, want, floor or 1)
  assert.is_true(support.within(e, tol, what, 2),
                 ("%s: relative error %g > %g (seed %d)"):format(what, e, tol, support.seed))
end

local function gelu(x)
  return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end

describe("l2l.ops", function()
  it("gemm and gemm_batched follow the transposes, alpha and beta", function()
    local m, n, k = support.int(1, 9), support.int(1, 9), support.int(1, 9)
    for _, ta in ipairs({ false, true }) do
      for _, tb in ipairs({ false, true }) do
        local a = rand(ta and { k, m } or { m, k })
        local b = rand(tb and { n, k } or { k, n })
        local c0 = rand({ m, n })
        local c = c0:clone()
        local alpha, beta = N(), N()
        ops.gemm(c, a, b, { trans_a = ta, trans_b = tb, alpha = alpha, beta = beta })
        local A, B, C0, want = a:totable(), b:totable(), c0:totable(), {}
        for i = 1, m do
          for j = 1, n do
            local s = 0
            for p = 1, k do
              s = s + (ta and A[p][i] or A[i][p]) * (tb and B[j][p] or B[p][j])
            end
            want[#want + 1] = alpha * s + beta * C0[i][j]
          end
        end
        close(flat(c), want, 1e-5, "gemm")
      end
    end
    local a, b, c = rand({ 3, 2, 4 }), rand({ 3, 4, 5 }), nan({ 3, 2, 5 })
    ops.gemm_batched(c, a, b)
    local A, B, want = a:totable(), b:totable(), {}
    for q = 1, 3 do
      for i = 1, 2 do
        for j = 1, 5 do
          local s = 0
          for p = 1, 4 do s = s + A[q][i][p] * B[q][p][j] end
          want[#want + 1] = s
        end
      end
    end
    close(flat(c), want, 1e-5, "gemm_batched")
  end)

  it("bias_add, bias_backward, add, gelu, gelu_backward", function()
    local r, cdim = support.int(1, 7), support.int(1, 11)
    local y, bias = rand({ r, cdim }), rand({ cdim })
    local Y, Bi = flat(y), flat(bias)
    ops.bias_add(y, bias)
    local want = {}
    for i = 1, #Y do want[i] = Y[i] + Bi[(i - 1) % cdim + 1] end
    close(flat(y), want, 1e-6, "bias_add")
    local db = rand({ cdim })
    local DB = flat(db)
    ops.bias_backward(db, y)
    want = {}
    local YY = flat(y)
    for j = 1, cdim do
      local s = DB[j]
      for i = 0, r - 1 do s = s + YY[i * cdim + j] end
      want[j] = s
    end
    close(flat(db), want, 1e-5, "bias_backward accumulates")
    local a, b, out = rand({ r, cdim }), rand({ r, cdim }), nan({ r, cdim })
    ops.add(out, a, b)
    local A, B = flat(a), flat(b)
    want = {}
    for i = 1, #A do want[i] = A[i] + B[i] end
    close(flat(out), want, 1e-6, "add")
    local x = l2l.tensor(support.random_table({ r, cdim }))
    local X, g = flat(x), nan({ r, cdim })
    ops.gelu(g, x)
    want = {}
    for i = 1, #X do want[i] = gelu(X[i]) end
    close(flat(g), want, 1e-5, "gelu")
    local dy, dx = rand({ r, cdim }), nan({ r, cdim })
    ops.gelu_backward(dx, dy, x)
    local DY = flat(dy)
    want = {}
    for i = 1, #X do
      local h = 1e-5
      want[i] = DY[i] * (gelu(X[i] + h) - gelu(X[i] - h)) / (2 * h)
    end
    close(flat(dx), want, 1e-4, "gelu_backward vs finite differences")
  end)

  it("layernorm and its backward", function()
    local r, cdim = support.int(1, 6), support.int(2, 13)
    local x, w, b = rand({ r, cdim }), rand({ cdim }), rand({ cdim })
    local y, mean, rstd = nan({ r, cdim }), nan({ r }), nan({ r })
    ops.layernorm(y, mean, rstd, x, w, b, 1e-5)
    local X, W, Bv = x:totable(), flat(w), flat(b)
    local want, wmean, wrstd = {}, {}, {}
    for i = 1, r do
      local mu, var = 0, 0
      for j = 1, cdim do mu = mu + X[i][j] / cdim end
      for j = 1, cdim do var = var + (X[i][j] - mu) ^ 2 / cdim end
      local rs = 1 / math.sqrt(var + 1e-5)
      wmean[i], wrstd[i] = mu, rs
      for j = 1, cdim do want[#want + 1] = (X[i][j] - mu) * rs * W[j] + Bv[j] end
    end
    close(flat(y), want, 1e-5, "layernorm")
    close(flat(mean), wmean, 1e-5, "mean")
    close(flat(rstd), wrstd, 1e-5, "rstd")
    -- backward: against finite differences of sum(dy * layernorm(x)) in doubles
    local dy = rand({ r, cdim })
    local dx, dw, db = nan({ r, cdim }), l2l.zeros({ cdim }), l2l.zeros({ cdim })
    ops.layernorm_backward(dx, dw, db, dy, x, w, mean, rstd)
    local DY = dy:totable()
    local function objective(Xp, Wp, Bp)
      local s = 0
      for i = 1, r do
        local mu, var = 0, 0
        for j = 1, cdim do mu = mu + Xp[i][j] / cdim end
        for j = 1, cdim do var = var + (Xp[i][j] - mu) ^ 2 / cdim end
        local rs = 1 / math.sqrt(var + 1e-5)
        for j = 1, cdim do s = s + DY[i][j] * ((Xp[i][j] - mu) * rs * Wp[j] + Bp[j]) end
      end
      return s
    end
    local h, wdx, wdw, wdb = 1e-6, {}, {}, {}
    for i = 1, r do
      for j = 1, cdim do
        local old = X[i][j]
        X[i][j] = old + h; local up = objective(X, W, Bv)
        X[i][j] = old - h; local down = objective(X, W, Bv)
        X[i][j] = old
        wdx[#wdx + 1] = (up - down) / (2 * h)
      end
    end
    for j = 1, cdim do
      local old = W[j]
      W[j] = old + h; local up = objective(X, W, Bv)
      W[j] = old - h; local down = objective(X, W, Bv)
      W[j] = old
      wdw[j] = (up - down) / (2 * h)
      old = Bv[j]
      Bv[j] = old + h; up = objective(X, W, Bv)
      Bv[j] = old - h; down = objective(X, W, Bv)
      Bv[j] = old
      wdb[j] = (up - down) / (2 * h)
    end
    close(flat(dx), wdx, 1e-3, "layernorm dx")
    close(flat(dw), wdw, 1e-3, "layernorm dweight")
    close(flat(db), wdb, 1e-3, "layernorm dbias")
  end)

  it("softmax with causal and padding masks, and its backward", function()
    local B, H, T = support.int(1, 3), support.int(1, 3), support.int(2, 7)
    local x = rand({ B, H, T, T })
    local mask = l2l.ones({ B, T }, { dtype = "u8" })
    mask:set(1, T, 0)                            -- sample 1: last key is padding
    local y = nan({ B, H, T, T })
    local scale = 0.5 + math.random()
    ops.softmax(y, x, { key_mask = mask, causal = true, scale = scale })
    local X, M, want = x:totable(), mask:totable(), {}
    for b = 1, B do
      for hh = 1, H do
        for i = 1, T do
          local row, mx = {}, -math.huge
          for j = 1, T do
            local visible = j <= i and M[b][j] == 1
            row[j] = visible and scale * X[b][hh][i][j] or nil
            if visible and row[j] > mx then mx = row[j] end
          end
          local s = 0
          for j = 1, T do if row[j] then s = s + math.exp(row[j] - mx) end end
          for j = 1, T do want[#want + 1] = row[j] and math.exp(row[j] - mx) / s or 0 end
        end
      end
    end
    close(flat(y), want, 1e-5, "softmax")
    local dy, dx = rand({ B, H, T, T }), nan({ B, H, T, T })
    ops.softmax_backward(dx, dy, y, scale)
    local Y, DY, wdx = flat(y), flat(dy), {}
    for row = 0, B * H * T - 1 do
      local dot = 0
      for j = 1, T do dot = dot + Y[row * T + j] * DY[row * T + j] end
      for j = 1, T do wdx[row * T + j] = scale * Y[row * T + j] * (DY[row * T + j] - dot) end
    end
    close(flat(dx), wdx, 1e-5, "softmax_backward")
  end)

  it("embedding, its scatter-add backward, cross-entropy and its backward", function()
    local V, Cd, n = support.int(2, 9), support.int(1, 5), support.int(3, 12)
    local ids_list = {}
    for i = 1, n do ids_list[i] = support.int(0, V - 1) end
    ids_list[n] = ids_list[1]                     -- a repeated id must sum in backward
    local ids, tab = l2l.tensor(ids_list, { dtype = "i32" }), rand({ V, Cd })
    local out = nan({ n, Cd })
    ops.embedding(out, ids, tab)
    local TB, want = tab:totable(), {}
    for i = 1, n do for j = 1, Cd do want[#want + 1] = TB[ids_list[i] + 1][j] end end
    close(flat(out), want, 0, "embedding")
    local dtab, dout = l2l.zeros({ V, Cd }), rand({ n, Cd })
    ops.embedding_backward(dtab, dout, ids)
    local DO, wd = dout:totable(), {}
    for v = 1, V * Cd do wd[v] = 0 end
    for i = 1, n do
      for j = 1, Cd do
        local k = ids_list[i] * Cd + j
        wd[k] = wd[k] + DO[i][j]
      end
    end
    close(flat(dtab), wd, 1e-6, "embedding_backward")

    local logits = rand({ n, V })
    local targets = l2l.tensor(ids_list, { dtype = "i32" })
    targets:set(2, -1)                            -- ignored
    local losses = nan({ n })
    ops.cross_entropy(losses, logits, targets, -1)
    local L, TG, wl = logits:totable(), targets:totable(), {}
    local scale = 1 / (n - 1)
    local wdl = {}
    for i = 1, n do
      local mx = -math.huge
      for j = 1, V do mx = math.max(mx, L[i][j]) end
      local s = 0
      for j = 1, V do s = s + math.exp(L[i][j] - mx) end
      wl[i] = TG[i] == -1 and 0 or (mx + math.log(s) - L[i][TG[i] + 1])
      for j = 1, V do
        wdl[#wdl + 1] = TG[i] == -1 and 0 or
            scale * (math.exp(L[i][j] - mx) / s - (j == TG[i] + 1 and 1 or 0))
      end
    end
    close(flat(losses), wl, 1e-5, "cross_entropy")
    local dlogits = nan({ n, V })
    ops.cross_entropy_backward(dlogits, logits, targets, -1, scale)
    close(flat(dlogits), wdl, 1e-5, "cross_entropy_backward", scale)
  end)

  it("dropout keeps, scales and remembers elements consistently", function()
    local n, p = support.int(9, 40), 0.3
    local x, y = rand({ n }), nan({ n })
    local mask = l2l.zeros({ math.ceil(n / 8) }, { dtype = "u8" })
    ops.dropout(y, mask, x, p, { seed = support.seed, stream = 7 })
    local X, Y, Mk = flat(x), flat(y), flat(mask)
    local worst, at = 0, 0
    for i = 1, n do
      local bit = math.floor(Mk[math.floor((i - 1) / 8) + 1] / 2 ^ ((i - 1) % 8)) % 2
      local want = bit == 1 and X[i] / (1 - p) or 0
      local e = math.abs(Y[i] - want) / (1 + math.abs(want))
      if not (e <= worst) then worst, at = e, i end
    end
    assert.is_true(support.within(worst, 1e-6, "dropout forward"), "element " .. at)
    local dy, dx = rand({ n }), nan({ n })
    ops.dropout_backward(dx, dy, mask, p)
    local DY, DX = flat(dy), flat(dx)
    worst, at = 0, 0
    for i = 1, n do
      local want = Y[i] == 0 and X[i] ~= 0 and 0 or DY[i] / (1 - p)
      local e = math.abs(DX[i] - want) / (1 + math.abs(want))
      if not (e <= worst) then worst, at = e, i end
    end
    assert.is_true(support.within(worst, 1e-6, "dropout backward"), "grad " .. at)
  end)

  it("reductions and AdamW", function()
    local x = rand({ support.int(1, 50) })
    local X = flat(x)
    local s, m, q = 0, 0, 0
    for _, v in ipairs(X) do s = s + v; m = math.max(m, math.abs(v)); q = q + v * v end
    assert.is_true(support.within(math.abs(ops.sum(x) - s), 1e-6 * (1 + math.abs(s)), "sum"))
    assert.are.equal(m, ops.max_abs(x))
    assert.is_true(support.within(math.abs(ops.norm2(x) - math.sqrt(q)), 1e-6 * math.sqrt(q), "norm2"))
    local n = support.int(1, 20)
    local p, g = rand({ n }), rand({ n })
    local mm, vv = l2l.zeros({ n }), l2l.zeros({ n })
    local P, G = flat(p), flat(g)
    local cfg = { lr = 0.01, beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.1 }
    local M1, V1 = {}, {}
    for i = 1, n do M1[i], V1[i] = 0, 0 end
    for step = 1, 3 do
      ops.adamw(p, mm, vv, g, cfg, step)
      for i = 1, n do
        M1[i] = 0.9 * M1[i] + 0.1 * G[i]
        V1[i] = 0.99 * V1[i] + 0.01 * G[i] ^ 2
        local mh, vh = M1[i] / (1 - 0.9 ^ step), V1[i] / (1 - 0.99 ^ step)
        P[i] = P[i] - 0.01 * (mh / (math.sqrt(vh) + 1e-8) + 0.1 * P[i])
      end
    end
    close(flat(p), P, 1e-5, "adamw")
  end)

  it("raise Lua errors carrying the C message and the argument's name", function()
    local a, b, c = l2l.zeros({ 2, 3 }), l2l.zeros({ 4, 5 }), l2l.zeros({ 2, 5 })
    assert.has_error(function() ops.gemm(c, a, b) end,
                     "l2l.ops.gemm: inner dims differ: op(a) is (2,3) but op(b) is (4,5) (trans_a = 0, trans_b = 0)")
    assert.has_error(function() ops.gemm(c, nil, b) end, "l2l.ops.gemm: a must be a tensor, got nil")
    assert.has_error(function() ops.gemm(c, a, b, { trans_a = 1 }) end,
                     "l2l.ops.gemm: trans_a must be a boolean, got number")
    local d = l2l.zeros({ 2, 3 }, { pool = "device" })
    assert.has_error(function() ops.gelu(d, a) end,
                     "l2l.ops.gelu: y is in pool 'device' but x is in pool 'host': an op's tensors must share one backend (copy them first)")
    local ids = l2l.tensor({ 0, 9 }, { dtype = "i32" })
    local out = l2l.full({ 2, 3 }, 42)
    assert.has_error(function() ops.embedding(out, ids, l2l.zeros({ 5, 3 })) end,
                     "l2l.ops.embedding: ids:get(2) = 9 is outside [0, 5)")
    assert.are.same({ { 42, 42, 42 }, { 42, 42, 42 } }, out:totable(), "nothing written")
    assert.has_error(function() ops.dropout(a, l2l.zeros({ 1 }, { dtype = "u8" }), a) end,
                     "l2l.ops.dropout: p is required")
    assert.has_error(function() ops.adamw(a, a:clone(), a:clone(), a:clone(), { lr = 1 }, 0) end,
                     "l2l.ops.adamw: step must be an integer >= 1, got 0")
    assert.has_error(function() ops.softmax(a, a, { key_mask = ids }) end,
                     "l2l.ops.softmax: key_mask is i32, need u8")
  end)
end)

describe("an op's error", function()
  it("names the line that called the op, not l2l's", function()
    local c, a, b = l2l.zeros({ 2, 3 }), l2l.zeros({ 2, 2 }), l2l.zeros({ 5, 5 })
    local line
    local ok, err = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      l2l.ops.gemm(c, a, b)
    end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("ops_spec.lua:" .. line .. ": l2l.ops.gemm: inner dims differ", 1, true), err)
    ok, err = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      l2l.ops.add(c, a, b)
    end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("ops_spec.lua:" .. line .. ": l2l.ops.add:", 1, true), err)
    c:free(); a:free(); b:free()
  end)
end)
