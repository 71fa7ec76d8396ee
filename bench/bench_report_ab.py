"""The front door (``deployment_report``) on one store, this checkout against another, alternating.

Each round runs one child process per checkout (``PYTHONPATH``), this one and ``--peer`` in
turn: it opens the store read-only (as ``ioe serve`` does), times the report once on the fresh
connection (the warm-up), then times ``--repeat`` reports on it, now open, garbage collector on,
and prints them. Medians over the rounds of each checkout, fresh and open, with the range. Both
read the same file: a store written by this checkout can be read by an older one when the schema
change is only added columns.

``--peer-store`` gives the peer another file: the same data in the layout the peer writes (a
file this checkout migrated on open, against the original the peer still reads as it is).

Run: ``.venv/bin/python -m bench.bench_report_ab --peer /work/main --store FILE --hours 1
[--peer-store FILE] [--window 900] [--rounds 3] [--repeat 1]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def child(store: str, hours: float, window_s: int, repeat: int) -> tuple[float, list[float]]:
    from analyzer.deployments import list_deployments
    from analyzer.report import deployment_report
    from analyzer.thresholds import Thresholds
    from bench.bench_envelope import NS, T0
    from collector.readonly import open_readonly

    gc.enable()
    con = open_readonly(Path(store))
    end = T0 + int(hours * 3600) * NS
    start = end - window_s * NS
    dep = list_deployments(con, end - 900 * NS)[0]
    th = Thresholds()
    t = time.perf_counter()
    deployment_report(con, dep, start, end, th)
    fresh = time.perf_counter() - t
    took = []
    for _ in range(repeat):
        t = time.perf_counter()
        deployment_report(con, dep, start, end, th)
        took.append(time.perf_counter() - t)
    return fresh, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", type=Path, required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument(
        "--peer-store",
        help="the file the peer reads (default: --store), e.g. the same data in the layout the peer writes",
    )
    ap.add_argument("--hours", type=float, default=1.0, help="the store's length (its end is T0 + hours)")
    ap.add_argument("--window", type=int, default=900)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.store, args.hours, args.window, args.repeat)))
        return
    got: dict[str, list[float]] = {"this": [], "peer": []}
    fresh: dict[str, list[float]] = {"this": [], "peer": []}
    load = [os.getloadavg()]
    for _ in range(args.rounds):
        for label, root in (("peer", args.peer), ("this", HERE)):
            store = args.peer_store if label == "peer" and args.peer_store else args.store
            cmd = [sys.executable, str(HERE / "bench" / "bench_report_ab.py"), "--child", "--peer", str(root),
                   "--store", store, "--hours", str(args.hours), "--window", str(args.window),
                   "--repeat", str(args.repeat)]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(root)}
            out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
            first, took = json.loads(out.stdout.strip().splitlines()[-1])
            fresh[label].append(first)
            got[label] += took
            print(label, "fresh", round(first, 3), "open", [round(x, 3) for x in took], flush=True)
    load.append(os.getloadavg())
    for kind, times in (("fresh", fresh), ("open", got)):
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            print(f"{kind} {k}: median {med[k]:.3f} s ({min(v):.3f}-{max(v):.3f}), n={len(v)}")
        print(f"{kind} peer / this: {med['peer'] / med['this']:.2f}x")
    print(f"load average before {load[0]}, after {load[1]}")


if __name__ == "__main__":
    main()
