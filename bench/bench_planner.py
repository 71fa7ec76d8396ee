"""Planner search time against the 1 s goal (issue 20; issue 6 asked 2 s), for budgets up to 64 GPUs.

Run: ``.venv/bin/python -m bench.bench_planner``. Prints, per case, the candidates evaluated, the
best-of-5 wall time and its ratio to the 1 s budget, and the best-of-5 CPU time of the process
(``time.process_time``): on a shared machine the wall time counts other jobs' turns on the cores,
the CPU time only the search's own work.
"""

from __future__ import annotations

import time

from analyzer import catalog, modelcfg, planner

BUDGET_S = 1.0
CASES = [
    ("llama-3.1-8b", "h100_sxm", 8, 1, "bf16"),
    ("llama-3.1-70b", "h100_sxm", 16, 2, "bf16"),
    ("llama-3.1-405b", "h100_sxm", 64, 8, "fp8"),
    ("qwen3-235b-a22b", "h200_sxm", 64, 8, "fp8"),
    ("deepseek-v3", "h200_sxm", 64, 8, "fp8"),
]


def main() -> None:
    print(f"{'case':44s} {'cands':>6s} {'best s':>8s} {'/ 1 s':>7s} {'cpu s':>7s}")
    for model, gpu, n, nodes, prec in CASES:
        p = planner.Problem(modelcfg.load(model), catalog.gpu(gpu), n, nodes, catalog.fabric("ib_ndr"),
                            "vllm", prec)  # fmt: skip
        times, cpus, count = [], [], 0
        for _ in range(5):
            t, c = time.perf_counter(), time.process_time()
            count = len(planner.search(p, planner.Workload(2048, 256)))
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        best = min(times)
        label = f"{model} {gpu} x{n}"
        print(f"{label:44s} {count:6d} {best:8.3f} {best / BUDGET_S:7.3f} {min(cpus):7.3f}")


if __name__ == "__main__":
    main()
