"""Import captured files or directories into the store, detecting each file's format."""

from __future__ import annotations

import gzip
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from collector.errors import ParseError, Problem
from collector.formats import SNIFF_BYTES, FileFormat, IngestContext, Parsed, file_formats
from collector.records import frame
from collector.sink import Sink

log = logging.getLogger(__name__)


@dataclass
class IngestReport:
    """Rows new per table, files per format, and every refused input with its location."""

    rows: Counter[str] = field(default_factory=Counter)
    files: Counter[str] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    unrecognized: list[str] = field(default_factory=list)
    # path -> why no format read it: the closest format and what it lacked (also in ingest_errors)
    reasons: dict[str, str] = field(default_factory=dict)


def read_head(path: Path) -> bytes:
    """The first bytes of a file, gunzipped when it is gzip."""
    with path.open("rb") as fh:
        magic = fh.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as fh:
            return fh.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return b""


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(x for x in p.rglob("*") if x.is_file())
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"ingest: no such file or directory: {p}")


def detect(path: Path, formats: list[FileFormat]) -> FileFormat | None:
    head = read_head(path)
    for fmt in formats:
        if fmt.sniff(path.name, head):
            return fmt
    return None


def why_unrecognized(name: str, head: bytes, formats: list[FileFormat]) -> str:
    """Why no format claimed ``head``: empty, binary, else the closest format and what it lacked."""
    if not head.strip():
        return "empty file"
    if b"\x00" in head[:4096]:
        return "binary content (NUL bytes): not a text or JSON capture"
    scored = []
    for fmt in formats:
        got = fmt.explain(name, head) if fmt.explain else None
        if got is not None:
            scored.append((got[0], fmt.name, got[1]))
    if not scored:
        names = ", ".join(f.name for f in formats)
        return f"no format is close (tried {names})"
    _, closest, missing = max(scored, key=lambda s: s[0])
    return f"closest format {closest}: {missing}"


def ingest_paths(store: Sink, paths: Iterable[str | Path], ctx: IngestContext | None = None) -> IngestReport:
    """Parse every recognized file under ``paths`` and write its rows; one bad file never stops the rest."""
    ctx = ctx or IngestContext(ts_ns=time.time_ns())
    formats = file_formats()
    report = IngestReport()
    for path in iter_files(paths):
        fmt = detect(path, formats)
        if fmt is None:
            _unrecognized(store, path, formats, report)
            continue
        try:
            parsed = fmt.load(path, ctx)
        except (ParseError, OSError, EOFError, ValueError) as exc:
            parsed = Parsed(problems=[Problem(str(path), str(exc))])
        report.files[fmt.name] += 1
        _write(store, parsed, path, report)
    return report


def _unrecognized(store: Sink, path: Path, formats: list[FileFormat], report: IngestReport) -> None:
    """Record why no format read ``path``: in the report and as one ``ingest_errors`` row."""
    why = why_unrecognized(path.name, read_head(path), formats)
    report.unrecognized.append(str(path))
    report.reasons[str(path)] = why
    log.debug("ingest: %s unrecognized: %s", path, why)
    row = {"ts_ns": [time.time_ns()], "source": [str(path)], "location": [str(path)]}
    store.write("ingest_errors", frame("ingest_errors", {**row, "message": [f"unrecognized: {why}"]}))


def _write(store: Sink, parsed: Parsed, path: Path, report: IngestReport) -> None:
    for table, batch in parsed.batches.items():
        report.rows[table] += store.write(table, batch)
    if parsed.problems:
        now = time.time_ns()
        problems = [
            Problem(p.location if str(path) in p.location else f"{path}: {p.location}", p.message)
            for p in parsed.problems
        ]
        report.problems.extend(problems)
        store.write(
            "ingest_errors",
            frame(
                "ingest_errors",
                {
                    "ts_ns": [now + i for i in range(len(problems))],
                    "source": [str(path)] * len(problems),
                    "location": [p.location for p in problems],
                    "message": [p.message for p in problems],
                },
            ),
        )
