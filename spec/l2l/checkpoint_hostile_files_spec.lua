-- SPDX-License-Identifier: MIT
-- checkpoint_hostile_files_spec — the loaders against files made to hurt (hardening 2, items 3, 4, 5
-- and 8): a GPT-2 file that names a huge model and holds almost nothing, a FIFO or a
-- directory where a file should be, a header too big to decode, and a checkpoint forged
-- to inject a gradient or to start MPI. Each is refused with a message saying what is
-- wrong, having allocated nothing from l2l's pools and waited on nothing. Loaders that
-- could block run in a child process under a timeout, so a regression fails the spec
-- instead of hanging the suite.
local support = dofile("spec/support.lua")
local l2l = require("l2l")
local ffi = require("ffi")
local cjson = require("cjson")
local C = require("l2l.lib").C

local dir = support.tmpdir()
local function path(name) return dir .. "/" .. name end
local exe = support.build_dir .. "/l2l"
local q = support.q
-- Runs Lua code in a child l2l (shell words before it: `prefix`) under a 60 s timeout:
-- its status (124: it blocked) and output.
local function in_child(code, prefix)
  return support.sh(("%stimeout 60 %s -e %s"):format(prefix or "", exe, q(code)))
end

-- A safetensors file from a header table (entries' offsets as given) and data bytes.
local function raw_file(file, header, data)
  local json = type(header) == "string" and header or cjson.encode(header)
  json = json .. (" "):rep((8 - #json % 8) % 8)
  local n, len = #json, {}
  for i = 0, 7 do len[i + 1] = string.char(math.floor(n / 2 ^ (8 * i)) % 256) end
  local f = assert(io.open(file, "wb"))
  f:write(table.concat(len), json, data or "")
  f:close()
  return file
end

local function host_allocs()
  local s = ffi.new("l2l_pool_stats")
  assert(C.l2l_pool_get_stats(s, C.L2L_POOL_HOST) == 0)
  return tonumber(s.allocs)
end

local refused = support.refused

local V, S, D = 11, 5, 16
local function small_run(o)
  o = o or {}
  local model = l2l.Sequential {
    l2l.Embedding { vocab = V, dim = D, max_seq = S, seed = support.int(1, 1e6) },
    l2l.Block { dim = D, heads = 2, seed = support.int(1, 1e6) },
    l2l.LMHead { vocab = V, dim = D, tie = true },
  }
  return l2l.Relay { model = model, micro_batch = 2, accumulate = o.accumulate or 1,
                     optimizer = l2l.AdamW { lr = 1e-2 } }
end
local function batch()
  local tok = {}
  for b = 1, 4 do
    tok[b] = {}
    for s = 1, S do tok[b][s] = support.int(0, V - 1) end
  end
  local t = l2l.tensor(tok, { dtype = "i32" })
  return t, t
end

-- The file at `from` rewritten to `to` with its l2l description changed by edit(desc,
-- entries): entries is the list {name =, tensor =} that is written.
local function forged(from, to, edit)
  local f = l2l.safetensors.open(from)
  local entries = {}
  for _, name in ipairs(f.names) do entries[#entries + 1] = { name = name, tensor = f:read(name) } end
  local meta = {}
  for k, v in pairs(f.metadata) do meta[k] = v end
  f:close()
  local desc = cjson.decode(meta.l2l)
  edit(desc, entries)
  meta.l2l = cjson.encode(desc)
  l2l.safetensors.write(to, entries, meta)
  return to
end

teardown(function() support.sh("rm -rf " .. q(dir)) end)

describe("l2l.import_gpt2 checks the whole file before it builds", function()
  it("refuses a file naming a wide wte and a far block, allocating nothing", function()
    -- wte (1, 512) and h.0's MLP read as a GPT-2 of dim 512; h.3 makes it 4 blocks. The
    -- importer used to build all four (and with wte (1, 4096), 2.1 GB) before finding
    -- that h.0.ln_1.weight is missing.
    local f32 = function(shape, at)
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      return { dtype = "F32", shape = shape, data_offsets = { at, at + 4 * n } }, at + 4 * n
    end
    local h, at = {}, 0
    h["wte.weight"], at = f32({ 1, 512 }, at)
    h["wpe.weight"], at = f32({ 1, 512 }, at)
    h["h.0.mlp.c_fc.weight"], at = f32({ 1, 4 }, at)
    h["h.3.attn.bias"], at = f32({ 1 }, at)
    local file = raw_file(path("wide.safetensors"), h, ("\0"):rep(at))
    local before = host_allocs()
    refused("has no tensor 'h.0.ln_1.weight'", l2l.import_gpt2, file)
    assert.are.equal(before, host_allocs(), "the importer allocated before refusing")
    -- an l2l checkpoint: named as one, with what reads it
    local model = l2l.Sequential{ l2l.Embedding{ vocab = 5, dim = 8, max_seq = 4 }, l2l.LMHead{ vocab = 5, dim = 8 } }
    local ck = path("run.safetensors")
    local run = l2l.Relay{ model = model }
    run:save(ck)
    run:free()
    refused(ck .. " is an l2l checkpoint, not a GPT-2 file: l2l.load (the run) or l2l.load_model", l2l.import_gpt2, ck)
  end)

  it("refuses h.99 alone, and a tensor of the wrong shape or dtype, allocating nothing", function()
    local h = {
      ["wte.weight"] = { dtype = "F32", shape = { 4, 8 }, data_offsets = { 0, 128 } },
      ["wpe.weight"] = { dtype = "F32", shape = { 4, 8 }, data_offsets = { 128, 256 } },
      ["h.99.ln_1.weight"] = { dtype = "F32", shape = { 8 }, data_offsets = { 256, 288 } },
    }
    local file = raw_file(path("far.safetensors"), h, ("\0"):rep(288))
    local before = host_allocs()
    refused("has no tensor 'h.0.mlp.c_fc.weight'", l2l.import_gpt2, file, { heads = 2 })
    assert.are.equal(before, host_allocs())
    -- a whole one-block GPT-2 of dim 8 whose ln_f.bias is I32: the dtype is named (F16
    -- and BF16 import: safetensors_spec)
    local D8, M8, names, at = 8, 12, {}, 0
    local function add(name, shape, dtype)
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      local size = (dtype == "F16" and 2 or 4) * n
      names[name] = { dtype = dtype or "F32", shape = shape, data_offsets = { at, at + size } }
      at = at + size
    end
    add("wte.weight", { V, D8 }); add("wpe.weight", { S, D8 })
    add("h.0.ln_1.weight", { D8 }); add("h.0.ln_1.bias", { D8 })
    add("h.0.attn.c_attn.weight", { D8, 3 * D8 }); add("h.0.attn.c_attn.bias", { 3 * D8 })
    add("h.0.attn.c_proj.weight", { D8, D8 }); add("h.0.attn.c_proj.bias", { D8 })
    add("h.0.ln_2.weight", { D8 }); add("h.0.ln_2.bias", { D8 })
    add("h.0.mlp.c_fc.weight", { D8, M8 }); add("h.0.mlp.c_fc.bias", { M8 })
    add("h.0.mlp.c_proj.weight", { M8, D8 }); add("h.0.mlp.c_proj.bias", { D8 })
    add("ln_f.weight", { D8 }); add("ln_f.bias", { D8 }, "I32")
    file = raw_file(path("i32.safetensors"), names, ("\0"):rep(at))
    before = host_allocs()
    refused("'ln_f.bias' is I32; l2l imports float tensors", l2l.import_gpt2, file, { heads = 2 })
    assert.are.equal(before, host_allocs())
    -- the same file with ln_f.bias (D + 1) wide: the shape is named
    names["ln_f.bias"] = { dtype = "F32", shape = { D8 + 1 }, data_offsets = names["ln_f.bias"].data_offsets }
    names["ln_f.bias"].data_offsets[2] = names["ln_f.bias"].data_offsets[1] + 4 * (D8 + 1)
    file = raw_file(path("wide_bias.safetensors"), names,
                    ("\0"):rep(names["ln_f.bias"].data_offsets[2]))
    before = host_allocs()
    refused("'ln_f.bias' is (9), expected (8)", l2l.import_gpt2, file, { heads = 2 })
    assert.are.equal(before, host_allocs())
    -- and made whole, it imports (the checks refuse only what is wrong)
    names["ln_f.bias"] = { dtype = "F32", shape = { D8 }, data_offsets = { names["ln_f.bias"].data_offsets[1],
                                                                           names["ln_f.bias"].data_offsets[1] + 4 * D8 } }
    file = raw_file(path("whole.safetensors"), names, ("\0"):rep(names["ln_f.bias"].data_offsets[2]))
    local model = l2l.import_gpt2(file, { heads = 2 })
    assert.are.equal(3, #model)
  end)
end)

describe("loaders open regular files only", function()
  -- Each loader, in a child process (a loader that opened the FIFO would wait for a
  -- writer forever): it must return an error naming what the path is.
  local calls = {
    ["l2l.load"] = "l2l.load(p)",
    ["l2l.load_weights"] = "l2l.load_weights(l2l.Sequential{l2l.Embedding{vocab=4,dim=4,max_seq=2}}, p)",
    ["l2l.import_gpt2"] = "l2l.import_gpt2(p)",
    ["safetensors.open"] = "l2l.safetensors.open(p)",
    ["tokenizer.load (encoder)"] = "l2l.tokenizer.load(p, ok_file)",
    ["tokenizer.load (vocab)"] = "l2l.tokenizer.load(ok_file, p)",
    ["plot.read_metrics"] = "require('l2l.plot').read_metrics(p)",
  }
  local fifo = path("pipe.safetensors")
  local folder = path("folder.safetensors")
  local ok_file = path("ok.json")
  support.write_file(ok_file, '{"a": 0}')
  assert(support.sh("mkfifo " .. q(fifo) .. " && mkdir -p " .. q(folder)) == 0)
  for name, call in pairs(calls) do
    it(name .. " refuses a FIFO and a directory without waiting", function()
      for target, want in pairs({ [fifo] = "is a FIFO (a named pipe), not a regular file",
                                  [folder] = "is a directory" }) do
        local script = ("local l2l = require('l2l'); local p, ok_file = %q, %q; "
                        .. "local ok, err = pcall(function() return %s end); "
                        .. "io.write(ok and 'LOADED' or tostring(err))"):format(target, ok_file, call)
        local status, out = in_child(script)
        assert.are.equal(0, status, name .. " on " .. target .. " (124: it blocked):\n" .. out)
        assert.is_truthy(out:find(want, 1, true), name .. " on " .. target .. ":\n" .. out)
      end
    end)
  end
  it("l2l.text.load refuses a FIFO (a directory is a corpus of files)", function()
    local status, out = in_child(("local ok, err = pcall(require('l2l.text').load, %q); io.write(tostring(err))"):format(fifo))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("is a FIFO", 1, true), out)
  end)
end)

describe("a header is at most 16 MiB", function()
  local limit = l2l.safetensors.max_header
  it("refuses a longer one before decoding it", function()
    assert.are.equal(16 * 2 ^ 20, limit)
    -- valid JSON a little over the limit: its metadata one long string
    local pad = limit + support.int(1, 4096)
    local header = '{"__metadata__":{"x":"' .. ("a"):rep(pad) .. '"}}'
    local file = raw_file(path("big.safetensors"), header)
    refused("bytes is over the 16777216 bytes l2l reads", l2l.safetensors.open, file)
    refused("bytes is over the 16777216 bytes l2l reads", l2l.load, file)
  end)

  it("does not write one it could not read back", function()
    local out = path("never.safetensors")
    refused("over the 16777216 l2l reads", l2l.safetensors.write, out,
            { { name = "w", tensor = l2l.zeros { 2 } } }, { big = ("b"):rep(limit) })
    assert.is_nil(io.open(out, "rb"), "a refused write left a file")
  end)

  it("reports running out of memory while decoding as such", function()
    if os.getenv("L2L_SANITIZE") == "1" then
      return pending("the address sanitizer reserves terabytes of address space: an address-space limit cannot bound it")
    end
    -- 14.7 MB of empty arrays in the metadata: decoding makes an object of each three
    -- bytes, about 600 MB. The child bounds its address space at what it uses already plus
    -- 128 MB (room for the header's bytes, 9x less than decoding needs, whatever the
    -- process's start took: threads and libraries vary with the machine and its load).
    local file = raw_file(path("many.safetensors"),
                          '{"__metadata__":{"k":[' .. ("[],"):rep(4900000 - 1) .. "[]]}}")
    local status, out = in_child(([[
      local ffi = require("ffi")
      ffi.cdef("struct spec_rlimit { unsigned long cur, max; }; int setrlimit(int, const struct spec_rlimit *);")
      local l2l = require("l2l")
      local vm_kb = assert(tonumber(assert(io.open("/proc/self/status")):read("*a"):match("VmSize:%%s*(%%d+) kB")))
      local bytes = (vm_kb + 128 * 1024) * 1024
      assert(ffi.C.setrlimit(9 --[=[RLIMIT_AS]=], ffi.new("struct spec_rlimit", { bytes, bytes })) == 0)
      local ok, err = pcall(l2l.safetensors.open, %q)
      io.write(tostring(err))]]):format(file))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("out of memory decoding the", 1, true), out)
  end)
end)

describe("a checkpoint carries only what a save writes", function()
  it("refuses a gradient where a save writes none", function()
    local run = small_run()
    run:step(batch())
    local good = path("good.l2l")
    run:save(good)
    run:free()
    -- record 1 (the embedding's wte) given a gradient of ones, marked as saved
    local bad = forged(good, path("grad.l2l"), function(desc, entries)
      desc.records[1].grad = true
      local f = l2l.safetensors.open(good)
      local shape = f.entries[desc.records[1].name].shape
      f:close()
      entries[#entries + 1] = { name = desc.records[1].name .. ".grad", tensor = l2l.full(shape, 1) }
    end)
    refused("carries a gradient, but step 1 ends an accumulation of 1", l2l.load, bad)
    -- mid-accumulation, a saved gradient is the run's own: it loads
    local acc = small_run { accumulate = 2 }
    acc:step(batch())
    local mid = path("mid.l2l")
    acc:save(mid)
    acc:free()
    l2l.load(mid):free()
  end)

  it("does not start MPI for a file saved by a data-parallel run unless asked", function()
    local run = small_run()
    run:step(batch())
    local good = path("single.l2l")
    run:save(good)
    run:free()
    local mpi = forged(good, path("mpi.l2l"), function(desc) desc.relay.dist = "mpi" end)
    refused('load it with {dist = "mpi"} in each rank of an mpirun job, or {dist = "none"}', l2l.load, mpi)
    local alone = l2l.load(mpi, { dist = "none" })
    assert.is_true(alone:step(batch()) > 0)
    alone:free()
  end)
end)

describe("clear errors for odd files", function()
  it("a directory given as a tokenizer file or a checkpoint is named as one", function()
    local enc = path("enc.json")
    support.write_file(enc, '{"a": 0}')
    refused("vocab_bpe: cannot read " .. dir .. ": is a directory", l2l.tokenizer.load, enc, dir)
    refused("cannot open " .. dir .. ": is a directory", l2l.load, dir)
  end)

  it("a header shape past 2^48 elements is named, not printed as a wrapped integer", function()
    local big = 2 ^ support.int(25, 40)
    local file = raw_file(path("huge_shape.safetensors"),
                          { w = { dtype = "F32", shape = { big, big, 4 }, data_offsets = { 0, 512 } } }, ("\0"):rep(512))
    local err = refused("has more than 2^48 elements", l2l.safetensors.open, file)
    assert.is_falsy(err:find("-9223372036854775808", 1, true), err)
  end)

  it("l2l plot names a bad step and draws values too large to plot as off the chart", function()
    local bad = path("bad_step.jsonl")
    support.write_file(bad, '{"step":1,"loss":2}\n{"step":"x","loss":1}\n')
    local status, out = support.sh(("%s plot %s %s"):format(exe, q(bad), q(path("bad.svg"))))
    assert.are.equal(1, status, out)
    assert.is_truthy(out:find(bad .. ":2: step must be a number, got string \"x\"", 1, true), out)
    assert.is_falsy(out:find("traceback", 1, true), out)
    -- ±1e308 and a huge budget: an SVG with only numbers in it
    local huge = path("huge.jsonl")
    local v = support.uniform(1e301, 1.7e308)
    support.write_file(huge, ('{"step":1,"loss":%.17g,"device_peak":%.17g,"device_budget":%.17g}\n'
                              .. '{"step":2,"loss":%.17g}\n{"step":3,"loss":1.5}\n{"step":4,"loss":1.25}\n')
                             :format(v, v, v, -v))
    local svg = path("huge.svg")
    status, out = support.sh(("%s plot %s %s"):format(exe, q(huge), q(svg)))
    assert.are.equal(0, status, out)
    local text = support.read_file(svg)
    assert.is_falsy(text:lower():find("nan", 1, true) or text:lower():find("inf", 1, true), "the SVG holds nan or inf")
    assert.is_truthy(text:find("<polyline", 1, true), "the finite points were not drawn")
  end)
end)
