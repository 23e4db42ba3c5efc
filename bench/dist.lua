-- SPDX-License-Identifier: MIT
-- bench/dist.lua — data parallel on one machine (issue 23): the same global minibatch
-- trained by one process with 2 compute threads, by 2 MPI ranks with 1 thread each over
-- shared memory, and by the same 2 ranks over TCP on loopback (--mca btl tcp,self, the
-- transport between machines), in alternating rounds so the machine's drift hits each
-- alike. Printed per setting: median step time and throughput, the ratio to one process,
-- exposed communication (the calling thread waiting for MPI: the step's exchanges of
-- counts and losses and of agreed norms) as a share of the step, and beside it the wait
-- for records before their forward (their update and, with ranks, their reduce-scatter
-- and all-gather: the part of the exchanges compute did not hide), the
-- bytes each rank's collectives send per step against the ring's minimum 2 (N - 1) / N of
-- the f32 parameter bytes, and the EPS's host bytes per rank (masters and accumulators
-- whole; optimizer state, and with ranks the reduced gradient, of a shard), with the
-- optimizer state's share alone.
--
-- A step's time is the wall time of --steps steps run back to back (as a training loop
-- runs them: a step's updates and exchanges overlap the next one's forward) until the
-- last update is done, divided by --steps; the shares of waits are the last step's.
-- Run:  build/l2l bench/dist.lua [--rounds 3] [--steps 8] [--dim 256] [--blocks 4]
-- (mpirun must be installed and libl2l built with its MPI plugin). Model: a GPT of
-- --blocks blocks of width --dim, vocab 256, tied head; 16 x 128 tokens a step, micro-
-- batch 4, AdamW, stash host; 2 warm-up steps first. Ratios are medians over rounds.
-- Must never: assert: the figures go to bench/RESULTS.md.
local l2l = require("l2l")
local cjson = require("cjson")
local text_mod = require("l2l.text")
local now = require("l2l.progress").now

local opt = { rounds = 3, steps = 8, dim = 256, blocks = 4, worker = "", dist = "none" }
for i = 1, #arg, 2 do
  local key = arg[i]:match("^%-%-(%a+)$")
  if key == nil or opt[key] == nil then
    error("usage: build/l2l bench/dist.lua [--rounds N] [--steps N] [--dim D] [--blocks L]", 0)
  end
  opt[key] = type(opt[key]) == "number" and tonumber(arg[i + 1]) or arg[i + 1]
end
local B, S, V, MB, WARM = 16, 128, 256, 4, 2

local function median(list)
  local t = {}
  for i, v in ipairs(list) do t[i] = v end
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end

----------------------------------------------------------------- a worker (one setting)

if opt.worker ~= "" then
  local rank, size = 0, 1
  if opt.dist == "mpi" then rank, size = l2l.dist.rank(), l2l.dist.size() end
  local list = { l2l.Embedding { vocab = V, dim = opt.dim, max_seq = S, seed = 1 } }
  for b = 1, opt.blocks do list[#list + 1] = l2l.Block { dim = opt.dim, heads = 4, seed = 1 + b } end
  list[#list + 1] = l2l.LMHead { vocab = V, dim = opt.dim, tie = true }
  local model = l2l.Sequential(list)
  local run = l2l.Relay { model = model, micro_batch = MB, stash = "host", dist = opt.dist,
                          optimizer_threads = l2l.threads(), optimizer = l2l.AdamW { lr = 1e-3 } }
  local text = {}
  for i = 1, 200000 do text[i] = string.char(32 + (i * 7919 + math.floor(i / 7)) % 90) end
  text = table.concat(text)
  local function batch(step) return text_mod.batch(text, B, S, 1, step, { rank = rank, size = size }) end
  for step = 1, WARM do run:step(batch(step)) end
  run:sync()
  -- the measured steps back to back, as a training loop runs them (a step's updates and
  -- exchanges overlap the next one's forward), until every update is done
  local batches = {}
  for step = WARM + 1, WARM + opt.steps do batches[#batches + 1] = { batch(step) } end
  -- over TCP the bytes on the wire are the loopback interface's (both ranks' traffic;
  -- nothing else on the machine moves much there)
  local function loopback_bytes()
    local f = io.open("/proc/net/dev")
    local text = f and f:read("*a") or ""
    if f then f:close() end
    return tonumber(text:match("\n%s*lo:%s*%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+%d+%s+(%d+)"))
  end
  if size > 1 then l2l.dist.barrier() end
  local lo0, t0 = loopback_bytes(), now()
  for _, b in ipairs(batches) do run:step(b[1], b[2]) end
  run:sync()
  local per_step = (now() - t0) / opt.steps
  if size > 1 then l2l.dist.barrier() end   -- (both ranks' bytes are in)
  local lo1 = loopback_bytes()
  local s = run:stats()
  local param_bytes = model:nparams() * 4
  if rank == 0 then
    local states = 0   -- this rank's optimizer state (m and v of its shards)
    for _, layer in ipairs(model) do
      for _, p in ipairs(layer:params()) do
        states = states + 2 * math.ceil(p.value:numel() / size) * 4
      end
    end
    io.write(cjson.encode({ step = per_step, exposed = s.exposed_comm_seconds / s.step_seconds,
                            wait_update = s.wait_update_seconds / s.step_seconds, sent = s.dist_sent_bytes,
                            wire = lo0 and lo1 and (lo1 - lo0) / size / opt.steps or nil,
                            param_bytes = param_bytes, eps_bytes = s.host_eps_bytes, state_bytes = states,
                            ranks = size }), "\n")
  end
  return
end

----------------------------------------------------------------- the driver

local exe = arg[-1] or "build/l2l"
local me = ("%s bench/dist.lua --worker 1 --steps %d --dim %d --blocks %d"):format(exe, opt.steps, opt.dim, opt.blocks)
local MPIRUN = "mpirun --allow-run-as-root --oversubscribe -np 2 -x L2L_THREADS -x OMP_WAIT_POLICY"
local SETTINGS = {
  { name = "1 process, 2 threads", cmd = "L2L_THREADS=2 " .. me },
  { name = "2 ranks x 1 thread, shared memory", cmd = "L2L_THREADS=1 " .. MPIRUN .. " " .. me .. " --dist mpi" },
  { name = "2 ranks x 1 thread, TCP loopback", cmd = "L2L_THREADS=1 " .. MPIRUN .. " --mca btl tcp,self " .. me .. " --dist mpi" },
}

local function run_one(setting)
  local p = io.popen("OMP_WAIT_POLICY=PASSIVE " .. setting.cmd .. " 2>&1")
  local out = p:read("*a")
  p:close()
  local line = out:match("(%b{})%s*$")
  if not line then error(setting.name .. " printed no result:\n" .. out, 0) end
  return cjson.decode(line)
end

print(("bench/dist: GPT of %d blocks x dim %d, vocab %d, %d x %d tokens a step, micro-batch %d, AdamW; " ..
       "%d rounds of %d steps (+%d warm-up)"):format(opt.blocks, opt.dim, V, B, S, MB, opt.rounds, opt.steps, WARM))
local results = {}
for _, st in ipairs(SETTINGS) do results[st.name] = {} end
for round = 1, opt.rounds do
  for _, st in ipairs(SETTINGS) do
    local r = run_one(st)
    table.insert(results[st.name], r)
    print(("  round %d  %-36s step %.3f s  exposed comm %.1f %%, waits for records %.1f %% (last step)"):format(
      round, st.name, r.step, 100 * r.exposed, 100 * r.wait_update))
  end
end

print()
local base = {}
for _, r in ipairs(results[SETTINGS[1].name]) do base[#base + 1] = r.step end
for _, st in ipairs(SETTINGS) do
  local rs = results[st.name]
  local steps, ratios, shares, waits = {}, {}, {}, {}
  for i, r in ipairs(rs) do
    steps[i] = r.step
    ratios[i] = base[i] / r.step                 -- same round: throughput against one process
    shares[i] = r.exposed
    waits[i] = r.wait_update
  end
  local r = rs[1]
  local minimum = r.ranks > 1 and 2 * (r.ranks - 1) / r.ranks * r.param_bytes or 0
  print(("%-36s step %.3f s (%.0f tok/s)  throughput x%.3f of one process (rounds: %s)"):format(
    st.name, median(steps), B * S / median(steps), median(ratios),
    table.concat((function() local t = {} for i, v in ipairs(ratios) do t[i] = ("%.3f"):format(v) end return t end)(), " ")))
  print(("%-36s waiting for records before their forward (their update; with ranks their exchange too) %.1f %% of the step"):format(
    "", 100 * median(waits)))
  if r.ranks > 1 and st.name:find("TCP", 1, true) then
    print(("%-36s on the wire (loopback, per rank and step): %.2f MiB"):format("", r.wire / 2 ^ 20))
  end
  print(("%-36s exposed comm %.1f %% of the step; sent %.2f MiB a step (ring minimum %.2f MiB); " ..
         "EPS %.2f MiB, optimizer state %.2f MiB per rank"):format("", 100 * median(shares), r.sent / 2 ^ 20,
         minimum / 2 ^ 20, r.eps_bytes / 2 ^ 20, r.state_bytes / 2 ^ 20))
end
