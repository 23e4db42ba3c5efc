-- SPDX-License-Identifier: MIT
-- exports_spec — libl2l.so's surface is include/l2l.h: the library is built with hidden
-- visibility, and the functions the header marks L2L_API are exactly what the shared
-- library exports (nm's dynamic symbol table read in full), none more (no part's internal
-- function, no kernel launcher, no C++ name), none fewer; and every function the header
-- declares carries the mark.
local support = dofile("spec/support.lua")

-- The function declarations of the header and its parts: name -> marked (a line at the left margin that
-- names l2l_...( and is not a typedef).
local function declared()
  local names = {}
  for _, file in ipairs(assert(dofile("scripts/public_header.lua")("include/l2l.h"))) do
    for line in file.body:gsub("/%*.-%*/", ""):gmatch("[^\n]+") do
      if line:match("^%a") and not line:match("^typedef") then
        local name = line:match("[%s%*](l2l_[%w_]+)%s*%(")
        if name then names[name] = line:match("^L2L_API ") ~= nil end
      end
    end
  end
  return names
end

describe("libl2l.so's exports", function()
  it("are the functions include/l2l.h declares, each marked L2L_API", function()
    local names = declared()
    local count = 0
    for name, marked in pairs(names) do
      count = count + 1
      assert.is_true(marked, name .. " is declared in include/l2l.h without L2L_API")
    end
    assert.is_true(count > 100, ("only %d functions found in include/l2l.h"):format(count))

    local status, out = support.sh("nm -D --defined-only " .. support.build_dir .. "/libl2l.so")
    assert.are.equal(0, status, out)
    local exported, extra = {}, {}
    for kind, name in out:gmatch("%x* (%a) ([^\n]+)") do
      -- the linker's own markers of a shared object's layout are not functions of ours
      if not (name == "_init" or name == "_fini" or name == "_edata" or name == "_end" or
              name == "__bss_start") then
        exported[name] = true
        if not names[name] then extra[#extra + 1] = ("%s (%s)"):format(name, kind) end
      end
    end
    table.sort(extra)
    assert.are.same({}, extra, "exported, not in include/l2l.h: " .. table.concat(extra, ", "))
    local missing = {}
    for name in pairs(names) do
      if not exported[name] then missing[#missing + 1] = name end
    end
    table.sort(missing)
    assert.are.same({}, missing, "in include/l2l.h, not exported: " .. table.concat(missing, ", "))
  end)

  it("leave l2l_ to them: no internal symbol or source name starts with it", function()
    local names = declared()
    local public = {}   -- every l2l_ name the public headers hold (functions, types, fields)
    for _, file in ipairs(assert(dofile("scripts/public_header.lua")("include/l2l.h"))) do
      for name in file.body:gmatch("l2l_[%w_]+") do public[name] = true end
    end
    for name in pairs(names) do public[name] = true end
    local status, out = support.sh("nm --defined-only " .. support.build_dir .. "/libl2l.so")
    assert.are.equal(0, status, out)
    local internal, seen = {}, {}
    for name in out:gmatch("%x* %a ([^\n]+)") do
      local base = name:match("^(l2l_[%w_]+)")   -- a compiler's clone (.cold, ._omp_fn.0) is its function's
      if base and not public[base] and not seen[base] then
        seen[base] = true
        internal[#internal + 1] = base .. " (symbol)"
      end
    end
    local status2, files = support.sh("git ls-files src kernels")
    assert.are.equal(0, status2, files)
    local count = 0
    for path in files:gmatch("[^\n]+") do
      count = count + 1
      local text = assert(io.open(path)):read("*a")
      -- an identifier, not a file name (".l2l_history") or a string ("l2l_xxh3")
      for name in text:gmatch('%f[%w_./"]l2l_[%w_]+') do
        if not public[name] and not seen[name] then
          seen[name] = true
          internal[#internal + 1] = ("%s (%s)"):format(name, path)
        end
      end
    end
    assert.is_true(count > 50, ("only %d source files listed"):format(count))
    table.sort(internal)
    assert.are.same({}, internal, "internal names with the public prefix: " .. table.concat(internal, ", "))
  end)
end)
