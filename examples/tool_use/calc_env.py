# The calculator environment of examples/tool_use.yaml (docs/multi-turn.md, "The environment
# protocol"): one JSON call per line on stdin, {"trajectory_id", "name", "arguments"}; one JSON answer
# per line on stdout, {"content": "<the integer>"}, or {"error": "..."} for an expression it refuses
# (the model then reads "Error: ..." as the tool response). Integers with + - * and parentheses only:
# no names, no calls, no powers, so nothing the model writes can run code or take long.
import ast
import hashlib
import json
import math
import operator
import random
import sys
import time

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg,
       ast.UAdd: operator.pos}
MAX_DIGITS = 60  # an operand or result longer than this is refused (the tool response stays short)


def evaluate(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in OPS:
        value = OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        value = OPS[type(node.op)](evaluate(node.operand))
    else:
        raise ValueError("only integers, + - * and parentheses are supported")
    if len(str(abs(value))) > MAX_DIGITS:
        raise ValueError("a number has more than %d digits" % MAX_DIGITS)
    return value


def answer(call):
    if call.get("name") != "calc":
        return {"error": "unknown tool %r (this program serves calc)" % call.get("name")}
    args = call.get("arguments")
    expr = args.get("expr") if isinstance(args, dict) else None
    if not isinstance(expr, str):
        return {"error": "arguments.expr must be a string, e.g. \"1234*5678\""}
    if len(expr) > 200:
        return {"error": "the expression is longer than 200 characters"}
    try:
        return {"content": str(evaluate(ast.parse(expr.strip(), mode="eval").body))}
    except (SyntaxError, ValueError, RecursionError) as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}


def latency(call, median_s, sigma):
    """A slow tool's latency for this call: log-normal, drawn from the trajectory id (reproducible)."""
    seed = int.from_bytes(hashlib.sha256(str(call.get("trajectory_id")).encode()).digest()[:8], "little")
    return random.Random(seed).lognormvariate(math.log(median_s), sigma)


def main():
    # --latency MEDIAN_S SIGMA: answer each call after a log-normal delay (a stand-in for a slow tool: a
    # sandbox, a search engine), to measure what asynchrony hides (docs/multi-turn.md)
    median_s = sigma = 0.0
    if len(sys.argv) == 4 and sys.argv[1] == "--latency":
        median_s, sigma = float(sys.argv[2]), float(sys.argv[3])
    elif len(sys.argv) != 1:
        sys.exit("usage: calc_env.py [--latency MEDIAN_S SIGMA]")
    for line in sys.stdin:
        try:
            call = json.loads(line)
            if median_s > 0 and isinstance(call, dict):
                time.sleep(latency(call, median_s, sigma))
            out = answer(call) if isinstance(call, dict) else {"error": "the call is not a JSON object"}
        except ValueError as e:
            out = {"error": "the call is not JSON: %s" % e}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
