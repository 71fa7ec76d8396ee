"""The collector-only agent's own endpoints, without the web stack (``api_enabled: false``).

A standard-library HTTP server on a daemon thread answers, on ``listen_host:listen_port``:

1. ``GET /healthz`` → 200 ``{"status": "ok"}`` while the process runs;
2. ``GET /readyz`` → 200 ``{"status": "ready", "schema_version": N}`` once the store answers,
   503 with the store's error otherwise;
3. ``GET /metrics`` → the self-metrics registries in the Prometheus text format 0.0.4, as the
   full API serves them (:meth:`collector.selfmetrics.Registry.exposition`; a prometheus_client
   registry is rendered by prometheus_client, imported then);
4. anything else → 404 naming the three paths; other methods → 405.

These are the same answers the full API gives on those paths, so probes and scrape configs do
not change with the mode.

5. The server thread sleeps until a request comes (:data:`POLL_S` between checks for a stop,
   not the standard library's 0.5 s); :meth:`HealthServer.stop` wakes it by connecting to the
   port once, so stopping still takes no longer than before. Two wake-ups a second were
   ~0.1 ms of CPU a second of a collector's ~9 (bench/results/sidecar.md, round 10).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from collector.selfmetrics import CONTENT_TYPE

log = logging.getLogger(__name__)
PATHS = ("/healthz", "/readyz", "/metrics")
POLL_S = 3600.0  # rule 5: how long the server thread sleeps between checks for a stop
STOP_WAIT_S = 5.0  # rule 5: how long stop() tries to wake it (a daemon thread: it ends with the process)


class HealthServer:
    """Serves rules 1-4 until :meth:`stop`; ``port=0`` picks a free port (see :attr:`port`)."""

    def __init__(
        self,
        host: str,
        port: int,
        registries: Iterable[Any],
        schema_version: Callable[[], int],
    ):
        self._registries = list(registries)
        self._schema_version = schema_version
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self._serve, name="ioe-health", daemon=True)

    def _serve(self) -> None:
        self.httpd.serve_forever(poll_interval=POLL_S)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port (also for a server that was never started): the
        shutdown waits for the serving thread, which a connection wakes (rule 5)."""
        if self._thread.is_alive():
            # shutdown() waits for serve_forever: it would block forever if never started
            done = threading.Thread(target=self.httpd.shutdown, name="ioe-health-stop", daemon=True)
            done.start()
            deadline = time.monotonic() + STOP_WAIT_S
            while done.is_alive() and time.monotonic() < deadline:
                self._wake()
                done.join(0.05)
        self.httpd.server_close()

    def _wake(self) -> None:
        """Connect to the server's own port, so its thread looks at the stop request now."""
        host, port = self.httpd.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(str(host), str(host))
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.5):
            pass

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for ``GET path`` (rules 1-4)."""
        route = path.split("?", 1)[0]
        if route == "/healthz":
            return _json(200, {"status": "ok"})
        if route == "/readyz":
            try:
                return _json(200, {"status": "ready", "schema_version": self._schema_version()})
            except Exception as exc:  # the store is not answering: not ready, and say why
                return _json(503, {"status": "not ready", "error": str(exc)})
        if route == "/metrics":
            return 200, CONTENT_TYPE, b"".join(map(_exposition, self._registries))
        return _json(404, {"error": f"no such path {route!r}; this agent serves {', '.join(PATHS)}"})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, ctype, body = server.answer(self.path)
                self._send(status, ctype, body)

            def do_POST(self) -> None:
                self._send(
                    *_json(405, {"error": "this collector-only agent takes no POST (api_enabled: false)"})
                )

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("health %s", fmt % args)

        return Handler


def _exposition(registry: Any) -> bytes:
    """Rule 3: a registry's text, by its own ``exposition`` or prometheus_client's."""
    if hasattr(registry, "exposition"):
        return bytes(registry.exposition())
    from prometheus_client import generate_latest

    return generate_latest(registry)


def _json(status: int, doc: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(doc).encode()
