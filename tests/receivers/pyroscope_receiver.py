"""A Pyroscope ingest endpoint for bpfprof's tests: it keeps each `POST /ingest` it gets as
two files in OUT_DIR, numbered in the order they came: NNNNNN.pb (the body as sent) and
NNNNNN.json (the path, the query's parameters and the headers, lower-cased). The body is
left for the test to decode with an independent pprof reader (`go tool pprof -raw`).

Usage: pyroscope_receiver.py PORT_FILE OUT_DIR
It listens on a free loopback port and writes it to PORT_FILE once it listens.
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

LOCK = threading.Lock()
COUNT = [0]


def main(port_file, out_dir):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            url = urlsplit(self.path)
            meta = {
                "path": url.path,
                "query": {k: v[0] for k, v in parse_qs(url.query).items()},
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
            with LOCK:
                n = COUNT[0]
                COUNT[0] += 1
                stem = os.path.join(out_dir, "%06d" % n)
                with open(stem + ".pb", "wb") as f:
                    f.write(body)
                # The JSON last, renamed into place: a test that sees it sees both whole.
                with open(stem + ".json.tmp", "w") as f:
                    json.dump(meta, f)
                os.rename(stem + ".json.tmp", stem + ".json")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
