"""Peak memory of ``ioe ingest`` on a large NCCL Inspector dump (issue 21, D5).

Workload: one Inspector JSONL file of ``--lines`` records (default 5,000,000; ~330 bytes a line,
8 ranks of one communicator, consecutive ``coll_sn``), written to a scratch folder, optionally
gzipped. The import runs as its own process (``python -m ioe ingest --store S FILE``) so its
peak resident set (``ru_maxrss`` of that child, from ``wait4``) is the importer's alone; the
rows stored are counted afterwards. ``--peer DIR`` runs the same import from another checkout
(e.g. ``/work/main``) for comparison.

Goal: peak RSS under 500 MB for 5 M lines, whatever the file's size.

    python -m bench.bench_import_memory --lines 5000000
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

RANKS = 8
LINE = (
    '{{"header":{{"id":"0x7f1e2d3c4b5a6978","comm_name":"tp_group","rank":{rank},"n_ranks":8,"nnodes":1}},'
    '"metadata":{{"inspector_output_format_version":"v4.0","rec_mechanism":"profiler_plugin",'
    '"dump_timestamp_us":{ts},"hostname":"node-0","pid":{pid}}},'
    '"coll_perf":{{"coll":"AllReduce","coll_sn":{sn},"coll_msg_size_bytes":1048576,'
    '"coll_exec_time_us":{exec_us},"coll_timing_source":"kernel_gpu","coll_algobw_gbs":101.2,'
    '"coll_busbw_gbs":177.1}}}}\n'
)


def write_dump(path: Path, lines: int, compress: bool) -> None:
    opener = gzip.open if compress else open
    with opener(path, "wt") as fh:  # type: ignore[operator]
        block: list[str] = []
        for i in range(lines):
            rank, sn = i % RANKS, i // RANKS
            block.append(
                LINE.format(
                    rank=rank, ts=1_700_000_000_000_000 + i, pid=4000 + rank, sn=sn, exec_us=40 + i % 7
                )
            )
            if len(block) == 10_000:
                fh.write("".join(block))
                block.clear()
        fh.write("".join(block))


def run_import(cwd: Path, store: Path, dump: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MB, exit status) of one ``ioe ingest`` child process."""
    python = cwd / ".venv" / "bin" / "python"
    exe = str(python) if python.exists() else sys.executable
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [exe, "-m", "ioe", "ingest", "--store", str(store), "--json", str(dump)],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        print(f"  import exited {proc.returncode}: {err[-400:]}", file=sys.stderr)
    return wall, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=5_000_000)
    ap.add_argument("--gzip", action="store_true", help="import a .log.gz of the same lines")
    ap.add_argument("--peer", type=Path, default=None, help="another checkout to run the same import from")
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ioe-import-", dir=args.scratch))
    try:
        dump = scratch / ("node-0-pid4000.log.gz" if args.gzip else "node-0-pid4000.log")
        t0 = time.perf_counter()
        write_dump(dump, args.lines, args.gzip)
        size_mb = dump.stat().st_size / 1e6
        print(
            f"dump: {args.lines:,} lines, {size_mb:,.0f} MB{' gzipped' if args.gzip else ''} "
            f"(written in {time.perf_counter() - t0:.0f} s); load average {os.getloadavg()[0]:.1f}"
        )
        runs = [("this checkout", Path(__file__).resolve().parent.parent)]
        if args.peer:
            runs.append((f"peer {args.peer}", args.peer))
        for name, cwd in runs:
            store = scratch / f"store-{len(name)}.duckdb"
            wall, rss, status = run_import(cwd, store, dump)
            rows = -1
            if status == 0:
                with duckdb.connect(str(store), read_only=True) as con:
                    got = con.execute("SELECT count(*) FROM collective_records").fetchone()
                    rows = int(got[0]) if got else 0
            print(f"{name}: exit {status}, {wall:,.0f} s, peak RSS {rss:,.0f} MB, rows stored {rows:,}")
            store.unlink(missing_ok=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
