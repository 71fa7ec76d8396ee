"""Error table of the performance model against measured TTFT/TPOT (the calibration CSV).

Run: ``.venv/bin/python -m bench.calibration [CSV] [--cv [--jobs N]] [--loso SYSTEM/BACKEND,...] [--fit]``
(``--jobs``: processes for the cross-validation's refits, default one per CPU; ``--loso``: only the
leave-one-shape-out medians of the named groups). Default CSV is
``tests/data/silicon/dense_calibration.csv`` (real H100/H200/B200/GB200 measurements, a subset of
NVIDIA aiconfigurator's silicon sample; the same file as ``shared/fixtures/silicon``).

1. For each (system, backend) group: rows, rows the model could not estimate (``skipped``, never
   silently dropped), and the median / p90 absolute % error of TPOT and TTFT with the shipped
   factors (:func:`analyzer.perf.efficiency`) seen through the benchmark's closed-loop harness
   (:func:`bench.closed_loop.harness_row`; the live model carries no harness term). ``factors``
   names the row of the table the group uses and ``fit`` the rows that row was fitted on: a
   group whose own rows fitted its factors is ``in-sample``; a group predicted by factors fitted
   elsewhere is ``held-out``.
2. ``--cv``: two cross-validations, each refitting (:func:`fit`, from the neutral :func:`start`)
   on rows that exclude what it predicts:
   a. leave-one-shape-out (LOSO): for each (ISL, OSL) of an in-sample group, the group's factor
      row is refitted on its training rows of every other shape and predicts that shape's rows.
      Held-out groups repeat their error (they are a prediction already).
   b. leave-one-model-out (LOMO): for each model, one factor row per backend is refitted on
      that backend's rows of the other models on every fitted platform (:data:`FIT_ON`) and
      predicts the model's rows in every group. Where a platform holds only one model (h100
      vLLM and SGLang: Qwen3-32B; h200: Llama-3.1-8B) this is also a cross-platform prediction.
3. ``--fit``: refit every row of :data:`FIT_ON` on all its rows and print the factors (how the
   numbers in ``analyzer/perf.py`` and ``bench/closed_loop.py`` were produced).
4. ``--heldout PATH``: held-out evaluation on another public measurement set in the same
   columns (e.g. aiconfigurator-core 0.12.0's full ``systems/silicon_sample.csv``, of which the
   calibration CSV is a subset). Rows whose ``id`` is in the calibration CSV are dropped; the
   rest are predicted with the shipped factors — never fitted on — and grouped by (model,
   system, backend); rows of models IOE does not ship, or that it cannot estimate, are counted
   as ``skipped``.

Absolute % error = |predicted − measured| / measured × 100. The fit minimizes median TPOT error
+ ½ × median TTFT error of the rows by coordinate descent over :data:`GRID` (each factor on a
grid of physically plausible values, up to three passes): a handful of named factors per platform,
nothing per row, shape, TP or model. The descent starts from each of :data:`STARTS` (the harness
factors burst_share, prefix_hit and slot_wait) and keeps the best.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from analyzer import modelcfg, perf
from bench.closed_loop import DEFAULT, Harness, harness_for, harness_row, read

GOAL_TPOT, GOAL_TTFT = 10.0, 20.0  # issue #6: median abs % error per system and backend

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

# Factors a fit may move and the plausible values it searches (fp8_kv, scheduler, admission,
# chunk_tokens and comm_eff are facts of the backend and the link, not fitted). burst_share and
# prefix_hit are the harness's (bench.closed_loop.Harness), the rest the efficiency row's.
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
HARNESS_FACTORS = ("burst_share", "prefix_hit", "slot_wait")

# (burst_share, prefix_hit, slot_wait): every pairing of the harness factors' valleys
STARTS = tuple((b, h, w) for w in (0.0, 0.75) for h in (0.0, 0.5) for b in (0.0, 0.15, 1.0))

MIN_GAIN = 0.1  # a descent step must lower the loss by this much (percentage points)
PARSIMONY = 1.0  # loss points a prefix-cache hit must win by (see fit)

Row = dict[str, str]
Errors = list[tuple[float, float] | None]
Params = tuple[perf.Efficiency, Harness]


def start(backend: str) -> Params:
    """The neutral starting point of every fit: mid-grid values, the backend's facts kept."""
    base = perf.EFFICIENCY[backend]
    eff = dataclasses.replace(
        base, mfu=0.5, low_precision_scale=0.7, hbm_eff=0.8, step_overhead_s=3e-3, seq_overhead_s=0.0
    )
    return eff, Harness(burst_share=0.15)


def _get(p: Params, name: str) -> float:
    return float(getattr(p[1] if name in HARNESS_FACTORS else p[0], name))


def _set(p: Params, name: str, value: float) -> Params:
    change: dict[str, Any] = {name: value}
    if name in HARNESS_FACTORS:
        return p[0], dataclasses.replace(p[1], **change)
    return dataclasses.replace(p[0], **change), p[1]


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


def errors(rows: Iterable[Row], params: Params | None = None) -> Errors:
    """(TPOT, TTFT) abs % error per row, None where the row cannot be estimated."""
    out: Errors = []
    for r in rows:
        try:
            est = harness_row(r, *params) if params else harness_row(r)
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


def fit(rows: list[Row], params: Params) -> Params:
    """The best of :func:`descend` from ``params`` with each of the harness factors' :data:`STARTS`
    (the TTFT landscape has a valley per arrival pattern, which one descent does not cross)."""
    found = [descend(rows, (params[0], Harness(b, h, w))) for b, h, w in STARTS]
    scored = [(loss(errors(rows, p)), p) for p in found]
    best = min(score for score, _ in scored)
    # Parsimony: among fits within PARSIMONY of the best, the one assuming the least prefix-cache
    # hit (it trades against mfu on prompt compute, so only a clear gain may claim a hit).
    near = [p for score, p in scored if score <= best + PARSIMONY]
    return min(near, key=lambda p: (p[1].prefix_hit, loss(errors(rows, p))))


def descend(rows: list[Row], params: Params, passes: int = 3) -> Params:
    """Coordinate descent of :data:`GRID` from ``params`` minimizing :func:`loss` on ``rows``."""
    best = loss(errors(rows, params))
    for _ in range(passes):
        moved = False
        for name, values in GRID.items():
            for v in values:
                if v == _get(params, name):
                    continue
                trial = _set(params, name, v)
                score = loss(errors(rows, trial))
                if score < best - MIN_GAIN:
                    best, params, moved = score, trial, True
        if not moved:
            break
    return params


def _shape(r: Row) -> tuple[int, int]:
    return (int(float(r["isl"])), int(float(r["osl"])))


def _model_of(r: Row) -> str:
    return modelcfg.canonical_name(r["model_path"])


def _fit_from_start(task: tuple[list[Row], str]) -> Params:
    train, backend = task
    return fit(train, start(backend)) if train else start(backend)


def _fit_all(tasks: list[tuple[list[Row], str]], jobs: int) -> list[Params]:
    """:func:`fit` from :func:`start` for each (train rows, backend), over ``jobs`` processes."""
    if jobs <= 1 or len(tasks) <= 1:
        return [_fit_from_start(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_fit_from_start, tasks))


def leave_one_shape_out(rows: list[Row], backend: str, jobs: int = 1) -> Errors:
    """Each row's errors under factors refitted on the group's rows of every other (ISL, OSL)."""
    out: Errors = [None] * len(rows)
    shapes = sorted({_shape(r) for r in rows})
    fitted = _fit_all([([r for r in rows if _shape(r) != sh], backend) for sh in shapes], jobs)
    for shape, params in zip(shapes, fitted, strict=True):
        test = [i for i, r in enumerate(rows) if _shape(r) == shape]
        for i, e in zip(test, errors([rows[i] for i in test], params), strict=True):
            out[i] = e
    return out


def leave_one_model_out(all_rows: list[Row], jobs: int = 1) -> dict[int, tuple[float, float] | None]:
    """Errors of every row (by index in ``all_rows``) under one factor row per backend refitted
    on that backend's rows of the other models, on the :data:`FIT_ON` platforms (module doc 2b)."""
    fitted = {(b, sys_) for (b, _), sys_ in FIT_ON.items()}
    out: dict[int, tuple[float, float] | None] = {}
    tasks: list[tuple[list[Row], str]] = []
    tests: list[list[int]] = []
    for backend in sorted({b for b, _ in fitted}):
        platforms = {sys_ for b, sys_ in fitted if b == backend}
        mine = [i for i, r in enumerate(all_rows) if r["backend"] == backend]
        for model in sorted({_model_of(all_rows[i]) for i in mine}):
            train = [
                all_rows[i]
                for i in mine
                if all_rows[i]["system"] in platforms and _model_of(all_rows[i]) != model
            ]
            test = [i for i in mine if _model_of(all_rows[i]) == model]
            if not train:
                out.update({i: None for i in test})
                continue
            tasks.append((train, backend))
            tests.append(test)
    for test, params in zip(tests, _fit_all(tasks, jobs), strict=True):
        out.update(zip(test, errors([all_rows[i] for i in test], params), strict=True))
    return out


def _factors_key(backend: str, system: str) -> tuple[str, str]:
    """The row of the factor table a (backend, system) uses."""
    shipped = perf.efficiency(backend, system)
    for key in ((backend, system), *((b, s) for b, s in FIT_ON if b == backend)):
        if key in perf.PLATFORM_EFFICIENCY and perf.PLATFORM_EFFICIENCY[key] is shipped:
            return key
    return (backend, "*")


def _summary(errs: Errors) -> dict[str, float]:
    ok = [e for e in errs if e is not None]
    tp, tt = [e[0] for e in ok], [e[1] for e in ok]
    return {
        "tpot_median": _pct(tp, 0.5), "tpot_p90": _pct(tp, 0.9),
        "ttft_median": _pct(tt, 0.5), "ttft_p90": _pct(tt, 0.9),
    }  # fmt: skip


def error_table(csv_path: Path = DEFAULT, cv: bool = False, jobs: int = 1) -> list[dict[str, object]]:
    """One dict per (system, backend) plus the in-sample / held-out totals (see the module doc).

    With ``cv``: ``loso_*`` (leave-one-shape-out; held-out groups repeat their error) and
    ``lomo_*`` (leave-one-model-out) medians; NaN without."""
    rows = read(csv_path)
    index = {id(r): i for i, r in enumerate(rows)}
    lomo = leave_one_model_out(rows, jobs) if cv else {}
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r["system"], r["backend"])].append(r)
    out: list[dict[str, object]] = []
    totals: dict[str, tuple[Errors, Errors, Errors]] = {"in-sample": ([], [], []), "held-out": ([], [], [])}
    nan = float("nan")
    for (system, backend), g in sorted(groups.items()):
        key = _factors_key(backend, system)
        fitted_on = FIT_ON.get(key, "")
        split = "in-sample" if fitted_on == system else "held-out"
        errs = errors(g)
        loso = leave_one_shape_out(g, backend, jobs) if cv and split == "in-sample" else errs
        mo = [lomo.get(index[id(r)]) for r in g]
        for acc, e in zip(totals[split], (errs, loso, mo), strict=True):
            acc.extend(e)
        c, m = _summary(loso), _summary(mo)
        out.append({
            "system": system, "backend": backend, "factors": f"{key[0]}/{key[1]}",
            "fit": f"{split} ({fitted_on or 'none'})", "n": sum(e is not None for e in errs),
            "skipped": sum(e is None for e in errs), **_summary(errs),
            "loso_tpot_median": c["tpot_median"] if cv else nan,
            "loso_ttft_median": c["ttft_median"] if cv else nan,
            "lomo_tpot_median": m["tpot_median"] if cv else nan,
            "lomo_ttft_median": m["ttft_median"] if cv else nan,
        })  # fmt: skip
    for split, (errs, loso, mo) in totals.items():
        c, m = _summary(loso), _summary(mo)
        out.append({
            "system": f"all {split}", "backend": "all", "factors": "", "fit": split,
            "n": sum(e is not None for e in errs), "skipped": sum(e is None for e in errs),
            **_summary(errs),
            "loso_tpot_median": c["tpot_median"] if cv else nan,
            "loso_ttft_median": c["ttft_median"] if cv else nan,
            "lomo_tpot_median": m["tpot_median"] if cv else nan,
            "lomo_ttft_median": m["ttft_median"] if cv else nan,
        })  # fmt: skip
    return out


def meets_goal(r: dict[str, object], cv: bool = False) -> bool:
    """TPOT and TTFT medians within the goal: leave-one-shape-out with ``cv``, else in-sample."""
    tpot = r["loso_tpot_median" if cv else "tpot_median"]
    ttft = r["loso_ttft_median" if cv else "ttft_median"]
    assert isinstance(tpot, float) and isinstance(ttft, float)
    return tpot <= GOAL_TPOT and ttft <= GOAL_TTFT


def render(rows: list[dict[str, object]]) -> str:
    head = (
        "| system | backend | factors | fit | rows | skipped | TPOT median % | TPOT p90 % "
        "| TTFT median % | TTFT p90 % | LOSO TPOT % | LOSO TTFT % | LOMO TPOT % | LOMO TTFT % | goal (LOSO) |"
    )
    lines = [head, "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cv = r["loso_tpot_median"] == r["loso_tpot_median"]  # not NaN
        goal = "met" if meets_goal(r, cv) else "not met"
        lines.append(
            f"| {r['system']} | {r['backend']} | {r['factors']} | {r['fit']} | {r['n']} | {r['skipped']} "
            f"| {r['tpot_median']:.1f} | {r['tpot_p90']:.1f} | {r['ttft_median']:.1f} | {r['ttft_p90']:.1f} "
            f"| {r['loso_tpot_median']:.1f} | {r['loso_ttft_median']:.1f} "
            f"| {r['lomo_tpot_median']:.1f} | {r['lomo_ttft_median']:.1f} | {goal} |"
        )
    return "\n".join(lines)


def refit(csv_path: Path = DEFAULT, log: Callable[[str], None] = print) -> dict[tuple[str, str], Params]:
    """Every row of :data:`FIT_ON` refitted on all of its rows (``--fit``)."""
    rows = read(csv_path)
    out = {}
    for (backend, platform), system in FIT_ON.items():
        train = [r for r in rows if r["system"] == system and r["backend"] == backend]
        params = fit(train, start(backend))
        out[(backend, platform)] = params
        shown = {k: _get(params, k) for k in GRID}
        score = loss(errors(train, params))
        log(f"{backend}/{platform} on {system} ({len(train)} rows): {shown} loss {score:.1f}")
    return out


def shipped_params(backend: str, system: str) -> Params:
    """The shipped (efficiency, harness) pair a (backend, system) uses."""
    return perf.efficiency(backend, system), harness_for(backend, system)


def heldout_table(csv_path: Path, fitted: Path = DEFAULT) -> list[dict[str, object]]:
    """Errors on the rows of ``csv_path`` not in ``fitted``, per (model, system, backend) (doc 4)."""
    known = {r["id"] for r in read(fitted)}
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for r in read(csv_path):
        if r["id"] not in known:
            groups[(_model_of(r), r["system"], r["backend"])].append(r)
    out: list[dict[str, object]] = []
    every: Errors = []
    for (model, system, backend), g in sorted(groups.items()):
        errs = errors(g)
        every.extend(errs)
        out.append({"model": model, "system": system, "backend": backend,
                    "n": sum(e is not None for e in errs), "skipped": sum(e is None for e in errs),
                    **_summary(errs)})  # fmt: skip
    out.append({"model": "all", "system": "all", "backend": "all", "n": sum(e is not None for e in every),
                "skipped": sum(e is None for e in every), **_summary(every)})  # fmt: skip
    return out


def render_heldout(rows: list[dict[str, object]]) -> str:
    lines = [
        "| model | system | backend | rows | skipped | TPOT median % | TPOT p90 % "
        "| TTFT median % | TTFT p90 % |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if not r["n"]:
            continue
        lines.append(f"| {r['model']} | {r['system']} | {r['backend']} | {r['n']} | {r['skipped']} "
                     f"| {r['tpot_median']:.1f} | {r['tpot_p90']:.1f} | {r['ttft_median']:.1f} "
                     f"| {r['ttft_p90']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv and not argv[0].startswith("--") else DEFAULT
    if "--heldout" in argv:
        print(render_heldout(heldout_table(Path(argv[argv.index("--heldout") + 1]), path)))
        return
    if "--fit" in argv:
        refit(path)
        return
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else (os.cpu_count() or 1)
    if "--loso" in argv:  # leave-one-shape-out of the named groups only (the full --cv adds LOMO)
        for name in argv[argv.index("--loso") + 1].split(","):
            system, _, backend = name.partition("/")
            group = [r for r in read(path) if (r["system"], r["backend"]) == (system, backend)]
            got = _summary(leave_one_shape_out(group, backend, jobs))
            tpot, ttft = got["tpot_median"], got["ttft_median"]
            print(f"{name}: LOSO TPOT {tpot:.1f} % TTFT {ttft:.1f} % ({len(group)} rows)")
        return
    print(render(error_table(path, cv="--cv" in argv, jobs=jobs)))


if __name__ == "__main__":
    main(sys.argv[1:])
