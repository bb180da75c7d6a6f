"""Python reference of the math-answer verifier (src/data/math_answer.h) for tests/test_math_answer.c.

Usage: /usr/bin/python3 tests/ref/gen_math_answers.py OUTDIR
  reads  tests/ref/math_answers.jsonl   {"response", "ground_truth", "expect": 0|1, "note"} per line
  writes OUTDIR/math_answers_ref.jsonl  {"response", "ground_truth", "score", "pred"} per line

The rules of math_answer.h written again, independently of the C code: regular expressions for the
scanning, fractions.Fraction for exact rationals. Source of the rules' ideas: verl's
reward_score/math.py (Hendrycks MATH strip_string / is_equiv) and math_dapo.py; no code taken.
Before writing, every case's score is checked against the hand-decided "expect" of the corpus, so
the reference is itself tested; it prints "N passed, N failed" and exits non-zero on a mismatch.
"""
import json
import os
import re
import sys
from fractions import Fraction

WS = " \t\n\r\v\f"
LIMIT = 10 ** 18       # a decimal or an integer has at most 18 digits
I64 = 2 ** 63          # |numerator| and denominator of the reduced value below 2^63


def nonempty(t):
    t = t.strip(WS)
    return t if t else None


def box_content(s):
    """The last \\boxed / \\fbox followed by '{' or ' '."""
    best = None
    for m in re.finditer(r"\\boxed(?=[{ ])|\\fbox(?=[{ ])", s):
        best = m
    if best is None:
        return None
    i = best.end()
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
                if depth == 0:
                    return nonempty(s[i + 1:j])
        return None
    m = re.match(r"[^ \t\n\r\v\f$]*", s[i:])
    return nonempty(m.group(0))


def after_hashes(s):
    k = s.rfind("####")
    if k < 0:
        return None
    return nonempty(s[k + 4:].split("\n", 1)[0])


def after_answer_is(s):
    last = None
    for m in re.finditer(r"answer(?: is|:)", s, re.IGNORECASE | re.ASCII):
        last = m
    if last is None:
        return None
    rest = s[last.end():].lstrip(" \t:")
    line = rest.split("\n", 1)[0]
    line = line.split(". ", 1)[0]
    return nonempty(line)


def last_number(s):
    found = None
    for m in re.finditer(r"(?<![0-9])[0-9]+(?:,[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?", s):
        a = m.start()
        if a >= 1 and s[a - 1] == "-":
            prev = s[a - 2] if a >= 2 else ""
            if not (prev.isascii() and (prev.isalnum() or prev == ")")):
                a -= 1
        found = s[a:m.end()]
    return found


def extract(s):
    for rule in (box_content, after_hashes, after_answer_is, last_number):
        r = rule(s)
        if r:
            return r
    return None


def brace_end(s, i):
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


TEXT_GROUP = re.compile(r"\\(?:text|textbf|mbox)\{")


def text_group_len(s, i):
    m = TEXT_GROUP.match(s, i)
    if not m:
        return 0
    j = brace_end(s, m.end() - 1)
    return j + 1 - i if j >= 0 else 0


def text_groups(s):
    while True:
        body = s.rstrip(WS + ".")
        cut = None
        for i in range(len(body)):
            g = text_group_len(body, i)
            if g and i + g == len(body) and body[:i].strip(WS):
                cut = i
                break
        if cut is None:
            break
        s = body[:cut]
    out, i = [], 0
    while i < len(s):
        g = text_group_len(s, i)
        if g:
            inner_start = s.index("{", i) + 1
            out.append(s[inner_start:i + g - 1])
            i += g
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def shorthand(s):
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i):
            out.append("\\frac")
            i += 5
            for _ in range(2):
                if i >= len(s) or s[i] == "\\":
                    break
                if s[i] == "{":
                    j = brace_end(s, i)
                    if j < 0:
                        break
                    out.append("{" + shorthand(s[i + 1:j]) + "}")
                    i = j + 1
                else:
                    out.append("{" + s[i] + "}")
                    i += 1
        elif s.startswith("\\sqrt", i):
            out.append("\\sqrt")
            i += 5
            if i < len(s) and s[i] not in "{[\\":
                out.append("{" + s[i] + "}")
                i += 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def normalize(a):
    s = re.sub(r"\\left(?![A-Za-z])", "", a)
    s = re.sub(r"\\right(?![A-Za-z])", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for d in ["\\!", "\\,", "\\;", "\\:", "\\ ", "\\%", "%", "\\$", "$", "^{\\circ}", "^\\circ"]:
        s = s.replace(d, "")
    s = text_groups(s)
    m = re.fullmatch(r"(-?[0-9]+)[ \t\n\r\v\f]+([0-9]+)/([0-9]+)", s.strip(WS))
    if m:
        s = "%s\\frac{%s}{%s}" % m.groups()
    s = re.sub(r"[ \t\n\r\v\f]", "", s)
    s = s.rstrip(".")
    if re.fullmatch(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?", s):
        s = s.replace(",", "")
    if s.count("=") == 1 and s.index("=") <= 2:
        s = s.split("=", 1)[1]
    return shorthand(s)


DEC = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"


def dec_value(t):
    ip, _, fp = t.partition(".")
    fp = fp.rstrip("0")
    if len(fp) > 18 or int((ip + fp) or "0") >= LIMIT:
        return None
    return Fraction(int((ip + fp) or "0"), 10 ** len(fp))


def int_value(t):
    v = int(t)
    return v if v < LIMIT else None


def rational(s):
    """[-]D, [-]D/D, [-]\\frac{[-]D}{[-]D}, [-]I\\frac{I}{I}: a Fraction, or None."""
    neg = s.startswith("-")
    body = s[1:] if neg else s
    v = None
    m = re.fullmatch(r"([0-9]+)\\frac\{([0-9]+)\}\{([0-9]+)\}", body)
    m2 = re.fullmatch(r"\\frac\{(-?)(%s)\}\{(-?)(%s)\}" % (DEC, DEC), body)
    m3 = re.fullmatch(r"(%s)(?:/(%s))?" % (DEC, DEC), body)
    if m:
        a, b, c = (int_value(x) for x in m.groups())
        if a is None or b is None or c is None or c == 0:
            return None
        v = a + Fraction(b, c)
    elif m2:
        x, y = dec_value(m2.group(2)), dec_value(m2.group(4))
        if x is None or y is None or y == 0:
            return None
        v = x / y * (-1 if (m2.group(1) == "-") != (m2.group(3) == "-") else 1)
    elif m3:
        x = dec_value(m3.group(1))
        y = dec_value(m3.group(2)) if m3.group(2) is not None else Fraction(1)
        if x is None or y is None or y == 0:
            return None
        v = x / y
    else:
        return None
    if neg:
        v = -v
    if abs(v.numerator) >= I64 or v.denominator >= I64:
        return None
    return v


def as_list(s):
    op = cl = ""
    inner = s
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        op, cl, inner = s[0], s[-1], s[1:-1]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    if len(parts) < 2 or len(parts) > 64:
        return None
    return op, cl, [p.strip(WS) for p in parts]


def equal(a, b):
    if a == b:
        return True
    ra, rb = rational(a), rational(b)
    if ra is not None and rb is not None:
        return ra == rb
    if ra is not None or rb is not None:
        return False
    la, lb = as_list(a), as_list(b)
    if la is None or lb is None or la[0] != lb[0] or la[1] != lb[1] or len(la[2]) != len(lb[2]):
        return False
    for x, y in zip(la[2], lb[2]):
        if (x == "") != (y == ""):
            return False
        if x and not equal(x, y):
            return False
    return True


def canonical(n):
    r = rational(n)
    if r is None:
        return n
    return str(r.numerator) if r.denominator == 1 else "%d/%d" % (r.numerator, r.denominator)


def score(response, ground_truth):
    """(score, pred) or raises ValueError for an empty ground truth."""
    gt = normalize(box_content(ground_truth) or ground_truth)
    if not gt:
        raise ValueError("empty ground truth")
    a = extract(response)
    n = normalize(a) if a is not None else ""
    if not n:
        return 0.0, None
    return (1.0 if equal(n, gt) else 0.0), canonical(n)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/testdata"
    os.makedirs(out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    passed = failed = 0
    rows = []
    with open(os.path.join(here, "math_answers.jsonl"), encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            c = json.loads(line)
            sc, pred = score(c["response"], c["ground_truth"])
            if sc == c["expect"]:
                passed += 1
            else:
                failed += 1
                print("FAIL math_answers.jsonl:%d (%s): reference scores %g, the corpus expects %g (pred %r)"
                      % (ln, c.get("note", ""), sc, c["expect"], pred))
            rows.append({"line": ln, "response": c["response"], "ground_truth": c["ground_truth"],
                         "score": sc, "pred": pred})
    with open(os.path.join(out, "math_answers_ref.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print("%d cases written to %s" % (len(rows), os.path.join(out, "math_answers_ref.jsonl")))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
