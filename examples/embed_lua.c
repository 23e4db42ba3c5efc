/* SPDX-License-Identifier: MIT */
/* embed_lua.c — a C program that embeds LuaJIT and runs an l2l training script.
 *
 * What it shows: a Lua state made with luaL_newstate and luaL_openlibs; package.path
 * pointed at l2l's Lua modules so that `require("l2l")` works; a script held in a C string
 * that builds a small model, trains it with l2l.Relay on a simple task (the next token is
 * the previous one plus 1, modulo 16) and prints its losses; a value passed from C into
 * the script (the number of steps, as the chunk's argument `...`) and results read back
 * from the Lua stack (the steps run and the final loss); a Lua error printed with its
 * traceback and a non-zero exit status.
 *
 * Why link libl2l rather than let the script load it: Debian's libjemalloc.so.2 (which
 * libl2l uses) cannot be dlopen'ed into a running process ("cannot allocate memory in
 * static TLS block"), so a plain luajit doing ffi.load fails. A program linked with libl2l
 * has jemalloc loaded at start, and l2l's Lua module then finds the C functions already in
 * the process (l2l.library is "(linked in)"). The call to l2l_version() below keeps the
 * link when the linker drops unused libraries (--as-needed, the default of many distros);
 * a program that calls nothing of l2l from C passes -Wl,--no-as-needed before -ll2l.
 *
 * Build outside this repository (libl2l built with `make`, L2L = the checkout):
 *   cc -std=c11 -Wall -Wextra embed_lua.c -I$L2L/include -I/usr/include/luajit-2.1 \
 *      -DL2L_LUA_DIR="\"$L2L/lua\"" -L$L2L/build -ll2l -Wl,-rpath,$L2L/build \
 *      -lluajit-5.1 -o embed_lua
 * (`make` builds it as build/embed_lua.) Run: ./embed_lua [steps] (default 100, under a
 * second). The environment variable L2L_LUA_DIR, when set, replaces the compiled-in folder.
 * Must never: hide a Lua error (it is printed and the exit status is 1).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, execv */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l2l.h"

#ifndef L2L_LUA_DIR
#define L2L_LUA_DIR "lua" /* relative to the working directory: pass -DL2L_LUA_DIR=... */
#endif

/* The script. Its argument (`...`) is the number of steps; it returns the steps run and
   the last loss. */
static const char script[] =
    "local steps = ...\n"
    "if type(steps) ~= 'number' or steps < 1 then   -- try ./embed_lua 0\n"
    "  error('steps must be a number >= 1, got ' .. tostring(steps))\n"
    "end\n"
    "local l2l = require('l2l')\n"
    "print(('l2l %s, library %s, %d steps'):format(l2l.version, l2l.library, steps))\n"
    "local V, S, B = 16, 12, 16   -- vocabulary, positions, samples per step\n"
    "local model = l2l.Sequential{\n"
    "  l2l.Embedding{ vocab = V, dim = 32, max_seq = S },\n"
    "  l2l.Block{ dim = 32, heads = 4, causal = true, memory = 'frugal' },\n"
    "  l2l.LMHead{ vocab = V, dim = 32, tie = true },\n"
    "}\n"
    "local run = l2l.Relay{ model = model, micro_batch = 4, stash = 'host', seed = 1,\n"
    "  optimizer = l2l.AdamW{ lr = 1e-2 },\n"
    "  schedule = l2l.CosineLR{ warmup = math.floor(steps / 10), total = steps } }\n"
    "local tok = l2l.zeros({ B, S }, { dtype = 'i32' })\n"
    "local tgt = l2l.zeros({ B, S }, { dtype = 'i32' })\n"
    "local loss\n"
    "for step = 1, steps do   -- learn to count: the next token is (t + 1) mod V\n"
    "  for b = 1, B do\n"
    "    local t0 = math.random(0, V - 1)\n"
    "    for s = 1, S do tok:set(b, s, (t0 + s) % V); tgt:set(b, s, (t0 + s + 1) % V) end\n"
    "  end\n"
    "  loss = run:step(tok, tgt)\n"
    "  if step == 1 or step % 20 == 0 or step == steps then\n"
    "    print(('step %4d  loss %.4f'):format(step, loss))\n"
    "  end\n"
    "end\n"
    "return steps, loss\n";

/* OpenMP's threads spin between parallel regions by default and then starve the relay's
   copy and optimizer threads (steps ran up to 60x slower on 2 cores). libgomp reads its
   policy before main, so the program restarts itself once with OMP_WAIT_POLICY=PASSIVE
   unless the user chose a policy (the l2l executable does the same). */
static void prefer_passive_openmp_threads(char **argv) {
  if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv); /* returns only on failure: then run as we are */
}

/* package.path := <dir>/?.lua;<dir>/?/init.lua;<the default path>, so that require("l2l")
   finds <dir>/l2l/init.lua. */
static void add_lua_dir(lua_State *L) {
  const char *dir = getenv("L2L_LUA_DIR");
  if (dir == NULL || dir[0] == '\0') dir = L2L_LUA_DIR;
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2); /* the old path and package */
}

/* The message handler of lua_pcall: runs where the error happened, so it can add the
   traceback (after the stack unwinds it is gone). */
static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg != NULL ? msg : "(the error object is not a string)", 1);
  return 1;
}

int main(int argc, char **argv) {
  prefer_passive_openmp_threads(argv);
  char *end = NULL;
  long steps = argc > 1 ? strtol(argv[1], &end, 10) : 100;
  if (argc > 2 || (argc > 1 && (end == argv[1] || *end != '\0'))) {
    fprintf(stderr, "usage: %s [steps]\n", argv[0]);
    return 2;
  }
  printf("embed_lua: libl2l %s linked in\n", l2l_version());

  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "embed_lua: cannot make a Lua state (out of memory)\n");
    return 1;
  }
  luaL_openlibs(L);
  add_lua_dir(L);

  /* Stack: traceback, the chunk, its argument; lua_pcall leaves the two results (or the
     message) in place of the chunk and argument. */
  lua_pushcfunction(L, traceback);
  int status = luaL_loadbuffer(L, script, strlen(script), "=embedded script");
  if (status == 0) {
    lua_pushinteger(L, (lua_Integer)steps);
    status = lua_pcall(L, 1, 2, 1);
  }
  if (status != 0) {
    fflush(stdout); /* what the script printed comes first */
    fprintf(stderr, "embed_lua: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return 1;
  }
  if (!lua_isnumber(L, -2) || !lua_isnumber(L, -1)) {
    fprintf(stderr, "embed_lua: the script did not return two numbers\n");
    lua_close(L);
    return 1;
  }
  long ran = (long)lua_tointeger(L, -2);
  double loss = lua_tonumber(L, -1);
  printf("embed_lua: the script ran %ld steps; final loss %.4f\n", ran, loss);

  /* Closing the state runs the finalizers that free the relay, the layers and tensors. */
  lua_close(L);
  return 0;
}
