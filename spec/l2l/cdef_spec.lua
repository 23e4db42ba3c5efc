-- SPDX-License-Identifier: MIT
-- cdef_spec — the FFI declarations are the public header's, and every one resolves.
local support = dofile("spec/support.lua")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("FFI declarations", function()
  -- include/l2l.h and its parts, each with its FFI block (scripts/public_header.lua)
  local blocks = assert(dofile("scripts/public_header.lua")("include/l2l.h"))

  it("are what gen_cdef makes from include/l2l.h (no drift)", function()
    local tmp = os.tmpname()
    local status, out = support.sh(("luajit scripts/gen_cdef.lua include/l2l.h %s"):format(tmp))
    assert.are.equal(0, status, out)
    local fresh = read(tmp)
    os.remove(tmp)
    assert.are.equal(fresh, read("lua/l2l/cdef.lua"),
                     "lua/l2l/cdef.lua is stale: run make to regenerate it")
  end)

  it("cover every function the header and its parts declare", function()
    assert.is_true(#blocks >= 2, "the header's parts are read too (" .. #blocks .. " files)")
    local declared = 0
    for _, file in ipairs(blocks) do
      local in_block = {}
      for name in file.body:gmatch("([%w_]+)%s*%(") do
        if name:match("^l2l_") then in_block[name] = true end
      end
      for name in file.text:gmatch("[%w_%*]+%s+%**(l2l_[%w_]+)%s*%(") do
        declared = declared + 1
        assert.is_true(in_block[name] == true, name .. " is declared outside the FFI block of " .. file.path)
      end
    end
    assert.is_true(declared > 40, "found the header's functions (" .. declared .. ")")
  end)

  it("all resolve in the loaded library", function()
    local l2l = require("l2l")
    local count = 0
    for _, file in ipairs(blocks) do
      for name in file.body:gmatch("(l2l_[%w_]+)%s*%(") do
        local ok, err = pcall(function() return l2l.C[name] end)
        assert.is_true(ok, name .. " does not resolve: " .. tostring(err))
        count = count + 1
      end
    end
    assert.is_true(count > 40, "checked " .. count .. " functions")
  end)
end)
