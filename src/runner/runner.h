/* SPDX-License-Identifier: MIT */
/* runner.h — the l2l executable's parts (internal to it: src/runner/).
 *
 * Purpose: main.c (the command line, scripts, commands and the REPL) asks stop_signals.c
 * for the module training loops stop through.
 * Must never: be included outside src/runner/.
 */
#ifndef L2L_RUNNER_H
#define L2L_RUNNER_H

#include <lua.h>

/* package.preload["l2l.stop_signals"]: catch(int_text, term_text, usr1_text), first(),
   release(), die([name]) (stop_signals.c says what each does). */
void stop_signals_preload(lua_State *L);
/* Puts back the stop signals' handling from before catch(); nothing when none is caught. */
void stop_signals_release(void);

#endif
