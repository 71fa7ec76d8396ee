"""What DuckDB holds in memory for rows appended to a store file, by the file's block size.

The collector-only sidecar's memory between checkpoints is mostly DuckDB's in-memory column
segments of the rows appended since the last one (``bench/results/sidecar.md``, rounds 12-13).
This measures them apart from everything else: in one fresh process per block size, three tables
of ``--columns`` DOUBLE columns in a new file,

1. ``new``: ``--rows`` rows appended to each empty table (no checkpoint yet);
2. ``after reopen``: the same rows checkpointed, the file closed and attached again, then
   ten rows appended to each table (the first flush after a checkpoint);

each with DuckDB's ``IN_MEMORY_TABLE`` memory and the process's anonymous RSS growth.

Run: ``.venv/bin/python -m bench.duckdb_append_memory [--rows 3000] [--columns 40]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_sidecar import status_kb

BLOCK_SIZES = (262_144, 65_536, 16_384)
TABLES = 3


def _anon_kb() -> int:
    return status_kb(os.getpid(), "RssAnon")[0]


def _mb(kib: int) -> float:
    """``/proc``'s kB (KiB) in the MB (10^6 bytes) that ``duckdb_memory()``'s bytes are shown in."""
    return round(kib * 1024 / 1e6, 1)


def _in_memory_mb(con: object) -> float:
    row = con.execute(  # type: ignore[attr-defined]
        "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'"
    ).fetchone()
    return round(int(row[0]) / 1e6, 1)


def measure(block: int, rows: int, columns: int, path: Path) -> dict[str, float]:
    """Steps 1 and 2 of the module's docstring for one block size (run in a fresh process)."""
    import duckdb

    config: dict[str, str | bool | int | float | list[str]] = {"threads": 1, "memory_limit": "256MB"}
    values = ", ".join("random()" for _ in range(columns))
    con = duckdb.connect(":memory:", config=config)
    con.execute(f"ATTACH '{path}' AS s (BLOCK_SIZE {block})")
    con.execute("USE s")
    for t in range(TABLES):
        con.execute(f"CREATE TABLE t{t} ({', '.join(f'c{i} DOUBLE' for i in range(columns))})")
    con.execute("CHECKPOINT")
    before = _anon_kb()
    for t in range(TABLES):
        con.execute(f"INSERT INTO t{t} SELECT {values} FROM range({rows})")
    got = {"new_in_memory_mb": _in_memory_mb(con), "new_anon_mb": _mb(_anon_kb() - before)}
    con.execute("CHECKPOINT")
    con.close()
    con = duckdb.connect(":memory:", config=config)
    con.execute(f"ATTACH '{path}' AS s")
    con.execute("USE s")
    before = _anon_kb()
    for t in range(TABLES):
        con.execute(f"INSERT INTO t{t} SELECT {values} FROM range(10)")
    got["reopen_in_memory_mb"] = _in_memory_mb(con)
    got["reopen_anon_mb"] = _mb(_anon_kb() - before)
    con.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rows", type=int, default=3000, help="rows appended to each table in step 1")
    ap.add_argument("--columns", type=int, default=40, help="DOUBLE columns of each table")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process: one block size
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(args.one, args.rows, args.columns, Path(tmp) / "s.duckdb")))
        return
    cols = TABLES * args.columns
    print(f"{TABLES} tables x {args.columns} DOUBLE columns ({cols}); {args.rows} rows each, 10 after reopen")
    sizes = ["--rows", str(args.rows), "--columns", str(args.columns)]
    for block in BLOCK_SIZES:
        out = subprocess.run(
            [sys.executable, "-m", "bench.duckdb_append_memory", "--one", str(block), *sizes],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        got = json.loads(out)
        counted, resident = (1e6 * got[k] / cols / 1024 for k in ("reopen_in_memory_mb", "reopen_anon_mb"))
        print(
            f"block {block // 1024:3d} KiB: new {got['new_in_memory_mb']:5.1f} MB in memory "
            f"(anon +{got['new_anon_mb']:.1f}); after reopen +10 rows {got['reopen_in_memory_mb']:5.1f} MB "
            f"(anon +{got['reopen_anon_mb']:.1f}): {counted:.0f} KiB a column counted, {resident:.0f} held"
        )


if __name__ == "__main__":
    main()
