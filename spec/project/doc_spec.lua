-- SPDX-License-Identifier: MIT
-- doc_spec — `make doc`: the man page l2l(1) renders without a warning and describes every
-- option `l2l --help` lists and every environment variable the sources read; the Lua
-- reference (LDoc) has a page for every module of lua/l2l/ and an entry for every public
-- function defined there, with its comment; the C reference has an entry for every
-- function of include/l2l.h, with its comment. Also: the repository holds its licence and its
-- design document, and the README points at them.
local support = dofile("spec/support.lua")
local sh = support.sh

local q = support.q
local doc = support.build .. "/doc"

-- The rendered man page's section `name` (up to the next unindented heading).
local function man_section(text, name)
  return text:match("\n" .. name .. "\n(.-)\n%u[%u ]+\n") or text:match("\n" .. name .. "\n(.*)$")
end

-- What the sources read from the environment: getenv("X") in C, os.getenv("X") in Lua.
local function environment_variables()
  local status, out = sh([[grep -rhoE '(os\.)?getenv\("[A-Za-z_0-9]+"\)' src lua --include='*.c' --include='*.h' --include='*.lua']])
  assert(status == 0, out)
  local seen, list = {}, {}
  for name in out:gmatch('getenv%("([%w_]+)"%)') do
    if not seen[name] then seen[name] = true; list[#list + 1] = name end
  end
  table.sort(list)
  return list
end

describe("make doc", function()
  local built, out
  setup(function()   -- from nothing, so that every step runs and shows its warnings
    sh("rm -rf " .. q(doc))
    built, out = sh(("cd %s && make --no-print-directory BUILD=%s SANITIZE=%s doc")
                    :format(q(support.root), q(support.build), os.getenv("L2L_SANITIZE") == "1" and "1" or "0"))
  end)

  it("builds the man page, the Lua reference and the C reference", function()
    assert.are.equal(0, built, out)
    assert.is_falsy(out:lower():find("warning:", 1, true), out)
    assert.are.equal(support.read_file("docs/l2l.1"), support.read_file(doc .. "/man1/l2l.1"))
    for _, f in ipairs({ "l2l.1.txt", "lua/index.html", "c-api.md" }) do
      assert.is_truthy(support.read_file(doc .. "/" .. f), f .. " was not made")
    end
  end)

  it("describes in l2l(1) every option of l2l --help", function()
    local man = assert(support.read_file(doc .. "/l2l.1.txt"))
    local options = man_section(man, "OPTIONS")
    assert.is_truthy(options, man)
    local status, help = sh(support.build .. "/l2l --help")
    assert.are.equal(0, status, help)
    local n = 0
    for option in help:gmatch("\n%s+(%-%-?[%w-]*)") do
      n = n + 1
      assert.is_truthy(options:find("\n       " .. option:gsub("%-", "%%-") .. "[ ,\n]")
                       or options:find("^       " .. option:gsub("%-", "%%-") .. "[ ,\n]"),
                       option .. " is not described under OPTIONS:\n" .. options)
    end
    assert.is_true(n >= 5, help)
    for _, option in ipairs({ "--version", "--help", "--" }) do   -- what main.c also takes
      assert.is_truthy(options:find(option, 1, true), option)
    end
  end)

  it("describes in l2l(1) every environment variable the sources read", function()
    local man = assert(support.read_file(doc .. "/l2l.1.txt"))
    local env = man_section(man, "ENVIRONMENT")
    assert.is_truthy(env, man)
    local names = environment_variables()
    assert.is_true(#names >= 8, table.concat(names, " "))
    for _, name in ipairs(names) do
      assert.is_truthy(env:find("%f[%w_]" .. name .. "%f[^%w_]"),
                       name .. " is read by the sources but not described under ENVIRONMENT")
    end
  end)

  it("has a Lua reference page per module and an entry per public function, with its comment", function()
    local status, files = sh("cd lua/l2l && ls *.lua")
    assert.are.equal(0, status, files)
    local index = assert(support.read_file(doc .. "/lua/index.html"))
    local entries = 0
    for file in files:gmatch("%S+") do
      if file ~= "cdef.lua" then
        local module = file == "init.lua" and "l2l" or "l2l." .. file:gsub("%.lua$", "")
        assert.is_truthy(index:find('"modules/' .. module .. '.html"', 1, true), module .. " not in the index")
        local page = assert(support.read_file(doc .. "/lua/modules/" .. module .. ".html"), module)
        for name in support.read_file("lua/l2l/" .. file):gmatch("\nfunction [%w_]+[%.:]([%w_]+)%s*%(") do
          local pattern = '<a name = "[%w_]*:?' .. name .. '"'
          assert.is_truthy(page:find(pattern), module .. ": no entry for " .. name)
          entries = entries + 1
        end
      end
    end
    assert.is_true(entries > 100, "only " .. entries .. " entries")
    local tensor = support.read_file(doc .. "/lua/modules/l2l.tensor.html")
    assert.is_truthy(tensor:find("A new tensor of another dtype (round to nearest even)", 1, true), tensor)
  end)

  it("has a C reference entry for every function of include/l2l.h, with its comment", function()
    local ref = assert(support.read_file(doc .. "/c-api.md"))
    local cdef = support.read_file("lua/l2l/cdef.lua")
    local n = 0
    for name in cdef:gmatch("[%w_%*]+%s+%**(l2l_[%w_]+)%s*%(") do
      n = n + 1
      assert.is_truthy(ref:find("\n### [^\n]*`" .. name .. "`"), name .. " has no entry")
    end
    assert.is_true(n >= 100, "only " .. n .. " functions found in cdef.lua")
    assert.is_truthy(ref:find("A view of rows [first, first+count) along dim 0: same storage, no copy.", 1, true)
                     or ref:find("A view of rows \\[first, first+count) along dim 0: same storage, no copy.", 1, true),
                     "l2l_tensor_view_rows's comment is missing")
  end)
end)

describe("the repository", function()
  it("holds the MIT licence, the design document, and a README that points at them", function()
    local license = assert(support.read_file("LICENSE"))
    assert.is_truthy(license:find("^MIT License\n\nCopyright %(c%) %d%d%d%d the l2l authors\n"), license)
    local design = assert(support.read_file("docs/design.md"))
    for _, part in ipairs({ "src/relay/", "src/eps/", "src/layers/", "src/backend/", "src/core/", "House style" }) do
      assert.is_truthy(design:find(part, 1, true), "docs/design.md does not cover " .. part)
    end
    local readme = support.read_file("README.md")
    assert.is_truthy(readme:find("docs/design.md", 1, true), "README does not point at docs/design.md")
    assert.is_falsy(readme:find("../shared/", 1, true), "README points outside the repository")
    assert.is_truthy(readme:find("LICENSE", 1, true), "README does not name the licence")
  end)
end)
