"""Start-up time of the ``ioe`` command (issue 22): ``--help``, ``-h`` and ``--version`` as a user
runs them, each a fresh process.

Each case runs ``--runs`` times (default 15, alternating the cases so load drifts hit them
alike) as a subprocess with the garbage collector on (nothing here disables it); the figure is
the median wall time from spawn to exit, and the median CPU time (user + system) of the child
from ``wait4``, which a loaded machine inflates less than wall time. Peers in the same run:
``python -c pass`` (the interpreter alone) and ``python -c "import typer"`` (the floor a typer
CLI cannot go under). ``ioe trace-report`` start-up: ``--help`` of that command, and its whole
run over the 2-rank ``trace_filter_2rank`` fixture.

The entry point is the ``ioe`` script beside this interpreter, run with ``PYTHONPATH`` set to
this checkout so it imports the code measured (an editable install may point elsewhere).

Goal: ``ioe --help`` under 0.15 s (median wall).

    python -m bench.bench_startup --runs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 0.15
TRACE_SET = ROOT / "tests" / "data" / "kineto" / "trace_filter_2rank"


def cases(trace: bool) -> dict[str, list[str]]:
    py = sys.executable
    script = str(Path(py).with_name("ioe"))
    out = {
        "python -c pass": [py, "-c", "pass"],
        'python -c "import typer"': [py, "-c", "import typer"],
        "python -m ioe --help": [py, "-m", "ioe", "--help"],
        "python -m ioe -h": [py, "-m", "ioe", "-h"],
        "python -m ioe --version": [py, "-m", "ioe", "--version"],
        "ioe --help (entry point)": [script, "--help"],
        "ioe --version (entry point)": [script, "--version"],
    }
    if trace:
        out["ioe trace-report --help"] = [script, "trace-report", "--help"]
        if TRACE_SET.exists():
            out["ioe trace-report <2-rank set>"] = [script, "trace-report", str(TRACE_SET)]
    return out


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run; raises if the command fails."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--no-trace", action="store_true", help="Skip the trace-report cases.")
    args = ap.parse_args()
    todo = cases(not args.no_trace)
    walls: dict[str, list[float]] = {k: [] for k in todo}
    cpus: dict[str, list[float]] = {k: [] for k in todo}
    for argv in todo.values():  # one warm-up each (page cache, .pyc files)
        run_once(argv)
    for _ in range(args.runs):
        for name, argv in todo.items():
            wall, cpu = run_once(argv)
            walls[name].append(wall)
            cpus[name].append(cpu)
    print(f"load average {os.getloadavg()[0]:.1f}, {args.runs} runs each, medians (min-max wall)")
    print(f"{'case':34s} {'wall s':>8s} {'cpu s':>7s}  range")
    for name in todo:
        w, c = walls[name], cpus[name]
        print(
            f"{name:34s} {statistics.median(w):8.3f} {statistics.median(c):7.3f}  {min(w):.3f}-{max(w):.3f}"
        )
    help_s = statistics.median(walls["python -m ioe --help"])
    entry_s = statistics.median(walls["ioe --help (entry point)"])
    met = "met" if max(help_s, entry_s) < GOAL_S else "not met"
    print(f"goal ioe --help < {GOAL_S} s: {met} (python -m {help_s:.3f} s, entry point {entry_s:.3f} s)")


if __name__ == "__main__":
    main()
