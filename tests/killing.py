"""A child process killed part way through its work, for crash-safety tests of the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kill_during(script: str, args: list[str], started: bytes, delay_s: float) -> None:
    """Run ``python -c script args`` from the checkout, wait for the line ``started`` it prints
    when its work begins, then SIGKILL it ``delay_s`` later and reap it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == started
    time.sleep(delay_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
