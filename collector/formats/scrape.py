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
4. A captured file is recognized by content (:func:`sniff`): the complete lines of its head
   parse as exposition (at most one bad line in ten) and at least one sample is a GPU or
   engine metric, whatever its extension
   (``.prom``, ``.openmetrics``, ``.txt``, gzipped or not). Its rows get ``ctx.ts_ns`` and
   ``ctx.host``, and ``source = "<ctx.source>:<file name>"`` so that two files captured at
   the same instant stay distinct series.
5. A scraper passes one :class:`ScrapeCache` per target: label blocks, unchanged HELP/TYPE
   lines and the row identities of series already seen are reused instead of worked out
   again on every scrape (exposition rule 11, dcgm rule 8, engine rule 9). The rows are the
   same with or without it; it is bounded (cleared whole past ``max_series`` series).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from collector.errors import ParseError, Problem
from collector.formats import SNIFF_BYTES, FileFormat, IngestContext, Parsed
from collector.formats.dcgm import GpuMemo, is_gpu_metric, to_gpu_samples
from collector.formats.engine import EngineMemo, engine_of, to_engine_samples
from collector.formats.exposition import MAX_BODY_CHARS, ParseCache, parse

Kind = Literal["dcgm", "engine", "auto"]


@dataclass
class ScrapeCache:
    """One target's memory from scrape to scrape (rule 5); never shared between targets."""

    max_series: int = 100_000
    parse: ParseCache = field(default_factory=ParseCache)
    gpu: GpuMemo = field(default_factory=dict)
    engine: EngineMemo = field(default_factory=dict)

    def bounded(self) -> ScrapeCache:
        """Itself, emptied first when it holds more than ``max_series`` series."""
        if len(self.gpu) + len(self.engine) > self.max_series:
            self.gpu.clear()
            self.engine.clear()
            self.parse.labels.clear()
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
) -> Parsed:
    """Canonical rows of one scrape body (rules 1-3; rule 5 with a ``cache``)."""
    if kind not in ("dcgm", "engine", "auto"):
        raise ValueError(f"parse_scrape: kind must be dcgm, engine or auto, not {kind!r}")
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise ParseError(f"body of {len(text):,} bytes exceeds the cap of {max_bytes:,}", source=source)
        text = text.decode("utf-8", errors="replace")
    memo = (cache or ScrapeCache()).bounded()
    exp = parse(text, source=source, max_chars=max_bytes, cache=memo.parse if cache else None)
    result = Parsed(problems=[_named(p, source) for p in exp.problems])
    if kind in ("dcgm", "auto"):
        result.extend(to_gpu_samples(exp, ts_ns=ts_ns, host=host, source=source, memo=memo.gpu))
    if kind in ("engine", "auto"):
        result.extend(to_engine_samples(exp, ts_ns=ts_ns, source=source, memo=memo.engine))
    return result


def _named(problem: Problem, source: str) -> Problem:
    return Problem(f"{source}: {problem.location}" if source else problem.location, problem.message)


def sniff(name: str, head: bytes) -> bool:
    """Rule 4: the head's complete lines parse as exposition and hold a GPU or engine metric."""
    text = head.decode("utf-8", errors="replace")
    if len(head) == SNIFF_BYTES:
        text = text[: text.rfind("\n") + 1]  # drop the cut last line
    if "#Entity" in text:
        return False
    exp = parse(text, openmetrics=False)
    if not exp.samples or len(exp.problems) > len(exp.samples) // 10:
        return False
    return any(is_gpu_metric(s.name) or engine_of(s.name) for s in exp.samples)


def load(path: Path, ctx: IngestContext) -> Parsed:
    """Parse a captured scrape file (rule 4)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    source = f"{ctx.source}:{path.name}" if ctx.source else path.name
    return parse_scrape(raw, kind="auto", ts_ns=ctx.ts_ns, host=ctx.host, source=source)


FILE_FORMAT = FileFormat(name="prometheus-scrape", sniff=sniff, load=load, priority=50)
