-- SPDX-License-Identifier: MIT
-- option_table_spec — the relay's options are one table (src/core/options.def): every field of
-- l2l_relay_config, of its optimizer and of its schedule has exactly one row, found at
-- its C offset; the table's bounds and choices are what l2l.Relay and C's check take and
-- refuse (drawn afresh each run), each refusal naming the option in Lua's terms; and
-- l2l.Relay's options, a checkpoint's keys and the readers are the table's rows.
local support = dofile("spec/support.lua")
local ffi = require("ffi")
local l2l = require("l2l")
local lib = require("l2l.lib")
local options = require("l2l.relay_options")

local C = lib.C
local ROWS, ROW = options.ROWS, options.ROW
local STRUCTS = { relay = "l2l_relay_config", optimizer = "l2l_optimizer_config", schedule = "l2l_schedule_config" }

-- The fields of a struct of the public header, by reading its text (not the table).
local function header_fields(struct)
  local fields = {}
  for _, file in ipairs(assert(dofile("scripts/public_header.lua")("include/l2l.h"))) do
    local body = file.body:match("typedef struct " .. struct .. " {(.-)} " .. struct .. ";")
    if body then
      body = body:gsub("/%*.-%*/", "")
      for decl in body:gmatch("([^;]+);") do
        local names = decl:gsub("^%s*const%s+", ""):gsub("^%s*[%w_]+", "")   -- the type dropped
        for name in names:gmatch("[%*%s]*([%a_][%w_]*)") do fields[#fields + 1] = name end
      end
    end
  end
  return fields
end

local function model()
  return l2l.Sequential { l2l.Embedding { vocab = 11, dim = 8, max_seq = 4 }, l2l.LMHead { dim = 8, vocab = 11 } }
end

-- A value inside a numeric row's bounds (as l2l.Relay takes it), drawn.
local function inside(row)
  local lo = row.min + ((row.flags.open_low and 1) or 0)
  local hi = math.min(row.max, 2 ^ 40)
  if row.type == "float" then
    local v = support.uniform(row.min, math.min(row.max, 1000))
    if row.flags.open_high and v >= row.max then v = row.min end
    return v
  end
  return math.floor(support.uniform(lo, math.min(hi, lo + 5000)))
end

describe("the option table", function()
  it("has one row for each field of the relay's config, its optimizer's and its schedule's, at its C offset", function()
    for group, struct in pairs(STRUCTS) do
      local fields = header_fields(struct)
      assert.is_true(#fields >= 4, struct .. ": fields not found in the header")
      for _, field in ipairs(fields) do
        if not (group == "relay" and (field == "optimizer" or field == "schedule")) then
          local found = 0
          for _, row in ipairs(ROWS) do
            if row.group == group and row.field == field then
              found = found + 1
              local out = ffi.new("const l2l_option *[1]")
              for i = 0, C.l2l_relay_option_count() - 1 do
                lib.check(C.l2l_relay_option(out, i))
                if ffi.string(out[0].name) == row.name then
                  assert.are.equal(ffi.offsetof(struct, field), tonumber(out[0].offset), row.name)
                end
              end
            end
          end
          assert.are.equal(1, found, ("%s.%s: rows in the option table"):format(struct, field))
        end
      end
    end
  end)

  it("refuses an index out of range", function()
    local out = ffi.new("const l2l_option *[1]")
    for _, i in ipairs({ -1, C.l2l_relay_option_count(), 2 ^ 31 - 1 }) do
      assert.are_not.equal(0, C.l2l_relay_option(out, i))
      assert.is_truthy(lib.last_error():find("index must be 0 to", 1, true))
    end
    assert.are_not.equal(0, C.l2l_relay_option(nil, 0))
  end)

  it("is what l2l.Relay takes and a checkpoint keeps", function()
    local names = {}
    for _, row in ipairs(ROWS) do
      if row.group == "relay" then
        names[#names + 1] = row.name
        assert.are.equal(row.keep, options.OPTIONS[row.name], row.name)
      end
    end
    for _, own in ipairs({ "model", "plan", "optimizer", "schedule" }) do assert.are.equal("own", options.OPTIONS[own]) end
    local count = 0
    for _ in pairs(options.OPTIONS) do count = count + 1 end
    assert.are.equal(#names + 4, count)
  end)

  it("takes each numeric option inside its bounds and refuses it outside, naming it (seed " .. support.seed .. ")", function()
    for _, row in ipairs(ROWS) do
      local numeric = row.type == "int" or row.type == "int64" or row.type == "uint64" or row.type == "float"
      if row.group == "relay" and numeric and row.name ~= "loss_scale" and row.name ~= "param_slots" then
        local v = inside(row)
        local o = { model = model(), [row.name] = v }
        if row.name == "optimizer_threads" then o[row.name] = math.min(v, 4) end
        local run = l2l.Relay(o)
        local want = o[row.name]
        if row.type == "float" then want = tonumber(ffi.new("float", want)) end
        assert.are.equal(want, tonumber(options.config_of(run.options)[row.field]), row.name)
        run:free()
        if row.min > -2 ^ 53 then
          local below = row.flags.open_low and row.min or (row.type == "float" and row.min - 0.5 or row.min - 1)
          local ok, err = pcall(l2l.Relay, { model = model(), [row.name] = below })
          assert.is_false(ok, row.name .. " = " .. below)
          assert.is_truthy(tostring(err):find("option '" .. row.name .. "'", 1, true), tostring(err))
        end
        if row.max < 2 ^ 31 then
          local ok, err = pcall(l2l.Relay, { model = model(), [row.name] = row.max + 1 })
          assert.is_false(ok, row.name .. " = " .. row.max + 1)
          assert.is_truthy(tostring(err):find("option '" .. row.name .. "'", 1, true), tostring(err))
        end
      end
    end
  end)

  it("takes each choice of a choice option and refuses another, listing them", function()
    for _, row in ipairs(ROWS) do
      if row.group == "relay" and row.type == "choice" and row.name ~= "dist" then
        for _, choice in ipairs(row.choices) do
          local o = { model = model(), [row.name] = choice }
          if row.name == "master" and choice == "bf16" then o.precision = "bf16" end
          if row.name == "grad_precision" and choice == "f16" then o.loss_scale = 1024 end
          local run = l2l.Relay(o)
          assert.are.equal(row.ids[choice], tonumber(options.config_of(run.options)[row.field]), row.name)
          run:free()
        end
        local ok, err = pcall(l2l.Relay, { model = model(), [row.name] = "neither" })
        assert.is_false(ok)
        for _, choice in ipairs(row.choices) do
          assert.is_truthy(tostring(err):find('"' .. choice .. '"', 1, true), tostring(err))
        end
      end
    end
  end)

  it("bounds the optimizers' and schedules' float options as their rows do (seed " .. support.seed .. ")", function()
    local option_table = require("l2l.option_table")
    local make = { sgd = l2l.SGD, adam = l2l.AdamW }
    for _, row in ipairs(ROWS) do
      if row.group ~= "relay" and row.type == "float" then
        local ctor = row.group == "schedule" and function(o) o.total = 10; return l2l.LinearLR(o) end
                     or (row.flags.sgd and make.sgd or make.adam)
        local inside = row.flags.open_low and row.min + support.uniform(0.01, 0.5) or row.min
        ctor({ [row.name] = inside })   -- taken
        local outside = { row.min - support.uniform(0.01, 1) }
        if row.flags.open_low then outside[#outside + 1] = row.min end
        if row.max ~= math.huge then outside[#outside + 1] = row.flags.open_high and row.max or row.max + 0.5 end
        for _, v in ipairs(outside) do
          local ok, err = pcall(ctor, { [row.name] = v })
          assert.is_false(ok, row.name .. " = " .. v)
          assert.is_truthy(tostring(err):find(("option '%s' must be %s"):format(row.name, option_table.float_range(row)), 1, true),
                           tostring(err))
        end
      end
    end
  end)

  it("checks every C field of a config against its row, and names it in Lua's terms", function()
    for _, row in ipairs(ROWS) do
      if row.group == "relay" and row.type ~= "path" then
        local c = ffi.new("l2l_relay_config")
        C.l2l_relay_config_default(c)
        local bad = row.type == "choice" and 1000 + support.int(0, 99) or
                    row.type == "float" and (support.int(0, 1) == 0 and 0 / 0 or -1 / 0) or
                    row.min - 1
        if row.type == "uint64" then bad = nil end   -- every uint64 is in bounds [0, 2^64)
        if bad ~= nil then
          c[row.field] = bad
          assert.are_not.equal(0, C.l2l_relay_config_check(c), row.name)
          local msg = lib.last_error()
          assert.is_truthy(msg:find("config->" .. row.field, 1, true), msg)
          local words = options.lua_message()
          assert.is_truthy(words:find("option '" .. row.name .. "'", 1, true), words)
          assert.is_falsy(words:find("config->", 1, true), words)
        end
      end
    end
  end)
end)
