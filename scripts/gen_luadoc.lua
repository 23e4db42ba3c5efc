-- SPDX-License-Identifier: MIT
-- gen_luadoc.lua — copies l2l's Lua modules with their comments marked for LDoc.
-- Usage: luajit scripts/gen_luadoc.lua lua/l2l build/doc/lua-src/l2l   (run by `make doc`,
-- which then runs ldoc on the copies with docs/config.ld)
-- The modules keep the house style's plain `--` comments; LDoc reads only comments that
-- begin with `---`. In each copy:
--   * the comment block at the top of the file (its purpose) becomes the module's
--     description, with `@module l2l.<name>` (init.lua is `l2l`);
--   * the comment block right above a top-level `function T.name(...)` or
--     `function T:name(...)` (T: the module's table or one of its classes) becomes that
--     function's description; a function without one gets a line saying so, so that the
--     reference lists every public function;
--   * a trailing `...` that the function takes only to refuse extra arguments (its first
--     line calls argcheck.too_many) is left out of its signature;
--   * functions declared `local` are private and stay out;
--   * a section rule (`------------- the kinds`) starts a section of the module's page.
-- Comment lines that would read as LDoc tags (a word after `@` at their start) are
-- left as they are, with the `@` spaced off. lua/l2l/cdef.lua (the C declarations) is
-- covered by the C reference and skipped.
-- Must never: write into the source folder.
local src_dir, out_dir = arg[1], arg[2]
if not src_dir or not out_dir then
  io.stderr:write("usage: luajit scripts/gen_luadoc.lua SRC_DIR OUT_DIR\n")
  os.exit(2)
end

local SKIP = { ["cdef.lua"] = true }

local function list_lua(dir)
  local p = assert(io.popen("ls -1 '" .. dir .. "'"))
  local names = {}
  for name in p:lines() do
    if name:match("%.lua$") and not SKIP[name] then names[#names + 1] = name end
  end
  p:close()
  table.sort(names)
  return names
end

local function read_lines(path)
  local lines = {}
  for line in assert(io.open(path, "rb")):lines() do lines[#lines + 1] = line end
  return lines
end

local function untag(line) return (line:gsub("^(%s*%-%-+%s*)@(%a)", "%1@ %2")) end

local function convert(lines, module)
  local out = {}
  for i, line in ipairs(lines) do out[i] = line end
  -- the module's comment: the first block of `--` lines (after a #! line)
  local first = (out[1] or ""):match("^#!") and 2 or 1
  local last = first - 1
  while out[last + 1] and out[last + 1]:match("^%-%-") do last = last + 1 end
  local module_line
  if last >= first then
    for i = first, last do out[i] = untag(out[i]) end
    out[first] = out[first]:gsub("^%-%-%-*", "---", 1)
    out[last] = out[last] .. "\n-- @module " .. module
  else
    module_line = "--- The module " .. module .. ".\n-- @module " .. module
  end
  -- section rules ("------------- the kinds") start sections of the module's page
  for i = last + 1, #out do
    local title = out[i]:match("^%-%-%-%-+%s+(%S.-)%s*$")
    if title then out[i] = ("--- %s\n-- @section %s"):format(title, (title:gsub("%W+", "_"))) end
  end
  -- public functions
  local documented, bare = 0, 0
  for i = last + 1, #out do
    if out[i]:match("^function [%w_]+[%.:][%w_]+%s*%(") then
      -- a trailing `...` that the body only refuses (argcheck.too_many) is no argument
      if (lines[i + 1] or ""):match('select%("#", %.%.%.%) ~= 0') and lines[i + 1]:match("too_many") then
        out[i] = out[i]:gsub(",%s*%.%.%.%)", ")", 1):gsub("%(%s*%.%.%.%)", "()", 1)
      end
      local top = i
      while top > last + 1 and out[top - 1]:match("^%-%-") do top = top - 1 end
      if top < i then
        for j = top, i - 1 do out[j] = untag(out[j]) end
        out[top] = out[top]:gsub("^%-%-%-*", "---", 1)
        documented = documented + 1
      else
        out[i] = "--- (no comment in the source)\n" .. out[i]
        bare = bare + 1
      end
    end
  end
  local text = table.concat(out, "\n") .. "\n"
  if module_line then text = module_line .. "\n" .. text end
  return text, documented, bare
end

os.execute("mkdir -p '" .. out_dir .. "'")
local modules, documented, bare = 0, 0, 0
for _, name in ipairs(list_lua(src_dir)) do
  local module = name == "init.lua" and "l2l" or ("l2l." .. name:gsub("%.lua$", ""))
  local text, d, b = convert(read_lines(src_dir .. "/" .. name), module)
  local f = assert(io.open(out_dir .. "/" .. name, "wb"))
  f:write(text)
  f:close()
  modules, documented, bare = modules + 1, documented + d, bare + b
end
print(("gen_luadoc: %d modules, %d functions with their comments, %d without -> %s")
      :format(modules, documented, bare, out_dir))
