"""The CLI's errors: one line on stderr and exit 2, each through a real ``ioe`` process.

Every case runs ``python -m ioe`` from this checkout as a subprocess and asserts the exit code
and that stderr is exactly one line naming the problem (no traceback). The stores are real
DuckDB files (:mod:`api_store`); the "running writer" is a second process holding the store
open, as a sidecar does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_store import build
from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120


def ioe(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ioe", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd, env=_env())  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, whatever cwd is


def one_line(r: subprocess.CompletedProcess[str], code: int = 2) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("built") / "store.duckdb"
    build(str(path)).close()
    return path


@pytest.fixture
def store(built: Path, tmp_path: Path) -> Path:
    path = tmp_path / "store.duckdb"
    shutil.copyfile(built, path)
    return path


@pytest.fixture
def held(store: Path) -> Iterator[int]:
    """A running writer (another process) holding ``store`` open: its PID."""
    code = ("import sys, time\nfrom collector.store import Store\nst = Store(sys.argv[1])\n"
            "print('held', flush=True)\ntime.sleep(300)\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, str(store)], stdout=subprocess.PIPE, text=True,
                            env=_env())  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", ["serve", "sidecar"])
def test_busy_port_is_one_line(command: str, taken_port: int, store: Path, tmp_path: Path) -> None:
    r = ioe(command, "--store", str(store), "--port", str(taken_port), cwd=tmp_path)
    line = one_line(r)
    assert f"127.0.0.1:{taken_port}" in line and "already in use" in line


def test_serve_does_not_create_a_mistyped_store(tmp_path: Path) -> None:
    typo = tmp_path / "tpyo" / "store.duckdb"
    line = one_line(ioe("serve", "--store", str(typo), "--port", str(free_port()), cwd=tmp_path))
    assert "no such file" in line and "--create" in line
    assert not typo.exists() and not typo.parent.exists()
    missing = tmp_path / "new.duckdb"
    assert "no such file" in one_line(ioe("serve", "--store", str(missing), "--port", "0", cwd=tmp_path))
    assert not missing.exists()


@pytest.mark.parametrize("command", ["serve", "sidecar"])
def test_a_store_a_running_writer_holds_is_one_line_for_writers(
    command: str, store: Path, held: int, tmp_path: Path
) -> None:
    line = one_line(ioe(command, "--store", str(store), "--port", str(free_port()), cwd=tmp_path))
    assert f"in use by another process (PID {held})" in line


def test_analyze_and_query_read_a_held_store_from_a_snapshot(store: Path, held: int, tmp_path: Path) -> None:
    r = ioe("analyze", "--store", str(store), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("llama70b: kv_capacity")
    assert r.stderr.strip() == f"ioe analyze: store {store} is in use by PID {held}: reading a snapshot"
    q = ioe("query", "--store", str(store), "--format", "json", "SELECT count(*) AS n FROM request_spans",
            cwd=tmp_path)  # fmt: skip
    assert q.returncode == 0, q.stderr
    assert q.stdout.strip() == '[{"n": 200}]'
    p = ioe("plan", "--deployment", "llama70b", "--store", str(store), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["candidates"]
    assert not list(Path(tempfile.gettempdir()).glob(f"ioe-snapshot-*/{store.name}"))  # removed after


@pytest.mark.parametrize("command", ["serve", "sidecar", "analyze", "query"])
def test_a_corrupt_store_is_one_line(command: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(bytes(range(256)) * 400)
    args = {"serve": ["--port", str(free_port())], "sidecar": ["--port", str(free_port())],
            "analyze": [], "query": ["SELECT 1"]}[command]  # fmt: skip
    line = one_line(ioe(command, "--store", str(bad), *args, cwd=tmp_path))
    assert str(bad) in line and "not a valid DuckDB database file" in line


@pytest.mark.parametrize("command", ["serve", "analyze"])
def test_a_truncated_store_is_refused_at_start(command: str, store: Path, tmp_path: Path) -> None:
    """A copy cut off short of its used blocks opens in DuckDB (its catalog is intact) and would be
    reported ready, failing only when a query reaches a missing block. (Cutting only free blocks off
    the end is harmless, DuckDB does it itself, so the cut goes at least one block into the used
    ones.)"""
    import duckdb

    with duckdb.connect(str(store), read_only=True) as con:
        row = con.execute(
            "SELECT block_size, used_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
    assert row is not None
    used_end = 3 * 4096 + int(row[0]) * int(row[1])
    size = store.stat().st_size
    with store.open("r+b") as fh:
        fh.truncate(min(size - size // 100, used_end - int(row[0])))
    args = ["--port", str(free_port())] if command == "serve" else []
    line = one_line(ioe(command, "--store", str(store), *args, cwd=tmp_path))
    assert "truncated" in line and str(store) in line


def test_analyze_missing_store_and_unknown_names(store: Path, tmp_path: Path) -> None:
    assert "no such file" in one_line(ioe("analyze", "--store", str(tmp_path / "nope.duckdb"), cwd=tmp_path))
    line = one_line(ioe("analyze", "--store", str(store), "--deployment", "llama7b", cwd=tmp_path))
    assert "no deployment 'llama7b'" in line and "llama70b" in line
    line = one_line(ioe("estimate", "--model", "llama-3.1-8b", "--gpu", "h1000", cwd=tmp_path))
    assert "unknown GPU 'h1000'" in line
    line = one_line(ioe("plan", "--model", "llama-3.1-8b", "--gpu", "h1000", cwd=tmp_path))
    assert "unknown GPU 'h1000'" in line


@pytest.mark.parametrize("at", ["inf", "nan", "9300000000", "-5"])
def test_analyze_refuses_a_time_nanoseconds_cannot_hold(store: Path, tmp_path: Path, at: str) -> None:
    """Past 2262 (or before 1970, or not a number) a time in ns does not fit 64 bits: one line, exit 2."""
    line = one_line(ioe("analyze", "--store", str(store), f"--at={at}", cwd=tmp_path))
    assert f"--at {at!r}" in line and "1970-2262" in line


def _interrupt_when_ready(args: list[str], port: int, sig: signal.Signals, cwd: Path) -> tuple[int, str]:
    """Start ``python -m ioe *args``, wait for /readyz, send ``sig``; the exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "ioe", *args], stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=_env())  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, f"ioe {args[0]} did not become ready"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_cleanly_on_ctrl_c(sig: signal.Signals, tmp_path: Path) -> None:
    """``--create`` starts a new store; Ctrl-C (or SIGTERM) ends with exit 0 and only the start
    line on stderr (the maintenance thread's join raised TypeError before)."""
    port, path = free_port(), tmp_path / "new.duckdb"
    args = ["serve", "--store", str(path), "--create", "--port", str(port)]
    code, err = _interrupt_when_ready(args, port, sig, tmp_path)
    assert code == 0, err
    assert err.strip().splitlines() == [f"ioe serve: store {path} on http://127.0.0.1:{port}"]
    assert path.exists()


def test_sidecar_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port, path = free_port(), tmp_path / "node.duckdb"
    args = ["sidecar", "--store", str(path), "--port", str(port)]
    code, err = _interrupt_when_ready(args, port, signal.SIGINT, tmp_path)
    assert code == 0, err
    assert "Traceback" not in err and "Error" not in err, err
