-- SPDX-License-Identifier: MIT
-- gen_cdef.lua — writes lua/l2l/cdef.lua from the FFI block of src/l2l.h.
-- Usage: luajit scripts/gen_cdef.lua src/l2l.h lua/l2l/cdef.lua
-- The header is the single source of truth for the FFI declarations; this copies the
-- block between the L2L_FFI_BEGIN and L2L_FFI_END markers, comments removed.
local header_path, out_path = arg[1], arg[2]
assert(header_path and out_path, "usage: gen_cdef.lua HEADER OUT")

local function ffi_block(text)
  local body = text:match("/%* L2L_FFI_BEGIN %*/(.-)/%* L2L_FFI_END %*/")
  assert(body, "no L2L_FFI_BEGIN ... L2L_FFI_END block in " .. header_path)
  body = body:gsub("/%*.-%*/", "")                 -- block comments
  -- the export mark, a macro ffi.cdef lacks: dropped, its declaration's continuation
  -- lines moved back by its width
  local lines, marked = {}, false
  for line in (body .. "\n"):gmatch("(.-)\n") do
    if line:sub(1, 8) == "L2L_API " then line, marked = line:sub(9), true
    elseif marked then line = line:gsub("^        ", "") end
    if marked and line:gsub("/%*.*", ""):find(";", 1, true) then marked = false end
    lines[#lines + 1] = line
  end
  body = table.concat(lines, "\n")
  body = body:gsub("[ \t]+\n", "\n"):gsub("\n\n+", "\n\n")
  return body:match("^%s*(.-)%s*$") .. "\n"
end

local f = assert(io.open(header_path, "rb"))
local block = ffi_block(f:read("*a"))
f:close()
local out = assert(io.open(out_path, "wb"))
out:write("-- Generated from src/l2l.h by scripts/gen_cdef.lua: do not edit.\n",
          "return [==[\n", block, "]==]\n")
out:close()
