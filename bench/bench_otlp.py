"""OTLP ingest throughput in spans/s on one core, SDK-sized batches (512 spans per request).

Goal (issue 3): ≥ 20,000 spans/s. Batches are vLLM ``llm_request`` spans built by the real
OpenTelemetry SDK and encoded by its own encoder; every batch has fresh trace ids, so each
request inserts 512 new rows into a DuckDB store (no dedup shortcut). Three measurements:

  1. ``decode``: :func:`decode_protobuf` + :func:`request_rows` only (the pure parser).
  2. ``asgi``: the whole ``POST /v1/traces`` route in process through ``httpx.ASGITransport``
     into ``Store(":memory:")``; client and server share the one pinned core.
  3. ``loopback``: uvicorn in a child process pinned to one core, writing a DuckDB file;
     the client (another core) sends over 127.0.0.1 with keep-alive.

Run: ``.venv/bin/python -m bench.bench_otlp [--batches N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

GOAL_SPANS_PER_S = 20_000
BATCH = 512
HEADERS = {"Content-Type": "application/x-protobuf"}


def make_bodies(batches: int) -> list[bytes]:
    """``batches`` protobuf bodies of 512 vLLM spans each, with distinct trace ids."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from otlp_engine_spans import to_protobuf, vllm_spans

    from collector.formats.otlp_spans import decode_protobuf

    template = decode_protobuf(to_protobuf(vllm_spans(BATCH)))
    bodies = []
    for b in range(batches):
        for i, span in enumerate(template.resource_spans[0].scope_spans[0].spans):
            span.trace_id = (b * BATCH + i + 1).to_bytes(16, "big")
        bodies.append(template.SerializeToString())
    return bodies


def pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return f"pinned to CPU {min(os.sched_getaffinity(0))}"
    return "not pinned (no sched_setaffinity)"


def bench_decode(bodies: list[bytes]) -> float:
    from collector.formats.otlp_spans import decode_protobuf, request_rows

    start = time.perf_counter()
    n = sum(request_rows(decode_protobuf(b)).frame.height for b in bodies)
    return n / (time.perf_counter() - start)


async def _post_all(client: httpx.AsyncClient, bodies: list[bytes], headers: dict[str, str]) -> None:
    for body in bodies:
        r = await client.post("/v1/traces", content=body, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(f"ingest failed: HTTP {r.status_code} {r.content[:200]!r}")


def bench_asgi(bodies: list[bytes], *, gzipped: bool) -> tuple[float, int]:
    from api.app import create_app
    from collector.store import Store
    from ioe.settings import Settings

    store = Store(":memory:")
    app = create_app(Settings(store_path=":memory:"), store)
    headers = {**HEADERS, "Content-Encoding": "gzip"} if gzipped else HEADERS
    payload = [gzip.compress(b, 6) for b in bodies] if gzipped else bodies

    async def run() -> float:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            await _post_all(client, payload[:2], headers)  # warm-up (stored, then re-sent below)
            start = time.perf_counter()
            await _post_all(client, payload[2:], headers)
            return time.perf_counter() - start

    elapsed = asyncio.run(run())
    stored = store.count("request_spans")
    store.close()
    return (len(payload) - 2) * BATCH / elapsed, stored


def bench_loopback(bodies: list[bytes]) -> tuple[float, str]:
    from tests.conftest import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "IOE_BENCH_STORE": str(Path(tmp) / "bench.duckdb")}
        cmd = ["taskset", "-c", "0", sys.executable, "-m", "bench.bench_otlp", "--serve", str(port)]
        proc = subprocess.Popen(cmd, env=env)
        try:
            _wait_up(port)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                for body in bodies[:2]:
                    client.post("/v1/traces", content=body, headers=HEADERS).raise_for_status()
                start = time.perf_counter()
                for body in bodies[2:]:
                    client.post("/v1/traces", content=body, headers=HEADERS).raise_for_status()
                elapsed = time.perf_counter() - start
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    how = "server: uvicorn, 1 worker, taskset -c 0; client on the other core"
    return (len(bodies) - 2) * BATCH / elapsed, how


def _wait_up(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"bench server on port {port} did not start")


def serve(port: int) -> None:
    """Child-process mode of the loopback bench."""
    import uvicorn

    from api.app import create_app
    from collector.store import Store
    from ioe.settings import Settings

    store = Store(os.environ["IOE_BENCH_STORE"])
    app = create_app(Settings(store_path=store.path), store)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=42)
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-loopback", action="store_true")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    bodies = make_bodies(args.batches)
    print(f"{args.batches} requests × {BATCH} spans ({len(bodies[0]):,} bytes each, protobuf)")
    if not args.no_loopback:
        rate, how = bench_loopback(bodies)
        _report("HTTP over loopback (uvicorn)", rate, how)
    where = pin_one_core()
    _report("decode only (parser)", bench_decode(bodies), where)
    for gzipped in (False, True):
        rate, stored = bench_asgi(bodies, gzipped=gzipped)
        label = "ASGI in-process, gzip" if gzipped else "ASGI in-process, identity"
        _report(label, rate, f"{where}; {stored:,} rows stored")


def _report(label: str, rate: float, how: str) -> None:
    print(f"{label:34s} {rate:>10,.0f} spans/s   ratio to goal {rate / GOAL_SPANS_PER_S:5.2f}×   ({how})")


if __name__ == "__main__":
    main()
