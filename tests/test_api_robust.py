"""The API under attack and faults, on a real uvicorn bound to 127.0.0.1 (as ``ioe serve`` runs it).

Each test names the attack or fault of issue 21 it replays, and what must hold:
  - S5: 45 concurrent slow SQL queries must not delay ``/healthz`` (was 8.5 s): 4 run, the rest
    get 429 with ``Retry-After``, counted in ``ioe_api_shed_requests_total``.
  - D9: OTLP under overload answers 503 with ``Retry-After`` and counts it; slowloris connections
    (headers or a body a byte at a time) are closed; a body that is not JSON, or nests deeply,
    is a 400, never a 500.
  - D3: a full disk (a file-size limit on this process: writes past it fail with EFBIG as they
    do with ENOSPC) answers 503 with ``Retry-After``, not 500; the checkpoint that fails
    invalidates the store, which is reopened; ``/healthz`` is 503 while it cannot be; nothing
    acknowledged is lost.
  - D8: a deployment named after a Hugging Face model id (``meta-llama/Llama-3.1-8B-Instruct``,
    inferred from a real vLLM 0.33 capture) is served by every route and the page.
"""

from __future__ import annotations

import resource
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import duckdb
import httpx
import pytest
import uvicorn
from api_store import build
from conftest import free_port, require_component, require_module
from fastapi.testclient import TestClient
from google.rpc import status_pb2
from otlp_engine_spans import to_protobuf, vllm_spans

from api import faults, limits
from api.app import QUERIES_IN_FLIGHT, create_app
from api.fastpath import SnapshotFastPath
from api.limits import InFlight
from collector.formats import IngestContext
from collector.ingest import ingest_paths
from collector.records import frame, points_name, series_name
from collector.store import Store
from ioe.settings import Settings

DATA = Path(__file__).resolve().parent / "data"
PROTOBUF = {"content-type": "application/x-protobuf"}
# ~25e9 rows: far past its 3 s limit on any machine, so it holds its slot until interrupted
SLOW_SQL = "SELECT count(*) FROM range(5000) a, range(5000) b, range(1000) c"


class Served:
    """The app on uvicorn in a thread on 127.0.0.1, with ``ioe serve``'s server options."""

    def __init__(self, app: object):
        config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",  # type: ignore[arg-type]
                                lifespan="off", **limits.server_options())  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.port = config.port
        self.url = f"http://127.0.0.1:{config.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = build()
    yield st
    st.close()


def shed(url: str, route: str, reason: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    line = f'ioe_api_shed_requests_total{{reason="{reason}",route="{route}"}} '
    got = [float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)]
    return got[0] if got else 0.0


def test_health_answers_at_once_while_45_slow_queries_run(store: Store) -> None:
    app = create_app(Settings(store_path=":memory:"), store)
    with Served(app) as srv:
        statuses: list[tuple[int, str | None, str]] = []
        go = threading.Barrier(46)

        def query() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                go.wait()
                r = c.post("/api/v1/query", json={"sql": SLOW_SQL, "timeout_s": 3})
                statuses.append((r.status_code, r.headers.get("retry-after"), r.text))

        threads = [threading.Thread(target=query) for _ in range(45)]
        for t in threads:
            t.start()
        go.wait()
        time.sleep(0.5)  # the admitted queries are running, the others answered
        waits = []
        with httpx.Client(base_url=srv.url, timeout=30) as probe:  # a client made per call costs ~0.1 s
            for _ in range(10):
                t0 = time.monotonic()
                assert probe.get("/healthz").json() == {"status": "ok"}
                waits.append(time.monotonic() - t0)
            ready = probe.get("/readyz")
        for t in threads:
            t.join(timeout=120)
        refused = [s for s in statuses if s[0] == 429]
        assert max(waits) < 1.0, waits  # was 8.5 s behind the pool
        assert ready.status_code == 200
        assert len(statuses) == 45 and len(refused) >= 45 - 2 * QUERIES_IN_FLIGHT
        assert all(s[1] == "1" and "in flight" in s[2] for s in refused)
        assert all(s[0] == 400 and "time limit" in s[2] for s in statuses if s[0] != 429)
        assert shed(srv.url, "query", "overload") == len(refused)
        # the analyses are not held back by the query cap
        assert httpx.get(f"{srv.url}/api/v1/deployments/llama70b", timeout=60).status_code == 200


def _partial_post(port: int, path: str, head: str, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body)
    return sock


def test_otlp_overload_answers_503_with_retry_after_and_counts_it(store: Store) -> None:
    app = create_app(Settings(store_path=":memory:"), store, otlp_in_flight=InFlight(2))
    body = to_protobuf(vllm_spans(3, seed=41))
    with Served(app) as srv:
        head = "Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n"
        slow = [_partial_post(srv.port, "/v1/traces", head, body[:10]) for _ in range(2)]  # hold both slots
        time.sleep(0.5)
        r = httpx.post(f"{srv.url}/v1/traces", content=body, headers=PROTOBUF, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "exports in flight" in status_pb2.Status.FromString(r.content).message
        assert shed(srv.url, "otlp", "overload") == 1.0
        for s in slow:
            s.close()
        deadline = time.monotonic() + 10
        while (
            r := httpx.post(f"{srv.url}/v1/traces", content=body, headers=PROTOBUF, timeout=30)
        ).status_code != 200:
            assert time.monotonic() < deadline, r.status_code  # the slots are freed once the peers are gone
            time.sleep(0.1)


def test_slowloris_connections_are_closed(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "HEADER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(limits, "BODY_TIMEOUT_S", 1.0)
    app = create_app(Settings(store_path=":memory:"), store)
    with Served(app) as srv:
        held = []
        for i in range(200):  # headers never finished
            sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + str(i).encode())
            held.append(sock)
        held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))  # nothing sent
        head = "Content-Type: application/json\r\nContent-Length: 100\r\n"
        held.append(_partial_post(srv.port, "/api/v1/query", head, b'{"sql": '))  # a body that stalls
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200  # served meanwhile
        t0 = time.monotonic()
        for sock in held:
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                data = b""
            assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:80]  # closed, not answered later
            sock.close()
        assert time.monotonic() - t0 < 8  # closed within their timeouts, not held for ever


def test_bad_json_is_400_never_500(store: Store) -> None:
    client = TestClient(create_app(Settings(store_path=":memory:"), store), raise_server_exceptions=False)
    deep = b'{"sql": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for body in (b'{"sql": "SELECT 1"', b"\xff\xfe", deep):
        r = client.post("/api/v1/query", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (body[:20], r.text)
        assert r.json()["detail"]["parameter"] == "body"
    surrogate = b'{"sql": "SELECT 1", "x": "\\ud800"}'  # an unknown field quoting a lone surrogate
    r = client.post("/api/v1/query", content=surrogate, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "x"]
    otlp = b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = client.post("/v1/traces", content=otlp, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nests too deeply" in r.json()["message"]


@pytest.fixture
def model_named() -> Iterator[Store]:
    """A deployment inferred from a real vLLM 0.33 capture: named after its model id."""
    st = Store()
    for k in range(3):
        ctx = IngestContext(ts_ns=1_800_000_000 * 10**9 + k * 15 * 10**9, host="node0", source="ingest")
        ingest_paths(st, [DATA / "engine" / "vllm_0.33.0_dp1.prom"], ctx)
    yield st
    st.close()


def test_a_deployment_named_after_a_model_id_works_in_every_route(model_named: Store) -> None:
    name = "meta-llama/Llama-3.1-8B-Instruct"
    client = TestClient(create_app(Settings(store_path=":memory:"), model_named))
    listed = client.get("/api/v1/deployments").json()["deployments"]
    assert [d["deployment"]["name"] for d in listed] == [name]
    for spelled in (quote(name, safe=""), name):  # the page sends %2F; a person may type "/"
        base = f"/api/v1/deployments/{spelled}"
        assert client.get(base).json()["deployment"]["name"] == name
        for route in ("envelope", "latency", "phases", "gpu", "fabric", "collectives", "stragglers"):
            r = client.get(f"{base}/{route}")
            assert r.status_code == 200, (route, r.text[:200])
            got = r.json()["deployment"]  # the envelope carries the deployment's summary
            assert (got["name"] if isinstance(got, dict) else got) == name
        plan = client.get(f"{base}/plan")  # reached the deployment: it has no GPU to plan for
        assert plan.status_code == 422 and name in plan.json()["detail"]["message"]
        assert client.get(f"/deployments/{spelled}").status_code == 200  # the page
    assert client.get(f"/api/v1/deployments/{quote('meta-llama/nope', safe='')}/envelope").status_code == 404
    fast = SnapshotFastPath(app=None, state=None, window_s=900.0, points=120)  # type: ignore[arg-type]
    path = f"/api/v1/deployments/{name}/latency"
    assert fast.snapshot_key({"type": "http", "path": path, "query_string": b""}) == ("latency", name)
    script = (Path(__file__).resolve().parent.parent / "api" / "static" / "app.js").read_text()
    assert "/deployments/${encodeURIComponent(" in script and "decodeURIComponent(m[1])" in script


@pytest.fixture
def file_limit() -> Iterator[list[int]]:
    """Writes of this process past ``limit[0]`` bytes into any file fail (EFBIG), as on a full
    disk; 0 lifts the limit (space returns)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
    limit = [0]
    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, old)


def _set_limit(limit: list[int], size: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size if size else hard, hard))
    limit[0] = size


def test_full_disk_answers_503_and_the_invalidated_store_is_reopened(
    tmp_path: Path, file_limit: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(faults, "REOPEN_EVERY_S", 0.2)
    path = tmp_path / "store.duckdb"
    st = build(str(path))
    st.checkpoint()
    before = st.count("request_spans")
    app = create_app(Settings(store_path=str(path)), st)
    acked = 0
    with Served(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        _set_limit(file_limit, path.stat().st_size + 256 * 1024)  # the disk fills up
        for i in range(400):
            r = c.post("/v1/traces", content=to_protobuf(vllm_spans(50, seed=1000 + i)), headers=PROTOBUF)
            if r.status_code != 200:
                break
            acked += 50
        assert acked > 0 and r.status_code == 503 and r.headers["retry-after"] == "1"  # was a 500
        assert "store unavailable" in status_pb2.Status.FromString(r.content).message
        with pytest.raises(duckdb.IOException, match="invalidated"):
            st.checkpoint()  # maintenance's checkpoint cannot write the file: DuckDB invalidates it
        r = c.get("/api/v1/targets")
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "invalidated" in r.json()["detail"]["message"]
        moved = path.rename(tmp_path / "elsewhere.duckdb")  # and cannot be reopened
        got = c.get("/healthz")
        assert got.status_code == 503 and got.json()["status"] == "store invalidated"
        assert "reopen failed" in got.json()["reason"] and not path.exists()  # no empty store in its place
        moved.rename(path)
        _set_limit(file_limit, 0)  # space returns
        deadline = time.monotonic() + 10
        while (got := c.get("/healthz")).status_code != 200:
            assert time.monotonic() < deadline, got.text
            time.sleep(0.1)
        assert (
            c.post("/v1/traces", content=to_protobuf(vllm_spans(5, seed=99)), headers=PROTOBUF).status_code
            == 200
        )
        assert c.get("/readyz").json()["status"] == "ready"
        assert shed(srv.url, "otlp", "store_unavailable") >= 1
    assert st.count("request_spans") == before + acked + 5  # nothing acknowledged was lost
    st.close()


def test_metrics_document_the_shed_counter() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    assert "`ioe_api_shed_requests_total`" in text


def _gpu_batch(k: int, n: int = 4000) -> object:
    """``n`` samples of 40 series new in batch ``k`` (so each write adds series as well)."""
    return frame("gpu_samples", {
        "ts_ns": [1_800_000_000 * 10**9 + (k * n + i) * 10**6 for i in range(n)], "host": ["node0"] * n,
        "gpu": [i % 8 for i in range(n)], "uuid": [f"GPU-{k}-{i % 40}" for i in range(n)],
        "metric": ["sm_active_ratio"] * n, "value": [0.5] * n,
    })  # fmt: skip


def test_a_reopened_store_keeps_committed_series_and_points(tmp_path: Path, file_limit: list[int]) -> None:
    """The writer's in-memory series ids are read again at a reopen: a commit that failed on the
    full disk must not leave ids the file never stored."""
    path = tmp_path / "store.duckdb"
    st = Store(path)
    st.write("gpu_samples", _gpu_batch(0))
    st.checkpoint()
    acked = 4000
    _set_limit(file_limit, path.stat().st_size + 128 * 1024)
    with pytest.raises(duckdb.Error):
        for k in range(1, 200):
            st.write("gpu_samples", _gpu_batch(k))
            acked += 4000
    with pytest.raises(duckdb.IOException, match="invalidated"):
        st.checkpoint()
    _set_limit(file_limit, 0)
    st.reopen()
    st.write("gpu_samples", _gpu_batch(500))
    assert st.count("gpu_samples") == acked + 4000
    series, points = series_name("gpu_samples"), points_name("gpu_samples")
    with st.cursor() as cur:
        n, ids = cur.execute(f"SELECT count(*), count(DISTINCT series_id) FROM {series}").fetchone()
        orphans = cur.execute(
            f"SELECT count(*) FROM {points} ANTI JOIN {series} USING (series_id)"
        ).fetchone()
    # every point names a stored series; ids are unique (series of a failed write may stay, pointless)
    assert n == ids >= acked // 100 + 40 and orphans == (0,)
    st.close()


def test_the_page_links_to_a_model_id_deployment(model_named: Store) -> None:
    """The overview's link encodes the ``/`` (``%2F``) and the deployment view loads from it."""
    from conftest import CHROMIUM_ARGS

    chromium = require_component(
        "chromium", "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    sync_api = require_module("playwright.sync_api", "the [test] extra")
    name = "meta-llama/Llama-3.1-8B-Instruct"
    with (
        Served(create_app(Settings(store_path=":memory:"), model_named)) as srv,
        sync_api.sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(srv.url + "/")
            page.wait_for_selector("main[data-ready='1']", timeout=30_000)
            link = page.locator("table tbody tr td a").first
            assert link.inner_text() == name
            assert link.get_attribute("href") == "/deployments/meta-llama%2FLlama-3.1-8B-Instruct"
            link.click()
            page.wait_for_selector("main[data-ready='1'] h1", timeout=30_000)
            assert page.locator("main h1").first.inner_text() == name
            assert errors == []
        finally:
            browser.close()


def test_a_query_that_quotes_a_fault_word_is_not_a_store_fault() -> None:
    """A SQL error whose text says "invalidated" or "I/O error" is the request's, not the store's:
    no 503, no reopen (schemathesis found ``{"sql": "invalidated"}`` answered 503)."""
    import duckdb

    from api.faults import fault_kind

    con = duckdb.connect()
    for sql in (
        "invalidated",
        "SELECT 'database has been invalidated'::INT",
        "SELECT * FROM io_error_disk_full",
    ):
        with pytest.raises(duckdb.Error) as caught:
            con.execute(sql)
        assert fault_kind(caught.value) is None, sql
