"""Request arrivals for the simulator, from real traces or a user's CSV.

Shipped traces (``simulate/data``, see SOURCES.md there): Azure LLM inference 2023
conversation and code (``TIMESTAMP,ContextTokens,GeneratedTokens``), and the head of the
Mooncake conversation trace (``timestamp`` ms, ``input_length``, ``output_length``). A user CSV
needs the columns ``arrival_s,isl,osl``.

Replay rules:
1. Arrival times are made relative to the first request and divided by ``speed``.
2. The trace loops when it runs out, shifted by its own length, so a run of any duration has
   arrivals.
3. ``rate_multiplier(t)`` (a load surge) thins or repeats arrivals deterministically: each
   trace request is emitted ``floor(m)`` times plus once more with probability ``m − floor(m)``
   from a seeded generator.
4. ``poisson=True`` keeps the trace's requests (their prompt and output lengths, in order) but
   spaces them as a Poisson process at the trace's mean rate × ``speed`` (seeded): the trace's
   token mix without its minute-scale bursts (the Azure code trace idles for minutes, then
   sends hundreds of requests in 30 s).
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TRACES = {
    "azure_conv": DATA / "AzureLLMInferenceTrace_conv_2023.csv",
    "azure_code": DATA / "AzureLLMInferenceTrace_code_2023.csv",
    "mooncake": DATA / "mooncake_conversation_trace_head3000.jsonl",
}


class WorkloadError(ValueError):
    """A trace that cannot be read; names the file and line."""


@dataclass(frozen=True)
class Arrival:
    t_s: float
    isl: int
    osl: int
    origin_s: float = -1.0  # when the request reached the front door (P/D: before its prefill)
    kv_ready: bool = False  # its prompt's KV was sent from a prefill engine


def load_trace(name_or_path: str) -> list[Arrival]:
    """Arrivals of a shipped trace (by name) or a file, relative to the first request (rule 1)."""
    path = TRACES.get(name_or_path, Path(name_or_path))
    if not path.is_file():
        raise WorkloadError(f"workload {name_or_path!r}: no such trace (shipped: {sorted(TRACES)})")
    rows = _read_jsonl(path) if path.suffix == ".jsonl" else _read_csv(path)
    if not rows:
        raise WorkloadError(f"workload {path}: no requests")
    t0 = rows[0].t_s
    return [Arrival(r.t_s - t0, max(r.isl, 1), max(r.osl, 1)) for r in sorted(rows, key=lambda a: a.t_s)]


def _read_csv(path: Path) -> list[Arrival]:
    out: list[Arrival] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        for lineno, row in enumerate(reader, start=2):
            try:
                out.append(_csv_row(row))
            except (KeyError, ValueError) as exc:
                raise WorkloadError(f"workload {path}: line {lineno}: {exc} in {row!r}") from exc
    return out


def _csv_row(row: dict[str, str]) -> Arrival:
    if "TIMESTAMP" in row:
        ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
        return Arrival(ts, int(row["ContextTokens"]), int(row["GeneratedTokens"]))
    return Arrival(float(row["arrival_s"]), int(row["isl"]), int(row["osl"]))


def _read_jsonl(path: Path) -> list[Arrival]:
    out: list[Arrival] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out.append(
                    Arrival(rec["timestamp"] / 1000.0, int(rec["input_length"]), int(rec["output_length"]))
                )
            except (KeyError, ValueError, TypeError) as exc:
                raise WorkloadError(f"workload {path}: line {lineno}: {exc}") from exc
    return out


def replay(
    trace: list[Arrival],
    *,
    speed: float = 1.0,
    rate_multiplier: Callable[[float], float] = lambda t: 1.0,
    seed: int = 0,
    max_isl: int = 0,
    poisson: bool = False,
) -> Iterator[Arrival]:
    """Endless arrivals in simulated seconds (rules 1–4); ``max_isl`` caps prompt length if > 0."""
    rng = random.Random(seed)
    span = trace[-1].t_s + (trace[-1].t_s / max(len(trace) - 1, 1))
    gap_s = span / len(trace)
    loop, clock = 0, 0.0
    while True:
        for a in trace:
            if poisson:
                clock += rng.expovariate(1.0 / gap_s)
            t = (clock if poisson else a.t_s + loop * span) / speed
            m = rate_multiplier(t)
            copies = int(m) + (1 if rng.random() < m - int(m) else 0)
            isl = min(a.isl, max_isl) if max_isl else a.isl
            for _ in range(copies):
                yield Arrival(t, isl, a.osl)
        loop += 1
