"""Sidecar resource cost: CPU share of one core and peak RSS while scraping a node at 1 Hz.

Goal (issue 2): ``ioe sidecar`` scraping an 8-GPU dcgm-exporter endpoint plus two engine
endpoints every second costs ≤ 1 % of one core and ≤ 150 MB resident. Peers, measured in the
same run against the same endpoints: Prometheus itself (``/usr/bin/prometheus``, 1 s scrape
interval, its own TSDB) and a plain Python scraper (``httpx`` + prometheus_client's parser,
no mapping, no store): the floor of "scrape in Python".

Workload (served from 127.0.0.1 by a thread of this process, never by the measured one):

1. ``/dcgm``: 8 × H100 with every field of dcgm-exporter's ``default-counters.csv`` and
   ``dcp-metrics-included.csv`` plus the extended profiling fields IOE reads (SM activity
   and occupancy, FP16/32/64 pipes, NVLink tx/rx), the real label layout of
   ``tests/data/dcgm/h100x8_k8s_pod_labels.prom`` (Kubernetes pod labels on GPU 0), with
   HELP/TYPE lines.
2. ``/vllm``: ``tests/data/engine/vllm_0.33.0_dp2.prom``; ``/sglang``:
   ``tests/data/engine/sglang_0.5.23.prom``.
3. Values move between scrapes (:data:`VARIANTS` bodies per endpoint, served in turn):
   counters, buckets, sums and counts grow, gauges jitter, so every scrape stores new rows
   and the counter-rate path does real work.

Method: the sidecar runs as ``ioe sidecar --config FILE`` (NVML, DCGM and InfiniBand readers
enabled: they report "unavailable" on a machine without them), once per ``--modes`` entry:
``collector`` (``api_enabled: false``) and ``agent`` (the default: REST API with its 15 s analysis
refresher, OTLP/HTTP receiver idle). After ``--warmup`` seconds, its utime+stime
(``/proc/<pid>/stat``) is sampled over ``--duration`` seconds: CPU % of one core = CPU seconds /
wall seconds × 100. Peak RSS is ``VmHWM`` from ``/proc/<pid>/status`` (the whole life, start-up
included); the largest anonymous and file-backed resident sizes (``RssAnon``, ``RssFile``) are
sampled each second beside it. Before each run the binaries both sides map (this interpreter's and
venv's shared objects, the Prometheus binary) are dropped from the page cache (``--page-cache
evicted``, the default), so each process reads its code from disk as after a reboot. Left as they
are, the same sidecar had DuckDB's 60 MB library 51.6 MB resident instead of 31.6 MB on this
machine (Linux 6.18) while the file was still cached as pip had written it (any plain write did
the same; a copy read back from disk did not: we take it for the page cache's large folios being
mapped whole) — ``--page-cache as-is`` measures that state. Rows stored/s come from the sidecar's
own ``ioe_rows_stored_total``; Prometheus's samples/s from its
``prometheus_tsdb_head_samples_appended_total``. Each process runs alone (one after the other) so
they do not share the 2-core machine with each other; with ``--together`` they all run at once
over the same window, so other load on a shared machine falls on each alike. ``--runs N`` repeats
the whole and prints each process's median and range, and of each ratio within a run.
Issue 24's goal: the collector at most Prometheus's CPU and at most 100 MB peak.

Run: ``.venv/bin/python -m bench.bench_sidecar [--duration 300] [--warmup 15] [--peers prometheus,plain]
[--runs 3] [--together]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "tests" / "data" / "engine"
DCGM_FIELDS = Path("/work/shared/fixtures/dcgm")
GOAL_CPU_PCT = 1.0
GOAL_RSS_MB = 150.0
# issue 24: the collector-only sidecar at most Prometheus's CPU on the same targets, and this peak
GOAL_PEAK_RSS_MB = 100.0
VARIANTS = 30
CLK_TCK = os.sysconf("SC_CLK_TCK")

# fields of dcgm-exporter's shipped lists (used when the CSVs are not on this machine) + extended
_DEFAULT_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus."),
)
_EXTENDED_FIELDS = (
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in us)."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active."),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink."),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink."),
)
_UUIDS = (
    "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
    "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a",
    "GPU-fbc2c554-4d37-8938-0032-f923bad0f716",
    "GPU-a65a773d-52bb-bcc1-a8ee-f78c3faa2e2d",
    "GPU-82e45d1b-1618-559f-144c-eab51545030b",
    "GPU-39e28159-8c62-ee71-64db-b748edd61e15",
    "GPU-e64d69ca-b4b3-59b2-e78c-94f26c4db365",
    "GPU-04d228d3-3b5a-3534-f5cf-969706647d56",
)
_BUS = ("53", "64", "75", "86", "97", "A8", "B9", "CA")


# -- bodies ---------------------------------------------------------------------------------
def dcgm_fields() -> list[tuple[str, str, str]]:
    """Fields of the shipped dcgm-exporter CSVs (label-only rows skipped) + the extended set."""
    rows: dict[str, tuple[str, str, str]] = {}
    for csv in ("default-counters.csv", "dcp-metrics-included.csv"):
        path = DCGM_FIELDS / csv
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            parts = [p.strip() for p in line.split(",", 2)]
            if len(parts) == 3 and not parts[0].startswith("#") and parts[1] in ("gauge", "counter"):
                rows.setdefault(parts[0], (parts[0], parts[1], parts[2]))
    for row in (*(() if rows else _DEFAULT_FIELDS), *_EXTENDED_FIELDS):
        rows.setdefault(row[0], row)
    return list(rows.values())


def _gpu_labels(i: int) -> str:
    base = (
        f'gpu="{i}",UUID="{_UUIDS[i]}",pci_bus_id="00000000:{_BUS[i]}:00.0",device="nvidia{i}",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="580.105.08"'
    )
    if i == 0:
        base += (
            ',container="main",namespace="dynamo-workload",pod="vllm-agg-0-vllmdecodeworker-s65j5",pod_uid=""'
        )
    return base


def dcgm_body(step: int, rng: random.Random) -> bytes:
    """One 8-GPU scrape; counters grow with ``step``, gauges jitter."""
    out: list[str] = []
    for name, kind, help_text in dcgm_fields():
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for i in range(8):
            value = (1_000_000 + step * 700_000 + i) if kind == "counter" else round(rng.uniform(0, 95), 3)
            out.append(f"{name}{{{_gpu_labels(i)}}} {value}")
    return ("\n".join(out) + "\n").encode()


def _grown(line: str, step: int, rng: random.Random) -> str:
    """A sample line with its value moved: cumulative series grow, gauges jitter."""
    head, _, value = line.rpartition(" ")
    try:
        number = float(value)
    except ValueError:
        return line
    name = head.split("{", 1)[0]
    if name.endswith(("_total", "_count", "_bucket", "_sum")) or name.startswith("vllm:num_pre"):
        return f"{head} {number + step * 3.0}"
    if name.startswith(("vllm:", "sglang:")) and number:
        return f"{head} {number * rng.uniform(0.8, 1.0):.6g}"
    return line


def engine_body(path: Path, step: int, rng: random.Random) -> bytes:
    lines = [
        ln if ln.startswith("#") or not ln else _grown(ln, step, rng) for ln in path.read_text().splitlines()
    ]
    return ("\n".join(lines) + "\n").encode()


def build_bodies() -> dict[str, list[bytes]]:
    rng = random.Random(7)
    return {
        "/dcgm": [dcgm_body(k, rng) for k in range(VARIANTS)],
        "/vllm": [engine_body(ENGINE / "vllm_0.33.0_dp2.prom", k, rng) for k in range(VARIANTS)],
        "/sglang": [engine_body(ENGINE / "sglang_0.5.23.prom", k, rng) for k in range(VARIANTS)],
    }


class BodyServer:
    """Serves each path's variants in turn (per path, so every scraper sees values move)."""

    def __init__(self, bodies: dict[str, list[bytes]]):
        self.bodies = bodies
        self.turn = {p: 0 for p in bodies}
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def next_body(self, path: str) -> bytes | None:
        variants = self.bodies.get(path)
        if variants is None:
            return None
        with self.lock:
            k = self.turn[path] = self.turn[path] + 1
        return variants[k % len(variants)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = server.next_body(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- measuring a process ----------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (fields 14 and 15 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kb(pid: int, *keys: str) -> list[int]:
    """The ``kB`` fields ``keys`` of ``/proc/<pid>/status``, read once (0 for one not there)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return [int(fields[k].split()[0]) if k in fields else 0 for k in keys]


def binaries() -> list[Path]:
    """The files whose pages the measured processes map: every shared object of this venv and
    interpreter (DuckDB's is 60 MB) and the Prometheus binary."""
    roots = {Path(sys.prefix), Path(sys.base_prefix)}
    found = {so for root in roots for so in root.glob("lib/**/*.so*") if so.is_file()}
    prom = shutil.which("prometheus")
    if prom:
        found.add(Path(prom))
    return sorted(found)


def evict(paths: list[Path]) -> int:
    """``--page-cache evicted`` (the module's docstring says why): drop ``paths`` from the page
    cache (``POSIX_FADV_DONTNEED``; a page some running process maps stays). Returns the bytes
    advised."""
    done = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return done


@dataclass
class Measured:
    name: str
    cpu_pct: float
    peak_rss_mb: float
    rss_end_mb: float
    rows_per_s: float
    wall_s: float
    slices: list[float]
    # the largest anonymous and file-backed resident sizes seen (sampled each second; the peak
    # above is the kernel's exact VmHWM, of both together)
    anon_mb: float = 0.0
    file_mb: float = 0.0

    def line(self) -> str:
        spread = f"{min(self.slices):.2f}–{max(self.slices):.2f}" if self.slices else "-"
        return (
            f"{self.name:<11} CPU {self.cpu_pct:6.2f} % of one core (10 s slices {spread} %)  "
            f"peak RSS {self.peak_rss_mb:6.1f} MB (end {self.rss_end_mb:.1f}; sampled max anon "
            f"{self.anon_mb:.1f}, file {self.file_mb:.1f})  "
            f"{self.rows_per_s:8.0f} rows/s over {self.wall_s:.0f} s"
        )


def measure(
    name: str, proc: subprocess.Popen[bytes], warmup_s: float, duration_s: float, rows: Callable[[], float]
) -> Measured:
    """Steady-state CPU share and rows/s over ``duration_s`` after ``warmup_s``; lifetime peak RSS."""
    time.sleep(warmup_s)
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited during warm-up with code {proc.returncode}")
    t0, c0, r0 = time.monotonic(), cpu_seconds(proc.pid), rows()
    slices: list[float] = []
    last_t, last_c = t0, c0
    anon = file = 0
    while time.monotonic() - t0 < duration_s:
        slice_end = min(last_t + 10.0, t0 + duration_s)
        while (left := slice_end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            now_anon, now_file = status_kb(proc.pid, "RssAnon", "RssFile")
            anon, file = max(anon, now_anon), max(file, now_file)
        now, cpu = time.monotonic(), cpu_seconds(proc.pid)
        slices.append((cpu - last_c) / (now - last_t) * 100)
        last_t, last_c = now, cpu
    wall, cpu, got = last_t - t0, last_c - c0, rows() - r0
    peak, end = status_kb(proc.pid, "VmHWM", "VmRSS")
    return Measured(
        name,
        cpu / wall * 100,
        peak / 1024,
        end / 1024,
        got / wall,
        wall,
        slices,
        anon / 1024,
        file / 1024,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def counter_sum(url: str, prefix: str) -> float:
    try:
        text = httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the three scrapers -----------------------------------------------------------------------
TARGETS = (("node/dcgm", "/dcgm", "dcgm"), ("vllm", "/vllm", "engine"), ("sglang", "/sglang", "engine"))


def run_sidecar(server: BodyServer, tmp: Path, args: argparse.Namespace, mode: str) -> Measured:
    """``mode``: ``agent`` (the default config: REST API, OTLP/HTTP, 15 s analysis refresher) or
    ``collector`` (``api_enabled: false``: scrape, store, /healthz, /readyz, /metrics)."""
    port = free_port()
    cfg = {
        "api_enabled": mode == "agent",
        "store_path": str(tmp / f"node-{mode}.duckdb"),
        "listen_port": port,
        "host": "gpu-node-1",
        **({"flush_interval_s": args.flush_interval} if args.flush_interval else {}),
        "targets": [
            {"name": n, "url": server.url(p), "kind": k, "interval_s": 1.0, "host": "gpu-node-1"}
            for n, p, k in TARGETS
        ],
        "readers": {"nvml": True, "dcgm": True, "infiniband": True, "sysfs_infiniband": str(tmp / "no-ib")},
    }
    path = tmp / f"sidecar-{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = (tmp / f"sidecar-{mode}.log").open("w")
    cmd = [sys.executable, "-m", "ioe", "sidecar", "--config", str(path)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=_sidecar_env(tmp, args))
    metrics = f"http://127.0.0.1:{port}/metrics"
    try:
        return measure(
            f"ioe {mode}",
            proc,
            args.warmup,
            args.duration,
            lambda: counter_sum(metrics, "ioe_rows_stored_total"),
        )
    finally:
        stop(proc)
        log.close()


def _sidecar_env(tmp: Path, args: argparse.Namespace) -> dict[str, str]:
    """``--hide-pandas``: pandas is only in the venv for the [bench] extra (HTA), but DuckDB
    imports it on the first Arrow scan when it is installed (~50 MB resident). A stub package
    that raises ImportError stands for a production install without it."""
    env = dict(os.environ)
    # this checkout's code, whichever checkout the venv's editable install points at
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH", ""))))
    if args.hide_pandas:
        stub = tmp / "no-pandas" / "pandas"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "__init__.py").write_text('raise ImportError("pandas is not installed here")\n')
        env["PYTHONPATH"] = os.pathsep.join((str(stub.parent), env["PYTHONPATH"]))
    return env


def run_prometheus(server: BodyServer, tmp: Path, args: argparse.Namespace) -> Measured | None:
    binary = shutil.which("prometheus")
    if binary is None:
        print("prometheus not installed: peer skipped")
        return None
    port = free_port()
    jobs = [
        {
            "job_name": n.replace("/", "_"),
            "metrics_path": p,
            "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}],
        }
        for n, p, _ in TARGETS
    ]
    cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    log = (tmp / "prometheus.log").open("w")
    cmd = [
        binary,
        f"--config.file={path}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    metrics = f"http://127.0.0.1:{port}/metrics"
    try:
        return measure(
            "prometheus",
            proc,
            args.warmup,
            args.duration,
            lambda: counter_sum(metrics, "prometheus_tsdb_head_samples_appended_total"),
        )
    finally:
        stop(proc)
        log.close()


def run_plain(server: BodyServer, tmp: Path, args: argparse.Namespace) -> Measured:
    rows = tmp / "plain.rows"
    cmd = [sys.executable, "-m", "bench.bench_sidecar", "--plain-scraper", str(rows)]
    cmd += [server.url(p) for _, p, _ in TARGETS]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        return measure("plain py", proc, args.warmup, args.duration, lambda: _read_float(rows))
    finally:
        stop(proc)


def _read_float(path: Path) -> float:
    try:
        return float(path.read_text() or 0)
    except (OSError, ValueError):
        return 0.0


def plain_scraper(rows_file: str, urls: list[str]) -> None:
    """The peer floor: fetch each URL every second and parse it with prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = 0
    with httpx.Client(trust_env=False) as client:
        while True:
            t0 = time.monotonic()
            for url in urls:
                text = client.get(url, headers={"Accept": "text/plain; version=0.0.4"}).text
                samples += sum(len(f.samples) for f in text_string_to_metric_families(text))
            Path(rows_file).write_text(str(samples))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))


# -- report -----------------------------------------------------------------------------------
def report(results: list[Measured]) -> None:
    print("\n".join(r.line() for r in results))
    ours = [r for r in results if r.name.startswith("ioe ")]
    prom = next((r for r in results if r.name == "prometheus"), None)
    for ioe in ours:
        verdict = "met" if ioe.cpu_pct <= GOAL_CPU_PCT and ioe.peak_rss_mb <= GOAL_RSS_MB else "NOT met"
        print(
            f"{ioe.name}: issue 2 goal (≤ {GOAL_CPU_PCT:g} % of one core, ≤ {GOAL_RSS_MB:g} MB): {verdict} "
            f"(CPU {ioe.cpu_pct / GOAL_CPU_PCT:.2f}× goal, RSS {ioe.peak_rss_mb / GOAL_RSS_MB:.2f}× goal)"
        )
        if prom is not None and ioe.name == "ioe collector":
            ok = ioe.cpu_pct <= prom.cpu_pct and ioe.peak_rss_mb <= GOAL_PEAK_RSS_MB
            print(
                f"{ioe.name}: issue 24 goal (≤ 1.0× Prometheus CPU, ≤ {GOAL_PEAK_RSS_MB:g} MB peak): "
                f"{'met' if ok else 'NOT met'}"
            )
        for peer in (r for r in results if not r.name.startswith("ioe ")):
            print(
                f"ratio {ioe.name} / {peer.name}: CPU {ioe.cpu_pct / max(peer.cpu_pct, 1e-9):.2f}×, "
                f"peak RSS {ioe.peak_rss_mb / max(peer.peak_rss_mb, 1e-9):.2f}×"
            )


def report_medians(runs: list[list[Measured]]) -> None:
    """Medians (and ranges) over runs of each process's CPU and peak RSS, and of the ratios of
    each sidecar mode to each peer within a run."""
    names = list(dict.fromkeys(r.name for run in runs for r in run))
    print(f"\nover {len(runs)} runs: median (range)")
    for name in names:
        got = [r for run in runs for r in run if r.name == name]
        cpu, rss = [r.cpu_pct for r in got], [r.peak_rss_mb for r in got]
        print(f"{name:<11} CPU {_mid(cpu, '.2f')} %  peak RSS {_mid(rss, '.1f')} MB")
    for ours in (n for n in names if n.startswith("ioe ")):
        for peer in (n for n in names if not n.startswith("ioe ")):
            pairs = [(a, b) for run in runs for a in run for b in run if a.name == ours and b.name == peer]
            cpu = [a.cpu_pct / max(b.cpu_pct, 1e-9) for a, b in pairs]
            rss = [a.peak_rss_mb / max(b.peak_rss_mb, 1e-9) for a, b in pairs]
            print(f"ratio {ours} / {peer}: CPU {_mid(cpu, '.2f')}×, peak RSS {_mid(rss, '.2f')}×")


def _mid(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def run_once(server: BodyServer, tmp: Path, args: argparse.Namespace) -> list[Measured]:
    """One run: each sidecar mode, then each peer, one after the other; with ``--together`` all at
    once, measured over the same window (they then share the CPUs, and any load on the machine)."""
    peers = {"prometheus": run_prometheus, "plain": run_plain}
    jobs: list[Callable[[], Measured | None]] = [
        functools.partial(run_sidecar, server, tmp, args, m) for m in filter(None, args.modes.split(","))
    ]
    names = [n for n in args.peers.split(",") if n in peers]
    jobs += [functools.partial(peers[n], server, tmp, args) for n in names]
    if args.together:
        with ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:
            got = list(pool.map(lambda job: job(), jobs))
    else:
        got = [job() for job in jobs]
    return [r for r in got if r is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    # 300 s: long enough for several DuckDB checkpoints and five maintenance passes (rollups)
    ap.add_argument("--duration", type=float, default=300.0, help="steady-state seconds measured")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds after start before measuring")
    ap.add_argument(
        "--flush-interval", type=float, help="sidecar flush_interval_s (default: unset, the sidecar's own)"
    )
    ap.add_argument("--hide-pandas", action="store_true", help="run the sidecar as if pandas were absent")
    ap.add_argument("--peers", default="prometheus,plain", help="comma list: prometheus, plain (or none)")
    ap.add_argument("--modes", default="collector,agent", help="sidecar modes: collector, agent")
    ap.add_argument("--runs", type=int, default=1, help="runs; medians over them are printed at the end")
    ap.add_argument("--together", action="store_true", help="run every process at once, same window")
    ap.add_argument(
        "--page-cache",
        choices=("evicted", "as-is"),
        default="evicted",
        help="evicted (default): the processes' binaries dropped from the page cache before each run; "
        "as-is: left as they are (a venv just installed by pip had DuckDB's library ~20 MB more resident)",
    )
    ap.add_argument("--plain-scraper", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_scraper:
        plain_scraper(args.plain_scraper[0], args.plain_scraper[1:])
        return
    bodies = build_bodies()
    sizes = ", ".join(f"{p} {len(v[0]) / 1024:.0f} KiB" for p, v in bodies.items())
    print(f"bodies: {sizes}; {os.cpu_count()} CPUs")
    server = BodyServer(bodies)
    runs: list[list[Measured]] = []
    try:
        for i in range(args.runs):
            print(f"\nrun {i + 1}/{args.runs}: load average before {os.getloadavg()[0]:.2f}", flush=True)
            if args.page_cache == "evicted":
                print(f"page cache: {evict(binaries()) / 2**20:.0f} MB of binaries evicted", flush=True)
            with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
                runs.append(run_once(server, Path(tmp), args))
            print(f"load average after: {os.getloadavg()[0]:.2f}")
            report(runs[-1])
    finally:
        server.close()
    if len(runs) > 1:
        report_medians(runs)


if __name__ == "__main__":
    main()
