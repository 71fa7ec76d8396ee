"""Capture: IOE's NVML reader on a real GPU under known workloads (run on a GPU machine).

Run: ``python -m bench.gpu_counters OUT.json [--seconds S]`` on a machine with an NVIDIA GPU,
PyTorch and nvidia-ml-py. It runs five phases one after another —

* ``idle``: nothing on the GPU;
* ``compute``: back-to-back 8192³ BF16 matrix products (tensor-core bound);
* ``memory``: back-to-back device-to-device copies of a 2 GiB buffer (HBM-bandwidth bound);
* ``h2d``: back-to-back copies of a pinned 1 GiB host buffer to the GPU (PCIe bound);
* ``tiny``: back-to-back launches of a one-block kernel (the GPU is "busy" but its SMs are idle);
* ``cooldown``: nothing again —

while :class:`collector.sources.nvml.NvmlReader` reads every ``--interval`` seconds in a thread
and ``nvidia-smi`` samples the same GPU independently. What each phase achieved is measured
with CUDA events (TFLOP/s, bytes/s counting read and write). Everything lands in one JSON file:
the reader's rows, the phase windows, the achieved figures, nvidia-smi's samples, and what the
machine has (driver, NVML bindings, DCGM, InfiniBand).

``tests/test_nvml_h100_capture.py`` checks the reader's interpretation against that capture.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SMI_FIELDS = (
    "timestamp,power.draw,clocks.sm,clocks.mem,utilization.gpu,utilization.memory,"
    "memory.used,temperature.gpu,clocks_event_reasons.active"
)


class Sampler(threading.Thread):
    """Calls the reader every ``interval`` seconds until stopped; keeps rows and problems."""

    def __init__(self, reader: Any, interval: float):
        super().__init__(daemon=True)
        self.reader, self.interval = reader, interval
        self.rows: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.read_s: list[float] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            t0 = time.perf_counter()
            parsed = self.reader.read(time.time_ns())
            self.read_s.append(time.perf_counter() - t0)
            for df in parsed.tables.values():
                self.rows.extend(df.to_dicts())
            self.problems.extend(f"{p.where}: {p.what}" for p in parsed.problems)
            self._stop_evt.wait(self.interval)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()


def _timed_loop(torch: Any, step: Any, seconds: float) -> tuple[int, float]:
    """Run ``step`` back to back for about ``seconds``; (iterations, GPU seconds by CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    n, t_end = 0, time.monotonic() + seconds
    while time.monotonic() < t_end:
        for _ in range(8):
            step()
        n += 8
        if n % 64 == 0:
            torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    return n, start.elapsed_time(end) / 1e3


def run_phases(seconds: float) -> dict[str, Any]:
    """The workload phases; returns their windows (ns) and achieved figures."""
    import torch

    phases: dict[str, Any] = {}

    def mark(name: str, fn: Any) -> None:
        t0 = time.time_ns()
        figures = fn()
        phases[name] = {"start_ns": t0, "end_ns": time.time_ns(), **figures}

    def idle() -> dict[str, Any]:
        time.sleep(seconds / 2)
        return {}

    def compute() -> dict[str, Any]:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        n, gpu_s = _timed_loop(torch, lambda: torch.matmul(a, b, out=c), seconds)
        return {"iterations": n, "gpu_s": gpu_s, "tflops": 2 * 8192**3 * n / gpu_s / 1e12}

    def memory() -> dict[str, Any]:
        nbytes = 2 << 30
        x = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32).fill_(1.0)
        y = torch.empty_like(x)
        n, gpu_s = _timed_loop(torch, lambda: y.copy_(x), seconds)
        return {
            "iterations": n,
            "gpu_s": gpu_s,
            "bytes_per_s": 2 * nbytes * n / gpu_s,
            "buffer_bytes": nbytes,
        }

    def h2d() -> dict[str, Any]:
        nbytes = 1 << 30
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        n, gpu_s = _timed_loop(torch, lambda: dev.copy_(host, non_blocking=True), seconds / 2)
        return {"iterations": n, "gpu_s": gpu_s, "bytes_per_s": nbytes * n / gpu_s, "buffer_bytes": nbytes}

    def tiny() -> dict[str, Any]:
        z = torch.zeros(32, device="cuda")
        n, gpu_s = _timed_loop(torch, lambda: z.add_(1.0), seconds)
        return {"iterations": n, "gpu_s": gpu_s, "launches_per_s": n / gpu_s}

    busy = (("idle", idle), ("compute", compute), ("memory", memory), ("h2d", h2d), ("tiny", tiny))
    for name, fn in busy:
        mark(name, fn)
        torch.cuda.empty_cache()
    mark("cooldown", idle)
    phases["torch"] = {"version": torch.__version__, "device": torch.cuda.get_device_name(0)}
    return phases


def _fields(struct: Any) -> dict[str, Any]:
    return {name: getattr(struct, name) for name, _ in struct._fields_}


def machine() -> dict[str, Any]:
    """What the machine has: driver, bindings, DCGM, InfiniBand — and each reader's own verdict."""
    import pynvml

    from collector.sources.infiniband import InfinibandReader
    from collector.sources.pydcgm import DcgmReader

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "nvml_version": pynvml.nvmlSystemGetNVMLVersion(),
        "nvidia_ml_py": importlib.metadata.version("nvidia-ml-py"),
        "gpu_name": pynvml.nvmlDeviceGetName(h),
        "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "memory_v1": _fields(pynvml.nvmlDeviceGetMemoryInfo(h)),
        "memory_v2": _fields(pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)),
        "dcgmi": shutil.which("dcgmi"),
        "pydcgm": list(DcgmReader().available()),
        "infiniband": list(InfinibandReader().available()),
    }
    pynvml.nvmlShutdown()
    return info


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each busy phase")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between reader reads")
    args = ap.parse_args(argv)

    from collector.sources.nvml import NvmlReader

    info = machine()
    reader = NvmlReader(host=platform.node(), energy_every=1)  # the energy test integrates every read
    print("reader:", reader.available(), flush=True)
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=subprocess.PIPE,
        text=True,
    )
    sampler = Sampler(reader, args.interval)
    sampler.start()
    phases = run_phases(args.seconds)
    sampler.stop()
    smi.terminate()
    smi_lines = (smi.communicate()[0] or "").splitlines()
    reader.close()
    capture = {
        "machine": info,
        "interval_s": args.interval,
        "phases": phases,
        "reader_rows": sampler.rows,
        "reader_problems": sampler.problems,
        "reader_read_s": sampler.read_s,
        "nvidia_smi_fields": SMI_FIELDS,
        "nvidia_smi": smi_lines,
    }
    args.out.write_text(json.dumps(capture, default=str))
    summary = {k: {kk: vv for kk, vv in v.items() if not kk.endswith("_ns")} for k, v in phases.items()}
    print(json.dumps({"machine": info, "phases": summary, "rows": len(sampler.rows)}, indent=1, default=str))
    print("problems:", sampler.problems[:5])


if __name__ == "__main__":
    main(sys.argv[1:])
