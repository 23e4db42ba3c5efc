/* SPDX-License-Identifier: MIT */
/* main.c — the l2l executable: LuaJIT with libl2l linked in, and its interactive prompt.
 *
 * Purpose: run l2l's Lua scripts in a process that has jemalloc loaded from the start
 * (Debian's jemalloc cannot be dlopen'ed later, see README), with `require("l2l")` working
 * from any directory. Usage, like luajit's:
 *   l2l script.lua args...   run a script; args in `arg` and `...`
 *   l2l -e 'code' [...]      run a string (several -e allowed, then an optional script)
 *   l2l -                    run standard input
 *   l2l                      the REPL when standard input is a terminal, else run it
 *   l2l -i [...]             the REPL after any -e code and script, whatever stdin is
 *   l2l train [FLAGS]        train a GPT on text (examples/train_gpt.lua, lua/l2l/train.lua)
 *   l2l plot METRICS [OUT]   redraw a training run's curves (lua/l2l/plot.lua's main)
 *   l2l sample CHECKPOINT    text a trained model writes (lua/l2l/use.lua's sample_main)
 *   l2l eval CHECKPOINT --data PATH   its loss and perplexity on a text (use.lua)
 * -e code and the REPL find `l2l` loaded, as a global. A script named `train`, `plot`,
 * `sample` or `eval` runs as `l2l ./plot` (and so on).
 * The REPL: line editing, completion and history with libedit when standard input and
 * output are terminals (history in $L2L_HISTORY, else ~/.l2l_history; an empty
 * L2L_HISTORY turns it off); plain lines otherwise, prompts on stderr so that stdout holds
 * only what the session printed. Each entry is tried as `return <entry>` first, so an
 * expression prints its values (lua/l2l/repl.lua: tensors, models, tables readably);
 * input that ends too early ("<eof>" expected) continues on a ">> " prompt; Ctrl-C drops
 * the entry being typed, or stops the running code at its next Lua instruction (code
 * typed at the prompt is never JIT-compiled, so that a loop in it reaches one; a second
 * Ctrl-C kills as usual); Ctrl-D ends the session with status 0 (1 when -e code or a
 * script run before `-i` failed).
 * Training loops stop gently on Ctrl-C, SIGTERM or SIGUSR1 through the module
 * "l2l.stop_signals" (stop_signals.c; lua/l2l/cli.lua wraps it).
 * SIGXFSZ is ignored: a file size limit is a refused write (EFBIG), which l2l reports.
 * Must never: hide a Lua error (it is printed with its traceback; a script's error makes
 * the exit status 1), end the REPL because of an error in an entry, or fail because the
 * history file cannot be read or written.
 */
#include <editline/readline.h>
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <libgen.h>
#include <limits.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "l2l.h"
#include "runner/runner.h"

static const char *program = "l2l";

/* A nil error object stays nil: `error()` with no value ends a script quietly with status
   1 (busted exits that way). An error object with __tostring is shown through it. */
static int traceback(lua_State *L) {
  if (lua_isnil(L, 1)) return 1;
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL && luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1)) msg = lua_tostring(L, -1);
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

/* stdout first: when both go to one pipe, the message comes after what the code printed. */
static int report(lua_State *L, int status) {
  if (status != 0 && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    fflush(stdout);
    fprintf(stderr, "%s: %s\n", program, msg ? msg : "(error object is not a string)");
    fflush(stderr);
    lua_pop(L, 1);
  }
  return status;
}

/* package.path gets, first, the folder of l2l's Lua modules: $L2L_LUA_DIR when set, else
   the first of these that holds l2l/init.lua, where ROOT is the folder above the
   executable's own:
     ROOT/lua             the checkout (build/l2l -> lua/)
     ROOT/share/lua/5.1   an installed tree (PREFIX/bin/l2l -> PREFIX/share/lua/5.1, make
                          install's LUADIR), wherever it was installed or copied to
   Otherwise LuaJIT's own path (LUA_PATH, or its default, which has /usr/local/share/lua/5.1
   and /usr/share/lua/5.1) is left to find them. */
static int has_modules(const char *dir) {
  char init[PATH_MAX];
  int n = snprintf(init, sizeof init, "%s/l2l/init.lua", dir);
  return n > 0 && (size_t)n < sizeof init && access(init, R_OK) == 0;
}

static void set_package_path(lua_State *L) {
  static const char *const below_root[] = {"lua", "share/lua/5.1"};
  char exe[PATH_MAX], lua_dir[PATH_MAX];
  const char *env = getenv("L2L_LUA_DIR");
  lua_dir[0] = '\0';
  if (env != NULL && env[0] != '\0') {
    snprintf(lua_dir, sizeof lua_dir, "%s", env);
  } else {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    char *root = dirname(dirname(exe)); /* build/l2l -> the checkout; PREFIX/bin/l2l -> PREFIX */
    for (size_t i = 0; i < sizeof below_root / sizeof below_root[0]; i++) {
      int len = snprintf(lua_dir, sizeof lua_dir, "%s/%s", strcmp(root, "/") == 0 ? "" : root,
                         below_root[i]);
      if (len > 0 && (size_t)len < sizeof lua_dir && has_modules(lua_dir)) break;
      lua_dir[0] = '\0';
    }
    if (lua_dir[0] == '\0') return;
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

/* ------------------------------------------------------------------ the REPL: Ctrl-C */

/* Ctrl-C at the prompt drops the entry being typed; while an entry runs, it sets a hook
   that raises "interrupted" at the next Lua call, return or instruction count (a loop
   inside C, or a JIT-compiled loop, sees it only when it comes back to the interpreter:
   a second Ctrl-C then kills the process as it would have without the REPL). The relay's
   threads may take the signal: it is passed on to the main thread, which runs Lua. */
static lua_State *repl_L;
static pthread_t main_thread;
static volatile sig_atomic_t interrupted, evaluating;

static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_where(L, 0);
  lua_pushfstring(L, "%sinterrupted (Ctrl-C)", lua_tostring(L, -1));
  lua_error(L);
}

static void on_sigint(int sig) {
  if (!pthread_equal(pthread_self(), main_thread)) {
    pthread_kill(main_thread, sig);
    return;
  }
  if (evaluating && interrupted) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  interrupted = 1;
  if (evaluating) lua_sethook(repl_L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* No SA_RESTART: a Ctrl-C at a plain prompt must end the blocked read (EINTR). */
static void catch_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

/* ------------------------------------------------------------------ the REPL: history */

/* A history file that exists but cannot be read is left alone for the session: writing
   ours would replace what is in it. Warnings come once; nothing here ends the REPL. */
static const char *history_file;   /* NULL: no history kept on disk */
static int history_warned;

static void history_warning(const char *what, int err) {
  if (history_warned) return;
  history_warned = 1;
  /* libedit says EINVAL (or nothing) for a file without its "_HiStOrY_V2_" header */
  const char *why = err == 0 || err == EINVAL ? "not a history file libedit can read" : strerror(err);
  fprintf(stderr, "%s: %s history file %s: %s; history will not be saved this session\n",
          program, what, history_file, why);
  history_file = NULL;
}

static void history_open(void) {
  static char path[PATH_MAX];
  const char *env = getenv("L2L_HISTORY");
  const char *home = getenv("HOME");
  using_history();
  stifle_history(1000);
  if (env != NULL) {
    if (env[0] == '\0') return;   /* turned off */
    snprintf(path, sizeof path, "%s", env);
  } else if (home != NULL && home[0] != '\0') {
    snprintf(path, sizeof path, "%s/.l2l_history", home);
  } else {
    return;
  }
  history_file = path;
  struct stat st;
  if (stat(path, &st) != 0) return;            /* a first session: created on the first save */
  if (st.st_size == 0) return;                 /* empty: nothing to read, nothing to lose */
  int err = read_history(path);
  if (err != 0) history_warning("cannot read the", err);
}

/* Saved after every entry, so that a crash or a kill loses nothing typed before it. The
   file is created private: a history can hold paths and secrets. */
static void history_add(const char *line) {
  if (strspn(line, " \t") == strlen(line)) return;
  add_history(line);
  if (history_file == NULL) return;
  int fd = open(history_file, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) {
    history_warning("cannot write the", errno);
    return;
  }
  close(fd);
  errno = 0;
  int err = write_history(history_file);
  if (err != 0) history_warning("cannot write the", err);
}

/* ------------------------------------------------------------------ the REPL: completion */

/* Names come from repl.complete (lua/l2l/repl.lua), which only reads tables. */
#define REPL_MODULE "l2l.repl"
#define REPL_MATCHES "l2l.repl: completions"

static char *completion_entry(const char *text, int state) {
  lua_State *L = repl_L;
  if (state == 0) {
    lua_getfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
    if (lua_istable(L, -1)) {
      lua_getfield(L, -1, "complete");
      lua_pushstring(L, text);
      if (lua_pcall(L, 1, 1, 0) != 0) lua_pushnil(L), lua_replace(L, -2);
    } else {
      lua_pushnil(L);
    }
    lua_setfield(L, LUA_REGISTRYINDEX, REPL_MATCHES);
    lua_pop(L, 1);
  }
  lua_getfield(L, LUA_REGISTRYINDEX, REPL_MATCHES);
  char *match = NULL;
  if (lua_istable(L, -1)) {
    lua_rawgeti(L, -1, state + 1);
    const char *s = lua_tostring(L, -1);
    if (s != NULL) match = strdup(s);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return match;
}

static char **complete(const char *text, int start, int end) {
  (void)start, (void)end;
  rl_attempted_completion_over = 1;       /* file names are no Lua names */
  rl_completion_append_character = '\0';  /* after `l2l.Sequential` comes `{` or `(` */
  return rl_completion_matches(text, completion_entry);
}

/* ------------------------------------------------------------------ the REPL: the loop */

/* One line without its newline (malloc'ed), or NULL at the end of input or on Ctrl-C
   (then `interrupted` is set). Without a terminal there is no libedit: its escapes would
   land in a pipe. */
static char *read_line(const char *prompt, int edit) {
  if (edit) return readline(prompt);
  fflush(stdout);
  fputs(prompt, stderr);
  fflush(stderr);
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, stdin);
  if (n < 0) {
    free(line);
    clearerr(stdin);   /* an EINTR sets the error flag; the next read must still work */
    return NULL;
  }
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  return line;
}

/* A syntax error whose message ends in '<eof>' ("'end' expected near '<eof>'") means the
   input stopped before the chunk was complete: more lines are wanted. */
static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t n;
  const char *msg = lua_tolstring(L, -1, &n);
  const char eof[] = "'<eof>'";
  return msg != NULL && n >= sizeof eof - 1 && strcmp(msg + n - (sizeof eof - 1), eof) == 0;
}

/* Compiles an entry as an expression list, whose values get printed, or else as
   statements; leaves the function or the statement form's error message, and in *nargs
   the number of arguments to run it with. The expression form is
   `return (...)(<entry>\n)`, run with an identity function as its one argument, not
   `return <entry>`: that would make `error("boom")` a tail call, whose message and
   traceback lose the line ("stdin:1:"). It is used only where `return <entry>` compiles,
   so it means the same. A leading `=` is Lua 5.1's shorthand for `return`. An entry whose
   expression form stops before its end (`1 +`) while its statement form is merely wrong
   leaves the expression's error: it is incomplete, and continues on the next line. */
static int compile(lua_State *L, const char *entry, size_t n, int *nargs) {
  const char *body = entry[0] == '=' ? entry + 1 : entry;
  size_t len = n - (size_t)(body - entry);
  *nargs = 0;
  lua_pushliteral(L, "return ");
  lua_pushlstring(L, body, len);
  lua_concat(L, 2);
  int status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_objlen(L, -1), "=stdin");
  lua_remove(L, -2);
  if (status == 0) {
    lua_pushliteral(L, "return (...)(");
    lua_pushlstring(L, body, len);
    lua_pushliteral(L, "\n)");   /* on its own line: the entry may end in a -- comment */
    lua_concat(L, 3);
    if (luaL_loadbuffer(L, lua_tostring(L, -1), lua_objlen(L, -1), "=stdin") == 0) {
      lua_remove(L, -2);   /* the source */
      lua_remove(L, -2);   /* the plain `return` form */
      *nargs = 1;
      return 0;
    }
    lua_pop(L, 2);   /* e.g. `1;` is an expression, `f(1;)` is not: keep `return 1;` */
    return 0;
  }
  if (body != entry) return status;
  int cut_short = incomplete(L, status);
  int statement = luaL_loadbuffer(L, entry, n, "=stdin");   /* (above the expression's error) */
  if (cut_short && statement != 0 && !incomplete(L, statement)) {
    lua_pop(L, 1);   /* the expression's error stands: more lines are wanted */
    return status;
  }
  lua_remove(L, -2);
  return statement;
}

/* The argument of the expression form: its arguments are its results. */
static int pass_values(lua_State *L) { return lua_gettop(L); }

/* Runs the compiled entry on top of the stack and shows what it returned. */
static void evaluate(lua_State *L, int nargs) {
  int top = lua_gettop(L) - 1;
  /* JIT-compiled code never looks at hooks: a loop typed here (`while true do end`) would
     not see the Ctrl-C. The entry and the functions it defines stay interpreted; what they
     call (l2l, modules, scripts) is compiled as usual. */
  luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF);
  /* A Ctrl-C that came after the line was read, while it compiled, stops the entry at its
     first instruction (the prompt clears `interrupted` before it reads a line). */
  evaluating = 1;
  if (interrupted) lua_sethook(L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  if (nargs == 1) lua_pushcfunction(L, pass_values);
  int status = call_chunk(L, nargs, LUA_MULTRET);
  int nvalues = lua_gettop(L) - top;
  if (status == 0 && nvalues > 0) {
    lua_getfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
    if (lua_istable(L, -1)) lua_getfield(L, -1, "show"), lua_remove(L, -2);
    else lua_pop(L, 1), lua_getglobal(L, "print");   /* lua/ not found: plain print */
    lua_insert(L, top + 1);
    status = call_chunk(L, nvalues, 0);
  }
  evaluating = 0;
  stop_signals_release();       /* a training loop that caught the stop signals and did not let go */
  lua_sethook(L, NULL, 0, 0);   /* a Ctrl-C that came after the last Lua instruction */
  fflush(stdout);
  report(L, status);
  lua_settop(L, top);
}

/* The first line of a failed require's message (the rest lists every path tried). */
static void require_failed(lua_State *L, const char *consequence) {
  const char *msg = lua_tostring(L, -1);
  if (msg == NULL) msg = "(error object is not a string)";
  int n = (int)strcspn(msg, "\n");
  if (n > 0 && msg[n - 1] == ':') n--;
  fprintf(stderr, "%s: %.*s; %s\n", program, n, msg, consequence);
  lua_pop(L, 1);
}

/* The global `l2l` for the REPL and -e code (a `local` typed at the prompt lasts one
   entry), unless one is there already; without it they still work as plain LuaJIT, and
   this says why. Returns whether the global `l2l` is there. */
static int define_l2l(lua_State *L) {
  lua_getglobal(L, "l2l");
  int defined = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (defined) return 1;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "l2l");
  if (lua_pcall(L, 1, 1, 0) != 0) {
    require_failed(L, "is L2L_LUA_DIR the lua/ folder of l2l?");
    return 0;
  }
  lua_setglobal(L, "l2l");
  return 1;
}

static int repl_setup(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, REPL_MODULE);
  if (lua_pcall(L, 1, 1, 0) == 0) lua_setfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
  else require_failed(L, "values print as print shows them, no completion");
  return define_l2l(L);
}

static void interactive(lua_State *L) {
  int edit = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  repl_L = L;
  main_thread = pthread_self();
  int loaded = repl_setup(L);
  catch_sigint();
  if (edit) {
    rl_readline_name = "l2l";   /* for "l2l:" lines in ~/.editrc */
    rl_attempted_completion_function = complete;
    /* '.' and ':' belong to the word: `l2l.Seq<Tab>`, `model:ins<Tab>` */
    static char breaks[] = " \t\n\"'`@$><=;|&{}()[],+-*/%^~#";
    rl_basic_word_break_characters = breaks;
    rl_completer_word_break_characters = breaks;
    history_open();
  }
  FILE *chat = edit ? stdout : stderr;   /* banner and prompts */
  fprintf(chat, "l2l %s (%s)%s; Ctrl-D quits\n", l2l_version(), LUAJIT_VERSION,
          loaded ? ": `l2l` is loaded" : "");
  fflush(chat);

  lua_settop(L, 0);
  lua_pushnil(L);   /* index 1: the entry so far when it needs more lines, else nil */
  for (;;) {
    int more = !lua_isnil(L, 1);
    interrupted = 0;
    char *line = read_line(more ? ">> " : "> ", edit);
    if (line == NULL && interrupted) {   /* Ctrl-C: a fresh prompt */
      fputc('\n', chat);
      fflush(chat);
      lua_pushnil(L);
      lua_replace(L, 1);
      continue;
    }
    if (line == NULL) break;
    if (edit) history_add(line);
    if (!more && strspn(line, " \t") == strlen(line)) {
      free(line);
      continue;
    }
    if (more) {
      lua_pushvalue(L, 1);
      lua_pushliteral(L, "\n");
      lua_pushstring(L, line);
      lua_concat(L, 3);
    } else {
      lua_pushstring(L, line);
    }
    free(line);
    size_t n;
    const char *entry = lua_tolstring(L, -1, &n);
    int nargs;
    int status = compile(L, entry, n, &nargs);
    if (incomplete(L, status)) {
      lua_pop(L, 1);
      lua_replace(L, 1);
      continue;
    }
    lua_remove(L, -2);
    lua_pushnil(L);
    lua_replace(L, 1);
    if (status != 0) report(L, status);
    else evaluate(L, nargs);
    lua_settop(L, 1);
  }
  /* Input that ended inside an entry is not silently dropped. */
  if (!lua_isnil(L, 1)) {
    size_t n;
    const char *entry = lua_tolstring(L, 1, &n);
    int nargs;
    report(L, compile(L, entry, n, &nargs));
  }
  fputc('\n', chat);
  fflush(chat);
  lua_settop(L, 0);
  signal(SIGINT, SIG_DFL);
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s [options] [script [args...]]\n"
          "       %s train [--data PATH] [--dry-run] ...   (train a GPT on text: `%s train --help`)\n"
          "       %s plot METRICS.jsonl [OUT.svg|OUT.png]   (redraw a run's curves)\n"
          "       %s sample CHECKPOINT [--prompt TEXT] [--tokens N] ...   (text the model writes)\n"
          "       %s eval CHECKPOINT --data PATH   (its loss and perplexity on a text)\n"
          "  -e code     run code (may repeat)\n"
          "  -i          the interactive prompt after the code and script, even when\n"
          "              standard input is not a terminal (then without line editing)\n"
          "  -v, --version  print the version\n"
          "  -h, --help     this help\n"
          "  -           run standard input\n"
          "  --          the options end: the next word is the script\n"
          "With no script and no -e, the interactive prompt when standard input is a\n"
          "terminal, else standard input runs as a script. -e code and the prompt have\n"
          "`l2l` loaded. At the prompt an expression prints its values; history is kept\n"
          "in $L2L_HISTORY (default ~/.l2l_history; empty: none). `%s plot --help`,\n"
          "`%s sample --help` and `%s eval --help` say more about each command.\n",
          program, program, program, program, program, program, program, program, program);
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

/* The commands: `l2l NAME ...` runs module.function(args). */
static const struct command {
  const char *name, *module, *function;
} commands[] = {
    {"train", "l2l.train", "main"},
    {"plot", "l2l.plot", "main"},
    {"sample", "l2l.use", "sample_main"},
    {"eval", "l2l.use", "eval_main"},
};

/* A word that names no file and looks like none (no '/', no '.'): a command mistyped
   (`l2l trian`), more likely than a script. */
static int looks_like_a_file(const char *word) {
  return strchr(word, '/') != NULL || strchr(word, '.') != NULL || strcmp(word, "-") == 0 ||
         access(word, F_OK) == 0;
}

static int not_a_command(const char *word) {
  fprintf(stderr, "%s: %s is neither a file nor a command; the commands are", program, word);
  for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
    fprintf(stderr, "%s %s", k == 0 ? "" : k + 1 == sizeof commands / sizeof commands[0] ? " and" : ",",
            commands[k].name);
  fprintf(stderr, " (`%s --help`)\n", program);
  return 1;
}

/* `l2l plot ...`: module.function(args), where args are the words after the command.
   Returns a Lua status; *code gets its result (the process's exit status when it is a
   number). */
static int run_command(lua_State *L, const struct command *c, char **argv, int argc, int command,
                       int *code) {
  lua_getglobal(L, "require");
  lua_pushstring(L, c->module);
  int status = call_chunk(L, 1, 1);
  if (status != 0) return report(L, status);
  lua_getfield(L, -1, c->function);
  lua_remove(L, -2);
  lua_createtable(L, argc - command - 1, 0);
  for (int i = command + 1; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - command);
  }
  status = call_chunk(L, 1, 1);
  if (status != 0) return report(L, status);
  *code = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return 0;
}

int main(int argc, char **argv) {
  prefer_passive_openmp_threads(argv);
  /* A file grown past the file size limit (ulimit -f) is refused with EFBIG, not answered
     by SIGXFSZ, whose default action kills the process with its output unflushed and its
     spill files left: the spill file's "no room" refusal then speaks, as for a full disk. */
  signal(SIGXFSZ, SIG_IGN);
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "%s: cannot create a Lua state (out of memory)\n", program);
    return 1;
  }
  luaL_openlibs(L);
  set_package_path(L);
  stop_signals_preload(L);
  int script = find_script(argc, argv);
  set_arg_table(L, argv, argc, script);

  /* With -i an error in the code or script is reported and the prompt still comes, to
     look at what the script left behind (python -i does the same); the exit status
     still says that it failed. */
  int force_repl = 0;
  for (int i = 1; i < script; i++) {
    if (strcmp(argv[i], "-e") == 0) i++;
    else if (strcmp(argv[i], "-i") == 0) force_repl = 1;
  }
  int status = 0, ran_code = 0, bad_option = 0, command_code = 0, defined = 0;
  for (int i = 1; i < script && status == 0; i++) {
    if (strcmp(argv[i], "-e") == 0 && i + 1 < script) {
      if (!defined) defined = 1, define_l2l(L);
      status = luaL_loadbuffer(L, argv[i + 1], strlen(argv[i + 1]), "=(command line)");
      if (status == 0) status = call_chunk(L, 0, 0);
      report(L, status);
      ran_code = 1;
      i++;
    } else if (strcmp(argv[i], "-i") == 0) {
      continue;
    } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
      printf("l2l %s\n", l2l_version());
      ran_code = 1;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      ran_code = 1;
    } else if (strcmp(argv[i], "-e") == 0) {
      fprintf(stderr, "%s: -e needs Lua code after it (-e 'print(1)')\n", program);
      usage(stderr);
      status = bad_option = 1;
    } else if (strcmp(argv[i], "--") != 0) {
      fprintf(stderr, "%s: bad option %s\n", program, argv[i]);
      usage(stderr);
      status = bad_option = 1;
    }
  }
  if (status == 0 && script < argc) {
    const struct command *c = NULL;
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
      if (strcmp(argv[script], commands[k].name) == 0) c = &commands[k];
    if (c != NULL) status = run_command(L, c, argv, argc, script, &command_code);
    else if (!looks_like_a_file(argv[script])) status = not_a_command(argv[script]);
    else status = run_script(L, argv, argc, script);
  }
  if (force_repl && !bad_option) {
    fflush(stdout);
    interactive(L);
  } else if (status == 0 && script == argc && !ran_code) {
    if (isatty(STDIN_FILENO)) interactive(L);
    else status = report(L, luaL_loadfile(L, NULL) || call_chunk(L, 0, 0));
  }
  /* Under mpirun a rank that failed ends the job at once (the others would wait out their
     timeout); it returns at once when MPI never started. Before lua_close, whose
     finalizers would wait for exchanges no other rank will answer. */
  if (status != 0) l2l_dist_abort("the script failed (its error is above)");
  lua_close(L);
  l2l_dist_finalize();
  return status != 0 ? 1 : command_code;
}
