-- SPDX-License-Identifier: MIT
-- l2l.train — `l2l train [flags]`: the training program (examples/train_gpt.lua) as a
-- command of the l2l executable, wherever l2l is installed.
--
-- Purpose: a user trains a GPT on their text with `l2l train --data FOLDER ...` instead of
-- typing the path of the installed example. The program stays one file, an example to
-- read and copy (examples/train_gpt.lua, installed to <datadir>/l2l/examples/); this finds
-- it beside the Lua modules (the source tree's examples/, or the installed share/l2l/) and
-- runs it with the command's words as its arguments. Its flags come from the option table
-- (cli.option_flags): every setting of the relay, its optimizer and its schedule.
-- Must never: run a program found anywhere but those two places.
local M = {}

-- The training program's path, or nil and where it was looked for.
function M.program()
  local me = package.searchpath("l2l.train", package.path)
  local lua_dir = me and me:match("^(.*)/l2l/train%.lua$")
  if lua_dir == nil then return nil, "l2l.train is not on package.path" end
  local tried = { lua_dir .. "/../examples/train_gpt.lua",              -- the source tree: lua/ beside examples/
                  lua_dir .. "/../../l2l/examples/train_gpt.lua" }      -- installed: share/lua/5.1 beside share/l2l
  for _, path in ipairs(tried) do
    local f = io.open(path, "r")
    if f then
      f:close()
      return path
    end
  end
  return nil, table.concat(tried, " or ")
end

-- `l2l train ARGS...`: the program run with ARGS (as `l2l <program> ARGS...` would).
function M.main(args)
  local path, tried = M.program()
  if path == nil then
    io.stderr:write(("l2l train: the training program is not installed beside l2l's modules (looked for %s)\n"):format(tried))
    return 1
  end
  local chunk, err = loadfile(path)
  if chunk == nil then error("l2l train: " .. err, 0) end
  local words = { [0] = "train" }   -- (arg[0] "train": the program calls itself `l2l train`)
  for i, a in ipairs(args) do words[i] = a end
  rawset(_G, "arg", words)
  chunk(unpack(args))
  return 0
end

return M
