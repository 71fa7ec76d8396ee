"""The calibration table (bench/calibration.py): goals held where they are claimed, honest labels."""

from __future__ import annotations

import pytest

from analyzer import catalog, modelcfg, perf
from analyzer.capacity import Layout
from bench import calibration as cal
from bench import closed_loop


@pytest.fixture(scope="module")
def table() -> dict[tuple[str, str], dict[str, object]]:
    return {(str(r["system"]), str(r["backend"])): r for r in cal.error_table()}


def test_every_group_is_labelled_with_where_its_factors_were_fitted(table: dict) -> None:
    assert table[("h100_sxm", "trtllm")]["fit"] == "in-sample (h100_sxm)"
    assert table[("h200_sxm", "vllm")]["fit"] == "in-sample (h200_sxm)"
    assert table[("h200_sxm", "vllm")]["factors"] == "vllm/h200_sxm"
    assert table[("gb200", "trtllm")]["fit"] == "held-out (h100_sxm)"
    assert table[("b200_sxm", "trtllm")]["factors"] == "trtllm/*"
    assert sum(int(str(r["n"])) for k, r in table.items() if not k[0].startswith("all")) == 630
    assert all(r["skipped"] == 0 for r in table.values())


@pytest.mark.parametrize("group", [("h100_sxm", "sglang"), ("h100_sxm", "vllm"), ("h100_sxm", "trtllm")])
def test_groups_claimed_to_meet_the_goal_meet_it(table: dict, group: tuple[str, str]) -> None:
    # In-sample medians through the closed-loop harness when written: sglang 3.8 / 8.9 %, vllm
    # 4.9 / 13.6 %, trtllm 8.0 / 17.6 % (TPOT / TTFT); leave-one-shape-out and leave-one-model-out
    # in bench/results/calibration_cv.md (python -m bench.calibration --cv).
    assert cal.meets_goal(table[group])


@pytest.mark.parametrize(
    ("group", "tpot_bound"),
    [(("h200_sxm", "sglang"), 9.0), (("h200_sxm", "vllm"), 10.0), (("b200_sxm", "trtllm"), 10.0)],
)  # fmt: skip
def test_tpot_medians_of_the_groups_that_miss_on_ttft(
    table: dict, group: tuple[str, str], tpot_bound: float
) -> None:
    # When written: h200 sglang 6.1 %, h200 vllm 7.6 %, b200 (held out, 2 rows) 8.6 %.
    assert float(str(table[group]["tpot_median"])) < tpot_bound


def test_leave_one_shape_out_never_fits_a_shape_on_its_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [r for r in cal.read(cal.DEFAULT) if r["system"] == "h200_sxm" and r["backend"] == "vllm"]
    seen: list[set[tuple[int, int]]] = []

    def fake_fit(train: list[dict[str, str]], params: object) -> object:
        seen.append({cal._shape(r) for r in train})
        return params

    monkeypatch.setattr(cal, "fit", fake_fit)
    errs = cal.leave_one_shape_out(rows, "vllm")
    shapes = {cal._shape(r) for r in rows}
    assert len(seen) == len(shapes) == 10 and all(e is not None for e in errs)
    assert all(len(shapes - train) == 1 for train in seen)  # exactly one shape left out of each fit
    assert set.union(*(shapes - t for t in seen)) == shapes


def test_leave_one_model_out_fits_each_backend_on_the_other_model(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = cal.read(cal.DEFAULT)
    seen: list[tuple[str, set[str]]] = []

    def fake_fit(train: list[dict[str, str]], params: tuple) -> object:
        seen.append((train[0]["backend"], {cal._model_of(r) for r in train}))
        return params

    monkeypatch.setattr(cal, "fit", fake_fit)
    errs = cal.leave_one_model_out(rows)
    assert len(errs) == len(rows)
    # two models (Llama-3.1-8B, Qwen3-32B) for each of three backends: six fits, each on one model
    want = [(b, {m}) for b in ("sglang", "trtllm", "vllm") for m in ("qwen3-32b", "llama-3.1-8b")]
    assert sorted(seen, key=str) == sorted(want, key=str)


def test_h200_sglang_c512_waits_grow_where_kv_room_grows() -> None:
    """Why no KV-derived admission cap is in the model for h200 SGLang (bench/results/calibration.md,
    issue #6 round 5): on the C = 512, ISL 1000 rows the share of a request's decode time spent
    waiting before the first token, (TTFT − predicted) / (OSL × TPOT) as measured, grows with TP
    while the KV room (the model's max_sequences) grows with it; a cap from the KV token pool
    would wait least where the pool is largest. TP8 holds over 4 × 512 sequences and waits most."""
    from ioe.commands.estimate import estimate_row

    rows = [
        r for r in cal.read(cal.DEFAULT)
        if r["system"] == "h200_sxm" and r["backend"] == "sglang" and r["isl"] == "1000"
        and float(r["batch_size"]) == 512 and r["osl"] in ("500", "1000")
    ]  # fmt: skip
    by_tp: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        est = estimate_row(r)
        decode_s = int(r["osl"]) * float(r["silicon_tpot_ms"]) / 1e3
        waited = (float(r["silicon_ttft_ms"]) / 1e3 - est.ttft_s) / decode_s
        by_tp.setdefault(int(float(r["tp_size"])), []).append((waited, est.terms["max_sequences"]))
    assert sorted(by_tp) == [2, 4, 8]
    wait = {tp: min(w for w, _ in v) for tp, v in by_tp.items()}
    room = {tp: min(m for _, m in v) for tp, v in by_tp.items()}
    assert wait[2] < wait[4] < wait[8] and room[2] < room[4] < room[8]
    assert room[8] > 4 * 512 and wait[8] > 0.1


def test_closed_loop_identities_of_a_measured_row() -> None:
    # h200 SGLang TP1, ISL 1000, OSL 100, C = 160: TTFT 1612 ms, TPOT 26.98 ms measured. The loop
    # lasts 1.612 + 99 × 0.02698 = 4.283 s, so 160 clients complete 37.4 requests/s: 37.4k prompt
    # tokens/s, about one 1000-token prompt per 27 ms step, 38 % of each client's time before
    # its first token.
    rows = [
        r
        for r in cal.read(cal.DEFAULT)
        if (r["system"], r["backend"], r["tp_size"], r["isl"], r["osl"])
        == ("h200_sxm", "sglang", "1.0", "1000", "100")
    ]
    assert len(rows) == 1
    loop = closed_loop.loop_of(rows[0])
    assert loop is not None and loop.clients == 160
    assert loop.cycle_s == pytest.approx(4.283, abs=0.002)
    assert loop.requests_per_s == pytest.approx(37.36, abs=0.05)
    assert loop.prompt_tokens_per_s == pytest.approx(37_360, abs=50)
    assert loop.prompt_tokens_per_step == pytest.approx(1008, abs=2)
    assert loop.wait_share == pytest.approx(0.376, abs=0.002)
    disagg = next(r for r in cal.read(cal.DEFAULT) if r["mode"] == "disagg")
    assert closed_loop.loop_of(disagg) is None  # no single engine's step to divide by
    assert "skipped" in closed_loop.table([rows[0], disagg])


def _setup_8b_h100() -> perf.Setup:
    gpu = catalog.gpu("h100_sxm")
    topo = perf.Topology.for_gpu(gpu)
    return perf.Setup(modelcfg.load("llama-3.1-8b"), gpu, Layout(), "bf16", "vllm", topo)


def test_replay_of_one_client_is_its_prompt_step_then_its_decode_steps() -> None:
    # One client: every profiled request finds the engine idle, so its 1000-token prompt (under the
    # 1 + 1000 + 1500 budget) runs alone in one step, and its 49 other tokens come one per
    # single-sequence decode step at a context of 1000-1048 tokens.
    s = _setup_8b_h100()
    ttft, tpot = closed_loop.replay(s, 1, 1000, 50)
    assert ttft == pytest.approx(perf.step_time(s, 0, 1000, 1000, 1000)["decode_step_s"], rel=0.02)
    assert tpot == pytest.approx(perf.step_time(s, 1, 1024, 0, 1000)["decode_step_s"], rel=0.02)


def test_replayed_loop_waits_by_clients_not_by_output_length() -> None:
    # All C clients open each phase at once and every request has the same ISL and OSL, so the
    # loop stays a train of waves: the prompts of one wave share the step budget, and a request's
    # wait depends on how many prompts its wave holds (C), not on how long the decodes last (OSL).
    s = _setup_8b_h100()
    short = closed_loop.replay(s, 32, 1024, 128)[0]
    long = closed_loop.replay(s, 32, 1024, 512)[0]
    more = closed_loop.replay(s, 64, 1024, 128)[0]
    assert long == pytest.approx(short, rel=0.15)
    assert more > 1.3 * short  # 75 -> 106 ms when written


def test_measured_ttft_sits_about_twice_above_the_replayed_benchmark() -> None:
    # h100 vLLM TP8 Qwen3-32B, ISL 1024, OSL 128, C = 8-128: the benchmark replayed on the live
    # step model (no harness factor) gives the measured TPOT within 10 %, and TTFT that grows with
    # C as the measurement does, but 1.8-2.2x below it (when written: 91/49, 110/56, 141/69,
    # 194/96, 324/150 ms). The rest of the measured TTFT is not queueing for GPU work.
    rows = [
        r
        for r in cal.read(cal.DEFAULT)
        if (r["system"], r["backend"], r["isl"], r["osl"]) == ("h100_sxm", "vllm", "1024", "128")
        and r["mode"] == "agg"
        and r["tp_size"]
        and int(float(r["tp_size"])) == 8
    ]
    assert len(rows) == 5
    for r in rows:
        got = closed_loop.replay_row(r)
        assert got is not None
        ttft, tpot = got
        assert tpot == pytest.approx(float(r["silicon_tpot_ms"]) / 1e3, rel=0.10)
        assert 1.7 < float(r["silicon_ttft_ms"]) / 1e3 / ttft < 2.4
