"""Raw sample tables keep their natural key unique without a PRIMARY KEY index (Store rules 1-3 of
``_insert_unindexed``), and files made when they had one are converted and keep it unique."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb
import polars as pl
import pytest

from collector.records import TABLES, batch
from collector.store import Store


def _gpu(ts: list[int], values: list[float], uuid: str = "GPU-0") -> object:
    n = len(ts)
    return batch(
        "gpu_samples",
        {"ts_ns": ts, "host": ["h"] * n, "uuid": [uuid] * n, "metric": ["power_w"] * n, "value": values},
    )


def _rows(store: Store) -> list[tuple[object, ...]]:
    return store.con.execute("SELECT ts_ns, uuid, value FROM gpu_samples ORDER BY ts_ns, uuid").fetchall()


def test_new_files_index_only_the_small_tables(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    keyed = {r[0] for r in store.con.execute(
        "SELECT table_name FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'"
    ).fetchall()}  # fmt: skip
    raw = {"gpu_samples", "engine_samples", "histogram_buckets", "fabric_samples"}
    assert keyed & raw == set()
    # rollups are rewritten a window at a time and series are numbered by the store: no index
    assert keyed & {"gpu_samples_1m", "gpu_samples_series", "ioe_state"} == set()
    assert {"targets", "deployments", "request_spans"} <= keyed
    assert all(not TABLES[t].indexed for t in raw)


def test_replays_overlaps_and_in_batch_duplicates_store_each_key_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    assert store.write("gpu_samples", _gpu([1, 2, 3], [10.0, 20.0, 30.0])) == 3
    assert store.write("gpu_samples", _gpu([1, 2, 3], [10.0, 20.0, 30.0])) == 0  # replay
    assert store.write("gpu_samples", _gpu([3, 4], [99.0, 40.0])) == 1  # 3 is stored: 4 only
    assert store.write("gpu_samples", _gpu([5, 5, 6], [50.0, 50.0, 60.0])) == 2  # one row for ts 5
    assert store.write("gpu_samples", _gpu([2], [20.0], uuid="GPU-1")) == 1  # older, new key
    assert _rows(store) == [
        (1, "GPU-0", 10.0), (2, "GPU-0", 20.0), (2, "GPU-1", 20.0), (3, "GPU-0", 30.0),
        (4, "GPU-0", 40.0), (5, "GPU-0", 50.0), (6, "GPU-0", 60.0),
    ]  # fmt: skip


def test_a_reopened_store_still_refuses_stored_keys(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    first = Store(path)
    first.write("gpu_samples", _gpu([1, 2], [1.0, 2.0]))
    first.close()
    again = Store(path)  # a restarted sidecar re-sending its last flush
    assert again.write("gpu_samples", _gpu([2, 3], [2.0, 3.0])) == 1
    frame = pl.DataFrame({"ts_ns": [3, 4], "host": "h", "uuid": "GPU-0", "metric": "power_w", "link": -1})
    full = batch("gpu_samples", {c: frame[c].to_list() for c in frame.columns}).to_polars()
    assert again.write("gpu_samples", full) == 1  # polars frames take the same path
    assert [r[0] for r in _rows(again)] == [1, 2, 3, 4]


def test_null_key_is_refused_and_nothing_stored_is_touched(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    store.write("gpu_samples", _gpu([1], [1.0]))
    bad = batch("gpu_samples", {"ts_ns": [2], "host": [None], "uuid": ["GPU-0"], "metric": ["power_w"]})
    with pytest.raises(duckdb.ConstraintException, match="NOT NULL"):
        store.write("gpu_samples", bad)
    assert _rows(store) == [(1, "GPU-0", 1.0)]


def test_a_file_made_with_primary_keys_is_converted_and_still_refuses_stored_keys(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute(replace(TABLES["gpu_samples"], indexed=True).ddl())  # the wide table, keyed as it was
    con.execute(
        "INSERT INTO gpu_samples (ts_ns, host, uuid, metric, link, value) "
        "VALUES (1, 'h', 'GPU-0', 'power_w', -1, 1.0)"
    )
    con.execute("CREATE TABLE ioe_schema (version INTEGER, applied_ns BIGINT)")
    con.execute("INSERT INTO ioe_schema VALUES (1, 0)")
    con.close()
    store = Store(path)
    assert store.write("gpu_samples", _gpu([1, 2], [1.0, 2.0])) == 1  # ts 1 came with the file
    assert store.write("gpu_samples", _gpu([2, 3], [2.0, 3.0])) == 1
    assert [r[0] for r in _rows(store)] == [1, 2, 3]
    assert store.con.execute("SELECT count(*) FROM gpu_samples_series").fetchone() == (1,)


def test_a_batch_promised_unique_skips_the_dedup_and_concat_keeps_the_promise_only_when_true(
    tmp_path: Path,
) -> None:
    from collector.batch import Batch

    a, b = _gpu([10, 10], [1.0, 2.0], uuid="GPU-0"), _gpu([20], [3.0])
    assert isinstance(a, Batch) and isinstance(b, Batch)
    a = a.take([0])  # one row: unique, but nobody said so
    assert not a.unique
    a.unique = b.unique = True
    assert Batch.concat([a, b]).unique  # ts 10 and 20: no key can repeat across the parts
    assert Batch.concat([b, a]).unique
    assert not Batch.concat([a, a]).unique  # the same ts twice: it could
    assert Batch.concat([a, b]).with_column("value", [5.0, 6.0]).unique
    assert not Batch.concat([a, b]).take([0, 0]).unique

    store = Store(tmp_path / "s.duckdb")
    assert store.write("gpu_samples", Batch.concat([a, b])) == 2
    # a false promise is the builder's bug, not bad input: the store believes it (no dedup pass)
    liar = _gpu([30, 30], [1.0, 2.0])
    assert isinstance(liar, Batch)
    liar.unique = True
    assert store.write("gpu_samples", liar) == 2
    honest = _gpu([40, 40], [1.0, 2.0])
    assert store.write("gpu_samples", honest) == 1


def test_replayed_scrapes_are_promised_unique_only_when_their_keys_are(tmp_path: Path) -> None:
    from collector.formats.scrape import ScrapeCache, parse_scrape, replay_scrape
    from tests.conftest import DATA

    body = (DATA / "dcgm" / "h100x8_k8s_pod_labels.prom").read_text()
    line = next(x for x in body.splitlines() if x.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    # the same GPU's power again under another label spelling: one canonical key, two series
    twin = line.replace("UUID=", "uuid=").replace("Hostname=", "hostname=")
    assert twin != line
    for text, unique in ((body, True), (body.replace(line, f"{line}\n{twin}"), False)):
        cache = ScrapeCache()
        parse_scrape(text, kind="dcgm", ts_ns=1, host="n", source="t", cache=cache)
        moved = text.replace(" 68.347000", " 70.0").encode()
        replayed = replay_scrape(moved, kind="dcgm", ts_ns=2, host="n", source="t", cache=cache)
        assert replayed is not None, "the body must replay for this test to mean anything"
        rows = replayed.batches["gpu_samples"]
        assert getattr(rows, "unique", None) is unique
        store = Store(tmp_path / f"{unique}.duckdb")
        stored = store.write("gpu_samples", rows)
        sql = "SELECT count(DISTINCT (host, uuid, metric, link)) FROM gpu_samples"
        keys = store.con.execute(sql).fetchone()
        assert keys is not None and stored == keys[0]
