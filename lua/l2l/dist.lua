-- SPDX-License-Identifier: MIT
-- l2l.dist — data parallel across the ranks of an mpirun job (OpenMPI from the system).
--
--   local l2l = require("l2l")
--   local rank, size = l2l.dist.rank(), l2l.dist.size()   -- 0-based rank; starts MPI
--   local run = l2l.Relay{ model = model, dist = "mpi", ... }
--   local tokens, targets = l2l.text.batch(text, B, S, seed, step, { rank = rank, size = size })
--   local loss = run:step(tokens, targets)     -- the whole minibatch's loss, on every rank
--   l2l.dist.barrier()
--   local total = l2l.dist.sum(count)          -- count summed over the ranks, on every rank
--
-- MPI is opened only when one of these (or a relay with dist = "mpi") asks for it; a
-- script that never does needs no mpirun. Under mpirun every rank runs the same script:
-- the same relay changes and steps in the same order (include/l2l/dist.h says what
-- each step exchanges). Every MPI wait has a deadline (l2l.dist.set_timeout, default
-- 300 s, or the environment's L2L_DIST_TIMEOUT): a rank that died or hangs ends the job
-- with a message instead of leaving the others waiting; so does a rank whose script
-- raises an error (the l2l executable calls MPI_Abort).
-- Must never: start MPI where nothing asked for it (require("l2l") does not).
local ffi = require("ffi")
local lib = require("l2l.lib")
local argcheck = require("l2l.argcheck")

local C, check, too_many = lib.C, lib.check, argcheck.too_many

local M = {}

local out = ffi.new("int[1]")

-- l2l.dist.init(): starts MPI (later calls do nothing); an error saying why when this
-- libl2l was built without MPI.
function M.init(...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.init", "", 2, ...) end
  check(C.l2l_dist_init(), "l2l.dist.init", 2)
end

-- l2l.dist.rank() -> this process's rank, 0 .. size - 1 (0 outside mpirun).
function M.rank(...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.rank", "", 2, ...) end
  check(C.l2l_dist_rank(out), "l2l.dist.rank", 2)
  return out[0]
end

-- l2l.dist.size() -> the number of ranks (1 outside mpirun).
function M.size(...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.size", "", 2, ...) end
  check(C.l2l_dist_size(out), "l2l.dist.size", 2)
  return out[0]
end

-- l2l.dist.barrier(): returns when every rank has called it.
function M.barrier(...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.barrier", "", 2, ...) end
  check(C.l2l_dist_barrier(), "l2l.dist.barrier", 2)
end

local SMALL = 4096   -- l2l.dist.sum's numbers up to this many in one buffer kept (a step's few allocate nothing)
local small_sums = ffi.new("double[?]", SMALL)

-- l2l.dist.sum(x) -> x summed over every rank: a number, or a list of numbers (a new list;
-- up to 2^24 of them), in float64. A collective: every rank calls it at the same point with
-- as many numbers. Outside mpirun, x as it is (MPI starts as one rank).
function M.sum(x, ...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.sum", "x", 2, ...) end
  local list = type(x) == "table"
  local n = list and #x or 1
  if not list and type(x) ~= "number" then
    error("l2l.dist.sum: x must be a number or a list of numbers, got " .. argcheck.describe(x), 2)
  end
  if n < 1 or n > 2 ^ 24 then
    error(("l2l.dist.sum: x must hold 1 to 2^24 numbers, got %d"):format(n), 2)
  end
  local sums = n <= SMALL and small_sums or ffi.new("double[?]", n)
  for i = 1, n do
    local v = list and x[i] or x
    if type(v) ~= "number" then
      error(("l2l.dist.sum: x[%d] must be a number, got %s"):format(i, argcheck.describe(v)), 2)
    end
    sums[i - 1] = v
  end
  check(C.l2l_dist_sum(sums, n), "l2l.dist.sum", 2)
  if not list then return sums[0] end
  local out = {}
  for i = 1, n do out[i] = sums[i - 1] end
  return out
end

-- l2l.dist.set_timeout(seconds): the deadline of every MPI wait, 0 < seconds <= 1e6.
function M.set_timeout(seconds, ...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.set_timeout", "seconds", 2, ...) end
  if type(seconds) ~= "number" then
    error("l2l.dist.set_timeout: seconds must be a number, got " .. argcheck.describe(seconds), 2)
  end
  check(C.l2l_dist_set_timeout(seconds), "l2l.dist.set_timeout", 2)
end

-- l2l.dist.abort([message]): ends every rank of the job now (MPI_Abort), after printing
-- message with this rank; returns when MPI is not running.
function M.abort(message, ...)
  if select("#", ...) ~= 0 then too_many("l2l.dist.abort", "message", 2, ...) end
  if message ~= nil and type(message) ~= "string" then
    error("l2l.dist.abort: message must be a string or nil, got " .. argcheck.describe(message), 2)
  end
  C.l2l_dist_abort(message)
end

return M
