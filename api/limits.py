"""Request body cap: an ASGI middleware answering 413 past ``max_bytes``.

Rules:
  1. A ``Content-Length`` above the cap → 413 before the body is read.
  2. A body without a length (chunked) or with a lying length is counted as it streams; at the
     first chunk that crosses the cap the application sees the body end there, and whatever it
     answers is replaced by the 413 (nothing past the cap is buffered).
  3. Paths in ``own_limits`` (the OTLP receiver, which caps the *decompressed* size itself with
     its own setting) are passed through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
