"""The README's demo table on the live surfaces: `ioe demo` running, its API, page and /metrics
asked at checkpoints (default 2, 10 and 20 minutes) for each deployment's zone.

Run: ``.venv/bin/python -m bench.demo_surfaces [--at 120 600 1200] [--out bench/results/demo_surfaces.md]``

At each checkpoint, for each deployment: the API envelope (default 15-minute window, what the page
draws), the one-hot ``ioe_deployment_zone`` of ``/metrics``, and the page's HTTP status. The
expected zones are the README's table (what each simulated deployment is built to show).
Prints one row per checkpoint and deployment; exit 1 when any surface disagrees.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

BUILT_TO_SHOW = {
    "chat-8b": "hbm_bandwidth",
    "code-70b": "compute",
    "longctx-70b": "kv_capacity",
    "tp16-ib": "network",
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 60.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError as exc:
        return 0, str(exc)


def surfaces(base: str) -> dict[str, dict[str, Any]]:
    """Each deployment's zone on the API and on /metrics, and the page's status."""
    out: dict[str, dict[str, Any]] = {}
    page, _ = _get(base + "/")
    _, metrics = _get(base + "/metrics")
    one_hot: dict[str, list[str]] = {}
    for fam in text_string_to_metric_families(metrics):
        for s in fam.samples:
            if s.name == "ioe_deployment_zone" and s.value == 1.0:
                one_hot.setdefault(s.labels["deployment"], []).append(s.labels["zone"])
    for name in BUILT_TO_SHOW:
        status, body = _get(f"{base}/api/v1/deployments/{name}/envelope")
        api = json.loads(body)["envelope"]["primary"] if status == 200 else f"HTTP {status}"
        out[name] = {"api": api, "metrics": one_hot.get(name, []), "page": page}
    return out


class Demo:
    """A running ``ioe demo`` on a free local port that stops itself ``duration`` seconds in."""

    def __init__(self, duration: float) -> None:
        self.port = _port()
        self.work = Path(tempfile.mkdtemp(prefix="ioe-demo-surfaces-"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ioe", "demo", "--duration", f"{duration:g}", "--port", str(self.port),
             "--workdir", str(self.work)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self.t0 = time.monotonic()

    def sample(self, checkpoints: list[float]) -> list[tuple[float, str, dict[str, Any]]]:
        """The surfaces at each checkpoint (seconds since the demo started)."""
        rows = []
        for at in sorted(checkpoints):
            time.sleep(max(at - (time.monotonic() - self.t0), 0))
            for name, got in surfaces(f"http://127.0.0.1:{self.port}").items():
                rows.append((at, name, got))
        return rows

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def run(checkpoints: list[float]) -> list[tuple[float, str, dict[str, Any]]]:
    demo = Demo(max(checkpoints) + 30)
    try:
        return demo.sample(checkpoints)
    finally:
        demo.stop()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--at", type=float, nargs="+", default=[120.0, 600.0, 1200.0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = run(args.at)
    lines = [
        "| minute | deployment | built to show | API / page | /metrics | page HTTP | agree |",
        "|---|---|---|---|---|---|---|",
    ]
    bad = 0
    for at, name, got in rows:
        want = BUILT_TO_SHOW[name]
        ok = got["api"] == want and got["metrics"] == [want] and got["page"] == 200
        bad += not ok
        lines.append(f"| {at / 60:g} | {name} | {want} | {got['api']} | {','.join(got['metrics'])} | "
                     f"{got['page']} | {'yes' if ok else '**no**'} |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
