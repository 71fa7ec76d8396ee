"""Precomputed verdicts: the refresher's schedule and ageing, the answers before routing, the
event-loop fast path for cache hits, and that none of it bypasses validation or the token."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from api_store import END_NS, NS, build, consistent_settings
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from api import routes
from api.app import create_app
from api.cache import MISSING, TTLCache
from api.fastpath import SnapshotFastPath
from api.refresher import Cycle, Refresher
from collector.store import Store
from ioe.settings import Settings

BASE = "/api/v1/deployments/llama70b"
HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _refresher(clock: Clock, work: list[tuple[Any, Any]]) -> Refresher:
    return Refresher(lambda: Cycle(END_NS, work), interval_s=15.0, clock=clock)


def test_snapshot_states_its_age_and_ages_out() -> None:
    clock = Clock()
    r = _refresher(clock, [(("envelope", "a"), lambda: (b'{"x":1}', {"x": 1}))])
    r.refresh_once()
    clock.t += 7.6
    snap = r.get(("envelope", "a"))
    assert snap is not None and snap.value == {"x": 1} and r.end_ns() == END_NS
    resp = r.response(snap)
    assert (resp.body, resp.headers["age"], resp.headers["cache-control"]) == (b'{"x":1}', "7", "max-age=15")
    assert resp.headers["content-type"] == "application/json"
    clock.t += 60.0 - 7.6  # exactly max_age_s = 4 × 15 s: still served
    assert r.get(("envelope", "a")) is not None
    clock.t += 0.1
    assert r.get(("envelope", "a")) is None and r.end_ns() is None


def test_failing_render_is_logged_and_the_others_still_refresh(caplog: pytest.LogCaptureFixture) -> None:
    clock, calls = Clock(), {"n": 0}

    def flaky() -> tuple[bytes, Any]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise ValueError("no engine samples in window\nsecond line")
        return b"old", "old"

    r = _refresher(clock, [(("envelope", "bad"), flaky), (("latency", "ok"), lambda: (b"{}", clock.t))])
    r.refresh_once()
    clock.t += 15.0
    with caplog.at_level(logging.WARNING, logger="ioe.api.refresher"):
        r.refresh_once()
    assert "('envelope', 'bad')" in caplog.text and "no engine samples in window" in caplog.text
    assert "second line" not in caplog.text
    assert r.failures == 1 and r.cycles == 2
    ok, bad = r.get(("latency", "ok")), r.get(("envelope", "bad"))
    assert ok is not None and ok.value == 115.0  # refreshed in the second cycle
    assert bad is not None and bad.body == b"old"  # the previous snapshot until it ages out
    clock.t += 46.0
    assert r.get(("envelope", "bad")) is None and r.get(("latency", "ok")) is not None


def test_interval_must_be_positive_and_thread_stops() -> None:
    with pytest.raises(ValueError, match="positive seconds, got 0"):
        Refresher(lambda: Cycle(0), interval_s=0)
    r = Refresher(lambda: Cycle(END_NS, [("k", lambda: (b"1", 1))]), interval_s=HOUR)
    r.start()
    deadline = time.monotonic() + 10
    while r.cycles < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    r.stop()
    assert r.cycles == 1 and r.get("k") is not None
    assert time.monotonic() - t0 < 2  # the hour-long wait is interrupted, not sat out


@pytest.mark.parametrize(
    ("route", "query", "default"),
    [
        ("envelope", b"", True),
        ("envelope", b"window=15m", True),
        ("envelope", b"window=900", True),
        ("envelope", b"window=900s", True),
        ("envelope", b"window=10m", False),
        ("envelope", b"window=15m&window=15m", False),
        ("envelope", b"window=15m%0A", False),
        ("envelope", b"window=15m&at=1800000000", False),
        ("envelope", b"points=120", False),
        ("latency", b"points=120&window=15m", True),
        ("latency", b"points=0120", False),
        ("latency", b"points=60", False),
        ("latency", b"window", False),
        ("latency", b"window=%ff", False),
    ],
)
def test_fast_path_takes_only_the_default_window(route: str, query: bytes, default: bool) -> None:
    state = type("State", (), {"settings": Settings(store_path=":memory:"), "refresher": None})()
    fast = SnapshotFastPath(lambda *a: None, state, window_s=900.0, points=120)  # type: ignore[arg-type]
    scope = {"type": "http", "path": f"{BASE}/{route}", "query_string": query}
    assert fast.snapshot_key(scope) == ((route, "llama70b") if default else None)
    assert fast.snapshot_key({**scope, "path": f"/api/v1/deployments/bad\x00name/{route}"}) is None


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = build()
    yield st
    st.close()


def _started(app: Any) -> None:
    deadline = time.monotonic() + 60
    while app.state.refresher.cycles < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.refresher.cycles >= 1 and app.state.refresher.failures == 0


@pytest.fixture(scope="module")
def served(store: Store) -> Iterator[tuple[TestClient, Any]]:
    app = create_app(Settings(store_path=":memory:"), store, refresh_s=HOUR)
    with TestClient(app) as c:
        _started(app)
        yield c, app


def _same(a: Any, b: Any, where: str = "body") -> None:
    """Equal documents, floats to 1e-9 relative (DuckDB sums in parallel, in no fixed order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), where
        for k in a:
            if k != "computed_at_s":
                _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


@pytest.mark.parametrize(
    ("route", "query"), [("envelope", ""), ("envelope", "?window=900s"), ("latency", "")]
)
def test_default_window_is_the_snapshot_and_equals_the_computed_answer(
    served: tuple[TestClient, Any], store: Store, route: str, query: str
) -> None:
    c, app = served
    before = app.state.cache.computed
    got = c.get(f"{BASE}/{route}{query}")
    assert got.status_code == 200 and int(got.headers["age"]) >= 0
    assert got.headers["cache-control"] == "max-age=3600"
    assert app.state.cache.computed == before  # nothing computed for it
    assert got.json()["window"] == {"start_ns": END_NS - 900 * NS, "end_ns": END_NS, "seconds": 900.0}
    with TestClient(create_app(Settings(store_path=":memory:"), store)) as plain:  # no refresher
        ref = plain.get(f"{BASE}/{route}?window=15m&at={END_NS / NS}")
    assert "age" not in ref.headers
    _same(got.json(), ref.json())
    assert abs(got.json()["computed_at_s"] - time.time()) < 600


def test_other_windows_are_computed_and_validated_as_before(served: tuple[TestClient, Any]) -> None:
    c, _ = served
    other = c.get(f"{BASE}/latency?window=10m&points=60")
    assert other.status_code == 200 and "age" not in other.headers
    body = other.json()
    assert body["window"]["seconds"] == 600.0 and body["bin_s"] == 10.0
    assert c.get(f"{BASE}/envelope?window=15m%0A").status_code == 422
    assert c.get(f"{BASE}/latency?points=5").status_code == 422
    assert c.get("/api/v1/deployments/nope/envelope").json()["detail"]["known"] == ["llama70b"]


def test_overview_and_metrics_share_the_snapshot(served: tuple[TestClient, Any]) -> None:
    c, app = served
    snap = app.state.refresher.get(("envelope", "llama70b"))
    deps = routes.cached_on(app, ("deployments",), routes.service.deployments)
    span = routes.Span(END_NS - 900 * NS, END_NS)
    assert routes.envelope_of(app, deps[0], span) is snap.value
    glance = c.get("/api/v1/deployments").json()["deployments"][0]["glance"]
    assert glance["zone"] == snap.value["envelope"]["primary"] == "kv_capacity"


def test_cache_hits_do_not_leave_the_event_loop(
    served: tuple[TestClient, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = served
    hops: list[str] = []
    real = routes.run_in_threadpool

    async def counting(fn: Any, *args: Any) -> Any:
        hops.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr(routes, "run_in_threadpool", counting)
    path = f"{BASE}/envelope?window=5m&at={END_NS / NS}"
    first, second = c.get(path), c.get(path)
    assert hops == ["_envelope_route"]  # only the miss went to the thread pool
    assert first.content == second.content and first.json()["window"]["seconds"] == 300.0


def test_token_for_reads_is_still_required(store: Store) -> None:
    settings = Settings(store_path=":memory:", auth_token="s3cret", require_token_for_reads=True)
    app = create_app(settings, store, refresh_s=HOUR)
    with TestClient(app) as c:
        _started(app)
        assert app.state.refresher.get(("envelope", "llama70b")) is not None
        assert c.get(f"{BASE}/envelope").status_code == 401
        ok = c.get(f"{BASE}/envelope", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and "age" in ok.headers  # the route serves the snapshot itself


def test_envelope_and_latency_conform_to_openapi_with_the_refresher(store: Store) -> None:
    """schemathesis on the two precomputed routes of an app as ``ioe serve`` builds it."""
    app = create_app(Settings(store_path=":memory:"), store, refresh_s=HOUR)
    app.state.refresher.refresh_once()  # no lifespan under the ASGI transport: one cycle by hand
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.path.endswith(("/envelope", "/latency"))]
    assert len(ops) == 2
    for op in ops:

        @given(case=op.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: schemathesis.Case) -> None:
            consistent_settings(case).call_and_validate()

        run()


def test_stale_body_is_answered_at_once_and_refreshed_in_the_background(store: Store) -> None:
    clock = Clock()
    app = create_app(Settings(store_path=":memory:"), store)
    app.state.cache = TTLCache(ttl_s=10, clock=clock)
    path = f"{BASE}/latency?window=5m&points=30&at={END_NS / NS}"
    with TestClient(app) as c:
        first = c.get(path)
        computed = app.state.cache.computed  # latency analysis + its body (+ deployments)
        clock.t += 15.0  # stale, within max_stale_s
        second = c.get(path)
        assert second.content == first.content  # the stale body, not a wait for the refresh
        deadline = time.monotonic() + 30
        while (app.state.tasks or app.state.cache.computed < computed + 3) and time.monotonic() < deadline:
            time.sleep(0.02)
    # the deployments look-up, the analysis and its body, each recomputed once, in the background
    assert app.state.cache.computed == computed + 3
    key = ("json", "latency", "llama70b", routes.Span(END_NS - 300 * NS, END_NS), 30)
    fresh, claim = app.state.cache.peek_stale(key)
    assert not app.state.tasks and not claim  # fresh again: nothing left to refresh
    assert fresh is not MISSING and fresh != first.content  # a new body (a new computed_at_s)


def test_a_slow_cycle_spaces_the_next_ones_out() -> None:
    """Rule 1: a cycle of 5 s (on the fake clock) is followed by 45 s of rest at the default share
    of 0.1, so the thread is busy 5 of every 50 s; snapshots live 4 pauses (rule 3)."""
    clock = Clock()

    def slow() -> tuple[bytes, Any]:
        clock.t += 5.0
        return b"{}", {}

    r = _refresher(clock, [(("envelope", "a"), slow)])
    assert r.pause_s() == 15.0 and r.max_age_s == 60.0  # nothing measured yet: the interval
    r.refresh_once()
    assert r.last_cycle_s == 5.0
    assert r.pause_s() == pytest.approx(45.0) and r.max_age_s == pytest.approx(180.0)
    share = r.last_cycle_s / (r.last_cycle_s + r.pause_s())
    assert share == pytest.approx(0.1)
    clock.t += 179.0
    assert r.get(("envelope", "a")) is not None  # still served while the next cycle is awaited
    fast = Refresher(lambda: Cycle(END_NS, []), interval_s=15.0, clock=clock, max_share=0.5)
    fast.refresh_once()
    assert fast.pause_s() == 15.0  # a quick cycle keeps the interval
    with pytest.raises(ValueError, match="share must be in"):
        Refresher(lambda: Cycle(0), interval_s=1.0, max_share=0.0)
