-- SPDX-License-Identifier: MIT
-- relay_step_calls_spec — the model in a relay is a view of the C relay's list (issue 31): a step
-- makes the same few C calls from Lua whatever the depth (no per-step diff of a mirror,
-- no per-layer question to C), counted by spec/step_calls.lua in its own process.
local support = dofile("spec/support.lua")

describe("a relay step from Lua", function()
  it("makes as many C calls for 8 blocks as for 2", function()
    local status, out = support.sh(support.build .. "/l2l spec/step_calls.lua")
    assert.are.equal(0, status, out)
    local calls, seen = {}, 0
    for blocks, n, list in out:gmatch("blocks=(%d+) calls=(%d+) top=([^\n]*)") do
      calls[tonumber(blocks)] = tonumber(n)
      seen = seen + 1
      assert.is_truthy(list:find("l2l_relay_step:1", 1, true), out)   -- the counting ran
    end
    assert.are.equal(2, seen, out)
    assert.are.equal(calls[2], calls[8], out)
  end)
end)
