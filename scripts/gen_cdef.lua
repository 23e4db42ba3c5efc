-- SPDX-License-Identifier: MIT
-- gen_cdef.lua — writes lua/l2l/cdef.lua from the FFI blocks of include/l2l.h and its parts.
-- Usage: luajit scripts/gen_cdef.lua include/l2l.h lua/l2l/cdef.lua
-- The header is the single source of truth for the FFI declarations; this copies the
-- blocks between the L2L_FFI_BEGIN and L2L_FFI_END markers (the header's, then each
-- part's in the order it includes them: scripts/public_header.lua), comments removed.
local header_path, out_path = arg[1], arg[2]
assert(header_path and out_path, "usage: gen_cdef.lua HEADER OUT")
local public_header = dofile((arg[0]:match("^(.*)/") or ".") .. "/public_header.lua")

local function ffi_block(body)
  body = body:gsub("/%*.-%*/", "")                 -- block comments
  -- the export mark, a macro ffi.cdef lacks: dropped, and its declaration's continuation
  -- lines (up to the `;`) moved back by its width, as gen_cdoc.lua shows them
  body = ("\n" .. body):gsub("\nL2L_API ([^;]*;)", function(decl)
    return "\n" .. decl:gsub("\n        ", "\n")
  end)
  -- a deprecated name's mark (a compiler attribute after the parameters): dropped
  body = body:gsub("%s*L2L_DEPRECATED%b()", "")
  body = body:gsub("[ \t]+\n", "\n"):gsub("\n\n+", "\n\n")
  return body:match("^%s*(.-)%s*$") .. "\n"
end

local blocks = assert(public_header(header_path))
local out_blocks = {}
for i, block in ipairs(blocks) do out_blocks[i] = ffi_block(block.body) end
local out = assert(io.open(out_path, "wb"))
out:write("-- Generated from include/l2l.h and its parts by scripts/gen_cdef.lua: do not edit.\n",
          "return [==[\n", table.concat(out_blocks, "\n"), "]==]\n")
out:close()
