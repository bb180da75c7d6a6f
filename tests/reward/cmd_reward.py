# A reward.command for tests/test_reward.c speaking moerl's JSON-lines protocol (docs/rewards.md).
# argv[1] selects a behaviour, good or bad:
#   ok          {"score": 1 if ground_truth in solution_str else 0, "len": len(solution_str), "pred": last word}
#   crash       exit status 3 at the first request (with a message on stderr)
#   segv        killed by SIGSEGV at the first request
#   crash_once STATE   crash at the first request when STATE does not exist (creates it), else ok
#   hang        never answers
#   hang_once STATE    as crash_once, hanging instead of crashing
#   garbage     answers a line that is not JSON
#   nan         answers NaN
#   notscore    answers an object without "score"
#   string      answers a JSON string
#   two         answers two lines per request (in one write)
#   exit0       reads one request and exits 0 without answering
#   error       answers {"error": ...}
#   closein     closes its stdin at start, then exits 4 on its own
import json
import os
import signal
import sys
import time

mode = sys.argv[1]
state = sys.argv[2] if len(sys.argv) > 2 else None


def ok(req):
    sol = req["solution_str"]
    words = sol.split()
    return json.dumps({"score": 1.0 if str(req["ground_truth"]) in sol else 0.0, "len": len(sol),
                       "pred": words[-1] if words else ""})


def first_time():
    if os.path.exists(state):
        return False
    open(state, "w").close()
    return True


if mode == "closein":
    os.close(0)
    time.sleep(0.5)
    sys.stderr.write("cmd_reward: closed stdin\n")
    sys.exit(4)
for line in sys.stdin:
    req = json.loads(line)
    if mode == "crash" or (mode == "crash_once" and first_time()):
        sys.stderr.write("cmd_reward: crashing on purpose at %s\n" % req["data_source"])
        sys.stderr.flush()
        sys.exit(3)
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "hang" or (mode == "hang_once" and first_time()):
        sys.stderr.write("cmd_reward: hanging\n")
        sys.stderr.flush()
        time.sleep(1000)
    if mode == "exit0":
        sys.exit(0)
    out = {"garbage": "this is not json", "nan": "NaN", "notscore": '{"scor": 1}', "string": '"0.5"',
           "error": '{"error": "no verifier for this row"}'}.get(mode, ok(req))
    if mode == "two":  # both lines in one write: they reach moerl together
        sys.stdout.flush()
        os.write(1, ((out + "\n") * 2).encode())
        continue
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
