"""The fleet store on DuckLake with a real PostgreSQL catalog on 127.0.0.1.

Writers are separate processes (``tests/lake_writer.py``) as sidecars would be; what each
acknowledged is recomputed exactly from ``batch_frame`` and compared with the lake by
count, distinct key count and sums (a checksum that a lost, duplicated or altered row moves).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.lake import LakeConfig, LakeError, LakeStore, open_store
from collector.lake_spool import SpoolError
from collector.records import frame
from collector.store import NS_PER_MIN, SCHEMA_VERSION, Retention
from ioe.settings import Settings
from tests.conftest import ROOT, require_component
from tests.lake_writer import METRIC, batch_frame
from tests.pg import PgCluster, find_binaries

ROWS = 400  # rows per batch
_db_names = itertools.count()


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    bindir = require_component("postgres", find_binaries())
    cluster = PgCluster(Path(bindir))
    with cluster:
        yield cluster


@pytest.fixture
def lake(pg: PgCluster, tmp_path: Path) -> dict[str, str]:
    dsn = pg.create_db(f"lake{next(_db_names)}_{os.getpid()}")
    return {"dsn": dsn, "data": str(tmp_path / "data"), "spool": str(tmp_path / "spool")}


def _cfg(lake: dict[str, str], spool: str, **kw: object) -> LakeConfig:
    return LakeConfig(lake["dsn"], lake["data"], spool, **kw)  # type: ignore[arg-type]


def _writer(
    lake: dict[str, str], host: str, first: int, count: int, interval: float = 0.3, pause: float = 0.001
) -> subprocess.Popen[str]:
    spool = f"{lake['spool']}-{host}"
    args = [
        lake["dsn"],
        lake["data"],
        spool,
        host,
        str(first),
        str(count),
        str(ROWS),
        str(interval),
        str(pause),
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lake_writer", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _expected(host: str, batches: set[int]) -> tuple[int, int, float]:
    """(rows, sum of ts_ns, sum of value) that ``batches`` of ``host`` put into the lake."""
    rows = len(batches) * ROWS
    ts = sum(sum(range(b * ROWS, (b + 1) * ROWS)) for b in batches)
    value = sum(((b * ROWS + i) % 1000) / 1000.0 for b in batches for i in range(ROWS))
    return rows, ts, value


def _observed(store: LakeStore, host: str) -> tuple[int, int, int, float]:
    with store.cursor() as cur:
        row = cur.execute(
            "SELECT count(*), count(DISTINCT (ts_ns, uuid, metric, link)), coalesce(sum(ts_ns), 0), "
            "coalesce(sum(value), 0) FROM gpu_samples WHERE host = ?",
            [host],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), float(row[3])


def _check_host(store: LakeStore, host: str, batches: set[int]) -> None:
    rows, ts, value = _expected(host, batches)
    n, distinct, got_ts, got_value = _observed(store, host)
    assert (n, distinct, got_ts) == (rows, rows, ts), host
    assert got_value == pytest.approx(value, rel=1e-12), host


def test_replayed_batch_inserts_nothing_and_null_keys_are_refused(lake: dict[str, str]) -> None:
    with LakeStore(_cfg(lake, lake["spool"], background=False)) as st:
        assert st.schema_version() == SCHEMA_VERSION
        batch = batch_frame("n1", 0, ROWS)
        assert st.write("gpu_samples", batch) == ROWS
        assert st.flush() == {"gpu_samples": ROWS}
        # A crash between commit and spool delete replays the file: nothing new.
        st.write("gpu_samples", batch)
        st.write("gpu_samples", batch_frame("n1", 0, 10))
        assert st.flush() == {"gpu_samples": 0}
        _check_host(st, "n1", {0})
        bad = batch.with_columns(batch["uuid"].set(batch["ts_ns"] == 3, None))
        with pytest.raises(LakeError, match=r"gpu_samples: key columns \['uuid'\] hold NULL"):
            st.write("gpu_samples", bad)
        assert st.spool.pending() == []
        # targets keep their latest state (last row of a batch wins).
        st.write(
            "targets", frame("targets", {"target": ["a", "a"], "up": [True, False], "samples_last": [5, 7]})
        )
        st.flush()
        with st.cursor() as cur:
            assert cur.execute("SELECT target, up, samples_last FROM targets").fetchall() == [("a", False, 7)]


BATCHES = 60  # ~15 s of writing: long enough for a maintenance pass to overlap it on a loaded machine


def test_four_writer_processes_and_concurrent_maintenance_lose_nothing(lake: dict[str, str]) -> None:
    hosts = [f"node{i}" for i in range(4)]
    procs = {h: _writer(lake, h, 0, BATCHES, interval=0.2, pause=0.08) for h in hosts}
    with LakeStore(_cfg(lake, lake["spool"] + "-reader", background=False)) as reader:
        seen: list[int] = []
        overlapped = 0  # maintenance passes that started while writers were writing
        time.sleep(2.0)  # the writers are past their start-up and writing
        while any(p.poll() is None for p in procs.values()):
            # The reader reads while maintenance (rollups, compaction, expiry) runs under writers.
            overlapped += any(p.poll() is None for p in procs.values())
            reader.maintain(now_ns=10 * NS_PER_MIN, retention=Retention(raw_s=1e9, rollup_s=1e9))
            seen.append(reader.count("gpu_samples"))
        outs = {h: p.communicate(timeout=60) for h, p in procs.items()}
        for h, (out, err) in outs.items():
            assert procs[h].returncode == 0, err[-2000:]
            lines = out.splitlines()
            assert [x for x in lines if x.startswith("ACK")] == [f"ACK {b}" for b in range(BATCHES)]
            assert lines[-1].startswith("DONE ")
        # on a loaded 2-core machine one pass can outlast the writers: one pass that started under
        # them suffices
        assert overlapped >= 1 and seen == sorted(seen)  # never saw rows vanish
        for h in hosts:
            _check_host(reader, h, set(range(BATCHES)))
        reader.maintain(now_ns=10 * NS_PER_MIN, retention=Retention(raw_s=1e9, rollup_s=1e9))
        with reader.cursor() as cur:
            got = cur.execute(
                "SELECT host, sum(n), min(min), max(max), count(*) FROM gpu_samples_1m "
                "WHERE metric = ? GROUP BY host",
                [METRIC],
            ).fetchall()
    # All rows lie in minute 0 (ts_ns < 24000 ns): one rollup row per host, n = every sample.
    assert sorted(got) == [(h, BATCHES * ROWS, 0.0, 0.999, 1) for h in hosts]


def _acks(stream: object, into: list[int]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        if line.startswith("ACK "):
            into.append(int(line.split()[1]))


def test_sigkill_mid_batch_loses_nothing_acknowledged(lake: dict[str, str]) -> None:
    proc = _writer(lake, "victim", 0, 100_000, interval=0.25)
    acked: list[int] = []
    reader = threading.Thread(target=_acks, args=(proc.stdout, acked), daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while len(acked) < 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    reader.join(timeout=10)
    assert len(acked) >= 60 and acked == list(range(len(acked)))
    # Restart on the same spool: it commits what the killed process had spooled but not committed.
    again = _writer(lake, "victim", 0, 0)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err[-2000:]
    with LakeStore(_cfg(lake, lake["spool"] + "-reader", background=False)) as st:
        n, distinct, _, _ = _observed(st, "victim")
        assert n == distinct  # exactly once
        with st.cursor() as cur:
            row = cur.execute("SELECT max(ts_ns) FROM gpu_samples WHERE host = 'victim'").fetchone()
        batches = set(range((int(row[0]) + 1) // ROWS)) if row and row[0] is not None else set()
        # Every acknowledged batch is there; at most the batch being written when killed
        # (spooled but not yet acknowledged) may be there too, whole.
        assert set(acked) <= batches and len(batches) - len(acked) <= 1
        _check_host(st, "victim", batches)


def test_catalog_outage_is_survived_via_spool(lake: dict[str, str], pg: PgCluster) -> None:
    cfg = _cfg(lake, lake["spool"] + "-out", commit_interval_s=0.2, max_retries=2, retry_wait_s=0.05)
    with LakeStore(cfg) as st:
        for b in range(5):
            st.write("gpu_samples", batch_frame("n1", b, ROWS))
        time.sleep(0.6)
        pg.stop()
        try:
            for b in range(5, 25):  # acknowledged while the catalog is down
                assert st.write("gpu_samples", batch_frame("n1", b, ROWS)) == ROWS
                time.sleep(0.15)
            assert len(st.spool.pending()) >= 15  # nothing could be committed
        finally:
            pg.start()
        deadline = time.monotonic() + 20
        while st.spool.pending() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert st.spool.pending() == []
        _check_host(st, "n1", set(range(25)))


def test_open_store_picks_the_backend(lake: dict[str, str], tmp_path: Path) -> None:
    embedded = open_store(Settings(store_path=str(tmp_path / "x.duckdb")))
    assert type(embedded).__name__ == "Store"
    embedded.close()
    with pytest.raises(LakeError, match=r"needs settings \['lake_catalog_dsn'"):
        open_store(Settings(store_backend="ducklake"))
    settings = Settings(
        store_backend="ducklake",
        lake_catalog_dsn=lake["dsn"],
        lake_data_path=lake["data"],
        lake_spool_dir=lake["spool"] + "-f",
        lake_commit_interval_s=0.1,
    )
    st = open_store(settings)
    assert isinstance(st, LakeStore) and st.cfg.commit_interval_s == 0.1
    with pytest.raises(SpoolError, match="in use by another process"):
        LakeStore(_cfg(lake, lake["spool"] + "-f"))
    st.close()


def _engine_counter(points: list[tuple[int, float]]) -> object:
    """Engine "x"'s token counter at ``(seconds, value)`` points."""
    rows = [
        {"ts_ns": s * 10**9, "source": "x", "engine": "vllm", "model": "m", "dp_rank": 0, "tp_rank": 0,
         "pp_rank": 0, "ep_rank": 0, "concept": "generation_tokens_total", "labels": "{}", "value": v}
        for s, v in points
    ]  # fmt: skip
    return frame("engine_samples", rows)


# every 10 s from 5 s: +10 a step to 70 at 75 s, a reset to 5 at 85 s (inside the minute 60-120 s),
# +10 a step to 45 at 125 s
_RESET_INSIDE = [
    (5 + 10 * i, float(v)) for i, v in enumerate([0, 10, 20, 30, 40, 50, 60, 70, 5, 15, 25, 35, 45])
]


def test_lake_rollups_keep_each_minutes_increase(lake: dict[str, str]) -> None:
    """collector.lake rule 7: minute 0 holds 5 steps of +10 (the first point has none): 50; minute
    1: +10, +10, the reset (+5), +30: 55; minute 2: +10. A long window sums them (analyzer.latency
    rule 11): (60 s, 180 s] is 65, the growth before the reset kept."""
    import analyzer.latency as latency

    with LakeStore(_cfg(lake, lake["spool"], background=False)) as st:
        st.write("engine_samples", _engine_counter(_RESET_INSIDE))
        st.flush()
        st.maintain(now_ns=180 * 10**9, retention=Retention(raw_s=1e9, rollup_s=1e9))
        with st.cursor() as cur:
            got = cur.execute("SELECT minute_ns, n, increase FROM engine_samples_1m ORDER BY 1").fetchall()
            assert got == [(0, 6, 50.0), (NS_PER_MIN, 6, 55.0), (2 * NS_PER_MIN, 1, 10.0)]
            inc = latency.counter_increases(
                cur, 60 * 10**9, 180 * 10**9, ["generation_tokens_total"], rollup=True
            )
            assert inc["increase"].to_list() == [65.0]


def test_a_schema_5_lake_gets_its_rollup_increases(lake: dict[str, str]) -> None:
    """A lake whose rollups have no increase (made here by removing it) gets the column on open,
    filled with the step between each minute's last value and the previous minute's: minute 1's
    last is 35 after 70 (a reset: 35), minute 2's 45 (+10); a series' first minute has none."""
    with LakeStore(_cfg(lake, lake["spool"], background=False)) as st:
        st.write("engine_samples", _engine_counter(_RESET_INSIDE))
        st.flush()
        st.maintain(now_ns=180 * 10**9, retention=Retention(raw_s=1e9, rollup_s=1e9))
        with st.cursor() as cur:
            for t in ("engine_samples_1m", "histogram_buckets_1m"):
                cur.execute(f"ALTER TABLE {t} DROP COLUMN increase")
            cur.execute(f"DELETE FROM ioe_schema WHERE version = {SCHEMA_VERSION}")
            cur.execute("INSERT INTO ioe_schema VALUES (5, 0)")  # before the rollups kept increases
    with LakeStore(_cfg(lake, lake["spool"], background=False)) as st:
        assert st.schema_version() == SCHEMA_VERSION
        with st.cursor() as cur:
            got = cur.execute("SELECT minute_ns, increase FROM engine_samples_1m ORDER BY 1").fetchall()
    assert got == [(0, None), (NS_PER_MIN, 35.0), (2 * NS_PER_MIN, 10.0)]
