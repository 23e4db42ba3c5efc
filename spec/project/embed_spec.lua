-- SPDX-License-Identifier: MIT
-- embed_spec — the embedding examples users copy: build/embed (a byte-level GPT trained
-- with the C API alone, examples/embed.c), build/resume (a run saved, freed and resumed
-- from its file with the C API alone, examples/resume.c) and build/embed_lua (a C program
-- that embeds LuaJIT and runs an l2l training script, examples/embed_lua.c). Each run
-- takes a few seconds; losses are read back from what the programs print.
local l2l = require("l2l")
local support = dofile("spec/support.lua")
local sh = support.sh
local sanitized = os.getenv("L2L_SANITIZE") == "1"
-- Absolute, so that a program can run from another directory.
local build = support.build_dir

local write_temp = support.write_temp

-- The {step, loss, text} of every "step N  loss X" line, in order.
local function step_losses(out)
  local list = {}
  for step, loss in out:gmatch("step%s+(%d+)%s+loss ([%d%.]+)") do
    list[#list + 1] = { step = tonumber(step), loss = tonumber(loss), text = loss }
  end
  return list
end

describe("examples/embed.c (the C API alone)", function()
  local exe = build .. "/embed"

  -- The losses of a run of `steps`: printed at step 1, every 15 and the last step; the
  -- first about ln 256 = 5.5 (a uniform guess over bytes), the last below `below`.
  local function check_training(out, steps, below, prompt)
    local losses = step_losses(out)
    assert.are.equal(1 + math.ceil(steps / 15), #losses, out)
    assert.are.equal(1, losses[1].step, out)
    assert.are.equal(steps, losses[#losses].step, out)
    local first, last = losses[1].loss, losses[#losses].loss
    assert.is_true(first > 4.5 and first < 7, out)
    assert.is_true(last < below, out)
    assert.is_truthy(out:find(("\nloss %.3f -> %.3f\n"):format(first, last), 1, true), out)
    assert.is_truthy(out:find('continuation: "' .. prompt, 1, true), out)
  end

  it("trains on its built-in text: the loss falls from about ln 256 to under 1", function()
    -- A sanitized build runs about 15 times slower: fewer steps, a looser bound.
    local steps, below = 150, 1
    if sanitized then steps, below = 30, 3.5 end
    local status, out = sh(("%s %d"):format(exe, steps))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find(("on 376 bytes of built-in text, %d steps\n"):format(steps), 1, true), out)
    check_training(out, steps, below, "It is a truth")
  end)

  it("trains on a file given on the command line, and refuses one too short", function()
    local text = ("Twinkle, twinkle, little star, how I wonder what you are! "):rep(8)
    local path = write_temp(text)
    local status, out = sh(("%s 40 %s"):format(exe, path))
    os.remove(path)
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find(("on %d bytes of %s, 40 steps\n"):format(#text, path), 1, true), out)
    check_training(out, 40, 1, "Twinkle, twi")

    path = write_temp("too short")
    status, out = sh(("%s 40 %s"):format(exe, path))
    os.remove(path)
    assert.are.equal(1, status, out)
    assert.are.equal(("embed: cannot read at least 34 bytes from %s\n"):format(path), out)
    status, out = sh(exe .. " 40 /nonexistent/text")
    assert.are.equal(1, status, out)
    assert.are.equal("embed: cannot read at least 34 bytes from /nonexistent/text\n", out)
  end)

  it("trains a run no longer than its warm-up, and prints its usage for bad arguments", function()
    -- 1 to 10 steps: the warm-up takes all but the last (the relay refuses a cosine
    -- schedule no longer than its warm-up)
    local steps = support.int(1, 10)
    local status, out = sh(("%s %d"):format(exe, steps))
    assert.are.equal(0, status, out)
    local losses = step_losses(out)
    assert.are.equal(steps, losses[#losses].step, out)
    assert.is_truthy(out:find('\ncontinuation: "It is a trut', 1, true), out)   -- (the prompt)
    for _, args in ipairs({ "0", "ten", "10 file extra" }) do
      status, out = sh(exe .. " " .. args)
      assert.are.equal(2, status, args .. ": " .. out)
      assert.is_truthy(out:find("^usage: %S+ %[steps %[file%]%]"), args .. ": " .. out)
    end
  end)
end)

describe("examples/resume.c (save, load and resume with the C API alone)", function()
  local exe = build .. "/resume"

  it("resumes to the bit: every loss after the load is the uninterrupted run's, and the file is the front end's", function()
    local steps = support.int(4, 14)
    local at = support.int(1, steps - 1)
    local dir = support.tmpdir()
    local path = dir .. "/run.safetensors"
    local status, out = sh(("%s %s %d %d"):format(exe, path, steps, at))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find(("saved after step %d to %s\nloaded: %d steps done\n"):format(at, path, at), 1, true), out)
    local lines = 0
    for step, a, kind, b in out:gmatch("step%s+(%d+)%s+loss (%S+)%s+(%a+[%a ]*) (%S+)\n") do
      lines = lines + 1
      assert.are.equal(lines, tonumber(step), out)
      assert.are.equal(tonumber(step) <= at and "before the save" or "resumed", kind, out)
      assert.are.equal(a, b, out)   -- 17 digits: the same double
    end
    assert.are.equal(steps, lines, out)
    assert.is_truthy(out:find(("\n%d of %d losses equal to the bit\n$"):format(steps, steps)), out)
    -- the front end reads what C wrote
    local info = l2l.checkpoint_info(path)
    assert.are.equal(at, info.steps)
    assert.are.same({ saved_at = at }, info.extra)
    -- a file at the path is not replaced without leave
    local before = support.read_file(path)
    status, out = sh(("%s %s %d %d"):format(exe, path, steps, at))
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("resume: saving: l2l_relay_save: " .. path .. " exists already: nothing was written", 1, true), out)
    assert.are.equal(before, support.read_file(path))
    os.remove(path)
    os.remove(dir)
    status, out = sh(exe)
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find("^usage: %S+ FILE %[steps %[save_at%]%]"), out)
  end)
end)

describe("examples/embed_lua.c (LuaJIT embedded in C)", function()
  local exe = build .. "/embed_lua"

  it("runs its script with libl2l linked in, from any directory: the loss falls and the "
     .. "steps go in and come back out", function()
    local steps = support.int(41, 79)   -- not a default the program could print by itself
    -- From /tmp without L2L_LUA_DIR: require("l2l") must use the compiled-in folder.
    local status, out = sh(("cd /tmp && env -u L2L_LUA_DIR %s %d"):format(exe, steps))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find(("library (linked in), %d steps\n"):format(steps), 1, true), out)
    local losses = step_losses(out)
    assert.is_true(#losses >= 3, out)
    assert.are.equal(1, losses[1].step, out)
    assert.are.equal(steps, losses[#losses].step, out)
    -- Counting modulo 16: from about ln 16 = 2.8 to nearly certain.
    local first, last = losses[1].loss, losses[#losses].loss
    assert.is_true(first > 2 and first < 4, out)
    assert.is_true(last < 0.2, out)
    -- What C read off the Lua stack: the steps it passed in, and the script's last loss.
    assert.is_truthy(out:find(("\nembed_lua: the script ran %d steps; final loss %s\n"):format(
      steps, losses[#losses].text), 1, true), out)
  end)

  it("prints a Lua error raised in the script with its traceback and exits 1", function()
    local status, out = sh(exe .. " 0")
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("embed_lua: embedded script:3: steps must be a number >= 1, got 0\n"
                              .. "stack traceback:", 1, true), out)
    assert.is_falsy(out:find("the script ran", 1, true), out)
  end)

  it("takes the Lua folder from L2L_LUA_DIR, and says so when require fails", function()
    local status, out = sh(("L2L_LUA_DIR=/nonexistent/l2l-lua %s 5"):format(exe))
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find("module 'l2l' not found", 1, true), out)
    assert.is_truthy(out:find("no file '/nonexistent/l2l-lua/l2l/init.lua'", 1, true), out)
    status, out = sh(exe .. " 5x")
    assert.are.equal(2, status, out)
    assert.is_truthy(out:find("usage: ", 1, true), out)
  end)
end)
