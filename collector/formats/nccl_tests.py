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

1. The op comes from the ``# Collective test starting: X`` banner, else from the test binary
   named anywhere around the table (``mpirun … ./build/all_reduce_perf``, ``Running: …``), so
   ``all_reduce_perf`` → ``AllReduce``; an unknown test name keeps its name (``hypercube``) and
   its rows are not checked (rule 4 needs the factor). With neither, busbw/algbw and the
   redop/root columns decide: ratio > 1 → AllReduce; < 1 → ReduceScatter with a reduction op,
   else AllGather (AlltoAll prints the same factor and is stored as AllGather); = 1 →
   Reduce/Broadcast with a root, else AllReduce on 2 GPUs with a reduction op, else SendRecv.
2. ``n_gpus``: the highest ``Rank N`` line + 1 (MPI gathers every process's lines onto rank 0;
   an excerpt may keep only the last), else NCCL's own ``nranks N`` (``NCCL_DEBUG=INFO``), else
   the launcher's process count (``mpirun -np N``, ``srun -n N``) × ``nThread × nGpus``, else
   ``nThread × nGpus``. ``host`` is set only when every rank line is there and names one host.
   When the printed busbw contradicts that count (or none is printed), the
   count that busbw/algbw implies for the op is used: AllReduce n = 2/(2 − r), (n−1)/n ops
   n = 1/(1 − r), rounded and checked against rule 4 on the row with the largest busbw.
   JSON: ``len(devices) × nthreads × ngpus``.
3. The table layout is read from the column header line, so logs with or without the ``redop`` /
   ``root`` columns (older nccl-tests, per-collective layouts) and with ``cputime`` parse alike;
   ``#wrong`` (``error`` before 2.13) may read ``N/A`` (validation off) → NULL.
4. busbw is checked: busbw = algbw × factor, factor AllReduce 2(n−1)/n; ReduceScatter, AllGather,
   AlltoAll, Gather, Scatter (n−1)/n; Broadcast, Reduce, SendRecv 1. A side whose printed busbw
   differs from the printed algbw × factor by more than the printing rounding (half a unit of
   each printed last digit) is refused as a Problem naming the line, with the expected value:
   it usually means the GPU count is wrong, and a wrong baseline is worse than none.
5. A row that does not split into the header's columns, or has a non-numeric field, is a Problem
   quoting the line; other rows are kept.
6. One log may hold several tests (a script running each ``*_perf`` in turn): each test ends at
   its ``# Avg bus bandwidth`` line and is read on its own (rules 1-3 per test).
7. Only lines that start like a result row (an integer size, then an integer count) are rows:
   slurm/MPI preambles, ``NCCL INFO``/``NCCL version`` lines, plugin logs and shell prompts
   are skipped, never refused.
8. A table without its column header line (an excerpt) takes its layout from its first row:
   13 fields → size count type redop root + 2 × (time algbw busbw #wrong); 12 → with redop, or
   with root when the fourth field is an integer; 11 → neither.
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
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_THREADS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_TEST = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_BINARY = re.compile(r"(?<![\w-])((?:[\w./-]*/)?[a-z_]+_perf(?:_mpi)?)(?![\w.])")
_NRANKS = re.compile(r"NCCL INFO .*\bnranks (\d+)")
_LAUNCH = re.compile(r"\b(?:mpirun|mpiexec|srun)\b.*?(?:\s-np?|\s--ntasks|\s--np)[\s=](\d+)")
_END = re.compile(r"^#\s*Avg bus bandwidth")
_SIDE = ("time", "algbw", "busbw", "#wrong")
_REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "premulsum", "mulsum"})


def parse_text(text: str, source: str = "", ts_ns: int = 0) -> Parsed:
    """Parse an nccl-tests text log (docstring rules 1–9); one log may hold several tests."""
    lines = text.splitlines()
    parsed = Parsed()
    sections = _sections(lines)
    if not any(_data_lines(lines[a:b], a) for a, b in sections):
        return Parsed(
            problems=[Problem(source or "log", "no nccl-tests result rows (size count type … busbw)")]
        )
    for start, stop in sections:
        parsed.extend(_section(lines[start:stop], start, source, ts_ns))
    return parsed


def _sections(lines: list[str]) -> list[tuple[int, int]]:
    """Rule 6: ``[start, stop)`` line ranges, each ending after its ``# Avg bus bandwidth`` line."""
    out, start = [], 0
    for i, line in enumerate(lines):
        if _END.match(line):
            out.append((start, i + 1))
            start = i + 1
    if start < len(lines):
        out.append((start, len(lines)))
    return out


def _data_lines(lines: list[str], offset: int) -> list[tuple[int, list[str]]]:
    """Rule 7: ``(line number, fields)`` of the lines that start like a result row (an integer
    size then an integer count); everything else in a log is skipped."""
    out = []
    for i, line in enumerate(lines):
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit():
            out.append((offset + i + 1, fields))
    return out


def _section(lines: list[str], offset: int, source: str, ts_ns: int) -> Parsed:
    rows_in = _data_lines(lines, offset)
    if not rows_in:
        return Parsed()
    head = _text_header(lines)
    columns = head["columns"] or _columns_of(rows_in[0][1])
    op = head["op"] or _op_from_ratio(rows_in, columns)
    n_gpus = _gpus(head, op, rows_in, columns)
    rows: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for lineno, fields in rows_in:
        loc = f"{source}:{lineno}" if source else f"line {lineno}"
        try:
            got = _text_row(fields, columns, op, n_gpus)
        except ValueError as exc:
            problems.append(Problem(loc, f"{exc} (got {quote(' '.join(fields))})"))
            continue
        for row in got:
            row.update(source=source, host=head["host"], ts_ns=ts_ns)
            rows.append(row)
    parsed = Parsed(problems=problems)
    if rows:
        parsed.add(TABLE, frame(TABLE, rows))
    return parsed


def _text_header(lines: list[str]) -> dict[str, Any]:
    """Rules 1-2 and 8: what the lines around a table say about it."""
    ranks: dict[int, str] = {}
    threads, test, binary, columns, nranks, procs = 0, "", "", None, 0, 0
    for line in lines:
        if m := _RANK.match(line):
            ranks[int(m.group(1))] = m.group(2)
        elif m := _THREADS.search(line):
            threads = int(m.group(1)) * int(m.group(2))
        elif m := _TEST.search(line):
            test = m.group(1)
        elif line.lstrip("#").split()[:2] == ["size", "count"]:
            columns = line.lstrip("#").split()
        else:
            if m := _NRANKS.search(line):
                nranks = max(nranks, int(m.group(1)))
            found = _BINARY.search(line)
            if not binary and found:
                binary = found.group(1)
            # the launcher's own options only: a test's "-n 50" (iterations) is not a count
            if m := _LAUNCH.search(line[: found.start()] if found else line):
                procs = int(m.group(1))
    hosts = set(ranks.values()) if len(ranks) == max(ranks, default=-1) + 1 else set()
    return {
        "op": op_name(test or binary) if (test or binary) else "",
        "ranks": max(ranks) + 1 if ranks else 0,
        "nranks": nranks,
        "procs": procs,
        "threads": threads,
        "columns": columns,
        "host": hosts.pop() if len(hosts) == 1 else "",
    }


def _columns_of(fields: list[str]) -> list[str]:
    """Rule 8: the layout of a table printed without its column header, from one row."""
    side = ["time", "algbw", "busbw", "#wrong"] * 2
    extra = len(fields) - 11
    if extra == 2:
        return ["size", "count", "type", "redop", "root", *side]
    if extra == 1:
        return ["size", "count", "type", "root" if _is_int(fields[3]) else "redop", *side]
    return ["size", "count", "type", *side]


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _reference(rows: list[tuple[int, list[str]]], columns: list[str]) -> tuple[str, str] | None:
    """The printed (algbw, busbw) of the row with the largest busbw (the most digits)."""
    n_pre = _n_pre(columns)
    best: tuple[str, str] | None = None
    for _, fields in rows:
        if len(fields) < n_pre + 4:
            continue
        algbw, busbw = fields[n_pre + 1], fields[n_pre + 2]
        try:
            if float(algbw) > 0 and (best is None or float(busbw) > float(best[1])):
                best = (algbw, busbw)
        except ValueError:
            continue
    return best


def _op_from_ratio(rows: list[tuple[int, list[str]]], columns: list[str]) -> str:
    """Rule 1, last resort: the op from busbw/algbw and the redop/root columns."""
    ref = _reference(rows, columns)
    if ref is None:
        return ""
    ratio = float(ref[1]) / float(ref[0])
    first = dict(zip(columns, rows[0][1], strict=False))
    reduces = first.get("redop", "none") in _REDOPS
    rooted = _is_int(first.get("root", "-1")) and int(first.get("root", "-1")) >= 0
    if ratio > 1.02:
        return "AllReduce"
    if ratio < 0.98:
        return "ReduceScatter" if reduces else "AllGather"
    if rooted:
        return "Reduce" if reduces else "Broadcast"
    return "AllReduce" if reduces else "SendRecv"


def _ratio_gpus(op: str, ref: tuple[str, str]) -> int | None:
    """Rule 2: the GPU count that busbw/algbw implies, when the op's factor depends on it."""
    ratio = float(ref[1]) / float(ref[0])
    if op == "AllReduce" and ratio < 2:
        guess = 2 / (2 - ratio)
    elif op in ("ReduceScatter", "AllGather", "AlltoAll", "Gather", "Scatter") and ratio < 1:
        guess = 1 / (1 - ratio)
    else:
        return None
    for n in sorted(range(max(2, round(guess) - 3), round(guess) + 4), key=lambda k: abs(k - guess)):
        if check_busbw(op, n, *ref) is None:
            return n
    return None


def _gpus(head: dict[str, Any], op: str, rows: list[tuple[int, list[str]]], columns: list[str]) -> int:
    """Rule 2: rank lines, NCCL's nranks, launcher processes × nThread × nGpus, nThread × nGpus;
    the busbw/algbw ratio when none is printed or the printed count contradicts it."""
    per_proc = head["threads"] or 1
    told = head["ranks"] or head["nranks"] or (head["procs"] * per_proc if head["procs"] else 0)
    ref = _reference(rows, columns)
    if ref is None:
        return told or per_proc
    guess = told or per_proc
    if check_busbw(op, guess, *ref) is None:
        return guess
    return _ratio_gpus(op, ref) or guess


def _n_pre(columns: list[str]) -> int:
    return columns.index(next(c for c in columns if c in ("time", "cputime")))


def _text_row(fields: list[str], columns: list[str], op: str, n: int) -> list[dict[str, Any]]:
    n_pre = _n_pre(columns)
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
_TABLE_HEAD = re.compile(rb"(?m)^#?\s*size\s+count\s+type\b.*\balgbw\s+busbw")


def sniff_text(name: str, head: bytes) -> bool:
    """A banner, an ``nThread … nGpus`` header with a table, or a bare table header (excerpts)."""
    return (
        b"# Collective test starting:" in head
        or (b"nThread" in head and b"nGpus" in head and b"algbw" in head and b"busbw" in head)
        or _TABLE_HEAD.search(head) is not None
    )


def sniff_json(name: str, head: bytes) -> bool:
    start = head.lstrip()[:1]
    return start == b"{" and b'"nccl_version"' in head and (b'"results"' in head or b'"config"' in head)


def load_text(path: Path, ctx: IngestContext) -> Parsed:
    return parse_text(path.read_text(encoding="utf-8", errors="replace"), str(path), ctx.ts_ns)


def load_json(path: Path, ctx: IngestContext) -> Parsed:
    return parse_json(path.read_text(encoding="utf-8", errors="replace"), str(path), ctx.ts_ns)


def explain_text(name: str, head: bytes) -> tuple[float, str] | None:
    """How close a refused head came to an nccl-tests log."""
    if any(k in head for k in (b"algbw", b"busbw", b"_perf", b"nThread")):
        return 0.6, (
            "mentions nccl-tests (algbw/busbw/*_perf/nThread) but holds no result table header "
            "(size count type … algbw busbw) nor a '# Collective test starting' banner"
        )
    return None


def explain_json(name: str, head: bytes) -> tuple[float, str] | None:
    if head.lstrip()[:1] == b"{" and (b'"results"' in head or b'"nccl_version"' in head):
        return 0.5, 'JSON, but not an nccl-tests -J report (needs "nccl_version" and "results" or "config")'
    return None


FILE_FORMATS = [
    FileFormat("nccl-tests", sniff_text, load_text, priority=30, explain=explain_text),
    FileFormat("nccl-tests-json", sniff_json, load_json, priority=30, explain=explain_json),
]
