-- SPDX-License-Identifier: MIT
-- l2l_gpt.lua — the l2l side of bench/vs_torch.sh: the GPT-2-shaped model of
-- bench/torch_gpt.py (pre-LN, tanh GELU, learned positions, tied LM head, no dropout)
-- trained through the relay on random tokens, weights streamed from the EPS, and one JSON
-- line out: tokens/s, seconds a step, the device pool's peak, and where the copy time went.
--
--   build/l2l bench/l2l_gpt.lua layers=12 dim=768 batch=8 [seq=1024 steps=5
--       micro_batch=4 precision=bf16 grad_precision=bf16 stash=host inner=recompute
--       memory=frugal device=cuda placement=host device_budget=0 plan= state=f32 master=f32
--       accumulate=1 phases=0]
--
-- placement=auto with device_budget=BYTES keeps on the device the records that fit beside
-- the step (issue 49: an ordinary GPU trainer's way while the model fits), plan=auto lets
-- the planner choose the micro-batch and policies within the same budget. state=8bit (or
-- bf16) keeps AdamW's moments compact, master=bf16 the GEMM weights' and tables' masters.
-- accumulate=auto: the tokens an update takes are the plan's (l2l.plan{accumulate =
-- "auto"}: the smallest accumulation from which the host optimizer hides under the step,
-- planned within device_budget, or 90 % of the GPU's free memory), and the relay runs that
-- plan; the timed steps are then a whole number of accumulations (steps rounded up).
--
-- memory=frugal by default: its attention keeps only the row log-sum-exp, and with 16-bit
-- precision runs on tensor cores (cuDNN, or kernels/attention_flash.cu); standard keeps S x S
-- probabilities, which only the fp32 attention kernels write.
--
-- The timed steps follow warm-up steps, an update's worth (the caching allocator's first round, the
-- pinned pool's first extents). tokens_per_second is by the wall clock over the timed
-- steps, run:sync() included (the last step's updates run after it returns, and each
-- step's forward waits for the last one's); step_seconds_stats is the relay's own figure
-- (each call, from its checks to its return: the optimizer's tail after a step's backward
-- is left out; before 2026-11-28 tokens_per_second was from it). profile=FILE writes the
-- timed steps' per-op profile (l2l.profile) to FILE and its table to stderr.
-- host_peak_resident is the process's peak resident memory (VmHWM: the EPS, pinned
-- buffers, stashes, libraries and all; nil where /proc does not say), the host memory a
-- model really took, beside host_eps_bytes, the EPS's own count.
-- phases=1 writes to stderr, after the model is made, after the relay is made and after
-- each step, the process's resident memory (VmRSS, its peak VmHWM) and the three pools'
-- bytes in use, peak and reserved (in use plus what their caches keep): where host memory
-- goes (issue 49: at most 6 GB a billion parameters for a 7 B model with 8-bit state and
-- bf16 masters). With device=cpu and L2L_GRADS_OUT=copy the CPU backend's relay treats its
-- device as a GPU's (gradients copied out and held for their updates): a GPU run's host
-- side, but for the device pool, which is host memory there too.
-- Its own speed is the point, so nothing here checks loss.
local l2l = require("l2l")
local cjson = require("cjson")
local now = require("l2l.progress").now

local o = { layers = 12, dim = 768, vocab = 50257, seq = 1024, batch = 8, steps = 5,
            micro_batch = 4, precision = "bf16", grad_precision = "bf16", stash = "host",
            device = "cuda", param_slots = 2, inner = "recompute", memory = "frugal", profile = "",
            placement = "host", device_budget = 0, plan = "", state = "f32", master = "f32", accumulate = 1,
            phases = 0 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.+)$")
  if k == nil or o[k] == nil then error("l2l_gpt.lua: expected key=value with a known key, got " .. a) end
  o[k] = tonumber(v) or v
end

l2l.device_use(o.device)
local function status_bytes(field)   -- a /proc/self/status field in bytes, or nil
  local f = io.open("/proc/self/status")
  if f == nil then return nil end
  local kib = f:read("*a"):match(field .. ":%s*(%d+)%s*kB")
  f:close()
  return kib and tonumber(kib) * 1024
end
local function phase(name)   -- phases=1: a row of the memory table on stderr
  if o.phases ~= 1 then return end
  local GiB, pools = 2 ^ 30, {}
  for _, p in ipairs { "host", "pinned", "device" } do
    local s = l2l.pool_stats(p)
    pools[#pools + 1] = string.format("%s %.2f / %.2f / %.2f", p, s.current / GiB, s.peak / GiB, s.reserved / GiB)
  end
  io.stderr:write(string.format("%-14s resident %6.2f GiB, peak %6.2f GiB | %s\n", name,
                                (status_bytes("VmRSS") or 0) / GiB, (status_bytes("VmHWM") or 0) / GiB,
                                table.concat(pools, " | ")))
end
phase("start")
local layers = { l2l.Embedding { vocab = o.vocab, dim = o.dim, max_seq = o.seq, seed = 1 } }
for b = 1, o.layers do
  layers[#layers + 1] = l2l.Block { dim = o.dim, heads = o.dim / 64, causal = true, dropout = 0,
                                    memory = o.memory, seed = 1 + b }
end
layers[#layers + 1] = l2l.LMHead { vocab = o.vocab, dim = o.dim, tie = true, memory = o.memory,
                                   seed = 2 + o.layers }
local model = l2l.Sequential(layers)
phase("model made")

local optimizer = l2l.AdamW { lr = 1e-4, weight_decay = 0.01, state = o.state }
local plan = o.plan ~= "" and o.plan or nil
if o.accumulate == "auto" then   -- (the plan's accumulation, and the plan itself)
  local device = l2l.device()
  local budget = o.device_budget > 0 and o.device_budget or device.free and math.floor(0.9 * device.free)
  if not budget then error("l2l_gpt.lua: accumulate=auto plans within a device budget: give device_budget") end
  plan = l2l.plan { model = model, batch = o.batch, seq = o.seq, device_budget = budget, precision = o.precision,
                    grad_precision = o.grad_precision, param_slots = o.param_slots, placement = o.placement,
                    master = o.master, optimizer = optimizer, accumulate = "auto" }
  io.stderr:write(tostring(plan), "\n")
end
local run = l2l.Relay { model = model, micro_batch = o.micro_batch, stash = o.stash,
                        inner = o.inner,
                        precision = o.precision, grad_precision = o.grad_precision,
                        param_slots = o.param_slots, placement = o.placement,
                        device_budget = o.device_budget > 0 and o.device_budget or nil,
                        plan = plan, master = o.master, optimizer = optimizer,
                        accumulate = o.accumulate ~= "auto" and o.accumulate or nil }
phase("relay made")
local accumulate = run.options.accumulate
local steps = accumulate * math.ceil(o.steps / accumulate)   -- (whole accumulations)

local ids, next_ids = {}, {}
for b = 1, o.batch do
  ids[b], next_ids[b] = {}, {}
  for s = 1, o.seq do ids[b][s] = math.random(0, o.vocab - 1) end
  for s = 1, o.seq do next_ids[b][s] = ids[b][s % o.seq + 1] end
end
local tokens = l2l.tensor(ids, { dtype = "i32" })
local targets = l2l.tensor(next_ids, { dtype = "i32" })

for _ = 1, accumulate do run:step(tokens, targets) end   -- warm-up (one update's worth)
run:sync()
phase("warm-up")
if o.profile ~= "" then l2l.profile.start() end
local wall0 = now()
local totals = { step = 0, compute = 0, wait_copy = 0, exposed_copy = 0, wait_update = 0, h2d = 0, d2h = 0,
                 h2d_bytes = 0, d2h_bytes = 0, peak = 0 }
local loss
for _ = 1, steps do
  loss = run:step(tokens, targets)
  local s = run:stats()
  totals.step = totals.step + s.step_seconds
  totals.compute = totals.compute + s.compute_seconds
  totals.wait_copy = totals.wait_copy + s.wait_copy_seconds
  totals.exposed_copy = totals.exposed_copy + s.exposed_copy_seconds
  totals.wait_update = totals.wait_update + s.wait_update_seconds
  totals.h2d, totals.d2h = totals.h2d + s.h2d_seconds, totals.d2h + s.d2h_seconds
  totals.h2d_bytes, totals.d2h_bytes = totals.h2d_bytes + s.h2d_bytes, totals.d2h_bytes + s.d2h_bytes
  totals.peak = math.max(totals.peak, s.device_peak)
  phase("step")
end
run:sync()
local wall = now() - wall0
if o.profile ~= "" then
  l2l.profile.stop()
  l2l.profile.write(o.profile, { overwrite = true })
  io.stderr:write(l2l.profile.table(120))
end

local params = 0
for _, p in ipairs(model:params()) do params = params + p.value:numel() end
local n = steps
print(cjson.encode({
  params = params, step_seconds = wall / n, step_seconds_stats = totals.step / n,
  tokens_per_second = o.batch * o.seq * n / wall,
  device_peak = totals.peak, host_eps_bytes = run:stats().host_eps_bytes,
  host_peak_resident = status_bytes("VmHWM"),
  device_records_bytes = run:stats().device_records_bytes, placement = o.placement,
  state = o.state, master = o.master, accumulate = accumulate, steps = n,
  compute_seconds = totals.compute / n, wait_copy_seconds = totals.wait_copy / n,
  exposed_copy_seconds = totals.exposed_copy / n,
  wait_update_seconds = totals.wait_update / n,
  h2d_seconds = totals.h2d / n, d2h_seconds = totals.d2h / n,
  h2d_bytes = totals.h2d_bytes / n, d2h_bytes = totals.d2h_bytes / n, loss = loss,
}))
run:free()
