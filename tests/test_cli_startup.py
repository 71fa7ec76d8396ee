"""``ioe --help``, ``-h`` and ``--version`` start without importing what only commands need.

1. The command index (:mod:`ioe.commands._index`) lists every command the modules register, in
   the order and with the help the complete application shows, so the fast root help is the
   same text as the complete application's.
2. ``ioe --help``, ``ioe -h``, ``ioe`` and ``ioe --version`` import no command module, and none of
   typer, click, polars, DuckDB, numpy, pyarrow, FastAPI, uvicorn, pydantic or rich
   (``sys.modules`` as the process exits): the root help is rendered by :mod:`ioe.entry`.
3. ``ioe NAME -h`` imports only NAME's module (``trace-report -h`` loads no polars).

The time itself is measured by bench/bench_startup.py (BENCHMARKS.md): a wall-clock bound here
would fail on a loaded machine and pass for the wrong reasons on a quiet one.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import typer
import typer.main
from conftest import ROOT
from typer.testing import CliRunner

import ioe.cli
from ioe.commands._index import COMMANDS
from ioe.entry import root_help

HEAVY = (
    "typer",
    "click",
    "polars",
    "duckdb",
    "numpy",
    "pyarrow",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "rich",
)


def _registered_by(module: str) -> list[str]:
    app = typer.Typer()

    @app.callback()
    def _root() -> None: ...

    importlib.import_module(f"ioe.commands.{module}").register(app)
    return list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_index_is_the_complete_applications_commands() -> None:
    group = typer.main.get_command(ioe.cli.app)
    real = [
        (name, (cmd.help or "").split("\n\n")[0])
        for name, cmd in group.commands.items()  # type: ignore[attr-defined]
    ]
    assert [(name, text) for name, _, text in COMMANDS] == real
    for name, module, _ in COMMANDS:
        assert name in _registered_by(module), f"{name} is not registered by ioe.commands.{module}"


# `python -m ioe ARGS`, printing the modules it imported as it exits (also through SystemExit)
PROBE = (
    "import atexit, json, runpy, sys\n"
    "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
    "sys.argv[0] = 'python -m ioe'\n"
    "runpy.run_module('ioe', run_name='__main__', alter_sys=True)\n"
)


def _run(*args: str, probe: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", PROBE, *args] if probe else [sys.executable, "-m", "ioe", *args]
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


def _imported(stderr: str) -> set[str]:
    line = [x for x in stderr.splitlines() if x.startswith("MODULES ")][-1]
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize("width", [50, 64, 78, 100])
def test_the_fast_root_help_is_clicks_rendering_at_every_width(width: int) -> None:
    group = typer.main.get_command(ioe.cli._listing())
    ctx = group.make_context("ioe", ["--help"], resilient_parsing=True, terminal_width=width)
    assert root_help("ioe", width) == group.get_help(ctx) + "\n"


def test_ioe_alone_prints_the_help_to_stderr_and_exits_2() -> None:
    done = _run()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == _run("--help").stdout


def test_root_help_is_the_complete_applications_help() -> None:
    fast = _run("--help")
    full = CliRunner().invoke(ioe.cli.app, ["--help"], prog_name="python -m ioe", terminal_width=78)
    assert fast.returncode == full.exit_code == 0, fast.stderr
    assert fast.stdout == full.output
    assert [
        line.split()[0] for line in fast.stdout.split("Commands:\n")[1].splitlines() if line[2:3] != " "
    ] == [name for name, _, _ in COMMANDS]


@pytest.mark.parametrize("args", [("--help",), ("-h",), (), ("--version",)])
def test_root_help_and_version_import_nothing_heavy(args: tuple[str, ...]) -> None:
    done = _run(*args, probe=True)
    assert done.returncode in (0, 2), done.stderr[-2000:]  # click exits 2 for `ioe` alone (no command)
    assert "Usage:" in done.stdout + done.stderr or done.stdout.startswith("ioe ")
    imported = _imported(done.stderr)
    assert "ioe.entry" in imported
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)
    commands = sorted(m for m in imported if m.startswith("ioe.commands.") and m != "ioe.commands._index")
    assert heavy == [] and commands == []


def test_a_command_imports_only_its_own_module() -> None:
    done = _run("trace-report", "-h", probe=True)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = _imported(done.stderr)
    commands = {m for m in imported if m.startswith("ioe.commands.")} - {"ioe.commands._index"}
    assert commands == {"ioe.commands.trace_report"}
    assert not {m for m in imported if m.split(".")[0] in ("polars", "duckdb", "numpy")}
