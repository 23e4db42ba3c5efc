-- SPDX-License-Identifier: MIT
-- ffi_spec — the FFI declarations are the public header's, and every one resolves.
local support = dofile("spec/support.lua")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("FFI declarations", function()
  local header = read("src/l2l.h")

  it("are what gen_cdef makes from src/l2l.h (no drift)", function()
    local tmp = os.tmpname()
    local status, out = support.sh(("luajit scripts/gen_cdef.lua src/l2l.h %s"):format(tmp))
    assert.are.equal(0, status, out)
    local fresh = read(tmp)
    os.remove(tmp)
    assert.are.equal(fresh, read("lua/l2l/cdef.lua"),
                     "lua/l2l/cdef.lua is stale: run make to regenerate it")
  end)

  it("cover every function the header declares", function()
    local block = header:match("L2L_FFI_BEGIN %*/(.-)/%* L2L_FFI_END")
    assert.is_truthy(block, "FFI block markers present")
    local declared, in_block = 0, {}
    for name in block:gmatch("([%w_]+)%s*%(") do
      if name:match("^l2l_") then in_block[name] = true end
    end
    for name in header:gmatch("[%w_%*]+%s+%**(l2l_[%w_]+)%s*%(") do
      declared = declared + 1
      assert.is_true(in_block[name] == true, name .. " is declared outside the FFI block")
    end
    assert.is_true(declared > 40, "found the header's functions (" .. declared .. ")")
  end)

  it("all resolve in the loaded library", function()
    local l2l = require("l2l")
    local block = header:match("L2L_FFI_BEGIN %*/(.-)/%* L2L_FFI_END")
    local count = 0
    for name in block:gmatch("(l2l_[%w_]+)%s*%(") do
      local ok, err = pcall(function() return l2l.C[name] end)
      assert.is_true(ok, name .. " does not resolve: " .. tostring(err))
      count = count + 1
    end
    assert.is_true(count > 40, "checked " .. count .. " functions")
  end)
end)
