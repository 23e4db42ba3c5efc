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
      -- cloned blocks start trained: right after growth the model is far from untrained
      -- (whose loss is the first one printed) and near the loss just before
      assert.is_true(g[5] < steps[1][4] - 0.3, why)
      assert.is_true(math.abs(g[5] - g[4]) < 0.5, why)
    end
    assert.are.equal(8, steps[#steps][2], why)
    assert.is_truthy(out:match("done: depth 8,"), why)
    assert.is_true(final ~= nil and final < steps[1][4] - 0.5, why)
  end)

  it("reads --data and refuses an unknown flag", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    for i = 1, 400 do f:write(("line %d: int f%d(void);\n"):format(i, i % 7)) end
    local size = f:seek()
    f:close()
    local out, why = example("grow_depth", ("--steps 2 --every 5 --data %s"):format(path))
    os.remove(path)
    assert.are.equal(size, tonumber(out:match("grow_depth: (%d+) bytes of text")), why)
    local status, bad = support.sh(exe .. " examples/grow_depth.lua --depth 3")
    assert.are_not.equal(0, status, bad)
    assert.is_truthy(bad:find("unknown flag or missing value: --depth", 1, true), bad)
  end)
end)

describe("examples/layerdrop.lua", function()
  it("skips random blocks while training, and the full-depth validation loss falls", function()
    local out, why = example("layerdrop", "--steps 50")
    local lines = step_lines(out,
      "^step%s+(%d+)%s+train loss ([%d.]+) %((%d+) of 6 blocks%)%s+valid loss ([%d.]+) %(all blocks%)$")
    assert.are.equal(3, #lines, why)   -- steps 1, 25, 50
    for _, l in ipairs(lines) do assert.are.equal(4, #l, why) end
    assert.is_true(lines[3][4] < lines[1][4] - 0.8, why)
    -- block l is skipped with probability 0.5 l / 6: 1.75 blocks a step on average
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
    assert.is_true(math.abs(first[3] - math.log(256)) < 0.5, why)   -- untrained: near uniform
    assert.is_true(last[3] < math.log(256) - 0.8, why)   -- validation text differs more
    assert.is_true(last[2] < math.log(256) - 1, why)
    assert.is_true(last[4] > 5 and last[4] <= 100, why)   -- chance is 0.4 %
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
