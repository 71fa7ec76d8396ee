"""The terminal report: each deployment's zone with its evidence, stragglers with causes, the plan.

Built from the analyzer over a store connection (``demo_report``) and rendered as text
(``render_report``). The numbers are the analyzer's; this module only chooses and formats.
Percentiles come from histogram buckets and are labelled as estimates.
"""

from __future__ import annotations

from typing import Any

import duckdb

from analyzer import planner, stragglers
from analyzer.deployments import list_deployments
from analyzer.report import build_report, latest_ns, plan_for_deployment
from analyzer.thresholds import Thresholds

NS = 1_000_000_000


def demo_report(
    con: duckdb.DuckDBPyConnection, window_s: float | None = None, th: Thresholds | None = None
) -> dict[str, Any]:
    """Envelope verdicts, stragglers and plans; the window defaults to the second half of what is
    stored, so that a ``previous_window`` regression baseline is the first half."""
    end_ns = latest_ns(con)
    if end_ns is None:
        return {"deployments": [], "stragglers": {}, "plans": {}}
    if window_s is None:
        row = con.execute("SELECT min(ts_ns) FROM engine_samples").fetchone()
        window_s = max((end_ns - int(row[0])) / NS / 2, 1.0) if row and row[0] else 60.0
    deps = list_deployments(con)
    report = build_report(con, deps, end_ns, window_s, th)
    report["stragglers"] = stragglers.analyze(con)
    report["plans"] = {}
    for dep in deps:
        try:
            report["plans"][dep.name] = plan_for_deployment(con, dep.name)
        except (ValueError, KeyError) as exc:
            report["plans"][dep.name] = {"error": str(exc)}
    return report


def render_report(report: dict[str, Any]) -> str:
    """Plain-text rendering for a terminal."""
    lines = ["", "== Envelope: which wall each deployment is against =="]
    for d in report.get("deployments", []):
        lines += _deployment_lines(d)
    lines += ["", "== Stragglers (blame by arrival skew) =="]
    lines += _straggler_lines(report.get("stragglers", {}))
    lines += ["", "== Re-parallelization plan =="]
    for name, plan in report.get("plans", {}).items():
        lines += _plan_lines(name, plan)
    return "\n".join(lines)


def _deployment_lines(d: dict[str, Any]) -> list[str]:
    env = d["envelope"]
    dep = d["deployment"]
    second = f", secondary {env['secondary']}" if env.get("secondary") else ""
    lay = dep.get("layout", {})
    shape = f"TP{lay.get('tp', 1)}·PP{lay.get('pp', 1)}·DP{lay.get('dp', 1)}"
    out = [f"{dep['name']} ({dep.get('model', '')}, {shape}): {env['primary'].upper()}{second}  "
           f"confidence {env['confidence']:.2f}"]  # fmt: skip
    for e in env["evidence"]:
        if e["verdict"] in ("pass", "near") and e["zone"] in (env["primary"], env.get("secondary")):
            thr = "" if e["threshold"] is None else f" {e['compared_with']} {e['threshold']}"
            out.append(
                f"    {e['verdict']:>4}  {e['signal']} = {e['value']} {e['unit']}{thr}  [{e['source']}]"
            )
    reg = d.get("regression") or {}
    for m in reg.get("metrics", []):
        if m.get("verdict") == "regressed":
            moved = ", ".join(a["axis"] for a in reg.get("axes", []) if a.get("moved")) or "no axis moved"
            first = f"; moved first: {reg['moved_first']}" if reg.get("moved_first") else ""
            used = reg.get("baseline_mode_used") or "baseline"
            vs = f"{m['now_s']:.3f} s vs {used} {m['baseline_s']:.3f} s"
            out.append(f"    p99 {m['metric']} regressed: {vs} (bucket estimates); moved: {moved}{first}")
    if reg.get("fallback_reason"):
        out.append(f"    regression baseline: {reg.get('baseline_mode_used')} ({reg['fallback_reason']})")
    for miss in env.get("missing", []):
        out.append(f"    missing: {miss}")
    return out


def _straggler_lines(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for origin, found in sorted(result.get("origins", {}).items()):
        for s in found:
            where = f"{s.get('host', '?')} GPU {s.get('gpu', '?')}"
            share = f"{s.get('persistence', 0):.0%} of windows"
            head = f"{origin} {s.get('comm_id', '')}: rank {s['rank']} = {where}"
            out.append(f"{head}, {s.get('kind', '')} ({share}), blame {s.get('blame_us', 0):.0f} µs"
                       f" — cause: {s.get('cause')}")  # fmt: skip
            for ev in s.get("evidence", [])[:4]:
                peers = ev.get("peers_median")
                out.append(f"    {ev.get('metric')}: culprit {ev.get('culprit')} vs peers {peers}")
    return out or ["no straggler: no rank's blame stands out from its peers"]


def _plan_lines(name: str, plan: dict[str, Any]) -> list[str]:
    if "error" in plan:
        return [f"{name}: no plan ({plan['error']})"]
    best = plan["candidates"][0] if plan.get("candidates") else None
    head = f"{name}: {plan.get('verdict', '')}"
    if best is None:
        return [head]
    return [head, f"    best: {best['layout']} — " + "; ".join(best.get("reasons", [])[:3])]


__all__ = ["demo_report", "planner", "render_report"]
