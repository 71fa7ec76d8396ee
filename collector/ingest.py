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


def ingest_paths(store: Sink, paths: Iterable[str | Path], ctx: IngestContext | None = None) -> IngestReport:
    """Parse every recognized file under ``paths`` and write its rows; one bad file never stops the rest."""
    ctx = ctx or IngestContext(ts_ns=time.time_ns())
    formats = file_formats()
    report = IngestReport()
    for path in iter_files(paths):
        fmt = detect(path, formats)
        if fmt is None:
            report.unrecognized.append(str(path))
            continue
        try:
            parsed = fmt.load(path, ctx)
        except (ParseError, OSError, EOFError, ValueError) as exc:
            parsed = Parsed(problems=[Problem(str(path), str(exc))])
        report.files[fmt.name] += 1
        _write(store, parsed, path, report)
    return report


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
