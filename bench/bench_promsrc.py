"""Backfill speed and memory: days of an 8-GPU node read from a real Prometheus with ``ioe backfill``.

Run: ``.venv/bin/python -m bench.bench_promsrc [--days 7] [--interval 15] [--rounds 3] [--cache DIR]``
(goal, issue 23: 7 days of an 8-GPU node in under 2 minutes, bounded memory).

Workload (built once into ``--cache``, reused by later runs):
  1. The node is the simulator's: one vLLM engine serving Llama-3.1-70B at TP 8 on 8 H100s
     (:mod:`simulate`), advanced 30 s so that every histogram and counter has counts; its
     dcgm-exporter and vLLM bodies are the template: every series they hold (24 DCGM fields × 8
     GPUs, the engine's gauges, counters and histogram buckets) is one series in Prometheus.
  2. Each series gets a point every ``--interval`` seconds over ``--days`` days ending now: gauges
     vary around their template value, counters (``_total``, ``_sum``, ``_count``, ``_bucket`` and
     DCGM's cumulative fields) grow in proportion to time, so buckets stay monotone in ``le``.
  3. The points are written as OpenMetrics a day at a time and turned into TSDB blocks by
     ``promtool tsdb create-blocks-from openmetrics`` (Debian's Prometheus 2.42), then served by
     ``prometheus`` on 127.0.0.1 with that TSDB (retention long enough to keep it).

Measurement: ``ioe backfill --prometheus URL --since <days>d --step <interval>s --store FILE`` in a
fresh process into a fresh store each round (GC on, as the command runs), wall time and the child's
peak RSS (``ru_maxrss``); the median over ``--rounds`` is the figure. Prometheus runs beside it on the
same 2 cores, as it would on a small host.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAY_S = 86400
COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")
DCGM_COUNTERS = ("ENERGY_CONSUMPTION", "VIOLATION", "REPLAY_COUNTER", "_TOTAL")


def template() -> list[tuple[str, str, float, bool]]:
    """Rule 1: (name, label block, value, is a counter) of every series of the simulated node."""
    from collector.formats.exposition import parse
    from simulate import dcgm_exporter
    from simulate.node import DeploymentSim
    from simulate.spec import SimDeployment

    sim = DeploymentSim(SimDeployment("bench", "llama-3.1-70b", tp=8, workload="azure_conv"), epoch_s=0.0)
    for t in range(1, 31):
        sim.advance(float(t))
    bodies = [dcgm_exporter.exposition(sim.gpus).decode(), sim.registry.exposition().decode()]
    out = []
    for body in bodies:
        for s in parse(body, openmetrics=False).samples:
            if s.name.endswith("_created"):
                continue
            block = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            counter = s.name.endswith(COUNTER_SUFFIXES) or any(c in s.name for c in DCGM_COUNTERS)
            out.append((s.name, block, s.value, counter))
    return out


def write_day(path: Path, series: list[tuple[str, str, float, bool]], start_s: int, end_s: int,
              interval_s: int, origin_s: int, rng: random.Random) -> int:  # fmt: skip
    """Rule 2: one day of points as OpenMetrics, time-major; returns the points written."""
    n = 0
    with path.open("w") as fh:
        for t in range(start_s, end_s, interval_s):
            age = (t - origin_s) / DAY_S + 1.0
            wave = 1.0 + 0.2 * math.sin(t / 3600.0)
            lines = []
            for name, block, value, counter in series:
                v = value * age if counter else value * wave * (0.95 + 0.1 * rng.random())
                lines.append(f"{name}{{{block}}} {v:.6g} {t}\n")
            fh.writelines(lines)
            n += len(lines)
        fh.write("# EOF\n")
    return n


def build_tsdb(cache: Path, days: float, interval_s: int) -> tuple[Path, int, int, int]:
    """Rule 3: the TSDB directory (built once per days × interval) and its range and point count."""
    tsdb = cache / f"tsdb-{days:g}d-{interval_s}s"
    stamp = tsdb / "ioe-bench.txt"
    if stamp.exists():
        start_s, end_s, points = map(int, stamp.read_text().split())
        return tsdb, start_s, end_s, points
    shutil.rmtree(tsdb, ignore_errors=True)
    tsdb.mkdir(parents=True)
    series = template()
    end_s = int(time.time()) // interval_s * interval_s
    start_s = end_s - int(days * DAY_S)
    rng = random.Random(23)
    points = 0
    for day_start in range(start_s, end_s, DAY_S):
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            text = Path(tmp) / "day.om"
            points += write_day(
                text, series, day_start, min(day_start + DAY_S, end_s), interval_s, start_s, rng
            )
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(tsdb)],
                           check=True, capture_output=True)  # fmt: skip
        print(f"  built {(day_start - start_s) / DAY_S + 1:.0f}/{days:g} days, {points:,} points", flush=True)
    stamp.write_text(f"{start_s} {end_s} {points}")
    print(f"  {len(series)} series × {points // len(series):,} points", flush=True)
    return tsdb, start_s, end_s, points


def serve(tsdb: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    config = tsdb.parent / "prometheus-bench.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
             "--storage.tsdb.retention.time=3650d", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"prometheus did not become ready on its TSDB; see {log}")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(
    url: str, store: Path, days: float, interval_s: int, end_s: int
) -> tuple[float, float, float, str]:
    """Measurement: wall seconds, peak RSS (MB) and CPU seconds of one ``ioe backfill`` process
    (its own rusage)."""
    store.unlink(missing_ok=True)
    out = store.with_suffix(".out")
    t0 = time.perf_counter()
    with out.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ioe", "backfill", "--prometheus", url, "--since", f"{days:g}d",
             "--until", str(end_s), "--step", f"{interval_s}s", "--store", str(store)],
            stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = out.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"ioe backfill failed ({proc.returncode}): {text}")
    return seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval", type=int, default=15, help="scrape interval of the stored data = step (s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ioe-bench-promsrc")
    ap.add_argument("--port", type=int, default=19099)
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tsdb, start_s, end_s, points = build_tsdb(args.cache, args.days, args.interval)
    built = time.perf_counter() - t0
    print(f"TSDB {tsdb}: {points:,} points, {start_s}..{end_s} (built or checked in {built:.0f} s)")
    prom = serve(tsdb, args.port, args.cache / "prometheus.log")
    url = f"http://127.0.0.1:{args.port}"
    times, peaks, cpus, prom_cpus = [], [], [], []
    try:
        for r in range(args.rounds):
            prom_before = cpu_s(prom.pid)
            seconds, peak_mb, cpu, out = one_round(
                url, args.cache / "backfill.duckdb", args.days, args.interval, end_s
            )
            prom_cpus.append(cpu_s(prom.pid) - prom_before)
            times.append(seconds)
            peaks.append(peak_mb)
            cpus.append(cpu)
            rows = "; ".join(" ".join(line.split()) for line in out.splitlines() if "rows" in line)
            load = os.getloadavg()[0]
            print(f"round {r + 1}: {seconds:.1f} s wall, {cpu:.1f} CPU s (Prometheus {prom_cpus[-1]:.1f}), "
                  f"peak RSS {peak_mb:.0f} MB, load average {load:.1f}; {rows}", flush=True)  # fmt: skip
    finally:
        prom.terminate()
        prom.wait(60)
    median = statistics.median(times)
    print(
        f"median {median:.1f} s (range {min(times):.1f}-{max(times):.1f}), "
        f"CPU {statistics.median(cpus):.1f} s "
        f"(Prometheus {statistics.median(prom_cpus):.1f} s), peak RSS {max(peaks):.0f} MB, "
        f"{points / median:,.0f} points/s; {args.days:g} days x {args.interval} s step"
    )


if __name__ == "__main__":
    main()
