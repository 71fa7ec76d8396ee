"""A real Prometheus as a source (issue 23 item 1): backfill and follow give the verdicts scraping gives.

Processes and threads, all on 127.0.0.1, all stopped at the end (module fixture ``runs``):

1. the simulator (:class:`simulate.node.Simulation`, in this process) serving dcgm-exporter and vLLM
   ``/metrics`` for three demo deployments built to sit in different zones (``chat-8b`` memory-bound,
   ``code-70b`` compute-bound, ``longctx-70b`` KV-capacity-bound: simulate/spec.py);
2. ``prometheus`` (Debian's) scraping every simulated endpoint every second, ``instance`` set to the
   endpoint's target name (as each real exporter has its own address);
3. sidecar A (:class:`collector.agent.Agent`) scraping the same endpoints directly into store A;
4. sidecar B with no scrape target, only a ``prometheus_sources`` entry with ``follow: true`` polling
   Prometheus every 2 s into store B;
5. after :data:`SCRAPE_S` seconds, ``ioe backfill --prometheus URL`` (the command, in a subprocess)
   reads the whole range into store C.

All three stores get the same declared deployments (the simulator's, whose ``targets`` are the names
Prometheus has as ``instance``). The zone verdicts are the analyzer's over the same window. The
expected answer does not come from the analyzer: it is "what direct scraping gave", and the GPU rows
are compared value by value with the direct scrape's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, free_port, require_component

from analyzer.deployments import list_deployments
from analyzer.report import build_report
from analyzer.thresholds import Thresholds
from collector.agent import Agent
from collector.store import Store
from ioeconf.settings import Settings
from simulate.node import Simulation
from simulate.spec import demo_deployments

pytestmark = [pytest.mark.e2e, pytest.mark.component]

SCRAPE_S = 75  # seconds of 1 s scrapes before the stores are compared
WINDOW_S = 50.0  # the window judged, ending at the newest time every store holds
TH = Thresholds(bin_s=5.0, regression_baseline="previous_window")  # the demo's: minutes, not days
NS = 1_000_000_000


@dataclass
class Runs:
    stores: dict[str, Path]  # "scrape", "follow", "backfill"
    backfill: subprocess.CompletedProcess[str]
    work: Path


class _AgentThread:
    """A sidecar running in a thread of this process, stopped gracefully (its queue drained)."""

    def __init__(self, settings: Settings):
        self.agent = Agent(settings, readers=[])
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"agent:{settings.store_path}")
        self.thread.start()

    def _run(self) -> None:
        self.loop.run_until_complete(self.agent.run(install_signals=False))

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.agent.sidecar.stop)
            self.thread.join(60)


def _settings(work: Path, name: str, sim: Simulation, **more: Any) -> Settings:
    return Settings(
        store_path=str(work / f"{name}.duckdb"),
        listen_port=free_port(),
        api_enabled=False,
        host="test-sidecar",
        deployments=sim.deployment_specs(),
        readers={"nvml": False, "dcgm": False, "infiniband": False},
        flush_interval_s=0.5,
        **more,
    )


def _prometheus_config(sim: Simulation) -> dict[str, Any]:
    static = []
    for t in sim.targets():
        parts = urllib.parse.urlsplit(t["url"])
        static.append(
            {"targets": [parts.netloc], "labels": {"__metrics_path__": parts.path, "instance": t["name"]}}
        )
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "simulated", "static_configs": static}],
    }


def _ready(url: str, tsdb: Path) -> bool:
    """Our Prometheus answers at ``url``: ready, and its TSDB is ours (another test run on this
    machine may have taken the port between free_port() and the bind)."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/status/flags", timeout=2) as resp:
            flags = json.loads(resp.read())["data"]
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return resp.status == 200 and flags.get("storage.tsdb.path") == str(tsdb)
    except (OSError, ValueError, KeyError):
        return False


def _start_prometheus(exe: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus on a free port, tried again on another port if the first is taken meanwhile."""
    for attempt in range(3):
        url = f"http://127.0.0.1:{free_port()}"
        with (work / f"prometheus-{attempt}.log").open("wb") as log:
            prom = subprocess.Popen(
                [exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
                 f"--web.listen-address={url.removeprefix('http://')}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while prom.poll() is None and time.monotonic() < deadline:
            if _ready(url, work / "tsdb"):
                return prom, url
            time.sleep(0.2)
        prom.terminate()
        prom.wait(30)
    raise AssertionError(f"prometheus did not start: {work}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    exe = require_component("prometheus")
    work = tmp_path_factory.mktemp("promsrc")
    sim = Simulation(demo_deployments(surge_at_s=1e9)[:3], tick_s=0.25)
    (work / "prometheus.yml").write_text(yaml.safe_dump(_prometheus_config(sim)))
    agents: list[_AgentThread] = []
    prom: subprocess.Popen[bytes] | None = None
    sim.start()
    try:
        prom, prom_url = _start_prometheus(exe, work)
        targets = [{**t, "interval_s": 1.0, "timeout_s": 1.0} for t in sim.targets()]
        follow = {"name": "prom", "url": prom_url, "follow": True, "interval_s": 2.0, "step_s": 1.0,
                  "since_s": 600.0, "lag_s": 1.0}  # fmt: skip
        agents.append(_AgentThread(_settings(work, "scrape", sim, targets=targets)))
        agents.append(_AgentThread(_settings(work, "follow", sim, prometheus_sources=[follow])))
        started = time.time()
        time.sleep(SCRAPE_S)
        for a in agents:
            a.stop()
        (work / "deployments.yaml").write_text(yaml.safe_dump({"deployments": sim.deployment_specs()}))
        since = f"{time.time() - started + 5:.0f}s"
        command = [sys.executable, "-m", "ioe", "backfill", "--prometheus", prom_url, "--since", since,
                   "--step", "1s", "--store", str(work / "backfill.duckdb"),
                   "--config", str(work / "deployments.yaml"), "--json"]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        backfill = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        stores = {name: work / f"{name}.duckdb" for name in ("scrape", "follow", "backfill")}
        yield Runs(stores, backfill, work)
    finally:
        for a in agents:
            a.stop()
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        sim.stop()


def _newest(path: Path) -> int:
    with Store(path, read_only=True) as st, st.cursor() as cur:
        row = cur.execute("SELECT max(ts_ns) FROM gpu_samples").fetchone()
    return int(row[0]) if row and row[0] else 0


def _report(path: Path, end_ns: int) -> dict[str, dict[str, Any]]:
    with Store(path, read_only=True) as st, st.cursor() as cur:
        report = build_report(cur, list_deployments(cur), end_ns, WINDOW_S, TH)
    return {d["deployment"]["name"]: d for d in report["deployments"]}


def _gpu_stats(
    path: Path, start_ns: int, end_ns: int
) -> dict[tuple[str, int, str], tuple[int, float, float]]:
    sql = """SELECT host, gpu, metric, count(*), avg(value), coalesce(stddev_pop(value), 0) FROM gpu_samples
             WHERE ts_ns > ? AND ts_ns <= ? GROUP BY ALL"""
    with Store(path, read_only=True) as st, st.cursor() as cur:
        rows = cur.execute(sql, [start_ns, end_ns]).fetchall()
    return {(h, g, m): (int(n), float(v), float(sd)) for h, g, m, n, v, sd in rows}


def test_backfill_command_reads_every_simulated_target(runs: Runs) -> None:
    assert runs.backfill.returncode == 0, runs.backfill.stderr
    assert '"error": ""' in runs.backfill.stdout
    with Store(runs.stores["backfill"], read_only=True) as st, st.cursor() as cur:
        rows = cur.execute("SELECT target FROM targets WHERE kind = 'prometheus'").fetchall()
        targets = {r[0] for r in rows}
        tables = {t: st.count(t) for t in ("gpu_samples", "engine_samples", "histogram_buckets")}
    sim_targets = {f"{d}/vllm" for d in ("chat-8b", "code-70b", "longctx-70b")}
    assert sim_targets <= targets and all(n > 1000 for n in tables.values()), (targets, tables)


@pytest.mark.parametrize("mode", ["backfill", "follow"])
def test_zone_verdicts_equal_direct_scraping(runs: Runs, mode: str) -> None:
    end_ns = min(_newest(p) for p in runs.stores.values()) - 2 * NS
    direct, got = _report(runs.stores["scrape"], end_ns), _report(runs.stores[mode], end_ns)
    assert set(direct) == set(got) == {"chat-8b", "code-70b", "longctx-70b"}
    zones = {name: (d["envelope"]["primary"], got[name]["envelope"]["primary"]) for name, d in direct.items()}
    # the three deployments are built to sit in three zones; Prometheus-sourced rows must say the same
    assert all(a == b for a, b in zones.values()), zones
    assert len({a for a, _ in zones.values()}) == 3, zones


@pytest.mark.parametrize("mode", ["backfill", "follow"])
def test_gpu_samples_match_direct_scraping(runs: Runs, mode: str) -> None:
    """Each GPU series has one point a second from Prometheus (its step is the scrape interval)
    and about one a second from the direct scrape, and its mean over the window agrees. The two
    samplers read one signal at different instants (the sidecar at its scrape, Prometheus at its
    own, then the step takes the latest), so the means of a varying series differ by sampling
    noise, about std·sqrt(2/n) ≈ 0.2 std for n ≈ 50, plus aliasing of what moves within a second:
    the bound is 5 % of the mean or the larger of the two standard deviations. (The simulator's
    values move within a second: a GPU's
    temperature read 56-69 °C a few ticks apart, and one sampler's phase can keep seeing 58.)"""
    end_ns = min(_newest(p) for p in runs.stores.values()) - 2 * NS
    start_ns = end_ns - int(WINDOW_S * NS)
    direct = _gpu_stats(runs.stores["scrape"], start_ns, end_ns)
    got = _gpu_stats(runs.stores[mode], start_ns, end_ns)
    assert set(direct) == set(got) and len(direct) >= 10 * 20  # 10 GPUs, 24 fields each
    # one point per 1 s step from Prometheus, less the steps after a scrape that timed out on a
    # loaded machine (Prometheus marks the target's series stale until its next scrape)
    steps = int(WINDOW_S)
    for key, (n, mean, sd_direct) in direct.items():
        m, other, sd_got = got[key]
        sd = max(sd_direct, sd_got)
        assert 0.85 * steps <= m <= steps + 1, (key, m)
        # the in-process scraper misses scrapes when this shared 2-core machine is loaded (42 of 50 seen
        # at load average 20); Prometheus' step then still holds the latest value
        assert abs(m - n) <= 0.25 * n + 2, (key, n, m)
        # one standard deviation: a value that swings faster than the 1 s sampling aliases, and two
        # samplers locked to different phases keep seeing different parts of the swing (a busier
        # code-70b: 58.0 vs 61.0 °C with sd 5.0 over the same 60 s)
        assert abs(other - mean) <= max(0.05 * abs(mean), sd, 0.02), (key, mean, sd, other)
