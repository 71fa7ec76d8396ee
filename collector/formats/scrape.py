"""One scrape body (dcgm-exporter and/or engine ``/metrics``) -> canonical rows.

``parse_scrape`` is what the HTTP scraper and ``ioe ingest`` call: it parses the exposition
once and hands the samples to :mod:`collector.formats.dcgm` and/or
:mod:`collector.formats.engine`.

Rules:

1. ``kind="dcgm"`` keeps GPU rows only, ``"engine"`` engine rows only, ``"auto"`` both: each
   mapper takes only the names it knows (``DCGM_FI_*``/``DCGM_EXP_*`` vs ``vllm:``,
   ``sglang:``, ``trtllm_``, ``dynamo_``, ``nv_inference_``), so a body holding both is fine.
2. Bytes are decoded as UTF-8 with invalid bytes replaced by U+FFFD; the exposition parser
   then refuses those lines (binary garbage keeps the good lines around it). The size cap is
   checked on the raw bytes, before decoding.
3. A body over the cap raises :class:`~collector.errors.ParseError` (nothing parsed); every
   other refusal is a Problem in the result, named ``<source>: line N``.
4. A captured file is recognized by content (:func:`sniff`): at least one sample of the
   complete lines of its head is a GPU or engine metric, whatever its extension
   (``.prom``, ``.openmetrics``, ``.txt``, gzipped or not), and the sample lines outnumber
   the bad ones. Its rows get ``ctx.ts_ns`` and ``ctx.host``, and
   ``source = "<ctx.source>:[<ctx.host>/]<name>"``, the name being the file's path under the
   folder imported (``node0/metrics.prom``): two files captured at the same instant, or two
   nodes' files of one name, stay distinct series, and the same file imported again gives
   the same series. (A file with many bad lines keeps its good rows; ``ioe ingest`` names
   the share refused.)
5. A scraper passes one :class:`ScrapeCache` per target: label blocks, unchanged HELP/TYPE
   lines and the row identities of series already seen are reused instead of worked out
   again on every scrape (exposition rule 11, dcgm rule 8, engine rule 9). The rows are the
   same with or without it; it is bounded (cleared whole past ``max_series`` series).
6. Replay: when a target's body has the same shape as its last clean scrape (exposition
   rule 12, checked with that scrape's :class:`Skeleton`: the same comment lines, names and
   label blocks in the same order, no timestamps)
   only the values are new, so the rows are rebuilt from the last scrape's identity columns
   and the new values (each row's value = its sample's value × the same scale), without
   parsing or mapping again. A value the mappers would refuse (non-finite, a DCGM blank
   sentinel, a KV usage outside 0..1) sends the scrape down the full path instead, so the
   rows and problems are always the full path's. A scrape is remembered for replay only
   when it had no problem and its replayed rows equal the rows the full path gave.
7. A file is read :data:`CHUNK_BYTES` of whole lines at a time (:mod:`collector.files`: gzip
   streamed and capped, a cut last line refused), so its size is not bounded by the body cap
   of rule 3. Each chunk starts with the ``# TYPE``/``# HELP`` line in force where the last
   one ended (the exposition parser's renames need the family), the dialect is the whole
   file's (``# EOF`` last), and problems name the file's line numbers. A series seen in two
   chunks is not refused as a duplicate (the store keeps the first row of a key).
8. A target whose scrapes have replayed :data:`FORGET_AFTER_REPLAYS` times in a row lets its
   parse memory go (the exposition parser's label blocks and comment lines, the mappers' row
   identities: ~0.35-1 MB a target on the bench's bodies): its replay plan alone rebuilds the
   rows. A body of another shape is then parsed cold, once, and the cache fills again from it;
   a target whose shape keeps changing never gets that far and keeps its cache. The rows are
   the same either way (rule 5).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from operator import mul
from pathlib import Path
from typing import Any, Literal

from collector.batch import Batch
from collector.errors import ParseError, Problem
from collector.files import LineChunks
from collector.formats import SNIFF_BYTES, FileFormat, IngestContext, Parsed
from collector.formats.dcgm import BLANK_MIN, GpuMemo, is_gpu_metric, to_gpu_samples
from collector.formats.engine import EngineMemo, engine_of, to_engine_samples
from collector.formats.exposition import MAX_BODY_CHARS, ParseCache, Skeleton, parse, picker
from collector.records import TABLES

Kind = Literal["dcgm", "engine", "auto"]


Trace = list[tuple[int, float, bool]]  # per row: (sample index, scale, must lie in 0..1)
CHUNK_BYTES = 4 << 20  # a file is parsed this many bytes of whole lines at a time (rule 7)
REPLAY_MAX_BYTES = 4 << 20  # replay_scrape leaves larger bodies to the full path (off the loop)
FORGET_AFTER_REPLAYS = 120  # rule 8: replays in a row after which a target's parse memory goes
VALUE_COLUMN = {"gpu_samples": "value", "engine_samples": "value", "histogram_buckets": "cumulative_count"}


@dataclass(frozen=True)
class _Plan:
    """How to rebuild one table's rows from a body's values (rule 6)."""

    table: str
    ids: dict[str, list[Any]]  # every column but the value and ts_ns, rows in output order
    columns: list[str]
    index: list[int]
    scale: list[float]
    unit_rows: list[int]  # rows whose value must lie in 0..1 (KV usage)
    counter_rows: list[int]  # rows whose value must not be negative (dcgm rule 10, engine rule 10)
    blank_check: bool  # DCGM rows: a raw value ≥ BLANK_MIN is a blank sentinel
    unique: bool  # no two rows share the table's key: replayed batches say so (Batch rule 4)

    @cached_property
    def _pick(self) -> Any:
        return picker(self.index)

    @cached_property
    def _unscaled(self) -> bool:
        return all(s == 1.0 for s in self.scale)

    def raw(self, values: list[float]) -> list[float]:
        """The body's values in row order."""
        return list(self._pick(values))

    def scaled(self, raw: list[float]) -> list[float]:
        return raw if self._unscaled else list(map(mul, raw, self.scale))


@dataclass(frozen=True)
class _Replay:
    key: tuple[str, str, str]  # (kind, host, source)
    skeleton: Skeleton  # the shape a body must have to replay
    plans: dict[str, _Plan]


@dataclass
class ScrapeCache:
    """One target's memory from scrape to scrape (rules 5-6); never shared between targets."""

    max_series: int = 100_000
    parse: ParseCache = field(default_factory=ParseCache)
    gpu: GpuMemo = field(default_factory=dict)
    engine: EngineMemo = field(default_factory=dict)
    replay: _Replay | None = None
    replays: int = 0  # replays in a row since the last full parse (rule 8)

    def replayed(self) -> None:
        """Count one replay; rule 8 at the :data:`FORGET_AFTER_REPLAYS`-th in a row."""
        self.replays += 1
        if self.replays == FORGET_AFTER_REPLAYS:
            self.gpu.clear()
            self.engine.clear()
            self.parse.clear()

    def bounded(self) -> ScrapeCache:
        """Itself, emptied first when it holds more than ``max_series`` series."""
        if len(self.gpu) + len(self.engine) > self.max_series:
            self.gpu.clear()
            self.engine.clear()
            self.parse.clear()
        self.parse.max_labels = self.max_series
        return self


def parse_scrape(
    text: str | bytes,
    *,
    kind: Kind = "auto",
    ts_ns: int,
    host: str = "",
    source: str = "",
    max_bytes: int = MAX_BODY_CHARS,
    cache: ScrapeCache | None = None,
    openmetrics: bool | None = None,
) -> Parsed:
    """Canonical rows of one scrape body (rules 1-3; rule 5 with a ``cache``); ``openmetrics``
    as the exposition parser's (None: told by the body's end)."""
    if kind not in ("dcgm", "engine", "auto"):
        raise ValueError(f"parse_scrape: kind must be dcgm, engine or auto, not {kind!r}")
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise ParseError(f"body of {len(text):,} bytes exceeds the cap of {max_bytes:,}", source=source)
        text = text.decode("utf-8", errors="replace")
    memo = (cache or ScrapeCache()).bounded()
    if cache is not None and len(text) <= max_bytes:
        replayed = _replay_of(text, kind, host, source, memo, ts_ns)
        if replayed is not None:
            return replayed
    return _full(text, kind, ts_ns, host, source, max_bytes, cache, memo, openmetrics)


def replay_scrape(
    body: bytes, *, kind: Kind, ts_ns: int, host: str, source: str, cache: ScrapeCache
) -> Parsed | None:
    """Rule 6 alone: the rows of ``body`` if it replays (the same rows :func:`parse_scrape`
    would give), else None. Cheap enough for an event loop: it gives up at once without a
    remembered scrape, and on bodies over :data:`REPLAY_MAX_BYTES`."""
    if len(body) > REPLAY_MAX_BYTES:
        return None
    return _replay_of(body, kind, host, source, cache, ts_ns)


def _replay_of(
    body: str | bytes, kind: Kind, host: str, source: str, cache: ScrapeCache, ts_ns: int
) -> Parsed | None:
    """The replayed rows of ``body``, or None: the one rule-6 check. Bytes are matched as they
    came, without decoding (exposition rule 12)."""
    replay = cache.replay
    if replay is None or replay.key != (kind, host, source):
        return None
    skeleton = replay.skeleton
    texts = skeleton.byte_values(body) if isinstance(body, bytes) else skeleton.values(body)
    got = None if texts is None else _replayed(replay, texts, ts_ns)
    if got is not None:
        cache.replayed()
    return got


def _full(
    text: str,
    kind: Kind,
    ts_ns: int,
    host: str,
    source: str,
    max_bytes: int,
    cache: ScrapeCache | None,
    memo: ScrapeCache,
    openmetrics: bool | None = None,
) -> Parsed:
    """The full path: parse, map, and (with a cache) remember the scrape for rule 6."""
    exp = parse(
        text, source=source, max_chars=max_bytes, cache=memo.parse if cache else None, openmetrics=openmetrics
    )
    result = Parsed(problems=[_named(p, source) for p in exp.problems])
    traces: dict[str, Trace] = {}
    if kind in ("dcgm", "auto"):
        traces["gpu_samples"] = []
        gpu = to_gpu_samples(
            exp, ts_ns=ts_ns, host=host, source=source, memo=memo.gpu, trace=traces["gpu_samples"]
        )
        result.extend(gpu)
    if kind in ("engine", "auto"):
        result.extend(to_engine_samples(exp, ts_ns=ts_ns, source=source, memo=memo.engine, trace=traces))
    if len(result.problems) > len(exp.problems):
        result.problems[len(exp.problems) :] = _located(text, result.problems[len(exp.problems) :], source)
    learned = Skeleton.learn(text) if cache is not None and not result.problems else None
    memo.replay, memo.replays = None, 0
    if learned is not None:
        memo.replay = _learned(result, traces, (kind, host, source), learned, ts_ns, len(exp.samples))
    return result


def _values(texts: list[str] | list[bytes]) -> list[float] | None:
    try:
        return list(map(float, texts))
    except ValueError:
        return None


def _replayed(replay: _Replay, texts: list[str] | list[bytes], ts_ns: int) -> Parsed | None:
    """Rule 6: the rows of a same-shape body from its values, or None to take the full path."""
    values = _values(texts)
    if values is None:
        return None
    result = Parsed()
    for table, plan in replay.plans.items():
        raw = plan.raw(values)
        if not all(map(math.isfinite, raw)) or (plan.blank_check and max(raw, default=0.0) >= BLANK_MIN):
            return None
        scaled = plan.scaled(raw)
        if any(not 0.0 <= scaled[r] <= 1.0 for r in plan.unit_rows):
            return None
        if min(raw, default=0.0) < 0 and any(raw[r] < 0 for r in plan.counter_rows):
            return None
        new: dict[str, list[Any]] = {"ts_ns": [ts_ns] * len(scaled), VALUE_COLUMN[table]: scaled}
        # the identity lists are shared with the plan, never copied (Batch rule 3)
        data = {name: new[name] if name in new else plan.ids[name] for name in plan.columns}
        result.add(table, Batch(plan.table, data, len(scaled), unique=plan.unique))
    return result


def _learned(
    result: Parsed,
    traces: dict[str, Trace],
    key: tuple[str, str, str],
    learned: tuple[Skeleton, list[str]],
    ts_ns: int,
    n: int,
) -> _Replay | None:
    """Rule 6: a replay plan from a clean full-path scrape, kept only if it reproduces its rows."""
    skeleton, texts = learned
    if len(texts) != n:  # the caller learns only from a scrape without problems
        return None
    plans = {}
    for table, trace in traces.items():
        frame = result.batches.get(table)
        if frame is None or not isinstance(frame, Batch) or frame.height != len(trace):
            if trace or frame is not None:
                return None
            continue
        index, scale, unit = zip(*trace, strict=True) if trace else ((), (), ())
        ids = {c: v for c, v in frame.data.items() if c not in (VALUE_COLUMN[table], "ts_ns")}
        unit_rows = [r for r, flag in enumerate(unit) if flag]
        identity = [ids[k] for k in TABLES[table].key if k != "ts_ns"]  # one ts_ns per scrape
        unique = len(set(zip(*identity, strict=True))) == frame.height
        plans[table] = _Plan(
            table,
            ids,
            frame.columns,
            list(index),
            list(scale),
            unit_rows,
            _counter_rows(table, ids),
            table == "gpu_samples",
            unique,
        )
    replay = _Replay(key, skeleton, plans)
    again = _replayed(replay, texts, ts_ns)
    if again is None or any(not again.batches[t].equals(f) for t, f in result.batches.items() if t in plans):
        return None
    return replay


def _counter_rows(table: str, ids: dict[str, list[Any]]) -> list[int]:
    """Rows of a replay plan that hold a count, which must never be negative."""
    if table == "histogram_buckets":
        return list(range(len(next(iter(ids.values()), []))))
    names = ids.get("metric") if table == "gpu_samples" else ids.get("concept")
    suffixes = ("_total", "_j", "_violation_s") if table == "gpu_samples" else ("_total", "_sum", "_count")
    return [r for r, name in enumerate(names or []) if name.endswith(suffixes)]


def _located(text: str, problems: list[Problem], source: str) -> list[Problem]:
    """A mapper's problem names a series (``DCGM_FI_X{gpu="9"}``): add the line of that sample.

    The first line that starts with the metric name and holds every ``k="v"`` of the named
    label set is taken (found only for the rare refused sample; a hint for a person)."""
    out = []
    for p in problems:
        lineno = 0
        if not p.location.startswith(("line ", "body", "end of")) and p.location not in (
            "",
            "dcgm",
            "engine",
        ):
            lineno = _line_of(text, p.location)
        out.append(_named(Problem(f"line {lineno}: {p.location}", p.message), source) if lineno else p)
    return out


_PAIR = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"')


def _line_of(text: str, series: str) -> int:
    name, _, rest = series.partition("{")
    pairs = _PAIR.findall(rest.removesuffix("…"))[:-1] if rest.endswith("…") else _PAIR.findall(rest)
    start = 0
    while (at := text.find(name, start)) >= 0:
        start = at + len(name)
        end = text.find("\n", at)
        line = text[at : end if end >= 0 else len(text)]
        starts = (at == 0 or text[at - 1] == "\n") and line[len(name) : len(name) + 1] in ("{", " ", "\t")
        if starts and all(pair in line for pair in pairs):
            return text.count("\n", 0, at) + 1
    return 0


def _named(problem: Problem, source: str) -> Problem:
    return Problem(f"{source}: {problem.location}" if source else problem.location, problem.message)


def sniff(name: str, head: bytes) -> bool:
    """Rule 4: the head's complete lines hold a GPU or engine metric and more samples than bad lines."""
    text = head.decode("utf-8", errors="replace")
    if len(head) == SNIFF_BYTES:
        text = text[: text.rfind("\n") + 1]  # drop the cut last line
    if "#Entity" in text:
        return False
    exp = parse(text, openmetrics=False)
    if not exp.samples or len(exp.problems) >= len(exp.samples):
        return False
    return any(is_gpu_metric(s.name) or engine_of(s.name, s.labels) for s in exp.samples)


def explain(name: str, head: bytes) -> tuple[float, str] | None:
    """Why rule 4 refused a head that is exposition-like: bad lines, or no family IOE maps."""
    text = head.decode("utf-8", errors="replace")
    if len(head) == SNIFF_BYTES:
        text = text[: text.rfind("\n") + 1]
    exp = parse(text, openmetrics=False)
    if not exp.samples:
        return None
    if len(exp.problems) > len(exp.samples) // 10:
        first = exp.problems[0]
        return 0.5, (
            f"{len(exp.problems)} line(s) are not Prometheus exposition beside {len(exp.samples)} "
            f"sample(s) (first: {first.location}: {first.message})"
        )
    names = sorted({s.name for s in exp.samples})
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return 0.9, (
        f"Prometheus exposition with {len(exp.samples)} sample(s), but no GPU or engine family IOE "
        f"maps ({shown}): an exporter or engine IOE does not read yet"
    )


def file_source(path: Path, ctx: IngestContext) -> str:
    """Rule 4: ``<ctx.source>:[<host>/]<name>``, the name being the file's path under the
    folder imported (``ctx.name``) or else its file name."""
    name = ctx.name or path.name
    name = f"{ctx.host}/{name}" if ctx.host else name
    return f"{ctx.source}:{name}" if ctx.source else name


_FAMILY_LINE = re.compile(r"(?m)^[ \t]*# (?:TYPE|HELP) .*$")
_LINE_NO = re.compile(r"\bline (\d+)")


def stream(path: Path, ctx: IngestContext) -> Iterator[Parsed]:
    """Rule 7: a captured scrape file of any size, a chunk of whole lines at a time."""
    source = file_source(path, ctx)
    chunks = LineChunks(path, chunk_bytes=CHUNK_BYTES)
    pending: tuple[int, bytes] | None = None
    om: bool | None = None
    context = ""
    for chunk in chunks:
        if pending is not None:
            om = _ends_with_eof(path) if om is None else om
            parsed, context = _chunk(pending, context, om, False, ctx, source)
            yield parsed
        pending = chunk
    if pending is not None:
        yield _chunk(pending, context, om, True, ctx, source)[0]
    if chunks.problems:
        yield Parsed(problems=chunks.problems)


def _chunk(
    chunk: tuple[int, bytes], context: str, om: bool | None, last: bool, ctx: IngestContext, source: str
) -> tuple[Parsed, str]:
    """One chunk's rows; ``context`` (the family line in force) is put before it so that the
    rule-8 renames of the exposition parser hold across chunks; problems get the file's lines."""
    first, data = chunk
    text = data.decode("utf-8", errors="replace")
    body = context + text
    try:
        parsed = parse_scrape(
            body, kind="auto", ts_ns=ctx.ts_ns, host=ctx.host, source=source, openmetrics=om
        )
    except ParseError as exc:  # one line longer than the body cap: that line is lost, not the file
        parsed = Parsed(problems=[Problem(f"{source}: line {first}", str(exc))])
        shift = 0
    else:
        shift = first - 1 - context.count("\n")
    problems = []
    for p in parsed.problems:
        if not last and p.location.endswith("end of body"):
            continue  # an OpenMetrics file's # EOF is in its last chunk
        location = _LINE_NO.sub(lambda m: f"line {int(m.group(1)) + shift}", p.location, count=1)
        problems.append(Problem(location, p.message))
    parsed.problems = problems
    parsed.lines = data.count(b"\n")
    families = _FAMILY_LINE.findall(text)
    return parsed, (families[-1] + "\n") if families else context


def _ends_with_eof(path: Path) -> bool:
    """Rule 2 of the exposition parser for a file read in chunks: its last line is ``# EOF``."""
    last = b""
    for _, data in LineChunks(path):
        lines = [ln for ln in data.splitlines() if ln.strip()]
        last = lines[-1] if lines else last
    return last.strip() == b"# EOF"


def load(path: Path, ctx: IngestContext) -> Parsed:
    """Parse a captured scrape file (rule 4) whole."""
    whole = Parsed()
    for part in stream(path, ctx):
        whole.extend(part)
        whole.lines += part.lines
    return whole


FILE_FORMAT = FileFormat(
    name="prometheus-scrape", sniff=sniff, load=load, priority=50, stream=stream, explain=explain
)
