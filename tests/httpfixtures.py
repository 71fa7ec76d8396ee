"""Small HTTP endpoints on 127.0.0.1 for end-to-end tests: fixed bodies, errors, hangs.

``serve({"/metrics": Route(body=...)})`` starts a threaded server on a free port and returns
it; ``.url(path)`` gives the address; ``.close()`` stops it and releases any hanging handler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Route:
    body: bytes | Callable[[], bytes] = b""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    hang_s: float = 0.0  # sleep this long (or until close) before answering


class FixtureServer:
    def __init__(self, routes: dict[str, Route]):
        self.routes = routes
        self.released = threading.Event()
        self.requests: list[tuple[str, dict[str, str]]] = []
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append((self.path, dict(self.headers.items())))
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                if route.hang_s:
                    server.released.wait(route.hang_s)
                body = route.body() if callable(route.body) else route.body
                try:
                    self.send_response(route.status)
                    self.send_header("Content-Type", route.content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a scrape deadline): expected in hang tests

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def serve(routes: dict[str, Route]) -> FixtureServer:
    return FixtureServer(routes)


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.2 s until it is truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
