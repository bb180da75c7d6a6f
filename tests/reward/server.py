# A reward server on the loopback interface for tests/test_reward.c (reward.url). Listens on
# 127.0.0.1 on a free port (port 0) and prints "PORT PID" on one line. It stops when its parent
# process goes away. POST bodies are JSON lists of moerl's request objects (docs/rewards.md); the
# path selects a behaviour:
#   /ok            a list of {"score", "acc", "pred", "batch"}: score 1 when ground_truth is in
#                  solution_str, batch = the POST's list length
#   /flaky/KEY     HTTP 500 at the first POST for KEY, then as /ok
#   /always500     HTTP 500 with a body
#   /close         closes the connection without an answer
#   /closeonce/KEY closes the connection at the first POST for KEY, then as /ok
#   /wronglen      one answer fewer than requests
#   /nan           NaN scores
#   /bad400        HTTP 400 with a body
#   /notjson       HTTP 200 with a body that is not JSON
#   /slow          answers after 30 s (for timeouts)
#   /conc          as /ok after 0.1 s, with "inflight": the most POSTs this server had in progress at once
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

seen = set()
lock = threading.Lock()
inflight = [0, 0]  # now, most


def first(key):
    with lock:
        if key in seen:
            return False
        seen.add(key)
        return True


def answers(reqs):
    out = []
    for r in reqs:
        sol, gt = r["solution_str"], str(r["ground_truth"])
        words = sol.split()
        out.append({"score": 1.0 if gt in sol else 0.0, "acc": gt in sol, "pred": words[-1] if words else "",
                    "batch": len(reqs)})
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        reqs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        p = self.path
        if p.startswith("/flaky/") and first(p):
            return self.reply(500, "internal error (flaky on purpose)")
        if p == "/always500":
            return self.reply(500, "internal error (always)")
        if p == "/close" or (p.startswith("/closeonce/") and first(p)):
            self.close_connection = True
            return
        if p == "/wronglen":
            return self.reply(200, json.dumps(answers(reqs)[:-1]))
        if p == "/nan":
            return self.reply(200, json.dumps([float("nan")] * len(reqs)))
        if p == "/bad400":
            return self.reply(400, "bad request: missing field")
        if p == "/notjson":
            return self.reply(200, "<html>hello</html>")
        if p == "/slow":
            time.sleep(30)
        if p == "/conc":
            with lock:
                inflight[0] += 1
                inflight[1] = max(inflight[1], inflight[0])
            time.sleep(0.1)
            with lock:
                inflight[0] -= 1
                most = inflight[1]
            return self.reply(200, json.dumps([dict(a, inflight=most) for a in answers(reqs)]))
        return self.reply(200, json.dumps(answers(reqs)))


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up (timeouts)
            super().handle_error(request, client_address)


def main():
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], os.getpid(), flush=True)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.2)
    sys.exit(0)


main()
