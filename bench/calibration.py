"""Error table of the performance model against measured TTFT/TPOT (the calibration CSV).

Run: ``.venv/bin/python -m bench.calibration [CSV] [--cv] [--fit]``. Default CSV is
``tests/data/silicon/dense_calibration.csv`` (real H100/H200/B200/GB200 measurements, a subset of
NVIDIA aiconfigurator's silicon sample).

1. For each (system, backend) group: rows, rows the model could not estimate (``skipped``, never
   silently dropped), and the median / p90 absolute % error of TPOT and TTFT with the shipped
   factors (:func:`analyzer.perf.efficiency`). ``factors`` names the row of the table the group
   uses and ``fit on`` the rows that row was fitted on: a group whose own rows fitted its factors
   is ``in-sample``; a group predicted by factors fitted elsewhere is ``held-out``.
2. ``--cv``: the cross-validated error of every in-sample group. Its rows are split by
   configuration (model, precision, ISL, OSL) into up to :data:`FOLDS` folds; each fold is
   predicted by factors refitted (:func:`fit`) on the other folds from the neutral
   :func:`start` point, so no fold's own measurements touch its prediction. Held-out groups
   repeat their error (they are a prediction already).
3. ``--fit``: refit every row of :data:`FIT_ON` on all its rows and print the factors (how the
   numbers in ``analyzer/perf.py`` were produced).

Absolute % error = |predicted − measured| / measured × 100. The fit minimizes median TPOT error
+ ½ × median TTFT error of the rows by coordinate descent over :data:`GRID` (each factor on a
grid of physically plausible values, up to three passes): a handful of named factors per platform,
nothing per row or per model. The descent starts from each of :data:`STARTS` (the harness
factors burst_share, prefix_hit and slot_wait) and keeps the best.
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from analyzer import perf
from ioe.commands.estimate import estimate_row

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "silicon" / "dense_calibration.csv"
GOAL_TPOT, GOAL_TTFT = 10.0, 20.0  # issue #6: median abs % error per system and backend
FOLDS = 5

# Which measured rows each factor row of analyzer/perf.py is fitted on: the backend defaults on
# the h100_sxm rows; each platform row on its own system's rows. gb200/b200 TRT-LLM has no row of
# its own: fitted on gb200 (mostly rows whose TPOT is not monotone in concurrency) it predicted
# the held-out b200 rows at 47 % TPOT error against 11 % with the defaults, so it was not kept.
FIT_ON: dict[tuple[str, str], str] = {
    ("sglang", "*"): "h100_sxm",
    ("trtllm", "*"): "h100_sxm",
    ("vllm", "*"): "h100_sxm",
    ("sglang", "h200_sxm"): "h200_sxm",
    ("vllm", "h200_sxm"): "h200_sxm",
}

# Factors a fit may move and the plausible values it searches (fp8_kv, scheduler, chunk_tokens
# and comm_eff are facts of the backend and the link, not fitted).
GRID: dict[str, tuple[float, ...]] = {
    "mfu": (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7),
    "low_precision_scale": (0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    "hbm_eff": (0.6, 0.7, 0.8, 0.9),
    "step_overhead_s": (1e-3, 2e-3, 3e-3, 5e-3, 8e-3),
    "seq_overhead_s": (0.0, 10e-6, 20e-6, 40e-6),
    "burst_share": (0.0, 0.05, 0.1, 0.15, 0.3, 0.5, 1.0),
    "prefix_hit": (0.0, 0.25, 0.5, 0.75),
    "slot_wait": (0.0, 0.25, 0.5, 0.75, 1.0),
}

# (burst_share, prefix_hit, slot_wait): every pairing of the harness factors' valleys
STARTS = tuple((b, h, w) for w in (0.0, 0.75) for h in (0.0, 0.5) for b in (0.0, 0.15, 1.0))

MIN_GAIN = 0.1  # a descent step must lower the loss by this much (percentage points)
PARSIMONY = 1.0  # loss points a prefix-cache hit must win by (see fit)

Row = dict[str, str]
Errors = list[tuple[float, float] | None]


def start(backend: str) -> perf.Efficiency:
    """The neutral starting point of every fit: mid-grid values, the backend's facts kept."""
    base = perf.EFFICIENCY[backend]
    return dataclasses.replace(
        base, mfu=0.5, low_precision_scale=0.7, hbm_eff=0.8, step_overhead_s=3e-3, seq_overhead_s=0.0,
        burst_share=0.15, prefix_hit=0.0, slot_wait=0.0,
    )  # fmt: skip


def _pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0..1) of ``values``; NaN if empty."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _err(pred_s: float, meas_ms: str) -> float | None:
    try:
        m = float(meas_ms)
    except ValueError:
        return None
    if m <= 0 or pred_s != pred_s or pred_s == float("inf"):
        return None
    return abs(pred_s * 1e3 - m) / m * 100


def errors(rows: Iterable[Row], eff: perf.Efficiency | None = None) -> Errors:
    """(TPOT, TTFT) abs % error per row, None where the row cannot be estimated."""
    out: Errors = []
    for r in rows:
        try:
            est = estimate_row(r, eff)
        except (ValueError, KeyError):
            out.append(None)
            continue
        tpot, ttft = _err(est.tpot_s, r["silicon_tpot_ms"]), _err(est.ttft_s, r["silicon_ttft_ms"])
        out.append(None if tpot is None or ttft is None else (tpot, ttft))
    return out


def loss(errs: Errors) -> float:
    ok = [e for e in errs if e is not None]
    if not ok:
        return float("inf")
    return _pct([e[0] for e in ok], 0.5) + 0.5 * _pct([e[1] for e in ok], 0.5)


def fit(rows: list[Row], eff: perf.Efficiency) -> perf.Efficiency:
    """The best of :func:`descend` from ``eff`` with each of the harness factors' :data:`STARTS`
    (the TTFT landscape has a valley per arrival pattern — opening burst, slot handoff — which
    one descent does not cross)."""
    found = [
        descend(rows, dataclasses.replace(eff, burst_share=b, prefix_hit=h, slot_wait=w))
        for b, h, w in STARTS
    ]
    scored = [(loss(errors(rows, e)), e) for e in found]
    best = min(score for score, _ in scored)
    # Parsimony: among fits within PARSIMONY of the best, the one assuming the least prefix-cache
    # hit (it trades against mfu on prompt compute, so only a clear gain may claim a hit).
    near = [e for score, e in scored if score <= best + PARSIMONY]
    return min(near, key=lambda e: (e.prefix_hit, loss(errors(rows, e))))


def descend(rows: list[Row], eff: perf.Efficiency, passes: int = 3) -> perf.Efficiency:
    """Coordinate descent of :data:`GRID` from ``eff`` minimizing :func:`loss` on ``rows``."""
    best = loss(errors(rows, eff))
    for _ in range(passes):
        moved = False
        for name, values in GRID.items():
            for v in values:
                if v == getattr(eff, name):
                    continue
                change: dict[str, Any] = {name: v}
                trial = dataclasses.replace(eff, **change)
                score = loss(errors(rows, trial))
                if score < best - MIN_GAIN:
                    best, eff, moved = score, trial, True
        if not moved:
            break
    return eff


def _config(r: Row) -> tuple[str, str, str, str]:
    return (r["model_path"], r["precision"], r["isl"], r["osl"])


def cross_validated(rows: list[Row], backend: str, folds: int = FOLDS) -> Errors:
    """Each row's errors under factors refitted on the other folds (rows split by configuration)."""
    configs = sorted({_config(r) for r in rows})
    k = min(folds, len(configs))
    fold_of = {c: i % k for i, c in enumerate(configs)}
    out: Errors = [None] * len(rows)
    for f in range(k):
        train = [r for r in rows if fold_of[_config(r)] != f]
        test = [i for i, r in enumerate(rows) if fold_of[_config(r)] == f]
        eff = fit(train, start(backend)) if train else start(backend)
        for i, e in zip(test, errors([rows[i] for i in test], eff), strict=True):
            out[i] = e
    return out


def _factors_key(backend: str, system: str) -> tuple[str, str]:
    """The row of the factor table a (backend, system) uses."""
    shipped = perf.efficiency(backend, system, harness=True)
    for key in ((backend, system), *((b, s) for b, s in FIT_ON if b == backend)):
        if key in perf.PLATFORM_EFFICIENCY and perf.PLATFORM_EFFICIENCY[key] is shipped:
            return key
    return (backend, "*")


def read(csv_path: Path) -> list[Row]:
    with csv_path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _summary(errs: Errors) -> dict[str, float]:
    ok = [e for e in errs if e is not None]
    tp, tt = [e[0] for e in ok], [e[1] for e in ok]
    return {
        "tpot_median": _pct(tp, 0.5), "tpot_p90": _pct(tp, 0.9),
        "ttft_median": _pct(tt, 0.5), "ttft_p90": _pct(tt, 0.9),
    }  # fmt: skip


def error_table(csv_path: Path = DEFAULT, cv: bool = False) -> list[dict[str, object]]:
    """One dict per (system, backend) plus the in-sample / held-out totals (see the module doc)."""
    rows = read(csv_path)
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r["system"], r["backend"])].append(r)
    out: list[dict[str, object]] = []
    totals: dict[str, tuple[Errors, Errors]] = {"in-sample": ([], []), "held-out": ([], [])}
    for (system, backend), g in sorted(groups.items()):
        key = _factors_key(backend, system)
        fitted_on = FIT_ON.get(key, "")
        split = "in-sample" if fitted_on == system else "held-out"
        errs = errors(g)
        cv_errs = cross_validated(g, backend) if cv and split == "in-sample" else errs
        totals[split][0].extend(errs)
        totals[split][1].extend(cv_errs)
        s, c = _summary(errs), _summary(cv_errs)
        out.append({
            "system": system, "backend": backend, "factors": f"{key[0]}/{key[1]}",
            "fit": f"{split} ({fitted_on or 'none'})", "n": sum(e is not None for e in errs),
            "skipped": sum(e is None for e in errs), **s,
            "cv_tpot_median": c["tpot_median"] if cv else float("nan"),
            "cv_ttft_median": c["ttft_median"] if cv else float("nan"),
        })  # fmt: skip
    for split, (errs, cv_errs) in totals.items():
        c = _summary(cv_errs)
        out.append({
            "system": f"all {split}", "backend": "all", "factors": "", "fit": split,
            "n": sum(e is not None for e in errs), "skipped": sum(e is None for e in errs),
            **_summary(errs),
            "cv_tpot_median": c["tpot_median"] if cv else float("nan"),
            "cv_ttft_median": c["ttft_median"] if cv else float("nan"),
        })  # fmt: skip
    return out


def meets_goal(r: dict[str, object], cv: bool = False) -> bool:
    tpot = r["cv_tpot_median" if cv else "tpot_median"]
    ttft = r["cv_ttft_median" if cv else "ttft_median"]
    assert isinstance(tpot, float) and isinstance(ttft, float)
    return tpot <= GOAL_TPOT and ttft <= GOAL_TTFT


def render(rows: list[dict[str, object]]) -> str:
    head = (
        "| system | backend | factors | fit | rows | skipped | TPOT median % | TPOT p90 % "
        "| TTFT median % | TTFT p90 % | CV TPOT median % | CV TTFT median % | goal |"
    )
    lines = [head, "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cv = r["cv_tpot_median"] == r["cv_tpot_median"]  # not NaN
        goal = "met" if meets_goal(r, cv) else "not met"
        lines.append(
            f"| {r['system']} | {r['backend']} | {r['factors']} | {r['fit']} | {r['n']} | {r['skipped']} "
            f"| {r['tpot_median']:.1f} | {r['tpot_p90']:.1f} | {r['ttft_median']:.1f} | {r['ttft_p90']:.1f} "
            f"| {r['cv_tpot_median']:.1f} | {r['cv_ttft_median']:.1f} | {goal} |"
        )
    return "\n".join(lines)


def refit(
    csv_path: Path = DEFAULT, log: Callable[[str], None] = print
) -> dict[tuple[str, str], perf.Efficiency]:
    """Every row of :data:`FIT_ON` refitted on all of its rows (``--fit``)."""
    rows = read(csv_path)
    out = {}
    for (backend, platform), system in FIT_ON.items():
        train = [r for r in rows if r["system"] == system and r["backend"] == backend]
        eff = fit(train, start(backend))
        out[(backend, platform)] = eff
        shown = {k: getattr(eff, k) for k in GRID}
        score = loss(errors(train, eff))
        log(f"{backend}/{platform} on {system} ({len(train)} rows): {shown} loss {score:.1f}")
    return out


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv and not argv[0].startswith("--") else DEFAULT
    if "--fit" in argv:
        refit(path)
        return
    print(render(error_table(path, cv="--cv" in argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
