-- SPDX-License-Identifier: MIT
-- bench/spill_capacity.lua — a model whose EPS is larger than this machine's RAM trains
-- on the CPU backend with a small host budget (issue "Beyond host memory"): a GPT of
-- --blocks blocks of width --dim (the defaults: 1.8 B parameters, 29 GB of masters,
-- gradient accumulators and AdamW state, on a machine of 24 GiB), its optimizer state
-- in a spill file in --dir. It trains --steps steps, saves a checkpoint (the state read
-- from the spill file record by record as the file is written), takes one more step,
-- frees everything, loads the checkpoint into a new spilled relay and takes that step
-- again: the loss must be the same to the bit. Printed: each step's time, loss, disk
-- bytes and the process's resident memory, the checkpoint's size and times, and the
-- process's peak resident memory (VmHWM) against the host budget.
-- Run:  build/l2l bench/spill_capacity.lua [--dir /var/tmp] [--dim 2048] [--blocks 36] [--steps 3] [--room 1]
-- Needs about 1.2 x the EPS in free disk space (the spill file and the checkpoint).
-- Must never: assert beyond the one loss it compares: the figures go to bench/RESULTS.md.
local l2l = require("l2l")
local text_mod = require("l2l.text")
local now = require("l2l.progress").now

local opt = { dir = os.getenv("TMPDIR") or "/var/tmp", dim = 2048, blocks = 36, steps = 3, room = 1 }
for i = 1, #arg, 2 do
  local key = arg[i]:match("^%-%-(%a+)$")
  if key == nil or opt[key] == nil then
    error("usage: build/l2l bench/spill_capacity.lua [--dir DIR] [--dim D] [--blocks L] [--steps N] [--room GIB]", 0)
  end
  opt[key] = type(opt[key]) == "number" and tonumber(arg[i + 1]) or arg[i + 1]
end
local GiB, V, S = 2 ^ 30, 256, 16
io.stdout:setvbuf("line")   -- each line as it comes (a long run)

-- A "key: N kB" line of a /proc file, in bytes.
local function proc_bytes(file, key)
  local f = assert(io.open(file))
  local t = f:read("*a")
  f:close()
  return tonumber(t:match(key .. ":%s*(%d+) kB")) * 1024
end
local function status(key) return proc_bytes("/proc/self/status", key) end
local function meminfo(key) return proc_bytes("/proc/meminfo", key) end

local text = {}
for i = 1, 200000 do text[i] = string.char(32 + (i * 7919 + math.floor(i / 7)) % 90) end
text = table.concat(text)
local function batch(step) return text_mod.batch(text, 1, S, 1, step) end

local t0 = now()
local list = { l2l.Embedding { vocab = V, dim = opt.dim, max_seq = S, seed = 1 } }
for b = 1, opt.blocks do list[#list + 1] = l2l.Block { dim = opt.dim, heads = 16, seed = 1 + b } end
list[#list + 1] = l2l.LMHead { vocab = V, dim = opt.dim, tie = true }
local model = l2l.Sequential(list)
local n = model:nparams()
-- the budget: the masters (4 bytes a parameter: the gradient accumulators pass, in memory
-- from their arrival to their update) and --room GiB for the windows and optimizer state
local budget = math.floor(4 * n + opt.room * GiB)
print(("machine: %.1f GiB of RAM; model: %d blocks of width %d, %.3f B parameters, made in %.0f s"):format(
  meminfo("MemTotal") / GiB, opt.blocks, opt.dim, n / 1e9, now() - t0))
print(("EPS in RAM would be %.1f GiB (16 bytes a parameter); host budget %.1f GiB (%.2f x less); spill directory %s"):format(
  16 * n / GiB, budget / GiB, 16 * n / budget, opt.dir))

local function relay_for(m)
  return l2l.Relay { model = m, micro_batch = 1, stash = "host", seed = 1, optimizer = l2l.AdamW { lr = 1e-4 },
                     spill = opt.dir, host_budget = budget }
end

local function report(run, step, loss, seconds)
  run:sync()
  local st = run:stats()
  print(("step %d: loss %.6f in %.1f s; EPS host %.2f GiB, disk read %.2f GiB written %.2f GiB (file %.2f GiB, %d late reads, %d gradient waits); resident %.2f GiB"):format(
    step, loss, seconds, st.host_eps_bytes / GiB, st.spill_read_bytes / GiB, st.spill_written_bytes / GiB,
    st.spill_file_bytes / GiB, st.spill_late_reads, st.spill_grad_waits, status("VmRSS") / GiB))
end

local run = relay_for(model)
for step = 1, opt.steps do
  local t = now()
  local loss = run:step(batch(step))
  report(run, step, loss, now() - t)
end
local path = opt.dir .. "/l2l-capacity.l2l"
local t = now()
run:save(path)
local f = io.open(path, "rb")
local size = f:seek("end")
f:close()
print(("checkpoint: %.2f GiB written in %.1f s; resident %.2f GiB"):format(size / GiB, now() - t, status("VmRSS") / GiB))
t = now()
local want = run:step(batch(opt.steps + 1))
report(run, opt.steps + 1, want, now() - t)
run:free()
for i = #model, 1, -1 do model[i]:free() end
list, model, run = nil, nil, nil
collectgarbage()
collectgarbage()

t = now()
local loaded = l2l.load(path, { spill = opt.dir, host_budget = budget })
print(("loaded in %.1f s; resident %.2f GiB"):format(now() - t, status("VmRSS") / GiB))
t = now()
local got = loaded:step(batch(opt.steps + 1))
report(loaded, opt.steps + 1, got, now() - t)
print(("the step after the checkpoint: loss %.17g continuing, %.17g loaded: %s"):format(want, got,
  want == got and "the same to the bit" or "DIFFERENT"))
loaded:free()
os.remove(path)
print(("peak resident memory %.2f GiB (VmHWM) against a host budget of %.2f GiB: %.2f GiB above it"):format(
  status("VmHWM") / GiB, budget / GiB, (status("VmHWM") - budget) / GiB))
