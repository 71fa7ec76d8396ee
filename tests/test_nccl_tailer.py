"""The Inspector tailer: each record lands exactly once across appends, torn lines, restarts,
truncation and rotation."""

from __future__ import annotations

import json
import os
from pathlib import Path

from inspector_gen import coll_record, lines, torn_rest, write_ranks

from collector.sink import Overloaded
from collector.sources.tailer import InspectorTailer
from collector.store import Store

N_RANKS = 4


def _count(store: Store, where: str = "TRUE") -> int:
    with store.cursor() as cur:
        row = cur.execute(f"SELECT count(*) FROM collective_records WHERE {where}").fetchone()
    return int(row[0]) if row else 0


def test_poll_append_poll_restart_poll_ingests_exactly_once(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "state" / "tail.json"
    store = Store()
    write_ranks(dump, N_RANKS, range(0, 3), verbose=True, torn=True)  # torn: half of sn 3's line
    first = InspectorTailer(dump, state, store, clock=lambda: 1).poll()
    assert first.rows["collective_records"] == N_RANKS * (3 + 3)
    assert first.problems == []
    assert _count(store, "kind='coll' AND coll_sn=3") == 0  # the half line is not read

    for rank, path in {r: dump / f"node0-pid{4000 + r}.log" for r in range(N_RANKS)}.items():
        with path.open("ab") as fh:
            fh.write(torn_rest(rank, N_RANKS, 3, verbose=True))
    write_ranks(dump, N_RANKS, range(4, 6), verbose=False, p2p=False)
    second = InspectorTailer(dump, state, store).poll()  # a new tailer: offsets come from the state file
    assert second.rows["collective_records"] == N_RANKS * (1 + 2)
    assert second.lines == N_RANKS * (1 + 1 + 2)  # completed line, dump_stats marker, two records

    third = InspectorTailer(dump, state, store).poll()
    assert third.lines == 0 and third.rows["collective_records"] == 0
    assert _count(store) == N_RANKS * (3 + 3 + 1 + 2)
    with store.cursor() as cur:
        got = cur.execute(
            "SELECT exec_us, start_us FROM collective_records WHERE kind='coll' AND coll_sn=3 AND rank=2"
        ).fetchone()
    assert got == (100 + 20 + 3, 1_760_000_000_000_000 + 3000 + 10)  # the joined torn line, whole


def test_state_file_is_json_and_atomic(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "tail.json"
    paths = write_ranks(dump, 1, range(2))
    InspectorTailer(dump, state, Store()).poll()
    saved = json.loads(state.read_text())
    entry = saved["files"][str(paths[0])]
    assert entry["offset"] == paths[0].stat().st_size
    assert entry["line"] == 1 + 2 + 2
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_truncation_restarts_at_zero_without_duplicates(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "tail.json"
    store = Store()
    paths = write_ranks(dump, 1, range(5), p2p=False)
    tailer = InspectorTailer(dump, state, store)
    tailer.poll()
    paths[0].write_bytes(lines([coll_record(0, 10, 1)]))  # truncated and rewritten, now shorter
    report = tailer.poll()
    assert report.restarted and "truncated" in report.restarted[0]
    assert report.rows["collective_records"] == 1
    with store.cursor() as cur:
        sns = [
            r[0] for r in cur.execute("SELECT coll_sn FROM collective_records ORDER BY coll_sn").fetchall()
        ]
    assert sns == [0, 1, 2, 3, 4, 10]


def test_rewritten_file_longer_than_offset_is_detected_by_fingerprint(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "tail.json"
    store = Store()
    path = dump / "node0-pid1.log"
    dump.mkdir()
    path.write_bytes(lines([coll_record(0, 0, 1)]))
    tailer = InspectorTailer(dump, state, store)
    tailer.poll()
    with path.open("r+b") as fh:  # truncate + regrow in place between polls: same inode, larger size
        fh.truncate(0)
        fh.write(lines([coll_record(1, sn, 1) for sn in range(3)]))
    report = tailer.poll()
    assert report.restarted and "rewritten" in report.restarted[0]
    assert report.rows["collective_records"] == 3


def test_rotation_new_inode_reads_new_file_from_start(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "tail.json"
    store = Store()
    paths = write_ranks(dump, 1, range(3), p2p=False)
    InspectorTailer(dump, state, store).poll()
    os.rename(paths[0], dump / "node0-pid4000.log.1")
    big = [coll_record(0, sn, 1) for sn in range(100, 110)]
    paths[0].write_bytes(lines(big))
    report = InspectorTailer(dump, state, store).poll()
    assert report.rows["collective_records"] == 10
    assert any("rotated" in r for r in report.restarted)


def test_bad_line_reported_with_file_and_line_number(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "tail.json"
    dump.mkdir()
    path = dump / "n-pid9.log"
    path.write_bytes(lines([coll_record(0, 0, 1)]) + b"garbage{\n" + lines([coll_record(0, 1, 1)]))
    tailer = InspectorTailer(dump, state, Store())
    report = tailer.poll()
    assert report.rows["collective_records"] == 2
    assert [p.location for p in report.problems] == [f"{path}:2"]
    with path.open("ab") as fh:
        fh.write(b"{oops\n")
    assert [p.location for p in tailer.poll().problems] == [f"{path}:4"]


class _FullSink:
    def __init__(self) -> None:
        self.refuse = True
        self.store = Store()

    def write(self, table: str, batch: object) -> int:
        if self.refuse:
            raise Overloaded("queue full")
        return self.store.write(table, batch)  # type: ignore[arg-type]


def test_overloaded_sink_keeps_offset_so_rows_come_next_poll(tmp_path: Path) -> None:
    dump, state = tmp_path / "dump", tmp_path / "tail.json"
    write_ranks(dump, 2, range(2), p2p=False)
    sink = _FullSink()
    tailer = InspectorTailer(dump, state, sink)
    report = tailer.poll()
    assert len(report.deferred) == 2 and report.rows["collective_records"] == 0
    sink.refuse = False
    assert tailer.poll().rows["collective_records"] == 4
