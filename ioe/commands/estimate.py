"""``ioe estimate``: expected TTFT/TPOT of one layout, or of every row of a calibration-style CSV.

Single form: ``ioe estimate --model M --gpu G --tp T --pp P --batch B --isl I --osl O [--json]``.
Batch form: ``ioe estimate --csv FILE [--out FILE]`` reads rows with the columns of
``dense_calibration.csv`` (model_path, system, backend, precision, mode, isl, osl, batch_size,
tp_size, pp_size, moe_ep_size, prefill_* / decode_* for disaggregated rows) and writes them back
with ``predicted_ttft_ms``, ``predicted_tpot_ms``, ``predicted_wall``, ``weights_per_gpu_gb``,
``max_sequences`` and ``estimate_error`` (why a row could not be estimated; the row is kept).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from analyzer import catalog, modelcfg, perf
from analyzer.capacity import (
    Layout,
    bytes_per_param,
    capacity,
    check_layout,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_per_gpu_per_sequence,
)

ADDED = (
    "predicted_ttft_ms",
    "predicted_tpot_ms",
    "predicted_wall",
    "weights_per_gpu_gb",
    "max_sequences",
    "estimate_error",
)


def _num(row: dict[str, str], col: str, default: int | None = None) -> int:
    """An integer cell (CSV writes ``8.0``); empty uses ``default``; otherwise a clear error."""
    text = (row.get(col) or "").strip()
    if not text:
        if default is None:
            raise ValueError(f"column {col!r} is empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"column {col!r} is not a number (got {text!r})") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"column {col!r} must be a finite non-negative number (got {text!r})")
    return int(value)


def _precision(row: dict[str, str]) -> str:
    """Empty precision in the calibration CSV means the checkpoint's BF16."""
    p = (row.get("precision") or "").strip().lower()
    return p or "bf16"


def _layout(row: dict[str, str], prefix: str = "") -> Layout:
    ep = _num(row, f"{prefix}moe_ep_size", 1) or 1
    adp = _num(row, f"{prefix}attention_dp_size", 1) > 1
    return Layout(
        tp=_num(row, f"{prefix}tp_size", 1), pp=_num(row, f"{prefix}pp_size", 1), ep=ep, attention_dp=adp
    )


def row_concurrency(row: dict[str, str]) -> int:
    """The benchmark's total concurrent clients: a ``concurrency`` column, else the
    ``silicon_concurrency=N`` field of ``silicon_data_source``; 0 when the row does not say."""
    if (row.get("concurrency") or "").strip():
        return _num(row, "concurrency")
    for part in (row.get("silicon_data_source") or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == "silicon_concurrency" and value.strip():
            return _num({"silicon_concurrency": value}, "silicon_concurrency")
    return 0


@functools.lru_cache(maxsize=64)
def _model(name: str) -> modelcfg.ModelConfig:
    """Each model of a CSV is read once (a calibration fit estimates every row many times)."""
    return modelcfg.load(name)


@dataclass(frozen=True)
class RowInputs:
    """What one calibration-style row asks for (:func:`row_inputs`)."""

    model: modelcfg.ModelConfig
    gpu: catalog.Gpu
    backend: str
    precision: str
    isl: int
    osl: int
    disagg: bool
    layout: Layout  # the aggregated layout (the prefill layout of a disaggregated row)
    batch: int


def row_inputs(row: dict[str, str]) -> RowInputs:
    """The model, GPU, backend, shape and layout of one row; raises ``ValueError``/``KeyError``
    naming the column."""
    model = _model(row.get("model_path") or row.get("model") or "")
    gpu = catalog.gpu(row.get("system") or row.get("gpu") or "")
    backend = (row.get("backend") or "vllm").strip().lower()
    disagg = (row.get("mode") or "agg").strip() == "disagg"
    return RowInputs(
        model, gpu, backend, _precision(row), _num(row, "isl"), _num(row, "osl"), disagg,
        _layout(row, "prefill_") if disagg else _layout(row), 0 if disagg else _num(row, "batch_size"),
    )  # fmt: skip


def estimate_row(row: dict[str, str], eff: perf.Efficiency | None = None) -> perf.Estimate:
    """The live model's estimate for one calibration-style row; raises ``ValueError``/``KeyError``
    naming the column.

    1. Aggregated rows: :func:`analyzer.perf.expected_latency` at ``batch_size`` requests in the
       system. No benchmark-harness term is added (the closed-loop harness model that compares
       with benchmark rows is ``bench/closed_loop.py``).
    2. Disaggregated rows use their worker counts: ``prefill_num_workers`` prefill servers and
       ``decode_num_workers`` decode servers share the benchmark's clients (:func:`row_concurrency`;
       :func:`analyzer.perf.disaggregated_latency`).
    ``eff`` replaces the tabled factors of the row's (backend, GPU) (calibration fits them with it).
    """
    r = row_inputs(row)
    factors = eff or perf.efficiency(r.backend, r.gpu.name)
    if r.disagg:
        return perf.disaggregated_latency(
            r.model, r.gpu, r.layout, _layout(row, "decode_"),
            _num(row, "prefill_batch_size", 1), _num(row, "decode_batch_size", 1),
            r.isl, r.osl, r.backend, r.precision, None,
            _num(row, "prefill_num_workers", 1) or 1, _num(row, "decode_num_workers", 1) or 1,
            row_concurrency(row), factors,
        )  # fmt: skip
    return perf.expected_latency(
        r.model, r.gpu, r.layout, r.batch, r.isl, r.osl, r.backend, r.precision, eff=factors
    )


def annotate(row: dict[str, str]) -> dict[str, Any]:
    """``row`` with the :data:`ADDED` columns; a row that cannot be estimated says why and is kept."""
    out: dict[str, Any] = dict(row)
    try:
        est = estimate_row(row)
    except (ValueError, KeyError) as exc:
        out.update({k: "" for k in ADDED})
        out["estimate_error"] = str(exc).strip("\"'")
        return out
    out.update({
        "predicted_ttft_ms": round(est.ttft_s * 1e3, 3),
        "predicted_tpot_ms": round(est.tpot_s * 1e3, 4),
        "predicted_wall": est.wall,
        "weights_per_gpu_gb": round(est.terms.get("weights_per_gpu_bytes", 0.0) / 1e9, 3),
        "max_sequences": int(est.terms.get("max_sequences", 0)),
        "estimate_error": "",
    })  # fmt: skip
    return out


def annotate_csv(src: Path) -> list[dict[str, Any]]:
    """Every row of ``src`` annotated (see :func:`annotate`)."""
    with src.open(newline="") as fh:
        return [annotate(r) for r in csv.DictReader(fh)]


def write_rows(rows: list[dict[str, Any]], dest: Any) -> None:
    if not rows:
        return
    writer = csv.DictWriter(dest, fieldnames=list(rows[0].keys()))
    writer.writeheader()
    writer.writerows(rows)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN/Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def single(
    model: str, gpu: str, layout: Layout, batch: int, isl: int, osl: int, backend: str, precision: str
) -> dict[str, Any]:
    """The single-layout estimate as a strict-JSON document (module doc, single form).

    1. Unknown model, GPU, backend or precision, and a layout the engines refuse
       (:func:`analyzer.capacity.check_layout`), raise ``ValueError``/``KeyError`` naming it.
    2. ``capacity`` carries the memory figures: weights bytes per GPU, KV bytes per token (whole
       model and per GPU), per sequence of ISL + OSL tokens (whole model and per GPU), the KV
       budget per GPU, the max sequences per replica, and ``fits`` with ``reason``.
    3. A layout that does not fit has ``ttft_ms``/``tpot_ms`` null and ``fits`` false with the
       reason; no value is ever NaN or Infinity.
    """
    m, g = modelcfg.load(model), catalog.gpu(gpu)
    check_layout(m, layout)
    if backend not in perf.EFFICIENCY:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(sorted(perf.EFFICIENCY))}")
    bytes_per_param(precision)  # unknown precisions raise, naming the known ones
    s = perf.Setup(m, g, layout, precision, backend)
    kv_p, ctx = s.kv_precision, isl + osl
    c = capacity(m, g, layout, context_tokens=ctx, precision=precision, kv_precision=kv_p)
    est = perf.expected_latency(m, g, layout, batch, isl, osl, backend, precision)
    fits = c.fits
    doc: dict[str, Any] = {
        "model": m.name, "gpu": g.name, "layout": layout.label(), "batch": batch,
        "isl": isl, "osl": osl, "backend": backend, "precision": precision, "kv_precision": kv_p,
        "fits": fits, "reason": c.reason or None,
        "ttft_ms": est.ttft_s * 1e3 if fits else None, "tpot_ms": est.tpot_s * 1e3 if fits else None,
        "running": est.running, "wall": est.wall,
        "capacity": {
            "weights_bytes_per_gpu": c.weights_bytes,
            "activation_bytes_per_gpu": c.activation_bytes,
            "usable_bytes_per_gpu": c.usable_bytes,
            "kv_budget_bytes_per_gpu": c.kv_budget_bytes,
            "kv_bytes_per_token": kv_bytes_per_token(m, kv_p),
            "kv_bytes_per_token_per_gpu": kv_per_gpu_per_sequence(m, 1, kv_p, layout),
            "kv_bytes_per_sequence": kv_bytes_per_sequence(m, ctx, kv_p),
            "kv_bytes_per_sequence_per_gpu": c.kv_per_sequence_bytes,
            "sequence_tokens": ctx,
            "max_sequences": c.max_sequences,
            "fits": fits, "reason": c.reason or None,
        },
        "terms": est.terms,
    }  # fmt: skip
    return _finite(doc)


def estimate(
    model: str = typer.Option("", "--model", help="Shipped model name or path to a config.json."),
    gpu: str = typer.Option("h100_sxm", "--gpu", help="GPU name (catalog key or DCGM modelName)."),
    tp: int = typer.Option(1, "--tp", min=1),
    pp: int = typer.Option(1, "--pp", min=1),
    ep: int = typer.Option(1, "--ep", min=1),
    batch: int = typer.Option(1, "--batch", min=1, help="Concurrent requests per replica."),
    isl: int = typer.Option(1024, "--isl", min=1),
    osl: int = typer.Option(128, "--osl", min=1),
    backend: str = typer.Option("vllm", "--backend", help="vllm | sglang | trtllm"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp8 | fp4"),
    csv_in: Path | None = typer.Option(None, "--csv", help="Calibration-style CSV to annotate."),
    out: Path | None = typer.Option(None, "--out", help="Where to write the annotated CSV (default stdout)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Expected TTFT and TPOT (with the model terms) for a layout, or for every row of a CSV.

    Exit 2 with one line on stderr for bad input (unknown model/GPU/backend/precision, a TP the
    heads refuse) and for a layout that does not fit (``--json`` still prints the document, with
    ``fits`` false and the reason).
    """
    if csv_in is not None:
        rows = annotate_csv(csv_in)
        if out is None:
            write_rows(rows, sys.stdout)
        else:
            with out.open("w", newline="") as fh:
                write_rows(rows, fh)
        return
    try:
        result = single(
            model, gpu, Layout(tp=tp, pp=pp, ep=ep), batch, isl, osl, backend.lower(), precision.lower()
        )
    except (ValueError, KeyError) as exc:
        typer.echo(f"estimate refused: {str(exc).strip(chr(34))}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(result, indent=2, allow_nan=False))
    else:
        r, c = result, result["capacity"]
        typer.echo(f"{r['model']} on {r['gpu']} {r['layout']} batch {batch} ISL {isl} OSL {osl}")
        typer.echo(
            f"  weights {c['weights_bytes_per_gpu'] / 1e9:.1f} GB/GPU, "
            f"KV {c['kv_bytes_per_token'] / 1e3:.1f} kB/token, "
            f"KV budget {max(c['kv_budget_bytes_per_gpu'], 0.0) / 1e9:.1f} GB/GPU, "
            f"max {c['max_sequences']} sequences of {c['sequence_tokens']} tokens"
        )
        if r["fits"]:
            typer.echo(f"  TTFT {r['ttft_ms']:.1f} ms   TPOT {r['tpot_ms']:.2f} ms   wall: {r['wall']}")
    if not result["fits"]:
        typer.echo(
            f"estimate: {result['model']} {result['precision']} does not fit {result['layout']} on "
            f"{result['gpu']}: {result['reason']}",
            err=True,
        )
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
