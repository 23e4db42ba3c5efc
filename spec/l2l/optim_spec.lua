-- SPDX-License-Identifier: MIT
-- optim_spec — the learning-rate schedules' names (lua/l2l/optim.lua): l2l.ConstantLR,
-- l2l.CosineLR and l2l.LinearLR build the C config the old names l2l.Constant, l2l.Cosine
-- and l2l.Linear built, which still work for one release and warn once a process on
-- standard error (a child l2l process's, read apart from its output); the messages that
-- list the schedules name the new names; and a checkpoint keeps the schedule as before
-- (its kind in lower case: "constant", "cosine", "linear"), so files saved by 0.1 load.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local cjson = require("cjson").new()

local exe = support.build .. "/l2l"
local PAIRS = { { new = "ConstantLR", old = "Constant", kind = "constant" },
                { new = "CosineLR", old = "Cosine", kind = "cosine" },
                { new = "LinearLR", old = "Linear", kind = "linear" } }

-- Random options a schedule of `kind` takes.
local function options(kind)
  local warmup = support.int(0, 50)
  if kind == "constant" then return { warmup = warmup } end
  return { warmup = warmup, total = warmup + support.int(1, 500), final_ratio = support.uniform(0, 1) }
end

local function config_fields(schedule)
  local c = schedule:config()
  return { kind = tonumber(c.kind), warmup = tonumber(c.warmup), total = tonumber(c.total),
           final_ratio = tonumber(c.final_ratio) }
end

local function tiny_model()
  return l2l.Sequential {
    l2l.Embedding { vocab = 8, dim = 8, max_seq = 4, seed = 1 },
    l2l.LMHead { vocab = 8, dim = 8, seed = 2 },
  }
end

describe("learning-rate schedules named as such (seed " .. support.seed .. ")", function()
  it("build with the new names the C config the old names built, and the same rates", function()
    for _, p in ipairs(PAIRS) do
      for _ = 1, 20 do
        local o = options(p.kind)
        local new = l2l[p.new](o)
        local old = support.quietly(l2l[p.old], o)
        assert.are.same(config_fields(old), config_fields(new))
        assert.are.equal(p.kind, new.kind)
        local t = support.int(1, 600)
        assert.are.equal(old:lr(0.01, t), new:lr(0.01, t))
        assert.is_truthy(tostring(new):match("^" .. p.new .. "{"), tostring(new))
      end
    end
  end)

  it("name the new names in errors, and in the relay's refusal of a schedule", function()
    support.refused("l2l.CosineLR: option 'total' is required", l2l.CosineLR, { warmup = 3 })
    support.refused("l2l.LinearLR: option 'final_ratio' must be a number in [0, 1]", l2l.LinearLR,
                    { total = 9, final_ratio = 2 })
    support.refused("l2l.Relay: option 'schedule' must be l2l.ConstantLR{...}, l2l.CosineLR{...} or " ..
                    "l2l.LinearLR{...}", l2l.Relay, { model = tiny_model(), schedule = { kind = "cosine" } })
  end)

  it("warn once a process for each old name, on standard error, and still work", function()
    local script = support.write_temp([[
      local l2l = require("l2l")
      local old = l2l.Cosine { warmup = 2, total = 10 }
      for _ = 1, 3 do l2l.Cosine { total = 20 } end
      local linear = l2l.Linear { total = 10 }
      local new = l2l.CosineLR { warmup = 2, total = 10 }
      l2l.ConstantLR {}
      print(old:lr(1, 5) == new:lr(1, 5), linear:lr(1, 5) == l2l.LinearLR { total = 10 }:lr(1, 5))
      local model = l2l.Sequential {
        l2l.Embedding { vocab = 8, dim = 8, max_seq = 4, seed = 1 },
        l2l.LMHead { vocab = 8, dim = 8, seed = 2 },
      }
      local run = l2l.Relay { model = model, optimizer_threads = 1, schedule = l2l.Constant { warmup = 1 } }
      local ids = l2l.full({ 2, 4 }, 3, { dtype = "i32" })
      local loss = run:step(ids, ids)
      run:sync()
      print(loss == loss, tostring(run.options.schedule))
    ]])
    local err = os.tmpname()
    local status, out = support.sh(("%s %s 2>%s"):format(exe, script, err))
    local stderr = support.read_file(err)
    os.remove(script)
    os.remove(err)
    assert.are.equal(0, status, out .. stderr)
    assert.are.equal("true\ttrue\ntrue\tConstantLR{warmup = 1}\n", out)
    assert.are.equal(
      "l2l: l2l.Cosine is deprecated: use l2l.CosineLR (the old name goes in the next release)\n" ..
      "l2l: l2l.Linear is deprecated: use l2l.LinearLR (the old name goes in the next release)\n" ..
      "l2l: l2l.Constant is deprecated: use l2l.ConstantLR (the old name goes in the next release)\n",
      stderr)
  end)

  it("are kept in a checkpoint as before (the kind in lower case), and load as the new names", function()
    local dir = support.tmpdir()
    for _, p in ipairs(PAIRS) do
      local o = options(p.kind)
      local run = l2l.Relay { model = tiny_model(), optimizer_threads = 1, schedule = l2l[p.new](o) }
      local path = dir .. "/" .. p.kind .. ".safetensors"
      run:save(path)
      local file = l2l.safetensors.open(path)
      local desc = cjson.decode(file.metadata.l2l)
      file:close()
      -- exactly the fields 0.1 wrote
      local want = { kind = p.kind, warmup = o.warmup, total = o.total or 0, final_ratio = o.final_ratio or 1 }
      local saved = desc.relay.schedule
      assert.are.same({ "final_ratio", "kind", "total", "warmup" },
                      (function() local k = {} for key in pairs(saved) do k[#k + 1] = key end table.sort(k) return k end)())
      assert.are.equal(want.kind, saved.kind)
      assert.are.equal(want.warmup, saved.warmup)
      assert.are.equal(want.total, saved.total)
      -- a number 14 digits do not give back is written {__f64 = "<17 digits>"} (checkpoint.lua)
      local ratio = type(saved.final_ratio) == "table" and tonumber(saved.final_ratio.__f64) or saved.final_ratio
      assert.are.equal(want.final_ratio, ratio)
      local loaded = l2l.load(path)
      assert.are.same(config_fields(run.options.schedule), config_fields(loaded.options.schedule))
      assert.is_truthy(tostring(loaded.options.schedule):match("^" .. p.new .. "{"))
      run:free()
      loaded:free()
    end
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

-- Each optimizer's and schedule's defaults are its rows' in the option table
-- (src/core/options.def, read here through l2l_relay_option itself, not l2l.option_table):
-- an optimizer or schedule built with no options holds them, its C config holds every
-- field's value for its kind, and C's default config is AdamW's and the constant schedule's.
describe("each optimizer's and schedule's defaults", function()
  local ffi = require("ffi")
  local lib = require("l2l.lib")
  local C = lib.C

  -- The table's rows of a group as C gives them.
  local function rows_of(group)
    local out, list = ffi.new("const l2l_option *[1]"), {}
    for i = 0, C.l2l_relay_option_count() - 1 do
      assert.are.equal(0, C.l2l_relay_option(out, i))
      if out[0].group == group then list[#list + 1] = out[0] end
    end
    assert.is_true(#list >= 4)
    return list
  end

  -- v as a C field of the row's type holds it.
  local function as_field(row, v)
    return row.type == C.L2L_OPTION_FLOAT and lib.as_f32(v) or v
  end

  -- Whether a kind takes the row's option (its flags: SGD's, AdamW's and LAMB's, decaying
  -- schedules' only).
  local function takes(row, only_sgd, only_adam, only_decay)
    local f = row.flags
    if bit.band(f, C.L2L_OPTION_SGD) ~= 0 then return only_sgd end
    if bit.band(f, C.L2L_OPTION_ADAM) ~= 0 then return only_adam end
    if bit.band(f, C.L2L_OPTION_DECAY) ~= 0 then return only_decay end
    return true
  end

  -- obj (built with no options but `given`) against the table's values for kind k.
  local function check(obj, k, group, taken, given)
    local c = obj:config()
    for _, row in ipairs(rows_of(group)) do
      local name, field = ffi.string(row.name), ffi.string(row.field)
      local want = row.kind_default[k]
      if given[name] ~= nil then want = given[name] end
      assert.are.equal(as_field(row, want), tonumber(c[field]),
                       ("%s %s: its C field"):format(tostring(obj), name))
      if field ~= "kind" and taken(row) then
        local held = obj[name]
        if row.type == C.L2L_OPTION_BOOL then held = held and 1 or 0 end
        if row.type == C.L2L_OPTION_CHOICE then
          for j = 0, row.nchoices - 1 do
            if ffi.string(row.choice_names[j]) == held then held = row.choice_values[j] end
          end
        end
        assert.are.equal(want, held, ("%s %s: its value"):format(tostring(obj), name))
      end
    end
  end

  it("are the option table's for every optimizer and schedule, and C's default config AdamW's", function()
    local OPT, SCHED = C.L2L_OPTION_OPTIMIZER, C.L2L_OPTION_SCHEDULE
    for _, o in ipairs { { l2l.SGD, C.L2L_OPTIMIZER_SGD, true, false },
                         { l2l.AdamW, C.L2L_OPTIMIZER_ADAMW, false, true },
                         { l2l.LAMB, C.L2L_OPTIMIZER_LAMB, false, true } } do
      check(o[1] {}, o[2], OPT, function(row) return takes(row, o[3], o[4], false) end, {})
    end
    check(l2l.ConstantLR {}, C.L2L_SCHEDULE_CONSTANT, SCHED,
          function(row) return takes(row, false, false, false) end, {})
    for _, s in ipairs { { l2l.CosineLR, C.L2L_SCHEDULE_COSINE, "l2l.CosineLR" },
                         { l2l.LinearLR, C.L2L_SCHEDULE_LINEAR, "l2l.LinearLR" } } do
      local total = support.int(1, 10000)   -- required: the table has none for it
      check(s[1] { total = total }, s[2], SCHED, function(row) return takes(row, false, false, true) end,
            { total = total })
      local ok, err = pcall(s[1], {})
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(s[3] .. ": option 'total' is required", 1, true), tostring(err))
    end
    -- C's default config: AdamW's and the constant schedule's values, field by field
    local d = ffi.new("l2l_relay_config")
    C.l2l_relay_config_default(d)
    for _, g in ipairs { { OPT, d.optimizer, C.L2L_OPTIMIZER_ADAMW }, { SCHED, d.schedule, C.L2L_SCHEDULE_CONSTANT } } do
      for _, row in ipairs(rows_of(g[1])) do
        assert.are.equal(as_field(row, row.kind_default[g[3]]), tonumber(g[2][ffi.string(row.field)]),
                         ffi.string(row.name))
      end
    end
  end)
end)
