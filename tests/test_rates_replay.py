"""Counter rates of replayed scrapes (collector.rates rule 7): batches that share their series
lists with the batch before take their previous points by position, and give exactly the rates
and the remembered state that the row-by-row rules 1-6 give.

The reference is the same sequence with every series list copied, so no two batches share a
list and every row goes through the per-series lookup. The sequences are hand-built: a counter
growing, a reset, a scrape repeated at the same time, one from the past, a NULL value, a change
of shape (a series more), and a state bound smaller than the scrape."""

from __future__ import annotations

from typing import Any

from collector.batch import Batch
from collector.formats.scrape import ScrapeCache, parse_scrape, replay_scrape
from collector.rates import CounterRates
from collector.records import batch
from tests.conftest import DATA

S = 1_000_000_000
CONCEPTS = ["requests_total", "kv_usage", "tokens_total", "latency_sum", "latency_count"]


def _scrape(ids: dict[str, list[Any]], ts: int, values: list[Any]) -> Batch:
    """One engine scrape at ``ts`` whose series columns are the lists in ``ids`` (shared)."""
    n = len(values)
    base = batch("engine_samples", {"ts_ns": [ts] * n, "value": values, **ids})
    data = {c: ids.get(c, v) for c, v in base.data.items()}
    return Batch("engine_samples", data, n, unique=True)


def _ids(concepts: list[str]) -> dict[str, list[Any]]:
    n = len(concepts)
    return {"source": ["vllm"] * n, "engine": ["vllm"] * n, "model": ["m"] * n, "concept": list(concepts)}


def _copied(rows: Batch) -> Batch:
    return Batch(rows.table, {c: list(v) for c, v in rows.data.items()}, rows.height, unique=rows.unique)


def _run(scrapes: list[Batch], max_series: int = 100_000) -> tuple[list[list[Any]], list[Any], list[Any]]:
    """Rates of each scrape with lists shared and with lists copied, and both remembered states."""
    shared, copied = CounterRates(max_series=max_series), CounterRates(max_series=max_series)
    got, want = [], []
    for rows in scrapes:
        got.append(shared.apply(rows)["rate_per_s"])
        want.append(copied.apply(_copied(rows))["rate_per_s"])
    assert got == want
    assert len(shared) == len(copied)  # len settles what the replayed batches owe the state
    return got, list(shared._last.items()), list(copied._last.items())


def test_replayed_scrapes_give_the_row_by_row_rates_and_state() -> None:
    ids = _ids(CONCEPTS)
    more = _ids([*CONCEPTS, "preemptions_total"])
    scrapes = [
        _scrape(ids, 10 * S, [100.0, 0.5, 1000.0, 2.0, 4.0]),
        _scrape(ids, 11 * S, [110.0, 0.6, 1500.0, 3.0, 6.0]),  # +10/s, +500/s, +1/s, +2/s
        _scrape(ids, 13 * S, [5.0, 0.7, 1600.0, 3.0, 6.0]),  # requests reset: NULL; 2 s apart
        _scrape(ids, 13 * S, [9.0, 0.7, 1700.0, 3.5, 7.0]),  # the same time again: NULL, not kept
        _scrape(ids, 12 * S, [1.0, 0.7, 1.0, 1.0, 1.0]),  # from the past: NULL, not kept
        _scrape(ids, 14 * S, [7.0, 0.8, 1800.0, 4.0, 8.0]),
        _scrape(ids, 15 * S, [8.0, None, 1900.0, 5.0, 9.0]),  # a NULL gauge: row by row
        _scrape(ids, 16 * S, [9.0, 0.9, 2000.0, 6.0, 10.0]),
        _scrape(more, 17 * S, [10.0, 0.9, 2100.0, 7.0, 11.0, 1.0]),  # another shape
        _scrape(more, 18 * S, [12.0, 0.9, 2200.0, 8.0, 12.0, 3.0]),
        _scrape(ids, 19 * S, [13.0, 0.9, 2300.0, 9.0, 13.0]),  # back to the first lists
    ]
    got, shared, copied = _run(scrapes)
    assert got[1] == [10.0, None, 500.0, 1.0, 2.0]
    assert got[2] == [None, None, 50.0, 0.0, 0.0]  # the reset, then per second over 2 s
    assert got[3] == [None] * 5 and got[4] == [None] * 5
    assert got[5] == [2.0, None, 200.0, 1.0, 2.0]  # from the 13 s scrape kept before the repeats
    assert got[9][5] == 2.0 and got[8][5] is None  # the new series' first point, then its rate
    assert shared == copied  # the same series remembered, in the same order, with the same points


def test_a_state_bound_smaller_than_the_scrape_is_kept_row_by_row() -> None:
    ids = _ids(CONCEPTS)
    scrapes = [_scrape(ids, (10 + k) * S, [float(k), 0.5, 10.0 * k, k + 1.0, k + 2.0]) for k in range(4)]
    got, shared, copied = _run(scrapes, max_series=2)
    assert shared == copied and len(shared) == 2
    # four counters through a state of two: each is forgotten before its next point comes
    assert got[3] == [None] * 5


def test_replay_of_a_real_vllm_body_matches_the_full_path() -> None:
    """The sidecar's own path: replayed scrapes of a captured vLLM body with moving counters."""
    body = (DATA / "engine" / "vllm_0.33.0_dp2.prom").read_text()
    cache = ScrapeCache()
    shared, copied = CounterRates(), CounterRates()
    replayed = 0
    for k in range(4):
        text = "\n".join(_grown(line, k) for line in body.split("\n")).encode()
        ts = (100 + k) * S
        parsed = replay_scrape(text, kind="engine", ts_ns=ts, host="h", source="vllm", cache=cache)
        replayed += parsed is not None
        if parsed is None:
            parsed = parse_scrape(text, kind="engine", ts_ns=ts, host="h", source="vllm", cache=cache)
        rows = parsed.batches["engine_samples"]
        assert isinstance(rows, Batch)
        got, want = shared.apply(rows)["rate_per_s"], copied.apply(_copied(rows))["rate_per_s"]
        assert got == want
        if k:
            assert any(r not in (None, 0.0) for r in got)  # counters moved: real rates
            assert shared._pending is not None  # rule 7's path, not the lookup per row
    assert replayed == 3 and len(shared) == len(copied)
    assert list(shared._last.items()) == list(copied._last.items())


def _grown(line: str, k: int) -> str:
    """A counter line of the body with its value grown by ``k`` (gauges kept)."""
    if line.startswith("#") or " " not in line:
        return line
    head, _, value = line.rpartition(" ")
    name = head.split("{", 1)[0]
    if not name.endswith(("_total", "_sum", "_count")):
        return line
    return f"{head} {float(value) + 3.0 * k}"
