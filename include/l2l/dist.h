/* SPDX-License-Identifier: MIT */
/* l2l/dist.h — a part of the public header l2l.h: data parallel, one process per device
 * under mpirun.
 *
 * Purpose: one seam of the C API. A program includes l2l.h, never a part: a part uses the
 * types the header and the parts before it declare, and l2l.h's conventions hold for it.
 * Its FFI block is read after theirs (scripts/public_header.lua).
 * Must never: be included but by l2l.h.
 */
#ifndef L2L_H
#error "include l2l.h, not its parts"
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- data parallel
   One process per device (or CPU socket) under mpirun, on the system's OpenMPI, which
   libl2l opens (a plugin beside the library, libl2l-mpi.so) only when a program asks for
   it: a program that never does needs no mpirun and loads no MPI. A relay with dist =
   L2L_DIST_MPI on every rank trains one model: each rank steps its own slice of every
   minibatch; the loss is the mean over every real target of the whole minibatch, the same
   on every rank; dropout draws follow the global sample index (the ranks' slices in rank
   order), so N ranks draw what one process draws for the whole minibatch. As soon as a
   record's gradient is complete on a rank it is reduce-scattered; each rank updates its
   shard of the master and of the optimizer state (which it alone keeps: host memory for
   optimizer state falls as 1/N), then an all-gather brings the updated master to every
   rank before the record's next forward; all of it overlaps backward. Global clipping,
   loss scaling, non-finite skips, accumulation and dynamic architecture behave as on one
   process, every rank deciding alike. MPI runs on one communication thread; every wait
   has a deadline (l2l_dist_set_timeout; default 300 s, or L2L_DIST_TIMEOUT in seconds)
   after which the rank says what it waited for (step, layer, operation, bytes, sequence)
   and ends the job with MPI_Abort; a step that fails on a rank once the ranks have
   exchanged their sizes ends the job the same way, with its message (the others would
   wait on collectives it never posts). Every rank must make the same calls in the same order:
   the relay's steps and changes, l2l_dist_barrier, l2l_dist_sum, and l2l_relay_param_state (which
   gathers the whole state from every rank's shard). */
/* Starts MPI (opening the plugin) on its communication thread; later calls do nothing.
   L2L_ERR_UNSUPPORTED when libl2l was built without MPI or the plugin cannot be opened
   (the message says why); L2L_ERR_STATE after l2l_dist_finalize. */
L2L_API l2l_status l2l_dist_init(void);
/* This process's rank and the number of ranks (starting MPI if needed). */
L2L_API l2l_status l2l_dist_rank(int *out);
L2L_API l2l_status l2l_dist_size(int *out);
/* Returns when every rank has called it (within the timeout). */
L2L_API l2l_status l2l_dist_barrier(void);
/* values[0 .. n) := their sums over every rank, in place (float64; 1 <= n <= 2^24): a
   collective, called by every rank with the same n at the same point. Outside mpirun,
   MPI starts as one rank and the values are left as they are. */
L2L_API l2l_status l2l_dist_sum(double *values, int n);
/* The deadline of every MPI wait, in seconds, 0 < seconds <= 1e6. */
L2L_API l2l_status l2l_dist_set_timeout(double seconds);
/* Waits for the exchanges in flight and finalizes MPI; nothing when it never started.
   Call it before a program that started MPI exits (the l2l executable does). */
L2L_API l2l_status l2l_dist_finalize(void);
/* Ends every rank of the job at once (MPI_Abort) after printing message (may be NULL)
   with this rank; returns only when MPI is not running. For a program that cannot go on:
   the other ranks would otherwise wait out their timeout. */
L2L_API void l2l_dist_abort(const char *message);

/* L2L_FFI_END */
