-- SPDX-License-Identifier: MIT
-- spec/tokenizer_fixture.lua — a small vocabulary in GPT-2's file format (encoder.json,
-- vocab.bpe), for the specs that need a tokenizer without GPT-2's own files (which need
-- npm): the 256 byte tokens in GPT-2's byte encoding and order, a few merges, then
-- <|endoftext|>. Not a spec (busted runs *_spec.lua only).
--
--   local fixture = dofile("spec/tokenizer_fixture.lua")
--   local dir = fixture.write(folder [, {merges =, encoder =}])   -- writes the two files
--   fixture.merges, fixture.vocab                          -- the merges written; 256 + #merges + 1
local M = {}

-- GPT-2's byte encoder, written out from its definition: printable Latin-1 bytes stand for
-- themselves, the others for U+0100 onwards in byte order.
local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
end
M.byte_char = {}
local order = {}   -- encoder.json's order: the printable bytes, then the others
do
  local n, rest = 0, {}
  for b = 0, 255 do
    if (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255) then
      M.byte_char[b] = utf8(b)
      order[#order + 1] = b
    else
      M.byte_char[b] = utf8(256 + n)
      n = n + 1
      rest[#rest + 1] = b
    end
  end
  for _, b in ipairs(rest) do order[#order + 1] = b end
end

-- "Ġ" is the space; each merge uses only what earlier ones made.
M.merges = {
  "l l", "h e", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ hello",
  "a a", "aa aa", "aaaa aaaa", "= =", "== ==",
}
M.vocab = 256 + #M.merges + 1

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return ("\\u%04x"):format(c:byte()) end) .. '"'
end

-- Writes encoder.json and vocab.bpe into `dir` (created); opts.encoder / opts.merges
-- replace the files' text. Returns dir.
function M.write(dir, opts)
  opts = opts or {}
  os.execute("mkdir -p '" .. dir .. "'")
  local entries = {}
  local id = 0
  for _, b in ipairs(order) do
    entries[#entries + 1] = json_string(M.byte_char[b]) .. ": " .. id
    id = id + 1
  end
  for _, m in ipairs(M.merges) do
    entries[#entries + 1] = json_string((m:gsub(" ", ""))) .. ": " .. id
    id = id + 1
  end
  entries[#entries + 1] = '"<|endoftext|>": ' .. id
  local f = assert(io.open(dir .. "/encoder.json", "wb"))
  f:write(opts.encoder or ("{" .. table.concat(entries, ", ") .. "}"))
  f:close()
  f = assert(io.open(dir .. "/vocab.bpe", "wb"))
  f:write(opts.merges or ("#version: 0.2\n" .. table.concat(M.merges, "\n") .. "\n"))
  f:close()
  return dir
end

return M
