"""A tiny HTTP server rate-limited per client address through ratelimitd.

    python3 example.py /run/ratelimitd/ratelimitd.sock 8080 rides_request
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ratelimitd import Client

SOCKET, PORT, RULE = sys.argv[1], int(sys.argv[2]), sys.argv[3]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        r = rl.check(RULE, self.client_address[0])
        self.send_response(200 if r.allowed else 429)
        for name, value in r.headers().items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(b"hello\n" if r.allowed else b"slow down\n")


rl = Client(SOCKET)  # one connection shared by the handler threads (the client locks)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
