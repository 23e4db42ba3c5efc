-- SPDX-License-Identifier: MIT
-- checkpoint_spec — run:save / l2l.load, the safetensors files under them, and GPT-2 import.
-- References are independent of what they test: safetensors bytes are written and read
-- here by hand, a resumed run is compared bit for bit with the run that never stopped,
-- and an imported GPT-2 is compared with a float64 GPT-2 forward written in this file.
local l2l = require("l2l")
local ffi = require("ffi")
local cjson = require("cjson").new()
local support = dofile("spec/support.lua")

local seed = support.seed
local exe = support.build .. "/l2l"

local function tmp_path(tag)
  return ("%s/l2l-ck-%s-%d-%d.safetensors"):format(os.getenv("TMPDIR") or "/tmp", tag, seed, math.random(1, 1e9))
end

local function read_bytes(path)
  local text = support.read_file(path)
  assert(text, "cannot read " .. path)
  return text
end
local write_bytes = support.write_file

local function le64(n)
  local t = {}
  for i = 1, 8 do t[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(t)
end

-- A safetensors file written without l2l: tensors = { {name, dtype ("F32"/"I32"), shape,
-- values (flat list)} }, metadata (table or nil).
local function write_by_hand(path, tensors, metadata)
  local header, blobs, at = {}, {}, 0
  for _, t in ipairs(tensors) do
    local n = #t.values
    local ctype = t.dtype == "F32" and "float[?]" or "int32_t[?]"
    local blob = ffi.string(ffi.new(ctype, n, t.values), 4 * n)
    header[t.name] = { dtype = t.dtype, shape = t.shape, data_offsets = { at, at + #blob } }
    blobs[#blobs + 1] = blob
    at = at + #blob
  end
  header.__metadata__ = metadata
  local json = cjson.encode(header)
  write_bytes(path, le64(#json) .. json .. table.concat(blobs))
end

local function flat(t)
  local out, p = {}, t:data()
  for i = 0, t:numel() - 1 do out[i + 1] = p[i] end
  return out
end

local function same_values(a, b)
  local pa, pb = a:data(), b:data()
  if a:numel() ~= b:numel() then return false end
  for i = 0, a:numel() - 1 do
    if pa[i] ~= pb[i] then return false end
  end
  return true
end

describe("safetensors files (seed " .. seed .. ")", function()
  it("reads a file written by hand and writes what a hand-written reader expects", function()
    local path = tmp_path("format")
    local rows, cols = support.int(1, 7), support.int(1, 9)
    local a, ids = {}, {}
    for i = 1, rows * cols do a[i] = support.normal() end
    for i = 1, support.int(1, 11) do ids[i] = support.int(-5, 5000) end
    write_by_hand(path, { { name = "a", dtype = "F32", shape = { rows, cols }, values = a },
                          { name = "ids", dtype = "I32", shape = { #ids }, values = ids } }, { note = "x" })
    local file = l2l.safetensors.open(path)
    assert.are.same({ rows, cols }, file.entries.a.shape)
    assert.are.equal("x", file.metadata.note)
    local ta, ti = file:read("a"), file:read("ids")
    file:close()
    assert.are.same({ rows, cols }, ta:shape())
    assert.are.equal("i32", ti:dtype())
    local want = ffi.new("float[?]", #a, a)       -- the f32 roundings of the doubles
    for i = 1, #a do assert.are.equal(want[i - 1], ta:data()[i - 1]) end
    assert.are.same(ids, flat(ti))

    -- l2l writes; this file's reader checks the layout byte by byte.
    local x = l2l.randn({ support.int(1, 5), support.int(1, 6) }, { seed = seed })
    local y = l2l.tensor({ 3, -1, 7 }, { dtype = "i32" })
    l2l.safetensors.write(path, { { name = "x", tensor = x }, { name = "y", tensor = y } }, { k = "v" })
    local bytes = read_bytes(path)
    local n = 0
    for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
    assert.are.equal(0, (8 + n) % 8, "the data starts 8-byte aligned")
    local header = cjson.decode(bytes:sub(9, 8 + n))
    assert.are.equal("v", header.__metadata__.k)
    assert.are.equal("F32", header.x.dtype)
    assert.are.same(x:shape(), header.x.shape)
    local data = bytes:sub(9 + n)
    local xo, yo = header.x.data_offsets, header.y.data_offsets
    assert.are.equal(#data, math.max(xo[2], yo[2]))
    -- copied out of the file's bytes: a pointer into a temporary Lua string would read
    -- freed memory once the collector takes the string
    local function values(ctype, from, to)
      local n = to - from
      local out = ffi.new(ctype .. "[?]", n / ffi.sizeof(ctype))
      ffi.copy(out, data:sub(from + 1, to), n)
      return out
    end
    local xs = values("float", xo[1], xo[2])
    for i = 0, x:numel() - 1 do assert.are.equal(x:data()[i], xs[i]) end
    local ys = values("int32_t", yo[1], yo[2])
    assert.are.same({ 3, -1, 7 }, { ys[0], ys[1], ys[2] })
    os.remove(path)
  end)

  it("refuses damaged, truncated and foreign files with a message naming them", function()
    local path = tmp_path("damage")
    l2l.safetensors.write(path, { { name = "w", tensor = l2l.randn({ 5, 3 }, { seed = seed }) } })
    local good = read_bytes(path)
    local cuts = { 0, 1, 7, 8, 9, #good - 1 }
    for _ = 1, 20 do cuts[#cuts + 1] = support.int(0, #good - 1) end
    for _, cut in ipairs(cuts) do
      write_bytes(path, good:sub(1, cut))
      local ok, err = pcall(l2l.safetensors.open, path)
      assert.is_false(ok, "truncated at " .. cut)
      assert.is_truthy(tostring(err):find(path, 1, true), err)
    end
    -- a header length that points past the end, a header that is not JSON, a hole
    write_bytes(path, le64(2^40) .. good:sub(9))
    assert.has_error(function() l2l.safetensors.open(path) end)
    write_bytes(path, le64(6) .. "{nope}" .. "\0\0\0\0")
    local ok, err = pcall(l2l.safetensors.open, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("not a JSON object"), err)
    write_by_hand(path, { { name = "a", dtype = "F32", shape = { 2 }, values = { 1, 2 } } })
    local with_hole = read_bytes(path) .. "\0\0\0\0"
    write_bytes(path, with_hole)
    ok, err = pcall(l2l.safetensors.open, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("after the last tensor"), err)
    write_bytes(path, "#include <stdio.h>\nint main(void) { return 0; }\n")
    assert.has_error(function() l2l.safetensors.open(path) end)
    os.remove(path)
    ok, err = pcall(l2l.safetensors.open, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("cannot open", 1, true), err)
  end)

  it("refuses tensors of more dimensions than l2l has, and reads those it has", function()
    local path = tmp_path("ranks")
    -- an empty dimension: valid safetensors, listed, no l2l tensor to read it into
    write_by_hand(path, { { name = "t", dtype = "F32", shape = { 0, 4 }, values = {} } })
    local empty = l2l.safetensors.open(path)
    assert.are.same({ { 0, 4 }, 0, 0 }, { empty.entries.t.shape, empty.entries.t.numel, empty.entries.t.bytes })
    support.refused("'t' of " .. path .. " is empty (shape {0, 4})", empty.read, empty, "t")
    empty:close()
    for ndim = 1, 8 do
      local shape = {}
      for d = 1, ndim do shape[d] = d % 3 + 1 end
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      local values = {}
      for i = 1, n do values[i] = support.uniform(-1, 1) end
      write_by_hand(path, { { name = "t", dtype = "F32", shape = shape, values = values } })
      local ok, file = pcall(l2l.safetensors.open, path)
      if ndim <= 4 then
        assert.is_true(ok, file)
        local t = file:read("t")
        assert.are.same(shape, t:shape())
        for i = 1, n do assert.are.equal(ffi.new("float", values[i]), ffi.new("float", t:data()[i - 1])) end
        file:close()
      else
        assert.is_false(ok, ndim .. " dimensions")
        assert.is_truthy(file:find(("entry 't' has %d dimensions; l2l's tensors have at most 4"):format(ndim), 1, true), file)
      end
    end
    os.remove(path)
  end)

  it("hands out no NaN with a payload: a file's NaN bits become the one quiet NaN", function()
    -- LuaJIT keeps other values inside NaNs' bits: a float from a file spelling a NaN
    -- with a payload, read into Lua, was taken for a pointer (run:step's loss crashed)
    local path = tmp_path("nan")
    local n = 6
    local bits = ffi.new("uint32_t[?]", n, 0xffae0af0, 0x7f800001, 0xff800000, 0x3f800000, 0xfffffffe, 0x7fc00000)
    local floats = ffi.cast("float *", bits)
    local values = {}
    -- written by hand: a file l2l writes carries checksums, which these bits would fail
    write_by_hand(path, { { name = "x", dtype = "F32", shape = { n }, values = { 0, 0, 0, 0, 0, 0 } } })
    local f = l2l.safetensors.open(path)
    local at = f.data_start
    f:close()
    local raw = read_bytes(path)
    write_bytes(path, raw:sub(1, at) .. ffi.string(floats, 4 * n) .. raw:sub(at + 4 * n + 1))
    f = l2l.safetensors.open(path)
    local t = f:read("x")
    f:close()
    local got = ffi.cast("uint32_t *", t:data())
    for i = 0, n - 1 do
      local b, want = bits[i], bits[i]
      local nan = bit.band(b, 0x7f800000) == 0x7f800000 and bit.band(b, 0x7fffff) ~= 0
      if nan then want = 0x7fc00000 end
      assert.are.equal(want, got[i], ("element %d: bits %08x"):format(i, b))
      values[i + 1] = t:get(i + 1)   -- a NaN with a payload crashed here
    end
    assert.is_true(values[1] ~= values[1] and values[2] ~= values[2] and values[5] ~= values[5])
    assert.are.equal(-math.huge, values[3])
    assert.are.equal(1, values[4])
    os.remove(path)
  end)

  it("refuses a header that is not UTF-8, byte for byte as the standard defines it", function()
    -- The reference decodes each sequence to its code point and checks what RFC 3629
    -- forbids: a stray or missing continuation byte, an overlong form, a surrogate, a
    -- code point past U+10FFFF.
    local function valid_utf8(s)
      local i = 1
      while i <= #s do
        local c = s:byte(i)
        local len = c < 0x80 and 1 or c >= 0xF0 and c < 0xF8 and 4 or c >= 0xE0 and c < 0xF0 and 3
                    or c >= 0xC0 and c < 0xE0 and 2 or nil
        if len == nil or i + len - 1 > #s then return false end
        local cp = len == 1 and c or bit.band(c, ({ 0, 0x1F, 0x0F, 0x07 })[len])
        for k = 1, len - 1 do
          local b = s:byte(i + k)
          if bit.band(b, 0xC0) ~= 0x80 then return false end
          cp = cp * 64 + bit.band(b, 0x3F)
        end
        local least = ({ 0, 0x80, 0x800, 0x10000 })[len]
        if cp < least or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return false end
        i = i + len
      end
      return true
    end
    local path = tmp_path("utf8")
    local pieces = { "a", "\195\169", "\226\130\172", "\240\157\132\158", "\244\143\191\191",
                     "\128", "\191", "\192\175", "\193\191", "\224\128\175", "\224\159\191",
                     "\237\160\128", "\237\159\191", "\240\128\128\128", "\244\144\128\128",
                     "\245", "\255", "\194", "\226\130", "\240\157\132" }
    local seen = { [true] = 0, [false] = 0 }
    for _ = 1, 300 do
      local parts = {}
      for k = 1, support.int(1, 4) do
        parts[k] = support.int(0, 2) == 0 and string.char(support.int(0x80, 0xFF)) or pieces[support.int(1, #pieces)]
      end
      local text = table.concat(parts)
      -- the bytes inside a metadata value (a JSON string takes any byte above 0x1F)
      local json = '{"__metadata__":{"note":"' .. text .. '"}}'
      write_bytes(path, le64(#json) .. json)
      local ok, err = pcall(l2l.safetensors.open, path)
      local want = valid_utf8(text)
      seen[want] = seen[want] + 1
      assert.are.equal(want, ok, ("%q: %s"):format(text, tostring(err)))
      if ok then
        assert.are.equal(text, err.metadata.note)
        err:close()
      else
        assert.is_truthy(err:find("the header is not valid UTF-8", 1, true), err)
      end
    end
    assert.is_true(seen[true] > 10 and seen[false] > 10, "both kinds drawn")
    os.remove(path)
  end)

  it("writes tensors made as it goes (produce) as it writes given ones, checksums and all", function()
    local path = tmp_path("lazy")
    collectgarbage()
    local host_before = l2l.pool_stats("host").current
    local shapes, made = {}, {}
    local entries = {}
    for i = 1, support.int(2, 6) do
      shapes[i] = { support.int(1, 40), support.int(1, 9) }
      local name = "t" .. i
      if i % 2 == 0 then
        entries[i] = { name = name, tensor = l2l.randn(shapes[i], { seed = seed + i }) }
        made[name] = entries[i].tensor
      else
        entries[i] = { name = name, shape = shapes[i], dtype = "f32", produce = function()
          local t = l2l.randn(shapes[i], { seed = seed + i })
          made[name] = t:clone()
          return t   -- the writer's, freed once written
        end }
      end
    end
    l2l.safetensors.write(path, entries, { k = "v" })
    local file = l2l.safetensors.open(path)
    file:verify()   -- every checksum in the header is the data's, the produced ones too
    for i = 1, #entries do
      local read = file:read("t" .. i)
      local got, want = flat(read), flat(made["t" .. i])
      read:free()
      assert.are.same(shapes[i], file.entries["t" .. i].shape)
      assert.are.same(want, got)
    end
    file:close()
    for _, t in pairs(made) do t:free() end
    assert.are.equal(host_before, l2l.pool_stats("host").current, "each produced tensor freed once written")
    -- a tensor not of the shape promised, or a produce that fails: an error naming the
    -- entry, and the old file left as it was
    local before = read_bytes(path)
    local bad = { { name = "a", shape = { 3 }, dtype = "f32", produce = function() return l2l.zeros({ 4 }) end } }
    local ok, err = pcall(l2l.safetensors.write, path, bad)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("entry 'a': produce must return a host tensor of f32 and shape {3}", 1, true), tostring(err))
    bad[1].produce = function() error("no state here") end
    ok, err = pcall(l2l.safetensors.write, path, bad)
    assert.is_truthy(tostring(err):find("entry 'a':.*no state here"), tostring(err))
    assert.are.equal(before, read_bytes(path), "a failed write leaves the old file")
    for _, e in ipairs({ { name = "b", shape = { 0 }, dtype = "f32", produce = print },
                         { name = "b", shape = { 2 }, dtype = "f64", produce = print },
                         { name = "b", shape = { 2 }, dtype = "f32", produce = 5 },
                         { name = "b", shape = { 2 }, dtype = "f32", produce = print, tensor = l2l.zeros({ 2 }) } }) do
      assert.is_false(pcall(l2l.safetensors.write, path, { e }))
    end
    os.remove(path)
  end)

  it("leaves nothing behind when it cannot write", function()
    local ok, err = pcall(l2l.safetensors.write, "/nonexistent-dir-l2l/x.safetensors",
                          { { name = "w", tensor = l2l.zeros({ 2 }) } })
    assert.is_false(ok)
    assert.is_truthy(err:find("cannot write /nonexistent-dir-l2l/x.safetensors: No such file or directory", 1, true), err)
    -- a directory is refused before anything is written (not at the rename, after all of it)
    local dir = support.tmpdir()
    ok, err = pcall(l2l.safetensors.write, dir, { { name = "w", tensor = l2l.zeros({ 2 }) } })
    assert.is_false(ok)
    assert.is_truthy(err:find(dir .. " is a directory: nothing was written", 1, true), err)
    -- nor anything else that is no regular file (as root, renaming over /dev/null replaced
    -- the device): a FIFO stays a FIFO
    local fifo = dir .. "/pipe"
    assert.are.equal(0, (support.sh("mkfifo " .. fifo)))
    ok, err = pcall(l2l.safetensors.write, fifo, { { name = "w", tensor = l2l.zeros({ 2 }) } })
    assert.is_false(ok)
    assert.is_truthy(err:find(fifo .. " is a FIFO (a named pipe): nothing was written", 1, true), err)
    assert.are.equal(0, (support.sh("test -p " .. fifo)))
    -- a link to a file is written through, the link left a link; one to nothing is refused
    local target, link = dir .. "/target.safetensors", dir .. "/link.safetensors"
    l2l.safetensors.write(target, { { name = "old", tensor = l2l.zeros({ 1 }) } })
    assert.are.equal(0, (support.sh(("ln -s %s %s"):format(target, link))))
    l2l.safetensors.write(link, { { name = "new", tensor = l2l.ones({ 3 }) } })
    assert.are.equal(0, (support.sh("test -L " .. link)))
    local f = l2l.safetensors.open(target)
    assert.are.same({ 1, 1, 1 }, f:read("new"):totable())
    f:close()
    os.remove(target)
    ok, err = pcall(l2l.safetensors.write, link, { { name = "w", tensor = l2l.zeros({ 2 }) } })
    assert.is_false(ok)
    assert.is_truthy(err:find(link .. " is a link to nothing", 1, true), err)
    assert.are.equal(0, (support.sh("test -L " .. link)))
    os.execute("rm -rf " .. dir)
    assert.has_error(function() l2l.safetensors.write("", {}) end)
    assert.has_error(function() l2l.safetensors.write("/tmp/x", { { name = "w" } }) end)
  end)
end)

----------------------------------------------------------------- checkpoints of a run

local V, S = 13, 9

-- A fresh run of a random configuration `cfg`, layers seeded by cfg.layer_seed.
local function make_run(cfg)
  local D = 16
  local list = { l2l.Embedding{ vocab = V, dim = D, max_seq = S, dropout = cfg.dropout, seed = cfg.layer_seed } }
  for b = 1, cfg.blocks do
    list[#list + 1] = l2l.Block{ dim = D, heads = 2, mlp = 24, causal = true, dropout = cfg.dropout,
                                 memory = b % 2 == 0 and "frugal" or "standard", seed = cfg.layer_seed + b }
  end
  list[#list + 1] = l2l.LMHead{ vocab = V, dim = D, tie = cfg.tie, seed = cfg.layer_seed + 99 }
  local model = l2l.Sequential(list)
  if cfg.freeze then model:freeze(2) end
  local optimizer = ({ l2l.AdamW{ lr = 0.01, weight_decay = 0.1, state = cfg.state },
                       l2l.SGD{ lr = 0.05, momentum = 0.9, nesterov = true, state = cfg.state },
                       l2l.LAMB{ lr = 0.01, state = cfg.state } })[cfg.optimizer]
  local run = l2l.Relay{ model = model, micro_batch = cfg.micro_batch, stash = cfg.stash,
                         optimizer = optimizer, schedule = l2l.CosineLR{ warmup = 3, total = 40, final_ratio = 0.1 },
                         accumulate = cfg.accumulate, clip_global_norm = cfg.clip, seed = cfg.seed,
                         param_slots = cfg.param_slots, loss_scale = cfg.loss_scale,
                         loss_scale_window = 3, master = cfg.master, placement = cfg.placement }
  if cfg.blocks >= 2 then run:set_stash(3, "recompute"); run:set_inner(2, "keep") end
  return run
end

local function batch_for(step, data_seed, B)
  local tok, tgt = l2l.zeros({ B, S }, { dtype = "i32" }), l2l.zeros({ B, S }, { dtype = "i32" })
  local r = l2l.rand({ B, 2 }, { seed = data_seed, stream = step })
  for b = 1, B do
    local t0, stride = math.floor(r:get(b, 1) * V), 1 + math.floor(r:get(b, 2) * 3)
    for s = 1, S do
      tok:set(b, s, (t0 + stride * s) % V)
      tgt:set(b, s, s == 1 and -1 or (t0 + stride * (s + 1)) % V)
    end
  end
  return tok, tgt
end

local function random_config()
  return {
    blocks = support.int(1, 3), dropout = support.int(0, 1) * 0.1, tie = support.int(0, 1) == 1,
    freeze = support.int(0, 3) == 0, optimizer = support.int(1, 3), micro_batch = support.int(1, 4),
    state = ({ "f32", "bf16", "8bit" })[support.int(1, 3)],   -- the optimizer state's precision
    stash = ({ "host", "device", "recompute" })[support.int(1, 3)], accumulate = support.int(1, 2),
    clip = support.int(0, 1) * 0.5, seed = support.int(0, 1000), layer_seed = support.int(1, 1000),
    B = support.int(3, 7), data_seed = support.int(1, 1e6), param_slots = support.int(2, 5),
    -- any scale (not only powers of two, which change nothing but the scale): a resumed run
    -- must go on with the very scale and count of good updates
    loss_scale = support.int(0, 1) * support.int(1, 5000),
  }
end

describe("run:save and l2l.load (seed " .. seed .. ")", function()
  it("resume bit for bit, whatever the configuration and the state's precision (also part way through an accumulation)", function()
    for trial = 1, 3 do
      local cfg = random_config()
      cfg.state = ({ "f32", "bf16", "8bit" })[trial]   -- every precision of the state, each run
      cfg.master = trial == 3 and "bf16" or nil         -- and bf16 masters (stochastic rounding)
      local what = ("trial %d: %s"):format(trial, cjson.encode(cfg))
      local total, at = 12, support.int(1, 11)
      local path = tmp_path("resume")
      local run = make_run(cfg)
      local want, scale_at = {}, nil
      for step = 1, total do
        if step == at + 1 then
          run:save(path, { at = at, cfg = cfg })
          scale_at = run:stats()
        end
        want[step] = run:step(batch_for(step, cfg.data_seed, cfg.B))
      end
      run:sync()
      local final = {}
      for _, p in ipairs(run.model:params()) do final[#final + 1] = p.value:clone() end
      local model_text = tostring(run.model)
      run:free()

      local back = l2l.load(path)
      assert.are.equal(at, back.extra.at, what)
      assert.are.equal(at, back:stats().steps, what)
      assert.are.equal(model_text, tostring(back.model), what)
      assert.are.equal(cfg.micro_batch, back.options.micro_batch, what)
      local st = back:stats()
      for _, k in ipairs({ "loss_scale", "loss_scale_good", "skipped_updates" }) do
        assert.are.equal(scale_at[k], st[k], what .. ": " .. k)
      end
      for step = at + 1, total do
        local loss = back:step(batch_for(step, cfg.data_seed, cfg.B))
        assert.are.equal(want[step], loss, ("%s: step %d"):format(what, step))
      end
      back:sync()
      for k, p in ipairs(back.model:params()) do
        assert.is_true(same_values(final[k], p.value), ("%s: record %s"):format(what, p.name))
      end
      back:free()
      os.remove(path)
    end
  end)

  it("resume bit for bit where a layer was frozen part way through an accumulation", function()
    -- Frozen in the middle of an accumulation, a layer is not updated by it: the gradient
    -- its records collected so far is dropped, so an accumulation's end leaves every
    -- accumulator zero, and a save there (which keeps no gradient) resumes the run that
    -- went on. (Kept, the step-1 gradient reached the update after the layer was thawed in
    -- the run that went on, and not in the resumed one.)
    local cfg = random_config()
    cfg.accumulate, cfg.freeze, cfg.blocks = support.int(2, 3), false, support.int(2, 3)
    local A = cfg.accumulate
    local frozen_at = support.int(1, A - 1)      -- steps done when the layer is frozen (mid-accumulation)
    local thaw_at = A * support.int(1, 2)       -- ... and thawed, at an accumulation's end
    local save_at = thaw_at + A * support.int(0, 1)
    local total = save_at + 2 * A
    local layer = support.int(2, cfg.blocks + 1)
    local what = ("%s, layer %d frozen after step %d, thawed after %d, saved after %d"):format(
      cjson.encode(cfg), layer, frozen_at, thaw_at, save_at)
    local function change(run, done)
      if done == frozen_at then
        run.model:freeze(layer)
        for _, p in ipairs(run.model[layer]:params()) do   -- its partial gradient is gone
          local g = p.grad:data()
          for i = 0, p.grad:numel() - 1 do
            if g[i] ~= 0 then error(("%s: %s's gradient [%d] is %g after the freeze"):format(what, p.name, i, g[i])) end
          end
        end
      end
      if done == thaw_at then run.model:unfreeze(layer) end
    end
    local path = tmp_path("frozen")
    local run, want = make_run(cfg), {}
    for step = 1, total do
      change(run, step - 1)
      if step - 1 == save_at then run:save(path) end
      want[step] = run:step(batch_for(step, cfg.data_seed, cfg.B))
    end
    run:free()
    local back = l2l.load(path)
    for step = save_at + 1, total do
      change(back, step - 1)
      assert.are.equal(want[step], back:step(batch_for(step, cfg.data_seed, cfg.B)), ("%s: step %d"):format(what, step))
    end
    back:free()
    os.remove(path)
  end)

  it("drop a frozen layer's partial gradient whole: an inf in it skips no later update", function()
    -- The partial gradient of a layer frozen mid-accumulation held an inf (written into
    -- p.grad here, as an overflowing micro-batch would leave it): dropping it drops its
    -- non-finite mark too, on the host and on the device, so the update after the thaw runs.
    for _, placement in ipairs({ "host", "device" }) do
      local cfg = random_config()
      cfg.accumulate, cfg.freeze, cfg.blocks, cfg.loss_scale, cfg.clip = 3, false, 1, 0, 0
      cfg.placement = placement
      local run = make_run(cfg)
      run:step(batch_for(1, cfg.data_seed, cfg.B))
      run:sync()
      local p = run.model[2]:params()[1]
      p.grad:set(1, math.huge)
      run:step(batch_for(2, cfg.data_seed, cfg.B))
      run.model:freeze(2)
      run.model:unfreeze(2)
      local before = p.value:to("host")
      run:step(batch_for(3, cfg.data_seed, cfg.B))   -- the accumulation's end: the update
      run:sync()
      assert.are.equal(0, run:stats().skipped_records, placement)
      assert.is_false(same_values(before, p.value:to("host")), placement .. ": " .. p.name .. " was not updated")
      run:free()
    end
  end)

  it("refuse to take out an embedding a head is tied to (its table would be the head's own)", function()
    local cfg = random_config()
    cfg.tie = true
    local run = make_run(cfg)
    run:step(batch_for(1, cfg.data_seed, cfg.B))
    local model, n = run.model, #run.model
    local before = tostring(model)
    for _, f in ipairs({ function() model:remove(1) end,
                         function() model:replace(1, l2l.Embedding{ vocab = V, dim = 16, max_seq = S }) end }) do
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(("its token table is also layer %d's (lm_head, tied to it)"):format(n), 1, true), err)
      assert.are.equal(before, tostring(model))
    end
    -- the relay refuses it alike (a C caller's way), naming the head
    local status = l2l.C.l2l_relay_remove(require("l2l.relay").c_relay(run, "the spec", 1), 0)
    assert.are_not.equal(0, status)
    local message = require("ffi").string(l2l.C.l2l_last_error())
    assert.is_truthy(message:find("is also layer " .. (n - 1) .. "'s (LM head, tied to it)", 1, true), message)
    assert.are.equal(before, tostring(model))
    -- a save after a step still loads; the head may go (the embedding keeps its table)
    local path = tmp_path("tied")
    run:save(path)
    assert.are.equal(before, tostring(l2l.load(path).model))
    model:remove(n)
    assert.are.equal(n - 1, #model)
    run:free()
    os.remove(path)
  end)

  it("refuse to write a model no step could run (mid-change), and write it once it can run again", function()
    -- a change may pass through such a shape (the next step refuses it); a file of it would
    -- load into a run that cannot train
    local cfg = random_config()
    local run = make_run(cfg)
    run:step(batch_for(1, cfg.data_seed, cfg.B))
    local model, path = run.model, tmp_path("mid-change")
    os.remove(path)
    local n = #model
    for _, change in ipairs({
      { function() model:insert(2, l2l.Embedding{ vocab = V, dim = 16, max_seq = S }) end, function() model:remove(2) end,
        "run:save: layer 2 (embedding) is between the embedding and the head" },
      { function() model:clone(n, 2) end, function() model:remove(2) end,
        "run:save: layer 2 (LM head) is between the embedding and the head" },
      { function() model:remove(n) end, nil, ("run:save: layer %d (the last) must be an LM head"):format(n - 1) } }) do
      change[1]()
      local ok, err = pcall(run.save, run, path)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(change[3], 1, true), tostring(err))
      assert.is_nil(io.open(path), "a file was written")
      if change[2] then change[2]() end
    end
    model:insert(n, l2l.LMHead{ vocab = V, dim = 16 })
    run:save(path)
    local back = l2l.load(path)
    assert.are.equal(n, #back.model)
    back:free()
    run:free()
    os.remove(path)
  end)

  it("free what a save made before it returns (the host pool is where it was)", function()
    -- In a process of its own: the host pool is the process's, and what the specs before
    -- this one left behind must not come and go in its count while the saves run.
    local cfg = random_config()
    local dir = support.tmpdir()
    support.write_file(dir .. "/save.lua", ([[
      local l2l = require("l2l")
      local V, S, D = 13, 9, 16
      local list = { l2l.Embedding{ vocab = V, dim = D, max_seq = S, seed = %d } }
      for b = 1, %d do list[#list + 1] = l2l.Block{ dim = D, heads = 2, mlp = 24, causal = true, seed = %d + b } end
      list[#list + 1] = l2l.LMHead{ vocab = V, dim = D, tie = %s }
      local optimizer = ({ l2l.AdamW{ lr = 0.01 }, l2l.SGD{ lr = 0.05, momentum = 0.9 }, l2l.LAMB{ lr = 0.01 } })[%d]
      local run = l2l.Relay{ model = l2l.Sequential(list), micro_batch = %d, stash = %q, optimizer = optimizer }
      local tok = l2l.zeros({ %d, S }, { dtype = "i32" })
      for step = 1, 2 do run:step(tok, tok) end   -- an update has made optimizer state
      run:sync()
      local st = run:state(run.model:params()[1], "m")
      assert(st, "no optimizer state to save")
      st:free()
      collectgarbage("stop")   -- only what save frees itself counts
      local before = l2l.pool_stats("host").current
      for i = 1, 3 do
        run:save(%q)
        local now = l2l.pool_stats("host").current
        if now ~= before then error(("save %%d: the host pool holds %%d bytes, %%d before it"):format(i, now, before)) end
      end
      print("kept nothing")
    ]]):format(cfg.layer_seed, cfg.blocks, cfg.layer_seed, tostring(cfg.tie), cfg.optimizer, cfg.micro_batch,
               cfg.stash, cfg.B, dir .. "/frees.l2l"))
    local status, out = support.sh(("%s/l2l %s/save.lua"):format(support.build_dir, dir))
    os.execute("rm -rf " .. dir)
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("kept nothing", 1, true), out)
  end)

  -- A saved run of a random configuration (one update done) and edited(edit), which
  -- writes the file again with its l2l description changed by edit(desc).
  local function saved_for_editing(name)
    local cfg = random_config()
    cfg.accumulate = 1
    local path = tmp_path(name)
    local run = make_run(cfg)
    run:step(batch_for(1, cfg.data_seed, cfg.B))
    run:save(path)
    run:free()
    local good = read_bytes(path)
    local function edited(edit)
      local n = 0
      for i = 8, 1, -1 do n = n * 256 + good:byte(i) end
      local header = cjson.decode(good:sub(9, 8 + n))
      local desc = cjson.decode(header.__metadata__.l2l)
      edit(desc)
      header.__metadata__.l2l = cjson.encode(desc)
      local json = cjson.encode(header)
      json = json .. string.rep(" ", (8 - #json % 8) % 8)
      write_bytes(path, le64(#json) .. json .. good:sub(9 + n))
    end
    return path, edited, cfg
  end

  it("refuse numbers in the description that would be truncated, and bound the threads it asks for", function()
    local path, edited = saved_for_editing("numbers")
    for _, case in ipairs {
      { function(d) d.layers[2].rng_id = 2 ^ 32 + 5 end, "layer 2: rng_id must be an integer from 0 to" },
      { function(d) d.layers[1].rng_id = -1 end, "layer 1: rng_id must be an integer" },
      { function(d) d.records[1].updates = 1.5 end, "updates must be an integer" },
      { function(d) d.records[1].updates = 2 ^ 53 end, "updates must be an integer" },
      { function(d) d.progress.steps = 2.5 end, "progress: steps must be an integer" },
      { function(d) d.progress.steps = cjson.null end, "progress: steps must be an integer from 0 to 9007199254740991, got userdata" },
      { function(d) d.records[1].updates = cjson.null end, "updates must be an integer" },
      { function(d) d.relay.seed = 2 ^ 64 end, "option 'seed' must be at most" },
      { function(d) d.relay.device_budget = 2 ^ 64 end, "option 'device_budget' must be at most" },
      { function(d) d.relay.accumulate = 2 ^ 40 end, "option 'accumulate' must be at most" },
      -- a 100 KB string where a policy goes: refused at once, shortened in the message (a
      -- pattern that backtracked over it took minutes)
      { function(d) d.layers[2].stash = ("A"):rep(100000) end, 'got string "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA..."' },
    } do
      edited(case[1])
      local ok, err = pcall(l2l.load, path)
      assert.is_false(ok, case[2])
      assert.is_truthy(tostring(err):find(case[2], 1, true), err)
    end
    -- a thread count beyond this machine's cores gives way to one per core
    edited(function(d) d.relay.optimizer_threads = 1024 end)
    local back = l2l.load(path)
    assert.are.equal(l2l.threads() >= 1024 and 1024 or 0, back.options.optimizer_threads)
    back:free()
    os.remove(path)
  end)

  it("refuse a description that asks for more than the file holds before building anything", function()
    local path, edited, cfg = saved_for_editing("sizes")
    local last = cfg.blocks + 2
    local huge = 2 ^ 20
    for _, case in ipairs {
      -- 2^20 x 4 * 2^20 floats (and as many for gradients and optimizer state): 16 TiB
      { function(d) d.layers[2].options.dim = huge; d.layers[2].options.mlp = 4 * huge end, "'2.ln1.weight' is f32 (16) but" },
      { function(d) d.layers[2].options.mlp = 4 * huge end, "'2.mlp.fc.weight' is f32 (16,24) but layer 2 (block) needs f32 or bf16 (16,4194304)" },
      { function(d) d.layers[1].options.vocab = 2 ^ 24; d.layers[last].options.vocab = 2 ^ 24 end, "'1.wte' is f32 (13,16) but" },
      { function(d) d.layers[1].options.max_seq = 2 ^ 24 end, "'1.wpe' is f32 (9,16) but" },
      { function(d) d.layers[2].options.dim = 2 ^ 24 end, "needs f32 or bf16 (16777216)" },
      { function(d) d.layers[1].options.type_vocab = 2 ^ 24 end, "has no tensor '1.wtt'" },
      { function(d) table.insert(d.layers, 2, d.layers[2]) end, "has no tensor '" },
      { function(d) d.layers[2].options.heads = 0 end, "layer 2 (block): l2l.Block: option 'heads' must be an integer >= 1" },
    } do
      edited(case[1])
      collectgarbage()
      l2l.reset_peak("host")
      local before = l2l.pool_stats("host")
      local ok, err = pcall(l2l.load, path)
      assert.is_false(ok, case[2])
      assert.is_truthy(tostring(err):find(case[2], 1, true), err)
      assert.is_truthy(tostring(err):find("^l2l%.load: "), err)
      -- refused before the model was built: the host pool never grew by a layer's worth
      local grew = l2l.pool_stats("host").peak - before.current
      assert.is_true(grew < 2 ^ 20, ("%s: the host pool grew by %d bytes before the refusal"):format(case[2], grew))
    end
    -- a tied head's projection is its embedding's table: a vocabulary that differs from
    -- the embedding's is refused before the (V, D) projection is made
    if cfg.tie then
      edited(function(d) d.layers[last].options.vocab = 2 ^ 24 end)
      local ok, err = pcall(l2l.load, path)
      assert.is_false(ok)
      assert.is_truthy(err:find("'1.wte' is f32 (13,16) but layer " .. last .. " (lm_head) needs f32 or bf16 (16777216,16)", 1, true), err)
    end
    edited(function() end)   -- unchanged, it loads
    l2l.load(path):free()
    os.remove(path)
  end)

  it("refuse a damaged or truncated checkpoint without a crash", function()
    local cfg = random_config()
    local path = tmp_path("ckdamage")
    local run = make_run(cfg)
    run:step(batch_for(1, cfg.data_seed, cfg.B))
    run:save(path)
    run:free()
    local good = read_bytes(path)
    for _ = 1, 12 do
      local cut = support.int(0, #good - 1)
      write_bytes(path, good:sub(1, cut))
      local ok, err = pcall(l2l.load, path)
      assert.is_false(ok, "truncated at " .. cut)
      assert.is_truthy(tostring(err):find("^l2l%.load: "), err)
    end
    -- bytes changed in the header: an error, or (where JSON stays valid) a loaded run
    for _ = 1, 12 do
      local at = support.int(9, 8 + 200)
      local damaged = good:sub(1, at - 1) .. string.char(support.int(0, 255)) .. good:sub(at + 1)
      write_bytes(path, damaged)
      local ok, result = pcall(l2l.load, path)
      assert.is_true(ok or type(result) == "string", tostring(result))
      if ok then result:free() end
    end
    -- a safetensors file that is not a checkpoint
    l2l.safetensors.write(path, { { name = "w", tensor = l2l.zeros({ 3 }) } })
    local ok, err = pcall(l2l.load, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("not an l2l checkpoint"), err)
    os.remove(path)
  end)

  it("refuse a tensor whose bytes were damaged, naming it; load files without checksums", function()
    local cfg = random_config()
    cfg.accumulate = 1
    local path = tmp_path("cksum")
    local run = make_run(cfg)
    for step = 1, 2 do run:step(batch_for(step, cfg.data_seed, cfg.B)) end
    run:save(path)
    run:free()
    local good = read_bytes(path)
    local n = 0
    for i = 8, 1, -1 do n = n * 256 + good:byte(i) end
    local header = cjson.decode(good:sub(9, 8 + n))
    -- the checksums an independent reader finds: one per tensor, 16 hex digits
    local sums = cjson.decode(header.__metadata__.l2l_xxh3)
    local names = {}
    for name, e in pairs(header) do
      if name ~= "__metadata__" then
        names[#names + 1] = name
        assert.is_truthy(type(sums[name]) == "string" and sums[name]:match("^%x+$") and #sums[name] == 16, name)
      end
    end
    -- 4 KiB (or the whole tensor, if smaller) of random bytes inside one tensor's data
    table.sort(names)
    local victim = names[support.int(1, #names)]
    local from, to = header[victim].data_offsets[1], header[victim].data_offsets[2]
    local len = math.min(4096, to - from)
    local at = from + support.int(0, to - from - len)
    local noise = {}
    for i = 1, len do noise[i] = string.char(support.int(0, 255)) end
    local damaged = good:sub(1, 8 + n + at) .. table.concat(noise) .. good:sub(8 + n + at + len + 1)
    if damaged == good then damaged = good:sub(1, 8 + n + at) .. string.char((good:byte(8 + n + at + 1) + 1) % 256)
                                      .. good:sub(8 + n + at + 2) end
    write_bytes(path, damaged)
    local ok, err = pcall(l2l.load, path)
    assert.is_false(ok, "a damaged tensor loaded (" .. victim .. ")")
    assert.is_truthy(err:find("tensor '" .. victim:gsub("%p", "%%%0") .. "' is damaged"), err)
    -- load_weights checks every tensor before it changes the model: nothing changed
    local twin = make_run(cfg)
    local before = {}
    for k, p in ipairs(twin.model:params()) do before[k] = p.value:clone() end
    ok, err = pcall(l2l.load_weights, twin.model, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("is damaged", 1, true), err)
    for k, p in ipairs(twin.model:params()) do assert.is_true(same_values(before[k], p.value), p.name) end
    -- the same file without its checksums (another tool's, an import): it loads
    header.__metadata__.l2l_xxh3 = nil
    local json = cjson.encode(header)
    json = json .. string.rep(" ", (8 - #json % 8) % 8)
    write_bytes(path, le64(#json) .. json .. good:sub(9 + n))
    local back = l2l.load(path)
    back:free()
    twin:free()
    os.remove(path)
  end)

  it("hold no more host memory after a load than the run they continue", function()
    local cfg = random_config()
    cfg.accumulate = 1
    local path = tmp_path("memory")
    collectgarbage()
    collectgarbage()
    local empty = l2l.pool_stats("host").current
    local run = make_run(cfg)
    for step = 1, 2 do run:step(batch_for(step, cfg.data_seed, cfg.B)) end
    run:sync()
    collectgarbage()
    collectgarbage()
    local base = l2l.pool_stats("host").current - empty   -- the model and its EPS state
    run:save(path)
    run:free()
    run = nil
    collectgarbage()
    collectgarbage()
    assert.are.equal(empty, l2l.pool_stats("host").current, "the freed run left host memory")
    collectgarbage("stop")   -- what load leaves behind, before any collector frees it
    local back = l2l.load(path)
    local loaded = l2l.pool_stats("host").current - empty
    collectgarbage("restart")
    -- the run as it was: the same bytes, not 8 a parameter more (the state's read copies)
    assert.is_true(loaded <= base,
                   ("loaded run %d bytes, the run it continues %d"):format(loaded, base))
    back:free()
    os.remove(path)
  end)

  it("load_weights refuses shapes that do not match and leaves the model as it was", function()
    local cfg = random_config()
    cfg.blocks = 1
    local path = tmp_path("weights")
    local run = make_run(cfg)
    run:save(path)
    run:free()
    local other = l2l.Sequential{ l2l.Embedding{ vocab = V + 1, dim = 16, max_seq = S },
                                  l2l.Block{ dim = 16, heads = 2, mlp = 24, causal = true },
                                  l2l.LMHead{ vocab = V + 1, dim = 16 } }
    local before = other[2]:params()[3].value:clone()
    local ok, err = pcall(l2l.load_weights, other, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("1.wte", 1, true), err)
    assert.is_true(same_values(before, other[2]:params()[3].value))
    -- the same shapes load
    local twin = make_run(cfg)
    for _, p in ipairs(twin.model:params()) do p.value:fill(0) end
    l2l.load_weights(twin.model, path)
    local back = l2l.load(path)
    for k, p in ipairs(twin.model:params()) do
      assert.is_true(same_values(back.model:params()[k].value, p.value), p.name)
    end
    os.remove(path)
  end)

  it("keep layers written in Lua, rebuilt from the constructor given at load", function()
    -- y = x + x W: a custom kind with one (D,D) parameter
    local Mix = l2l.layer_kind {
      name = "Mix", options = { "std" },
      params = function(o) return { { name = "w", shape = { o.dim, o.dim }, std = o.std } } end,
      forward = function(self, y, x)
        local n = x:dim(1) * x:dim(2)
        local y2 = self:reshape(y, { n, self.dim })
        y2:copy(self:reshape(x, { n, self.dim }))
        l2l.ops.gemm(y2, self:reshape(x, { n, self.dim }), self:param("w"), { beta = 1 })
      end,
      backward = function(self, dx, dy, x)
        local n = x:dim(1) * x:dim(2)
        local dx2, dy2 = self:reshape(dx, { n, self.dim }), self:reshape(dy, { n, self.dim })
        dx2:copy(dy2)
        l2l.ops.gemm(dx2, dy2, self:param("w"), { trans_b = true, beta = 1 })
        l2l.ops.gemm(self:grad("w"), self:reshape(x, { n, self.dim }), dy2, { trans_a = true, beta = 1 })
      end,
    }
    local model = l2l.Sequential{ l2l.Embedding{ vocab = V, dim = 16, max_seq = S },
                                  Mix{ dim = 16, std = 0.1 }, l2l.LMHead{ vocab = V, dim = 16 } }
    local run = l2l.Relay{ model = model, micro_batch = 2, optimizer = l2l.AdamW{ lr = 0.01 } }
    local path = tmp_path("custom")
    local data_seed = support.int(1, 1e6)
    run:step(batch_for(1, data_seed, 4))
    run:save(path)
    local want = run:step(batch_for(2, data_seed, 4))
    run:free()
    local ok, err = pcall(l2l.load, path)
    assert.is_false(ok)
    assert.is_truthy(err:find("custom kind 'Mix'"), err)
    -- a constructor whose parameters differ from the file's is refused before it builds
    local Wide = l2l.layer_kind { name = "Mix", options = { "std" }, forward = function() end,
                                  backward = function() end,
                                  params = function(o) return { { name = "w", shape = { o.dim, 2 ^ 24 }, std = 1 } } end }
    ok, err = pcall(l2l.load, path, { kinds = { Mix = Wide } })
    assert.is_false(ok)
    assert.is_truthy(err:find("'2.w' is f32 (16,16) but layer 2 (Mix) needs f32 or bf16 (16,16777216)", 1, true), err)
    ok, err = pcall(l2l.load, path, { kinds = { Mix = print } })
    assert.is_false(ok)
    assert.is_truthy(err:find("layer 2 (Mix): not a constructor from l2l.layer_kind", 1, true), err)
    local back = l2l.load(path, { kinds = { Mix = Mix } })
    assert.are.equal("Mix", back.model[2]:label())
    assert.are.equal(want, back:step(batch_for(2, data_seed, 4)))
    back:free()
    os.remove(path)
  end)

  it("check their arguments", function()
    local cfg = random_config()
    local run = make_run(cfg)
    assert.has_error(function() run:save(42) end, "run:save: path must be a non-empty string")
    assert.has_error(function() run:save("/tmp/x", 5) end, "run:save: extra must be a table or nil")
    local ok, err = pcall(run.save, run, "/nonexistent-dir-l2l/run.safetensors")
    assert.is_false(ok)
    assert.is_truthy(err:find("^run:save: .*nonexistent%-dir%-l2l"), err)
    assert.has_error(function() l2l.load(nil) end, "l2l.load: path must be a non-empty string")
    ok, err = pcall(l2l.load, "/nonexistent-dir-l2l/run.safetensors")
    assert.is_false(ok)
    assert.is_truthy(err:find("^l2l%.load: cannot open"), err)
    ok, err = pcall(l2l.load, "x", { lr = 1 })
    assert.is_false(ok)
    assert.is_truthy(err:find("unknown option 'lr'"), err)
    run:free()
  end)

  it("survive a process killed at any moment while saving: the file is the old one or the new one", function()
    local path = tmp_path("kill")
    -- The child saves, in a loop, a run whose every weight equals the save's number n,
    -- with n in extra; a file that loads must be whole: all weights equal to its n. Its
    -- argument, if any, stops it after that many saves.
    local script = tmp_path("killer") .. ".lua"
    write_bytes(script, ([[
      local l2l = require("l2l")
      local model = l2l.Sequential{ l2l.Embedding{ vocab = 64, dim = 256, max_seq = 8 },
                                    l2l.Block{ dim = 256, heads = 4, causal = true },
                                    l2l.LMHead{ vocab = 64, dim = 256 } }
      local run = l2l.Relay{ model = model }
      for n = 1, tonumber(arg[1]) or 1e9 do
        for _, p in ipairs(model:params()) do p.value:fill(n) end
        run:save(%q, { n = n })
      end
    ]]):format(path))
    local status, out = support.sh(("%s %s 1"):format(exe, script))   -- a first file, however slow the machine
    assert.are.equal(0, status, out)
    local kills, loads = 0, 0
    for _ = 1, 6 do
      local delay = support.uniform(0.05, 0.6)
      support.sh(("timeout --foreground -s KILL %.3f %s %s"):format(delay, exe, script))
      kills = kills + 1
      local run = l2l.load(path)    -- must not fail: the last complete save is there
      loads = loads + 1
      local n = run.extra.n
      assert.is_truthy(n >= 1, "n = " .. tostring(n))
      for _, p in ipairs(run.model:params()) do
        local v = p.value:data()
        for i = 0, p.value:numel() - 1, 97 do
          assert.are.equal(n, v[i], ("%s after a kill at %.3f s"):format(p.name, delay))
        end
      end
      run:free()
    end
    assert.are.equal(kills, loads)
    -- A kill leaves its temporary; the next save to the path removes those of processes
    -- that are gone, and only those: a dead pid's goes, a live
    -- one's (pid 1, or a save in progress) and another host's stay.
    local host = io.popen("hostname"):read("*l"):gsub("[^%w%-]", "_")
    -- a pid no process can have: above the kernel's largest (a child that has exited could
    -- see its pid reused on a busy machine)
    local dead = tonumber(support.read_file("/proc/sys/kernel/pid_max")) + 1
    local stale, live, other = ("%s.tmp.%s.%d"):format(path, host, dead), ("%s.tmp.%s.1"):format(path, host),
                               ("%s.tmp.%s-elsewhere.%d"):format(path, host, dead)
    for _, name in ipairs({ stale, live, other }) do write_bytes(name, "partial") end
    local run = l2l.load(path)
    run:save(path)
    run:free()
    local left = {}
    for name in io.popen(("ls %s.tmp.* 2>/dev/null"):format(path)):lines() do left[#left + 1] = name end
    table.sort(left)
    local want = { live, other }
    table.sort(want)
    assert.are.same(want, left)
    os.remove(path)
    os.remove(script)
    os.execute(("rm -f %s.tmp.*"):format(path))
  end)
end)

----------------------------------------------------------------- GPT-2 import

-- float64 GPT-2 forward: logits[b][s][v] for tokens[b][s] (0-based ids), weights W[name]
-- as flat lists in the file's row-major layouts.
local function gpt2_reference(W, tokens, cfg)
  local D, H, V, L, F = cfg.dim, cfg.heads, cfg.vocab, cfg.blocks, cfg.mlp
  local hd = D / H
  local function at(name, r, c, cols) return W[name][(r - 1) * cols + c] end
  local function layernorm(x, g, b)
    local mean, var = 0, 0
    for i = 1, D do mean = mean + x[i] end
    mean = mean / D
    for i = 1, D do var = var + (x[i] - mean) ^ 2 end
    local rstd = 1 / math.sqrt(var / D + 1e-5)
    local y = {}
    for i = 1, D do y[i] = (x[i] - mean) * rstd * W[g][i] + W[b][i] end
    return y
  end
  local function linear(x, w, b, n_in, n_out)
    local y = {}
    for o = 1, n_out do
      local s = W[b][o]
      for i = 1, n_in do s = s + x[i] * at(w, i, o, n_out) end
      y[o] = s
    end
    return y
  end
  local function gelu(x)
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
  end
  local out = {}
  for b, row in ipairs(tokens) do
    local xs = {}
    for s, t in ipairs(row) do
      local x = {}
      for i = 1, D do x[i] = at("wte.weight", t + 1, i, D) + at("wpe.weight", s, i, D) end
      xs[s] = x
    end
    for l = 0, L - 1 do
      local p = "h." .. l .. "."
      local qkv = {}
      for s = 1, #row do qkv[s] = linear(layernorm(xs[s], p .. "ln_1.weight", p .. "ln_1.bias"),
                                          p .. "attn.c_attn.weight", p .. "attn.c_attn.bias", D, 3 * D) end
      for s = 1, #row do
        local ctx = {}
        for h = 0, H - 1 do
          local scores, top = {}, -math.huge
          for u = 1, s do
            local dot = 0
            for i = 1, hd do dot = dot + qkv[s][h * hd + i] * qkv[u][D + h * hd + i] end
            scores[u] = dot / math.sqrt(hd)
            top = math.max(top, scores[u])
          end
          local sum = 0
          for u = 1, s do scores[u] = math.exp(scores[u] - top); sum = sum + scores[u] end
          for i = 1, hd do
            local c = 0
            for u = 1, s do c = c + scores[u] / sum * qkv[u][2 * D + h * hd + i] end
            ctx[h * hd + i] = c
          end
        end
        local a = linear(ctx, p .. "attn.c_proj.weight", p .. "attn.c_proj.bias", D, D)
        for i = 1, D do xs[s][i] = xs[s][i] + a[i] end
      end
      for s = 1, #row do
        local hid = linear(layernorm(xs[s], p .. "ln_2.weight", p .. "ln_2.bias"), p .. "mlp.c_fc.weight",
                           p .. "mlp.c_fc.bias", D, F)
        for i = 1, F do hid[i] = gelu(hid[i]) end
        local m = linear(hid, p .. "mlp.c_proj.weight", p .. "mlp.c_proj.bias", F, D)
        for i = 1, D do xs[s][i] = xs[s][i] + m[i] end
      end
    end
    out[b] = {}
    for s = 1, #row do
      local y = layernorm(xs[s], "ln_f.weight", "ln_f.bias")
      local logits = {}
      for v = 1, V do
        local z = 0
        for i = 1, D do z = z + y[i] * at("wte.weight", v, i, D) end
        logits[v] = z
      end
      out[b][s] = logits
    end
  end
  return out
end

describe("l2l.import_gpt2 (seed " .. seed .. ")", function()
  it("builds the model a GPT-2 file describes and computes GPT-2's logits", function()
    local cfg = { dim = 8 * support.int(1, 3), heads = 2, vocab = support.int(11, 30), blocks = support.int(1, 2),
                  positions = support.int(6, 12) }
    cfg.mlp = 4 * cfg.dim
    local D, V = cfg.dim, cfg.vocab
    local tensors, W = {}, {}
    local prefix = support.int(0, 1) == 1 and "transformer." or ""
    local function add(name, shape, std, mean)
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      local values = {}
      for i = 1, n do values[i] = (mean or 0) + std * support.normal() end
      -- the reference computes with the f32 values the file holds
      local f = ffi.new("float[?]", n, values)
      for i = 1, n do values[i] = f[i - 1] end
      W[name] = values
      tensors[#tensors + 1] = { name = prefix .. name, dtype = "F32", shape = shape, values = values }
    end
    add("wte.weight", { V, D }, 0.5)
    add("wpe.weight", { cfg.positions, D }, 0.3)
    for l = 0, cfg.blocks - 1 do
      local p = "h." .. l .. "."
      add(p .. "ln_1.weight", { D }, 0.2, 1); add(p .. "ln_1.bias", { D }, 0.2)
      add(p .. "attn.c_attn.weight", { D, 3 * D }, 0.4); add(p .. "attn.c_attn.bias", { 3 * D }, 0.2)
      add(p .. "attn.c_proj.weight", { D, D }, 0.3); add(p .. "attn.c_proj.bias", { D }, 0.2)
      add(p .. "ln_2.weight", { D }, 0.2, 1); add(p .. "ln_2.bias", { D }, 0.2)
      add(p .. "mlp.c_fc.weight", { D, cfg.mlp }, 0.3); add(p .. "mlp.c_fc.bias", { cfg.mlp }, 0.2)
      add(p .. "mlp.c_proj.weight", { cfg.mlp, D }, 0.2); add(p .. "mlp.c_proj.bias", { D }, 0.2)
      -- the causal-mask buffer older files carry
      tensors[#tensors + 1] = { name = prefix .. p .. "attn.bias", dtype = "F32", shape = { 1 }, values = { 1 } }
    end
    add("ln_f.weight", { D }, 0.2, 1); add("ln_f.bias", { D }, 0.2)
    local path = tmp_path("gpt2")
    write_by_hand(path, tensors, { format = "pt" })

    local model = l2l.import_gpt2(path, { heads = cfg.heads })
    assert.are.equal(cfg.blocks + 2, #model)
    assert.are.equal(cfg.positions, model[1]:config().max_seq)
    local B, S = support.int(1, 2), support.int(2, cfg.positions)
    local rows = {}
    local tok = l2l.zeros({ B, S }, { dtype = "i32" })
    for b = 1, B do
      rows[b] = {}
      for s = 1, S do rows[b][s] = support.int(0, V - 1); tok:set(b, s, rows[b][s]) end
    end
    local logits = model:forward({ tokens = tok, training = false })
    local want = gpt2_reference(W, rows, cfg)
    local got_flat, want_flat = flat(logits), {}
    for b = 1, B do for s = 1, S do for v = 1, V do want_flat[#want_flat + 1] = want[b][s][v] end end end
    -- relative to each logit and to the logits' scale (their RMS): a logit near 0 is a
    -- difference of larger terms, its rounding is of their size, not its own
    local sq = 0
    for _, w in ipairs(want_flat) do sq = sq + w * w end
    local err = support.rel_err(got_flat, want_flat, math.sqrt(sq / #want_flat))
    assert.is_true(support.within(err, 1e-5, "imported GPT-2 logits") and err < 1e-5,
                   ("relative error %.3g"):format(err))

    -- max_seq keeps the first positions; a wrong head count or a missing tensor is an error
    local short = l2l.import_gpt2(path, { heads = cfg.heads, max_seq = 3 })
    assert.are.equal(3, short[1]:config().max_seq)
    assert.has_error(function() l2l.import_gpt2(path, { heads = 5 }) end)
    assert.has_error(function() l2l.import_gpt2(path, { heads = cfg.heads, max_seq = cfg.positions + 1 }) end)
    assert.has_error(function() l2l.import_gpt2(path, { head = 2 }) end)
    table.remove(tensors, 5)
    write_by_hand(path, tensors)
    local ok, msg = pcall(l2l.import_gpt2, path, { heads = cfg.heads })
    assert.is_false(ok)
    assert.is_truthy(msg:find("has no tensor"), msg)
    os.remove(path)
  end)
end)
