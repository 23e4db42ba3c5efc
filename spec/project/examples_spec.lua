-- SPDX-License-Identifier: MIT
-- examples_spec — the dynamic-architecture examples run as users run them (build/l2l
-- examples/<name>.lua, as subprocesses) in shortened form, and what they print shows that
-- they did their job: grow_depth doubles the depth from cloned blocks and ends lower than
-- it started, layerdrop skips blocks and its full-depth validation loss falls, bert_mlm's
-- masked-token loss falls clearly below ln(256). Their flags work (--data, a bad flag
-- fails). Also l2l.text, the corpus helper they share: batches are windows of the text
-- with next-byte targets, repeatable from (seed, step), and misuse names the argument.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local text = require("l2l.text")

local exe = support.build .. "/l2l"
local seed = support.seed % 1000 + 1   -- a different run each time; printed on failure

-- Runs an example; its output, which must come with exit status 0.
local function example(name, flags)
  local cmd = ("%s examples/%s.lua --seed %d %s"):format(exe, name, seed, flags)
  local status, out = support.sh(cmd)
  assert.are.equal(0, status, cmd .. "\n" .. out)
  return out, cmd .. "\n" .. out
end

-- The numbers `pattern` captures in each line of `out` that starts with "step ".
local function step_lines(out, pattern)
  local list = {}
  for line in out:gmatch("[^\n]+") do
    if line:match("^step ") then
      local caps = { line:match(pattern) }
      for i, v in ipairs(caps) do caps[i] = tonumber(v) end
      list[#list + 1] = caps
    end
  end
  return list
end

local function numbers(line, pattern)
  local caps = { line:match(pattern) }
  for i, v in ipairs(caps) do caps[i] = tonumber(v) end
  return caps
end

describe("examples/grow_depth.lua", function()
  it("doubles the depth from the trained blocks, and the loss ends below where it began", function()
    local out, why = example("grow_depth", "--steps 45 --every 15")
    local steps, growths, final = {}, {}, nil
    for line in out:gmatch("[^\n]+") do
      if line:match("^step") then
        steps[#steps + 1] = numbers(line, "^step%s+(%d+)%s+depth%s+(%d+)%s+train loss ([%d.]+)%s+valid loss ([%d.]+)$")
      elseif line:match("^growth") then
        growths[#growths + 1] = numbers(line,
          "^growth at step (%d+): depth (%d+) %-> (%d+), valid loss ([%d.]+) before, ([%d.]+) after$")
      elseif line:match("^done") then
        final = tonumber(line:match("final valid loss ([%d.]+)$"))
      end
    end
    assert.is_true(#steps >= 2, why)
    for _, s in ipairs(steps) do assert.are.equal(4, #s, why) end
    assert.are.same({ 1, 2 }, { steps[1][1], steps[1][2] }, why)
    assert.are.equal(2, #growths, why)
    local depth = 2
    for k, g in ipairs(growths) do
      assert.are.equal(5, #g, why)
      assert.are.equal(15 * k, g[1], why)
      assert.are.same({ depth, 2 * depth }, { g[2], g[3] }, why)
      depth = 2 * depth
    end
    -- Cloned blocks start trained: right after the first growth (step 15, still warming
    -- up) the model is far from untrained (whose loss is the first one printed) and at the
    -- loss just before. Over seeds 1-200 that growth moved the validation loss by 0.004 to
    -- 0.014 (mean 0.008), and the model stayed 0.86 or more below its first loss. The
    -- second growth (step 30, past warm-up) comes at whatever point of the training's
    -- swings: it moved the loss by up to 0.59 (seed 119; 0.65 at seed 313), so it is
    -- judged by the loss at the end, 1.57 or more below the first over those seeds.
    local g = growths[1]
    assert.is_true(math.abs(g[5] - g[4]) < 0.2, why)
    assert.is_true(g[5] < steps[1][4] - 0.3, why)
    assert.are.equal(8, steps[#steps][2], why)
    assert.is_truthy(out:match("done: depth 8,"), why)
    assert.is_true(final ~= nil and final < steps[1][4] - 0.5, why)
  end)

  it("reads --data FILE and --data FOLDER, and refuses an unknown flag with a hint", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    for i = 1, 400 do f:write(("line %d: int f%d(void);\n"):format(i, i % 7)) end
    local size = f:seek()
    f:close()
    local out, why = example("grow_depth", ("--steps 2 --every 5 --data %s"):format(path))
    assert.are.equal(size, tonumber(out:match("grow_depth: (%d+) bytes of text")), why)
    -- a folder: its text files, sub-folders included (a name with a space and a quote too)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute(("mkdir -p '%s/sub/it''s here'"):format(dir)) == 0)
    assert(os.execute(("cp %s %s/a.txt && cp %s '%s/sub/it''s here/b.h'"):format(path, dir, path, dir)) == 0)
    out, why = example("grow_depth", ("--steps 2 --every 5 --data %s"):format(dir))
    os.execute("rm -rf " .. dir)
    os.remove(path)
    assert.are.equal(2 * size, tonumber(out:match("grow_depth: (%d+) bytes of text")), why)
    local status, bad = support.sh(exe .. " examples/grow_depth.lua --depth 3")
    assert.are.equal(2, status, bad)
    assert.is_truthy(bad:find("grow_depth: unknown option '--depth'", 1, true), bad)
    status, bad = support.sh(exe .. " examples/grow_depth.lua --evrey 3")
    assert.are.equal(2, status, bad)
    assert.is_truthy(bad:find("unknown option '--evrey' (did you mean '--every'?)", 1, true), bad)
    status, bad = support.sh(exe .. " examples/grow_depth.lua --data /nonexistent/corpus")
    assert.are.equal(2, status, bad)
    assert.is_truthy(bad:find("grow_depth: --data: cannot read '/nonexistent/corpus'", 1, true), bad)
  end)
end)

describe("examples/layerdrop.lua", function()
  it("skips random blocks while training, and the full-depth validation loss falls", function()
    local out, why = example("layerdrop", "--steps 50")
    local lines = step_lines(out,
      "^step%s+(%d+)%s+train loss ([%d.]+) %((%d+) of 6 blocks%)%s+valid loss ([%d.]+) %(all blocks%)$")
    assert.are.equal(3, #lines, why)   -- steps 1, 25, 50
    for _, l in ipairs(lines) do assert.are.equal(4, #l, why) end
    -- over seeds 1-200 the validation loss fell by 1.60 to 2.19 (mean 1.94)
    assert.is_true(lines[3][4] < lines[1][4] - 0.8, why)
    -- Block l is skipped with probability 0.5 l / 6: 1.75 blocks a step on average, with
    -- a variance of sum p (1 - p) = 1.12 a step, so 50 steps average it with a standard
    -- deviation of 0.15, and 1 and 2.5 are five of them away (seeds 1-200: 1.34 to 2.14).
    local avg = tonumber(out:match("done: ([%d.]+) blocks skipped per step on average"))
    assert.is_true(avg ~= nil and avg > 1 and avg < 2.5, why)
  end)
end)

describe("examples/bert_mlm.lua", function()
  it("learns masked bytes: the loss falls clearly below ln(256)", function()
    local out, why = example("bert_mlm", "--steps 60")
    local lines = step_lines(out,
      "^step%s+(%d+)%s+train masked loss ([%d.]+)%s+valid masked loss ([%d.]+)%s+valid accuracy ([%d.]+)%%$")
    assert.are.equal(4, #lines, why)   -- steps 1, 25, 50, 60
    local first, last = lines[1], lines[#lines]
    assert.are.equal(4, #last, why)
    -- Over seeds 1-200: the untrained loss within 0.16 of ln 256; after 60 steps the
    -- validation loss 3.90 on average (standard deviation 0.08, worst 4.16: the bound is
    -- 10 deviations away), the last batch's loss 3.81 (0.15, worst 4.22: 4.9 away).
    assert.is_true(math.abs(first[3] - math.log(256)) < 0.5, why)   -- untrained: near uniform
    assert.is_true(last[3] < math.log(256) - 0.8, why)   -- validation text differs more
    assert.is_true(last[2] < math.log(256) - 1, why)
    -- Chance is 0.4 %. After 60 steps the model mostly names frequent bytes: over seeds
    -- 1-200 its accuracy was 5.5-16.6 % (median 9.9 %), so 2 % is five times chance
    -- without sitting inside that spread.
    assert.is_true(last[4] > 2 and last[4] <= 100, why)
  end)
end)

describe("every example", function()
  local names = { "train_gpt", "grow_depth", "layerdrop", "bert_mlm", "tour" }

  it("answers --help with its flags, --data among them, and exits 0 without training", function()
    for _, name in ipairs(names) do
      local status, out = support.sh(("%s examples/%s.lua --help"):format(exe, name))
      assert.are.equal(0, status, name .. ": " .. out)
      assert.is_truthy(out:find("^Usage: l2l examples/" .. name .. "%.lua "), name .. ": " .. out)
      for _, flag in ipairs({ "-h, --help", "--data <FILE_OR_FOLDER>", "--max-bytes <N>", "--steps <N>" }) do
        assert.is_truthy(out:find(flag, 1, true), name .. " lacks " .. flag .. ":\n" .. out)
      end
      assert.is_falsy(out:find("\nstep "), name .. " trained:\n" .. out)
    end
  end)

  it("refuses a bad value naming the flag, exit status 2", function()
    for _, name in ipairs(names) do
      local status, out = support.sh(("%s examples/%s.lua --steps 0"):format(exe, name))
      assert.are.equal(2, status, name .. ": " .. out)
      assert.is_truthy(out:find(name .. ": --steps must be an integer >= 1, got '0'", 1, true), name .. ": " .. out)
    end
  end)

  it("says what to install when lua-argparse is missing", function()
    local status, out = support.sh(exe .. [[ -e 'package.preload.argparse = function() error("not found") end' ]] ..
                                   "examples/layerdrop.lua --steps 1")
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("l2l.cli: the examples' flags need Debian's lua-argparse, which is not installed " ..
                              "(sudo apt-get install lua-argparse, or scripts/deps.sh)", 1, true), out)
  end)

  it("runs from any folder: tour.lua's default text is found without the checkout", function()
    local status, out = support.sh(("cd / && %s/l2l %s/examples/tour.lua --steps 2"):format(support.build_dir, support.root))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("\ntext: [^\n]+, %d+ bytes\n"), out)
    assert.is_truthy(out:find("\nstep    2  loss [%d.]+"), out)
  end)
end)

describe("l2l.text", function()
  local s = ("0123456789abcdefghijklmnopqrstuvwxyz"):rep(3)

  it("draws windows of the text with next-byte targets, repeatable from (seed, step)", function()
    local B, S = 5, 7
    local tok, tgt = text.batch(s, B, S, seed, 3)
    assert.are.same({ B, S }, tok:shape())
    assert.are.equal("i32", tgt:dtype())
    local t, g = tok:totable(), tgt:totable()
    local starts = {}
    for b = 1, B do
      local row = string.char(unpack(t[b]))
      local at = s:find(row, 1, true)
      assert.is_truthy(at, row)
      starts[b] = at
      assert.are.equal(s:sub(at + 1, at + S), string.char(unpack(g[b])))
    end
    local again = text.batch(s, B, S, seed, 3)
    assert.are.same(t, again:totable())
    -- another step draws other windows (the chance that all five starts repeat is nil)
    assert.are_not.same(t, text.batch(s, B, S, seed, 4):totable())
    assert.are_not.same(t, text.batch(s, B, S, seed + 1, 3):totable())
    -- opts.first: batches further along one stream are the rows of one bigger batch;
    -- opts.tokens/targets: filled in place (poisoned first), the same rows
    local big_t, big_g = text.batch(s, 2 * B, S, seed, 3)
    local into_t = l2l.full({ B, S }, -7, { dtype = "i32" })
    local into_g = l2l.full({ B, S }, -7, { dtype = "i32" })
    local got_t, got_g = text.batch(s, B, S, seed, 3, { first = B, tokens = into_t, targets = into_g })
    assert.are.equal(into_t, got_t)
    assert.are.equal(into_g, got_g)
    local bt, bg = big_t:totable(), big_g:totable()
    local it_, ig = into_t:totable(), into_g:totable()
    for b = 1, B do
      assert.are.same(bt[B + b], it_[b])
      assert.are.same(bg[B + b], ig[b])
    end
    local ok, err = pcall(text.batch, s, B, S, seed, 3, { tokens = l2l.zeros({ B, S + 1 }, { dtype = "i32" }) })
    assert.is_truthy(not ok and tostring(err):find("text.batch: opts.tokens must be an i32"), err)
    -- a tokenized text (an i32 tensor of ids) gives the same windows as the string of
    -- the same symbols: the same draws, next-id targets
    local ids = l2l.empty({ #s }, { dtype = "i32" })
    for i = 1, #s do ids:set(i, s:byte(i) + 1000) end
    local id_t, id_g = text.batch(ids, B, S, seed, 3)
    local tt, tg = id_t:totable(), id_g:totable()
    for b = 1, B do
      for j = 1, S do
        assert.are.equal(t[b][j] + 1000, tt[b][j])
        assert.are.equal(g[b][j] + 1000, tg[b][j])
      end
    end
    ok, err = pcall(text.batch, l2l.zeros({ 4, 4 }, { dtype = "i32" }), 1, 2, seed, 3)
    assert.is_truthy(not ok and tostring(err):find("one dimension", 1, true), err)
  end)

  it("walks folders without a shell: sub-folders in a fixed order; hidden, linked and binary files left out", function()
    local dir = os.tmpname()
    os.remove(dir)
    local function put(name, bytes) support.write_file(dir .. "/" .. name, bytes) end
    assert(os.execute(("mkdir -p '%s/b/deep' '%s/.git' '%s/a $(x)'"):format(dir, dir, dir)) == 0)
    put("z.txt", "zzzz\n"); put("b/deep/y.h", "yyyy\n"); put("a $(x)/x.txt", "xxxx\n")
    put(".hidden", "hidden\n"); put(".git/config", "git\n"); put("empty.txt", "")
    put("binary.bin", "bin\0ary\n")
    assert(os.execute(("ln -s '%s/z.txt' '%s/link.txt' && ln -s '%s/b' '%s/loop'"):format(dir, dir, dir, dir)) == 0)
    local files = text.files(dir)
    local rel = {}
    for i, f in ipairs(files) do rel[i] = f:sub(#dir + 2) end
    assert.are.same({ "a $(x)/x.txt", "b/deep/y.h", "binary.bin", "empty.txt", "z.txt" }, rel)
    assert.are.same({ dir .. "/b/deep/y.h" }, text.files(dir, { pattern = "%.h$" }))
    assert.are.same({ dir .. "/z.txt" }, text.files(dir .. "/z.txt"))
    -- by path: the three text files; the empty and the binary one are not text
    local c = text.corpus(dir, { order = "path" })
    assert.are.equal("xxxx\nyyyy\nzzzz\n", c.text)
    assert.are.same({ 5, 10, 15 }, c.ends)
    assert.are.equal(3, c.files)
    -- mixed: the same files in an order fixed by their paths' hash, the same every time
    local m = text.corpus({ dir }, { max_bytes = 12 })
    assert.are.equal(12, #m.text)
    assert.are.equal(m.text, text.corpus({ dir }, { max_bytes = 12 }).text)
    -- a file named on its own is read whatever it holds
    assert.are.equal("bin\0ary\n", text.corpus({ dir .. "/binary.bin" }).text)
    local ok, err = pcall(text.corpus, dir .. "/.git/nothing")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("text.corpus: paths: cannot read '" .. dir .. "/.git/nothing': No such file", 1, true), err)
    os.execute("rm -rf '" .. dir .. "'")
    -- the default: C headers under /usr/include (l2l's own sources where there are none)
    local d = text.corpus(nil, { max_bytes = 5000 })
    assert.are.equal(5000, #d.text)
    assert.is_truthy(d.description == "C headers under /usr/include" or d.description:find("l2l's own sources", 1, true),
                     d.description)
  end)

  it("prints valid UTF-8 as it is, and controls and bytes that are not UTF-8 as '?'", function()
    -- pieces and what each prints as; each ends in a byte no sequence continues with, so
    -- that any order of them prints as the order of their parts
    local PIECES = {
      { "plain a-z 0-9 \t\n", "plain a-z 0-9 \t\n" }, { "caf\xc3\xa9", "caf\xc3\xa9" },
      { "\xe2\x86\x92", "\xe2\x86\x92" }, { "\xf0\x9d\x84\x9e", "\xf0\x9d\x84\x9e" },
      { "\xc2\xa0", "\xc2\xa0" }, { "\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf" },   -- U+00A0, U+10FFFF
      { "\r\27[2J\0\127", "??[2J??" },                                  -- C0 controls, DEL
      { "\xc2\x9b", "??" }, { "\xc2\x85", "??" },                         -- C1 controls (CSI, NEL)
      { "\xff\xfe", "??" }, { "\x80x", "?x" }, { "\xe2\x86x", "??x" },   -- not UTF-8, cut short
      { "\xc0\xafx", "??x" }, { "\xed\xa0\x80", "???" },                  -- overlong, surrogate
      { "\xf4\x90\x80\x80", "????" }, { "\xf5\x80x", "??x" },            -- past U+10FFFF
      { "\xe0\x9f\xbf", "???" }, { "\xf0\x8f\xbf\xbf", "????" },          -- overlong 3 and 4 bytes
      { "\xe0\xa0\x80", "\xe0\xa0\x80" }, { "\xf0\x90\x80\x80", "\xf0\x90\x80\x80" },   -- their least
    }
    for _ = 1, 200 do
      local parts, want = {}, {}
      for k = 1, support.int(0, 8) do
        local p = PIECES[support.int(1, #PIECES)]
        parts[k], want[k] = p[1], p[2]
      end
      local s = table.concat(parts)
      assert.are.equal(table.concat(want), text.printable(s), ("%q"):format(s))
    end
    assert.has_error(function() text.printable(nil) end, "text.printable: s must be a string, got nil")
  end)

  it("splits off the validation part and loads files, or names what is wrong", function()
    local train, valid = text.split(s, 0.25)
    assert.are.equal(s, train .. valid)
    assert.are.equal(math.floor(#s * 0.75), #train)
    local corpus = text.load(nil, 5000)
    assert.are.equal(5000, #corpus)
    assert.are.equal(corpus, text.load(nil, 5000), "the default corpus is the same every time")
    local ok, err = pcall(text.load, { "/nonexistent/file.txt" })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("text.load: paths: cannot read '/nonexistent/file.txt'", 1, true), err)
    ok, err = pcall(text.split, s, 1)
    assert.is_truthy(not ok and tostring(err):find("text.split: fraction must be"), err)
    ok, err = pcall(text.batch, "short", 1, 5, 0, 0)
    assert.is_truthy(not ok and tostring(err):find("text.batch: the text %(5 bytes%) is shorter than S %+ 1 = 6"), err)
    ok, err = pcall(text.batch, s, 0, 5, 0, 0)
    assert.is_truthy(not ok and tostring(err):find("text.batch: B must be an integer >= 1"), err)
  end)
end)
