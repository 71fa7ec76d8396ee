"""The regression's baseline is picked from the deployment's history start read only as far as the
choice needs it (regression rule 2, ``baseline_for``), with the same answer as from the first
sample itself (``pick_baseline(history_start(...))``).

The telemetry is hand-built (``build`` of test_regression_axes: one engine scraped every 5 s from
``T0`` for an hour), plus, where a case asks for it, an island of earlier samples two and a half
hours before with nothing between: a history whose probe hour (the hour up to the latest start that
still serves the asked baseline) can hold a sample, hold none while the history starts earlier, or
start after it. Why each expected answer holds is stated by each case."""

from __future__ import annotations

import pytest
from test_regression_axes import SOURCE, T0, Phase, build

from analyzer.deployments import list_deployments
from analyzer.regression import baseline_for, history_start, pick_baseline
from analyzer.thresholds import Thresholds
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
END = T0 + 3600 * NS


def _store(island: bool) -> Store:
    st = build([Phase(3600)])
    if island:  # KV usage every 5 s over (T0 - 3 h, T0 - 2.5 h]: then nothing until T0
        _write_island(st, SOURCE, "llama8b")
    return st


def _write_island(st: Store, source: str, model: str) -> None:
    """KV usage of ``source``'s engine 0 every 5 s over (T0 - 3 h, T0 - 2.5 h]."""
    ident = {"source": source, "engine": "0", "model": model, "dp_rank": -1}
    rows = [
        {**ident, "ts_ns": T0 - 10800 * NS + k * 5 * NS, "concept": "kv_usage_ratio", "value": 0.4,
         "rate_per_s": None}
        for k in range(1, 361)
    ]  # fmt: skip
    st.write("engine_samples", frame("engine_samples", rows))


CASES = [
    # (island, window seconds, mode, coverage ratio, expected mode used, a fallback reason?)
    (False, 900, "previous_window", 0.5, "previous_window", False),  # history covers the previous 15 min
    (False, 1800, "previous_window", 0.99, "previous_window", False),  # 1,795 of 1,800 s: 99.7 %
    (False, 1800, "previous_window", 1.0, "previous_window", True),  # ... not 100 %: nothing serves
    (False, 900, "day_before", 0.5, "previous_window", True),  # no sample a day before: falls back
    (False, 2700, "previous_window", 0.3, "previous_window", False),  # 895 of 2,700 s: 33 % >= 30 %
    (False, 2700, "previous_window", 0.5, "previous_window", True),  # 33 % < 50 %: nothing serves
    (True, 900, "day_before", 0.5, "previous_window", True),  # the island is not a day back either
    (True, 3600, "previous_window", 0.5, "previous_window", False),  # starts 3 h back: covered
    (True, 1800, "trailing_7d", 0.05, "previous_window", True),  # 3.5 h of 7 d: 2 %; the day before: 0
]


@pytest.mark.parametrize(("island", "window_s", "mode", "ratio", "used", "reason"), CASES)
def test_the_baseline_equals_the_one_picked_from_the_first_sample(
    island: bool, window_s: int, mode: str, ratio: float, used: str, reason: bool
) -> None:
    th = Thresholds(regression_baseline=mode, regression_baseline_min_coverage_ratio=ratio)
    start = END - window_s * NS
    st = _store(island)
    with st.cursor() as con:
        dep = list_deployments(con)[0]
        first = history_start(con, dep)
        got = baseline_for(con, dep, start, END, th)
    assert first == (T0 - 10800 * NS + 5 * NS if island else T0 + 5 * NS)
    assert got == pick_baseline(first, start, END, th)
    assert got[0] == used and (got[2] is not None) == reason


def test_the_probe_hour_in_the_gap_reads_the_first_sample() -> None:
    """A 2 h window from ``T0 - 1 h``: its previous window ``(T0 - 3 h, T0 - 1 h]`` is covered from
    the island's first sample (``T0 - 3 h + 5 s``: all but 5 s). At 95 % the latest start that
    serves is ``T0 - 2 h 54 min``, and the hour up to it holds the island: the probe settles it.
    At 20 % it is ``T0 - 1 h 24 min``, whose hour lies in the gap: the first sample is read."""
    st = _store(True)
    start = END - 2 * 3600 * NS
    with st.cursor() as con:
        dep = list_deployments(con)[0]
        for ratio in (0.95, 0.2):
            th = Thresholds(
                regression_baseline="previous_window", regression_baseline_min_coverage_ratio=ratio
            )
            got = baseline_for(con, dep, start, END, th)
            assert got == pick_baseline(history_start(con, dep), start, END, th)
            assert got == ("previous_window", (start - 2 * 3600 * NS, start), None)


def test_the_first_sample_when_another_deployment_started_the_store() -> None:
    """Another model's engine (``other-engine-0``) scraped from three hours before ``T0`` starts
    the store; this deployment's first sample is still ``T0 + 5 s`` (``build``'s first scrape).
    The store's first minute holds none of this deployment's samples, so every point is read;
    where this deployment is the one that starts the store (the island, its own source), the first
    minute answers. Both as the full read of every point (``min`` over the sources' points)."""
    for other in (True, False):
        st = build([Phase(3600)])
        _write_island(st, "other-engine-0" if other else SOURCE, "other8b" if other else "llama8b")
        with st.cursor() as con:
            dep = next(d for d in list_deployments(con) if SOURCE in {k.split("|")[0] for k in d.engine_keys})
            first = history_start(con, dep)
            scan = con.execute("SELECT min(ts_ns) FROM engine_samples WHERE source = ?", [SOURCE]).fetchone()
        assert first == (T0 + 5 * NS if other else T0 - 10800 * NS + 5 * NS)
        assert scan is not None and first == scan[0]
