"""Planner search time against the 2 s goal (issue 6), for budgets up to 64 GPUs.

Run: ``.venv/bin/python -m bench.bench_planner``. Prints, per case, the candidates evaluated, the
best-of-5 wall time and its ratio to the 2 s budget.
"""

from __future__ import annotations

import time

from analyzer import catalog, modelcfg, planner

BUDGET_S = 2.0
CASES = [
    ("llama-3.1-8b", "h100_sxm", 8, 1, "bf16"),
    ("llama-3.1-70b", "h100_sxm", 16, 2, "bf16"),
    ("llama-3.1-405b", "h100_sxm", 64, 8, "fp8"),
    ("qwen3-235b-a22b", "h200_sxm", 64, 8, "fp8"),
    ("deepseek-v3", "h200_sxm", 64, 8, "fp8"),
]


def main() -> None:
    print(f"{'case':44s} {'cands':>6s} {'best s':>8s} {'/ 2 s':>7s}")
    for model, gpu, n, nodes, prec in CASES:
        p = planner.Problem(modelcfg.load(model), catalog.gpu(gpu), n, nodes, catalog.fabric("ib_ndr"),
                            "vllm", prec)  # fmt: skip
        times, count = [], 0
        for _ in range(5):
            t = time.perf_counter()
            count = len(planner.search(p, planner.Workload(2048, 256)))
            times.append(time.perf_counter() - t)
        best = min(times)
        print(f"{model + ' ' + gpu + ' x' + str(n):44s} {count:6d} {best:8.3f} {best / BUDGET_S:7.3f}")


if __name__ == "__main__":
    main()
