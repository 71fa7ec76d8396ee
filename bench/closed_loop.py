"""What each measured calibration row says about its own closed loop, before any model.

Run: ``.venv/bin/python -m bench.closed_loop [CSV] [--system S] [--backend B]``.

A closed-loop benchmark keeps C clients busy: each sends its next request the moment its previous
one completes. Its measured TTFT and TPOT therefore fix the loop's throughput without any model:

1. cycle = TTFT + (OSL − 1) × TPOT, one client's request from send to last token;
2. X = C / cycle requests per second (Little's law over the C clients);
3. prompt tokens per second = X × ISL; prompt tokens per decode step = X × TPOT × ISL (an
   aggregated engine emits one token per running request per step, so a step lasts one TPOT);
4. wait share = TTFT / cycle, the share of a client's time spent before its first token.

These are identities of the measurement, not estimates. They show where a row's TTFT comes from:
a row whose prompt throughput sits at the same ceiling as its neighbours' while its wait share is
large is queueing for prefill; a row far below that ceiling with a large wait share is waiting for
something the GPU work does not explain. Rows without a concurrency are skipped, and say so.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench.calibration import DEFAULT, read
from ioe.commands.estimate import row_concurrency

Row = dict[str, str]


@dataclass(frozen=True)
class Loop:
    """The closed-loop identities of one measured row (module doc 1–4)."""

    tp: int
    isl: int
    osl: int
    clients: int
    ttft_s: float
    tpot_s: float

    @property
    def cycle_s(self) -> float:
        return self.ttft_s + max(self.osl - 1, 0) * self.tpot_s

    @property
    def requests_per_s(self) -> float:
        return self.clients / self.cycle_s

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.requests_per_s * self.isl

    @property
    def prompt_tokens_per_step(self) -> float:
        return self.requests_per_s * self.tpot_s * self.isl

    @property
    def wait_share(self) -> float:
        return self.ttft_s / self.cycle_s


def loop_of(row: Row) -> Loop | None:
    """The row's loop, or None when it records no concurrency (nothing to divide by)."""
    clients = row_concurrency(row)
    if clients <= 0 or (row.get("mode") or "agg").strip() != "agg":
        return None
    return Loop(
        tp=int(float(row["tp_size"] or 1)),
        isl=int(row["isl"]),
        osl=int(row["osl"]),
        clients=clients,
        ttft_s=float(row["silicon_ttft_ms"]) / 1e3,
        tpot_s=float(row["silicon_tpot_ms"]) / 1e3,
    )


def table(rows: list[Row]) -> str:
    """Markdown: one line per agg row with a concurrency, sorted by TP, ISL, OSL."""
    lines = [
        "| TP | ISL | OSL | C | TTFT ms | TPOT ms | req/s | prompt ktok/s | prompt tok/step | wait share |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    loops = [lp for lp in map(loop_of, rows) if lp is not None]
    for lp in sorted(loops, key=lambda lp: (lp.tp, lp.isl, lp.osl)):
        lines.append(
            f"| {lp.tp} | {lp.isl} | {lp.osl} | {lp.clients} | {lp.ttft_s * 1e3:.0f} | {lp.tpot_s * 1e3:.1f} "
            f"| {lp.requests_per_s:.1f} | {lp.prompt_tokens_per_s / 1e3:.1f} "
            f"| {lp.prompt_tokens_per_step:.0f} | {lp.wait_share:.2f} |"
        )
    skipped = len(rows) - len(loops)
    if skipped:
        lines.append(f"\n{skipped} row(s) skipped: disaggregated, or no concurrency recorded.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--system", default="", help="only this system (e.g. h200_sxm)")
    ap.add_argument("--backend", default="", help="only this backend (e.g. sglang)")
    args = ap.parse_args(argv)
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in read(args.csv):
        if args.system in ("", r["system"]) and args.backend in ("", r["backend"]):
            groups[(r["system"], r["backend"])].append(r)
    for (system, backend), g in sorted(groups.items()):
        print(f"\n### {system} / {backend} ({len(g)} rows)\n")
        print(table(g))


if __name__ == "__main__":
    main()
