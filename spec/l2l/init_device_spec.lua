-- SPDX-License-Identifier: MIT
-- init_device_spec — the device from Lua: which backend serves the device pool, t:to("cuda"),
-- switching with l2l.device_use, the pool statistics of the caching allocator, and (where
-- a GPU is present) ops on CUDA tensors against the same ops on host tensors.
-- The test runner sets L2L_DEVICE=cpu, so every run starts on the CPU backend.
local support = dofile("spec/support.lua")
local l2l = require("l2l")

local device = l2l.device()
local why_no_gpu = not device.cuda and ("no GPU: " .. tostring(device.why)) or nil

describe("l2l.device", function()
  it("says which backend serves the device pool, and why CUDA cannot run when it cannot", function()
    assert.are.equal("cpu", device.backend)   -- L2L_DEVICE=cpu from the runner
    assert.is_boolean(device.cuda)
    if device.cuda then
      assert.is_truthy(#device.name > 0)
      assert.is_truthy(tonumber(device.capability) >= 8.0, device.capability)
      assert.is_truthy(device.memory > 0 and device.free <= device.memory)
    else
      assert.is_string(device.why)
      assert.is_truthy(#device.why > 0)
    end
  end)

  it("says which cuDNN the attention can use, from where, or why none", function()
    assert.is_string(device.cudnn_about)
    assert.is_truthy(#device.cudnn_about > 0)
    if device.cudnn then
      assert.is_truthy(device.cudnn:match("^9%.%d+%.%d+$"), device.cudnn)
      assert.is_truthy(device.cudnn_about:find("cuDNN " .. device.cudnn .. " from /", 1, true),
                       device.cudnn_about)
    else
      assert.is_false(device.cudnn)
    end
    -- L2L_CUDNN naming a missing file: no cuDNN, and the reason names the file; 0 turns it off
    local probe = support.build_dir .. "/l2l -e " ..
                  support.q('local d = require("l2l").device() print(tostring(d.cudnn) .. "|" .. d.cudnn_about)')
    local missing = support.build_dir .. "/no-such-dir/libcudnn.so.9"
    local status, out = support.sh("L2L_CUDNN=" .. support.q(missing) .. " " .. probe)
    assert.are.equal(0, status, out)
    local built = not (device.cudnn_about:find("has no CUDA", 1, true) or   -- no CUDA build,
                       device.cudnn_about:find("has no cuDNN", 1, true))    -- or no cuDNN one
    if built then
      assert.is_truthy(out:find("false|L2L_CUDNN names a library l2l cannot use: cannot open " ..
                                missing, 1, true), out)
      status, out = support.sh("L2L_CUDNN=0 " .. probe)
      assert.is_truthy(out:find("false|L2L_CUDNN=0 turns cuDNN off", 1, true), out)
    else
      assert.is_truthy(out:find("false|" .. device.cudnn_about, 1, true), out)
    end
  end)

  it("names a machine without NVIDIA's driver as such, not as an old driver", function()
    local ffi = require("ffi")
    local built = not tostring(device.why):find("has no CUDA backend", 1, true)
    local proc = io.open("/proc/driver/nvidia/version")
    if proc then proc:close() end
    local has_lib = pcall(ffi.load, "libcuda.so.1")
    if device.cuda or not built or proc or has_lib then
      pending("this machine has CUDA built and no NVIDIA driver at all only where it says so: not here")
      return
    end
    assert.is_truthy(device.why:find("^no NVIDIA driver on this machine"), device.why)
    assert.is_falsy(device.why:find("driver version", 1, true), device.why)
    local _, out = support.sh(support.build_dir .. "/l2l_ctest cuda_gemm")   -- all skipped: status 1
    assert.is_truthy(out:find("skip cuda_gemm: no GPU: no NVIDIA driver on this machine", 1, true), out)
  end)

  it("refuses t:to('cuda') and l2l.device_use('cuda') with the reason, and bad names", function()
    local t = l2l.randn({ 3, 5 }, { seed = support.seed })
    if device.cuda then
      -- the device pool is on the CPU backend until asked: 'cuda' says how to switch
      local ok, err = pcall(t.to, t, "cuda")
      assert.is_false(ok)
      assert.is_truthy(err:find("l2l.device_use('cuda')", 1, true), err)
    else
      local ok, err = pcall(t.to, t, "cuda")
      assert.is_false(ok)
      assert.is_truthy(err:find("tensor:to: pool 'cuda' cannot be used: " .. device.why, 1, true), err)
      ok, err = pcall(l2l.device_use, "cuda")
      assert.is_false(ok)
      assert.is_truthy(err:find("l2l.device_use: cannot use CUDA: " .. device.why, 1, true), err)
    end
    local ok, err = pcall(l2l.device_use, "tpu")
    assert.is_false(ok)
    assert.is_truthy(err:find('backend must be "cpu" or "cuda", got "tpu"', 1, true), err)
    ok, err = pcall(l2l.device_use, 3)
    assert.is_false(ok)
    assert.is_truthy(err:find("l2l.device_use: backend must be 'cpu' or 'cuda', got 3", 1, true), err)
    ok, err = pcall(l2l.cuda_tf32, 1)
    assert.is_false(ok)
    assert.is_truthy(err:find("l2l.cuda_tf32: on must be true or false, got 1", 1, true), err)
    l2l.cuda_tf32(false)
    l2l.device_use("cpu")   -- already there: fine
    assert.are.equal("cpu", l2l.device().backend)
    t:free()
  end)

  it("can be switched by the very first device call of a process", function()
    local status, out = support.sh(("timeout 20 %s/l2l -e 'require(\"l2l\").device_use(\"cpu\") print(\"switched\")'")
                                   :format(support.build_dir))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("switched", 1, true), out)
  end)

  it("counts the device pool's reserved bytes and system allocations", function()
    local before = l2l.pool_stats("device")
    local t = l2l.zeros({ 1000 }, { pool = "device" })
    local during = l2l.pool_stats("device")
    assert.are.equal(before.current + 4032, during.current)     -- 4000 rounded to 64
    assert.is_truthy(during.reserved >= during.current)
    assert.are.equal(before.system_allocs + 1, during.system_allocs)
    t:free()
    l2l.synchronize()   -- nothing queued on the CPU backend: returns at once
  end)
end)

describe("CUDA tensors from Lua", function()
  local function on_gpu(f)
    return function()
      if why_no_gpu then
        pending(why_no_gpu)
        return
      end
      l2l.device_use("cuda")
      local ok, err = pcall(f)
      collectgarbage()
      collectgarbage()
      l2l.device_use("cpu")
      assert(ok, err)
    end
  end

  it("round-trips values through t:to('cuda') and t:to('host')", on_gpu(function()
    local x = l2l.randn({ 37, 129 }, { seed = support.seed })
    local g = x:to("cuda")
    assert.are.equal("device", g:pool())
    local back = g:to("host")
    assert.are.same(x:totable(), back:totable())
    assert.are.equal(x:get(5, 7), g:get(5, 7))    -- element reads go through a host copy
    g:set(5, 7, 42)
    assert.are.equal(42, g:get(5, 7))
    x:free(); g:free(); back:free()
  end))

  it("runs ops on CUDA tensors to the CPU's results", on_gpu(function()
    l2l.cuda_tf32(false)   -- fp32 GEMMs: TF32's 10-bit products would miss 1e-5
    local a = l2l.randn({ 33, 70 }, { seed = support.seed })
    local b = l2l.randn({ 70, 19 }, { seed = support.seed + 1 })
    local c = l2l.zeros({ 33, 19 })
    l2l.ops.gemm(c, a, b)
    local ga, gb, gc = a:to("cuda"), b:to("cuda"), l2l.zeros({ 33, 19 }, { pool = "cuda" })
    l2l.ops.gemm(gc, ga, gb)
    l2l.ops.gelu(gc, gc)
    l2l.ops.gelu(c, c)
    local want, got = support.flatten(c:totable()), support.flatten(gc:to("host"):totable())
    -- Each element against the outputs' scale (rms; sqrt(70) here): the two backends sum
    -- the 70 products in other orders, an error of about sqrt(70) f32 epsilons of that scale
    -- (5e-7), which an element near 0 cannot be held to relative to itself.
    local sq = 0
    for _, w in ipairs(want) do sq = sq + w * w end
    local err = support.rel_err(got, want, math.sqrt(sq / #want))
    assert.is_true(err <= 1e-5, ("error %.3g of the outputs' rms > 1e-5 (TF32 off)"):format(err))
    -- One tensor of a size made and freed puts its block in the cache (gc still holds the
    -- first block of that size); the same size again is then served from there.
    l2l.empty({ 33, 19 }, { pool = "cuda" }):free()
    local caching = l2l.pool_stats("device")
    for _ = 1, 3 do
      local t = l2l.empty({ 33, 19 }, { pool = "cuda" })
      t:free()
    end
    assert.are.equal(caching.system_allocs, l2l.pool_stats("device").system_allocs)
    for _, t in ipairs({ a, b, c, ga, gb, gc }) do t:free() end
  end))
end)
