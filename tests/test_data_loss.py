"""Issue 21, data loss and wrong data (D1, D2, D4-D7): hand-built bad inputs, each with the
outcome a careful operator expects written beside it. Every case is small and bounded in time."""

from __future__ import annotations

import json

from collector.batch import Batch
from collector.formats.nccl_inspector import parse_jsonl
from collector.formats.scrape import ScrapeCache, parse_scrape
from collector.records import batch
from collector.store import Store
from collector.writer import QueueSink, WriterThread

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
