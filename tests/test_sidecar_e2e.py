"""End to end: `ioe sidecar` scrapes real fixture bodies over HTTP on 127.0.0.1 while one target
is down, one hangs and one spews garbage, for several cycles; then the store is read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml

from tests.conftest import DATA, free_port
from tests.httpfixtures import Route, serve, wait_until

pytestmark = pytest.mark.e2e

FIX = DATA / "sidecar"
GARBAGE = (
    b"\x00\xff\xfe binary junk \x81\n"
    b'vllm:num_requests_running{engine="0",model_name="m"} 7\n'
    b"this line is not exposition at all {{{\n"
)


def _scrapes(port: int, target: str) -> float:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(f'ioe_target_scrapes_total{{target="{target}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def endpoints():
    servers = {
        "dcgm": serve({"/metrics": Route((FIX / "h100x8_k8s_pod_labels.prom").read_bytes())}),
        "vllm": serve({"/metrics": Route((FIX / "vllm_0.33.0_dp2.prom").read_bytes())}),
        "hang": serve({"/metrics": Route(b"", hang_s=60)}),
        "garbage": serve({"/metrics": Route(GARBAGE)}),
    }
    yield servers
    for s in servers.values():
        s.close()


def _config(tmp_path: Path, endpoints, port: int) -> Path:
    dead = free_port()
    targets = [
        {"name": "dcgm", "url": endpoints["dcgm"].url(), "kind": "dcgm", "interval_s": 0.5, "timeout_s": 1},
        {"name": "vllm", "url": endpoints["vllm"].url(), "kind": "engine", "interval_s": 0.5, "timeout_s": 1},
        {"name": "hang", "url": endpoints["hang"].url(), "interval_s": 0.5, "timeout_s": 1},
        {"name": "garbage", "url": endpoints["garbage"].url(), "interval_s": 0.5, "timeout_s": 1},
        {"name": "dead", "url": f"http://127.0.0.1:{dead}/metrics", "interval_s": 0.5, "timeout_s": 1},
    ]
    cfg = {
        "store_path": str(tmp_path / "node.duckdb"),
        "listen_port": port,
        "host": "node-a",
        "flush_interval_s": 0.2,
        "targets": targets,
        "readers": {"sysfs_infiniband": str(tmp_path / "no-ib")},
        "deployments": [
            {
                "name": "llama70b",
                "model": "llama-3.1-70b",
                "gpu_type": "h100_sxm",
                "tp": 8,
                "targets": ["vllm"],
            }
        ],
    }
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_sidecar_end_to_end(tmp_path: Path, endpoints) -> None:
    port = free_port()
    cfg = _config(tmp_path, endpoints, port)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "sidecar.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ioe", "sidecar", "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_until(
            lambda: _scrapes(port, "dcgm") >= 6 and _scrapes(port, "vllm") >= 6, 40, "6 good scrapes each"
        )
        # the hanging target costs only itself: it got far fewer (each waits its 1 s timeout)
        assert _scrapes(port, "hang") < _scrapes(port, "dcgm")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'ioe_target_up{kind="auto",target="dead"} 0.0' in metrics
        assert 'ioe_target_up{kind="dcgm",target="dcgm"} 1.0' in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    _check_store(tmp_path / "node.duckdb")


def _check_store(path: Path) -> None:
    con = duckdb.connect(str(path), read_only=True)
    q = lambda sql: con.execute(sql).fetchall()  # noqa: E731

    # GPU 0 of the real 8×H100 scrape: 113.611 W, on the exporter's own Hostname, with its pod labels
    rows = q(
        "SELECT DISTINCT value, host, pod, namespace FROM gpu_samples WHERE metric = 'power_w' AND gpu = 0"
    )
    assert rows == [(113.611, "gpu-node-1", "vllm-agg-0-vllmdecodeworker-s65j5", "dynamo-workload")]
    (n_ts,) = q("SELECT count(DISTINCT ts_ns) FROM gpu_samples")[0]
    assert n_ts >= 6
    # a replayed identical body adds one row per series per scrape, never duplicates within a scrape
    (dups,) = q(
        "SELECT count(*) FROM (SELECT ts_ns, uuid, metric, link FROM gpu_samples "
        "GROUP BY ALL HAVING count(*) > 1)"
    )[0]
    assert dups == 0

    # engine counters got rates from the second scrape on; the fixture is static, so exactly 0/s
    rates = q(
        "SELECT DISTINCT rate_per_s FROM engine_samples WHERE concept = 'generation_tokens_total' "
        "AND rate_per_s IS NOT NULL"
    )
    assert rates == [(0.0,)]
    dp = q("SELECT DISTINCT dp_rank FROM engine_samples WHERE source = 'vllm' ORDER BY 1")
    assert dp == [(0,), (1,)]

    health = dict(q("SELECT target, up FROM targets"))
    assert health["dcgm"] is True and health["vllm"] is True
    assert health["dead"] is False and health["hang"] is False
    errors = dict(q("SELECT target, last_error FROM targets"))
    assert "ConnectionRefusedError" in errors["dead"]
    assert "within 1 s" in errors["hang"]

    # the garbage target: its one good line is kept, the bad lines are refused with their line numbers
    kept = q(
        "SELECT DISTINCT value FROM engine_samples WHERE source = 'garbage' AND concept = 'requests_running'"
    )
    assert kept == [(7.0,)]
    refused = q("SELECT location FROM ingest_errors WHERE source = 'garbage'")
    assert any("line 1" in loc for (loc,) in refused) and any("line 3" in loc for (loc,) in refused)

    # the declared deployment is in the store; a missing NVML/DCGM/IB is reported, not fatal
    assert q("SELECT name, tp, origin FROM deployments") == [("llama70b", 8, "config")]
    readers = dict(q("SELECT target, last_error FROM targets WHERE kind = 'reader'"))
    assert readers and all(err.startswith("unavailable") for err in readers.values())
    con.close()
