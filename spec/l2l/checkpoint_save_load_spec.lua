-- SPDX-License-Identifier: MIT
-- checkpoint_save_load_spec — what run:save writes, l2l.load takes, and nothing else (issue 47):
-- a save refuses optimizer state a load would refuse, leaving the last good file as it
-- was (item 2); every setting of l2l.Relay, drawn at random from the relay's own option
-- list, comes back from a save unchanged, and the machine's settings may be given anew at
-- load (item 4); a link planted at the save's predictable temporary name is not followed
-- (item 6); a refused load leaves no relay, spill file or memory behind (item 8); a
-- checkpoint whose checksums are written in capitals loads, and damage is still found
-- (item 13); a save's error speaks of the save, not of a line inside the library (item 14).
-- (The update that would make the state non-finite is refused at the step: compact_state_spec.)
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local ffi = require("ffi")
local cjson = require("cjson").new()
local relay_mod = require("l2l.relay")
local relay_options = require("l2l.relay_options")

local seed = support.seed
math.randomseed(seed)
local C = l2l.C
pcall(ffi.cdef, "int getpid(void);")
pcall(ffi.cdef, "int symlink(const char *target, const char *path);")

local V, n = 13, 4
local S = 2 * n + 1
local dir = support.tmpdir()
local q = support.q
support.sh(("mkdir %s/spill-drawn %s/spill-given"):format(q(dir), q(dir)))
teardown(function() support.sh("rm -rf " .. q(dir)) end)

local function tiny_gpt(s)
  return l2l.Sequential {
    l2l.Embedding { vocab = V, dim = 16, max_seq = S, seed = s },
    l2l.Block { dim = 16, heads = 2, causal = true, seed = s + 1 },
    l2l.LMHead { vocab = V, dim = 16, tie = true, seed = s + 2 },
  }
end

local function batches(count, B) return support.reversal_batches(count, B, n, V) end

local function listing(folder)
  local names = {}
  for name in io.popen("ls -A " .. q(folder)):lines() do names[#names + 1] = name end
  table.sort(names)
  return table.concat(names, " ")
end

local refused = support.refused

describe("save and load agree (seed " .. seed .. ")", function()
  it("a save refuses optimizer state a load would refuse, and leaves the last file as it was", function()
    -- The state of a live relay is made non-finite by hand (l2l_relay_param_state's
    -- borrowed array: the C API's own; no update makes such state now, compact_state_spec):
    -- an inf, a NaN, or v < 0, in one element of one record, in the run's precision. The
    -- save that finds it says which record and leaves the good file there byte for byte,
    -- and no temporary beside it; the file then loads.
    local precision = ({ "f32", "bf16", "8bit" })[support.int(1, 3)]
    local data = batches(2, 4)
    local run = l2l.Relay { model = tiny_gpt(support.int(1, 1000)), micro_batch = 2,
                            optimizer = l2l.AdamW { lr = 1e-3, state = precision } }
    run:step(data[1][1], data[1][2])
    local folder = support.tmpdir()
    local path = folder .. "/run.safetensors"
    run:save(path)
    local good = support.read_file(path)
    local params = run.model:params()
    local p = params[support.int(1, #params)]
    local which = support.int(0, 1)
    local bad = ({ math.huge, 0 / 0, -1 })[support.int(1, which == 1 and 3 or 2)]
    local what = ("%s state, record %s, %s = %s (seed %d)"):format(precision, p.name, which == 0 and "m" or "v",
                                                                 tostring(bad), seed)
    local out = ffi.new("l2l_tensor *[1]")
    assert.are.equal(0, C.l2l_relay_param_state(out, relay_mod.c_relay(run, "spec"), p.handle, which))
    local count = p.value:numel()
    local at = support.int(0, count - 1)
    local data_ptr = C.l2l_tensor_data(out[0])
    if precision == "f32" then
      ffi.cast("float *", data_ptr)[at] = bad
    elseif precision == "bf16" then   -- inf, NaN, -1 in bf16
      ffi.cast("uint16_t *", data_ptr)[at] = bad ~= bad and 0x7fc0 or bad == math.huge and 0x7f80 or 0xbf80
    else   -- the scale of at's block: an 8-bit code decodes to code * scale
      local scales = ffi.cast("float *", ffi.cast("uint8_t *", data_ptr) + math.ceil(count / 4) * 4)
      scales[math.floor(at / 2048)] = bad == -1 and math.huge or bad
    end
    local err = refused("would not load", run.save, run, path)
    assert.is_truthy(err:find("^run:save: "), err)
    assert.is_truthy(err:find(p.name, 1, true), what .. ": " .. err)
    assert.is_nil(err:find("%.lua:%d+:"), err)
    assert.are.equal(good, support.read_file(path), what .. ": the last good file is as it was")
    assert.are.equal("run.safetensors", listing(folder), what .. ": nothing beside it")
    refused("would not load", run.save, run, folder .. "/fresh.safetensors")
    assert.are.equal("run.safetensors", listing(folder), what .. ": no file where there was none")
    local back = l2l.load(path)
    back:free()
    run:free()
    support.sh("rm -rf " .. q(folder))
  end)

  it("l2l.load_model and l2l.load_weights write the records without handing their values out", function()
    -- They write each record through p:write (l2l_param_write), not p.value: a step of a
    -- relay over the model they fill moves the host bytes of a relay over a clone of it,
    -- to the byte (values read, their 16-bit copies would be rewritten every step)
    local folder = dir .. "/unread"
    support.sh("mkdir " .. q(folder))
    local list = batches(3, 2)
    local function passes(model)
      local run = l2l.Relay { model = model, precision = "bf16", micro_batch = 1, optimizer_threads = 1 }
      local bytes = {}
      for i, b in ipairs(list) do
        run:step(b[1], b[2])
        run:sync()
        bytes[i] = run:stats().host_pass_bytes
      end
      run:free()
      return table.concat(bytes, " ")
    end
    local run = l2l.Relay { model = tiny_gpt(5), optimizer_threads = 1 }
    run:step(list[1][1], list[1][2])
    run:save(folder .. "/run.safetensors")
    run:free()
    local loaded, into = l2l.load_model(folder .. "/run.safetensors"), tiny_gpt(9)
    l2l.load_weights(into, folder .. "/run.safetensors")
    for _, model in ipairs { loaded, into } do
      local twin = {}
      for i = 1, #model do twin[i] = model[i]:clone() end
      assert.are.equal(passes(l2l.Sequential(twin)), passes(model), "a step's host bytes, loaded against a clone's")
    end
    support.sh("rm -rf " .. q(folder))
  end)

  it("every setting of l2l.Relay comes back from a save unchanged, and the machine's may be given anew", function()
    -- One value drawn for every option in the relay's list (relay_options.OPTIONS); an
    -- option without a way to draw it here fails the spec, so a new option cannot go
    -- unsaved unseen. The loaded run's settings equal the saved run's, option by option
    -- (the optimizer and the schedule field by field), and its next step is the saved
    -- run's to the bit. Then each "load" option given to l2l.load is taken, and the others
    -- still come back as saved.
    local B = support.int(3, 6)
    local pick = function(list) return list[support.int(1, #list)] end
    local cores = C.l2l_get_threads()
    local o = {}
    -- Whether the records may live on the device with the rest as drawn (placement device
    -- takes no spill directory).
    local function device_fits() return o.spill == nil end
    local draw = {
      model = function() return nil end,   -- (the model is the layers the file describes)
      micro_batch = function() return support.int(1, B) end,
      stash = function() return pick { "device", "host", "recompute" } end,
      recompute_every = function() return support.int(1, 3) end,
      inner = function() return pick { "recompute", "keep", "swap" } end,
      clip_global_norm = function() return pick { 0, support.uniform(0.1, 5) } end,
      clip_layer_norm = function() return pick { 0, support.uniform(0.1, 5) } end,
      accumulate = function() return support.int(1, 3) end,
      optimizer_threads = function() return support.int(0, math.min(4, cores)) end,
      seed = function() return support.int(0, 2 ^ 30) * 2 ^ 20 + support.int(0, 2 ^ 20) end,
      device_budget = function() return pick { 0, support.int(256, 1024) * 2 ^ 20 } end,
      host_budget = function() return pick { 0, support.int(1024, 2048) * 2 ^ 20 } end,
      spill = function() return pick { false, true } and (dir .. "/spill-drawn") or nil end,
      master = function() return pick { "f32", "bf16" } end,
      precision = function() return o.master == "bf16" and "bf16" or pick { "f32", "bf16", "f16" } end,
      grad_precision = function() return pick { "f32", "bf16", "f16" } end,
      param_slots = function() return pick { 0, support.int(2, 5) } end,
      loss_scale = function() return o.grad_precision == "f16" and support.int(1, 5000) or pick { 0, support.int(1, 5000) } end,
      loss_scale_window = function() return support.int(1, 5) end,
      nonfinite = function() return pick { "skip", "error" } end,
      dist = function() return "none" end,   -- (mpi's saves and loads: dist_spec, under mpirun)
      placement = function() return device_fits() and pick { "host", "device", "auto" } or pick { "host", "auto" } end,
      plan = function()
        if support.int(0, 2) > 0 then return nil end
        if o.device_budget == 0 then o.device_budget = 512 * 2 ^ 20 end
        return "auto"
      end,
      optimizer = function()
        local state = pick { "f32", "bf16", "8bit" }
        local kind = pick { "sgd", "adamw", "lamb" }
        if kind == "sgd" then
          local momentum = pick { 0, support.uniform(0.5, 0.99) }
          return l2l.SGD { lr = support.uniform(1e-3, 0.1), momentum = momentum, nesterov = momentum > 0 and pick { true, false },
                           weight_decay = support.uniform(0, 0.1), decay_all = pick { true, false }, state = state }
        end
        return (kind == "adamw" and l2l.AdamW or l2l.LAMB) {
          lr = support.uniform(1e-4, 1e-2), betas = { support.uniform(0.5, 0.95), support.uniform(0.9, 0.9999) },
          eps = support.uniform(1e-9, 1e-6), weight_decay = support.uniform(0, 0.1), decay_all = pick { true, false },
          state = state }
      end,
      schedule = function()
        local warmup = support.int(0, 5)
        local kind = pick { "constant", "cosine", "linear" }
        if kind == "constant" then return l2l.ConstantLR { warmup = warmup } end
        return (kind == "cosine" and l2l.CosineLR or l2l.LinearLR) {
          warmup = warmup, total = warmup + support.int(1, 50), final_ratio = support.uniform(0, 1) }
      end,
    }
    local names = {}
    for name in pairs(relay_options.OPTIONS) do
      assert.is_function(draw[name], "option '" .. name .. "' of l2l.Relay: this spec draws no value for it (add one)")
      names[#names + 1] = name
    end
    table.sort(names)
    -- the ones others depend on first, and placement (which depends on others) last
    local order = { "master", "grad_precision", "device_budget" }
    for _, name in ipairs(names) do
      if name ~= "master" and name ~= "grad_precision" and name ~= "device_budget" and name ~= "placement" then
        order[#order + 1] = name
      end
    end
    order[#order + 1] = "placement"
    for _, name in ipairs(order) do
      local v = draw[name]()
      if o[name] == nil then o[name] = v end
    end
    o.model = tiny_gpt(support.int(1, 1000))
    local shown = {}
    for _, name in ipairs(names) do
      if name ~= "model" then shown[#shown + 1] = name .. " = " .. tostring(o[name]) end
    end
    local what = ("the settings {%s} (seed %d)"):format(table.concat(shown, ", "), seed)
    local run = l2l.Relay(o)
    local data = batches(3, B)
    local function step(r, i)   -- (nonfinite = "error" may raise: both runs alike)
      local ok, loss = pcall(r.step, r, data[i][1], data[i][2])
      return ok and loss or tostring(loss):gsub("^.-run:step", "run:step")
    end
    step(run, 1)
    local path = dir .. "/settings.safetensors"
    run:save(path)
    local back = l2l.load(path)
    local function fields(x)   -- an optimizer's or a schedule's values, by name
      local t = {}
      for k, v in pairs(x) do if type(v) ~= "function" and type(v) ~= "table" then t[k] = v end end
      if type(x.betas) == "table" then t.betas = { x.betas[1], x.betas[2] } end
      return t
    end
    local function same_settings(a, b, loaded, skip)
      local sa, sb = relay_mod.settings(a), relay_mod.settings(b)
      for _, name in ipairs(names) do
        if name == "optimizer" or name == "schedule" then
          assert.are.same(fields(sa[name]), fields(sb[name]), what .. loaded .. ": option '" .. name .. "'")
        elseif name ~= "model" and not (skip and skip[name]) then
          assert.are.equal(sa[name], sb[name], what .. loaded .. ": option '" .. name .. "'")
        end
      end
    end
    same_settings(run, back, "")
    local second = step(run, 2)
    assert.are.equal(second, step(back, 2), what .. ": the step after the load")
    back:free()
    -- the machine's settings: given, taken; not given, as saved
    local given = { micro_batch = support.int(1, B), optimizer_threads = support.int(0, math.min(4, cores)),
                    device_budget = support.int(256, 1024) * 2 ^ 20, host_budget = support.int(1024, 2048) * 2 ^ 20,
                    spill = o.placement ~= "device" and (dir .. "/spill-given") or nil,   -- (not on the device yet)
                    master = o.precision == "bf16" and pick { "f32", "bf16" } or nil,
                    dist = "none", placement = device_fits() and pick { "host", "device", "auto" } or pick { "host", "auto" } }
    for _, name in ipairs(relay_options.option_names({ load = true })) do
      assert.is_truthy(given[name] ~= nil or name == "master" or (name == "spill" and o.placement == "device"),
                       "option '" .. name .. "': this spec gives no value for it at load")
      if given[name] ~= nil then
        local other = l2l.load(path, { [name] = given[name] })
        local settings = relay_mod.settings(other)
        if not (name == "micro_batch" and o.plan == "auto") then   -- (a plan sets its own)
          assert.are.equal(given[name], settings[name], what .. ": '" .. name .. "' given at load")
        end
        local skip = { [name] = true }
        if o.plan == "auto" then skip.micro_batch = true end   -- (a plan sets its own)
        same_settings(run, other, ", loaded with " .. name .. " given", skip)
        other:free()
      end
    end
    if o.spill then   -- spill = false: no spill file, where the run had one
      local plain = l2l.load(path, { spill = false })
      assert.is_nil(relay_mod.settings(plain).spill, what)
      assert.are.equal(second, step(plain, 2), what .. ": loaded without its spill file")
      plain:free()
    end
    run:free()
  end)

  it("a save does not follow a link planted at its temporary name, which only its owner can read", function()
    -- The temporary's first name is predictable, "<path>.tmp.<host>.<pid>": a symbolic
    -- link there to a victim file must leave the victim's bytes alone; the save goes on
    -- under another name and succeeds. While it is written (a tensor made as the file gets
    -- to it looks) the temporary is a regular file of mode 0600; the file saved has the
    -- mode a plain create gives (0666 less the umask); the link stays as it was.
    local folder = support.tmpdir()
    local path = folder .. "/run.safetensors"
    local host = io.popen("hostname"):read("*l"):gsub("[^%w%-]", "_")
    local link = ("%s.tmp.%s.%d"):format(path, host, ffi.C.getpid())
    local victim = folder .. "/victim"
    local words = ("victim %d"):format(support.int(1, 1e9))
    support.write_file(victim, words)
    assert.are.equal(0, ffi.C.symlink(victim, link))
    local run = l2l.Relay { model = tiny_gpt(support.int(1, 1000)), micro_batch = 2 }
    local data = batches(1, 4)
    run:step(data[1][1], data[1][2])
    run:save(path)
    assert.are.equal(words, support.read_file(victim), "the link's target was written")
    local _, kind = support.sh("stat -c %F " .. q(link))
    assert.is_truthy(kind:find("symbolic link", 1, true), kind)
    assert.are.equal(("run.safetensors %s victim"):format(link:match("[^/]*$")), listing(folder))
    l2l.load(path):free()
    local umask = tonumber(support.read_file("/proc/self/status"):match("\nUmask:%s*(%d+)"), 8)
    local _, mode = support.sh("stat -c %a " .. q(path))
    assert.are.equal(bit.band(tonumber("666", 8), bit.bnot(umask)), tonumber(mode, 8), "the saved file's mode " .. mode)
    -- while it is written
    local seen
    l2l.safetensors.write(path, { { name = "w", shape = { 3 }, dtype = "f32", produce = function()
      for name in io.popen("ls -A " .. q(folder)):lines() do
        local full = folder .. "/" .. name
        if full ~= link and name:find("^run%.safetensors%.tmp%.") then
          local _, m = support.sh("stat -c '%a %F' " .. q(full))
          seen = m:gsub("%s+$", "")
        end
      end
      return l2l.zeros({ 3 })
    end } })
    assert.are.equal("600 regular file", seen)
    assert.are.equal(words, support.read_file(victim))
    run:free()
    support.sh("rm -rf " .. q(folder))
  end)

  it("a refused load frees what it made before it says so: the relay, its spill file, its memory", function()
    -- A file whose progress is forged (more updates than steps) passes every check until
    -- the relay is made and the tensors read; the refusal must leave the spill folder and
    -- the pools as they were, with the collector stopped (nothing left for it to free).
    local spill = support.tmpdir()
    local run = l2l.Relay { model = tiny_gpt(support.int(1, 1000)), micro_batch = 2,
                            optimizer = l2l.AdamW { state = ({ "f32", "bf16", "8bit" })[support.int(1, 3)] } }
    local data = batches(1, 4)
    run:step(data[1][1], data[1][2])
    local good = dir .. "/good.safetensors"
    run:save(good)
    run:free()
    local f = l2l.safetensors.open(good)
    local entries, meta = {}, {}
    for _, name in ipairs(f.names) do entries[#entries + 1] = { name = name, tensor = f:read(name) } end
    for k, v in pairs(f.metadata) do meta[k] = v end
    f:close()
    local desc = cjson.decode(meta.l2l)
    desc.progress.updates = desc.progress.steps + 1
    meta.l2l = cjson.encode(desc)
    local bad = dir .. "/forged.safetensors"
    l2l.safetensors.write(bad, entries, meta)
    for _, e in ipairs(entries) do e.tensor:free() end
    collectgarbage("collect")
    local pools = {}
    for _, name in ipairs({ "host", "pinned", "device", "spill" }) do pools[name] = l2l.pool_stats(name) end
    local before = listing(spill)
    collectgarbage("stop")
    local ok, err = pcall(l2l.load, bad, { spill = spill, host_budget = support.int(0, 1) * 2 ^ 30 })
    local after = listing(spill)
    local now = {}
    for _, name in ipairs({ "host", "pinned", "device", "spill" }) do now[name] = l2l.pool_stats(name) end
    collectgarbage("restart")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("progress", 1, true), tostring(err))
    assert.are.equal(before, after, "the spill folder after a refused load")
    for name, s in pairs(pools) do
      assert.are.equal(s.current, now[name].current, "the " .. name .. " pool's bytes after a refused load")
    end
    l2l.load(good, { spill = spill }):free()
    support.sh("rm -rf " .. q(spill))
  end)

  it("checksums written in capitals are the same sums: the file loads, and damage is still found", function()
    local run = l2l.Relay { model = tiny_gpt(support.int(1, 1000)), micro_batch = 2 }
    local data = batches(2, 4)
    run:step(data[1][1], data[1][2])
    local path = dir .. "/upper.safetensors"
    run:save(path)
    local bytes = support.read_file(path)
    local len = 0
    for i = 8, 1, -1 do len = len * 256 + bytes:byte(i) end
    local header = bytes:sub(9, 8 + len)
    local letters = 0
    local upper = header:gsub('(\\")(' .. ("%x"):rep(16) .. ')(\\")', function(a, h, b)
      local _, k = h:gsub("%l", "")
      letters = letters + k
      return a .. h:upper() .. b
    end)
    assert.is_true(letters > 0, "no hex letter among the checksums (seed " .. seed .. ")")
    assert.are.equal(#header, #upper)
    support.write_file(path, bytes:sub(1, 8) .. upper .. bytes:sub(9 + len))
    local back = l2l.load(path)
    assert.are.equal(run:step(data[2][1], data[2][2]), back:step(data[2][1], data[2][2]))
    back:free()
    -- a byte of the data changed: still named as damage, capitals or not
    local at = 9 + len + support.int(0, #bytes - 9 - len)
    local changed = bytes:sub(1, 8) .. upper .. bytes:sub(9 + len, at - 1) .. string.char((bytes:byte(at) + 1) % 256)
                    .. bytes:sub(at + 1)
    support.write_file(path, changed)
    refused("is damaged", l2l.load, path)
    run:free()
  end)

  it("a save that cannot read its state says so in the caller's terms, with no line of the library", function()
    -- The spill file cut short by another program: the save names the file and what
    -- happened, and the last good file stays.
    local spill = support.tmpdir()
    local run = l2l.Relay { model = tiny_gpt(support.int(1, 1000)), micro_batch = 2, spill = spill }
    local data = batches(1, 4)
    run:step(data[1][1], data[1][2])
    local path = dir .. "/cut.safetensors"
    run:save(path)
    local good = support.read_file(path)
    run:sync()
    local file = listing(spill)
    assert.is_truthy(file:find("^l2l%-spill%-%d+%-%d+%.bin$"), file)
    support.sh(("truncate -s %d %s"):format(support.int(0, 4096), q(spill .. "/" .. file)))
    local err = refused(file, run.save, run, path)
    assert.is_truthy(err:find("^run:save: "), err)
    assert.is_nil(err:find("%.lua:%d+:"), err)
    assert.are.equal(good, support.read_file(path))
    run:free()
    support.sh("rm -rf " .. q(spill))
  end)
end)
