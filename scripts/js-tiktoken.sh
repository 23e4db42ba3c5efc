#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# js-tiktoken.sh — the reference GPT-2 tokenizer for l2l's tests and benchmark: installs
# the npm package js-tiktoken (a JavaScript port of OpenAI's tiktoken, whose `gpt2`
# encoding is GPT-2's) into l2l's cache once, and prints the folder to give
# scripts/gpt2-reference.js.
# Usage: scripts/js-tiktoken.sh        (prints the folder; exit 1, saying why, without it)
# The folder: $L2L_JS_TIKTOKEN_DIR, else ${XDG_CACHE_HOME:-~/.cache}/l2l/js-tiktoken-VERSION.
# npm checks the package against the registry's integrity digest (and records it in the
# folder's package-lock.json). l2l's tokenizer itself never needs node or npm.
# Must never: install anything outside that folder (no global install).
set -euo pipefail
version=1.0.21
dir=${L2L_JS_TIKTOKEN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l/js-tiktoken-$version}

command -v node >/dev/null 2>&1 || { echo "js-tiktoken.sh: node is not installed (Debian: apt-get install nodejs npm)" >&2; exit 1; }
if [[ ! -f $dir/node_modules/js-tiktoken/package.json ]]; then
  command -v npm >/dev/null 2>&1 || { echo "js-tiktoken.sh: npm is not installed (Debian: apt-get install npm)" >&2; exit 1; }
  mkdir -p "$dir"
  [[ -f $dir/package.json ]] || echo '{ "name": "l2l-gpt2-reference", "private": true }' > "$dir/package.json"
  if ! out=$(cd "$dir" && timeout 300 npm install --no-audit --no-fund --fetch-retries=1 \
                 "js-tiktoken@$version" 2>&1); then
    echo "js-tiktoken.sh: npm could not install js-tiktoken@$version into $dir:" >&2
    echo "$out" | grep -v "Unknown user config" | tail -n 5 >&2
    exit 1
  fi
fi
got=$(node -e 'console.log(require(process.argv[1]).version)' "$dir/node_modules/js-tiktoken/package.json")
[[ $got == "$version" ]] || { echo "js-tiktoken.sh: $dir holds js-tiktoken $got, not $version" >&2; exit 1; }
echo "$dir"
