# An environment server on the loopback interface for tests/test_env.c (a tool's url:). Listens on
# 127.0.0.1 on a free port and prints "PORT PID" on one line; stops when its parent goes away. A
# POST's body is one call object; the path selects a behaviour:
#   /tool      the answer of tests/tools/calc_env.py's tool of that name
#   /always500 HTTP 500 (the server refuses: the run stops once retries are used up)
#   /bad400    HTTP 400
#   /slow      answers after 60 s (for timeouts)
import importlib.util
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

spec = importlib.util.spec_from_file_location("calc_env_answer", os.path.join(os.path.dirname(__file__), "calc_env.py"))
sys.stdin = open(os.devnull)  # calc_env.py's loop over stdin ends at once when imported
calc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calc)


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
        call = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/always500":
            return self.reply(500, "internal error (always)")
        if self.path == "/bad400":
            return self.reply(400, "bad request")
        if self.path == "/slow":
            time.sleep(60)
        out = calc.answer(call)
        return self.reply(200, out if isinstance(out, str) else json.dumps(out))


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
