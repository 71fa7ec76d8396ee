"""Faults injected into real processes (issue 21): ``ioe sidecar`` killed with SIGKILL while
the NCCL Inspector tailer's rows sit in its write queue, again and again, while the dump keeps
growing; then a truncated store. Nothing written to the dump may be missing at the end: every
line is in the store exactly once (the tailer saves only offsets the store has committed, and
the store's natural key absorbs what is read twice)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml

from tests.conftest import free_port
from tests.httpfixtures import wait_until

LINES = 3000
RATE_PER_S = 400


def _line(sn: int) -> str:
    return json.dumps(
        {
            "header": {"id": "0xfeed", "rank": 0, "n_ranks": 2, "nnodes": 1},
            "metadata": {"hostname": "n0", "pid": 1, "dump_timestamp_us": sn},
            "coll_perf": {
                "coll": "AllReduce",
                "coll_sn": sn,
                "coll_msg_size_bytes": 8192,
                "coll_exec_time_us": 12.5,
            },
        }
    )


def _append(path: Path, done: threading.Event) -> None:
    with path.open("a") as fh:
        for sn in range(LINES):
            fh.write(_line(sn) + "\n")
            fh.flush()
            time.sleep(1 / RATE_PER_S)
    done.set()


def _stored(port: int) -> float:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    rows = [
        ln for ln in text.splitlines() if ln.startswith('ioe_rows_stored_total{table="collective_records"}')
    ]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in rows)


def _alive(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _start(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ioe", "sidecar", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _committed(state: Path) -> int:
    try:
        files = json.loads(state.read_text())["files"]
    except (OSError, ValueError, KeyError):
        return -1
    return sum(f["offset"] for f in files.values())


@pytest.mark.e2e
def test_kill_9_of_the_sidecar_mid_flush_loses_no_inspector_line(tmp_path: Path) -> None:
    dump, store = tmp_path / "dump", tmp_path / "node.duckdb"
    dump.mkdir()
    log = dump / "n0-pid1.log"
    log.touch()
    port = free_port()
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "store_path": str(store),
                "listen_port": port,
                "api_enabled": False,
                "flush_interval_s": 1.0,  # rows wait up to 1 s in the queue: the window killed into
                "nccl_inspector_dir": str(dump),
                "readers": {"nvml": False, "dcgm": False, "infiniband": False, "interval_s": 0.05},
            }
        )
    )
    done = threading.Event()
    appender = threading.Thread(target=_append, args=(log, done), daemon=True)
    appender.start()
    rng = random.Random(21)
    kills = 0
    while not done.is_set() and kills < 5:
        proc = _start(config)
        try:
            wait_until(lambda: _stored(port) > 0, 60, "a first flush")
            time.sleep(rng.uniform(0.2, 0.9))  # inside the next flush interval: rows are queued
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        kills += 1
    appender.join(timeout=60)
    assert kills >= 3
    proc = _start(config)
    state = store.with_suffix(".inspector-offsets.json")
    try:
        wait_until(lambda: _alive(port), 60, "the last sidecar up")
        time.sleep(1.5)  # its first poll and flush
        wait_until(lambda: _committed(state) == log.stat().st_size, 60, "every line committed")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    with duckdb.connect(str(store), read_only=True) as con:
        got = con.execute(
            "SELECT count(*), count(DISTINCT coll_sn), max(coll_sn) FROM collective_records"
        ).fetchone()
    assert got == (LINES, LINES, LINES - 1)


def test_a_truncated_store_is_a_one_line_error_not_a_traceback(tmp_path: Path) -> None:
    store = tmp_path / "node.duckdb"
    with duckdb.connect(str(store)) as con:
        con.execute("CREATE TABLE t AS SELECT range AS x, repeat('x', 40) AS y FROM range(200000)")
    os.truncate(store, store.stat().st_size // 2)
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump({"store_path": str(store), "listen_port": free_port(), "api_enabled": False})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ioe", "sidecar", "--config", str(config)], capture_output=True, timeout=120
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.startswith(f"ioe sidecar: store {store}: cannot open")
