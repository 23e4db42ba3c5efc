#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu-unpack.sh — unpacks the .deb files of a folder made by scripts/gpu-deps.sh into
# PREFIX and writes PREFIX/env.sh, which puts their programs, libraries, headers and Lua
# modules on the search paths. scripts/gpu-host.sh calls it; by hand:
# Usage: scripts/gpu-unpack.sh DEBDIR [PREFIX]   then:  . PREFIX/env.sh
set -euo pipefail
src=${1:?usage: gpu-unpack.sh DEBDIR [PREFIX]}; prefix=${2:-/tmp/l2l-deps}
compgen -G "$src/*.deb" >/dev/null || { echo "gpu-unpack: no .deb files in $src" >&2; exit 2; }
mkdir -p "$prefix"
for f in "$src"/*.deb; do dpkg-deb -x "$f" "$prefix"; done
# absolute links (lib.so -> /usr/lib/...) are made to resolve inside the prefix
find "$prefix" -type l | while read -r l; do
  t=$(readlink "$l")
  case "$t" in /*) if [[ -e $prefix$t ]]; then ln -sfn "$prefix$t" "$l"; fi ;; esac
done
arch=x86_64-linux-gnu
blas=$prefix/usr/lib/$arch/openblas-openmp
# Debian's Lua scripts start with `#!/usr/bin/env lua-any`, which looks for /usr/bin/lua5.1
# itself: in a folder of their own, ldoc is started with the unpacked lua5.1 instead.
mkdir -p "$prefix/wrap"
if [[ -f $prefix/usr/bin/ldoc ]]; then
  printf '#!/bin/sh\nexec "%s/usr/bin/lua5.1" "%s/usr/bin/ldoc" "$@"\n' "$prefix" "$prefix" > "$prefix/wrap/ldoc"
  chmod +x "$prefix/wrap/ldoc"
fi
cat > "$prefix/env.sh" <<ENV
export PATH="$prefix/wrap:$prefix/usr/bin:\$PATH"
export GROFF_FONT_PATH="$prefix/usr/share/groff/current/font"
export GROFF_TMAC_PATH="$prefix/usr/share/groff/current/tmac:$prefix/etc/groff"
export LD_LIBRARY_PATH="$prefix/usr/lib/$arch:$prefix/lib/$arch:$blas:$prefix/usr/lib:\${LD_LIBRARY_PATH:-}"
export LIBRARY_PATH="$prefix/usr/lib/$arch:$blas:$prefix/usr/lib:\${LIBRARY_PATH:-}"
export C_INCLUDE_PATH="$prefix/usr/include:$prefix/usr/include/$arch:$prefix/usr/include/$arch/openblas-openmp:$prefix/usr/include/luajit-2.1:\${C_INCLUDE_PATH:-}"
export CPATH="\$C_INCLUDE_PATH"
export LUA_PATH="$prefix/usr/share/lua/5.1/?.lua;$prefix/usr/share/lua/5.1/?/init.lua;\${LUA_PATH:-;}"
export LUA_CPATH="$prefix/usr/lib/$arch/lua/5.1/?.so;\${LUA_CPATH:-;}"
export PKG_CONFIG_PATH="$prefix/usr/lib/$arch/pkgconfig:$prefix/usr/share/pkgconfig:\${PKG_CONFIG_PATH:-}"
ENV
echo "unpacked into $prefix; now: . $prefix/env.sh"
