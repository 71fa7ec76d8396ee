"""``ioe demo``: simulated deployments → the sidecar → the store → the analysis → the API and page.

Everything runs in one process on 127.0.0.1: the simulator (:mod:`simulate`) serves
dcgm-exporter and vLLM endpoints, sends OTLP spans to the sidecar's ``/v1/traces`` and writes
NCCL Inspector logs; the sidecar (:class:`collector.agent.Agent`) scrapes, tails and receives
into a DuckDB file and serves the API and page. After ``warmup_s`` the analysis runs over what
was stored and the terminal report is printed; the demo then keeps serving until ``duration_s``
has passed (or Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.thresholds import Thresholds
from api.agent import serve_api
from collector.agent import Agent
from ioe.report import demo_report, render_report
from ioe.settings import DeploymentSpec, NodeReaders, Settings, TargetSpec
from simulate.node import Simulation
from simulate.spec import demo_deployments

# A demo sees minutes, not days: 5 s bins, and the regression baseline is the run's first half.
DEMO_THRESHOLDS = Thresholds(bin_s=5.0, regression_baseline="previous_window")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo_settings(sim: Simulation, workdir: Path, port: int) -> Settings:
    """Sidecar settings that scrape every simulated endpoint every second."""
    targets = [TargetSpec(name=t["name"], url=t["url"], kind=t["kind"], host=t.get("host", ""),
                          interval_s=1.0, timeout_s=2.0) for t in sim.targets()]  # fmt: skip
    return Settings(
        store_path=str(workdir / "ioe-demo.duckdb"),
        listen_port=port,
        host="demo-sidecar",
        targets=targets,
        deployments=[DeploymentSpec(**d) for d in sim.deployment_specs()],
        nccl_inspector_dir=str(workdir / "nccl"),
        readers=NodeReaders(nvml=True, dcgm=True, infiniband=True, sysfs_infiniband=str(workdir / "no-ib")),
        flush_interval_s=0.5,
        maintenance_interval_s=30.0,
        analysis=DEMO_THRESHOLDS.model_dump(),  # the page, API and /metrics judge with the report's settings
    )


async def run_demo(
    *,
    duration_s: float,
    warmup_s: float,
    port: int = 0,
    workdir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the whole demo; returns the report that was printed."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="ioe-demo-"))
    port = port or free_port()
    sim = Simulation(demo_deployments(surge_at_s=warmup_s * 0.6), otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces",
                     inspector_dir=str(workdir / "nccl"))  # fmt: skip
    agent = Agent(demo_settings(sim, workdir, port), frontend=serve_api)
    echo(f"ioe demo: {len(sim.deployments)} simulated deployments, "
         f"{sum(len(d.gpus) for d in sim.deployments)} GPUs; store {agent.settings.store_path}")  # fmt: skip
    echo(f"ioe demo: page and API at http://127.0.0.1:{port}/  (Ctrl-C stops)")
    sim.start()
    agent_task = asyncio.create_task(agent.run(install_signals=False))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError):
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    report: dict[str, Any] = {}
    try:
        if await _progress(agent, warmup_s, stop, echo):
            report = await asyncio.to_thread(_analyze, agent)
            echo(render_report(report))
        await _wait(stop, max(duration_s - warmup_s, 0.0)) if duration_s != float(
            "inf"
        ) else await stop.wait()
    finally:
        await asyncio.to_thread(sim.stop)  # first, so the last spans still find the receiver
        agent.sidecar.stop()
        await asyncio.gather(agent_task, return_exceptions=True)
    return report


def _analyze(agent: Agent) -> dict[str, Any]:
    agent.writer.flush_now()
    agent.store.maintain()
    with agent.store.cursor() as cur:
        return demo_report(cur, window_s=None, th=DEMO_THRESHOLDS)


async def _progress(agent: Agent, warmup_s: float, stop: asyncio.Event, echo: Callable[[str], None]) -> bool:
    """Print what has been stored every 10 s during warm-up; False if stopped first."""
    t0 = time.monotonic()
    while (left := warmup_s - (time.monotonic() - t0)) > 0:
        if await _wait(stop, min(10.0, left)):
            return False
        up = sum(1 for s in agent.sidecar.states.values() if s.health.up)
        echo(f"  warming up: {time.monotonic() - t0:4.0f}/{warmup_s:.0f} s, {up}/{len(agent.sidecar.states)} "
             f"sources up, rows stored: {_stored(agent)}")  # fmt: skip
    return True


def _stored(agent: Agent) -> str:
    got = agent.metrics.stored_by_table
    keys = ("gpu_samples", "engine_samples", "histogram_buckets", "request_spans", "collective_records")
    return ", ".join(f"{k} {got.get(k, 0)}" for k in keys)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop``; True when stopped."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
