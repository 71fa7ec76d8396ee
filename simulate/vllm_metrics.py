"""The simulated engines' ``/metrics``: vLLM 0.33's own metric names, labels and buckets.

The registry is a real prometheus_client registry, as in vLLM itself, so the exposition text
is byte-for-byte the shape a scraper meets in production (``vllm:`` names, ``engine`` = DP
index, ``model_name``, ``_created`` samples). Buckets are vLLM's defaults (REFERENCE §2;
``fixtures/engine/vllm_0.33.0_dp1.prom``).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from simulate.engine import Finished, Request, StepCost

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
PHASE_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NIXL_BYTES_BUCKETS = tuple(float(2**k) for k in range(20, 36, 2))  # 1 MiB … 16 GiB
LABELS = ["engine", "model_name"]


class VllmRegistry:
    """One deployment's engine metrics; :meth:`observer` binds one DP engine's labels."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"vllm:{name}", doc, LABELS, buckets=buckets, registry=r)

        self.ttft = hist(
            "time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = hist(
            "request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", PHASE_BUCKETS
        )
        self.queue = hist(
            "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            PHASE_BUCKETS,
        )
        self.inference = hist(
            "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            PHASE_BUCKETS,
        )
        self.prefill = hist(
            "request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            PHASE_BUCKETS,
        )
        self.decode = hist(
            "request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            PHASE_BUCKETS,
        )
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=r
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=r
        )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", LABELS, registry=r
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        # NIXL KV connector (disaggregated prefill/decode), on the engine that receives the KV
        self.nixl_time = hist(
            "nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            NIXL_TIME_BUCKETS,
        )
        self.nixl_bytes = hist(
            "nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            NIXL_BYTES_BUCKETS,
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=r,
        )

    def observer(
        self, engine: int, on_finish: Callable[[Finished], None], receives_kv: bool = False
    ) -> EngineMetrics:
        return EngineMetrics(self, str(engine), on_finish, receives_kv)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class EngineMetrics:
    """The observer one simulated engine reports to (see :class:`simulate.engine.EngineObserver`)."""

    def __init__(
        self, reg: VllmRegistry, engine: str, on_finish: Callable[[Finished], None], receives_kv: bool = False
    ):
        self.reg = reg
        self.labels = (engine, reg.model_name)
        self.on_finish = on_finish
        hists: tuple[Histogram, ...] = (
            reg.ttft,
            reg.itl,
            reg.tpot,
            reg.e2e,
            reg.queue,
            reg.inference,
            reg.prefill,
            reg.decode,
        )
        if receives_kv:
            hists += (reg.nixl_time, reg.nixl_bytes)
        for metric in (*hists, reg.running, reg.waiting, reg.kv_usage, reg.preemptions, reg.prompt_tokens,
                       reg.generation_tokens):  # fmt: skip
            metric.labels(*self.labels)  # every series exists at 0 from start-up, as in vLLM
        reg.success.labels(*self.labels, "length")

    def step(self, cost: StepCost, decoding: int, prefill_tokens: int, itl_s: float) -> None:
        lab = self.labels
        if decoding:
            self.reg.generation_tokens.labels(*lab).inc(decoding)
            itl = self.reg.itl.labels(*lab)
            for _ in range(decoding):
                itl.observe(itl_s)
        if prefill_tokens:
            self.reg.prompt_tokens.labels(*lab).inc(prefill_tokens)

    def first_token(self, req: Request, now: float) -> None:
        self.reg.ttft.labels(*self.labels).observe(now - req.arrival_s)
        if not req.remote_kv:  # a remote-KV request's first token was counted by its decode step
            self.reg.generation_tokens.labels(*self.labels).inc()

    def kv_transfer(self, seconds: float, nbytes: float) -> None:
        """One NIXL transfer of a prompt's KV into this engine."""
        self.reg.nixl_time.labels(*self.labels).observe(seconds)
        self.reg.nixl_bytes.labels(*self.labels).observe(nbytes)

    def preempted(self) -> None:
        self.reg.preemptions.labels(*self.labels).inc()

    def finished(self, done: Finished) -> None:
        lab, r = self.labels, self.reg
        e2e = done.finish_s - done.arrival_s
        r.e2e.labels(*lab).observe(e2e)
        r.queue.labels(*lab).observe(done.scheduled_s - done.arrival_s)
        r.inference.labels(*lab).observe(done.finish_s - done.scheduled_s)
        r.prefill.labels(*lab).observe(done.first_token_s - done.scheduled_s)
        r.decode.labels(*lab).observe(done.finish_s - done.first_token_s)
        if done.osl > 1:
            r.tpot.labels(*lab).observe((done.finish_s - done.first_token_s) / (done.osl - 1))
        r.success.labels(*lab, "length").inc()
        self.on_finish(done)

    def gauges(self, running: int, waiting: int, kv_usage: float) -> None:
        self.reg.running.labels(*self.labels).set(running)
        self.reg.waiting.labels(*self.labels).set(waiting)
        self.reg.kv_usage.labels(*self.labels).set(kv_usage)
