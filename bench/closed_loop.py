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

The harness model (:func:`closed_loop_latency`, :func:`harness_row`) is how the calibration
compares the live model (:func:`analyzer.perf.expected_latency`) with such benchmark rows. It is
kept here, outside the live model, so no plan, deployment estimate or simulator ever sees it:

5. C clients in a closed loop are C requests in the system; the live model at concurrency C
   already queues those beyond the running batch (Little's law).
6. All C clients start at once: the benchmark's opening burst, a share ``burst_share`` of its
   requests (about C / requests sent), sees a wave of C simultaneous prompts
   (:func:`analyzer.perf.wave_latency`); the rest see spread-out arrivals. TTFT and TPOT are the
   share-weighted means.
7. ``prefix_hit``: the share of each prompt's tokens the benchmark's prompts repeat (its
   generator reuses a prefix; the engine's prefix cache serves them), a property of the
   benchmark's workload.
8. ``slot_wait``: the share of requests that find the batch full when they arrive, and wait one
   completion gap, OSL × TPOT / C (none for C = 1). The benchmark sets the engine's max batch
   to its client count, and in-flight batching releases a finished sequence's slot an
   iteration after its client has resent, so the new request waits for the next completion.
   This is the benchmark's configuration, not the engine's behaviour under live traffic (the
   live model never has it): a deployment sizes its max batch above its load.
The harness factors are fitted with the efficiency factors (``bench.calibration``), one set per
row of the factor table, nothing per shape, TP or row; the leave-one-model-out column of the
calibration table shows how far they carry from one model's benchmark to another's.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from analyzer import perf
from analyzer.capacity import Layout
from analyzer.catalog import Gpu
from analyzer.modelcfg import ModelConfig
from ioe.commands.estimate import estimate_row, row_concurrency, row_inputs

Row = dict[str, str]
DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "silicon" / "dense_calibration.csv"


def read(csv_path: Path) -> list[Row]:
    with csv_path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@dataclass(frozen=True)
class Harness:
    """The closed-loop benchmark that measured a set of rows (module doc 5-7)."""

    burst_share: float = 0.0  # share of requests in the opening burst of C simultaneous prompts
    prefix_hit: float = 0.0  # share of prompt tokens the benchmark's prompts repeat
    slot_wait: float = 0.0  # share of requests that wait one completion gap for a slot (doc 8)


# The harness of the calibration CSV's benchmarks, fitted by ``python -m bench.calibration --fit``
# together with the efficiency factors of analyzer/perf.py, one entry per row of that table.
# Nothing outside bench/ reads these.
HARNESS: dict[tuple[str, str], Harness] = {
    ("trtllm", "*"): Harness(burst_share=0.10, slot_wait=1.0),
    ("vllm", "*"): Harness(burst_share=0.15, slot_wait=0.25),
    ("sglang", "*"): Harness(burst_share=1.0),
    ("sglang", "h200_sxm"): Harness(burst_share=0.3, slot_wait=0.25),
    ("vllm", "h200_sxm"): Harness(burst_share=0.15, prefix_hit=0.5, slot_wait=0.75),
}


def harness_for(backend: str, system: str) -> Harness:
    """The harness entry of (backend, system), else the backend's, else no harness at all."""
    return HARNESS.get((backend, system)) or HARNESS.get((backend, "*")) or Harness()


def closed_loop_latency(
    model: ModelConfig,
    gpu: Gpu,
    layout: Layout,
    clients: int,
    isl: int,
    osl: int,
    backend: str,
    precision: str,
    eff: perf.Efficiency,
    harness: Harness,
) -> perf.Estimate:
    """The live model at C = ``clients`` requests in the system, seen through ``harness`` (module
    doc 5-8): the opening burst's wave mixed in with share ``burst_share``, the slot queue
    recomputed from the mixed TTFT and TPOT, and the slot handoff's completion gap."""
    e = dataclasses.replace(eff, prefix_hit=harness.prefix_hit)
    est = perf.expected_latency(model, gpu, layout, clients, isl, osl, backend, precision, eff=e)
    b = harness.burst_share
    if est.running <= 0:
        return est
    s = perf.Setup(model, gpu, layout, precision, backend, perf.Topology.for_gpu(gpu), e)
    w_ttft, w_tpot = perf.wave_latency(s, est.running, isl, osl) if b > 0 else (0.0, 0.0)
    ttft = b * w_ttft + (1 - b) * (est.ttft_s - est.terms["queue_wait_s"])
    tpot = b * w_tpot + (1 - b) * est.tpot_s
    queue = (ttft + osl * tpot) * (clients / est.running - 1) if clients > est.running else 0.0
    slot = harness.slot_wait * osl * tpot / est.running if 1 < clients <= est.running else 0.0
    terms = {**est.terms, "burst_wave_ttft_s": w_ttft, "queue_wait_s": queue, "slot_wait_s": slot}
    return perf.Estimate(ttft + queue + slot, tpot, est.running, est.wall, terms)


def harness_row(
    row: Row, eff: perf.Efficiency | None = None, harness: Harness | None = None
) -> perf.Estimate:
    """One calibration row through the harness model; ``eff`` / ``harness`` replace the tabled
    ones (the fit moves them). Disaggregated rows take the live model with the harness's prefix
    hits (their worker pools already queue the row's clients)."""
    r = row_inputs(row)
    factors = eff or perf.efficiency(r.backend, r.gpu.name)
    h = harness or harness_for(r.backend, r.gpu.name)
    if r.disagg:
        return estimate_row(row, dataclasses.replace(factors, prefix_hit=h.prefix_hit))
    return closed_loop_latency(
        r.model, r.gpu, r.layout, r.batch, r.isl, r.osl, r.backend, r.precision, factors, h
    )


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
