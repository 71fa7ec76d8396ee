"""One engine's steady state per scrape interval, from :mod:`truthgen.physics`.

Notes:

1. Each interval has an arrival rate λ (per engine) and prompt/output lengths. The engine runs two
   kinds of step (roofline of :func:`truthgen.physics.step_cost`): decode-only steps over the b
   running sequences, and mixed steps that also carry one prefill chunk of min(ISL, token budget − b)
   tokens (vLLM's chunked prefill schedules a waiting prompt into the next step). Admitting r
   requests/s costs r × ISL / chunk mixed steps per second; the rest of the busy time is
   decode-only steps. Every step gives each running sequence one token, so a sequence's ITL is the
   decode step with probability 1 − q and the (longer) mixed step with probability q.
   Running sequences solve Little's law b = r · W(b), W = TTFT service + (OSL − 1) × mean ITL.
2. b is capped by ``max_num_seqs`` and by the KV pool (tokens ÷ mean context); admissions are
   capped where mixed steps would fill 98 % of the time. When the offered rate exceeds the most the
   engine can admit at the cap, it is overloaded: b = cap, completions = that maximum, and the
   waiting queue grows by (λ − completions) per second (it drains the same way).
3. Queue time = waiting ÷ completions when a queue stands (Little), else half a step (admitted at
   the next step boundary) plus the M/D/1 wait of prefill work ρ/(2(1−ρ)) × prefill service, ρ the
   share of time spent in mixed steps.
4. KV usage = b × mean context ÷ KV pool; KV-limited overload runs the pool at 0.97-0.99 and
   preempts (vLLM recomputes a sequence it cannot grow): 0.3 preemptions per completion.
5. DCGM activity follows what a step does: DRAM_ACTIVE = busy × achieved bytes/s ÷ peak ÷ 0.85
   (a busy memory interface moves ~85 % of peak per active cycle), PIPE_TENSOR_ACTIVE = busy ×
   achieved FLOP/s ÷ peak ÷ 0.8, SM_ACTIVE = busy × (kernel share × 0.93 + communication share ×
   0.15: NCCL kernels occupy a few SMs while they wait on the link); busy = P(at least one
   sequence) = 1 − e^(−b), at least the share of time in mixed steps. Each is a per-second total
   over the two step kinds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from truthgen.physics import (
    Fabric,
    Gpu,
    Model,
    StepCost,
    ep_dispatch_per_step,
    kv_capacity_tokens,
    step_cost,
    tp_allreduce_per_step,
)

TOKEN_BUDGET = 8192  # vLLM V1 max_num_batched_tokens on a data-centre GPU


@dataclass(frozen=True)
class Layout:
    """How one engine runs: its TP group, EP group and the fabrics they cross."""

    tp: int = 1
    ep: int = 1
    tp_fabric: Fabric | None = None  # None: single GPU
    ep_fabric: Fabric | None = None
    max_num_seqs: int = 256


def _comm(m: Model, lay: Layout, tokens: float) -> tuple[float, float, int, float]:
    """Exposed communication per step: (seconds, message bytes, calls, seconds per call) of the
    dominant group (EP when the model is MoE and EP > 1, else TP)."""
    if m.moe and lay.ep > 1 and lay.ep_fabric is not None:
        per_rank = tokens
        ep_s, total, calls = ep_dispatch_per_step(m, per_rank, lay.ep, lay.ep_fabric)
        tp_s = tp_allreduce_per_step(m, tokens, lay.tp, lay.tp_fabric)[0] if lay.tp_fabric else 0.0
        return ep_s + tp_s / 2, total, calls, ep_s / calls
    if lay.tp > 1 and lay.tp_fabric is not None:
        s, msg, calls = tp_allreduce_per_step(m, tokens, lay.tp, lay.tp_fabric)
        return s, msg, calls, s / calls
    return 0.0, 0.0, 0, 0.0


@dataclass(frozen=True)
class Interval:
    """What one engine does, on average, during one scrape interval (note 1's two step kinds)."""

    arrival: float  # req/s offered
    completions: float  # req/s admitted and finished (steady state)
    running: float
    waiting: float
    kv_usage: float
    preempt_per_s: float
    dec: StepCost  # a decode-only step
    mix: StepCost  # a step carrying one prefill chunk
    chunk: float  # prefill tokens in a mixed step
    q_mix: float  # share of a running sequence's steps that are mixed
    steps_per_s: float
    mix_steps_per_s: float
    busy: float  # share of time a step runs
    ttft_service_s: float
    queue_s: float
    kv_limited: bool
    coll_calls_per_step: int
    coll_msg_bytes: float  # per collective, decode-only step
    coll_s_per_call: float
    mix_msg_bytes: float  # per collective, mixed step
    mix_s_per_call: float

    @property
    def itl_mean_s(self) -> float:
        return (1 - self.q_mix) * self.dec.total_s + self.q_mix * self.mix.total_s

    def per_s(self, attr: str) -> float:
        """Per-second total of a StepCost attribute (bytes, flops, comm_s, overhead_s) or ``total_s``."""
        n_dec = self.steps_per_s - self.mix_steps_per_s
        return n_dec * float(getattr(self.dec, attr)) + self.mix_steps_per_s * float(getattr(self.mix, attr))


@dataclass(frozen=True)
class _Load:
    dec: StepCost
    mix: StepCost
    chunk: float
    q_seq: float
    steps_per_s: float
    mix_steps_per_s: float
    busy: float
    ttft: float
    w: float
    mix_share: float


def _cost(m: Model, gpu: Gpu, lay: Layout, b: float, p: float, ctx: float, isl: float) -> StepCost:
    comm = _comm(m, lay, b + p)[0]
    return step_cost(m, gpu, tp=lay.tp, ep=lay.ep, batch=b, ctx=ctx, prefill_tokens=p, isl=isl, comm_s=comm)


def _load(m: Model, gpu: Gpu, lay: Layout, b: float, r: float, isl: float, osl: float, ctx: float) -> _Load:
    """Note 1 at b running sequences and r admissions/s (isl = 0: prefill happens elsewhere)."""
    dec = _cost(m, gpu, lay, b, 0.0, ctx, isl)
    chunk = min(isl, max(TOKEN_BUDGET - b, 1.0)) if isl > 0 else 0.0
    mix = _cost(m, gpu, lay, b, chunk, ctx, isl) if chunk > 0 else dec
    n_mix = r * isl / chunk if chunk > 0 else 0.0
    mix_share = n_mix * mix.total_s
    busy = min(max(1.0 - math.exp(-b), mix_share), 1.0)
    n_dec = max(busy - mix_share, 0.0) / dec.total_s
    # a running sequence sees the engine stepping back to back: its ITL mixes the two step kinds
    q_seq = n_mix / (n_mix + max(1.0 - mix_share, 0.0) / dec.total_s) if n_mix > 0 else 0.0
    itl = (1 - q_seq) * dec.total_s + q_seq * mix.total_s
    ttft = mix.total_s * math.ceil(isl / chunk) if chunk > 0 else dec.total_s
    return _Load(dec, mix, chunk, q_seq, n_mix + n_dec, n_mix, busy, ttft, ttft + (osl - 1) * itl, mix_share)


def _max_rate(m: Model, gpu: Gpu, lay: Layout, cap: float, isl: float, osl: float, ctx: float) -> float:
    """Note 2: the most admissions/s at b = cap (fixed point r = cap / W), mixed steps ≤ 98 % of time."""
    r = 1.0
    for _ in range(80):
        ld = _load(m, gpu, lay, cap, r, isl, osl, ctx)
        target = cap / ld.w
        if ld.mix_share > 0.98:
            target = min(target, r * 0.98 / ld.mix_share)
        r = 0.5 * r + 0.5 * target
    return r


def solve(
    m: Model,
    gpu: Gpu,
    lay: Layout,
    *,
    arrival: float,
    isl: float,
    osl: float,
    waiting: float,
    dt: float,
    local_prefill: bool = True,
) -> tuple[Interval, float]:
    """Notes 1-4 for one interval; returns the interval and the waiting queue at its end."""
    ctx = isl + osl / 2
    pre = isl if local_prefill else 0.0
    kv_cap = kv_capacity_tokens(m, gpu, lay.tp, lay.ep)
    kv_seqs = kv_cap / ctx * 0.98
    cap = min(float(lay.max_num_seqs), kv_seqs)
    kv_limited = kv_seqs < lay.max_num_seqs
    offered = arrival + waiting / dt
    r_max = _max_rate(m, gpu, lay, cap, pre, osl, ctx)
    if offered <= r_max:
        r, lo, hi = offered, 0.0, cap
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if r * _load(m, gpu, lay, mid, r, pre, osl, ctx).w > mid else (lo, mid)
        b = 0.5 * (lo + hi)
    else:
        r, b = r_max, cap
    ld = _load(m, gpu, lay, b, r, pre, osl, ctx)
    new_waiting = max(waiting + (arrival - r) * dt, 0.0)
    rho = min(ld.mix_share, 0.95)
    standing = new_waiting > 0.5 or waiting > 0.5
    queue = (
        0.5 * (waiting + new_waiting) / r
        if standing
        else (0.5 * ld.dec.total_s + rho / (2 * (1 - rho)) * ld.ttft)
    )
    at_kv_wall = kv_limited and b >= cap * 0.97
    kv_usage = 0.985 if at_kv_wall and standing else min(b * ctx / kv_cap, 0.985)
    preempt = 0.3 * r if at_kv_wall and standing else 0.0
    _, msg, calls, per_call = _comm(m, lay, b)
    _, mix_msg, _, mix_per_call = _comm(m, lay, b + ld.chunk)
    iv = Interval(
        arrival,
        r,
        b,
        new_waiting,
        kv_usage,
        preempt,
        ld.dec,
        ld.mix,
        ld.chunk,
        ld.q_seq,
        ld.steps_per_s,
        ld.mix_steps_per_s,
        ld.busy,
        ld.ttft,
        queue,
        at_kv_wall,
        calls,
        msg,
        per_call,
        mix_msg,
        mix_per_call,
    )
    return iv, new_waiting


def activity(iv: Interval, gpu: Gpu) -> dict[str, float]:
    """Note 5: the DCGM profiling ratios of one GPU of the engine over the interval."""
    comm = iv.per_s("comm_s")
    kernel = iv.busy - comm - iv.per_s("overhead_s")
    return {
        "dram": min(iv.per_s("bytes") / gpu.hbm_bw / 0.85, 0.95),
        "tensor": min(iv.per_s("flops") / gpu.peak_bf16 / 0.8, 0.95),
        "sm": min(max(kernel, 0.0) * 0.93 + comm * 0.15, 0.97),
        "gr": min(iv.busy * 0.98, 0.99),
        "comm_share": comm,
    }
