-- SPDX-License-Identifier: MIT
-- public_header.lua — the public header's FFI blocks, its parts included.
-- include/l2l.h is the one header a program includes; it declares the first part of the API
-- and includes the rest from its folder l2l/ (#include "l2l/NAME.h"), each part with an
-- FFI block of its own. Whoever reads the API from the header (scripts/gen_cdef.lua,
-- scripts/gen_cdoc.lua, spec/project/exports_spec.lua) reads it through this, so that the parts'
-- order is the header's, written once.
-- Returns function(path) -> list of { path =, text =, body =, first_line = } for path
-- and each part it includes, in order: body is the text between L2L_FFI_BEGIN and
-- L2L_FFI_END, first_line the line of the file it starts on; or nil and a message.
-- Must never: change a file, or leave out a part the header includes.
return function(path)
  local function read(file)
    local f = io.open(file, "rb")
    if not f then return nil end
    local text = f:read("*a")
    f:close()
    return text
  end
  local function block_of(file)
    local text = read(file)
    if not text then return nil, "cannot read " .. file end
    local body = text:match("/%* L2L_FFI_BEGIN %*/(.-)/%* L2L_FFI_END %*/")
    if not body then return nil, "no L2L_FFI_BEGIN ... L2L_FFI_END block in " .. file end
    local before = text:sub(1, text:find("/* L2L_FFI_BEGIN */", 1, true))
    return { path = file, text = text, body = body, first_line = select(2, before:gsub("\n", "")) + 1 }
  end
  local top, err = block_of(path)
  if not top then return nil, err end
  local blocks = { top }
  local folder = path:match("^(.*)/") or "."
  for line in top.text:gmatch("[^\n]+") do
    local part = line:match('^#include "(l2l/[%w_]+%.h)"')
    if part then
      local block, why = block_of(folder .. "/" .. part)
      if not block then return nil, why end
      blocks[#blocks + 1] = block
    end
  end
  return blocks
end
