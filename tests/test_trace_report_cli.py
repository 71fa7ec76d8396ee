"""``ioe trace-report`` as a user runs it: strict JSON on an inference trace, arrival skew in the text."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

STRAGGLER = ROOT / "tests" / "data" / "kineto" / "synthetic_4rank_straggler"


def _inference_trace(path: Path) -> None:
    """One rank of a single-GPU serving step: GEMMs and attention, no communication kernel (hand-built in
    the Kineto layout of tests/data/kineto; what every TP1 inference profile looks like)."""
    t0, events = 1_700_000_000_000_000, []
    for step in range(3):
        base = t0 + step * 5000
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step + 1}",
                "pid": 1000,
                "tid": 1000,
                "ts": base,
                "dur": 4990,
                "args": {"External id": step + 1},
            }
        )
        for k, (name, dur) in enumerate((("sm90_xmma_gemm_bf16", 1800), ("flash_fwd_kernel", 900))):
            corr = 100 * step + k + 1
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1000,
                    "tid": 1000,
                    "ts": base + 5 + k,
                    "dur": 3,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": name,
                    "pid": 0,
                    "tid": 7,
                    "ts": base + 20 + k * 2000,
                    "dur": dur,
                    "args": {"device": 0, "stream": 7, "correlation": corr},
                }
            )
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "traceEvents": events,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ioe", "trace-report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_json_is_strict_where_a_rank_has_no_communication(tmp_path: Path) -> None:
    _inference_trace(tmp_path / "serve" / "rank-0.json.gz")
    done = _run(str(tmp_path / "serve"), "--json")
    assert done.returncode == 0, done.stderr
    assert "NaN" not in done.stdout and "Infinity" not in done.stdout
    body = json.loads(done.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    [row] = body["sets"]["serve"]["comm_comp_overlap"]  # was a bare NaN: 0 us of comm over 0 us
    assert row["comp_comm_overlap_pctg"] is None
    assert "no communication kernel" in row["null_reasons"]["comp_comm_overlap_pctg"]
    text = _run(str(tmp_path / "serve"))
    assert text.returncode == 0 and "nan" not in text.stdout.lower()
    assert "arrival skew: no collective seen on two or more ranks" in text.stdout


def test_text_report_names_the_late_rank() -> None:
    done = _run(str(STRAGGLER))
    assert done.returncode == 0, done.stderr
    skew = [line for line in done.stdout.splitlines() if "arrival skew" in line]
    assert skew and "last to arrive most often: rank 2" in skew[0]
