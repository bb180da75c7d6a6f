# An environment program for tests/test_env.c: JSON lines on stdin/stdout (docs/multi-turn.md),
# one answer line per call line. The tool name selects a behaviour:
#   calc       {"expr": "12*(3+4)"} → {"content": "84"}; with "finish": true also "done" and "reward" 1
#   echo       {"text": T} → {"content": "TRAJECTORY_ID:T"}
#   meet       {"dir": D, "n": N}: creates a file in D, then answers once D holds N files (calls of N
#              trajectories met, so they ran at once); waits at most 60 s, then answers "alone"
#   fail       {"error": "division by zero"}
#   garbage    a line that is not JSON
#   nocontent  {"result": 1}
#   sleep      sleeps 60 s (for timeouts)
#   die        exits with status 3 (writing to stderr first)
#   dieonce    {"mark": F}: exits with status 5 if F does not exist (creating it), else as echo
#   exit0      exits with status 0 without answering
#   twolines   answers with two lines
import ast
import json
import operator
import os
import sys
import time

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
       ast.Mod: operator.mod, ast.USub: operator.neg}


def arith(node):
    if isinstance(node, ast.Expression):
        return arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](arith(node.left), arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](arith(node.operand))
    raise ValueError("only integers and + - * // % are supported")


def answer(call):
    name, args, tid = call["name"], call["arguments"], call["trajectory_id"]
    if name == "calc":
        out = {"content": str(arith(ast.parse(args["expr"], mode="eval")))}
        if args.get("finish"):
            out.update(done=True, reward=1.0)
        return out
    if name == "echo":
        return {"content": "%s:%s" % (tid, args.get("text", ""))}
    if name == "meet":
        open(os.path.join(args["dir"], tid), "w").close()
        for _ in range(6000):
            if len(os.listdir(args["dir"])) >= args["n"]:
                return {"content": "met"}
            time.sleep(0.01)
        return {"content": "alone"}
    if name == "fail":
        return {"error": "division by zero"}
    if name == "garbage":
        return "GARBAGE"
    if name == "nocontent":
        return {"result": 1}
    if name == "sleep":
        time.sleep(60)
    if name == "die":
        sys.stderr.write("calc_env: dying on purpose\n")
        sys.stderr.flush()
        sys.exit(3)
    if name == "dieonce":
        if not os.path.exists(args["mark"]):
            open(args["mark"], "w").close()
            sys.exit(5)
        return {"content": "%s:%s" % (tid, "survived")}
    if name == "exit0":
        sys.exit(0)
    if name == "twolines":
        return '{"content": "one"}\n{"content": "two"}'
    return {"error": "unknown tool " + name}


for line in sys.stdin:
    out = answer(json.loads(line))
    sys.stdout.write((out if isinstance(out, str) else json.dumps(out)) + "\n")
    sys.stdout.flush()
