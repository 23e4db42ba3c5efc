/* SPDX-License-Identifier: MIT */
/* stop_signals.c — the l2l executable's module "l2l.stop_signals": the signals that ask a
 * training loop to stop after its step (lua/l2l/cli.lua's cli.interrupt wraps it).
 *
 * Purpose: a Ctrl-C, a SIGTERM or a SIGUSR1 in the middle of a long step must not lose the
 * run: the first is remembered for the loop to see after its step, which then
 * saves what it saves and ends the process as the signal would have (stop_die); a second
 * one ends it at once, as without the loop.
 * Must never: call anything but async-signal-safe functions in the handler, or end the
 * process but on a second signal or through die().
 */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "l2l.h"
#include "runner/runner.h"

/* The signals that ask a training loop to stop: Ctrl-C (SIGINT); SIGTERM (kill, timeout(1),
   a scheduler's preemption or time limit, mpirun ending its ranks); SIGUSR1 (what mpirun
   passes on to every rank, and what Slurm's --signal sends before a time limit).
   l2l.stop_signals.catch(int_text, term_text, usr1_text) makes the first of them a request:
   remembered, and its text written to stderr at once (the loop may be in the middle of a
   long step); the second (any of them) puts back the handling from before catch() and
   raises itself again, so a script dies as that signal kills it and the REPL stops the
   entry. Only async-signal-safe calls in the handler (write, sigaction, raise, a lock-free
   atomic), which any thread may run (the library's threads do not block these signals):
   which signal came first is one atomic, set once by whichever handler gets there first.
   A signal ignored by the parent (SIGINT in a background job of a non-interactive shell)
   stays ignored; catch() answers false when all three are. */
enum { NSTOP = 3 };
static const int stop_signal[NSTOP] = {SIGINT, SIGTERM, SIGUSR1};
static const char *const stop_name[NSTOP] = {"INT", "TERM", "USR1"};
static atomic_int stop_first;                  /* the first signal's index + 1; 0: none yet */
static volatile sig_atomic_t stop_catching;
static int stop_caught[NSTOP];                 /* changed with the three blocked */
static struct sigaction stop_previous[NSTOP];
static char stop_message[NSTOP][512];
static size_t stop_message_len[NSTOP];

static int stop_index(int sig) {
  for (int i = 0; i < NSTOP; i++)
    if (stop_signal[i] == sig) return i;
  return 0;
}

/* Puts back the handling from before catch() (async-signal-safe). */
static void stop_restore(void) {
  for (int i = 0; i < NSTOP; i++)
    if (stop_caught[i]) sigaction(stop_signal[i], &stop_previous[i], NULL);
  stop_catching = 0;
}

static void on_stop(int sig) {
  int saved = errno;
  int i = stop_index(sig), none = 0;
  if (atomic_compare_exchange_strong(&stop_first, &none, i + 1)) {
    ssize_t w = write(STDERR_FILENO, stop_message[i], stop_message_len[i]);
    (void)w;
  } else {
    stop_restore();
    raise(sig);   /* delivered when this handler returns */
  }
  errno = saved;
}

static void stop_block(sigset_t *old) {
  sigset_t block;
  sigemptyset(&block);
  for (int i = 0; i < NSTOP; i++) sigaddset(&block, stop_signal[i]);
  pthread_sigmask(SIG_BLOCK, &block, old);
}

void stop_signals_release(void) {
  if (!stop_catching) return;
  sigset_t old;
  stop_block(&old);
  stop_restore();
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static int stop_catch(lua_State *L) {
  const char *text[NSTOP];
  size_t len[NSTOP];
  for (int i = 0; i < NSTOP; i++) {
    text[i] = luaL_optlstring(L, i + 1, "", &len[i]);
    if (len[i] > sizeof stop_message[i] - 1) len[i] = sizeof stop_message[i] - 1;
  }
  sigset_t old;   /* no stop signal (on this thread) while the texts and the handlers change */
  stop_block(&old);
  atomic_store(&stop_first, 0);
  int any = 0;
  for (int i = 0; i < NSTOP; i++) {
    memcpy(stop_message[i], text[i], len[i]);
    stop_message_len[i] = len[i];
    if (!stop_catching) {
      struct sigaction now;
      sigaction(stop_signal[i], NULL, &now);
      stop_caught[i] = now.sa_handler != SIG_IGN;
      if (stop_caught[i]) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop;
        sa.sa_flags = SA_RESTART;   /* the loop's reads and writes go on */
        sigemptyset(&sa.sa_mask);
        for (int k = 0; k < NSTOP; k++) sigaddset(&sa.sa_mask, stop_signal[k]);
        sigaction(stop_signal[i], &sa, &stop_previous[i]);
      }
    }
    any |= stop_caught[i];
  }
  stop_catching = any;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  lua_pushboolean(L, any);
  return 1;
}

/* The first stop signal's name ("INT", "TERM", "USR1"), or nil before one came. */
static int stop_first_of(lua_State *L) {
  int first = atomic_load(&stop_first);
  if (first == 0) lua_pushnil(L);
  else lua_pushstring(L, stop_name[first - 1]);
  return 1;
}

static int stop_release_fn(lua_State *L) {
  (void)L;
  stop_signals_release();
  return 0;
}

/* die([name]) ends the process as the stop signal `name` (default: the first that came)
   ends a program (killed by it: status 128 + its number in a shell, so a shell loop around
   a Ctrl-C'ed run stops too) when that signal's handling, after release, is the default
   one, and with status 128 + its number where it is ignored (a rank stopped by another
   rank's signal, which its parent had it ignore); otherwise (the REPL's Ctrl-C handler)
   returns false, for the caller to raise an error. The Lua state is closed first, as at a
   script's end (LuaJIT's os.exit(code, true) does the same from inside a call): its
   finalizers free what the script holds, so a relay removes its spill file (issue 47:
   raised with the state open, the file was left behind); then MPI is finalized, as at a
   script's end: mpirun sees ranks that finished their MPI and then ended, each on its own
   (a rank gone without it is a failure to mpirun, which then ends the others itself,
   SIGTERM then SIGKILL, whatever they were still closing). A stop signal while they run
   ends the process at once. */
static int stop_die(lua_State *L) {
  const char *name = luaL_optstring(L, 1, NULL);
  int first = atomic_load(&stop_first), i = first > 0 ? first - 1 : 0;
  if (name != NULL) {
    for (i = 0; i < NSTOP && strcmp(name, stop_name[i]) != 0; i++) {}
    if (i == NSTOP) return luaL_argerror(L, 1, "INT, TERM or USR1");
  }
  int sig = stop_signal[i];
  stop_signals_release();
  struct sigaction now;
  sigaction(sig, NULL, &now);
  if (now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN) {
    lua_pushboolean(L, 0);
    return 1;
  }
  fflush(NULL);
  lua_close(L);   /* (not used after this) */
  l2l_dist_finalize();
  fflush(NULL);
  if (now.sa_handler == SIG_DFL) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);   /* its default action ends the process */
  }
  _exit(128 + sig);
}

static int open_stop_signals(lua_State *L) {
  static const luaL_Reg fns[] = {{"catch", stop_catch},       {"first", stop_first_of},
                                 {"release", stop_release_fn}, {"die", stop_die},
                                 {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, fns);
  return 1;
}

void stop_signals_preload(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, open_stop_signals);
  lua_setfield(L, -2, "l2l.stop_signals");
  lua_pop(L, 2);
}
