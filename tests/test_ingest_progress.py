"""The progress bar of ``ioe ingest`` (:mod:`ioe.progress`): on a terminal or with ``--progress``,
never changing what a pipe receives.

1. Not on a terminal, the output is byte for byte that of ``--no-progress`` (which never draws),
   and rich is not even imported.
2. ``--progress`` on a pipe draws on stderr only: stdout is unchanged and the rows stored are the
   same.
3. On a terminal (a pseudo-terminal here) the bar is drawn, with the files and rows counted.
4. Without ``--progress`` a terminal gets the bar only once the import has run 2 s (a clock passed
   in): a quick import prints nothing more than before.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import duckdb
from conftest import ROOT

from ioe.progress import AFTER_S, IngestProgress

DATA = ROOT / "tests" / "data" / "prom"
PROBE = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('RICH' if 'rich' in sys.modules else 'NO-RICH', file=sys.stderr))\n"
    "runpy.run_module('ioe', run_name='__main__', alter_sys=True)\n"
)


def _ingest(
    store: Path, *extra: str, stderr: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-c",
        PROBE,
        "ingest",
        str(DATA),
        "--store",
        str(store),
        "--ts",
        "1764000000",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                          timeout=120, check=False)  # fmt: skip


def _rows(store: Path) -> list[tuple[str, int]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        return [(t, con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables]  # type: ignore[index]
    finally:
        con.close()


def test_a_pipe_gets_the_same_bytes_as_no_progress_and_no_rich(tmp_path: Path) -> None:
    default, off = _ingest(tmp_path / "a.duckdb"), _ingest(tmp_path / "b.duckdb", "--no-progress")
    assert default.returncode == off.returncode == 0, default.stderr
    assert default.stdout == off.stdout and default.stderr == off.stderr
    assert default.stderr.splitlines()[-1] == "NO-RICH"
    assert "rows" in default.stdout and "━" not in default.stdout + default.stderr
    assert _rows(tmp_path / "a.duckdb") == _rows(tmp_path / "b.duckdb")


def test_progress_on_a_pipe_draws_on_stderr_only(tmp_path: Path) -> None:
    plain, drawn = _ingest(tmp_path / "a.duckdb"), _ingest(tmp_path / "b.duckdb", "--progress")
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout == plain.stdout
    files = len([p for p in DATA.rglob("*") if p.is_file()])
    assert f"{files}/{files} files" in drawn.stderr and "ioe ingest" in drawn.stderr
    assert _rows(tmp_path / "a.duckdb") == _rows(tmp_path / "b.duckdb")
    as_json = _ingest(tmp_path / "c.duckdb", "--progress", "--json")
    assert json.loads(as_json.stdout)["files"]  # --json stdout is still one JSON document


def test_a_terminal_gets_the_bar(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    try:
        done = _ingest(tmp_path / "a.duckdb", "--progress", stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the writer side is closed and everything was read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
    assert done.returncode == 0
    text = b"".join(chunks).decode(errors="replace")
    rows = sum(int(line.split()[-2]) for line in done.stdout.splitlines() if line.endswith(" rows"))
    assert "ioe ingest" in text and "files" in text and "\x1b[" in text  # drawn with terminal codes
    assert f"{rows:,} rows" in text.replace("\x1b", " ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_bar_only_after_two_seconds() -> None:
    now = [0.0]
    files = sorted(p for p in DATA.rglob("*") if p.is_file())
    screen = _Terminal()
    bar = IngestProgress([DATA], stream=screen, clock=lambda: now[0])
    assert bar.enabled
    bar(files[0], 10, False)
    bar(files[0], 25, True)
    now[0] = AFTER_S - 0.01
    bar(files[1], 5, True)
    assert screen.getvalue() == ""  # a quick import: nothing drawn
    now[0] = AFTER_S
    bar(files[2], 7, True)
    bar.close()
    assert bar.rows == 37 and bar.files == 3
    assert "3/" in screen.getvalue() and "37 rows" in screen.getvalue()
    piped = io.StringIO()
    assert not IngestProgress([DATA], stream=piped).enabled and piped.getvalue() == ""
