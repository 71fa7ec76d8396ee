"""End to end: the real OpenTelemetry SDK exporters (OTLP/HTTP protobuf+gzip and OTLP/gRPC+gzip)
stream vLLM request spans into `ioe sidecar`; the sidecar is killed with SIGKILL mid-stream and
restarted on the same store file while the exporters retry; then the store is read back.

The claim is exact. Each batch the SDK hands to its exporter is recorded with its result (and
every span created is handed over: the SDK's queue is large enough never to drop one):
  1. every span of a batch the exporter reported SUCCESS is in the store exactly once, with the
     latency it was created with (no loss of acknowledged spans, no double count after retries);
  2. the store holds nothing the test did not create, and a batch that FAILED is all-or-nothing
     (the store commits a request in one insert, so a kill never leaves half a batch);
  3. the kill lands while a batch is in flight (sent, not yet answered), and that batch is
     acknowledged later; for each protocol at least one batch was handed to the exporter before
     the restarted sidecar answered and reported SUCCESS after: it was retried across the gap.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml
from grpc import Compression as GrpcCompression
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tests.conftest import free_port

pytestmark = pytest.mark.e2e

EXPORT_TIMEOUT_S = 20  # per batch, retries included: outlives a sidecar restart
T0_NS = 1_780_000_000_000_000_000
MS = 1_000_000
Key = tuple[str, str]  # (trace_id hex, span_id hex), as the store keeps them


@dataclass
class Batch:
    keys: list[Key]
    started: float
    ended: float
    ok: bool


@dataclass
class Recording(SpanExporter):
    """Wraps a real exporter; records every batch, when its export ran and what it returned."""

    inner: SpanExporter
    batches: list[Batch] = field(default_factory=list)
    busy: threading.Event = field(default_factory=threading.Event)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        keys = [(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans if s.context]
        started = time.monotonic()
        self.busy.set()
        try:
            result = self.inner.export(spans)
        finally:
            self.busy.clear()
        self.batches.append(Batch(keys, started, time.monotonic(), result is SpanExportResult.SUCCESS))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def exported(self) -> int:
        return sum(len(b.keys) for b in self.batches if b.ok)


class Stream:
    """One provider + batch processor + producer thread making vLLM ``llm_request`` spans."""

    def __init__(self, exporter: SpanExporter, service: str):
        self.recording = Recording(exporter)
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(
            BatchSpanProcessor(
                self.recording, max_queue_size=1_000_000, max_export_batch_size=512, schedule_delay_millis=250
            )
        )
        self.tracer = self.provider.get_tracer("vllm.tracing")
        self.ttft_s: dict[Key, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._produce, daemon=True)

    def _produce(self) -> None:
        i = 0
        while not self.stop.is_set():
            for _ in range(20):  # ~1000 spans/s: bounded by the stop event
                i += 1
                ttft = (i % 997) / 1000
                start = T0_NS + i * MS
                span = self.tracer.start_span(
                    "llm_request",
                    start_time=start,
                    attributes={
                        "gen_ai.latency.time_to_first_token": ttft,
                        "gen_ai.usage.prompt_tokens": i,
                        "gen_ai.request.id": f"cmpl-{i}",
                    },
                )
                span.end(end_time=start + 500 * MS)
                ctx = span.get_span_context()
                self.ttft_s[(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")] = ttft
            time.sleep(0.02)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert self.provider.force_flush(60_000), "SDK could not flush its queue"
        self.provider.shutdown()


def _config(tmp_path: Path, http_port: int, grpc_port: int) -> Path:
    cfg = {
        "store_path": str(tmp_path / "node.duckdb"),
        "listen_port": http_port,
        "otlp": {"grpc_port": grpc_port},
        "host": "node-a",
        "readers": {"sysfs_infiniband": str(tmp_path / "no-ib")},  # readers report unavailable here
    }
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ioe", "sidecar", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_PROXY": "127.0.0.1"},
        )


def _ready(http_port: int, grpc_port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=1).raise_for_status()
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=1):
            return True
    except (httpx.HTTPError, OSError):
        return False


def _wait(
    predicate: Callable[[], bool], timeout_s: float, what: str, log: Path, poll_s: float = 0.05
) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(poll_s)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}; sidecar log:\n{log.read_text()[-3000:]}"
    )


def test_spans_survive_sidecar_kill_and_restart_exactly_once(tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    cfg, log = _config(tmp_path, http_port, grpc_port), tmp_path / "sidecar.log"
    proc = _start(cfg, log)
    streams: dict[str, Stream] = {}
    try:
        _wait(lambda: _ready(http_port, grpc_port), 30, "the sidecar to listen", log)
        streams = {
            "http": Stream(
                HttpExporter(
                    endpoint=f"http://127.0.0.1:{http_port}/v1/traces",
                    compression=HttpCompression.Gzip,
                    timeout=EXPORT_TIMEOUT_S,
                ),
                "vllm-http",
            ),
            "grpc": Stream(
                GrpcExporter(
                    endpoint=f"127.0.0.1:{grpc_port}",
                    insecure=True,
                    compression=GrpcCompression.Gzip,
                    timeout=EXPORT_TIMEOUT_S,
                ),
                "vllm-grpc",
            ),
        }
        for s in streams.values():
            s.thread.start()
        what = "both exporters to deliver 1000 spans"
        _wait(lambda: all(s.recording.exported() >= 1000 for s in streams.values()), 30, what, log)

        in_flight = lambda: any(s.recording.busy.is_set() for s in streams.values())  # noqa: E731
        _wait(in_flight, 10, "a batch in flight", log, poll_s=0.001)
        killed = time.monotonic()
        proc.send_signal(signal.SIGKILL)  # mid-request: producers and exporters keep going
        proc.wait(10)
        time.sleep(0.5)
        proc = _start(cfg, log)
        back = _wait(lambda: _ready(http_port, grpc_port), 30, "the restarted sidecar", log)
        time.sleep(1.5)  # more traffic after the restart
        for s in streams.values():
            s.finish()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()[-3000:]
    finally:
        for s in streams.values():
            s.stop.set()
        if proc.poll() is None:
            proc.kill()
    _check(tmp_path / "node.duckdb", streams, killed, back)


def _check(path: Path, streams: dict[str, Stream], killed: float, back: float) -> None:
    con = duckdb.connect(str(path), read_only=True)
    rows = con.execute(
        "SELECT trace_id, span_id, count(*) OVER (PARTITION BY trace_id, span_id), ttft_s, service, engine "
        "FROM request_spans"
    ).fetchall()
    con.close()
    stored = {(t, s): (n, ttft, service, engine) for t, s, n, ttft, service, engine in rows}
    assert len(stored) == len(rows), "a (trace_id, span_id) is stored twice"
    created: dict[Key, float] = {}
    for name, stream in streams.items():
        created.update(stream.ttft_s)
        handed = {k for b in stream.recording.batches for k in b.keys}
        assert handed == stream.ttft_s.keys(), f"{name}: the SDK dropped spans before exporting them"
        ok = [b for b in stream.recording.batches if b.ok]
        acked = {k for b in ok for k in b.keys}
        assert len(acked) >= 1000, f"{name}: too few spans acknowledged to mean anything"
        missing = acked - stored.keys()
        assert not missing, f"{name}: {len(missing)} acknowledged spans lost, e.g. {sorted(missing)[:3]}"
        for key in acked:  # rule 1: the very span, with its own numbers and origin
            assert stored[key] == (1, pytest.approx(stream.ttft_s[key]), f"vllm-{name}", "vllm")
        for b in stream.recording.batches:  # rule 2: a failed batch is all or nothing
            if not b.ok:
                assert len({k in stored for k in b.keys}) == 1, f"{name}: half a failed batch stored"
        crossed = [b for b in ok if b.started < back < b.ended]  # rule 3
        assert crossed, f"{name}: no batch was retried across the restart"
    hit = [b for s in streams.values() for b in s.recording.batches if b.started < killed < b.ended]
    assert hit and all(b.ok for b in hit), "the batch in flight at the kill was not acknowledged"
    strangers = stored.keys() - created.keys()
    assert not strangers, f"{len(strangers)} stored spans were never created"
