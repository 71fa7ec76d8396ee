"""A small HTTP/1.1 client for scraping: one ``GET`` at a time per connection, kept alive.

A scrape is one GET of one URL every few seconds. httpx (with httpcore, h11 and anyio under it)
spent ~45 % of the sidecar's event-loop CPU on that, more than parsing the bodies did
(py-spy, ``bench/results/sidecar.md`` round 4); this client does the same GET on asyncio's
streams and is not imported with anything else.

Rules:

1. ``http://`` and ``https://`` URLs only (``https`` verifies the server's certificate against
   the system's CA store); anything else is :class:`HttpError` before a connection is made.
2. Connections are kept per (scheme, host, port) and reused while the server keeps them alive:
   HTTP/1.1 without ``Connection: close`` and a body whose end was known. Requests to one origin
   at the same time (three targets on one port) each take an idle connection or open one; at most
   :data:`MAX_IDLE_PER_ORIGIN` wait idle afterwards, the rest are closed. A request on a reused
   connection that the server closed in the meantime (EOF before any byte of a status line) is
   sent once more on a new connection; any other failure is not retried here.
3. Body framing (RFC 9112 §6.3): ``Transfer-Encoding: chunked``, else ``Content-Length``, else
   the body runs until the server closes the connection.
4. ``max_body_bytes`` bounds the body: a ``Content-Length`` over it is refused before reading,
   a chunked or close-delimited body as it streams in, a compressed one on its decoded size.
5. ``Content-Encoding: gzip`` or ``deflate`` is decoded (the request asks for ``identity``;
   a server may compress anyway); any other coding is an error naming it.
6. A status line that is not ``HTTP/1.x NNN``, a header section over :data:`MAX_HEAD_BYTES`, a
   header line without a colon, a bad ``Content-Length`` or chunk size: :class:`HttpError`
   naming what was wrong.
7. Any error, and a cancellation (the caller's deadline), closes the connection: a half-read
   response never leaks into the next request.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_PER_ORIGIN = 4  # idle keep-alive connections kept per (scheme, host, port), rule 2
READ_CHUNK = 256 * 1024
USER_AGENT = "ioe-sidecar"
DEFAULT_PORT = {"http": 80, "https": 443}


class HttpError(RuntimeError):
    """A request that got no usable response; the message says what was wrong."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent on the request line

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORT[self.scheme] else f"{host}:{self.port}"


def _target(url: str) -> _Target:
    """Rule 1."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise HttpError(f"bad URL {url!r}: {exc}") from exc
    if parts.scheme not in DEFAULT_PORT:
        raise HttpError(f"bad URL {url!r}: only http:// and https:// are scraped")
    if not parts.hostname:
        raise HttpError(f"bad URL {url!r}: no host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(parts.scheme, parts.hostname, port or DEFAULT_PORT[parts.scheme], path)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.used = False

    def close(self) -> None:
        self.writer.close()


class _Stale(Exception):
    """A reused connection the server had closed (rule 2): nothing of a response was read."""


class HttpClient:
    """Keep-alive GETs (see the module rules). Use as ``async with HttpClient() as c``."""

    def __init__(self, *, user_agent: str = USER_AGENT):
        self.user_agent = user_agent
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl: Any = None

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for pool in self._idle.values():
            for conn in pool:
                conn.close()
        self._idle.clear()

    async def get(self, url: str, *, headers: dict[str, str] | None = None, max_body_bytes: int) -> Response:
        """GET ``url``; raises :class:`HttpError` or ``OSError`` (connect, reset)."""
        target = _target(url)
        request = self._request(target, headers or {})
        pool = self._idle.get(target.origin)
        conn = pool.pop() if pool else None
        if conn is not None:
            try:
                return await self._exchange(target, conn, request, max_body_bytes)
            except _Stale:
                pass  # rule 2: the server closed it while idle; once more on a new connection
        conn = await self._connect(target)
        try:
            return await self._exchange(target, conn, request, max_body_bytes)
        except _Stale as exc:
            raise HttpError("connection closed before a status line") from exc

    # -- one exchange ---------------------------------------------------------------------
    async def _exchange(self, target: _Target, conn: _Connection, request: bytes, cap: int) -> Response:
        keep = False
        try:
            conn.writer.write(request)
            status, version, headers = await _read_head(conn)
            body, framed = await _read_body(conn.reader, headers, cap)
            body = _decoded(body, headers.get("content-encoding", ""), cap)
            keep = framed and version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
            return Response(status, headers, body)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise HttpError(f"connection lost mid-response ({type(exc).__name__})") from exc
        except asyncio.LimitOverrunError as exc:  # a chunk-size or trailer line without its CRLF
            raise HttpError(f"a chunked-body line over {MAX_HEAD_BYTES} bytes") from exc
        finally:
            pool = self._idle.setdefault(target.origin, [])
            if keep and len(pool) < MAX_IDLE_PER_ORIGIN:
                conn.used = True
                pool.append(conn)
            else:
                conn.close()  # rule 7, also on cancellation; or one idle connection too many

    def _request(self, target: _Target, headers: dict[str, str]) -> bytes:
        lines = [
            f"GET {target.path} HTTP/1.1",
            f"Host: {target.host_header}",
            f"User-Agent: {self.user_agent}",
            "Accept-Encoding: identity",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _connect(self, target: _Target) -> _Connection:
        ssl: Any = None
        if target.scheme == "https":
            if self._ssl is None:
                import ssl as ssl_module

                self._ssl = ssl_module.create_default_context()
            ssl = self._ssl
        reader, writer = await asyncio.open_connection(
            target.host, target.port, ssl=ssl, limit=MAX_HEAD_BYTES
        )
        return _Connection(reader, writer)


async def _read_head(conn: _Connection) -> tuple[int, str, dict[str, str]]:
    """Rule 6: status, HTTP version and headers of one response."""
    try:
        head = await conn.reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise HttpError(f"response header section over {MAX_HEAD_BYTES} bytes") from exc
    except asyncio.IncompleteReadError as exc:
        if conn.used and not exc.partial:
            raise _Stale() from exc
        raise HttpError(
            f"connection closed inside the response head ({len(exc.partial)} bytes read)"
        ) from exc
    except ConnectionError as exc:
        if conn.used:  # reset before a byte of the response: the server dropped the idle connection
            raise _Stale() from exc
        raise
    status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit() or rest[3:4] not in ("", " "):
        raise HttpError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(f"malformed response header line: {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return int(code), version, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], cap: int) -> tuple[bytes, bool]:
    """Rules 3-4: (body, whether its end was framed, so the connection may be reused)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader, cap), True
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise HttpError(f"bad Content-Length {length[:40]!r}")
        size = int(length)
        if size > cap:
            raise HttpError(f"body exceeds {cap} bytes (Content-Length {size}), abandoned")
        return await reader.readexactly(size), True
    parts: list[bytes] = []
    size = 0
    while chunk := await reader.read(READ_CHUNK):
        size += len(chunk)
        if size > cap:
            raise HttpError(f"body exceeds {cap} bytes, abandoned")
        parts.append(chunk)
    return b"".join(parts), False


async def _read_chunked(reader: asyncio.StreamReader, cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        text = line[:-2].split(b";", 1)[0].strip()
        try:
            n = int(text, 16)
        except ValueError as exc:
            raise HttpError(f"bad chunk size line {line[:40]!r}") from exc
        if n < 0:
            raise HttpError(f"bad chunk size line {line[:40]!r}")
        if n == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, ignored
                pass
            return b"".join(parts)
        size += n
        if size > cap:
            raise HttpError(f"body exceeds {cap} bytes, abandoned")
        parts.append(await reader.readexactly(n))
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError("chunk not followed by CRLF")


def _decoded(body: bytes, coding: str, cap: int) -> bytes:
    """Rule 5."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise HttpError(f"unsupported Content-Encoding {coding!r}")
    wbits = 47 if coding != "deflate" else 15  # 32+15: gzip or zlib header
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, cap + 1)
    except zlib.error as exc:
        raise HttpError(f"{coding} body does not decode: {exc}") from exc
    if len(out) > cap:
        raise HttpError(f"body exceeds {cap} bytes once decoded ({coding}), abandoned")
    return out
