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
     identical (name, labels, value) on every body timed, so neither side skips work the other
     does. prometheus_client renames a counter sample exposed without ``_total`` (an old
     exporter's habit) to ``…_total``; IOE keeps the name as exposed, so the comparison ignores
     that suffix.
  4. A floor is printed beside them: splitting the same text into lines, the least any line
     parser must spend.
  5. The ``ioe`` side parses as the sidecar's scraper does: with one
     :class:`~collector.formats.exposition.ParseCache` per target, kept from body to body
     (exposition rule 11: known label blocks, HELP/TYPE lines and series texts are not parsed
     again, as Prometheus keeps series references from scrape to scrape). So that the cache hits
     only on what really repeats between scrapes, no two successive calls parse the same text:
     each fixture is timed as :data:`VARIANTS` bodies that share its series, comment lines and
     layout but carry different values (and timestamps, where a line has one), generated once,
     parsed in turn, the same bodies in the same order for every side. The cache is warmed by the
     identity check of rule 3, as a scraper's is by its first scrape. ``ioe cold`` is the same
     parser with no cache (a fresh parse of every body), printed beside it; the goal is read on
     ``ioe``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.formats.exposition import ParseCache, parse

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [
    ROOT / "tests" / "data" / "engine" / "vllm_0.33.0_dp2.prom",
    ROOT / "tests" / "data" / "engine" / "sglang_0.5.23.prom",
    ROOT / "tests" / "data" / "dcgm" / "t4_a10g_mixed.prom",
]
GOAL = 10.0
GOAL_FIXTURES = ("vllm_0.33.0_dp2.prom", "sglang_0.5.23.prom")
VARIANTS = 16  # bodies per fixture, parsed in turn (rule 5)


def variants(text: str, count: int = VARIANTS, seed: int = 24) -> list[str]:
    """Rule 5: ``count`` bodies of ``text``'s series with other values (and timestamps): the
    first is the fixture itself. In the others a whole-number value (a counter, a bucket count)
    grows by a whole 0-1 % (at least 0-1) and is written as the exporter wrote it (``9747.0``),
    any other finite value moves by up to ±1 % (at least ±0.01) and is written as Python's
    ``repr`` (as prometheus_client renders it, up to 17 digits), NaN and infinities stay, and
    every timestamp moves by one second per body."""
    rng = random.Random(seed)
    lines = text.split("\n")
    out = [text]
    for k in range(1, count):
        body = []
        for line in lines:
            if line.strip() and not line.lstrip().startswith("#"):
                cut = line.rfind("}") + 1 or len(line.split(None, 1)[0])
                head, tokens = line[:cut], line[cut:].split()
                value = float(tokens[0])
                if value.is_integer():
                    step = float(rng.randint(0, max(1, int(abs(value) * 0.01))))
                    tokens[0] = (
                        repr(value + step) if "." in tokens[0] or "e" in tokens[0] else str(int(value + step))
                    )
                elif math.isfinite(value):
                    tokens[0] = repr(value + rng.uniform(-1.0, 1.0) * max(abs(value), 1.0) * 0.01)
                if len(tokens) > 1:
                    tokens[1] = str(int(tokens[1]) + 1000 * k)
                line = f"{head} {' '.join(tokens)}"
            body.append(line)
        out.append("\n".join(body))
    if len(set(out)) != count:
        raise SystemExit("variants are not all different")
    return out


def ours(text: str, cache: ParseCache | None = None) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name.removesuffix("_total"), tuple(sorted(s.labels.items())), s.value)
        for s in parse(text, cache=cache).samples
    ]


def peers(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name.removesuffix("_total"), tuple(sorted(s.labels.items())), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def same_samples(text: str, cache: ParseCache) -> None:
    """Rule 3: both parsers see the same samples (NaN compared as NaN), IOE with and without its cache."""
    b = sorted(peers(text), key=repr)
    for a in (sorted(ours(text, cache), key=repr), sorted(ours(text), key=repr)):
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
    bodies = variants(path.read_text())
    cache = ParseCache()  # one target's, kept across its bodies (rule 5)
    for text in bodies:
        same_samples(text, cache)
    turn = {side: itertools.cycle(bodies) for side in ("ioe", "ioe_cold", "prometheus_client", "split_lines")}
    sides: dict[str, Callable[[], object]] = {
        "ioe": lambda: parse(next(turn["ioe"]), cache=cache).samples,
        "ioe_cold": lambda: parse(next(turn["ioe_cold"])).samples,
        "prometheus_client": lambda: [
            s for f in text_string_to_metric_families(next(turn["prometheus_client"])) for s in f.samples
        ],
        "split_lines": lambda: next(turn["split_lines"]).split("\n"),
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(per_call_s(sides[name], seconds))
    med = {k: statistics.median(v) for k, v in times.items()}
    med["ratio"] = med["prometheus_client"] / med["ioe"]
    med["ratio_cold"] = med["prometheus_client"] / med["ioe_cold"]
    med["ratio_lo"] = min(p / o for p, o in zip(times["prometheus_client"], times["ioe"], strict=True))
    med["ratio_hi"] = max(p / o for p, o in zip(times["prometheus_client"], times["ioe"], strict=True))
    return med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.5, help="timing per side per round")
    args = ap.parse_args(argv)
    assert gc.isenabled()  # rule 1
    print(
        f"GC on; median of {args.rounds} rounds, ~{args.seconds:g} s per side per round, "
        f"{VARIANTS} bodies per fixture parsed in turn"
    )
    print(f"{'fixture':26s} {'ioe':>9s} {'prom_client':>12s} {'ratio (min-max)':>18s} {'split floor':>12s} "
          f"{'ioe cold':>9s} {'cold ratio':>10s}")  # fmt: skip
    met = True
    for path in FIXTURES:
        m = measure(path, args.rounds, args.seconds)
        span = f"{m['ratio']:.1f}x ({m['ratio_lo']:.1f}-{m['ratio_hi']:.1f})"
        print(f"{path.name:26s} {m['ioe'] * 1e3:7.3f}ms {m['prometheus_client'] * 1e3:10.3f}ms "
              f"{span:>18s} {m['split_lines'] * 1e3:10.3f}ms {m['ioe_cold'] * 1e3:7.3f}ms "
              f"{m['ratio_cold']:9.1f}x")  # fmt: skip
        if path.name in GOAL_FIXTURES:
            met = met and m["ratio"] >= GOAL
    print(f"goal ≥ {GOAL:.0f}x (median, GC on) on {', '.join(GOAL_FIXTURES)}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
