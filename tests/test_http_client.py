"""The scrape client (collector/sources/http_client.py) against scripted servers on 127.0.0.1.

Each server is asyncio's own: it answers every request on a connection with the next scripted
reply (raw bytes), so framing, keep-alive and broken answers are exactly what the test says.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Awaitable, Callable

import pytest

from collector.sources.http_client import MAX_HEAD_BYTES, HttpClient, HttpError

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"


class Scripted:
    """Replies in order, one per request; ``close_after`` closes a connection after N replies."""

    def __init__(self, replies: list[bytes], *, close_after: int = 0):
        self.replies = list(replies)
        self.close_after = close_after
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                writer.write(self.replies.pop(0))
                await writer.drain()
                served += 1
                if self.close_after and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def run(server: Scripted, body: Callable[[str], Awaitable[None]]) -> None:
    async def go() -> None:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            await body(f"http://127.0.0.1:{port}/metrics?x=1")
        finally:
            srv.close()

    asyncio.run(go())


def test_content_length_body_and_keep_alive_reuse() -> None:
    server = Scripted([OK + b"Content-Length: 6\r\n\r\nup 1\n\n", OK + b"Content-Length: 4\r\n\r\nup 2"])

    async def body(url: str) -> None:
        async with HttpClient() as c:
            first = await c.get(url, headers={"Accept": "text/plain; version=0.0.4"}, max_body_bytes=100)
            second = await c.get(url, max_body_bytes=100)
        assert (first.status, first.body, first.headers["content-type"]) == (200, b"up 1\n\n", "text/plain")
        assert second.body == b"up 2"

    run(server, body)
    assert server.connections == 1  # the second GET reused the first connection
    first = server.requests[0].decode()
    assert first.startswith("GET /metrics?x=1 HTTP/1.1\r\n")
    assert "\r\nAccept: text/plain; version=0.0.4\r\n" in first
    assert "\r\nHost: 127.0.0.1:" in first and "\r\nAccept-Encoding: identity\r\n" in first


def test_chunked_body_with_extension_and_trailer() -> None:
    reply = OK + b"Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nup 1\n\r\n3\r\nx 2\r\n0\r\nTrailer: t\r\n\r\n"
    server = Scripted([reply, OK + b"Content-Length: 2\r\n\r\nok"])

    async def body(url: str) -> None:
        async with HttpClient() as c:
            assert (await c.get(url, max_body_bytes=100)).body == b"up 1\nx 2"
            assert (await c.get(url, max_body_bytes=100)).body == b"ok"

    run(server, body)
    assert server.connections == 1


def test_close_delimited_body_is_read_to_eof_and_not_reused() -> None:
    server = Scripted([b"HTTP/1.0 200 OK\r\n\r\nup 1\nup 2\n"], close_after=1)
    server2 = server

    async def body(url: str) -> None:
        async with HttpClient() as c:
            assert (await c.get(url, max_body_bytes=100)).body == b"up 1\nup 2\n"
            server2.replies.append(OK + b"Connection: close\r\nContent-Length: 1\r\n\r\n7")
            assert (await c.get(url, max_body_bytes=100)).body == b"7"

    run(server, body)
    assert server.connections == 2


def test_stale_keep_alive_connection_is_retried_once_on_a_new_one() -> None:
    # the server answers one request per connection but does not say Connection: close
    server = Scripted([OK + b"Content-Length: 1\r\n\r\na", OK + b"Content-Length: 1\r\n\r\nb"], close_after=1)

    async def body(url: str) -> None:
        async with HttpClient() as c:
            assert (await c.get(url, max_body_bytes=10)).body == b"a"
            await asyncio.sleep(0.05)  # the server has closed the idle connection by now
            assert (await c.get(url, max_body_bytes=10)).body == b"b"

    run(server, body)
    assert server.connections == 2


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (OK + b"Content-Length: 5000\r\n\r\n", r"exceeds 100 bytes \(Content-Length 5000\)"),
        (OK + b"Transfer-Encoding: chunked\r\n\r\n40\r\n" + b"a" * 64 + b"\r\n40\r\n", "exceeds 100"),
        (b"HTTP/1.0 200 OK\r\n\r\n" + b"a" * 500, "exceeds 100 bytes, abandoned"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x status line: 'SSH-2.0-OpenSSH_9.2'"),
        (b"\x00\xff\xfe garbage\r\n\r\n", "not an HTTP/1.x status line"),
        (OK + b"no colon here\r\n\r\n", "malformed response header line: 'no colon here'"),
        (OK + b"Content-Length: -3\r\n\r\n", "bad Content-Length '-3'"),
        (OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size line"),
        (OK + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * (MAX_HEAD_BYTES + 10), "chunked-body line over"),
        (OK + b"Content-Length: 10\r\n\r\nabc", "connection lost mid-response"),
        (OK + b"X: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n", f"header section over {MAX_HEAD_BYTES}"),
        (OK + b"Content-Encoding: br\r\nContent-Length: 1\r\n\r\nx", "unsupported Content-Encoding 'br'"),
        (OK + b"Content-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", "gzip body does not decode"),
        (b"HTTP/1.1 200", "connection closed inside the response head"),
    ],
)
def test_broken_answers_name_what_was_wrong(reply: bytes, match: str) -> None:
    server = Scripted([reply], close_after=1)

    async def body(url: str) -> None:
        async with HttpClient() as c:
            with pytest.raises(HttpError, match=match):
                await c.get(url, max_body_bytes=100)

    run(server, body)


def test_compressed_bodies_are_decoded_and_capped_on_their_decoded_size() -> None:
    text = b"up 1\n" * 50  # 250 bytes
    gz, dfl = gzip.compress(text), zlib.compress(text)
    server = Scripted(
        [
            OK + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz) + gz,
            OK + b"Content-Encoding: deflate\r\nContent-Length: %d\r\n\r\n" % len(dfl) + dfl,
            OK + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz) + gz,
        ]
    )

    async def body(url: str) -> None:
        async with HttpClient() as c:
            assert (await c.get(url, max_body_bytes=1000)).body == text
            assert (await c.get(url, max_body_bytes=1000)).body == text
            with pytest.raises(HttpError, match="exceeds 100 bytes once decoded"):
                await c.get(url, max_body_bytes=100)

    run(server, body)


def test_non_200_status_is_returned_with_its_body() -> None:
    server = Scripted([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"])

    async def body(url: str) -> None:
        async with HttpClient() as c:
            got = await c.get(url, max_body_bytes=100)
        assert (got.status, got.body) == (503, b"busy")

    run(server, body)


def test_a_cancelled_request_closes_its_connection() -> None:
    server = Scripted(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", OK + b"Content-Length: 2\r\n\r\nok"]
    )

    async def body(url: str) -> None:
        async with HttpClient() as c:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c.get(url, max_body_bytes=100), 0.3)
            # the half-read answer is gone with its connection: the next GET starts clean
            assert (await c.get(url, max_body_bytes=100)).body == b"ok"

    run(server, body)
    assert server.connections == 2


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://h/x", "only http:// and https://"),
        ("http:///metrics", "no host"),
        ("http://h:99999/", "bad URL"),
    ],
)
def test_bad_urls_are_refused_before_connecting(url: str, match: str) -> None:
    async def go() -> None:
        async with HttpClient() as c:
            await c.get(url, max_body_bytes=10)

    with pytest.raises(HttpError, match=match):
        asyncio.run(go())


def test_refused_connection_is_an_oserror() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> None:
        async with HttpClient() as c:
            await c.get(f"http://127.0.0.1:{port}/metrics", max_body_bytes=10)

    with pytest.raises(OSError):
        asyncio.run(go())


def test_concurrent_gets_to_one_origin_each_keep_their_connection_and_the_surplus_is_closed() -> None:
    """Three targets on one port scraped at the same moment: three connections, all reused on the
    next round (none dropped unclosed); past MAX_IDLE_PER_ORIGIN the extra ones are closed."""
    from collector.sources import http_client

    n = http_client.MAX_IDLE_PER_ORIGIN + 2
    server = Scripted([OK + b"Content-Length: 2\r\n\r\nok"] * (3 * n))

    async def body(url: str) -> None:
        async with HttpClient() as c:
            for _ in range(3):
                got = await asyncio.gather(*(c.get(url, max_body_bytes=10) for _ in range(n)))
                assert [r.body for r in got] == [b"ok"] * n
                pool = c._idle[next(iter(c._idle))]
                assert len(pool) == http_client.MAX_IDLE_PER_ORIGIN
                assert all(not conn.writer.is_closing() for conn in pool)

    run(server, body)
    # round 1 opens n; rounds 2 and 3 reuse the kept ones and open n - kept each
    kept = http_client.MAX_IDLE_PER_ORIGIN
    assert server.connections == n + 2 * (n - kept)
