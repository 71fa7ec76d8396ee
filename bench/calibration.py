"""Error table of the performance model against measured TTFT/TPOT (the calibration CSV).

Run: ``.venv/bin/python -m bench.calibration [CSV] [--markdown]``. Default CSV is
``tests/data/silicon/dense_calibration.csv`` (real H100/H200/B200/GB200 measurements, a subset of
NVIDIA aiconfigurator's silicon sample). For each (system, backend) group it prints the number of
rows, the median and p90 absolute % error of TPOT and TTFT, whether the group was used to fit
:data:`analyzer.perf.EFFICIENCY` (``in-sample``: the h100_sxm rows) or not (``held-out``: every
other system), and one ``all`` line per split so the in-sample and held-out claims stay apart.

Absolute % error = |predicted − measured| / measured × 100. Rows the model cannot estimate are
counted in ``skipped`` and never silently dropped.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from ioe.commands.estimate import annotate_csv

FIT_SYSTEMS = frozenset({"h100_sxm"})  # the rows the efficiency factors were fitted on
DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "silicon" / "dense_calibration.csv"


def _pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0..1) of ``values``; NaN if empty."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _err(pred: object, meas: str) -> float | None:
    try:
        p, m = float(str(pred)), float(meas)
    except ValueError:
        return None
    return abs(p - m) / m * 100 if m > 0 else None


def error_table(csv_path: Path) -> list[dict[str, object]]:
    """One dict per (system, backend) plus ``all``: n, skipped, TPOT/TTFT median and p90 abs % error."""
    groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    skipped: dict[tuple[str, str], int] = defaultdict(int)
    for row in annotate_csv(csv_path):
        key = (row["system"], row["backend"])
        tpot = _err(row["predicted_tpot_ms"], row["silicon_tpot_ms"])
        ttft = _err(row["predicted_ttft_ms"], row["silicon_ttft_ms"])
        if tpot is None or ttft is None:
            skipped[key] += 1
            continue
        split = "all in-sample" if key[0] in FIT_SYSTEMS else "all held-out"
        for k in (key, (split, "all")):
            groups[k]["tpot"].append(tpot)
            groups[k]["ttft"].append(ttft)
    out = []
    for key in sorted(groups, key=lambda k: (k[0].startswith("all"), k)):
        g = groups[key]
        out.append({
            "system": key[0], "backend": key[1], "n": len(g["tpot"]),
            "fit": "held-out" if key[0] not in FIT_SYSTEMS and "in-sample" not in key[0] else "in-sample",
            "skipped": skipped.get(key, 0),
            "tpot_median": _pct(g["tpot"], 0.5), "tpot_p90": _pct(g["tpot"], 0.9),
            "ttft_median": _pct(g["ttft"], 0.5), "ttft_p90": _pct(g["ttft"], 0.9),
        })  # fmt: skip
    return out


def render(rows: list[dict[str, object]]) -> str:
    head = (
        "| system | backend | fit | rows | skipped "
        "| TPOT median % | TPOT p90 % | TTFT median % | TTFT p90 % |"
    )
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['system']} | {r['backend']} | {r['fit']} | {r['n']} | {r['skipped']} "
            f"| {r['tpot_median']:.1f} | {r['tpot_p90']:.1f} | {r['ttft_median']:.1f} | {r['ttft_p90']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv and not argv[0].startswith("--") else DEFAULT
    print(render(error_table(path)))


if __name__ == "__main__":
    main(sys.argv[1:])
