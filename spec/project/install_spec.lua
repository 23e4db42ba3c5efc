-- SPDX-License-Identifier: MIT
-- install_spec — l2l as a distribution packages it: `make install` into a temporary
-- DESTDIR with PREFIX=/usr gives exactly the files a package ships (the library with its
-- soname and links, the static library, l2l.h, l2l.pc, l2l, its man page and the Lua
-- modules), none with a RUNPATH (under PREFIX=/usr; any other prefix's l2l finds its
-- library by $ORIGIN/../lib); a C program builds against that tree with pkg-config
-- alone, shared and static; the installed l2l runs a script from a folder outside the
-- checkout, also after the tree is moved; a plain luajit loads the library by its soname;
-- `make uninstall` takes every file away again. Also: the build takes the caller's
-- CFLAGS, CPPFLAGS and LDFLAGS, and ARCH, as a package build passes them.
-- The nested `make` runs with this build's knobs (BUILD, SANITIZE; the caller's other
-- variables come through MAKEFLAGS from `make test`). A sanitized build installs
-- sanitized files: its l2l.pc adds the sanitizer runtimes, so the same tests run.
local support = dofile("spec/support.lua")
local sh = support.sh
local sanitized = os.getenv("L2L_SANITIZE") == "1"

local q = support.q
-- The installed library's folder goes first; what the environment already lists stays
-- after it (a machine whose packages are unpacked in a folder finds LuaJIT and OpenBLAS
-- there: scripts/gpu-host.sh).
local inherited = os.getenv("LD_LIBRARY_PATH") and os.getenv("LD_LIBRARY_PATH") ~= ""
                  and ":" .. q(os.getenv("LD_LIBRARY_PATH")) or ""

-- make in the checkout with this build's folder and mode.
local function make(args)
  return sh(("cd %s && make -s --no-print-directory BUILD=%s SANITIZE=%s %s")
            :format(q(support.root), q(support.build), sanitized and "1" or "0", args))
end

local function lines(text)
  local list = {}
  for line in text:gmatch("[^\n]+") do list[#list + 1] = line end
  return list
end

-- "type mode path [link target]" of everything under dir, sorted.
local function tree(dir)
  local status, out = sh(("cd %s && find . -mindepth 1 \\( -type f -o -type l \\) -printf '%%y %%m %%P %%l\\n' | LC_ALL=C sort")
                         :format(q(dir)))
  assert(status == 0, out)
  return lines((out:gsub(" \n", "\n")))
end

local function readelf_dynamic(path)
  local status, out = sh("readelf -d " .. q(path))
  assert(status == 0, out)
  return out
end

local version = (select(2, sh(support.build .. "/l2l -v")):match("^l2l (%d+%.%d+%.%d+)\n$"))
local major = version and version:match("^(%d+)")

describe("make install DESTDIR=... PREFIX=/usr", function()
  local tmp, stage, usr
  local lua_files = lines(select(2, sh("cd lua && find l2l -type f -name '*.lua' | LC_ALL=C sort")))

  setup(function()
    tmp = select(2, sh("mktemp -d")):match("^(%S+)")
    stage = tmp .. "/stage"
    usr = stage .. "/usr"
    local status, out = make(("install DESTDIR=%s PREFIX=/usr"):format(q(stage)))
    assert(status == 0, "make install failed: " .. out)
  end)

  teardown(function()
    if tmp then sh("rm -rf " .. q(tmp)) end
  end)

  it("installs exactly the files a package ships, with their modes", function()
    assert.is_truthy(version, "build/l2l -v gave no version")
    local want = {
      "f 755 usr/bin/l2l",
      "f 644 usr/include/l2l.h",
      "f 644 usr/lib/libl2l.a",
      "l 777 usr/lib/libl2l.so libl2l.so." .. major,
      ("l 777 usr/lib/libl2l.so.%s libl2l.so.%s"):format(major, version),
      "f 644 usr/lib/libl2l.so." .. version,
      "f 644 usr/lib/pkgconfig/l2l.pc",
      "f 644 usr/share/man/man1/l2l.1",
      "f 755 usr/share/l2l/gpt2-vocab.sh",   -- l2l.tokenizer.gpt2() fetches GPT-2's files with it
    }
    -- the MPI plugin, where this build has one (mpicc was found)
    if support.read_file(support.build .. "/libl2l-mpi.so") then want[#want + 1] = "f 644 usr/lib/libl2l-mpi.so" end
    for _, f in ipairs(lua_files) do want[#want + 1] = "f 644 usr/share/lua/5.1/" .. f end
    -- the header's parts, beside it (l2l.h includes them from l2l/)
    local parts = lines(select(2, sh("cd include && ls l2l/*.h | LC_ALL=C sort")))
    assert.is_true(#parts >= 2, "include/l2l/ has the header's parts")
    for _, f in ipairs(parts) do want[#want + 1] = "f 644 usr/include/" .. f end
    -- the examples, to read and to run (`l2l /usr/share/l2l/examples/train_gpt.lua`)
    for _, f in ipairs(lines(select(2, sh("ls examples/*.lua examples/*.c | LC_ALL=C sort")))) do
      want[#want + 1] = "f 644 usr/share/l2l/" .. f
    end
    table.sort(want)
    assert.are.same(want, tree(stage))
    assert.are.equal(support.read_file("include/l2l.h"), support.read_file(usr .. "/include/l2l.h"))
    for _, f in ipairs(parts) do
      assert.are.equal(support.read_file("include/" .. f), support.read_file(usr .. "/include/" .. f))
    end
    assert.are.equal(support.read_file("lua/l2l/init.lua"),
                     support.read_file(usr .. "/share/lua/5.1/l2l/init.lua"))
  end)

  it("gives the library its soname and neither it nor l2l a RUNPATH", function()
    local lib = readelf_dynamic(usr .. "/lib/libl2l.so." .. version)
    assert.is_truthy(lib:find("Library soname: [libl2l.so." .. major .. "]", 1, true), lib)
    assert.is_falsy(lib:find("RPATH", 1, true) or lib:find("RUNPATH", 1, true), lib)
    local exe = readelf_dynamic(usr .. "/bin/l2l")
    assert.is_truthy(exe:find("Shared library: [libl2l.so." .. major .. "]", 1, true), exe)
    assert.is_falsy(exe:find("RPATH", 1, true) or exe:find("RUNPATH", 1, true), exe)
    -- the build tree's programs keep theirs (they run from the checkout)
    local built = readelf_dynamic(support.build .. "/l2l")
    assert.is_truthy(built:find("[$ORIGIN]", 1, true), built)
  end)

  -- pkg-config reads only the staged l2l.pc, with its prefix moved into the stage
  -- (--define-variable: what the file says is relative to ${prefix}).
  local function pkg_config(args)
    return ("PKG_CONFIG_LIBDIR=%s pkg-config --define-variable=prefix=%s %s")
           :format(q(usr .. "/lib/pkgconfig"), q(usr), args)
  end

  it("has an l2l.pc with the version, the folders and the libraries", function()
    local pc = support.read_file(usr .. "/lib/pkgconfig/l2l.pc")
    assert.is_truthy(pc:find("\nprefix=/usr\n", 1, true) or pc:find("^prefix=/usr\n"), pc)
    assert.is_truthy(pc:find("\nlibdir=${prefix}/lib\n", 1, true), pc)
    assert.is_truthy(pc:find("\nincludedir=${prefix}/include\n", 1, true), pc)
    local status, out = sh(pkg_config("--modversion l2l"))
    assert.are.equal(0, status, out)
    assert.are.equal(version .. "\n", out)
    status, out = sh(pkg_config("--cflags --libs l2l"))
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("-I" .. usr .. "/include", 1, true), out)
    assert.is_truthy(out:find("-L" .. usr .. "/lib -ll2l", 1, true), out)
    status, out = sh(pkg_config("--static --libs l2l"))
    assert.are.equal(0, status, out)
    for _, l in ipairs({ "-lopenblas", "-ljemalloc", "-lxxhash", "-lgomp", "-lm" }) do
      assert.is_truthy(out:find(l, 1, true), l .. " missing: " .. out)
    end
  end)

  -- (its last line: cuDNN loaded, or why not; a program that did not link jemalloc itself
  -- once aborted there, "free(): invalid pointer", its C++ code taking jemalloc's
  -- operator new beside glibc's free)
  local function check_hello(out)
    assert.is_truthy(out:find("c = [[1, 4], [3, 10]]", 1, true), out)
    assert.is_truthy(out:find("refused: l2l_gemm: inner dims differ", 1, true), out)
    assert.is_truthy(out:find("\ncuDNN: [^\n]+\n$"), out)
  end

  it("builds examples/hello.c with pkg-config alone, and runs it", function()
    local hello = tmp .. "/hello"
    local status, out = sh(("cd %s && cc -std=c11 -Wall -Wextra -Werror %s/examples/hello.c -o %s $(%s)")
                           :format(q(tmp), q(support.root), q(hello), pkg_config("--cflags --libs l2l")))
    assert.are.equal(0, status, out)
    local elf = readelf_dynamic(hello)
    assert.is_truthy(elf:find("[libl2l.so." .. major .. "]", 1, true), elf)
    status, out = sh(("cd %s && LD_LIBRARY_PATH=%s%s %s"):format(q(tmp), q(usr .. "/lib"), inherited, q(hello)))
    assert.are.equal(0, status, out)
    check_hello(out)
  end)

  -- libl2l.a statically, the libraries it needs from pkg-config --static (without them:
  -- undefined GOMP_parallel, and __cxa_guard_acquire where CUDA was built).
  it("links libl2l.a statically with pkg-config --static, and runs it", function()
    local hello = tmp .. "/hello_static"
    local status, out = sh(("cd %s && cc -std=c11 %s/examples/hello.c -o %s $(%s) $(%s | sed 's/-ll2l/-l:libl2l.a/')")
                           :format(q(tmp), q(support.root), q(hello), pkg_config("--cflags l2l"),
                                   pkg_config("--static --libs l2l")))
    assert.are.equal(0, status, out)
    local elf = readelf_dynamic(hello)
    assert.is_falsy(elf:find("libl2l", 1, true), elf)
    status, out = sh(q(hello))
    assert.are.equal(0, status, out)
    check_hello(out)
  end)

  local script = [[
local l2l = require("l2l")
print(l2l.version, l2l.library, package.searchpath("l2l", package.path))
local x = l2l.ones({ 2, 3 })
print(x:numel(), l2l.ops ~= nil)
]]

  it("runs a script with the installed l2l from a folder outside the checkout", function()
    local dir = tmp .. "/elsewhere"
    sh("mkdir -p " .. q(dir))
    support.write_file(dir .. "/script.lua", script)
    local run = "cd %s && env -u L2L_LUA_DIR -u LUA_PATH LD_LIBRARY_PATH=%s" .. inherited .. " %s script.lua"
    local status, out = sh(run:format(q(dir), q(usr .. "/lib"), q(usr .. "/bin/l2l")))
    assert.are.equal(0, status, out)
    assert.are.equal(("%s\t(linked in)\t%s/share/lua/5.1/l2l/init.lua\n6\ttrue\n"):format(version, usr), out)
    -- the same tree moved elsewhere still finds its own modules
    local moved = tmp .. "/moved"
    sh(("cp -a %s %s"):format(q(stage), q(moved)))
    status, out = sh(run:format(q(dir), q(moved .. "/usr/lib"), q(moved .. "/usr/bin/l2l")))
    sh("rm -rf " .. q(moved))
    assert.are.equal(0, status, out)
    assert.are.equal(("%s\t(linked in)\t%s/usr/share/lua/5.1/l2l/init.lua\n6\ttrue\n"):format(version, moved), out)
  end)

  it("lets a plain luajit load the library by its soname", function()
    if sanitized then
      pending("a sanitized libl2l needs the sanitizer runtime loaded before it; plain luajit has none")
      return
    end
    local lua_path = ("%s/share/lua/5.1/?.lua;%s/share/lua/5.1/?/init.lua;;"):format(usr, usr)
    local run = ("cd %s && env -u L2L_LIB -u LD_PRELOAD -u GLIBC_TUNABLES LD_LIBRARY_PATH=%s" .. inherited .. " LUA_PATH=%s %%s luajit -e %s")
                :format(q(tmp), q(usr .. "/lib"), q(lua_path),
                        q('local l2l = require("l2l"); print(l2l.library, l2l.ones({ 2 }):numel())'))
    local status, out = sh(run:format("GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536"))
    assert.are.equal(0, status, out)
    assert.are.equal("libl2l.so." .. major .. "\t2\n", out)
    -- without the workaround: the TLS hint, naming the soname it tried
    status, out = sh(run:format(""))
    assert.are_not.equal(0, status, out)
    assert.is_truthy(out:find("libl2l.so." .. major .. ": ", 1, true), out)
    assert.is_truthy(out:find("GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 luajit", 1, true), out)
  end)

  it("takes every file away again with make uninstall", function()
    local status, out = make(("uninstall DESTDIR=%s PREFIX=/usr"):format(q(stage)))
    assert.are.equal(0, status, out)
    assert.are.same({}, tree(stage))
  end)
end)

describe("make install's folders", function()
  it("default to PREFIX=/usr/local and follow BINDIR, LIBDIR, INCLUDEDIR, MANDIR", function()
    local tmp = select(2, sh("mktemp -d")):match("^(%S+)")
    local status, out = make(("install DESTDIR=%s"):format(q(tmp .. "/a")))
    assert.are.equal(0, status, out)
    local files = table.concat(tree(tmp .. "/a"), "\n")
    for _, f in ipairs({ "usr/local/bin/l2l", "usr/local/lib/libl2l.so." .. tostring(version),
                         "usr/local/lib/pkgconfig/l2l.pc", "usr/local/include/l2l.h",
                         "usr/local/share/man/man1/l2l.1", "usr/local/share/lua/5.1/l2l/init.lua" }) do
      assert.is_truthy(files:find(" " .. f, 1, true), f .. " not in:\n" .. files)
    end
    local dirs = "PREFIX=/opt/l2l BINDIR=/opt/l2l/sbin LIBDIR=/usr/lib/x86_64-linux-gnu " ..
                 "INCLUDEDIR=/opt/inc MANDIR=/opt/man"
    status, out = make(("install DESTDIR=%s %s"):format(q(tmp .. "/b"), dirs))
    assert.are.equal(0, status, out)
    files = table.concat(tree(tmp .. "/b"), "\n")
    for _, f in ipairs({ "opt/l2l/sbin/l2l", "usr/lib/x86_64-linux-gnu/libl2l.a",
                         "usr/lib/x86_64-linux-gnu/pkgconfig/l2l.pc", "opt/inc/l2l.h",
                         "opt/man/man1/l2l.1", "opt/l2l/share/lua/5.1/l2l/init.lua" }) do
      assert.is_truthy(files:find(" " .. f, 1, true), f .. " not in:\n" .. files)
    end
    local pc = support.read_file(tmp .. "/b/usr/lib/x86_64-linux-gnu/pkgconfig/l2l.pc")
    assert.is_truthy(pc:find("libdir=/usr/lib/x86_64-linux-gnu\n", 1, true), pc)
    assert.is_truthy(pc:find("includedir=/opt/inc\n", 1, true), pc)
    status, out = make(("uninstall DESTDIR=%s %s"):format(q(tmp .. "/b"), dirs))
    sh("rm -rf " .. q(tmp))
    assert.are.equal(0, status, out)
  end)
end)

describe("make install PREFIX=<a folder of your own>", function()
  it("runs without LD_LIBRARY_PATH (a RUNPATH relative to l2l's folder), also moved, and C programs by the README's recipe", function()
    local tmp = select(2, sh("mktemp -d")):match("^(%S+)")
    local prefix = tmp .. "/opt/l2l"
    local status, out = make(("install PREFIX=%s"):format(q(prefix)))
    assert.are.equal(0, status, out)
    local exe = readelf_dynamic(prefix .. "/bin/l2l")
    assert.is_truthy(exe:find("Library runpath: [$ORIGIN/../lib]", 1, true), exe)
    assert.is_falsy(readelf_dynamic(prefix .. "/lib/libl2l.so." .. version):find("RUNPATH", 1, true))
    -- the loader's path has nothing of the prefix (the environment's own folders stay:
    -- scripts/gpu-host.sh's unpacked packages)
    local env_path = os.getenv("LD_LIBRARY_PATH") and q(os.getenv("LD_LIBRARY_PATH")) or "''"
    local run = ("cd %s && env -u L2L_LUA_DIR -u LUA_PATH LD_LIBRARY_PATH=%s %%s -e %s")
                :format(q(tmp), env_path,
                        q('local l2l = require("l2l"); print(l2l.version, package.searchpath("l2l", package.path))'))
    status, out = sh(run:format(q(prefix .. "/bin/l2l")))
    assert.are.equal(0, status, out)
    assert.are.equal(("%s\t%s/share/lua/5.1/l2l/init.lua\n"):format(version, prefix), out)
    status, out = sh(("env LD_LIBRARY_PATH=%s ldd %s"):format(env_path, q(prefix .. "/bin/l2l")))
    assert.is_truthy(out:find("libl2l.so." .. major .. " => " .. prefix .. "/bin/../lib/", 1, true), out)
    local moved = tmp .. "/moved"
    sh(("cp -a %s %s"):format(q(prefix), q(moved)))
    status, out = sh(run:format(q(moved .. "/bin/l2l")))
    assert.are.equal(0, status, out)
    assert.are.equal(("%s\t%s/share/lua/5.1/l2l/init.lua\n"):format(version, moved), out)
    -- a program of your own: PKG_CONFIG_PATH to build, the library's folder as its RUNPATH
    if not sanitized then
      local hello = tmp .. "/hello"
      local pc = ("PKG_CONFIG_PATH=%s pkg-config"):format(q(prefix .. "/lib/pkgconfig"))
      status, out = sh(("cc -std=c11 %s/examples/hello.c -o %s $(%s --cflags --libs l2l) -Wl,-rpath,$(%s --variable=libdir l2l)")
                       :format(q(support.root), q(hello), pc, pc))
      assert.are.equal(0, status, out)
      status, out = sh(("env LD_LIBRARY_PATH=%s %s"):format(env_path, q(hello)))
      assert.are.equal(0, status, out)
      assert.is_truthy(out:find("c = [[1, 4], [3, 10]]", 1, true), out)
    end
    status, out = make(("uninstall PREFIX=%s"):format(q(prefix)))
    assert.are.equal(0, status, out)
    assert.are.same({}, tree(prefix))
    sh("rm -rf " .. q(tmp))
  end)
end)

describe("the build's flags", function()
  -- `make -n -B` prints every command of a full build without running one.
  local function dry_run(vars, env)
    local tmp = select(2, sh("mktemp -d")):match("^(%S+)")
    -- (none of the caller's variables: the defaults are under test)
    local clean = "-u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CFLAGS -u CPPFLAGS -u LDFLAGS -u ARCH -u EXTRA_CFLAGS"
    local status, out = sh(("cd %s && env " .. clean .. " %s make -n -B --no-print-directory BUILD=%s SANITIZE=0 %s all")
                           :format(q(support.root), env or "", q(tmp), vars))
    sh("rm -rf " .. q(tmp))
    assert(status == 0, out)
    local compiles, links, cuda = {}, {}, false
    for _, line in ipairs(lines(out)) do
      if line:match("nvcc") then
        cuda = true
      elseif line:match(" %-c src/%S+%.c ") then
        compiles[#compiles + 1] = line
      elseif line:match(" %-o %S+/libl2l%.so%.[%d.]+ ") or line:match(" %-o %S+/l2l ") then
        links[#links + 1] = line
      end
    end
    assert(#compiles > 10 and #links == 4, "unexpected dry run:\n" .. out)
    return compiles, links, cuda
  end

  it("puts the caller's CFLAGS, CPPFLAGS and LDFLAGS after its own", function()
    local flags = "CFLAGS='-O2 -g -DPROBE_CFLAGS' CPPFLAGS='-DPROBE_CPPFLAGS' " ..
                  "LDFLAGS='-Wl,-z,relro -Wl,--defsym=probe_ldflags=0'"
    for _, how in ipairs({ "command line", "environment" }) do
      local compiles, links, cuda
      if how == "command line" then compiles, links, cuda = dry_run(flags)
      else compiles, links, cuda = dry_run("", flags) end
      for _, line in ipairs(compiles) do
        local own, cpp, c = line:find("-march=native", 1, true), line:find("-DPROBE_CPPFLAGS", 1, true),
                            line:find("-O2 -g -DPROBE_CFLAGS", 1, true)
        assert.is_truthy(own and cpp and c and own < cpp and cpp < c, how .. ": " .. line)
        assert.is_falsy(line:find("-O3", 1, true), how .. ": " .. line)
        if cuda and line:find("src/backend/cuda/", 1, true) then
          assert.is_truthy(line:find("-DL2L_CUDA", 1, true), how .. ": " .. line)
        end
      end
      for _, line in ipairs(links) do
        assert.is_truthy(line:find("-Wl,-z,relro -Wl,--defsym=probe_ldflags=0", 1, true), how .. ": " .. line)
      end
    end
  end)

  it("builds for this machine by default, for ARCH=x86-64-v3 when asked, or for no -march", function()
    local compiles = dry_run("")
    for _, line in ipairs(compiles) do
      assert.is_truthy(line:find(" -O3 -g", 1, true) and line:find(" -march=native ", 1, true), line)
    end
    compiles = dry_run("ARCH=x86-64-v3")
    for _, line in ipairs(compiles) do
      assert.is_truthy(line:find(" -march=x86-64-v3 ", 1, true), line)
      assert.is_falsy(line:find("native", 1, true), line)
    end
    compiles = dry_run("ARCH=")
    for _, line in ipairs(compiles) do assert.is_falsy(line:find("-march", 1, true), line) end
  end)
end)
