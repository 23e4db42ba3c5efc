-- SPDX-License-Identifier: MIT
-- train_spec — `l2l train`: the training program (examples/train_gpt.lua) as a
-- command of the executable, with a flag for every option of the option table
-- (src/core/options.def) that reaches the relay it makes, and --dry-run, which prints the
-- planner's figures and trains nothing. Each runs the command as a user runs it, a
-- subprocess, in a tiny configuration.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local options = require("l2l.relay_options")

local sh = support.sh
local exe = support.build .. "/l2l"
local TINY = "--layers 1 --dim 32 --heads 2 --seq 16 --batch 4 --micro-batch 2 --eval-every 2 " ..
             "--eval-batches 1 --max-bytes 20000 --plot none --sample 0"

local q = support.q
local function train(flags) return sh(("env -u L2L_PROGRESS %s train %s %s"):format(exe, TINY, flags)) end

describe("l2l train", function()
  local dir
  before_each(function() dir = support.tmpdir() end)
  after_each(function() sh("rm -rf " .. q(dir)) end)

  it("has a flag for every option of the relay, its optimizer and its schedule", function()
    local status, help = sh(exe .. " train --help")
    assert.are.equal(0, status, help)
    assert.is_truthy(help:find("Usage: l2l train", 1, true), help)
    for _, row in ipairs(options.ROWS) do
      -- (the schedule's total is the run's update count, from --steps and --accumulate)
      if row.name ~= "total" then
        local flag = "--" .. row.name:gsub("_", "-")
        assert.is_truthy(help:find(flag:gsub("%-", "%%-") .. "[%s,%]]"), flag .. " is not in `l2l train --help`")
      end
    end
  end)

  it("says in --help the default of each relay flag, which a run given none of them gets", function()
    local status, help = sh(exe .. " train --help")
    assert.are.equal(0, status, help)
    help = help:gsub("%s+", " ")
    local ck = dir .. "/defaults.ckpt"
    local out
    status, out = train(("--steps 1 --checkpoint %s --out %s"):format(q(ck), q(dir .. "/o")))
    assert.are.equal(0, status, out)
    local run = l2l.load(ck)
    local s = run.options
    run:free()
    local compared = 0
    for _, row in ipairs(options.ROWS) do
      local said = help:match(("%%(l2l%%.Relay's %s; default: ([^)]*)%%)"):format(row.name))
      if row.group == "relay" and said and row.name ~= "precision" and row.name ~= "placement" then
        local got = s[row.name]
        if type(got) == "number" then said = tonumber(said) end
        assert.are.equal(said, got, ("--%s: --help says %s, a run without it has %s"):format(
          (row.name:gsub("_", "-")), tostring(said), tostring(got)))
        compared = compared + 1
      end
    end
    assert.is_true(compared >= 10, "only " .. compared .. " relay flags say their default")
    -- the rules (placement is the loading machine's: l2l.load's, not the run's)
    assert.are.equal(l2l.device().backend == "cpu" and "f32" or "bf16", s.precision)
    assert.is_truthy(help:find("(l2l.Relay's precision; default: bf16 on a GPU or with bf16 masters, else f32)", 1, true), help)
    assert.is_truthy(help:find("(l2l.Relay's placement; default: auto within a device budget, else host)", 1, true), help)
    assert.is_truthy(help:find("--eps <X> AdamW's and LAMB's epsilon (default: " .. ("%.10g"):format(s.optimizer.eps) .. ")", 1, true), help)
  end)

  it("gives the relay, its optimizer and its schedule what the flags say (seed " .. support.seed .. ")", function()
    local ck = dir .. "/run.ckpt"
    local clip, window = support.int(1, 9) / 4, support.int(1, 5000)
    local momentum = support.int(1, 9) / 10
    local status, out = train(("--steps 4 --accumulate 2 --clip-global-norm %g --loss-scale-window %d " ..
                               "--optimizer sgd --momentum %g --nesterov --schedule linear --final-ratio 0.25 " ..
                               "--inner keep --checkpoint %s --out %s"):format(clip, window, momentum, q(ck), q(dir .. "/o")))
    assert.are.equal(0, status, out)
    local run = l2l.load(ck)
    local s = run.options
    assert.are.equal(2, s.accumulate)
    assert.are.equal(clip, s.clip_global_norm)
    assert.are.equal(window, s.loss_scale_window)
    assert.are.equal("keep", s.inner)
    assert.are.equal("sgd", s.optimizer.kind)
    assert.are.equal(tonumber(require("ffi").new("float", momentum)), tonumber(require("ffi").new("float", s.optimizer.momentum)))
    assert.is_true(s.optimizer.nesterov)
    assert.are.equal("linear", s.schedule.kind)
    assert.are.equal(2, s.schedule.total)   -- 4 minibatches, 2 a update
    assert.are.equal(0.25, s.schedule.final_ratio)
    run:free()
  end)

  it("refuses a setting the chosen optimizer has not, and a run's setting given again with --resume", function()
    local status, out = train(("--steps 2 --optimizer sgd --beta1 0.8 --out %s"):format(q(dir .. "/a")))
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find("l2l train: --beta1 is not a setting of sgd", 1, true), out)
    local ck = dir .. "/r.ckpt"
    status, out = train(("--steps 2 --checkpoint %s --out %s"):format(q(ck), q(dir .. "/b")))
    assert.are.equal(0, status, out)
    status, out = train(("--steps 4 --resume --checkpoint %s --clip-layer-norm 1 --out %s"):format(q(ck), q(dir .. "/b")))
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find("--clip-layer-norm: --resume continues the run with the settings it was saved with", 1, true), out)
    -- the machine's settings apply to the loaded run
    status, out = train(("--steps 4 --resume --checkpoint %s --optimizer-threads 1 --out %s"):format(q(ck), q(dir .. "/b")))
    assert.are.equal(0, status, out)
  end)

  it("refuses a --checkpoint it could not write before training, and fails when the last save fails", function()
    -- a folder that does not exist, and a directory as the path (with --force too): refused
    -- before step 1, nothing written
    sh("mkfifo " .. q(dir .. "/fifo"))
    for _, case in ipairs({ { dir .. "/no/such/folder/ck", "cannot write a checkpoint in " .. dir .. "/no/such/folder" },
                            { dir, dir .. " is a directory: --checkpoint names a file" },
                            { dir .. "/fifo", dir .. "/fifo is a FIFO (a named pipe), not a regular file" },
                            { dir .. "/ --force", dir .. "/ is a directory" } }) do
      local status, out = train(("--steps 2 --checkpoint %s --out %s"):format(case[1], q(dir .. "/o")))
      assert.are.equal(2, status, out)
      assert.is_truthy(out:find(case[2], 1, true), out)
      assert.is_falsy(out:find("step 1/", 1, true), out)
    end
    -- --out names a folder: a file there is refused, before anything is written
    local status, out = train(("--steps 1 --out %s"):format(q(dir .. "/fifo")))
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find("--out: " .. dir .. "/fifo is a FIFO (a named pipe), not a regular file: --out names a folder", 1, true), out)
    -- a folder --out makes: a checkpoint in it is written, however either is spelt; the
    -- folder itself as the checkpoint is refused
    local made = dir .. "/made/by/out"
    status, out = train(("--steps 1 --checkpoint %s --out %s"):format(q(made .. "/run.ckpt"), q(made .. "/")))
    assert.are.equal(0, status, out)
    assert.are.equal(1, l2l.checkpoint_info(made .. "/run.ckpt").steps)
    local other = dir .. "/made/again"
    status, out = train(("--steps 1 --checkpoint %s --out %s"):format(q(other .. "/./run.ckpt"),
                                                                      q(dir .. "//made/./again//")))
    assert.are.equal(0, status, out)
    assert.are.equal(1, l2l.checkpoint_info(other .. "/run.ckpt").steps)
    status, out = train(("--steps 1 --checkpoint %s --out %s"):format(q(dir .. "/made/new"), q(dir .. "/made/new")))
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find(dir .. "/made/new is the folder --out makes: --checkpoint names a file", 1, true), out)
    -- a file that is not a checkpoint: --resume cannot continue it, so it is not offered,
    -- and it stays as it was
    local text = dir .. "/notes.txt"
    support.write_file(text, "my notes\n")
    status, out = train(("--steps 2 --checkpoint %s --out %s"):format(q(text), q(dir .. "/o")))
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("is a file that is not a checkpoint l2l reads", 1, true), out)
    assert.is_truthy(out:find("what it holds now is lost", 1, true), out)
    assert.is_falsy(out:find("--resume continues it", 1, true), out)
    assert.are.equal("my notes\n", support.read_file(text))
    -- --force replaces it, saying so (and says whose checkpoint it replaces next time)
    status, out = train(("--steps 1 --force --checkpoint %s --out %s"):format(q(text), q(dir .. "/o")))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("--force: " .. text .. " is not a checkpoint; this run replaces it at its first save", 1, true), out)
    assert.is_truthy(out:find("with 0 warm-up steps", 1, true), out)   -- (--warmup 20: all but the run's last update)
    assert.are.equal(1, l2l.checkpoint_info(text).steps)
    status, out = train(("--steps 1 --force --checkpoint %s --out %s"):format(q(text), q(dir .. "/o")))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("this run replaces the checkpoint of run %x+ at step 1 in " .. text:gsub("%p", "%%%0")), out)
    -- the last save failing (a file size limit stands for a full disk: the checkpoint is
    -- larger than it, the metrics are not) ends the process with a failure, after training
    local limited = dir .. "/limited.ckpt"
    status, out = sh(("ulimit -f 16 && env -u L2L_PROGRESS %s train %s --steps 2 --checkpoint %s --out %s")
                     :format(exe, TINY, q(limited), q(dir .. "/o")))
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("step 2/2", 1, true), out)
    assert.is_truthy(out:find("l2l train: checkpoint not written: run:save: ", 1, true), out)
  end)

  it("names a value the relay refuses by the flag given, status 2", function()
    for _, case in ipairs({ { "--param-slots 1", "l2l train: --param-slots must be 0 (two) or 2 to 4096, got 1" },
                            { "--master bf16 --precision f32", "l2l train: --master bf16 needs precision bf16" } }) do
      local status, out = train(("--steps 1 %s --out %s"):format(case[1], q(dir .. "/o")))
      assert.are.equal(2, status, out)
      assert.is_truthy(out:find(case[2], 1, true), out)
      assert.is_falsy(out:find("step 1/", 1, true), out)
    end
  end)

  it("refuses a model the host cannot hold before making any of it, a dry run too", function()
    -- 8e13 parameters: 600,000 GiB of weights and gradients, on no machine; building it
    -- first would fill the host's memory before the allocation that fails
    for _, dry in ipairs({ "", "--dry-run" }) do
      local status, out = sh(("env -u L2L_PROGRESS %s train --dim 8192 --heads 64 --layers 100000 --steps 1 %s --out %s")
                             :format(exe, dry, q(dir .. "/o")))
      assert.are.equal(2, status, out)
      local params, gib = out:match("l2l train: the model %(%-%-layers 100000, %-%-dim 8192, %-%-mlp 32768%) has (%S+) "
                                    .. "parameters: making it takes (%S+) GiB of host memory")
      -- GPT-2's count: 12 D^2 + 13 D a block, the rest (tables of 256 and --seq rows) far below 0.1 %
      local want = 100000 * (12 * 8192 ^ 2 + 13 * 8192)
      assert.is_true(math.abs(tonumber(params) / want - 1) < 1e-3, out)
      assert.is_true(math.abs(tonumber(gib) - 8 * want / 2 ^ 30) < 0.001 * 8 * want / 2 ^ 30, out)
      assert.is_falsy(out:find("traceback", 1, true), out)
    end
  end)

  it("keeps the last N checkpoints and the best by validation loss, and validates on --val-data", function()
    local ck = dir .. "/k.ckpt"
    local every = support.int(1, 2)
    local status, out = train(("--steps 8 --save-every %d --eval-every %d --keep-last 3 --keep-best " ..
                               "--checkpoint %s --out %s"):format(every, every, q(ck), q(dir .. "/o")))
    assert.are.equal(0, status, out)
    -- the last is the checkpoint (step 8), the two before it the saves just before
    assert.are.equal(8, l2l.checkpoint_info(ck).steps)
    local kept = {}
    local _, listing = sh("ls " .. q(dir))
    for name in listing:gmatch("k%.ckpt%.step(%d+)") do kept[#kept + 1] = tonumber(name) end
    table.sort(kept)
    assert.are.same({ 8 - 2 * every, 8 - every }, kept)
    for _, n in ipairs(kept) do assert.are.equal(n, l2l.checkpoint_info(("%s.step%d"):format(ck, n)).steps) end
    -- the best: the lowest validation loss the metrics hold, at its step
    local best, best_step = math.huge, nil
    for line in support.read_file(dir .. "/o/metrics.jsonl"):gmatch("[^\n]+") do
      local rec = require("cjson").decode(line)
      if type(rec.val_loss) == "number" and rec.step > 0 and rec.val_loss < best then best, best_step = rec.val_loss, rec.step end
    end
    local info = l2l.checkpoint_info(ck .. ".best")
    assert.are.equal(best_step, info.steps)
    assert.is_true(math.abs(info.extra.val_loss - best) <= 1e-12 * math.abs(best), out)
    -- --val-data: the validation text is that file (the summary says so); with --val-fraction, a usage error
    local val_file = dir .. "/val.txt"
    local f = assert(io.open(val_file, "w"))
    for _ = 1, 400 do f:write("abcabcabc ") end
    f:close()
    status, out = train(("--steps 2 --val-data %s --out %s"):format(q(val_file), q(dir .. "/v")))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("MiB of --val-data to validate on", 1, true), out)
    status, out = train(("--steps 2 --val-data %s --val-fraction 0.2 --out %s"):format(q(val_file), q(dir .. "/w")))
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find("give one of them", 1, true), out)
  end)

  it("--dry-run prints the planner's figures for the demo's model and trains nothing", function()
    local out_dir, ck = dir .. "/dry", dir .. "/dry.ckpt"
    local status, out = sh(("env -u L2L_PROGRESS %s train --dry-run --max-bytes 100000 --checkpoint %s --out %s")
                           :format(exe, q(ck), q(out_dir)))
    assert.are.equal(0, status, out)
    local device = tonumber(out:match("dry run: device: a training step needs ([%d.]+) MiB at its peak"))
    local host = tonumber(out:match("dry run: host: the EPS holds ([%d.]+) MiB"))
    local seconds = tonumber(out:match("takes about ([%d.]+) s"))
    assert.is_truthy(device and device > 0, out)
    assert.is_truthy(seconds and seconds > 0, out)
    -- the EPS of the demo's model: its parameters' f32 masters, gradients and AdamW's m and v
    local params = tonumber(out:match("([%d.]+) M parameters")) * 1e6
    assert.is_truthy(host and math.abs(host * 2 ^ 20 - 16 * params) < 0.02 * 16 * params, out)
    assert.is_nil(out:find("step 1/", 1, true), out)
    assert.are.equal(1, select(1, sh("test -e " .. q(out_dir))), "--dry-run made " .. out_dir)
    assert.are.equal(1, select(1, sh("test -e " .. q(ck))), "--dry-run wrote " .. ck)
  end)
end)
