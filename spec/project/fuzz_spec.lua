-- SPDX-License-Identifier: MIT
-- fuzz_spec — the loader fuzzer (scripts/fuzz_load.lua) as part of `make test`: first its
-- self-test (children made to segfault, abort, hang and fail with internal messages are
-- classified so, and every base checkpoint, written again by the fuzzer's own JSON
-- writer, loads and trains under each target), then a few hundred mutated checkpoints
-- from this run's seed, each fed to l2l.load, l2l.load_weights or l2l.safetensors.open in
-- a child process. Passes only with no crash, no hang, no unclean error and no accepted
-- file that cannot train. Failing cases are kept under <build>/fuzz/ with the commands
-- that replay them.
local support = dofile("spec/support.lua")

local sanitized = os.getenv("L2L_SANITIZE") == "1"
local exe = support.build .. "/l2l"
local script = "scripts/fuzz_load.lua"
-- A sanitized child starts and runs several times slower: fewer cases, a longer limit.
local cases = sanitized and 150 or 300
local limit = sanitized and 120 or 20

describe("the loader fuzzer (seed " .. support.seed .. ")", function()
  it("tells crashes, hangs and unclean errors apart, and the checkpoints it mutates load", function()
    local status, out = support.sh(("%s %s --self-test --seed %d --timeout %d"):format(exe, script, support.seed, limit))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("fuzz_load: self-test passed", 1, true), out)
  end)

  it(("finds no crash, hang or unclean error in %d mutated checkpoints"):format(cases), function()
    local status, out = support.sh(("%s %s --n %d --seed %d --timeout %d"):format(
      exe, script, cases, support.seed, limit))
    -- the counts in the test log: per target and class, and the last line
    for line in out:gmatch("[^\n]+") do
      if line:find("^%s+accepted") or line:find("^  l2l%.") or line:find("^  safetensors%.") or
         line:find("^  tokenizer ") or line:find("^  the largest resident") or line:find("^  the longest case") or
         line:find("^  all ") or line:find("^fuzz_load: seed %d+:") then
        print(line)
      end
    end
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find(("fuzz_load: seed %d: %d cases"):format(support.seed, cases), 1, true), out)
    assert.is_truthy(out:find(" 0 unclean, 0 unsteppable, 0 crashes, 0 hangs", 1, true), out)
  end)
end)
