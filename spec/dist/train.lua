-- SPDX-License-Identifier: MIT
-- spec/dist/train.lua — what the dist specs (spec/l2l/dist_spec.lua, dist_faults_spec.lua)
-- run under mpirun (or alone): a small model trained a few steps on a global minibatch,
-- each rank stepping its own slice; then every loss, weight and optimizer state of the
-- run is written exactly (hex floats) as JSON, by every rank into OUT.<rank>, for the spec
-- to compare with one process.
-- Usage: l2l spec/dist/train.lua OUT SEED [key=value ...]
--   dist=none|mpi, steps=5, B=7 (global samples), mb=2 (micro-batch), accumulate=1,
--   clip=0 (global norm), loss_scale=0, grad_precision=f32|f16, dropout=0,
--   optimizer=adamw|lamb|sgd, eps=1e-3 (AdamW's and LAMB's: spec/dist/runs.lua says why),
--   grow=0 (1: after the second step, insert a new block at 2 and clone block 4; after
--   the third, freeze block 3 and remove block 5; the fourth skips block 2),
--   save=PATH and save_at=STEP (a checkpoint after that step; save_fail=1: rank 0 saves to
--   a folder that does not exist instead, and each rank's error goes to the output as
--   save_error), load=PATH (start from it; load_placement=host|device|auto: placed so),
--   extra_layer_rank=-1 (that rank's model has one more block: the ranks disagree),
--   hang_rank=-1 / hang_step (that rank sleeps there: the others must time out),
--   wait_file=PATH / wait_step=2 (every rank says so and waits there until PATH exists: the
--   caller cuts the network first), die_rank=-1 / die_step (that rank kills itself with
--   SIGKILL there), bad_rank=-1 /
--   bad_step (that rank's batch holds a token beyond the vocabulary there: its step
--   raises), timeout=SECONDS, lr=3e-3 (AdamW's and LAMB's), heads=3 (the first block's),
--   dim=24 (the model's width: a multiple of 6), blocks=2 (more: each like the first);
--   spill=DIR (the optimizer state in a spill file there, each rank its own) with
--   host_budget=BYTES (0: none, every record's state on disk) or tight=1 (each step at the
--   smallest budget that works on each rank: a refused step, which every rank refuses
--   alike, is taken again within the budget this rank's error names; the output's
--   host_budget is the last, first_budget the first step's, plan_smallest l2l.plan's
--   smallest for this rank before it, host_most the most the EPS held after a step),
--   state=f32|bf16|8bit (the optimizer state's precision), master=f32|bf16 (bf16 masters),
--   placement=host|device|auto (where the records live and are updated),
--   spike=VALUE with spike_rank, spike_step=2, spike_record, spike_at (before that step,
--   that rank, or the one process, adds VALUE to element spike_at (mod its size) of the
--   accumulator of record spike_record of model:params(); the output's spike_skipped is
--   that step's skipped_records),
--   plan=1 (the output's plan_eps_bytes: l2l.plan's host bytes for this rank's EPS),
--   shares=F1,F2,... with placement=auto (before step k the relay's device budget is this
--   rank's step peak with every record on the host plus share k (cycled) of every record's
--   device bytes: auto moves records between steps; the output's placed lists each step's
--   device_records_bytes),
--   rank<r>_<key>=value sets key on rank r alone (the ranks disagree).
local ffi = require("ffi")
local l2l = require("l2l")
local cjson = require("cjson")
local text = require("l2l.text")

ffi.cdef [[ int getpid(void); int kill(int pid, int sig); void *signal(int sig, void *handler); ]]
-- A rank's output goes through the launcher's daemon, which closes it as it tears a failed
-- job down: a rank that wrote then would die of SIGPIPE and the launcher could name that
-- death instead of the one that ended the job (seen under load). Ignored, a write fails.
ffi.C.signal(13, ffi.cast("void *", 1))   -- SIGPIPE, SIG_IGN

local out_path, seed = arg[1], tonumber(arg[2])
local o = { dist = "none", steps = 5, B = 7, mb = 2, accumulate = 1, clip = 0, loss_scale = 0, grad_precision = "f32",
            dropout = 0, grow = 0, optimizer = "adamw", eps = 1e-3, save_at = 2, extra_layer_rank = -1,
            hang_rank = -1, hang_step = 2, wait_step = 2, die_rank = -1, die_step = 3, bad_rank = -1, bad_step = 2,
            lr = 3e-3, heads = 3, dim = 24, blocks = 2, spike_rank = -1, spike_step = 2, spike_record = 1,
            spike_at = 0 }
for i = 3, #arg do
  local k, v = arg[i]:match("^([%w_]+)=(.*)$")
  o[k] = tonumber(v) or v
end

local rank, size = 0, 1
if o.dist == "mpi" then
  rank, size = l2l.dist.rank(), l2l.dist.size()
  if o.timeout then l2l.dist.set_timeout(o.timeout) end
end
for k, v in pairs(o) do   -- this rank's own settings
  local r, key = tostring(k):match("^rank(%d+)_(.+)$")
  if r and tonumber(r) == rank then o[key] = v end
end

local V, D, S = 96, o.dim, 9
local corpus = {}
for i = 1, 3000 do corpus[i] = string.char(32 + (i * 7 + math.floor(i / 13) * 5) % 61) end
corpus = table.concat(corpus)

local function fresh_model()
  local m = l2l.Sequential {
    l2l.Embedding { vocab = V, dim = D, max_seq = S, seed = seed, dropout = o.dropout },
    l2l.Block { dim = D, heads = o.heads, seed = seed + 1, dropout = o.dropout },
    l2l.Block { dim = D, heads = 2, mlp = 40, seed = seed + 2 },
    l2l.LMHead { vocab = V, dim = D, tie = true },
  }
  for b = 3, o.blocks do m:insert(b + 1, l2l.Block { dim = D, heads = 3, seed = seed + 10 + b }) end
  if rank == o.extra_layer_rank then m:insert(2, l2l.Block { dim = D, heads = 3, seed = seed + 3 }) end
  return m
end

-- grow=1's change after the second step
local function grow(model)
  model:insert(2, l2l.Block { dim = D, heads = 3, seed = seed + 7 })
  model:clone(4)
end

local optimizer = ({ adamw = l2l.AdamW { lr = o.lr, weight_decay = 0.1, eps = o.eps, state = o.state },
                     lamb = l2l.LAMB { lr = o.lr, eps = o.eps, state = o.state },
                     sgd = l2l.SGD { lr = 0.05, momentum = 0.9, state = o.state } })[o.optimizer]
local run
if o.load then
  run = l2l.load(o.load, { dist = o.dist, optimizer_threads = 1, placement = o.load_placement })
else
  run = l2l.Relay { model = fresh_model(), micro_batch = o.mb, accumulate = o.accumulate,
                    optimizer = optimizer, clip_global_norm = o.clip, loss_scale = o.loss_scale,
                    grad_precision = o.grad_precision, spill = o.spill,
                    host_budget = o.tight == 1 and 1 or o.host_budget, seed = seed, dist = o.dist,
                    optimizer_threads = 1, master = o.master, placement = o.placement }
end

-- tight: the planner's smallest budget for this rank, to set beside the one the first step
-- names
local plan_smallest = o.tight == 1 and l2l.plan {
  model = run.model, batch = 1, seq = S, device_budget = 2 ^ 40, optimizer = optimizer, accumulate = o.accumulate,
  clip_global_norm = o.clip, loss_scale = o.loss_scale, spill = o.spill, dist = o.dist,
  placement = run.options.placement }.host_budget_smallest or nil

-- shares: this rank's step with its records on the host (the larger of the model's and, with
-- grow, the grown model's: a relay of its own, no records placed), and every record's device bytes
local shares, host_peak, records_bytes = {}, 0, 0
if o.shares and o.placement == "auto" then
  for f in tostring(o.shares):gmatch("[^,]+") do shares[#shares + 1] = tonumber(f) end
  local slice = math.floor((rank + 1) * o.B / size) - math.floor(rank * o.B / size)
  host_peak = run:step_peak(slice, S)
  if o.grow == 1 then
    local grown = fresh_model()
    grow(grown)
    local own = l2l.Relay { model = grown, micro_batch = o.mb, grad_precision = o.grad_precision,
                            master = o.master, placement = "host", optimizer_threads = 1 }
    host_peak = math.max(host_peak, own:step_peak(slice, S))
    own:free()
  end
  records_bytes = l2l.plan {
    model = run.model, batch = slice, seq = S, device_budget = 2 ^ 40, optimizer = optimizer,
    accumulate = o.accumulate, clip_global_norm = o.clip, loss_scale = o.loss_scale, dist = o.dist,
    master = o.master, placement = "device", rates = { flops = 1e12, h2d = 1e10, d2h = 1e10, optimizer = 1e9 },
  }.device_records_bytes
end

local hex = function(x) return string.format("%a", x) end
local losses, save_error, host_most, first_budget, spike_skipped, placed = {}, nil, 0, nil, nil, {}
local first = run:stats().steps + 1
for step = first, first + o.steps - 1 do
  if #shares > 0 then
    run:set_device_budget(math.floor(host_peak + shares[(step - first) % #shares + 1] * records_bytes))
  end
  if step == o.hang_step and rank == o.hang_rank then os.execute("sleep 600") end
  if step == o.wait_step and o.wait_file then   -- (the caller acts, then makes the file)
    io.stdout:write(("rank %d: waiting for %s before step %d\n"):format(rank, o.wait_file, step))
    io.stdout:flush()
    while not io.open(o.wait_file) do os.execute("sleep 0.05") end
  end
  if step == o.die_step and rank == o.die_rank then ffi.C.kill(ffi.C.getpid(), 9) end
  local tokens, targets = text.batch(corpus, o.B, S, seed, step, { rank = rank, size = size })
  -- every 5th position of the global minibatch ignored, so each rank's slice has its own
  -- count of real targets
  local t, lo = targets:data(), math.floor(rank * o.B / size)
  for i = 0, targets:numel() - 1 do
    if (lo * S + i) % 5 == 0 then t[i] = -1 end
  end
  if step == o.bad_step and rank == o.bad_rank then tokens:data()[0] = V end
  -- (the last step's updates may still read and clear the accumulators: they end first)
  if o.spike and step == o.spike_step then run:sync() end
  if o.spike and step == o.spike_step and (rank == o.spike_rank or o.dist ~= "mpi") then
    local params = run.model:params()
    local p = params[(o.spike_record - 1) % #params + 1]
    local g = p.grad:reshape({ p.grad:numel() })   -- (on the device: through the host)
    local at = o.spike_at % p.grad:numel() + 1
    g:set(at, g:get(at) + o.spike)
  end
  local skip = o.grow == 1 and step == first + 3 and { 2 } or nil
  local ok, loss = pcall(run.step, run, tokens, targets, skip and { skip = skip } or nil)
  for _ = 1, o.tight == 1 and 3 or 0 do
    if ok then break end
    local smallest = tonumber(tostring(loss):match("is below the (%d+)"))
    if not smallest and not tostring(loss):find("could not begin step", 1, true) then break end
    if smallest then run:set_host_budget(smallest) end
    ok, loss = pcall(run.step, run, tokens, targets, skip and { skip = skip } or nil)
  end
  if ok and o.tight == 1 then
    first_budget = first_budget or run.options.host_budget
    run:sync()   -- (the host bytes of the step's updates, which may end after it returns)
    host_most = math.max(host_most, run:stats().host_eps_bytes)
  end
  local refused = not ok and (tostring(loss):find("the ranks differ", 1, true) or
                              tostring(loss):find("could not begin step", 1, true) or
                              tostring(loss):find("host budget", 1, true))
  if refused then
    -- every rank refused the step alike and is still in step with the others: each says
    -- why before the first to end the job (MPI_Abort) cuts the others' output short
    io.stderr:write(tostring(loss), "\n")
    io.stderr:flush()
    l2l.dist.barrier()
  end
  if not ok then error(loss, 0) end
  if o.spike and step == o.spike_step then spike_skipped = run:stats().skipped_records end
  losses[#losses + 1] = hex(loss)
  placed[#placed + 1] = run:stats().device_records_bytes
  if o.grow == 1 and step == first + 1 then
    grow(run.model)
  elseif o.grow == 1 and step == first + 2 then
    run.model:freeze(3)
    run.model:remove(5)
  end
  if o.save and step == o.save_at and o.save_fail == 1 then
    local ok, err = pcall(run.save, run, rank == 0 and o.save .. ".missing/run.l2l" or o.save)
    save_error = not ok and tostring(err) or nil
  elseif o.save and step == o.save_at then
    run:save(o.save)
  end
end
run:sync()

-- a tensor's elements: numbers (bf16 widened; 8-bit state's bytes as they are; a record
-- on the device copied to the host first)
local function hex_list(t)
  if t:pool() == "device" then t = t:to("host") end
  if t:dtype() == "bf16" then t = t:cast("f32") end
  local d, list = t:data(), {}
  for j = 0, t:numel() - 1 do list[j + 1] = hex(d[j]) end
  return list
end

-- the last step's exchanges on the timeline: how many of each, on which lane, and the
-- name a Chrome trace gives that lane
local exchanges = { reduce_scatter = 0, all_gather = 0 }
for _, e in ipairs(run:events()) do
  if exchanges[e.phase] then
    exchanges[e.phase] = exchanges[e.phase] + 1
    exchanges.lane = e.thread
  end
end
for _, m in ipairs(require("l2l.trace").chrome(run:events()).traceEvents) do
  if m.name == "thread_name" and m.tid == exchanges.lane then exchanges.lane_name = m.args.name end
end
-- plan=1: the planner's host bytes for this rank (the model as it ends), beside the EPS's
local plan_eps_bytes = o.plan == 1 and l2l.plan {
  model = run.model, batch = 1, seq = S, device_budget = 2 ^ 40, optimizer = optimizer, accumulate = o.accumulate,
  clip_global_norm = o.clip, loss_scale = o.loss_scale, dist = o.dist, master = o.master,
  placement = run.options.placement }.host_eps_bytes or nil
-- the stats as JSON takes them: an overflowed step's grad_norm is inf, written as text
local stats = {}
for k, v in pairs(run:stats()) do stats[k] = (v == v and v ~= math.huge and v ~= -math.huge) and v or tostring(v) end
local result = { losses = losses, stats = stats, exchanges = exchanges, params = {}, save_error = save_error,
                 host_budget = run.options.host_budget, host_most = host_most, first_budget = first_budget,
                 plan_smallest = plan_smallest, spike_skipped = spike_skipped, plan_eps_bytes = plan_eps_bytes,
                 placed = placed }
for i, layer in ipairs(run.model) do
  for _, p in ipairs(layer:params()) do
    local entry = { layer = i, name = p.name, value = hex_list(p.value), dtype = p.value:dtype() }
    for which = 1, 2 do
      local st = run:state(p, which)
      if st then
        entry["state" .. which] = hex_list(st)
        st:free()
      end
    end
    result.params[#result.params + 1] = entry
  end
end
local f = assert(io.open(out_path .. "." .. rank, "w"))
f:write(cjson.encode(result))
f:close()
