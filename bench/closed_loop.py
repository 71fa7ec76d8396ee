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

The replay (:func:`replay`, ``--simulate``) is the benchmark itself, step by step, with nothing
fitted to it: the loop AIConfigurator's generator scripts (aiperf at concurrency C: 2C warm-up
requests, then 20C profiled ones, ISL and OSL fixed, each phase opening with all C clients at
once) driving an engine that runs the live model's steps under the generator's engine settings
(a step budget of C + ISL + 1500 tokens: vLLM ``max-num-batched-tokens``, TRT-LLM
``max_num_tokens``; SGLang ``max-prefill-tokens`` ISL + 1500 per prefill batch, replayed with the
engine's scheduler of the factor table, prefill-first, although the generator also passes
``--enable-mixed-chunk``). It says what TTFT the benchmark's own loop produces from the GPU work
the live model prices; what a row measures beyond it is not queueing for that work.
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


# The benchmark as AIConfigurator 0.12's generator writes it (generator/config/backend_templates/
# benchmark/bench_run.sh.j2: ``--warmup-request-count C*2``, ``--num-requests C*20``;
# rule_plugin/benchmark/{vllm,trtllm,sglang}.rule: the agg step budget C + ISL + 1500).
WARMUP_ROUNDS = 2
PROFILED_ROUNDS = 20
BUDGET_SLACK = 1500


def replay(
    s: perf.Setup,
    clients: int,
    isl: int,
    osl: int,
    budget: int | None = None,
    rounds: tuple[int, int] = (WARMUP_ROUNDS, PROFILED_ROUNDS),
) -> tuple[float, float]:
    """Mean (TTFT, TPOT) of the profiled requests of a closed-loop benchmark, replayed step by step.

    1. Phases: ``rounds[0]`` × C warm-up requests, then ``rounds[1]`` × C profiled ones. Each
       phase opens with all C clients sending at once; a client sends its next request the
       moment its previous one completes, until the phase's count is sent; the next phase
       opens when every request of the previous one has completed.
    2. "mixed" engines (vLLM, TRT-LLM): each step, every running request that has its first
       token decodes one token; the rest of the step budget (``budget`` less those decodes;
       default C + ISL + 1500) goes to prompt tokens, first to a request already part-way
       through its prompt, then to waiting requests in arrival order, while fewer than the KV
       pool's admitted sequences (:func:`analyzer.perf.admitted`) run. "prefill_first" engines
       (SGLang): a step with prompt work to do is a prefill batch of up to ``budget`` prompt
       tokens (default ISL + 1500, the generator's ``max-prefill-tokens``) and decodes nothing;
       the others decode. A request whose last prompt token is computed gets its first token
       when that step ends. Only the prefix-cache misses are computed (``s.eff.fresh``).
    3. A step lasts :func:`analyzer.perf.step_time` of its decodes (at their mean context) and
       prompt tokens — the live model's step, memoized on a 256-token context and 32-token
       prompt grid.
    4. TTFT = first token − send; TPOT = (last token − first token) / (OSL − 1).
    """
    fresh = s.eff.fresh(isl)
    prefill_first = s.eff.scheduler == "prefill_first"
    if budget is None:
        budget = isl + BUDGET_SLACK + (0 if prefill_first else clients)
    cap_running = max(1, min(clients, perf.admitted(s, isl, osl)))
    memo: dict[tuple[int, int, int], float] = {}

    def step_s(decodes: int, ctx: float, prompt: int) -> float:
        key = (decodes, int(ctx) >> 8, prompt >> 5)
        if key not in memo:
            memo[key] = perf.step_time(s, decodes, ctx, prompt, isl)["decode_step_s"]
        return memo[key]

    now = 0.0
    ttfts: list[float] = []
    tpots: list[float] = []
    for phase, count in enumerate(clients * n for n in rounds):
        # a request: [sent, prompt tokens left, output tokens left, first token time, context]
        waiting: list[list[float]] = [[now, fresh, osl, -1.0, 0.0] for _ in range(min(clients, count))]
        sent, done, head = len(waiting), 0, 0
        running: list[list[float]] = []
        while done < count:
            decoding = [r for r in running if r[1] == 0]
            room = budget - (0 if prefill_first else len(decoding))
            chunks: list[tuple[list[float], int]] = []
            for r in running:
                if r[1] > 0 and room > 0:
                    take = int(min(r[1], room))
                    chunks.append((r, take))
                    room -= take
            while head < len(waiting) and room > 0 and len(running) < cap_running and waiting[head][0] <= now:
                r = waiting[head]
                head += 1
                running.append(r)
                take = int(min(r[1], room))
                chunks.append((r, take))
                room -= take
            if not decoding and not chunks:
                now = waiting[head][0]  # idle until the next request arrives
                continue
            if prefill_first and chunks:
                decoding = []  # a prefill batch pauses the decodes
            ctx = sum(r[4] for r in decoding) / len(decoding) if decoding else float(isl)
            now += step_s(len(decoding), ctx, sum(t for _, t in chunks))
            finished = []
            for r in decoding:
                r[2] -= 1
                r[4] += 1
                if r[2] <= 0:
                    finished.append(r)
            for r, take in chunks:
                r[1] -= take
                if r[1] == 0:
                    r[3], r[2], r[4] = now, r[2] - 1, float(isl)
                    if r[2] <= 0:
                        finished.append(r)
            for r in finished:
                running.remove(r)
                done += 1
                if phase == len(rounds) - 1:
                    ttfts.append(r[3] - r[0])
                    tpots.append((now - r[3]) / max(osl - 1, 1))
                if sent < count:
                    waiting.append([now, fresh, osl, -1.0, 0.0])
                    sent += 1
    return sum(ttfts) / len(ttfts), sum(tpots) / len(tpots)


def replay_row(row: Row, eff: perf.Efficiency | None = None) -> tuple[float, float] | None:
    """:func:`replay` of one aggregated row with its clients, shape and layout under the tabled
    factors (no harness factor: the replay is the harness); None for a row it cannot replay."""
    loop = loop_of(row)
    if loop is None:
        return None
    r = row_inputs(row)
    s = perf.Setup(r.model, r.gpu, r.layout, r.precision, r.backend, perf.Topology.for_gpu(r.gpu), eff)
    return replay(s, loop.clients, r.isl, r.osl)


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


def replay_table(rows: list[Row]) -> str:
    """Markdown: measured against :func:`replay_row` per agg row with a concurrency, then the
    medians of the absolute % errors and of measured / replayed TTFT."""
    lines = [
        "| TP | ISL | OSL | C | TTFT ms | replayed | measured / replayed | TPOT ms | replayed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    found = [(lp, r) for lp, r in ((loop_of(r), r) for r in rows) if lp is not None]
    e_ttft, e_tpot, ratios = [], [], []
    for lp, r in sorted(found, key=lambda x: (x[0].tp, x[0].isl, x[0].osl, x[0].clients)):
        got = replay_row(r)
        if got is None:
            continue
        ttft, tpot = got
        ratios.append(lp.ttft_s / ttft)
        e_ttft.append(abs(ttft - lp.ttft_s) / lp.ttft_s * 100)
        e_tpot.append(abs(tpot - lp.tpot_s) / lp.tpot_s * 100)
        lines.append(
            f"| {lp.tp} | {lp.isl} | {lp.osl} | {lp.clients} | {lp.ttft_s * 1e3:.0f} | {ttft * 1e3:.0f} "
            f"| {lp.ttft_s / ttft:.2f} | {lp.tpot_s * 1e3:.1f} | {tpot * 1e3:.1f} |"
        )
    if ratios:
        med = sorted(ratios)[len(ratios) // 2]
        lines.append(
            f"\nmedian abs error: TTFT {sorted(e_ttft)[len(e_ttft) // 2]:.1f} %, "
            f"TPOT {sorted(e_tpot)[len(e_tpot) // 2]:.1f} %; measured / replayed TTFT: median {med:.2f} "
            f"(range {min(ratios):.2f}–{max(ratios):.2f}), {len(ratios)} rows"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--system", default="", help="only this system (e.g. h200_sxm)")
    ap.add_argument("--backend", default="", help="only this backend (e.g. sglang)")
    ap.add_argument("--simulate", action="store_true", help="replay each row's benchmark loop (slow)")
    args = ap.parse_args(argv)
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in read(args.csv):
        if args.system in ("", r["system"]) and args.backend in ("", r["backend"]):
            groups[(r["system"], r["backend"])].append(r)
    for (system, backend), g in sorted(groups.items()):
        print(f"\n### {system} / {backend} ({len(g)} rows)\n")
        print(replay_table(g) if args.simulate else table(g), flush=True)


if __name__ == "__main__":
    main()
