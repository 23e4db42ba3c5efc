#!/usr/bin/env node
// gpt2-reference.js — GPT-2's encoding by an independent implementation (js-tiktoken's
// `gpt2`), for spec/l2l/tokenizer_spec.lua and bench/tokenizer.lua to compare l2l's with.
//
// Usage: node scripts/gpt2-reference.js DIR MODE ARGS...   (DIR: from scripts/js-tiktoken.sh)
//   encode IN OUT   IN: one text a line, as "x" and the hex of its UTF-8 bytes; OUT: each text's
//                   ids, space-separated, a line each (<|endoftext|> is plain text here,
//                   as in GPT-2's encoder.py and l2l); and OUT.bytes: the bytes' ids (below)
//   bytes OUT       the id of each single byte 0..255, a line each (from the ranks)
//   classes OUT     0x110000 bytes: the class JavaScript's regular expressions give each
//                   code point (0 other, 1 \p{L}, 2 \p{N}, 3 \s), with its Unicode version
//                   in OUT.version
//   bench FILE N    encodes FILE's text N times; prints JSON: tokens, the first and the
//                   best pass in CPU seconds (the process's, every thread) and the best in
//                   wall seconds, and a digest of the ids (to check both sides agree)
// Must never: hold tokenizer logic of its own: everything comes from js-tiktoken.
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, mode, ...args] = process.argv.slice(2);
if (!dir || !mode) { console.error('usage: gpt2-reference.js DIR MODE ARGS...'); process.exit(2); }

function encoding() {
  const { Tiktoken } = require(require.resolve('js-tiktoken/lite', { paths: [dir] }));
  const ranks = require(require.resolve('js-tiktoken/ranks/gpt2', { paths: [dir] }));
  return new Tiktoken(ranks);
}
// Ordinary text: no special token is allowed, and none refused.
const ordinary = (enc, text) => enc.encode(text, [], []);

function byteIds(enc, out) {
  const ids = [];
  for (let b = 0; b < 256; b++) ids.push(String(enc.rankMap.get(String(b))));
  fs.writeFileSync(out, ids.join('\n') + '\n');
}

if (mode === 'encode') {
  const enc = encoding();
  byteIds(enc, args[1] + '.bytes');
  const lines = fs.readFileSync(args[0], 'latin1').split('\n').filter((l) => l.startsWith('x'));
  const out = lines.map((l) => ordinary(enc, Buffer.from(l.slice(1), 'hex').toString('utf8')).join(' '));
  fs.writeFileSync(args[1], out.join('\n') + '\n');
} else if (mode === 'bytes') {
  byteIds(encoding(), args[0]);
} else if (mode === 'classes') {
  const letter = /^\p{L}$/u, number = /^\p{N}$/u, space = /^\s$/u;
  const out = Buffer.alloc(0x110000);
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    const s = String.fromCodePoint(cp);
    out[cp] = letter.test(s) ? 1 : number.test(s) ? 2 : space.test(s) ? 3 : 0;
  }
  fs.writeFileSync(args[0], out);
  fs.writeFileSync(args[0] + '.version', process.versions.unicode + '\n');
} else if (mode === 'bench') {
  const text = fs.readFileSync(args[0]).toString('utf8');
  const reps = Number(args[1] || 3);
  const t0 = process.hrtime.bigint();
  const enc = encoding();
  const load = Number(process.hrtime.bigint() - t0) / 1e9;
  let first = 0, best = Infinity, wall = Infinity, ids = null;
  const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
  for (let r = 0; r < reps; r++) {
    const t = process.hrtime.bigint(), c = cpu();
    ids = ordinary(enc, text);
    const s = cpu() - c;
    wall = Math.min(wall, Number(process.hrtime.bigint() - t) / 1e9);
    if (r === 0) first = s;
    best = Math.min(best, s);
  }
  // The same digest bench/tokenizer.lua computes: sum of (index mod 65521 + 1) * id, mod 2^32.
  let digest = 0;
  for (let i = 0; i < ids.length; i++) digest = (digest + ((i % 65521) + 1) * ids[i]) % 4294967296;
  console.log(JSON.stringify({ tokens: ids.length, load, first, best, wall, digest, node: process.version }));
} else {
  console.error('gpt2-reference.js: unknown mode ' + mode);
  process.exit(2);
}
