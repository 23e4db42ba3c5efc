-- SPDX-License-Identifier: MIT
-- relay_interrupt_spec — Ctrl-C ends training gracefully (issue 24): the first SIGINT lets the
-- step finish and the example write what it writes at its end (summary, metrics, picture,
-- checkpoint), then the process ends as Ctrl-C ends a program (killed by SIGINT: status
-- 130 from the shell); a second SIGINT stops it at once. SIGTERM (kill, timeout(1), a
-- scheduler) and SIGUSR1 (what mpirun passes on) stop it the same way, and the process ends
-- as that signal ends it; a signal the parent ignores stays ignored (the stop across
-- mpirun's ranks: dist_spec). The processes run as users run
-- them (build/l2l, a subprocess that is the shell's foreground command, so SIGINT is not
-- ignored), and get the signal from a watcher that waits for them to reach a given point;
-- a watchdog kills a process that would not end, so a failure cannot hang the suite. A
-- run with a spill file removes it on the way out (the Lua state closed, its relay freed).
local support = dofile("spec/support.lua")
local cjson = require("cjson")
local l2l = require("l2l")

local exe = support.build_dir .. "/l2l"

local function tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(os.execute("mkdir -p " .. path) == 0)
  return path
end

-- Runs `command` (exec'ed by a shell script, so that $$ is its pid) while a watcher sends a
-- signal once `file` holds a line matching `pattern` (grep -E), for each pattern of the list
-- in turn (SIGINT, or signals[i]: "TERM", "USR1"), as long as the command runs (none when
-- the line does not come within a minute); a watchdog sends SIGKILL a minute after the
-- last. `ignored`: a stop signal the command starts with ignored.
-- Returns the exit status and the output.
local function interrupted(command, file, patterns, signals, ignored)
  local steps = {}
  for i, p in ipairs(patterns) do
    steps[#steps + 1] = ("n=0; until grep -qE '%s' '%s' 2>/dev/null || ! kill -0 $$ 2>/dev/null || [ $n -ge 1200 ]; " ..
                         "do sleep 0.05; n=$((n+1)); done; grep -qE '%s' '%s' 2>/dev/null && kill -%s $$ 2>/dev/null"):format(
                         p, file, p, file, signals and signals[i] or "INT")
  end
  local watcher = table.concat(steps, "; ") ..
                  "; n=0; while kill -0 $$ 2>/dev/null && [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done; " ..
                  "kill -KILL $$ 2>/dev/null"
  -- a script of its own: $$ in a command support.sh runs would be the outer shell's pid.
  -- env --default-signal: a suite started in the background (`make test &`, nohup) hands
  -- its processes SIGINT ignored (and a parent may ignore the others), which l2l rightly
  -- keeps ignored, as a background job's; a Ctrl-C typed at a terminal reaches a foreground
  -- program whatever started it.
  local defaults = {}
  for _, name in ipairs({ "INT", "TERM", "USR1" }) do
    if name ~= ignored then defaults[#defaults + 1] = name end
  end
  local env = ("--default-signal=%s%s"):format(table.concat(defaults, ","), ignored and " --ignore-signal=" .. ignored or "")
  local script = support.write_temp(("(%s) >/dev/null 2>&1 &\nexec env %s %s\n"):format(watcher, env, command))
  -- (inside a shell of its own, whose "Terminated" for a process SIGTERM killed is output)
  local status, out = support.sh(("sh -c 'sh %s; exit $?' 2>&1"):format(script))
  os.remove(script)
  return status, out
end

describe("Ctrl-C during examples/train_gpt.lua", function()
  local dir = tmpdir()
  local ckpt = dir .. "/run.safetensors"
  local status, out, context
  setup(function()
    local command = ("%s examples/train_gpt.lua --steps 100000 --layers 1 --dim 32 --heads 2 --seq 32 --batch 8 " ..
                     "--micro-batch 4 --eval-every 1000 --eval-batches 2 --max-bytes 100000 --plot svg --sample 50 " ..
                     "--seed %d --out %s --checkpoint %s"):format(exe, support.seed % 1000 + 1, dir, ckpt)
    -- the first SIGINT once step 3's line is in the metrics log
    status, out = interrupted(command, dir .. "/metrics.jsonl", { '"step":3,' })
    context = ("seed %d, output:\n%s"):format(support.seed, out)
  end)
  teardown(function() os.execute("rm -rf " .. dir) end)

  it("finishes the step, then ends as Ctrl-C ends a program (status 130)", function()
    assert.are.equal(130, status, context)
    assert.is_truthy(out:find("train_gpt: Ctrl-C: stopping after this step (Ctrl-C again stops at once)", 1, true), context)
  end)

  it("prints the summary for the steps it did", function()
    local stopped = tonumber(out:match("\nstopped at step (%d+) of 100000 %(Ctrl%-C%)\n"))
    assert.is_truthy(stopped, context)
    assert.is_true(stopped >= 3, context)
    assert.are.equal(stopped, tonumber(out:match("\ndone: (%d+) steps")), context)
    assert.is_truthy(out:find("\nloss: train [%d.]+, validation [%d.]+"), context)
    assert.is_truthy(out:find("\nsample: none (stopped by Ctrl-C)", 1, true), context)
    -- the plain progress lines end with the step it stopped at
    assert.is_truthy(out:find(("\nstep%%s+%d/100000  loss "):format(stopped)), context)
  end)

  it("writes the metrics up to that step, with its validation loss, and the picture", function()
    local stopped = tonumber(out:match("stopped at step (%d+) of"))
    assert.is_truthy(stopped, context)
    local last
    for line in io.lines(dir .. "/metrics.jsonl") do last = cjson.decode(line) end
    assert.is_truthy(last, context)
    assert.are.equal(stopped, last.step, context)
    assert.is_number(last.val_loss, context)
    assert.is_truthy(out:find("picture: " .. dir .. "/curves.svg", 1, true), context)
    local svg = support.read_file(dir .. "/curves.svg")
    assert.is_truthy(svg and svg:find("</svg>", 1, true), "no picture")
  end)

  it("saves a checkpoint that loads at that step", function()
    local stopped = tonumber(out:match("stopped at step (%d+) of"))
    assert.is_truthy(stopped, context)
    assert.is_truthy(out:find(("checkpoint: %s (step %d): --resume continues from it"):format(ckpt, stopped), 1, true), context)
    local budget = l2l.pool_stats("device").budget
    local run = l2l.load(ckpt)
    assert.are.equal(budget, l2l.pool_stats("device").budget, "loading a run set the process's device budget")
    assert.are.equal(stopped, run:stats().steps)
    run:free()
  end)
end)

describe("SIGTERM during examples/train_gpt.lua's sample", function()
  -- Once the run is written (metrics, checkpoint), a stop signal ends the process at once:
  -- the sample is not waited for (here it would take minutes).
  it("ends the process at once, the checkpoint written", function()
    local dir = tmpdir()
    local ckpt = dir .. "/run.safetensors"
    local log = dir .. "/out.txt"
    local command = ("%s examples/train_gpt.lua --steps 2 --layers 1 --dim 32 --heads 2 --seq 32 --batch 4 " ..
                     "--eval-batches 1 --max-bytes 100000 --plot none --sample 100000000 --out %s --checkpoint %s > %s"):format(
                     exe, dir, ckpt, log)
    -- (once the sample's first line is out: the signals were let go before it)
    local status, err = interrupted(command, log, { "^sample \\(temperature" }, { "TERM" })
    local out = support.read_file(log) or ""
    os.execute("rm -rf " .. dir)
    local context = ("status %s, output:\n%s%s"):format(tostring(status), out, err)
    assert.are.equal(143, status, context)
    assert.is_truthy(out:find(("checkpoint: %s (step 2)\n"):format(ckpt), 1, true), context)
    assert.is_falsy(err:find("stopping after this step", 1, true), context)
  end)
end)

describe("SIGTERM during examples/grow_depth.lua, its output a file", function()
  -- (the watcher sends it once the first step's line is in the file: standard output is
  -- line-buffered, cli.parse)
  it("stops after the step, says so, and ends as SIGTERM ends a program", function()
    local log = os.tmpname()
    local status, err = interrupted(("%s examples/grow_depth.lua --steps 100000 --max-bytes 100000 > %s"):format(exe, log),
                                    log, { "^step +1 " }, { "TERM" })
    local out = support.read_file(log) or ""
    os.remove(log)
    local context = ("status %s, output:\n%s%s"):format(tostring(status), out, err)
    assert.are.equal(143, status, context)
    assert.is_truthy(out:find("\nstopped at step %d+ of 100000 %(SIGTERM%)\n"), context)
    assert.is_truthy(err:find("grow_depth: SIGTERM: stopping after this step", 1, true), context)
  end)
end)

describe("Ctrl-C during training with a spill file", function()
  -- The first Ctrl-C ends the script after its step as Ctrl-C ends a program (status 130);
  -- on the way the Lua state is closed, as at a script's end, so the relay is freed and
  -- its spill file removed (issue 47: the stop path raised SIGINT at once and left it).
  it("ends with status 130 and leaves no spill file", function()
    local dir = tmpdir()
    local log = os.tmpname()
    local script = support.write_temp(([[
      local l2l = require("l2l")
      local cli = require("l2l.cli")
      local m = l2l.Sequential { l2l.Embedding { vocab = 64, dim = 32, max_seq = 8, seed = %d },
                                 l2l.Block { dim = 32, heads = 4, causal = true, seed = 2 },
                                 l2l.LMHead { vocab = 64, dim = 32, seed = 3 } }
      local run = l2l.Relay { model = m, optimizer = l2l.AdamW { lr = 1e-3 }, spill = %q }
      local t = l2l.zeros({ 2, 8 }, { dtype = "i32" })
      local stop = cli.interrupt()
      for step = 1, 100000 do
        run:step(t, t)
        run:sync()
        print("spill file bytes " .. run:stats().spill_file_bytes)
        print("step " .. step)
        io.stdout:flush()
        if stop:requested() then break end
      end
      stop:finish()
      print("not reached after a Ctrl-C")
    ]]):format(support.seed % 1000 + 1, dir))
    local status, err = interrupted(("%s %s > %s"):format(exe, script, log), log, { "^step 3$" })
    local out = support.read_file(log) or ""
    local _, left = support.sh("ls -A " .. dir)
    os.remove(script)
    os.remove(log)
    os.execute("rm -rf " .. dir)
    local context = ("seed %d, status %s, output:\n%s%s"):format(support.seed, tostring(status), out, err)
    assert.are.equal(130, status, context)
    assert.is_truthy(out:find("\nstep 3\n"), context)
    assert.is_falsy(out:find("not reached", 1, true), context)
    assert.is_true((tonumber(out:match("spill file bytes (%d+)")) or 0) > 0, "nothing spilled: " .. context)
    assert.are.equal("", left, "the spill directory after Ctrl-C holds: " .. left .. "\n" .. context)
  end)
end)

describe("cli.interrupt", function()
  -- A loop of 50 ms steps, then `after` seconds of work at its end, as an example has.
  local script = support.write_temp([[
    local cli = require("l2l.cli")
    local progress = require("l2l.progress")
    local opt = cli.parse(cli.parser { name = "slow", flags = { { "--after", 1, "number", "seconds of work at the end" } } })
    local function busy(s) local t = progress.now() while progress.now() - t < s do end end
    local stop = cli.interrupt()
    for step = 1, 10000 do
      busy(0.05)
      print("step " .. step)
      io.stdout:flush()
      if stop:requested() then break end
    end
    print("saving")
    io.stdout:flush()
    busy(opt.after)
    print("saved")
    stop:finish()
    print("not reached after a Ctrl-C")
  ]])
  teardown(function() os.remove(script) end)

  it("lets the loop end and the work after it run on the first Ctrl-C", function()
    local log = os.tmpname()
    local status, err = interrupted(("%s %s --after 0.3 > %s"):format(exe, script, log), log, { "^step 3$" })
    local out = support.read_file(log)
    os.remove(log)
    assert.are.equal(130, status, out .. err)
    assert.is_truthy(out:find("\nsaving\nsaved\n$"), out)
    assert.is_truthy(err:find("slow: Ctrl-C: stopping after this step", 1, true), err)
  end)

  it("stops at once on the second Ctrl-C", function()
    local log = os.tmpname()
    local status, err = interrupted(("%s %s --after 30 > %s"):format(exe, script, log), log, { "^step 3$", "^saving$" })
    local out = support.read_file(log)
    os.remove(log)
    assert.are.equal(130, status, out .. err)
    assert.is_truthy(out:find("\nsaving\n$"), out)   -- the 30 s of work were cut short: no "saved"
  end)

  for _, sig in ipairs({ { "TERM", "SIGTERM" }, { "USR1", "SIGUSR1" } }) do
    it(("stops the loop on %s as on Ctrl-C, and ends as %s ends a program"):format(sig[2], sig[2]), function()
      local log = os.tmpname()
      local status, err = interrupted(("%s %s --after 0.3 > %s"):format(exe, script, log), log, { "^step 3$" }, { sig[1] })
      local out = support.read_file(log)
      os.remove(log)
      assert.are.equal(support.killed_by(sig[1]), status, out .. err)
      assert.is_truthy(out:find("\nsaving\nsaved\n$"), out)
      assert.is_truthy(err:find(("slow: %s: stopping after this step (a second signal stops at once)"):format(sig[2]), 1, true),
                       err)
    end)
  end

  it("stops at once on a second signal of another kind (SIGTERM, then Ctrl-C)", function()
    local log = os.tmpname()
    local status, err = interrupted(("%s %s --after 30 > %s"):format(exe, script, log), log, { "^step 3$", "^saving$" },
                                    { "TERM", "INT" })
    local out = support.read_file(log)
    os.remove(log)
    assert.are.equal(130, status, out .. err)
    assert.is_truthy(out:find("\nsaving\n$"), out)
  end)

  it("leaves a signal the parent ignores ignored (SIGTERM), and still stops on Ctrl-C", function()
    local log = os.tmpname()
    local status, err = interrupted(("%s %s --after 0.3 > %s"):format(exe, script, log), log, { "^step 3$", "^step 6$" },
                                    { "TERM", "INT" }, "TERM")
    local out = support.read_file(log)
    os.remove(log)
    assert.are.equal(130, status, out .. err)
    assert.is_truthy(out:find("\nstep 6\n"), out)   -- SIGTERM at step 3 stopped nothing
    assert.is_falsy(err:find("SIGTERM", 1, true), err)
    assert.is_truthy(out:find("\nsaving\nsaved\n$"), out)
  end)

  it("answers false until a Ctrl-C comes, and lets go of Ctrl-C on finish", function()
    local stop = require("l2l.cli").interrupt("a message")
    assert.is_false(stop:requested())
    assert.is_nil(stop:signal())
    stop:finish()   -- nothing was requested: returns
    stop:release()  -- twice: harmless
  end)
end)
