#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# spdx.sh — checks, or adds, the licence line atop each source file:
#   SPDX-License-Identifier: MIT      (the LICENSE file; https://spdx.dev/ids/)
# Usage: scripts/spdx.sh [--check | --add] [ROOT]    (default --check; ROOT: a checkout,
#        default the one this script is in)
# The files are those git tracks in ROOT (or every file, where ROOT is no git checkout).
# The line is the first one, or the second after a #! line, written in the file's own
# comment syntax:
#   .c .h .cu .cuh                      /* SPDX-License-Identifier: MIT */
#   .lua .ld, #! ...luajit or lua       -- SPDX-License-Identifier: MIT
#   .sh .py Makefile, #! ...sh|bash|python   # SPDX-License-Identifier: MIT
#   .1 (man pages)                      .\" SPDX-License-Identifier: MIT
# Generated files (lua/l2l/cdef.lua, made from include/l2l.h) and files of other kinds
# (Markdown, data, LICENSE) are left alone. --check lists each file without the line and
# exits 1 if there is one; --add inserts the line where it is missing and changes nothing
# else (running it twice changes nothing the second time).
# Must never: change a file in --check mode, or touch a file it does not know the syntax of.
set -uo pipefail

mode=--check
case ${1:-} in
  --check | --add) mode=$1; shift ;;
  -h | --help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) echo "spdx: unknown option $1 (--check or --add)" >&2; exit 2 ;;
esac
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || { echo "spdx: no folder $root" >&2; exit 2; }

ID="SPDX-License-Identifier: MIT"
GENERATED=" lua/l2l/cdef.lua "

# The comment syntax of a file: c, lua, hash, roff, or nothing (not a source file).
syntax_of() {
  local path=$1 first
  case $path in
    *.c | *.h | *.cu | *.cuh) echo c; return ;;
    *.lua | *.ld) echo lua; return ;;
    *.sh | *.py | Makefile | */Makefile) echo hash; return ;;
    *.1) echo roff; return ;;
  esac
  IFS= read -r first < "$path" 2>/dev/null || return
  case $first in
    '#!'*luajit* | '#!'*lua) echo lua ;;
    '#!'*sh | '#!'*bash | '#!'*python*) echo hash ;;
  esac
}

line_for() {
  case $1 in
    c) echo "/* $ID */" ;;
    lua) echo "-- $ID" ;;
    hash) echo "# $ID" ;;
    roff) echo ".\\\" $ID" ;;
  esac
}

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files)
else
  # no git (a machine with only the carried packages): every file but .git and the
  # folders .gitignore names (build outputs, carried packages), which git would skip
  prune=(-path ./.git)
  if [[ -f .gitignore ]]; then
    while read -r pattern; do
      [[ $pattern == */ && $pattern != /* && $pattern != \#* ]] || continue
      prune+=(-o -path "./${pattern%/}" -o -path "*/${pattern%/}")
    done < .gitignore
  fi
  mapfile -t files < <(find . \( "${prune[@]}" \) -prune -o -type f -print | sed 's|^\./||' | LC_ALL=C sort)
fi

missing=0 added=0 checked=0
for path in "${files[@]}"; do
  [[ -f $path ]] || continue
  [[ $GENERATED == *" $path "* ]] && continue
  syntax=$(syntax_of "$path")
  [[ -n $syntax ]] || continue
  checked=$((checked + 1))
  want=$(line_for "$syntax")
  first=$(sed -n 1p "$path")
  at=1
  [[ $first == '#!'* ]] && at=2
  [[ $(sed -n "${at}p" "$path") == "$want" ]] && continue
  if [[ $mode == --check ]]; then
    echo "spdx: $path: line $at is not: $want"
    missing=$((missing + 1))
  else
    tmp=$(mktemp "$path.spdx.XXXXXX") || exit 1
    if ((at == 2)); then
      { printf '%s\n' "$first"; printf '%s\n' "$want"; tail -n +2 "$path"; } > "$tmp"
    else
      { printf '%s\n' "$want"; cat "$path"; } > "$tmp"
    fi
    chmod --reference="$path" "$tmp" && mv "$tmp" "$path" || { rm -f "$tmp"; exit 1; }
    added=$((added + 1))
  fi
done

if [[ $mode == --check ]]; then
  if ((missing)); then
    echo "spdx: $missing of $checked source files lack the line (scripts/spdx.sh --add adds it)"
    exit 1
  fi
  echo "spdx: all $checked source files carry: $ID"
else
  echo "spdx: added the line to $added of $checked source files"
fi
