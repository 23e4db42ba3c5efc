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
  -- the export mark, a macro ffi.cdef lacks: dropped, and its declaration's continuation
  -- lines (up to the `;`) moved back by its width, as gen_cdoc.lua shows them
  body = ("\n" .. body):gsub("\nL2L_API ([^;]*;)", function(decl)
    return "\n" .. decl:gsub("\n        ", "\n")
  end)
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
