"""A continuous-batching engine (vLLM's scheduler, simplified) driven by a step-time model.

Each step, in order:
1. Arrivals due by now join the waiting queue.
2. Every running request that has finished its prompt decodes one token.
3. KV growth is checked: while the decode tokens do not fit, the most recently admitted
   request is preempted (its KV freed, back to the front of the queue; it recomputes its
   prompt plus what it had generated), and counted.
4. Prefill is scheduled with chunking: the token budget (``max_batched_tokens`` − decodes)
   goes first to requests already prefilling, then to waiting requests admitted while the
   sequence limit and the KV capacity (their whole prompt) allow.
5. The step lasts ``step(decode_batch, decode_context_tokens, prefill_tokens, now).seconds``;
   every decoding request observes that as one inter-token latency (vLLM's ITL histogram has
   one observation per engine step per request).
6. A request handed over by a prefill engine (``Arrival.kv_ready``) arrives with its prompt's
   KV already in place: it is admitted when its KV fits and decodes from its first step (its
   first token is that step's); a preempted one recomputes its prompt here like any other.

Times are simulated seconds from the start of the run; the caller maps them to wall time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from simulate.workload import Arrival


@dataclass(frozen=True)
class Collective:
    """One sampled call of a step's collectives: op, calls per step, message bytes, transfer
    seconds of one call, and each rank's arrival (seconds after the step starts)."""

    op: str
    calls: int
    msg_bytes: int
    transfer_s: float
    arrivals_s: tuple[float, ...]


@dataclass(frozen=True)
class StepCost:
    """One engine step: its duration, what it spent it on, and what each GPU of the group did
    (``ranks``: :class:`simulate.activity.RankStep`, one per TP × PP rank)."""

    seconds: float
    compute_s: float
    hbm_s: float
    comm_s: float
    comm_bytes_per_gpu: float
    host_s: float = 0.0
    flops: float = 0.0
    hbm_bytes: float = 0.0
    ranks: tuple[Any, ...] = ()
    collectives: tuple[Collective, ...] = ()


class StepFn(Protocol):
    def __call__(self, batch: int, ctx: int, prefill: int, now: float = 0.0) -> StepCost: ...


@dataclass(frozen=True)
class EngineConfig:
    kv_capacity_tokens: int
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192


@dataclass
class Request:
    rid: int
    arrival_s: float
    isl: int
    osl: int
    prompt: int = 0  # tokens to prefill (isl, or more after a preemption)
    prefilled: int = 0
    generated: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float = 0.0
    preemptions: int = 0
    ready_s: float = 0.0  # when it reached this engine (its arrival, or its KV's arrival)
    remote_kv: bool = False

    @property
    def kv_tokens(self) -> int:
        return self.prefilled + self.generated

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prompt


@dataclass(frozen=True)
class Finished:
    rid: int
    arrival_s: float
    scheduled_s: float
    first_token_s: float
    finish_s: float
    isl: int
    osl: int
    preemptions: int


class EngineObserver(Protocol):
    def step(self, cost: StepCost, decoding: int, prefill_tokens: int, itl_s: float) -> None: ...

    def first_token(self, req: Request, now: float) -> None: ...

    def finished(self, done: Finished) -> None: ...

    def preempted(self) -> None: ...


@dataclass
class EngineSim:
    """One engine replica (a DP rank); see the module rules."""

    cfg: EngineConfig
    step: StepFn
    arrivals: Iterator[Arrival]
    observer: EngineObserver
    clock: float = 0.0
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    preemptions: int = 0
    _next: Arrival | None = None
    _rid: int = 0

    def __post_init__(self) -> None:
        self._next = next(self.arrivals, None)

    @property
    def kv_used(self) -> int:
        return sum(r.kv_tokens for r in self.running)

    def advance(self, until_s: float) -> None:
        """Run steps until the clock reaches ``until_s``."""
        while self.clock < until_s:
            self._arrive()
            if not self.running and not self.waiting:
                if self._next is None:
                    self._next = next(self.arrivals, None)
                nxt = self._next.t_s if self._next else until_s
                self.clock = min(max(nxt, self.clock), until_s)
                if self.clock >= until_s:
                    return
                continue
            self._one_step()

    def _arrive(self) -> None:
        if self._next is None:  # a live source (a P/D hand-off queue) may have grown since
            self._next = next(self.arrivals, None)
        while self._next is not None and self._next.t_s <= self.clock:
            a = self._next
            self._rid += 1
            origin = a.origin_s if a.origin_s >= 0 else a.t_s
            req = Request(self._rid, origin, a.isl, a.osl, prompt=a.isl, ready_s=a.t_s)
            if a.kv_ready:  # rule 6: the prompt's KV arrived from a prefill engine
                req.prefilled = req.prompt
                req.remote_kv = True
            self.waiting.append(req)
            self._next = next(self.arrivals, None)

    def _one_step(self) -> None:
        decoders = [r for r in self.running if r.decoding]
        self._make_room(len(decoders))
        decoders = [r for r in self.running if r.decoding]
        chunks = self._schedule_prefill(self.cfg.max_batched_tokens - len(decoders))
        prefill_tokens = sum(n for _, n in chunks)
        ctx = sum(r.kv_tokens for r in decoders)
        cost = self.step(len(decoders), ctx, prefill_tokens, self.clock)
        self.clock += cost.seconds
        self.observer.step(cost, len(decoders), prefill_tokens, cost.seconds)
        for req in decoders:
            req.generated += 1
            req.last_token_s = self.clock
            if req.first_token_s is None:  # a remote-KV request's first token is its first decode
                req.first_token_s = self.clock
                self.observer.first_token(req, self.clock)
        for req, n in chunks:
            req.prefilled += n
            if req.decoding and req.first_token_s is None:
                req.first_token_s = req.last_token_s = self.clock
                req.generated = max(req.generated, 1)
                self.observer.first_token(req, self.clock)
        self._finish_done()

    def _make_room(self, decoders: int) -> None:
        """Rule 3: preempt the newest requests until this step's decode tokens fit."""
        while self.running and self.kv_used + decoders > self.cfg.kv_capacity_tokens:
            victim = self.running.pop()
            decoders -= 1 if victim.decoding else 0
            victim.prompt = victim.isl + victim.generated
            victim.prefilled = 0
            victim.remote_kv = False
            victim.preemptions += 1
            self.preemptions += 1
            self.observer.preempted()
            self.waiting.appendleft(victim)

    def _schedule_prefill(self, budget: int) -> list[tuple[Request, int]]:
        """Rule 4: chunked prefill within the token budget, sequence limit and KV capacity."""
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            if budget <= 0:
                return chunks
            if not req.decoding:
                n = min(req.prompt - req.prefilled, budget)
                chunks.append((req, n))
                budget -= n
        free = self.cfg.kv_capacity_tokens - self.kv_used
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            if req.prompt + 1 > free:
                break
            self.waiting.popleft()
            free -= req.prompt
            if req.scheduled_s is None:
                req.scheduled_s = self.clock
            self.running.append(req)
            if req.decoding:  # its KV came from a prefill engine: nothing to compute
                continue
            n = min(req.prompt, budget)
            chunks.append((req, n))
            budget -= n
        return chunks

    def _finish_done(self) -> None:
        keep: list[Request] = []
        for req in self.running:
            if req.decoding and req.generated >= req.osl:
                self.observer.finished(
                    Finished(
                        req.rid,
                        req.arrival_s,
                        req.scheduled_s or req.arrival_s,
                        req.first_token_s or self.clock,
                        self.clock,
                        req.isl,
                        req.osl,
                        req.preemptions,
                    )
                )
            else:
                keep.append(req)
        self.running = keep
