"""Parse speed of collector.formats.exposition vs prometheus_client, in the same run.

Run: ``.venv/bin/python -m bench.bench_parse`` (goal: ≥ 10× on vllm_0.33.0_dp2.prom).

Both parsers get the same in-memory text; each figure is the best of ``REPEATS`` rounds
(the minimum is the least noisy estimate on a shared machine), and the ratio is taken from
figures measured in this run. prometheus_client's parser is consumed fully (``list(...)``)
so both sides do the whole job. The canonical mapping (``parse_scrape``) is timed too, as it
is what a scrape actually costs.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.formats.exposition import parse
from collector.formats.scrape import parse_scrape

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [
    ROOT / "tests" / "data" / "engine" / "vllm_0.33.0_dp2.prom",
    ROOT / "tests" / "data" / "engine" / "sglang_0.5.23.prom",
    ROOT / "tests" / "data" / "dcgm" / "t4_a10g_mixed.prom",
]
REPEATS = 15
GOAL = 10.0


def best_ms(fn: object, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=REPEATS)) / number * 1e3  # type: ignore[arg-type]


def measure(path: Path) -> tuple[float, float, float]:
    text = path.read_text()
    ours = best_ms(lambda: parse(text), 20)
    peer = best_ms(lambda: list(text_string_to_metric_families(text)), 3)
    scrape = best_ms(lambda: parse_scrape(text, ts_ns=0, source="bench"), 10)
    return ours, peer, scrape


def main() -> int:
    print(f"{'fixture':32s} {'ioe parse':>10s} {'prom_client':>12s} {'ratio':>7s} {'parse_scrape':>13s}")
    ratios = {}
    for path in FIXTURES:
        ours, peer, scrape = measure(path)
        ratios[path.name] = peer / ours
        print(f"{path.name:32s} {ours:8.2f}ms {peer:10.2f}ms {peer / ours:6.1f}x {scrape:11.2f}ms")
    main_ratio = ratios[FIXTURES[0].name]
    verdict = "met" if main_ratio >= GOAL else "NOT met"
    print(f"goal ≥ {GOAL:.0f}x on {FIXTURES[0].name}: {main_ratio:.1f}x ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
