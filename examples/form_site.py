"""A one-form web site on loopback, for trying the example agent.

    python examples/form_site.py --port 8123

``/form`` has a name field (``#name``) and a Send button (``#send``); ``/submitted``
answers ``<p id="r">Hello NAME</p>``.
"""

from __future__ import annotations

import argparse
import html
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

FORM = """<html><head><title>Form</title></head><body>
<form action="/submitted" method="get">
  <label>Name <input id="name" name="name"></label>
  <button id="send" type="submit">Send</button>
</form></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = urlsplit(self.path)
        if parts.path == "/form":
            body = FORM
        elif parts.path == "/submitted":
            name = html.escape(parse_qs(parts.query).get("name", [""])[0])
            body = f"<html><head><title>Thanks</title></head><body><p id='r'>Hello {name}</p>"
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8123)
    port = parser.parse_args().port
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:  # the port is taken: one line, not a traceback
        print(f"form_site: cannot listen on 127.0.0.1:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"form at http://127.0.0.1:{port}/form", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C: one line, exit 130 (as the hub and the sidecar)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
