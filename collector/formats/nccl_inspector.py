"""NCCL Inspector output → ``collective_records`` rows (REFERENCE §3).

Two shapes are read, both pure (text in, :class:`Parsed` out):

* **JSONL** (``<dir>/<hostname>-pid<pid>.log``): one JSON object per line, ``header`` +
  ``metadata`` + one of ``coll_perf`` / ``p2p_perf`` / ``dump_stats``. Verbose dumps add
  ``event_trace_ts`` (epoch µs) inside the perf object.
* **Prometheus textfile** (``NCCL_INSPECTOR_PROM_DUMP=1``): gauges
  ``nccl_collective_exec_time_microseconds``, ``nccl_collective_bus_bandwidth_gbs`` /
  ``nccl_bus_bandwidth_gbs``, ``nccl_algorithm_bandwidth_gbs`` and ``nccl_p2p_*``.

Rules for a JSONL line:

1. A blank line is skipped silently.
2. A line that is not a JSON object, lacks ``header.id`` (a non-empty string) or
   ``header.rank`` (an integer), or whose perf fields have the wrong JSON type, is a
   :class:`Problem` at ``<source>:<line>`` naming the field and quoting it; the other lines
   are kept. Integers must lie in ``0..`` the store column's largest value (rank, ranks,
   nodes, peer: 32-bit; ``*_sn``, sizes, pid: 64-bit); times and bandwidths must not be
   negative.
3. A ``dump_stats`` line (a per-dump marker the Inspector writes before the records) and a line
   with no perf object carry no collective: they are skipped, not refused.
4. ``coll_perf`` → ``kind='coll'``, ``coll_sn`` from ``coll_sn``; ``p2p_perf`` →
   ``kind='p2p'``, ``coll_sn`` from ``p2p_sn`` and ``peer`` from ``p2p_peer``. The cross-rank
   join key is ``(comm_id, coll_sn)``; ``origin`` is ``'inspector'``.
5. ``exec_us`` is the Inspector's ``*_exec_time_us`` unchanged: the longest channel's GPU kernel
   time, so it **includes waiting for late ranks**.
6. Verbose ``event_trace_ts``: ``start_us``/``stop_us`` from ``coll_start_ts``/``coll_stop_ts``
   (or ``p2p_*``), and ``kernel_events`` keeps the per-channel list as JSON text.

Prometheus textfile mapping (the choice made here):

7. One row per label set (metric name aside): the exec-time and bandwidth gauges that share
   labels are merged into that row. ``origin='inspector-prom'``.
8. When the series carries ``comm_id`` and ``coll_sn`` labels (the Inspector's own textfile),
   the row is that exact collective and joins with JSONL rows on ``(comm_id, coll_sn)``.
9. Without ``coll_sn`` the series is an aggregate of one (communicator, op, size, algo/proto):
   ``coll_sn = -1`` and ``comm_id`` is a series id ``prom:<comm>|<op>|<size>|<algo_proto>``
   so distinct series never collide; ``comm_name`` keeps the communicator's name and
   ``dump_ts_us`` the snapshot time. The store keeps the first snapshot of each such series
   (a limit: the textfile has no sequence number to tell snapshots apart).
10. Each label has its own column: the op from ``collective``, or for P2P series
    ``p2p_operation`` (``Send``/``Recv``; older layouts ``p2p``/``op``); ``algo_proto`` →
    ``algo_proto``; ``message_size`` → ``msg_bytes`` and ``msg_bytes_max``: exact sizes
    (``"1.00MB"``) give both the same value, the Inspector's buckets (``"8-9MB"``) keep their
    range (8 MiB, 9 MiB). Units are read as binary multiples (K = 1024).
11. A P2P series is recognised by its metric name (``nccl_p2p_*``) → ``kind='p2p'``.
12. The snapshot time (``dump_ts_us``) is the ``ioe ingest --ts`` time when one is given, else
    the file's modification time.

Known limits: this parser trusts ``n_ranks``/``nnodes`` as written; it does not check
``*_busbw_gbs`` against the algorithm factor (nccl-tests rows are checked in
:mod:`collector.formats.nccl_tests`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from collector.errors import ParseError, Problem
from collector.files import LineChunks, read_capped
from collector.formats import FileFormat, IngestContext, Parsed, gather_parts
from collector.records import frame

TABLE = "collective_records"
ORIGIN = "inspector"
PROM_ORIGIN = "inspector-prom"

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_PERF_KEYS = (("coll_perf", "coll", "coll"), ("p2p_perf", "p2p", "p2p"))


# -- JSONL -----------------------------------------------------------------------------------
def parse_jsonl(text: str, source: str = "", first_line: int = 1) -> Parsed:
    """Parse Inspector JSONL ``text``; line numbers in problems start at ``first_line``.

    Input: ``'{"header":…,"metadata":…,"coll_perf":…}\\n…'``; output: ``Parsed`` with one
    ``collective_records`` frame (one row per collective or P2P record) and a Problem per refused
    line (docstring rules 1–3).
    """
    rows: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for offset, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        location = f"{source}:{first_line + offset}" if source else f"line {first_line + offset}"
        try:
            row = parse_record(line)
        except ParseError as exc:
            problems.append(Problem(location, str(exc)))
            continue
        if row is not None:
            rows.append(row)
    parsed = Parsed(problems=problems)
    if rows:
        parsed.add(TABLE, frame(TABLE, rows))
    return parsed


def parse_record(line: str, location: str = "") -> dict[str, Any] | None:
    """One JSONL line → one row dict, or ``None`` for a line that holds no collective (rule 3)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not JSON ({exc.msg})", location=location, snippet=line) from None
    if not isinstance(obj, dict):
        raise ParseError("not a JSON object", location=location, snippet=line)
    header = _section(obj, "header", line, location, required=True)
    meta = _section(obj, "metadata", line, location, required=False)
    for key, prefix, kind in _PERF_KEYS:
        if key in obj:
            perf = _section(obj, key, line, location, required=True)
            row = _identity(header, meta, line, location)
            row.update(_perf(perf, prefix, kind, line, location))
            return row
    return None


def _section(obj: dict[str, Any], key: str, line: str, loc: str, *, required: bool) -> dict[str, Any]:
    value = obj.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ParseError(f"{key!r} must be a JSON object", location=loc, snippet=line)
    return value


def _identity(header: dict[str, Any], meta: dict[str, Any], line: str, loc: str) -> dict[str, Any]:
    comm_id = header.get("id")
    if not isinstance(comm_id, str) or not comm_id:
        raise ParseError("header.id (communicator hash) missing or not a string", location=loc, snippet=line)
    return {
        "origin": ORIGIN,
        "comm_id": comm_id,
        "rank": _int(header, "rank", "header.", line, loc, required=True, top=INT32_MAX),
        "comm_name": _str(header, "comm_name", "header.", line, loc),
        "n_ranks": _int(header, "n_ranks", "header.", line, loc, top=INT32_MAX),
        "nnodes": _int(header, "nnodes", "header.", line, loc, top=INT32_MAX),
        "host": _str(meta, "hostname", "metadata.", line, loc),
        "pid": _int(meta, "pid", "metadata.", line, loc),
        "dump_ts_us": _num(meta, "dump_timestamp_us", "metadata.", line, loc),
    }


def _perf(perf: dict[str, Any], p: str, kind: str, line: str, loc: str) -> dict[str, Any]:
    where = f"{p}_perf."
    row: dict[str, Any] = {
        "kind": kind,
        "op": _str(perf, p, where, line, loc, required=True),
        "coll_sn": _int(perf, f"{p}_sn", where, line, loc, required=True),
        "msg_bytes": _int(perf, f"{p}_msg_size_bytes", where, line, loc),
        "exec_us": _num(perf, f"{p}_exec_time_us", where, line, loc, low=0.0),
        "timing_source": _str(perf, f"{p}_timing_source", where, line, loc),
        "algbw_gbs": _num(perf, f"{p}_algobw_gbs", where, line, loc, low=0.0),
        "busbw_gbs": _num(perf, f"{p}_busbw_gbs", where, line, loc, low=0.0),
        "peer": _int(perf, "p2p_peer", where, line, loc, top=INT32_MAX) if kind == "p2p" else None,
    }
    trace = perf.get("event_trace_ts")
    if trace is not None:
        if not isinstance(trace, dict):
            raise ParseError(f"{where}event_trace_ts must be an object", location=loc, snippet=line)
        row["start_us"] = _num(trace, f"{p}_start_ts", where + "event_trace_ts.", line, loc)
        row["stop_us"] = _num(trace, f"{p}_stop_ts", where + "event_trace_ts.", line, loc)
        events = trace.get("kernel_events")
        if events is not None and not isinstance(events, list):
            raise ParseError(f"{where}event_trace_ts.kernel_events: not a list", location=loc, snippet=line)
        row["kernel_events"] = json.dumps(events, separators=(",", ":")) if events is not None else None
    return row


def _json(value: Any) -> str:
    return json.dumps(value)[:120] if value is not None else "missing"


def _int(
    d: dict[str, Any],
    key: str,
    where: str,
    line: str,
    loc: str,
    *,
    required: bool = False,
    top: int = INT64_MAX,
) -> int | None:
    """Rule 2: an integer in ``0..top`` (the store's INTEGER or BIGINT), else a ParseError."""
    value = d.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParseError(f"{where}{key} must be an integer", location=loc, snippet=_json(value))
    if not 0 <= value <= top:
        raise ParseError(f"{where}{key} out of range 0..{top}", location=loc, snippet=_json(value))
    return value


def _num(
    d: dict[str, Any], key: str, where: str, line: str, loc: str, *, low: float = -math.inf
) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParseError(f"{where}{key} must be a finite number", location=loc, snippet=_json(value))
    if value < low:
        raise ParseError(f"{where}{key} must not be negative", location=loc, snippet=_json(value))
    return float(value)


def _str(
    d: dict[str, Any], key: str, where: str, line: str, loc: str, *, required: bool = False
) -> str | None:
    value = d.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ParseError(f"{where}{key} must be a string", location=loc, snippet=_json(value))
    return value


# -- Prometheus textfile -------------------------------------------------------------------
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')

# metric name -> (kind, row column)
PROM_METRICS: dict[str, tuple[str, str]] = {
    "nccl_collective_exec_time_microseconds": ("coll", "exec_us"),
    "nccl_collective_bus_bandwidth_gbs": ("coll", "busbw_gbs"),
    "nccl_collective_algorithm_bandwidth_gbs": ("coll", "algbw_gbs"),
    "nccl_bus_bandwidth_gbs": ("coll", "busbw_gbs"),
    "nccl_algorithm_bandwidth_gbs": ("coll", "algbw_gbs"),
    "nccl_p2p_exec_time_microseconds": ("p2p", "exec_us"),
    "nccl_p2p_bus_bandwidth_gbs": ("p2p", "busbw_gbs"),
    "nccl_p2p_algorithm_bandwidth_gbs": ("p2p", "algbw_gbs"),
}
# labels that say which series a sample belongs to but are not the series' identity
_VOLATILE_LABELS = frozenset({"timestamp"})


def parse_prom(text: str, source: str = "", snapshot_us: float | None = None) -> Parsed:
    """Parse an Inspector Prometheus textfile into ``collective_records`` (docstring rules 7–9).

    Comment lines and metrics not in :data:`PROM_METRICS` are ignored; a malformed sample line
    or a non-numeric value is a Problem at ``<source>:<line>``.
    """
    series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    problems: list[Problem] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        location = f"{source}:{n}" if source else f"line {n}"
        try:
            name, labels, value = _prom_sample(line)
        except ParseError as exc:
            problems.append(Problem(location, str(exc)))
            continue
        if name not in PROM_METRICS:
            continue
        kind, column = PROM_METRICS[name]
        ident = tuple(sorted((k, v) for k, v in labels.items() if k not in _VOLATILE_LABELS))
        row = series.setdefault((kind, ident), _prom_row(kind, labels, snapshot_us))
        row[column] = value
    parsed = Parsed(problems=problems)
    if series:
        parsed.add(TABLE, frame(TABLE, list(series.values())))
    return parsed


def _prom_sample(line: str, location: str = "") -> tuple[str, dict[str, str], float]:
    m = _SAMPLE.match(line.strip())
    if m is None:
        raise ParseError("not a Prometheus sample line", location=location, snippet=line)
    labels: dict[str, str] = {}
    raw = m.group("labels") or ""
    pos = 0
    while pos < len(raw):
        lm = _LABEL.match(raw, pos)
        if lm is None:
            raise ParseError("malformed label set", location=location, snippet=line)
        labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\\\", "\\")
        pos = lm.end()
    try:
        value = float(m.group("value"))
    except ValueError:
        raise ParseError("sample value is not a number", location=location, snippet=line) from None
    return m.group("name"), labels, value


def _prom_row(kind: str, labels: dict[str, str], snapshot_us: float | None) -> dict[str, Any]:
    """Rules 7-11: the row a textfile series stands for, each label in its own column."""
    op = (
        labels.get("collective") or labels.get("p2p_operation") or labels.get("p2p") or labels.get("op") or ""
    )
    comm_name = labels.get("comm_name") or ""
    sn = _label_int(labels, "coll_sn") if kind == "coll" else _label_int(labels, "p2p_sn")
    if sn is None:
        sn = _label_int(labels, "coll_sn")
    comm_id = labels.get("comm_id", "")
    size_text = labels.get("message_size", "")
    low, high = message_size_bytes(size_text)
    if sn is None or not comm_id:
        algo = labels.get("algo_proto", "")
        comm_id = f"prom:{comm_id or comm_name}|{op}|{size_text}|{algo}"
        sn = -1
    return {
        "origin": PROM_ORIGIN,
        "comm_id": comm_id,
        "coll_sn": sn,
        "rank": rank if (rank := _label_int(labels, "rank")) is not None else -1,
        "kind": kind,
        "comm_name": comm_name or None,
        "n_ranks": _label_int(labels, "nranks"),
        "nnodes": _label_int(labels, "n_nodes") or _label_int(labels, "nnodes"),
        "host": labels.get("hostname") or labels.get("node") or None,
        "op": op or None,
        "peer": _label_int(labels, "peer"),
        "msg_bytes": low,
        "msg_bytes_max": high,
        "algo_proto": labels.get("algo_proto") or None,
        "timing_source": labels.get("timing_source") or None,
        "dump_ts_us": snapshot_us,
    }


_UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9.]+)(?:\s*-\s*([0-9.]+))?\s*([KMGT]?B)?\s*$", re.IGNORECASE)


def message_size_bytes(text: str) -> tuple[int | None, int | None]:
    """Rule 10: ``"1.00MB"`` → (1 MiB, 1 MiB); a bucket ``"4-5GB"`` → (4 GiB, 5 GiB);
    anything else → (None, None). Units are binary multiples (K = 1024)."""
    m = _SIZE.match(text)
    if m is None:
        return None, None
    unit = _UNITS[(m.group(3) or "").upper()]
    low = float(m.group(1)) * unit
    high = float(m.group(2)) * unit if m.group(2) else low
    return round(low), round(high)


def _label_int(labels: dict[str, str], key: str) -> int | None:
    """The label as an integer the store's INTEGER holds (its BIGINT for ``*_sn``), else None."""
    try:
        value = int(labels[key])
    except (KeyError, ValueError):
        return None
    top = INT64_MAX if key.endswith("_sn") else INT32_MAX
    return value if -top - 1 <= value <= top else None


# -- file formats ---------------------------------------------------------------------------
def _first_line(head: bytes) -> bytes:
    for line in head.splitlines():
        if line.strip():
            return line.strip()
    return b""


def sniff_jsonl(name: str, head: bytes) -> bool:
    """An Inspector dump: ``*.log``/``*.jsonl`` whose first line is an object with ``header``."""
    first = _first_line(head)
    return (
        name.endswith((".log", ".jsonl", ".log.gz", ".jsonl.gz"))
        and first.startswith(b"{")
        and b'"header"' in first
        and any(k in first for k in (b'"coll_perf"', b'"p2p_perf"', b'"dump_stats"', b'"metadata"'))
    )


def sniff_prom(name: str, head: bytes) -> bool:
    """An Inspector textfile: names one of :data:`PROM_METRICS` at the start of a line."""
    return any(re.search(rb"(?m)^" + m.encode() + rb"[{\s]", head) for m in PROM_METRICS)


JSONL_CHUNK_BYTES = 2 << 20  # ~6,000 records: each becomes a dict, so chunks stay small
MAX_PROM_BYTES = 256 << 20  # a textfile is one snapshot, read whole; past this it is refused


def _read_text(path: Path) -> str:
    return read_capped(path, MAX_PROM_BYTES).decode("utf-8", "replace")


def stream_jsonl(path: Path, ctx: IngestContext) -> Iterator[Parsed]:
    """A dump of any size, a chunk of whole lines at a time (gzip streamed and capped, a cut
    last line refused: :mod:`collector.files`)."""
    chunks = LineChunks(path, chunk_bytes=JSONL_CHUNK_BYTES)
    for first, data in chunks:
        parsed = parse_jsonl(data.decode("utf-8", "replace"), str(path), first_line=first)
        parsed.lines = data.count(b"\n")
        yield parsed
    if chunks.problems:
        yield Parsed(problems=chunks.problems)


def load_jsonl(path: Path, ctx: IngestContext) -> Parsed:
    return gather_parts(stream_jsonl(path, ctx))


def load_prom(path: Path, ctx: IngestContext) -> Parsed:
    """Rule 12: the snapshot time is ``ioe ingest --ts`` when given, else the file's mtime."""
    snapshot_us = ctx.ts_ns / 1000 if ctx.ts_given else path.stat().st_mtime_ns / 1000
    return parse_prom(_read_text(path), str(path), snapshot_us=snapshot_us)


def explain_jsonl(name: str, head: bytes) -> tuple[float, str] | None:
    """How close a refused head came to an Inspector dump."""
    first = _first_line(head)
    if not (first.startswith(b"{") and b'"header"' in first):
        return None
    if not name.endswith((".log", ".jsonl", ".log.gz", ".jsonl.gz")):
        return 0.7, "an Inspector-like JSON line, but the file name does not end in .log or .jsonl"
    return 0.6, "a JSON line with a header, but no coll_perf, p2p_perf, dump_stats or metadata"


FILE_FORMATS = [
    FileFormat(
        "nccl-inspector-jsonl",
        sniff_jsonl,
        load_jsonl,
        priority=40,
        stream=stream_jsonl,
        explain=explain_jsonl,
    ),
    FileFormat("nccl-inspector-prom", sniff_prom, load_prom, priority=40),
]

__all__ = ["FILE_FORMATS", "message_size_bytes", "parse_jsonl", "parse_prom", "parse_record"]
