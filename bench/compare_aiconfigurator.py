"""``ioe plan`` against NVIDIA AIConfigurator 0.12 on the same cases (issue 20, item 3).

Run: ``.venv/bin/python -m bench.compare_aiconfigurator [--aic /work/aic-venv/bin/aiconfigurator]
[--out DIR] [--cases N,M]``. AIConfigurator lives in its own venv (``python3 -m venv
/work/aic-venv && /work/aic-venv/bin/pip install 'aiconfigurator==0.12.*'``); this script only
shells out to it and to ``python -m ioe plan`` — nothing here is imported by the test suite.

Per case (model, GPU, backend, precision, ISL/OSL, SLOs, 8 GPUs, aggregated serving):
  1. AIConfigurator: ``aiconfigurator cli default --serving-mode agg`` with ``HF_HUB_OFFLINE=1``;
     its ``agg/best_config_topn.csv`` holds each layout's best SLO-meeting batch and
     ``agg/pareto.csv`` the frontier of its batch sweeps. A layout's goodput is the largest
     ``tokens/s/gpu`` among its rows meeting both SLOs (TTFT ≤ SLO, TPOT ≤ SLO); AIC's best is
     the largest of those.
  2. IOE: ``ioe plan --json --top 500``; IOE's pick is its first aggregated candidate (the case
     compares aggregated serving; an overall P/D pick is noted).
  3. Layouts are matched on (TP, PP, attention-DP, MoE TP, MoE EP): IOE TPt → AIC tp t (MoE:
     etp t); TPt·EPt → tp t, ep t; TPt·EPt·attnDP → tp 1, dp t, ep t.
  4. Figures: ``pick/best`` = AIC's goodput of IOE's pick over AIC's best (goal ≥ 0.95);
     ``IOE/AIC same layout`` = IOE's predicted goodput of its pick over AIC's for that layout
     (goal within ±25 %). A pick outside AIC's search space has no AIC figure and fails.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

AIC = "/work/aic-venv/bin/aiconfigurator"
GPUS = 8


@dataclass(frozen=True)
class Case:
    aic_model: str
    ioe_model: str
    gpu: str
    backend: str
    precision: str
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float

    @property
    def label(self) -> str:
        return (f"{self.ioe_model} {self.precision} {self.gpu} {self.backend} "
                f"{self.isl}/{self.osl} TTFT≤{self.ttft_ms:g} TPOT≤{self.tpot_ms:g}")  # fmt: skip


L70 = "meta-llama/Meta-Llama-3.1-70B"
CASES = [
    Case("Qwen/Qwen3-32B", "qwen3-32b", "h200_sxm", "vllm", "bf16", 4000, 500, 1000, 20),
    Case("Qwen/Qwen3-32B-FP8", "qwen3-32b", "h100_sxm", "trtllm", "fp8", 2048, 256, 2000, 50),
    Case(L70, "llama-3.1-70b", "h100_sxm", "vllm", "bf16", 1024, 1024, 2000, 30),
    Case(L70, "llama-3.1-70b", "h200_sxm", "trtllm", "bf16", 8000, 1000, 3000, 40),
    Case("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b", "h100_sxm", "vllm", "bf16", 1024, 256, 500, 15),
    Case("Qwen/Qwen3-30B-A3B-FP8", "qwen3-30b-a3b", "h200_sxm", "vllm", "fp8", 4000, 500, 1000, 20),
    Case("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b", "h100_sxm", "trtllm", "bf16", 2048, 256, 2000, 50),
    Case("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b", "h200_sxm", "trtllm", "fp8", 1024, 1024, 2000, 50),
    Case("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b", "h200_sxm", "vllm", "fp8", 4000, 500, 2000, 50),
]  # fmt: skip

Key = tuple[int, int, int, int, int]  # (tp, pp, attention dp, moe tp, moe ep) in AIC's terms


def aic_command(c: Case, save: Path, aic: str) -> list[str]:
    return [aic, "cli", "default", "--model", c.aic_model, "--total-gpus", str(GPUS), "--system", c.gpu,
            "--backend", c.backend, "--isl", str(c.isl), "--osl", str(c.osl), "--ttft", f"{c.ttft_ms:g}",
            "--tpot", f"{c.tpot_ms:g}", "--serving-mode", "agg", "--top-n", "20", "--save-dir", str(save),
            "--no-color"]  # fmt: skip


def ioe_command(c: Case) -> list[str]:
    return [sys.executable, "-m", "ioe", "plan", "--model", c.ioe_model, "--gpu", c.gpu, "--gpus", str(GPUS),
            "--isl", str(c.isl), "--osl", str(c.osl), "--ttft-slo", f"{c.ttft_ms / 1e3:g}",
            "--tpot-slo", f"{c.tpot_ms / 1e3:g}", "--backend", c.backend, "--precision", c.precision,
            "--top", "500", "--json"]  # fmt: skip


def aic_goodput(save: Path, c: Case) -> dict[Key, float]:
    """Best SLO-meeting tokens/s/gpu per AIC layout (note 1): the run's ``agg/best_config_topn.csv``
    (AIC's best SLO-meeting batch of each layout) and its ``agg/pareto.csv`` (the frontier of the
    batch sweeps, which drops dominated layouts), each row kept only if it meets both SLOs."""
    files = sorted(save.rglob("agg/best_config_topn.csv")) + sorted(save.rglob("agg/pareto.csv"))
    if not files:
        raise RuntimeError(f"no agg/best_config_topn.csv or agg/pareto.csv under {save}")
    out: dict[Key, float] = {}
    for path in files:
        with path.open() as f:
            for r in csv.DictReader(f):
                if float(r["ttft"]) > c.ttft_ms or float(r["tpot"]) > c.tpot_ms:
                    continue
                key = (int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["moe_tp"]), int(r["moe_ep"]))
                out[key] = max(out.get(key, 0.0), float(r["tokens/s/gpu"]))
    return out


def to_aic(cand: dict[str, object], moe: bool) -> Key:
    """An IOE candidate's layout in AIC's terms (note 3)."""
    tp, pp, ep = int(str(cand["tp"])), int(str(cand["pp"])), int(str(cand["ep"]))
    if not moe:
        return (tp, pp, 1, 1, 1)
    if cand["attention_dp"]:
        return (1, pp, tp, 1, ep)
    return (tp, pp, 1, 1 if ep > 1 else tp, ep)


def aic_label(k: Key) -> str:
    return f"tp{k[0]}pp{k[1]}dp{k[2]}etp{k[3]}ep{k[4]}"


def run_case(c: Case, out: Path, aic: str) -> dict[str, object]:
    save = out / c.label.replace(" ", "_").replace("/", "-").replace("≤", "")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t = time.perf_counter()
    if not sorted(save.rglob("agg/pareto.csv")):
        proc = subprocess.run(aic_command(c, save, aic), env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            return {"case": c.label, "error": f"aiconfigurator exit {proc.returncode}: {proc.stderr[-400:]}"}
    aic_s = time.perf_counter() - t
    aic_table = aic_goodput(save, c)
    t = time.perf_counter()
    plan = subprocess.run(ioe_command(c), capture_output=True, text=True, check=False)
    ioe_s = time.perf_counter() - t
    if plan.returncode:
        return {"case": c.label, "error": f"ioe plan exit {plan.returncode}: {plan.stderr[-400:]}"}
    cands = json.loads(plan.stdout)["candidates"]
    agg = [x for x in cands if not x["prefill_replicas"] and x["feasible"]]
    moe = c.ioe_model.startswith(("qwen3-30b", "qwen3-235b"))
    best_key, best = max(aic_table.items(), key=lambda kv: kv[1]) if aic_table else ((0, 0, 0, 0, 0), 0.0)
    row: dict[str, object] = {"case": c.label, "aic_best": best, "aic_best_layout": aic_label(best_key),
                              "aic_s": round(aic_s, 1), "ioe_s": round(ioe_s, 1),
                              "ioe_overall_pick": cands[0]["layout"] if cands else ""}  # fmt: skip
    if not agg:
        return {**row, "error": "IOE: no aggregated layout meets the SLOs"}
    pick = agg[0]
    key = to_aic(pick, moe)
    same = aic_table.get(key)
    ioe_same = {to_aic(x, moe): x["goodput_tok_s_per_gpu"] for x in reversed(agg)}
    row.update({
        "ioe_pick": pick["layout"], "ioe_pick_aic": aic_label(key),
        "ioe_goodput": pick["goodput_tok_s_per_gpu"],
        "aic_of_pick": same, "pick_over_best": (same or 0.0) / best if best else None,
        "ioe_over_aic_same": pick["goodput_tok_s_per_gpu"] / same if same else None,
        "ioe_of_aic_best": ioe_same.get(best_key),
    })  # fmt: skip
    return row


def render(rows: list[dict[str, object]]) -> str:
    head = ("| case | AIC best layout | AIC best tok/s/GPU | IOE pick (AIC terms) | AIC of IOE pick "
            "| pick / best | IOE pick tok/s/GPU | IOE / AIC same layout | IOE of AIC's best layout "
            "| goals |")  # fmt: skip
    lines = [head, "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['error']} |  |  |  |  |  |  |  |  |")
            continue

        def f(v: object, fmt: str = ".0f") -> str:
            return "—" if v is None else format(float(str(v)), fmt)

        pb, same = r["pick_over_best"], r["ioe_over_aic_same"]
        ok_pick = pb is not None and float(str(pb)) >= 0.95
        ok_same = same is not None and abs(float(str(same)) - 1) <= 0.25
        goals = f"pick {'met' if ok_pick else 'not met'}, same layout {'met' if ok_same else 'not met'}"
        lines.append(
            f"| {r['case']} | {r['aic_best_layout']} | {f(r['aic_best'])} "
            f"| {r['ioe_pick']} ({r['ioe_pick_aic']}) "
            f"| {f(r['aic_of_pick'])} | {f(pb, '.2f')} | {f(r['ioe_goodput'])} | {f(same, '.2f')} "
            f"| {f(r['ioe_of_aic_best'])} | {goals} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    aic = argv[argv.index("--aic") + 1] if "--aic" in argv else AIC
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path("/tmp/aic_compare")
    picked = [int(i) for i in argv[argv.index("--cases") + 1].split(",")] if "--cases" in argv else None
    cases = [c for i, c in enumerate(CASES) if picked is None or i in picked]
    rows = []
    for c in cases:
        rows.append(run_case(c, out, aic))
        print(json.dumps(rows[-1]), flush=True)
    print(render(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
