"""A tiny web app rate-limited per client address through ratelimitd, standard
library only (wsgiref); the same middleware wraps a Flask or Django app.

    pip install ./clients/python
    python3 example.py /run/ratelimitd/ratelimitd.sock 8080 rides_request
"""

import sys
from wsgiref.simple_server import make_server

from ratelimitd import Client
from ratelimitd.wsgi import RateLimitMiddleware

SOCKET, PORT, RULE = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]


# One client shared by every request (it is thread-safe); 429 + headers once the
# rule's limit for this address is used up.
limited = RateLimitMiddleware(app, Client(SOCKET), rule=RULE, key=lambda environ: environ["REMOTE_ADDR"])
make_server("127.0.0.1", PORT, limited).serve_forever()
