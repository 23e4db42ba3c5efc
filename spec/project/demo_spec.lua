-- SPDX-License-Identifier: MIT
-- demo_spec — `make demo` (examples/train_gpt.lua) and model:generate.
--
-- The demo runs as a user runs it, a subprocess of the l2l executable, in a shortened
-- configuration (a 2-block model, 60 steps: a few seconds): it must exit 0, its held-out
-- loss must fall well below a uniform guess over bytes (ln 256 = 5.55), and it must write
-- a metrics log of JSON lines, an SVG picture, plain output lines when not on a
-- terminal, and a generated sample. The default configuration is started for two steps
-- to check what it is for: parameters plus optimizer state larger than the device budget
-- it trains within. model:generate is checked against an argmax computed here from the
-- layers' own forward, against the k likeliest bytes, for determinism, for its argument
-- errors, and for leaving a relay's training exactly as it was.
local support = dofile("spec/support.lua")
local cjson = require("cjson")
local l2l = require("l2l")

local sh, build = support.sh, support.build
local exe = build .. "/l2l"
local script = "examples/train_gpt.lua"

local tmpdir = support.tmpdir

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The demo with flags; output as a pipe (never a terminal), L2L_PROGRESS unset.
local function demo(flags)
  return sh(("env -u L2L_PROGRESS %s %s %s"):format(exe, script, flags))
end

-- Every tag closed in order (self-closing tags aside): a check that the SVG is XML-ish.
local function balanced_tags(text)
  local stack = {}
  for closing, name, self_closing in text:gmatch("<(/?)([%w:%-]+)[^>]-(/?)>") do
    if closing == "/" then
      if stack[#stack] ~= name then return false, "</" .. name .. "> closes <" .. tostring(stack[#stack]) .. ">" end
      stack[#stack] = nil
    elseif self_closing ~= "/" then
      stack[#stack + 1] = name
    end
  end
  if #stack > 0 then return false, "<" .. stack[#stack] .. "> is never closed" end
  return true
end

describe("examples/train_gpt.lua, shortened", function()
  -- A fixed seed: the run's claims include learning (the validation loss falls so far in
  -- 60 steps), which holds for most seeds, not all (at seed 1: validation 5.41 -> 2.75,
  -- the last batch's loss 3.15).
  local seed = 1
  local out = tmpdir()
  local flags = ("--steps 60 --layers 2 --dim 64 --heads 4 --seq 64 --batch 16 --micro-batch 4 --eval-every 20 " ..
                 "--max-bytes 1000000 --plot svg --sample 60 --seed %d --out %s"):format(seed, out)
  local status, output, context
  setup(function()
    status, output = demo(flags)
    context = ("seed %d, output:\n%s"):format(seed, output)
  end)
  teardown(function() os.execute("rm -rf " .. out) end)

  it("exits 0 and the validation loss falls well below a uniform guess", function()
    assert.are.equal(0, status, context)
    local train, val, start = output:match("loss: train ([%d.]+), validation ([%d.]+) %(validation at the start ([%d.]+)")
    assert.is_truthy(val, context)
    val, start = tonumber(val), tonumber(start)
    -- measured on 8 seeds: 2.62 .. 2.98 after 60 steps, from 5.2 .. 5.5 at the start
    assert.is_true(val < 3.4, context)
    assert.is_true(start - val > 1.5, context)
    assert.is_true(tonumber(train) < 4, context)
  end)

  it("writes the metrics as JSON lines with increasing steps", function()
    local text = read(out .. "/metrics.jsonl")
    assert.is_truthy(text, "no metrics.jsonl in " .. out)
    local records = {}
    for line in text:gmatch("[^\n]+") do
      local ok, rec = pcall(cjson.decode, line)
      assert.is_true(ok, "not JSON: " .. line)
      records[#records + 1] = rec
    end
    assert.are.equal(61, #records)   -- step 0 (the loss before training), then 1 .. 60
    local fields = { "step", "loss", "val_loss", "lr", "tokens_per_s", "device_peak", "host_bytes", "eps_bytes" }
    for i, rec in ipairs(records) do
      for _, f in ipairs(fields) do
        assert.is_not_nil(rec[f], ("line %d has no field %s"):format(i, f))
      end
      assert.are.equal(i - 1, rec.step)
      if i > 1 then
        assert.is_true(rec.step > records[i - 1].step)
        assert.are.equal("number", type(rec.loss))
        assert.is_true(rec.tokens_per_s > 0 and rec.lr > 0 and rec.device_peak > 0 and rec.host_bytes > 0)
      end
      -- a validation loss every 20 steps, null between
      local evaluated = rec.step % 20 == 0
      assert.are.equal(evaluated and "number" or "userdata", type(rec.val_loss), "step " .. rec.step)
    end
    -- the cosine schedule: warm-up to the peak, then down
    assert.is_true(records[21].lr > records[2].lr and records[61].lr < records[21].lr)
  end)

  it("draws the loss and memory curves as an SVG", function()
    local svg = read(out .. "/curves.svg")
    assert.is_truthy(svg, "no curves.svg in " .. out .. "\n" .. context)
    assert.is_truthy(svg:match("^<svg "), svg:sub(1, 80))
    assert.is_truthy(svg:match("</svg>%s*$"))
    local ok, why = balanced_tags(svg)
    assert.is_true(ok, why)
    local _, polylines = svg:gsub("<polyline ", "")
    assert.is_true(polylines >= 4, "polylines: " .. polylines)   -- train, validation, device, host
    local _, panels = svg:gsub('<g class="panel"', "")
    assert.are.equal(2, panels)
    for _, label in ipairs({ ">step<", ">validation<", ">device peak<", ">device budget<", ">MiB<" }) do
      assert.is_truthy(svg:find(label, 1, true), label)
    end
    assert.is_truthy(output:find("picture: " .. out .. "/curves.svg", 1, true), context)
  end)

  it("prints plain lines when the output is not a terminal, and a sample", function()
    assert.is_falsy(output:find("\r", 1, true), "a carriage return in the output")
    assert.is_falsy(output:find("\27[", 1, true), "an escape sequence in the output")
    assert.is_truthy(output:find("\nstep 60/60  loss [%d.]+  val [%d.]+"), context)
    assert.is_truthy(output:find("model%+optimizer state [%d.]+ MiB, device budget [%d.]+ MiB"), context)
    local sample = output:match('sample %([^\n]*%): "#include <" continued by the model:\n(#include <[^\n]*)')
    assert.is_truthy(sample, context)
  end)
end)

describe("examples/train_gpt.lua --tokenizer gpt2", function()
  it("trains on GPT-2 tokens and decodes its sample to text", function()
    local fetched, why = sh("bash scripts/gpt2-vocab.sh")
    if fetched ~= 0 then return pending("GPT-2's tokenizer files could not be fetched: " .. why) end
    local out = tmpdir()
    local status, output = demo(("--tokenizer gpt2 --steps 12 --layers 1 --dim 32 --heads 2 --seq 32 --batch 8 " ..
      "--micro-batch 4 --eval-every 6 --max-bytes 300000 --device-budget 0 --plot none --sample 12 --out %s"):format(out))
    assert.are.equal(0, status, output)
    assert.is_truthy(output:find("a GPT-2-token GPT", 1, true), output)
    -- the losses are over GPT-2's 50257 tokens: a fresh model starts near ln(50257) = 10.8
    local first = tonumber(output:match("step 0: validation loss ([%d%.]+) %(a uniform guess over 50257 tokens: 10%.825%)"))
    assert.is_truthy(first and first > 9 and first < 12, output)
    local train, valid = output:match("loss: train ([%d%.]+), validation ([%d%.]+)")
    assert.is_true(tonumber(valid) < first, output)
    -- the sample is text: the prompt, then the decoded continuation
    local sample = output:match("continued by the model:\n([^\n]+)")
    assert.is_truthy(sample and sample:find("^#include <") and #sample > #"#include <", output)
    assert.is_truthy(tonumber(train), output)
  end)
end)

describe("examples/train_gpt.lua, flags", function()
  it("--help lists the flags and exits 0", function()
    local status, output = demo("--help")
    assert.are.equal(0, status, output)
    for _, flag in ipairs({ "--data", "--layers", "--dim", "--heads", "--seq", "--batch", "--micro-batch", "--steps",
                            "--lr", "--stash", "--device-budget", "--seed", "--checkpoint", "--resume", "--plot" }) do
      assert.is_truthy(output:find(flag .. " ", 1, true), flag .. " missing from\n" .. output)
    end
    assert.is_falsy(output:find("uniform guess", 1, true), "--help must not train")
  end)

  it("refuses a bad flag or value with a message naming it", function()
    local cases = {
      { "--nonsense", "train_gpt: unknown option '--nonsense'\n" },
      { "--stpes 5", "unknown option '--stpes' (did you mean '--steps'?)" },
      { "--steps abc", "--steps must be an integer >= 1, got 'abc'" },
      { "--steps", "option '--steps' requires an argument" },
      { "--dim 64 --heads 3", "--heads (3) must divide --dim (64)" },
      { "--stash nowhere", "must be one of 'host', 'device', 'recompute', got 'nowhere'" },
      { "--stash=hots", "got 'hots' (did you mean 'host'?)" },
      { "--device-budget lots", "--device-budget must be a number of MiB" },
      { "--resume", "--resume needs --checkpoint" },
      { "--data /nonexistent/l2l", "--data: cannot read '/nonexistent/l2l': No such file or directory" },
    }
    for _, c in ipairs(cases) do
      local status, output = demo(c[1])
      assert.are.equal(2, status, c[1] .. ": " .. output)
      assert.is_truthy(output:find(c[2], 1, true), c[1] .. ": " .. output)
      assert.is_truthy(output:find("(`l2l examples/train_gpt.lua --help` lists the flags)", 1, true), output)
    end
  end)

  it("trains the default model within a device budget smaller than its state", function()
    local out = tmpdir()
    local status, output = demo("--steps 2 --eval-batches 1 --sample 0 --plot none --out " .. out)
    os.execute("rm -rf " .. out)
    assert.are.equal(0, status, output)
    local state, budget = output:match("model%+optimizer state ([%d.]+) MiB, device budget ([%d.]+) MiB")
    assert.is_truthy(state, output)
    assert.is_true(tonumber(state) > 1.5 * tonumber(budget), output)
    local peak, unit = output:match("device: peak ([%d.]+) (%a+) within a budget")
    assert.are.equal("MiB", unit, output)
    assert.is_true(tonumber(peak) <= tonumber(budget), output)
  end)

  it("--stop-at and --resume give the uninterrupted run's losses", function()
    if l2l.load == nil then
      pending("checkpoints not available in this build")
      return
    end
    local a, b = tmpdir(), tmpdir()
    local tiny = "--steps 12 --layers 1 --dim 32 --seq 32 --batch 8 --micro-batch 4 --eval-every 4 --max-bytes 200000 " ..
                 "--plot none --sample 20"
    local s1, o1 = demo(tiny .. " --out " .. a)
    local ck = b .. "/run.ckpt"
    local s2, o2 = demo(("%s --out %s --checkpoint %s --save-every 3 --stop-at 7"):format(tiny, b, ck))
    local s3, o3 = demo(("%s --out %s --checkpoint %s --resume"):format(tiny, b, ck))
    local m1, m3 = read(a .. "/metrics.jsonl"), read(b .. "/metrics.jsonl")
    os.execute("rm -rf " .. a .. " " .. b)
    assert.are.equal(0, s1, o1)
    assert.are.equal(0, s2, o2)
    assert.are.equal(0, s3, o3)
    if o2:find("checkpoints not available", 1, true) then
      pending("checkpoints not available in this build")
      return
    end
    assert.is_truthy(o2:find("stopped at step 7 of 12", 1, true), o2)
    assert.is_truthy(o3:find("resuming from " .. ck .. " at step 7 of 12", 1, true), o3)
    local function losses(text)
      local t = {}
      for line in text:gmatch("[^\n]+") do
        local r = cjson.decode(line)
        t[r.step] = r.loss
      end
      return t
    end
    local l1, l3 = losses(m1), losses(m3)
    for step = 1, 12 do
      assert.are.equal(l1[step], l3[step], "step " .. step)
    end
    -- the same weights at the end: the same sample
    assert.are.equal(o1:match("continued by the model:\n(.*)$"), o3:match("continued by the model:\n(.*)$"))
  end)
end)

describe("model:generate", function()
  local V, D, S = 256, 32, 16

  -- init_std 0.5: logits far from uniform, so argmax and top-k are not decided by ties
  local function new_model(seed)
    return l2l.Sequential{
      l2l.Embedding{ vocab = V, dim = D, max_seq = S, init_std = 0.5, seed = seed },
      l2l.Block{ dim = D, heads = 4, causal = true, memory = "frugal", init_std = 0.5, seed = seed + 1 },
      l2l.LMHead{ vocab = V, dim = D, tie = true },
    }
  end

  -- The last position's logits for `ids` (a list, at most S long), through each layer's
  -- own forward: not through Sequential:forward nor generate.
  local function last_logits(model, ids)
    local tok = l2l.tensor({ ids }, { dtype = "i32" })
    local batch = { tokens = tok, training = false }
    local x
    for i = 1, #model do x = model[i]:forward(x, batch) end
    local row = x:totable()[1][#ids]
    return row
  end

  local function ranked(row)
    local order = {}
    for v = 1, #row do order[v] = v - 1 end
    table.sort(order, function(a, b) return row[a + 1] > row[b + 1] end)
    return order
  end

  local model = new_model(support.int(1, 10000))
  local prompt = {}
  for i = 1, S + 5 do prompt[i] = support.int(0, V - 1) end   -- longer than max_seq: a window

  it("with top_k = 1 (or temperature 0) is the argmax of the model's logits, step by step", function()
    local got = model:generate(prompt, 12, { top_k = 1 })
    local ids = {}
    for i, t in ipairs(prompt) do ids[i] = t end
    local want = {}
    for step = 1, 12 do
      local window = {}
      for i = math.max(1, #ids - S + 1), #ids do window[#window + 1] = ids[i] end
      want[step] = ranked(last_logits(model, window))[1]
      ids[#ids + 1] = want[step]
    end
    assert.are.same(want, got)
    assert.are.same(want, model:generate(prompt, 12, { temperature = 0, seed = 9 }))
  end)

  it("draws only among the top_k likeliest tokens", function()
    local k = 3
    local got = model:generate(prompt, 20, { top_k = k, temperature = 20, seed = support.int(0, 1000) })
    local ids = {}
    for i, t in ipairs(prompt) do ids[i] = t end
    local outside_top1 = 0
    for step = 1, 20 do
      local window = {}
      for i = math.max(1, #ids - S + 1), #ids do window[#window + 1] = ids[i] end
      local order = ranked(last_logits(model, window))
      local rank
      for r = 1, V do if order[r] == got[step] then rank = r end end
      assert.is_true(rank <= k, ("step %d: token %d has rank %d"):format(step, got[step], rank))
      if rank > 1 then outside_top1 = outside_top1 + 1 end
      ids[#ids + 1] = got[step]
    end
    -- at temperature 20 among three tokens, twenty draws that are all the argmax are a ~1e-7 event
    assert.is_true(outside_top1 > 0, "every draw was the argmax: sampling is not sampling")
  end)

  it("gives n tokens, the same for a seed and other ones for another seed", function()
    local a, ids = model:generate("int main(", 40, { seed = 3 })
    assert.are.equal("string", type(a))
    assert.are.equal(40, #a)
    assert.are.equal(40, #ids)
    for i = 1, 40 do assert.are.equal(a:byte(i), ids[i]) end
    assert.are.equal(a, (model:generate("int main(", 40, { seed = 3 })))
    assert.are_not.equal(a, (model:generate("int main(", 40, { seed = 4 })))
    assert.are.equal("", (model:generate("x", 0)))
    assert.are.equal(7, #model:generate({ 1, 2, 3 }, 7, { top_k = 5, temperature = 0.5 }))
  end)

  it("raises errors naming the bad argument", function()
    local function fails(pattern, f)
      local ok, err = pcall(f)
      assert.is_false(ok, "no error; expected " .. pattern)
      assert.is_truthy(tostring(err):find(pattern, 1, true), tostring(err))
    end
    fails("prompt must not be empty", function() model:generate("", 3) end)
    fails("prompt must be a string or a list of token ids, got number", function() model:generate(5, 3) end)
    fails("prompt[2] must be a token id in [0, 256), got 300", function() model:generate({ 1, 300 }, 3) end)
    fails("n must be an integer >= 0, got -1", function() model:generate("a", -1) end)
    fails("n must be an integer >= 0, got 1.5", function() model:generate("a", 1.5) end)
    fails("option 'top_k' must be an integer in [1, 256], got 0", function() model:generate("a", 1, { top_k = 0 }) end)
    fails("option 'temperature' must be a finite number >= 0", function() model:generate("a", 1, { temperature = -1 }) end)
    fails("option 'seed' must be an integer >= 0, got -2", function() model:generate("a", 1, { seed = -2 }) end)
    fails("unknown option 'topk'", function() model:generate("a", 1, { topk = 3 }) end)
    fails("self must be a model", function() model.generate({}, "a", 1) end)
    local headless = l2l.Sequential{ l2l.Embedding{ vocab = V, dim = D, max_seq = S },
                                     l2l.Block{ dim = D, heads = 4, causal = true } }
    fails("the last layer must be an LMHead (it is layer 2, block)", function() headless:generate("a", 1) end)
    local wide = l2l.Sequential{ l2l.Embedding{ vocab = 300, dim = D, max_seq = S },
                                 l2l.LMHead{ vocab = 300, dim = D, tie = true } }
    fails("a string prompt needs a byte-level model", function() wide:generate("a", 1) end)
    assert.are.equal(2, #wide:generate({ 299 }, 2))
  end)

  it("runs between relay steps without changing the training", function()
    local function batch(step)
      local B = 4
      local tok, tgt = l2l.zeros({ B, S }, { dtype = "i32" }), l2l.zeros({ B, S }, { dtype = "i32" })
      for b = 1, B do
        for s = 1, S do
          local t = (step * 7 + b * 3 + s) % 50
          tok:set(b, s, t)
          tgt:set(b, s, (t + 1) % 50)
        end
      end
      return tok, tgt
    end
    local seed = support.int(1, 10000)
    local runs, losses = {}, {}
    for r = 1, 2 do
      local m = new_model(seed)
      runs[r] = { model = m, relay = l2l.Relay{ model = m, micro_batch = 2, stash = "host",
                                                optimizer = l2l.AdamW{ lr = 1e-2 } } }
      losses[r] = {}
    end
    for step = 1, 5 do
      for r = 1, 2 do
        losses[r][step] = runs[r].relay:step(batch(step))
        if r == 1 and step == 2 then
          runs[r].relay:sync()
          local text = runs[r].model:generate("abc", 20, { seed = 1 })
          assert.are.equal(20, #text)
        end
      end
    end
    for step = 1, 5 do
      assert.is_true(math.abs(losses[1][step] - losses[2][step]) <= 1e-6 * math.abs(losses[2][step]),
                     ("step %d: %.9g with generate, %.9g without"):format(step, losses[1][step], losses[2][step]))
    end
    -- it trains (the comparison is not of two idle runs): step 1's batch, before and after
    local after = runs[1].relay:evaluate(batch(1))
    assert.is_true(after < 0.9 * losses[1][1], ("loss on batch 1: %.6g at step 1, %.6g after 5 steps")
                   :format(losses[1][1], after))
    -- after training the generated text follows the weights: equal models, equal text
    for r = 1, 2 do runs[r].relay:sync() end
    assert.are.equal(runs[1].model:generate("abc", 20, { seed = 2 }), runs[2].model:generate("abc", 20, { seed = 2 }))
    for r = 1, 2 do runs[r].relay:free() end
  end)
end)

describe("l2l.progress and l2l.plot", function()
  local progress, plot = require("l2l.progress"), require("l2l.plot")

  -- An output stream that keeps what is written.
  local function sink()
    local parts = {}
    return { write = function(self, ...) for _, s in ipairs({ ... }) do parts[#parts + 1] = s end end,
             flush = function() end, text = function() return table.concat(parts) end }
  end

  it("updates one line on a terminal and prints plain lines elsewhere", function()
    local tty, plain = sink(), sink()
    local a = progress.new{ total = 20, every = 5, tty = true, out = tty, width = 200 }
    local b = progress.new{ total = 20, every = 5, tty = false, out = plain }
    for step = 1, 20 do
      local f = { loss = 3 - step / 10, tokens_per_s = 1500, device_peak = 3 * 2 ^ 20, host = 5 * 2 ^ 30 }
      a:update(step, f)
      b:update(step, f)
    end
    a:finish()
    b:finish()
    local t, p = tty.text(), plain.text()
    local _, redraws = t:gsub("\r", "")
    assert.are.equal(20, redraws)
    assert.is_truthy(t:find("\27[K", 1, true))
    assert.is_truthy(t:find("step 20/20  loss 1.000  1.50k tok/s  dev peak 3.00 MiB  host 5.00 GiB  took ", 1, true), t)
    assert.is_falsy(p:find("[\r\27]"), p)
    local steps = {}
    for s in p:gmatch("step%s+(%d+)/20") do steps[#steps + 1] = tonumber(s) end
    assert.are.same({ 1, 5, 10, 15, 20 }, steps)
    assert.is_truthy(p:find("step  5/20  loss 2.500  1.50k tok/s  dev peak 3.00 MiB  host 5.00 GiB  ETA ", 1, true), p)
  end)

  -- What a terminal shows of `text`: lines, each after its carriage returns and
  -- clear-to-end-of-line sequences took effect.
  local function screen(text)
    local shown = {}
    for row in (text .. "\n"):gmatch("(.-)\n") do
      local line = ""
      for part in (row .. "\r"):gmatch("(.-)\r") do   -- each \r starts over at column 0
        local before, after = part:match("^(.-)\27%[K(.*)$")
        if before then line = before .. after   -- written, the rest of the line cleared
        else line = part .. line:sub(#part + 1) end
      end
      shown[#shown + 1] = line
    end
    return shown
  end

  it("fits the terminal's width, leaving out the fields kept least first", function()
    local f = { loss = 2.5, val_loss = 2.4, tokens_per_s = 151234, device_peak = 3 * 2 ^ 20,
                device_budget = 5 * 2 ^ 20, host = 5 * 2 ^ 30, disk = 7 * 2 ^ 20 }
    local full = progress.new{ total = 1000, tty = false, out = sink() }:line(123, f)
    local order = { "%d ranks", "disk ", "host ", "dev peak ", "tok/s", "val ", "loss " }
    for _, width in ipairs { 40, 60, 80, support.int(41, 160), 200 } do
      local out = sink()
      local bar = progress.new{ total = 1000, every = 5, tty = true, out = out, width = width, ranks = 2 }
      bar:update(123, f)
      local shown = screen(out.text())[1]
      assert.is_true(#shown <= width - 1, ("%d columns: %q"):format(width, shown))
      assert.is_truthy(shown:find("^step  123/1000"), shown)
      assert.is_truthy(shown:find("ETA ", 1, true), shown)
      -- what is left out comes first in the order: once a field shows, every field kept
      -- longer shows too
      local kept = false
      for _, field in ipairs(order) do
        local here = shown:find(field) ~= nil
        assert.is_false(kept and not here, ("%d columns: %q leaves out %s, kept longer than one it shows")
                        :format(width, shown, field))
        kept = kept or here
      end
      if width == 200 then assert.is_truthy(shown:find("2 ranks  loss 2.500  val 2.400", 1, true), shown) end
    end
    assert.is_truthy(full:find("disk 7.00 MiB/step", 1, true), full)   -- plain lines keep every field
  end)

  it("shows a step once when its line was printed and then drawn", function()
    local out = sink()
    local bar = progress.new{ total = 100, every = 5, tty = true, out = out, width = 200 }
    local f = { loss = 2.5, tokens_per_s = 1500, device_peak = 3 * 2 ^ 20, host = 5 * 2 ^ 30 }
    for step = 1, 7 do
      if step == 7 then bar:print(bar:line(step, f)) end   -- the stop step's evaluation line
      bar:update(step, f)
    end
    bar:finish()
    local count = 0
    for _, line in ipairs(screen(out.text())) do
      if line:find("step%s+7/100") then count = count + 1 end
    end
    assert.are.equal(1, count, out.text())
    -- an updating line that is not a repeat stays, ended by a newline
    out = sink()
    bar = progress.new{ total = 100, every = 5, tty = true, out = out, width = 200 }
    bar:update(3, f)
    bar:finish()
    assert.is_truthy(out.text():find("step%s+3/100.*\n$"), out.text())
  end)

  it("writes human units", function()
    assert.are.equal("512 B", progress.bytes(512))
    assert.are.equal("1.50 KiB", progress.bytes(1536))
    assert.are.equal("30.5 MiB", progress.bytes(3.2e7))
    assert.are.equal("999", progress.count(999))
    assert.are.equal("12.3k", progress.count(12345))
    assert.are.equal("4.20M", progress.count(4.2e6))
    assert.are.equal("7.3s", progress.duration(7.3))
    assert.are.equal("1m35s", progress.duration(95))
    assert.are.equal("2h01m", progress.duration(7300))
    assert.has_error(function() progress.new{ every = 5 } end, "progress.new: option 'total' is required")
  end)

  it("writes a metrics line with a NaN or infinite loss as what it is, and reads it back", function()
    local recs = { { step = 1, loss = 2.5, val_loss = 2.6, run = "inf" },   -- a run id is text, whatever it says
                   { step = 2, loss = 0 / 0, val_loss = math.huge, lr = -math.huge, run = "inf" },
                   { step = 3, loss = 1.5, run = "inf" } }
    local text = {}
    for i, r in ipairs(recs) do text[i] = plot.metrics_line(r) end
    assert.is_truthy(text[2]:find('"loss":"nan"', 1, true), text[2])
    assert.is_truthy(text[2]:find('"val_loss":"inf"', 1, true) and text[2]:find('"lr":"-inf"', 1, true), text[2])
    local path = os.tmpname()
    support.write_file(path, table.concat(text, "\n") .. "\n")
    local back = plot.read_metrics(path)
    os.remove(path)
    assert.is_true(back[2].loss ~= back[2].loss, "NaN comes back as NaN")
    assert.are.equal(math.huge, back[2].val_loss)
    assert.are.equal(-math.huge, back[2].lr)
    assert.are.equal("inf", back[2].run)
    assert.are.equal(2.5, back[1].loss)
    -- the curves leave the step out rather than fail
    local fig = plot.metrics_figure(back, { title = "diverged" })
    assert.is_truthy(plot.svg(fig):find("</svg>", 1, true))
    -- a binary file (a checkpoint given for its metrics) is named as not a log
    support.write_file(path, "\24\0\0\0\0\0\0\0{\"a\":{\"dtype\":\"F32\"}}\n")
    local ok, err = pcall(plot.read_metrics, path)
    os.remove(path)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find(path .. " is not a metrics log (JSON lines, as a run's metrics.jsonl): line 1 is not text", 1, true), err)
  end)

  it("chooses nice axis ticks and escapes text in the SVG", function()
    assert.are.same({ 0, 40, 5 }, { plot.axis(0, 40, 8) })
    local lo, hi, step = plot.axis(1.36, 3, 5)
    assert.is_true(math.abs(lo - 1.2) < 1e-9 and math.abs(hi - 3) < 1e-9 and math.abs(step - 0.2) < 1e-9)
    local svg = plot.svg{ title = "a < b & c", panels = {
      { title = "p", series = { { name = "s", x = { 1, 2, 3 }, y = { 1, 0 / 0, 2 } } } } } }
    assert.is_truthy(svg:find("a &lt; b &amp; c", 1, true))
    assert.is_falsy(svg:find("nan", 1, true))   -- a NaN point is left out, not drawn
    local pts = svg:match('<polyline [^>]*points="([^"]*)"')
    local _, n = pts:gsub(",", "")
    assert.are.equal(2, n)
    assert.has_error(function() plot.svg{ panels = { { series = { { x = { 1 }, y = {} } } } } } end,
      "plot.svg: figure.panels[1].series[1]: x has 1 values but y has 0")
  end)

  it("writes a PNG through gnuplot when it is installed", function()
    if not plot.have_gnuplot() then
      pending("gnuplot is not installed (the SVG path is checked above)")
      return
    end
    local base = os.tmpname()
    local path, format = plot.write(base, { panels = { { series = { { name = "s", x = { 1, 2 }, y = { 3, 4 } } } } } },
                                    { format = "png" })
    local f = io.open(path, "rb")
    local head = f and f:read(8)
    if f then f:close() end
    os.remove(path)
    os.remove(base)
    assert.are.equal("png", format)
    assert.are.equal("\137PNG\r\n\26\n", head)
  end)
end)
