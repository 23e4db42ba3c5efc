-- SPDX-License-Identifier: MIT
-- readme_spec — the README's 15-line training script ("Training with the relay") runs as
-- printed (shortened to 50 steps, in a temporary folder), learns, and writes its
-- checkpoint and trace: the README cannot rot.
local support = dofile("spec/support.lua")

local function readme_script()
  local text = support.read_file("README.md")
  assert(text, "cannot read README.md")
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
    support.write_file(dir .. "/script.lua", short)
    local status, out = support.sh(("cd %s && %s/l2l script.lua"):format(dir, support.build_dir))
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

-- The README's REPL session: its input (the text after each "> " and ">> " prompt) goes
-- through a pipe into `l2l -i` (prompts on stderr, values on stdout, both into one pipe in
-- order), and the session as a terminal shows it (each prompt followed by the line typed
-- after it, then what the REPL printed) must be the README's, line for line. One
-- normalisation: numbers with five or more decimals (losses) may differ from the README's
-- in their last digits, as float sums do between machines and thread counts: they must
-- agree to a relative 1e-5. Trailing spaces are not compared (the README's last prompt).
local function readme_session()
  local text = assert(support.read_file("README.md"), "cannot read README.md")
  local at = assert(text:find("\n$ build/l2l\nl2l ", 1, true), "the README lost its REPL session")
  local block = assert(text:match("^\n%$ build/l2l\n(.-)```", at), "the session's block ends")
  return block
end

-- Numbers with five or more decimals out of `s`, and s with each replaced by "#".
local function long_numbers(s)
  local list = {}
  local rest = s:gsub("%-?%d+%.%d%d%d%d%d+", function(n)
    list[#list + 1] = tonumber(n)
    return "#"
  end)
  return rest, list
end

local function trim_lines(s) return (s:gsub("[ \t]+\n", "\n"):gsub("[ \t]+$", "")) end

describe("the README's REPL session", function()
  it("is what the REPL prints for its input", function()
    local want = readme_session()
    local inputs, prompts = {}, {}
    for line in want:gmatch("([^\n]*)\n") do
      local prompt, typed = line:match("^(>>? )(.*)$")
      if prompt then prompts[#prompts + 1], inputs[#inputs + 1] = prompt, typed end
    end
    assert.is_true(#inputs >= 10, want)
    local input = support.write_temp(table.concat(inputs, "\n") .. "\n")
    local status, stream = support.sh(("%s/l2l -i < %s"):format(support.build_dir, input))
    os.remove(input)
    assert.are.equal(0, status, stream)
    -- the stream: the banner line, then per line read its prompt and what it printed
    local banner, p = stream:match("^([^\n]*\n)()")
    assert.is_truthy(banner, stream)
    local shown = { banner }
    for k = 1, #inputs + 1 do
      local prompt = stream:match("^>>? ", p)
      assert.is_truthy(prompt, ("no prompt before line %d at: %q"):format(k, stream:sub(p, p + 80)))
      p = p + #prompt
      if k > #inputs then
        shown[#shown + 1] = prompt .. stream:sub(p)   -- the prompt at the end of input
        break
      end
      local output = ""
      if not stream:match("^>>? ", p) then   -- what the line printed runs to the next prompt
        local e = stream:find("\n>>? ", p) or error(("no prompt after line %d: %q"):format(k, stream:sub(p)))
        output, p = stream:sub(p, e), e + 1
      end
      shown[#shown + 1] = prompt .. inputs[k] .. "\n" .. output
    end
    local got, got_numbers = long_numbers(trim_lines(table.concat(shown)))
    local expected, want_numbers = long_numbers(trim_lines(want))
    assert.are.equal(expected, got)
    assert.are.equal(#want_numbers, #got_numbers)
    for i = 1, #want_numbers do
      assert.is_true(math.abs(got_numbers[i] - want_numbers[i]) <= 1e-5 * math.abs(want_numbers[i]),
                     ("%.12g in the README, %.12g now"):format(want_numbers[i], got_numbers[i]))
    end
  end)
end)
