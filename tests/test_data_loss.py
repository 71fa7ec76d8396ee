"""Issue 21, data loss and wrong data (D1, D2, D4-D7): hand-built bad inputs, each with the
outcome a careful operator expects written beside it. Every case is small and bounded in time."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collector import files
from collector.batch import Batch
from collector.formats import IngestContext
from collector.formats.nccl_inspector import parse_jsonl
from collector.formats.scrape import ScrapeCache, parse_scrape
from collector.ingest import MAX_PROBLEMS_PER_FILE, IngestReport, ingest_paths
from collector.records import batch
from collector.selfmetrics import SelfMetrics
from collector.sidecar import MAX_ERRORS_PER_SCRAPE, Sidecar, SourceState
from collector.sources.http_client import HttpClient
from collector.sources.tailer import InspectorTailer, load_state
from collector.store import Retention, Store
from collector.writer import QueueSink, WriterThread
from ioe.cli import app
from ioe.settings import TargetSpec, load_settings
from tests.httpfixtures import Route, serve

GOOD_GPU = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 40\n'


def _inspector(rank: object = 0, sn: object = 1, exec_us: object = 10.0) -> str:
    return json.dumps(
        {
            "header": {"id": "0xabc", "rank": rank, "n_ranks": 2, "nnodes": 1},
            "metadata": {"hostname": "n0", "pid": 7, "dump_timestamp_us": 1},
            "coll_perf": {
                "coll": "AllReduce",
                "coll_sn": sn,
                "coll_msg_size_bytes": 8,
                "coll_exec_time_us": exec_us,
            },
        }
    )


# -- D1 / D7: values validated per line ---------------------------------------------------------
def test_gpu_index_over_32_bits_is_a_problem_naming_line_and_field_and_the_rest_is_kept() -> None:
    # gpu="3000000000" does not fit the store's INTEGER: storing it would fail the whole write
    body = GOOD_GPU + 'DCGM_FI_DEV_GPU_TEMP{gpu="3000000000",UUID="GPU-b"} 41\n'
    parsed = parse_scrape(body.encode(), ts_ns=1, source="node7:9400")
    rows = parsed.tables["gpu_samples"]
    assert rows["uuid"].to_list() == ["GPU-a"]
    (problem,) = parsed.problems
    assert problem.location.startswith("node7:9400: line 2:")
    assert "field gpu" in problem.message and "3000000000" in problem.message


def test_negative_counters_are_refused_not_turned_into_a_rate() -> None:
    # a counter never goes below zero: -5 J of energy or -3 prompt tokens is wrong data
    body = (
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-c"} -5\n'
        'vllm:prompt_tokens_total{model_name="m",engine="0"} -3\n'
        'vllm:num_requests_running{model_name="m",engine="0"} 2\n'
    )
    parsed = parse_scrape(body.encode(), ts_ns=1, source="t")
    assert "gpu_samples" not in parsed.batches
    assert parsed.tables["engine_samples"]["concept"].to_list() == ["requests_running"]
    assert [p.location.split(":")[1].strip() for p in parsed.problems] == ["line 1", "line 2"]
    assert all("negative" in p.message for p in parsed.problems)


def test_a_replayed_scrape_with_a_negative_counter_takes_the_checked_path() -> None:
    cache = ScrapeCache()
    good = b'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-c"} 5\n'
    assert not parse_scrape(good, ts_ns=1, source="t", cache=cache).problems
    assert cache.replay is not None
    again = parse_scrape(good.replace(b" 5", b" -5"), ts_ns=2, source="t", cache=cache)
    assert again.batches == {} and "negative" in again.problems[0].message


def test_out_of_range_engine_rank_and_timestamp_never_reach_the_store() -> None:
    # a rank over 32 bits is kept as text in labels with rank -1 (like any non-integer rank);
    # a timestamp past the store's 64-bit nanoseconds refuses its line
    body = (
        'vllm:num_requests_running{model_name="m",engine="99999999999"} 2\n'
        'vllm:num_requests_waiting{model_name="m",engine="0"} 1 1e30\n'
    )
    parsed = parse_scrape(body.encode(), ts_ns=1, source="t")
    row = parsed.tables["engine_samples"].row(0, named=True)
    assert row["dp_rank"] == -1 and json.loads(row["labels"]) == {"engine": "99999999999"}
    assert [p.location for p in parsed.problems] == ["t: line 2"]


def test_inspector_rank_and_coll_sn_out_of_range_are_problems_and_good_lines_stay() -> None:
    lines = [
        _inspector(),
        _inspector(rank=2**40),
        _inspector(sn=2**64),
        _inspector(sn=-1),
        _inspector(exec_us=-4),
    ]
    parsed = parse_jsonl("\n".join(lines) + "\n", "n0-pid7.log")
    assert parsed.tables["collective_records"].height == 1
    where = [p.location for p in parsed.problems]
    assert where == ["n0-pid7.log:2", "n0-pid7.log:3", "n0-pid7.log:4", "n0-pid7.log:5"]
    fields = [p.message.split(" ")[1] if p.message.startswith(":") else p.message for p in parsed.problems]
    assert (
        "header.rank" in fields[0] and "coll_perf.coll_sn" in fields[1] and "coll_perf.coll_sn" in fields[2]
    )
    assert "coll_exec_time_us" in fields[3]


# -- D1: a failing store write isolates the bad rows, per source --------------------------------
def _gpu_batch(source: str, gpus: list[int], ts_ns: int = 1) -> Batch:
    n = len(gpus)
    return batch(
        "gpu_samples",
        {
            "ts_ns": [ts_ns] * n,
            "host": [source] * n,
            "gpu": gpus,
            "uuid": [f"{source}-GPU-{i}" for i in range(n)],
            "metric": ["power_w"] * n,
            "link": [-1] * n,
            "value": [1.0] * n,
            "source": [source] * n,
        },
    )


def test_one_unstorable_row_costs_only_itself_not_the_other_targets_rows() -> None:
    # rows built past the parsers (a future reader's bug): the merged flush fails on gpu=3e9;
    # the writer must keep target a's 50 rows and b's other 49, and say which row it dropped
    store = Store()
    sink = QueueSink(100)
    errors: list[tuple[str, int]] = []
    writer = WriterThread(sink, store, flush_interval_s=60, on_error=lambda t, n, e: errors.append((t, n)))
    writer.start()
    sink.write("gpu_samples", _gpu_batch("a", list(range(50))))
    sink.write("gpu_samples", _gpu_batch("b", [*range(20), 3_000_000_000, *range(21, 50)]))
    acked: list[bool] = []
    sink.after_commit(acked.append)
    assert writer.flush_now()
    writer.stop()
    with store.cursor() as cur:
        per_source = dict(cur.execute("SELECT source, count(*) FROM gpu_samples GROUP BY 1").fetchall())
        refused = cur.execute("SELECT source, location, message FROM ingest_errors").fetchall()
    assert per_source == {"a": 50, "b": 49}
    assert errors == [("gpu_samples", 1)] and acked == [True]
    ((source, location, message),) = refused
    assert source == "b" and location == "store write to gpu_samples" and "gpu" in message


def test_a_store_failure_is_not_mistaken_for_bad_rows_and_the_ack_says_so() -> None:
    # a closed store fails every write: nothing is "isolated", the commit callback gets False
    store = Store()
    sink = QueueSink(10)
    writer = WriterThread(sink, store, flush_interval_s=60)
    store.close()
    writer.start()
    sink.write("gpu_samples", _gpu_batch("a", [0, 1]))
    acked: list[bool] = []
    sink.after_commit(acked.append)
    writer.flush_now()
    writer.stop()
    assert acked == [False]


# -- D4 / D5 / D7: ioe ingest -------------------------------------------------------------------
VLLM = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m",engine="0"}} {v}\n'


def _ingest(store: Store, *paths: Path, **ctx: object) -> IngestReport:
    return ingest_paths(store, list(paths), IngestContext(ts_ns=0, source="ingest", **ctx))  # type: ignore[arg-type]


def test_two_nodes_files_of_one_name_stay_two_series_and_reimport_adds_nothing(tmp_path: Path) -> None:
    # node0/metrics.prom and node1/metrics.prom were captured at the same instant: two engines,
    # two series. Re-importing the folder (no --ts) must not add a row: the default time is
    # each file's modification time, not "now".
    for node, value in (("node0", 3), ("node1", 5)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "metrics.prom").write_text(
            VLLM.format(v=value) + GOOD_GPU.replace("GPU-a", f"GPU-{node}")
        )
    store = Store()
    first = _ingest(store, tmp_path)
    again = _ingest(store, tmp_path)
    assert first.rows["engine_samples"] == 2 and first.rows["gpu_samples"] == 2
    assert again.rows["engine_samples"] == 0 and again.rows["gpu_samples"] == 0
    with store.cursor() as cur:
        rows = cur.execute("SELECT source, value, ts_ns FROM engine_samples ORDER BY source").fetchall()
    mtime = (tmp_path / "node0" / "metrics.prom").stat().st_mtime_ns
    assert [(s, v) for s, v, _ in rows] == [
        ("ingest:node0/metrics.prom", 3.0),
        ("ingest:node1/metrics.prom", 5.0),
    ]
    assert rows[0][2] == mtime


def test_a_cut_off_last_line_is_refused_not_stored_as_a_smaller_number(tmp_path: Path) -> None:
    # the copy was taken mid-write: "24669591596" became "24669"; still a number, but wrong
    full = 'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{gpu="0",UUID="GPU-a"} 24669591596\n'
    path = tmp_path / "dcgm.prom"
    path.write_text(full + full.replace("GPU-a", "GPU-b")[:-7])
    store = Store()
    report = _ingest(store, path)
    assert report.rows["gpu_samples"] == 1
    problem = report.problems[0]
    assert problem.location == f"{path}:2" and "no newline" in problem.message


def test_a_file_with_many_bad_lines_keeps_its_good_rows_and_says_why(tmp_path: Path) -> None:
    # 10 good samples and 6 lines of garbage (37 %): the good rows are kept and the report
    # says how much was refused, rather than calling the whole file "unrecognized"
    good = "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="GPU-{i}"}} 40\n' for i in range(10))
    path = tmp_path / "mixed.txt"
    path.write_text(good + "this is not a metric line\n" * 6)
    report = _ingest(Store(), path)
    assert report.rows["gpu_samples"] == 10 and not report.unrecognized
    assert any("6 of 16 lines refused" in p.message for p in report.problems)


def test_problems_are_bounded_per_file(tmp_path: Path) -> None:
    path = tmp_path / "n0-pid1.log"
    path.write_text("\n".join([_inspector()] + ['{"header": {"id": "x"}, "coll_perf": 1}'] * 5000) + "\n")
    store = Store()
    report = _ingest(store, path)
    assert report.rows["collective_records"] == 1
    assert len(report.problems) <= MAX_PROBLEMS_PER_FILE + 2
    assert store.count("ingest_errors") <= MAX_PROBLEMS_PER_FILE + 2
    assert any("more problem(s) not listed" in p.message for p in report.problems)


def test_a_file_over_16_mib_is_streamed_not_refused(tmp_path: Path) -> None:
    # 20,000 GPU series with 850-byte pod labels, ~17 MiB: over the 16 MiB scrape-body cap, so
    # it must be read in chunks; every sample is stored once, and the one problem's line
    # number is the file's, not its chunk's
    n, pod = 20_000, "p" * 850
    path = tmp_path / "big.prom"
    with path.open("w") as fh:
        fh.write("# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n")
        fh.writelines(
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",UUID="GPU-{i:07d}",pod="{pod}"}} 40\n' for i in range(n)
        )
        fh.write("garbage line\n")
    assert path.stat().st_size > 16 << 20
    report = _ingest(Store(), path)
    assert report.rows["gpu_samples"] == n
    assert [p.location.rsplit(": ", 1)[-1] for p in report.problems] == [f"line {n + 2}"]


def test_gzip_bomb_stops_at_the_cap_and_keeps_what_came_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 MB of gzip can hold GBs; the reader streams and stops at its cap (set small here)
    monkeypatch.setattr(files, "MAX_GZIP_RATIO", 2)
    monkeypatch.setattr(files, "MIN_GZIP_CAP", 1 << 20)
    body = "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",UUID="GPU-{i:07d}"}} 40\n' for i in range(200_000))
    path = tmp_path / "bomb.prom.gz"
    path.write_bytes(gzip.compress(body.encode()))
    report = _ingest(Store(), path)
    assert 0 < report.rows["gpu_samples"] < 200_000
    assert any("passes the cap of 1,048,576 bytes" in p.message for p in report.problems)


def test_ioe_ingest_prints_problems_not_a_traceback(tmp_path: Path) -> None:
    # every input that used to crash the importer, in one folder; and a truncated store
    data = tmp_path / "in"
    data.mkdir()
    (data / "dcgm.prom").write_text(GOOD_GPU + 'DCGM_FI_DEV_GPU_TEMP{gpu="3000000000",UUID="GPU-b"} 41\n')
    (data / "vllm.prom").write_text(VLLM.format(v=1).replace('engine="0"', 'engine="99999999999999999999"'))
    (data / "n0-pid1.log").write_text(_inspector() + "\n" + _inspector(rank=2**40, sn=2**70) + "\n")
    runner = CliRunner()
    got = runner.invoke(app, ["ingest", "--store", str(tmp_path / "s.duckdb"), "--json", str(data)])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert out["rows"] == {"gpu_samples": 1, "engine_samples": 1, "collective_records": 1}
    assert len(out["problems"]) == 2
    store_file = tmp_path / "s.duckdb"
    size = store_file.stat().st_size
    with store_file.open("r+b") as fh:
        fh.truncate(size // 2)
    bad = runner.invoke(app, ["ingest", "--store", str(store_file), str(data)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert bad.stderr.startswith(f"ioe ingest: store {store_file}")


# -- D6: a target sending garbage is down, and what it costs the store is bounded ---------------
def test_a_garbage_target_is_down_with_a_reason_and_its_errors_are_bounded_and_pruned(tmp_path: Path) -> None:
    # 500 lines of garbage and 2 good samples: the target is not "up", the reason says why,
    # and one scrape stores at most MAX_ERRORS_PER_SCRAPE rows (a second scrape in the same
    # minute stores none); maintenance deletes them with the raw rows' retention
    body = (GOOD_GPU + "\x00\x01garbage {{{ \n" * 500 + GOOD_GPU.replace("GPU-a", "GPU-b")).encode()
    srv = serve({"/metrics": Route(body)})
    now = [10**18]
    settings = load_settings(None, args={"store_path": str(tmp_path / "s.duckdb"), "host": "n0"})
    sink, store = QueueSink(100), Store()
    car = Sidecar(settings, sink, SelfMetrics(), clock=lambda: now[0])
    spec = TargetSpec(name="junk", url=srv.url(), kind="dcgm")
    state = SourceState("junk", "dcgm", srv.url())

    async def scrape_twice() -> None:
        async with HttpClient() as client:
            await car.scrape_target(client, spec, state)
            now[0] += 5 * 10**9
            await car.scrape_target(client, spec, state)

    try:
        asyncio.run(scrape_twice())
    finally:
        srv.close()
    writer = WriterThread(sink, store, flush_interval_s=0.05)
    writer.start()
    writer.stop()
    assert not state.health.up and state.health.last_error.startswith("mostly garbage: 500 line(s) refused")
    assert store.count("gpu_samples") == 4  # the good samples of both scrapes are kept
    with store.cursor() as cur:
        up = cur.execute("SELECT up, last_error FROM targets").fetchone()
    assert up is not None and up[0] is False and "mostly garbage" in up[1]
    assert store.count("ingest_errors") == MAX_ERRORS_PER_SCRAPE
    store.maintain(now[0] + 3 * 86400 * 10**9, Retention(raw_s=86400))
    assert store.count("ingest_errors") == 0


# -- D2: the tailer saves only committed offsets ------------------------------------------------
def test_tailer_saves_an_offset_only_after_the_store_committed_the_rows(tmp_path: Path) -> None:
    # rows sit in the write queue after a poll: the saved offset must still be 0, so a kill -9
    # now rereads them; after the writer's flush the next save holds the new offset
    dump, state = tmp_path / "dump", tmp_path / "offsets.json"
    dump.mkdir()
    log = dump / "n0-pid1.log"
    log.write_text("".join(_inspector(sn=i) + "\n" for i in range(5)))
    sink, store = QueueSink(100), Store()
    tailer = InspectorTailer(dump, state, sink)
    assert tailer.poll().rows["collective_records"] == 5
    assert str(log) not in load_state(state)  # nothing committed yet
    writer = WriterThread(sink, store, flush_interval_s=60)
    writer.start()
    assert writer.flush_now()
    tailer.poll()
    assert load_state(state)[str(log)].offset == log.stat().st_size
    # a store failure sends the file back to its committed offset: the lines are read again
    with log.open("a") as fh:
        fh.write(_inspector(sn=5) + "\n")
    writer.stop()
    store.close()
    failing = QueueSink(100)
    tailer.sink = failing
    tailer.poll()
    dead = WriterThread(failing, store, flush_interval_s=60)
    dead.start()
    dead.flush_now()
    dead.stop()
    assert tailer.files[str(log)].offset == load_state(state)[str(log)].offset < log.stat().st_size
