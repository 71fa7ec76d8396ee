"""The series layout of a store file's raw tables (collector.series): the views give back exactly
the rows written, each description is stored once, ids survive a restart, retention prunes
series, and a file with the old wide tables is converted without losing or changing a row."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from collector.formats.scrape import parse_scrape
from collector.records import TABLES, batch
from collector.store import NS_PER_MIN, SCHEMA_VERSION, Retention, Store
from tests.conftest import DATA

DCGM_K8S = "dcgm/h100x8_k8s_pod_labels.prom"
RAW = ("gpu_samples", "engine_samples", "histogram_buckets", "fabric_samples")


def _scrape(kind: str, name: str, ts_ns: int) -> dict[str, Any]:
    body = (DATA / name).read_text()
    return parse_scrape(body, kind=kind, ts_ns=ts_ns, host="node-1", source=name).batches  # type: ignore[arg-type]


def _all(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[Any, ...]]:
    cols = ", ".join(TABLES[table].column_names)
    return con.execute(f"SELECT {cols} FROM {table} ORDER BY ALL").fetchall()


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    got = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert got is not None
    return int(got[0])


def test_views_give_back_exactly_the_rows_of_a_real_scrape_with_each_series_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    parsed = dict(_scrape("dcgm", DCGM_K8S, 10**18))
    parsed.update(_scrape("engine", "engine/vllm_0.33.0_dp2.prom", 10**18))
    for table, rows in parsed.items():
        store.write(table, rows)
    for table, rows in parsed.items():
        frame = rows.to_polars()
        expected = sorted(frame.select(TABLES[table].column_names).rows(), key=repr)
        assert sorted(_all(store.con, table), key=repr) == expected
        series = frame.select(TABLES[table].series_columns).unique().height
        assert _count(store.con, f"{table}_series") == series
        assert _count(store.con, f"{table}_points") == frame.height
    # the pod labels of the k8s fixture are part of each GPU series
    pods = store.con.execute("SELECT DISTINCT pod FROM gpu_samples WHERE pod <> '' ORDER BY 1").fetchall()
    assert pods, "the k8s fixture names pods"
    # a second scrape with new values adds points only
    again = _scrape("dcgm", DCGM_K8S, 10**18 + 10**9)["gpu_samples"]
    before = _count(store.con, "gpu_samples_series")
    assert store.write("gpu_samples", again) == again.height
    assert _count(store.con, "gpu_samples_series") == before


def _gpu(ts: list[int], pod: str, value: float = 1.0) -> Any:
    n = len(ts)
    return batch(
        "gpu_samples",
        {"ts_ns": ts, "host": ["h"] * n, "uuid": ["GPU-0"] * n, "metric": ["power_w"] * n,
         "value": [value] * n, "pod": [pod] * n, "gpu": [0] * n},
    )  # fmt: skip


def test_a_gpu_under_a_new_pod_is_a_new_series_and_old_rows_keep_their_pod(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    store = Store(path)
    store.write("gpu_samples", _gpu([1, 2], "a"))
    store.write("gpu_samples", _gpu([3], "b"))
    rows = store.con.execute("SELECT ts_ns, pod FROM gpu_samples ORDER BY ts_ns").fetchall()
    assert rows == [(1, "a"), (2, "a"), (3, "b")]
    assert store.con.execute("SELECT series_id, pod FROM gpu_samples_series ORDER BY 1").fetchall() == [
        (0, "a"),
        (1, "b"),
    ]
    store.close()
    again = Store(path)  # a restarted sidecar: the ids are read back, not assigned twice
    assert again.write("gpu_samples", _gpu([4], "a")) == 1
    assert again.write("gpu_samples", _gpu([5], "c")) == 1
    assert again.con.execute("SELECT series_id, pod FROM gpu_samples_series ORDER BY 1").fetchall() == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
    ]
    assert again.write("gpu_samples", _gpu([4, 5], "a")) == 1  # ts 4 of pod a is stored: 5 only


def test_retention_prunes_series_whose_points_are_all_gone(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    now = 100 * NS_PER_MIN
    store.write("gpu_samples", _gpu([now - 50 * NS_PER_MIN], "old"))
    store.write("gpu_samples", _gpu([now - 10 * NS_PER_MIN, now - 5 * NS_PER_MIN], "new"))
    done = store.maintain(now_ns=now, retention=Retention(raw_s=30 * 60, rollup_s=86400))
    assert done["deleted_gpu_samples"] == 1
    assert done["pruned_gpu_samples_series"] == 1
    assert store.con.execute("SELECT pod FROM gpu_samples_series").fetchall() == [("new",)]
    # rollups were made from the view before the delete: the old minute is still there
    minutes = store.con.execute("SELECT minute_ns FROM gpu_samples_1m ORDER BY 1").fetchall()
    assert minutes[0] == (now - 50 * NS_PER_MIN,)
    # the pruned description comes back as a new series when it is seen again
    assert store.write("gpu_samples", _gpu([now], "old")) == 1
    assert store.con.execute("SELECT DISTINCT pod FROM gpu_samples ORDER BY 1").fetchall() == [
        ("new",),
        ("old",),
    ]
    # within the hour, a maintenance pass does not scan the points for orphans again
    assert "pruned_gpu_samples_series" not in store.maintain(now_ns=now + NS_PER_MIN)


def _wide_file(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """A store file as IOE wrote it at schema version 1: wide raw tables with real rows."""
    parsed = _scrape("dcgm", DCGM_K8S, 10**18)
    parsed.update(_scrape("engine", "engine/sglang_0.5.23.prom", 10**18))
    parsed["fabric_samples"] = batch(
        "fabric_samples",
        {"ts_ns": [1, 2], "host": ["h", "h"], "device": ["mlx5_0"] * 2, "port": [1, 1],
         "metric": ["port_rcv_data_bytes"] * 2, "value": [4.0, 8.0], "rate_per_s": [None, 4.0]},
    )  # fmt: skip
    con = duckdb.connect(str(path))
    for table in TABLES.values():
        con.execute(table.ddl())
    con.execute("CREATE TABLE ioe_schema (version INTEGER, applied_ns BIGINT)")
    con.execute("INSERT INTO ioe_schema VALUES (1, 0)")
    for table, rows in parsed.items():
        _stream = rows.__arrow_c_stream__()
        con.execute(f"INSERT INTO {table} SELECT * FROM _stream")
    before = {t: _all(con, t) for t in RAW}
    con.close()
    return before


def test_a_wide_file_is_converted_with_every_row_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "v1.duckdb"
    before = _wide_file(path)
    assert all(before[t] for t in ("gpu_samples", "engine_samples", "histogram_buckets", "fabric_samples"))
    with Store(path, read_only=True) as old:  # read-only: read as it is, not converted
        assert _all(old.con, "gpu_samples") == before["gpu_samples"]
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION
    kinds = dict(store.con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
    for table in RAW:
        assert kinds[table] == "VIEW"
        assert _all(store.con, table) == before[table]
    # the converted file keeps its keys unique: a replay of a stored row adds nothing
    gpu = before["gpu_samples"][0]
    row = dict(zip(TABLES["gpu_samples"].column_names, gpu, strict=True))
    assert store.write("gpu_samples", batch("gpu_samples", [row])) == 0
    store.close()
    reader = duckdb.connect(str(path), read_only=True)  # `ioe query` and other readers
    assert _all(reader, "histogram_buckets") == before["histogram_buckets"]
    reader.close()


def test_a_null_key_in_a_new_series_is_refused_before_any_point(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    cols = {"ts_ns": [1, 2], "host": ["h", None], "uuid": ["G", "G"], "metric": ["m", "m"]}
    bad = batch("gpu_samples", cols)
    with pytest.raises(duckdb.ConstraintException, match="NOT NULL"):
        store.write("gpu_samples", bad)
    assert _count(store.con, "gpu_samples_points") == 0
    assert store.write("gpu_samples", _gpu([1], "a")) == 1  # the writer carries on


def test_a_full_buffer_pool_is_checkpointed_and_the_write_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "s.duckdb")
    real = store._insert
    calls: list[str] = []

    def full_once(spec: Any, rows: Any, closed: bool = False) -> int:
        calls.append(spec.name)
        if len(calls) == 1:
            raise duckdb.OutOfMemoryException("could not allocate block of size 256.0 KiB")
        return real(spec, rows, closed)

    monkeypatch.setattr(store, "_insert", full_once)
    with caplog.at_level(logging.WARNING, logger="collector.store"):
        assert store.write("gpu_samples", _gpu([1, 2], "a")) == 2
    assert calls == ["gpu_samples", "gpu_samples"]
    assert "write to gpu_samples found memory full" in caplog.text
    assert _all(store.con, "gpu_samples") == sorted(_all(store.con, "gpu_samples"))
    assert _count(store.con, "gpu_samples") == 2


def test_polars_and_arrow_inputs_take_the_same_path(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    frame = _gpu([1, 2], "a").to_polars()
    assert isinstance(frame, pl.DataFrame)
    assert store.write("gpu_samples", frame) == 2
    assert store.write("gpu_samples", frame.to_arrow()) == 0
    assert store.write("gpu_samples", _gpu([3], "a").to_polars().to_arrow()) == 1
    assert _count(store.con, "gpu_samples_series") == 1


def test_rollups_from_points_equal_the_plain_aggregates_of_the_views(tmp_path: Path) -> None:
    """The rollups aggregate points per series before the join (Store._ROLLUPS); they must give
    what a plain GROUP BY over the view gives (the counters' increase: the sum of the points'
    stored increases), NULL values and two series per key included."""
    store = Store(tmp_path / "s.duckdb")
    t0 = 1000 * NS_PER_MIN
    for i, ts in enumerate((t0 + 1, t0 + 20 * 10**9, t0 + NS_PER_MIN + 5, t0 + NS_PER_MIN + 40 * 10**9)):
        for kind, name in (
            ("dcgm", DCGM_K8S),
            ("engine", "engine/vllm_0.33.0_dp2.prom"),
        ):
            for table, rows in _scrape(kind, name, ts).items():
                moved = [None if v is None else v * (1 + i) for v in rows[TABLES[table].values[0]]]
                store.write(table, rows.with_column(TABLES[table].values[0], moved))
        # the same GPU key under two pods: two series, one rollup row; p1's latest value is NULL,
        # so the key's last value is p2's, though p1 has the latest point
        store.write("gpu_samples", _gpu([ts], "p1", value=float(i)))
        store.write("gpu_samples", _gpu([ts + 2], "p1").with_column("value", [None]))
        store.write("gpu_samples", _gpu([ts + 1], "p2", value=10.0 + i))
    store.maintain(now_ns=t0 + 2 * NS_PER_MIN)
    minute = f"(ts_ns - ts_ns % {NS_PER_MIN})"
    engine_id = "source, engine, model, dp_rank, tp_rank, pp_rank, ep_rank, concept, labels"
    plain = {
        "gpu_samples_1m": f"SELECT {minute}, host, uuid, metric, link, count(*), min(value), max(value), "
        "avg(value), arg_max(value, ts_ns) FROM gpu_samples GROUP BY ALL",
        "engine_samples_1m": f"SELECT {minute}, {engine_id}, count(*), avg(value), max(value), "
        "arg_max(value, ts_ns), avg(rate_per_s), sum(increase) FROM engine_samples_points "
        "JOIN engine_samples_series USING (series_id) GROUP BY ALL",
        "histogram_buckets_1m": f"SELECT {minute}, {engine_id}, le, arg_max(cumulative_count, ts_ns), "
        "sum(increase) FROM histogram_buckets_points JOIN histogram_buckets_series USING (series_id) "
        "GROUP BY ALL",
    }
    for rollup, sql in plain.items():
        expected = sorted(store.con.execute(sql).fetchall(), key=repr)
        cols = [c for c in TABLES[rollup].column_names if c != "gpu"]
        got = sorted(store.con.execute(f"SELECT {', '.join(cols)} FROM {rollup}").fetchall(), key=repr)
        assert len(got) == len(expected) > 0
        for mine, theirs in zip(got, expected, strict=True):
            assert all(_same(a, b) for a, b in zip(mine, theirs, strict=True)), (mine, theirs)
    two_pods = "SELECT n, avg, last FROM gpu_samples_1m WHERE host = 'h' ORDER BY minute_ns"
    assert store.con.execute(two_pods).fetchall() == [(6, 5.5, 11.0), (6, 7.5, 13.0)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return bool(a == b)


def test_a_flush_of_scrapes_keeps_every_rows_series(tmp_path: Path) -> None:
    """A writer's flush joins scrapes (Batch rule 6); a part repeating an earlier part's series
    takes its ids, and a part of the same height whose series differ (a GPU swapped, a series
    renamed) is looked up: every row must read back with its own description."""
    from collector.batch import Batch

    def scrape(k: int, uuids: list[str], metric: str = "power_w") -> Batch:
        rows = [
            {
                "ts_ns": 10**18 + k * 10**9 + i,
                "host": "n",
                "uuid": u,
                "metric": metric,
                "value": float(k * 10 + i),
            }
            for i, u in enumerate(uuids)
        ]
        return batch("gpu_samples", rows)

    gpus = ["GPU-a", "GPU-b", "GPU-c"]
    parts = [
        scrape(0, gpus),
        scrape(1, gpus),
        scrape(2, ["GPU-a", "GPU-x", "GPU-c"]),  # same height, one series differs
        scrape(3, gpus, metric="sm_clock_mhz"),  # same height, every series differs in one column
        scrape(4, gpus[:2]),  # another height
        scrape(5, gpus),
    ]
    joined = Batch.concat(parts)
    assert joined.parts == [3, 3, 3, 3, 2, 3]
    with Store(tmp_path / "s.duckdb") as st:
        assert st.write("gpu_samples", joined) == joined.height
        got = st.con.execute("SELECT ts_ns, uuid, metric, value FROM gpu_samples ORDER BY ts_ns").fetchall()
        series = st.con.execute("SELECT count(*) FROM gpu_samples_series").fetchone()
    want = [
        (t, u, m, v)
        for t, u, m, v in zip(*(joined[c] for c in ("ts_ns", "uuid", "metric", "value")), strict=True)
    ]
    assert got == sorted(want)
    assert series == (3 + 1 + 3,)


def test_parts_sharing_a_replay_plans_lists_take_the_first_parts_ids(tmp_path: Path) -> None:
    """Batch rule 6's ``same``: parts whose identity columns are the very same lists (a replay
    plan's, shared by every scrape it replays) point at the first such part; a part with equal
    but other lists, or with one list of its own, does not. Every row reads back with its own
    description either way."""
    from collector.batch import Batch

    uuids, power, clock = ["GPU-a", "GPU-b", "GPU-c"], ["power_w"] * 3, ["sm_clock_mhz"] * 3
    first = {"ts_ns": [0] * 3, "host": ["n"] * 3, "uuid": uuids, "metric": power, "value": [0.0] * 3}
    plan = batch("gpu_samples", first)

    def scrape(k: int, metric: list[str], uuid: list[str] = uuids) -> Batch:
        ts, values = [10**18 + k * 10**9] * 3, [float(k * 10 + i) for i in range(3)]
        new = {"ts_ns": ts, "uuid": uuid, "metric": metric, "value": values}
        data = {c: new.get(c, v) for c, v in plan.data.items()}  # the other lists: the plan's own
        return Batch("gpu_samples", data, 3, unique=True)

    parts = [
        scrape(0, power),
        scrape(1, clock),  # another plan's metric list
        scrape(2, power),  # the first part's lists again
        scrape(3, list(power), list(uuids)),  # equal values, other lists: compared, not assumed
        scrape(4, clock),
        scrape(5, power, ["GPU-a", "GPU-x", "GPU-c"]),  # one list of its own
    ]
    joined = Batch.concat(parts)
    assert joined.same == [0, 1, 0, 3, 1, 5]
    assert Batch.concat([joined, parts[0]]).same is None  # a joined part: compared instead
    with Store(tmp_path / "s.duckdb") as st:
        assert st.write("gpu_samples", joined) == joined.height
        read = "SELECT ts_ns, uuid, metric, value FROM gpu_samples ORDER BY ALL"
        got = st.con.execute(read).fetchall()
        series = st.con.execute("SELECT count(*) FROM gpu_samples_series").fetchone()
    want = sorted(zip(*(joined[c] for c in ("ts_ns", "uuid", "metric", "value")), strict=True))
    assert got == want and series == (3 + 3 + 1,)
