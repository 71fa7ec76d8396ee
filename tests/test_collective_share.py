"""The collective time share (critical-path rule 4) on hand-built NCCL records: the share is a duty
cycle over the time the collectives were issued in, not over whatever window was asked for.

Each case writes records whose true duty cycle is known by construction (exec time ÷ the spacing
between collectives) and asks for windows longer than the records."""

from __future__ import annotations

from typing import Any

import pytest

from analyzer.critical_path import comm_shares
from collector.records import frame
from collector.store import Store

S = 1_000_000  # µs per second
T_END = 2_000_000_000 * S  # an epoch in µs


def _records(first_us: float, seconds: int, every_s: float, exec_us: float, sample: int = 1,
             dump_only: bool = False) -> Any:  # fmt: skip
    """Two ranks on two hosts issuing one AllReduce every ``every_s``; every ``sample``-th is kept
    (the Inspector keeps the latest completed collective per dump)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("origin", "comm_id", "coll_sn", "rank", "kind", "n_ranks",
                                                  "host", "op", "msg_bytes", "exec_us", "start_us",
                                                  "dump_ts_us")}  # fmt: skip
    n = int(seconds / every_s)
    for rank in (0, 1):
        for sn in range(0, n, sample):
            t = first_us + sn * every_s * S
            dump = first_us + seconds * S if dump_only else t + exec_us
            row = ("inspector", "0xc", sn, rank, "coll", 2, f"node{rank}", "AllReduce", 1 << 20, exec_us,
                   None if dump_only else t, dump)  # fmt: skip
            for k, v in zip(cols, row, strict=True):
                cols[k].append(v)
    return frame("collective_records", cols)


def _share(records: Any, window_s: int) -> float:
    st = Store(":memory:")
    try:
        st.write("collective_records", records)
        with st.cursor() as con:
            (c,) = comm_shares(con, ["0xc"], (T_END - window_s * S) * 1000, T_END * 1000)
        assert c.crosses_nodes
        return c.share
    finally:
        st.close()


def test_a_deployment_two_minutes_old_is_not_diluted_by_a_fifteen_minute_window() -> None:
    # 40 ms of every 100 ms in all-reduce for the last 120 s: duty cycle 0.4
    recs = _records(T_END - 120 * S, 120, 0.1, 40_000)
    assert _share(recs, 900) == pytest.approx(0.4, rel=0.01)


def test_a_sample_of_the_calls_gives_the_same_duty_cycle() -> None:
    # only every 50th call kept (a dump every 5 s): the sequence numbers still count all of them
    recs = _records(T_END - 600 * S, 600, 0.1, 25_000, sample=50)
    assert _share(recs, 900) == pytest.approx(0.25, rel=0.02)


def test_records_that_fill_the_window_keep_their_share() -> None:
    recs = _records(T_END - 900 * S + 1, 900, 0.5, 50_000, sample=10)
    assert _share(recs, 900) == pytest.approx(0.1, rel=0.02)


def test_without_a_spread_of_times_the_whole_window_is_the_denominator() -> None:
    # one dump time for every record: when the 600 calls of 30 ms were made is unknown, so they
    # are spread over the 900 s asked for (18 s of 900)
    recs = _records(T_END - 60 * S, 60, 0.1, 30_000, dump_only=True)
    assert _share(recs, 900) == pytest.approx(18 / 900, rel=0.01)


def test_the_share_never_exceeds_one() -> None:
    # overlapping records (exec longer than the spacing) are capped: a share is a part of the time
    recs = _records(T_END - 100 * S, 100, 0.1, 300_000)
    assert _share(recs, 900) == 1.0
