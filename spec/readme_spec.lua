-- readme_spec — the README's 15-line training script ("Training with the relay") runs as
-- printed (shortened to 50 steps, in a temporary folder), learns, and writes its
-- checkpoint and trace: the README cannot rot.
local support = dofile("spec/support.lua")

local function readme_script()
  local f = assert(io.open("README.md"))
  local text = f:read("*a")
  f:close()
  local at = assert(text:find("A whole training job in 15 lines", 1, true), "the README lost its script")
  return assert(text:match("```lua\n(.-)```", at))
end

describe("the README's training script", function()
  it("is 15 lines and trains", function()
    local script = readme_script()
    local _, lines = script:gsub("\n", "")
    assert.are.equal(15, lines)
    local short, n = script:gsub("for step = 1, 300 do", "for step = 1, 50 do")
    assert.are.equal(1, n, "the loop line changed: update this spec")
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0)
    local path = dir .. "/script.lua"
    local f = assert(io.open(path, "w"))
    f:write(short)
    f:close()
    local build = support.build:sub(1, 1) == "/" and support.build or support.root .. "/" .. support.build
    local status, out = support.sh(("cd %s && %s/l2l script.lua"):format(dir, build))
    assert.are.equal(0, status, out)
    local loss, valid = out:match("step  50  loss ([%d.]+)  device peak [%d.]+ MiB  valid ([%d.]+)")
    assert.is_truthy(loss, out)
    assert.is_true(tonumber(valid) < 4.2, out)       -- from 5.55 (uniform over 256 bytes)
    local saved = io.open(dir .. "/gpt.safetensors", "rb")
    assert.is_truthy(saved, "no checkpoint written")
    saved:close()
    assert.is_truthy(io.open(dir .. "/step.json"), "no trace written")
    os.execute("rm -rf " .. dir)
  end)
end)
