"""Request limits: the body cap (413), caps on requests in flight (429), and the server's
header and body read timeouts.

Rules:
  1. A ``Content-Length`` above the cap → 413 before the body is read.
  2. A body without a length (chunked) or with a lying length is counted as it streams; at the
     first chunk that crosses the cap the application sees the body end there, and whatever it
     answers is replaced by the 413 (nothing past the cap is buffered).
  3. Paths in ``own_limits`` (the OTLP receiver, which caps the *decompressed* size itself with
     its own setting) are passed through untouched.
  4. :class:`Admission` caps the requests in flight under each path prefix it is given (the
     API's analyses and, tighter, its SQL queries): past a cap the request is answered at once
     with 429 and ``Retry-After`` and counted in ``ioe_api_shed_requests_total``. Queries and
     analyses run in the server's shared thread pool; the caps keep them from filling it, so
     OTLP ingest still gets threads, and ``/healthz``/``/readyz`` run on the event loop.
  5. :class:`GuardedH11Protocol` closes a connection whose request headers are not complete
     :data:`HEADER_TIMEOUT_S` after its first byte (or after it opened), and one whose body
     stops arriving for :data:`BODY_TIMEOUT_S` (slowloris: thousands of connections each
     sending a byte now and then).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import h11
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_S = 1
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
SERVER_LIMIT_CONNECTIONS = 2048  # uvicorn answers 503 to requests past this many connections


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, own_limits: tuple[str, ...] = ()):
        self.app = app
        self.max_bytes = max_bytes
        self.own_limits = own_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in self.own_limits:
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await self._refuse(send, f"request body of {length} bytes exceeds the {self.max_bytes}-byte cap")
            return
        seen, refused = 0, False

        async def counting_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # rule 2: end the body here; the answer becomes 413
                    refused = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def replacing_send(message: Message) -> None:
            if not refused:
                await send(message)
            elif message["type"] == "http.response.start":
                await self._refuse(send, f"request body exceeds the {self.max_bytes}-byte cap")

        await self.app(scope, counting_receive, replacing_send)

    async def _refuse(self, send: Send, message: str) -> None:
        body = json.dumps({"detail": {"parameter": "body", "message": message}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]  # fmt: skip
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class ShedCounter:
    """``ioe_api_shed_requests_total{route, reason}``: requests refused to protect the server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.counter = Counter(
            "ioe_api_shed_requests",
            "Requests answered 429/503 without being served (overload, store unavailable).",
            ["route", "reason"],
            registry=self.registry,
        )

    def count(self, route: str, reason: str) -> None:
        self.counter.labels(route, reason).inc()

    def value(self, route: str, reason: str) -> float:
        labels = {"route": route, "reason": reason}
        return self.registry.get_sample_value("ioe_api_shed_requests_total", labels) or 0.0


class InFlight:
    """A count of requests in flight with a cap (event-loop only: no lock needed)."""

    def __init__(self, cap: int):
        self.cap, self.now = cap, 0

    def enter(self) -> bool:
        if self.now >= self.cap:
            return False
        self.now += 1
        return True

    def leave(self) -> None:
        self.now -= 1


class Admission:
    """Rule 4: ``caps`` maps a path prefix to ``(route label, InFlight)``; a request counts
    against every prefix it starts with."""

    def __init__(self, app: ASGIApp, caps: dict[str, tuple[str, InFlight]], shed: ShedCounter):
        self.app, self.caps, self.shed = app, caps, shed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        held: list[InFlight] = []
        for prefix, (route, gate) in self.caps.items():
            if not path.startswith(prefix):
                continue
            if not gate.enter():
                for g in held:
                    g.leave()
                self.shed.count(route, "overload")
                await too_many(send, f"more than {gate.cap} {route} requests in flight; retry later")
                return
            held.append(gate)
        try:
            await self.app(scope, receive, send)
        finally:
            for g in held:
                g.leave()


async def too_many(send: Send, message: str, status: int = 429) -> None:
    body = json.dumps({"detail": {"parameter": "concurrency", "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(RETRY_AFTER_S).encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardedH11Protocol(H11Protocol):
    """Rule 5: uvicorn's h11 protocol with a header deadline and a body idle timeout.

    uvicorn times out only idle keep-alive connections; a client that sends a request's headers
    (or its body) a byte at a time holds its connection, and a task, for ever."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(HEADER_TIMEOUT_S)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE and self.conn.our_state is h11.IDLE:
            if self._deadline is None:  # a request's first bytes: the headers must follow in time
                self._arm(HEADER_TIMEOUT_S)
        elif state is h11.SEND_BODY:
            self._arm(BODY_TIMEOUT_S)  # the body is read: each chunk restarts the idle clock
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.flow.read_paused:  # the server stopped reading (the app is busy): not the client's delay
            self._arm(BODY_TIMEOUT_S)
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.our_state is h11.IDLE):
            self.transport.close()


def server_options() -> dict[str, Any]:
    """uvicorn ``Config`` keywords for rule 5 (``ioe serve``)."""
    return {"http": GuardedH11Protocol, "limit_concurrency": SERVER_LIMIT_CONNECTIONS,
            "h11_max_incomplete_event_size": 64 * 1024}  # fmt: skip
