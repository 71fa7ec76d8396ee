"""Parse speed of collector.formats.exposition vs prometheus_client, timed as a real process runs.

Run: ``.venv/bin/python -m bench.bench_parse [--rounds 7] [--seconds 0.5]``
(goal: ≥ 10× prometheus_client on vllm_0.33.0_dp2.prom and sglang_0.5.23.prom).

Method, so the figure means what a sidecar pays:
  1. The garbage collector stays ON (``timeit`` turns it off by default, which flattered IOE's
     parser by 13–38 %: it allocates a ``Sample`` and a label mapping per sample).
  2. Each round times each side for about ``--seconds`` (whole parses, ``time.perf_counter``),
     the sides alternate within a round, and the figure per side is the MEDIAN over rounds, not
     the best: the ratio is of medians taken in this run.
  3. Both sides do the whole job: prometheus_client's generator is consumed (``list``) and every
     sample is materialized on both sides; before timing, the two sample lists are checked to be
     identical (name, labels, value), so neither side skips work the other does. prometheus_client
     renames a counter sample exposed without ``_total`` (an old exporter's habit) to ``…_total``;
     IOE keeps the name as exposed, so the comparison ignores that suffix.
  4. A floor is printed beside them: splitting the same text into lines, the least any line
     parser must spend.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.formats.exposition import parse

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [
    ROOT / "tests" / "data" / "engine" / "vllm_0.33.0_dp2.prom",
    ROOT / "tests" / "data" / "engine" / "sglang_0.5.23.prom",
    ROOT / "tests" / "data" / "dcgm" / "t4_a10g_mixed.prom",
]
GOAL = 10.0
GOAL_FIXTURES = ("vllm_0.33.0_dp2.prom", "sglang_0.5.23.prom")


def ours(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name.removesuffix("_total"), tuple(sorted(s.labels.items())), s.value) for s in parse(text).samples
    ]


def peers(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name.removesuffix("_total"), tuple(sorted(s.labels.items())), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def same_samples(text: str) -> None:
    """Rule 3: both parsers see the same samples (NaN compared as NaN)."""
    a, b = sorted(ours(text), key=repr), sorted(peers(text), key=repr)
    if len(a) != len(b) or any(
        x[:2] != y[:2] or not (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))
        for x, y in zip(a, b, strict=True)
    ):
        raise SystemExit(f"parsers disagree: {len(a)} vs {len(b)} samples")


def per_call_s(fn: Callable[[], object], seconds: float) -> float:
    """Rule 2: whole calls for about ``seconds``, GC on; seconds per call."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def measure(path: Path, rounds: int, seconds: float) -> dict[str, float]:
    text = path.read_text()
    same_samples(text)
    sides: dict[str, Callable[[], object]] = {
        "ioe": lambda: parse(text).samples,
        "prometheus_client": lambda: [s for f in text_string_to_metric_families(text) for s in f.samples],
        "split_lines": lambda: text.split("\n"),
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(per_call_s(sides[name], seconds))
    med = {k: statistics.median(v) for k, v in times.items()}
    med["ratio"] = med["prometheus_client"] / med["ioe"]
    med["ratio_lo"] = min(p / o for p, o in zip(times["prometheus_client"], times["ioe"], strict=True))
    med["ratio_hi"] = max(p / o for p, o in zip(times["prometheus_client"], times["ioe"], strict=True))
    return med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.5, help="timing per side per round")
    args = ap.parse_args(argv)
    assert gc.isenabled()  # rule 1
    print(f"GC on; median of {args.rounds} rounds, ~{args.seconds:g} s per side per round")
    print(f"{'fixture':26s} {'ioe':>9s} {'prom_client':>12s} {'ratio (min-max)':>18s} {'split floor':>12s}")
    met = True
    for path in FIXTURES:
        m = measure(path, args.rounds, args.seconds)
        span = f"{m['ratio']:.1f}x ({m['ratio_lo']:.1f}-{m['ratio_hi']:.1f})"
        print(f"{path.name:26s} {m['ioe'] * 1e3:7.3f}ms {m['prometheus_client'] * 1e3:10.3f}ms "
              f"{span:>18s} {m['split_lines'] * 1e3:10.3f}ms")  # fmt: skip
        if path.name in GOAL_FIXTURES:
            met = met and m["ratio"] >= GOAL
    print(f"goal ≥ {GOAL:.0f}x (median, GC on) on {', '.join(GOAL_FIXTURES)}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
