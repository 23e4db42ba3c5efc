/* main.c — the l2l executable: LuaJIT with libl2l linked in.
 *
 * Purpose: run l2l's Lua scripts in a process that has jemalloc loaded from the start
 * (Debian's jemalloc cannot be dlopen'ed later, see README), with `require("l2l")` working
 * from any directory. Usage, like luajit's:
 *   l2l script.lua args...   run a script; args in `arg` and `...`
 *   l2l -e 'code' [...]      run a string (several -e allowed, then an optional script)
 *   l2l -                    run standard input
 *   l2l                      an interactive prompt (when standard input is a terminal)
 * Must never: hide a Lua error (it is printed with its traceback and the exit status is 1).
 */
#include <lauxlib.h>
#include <libgen.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l2l.h"

static const char *program = "l2l";

/* A nil error object stays nil: `error()` with no value ends a script quietly with status
   1 (busted exits that way). */
static int traceback(lua_State *L) {
  if (lua_isnil(L, 1)) return 1;
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  lua_getglobal(L, "debug");
  lua_getfield(L, -1, "traceback");
  lua_pushstring(L, msg);
  lua_pushinteger(L, 2);
  lua_call(L, 2, 1);
  return 1;
}

/* Runs the chunk on top of the stack with `nargs` arguments above it. */
static int call_chunk(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  return status;
}

static int report(lua_State *L, int status) {
  if (status != 0 && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "%s: %s\n", program, msg ? msg : "(error object is not a string)");
    fflush(stderr);
    lua_pop(L, 1);
  }
  return status;
}

/* package.path gets <root>/lua, where root is the folder above the executable's
   (build/l2l -> lua/ of the checkout), unless L2L_LUA_DIR names another. */
static void set_package_path(lua_State *L) {
  char exe[PATH_MAX], lua_dir[PATH_MAX];
  const char *env = getenv("L2L_LUA_DIR");
  if (env != NULL && env[0] != '\0') {
    snprintf(lua_dir, sizeof lua_dir, "%s", env);
  } else {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    char *dir = dirname(exe);       /* .../build */
    char *root = dirname(dir);      /* ... */
    snprintf(lua_dir, sizeof lua_dir, "%s/lua", root);
  }
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  const char *old = lua_tostring(L, -1);
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", lua_dir, lua_dir, old ? old : "");
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

/* arg = { [-k..-1] = interpreter and options, [0] = script, [1..] = script arguments }. */
static void set_arg_table(lua_State *L, char **argv, int argc, int script) {
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int run_script(lua_State *L, char **argv, int argc, int script) {
  const char *name = strcmp(argv[script], "-") == 0 ? NULL : argv[script];
  int status = luaL_loadfile(L, name);
  if (status != 0) return report(L, status);
  int nargs = argc - script - 1;
  for (int i = script + 1; i < argc; i++) lua_pushstring(L, argv[i]);
  return report(L, call_chunk(L, nargs, 0));
}

/* A plain prompt; line editing and history come with the REPL's own issue. Each line is
   tried as `return <line>` first, so expressions print their values. */
static void interactive(lua_State *L) {
  char line[8192];
  printf("l2l %s (LuaJIT) — Ctrl-D to quit\n", l2l_version());
  for (;;) {
    fputs("> ", stdout);
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL) break;
    lua_pushfstring(L, "return %s", line);
    const char *code = lua_tostring(L, -1);
    int status = luaL_loadbuffer(L, code, strlen(code), "=stdin");
    lua_remove(L, -2);
    if (status != 0) {
      lua_pop(L, 1);
      status = luaL_loadbuffer(L, line, strlen(line), "=stdin");
    }
    if (status == 0) {
      int top = lua_gettop(L) - 1;
      status = call_chunk(L, 0, LUA_MULTRET);
      if (status == 0 && lua_gettop(L) > top) {
        lua_getglobal(L, "print");
        lua_insert(L, top + 1);
        status = call_chunk(L, lua_gettop(L) - top - 1, 0);
      }
    }
    report(L, status);
    lua_settop(L, 0);
  }
  putchar('\n');
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s [options] [script [args...]]\n"
          "  -e code     run code (may repeat)\n"
          "  -v          print the version\n"
          "  -h          this help\n"
          "  -           run standard input\n"
          "With no script and no -e, an interactive prompt.\n",
          program);
}

/* Index of the script in argv (after the options), or argc if there is none. */
static int find_script(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-e") == 0) i++;
    else if (strcmp(argv[i], "--") == 0) return i + 1 < argc ? i + 1 : argc;
    else if (strcmp(argv[i], "-") == 0 || argv[i][0] != '-') return i;
  }
  return argc;
}

/* OpenMP threads (libgomp) spin between parallel regions by default. When another process
   holds a core, the spinning team and the descheduled thread starve each other: a tiny
   model trained 25x slower on 2 threads than with passive waiting. libgomp reads its
   policy once, before main, so the executable restarts itself with OMP_WAIT_POLICY set
   unless the user chose a policy. */
static void prefer_passive_openmp_threads(char **argv) {
  if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv); /* returns only on failure: then run as we are */
}

int main(int argc, char **argv) {
  prefer_passive_openmp_threads(argv);
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "%s: cannot create a Lua state (out of memory)\n", program);
    return 1;
  }
  luaL_openlibs(L);
  set_package_path(L);
  int script = find_script(argc, argv);
  set_arg_table(L, argv, argc, script);

  int status = 0, ran_code = 0;
  for (int i = 1; i < script && status == 0; i++) {
    if (strcmp(argv[i], "-e") == 0 && i + 1 < script) {
      status = luaL_loadbuffer(L, argv[i + 1], strlen(argv[i + 1]), "=(command line)");
      if (status == 0) status = call_chunk(L, 0, 0);
      report(L, status);
      ran_code = 1;
      i++;
    } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
      printf("l2l %s\n", l2l_version());
      ran_code = 1;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      ran_code = 1;
    } else if (strcmp(argv[i], "--") != 0) {
      fprintf(stderr, "%s: bad option %s\n", program, argv[i]);
      usage(stderr);
      status = 1;
    }
  }
  if (status == 0 && script < argc) {
    status = run_script(L, argv, argc, script);
  } else if (status == 0 && !ran_code) {
    if (isatty(STDIN_FILENO)) interactive(L);
    else status = report(L, luaL_loadfile(L, NULL) || call_chunk(L, 0, 0));
  }
  lua_close(L);
  return status == 0 ? 0 : 1;
}
