"""nccl-tests output (``all_reduce_perf`` …, text log or ``-J`` JSON) → ``nccl_baselines`` rows.

Input shapes:

* text: header lines (``# Collective test starting: all_reduce_perf``, ``#  Rank  3 Group …``),
  a column header line ``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time …``
  then one row per size: out-of-place columns, then in-place columns (µs and GB/s);
* JSON (``-J file``): ``{"args": [...], "config": {"nthreads", "ngpus", "devices": [...]},
  "results": [{"size", "count", "type", "redop", "root", "out_of_place": {"time", "alg_bw",
  "bus_bw", "nwrong"}, "in_place": {...}}]}``.

Output: two rows per size (``in_place`` False then True), sizes in bytes, time in µs, bandwidth
in GB/s (10^9 bytes/s, as nccl-tests prints it).

Rules:

1. The op comes from the test name (``all_reduce_perf`` → ``AllReduce``); an unknown test name
   keeps its name (``hypercube``) and its rows are not checked (rule 4 needs the factor).
2. ``n_gpus`` is the number of ``#  Rank`` lines (MPI gathers every process's lines onto rank 0);
   without them, ``nThread × nGpus``. JSON: ``len(devices) × nthreads × ngpus``.
3. The table layout is read from the column header line, so logs with or without the ``redop`` /
   ``root`` columns (older nccl-tests, per-collective layouts) and with ``cputime`` parse alike;
   ``#wrong`` may read ``N/A`` (validation off) → NULL.
4. busbw is checked: busbw = algbw × factor, factor AllReduce 2(n−1)/n; ReduceScatter, AllGather,
   AlltoAll, Gather, Scatter (n−1)/n; Broadcast, Reduce, SendRecv 1. A side whose printed busbw
   differs from the printed algbw × factor by more than the printing rounding (half a unit of
   each printed last digit) is refused as a Problem naming the line, with the expected value:
   it usually means the GPU count is wrong, and a wrong baseline is worse than none.
5. A row that does not split into the header's columns, or has a non-numeric field, is a Problem
   quoting the line; other rows are kept.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from collector.errors import Problem, quote
from collector.formats import FileFormat, IngestContext, Parsed
from collector.records import frame

TABLE = "nccl_baselines"

OPS = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "alltoall": "AlltoAll",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "sendrecv": "SendRecv",
    "gather": "Gather",
    "scatter": "Scatter",
}


def bus_factor(op: str, n: int) -> float | None:
    """busbw / algbw for ``op`` on ``n`` GPUs (rule 4); ``None`` when unknown."""
    if n < 1:
        return None
    if op == "AllReduce":
        return 2 * (n - 1) / n
    if op in ("ReduceScatter", "AllGather", "AlltoAll", "Gather", "Scatter"):
        return (n - 1) / n
    if op in ("Broadcast", "Reduce", "SendRecv"):
        return 1.0
    return None


def op_name(test: str) -> str:
    """``/opt/nccl-tests/build/all_reduce_perf_mpi`` → ``AllReduce`` (rule 1)."""
    base = Path(test).name
    base = re.sub(r"_perf(_mpi)?$", "", base)
    return OPS.get(base, base)


def _half_unit(text: str) -> float:
    """Half a unit of the last printed digit: '171.98' → 0.005, '1.2e+03' → 50, '355' → 0.5."""
    mantissa, _, exp = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals) * 10.0 ** (int(exp) if exp else 0)


def check_busbw(op: str, n: int, algbw: str, busbw: str) -> str | None:
    """Rule 4 on printed values; returns why it fails, or ``None``."""
    factor = bus_factor(op, n)
    if factor is None:
        return None
    expected = float(algbw) * factor
    slack = _half_unit(busbw) + _half_unit(algbw) * factor + 1e-9
    if abs(float(busbw) - expected) > slack:
        return (
            f"busbw {busbw} GB/s disagrees with algbw {algbw} × {factor:.4g} "
            f"({op}, n={n}) = {expected:.4g} GB/s beyond rounding (±{slack:.3g})"
        )
    return None


# -- text --------------------------------------------------------------------------------------
_RANK = re.compile(r"^#\s+Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_THREADS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_TEST = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_SIDE = ("time", "algbw", "busbw", "#wrong")


def parse_text(text: str, source: str = "", ts_ns: int = 0) -> Parsed:
    """Parse an nccl-tests text log (docstring rules 1–5)."""
    head = _text_header(text)
    op, n_gpus, columns = head["op"], head["n_gpus"], head["columns"]
    rows: list[dict[str, Any]] = []
    problems: list[Problem] = []
    if columns is None:
        return Parsed(
            problems=[Problem(source or "log", "no nccl-tests column header line (# size count …)")]
        )
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        loc = f"{source}:{lineno}" if source else f"line {lineno}"
        fields = line.split()
        try:
            got = _text_row(fields, columns, op, n_gpus)
        except ValueError as exc:
            problems.append(Problem(loc, f"{exc} (got {quote(line.strip())})"))
            continue
        for row in got:
            row.update(source=source, host=head["host"], ts_ns=ts_ns)
            rows.append(row)
    parsed = Parsed(problems=problems)
    if rows:
        parsed.add(TABLE, frame(TABLE, rows))
    return parsed


def _text_header(text: str) -> dict[str, Any]:
    ranks, hosts, threads, test, columns = 0, [], 1, "", None
    for line in text.splitlines():
        if m := _RANK.match(line):
            ranks += 1
            hosts.append(m.group(1))
        elif m := _THREADS.search(line):
            threads = int(m.group(1)) * int(m.group(2))
        elif m := _TEST.search(line):
            test = m.group(1)
        elif line.startswith("#") and line[1:].split()[:2] == ["size", "count"]:
            columns = line[1:].split()
    host = hosts[0] if hosts and len(set(hosts)) == 1 else ""
    return {"op": op_name(test), "n_gpus": ranks or threads, "columns": columns, "host": host}


def _text_row(fields: list[str], columns: list[str], op: str, n: int) -> list[dict[str, Any]]:
    n_pre = columns.index(next(c for c in columns if c in ("time", "cputime")))
    if len(fields) < n_pre + 8:
        raise ValueError(f"row has {len(fields)} fields, the header names {n_pre + 8}")
    pre = dict(zip(columns[:n_pre], fields[:n_pre], strict=True))
    base = {
        "op": op,
        "n_gpus": n,
        "size_bytes": int(pre["size"]),
        "count": int(pre["count"]),
        "dtype": pre.get("type", ""),
        "redop": pre.get("redop"),
        "root": int(pre["root"]) if "root" in pre else None,
    }
    out = []
    for in_place, side in ((False, fields[n_pre : n_pre + 4]), (True, fields[n_pre + 4 : n_pre + 8])):
        out.append({**base, "in_place": in_place, **_side(side, op, n)})
    return out


def _side(side: list[str], op: str, n: int) -> dict[str, Any]:
    time_s, algbw, busbw, wrong = side
    for name, value in zip(_SIDE, side, strict=True):
        if name != "#wrong" and not math.isfinite(float(value)):
            raise ValueError(f"{name} is not a finite number")
    why = check_busbw(op, n, algbw, busbw)
    if why:
        raise ValueError(why)
    return {
        "time_us": float(time_s),
        "algbw_gbs": float(algbw),
        "busbw_gbs": float(busbw),
        "wrong": None if wrong.upper() == "N/A" else int(float(wrong)),
    }


# -- JSON ---------------------------------------------------------------------------------------
def parse_json(text: str, source: str = "", ts_ns: int = 0) -> Parsed:
    """Parse an nccl-tests ``-J`` JSON report (rules 1, 2, 4, 5; ``results[i]`` names a row)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return Parsed(problems=[Problem(source or "json", f"not JSON ({exc.msg}) (got {quote(text[:80])})")])
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        return Parsed(problems=[Problem(source or "json", "no 'results' list: not an nccl-tests -J report")])
    args = doc.get("args") or [""]
    op = op_name(str(args[0]))
    raw_config = doc.get("config")
    config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    n = _json_gpus(config)
    host = _json_host(config)
    rows, problems = [], []
    for i, item in enumerate(doc["results"]):
        loc = f"{source}:results[{i}]" if source else f"results[{i}]"
        try:
            rows.extend(_json_rows(item, op, n))
        except (ValueError, TypeError, KeyError) as exc:
            problems.append(Problem(loc, f"{exc} (got {quote(json.dumps(item)[:100])})"))
    for row in rows:
        row.update(source=source, host=host, ts_ns=ts_ns)
    parsed = Parsed(problems=problems)
    if rows:
        parsed.add(TABLE, frame(TABLE, rows))
    return parsed


def _json_gpus(config: dict[str, Any]) -> int:
    per_proc = int(config.get("nthreads", 1)) * int(config.get("ngpus", 1))
    devices = config.get("devices")
    return per_proc * (len(devices) if isinstance(devices, list) and devices else 1)


def _json_host(config: dict[str, Any]) -> str:
    raw = config.get("devices")
    devices: list[Any] = raw if isinstance(raw, list) else []
    hosts = {d.get("hostname") for d in devices if isinstance(d, dict)}
    return str(hosts.pop()) if len(hosts) == 1 else ""


def _json_rows(item: dict[str, Any], op: str, n: int) -> list[dict[str, Any]]:
    base = {
        "op": op,
        "n_gpus": n,
        "size_bytes": int(item["size"]),
        "count": int(item["count"]),
        "dtype": str(item.get("type", "")),
        "redop": str(item["redop"]).strip() if item.get("redop") is not None else None,
        "root": int(str(item["root"]).strip()) if item.get("root") is not None else None,
    }
    out = []
    for in_place, key in ((False, "out_of_place"), (True, "in_place")):
        side = item.get(key)
        if side is None:  # trace replay writes no out-of-place result
            continue
        t = side.get("time", side.get("cputime", side.get("cpu_time")))
        wrong = side.get("nwrong")
        printed = [f"{float(t)!r}", f"{float(side['alg_bw'])!r}", f"{float(side['bus_bw'])!r}", "N/A"]
        values = _side(printed, op, n)
        values["wrong"] = None if wrong is None else int(float(wrong))
        out.append({**base, "in_place": in_place, **values})
    return out


# -- file formats ---------------------------------------------------------------------------------
def sniff_text(name: str, head: bytes) -> bool:
    return b"# Collective test starting:" in head or (
        b"nThread" in head and b"nGpus" in head and b"algbw" in head and b"busbw" in head
    )


def sniff_json(name: str, head: bytes) -> bool:
    start = head.lstrip()[:1]
    return start == b"{" and b'"nccl_version"' in head and (b'"results"' in head or b'"config"' in head)


def load_text(path: Path, ctx: IngestContext) -> Parsed:
    return parse_text(path.read_text(encoding="utf-8", errors="replace"), str(path), ctx.ts_ns)


def load_json(path: Path, ctx: IngestContext) -> Parsed:
    return parse_json(path.read_text(encoding="utf-8", errors="replace"), str(path), ctx.ts_ns)


FILE_FORMATS = [
    FileFormat("nccl-tests", sniff_text, load_text, priority=30),
    FileFormat("nccl-tests-json", sniff_json, load_json, priority=30),
]
