"""PyTorch / vLLM profiler traces (Kineto Chrome JSON) → ``kernel_events`` + ``collective_records``.

One file is one rank (REFERENCE §4). The rank is, in order: the ``distributedInfo.rank`` of the
trace; else the ``tp`` of a vLLM ``dp{d}_pp{p}_tp{t}`` file name when ``d == p == 0``; else
``d*1_000_000 + p*1_000 + t`` (documented, unique); else the ``rank-N`` / ``rank_N`` of the name;
else 0. The trace set is the name of the file's folder; collectives get ``origin='kineto:<set>'``.

Preprocessing follows Holistic Trace Analysis 0.5.0 exactly, so that analyses over the store
equal HTA's numbers to the microsecond:

1. Events without ``dur`` or ``cat``, and events with ``cat == "Trace"``, are dropped.
2. Timestamps are rounded inward: ``ts = ceil(ts)``, ``end = floor(ts + dur)``, ``dur = end - ts``
   (identity for integer µs traces; ns-resolution float traces are made non-overlapping).
3. ``stream`` is ``int(args.stream)`` (−1 when absent or not a number); ``correlation`` is
   ``args.correlation`` (−1 when absent).
4. HTA's *GPU kernel filter*: ``stream >= 0 and correlation >= 0``, or the name is
   ``Event Sync``/``Context Sync``. Every other event is a CPU event for the step filter.
5. Step filter (only when the trace names ≥ 2 distinct ``ProfilerStep`` events): with
   ``S`` = the latest start of a CPU ``ProfilerStep*`` and ``E`` = the latest end, CPU events are
   kept when ``ts < S`` (default) or ``ts <= E`` (include last step); a GPU-filter event is kept
   when a kept CPU event has its correlation. ``kept`` / ``kept_with_last`` record both answers.
6. ``kernel_events`` holds every surviving candidate with ``stream != -1`` (what HTA's breakdowns
   read), with ``kernel_type`` by HTA's rules: communication ``^nccl.*|.*ncclKernel.*|^hip|^hccl``,
   memory ``^Memcpy|^Memset|^dma``, else computation unless the name matches
   ``^nccl.*Kernel``, contains ``Memcpy`` / ``Sync`` or starts ``Memset`` (then ``OTHER``).

Collectives: every communication kernel (``ncclKernel_*`` and ``ncclDevKernel_*``) becomes one
``collective_records`` row. Its arguments (``Collective name``, ``In/Out msg nelems``,
``Group size``, ``dtype``, ``Process Group Name/Description/Ranks``, ``Seq``) come from the
kernel's own args when present, else from the innermost enclosing ``record_param_comms`` /
``nccl:*`` CPU op on the thread of the kernel's launch (joined by correlation id). ``comm_id`` is
the process group name; ``coll_sn`` is ``Seq``, or, without it, the kernel's ordinal within its
communicator on this rank. Without any args the op comes from the kernel name.

7. A collective keeps the trace's own times, not rule 2's rounded ones: ``start_us``,
   ``stop_us`` and ``exec_us`` are the float µs the trace holds (ns resolution), and algbw/busbw
   are computed from that duration: a 21.95 µs all-gather rounded inward to 21 µs would
   overstate its bandwidth by 4.5 %. ``kernel_events`` stay rounded (HTA parity).

Decoding: ``msgspec`` with typed dicts keeps only the keys above (a document it refuses, e.g. one
with a non-object event, is decoded in full with ``orjson``, stdlib ``json`` as the last fallback);
the parsed result is the same either way.

Known limits: the whole document is decoded at once, so memory is a few times the JSON size;
the ≥ 2-step rule is judged per file, not over the whole set.
"""

from __future__ import annotations

import bisect
import gc
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from collector.errors import ParseError, Problem
from collector.files import read_capped
from collector.formats import FileFormat, IngestContext, Parsed
from collector.records import frame

MAX_TRACE_BYTES = 4 << 30  # a trace is one JSON document, read whole; past this it is refused

try:  # orjson is ~5x faster than the stdlib decoder; both give the same Python objects.
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

    _DECODE_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover - depends on the environment
    import json

    def _loads(data: bytes) -> Any:
        return json.loads(data)

    _DECODE_ERRORS = (ValueError,)

# The keys the parser reads. msgspec decodes only these (typed dicts skip every other key, such as
# the large ``Input Dims`` of CPU ops), ~2.5x faster than a full decode; a document it refuses
# (a non-object event or args, no traceEvents) is decoded in full by ``_loads`` instead.
_ARG_KEYS = (
    "stream", "correlation", "Collective name", "Process Group Name", "Process Group Description",
    "Seq", "Group size", "dtype", "In msg nelems", "Out msg nelems",
)  # fmt: skip
_EventArgs = TypedDict("_EventArgs", dict.fromkeys(_ARG_KEYS, Any), total=False)  # type: ignore[misc]


class _Event(TypedDict, total=False):
    name: Any
    cat: Any
    ts: Any
    dur: Any
    pid: Any
    tid: Any
    args: _EventArgs


class _Document(TypedDict, total=False):
    traceEvents: list[_Event]
    distributedInfo: Any


try:
    import msgspec

    _TYPED: Any = msgspec.json.Decoder(_Document)
    _TYPED_REFUSED: tuple[type[Exception], ...] = (msgspec.DecodeError,)
except ImportError:  # pragma: no cover - depends on the environment
    _TYPED, _TYPED_REFUSED = None, ()

COMM_KERNEL_RE = re.compile(r"^nccl.*|.*ncclKernel.*|^hip|^hccl")
MEMORY_KERNEL_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})
_VLLM_RE = re.compile(r"dp(\d+)_pp(\d+)_tp(\d+)")
_RANK_RE = re.compile(r"rank[-_]?(\d+)")
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_KERNEL_OP_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")

# PyTorch ``dtype`` arg → bytes per element.
DTYPE_BYTES = {
    "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Short": 2,
    "Byte": 1, "Char": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
}  # fmt: skip

# PyTorch ``Collective name`` / kernel name → the op names NCCL Inspector uses.
_OPS = {
    "allreduce": "AllReduce", "all_reduce": "AllReduce", "allgather": "AllGather",
    "_allgather_base": "AllGather", "all_gather": "AllGather", "allgather_into_tensor_coalesced":
    "AllGather", "reduce_scatter": "ReduceScatter", "_reduce_scatter_base": "ReduceScatter",
    "reduce_scatter_tensor_coalesced": "ReduceScatter", "reducescatter": "ReduceScatter",
    "broadcast": "Broadcast", "reduce": "Reduce", "all_to_all": "AllToAll", "alltoall": "AllToAll",
    "all_to_allv": "AllToAll", "alltoall_base": "AllToAll", "send": "Send", "recv": "Recv",
    "sendrecv": "SendRecv", "barrier": "Barrier", "gather": "Gather", "scatter": "Scatter",
}  # fmt: skip
P2P_OPS = frozenset({"Send", "Recv", "SendRecv"})
# busbw = algbw × factor (REFERENCE §3, nccl-tests).
BUS_FACTOR = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
              "ReduceScatter": lambda n: (n - 1) / n, "AllToAll": lambda n: (n - 1) / n}  # fmt: skip


def kernel_type(name: str) -> str:
    """HTA's kernel class of ``name`` (rule 6 of the module notes)."""
    if COMM_KERNEL_RE.match(name):
        return "COMMUNICATION"
    if MEMORY_KERNEL_RE.match(name):
        return "MEMORY"
    if NOT_COMPUTE_RE.match(name):
        return "OTHER"
    return "COMPUTATION"


def canonical_op(raw: str) -> str:
    """``allreduce`` / ``AllReduce`` → ``AllReduce``; unknown names are kept as given."""
    return _OPS.get(raw.lower(), raw)


@dataclass
class _Scan:
    """What one pass over ``traceEvents`` collects (all times rounded per rule 2)."""

    candidates: list[tuple[Any, ...]] = field(default_factory=list)  # stream != -1
    cpu_corr_ts: dict[int, int] = field(default_factory=dict)  # correlation -> earliest CPU ts
    launches: dict[int, tuple[Any, Any, int]] = field(default_factory=dict)  # corr -> pid, tid, ts
    comm_ops: dict[tuple[Any, Any], list[tuple[int, int, dict[str, Any]]]] = field(default_factory=dict)
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (ts, end, step number)
    step_names: set[str] = field(default_factory=set)
    not_objects: int = 0  # traceEvents entries that are not JSON objects (skipped)


def _int_or(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _int_of(value: Any) -> int:
    """``int(value)``, −1 when it is not a number (ints pass without a call)."""
    return value if type(value) is int else _int_or(value)


def scan_events(events: Iterable[Any]) -> _Scan:
    """One pass: round, classify (rules 1–4) and index what the step filter and collectives need."""
    scan = _Scan()
    add = scan.candidates.append
    for e in events:
        if not isinstance(e, dict):
            scan.not_objects += 1
            continue
        dur, cat, ts = e.get("dur"), e.get("cat"), e.get("ts")
        if dur is None or cat is None or cat == "Trace" or ts is None:
            continue
        try:
            raw = (float(ts), float(dur))  # rule 7: collectives keep the unrounded times
            end = math.floor(ts + dur)
            ts = math.ceil(ts)
        except (TypeError, ValueError, OverflowError):
            continue
        args = e.get("args")
        if not isinstance(args, dict):
            args = {}
        stream = _int_of(args.get("stream", -1))
        corr = _int_of(args.get("correlation", -1))
        name = e.get("name", "")
        if type(name) is not str:
            name = str(name)
        if (stream >= 0 and corr >= 0) or name in SYNC_NAMES:  # rule 4: a GPU event
            if stream != -1:
                add((True, ts, end - ts, name, str(cat), stream, corr, args, raw))
            continue
        if corr >= 0 or "ProfilerStep" in name or "Collective name" in args:
            _index_cpu_event(scan, e, args, name, ts, end, corr)
        if stream != -1:
            add((False, ts, end - ts, name, str(cat), stream, corr, args, raw))
    return scan


def _index_cpu_event(
    scan: _Scan, e: dict[str, Any], args: dict[str, Any], name: str, ts: int, end: int, corr: int
) -> None:
    if corr >= 0:
        prev = scan.cpu_corr_ts.get(corr)
        if prev is None or ts < prev:
            scan.cpu_corr_ts[corr] = ts
        scan.launches.setdefault(corr, (e.get("pid"), e.get("tid"), ts))
    if "ProfilerStep" in name:
        scan.step_names.add(name)
        m = _STEP_RE.match(name)
        scan.steps.append((ts, end, int(m.group(1)) if m else -1))
    if "Collective name" in args:
        scan.comm_ops.setdefault((e.get("pid"), e.get("tid")), []).append((ts, end, args))


def _step_of(steps: list[tuple[int, int, int]], starts: list[int], ts: int) -> int:
    """HTA's iteration of a CPU time: the ProfilerStep ``s`` with ``s.ts <= ts < s.end``, else −1."""
    i = bisect.bisect_right(starts, ts) - 1
    while i >= 0:
        s_ts, s_end, number = steps[i]
        if s_ts <= ts < s_end:
            return number
        i -= 1
        if i >= 0 and steps[i][1] <= ts:
            break
    return -1


def kernel_rows(scan: _Scan, trace_set: str, rank: int) -> dict[str, list[Any]]:
    """``kernel_events`` columns with the step filter (rule 5) applied as two flags."""
    cands = scan.candidates
    n = len(cands)
    steps = sorted(scan.steps)
    starts = [s[0] for s in steps]
    last_number = max((s[2] for s in steps), default=-1)
    corr_ts = scan.cpu_corr_ts
    refs = [corr_ts.get(c[6]) if c[0] else c[1] for c in cands]  # the launching CPU time
    if len(scan.step_names) >= 2:
        last_start = max((s[0] for s in scan.steps), default=0)
        last_end = max((s[1] for s in scan.steps), default=0)
        kept = [r is not None and r < last_start for r in refs]
        kept_last = [r is not None and r <= last_end for r in refs]
    else:
        kept = kept_last = [True] * n
    iteration = [_step_of(steps, starts, r) if r is not None else -1 for r in refs]
    types: dict[str, str] = {}
    ktype = [types.get(c[3]) or types.setdefault(c[3], kernel_type(c[3])) for c in cands]
    return {
        "trace_set": [trace_set] * n, "rank": [rank] * n, "stream": [c[5] for c in cands],
        "correlation": [c[6] for c in cands], "ts_us": [c[1] for c in cands], "dur_us": [c[2] for c in cands],
        "name": [c[3] for c in cands], "cat": [c[4] for c in cands],
        "is_comm": [t == "COMMUNICATION" for t in ktype], "kernel_type": ktype, "iteration": iteration,
        "last_step": [i >= 0 and i == last_number for i in iteration],
        "kept": kept, "kept_with_last": kept_last,
    }  # fmt: skip


def _comm_args(scan: _Scan, corr: int, kernel_args: dict[str, Any]) -> dict[str, Any]:
    """The collective's args: the kernel's own, else the innermost enclosing comm CPU op's."""
    if "Collective name" in kernel_args:
        return kernel_args
    launch = scan.launches.get(corr)
    if launch is None:
        return {}
    pid, tid, ts = launch
    ops = scan.comm_ops.get((pid, tid))
    if not ops:
        return {}
    i = bisect.bisect_right([o[0] for o in ops], ts) - 1
    for j in range(i, max(i - 16, -1), -1):
        if ops[j][0] <= ts <= ops[j][1]:
            return ops[j][2]
    return {}


def collective_rows(scan: _Scan, trace_set: str, rank: int, host: str) -> list[dict[str, Any]]:
    """One ``collective_records`` row per communication kernel, in kernel start order."""
    rows: list[dict[str, Any]] = []
    ordinal: dict[str, int] = {}
    comm = sorted((c for c in scan.candidates if c[0] and COMM_KERNEL_RE.match(c[3])), key=lambda c: c[1])
    for _gpu, _ts, _dur, name, _cat, _stream, corr, kargs, (ts, dur) in comm:
        args = _comm_args(scan, corr, kargs)
        raw_op = str(args.get("Collective name", ""))
        if not raw_op:
            m = _KERNEL_OP_RE.match(name)
            raw_op = m.group(1) if m else ""
        op = canonical_op(raw_op)
        comm_id = str(args.get("Process Group Name", ""))
        seq = _int_or(args.get("Seq"), -1)
        if seq < 0:
            seq = ordinal.get(comm_id, 0)
        ordinal[comm_id] = seq + 1
        launch = scan.launches.get(corr)
        rows.append(_collective_row(trace_set, rank, host, op, comm_id, seq, ts, dur, args, launch))
    return rows


def _collective_row(
    trace_set: str, rank: int, host: str, op: str, comm_id: str, seq: int, ts: float, dur: float,
    args: dict[str, Any], launch: tuple[Any, Any, int] | None,
) -> dict[str, Any]:  # fmt: skip
    n = _int_or(args.get("Group size"), -1)
    elem = DTYPE_BYTES.get(str(args.get("dtype", "")))
    nelems = max(_int_or(args.get("In msg nelems"), -1), _int_or(args.get("Out msg nelems"), -1))
    msg_bytes = nelems * elem if elem and nelems >= 0 else None
    algbw = msg_bytes / dur / 1e3 if msg_bytes is not None and dur > 0 else None  # bytes/µs → GB/s
    factor = BUS_FACTOR.get(op, lambda _n: 1.0)(n) if n > 0 else None
    return {
        "origin": f"kineto:{trace_set}", "comm_id": comm_id, "coll_sn": seq, "rank": rank,
        "kind": "p2p" if op in P2P_OPS else "coll",
        "comm_name": str(args.get("Process Group Description", "")) or None,
        "n_ranks": n if n > 0 else None, "nnodes": None, "host": host or None,
        "pid": _int_or(launch[0], -1) if launch else None, "op": op or None, "peer": None,
        "msg_bytes": msg_bytes, "exec_us": dur, "algbw_gbs": algbw,
        "busbw_gbs": algbw * factor if algbw is not None and factor is not None else None,
        "timing_source": "kineto_kernel", "start_us": ts, "stop_us": ts + dur,
        "dump_ts_us": None, "kernel_events": None,
    }  # fmt: skip


def trace_rank(file_name: str, doc: dict[str, Any]) -> int:
    """The rank of one trace file (module notes, first paragraph)."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and _int_or(info.get("rank"), -1) >= 0:
        return _int_or(info.get("rank"))
    m = _VLLM_RE.search(file_name)
    if m:
        d, p, t = (int(x) for x in m.groups())
        return t if d == 0 and p == 0 else d * 1_000_000 + p * 1_000 + t
    m = _RANK_RE.search(file_name)
    return int(m.group(1)) if m else 0


def parse_document(doc: Any, trace_set: str, file_name: str = "", host: str = "") -> Parsed:
    """A decoded Kineto document → frames for ``kernel_events`` and ``collective_records``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ParseError("not a Kineto trace: no traceEvents list", source=file_name, snippet=str(doc)[:80])
    rank = trace_rank(file_name, doc)
    scan = scan_events(doc["traceEvents"])
    parsed = Parsed()
    parsed.add("kernel_events", frame("kernel_events", kernel_rows(scan, trace_set, rank)))
    coll = collective_rows(scan, trace_set, rank, host)
    if coll:
        parsed.add("collective_records", frame("collective_records", _columns(coll)))
    if scan.not_objects:
        parsed.problems.append(
            Problem(file_name, f"{scan.not_objects} traceEvents entries are not objects; skipped")
        )
    return parsed


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {k: [r[k] for r in rows] for k in rows[0]}


def read_trace(path: Path) -> Any:
    """Decode one trace file, gzipped or not; a broken file raises :class:`ParseError`."""
    data = read_capped(path, MAX_TRACE_BYTES)  # a gzip is streamed and capped (collector.files)
    if _TYPED is not None:
        try:
            doc = _TYPED.decode(data)
            if "traceEvents" in doc:
                return doc
        except _TYPED_REFUSED:
            pass
    try:
        return _loads(data)
    except _DECODE_ERRORS as exc:
        raise ParseError(f"invalid JSON ({exc})", source=str(path), snippet=data[:80]) from exc


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding builds ~10 objects per event, none cyclic: collecting in between only costs time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load(path: Path, ctx: IngestContext) -> Parsed:
    """``FileFormat.load``: the trace set is the folder name."""
    with _gc_paused():
        return parse_document(read_trace(path), path.parent.name, path.name, ctx.host)


def sniff(name: str, head: bytes) -> bool:
    """A Chrome trace that Kineto wrote: ``traceEvents`` plus a Kineto-only marker."""
    if b'"traceEvents"' not in head:
        return False
    return any(m in head for m in (b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"'))


def explain(name: str, head: bytes) -> tuple[float, str] | None:
    """How close a refused head came to a Kineto trace."""
    if b'"traceEvents"' in head:
        return 0.8, (
            "a Chrome trace, but without Kineto's markers (schemaVersion, deviceProperties or "
            "distributedInfo): not written by the PyTorch profiler"
        )
    if head.lstrip()[:1] in (b"{", b"["):
        return 0.2, "JSON without traceEvents: not a Kineto trace"
    return None


FILE_FORMAT = FileFormat(name="kineto", sniff=sniff, load=load, priority=50, explain=explain)
