-- SPDX-License-Identifier: MIT
-- gen_cdoc.lua — writes the C API reference (Markdown) from the comments of include/l2l.h and
-- its parts (their FFI blocks in the header's order: scripts/public_header.lua).
-- Usage: luajit scripts/gen_cdoc.lua include/l2l.h build/doc/c-api.md   (run by `make doc`)
-- The header is the reference: its top comment (purpose and conventions) opens the page;
-- each `/* ---- name */` rule inside an FFI block starts a section (the rest of that
-- comment is the section's introduction); each comment followed by declarations becomes
-- one entry, named by what it declares, with the comment as its text and the declarations
-- as code. Declarations with no comment of their own are listed too.
-- Fails (status 1), naming the line, on a declaration it cannot name, so that nothing the
-- header declares is left out silently.
-- Must never: change the header, or document anything the header does not declare.
local header_path, out_path = arg[1], arg[2]
if not header_path or not out_path then
  io.stderr:write("usage: luajit scripts/gen_cdoc.lua HEADER OUT.md\n")
  os.exit(2)
end

local where = header_path   -- the file being read, for fail's message
local function fail(msg)
  io.stderr:write("gen_cdoc: " .. where .. ": " .. msg .. "\n")
  os.exit(1)
end
-- the header and its parts, each with its FFI block (scripts/public_header.lua)
local blocks, why = dofile((arg[0]:match("^(.*)/") or ".") .. "/public_header.lua")(header_path)
if not blocks then fail(why) end
local text = blocks[1].text

-- The lines of a /* ... */ comment without the markers and the " * " of a starred
-- comment; the continuation lines lose their common indentation (the first line's text
-- starts right after "/*").
local function comment_lines(body)
  body = body:gsub("^/%*", ""):gsub("%*/$", "")
  local lines = {}
  for line in (body .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
  local starred = #lines > 2
  for i = 2, #lines - 1 do
    if not lines[i]:match("^%s*%*") then starred = false end
  end
  if starred then
    for i = 2, #lines do lines[i] = lines[i]:gsub("^%s*%* ?", "") end
  end
  lines[1] = lines[1]:gsub("^%s+", "")
  local indent
  for i = 2, #lines do
    if lines[i]:match("%S") then
      local n = #lines[i]:match("^ *")
      if not indent or n < indent then indent = n end
    end
  end
  for i, line in ipairs(lines) do
    if i > 1 then line = line:sub((indent or 0) + 1) end
    lines[i] = line:gsub("%s+$", "")
  end
  while #lines > 0 and lines[1] == "" do table.remove(lines, 1) end
  while #lines > 0 and lines[#lines] == "" do table.remove(lines) end
  return lines
end

-- Markdown for comment lines: paragraphs of plain sentences flow; a paragraph with lists,
-- indentation or columns aligned by spaces keeps its lines, as preformatted text.
local function markdown(lines)
  local out, para = {}, {}
  local function flush()
    if #para == 0 then return end
    local preformatted = false
    for i, line in ipairs(para) do
      if line:match("^%s") and i > 1 or line:match("^%- ") or line:match("%S   +%S")
         or line:match("^%s*[%w_%.]+:%s%s") then
        preformatted = true
      end
    end
    if preformatted then
      out[#out + 1] = "```text\n" .. table.concat(para, "\n") .. "\n```"
    else
      local joined = table.concat(para, " "):gsub("%s+", " ")
      joined = joined:gsub("([\\%*<>%[%]])", "\\%1")
      out[#out + 1] = joined
    end
    para = {}
  end
  for _, line in ipairs(lines) do
    if line == "" then flush() else para[#para + 1] = line end
  end
  flush()
  return table.concat(out, "\n\n")
end

-- The names a declaration declares: functions, types, enumerators of an anonymous enum.
local function names_of(decl)
  local flat = decl:gsub("/%*.-%*/", " "):gsub("%s+", " ")
  local fp = flat:match("^typedef [^;]-%(%s*%*%s*([%w_]+)%s*%)%s*%(")
  if fp then return { fp } end
  if flat:match("^typedef ") then
    local name = flat:match("([%w_]+)%s*;%s*$")
    return name and { name } or nil
  end
  if flat:match("^enum%s*{") then
    local list = {}
    for name in flat:gmatch("([%w_]+)%s*=") do list[#list + 1] = name end
    return #list > 0 and list or nil
  end
  if flat:match("^struct [%w_]+ {") or flat:match("^enum [%w_]+ {") then
    return { flat:match("^%w+ ([%w_]+)") }
  end
  local fn = flat:match("([%w_]+)%s*%(")
  return fn and { fn } or nil
end

local function anchor(title)
  return (title:lower():gsub("[^%w%- ]", ""):gsub(" ", "-"))
end

-- (the licence's SPDX line, a comment of its own, is not the top comment)
local top = text:gsub("^%s*/%* SPDX%-License%-Identifier:[^\n]*%*/", "", 1):match("^%s*(/%*.-%*/)")
if not top then fail("no top comment") end

-- Walk the blocks in order: comments, blank lines and declarations (up to a `;` outside
-- braces).
local sections = { { title = nil, intro = nil, entries = {} } }
local pending         -- the comment lines waiting for their declarations
local entry           -- the entry the last declarations joined (until a blank line)
local block, pos, line_no
local function advance(piece)
  local _, n = piece:gsub("\n", "")
  line_no = line_no + n
  pos = pos + #piece
end
for _, file in ipairs(blocks) do
  where, block, pos, line_no, pending, entry = file.path, file.body, 1, file.first_line, nil, nil
  while pos <= #block do
    local rest = block:sub(pos)
    local ws = rest:match("^[ \t]*\n") or rest:match("^[ \t]+$")
    if ws then
      if rest:match("^[ \t]*\n[ \t]*\n") then entry = nil end   -- a blank line ends an entry
      advance(ws)
    elseif rest:match("^%s*/%*") then
      local lead, comment = rest:match("^(%s*)(/%*.-%*/)")
      if not comment then fail(("line %d: an unterminated comment"):format(line_no)) end
      local title = comment:match("^/%*%s*%-%-%-%-+%s*([^\n]-)%s*%*?/?$") or
                    comment:match("^/%*%s*%-%-%-%-+%s*([^\n]-)%s*\n")
      if title then
        title = title:gsub("%s*%*/$", "")
        local lines = comment_lines(comment)
        table.remove(lines, 1)
        sections[#sections + 1] = { title = title, intro = #lines > 0 and lines or nil, entries = {} }
        pending, entry = nil, nil
      else
        pending, entry = comment_lines(comment), nil
      end
      advance(lead .. comment)
    else
      -- a declaration: up to the `;` that closes it outside braces, plus a trailing comment
      local depth, i = 0, 1
      while i <= #rest do
        local c = rest:sub(i, i)
        if rest:sub(i, i + 1) == "/*" then
          local close = rest:find("*/", i + 2, true)
          if not close then fail(("line %d: an unterminated comment"):format(line_no)) end
          i = close + 1
        elseif c == "{" then depth = depth + 1
        elseif c == "}" then depth = depth - 1
        elseif c == ";" and depth == 0 then break end
        i = i + 1
      end
      if i > #rest then fail(("line %d: a declaration with no closing ';'"):format(line_no)) end
      local decl = rest:sub(1, i)
      local trailing = rest:sub(i + 1):match("^[ \t]*/%*.-%*/")
      if trailing and not trailing:find("\n") then decl = decl .. trailing end
      local names = names_of(decl)
      if not names then fail(("line %d: cannot tell what this declares: %s"):format(line_no, decl)) end
      local section = sections[#sections]
      if not entry then
        entry = { names = {}, comment = pending, code = {} }
        section.entries[#section.entries + 1] = entry
        pending = nil
      end
      for _, n in ipairs(names) do entry.names[#entry.names + 1] = n end
      -- the export mark every function carries says nothing to a reader: left out, its
      -- continuation lines moved back by its width
      local shown = decl:match("^%s*(.-)%s*$")
      if shown:sub(1, 8) == "L2L_API " then shown = shown:sub(9):gsub("\n        ", "\n") end
      entry.code[#entry.code + 1] = shown
      advance(decl)
    end
  end
end

local out = {}
local function put(s) out[#out + 1] = s end
put("# The C API of libl2l\n")
put("Generated by `scripts/gen_cdoc.lua` from the comments of `include/l2l.h` and its parts " ..
    "(`include/l2l/*.h`), the one header a program includes (`#include <l2l.h>`; build with " ..
    "`pkg-config --cflags --libs l2l`). Every entry below is a declaration of that header " ..
    "with the comment above it.\n")
put(markdown(comment_lines(top)) .. "\n")
put("## Contents\n")
for _, s in ipairs(sections) do
  if s.title and #s.entries > 0 then put(("- [%s](#%s)"):format(s.title, anchor(s.title))) end
end
put("")
local count = 0
for _, s in ipairs(sections) do
  if #s.entries > 0 or s.intro then
    put("## " .. (s.title or "declarations") .. "\n")
    if s.intro then put(markdown(s.intro) .. "\n") end
    for _, e in ipairs(s.entries) do
      local shown = {}
      for _, n in ipairs(e.names) do shown[#shown + 1] = "`" .. n .. "`" end
      put("### " .. table.concat(shown, ", ") .. "\n")
      if e.comment then put(markdown(e.comment) .. "\n") end
      put("```c\n" .. table.concat(e.code, "\n") .. "\n```\n")
      count = count + #e.names
    end
  end
end

local o = assert(io.open(out_path, "wb"))
o:write(table.concat(out, "\n"))
o:close()
print(("gen_cdoc: %d names in %d sections -> %s"):format(count, #sections - 1, out_path))
