"""The per-target scrape cache (scrape rule 5) changes the cost of a scrape, never its rows.

Real fixture bodies are scraped several times through one :class:`ScrapeCache` while their
values, HELP/TYPE lines and label sets change; every result must equal a cold parse.
"""

from __future__ import annotations

import re

import polars as pl
from polars.testing import assert_frame_equal

from collector.formats.scrape import ScrapeCache, parse_scrape
from tests.conftest import DATA

DCGM = (DATA / "dcgm" / "h100x8_k8s_pod_labels.prom").read_text()
VLLM = (DATA / "engine" / "vllm_0.33.0_dp2.prom").read_text()
SGLANG = (DATA / "engine" / "sglang_0.5.23.prom").read_text()
GPU1_POWER = 'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"'
POD = "vllm-agg-0-vllmdecodeworker-s65j5"


def _same(body: str, cache: ScrapeCache, ts_ns: int, kind: str = "auto") -> dict[str, pl.DataFrame]:
    warm = parse_scrape(body, kind=kind, ts_ns=ts_ns, host="node-a", source="t", cache=cache)  # type: ignore[arg-type]
    cold = parse_scrape(body, kind=kind, ts_ns=ts_ns, host="node-a", source="t")  # type: ignore[arg-type]
    assert warm.problems == cold.problems
    assert warm.tables.keys() == cold.tables.keys()
    for table in cold.tables:
        assert_frame_equal(warm.tables[table], cold.tables[table])
    return warm.tables


def _bump(body: str, by: float) -> str:
    """Every sample value + ``by`` (label sets and comments untouched)."""
    return re.sub(r"(?m)^([^#\n].*[ }])(-?[0-9.e+]+)$", lambda m: f"{m[1]}{float(m[2]) + by}", body)


def test_values_move_with_a_warm_cache() -> None:
    cache = ScrapeCache()
    first = _same(DCGM, cache, 1_000_000_000)
    assert f"{GPU1_POWER}," in DCGM and DCGM.count("68.347000") == 1
    second = _same(DCGM.replace("68.347000", "250.5"), cache, 2 * 10**9)
    power = lambda rows: rows.filter((pl.col("gpu") == 1) & (pl.col("metric") == "power_w"))["value"].item()  # noqa: E731
    assert power(first["gpu_samples"]) == 68.347  # W, as scraped
    assert power(second["gpu_samples"]) == 250.5  # the new value, not the cached series' old one
    assert second["gpu_samples"]["ts_ns"].unique().to_list() == [2 * 10**9]
    assert len(cache.gpu) == first["gpu_samples"].height  # one identity per series


def test_engine_bodies_equal_cold_parse_across_scrapes() -> None:
    for body in (VLLM, SGLANG):
        cache = ScrapeCache()
        for step in range(3):
            tables = _same(_bump(body, step * 2.0), cache, (step + 1) * 10**9, kind="engine")
        assert tables["histogram_buckets"].height > 100
        assert cache.parse.comments is not None  # HELP/TYPE of the clean body were memoized


def test_changed_type_lines_are_not_reused() -> None:
    cache = ScrapeCache()
    _same(VLLM, cache, 1)
    retyped = VLLM.replace(
        "# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_running counter"
    )
    assert retyped != VLLM
    warm = parse_scrape(retyped, kind="engine", ts_ns=2, source="t", cache=cache)
    cold = parse_scrape(retyped, kind="engine", ts_ns=2, source="t")
    assert_frame_equal(warm.tables["engine_samples"], cold.tables["engine_samples"])


def test_a_bad_line_after_clean_scrapes_is_reported_the_same() -> None:
    cache = ScrapeCache()
    _same(VLLM, cache, 1)
    broken = VLLM + 'vllm:num_requests_waiting{engine="0",model_name="m"} not-a-number\n'
    tables = _same(broken, cache, 2)
    assert tables["engine_samples"].height > 0  # the good rows are kept
    again = parse_scrape(broken, kind="engine", ts_ns=3, source="t", cache=cache)
    assert len(again.problems) == 1
    assert again.problems[0].location == f"t: line {VLLM.count(chr(10)) + 1}"
    assert again.problems[0].message.startswith("bad value 'not-a-number' (rule 4)")


def test_cache_is_bounded_when_label_sets_keep_changing() -> None:
    cache = ScrapeCache(max_series=50)
    for step in range(10):  # a new pod name each time: 4 new GPU-0 series per scrape
        _same(DCGM.replace(POD, f"{POD}-{step}"), cache, step + 1)
        assert len(cache.gpu) <= 50 + 4  # cleared whole before a scrape once past 50
    unbounded = ScrapeCache()
    for step in range(10):
        _same(DCGM.replace(POD, f"{POD}-{step}"), unbounded, step + 1)
    assert len(unbounded.gpu) == 30 + 9 * 4  # what the bound prevents from growing


def _replays(cache: ScrapeCache, body: str, kind: str, ts_ns: int) -> bool:
    """Whether this scrape was answered by replay (scrape rule 6): the full path never ran."""
    import collector.formats.scrape as scrape

    calls: list[int] = []
    real = scrape.parse

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.extend([1] if kwargs.get("cache") is not None else [])  # the warm scrape's full path
        return real(*args, **kwargs)

    scrape.parse = counted  # type: ignore[assignment]
    try:
        _same(body, cache, ts_ns, kind)
    finally:
        scrape.parse = real
    return not calls


def test_same_shape_bodies_are_replayed_with_the_full_paths_rows() -> None:
    for body, kind in ((DCGM, "dcgm"), (VLLM, "engine"), (SGLANG, "engine"), (VLLM + DCGM, "auto")):
        cache = ScrapeCache()
        assert not _replays(cache, body, kind, 10**9)  # first scrape: full path, then learned
        assert cache.replay is not None
        for step in range(1, 4):  # values move, shape stays: replayed, rows equal a cold parse
            assert _replays(cache, _bump(body, step * 0.01), kind, (step + 1) * 10**9)


def test_values_the_mappers_refuse_take_the_full_path() -> None:
    kv = re.search(r"(?m)^(vllm:(?:kv|gpu)_cache_usage_perc\{[^}]*\}) (\S+)$", VLLM)
    assert kv is not None
    refused = [
        (DCGM, "dcgm", DCGM.replace("68.347000", "NaN")),  # non-finite
        (DCGM, "dcgm", DCGM.replace("68.347000", "1e15")),  # DCGM blank sentinel
        (VLLM, "engine", VLLM.replace(kv[0], f"{kv[1]} 1.5")),  # KV usage outside 0..1
    ]
    for body, kind, bad in refused:
        cache = ScrapeCache()
        _same(body, cache, 10**9, kind)
        assert not _replays(cache, bad, kind, 2 * 10**9)  # same shape, but the full path ran
        assert cache.replay is None  # a scrape with problems is not learned
        assert not _replays(cache, body, kind, 3 * 10**9)
        assert _replays(cache, _bump(body, 0.01), kind, 4 * 10**9)


def test_a_new_label_set_or_timestamp_is_not_replayed() -> None:
    cache = ScrapeCache()
    _same(DCGM, cache, 10**9, "dcgm")
    assert not _replays(cache, DCGM.replace(POD, "vllm-agg-0-other"), "dcgm", 2 * 10**9)
    stamped = DCGM.replace("68.347000", "68.347000 1767225600000")
    assert not _replays(cache, stamped, "dcgm", 3 * 10**9)


def test_replay_scrape_alone_answers_only_what_replays() -> None:
    from collector.formats.scrape import REPLAY_MAX_BYTES, replay_scrape

    where = {"kind": "engine", "host": "node-a", "source": "t"}
    cache = ScrapeCache()
    body = VLLM.encode()
    assert replay_scrape(body, ts_ns=1, cache=cache, **where) is None  # nothing remembered yet
    parse_scrape(body, ts_ns=1, cache=cache, **where)  # type: ignore[arg-type]
    moved = _bump(VLLM, 0.01).encode()
    got = replay_scrape(moved, ts_ns=2, cache=cache, **where)
    cold = parse_scrape(moved, ts_ns=2, **where)  # type: ignore[arg-type]
    assert got is not None and got.problems == [] and got.tables.keys() == cold.tables.keys()
    for table, frame in cold.tables.items():
        assert_frame_equal(got.tables[table], frame)
    assert replay_scrape(moved, ts_ns=3, cache=cache, **{**where, "source": "other"}) is None
    assert (
        replay_scrape(VLLM.replace('engine="1"', 'engine="9"').encode(), ts_ns=3, cache=cache, **where)
        is None
    )
    assert replay_scrape(moved + b"#" * REPLAY_MAX_BYTES, ts_ns=3, cache=cache, **where) is None


def test_skeleton_gives_body_shapes_values_or_none() -> None:
    from collector.formats.exposition import Skeleton, body_shape

    for body in (DCGM, VLLM, SGLANG, VLLM + DCGM):
        learned = Skeleton.learn(body)
        assert learned is not None
        skeleton, values = learned
        assert values == body_shape(body)[1]  # type: ignore[index]
        moved = _bump(body, 0.5)
        assert skeleton.values(moved) == body_shape(moved)[1]  # type: ignore[index]
    skeleton = Skeleton.learn(DCGM)[0]  # type: ignore[index]
    line = next(x for x in DCGM.splitlines() if x.startswith(GPU1_POWER))
    prefix, _, value = line.rpartition(" ")
    near_misses = {
        "a value with _ (the parser refuses it)": f"{prefix} 1_0",
        "a timestamp after the value": f"{prefix} {value} 1767225600000",
        "a tab before a timestamp": f"{prefix} {value}\t17",
        "an exemplar": f'{prefix} {value} # {{a="b"}} 1',
        "a value glued to #": f"{prefix} {value}#",
        "no value": f"{prefix} ",
        "another label value": line.replace('gpu="1"', 'gpu="9"'),
    }
    for what, changed in near_misses.items():
        assert skeleton.values(DCGM.replace(line, changed)) is None, what
    assert skeleton.values(DCGM.replace("# SOURCE:", "# SOURCES:")) is None
    assert skeleton.values(DCGM + "\n") is None  # one more (empty) line
    assert Skeleton.learn(DCGM.replace("\n", "\r\n")) is None  # CRLF bodies are never remembered
    assert Skeleton.learn(DCGM.replace(line, f"{prefix} {value} 17")) is None  # a timestamp


def test_skeleton_byte_values_are_values_of_the_text_or_none() -> None:
    """Exposition rule 12's bytes check: the value texts of a body's bytes are those of its text
    (encoded), and a near miss is None as with the text."""
    from collector.formats.exposition import Skeleton

    for body in (DCGM, VLLM, SGLANG, VLLM + DCGM):
        skeleton = Skeleton.learn(body)[0]  # type: ignore[index]
        moved = _bump(body, 0.5)
        assert skeleton.byte_values(moved.encode()) == [v.encode() for v in skeleton.values(moved)]  # type: ignore[union-attr]
    assert not SGLANG.isascii()  # one body with a non-ASCII character, matched as bytes
    skeleton = Skeleton.learn(DCGM)[0]  # type: ignore[index]
    line = next(x for x in DCGM.splitlines() if x.startswith(GPU1_POWER))
    prefix, _, value = line.rpartition(" ")
    near_misses = (f"{prefix} 1_0", f"{prefix} {value} 17", f"{prefix} {value}#", line.replace("1", "9"))
    for changed in near_misses:
        assert skeleton.byte_values(DCGM.replace(line, changed).encode()) is None, changed
    assert skeleton.byte_values((DCGM + "\n").encode()) is None
    # a text given as str with a lone surrogate in a comment matches as text only
    odd = DCGM.replace("# SOURCE:", "# SOURCE\ud800:")
    learned = Skeleton.learn(odd)
    assert learned is not None and learned[0].values(odd) is not None
    assert learned[0].byte_values(odd.encode("utf-8", "surrogatepass")) is None


def test_replayed_bytes_give_the_full_paths_rows_or_the_full_path() -> None:
    """Scrape rule 6 over bytes: a value in another script's digits (which ``float`` of the text
    takes) and invalid UTF-8 in a comment are left to the full path, whose rows stand."""
    from collector.formats.scrape import replay_scrape

    where = {"kind": "dcgm", "host": "node-a", "source": "t"}
    line = next(x for x in DCGM.splitlines() if x.startswith(GPU1_POWER))
    prefix, _, _ = line.rpartition(" ")
    for odd in (
        DCGM.replace(line, f"{prefix} \u0661\u0662").encode(),  # Arabic-Indic 12
        DCGM.encode().replace(b"# SOURCE:", b"# SOURCE\xff:"),
    ):
        cache = ScrapeCache()
        parse_scrape(odd, ts_ns=1, cache=cache, **where)  # type: ignore[arg-type]
        assert cache.replay is not None  # learned: its text replays, its bytes do not
        assert cache.replay.skeleton.values(odd.decode("utf-8", errors="replace")) is not None
        assert replay_scrape(odd, ts_ns=2, cache=cache, **where) is None
        warm = parse_scrape(odd, ts_ns=2, cache=cache, **where)  # type: ignore[arg-type]
        cold = parse_scrape(odd, ts_ns=2, **where)  # type: ignore[arg-type]
        assert warm.problems == cold.problems and warm.tables.keys() == cold.tables.keys()
        for table, frame in cold.tables.items():
            assert_frame_equal(warm.tables[table], frame)


def test_a_target_that_keeps_replaying_lets_its_parse_memory_go(monkeypatch: object) -> None:
    """Scrape rule 8: after N replays in a row the parse memory is empty, replays go on, a body
    of another shape after that gets a cold parse's rows, and the memory fills again."""
    from collector.formats import scrape
    from collector.formats.scrape import replay_scrape

    monkeypatch.setattr(scrape, "FORGET_AFTER_REPLAYS", 3)  # type: ignore[attr-defined]
    where = {"kind": "engine", "host": "node-a", "source": "t"}
    cache = ScrapeCache()
    parse_scrape(VLLM.encode(), ts_ns=10**9, cache=cache, **where)  # type: ignore[arg-type]
    assert cache.parse.labels and cache.engine
    for step in range(1, 4):
        got = replay_scrape(_bump(VLLM, step * 0.01).encode(), ts_ns=(step + 1) * 10**9, cache=cache, **where)
        assert got is not None
        assert bool(cache.parse.labels) == (step < 3) and bool(cache.engine) == (step < 3)
    assert replay_scrape(_bump(VLLM, 0.04).encode(), ts_ns=5 * 10**9, cache=cache, **where) is not None
    other = VLLM.replace('engine="1"', 'engine="9"')
    assert replay_scrape(other.encode(), ts_ns=6 * 10**9, cache=cache, **where) is None
    assert _same(other, cache, 6 * 10**9, "engine")  # the full path, cold, gives a cold parse's rows
    assert cache.parse.labels and cache.engine and cache.replays == 0 and cache.replay is not None
