"""The sidecar's own metrics without prometheus_client (collector.selfmetrics), the collector-only
process without OpenSSL (ioe.sidecar rule 4) and its maintenance and flush intervals (collector.agent)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.agent import (
    COLLECTOR_FLUSH_INTERVAL_S,
    COLLECTOR_MAINTENANCE_INTERVAL_S,
    FLUSH_INTERVAL_S,
    flush_interval_s,
    maintenance_interval_s,
)
from collector.maintenance import MAINTENANCE_INTERVAL_S
from collector.selfmetrics import Counter, Gauge, Registry, SelfMetrics, go_float
from ioe.settings import Settings
from ioe.sidecar import needs_tls
from ioeconf.plain import PlainSettings


def _filled() -> SelfMetrics:
    m = SelfMetrics()
    m.stored("gpu_samples", 3)
    m.stored("gpu_samples", 4)
    m.target_up.labels("node/dcgm", "dcgm").set(1)
    m.scrape_duration.labels('we"ird\\name\nx').set(0.25)
    m.dropped("parse", 2)
    m.dropped("parse", 0)  # nothing dropped: no sample made for it
    m.queue_batches.set(5)
    return m


def test_exposition_is_the_text_format_prometheus_client_reads() -> None:
    text = _filled().registry.exposition().decode()
    assert 'ioe_rows_stored_total{table="gpu_samples"} 7.0\n' in text
    assert "# TYPE ioe_rows_stored_total counter\n" in text
    assert 'ioe_target_up{kind="dcgm",target="node/dcgm"} 1.0\n' in text  # label names sorted
    assert "ioe_queue_batches 5.0\n" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["ioe_rows_stored"].type == "counter"
    assert [s.value for s in families["ioe_rows_dropped"].samples] == [2.0]
    (duration,) = families["ioe_target_scrape_duration_seconds"].samples
    assert duration.labels == {"target": 'we"ird\\name\nx'} and duration.value == 0.25  # escaped, read back


def test_prometheus_client_renders_the_same_registry_alike() -> None:
    """The API renders this registry with prometheus_client's generate_latest (rule 2)."""
    reg = _filled().registry
    assert generate_latest(reg) == reg.exposition()


def test_values_and_bad_use() -> None:
    assert [go_float(v) for v in (1, 0.25, 1e-05, 1e16, math.inf, -math.inf, math.nan)] == [
        "1.0", "0.25", "1e-05", "1e+16", "+Inf", "-Inf", "NaN",
    ]  # fmt: skip
    reg = Registry()
    c = Counter("c", "a counter", ["a"], registry=reg)
    with pytest.raises(ValueError, match="only goes up"):
        c.labels("x").inc(-1)
    with pytest.raises(ValueError, match="1 label value"):
        c.labels("x", "y")
    g = Gauge("g", "a gauge", registry=reg)
    g.set(-2)
    assert "g -2.0\n" in reg.exposition().decode()


def test_counter_updates_from_threads_all_count() -> None:
    reg = Registry()
    c = Counter("n", "n", ["t"], registry=reg)

    def work() -> None:
        for _ in range(5000):
            c.labels("a").inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 'n_total{t="a"} 20000.0' in reg.exposition().decode()


def _plain(**fields: object) -> PlainSettings:
    dump = Settings(**fields).model_dump(mode="json")  # type: ignore[arg-type]
    return PlainSettings(dump)


def test_tls_only_where_a_url_or_the_grpc_receiver_may_need_it() -> None:
    target = {"name": "d", "kind": "dcgm", "interval_s": 1}
    assert not needs_tls(_plain(targets=[{**target, "url": "http://127.0.0.1:9400/metrics"}]))
    assert needs_tls(_plain(targets=[{**target, "url": "https://gpu-1:9400/metrics"}]))
    assert needs_tls(_plain(otlp={"grpc_port": 4317}))


def test_maintenance_interval_unset_depends_on_the_mode() -> None:
    """collector.agent.COLLECTOR_MAINTENANCE_INTERVAL_S: 300 s passes for a collector-only agent,
    60 s with the API (and for ioe serve); a value set is used as set, in either mode."""
    assert maintenance_interval_s(_plain(api_enabled=False)) == COLLECTOR_MAINTENANCE_INTERVAL_S == 300.0
    assert maintenance_interval_s(_plain(api_enabled=True)) == MAINTENANCE_INTERVAL_S == 60.0
    assert maintenance_interval_s(_plain(api_enabled=False, maintenance_interval_s=7)) == 7.0
    assert maintenance_interval_s(Settings(api_enabled=True, maintenance_interval_s=30)) == 30.0
    with pytest.raises(ValueError, match="maintenance_interval_s"):
        Settings(maintenance_interval_s=0)


def test_flush_interval_unset_depends_on_the_mode() -> None:
    """collector.agent.COLLECTOR_FLUSH_INTERVAL_S: a collector-only agent flushes every 30 s, one
    with the API (whose readers see rows once flushed) every 10 s; a value set is used as set."""
    assert flush_interval_s(_plain(api_enabled=False)) == COLLECTOR_FLUSH_INTERVAL_S == 30.0
    assert flush_interval_s(_plain(api_enabled=True)) == FLUSH_INTERVAL_S == 10.0
    assert flush_interval_s(_plain(api_enabled=False, flush_interval_s=2)) == 2.0
    assert flush_interval_s(Settings(api_enabled=True, flush_interval_s=0.5)) == 0.5
    with pytest.raises(ValueError, match="flush_interval_s"):
        Settings(flush_interval_s=0)


_ARENAS = """
import ctypes, sys, threading
from ioe.sidecar import one_malloc_arena
if sys.argv[1] == "one":
    assert one_malloc_arena()
keep = []
def work():
    keep.extend(bytearray(4000) for _ in range(50))  # glibc malloc, below its mmap threshold
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" section per arena, on stderr
"""


def test_collector_threads_share_one_malloc_arena() -> None:
    """ioe.sidecar rule 5: with one_malloc_arena, threads that allocate use the main arena; without
    it glibc gives them arenas of their own."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}

    def arenas(mode: str) -> int:
        got = subprocess.run(
            [sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, env=env, check=True
        )
        return got.stderr.count("Arena ")

    assert arenas("one") == 1
    assert arenas("default") > 1
    env["MALLOC_ARENA_MAX"] = "2"  # set by whoever started it: left to glibc
    got = subprocess.run(
        [sys.executable, "-c", "from ioe.sidecar import one_malloc_arena; print(one_malloc_arena())"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert got.stdout.strip() == "False"
