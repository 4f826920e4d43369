"""Web pages served on loopback by the tests (the browser toolset, the MCP done-when
test, the example agent): a form, a slow page, pages that navigate away mid-click, a page
whose element appears late, a link to another origin."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PAGES = {
    "/form": """<html><head><title>Form</title></head><body>
        <form action="/submitted" method="get">
          <label>Name <input id="name" name="name"></label>
          <button id="send" type="submit">Send</button>
        </form></body></html>""",
    "/away": """<html><head><title>Away</title></head><body>
        <button id="go" onclick="location.href='/landing'">Go</button>
        <button id="early" onmousedown="location.href='/landing'">Early</button>
        </body></html>""",
    "/landing": "<html><head><title>Landing</title></head><body><h1>Landed</h1></body></html>",
    "/late": """<html><head><title>Late</title></head><body>
        <script>setTimeout(() => { const p = document.createElement('p');
          p.id = 'late'; p.textContent = 'here now'; document.body.appendChild(p); }, 300);
        </script></body></html>""",
    "/outlink": """<html><head><title>Out</title></head><body>
        <a id="out" href="http://127.0.0.2:{port}/landing">elsewhere</a></body></html>""",
    # ways off the allowed origin besides a link ({other}: the same server under
    # another origin, reachable, so only the toolset's route can stop the browser)
    "/popup": """<html><head><title>Popup</title></head><body>
        <button id="pop" onclick="window.open('{other}/landing')">Pop</button></body></html>""",
    "/refresh": """<html><head><title>Refresh</title>
        <meta http-equiv="refresh" content="0;url={other}/landing"></head><body></body></html>""",
    "/postform": """<html><head><title>PostForm</title></head><body>
        <form action="/posted" method="post">
          <input id="name" name="name"><button id="send" type="submit">Send</button>
        </form></body></html>""",
    "/jump": """<html><head><title>Jump</title></head><body>
        <button id="go" onclick="location.href='/redirect'">Go</button></body></html>""",
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = urlsplit(self.path)
        if parts.path == "/slow":
            time.sleep(3)
            body = "<html><head><title>Slow</title></head><body>finally</body></html>"
        elif parts.path == "/submitted":
            name = parse_qs(parts.query).get("name", [""])[0]
            body = f"<html><head><title>Thanks</title></head><body><p id='r'>Hello {name}</p>"
        elif parts.path in ("/redirect", "/hop"):  # to another origin / to this one
            port = self.server.server_address[1]
            self.send_response(302)
            other = f"http://localhost:{port}" if parts.path == "/redirect" else ""
            self.send_header("Location", f"{other}/landing")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        elif parts.path in PAGES:
            port = str(self.server.server_address[1])
            body = PAGES[parts.path].replace("{port}", port)
            body = body.replace("{other}", f"http://localhost:{port}")
        else:
            self.send_error(404)
            return
        data = body.encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser gave up on a slow page

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        name = parse_qs(self.rfile.read(length).decode()).get("name", [""])[0]
        data = f"<html><head><title>Posted</title></head><body><p id='r'>Got {name}</p>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (an ephemeral port) from a thread; yields the base
    URL, ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def serve_site() -> contextlib.AbstractContextManager[str]:
    """Serve :data:`PAGES` (plus ``/slow`` and ``/submitted``) on 127.0.0.1 from a thread;
    yields the base URL."""
    return serve(_Handler)
