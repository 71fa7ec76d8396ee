"""What the simulated engines send or write besides ``/metrics``: OTLP spans and NCCL Inspector logs.

Spans (REFERENCE §2): one vLLM ``llm_request`` SERVER span per finished request, sent with the
real OpenTelemetry SDK (``BatchSpanProcessor`` + OTLP/HTTP protobuf exporter), with the
``gen_ai.latency.*`` seconds and ``gen_ai.usage.*`` token counts vLLM sets. The resource carries
``service.name=vllm`` and the Kubernetes semantic-convention names of the pod and deployment.

NCCL Inspector (REFERENCE §3): ``<dir>/<host>-pid<pid>.log`` JSONL in format v4.0 with verbose
``event_trace_ts``. Rules:
1. One call of the group's collective per sampled engine step is written for every rank (the
   Inspector's dump thread writes the latest completed collective per interval: a sample);
   ``coll_sn`` advances by the step's real number of calls (2 per layer: TP all-reduces, or
   EP dispatch + combine all-to-alls) so the gaps say how many calls a record stands for.
   The op is ``AllReduce`` for TP, ``AlltoAll`` (NCCL ≥ 2.28's native all-to-all) for EP;
   busbw = algbw × 2(n−1)/n for AllReduce, × (n−1)/n for AlltoAll.
2. Each rank arrives when the step's model says (a throttled, contended or hung rank later,
   with ±2 % noise); the collective ends when the last rank has arrived plus the transfer time;
   each rank's ``coll_exec_time_us`` runs from its own arrival to the end, so it includes
   waiting, as the real field does.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from simulate.engine import Finished


class SpanEmitter:
    """Sends one ``llm_request`` span per finished request to an OTLP/HTTP endpoint."""

    def __init__(
        self, endpoint: str, deployment: str, model: str, pod: str, headers: dict[str, str] | None = None
    ):
        resource = Resource.create(
            {
                "service.name": "vllm",
                "k8s.deployment.name": deployment,
                "k8s.pod.name": pod,
                "k8s.namespace.name": "inference",
            }
        )
        self.provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=endpoint, headers=headers or {}, timeout=5)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self.tracer = self.provider.get_tracer("vllm.tracing")
        self.model = model

    def emit(self, done: Finished, epoch_s: float, dp_rank: int) -> None:
        def ns(t: float) -> int:
            return int((epoch_s + t) * 1e9)

        span = self.tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=ns(done.arrival_s))
        span.set_attributes(
            {
                "gen_ai.request.id": f"cmpl-{dp_rank}-{done.rid}",
                "gen_ai.response.model": self.model,
                "gen_ai.request.max_tokens": done.osl,
                "gen_ai.usage.prompt_tokens": done.isl,
                "gen_ai.usage.completion_tokens": done.osl,
                "gen_ai.latency.time_in_queue": done.scheduled_s - done.arrival_s,
                "gen_ai.latency.time_to_first_token": done.first_token_s - done.arrival_s,
                "gen_ai.latency.e2e": done.finish_s - done.arrival_s,
                "gen_ai.latency.time_in_model_prefill": done.first_token_s - done.scheduled_s,
                "gen_ai.latency.time_in_model_decode": done.finish_s - done.first_token_s,
                "gen_ai.latency.time_in_model_inference": done.finish_s - done.scheduled_s,
                "dp_rank": dp_rank,
            }
        )
        span.end(end_time=ns(done.finish_s))

    def close(self) -> None:
        self.provider.shutdown()


@dataclass
class InspectorWriter:
    """Writes sampled TP all-reduce records for one TP group (module rules 1–2)."""

    directory: Path
    deployment: str
    hosts: list[str]  # host of each rank
    layers: int
    comm_id: str = ""
    comm_name: str = ""
    coll_sn: int = 0
    rng: random.Random = field(default_factory=random.Random)
    _files: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.comm_id = self.comm_id or f"0x{abs(hash(self.deployment)) % (1 << 60):x}"
        self.comm_name = self.comm_name or f"{self.deployment}-tp"

    def write_step(
        self,
        start_us: float,
        arrivals_us: list[float],
        transfer_us: float,
        msg_bytes: int,
        op: str = "AllReduce",
        calls: int = 0,
    ) -> None:
        """Rules 1-2 for one sampled call of a step that started at ``start_us``: ``arrivals_us``
        are the ranks' arrivals (epoch µs)."""
        arrivals = [start_us + (a - start_us) * self.rng.uniform(0.98, 1.02) for a in arrivals_us]
        end = max(arrivals) + transfer_us
        n = len(arrivals)
        nnodes = len(set(self.hosts))
        self.coll_sn += calls or 2 * self.layers
        for rank, arrive in enumerate(arrivals):
            rec = self._record(rank, n, nnodes, arrive, end, msg_bytes, op)
            self._file(rank).write(json.dumps(rec, separators=(",", ":")) + "\n")

    def _record(
        self, rank: int, n: int, nnodes: int, start: float, stop: float, msg: int, op: str
    ) -> dict[str, Any]:
        exec_us = stop - start
        algbw = msg / (exec_us * 1e-6) / 1e9 if exec_us > 0 else 0.0
        factor = 2 * (n - 1) / n if op == "AllReduce" else (n - 1) / n
        return {
            "header": {
                "id": self.comm_id,
                "comm_name": self.comm_name,
                "rank": rank,
                "n_ranks": n,
                "nnodes": nnodes,
            },
            "metadata": {
                "inspector_output_format_version": "v4.0",
                "rec_mechanism": "profiler_plugin",
                "dump_timestamp_us": int(stop) + 1000,
                "hostname": self.hosts[rank],
                "pid": 4000 + rank,
            },
            "coll_perf": {
                "coll": op,
                "coll_sn": self.coll_sn,
                "coll_msg_size_bytes": msg,
                "coll_exec_time_us": round(exec_us, 3),
                "coll_timing_source": "kernel_gpu",
                "coll_algobw_gbs": round(algbw, 4),
                "coll_busbw_gbs": round(algbw * factor, 4),
                "event_trace_ts": {
                    "coll_start_ts": int(start),
                    "coll_stop_ts": int(stop),
                    "kernel_events": [
                        {
                            "channel_id": 0,
                            "kernel_start_ts": int(start),
                            "kernel_stop_ts": int(stop),
                            "kernel_record_ts": int(stop) + 5,
                        }
                    ],
                },
            },
        }

    def _file(self, rank: int) -> Any:
        if rank not in self._files:
            path = self.directory / f"{self.hosts[rank]}-pid{4000 + rank}.log"
            self._files[rank] = path.open("a", buffering=1)
        return self._files[rank]

    def close(self) -> None:
        for fh in self._files.values():
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        self._files.clear()
