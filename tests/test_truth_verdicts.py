"""Each truth-set scenario against the verdict of ``ioe analyze --json`` (issue 18, part 3).

The scenarios come from tests/truthgen (first-principles physics, real formats, no IOE code); the
verdict comes from the CLI over a store built by the real ingest path. A scenario today's rules get
wrong is marked ``xfail(strict=True)`` with why the rule misfires: when the rules are fixed the test
passes, strict xfail turns that into a failure, and the mark must be removed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from truth_store import analyze_json, build
from truthgen.scenarios import Scenario, build_all

SCENARIOS = build_all()


def _xfail(why: str) -> Any:
    return pytest.mark.xfail(strict=True, reason=f"issue 18: {why}")


# Verdicts today's analyzer gets wrong, and why its rule misfires (none since the issue 18 rules).
KNOWN_WRONG: dict[str, str] = {}
KNOWN_WRONG_WINDOWS: dict[tuple[str, int], str] = {}


def _primary(report: dict[str, Any], sc: Scenario) -> tuple[str, float]:
    deps = report["deployments"]
    assert [d["deployment"]["name"] for d in deps] == [sc.name], "one declared deployment per store"
    env = deps[0]["envelope"]
    return str(env["primary"]), float(env["confidence"])


def _params() -> list[Any]:
    out = []
    for name in sorted(SCENARIOS):
        marks = [_xfail(KNOWN_WRONG[name])] if name in KNOWN_WRONG else []
        if SCENARIOS[name].expected.windows:
            continue  # judged per window below
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _params())
def test_cli_verdict_matches_the_expert(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    sc = SCENARIOS[name]
    _, store, report = build(sc, tmp_path_factory.getbasetemp() / "truth")
    assert report.problems == []
    zone, _ = _primary(analyze_json(store, window_s=sc.duration_s), sc)
    assert zone == sc.expected.zone, f"{name}: expected {sc.expected.zone} ({sc.expected.reason})"


def _window_params() -> list[Any]:
    out = []
    for name in sorted(SCENARIOS):
        for i, _ in enumerate(SCENARIOS[name].expected.windows):
            why = KNOWN_WRONG_WINDOWS.get((name, i))
            out.append(pytest.param(name, i, marks=[_xfail(why)] if why else [], id=f"{name}-w{i}"))
    return out


@pytest.mark.parametrize(("name", "index"), _window_params())
def test_cli_verdict_follows_the_wall_per_window(
    name: str, index: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sc = SCENARIOS[name]
    w = sc.expected.windows[index]
    _, store, _ = build(sc, tmp_path_factory.getbasetemp() / "truth")
    report = analyze_json(store, window_s=w.end_s - w.start_s, at_s=sc.t0 + w.end_s)
    zone, _ = _primary(report, sc)
    assert zone == w.zone, f"{name} [{w.start_s:g}, {w.end_s:g}) s: expected {w.zone}"


def test_verdicts_doc_is_current(tmp_path_factory: pytest.TempPathFactory) -> None:
    """docs/verdicts.md is what scripts/gen_verdicts_doc.py writes from today's verdicts."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "gen_verdicts_doc", root / "scripts" / "gen_verdicts_doc.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.render_doc(tmp_path_factory.getbasetemp() / "truth")
    assert (root / "docs" / "verdicts.md").read_text() == text, "run scripts/gen_verdicts_doc.py"


STEADY = sorted(n for n, sc in SCENARIOS.items() if not sc.expected.windows and "ramp" not in n)


@pytest.mark.parametrize("name", STEADY)
def test_a_steady_state_gets_one_zone_for_5_10_and_15_minute_windows(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A steady capture judged over its last 5 minutes, its whole 10, and a 15-minute window that
    starts 5 minutes before it: the same zone each time."""
    sc = SCENARIOS[name]
    _, store, _ = build(sc, tmp_path_factory.getbasetemp() / "truth")
    end = sc.t0 + sc.duration_s
    zones = {w: _primary(analyze_json(store, window_s=w, at_s=end), sc)[0] for w in (300.0, 900.0)}
    assert zones == {300.0: sc.expected.zone, 900.0: sc.expected.zone}


def test_pd_kv_transfer_share_from_spans_is_network_evidence(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The P/D scenario's decode server sends request spans (OTLP/JSON files through `ioe ingest`):
    their KV-transfer time is most of TTFT, and the envelope counts it for the network wall."""
    sc = SCENARIOS["pd_slow_kv_transfer"]
    _, store, report = build(sc, tmp_path_factory.getbasetemp() / "truth")
    assert report.rows["request_spans"] > 100
    env = analyze_json(store, window_s=sc.duration_s)["deployments"][0]["envelope"]
    (kv,) = [e for e in env["evidence"] if e["signal"] == "kv_transfer_share_of_ttft"]
    assert kv["verdict"] == "pass" and kv["value"] > 0.8
    assert kv["source"].startswith("request spans")
