-- SPDX-License-Identifier: MIT
-- tensor_spec — tensors from Lua: round trips, printing, views, copies, casts, random
-- fills, pools, freeing, and errors that name the argument.
local support = dofile("spec/support.lua")
local l2l = require("l2l")

local function shape_of(t) return table.concat(t:shape(), ",") end

describe("l2l.tensor", function()
  it("round-trips nested tables of every rank and dtype", function()
    for rank = 1, 4 do
      local shape = {}
      for d = 1, rank do shape[d] = support.int(1, 5) end
      local data = support.random_table(shape)
      local t = l2l.tensor(data)
      assert.are.same(shape, t:shape())
      assert.are.equal(#support.flatten(data), t:numel())
      -- f32 keeps each double rounded to float: within 2^-24 relative
      assert.is_true(support.rel_err(support.flatten(t:totable()), support.flatten(data), 1e-30)
                     <= 2 ^ -24)
      t:free()
    end
    local ids = l2l.tensor({ { 1, -7, 2147483647 }, { 0, 5, -2147483648 } }, { dtype = "i32" })
    assert.are.same({ { 1, -7, 2147483647 }, { 0, 5, -2147483648 } }, ids:totable())
    local bytes = l2l.tensor { 0, 255, 17, dtype = "u8" }
    assert.are.same({ 0, 255, 17 }, bytes:totable())
    assert.are.equal("u8", bytes:dtype())
  end)

  it("stores bf16 and f16 rounded to nearest even", function()
    -- 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1;
    -- 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: gives 1 + 2^-6.
    local b = l2l.tensor({ 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, -(1 + 2 ^ -8) }, { dtype = "bf16" })
    assert.are.same({ 1, 1 + 2 ^ -6, -1 }, b:totable())
    local h = l2l.tensor({ 1 + 2 ^ -11, 65504, 1e6, 2 ^ -24 }, { dtype = "f16" })
    assert.are.same({ 1, 65504, math.huge, 2 ^ -24 }, h:totable())
    local x = l2l.randn({ 50 }, { seed = support.seed })
    local back = x:cast("bf16"):cast("f32")
    for i = 1, 50 do
      local v, r = x:get(i), back:get(i)
      assert.is_true(math.abs(v - r) <= math.abs(v) * 2 ^ -8, ("%g -> %g"):format(v, r))
    end
  end)

  it("prints dtype, shape, pool and a preview of the values", function()
    local t = l2l.tensor { { 1, 2, 3 }, { 4, 5.5, 6 } }
    assert.are.equal("tensor f32 (2,3) host\n[[1, 2, 3],\n [4, 5.5, 6]]", tostring(t))
    local big = l2l.zeros({ 10, 20 }, { pool = "pinned" })
    big:set(10, 20, 7)
    local s = tostring(big)
    assert.is_truthy(s:find("^tensor f32 %(10,20%) pinned\n"), s)
    assert.is_truthy(s:find("0, 0, 0, ..., 0, 0, 7]]", 1, true), s)
    assert.is_truthy(s:find("...,\n", 1, true), "rows are elided too: " .. s)
    t:free()
    assert.are.equal("tensor (freed)", tostring(t))
  end)

  it("reports shape, dims, numel, dtype, pool; gets and sets elements", function()
    local t = l2l.zeros({ 2, 3, 4 }, { dtype = "bf16", pool = "device" })
    assert.are.equal(3, t:ndim())
    assert.are.equal(3, t:dim(2))
    assert.are.equal(24, t:numel())
    assert.are.equal("bf16", t:dtype())
    assert.are.equal("device", t:pool())
    t:set(2, 3, 4, 1.5)
    assert.are.equal(1.5, t:get(2, 3, 4))
    assert.are.equal(0, t:get(1, 1, 1))
    assert.has_error(function() t:get(3, 1, 1) end, "tensor:get: index 1 must be an integer in [1, 2], got 3")
    assert.has_error(function() t:get(1, 1) end, "tensor:get: need 3 indices, got 2")
    assert.has_error(function() t:dim(4) end, "tensor:dim: d must be an integer in [1, 3], got 4")
    assert.has_error(function() t:data() end)
  end)

  it("refuses bad shapes, dtypes, pools and data with Lua errors", function()
    assert.has_error(function() l2l.zeros({ 2, 0 }) end, "l2l.zeros: shape[2] must be an integer >= 1, got 0")
    assert.has_error(function() l2l.zeros({ 1, 2, 3, 4, 5 }) end, "l2l.zeros: shape must have 1 to 4 sizes, got 5")
    assert.has_error(function() l2l.zeros({ 2 }, { dtype = "f64" }) end,
                     "l2l.zeros: dtype must be one of bf16, f16, f32, i32, u8, got 'f64'")
    assert.has_error(function() l2l.zeros({ 2 }, { pool = "gpu" }) end,
                     "l2l.zeros: pool must be one of device, host, pinned, got 'gpu'")
    assert.has_error(function() l2l.tensor { { 1, 2 }, { 3 } } end,
                     "l2l.tensor: ragged table: [2] has 1 entries, expected 2")
    assert.has_error(function() l2l.tensor { 1, "x" } end, "l2l.tensor: element [2] is a string, not a number")
    assert.has_error(function() l2l.tensor({ 1.5 }, { dtype = "i32" }) end, "l2l.tensor: value 1 = 1.5 is not an int32")
    assert.has_error(function() l2l.tensor({ 256 }, { dtype = "u8" }) end,
                     "l2l.tensor: value 1 = 256 is not an integer in [0, 255]")
    assert.has_error(function() l2l.tensor {} end, "l2l.tensor: empty table (every dim needs a size >= 1)")
    assert.has_error(function() l2l.tensor(3) end, "l2l.tensor: data must be a (nested) table of numbers, got number")
    assert.has_error(function() l2l.zeros({ 4 }):reshape({ 5 }) end, "tensor:reshape: cannot reshape 4 elements into 5")
  end)

  it("frees explicitly, twice safely, and refuses use after free", function()
    local before = l2l.pool_stats("host").current
    local t = l2l.zeros { 1000 }
    assert.are.equal(before + 4032, l2l.pool_stats("host").current)
    t:free()
    t:free()
    assert.are.equal(before, l2l.pool_stats("host").current)
    assert.is_true(t:is_freed())
    assert.has_error(function() t:numel() end, "tensor:numel: self was freed")
    assert.has_error(function() l2l.ops.gelu(t, t) end, "l2l.ops.gelu: y was freed")
  end)

  it("is freed by the garbage collector", function()
    collectgarbage()
    local before = l2l.pool_stats("host").current
    do local _ = l2l.zeros { 100000 } end
    assert.is_true(l2l.pool_stats("host").current > before)
    collectgarbage()
    collectgarbage()
    assert.are.equal(before, l2l.pool_stats("host").current)
  end)

  it("views rows without copying; the storage outlives the base", function()
    local rows, cols = support.int(4, 12), support.int(1, 6)
    local t = l2l.randn({ rows, cols }, { seed = support.seed })
    local first, count = support.int(1, rows - 1), 1
    count = support.int(1, rows - first + 1)
    local v = t:view(first, count)
    assert.are.same({ count, cols }, v:shape())
    assert.are.equal((first - 1) * cols, v:offset())
    assert.are.equal(t:get(first, cols), v:get(1, cols))
    v:set(1, 1, 123)
    assert.are.equal(123, t:get(first, 1))
    local data = t:totable()
    t:free()
    collectgarbage()
    assert.are.same(data[first + count - 1], v:totable()[count])
    assert.has_error(function() v:view(count, 2) end)
  end)

  it("copies across pools, clones, casts and fills", function()
    local a = l2l.randn({ 7, 3 }, { seed = support.seed, stream = 2 })
    local d = a:to("device")
    assert.are.equal("device", d:pool())
    assert.are.same(a:totable(), d:totable())
    local c = d:clone()
    c:fill(2)
    assert.are.same(a:totable(), d:totable(), "a clone is independent")
    assert.are.equal(2, c:get(7, 3))
    local ids = l2l.tensor({ 3, 1, 4 }):cast("i32")
    assert.are.equal("i32", ids:dtype())
    assert.are.same({ 3, 1, 4 }, ids:totable())
    assert.has_error(function() l2l.tensor({ 0.5 }):cast("i32") end,
                     "tensor:cast: src:get(1) is not an integer within int32 range")
    assert.has_error(function() l2l.tensor({ { 1, 2 }, { 3, 0 / 0 } }):cast("i32") end,
                     "tensor:cast: src:get(2, 2) is not an integer within int32 range")
    -- positions count from 1 in what Lua says
    assert.has_error(function() a:view(0, 1) end, "tensor:view: first must be a row of dim 1, 1 to 7, got 0")
    assert.has_error(function() a:view(6, 3) end, "tensor:view: count must be 1 to 2 (rows 6 to 7 of dim 1), got 3")
    assert.has_error(function() l2l.zeros({ 1 / 0 }) end, "l2l.zeros: shape[1] must be an integer >= 1, got inf")
    assert.has_error(function() a:copy(ids) end)
    assert.has_error(function() a:fill("x") end, "tensor:fill: value must be a number")
  end)

  it("draws the same random numbers for any split into row views", function()
    local rows, cols = support.int(5, 30), support.int(1, 9)
    local seed, stream = support.int(0, 2 ^ 31), support.int(0, 1000)
    local whole = l2l.randn({ rows, cols }, { seed = seed, stream = stream })
    local parts = l2l.zeros({ rows, cols })
    local r = 1
    while r <= rows do
      local n = support.int(1, rows - r + 1)
      parts:view(r, n):normal(0, 1, { seed = seed, stream = stream })  -- first = view offset
      r = r + n
    end
    assert.are.same(whole:totable(), parts:totable())
    local other = l2l.randn({ rows, cols }, { seed = seed + 1, stream = stream })
    assert.are_not.same(whole:totable(), other:totable())
  end)
end)

describe("pools", function()
  it("report statistics and refuse allocations over budget with the numbers", function()
    local s = l2l.pool_stats("device")
    l2l.set_budget("device", s.current + 4096)
    local ok_t = l2l.zeros({ 1000 }, { pool = "device" })
    local ok, err = pcall(l2l.zeros, { 1000 }, { pool = "device" })
    assert.is_false(ok)
    assert.is_truthy(err:find("l2l.zeros: device pool: cannot allocate 4032 bytes (3.94 KiB): "
                              .. (s.current + 4032) .. " bytes", 1, true), err)
    assert.is_truthy(err:find("budget " .. (s.current + 4096) .. " bytes", 1, true), err)
    assert.are.equal(s.refused + 1, l2l.pool_stats("device").refused)
    ok_t:free()
    l2l.set_budget("device", 0)
    assert.has_error(function() l2l.pool_stats("gpu") end,
                     "l2l.pool_stats: pool must be one of device, host, pinned, got 'gpu'")
    assert.has_error(function() l2l.set_budget("host", -1) end,
                     "l2l.set_budget: bytes must be an integer >= 0, got -1")
  end)

  it("track the peak until reset", function()
    l2l.reset_peak("pinned")
    local base = l2l.pool_stats("pinned")
    assert.are.equal(base.current, base.peak)
    local a = l2l.zeros({ 16 }, { pool = "pinned" })
    local b = l2l.zeros({ 32 }, { pool = "pinned" })
    a:free()
    b:free()
    local s = l2l.pool_stats("pinned")
    assert.are.equal(base.current, s.current)
    assert.are.equal(base.current + 64 + 128, s.peak)
  end)

  it("keep the pinned pool under its cap, falling back to pageable memory with one warning", function()
    -- In a process of its own: the warning comes once per process.
    local script = support.write_temp([[
      local l2l = require("l2l")
      local cap = 1048576 * tonumber(arg[1])
      l2l.set_pinned_cap(cap)
      local ts = {}
      for i = 1, 6 do ts[i] = l2l.full({ 131072 }, i, { pool = "pinned" }) end  -- 512 KiB each
      local s = l2l.pool_stats("pinned")
      local sum = 0
      for i = 1, 6 do sum = sum + l2l.ops.sum(ts[i]) end
      print(("cap %d fallback %d allocs %d reserved %d sum %d"):format(s.cap, s.fallback,
            s.fallback_allocs, s.reserved, sum))
    ]])
    local mib = support.int(1, 2)
    local status, out = support.sh(("%s/l2l %s %d"):format(support.build, script, mib))
    os.remove(script)
    assert.are.equal(0, status, out)
    local cap, fallback, allocs, reserved, sum =
      out:match("cap (%d+) fallback (%d+) allocs (%d+) reserved (%d+) sum (%d+)")
    assert.are.equal(mib * 1048576, tonumber(cap), out)
    assert.is_true(tonumber(fallback) >= (6 - 2 * mib) * 524288, out)
    assert.is_true(tonumber(reserved) - tonumber(fallback) <= tonumber(cap) + 6 * 64, out)
    assert.are.equal(131072 * 21, tonumber(sum), out)
    local _, warnings = out:gsub("warning: the pinned pool is at its cap", "")
    assert.are.equal(1, warnings, out)
    assert.has_error(function() l2l.set_pinned_cap(-1) end,
                     "l2l.set_pinned_cap: bytes must be an integer >= 0, got -1")
  end)

  it("set compute threads", function()
    local n = l2l.threads()
    assert.is_true(n >= 1)
    assert.are.equal(1, l2l.threads(1))
    assert.are.equal(n, l2l.threads(n))
    assert.has_error(function() l2l.threads(0) end, "l2l.threads: threads must be between 1 and 4096, got 0")
  end)
end)

-- The sanitized build keeps freed large host buffers for reuse (src/core/pool.c, "A
-- sanitizer build's large buffers"): a use after free must still be reported, also once
-- tensors of the freed one's size were made again, and a buffer that came back must still
-- be fenced by the sanitizer's red zones.
describe("a sanitized build (make test SANITIZE=1)", function()
  -- Runs Lua code in a child l2l; its exit status and output.
  local function child(code)
    return support.sh(("%s/l2l -e %s"):format(support.build_dir, support.q(code)))
  end

  it("reports a use of a freed large host buffer, and a read past a reused one's end", function()
    if os.getenv("L2L_SANITIZE") ~= "1" then
      return pending("needs the sanitized build's AddressSanitizer (make test SANITIZE=1)")
    end
    -- 160 KB to 1.2 MB (past the sanitizer's 128 KiB), whole 64-byte lines (the pool's
    -- alignment: a tensor's end is then its buffer's)
    local n = 16 * support.int(2500, 18750)
    local at = support.int(0, n - 1)
    local context = ("n = %d, element %d (seed %d)"):format(n, at, support.seed)
    -- freed, then made again at its size: still reported (read by libc's memcpy, which
    -- the sanitizer checks: LuaJIT's own loads it does not see)
    local status, out = child(([[
      local l2l, ffi = require("l2l"), require("ffi")
      ffi.cdef("void *memcpy(void *, const void *, size_t);")
      local t = l2l.empty { %d }
      local p = t:data()
      t:free()
      local again = {}
      for i = 1, 4 do again[i] = l2l.empty { %d }; again[i]:fill(i) end
      local x = ffi.new("float[1]")
      ffi.C.memcpy(x, p + %d, 4)
      print("read", x[0])
    ]]):format(n, n, at))
    assert.are_not.equal(0, status, context .. "\n" .. out)
    assert.is_falsy(out:find("\nread", 1, true), context .. "\n" .. out)
    assert.is_truthy(out:find("ERROR: AddressSanitizer: use%-after%-poison") or
                     out:find("ERROR: AddressSanitizer: heap%-use%-after%-free"), context .. "\n" .. out)
    -- past the end of a buffer after 300 MB of frees of its size (so that one comes back)
    status, out = child(([[
      local l2l, ffi = require("l2l"), require("ffi")
      ffi.cdef("void *memcpy(void *, const void *, size_t);")
      for _ = 1, math.ceil(300e6 / (4 * %d)) do l2l.empty({ %d }):free() end
      local t = l2l.empty { %d }
      local x = ffi.new("float[2]")
      ffi.C.memcpy(x, t:data() + %d, 8)
      print("read", x[0])
    ]]):format(n, n, n, n - 1))
    assert.are_not.equal(0, status, context .. "\n" .. out)
    assert.is_falsy(out:find("\nread", 1, true), context .. "\n" .. out)
    assert.is_truthy(out:find("ERROR: AddressSanitizer: heap%-buffer%-overflow"), context .. "\n" .. out)
  end)
end)
