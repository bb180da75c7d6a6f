# moerl's adapter for verl-style reward functions (reward.custom_reward_function.path / .name).
#
# moerl runs it as:  PYTHON -c <this file's text> PATH NAME
# It imports PATH as verl's get_custom_reward_fn does (a module loaded from the file), looks up
# NAME, and says {"ready": true} on one line. Then, for each request line on stdin (a JSON object:
# data_source, solution_str, ground_truth, extra_info, prompt), it calls
#     NAME(data_source=..., solution_str=..., ground_truth=..., extra_info=...)
# as verl's reward managers do, and writes one answer line: the float, or the dict the function
# returned (verl reads its "score" and keeps the other fields as reward_extra_info). An exception
# in the function answers {"error": "..."} (moerl stops the run with it); the traceback goes to
# stderr. Anything the function prints goes to stderr, never into the answers.
# The protocol is docs/rewards.md's.
import importlib.util
import json
import os
import sys
import traceback


def load(path, name):
    spec = importlib.util.spec_from_file_location("custom_module", path)
    if spec is None or spec.loader is None:
        sys.stderr.write("cannot load '%s' as a Python module\n" % path)
        sys.exit(2)
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.stderr.write("importing '%s' failed:\n%s" % (path, traceback.format_exc()))
        sys.exit(2)
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        sys.stderr.write("'%s' defines no function '%s' (its functions: %s)\n"
                         % (path, name, ", ".join(defined) or "none"))
        sys.exit(3)
    return fn


def plain(v):
    """JSON-ready values for what reward functions return (numpy scalars, bools, ...)."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if hasattr(v, "item"):
        return v.item()
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def answer(result, name):
    if isinstance(result, dict):
        return json.dumps({str(k): plain(v) for k, v in result.items()})
    if isinstance(result, (str, bytes)) or result is None or not hasattr(result, "__float__"):
        # verl puts the value into a float tensor: a string or None is a bug in the reward function
        return json.dumps({"error": "%s returned %s %.60r; expected a number or a dict with \"score\""
                                    % (name, type(result).__name__, result)})
    return json.dumps(float(result))  # NaN / inf are written as NaN / Infinity: moerl refuses them


def main():
    path, name = sys.argv[1], sys.argv[2]
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # prints of the reward code (and of C extensions) go to stderr
    sys.stdout = sys.stderr
    fn = load(path, name)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:  # bytes: UTF-8 whatever the locale (json.loads decodes them)
        req = json.loads(line)
        try:
            result = fn(data_source=req["data_source"], solution_str=req["solution_str"],
                        ground_truth=req["ground_truth"], extra_info=req["extra_info"])
        except Exception as e:
            traceback.print_exc()
            text = json.dumps({"error": "%s raised %s: %s" % (name, type(e).__name__, e)})
        else:
            text = answer(result, name)
        out.write(text + "\n")
        out.flush()


main()
