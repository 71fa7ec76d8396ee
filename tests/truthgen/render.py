"""Render a :class:`~truthgen.scenarios.Scenario` into a capture directory ``ioe ingest`` reads.

Layout (one directory per scenario)::

    scrapes/<unix seconds>/<host>-dcgm.prom.gz     dcgm-exporter body of that host's GPUs
    scrapes/<unix seconds>/<server>-vllm.prom.gz   a vLLM API server's /metrics body
    nccl/<host>-pid<pid>.log                        NCCL Inspector JSONL of one rank (its own stamps)
    spans/<server>-otlp.jsonl                       P/D only: the decode server's request spans (note 5)
    deployment.yaml                                 the deployment as an IOE config file declares it
    expected.json                                   the expert's verdict and reason
    scenario.json                                   the parameters and the generator's own numbers

Notes:

1. ``ioe ingest`` stamps a scrape body with ``--ts`` (scrape bodies carry no time of their own), so a
   scrape lives in a directory named by its capture time: ingest each ``scrapes/<ts>`` with
   ``--ts <ts>``; the Inspector logs carry ``dump_timestamp_us`` and are ingested once.
2. File names stay the same from scrape to scrape (the store names a series' source after its
   file), so a host's or server's series continue across time.
3. Bodies are gzipped (``ioe ingest`` gunzips by magic bytes) to keep a scenario under ~2 MB; the
   text inside is byte for byte what the exporter or engine serves.
4. Latency histograms add n × CDF(le) of a log-normal per interval (median = the interval's
   modelled latency, σ the scenario's jitter) and print the floor of the running totals, so counts
   are integers that never decrease.
5. A P/D scenario (one with a KV link) also writes the decode server's request spans: per interval
   up to :data:`SPANS_PER_INTERVAL` of the requests it completed, each with log-normal queue (σ 0.6),
   prefill (σ 0.3) and KV-transfer (σ 0.3) times around the interval's medians, TTFT their sum and
   e2e TTFT plus the decode steps. The span draws use their own random stream, so the scrapes and
   NCCL logs are the same with or without them.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from truthgen.engine import Interval, Layout, activity, solve
from truthgen.formats import (
    EngineState,
    GpuIdentity,
    Histogram,
    RequestSpan,
    dcgm_text,
    inspector_line,
    otlp_json_line,
    vllm_text,
)
from truthgen.physics import GB, all_reduce_s
from truthgen.scenarios import Phase, Scenario

MIB = 1024 * 1024
SPANS_PER_INTERVAL = 12


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def observe(h: Histogram, n: float, median: float, sigma: float) -> None:
    """Note 4: n log-normal observations of ``median`` and ``sigma`` into ``h``'s running totals."""
    if n <= 0 or median <= 0:
        return
    per = [n * _phi((math.log(le) - math.log(median)) / sigma) for le in h.bounds]
    h.add(per, n, n * median * math.exp(sigma * sigma / 2))


@dataclass
class _Gpu:
    ident: GpuIdentity
    energy_mj: float = 0.0


@dataclass
class _Engine:
    index: int
    role: str  # both | prefill | decode
    server: str
    gpus: list[_Gpu]
    state: EngineState
    waiting: float = 0.0
    coll_sn: int = 0
    ep_sn: int = 0
    last: Interval | None = None


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _engines(sc: Scenario, rng: random.Random) -> list[_Engine]:
    out = []
    for e, spec in enumerate(sc.engines):
        gpus = [
            _Gpu(
                GpuIdentity(
                    host, idx, _uuid(rng), f"00000000:{0x18 + 0x11 * idx:02X}:00.0", sc.gpu.dcgm_model
                )
            )
            for host, idx in spec.gpus
        ]
        kv_blocks = int(sc.kv_pool_tokens(spec) / 16)
        st = EngineState(
            engine=str(spec.engine_label),
            model=sc.model.name,
            num_gpu_blocks=kv_blocks,
            created=sc.t0 - 600.0 + 0.1 * e,
        )
        out.append(_Engine(e, spec.role, spec.server, gpus, st))
    return out


def _interval(sc: Scenario, eng: _Engine, t_mid: float, dt: float, rng: random.Random) -> Interval:
    ph = sc.phase_at(t_mid)
    noise = 1.0 + sc.load_noise * rng.gauss(0.0, 1.0)
    arrival = max(ph.arrival_at(t_mid) * noise / sc.engines_serving(eng.role), 0.0)
    spec = sc.engines[eng.index]
    lay = Layout(spec.tp, sc.ep, sc.tp_fabric(spec), sc.ep_fabric(), sc.max_num_seqs)
    osl = 1 if eng.role == "prefill" else ph.osl
    iv, eng.waiting = solve(
        sc.model,
        sc.gpu,
        lay,
        arrival=arrival,
        isl=ph.isl,
        osl=osl,
        waiting=eng.waiting,
        dt=dt,
        local_prefill=eng.role != "decode",
    )
    return iv


def _account(sc: Scenario, eng: _Engine, iv: Interval, dt: float, ph: Phase, kv: tuple[float, float]) -> None:
    """Counters, gauges and histograms of one interval (note 4); ``kv`` = (requests waiting on a
    KV transfer, seconds each waits) for a P/D decode engine."""
    st = eng.state
    assert st.hists is not None
    done = iv.completions * dt
    osl = 1 if eng.role == "prefill" else ph.osl
    isl = ph.isl
    kv_wait, extra_queue_s = kv if eng.role == "decode" else (0.0, 0.0)
    st.running = round(iv.running)
    st.waiting = round(iv.waiting + kv_wait)
    st.waiting_deferred = round(kv_wait)
    st.kv_usage = round(iv.kv_usage, 6)
    st.preemptions += iv.preempt_per_s * dt
    prompt = done * isl
    st.prompt_tokens += prompt
    if eng.role == "decode":
        st.prompt_tokens_external += prompt
    st.prefix_queries += prompt
    st.generation_tokens += done * osl
    st.success_stop += 0.6 * done
    st.success_length += 0.4 * done
    st.flops += iv.per_s("flops") * dt
    st.read_bytes += iv.per_s("bytes") * dt
    t = iv.itl_mean_s
    sigma = sc.itl_sigma
    queue = iv.queue_s + extra_queue_s
    ttft = queue + iv.ttft_service_s
    h = st.hists
    observe(h["request_prompt_tokens"], done, isl, 0.3)
    observe(h["request_generation_tokens"], done, osl, 0.3)
    observe(h["time_to_first_token_seconds"], done, ttft, 0.45)
    itl_n = done * max(osl - 1, 0)
    observe(h["inter_token_latency_seconds"], itl_n * (1 - iv.q_mix), iv.dec.total_s, sigma)
    observe(h["inter_token_latency_seconds"], itl_n * iv.q_mix, iv.mix.total_s, sigma)
    observe(h["request_time_per_output_token_seconds"], done if osl > 1 else 0, t, sigma / 3)
    observe(h["e2e_request_latency_seconds"], done, ttft + (osl - 1) * t, 0.35)
    observe(h["request_queue_time_seconds"], done, queue, 0.6)
    observe(h["request_inference_time_seconds"], done, iv.ttft_service_s + (osl - 1) * t, 0.35)
    observe(h["request_prefill_time_seconds"], done, iv.ttft_service_s, 0.3)
    observe(h["request_decode_time_seconds"], done if osl > 1 else 0, (osl - 1) * t, 0.35)


def _gpu_values(sc: Scenario, eng: _Engine, iv: Interval, g: _Gpu, dt: float, extra_pcie: float) -> dict:
    act = activity(iv, sc.gpu)
    busy_w = sc.gpu.idle_w + (sc.gpu.max_w - sc.gpu.idle_w) * min(
        0.15 * act["gr"] + 0.45 * act["tensor"] + 0.4 * act["dram"], 1.0
    )
    g.energy_mj += busy_w * dt * 1000
    total_mib = sc.gpu.hbm_bytes / MIB
    used = total_mib * 0.9 + 600
    n_mix = iv.mix_steps_per_s
    per_s = iv.coll_calls_per_step * ((iv.steps_per_s - n_mix) * iv.coll_msg_bytes + n_mix * iv.mix_msg_bytes)
    spec = sc.engines[eng.index]
    link = per_s * 2 * (spec.tp - 1) / max(spec.tp, 1) * 2
    fab = sc.tp_fabric(spec)
    nvlink = link if fab is not None and not fab.crosses_nodes else 0.3 * link
    pcie = 2e8 + (link if fab is not None and fab.crosses_nodes else 0.0) + extra_pcie
    temp = 30 + 40 * busy_w / sc.gpu.max_w
    vals = {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_MEMORY_TEMP": temp + 6,
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_POWER_USAGE": busy_w,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 4.2e9 + g.energy_mj,
        "DCGM_FI_DEV_GPU_UTIL": 100 * min(iv.busy * 1.02, 1.0),
        "DCGM_FI_DEV_MEM_COPY_UTIL": 100 * act["dram"] * 0.9,
        "DCGM_FI_DEV_FB_FREE": total_mib - used - 520,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_RESERVED": 520,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": nvlink / 1e6,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": act["gr"],
        "DCGM_FI_PROF_SM_ACTIVE": act["sm"],
        "DCGM_FI_PROF_SM_OCCUPANCY": act["sm"] * 0.35,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": act["tensor"],
        "DCGM_FI_PROF_DRAM_ACTIVE": act["dram"],
        "DCGM_FI_PROF_PCIE_TX_BYTES": pcie,
        "DCGM_FI_PROF_PCIE_RX_BYTES": pcie * 0.97,
    }
    return vals


def _nccl(sc: Scenario, engines: list[_Engine], ts: float, dt: float, rng: random.Random, logs: dict) -> None:
    """The Inspector's dump at ``ts``: per communicator and rank, the latest completed collective."""
    for eng in engines:
        iv, spec = eng.last, sc.engines[eng.index]
        fab = sc.tp_fabric(spec)
        if iv is None or fab is None or iv.steps_per_s <= 0:
            continue
        steps = dt * iv.steps_per_s
        mixed = rng.random() < iv.mix_steps_per_s / iv.steps_per_s  # the sampled call's step kind
        if sc.model.moe and sc.ep > 1:
            eng.coll_sn += int(steps * sc.model.layers)  # attention: one TP all-reduce per layer here
            msg = (iv.running + (iv.chunk if mixed else 0.0)) * sc.model.hidden * 2
            per_call = all_reduce_s(msg, spec.tp, fab)
        else:
            eng.coll_sn += int(steps * iv.coll_calls_per_step)
            msg, per_call = (
                (iv.mix_msg_bytes, iv.mix_s_per_call) if mixed else (iv.coll_msg_bytes, iv.coll_s_per_call)
            )
        if steps < 1.0:  # no collective completed since the last dump: the Inspector writes nothing
            continue
        _emit(
            sc,
            logs,
            f"0x{0x5EED0000 + eng.index:016x}",
            f"TP{eng.index}",
            eng.gpus,
            "AllReduce",
            eng.coll_sn,
            msg,
            per_call,
            spec.tp,
            ts,
            rng,
            sc.tp_jitter(spec),
        )
    if sc.model.moe and sc.ep > 1:
        _moe_dump(sc, engines, ts, dt, rng, logs)


def _moe_dump(
    sc: Scenario, engines: list[_Engine], ts: float, dt: float, rng: random.Random, logs: dict
) -> None:
    iv = engines[0].last
    if iv is None:
        return
    steps = dt * iv.steps_per_s
    engines[0].ep_sn += int(steps * iv.coll_calls_per_step)
    sn = engines[0].ep_sn
    op = "AllGather" if sn % 2 == 0 else "ReduceScatter"
    gpus = [g for e in engines for g in e.gpus]
    _emit(
        sc,
        logs,
        "0x00e90000c0ffee00",
        "EP",
        gpus,
        op,
        sn,
        iv.coll_msg_bytes,
        iv.coll_s_per_call,
        sc.ep,
        ts,
        rng,
        sc.ep_jitter(),
    )


def _emit(
    sc: Scenario,
    logs: dict,
    comm_id: str,
    name: str,
    gpus: list[_Gpu],
    op: str,
    sn: int,
    msg: float,
    per_call_s: float,
    n: int,
    ts: float,
    rng: random.Random,
    sigma: float,
) -> None:
    nnodes = len({g.ident.host for g in gpus})
    factor = 2 * (n - 1) / n if op == "AllReduce" else (n - 1) / n
    for rank, g in enumerate(gpus):
        exec_s = per_call_s * math.exp(sigma * rng.gauss(0.0, 1.0))
        algbw = msg / exec_s / GB
        pid = 20000 + 10 * g.ident.index
        line = inspector_line(
            comm_id=comm_id,
            comm_name=name,
            rank=rank,
            n_ranks=n,
            nnodes=nnodes,
            host=g.ident.host,
            pid=pid,
            dump_us=int(ts * 1e6) + rank,
            op=op,
            sn=sn,
            msg_bytes=int(msg),
            exec_us=exec_s * 1e6,
            algbw_gbs=algbw,
            busbw_gbs=algbw * factor,
        )
        logs.setdefault(f"{g.ident.host}-pid{pid}.log", []).append(line)


def _spans(sc: Scenario, eng: _Engine, iv: Interval, ph: Phase, ts: float, kv_s: float,
           rng: random.Random) -> list[RequestSpan]:  # fmt: skip
    """Note 5: the decode engine's completed requests of one interval as spans."""
    n = min(int(iv.completions * sc.scrape_s), SPANS_PER_INTERVAL)
    out = []
    for _ in range(n):
        queue = iv.queue_s * math.exp(0.6 * rng.gauss(0.0, 1.0))
        prefill = iv.ttft_service_s * math.exp(0.3 * rng.gauss(0.0, 1.0))
        kv = kv_s * math.exp(0.3 * rng.gauss(0.0, 1.0))
        ttft = queue + prefill + kv
        end_ns = round((ts - rng.uniform(0.0, sc.scrape_s)) * 1e9)
        ids = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64) or 1:016x}"
        e2e = ttft + (ph.osl - 1) * iv.itl_mean_s
        out.append(RequestSpan(*ids, end_ns, queue, prefill, kv, ttft, e2e, ph.isl, ph.osl))
    return out


def _write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode(), compresslevel=6, mtime=0))


def render(sc: Scenario, out: Path) -> dict[str, Any]:
    """Write ``sc`` under ``out`` (layout in the module docstring); return the per-interval summary."""
    rng = random.Random(sc.seed)
    span_rng = random.Random(sc.seed + 7919)
    spans: dict[str, list[str]] = {}
    engines = _engines(sc, rng)
    dt = sc.scrape_s
    logs: dict[str, list[str]] = {}
    summary: list[dict[str, float]] = []
    for k in range(1, int(sc.duration_s / dt) + 1):
        t_mid, ts = (k - 0.5) * dt, sc.t0 + k * dt
        ph = sc.phase_at(t_mid)
        kv_wait, extra_queue, pcie_pd = sc.kv_transfer(t_mid)
        per_host: dict[str, tuple[list[GpuIdentity], list[dict]]] = {}
        for eng in engines:
            iv = _interval(sc, eng, t_mid, dt, rng)
            eng.last = iv
            _account(sc, eng, iv, dt, ph, (kv_wait, extra_queue))
            if sc.kv_link is not None and eng.role == "decode":
                reqs = _spans(sc, eng, iv, ph, ts, extra_queue, span_rng)
                if reqs:
                    line = otlp_json_line("vllm", sc.model.name, reqs)
                    spans.setdefault(f"{eng.server}-otlp.jsonl", []).append(line)
            act = activity(iv, sc.gpu)
            pcie = pcie_pd if eng.role in ("prefill", "decode") else 0.0
            for g in eng.gpus:
                ids, vals = per_host.setdefault(g.ident.host, ([], []))
                ids.append(g.ident)
                vals.append(_gpu_values(sc, eng, iv, g, dt, pcie))
            summary.append(
                {
                    "t_s": k * dt,
                    "engine": eng.index,
                    "running": iv.running,
                    "waiting": iv.waiting,
                    "kv_usage": iv.kv_usage,
                    "itl_ms": iv.itl_mean_s * 1e3,
                    "dram": act["dram"],
                    "tensor": act["tensor"],
                    "sm": act["sm"],
                    "comm_share": act["comm_share"],
                    "queue_s": iv.queue_s + (extra_queue if eng.role == "decode" else 0.0),
                    "completions_per_s": iv.completions,
                    "arrival_per_s": iv.arrival,
                    "kv_wait_requests": kv_wait,
                }
            )
        folder = out / "scrapes" / f"{ts:.0f}"
        for host, (ids, vals) in sorted(per_host.items()):
            order = sorted(range(len(ids)), key=lambda i: ids[i].index)
            body = dcgm_text([ids[i] for i in order], [vals[i] for i in order], profiling=sc.profiling)
            _write_gz(folder / f"{host}-dcgm.prom.gz", body)
        for server in sorted({e.server for e in engines}):
            body = vllm_text([e.state for e in engines if e.server == server])
            _write_gz(folder / f"{server}-vllm.prom.gz", body)
        _nccl(sc, engines, ts, dt, rng, logs)
    for name, lines in sorted(spans.items()):
        p = out / "spans" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(lines) + "\n")
    for name, lines in sorted(logs.items()):
        p = out / "nccl" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(lines) + "\n")
    (out / "deployment.yaml").write_text(sc.deployment_yaml())
    (out / "expected.json").write_text(json.dumps(sc.expected_json(), indent=2) + "\n")
    (out / "scenario.json").write_text(
        json.dumps({"parameters": sc.describe(), "intervals": summary}, indent=1, default=str) + "\n"
    )
    return {"intervals": summary, "expected": asdict(sc.expected)}
