"""Store density: bytes on disk per GPU sample against Prometheus TSDB on the same samples.

Goal (issue 24): at most Prometheus TSDB's bytes per sample on an hour of one 8-GPU node
scraped at 1 Hz with dcgm-exporter's default fields, through both the sidecar's write path and
``ioe ingest`` of per-second scrape files.

Workload: :data:`HOURS` hour(s) of 1 Hz scrapes of 8 × H100 with every gauge and counter field
of dcgm-exporter's ``default-counters.csv`` (``bench.bench_sidecar``'s copy of the list), the
real label layout of ``tests/data/dcgm/h100x8_k8s_pod_labels.prom``. Values follow a GPU load
that drifts (a slow sine per GPU plus noise): utilization and temperatures are integers,
ratios and power print with 6 decimals, energy grows with power, clocks and memory sizes are
flat, error counters stay 0 — as a busy inference node reads.

Three stores of the same samples:

1. **sidecar**: each scrape parsed as the sidecar parses it (``replay_scrape`` with a
   per-target cache, full parse on a miss) and written with ``Store.write`` once per second, the
   writer thread's flush; ``Store.maintain`` every 60 s of the workload's clock, as the agent
   runs it, and once more an hour after the last scrape (the hour is then closed).
2. **ingest**: the scrapes as files ``scrape-NNNNN.prom`` stamped (mtime) with their scrape
   time, imported by ``python -m ioe ingest DIR --store FILE --target node0:9400`` in a child
   process (periodic captures of one endpoint: one source, as the sidecar's scrapes are);
   ``--ingest-by-path`` leaves ``--target`` out, so each file's series are its own.
3. **prometheus**: the same samples as OpenMetrics (one family at a time, each sample with its
   timestamp), turned into TSDB blocks by ``promtool tsdb create-blocks-from openmetrics``.

Bytes: every file each one keeps (the DuckDB file, its WAL and temp folder after the last
checkpoint; every block folder of the TSDB). Samples: the GPU samples the store holds (checked
equal to those written to Prometheus).

Growth per sample after the first hour (a long-running store's density): run ``--hours 3`` and
``--hours 1`` and divide the difference in bytes by the samples of the two extra hours.

The cost of rewriting a closed store without its free blocks (``collector.compaction``):
``--compaction 1 4 12 48`` times it on stores of those hours (:func:`compaction_cost`).

``--blocks`` prints where each store file's 256 KiB blocks go: each table's data blocks (with its
segments' compression), the catalog metadata, the free blocks.

Run: ``.venv/bin/python -m bench.bench_density [--rounds 3] [--hours 1] [--grid] [--keep DIR] [--blocks]``.
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
from collections.abc import Iterator
from pathlib import Path

import duckdb

from bench.bench_sidecar import _BUS, _DEFAULT_FIELDS, _UUIDS
from collector import compaction
from collector import store as store_module
from collector.formats.scrape import ScrapeCache, parse_scrape, replay_scrape
from collector.store import STORAGE_VERSION, Store

NS = 1_000_000_000
GPUS = 8
HOURS = 1
HOST = "gpu-node-1"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ROOT = Path(__file__).resolve().parent.parent
# a start on a 2-hour boundary, so promtool's default 2 h blocks hold the workload in one block
START_S = 1_790_000_000 - 1_790_000_000 % 7200


def labels(i: int) -> str:
    base = (
        f'gpu="{i}",UUID="{_UUIDS[i]}",pci_bus_id="00000000:{_BUS[i]}:00.0",device="nvidia{i}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="{HOST}",DCGM_FI_DRIVER_VERSION="580.105.08"'
    )
    if i == 0:
        base += ',container="main",namespace="dynamo-workload",pod="vllm-agg-0-vllmdecodeworker-s65j5"'
        base += ',pod_uid=""'
    return "{" + base + "}"


class Node:
    """Eight GPUs' field values, one second at a time (see the module's workload)."""

    def __init__(self, seed: int = 24):
        self.rng = random.Random(seed)
        self.energy_mj = [1_000_000_000 + 7_919 * g for g in range(GPUS)]

    def values(self, t: int) -> list[dict[str, float | int]]:
        out = []
        for g in range(GPUS):
            load = 0.55 + 0.3 * math.sin(2 * math.pi * t / 900 + g) + self.rng.gauss(0, 0.05)
            busy = min(max(load, 0.0), 1.0)
            tensor, dram = 0.9 * busy * 0.6, 0.85 * busy * 0.5
            power = 70 + 630 * (0.3 * busy + 0.7 * max(tensor, dram))
            self.energy_mj[g] += round(power * 1000)
            out.append(
                {
                    "DCGM_FI_DEV_SM_CLOCK": 1980,
                    "DCGM_FI_DEV_MEM_CLOCK": 2619,
                    "DCGM_FI_DEV_MEMORY_TEMP": round(35 + 30 * dram),
                    "DCGM_FI_DEV_GPU_TEMP": round(32 + 40 * (power - 70) / 630),
                    "DCGM_FI_DEV_POWER_USAGE": round(power, 6),
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy_mj[g],
                    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
                    "DCGM_FI_DEV_GPU_UTIL": round(100 * busy),
                    "DCGM_FI_DEV_MEM_COPY_UTIL": round(100 * dram),
                    "DCGM_FI_DEV_ENC_UTIL": 0,
                    "DCGM_FI_DEV_DEC_UTIL": 0,
                    "DCGM_FI_DEV_XID_ERRORS": 0,
                    "DCGM_FI_DEV_FB_FREE": 7680,
                    "DCGM_FI_DEV_FB_USED": 72899,
                    "DCGM_FI_DEV_FB_RESERVED": 501,
                    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(busy * 120_000 * self.rng.uniform(0.9, 1.1)),
                    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
                    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
                    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
                    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(busy, 6),
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(tensor, 6),
                    "DCGM_FI_PROF_DRAM_ACTIVE": round(dram, 6),
                    "DCGM_FI_PROF_PCIE_TX_BYTES": round(2e6 * busy + self.rng.uniform(0, 1e5)),
                    "DCGM_FI_PROF_PCIE_RX_BYTES": round(1e6 * busy + self.rng.uniform(0, 1e5)),
                }
            )
        return out


def _text(v: float | int) -> str:
    return f"{v:.6f}" if isinstance(v, float) else str(v)


def scrapes(seconds: int, jitter: bool = True) -> Iterator[tuple[int, list[dict[str, float | int]]]]:
    """``(ts_ns, values)`` of each scrape. With ``jitter`` a scrape starts 1 s after the previous
    one plus the event loop's overshoot (0.05-1.5 ms, drawn), as the sidecar's own clock reads
    (its loop sleeps ``interval - elapsed``); without, exactly on the second."""
    node, rng = Node(), random.Random(99)
    ts_ns = START_S * NS
    for k in range(seconds):
        yield ts_ns, node.values(k)
        ts_ns += NS + (rng.randrange(50_000, 1_500_000) if jitter else 0)


def exposition(values: list[dict[str, float | int]]) -> bytes:
    """One dcgm-exporter body: HELP/TYPE per field, one line per GPU."""
    out: list[str] = []
    for name, kind, help_text in _DEFAULT_FIELDS:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        out += [f"{name}{labels(g)} {_text(values[g][name])}" for g in range(GPUS)]
    return ("\n".join(out) + "\n").encode()


def write_inputs(tmp: Path, seconds: int, jitter: bool) -> tuple[Path, Path, int]:
    """The scrape files (mtime = scrape time, ns) and the OpenMetrics file (timestamps in ms,
    Prometheus's resolution); returns both and the number of samples."""
    scrape_dir, om = tmp / "scrapes", tmp / "samples.om"
    scrape_dir.mkdir()
    series: dict[tuple[str, int], list[str]] = {}
    for name, _, _ in _DEFAULT_FIELDS:
        series.update({(name, g): [] for g in range(GPUS)})
    for k, (ts_ns, values) in enumerate(scrapes(seconds, jitter)):
        path = scrape_dir / f"scrape-{k:05d}.prom"
        path.write_bytes(exposition(values))
        os.utime(path, ns=(ts_ns, ts_ns))
        stamp = f"{ts_ns // 1_000_000 / 1000:.3f}"
        for (name, g), points in series.items():
            points.append(f"{_text(values[g][name])} {stamp}")
    with om.open("w") as fh:
        for name, _, help_text in _DEFAULT_FIELDS:
            fh.write(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
            for g in range(GPUS):
                head = f"{name}{labels(g)} "
                fh.writelines(head + p + "\n" for p in series[(name, g)])
        fh.write("# EOF\n")
    return scrape_dir, om, len(series) * seconds


def tree_bytes(*paths: Path) -> int:
    total = 0
    for p in paths:
        if p.is_file():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return total


def store_bytes(db: Path) -> int:
    return tree_bytes(db, Path(f"{db}.wal"), Path(f"{db}.tmp"))


def gpu_points(db: Path) -> int:
    """GPU samples in the store (a plain read-only connection: it reads any version's file)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute("SELECT count(*) FROM gpu_samples").fetchone()
    finally:
        con.close()
    return int(got[0]) if got else 0


def used_bytes(db: Path) -> int:
    """Bytes of the blocks DuckDB has in use (the file also holds free blocks it reuses)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute("SELECT block_size * used_blocks FROM pragma_database_size()").fetchone()
    finally:
        con.close()
    return int(got[0]) if got else 0


def table_blocks(db: Path) -> str:
    """Where the file's blocks go: the data blocks each table's segments lie in (DuckDB 1.5.5 gives
    every table with rows at least one block of its own; a table whose columns are all constant,
    one row, keeps them in the catalog), the free blocks, and the rest (catalog metadata)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        size = con.execute(
            "SELECT used_blocks, free_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        parts, data = [], set()
        for t in tables:
            got = con.execute(
                f"SELECT list(DISTINCT block_id), list(DISTINCT compression ORDER BY compression) "
                f"FROM pragma_storage_info('{t}') WHERE block_id >= 0 AND segment_type <> 'VALIDITY'"
            ).fetchone()
            blocks = set(got[0] or []) if got else set()
            if blocks:
                data |= blocks
                parts.append(f"{t} {len(blocks)} ({'/'.join(got[1])})" if got else t)
    finally:
        con.close()
    used, free = (int(v) for v in size) if size else (0, 0)
    meta = used - len(data)
    return f"{used} blocks in use: " + ", ".join(parts) + f", catalog metadata {meta}; {free} free"


def run_sidecar(tmp: Path, seconds: int, jitter: bool) -> tuple[int, int, float]:
    """Path 1: bytes, samples stored, seconds taken."""
    db = tmp / "sidecar.duckdb"
    t0 = time.perf_counter()
    cache = ScrapeCache()
    with Store(db, threads=1, memory_limit="32MB") as st:
        for k, (ts_ns, values) in enumerate(scrapes(seconds, jitter)):
            body = exposition(values)
            parsed = replay_scrape(body, kind="dcgm", ts_ns=ts_ns, host=HOST, source="dcgm", cache=cache)
            if parsed is None:
                parsed = parse_scrape(body, kind="dcgm", ts_ns=ts_ns, host=HOST, source="dcgm", cache=cache)
            for table, rows in parsed.batches.items():
                st.write(table, rows)
            if k % 60 == 59:  # the agent's maintenance interval
                st.maintain(ts_ns + NS)
        st.maintain(ts_ns + 3600 * NS)
        st.checkpoint()
    took = time.perf_counter() - t0
    return store_bytes(db), gpu_points(db), took


def compaction_cost(tmp: Path, hours: list[int], rounds: int) -> None:
    """Seconds :func:`collector.compaction.compact` takes on stores of ``hours`` hours, under the
    sidecar's DuckDB settings (1 thread, 32MB), each round on a fresh copy.

    The one-hour store is the sidecar path's, closed without its rewrite (free blocks kept). A
    longer store repeats that hour's packed points, times and rollups ``hours - 1`` more times,
    shifted by an hour each (its free blocks stay those of the one hour, as a long-running store
    keeps about one hour of them)."""
    limit = store_module.COMPACT_MAX_BYTES
    store_module.COMPACT_MAX_BYTES = 0  # no rewrite at this close
    try:
        run_sidecar(tmp, 3600, True)
    finally:
        store_module.COMPACT_MAX_BYTES = limit
    one = tmp / "sidecar.duckdb"
    for n in hours:
        built = tmp / f"hours{n}.duckdb"
        shutil.copyfile(one, built)
        if n > 1:
            con = duckdb.connect(str(built))
            end = START_S * NS + 3600 * NS
            for k in range(1, n):
                ns, tix = k * 3600 * NS, k * 3600
                for sql in (
                    f"INSERT INTO gpu_samples_times SELECT tix + {tix}, ts_ns + {ns} "
                    "FROM gpu_samples_times WHERE tix < 3600",
                    f"INSERT INTO gpu_samples_packed SELECT series_id, tix + {tix}, value "
                    "FROM gpu_samples_packed WHERE tix < 3600",
                    f"INSERT INTO gpu_samples_1m SELECT * REPLACE (minute_ns + {ns} AS minute_ns) "
                    f"FROM gpu_samples_1m WHERE minute_ns < {end}",
                ):
                    con.execute(sql)
            con.execute("CHECKPOINT")
            con.close()
        config = {"threads": 1, "memory_limit": "32MB"}
        times, size = [], (0, 0)
        for _ in range(rounds):
            work = tmp / "work.duckdb"
            shutil.copyfile(built, work)
            done = compaction.compact(work, STORAGE_VERSION, config)
            times.append(done.seconds)
            size = (done.bytes_before, done.bytes_after)
            work.unlink()
        print(
            f"compaction of {n:3d} h: {size[0]:>12,d} -> {size[1]:>12,d} bytes, median "
            f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f}, {rounds} rounds), "
            f"load {os.getloadavg()[0]:.2f}"
        )
        built.unlink()


def run_ingest(tmp: Path, scrape_dir: Path, by_path: bool = False) -> tuple[int, int, float]:
    """Path 2: ``ioe ingest`` of the scrape files in a child process."""
    db = tmp / "ingest.duckdb"
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "ioe", "ingest", str(scrape_dir), "--store", str(db), "--no-progress"]
    cmd += [] if by_path else ["--target", "node0:9400"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    return store_bytes(db), gpu_points(db), took


def run_promtool(tmp: Path, om: Path) -> tuple[int, float]:
    """Path 3: TSDB blocks from the OpenMetrics file."""
    out = tmp / "tsdb"
    t0 = time.perf_counter()
    cmd = [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    blocks = [p for p in out.iterdir() if p.is_dir()]
    return tree_bytes(*blocks), took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("sidecar", "ingest", "prometheus"), action="append")
    ap.add_argument("--hours", type=float, default=HOURS)
    ap.add_argument("--grid", action="store_true", help="scrapes exactly on the second (no jitter)")
    ap.add_argument("--keep", type=Path, help="keep the last round's stores and blocks here")
    ap.add_argument("--ingest-by-path", action="store_true", help="ingest without --target (series per file)")
    ap.add_argument("--blocks", action="store_true", help="print the blocks each table of a store takes")
    ap.add_argument("--compaction", type=int, nargs="*", help="time the rewrite of stores of these hours")
    args = ap.parse_args()
    if args.compaction:
        tmp = Path(tempfile.mkdtemp(prefix="ioe-density-"))
        try:
            compaction_cost(tmp, args.compaction, args.rounds)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    seconds = int(args.hours * 3600)
    clock = "on the second" if args.grid else "with the loop's jitter"
    print(
        f"load average {os.getloadavg()[0]:.2f}; {GPUS} GPUs x {len(_DEFAULT_FIELDS)} fields x {seconds} s, "
        f"scrapes {clock}"
    )
    rows: dict[str, list[float]] = {"sidecar": [], "ingest": [], "prometheus": []}
    for r in range(args.rounds):
        tmp = Path(tempfile.mkdtemp(prefix="ioe-density-"))
        try:
            scrape_dir, om, samples = write_inputs(tmp, seconds, not args.grid)
            # alternate the order of the three each round
            order = ["prometheus", "sidecar", "ingest"] if r % 2 == 0 else ["sidecar", "ingest", "prometheus"]
            for name in [n for n in order if not args.only or n in args.only]:
                if name == "prometheus":
                    size, took = run_promtool(tmp, om)
                    stored = samples
                elif name == "sidecar":
                    size, stored, took = run_sidecar(tmp, seconds, not args.grid)
                else:
                    size, stored, took = run_ingest(tmp, scrape_dir, args.ingest_by_path)
                if stored != samples:
                    raise SystemExit(f"{name}: {stored} samples stored, {samples} written")
                rows[name].append(size / samples)
                per = size / samples
                used = (
                    ""
                    if name == "prometheus"
                    else f", in use {used_bytes(tmp / f'{name}.duckdb') / samples:.3f}"
                )
                print(f"round {r + 1} {name:10s} {size:>11,d} bytes {per:6.3f} B/sample{used} ({took:.1f} s)")
                if args.blocks and name != "prometheus":
                    print(f"    {table_blocks(tmp / f'{name}.duckdb')}")
            if args.keep and r == args.rounds - 1:
                shutil.rmtree(args.keep, ignore_errors=True)
                shutil.copytree(tmp, args.keep, ignore=shutil.ignore_patterns("scrapes"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    prom = statistics.median(rows["prometheus"]) if rows["prometheus"] else math.nan
    for name in [n for n in ("sidecar", "ingest") if rows[n]]:
        got = statistics.median(rows[name])
        lo, hi = min(rows[name]), max(rows[name])
        verdict = "met" if got <= prom else "not met"
        print(
            f"{name}: median {got:.3f} B/sample ({lo:.3f}-{hi:.3f}); "
            f"Prometheus {prom:.3f}: {got / prom:.2f}x {verdict}"
        )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
