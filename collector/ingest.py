"""Import captured files or directories into the store, detecting each file's format.

Rules:

1. One bad file never stops the rest: whatever a file's parser or reader raises becomes a
   problem naming the file; the rows written before it stay.
2. Formats that can stream (``FileFormat.stream``) are written a chunk at a time, so a file
   of any size is imported with bounded memory; the others are read whole under their own cap.
3. Idempotent: a file's series are named by its path under the folder imported
   (``node0/metrics.prom``, or the path as given for a file argument), and a file without
   timestamps is stamped with its modification time unless the context gives one
   (``ctx.ts_ns`` 0 means "the file's"), so importing the same files again adds no row.
   With ``ctx.target`` (``ioe ingest --target``) every file is a capture of that one scrape
   target, and its series are named by the target: a folder of 3,600 per-second scrapes of one
   endpoint holds each series once with 3,600 points, not 3,600 one-point series. Two files
   of one target stamped alike would be one scrape twice: a stated ``--ts`` over several files
   is refused for it (:func:`check_target`).
4. Problems are bounded: at most :data:`MAX_PROBLEMS_PER_FILE` are listed and stored in
   ``ingest_errors`` per file; one more problem counts the rest. A file of 10 lines or more
   whose refused lines are more than :data:`BAD_SHARE` of its lines gets a problem that says
   so (its good rows are kept).
5. Rows the store refuses are isolated (:func:`collector.writer.isolate`): the other rows of
   the batch are kept, the refused ones are problems. A failure of the store itself (I/O,
   memory) stops the import with :class:`collector.store.StoreError`.
6. ``progress``, when given, is called after each part a file writes, with the file, the rows
   that file has stored so far and False, then once more with True when the file is done
   (unrecognized files included, with 0 rows). It only observes: the import is the same.
"""

from __future__ import annotations

import gzip
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from collector.errors import ParseError, Problem
from collector.formats import SNIFF_BYTES, FileFormat, IngestContext, Parsed, file_formats
from collector.records import frame
from collector.sink import Sink
from collector.store import StoreError
from collector.writer import isolate, rejected_rows, store_failure

log = logging.getLogger(__name__)

MAX_PROBLEMS_PER_FILE = 100
MAX_REPORT_PROBLEMS = 1000
BAD_SHARE = 0.10
MIN_LINES_FOR_SHARE = 10  # a smaller file's refused lines are each listed already
_MORE = re.compile(r"^(\d+) more bad lines")


@dataclass
class IngestReport:
    """Rows new per table, files per format, and every refused input with its location."""

    rows: Counter[str] = field(default_factory=Counter)
    files: Counter[str] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    unrecognized: list[str] = field(default_factory=list)
    problems_not_listed: int = 0
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
    except (OSError, EOFError, zlib.error):
        return b""


def iter_files(paths: Iterable[str | Path]) -> Iterator[tuple[Path, str]]:
    """Every file under ``paths`` with its name for series identities (rule 3)."""
    for p in map(Path, paths):
        if p.is_dir():
            for x in sorted(x for x in p.rglob("*") if x.is_file()):
                yield x, x.relative_to(p).as_posix()
        elif p.is_file():
            yield p, p.as_posix()
        else:
            raise FileNotFoundError(f"ingest: no such file or directory: {p}")


def check_target(paths: Iterable[str | Path], ctx: IngestContext) -> None:
    """Rule 3: one target with one stated capture time fits one file only (else ValueError)."""
    if not (ctx.target and ctx.ts_given):
        return
    files = list(iter_files(paths))
    if len(files) > 1:
        raise ValueError(
            f"--target {ctx.target!r} with --ts stamps {len(files)} files of one target alike "
            "(one scrape many times): drop --ts to stamp each file with its modification time"
        )


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


# rule 6: (file, rows stored from it so far, file done)
Progress = Callable[[Path, int, bool], None]


def ingest_paths(
    store: Sink,
    paths: Iterable[str | Path],
    ctx: IngestContext | None = None,
    progress: Progress | None = None,
) -> IngestReport:
    """Parse every recognized file under ``paths`` and write its rows (see the module rules)."""
    ctx = ctx or IngestContext(ts_ns=0)
    formats = file_formats()
    report = IngestReport()
    for path, name in iter_files(paths):
        try:
            fmt = detect(path, formats)
            stamp = ctx.ts_ns or path.stat().st_mtime_ns
        except OSError as exc:  # unreadable: named, and the other files go on
            report.problems.append(Problem(str(path), f"cannot read ({exc})"))
            if progress:
                progress(path, 0, True)
            continue
        if fmt is None:
            _unrecognized(store, path, formats, report)
            if progress:
                progress(path, 0, True)
            continue
        one = _FileImport(store, path, report, progress)
        one.run(fmt, replace(ctx, ts_ns=stamp, name=ctx.target or name))
        report.files[fmt.name] += 1
        if progress:
            progress(path, one.stored, True)
    return report


def _unrecognized(store: Sink, path: Path, formats: list[FileFormat], report: IngestReport) -> None:
    """Record why no format read ``path``: in the report and as one ``ingest_errors`` row."""
    why = why_unrecognized(path.name, read_head(path), formats)
    report.unrecognized.append(str(path))
    report.reasons[str(path)] = why
    log.debug("ingest: %s unrecognized: %s", path, why)
    row = {"ts_ns": [time.time_ns()], "source": [str(path)], "location": [str(path)]}
    store.write("ingest_errors", frame("ingest_errors", {**row, "message": [f"unrecognized: {why}"]}))


class _FileImport:
    """One file's import: its parts written as they come, its problems bounded (rules 1-5)."""

    def __init__(self, store: Sink, path: Path, report: IngestReport, progress: Progress | None = None):
        self.store, self.path, self.report, self.progress = store, path, report, progress
        self.lines = self.bad = self.listed = self.unlisted = self.stored = 0

    def run(self, fmt: FileFormat, ctx: IngestContext) -> None:
        parts = fmt.stream(self.path, ctx) if fmt.stream else None
        try:
            for parsed in parts if parts is not None else iter([fmt.load(self.path, ctx)]):
                self.write(parsed)
        except (ParseError, OSError, EOFError, ValueError, zlib.error, MemoryError) as exc:
            self.problems([Problem(str(self.path), str(exc))])
        share = self.bad / self.lines if self.lines else 0.0
        if share > BAD_SHARE and self.lines >= MIN_LINES_FOR_SHARE:
            why = (
                f"{self.bad:,} of {self.lines:,} lines refused ({share:.0%}, over {BAD_SHARE:.0%}): "
                "the good rows are kept; is this the format it looks like?"
            )
            self.problems([Problem(str(self.path), why)], count=False)
        if self.unlisted:
            more = f"{self.unlisted:,} more problem(s) not listed"
            self.problems([Problem(str(self.path), more)], count=False, bounded=False)

    def write(self, parsed: Parsed) -> None:
        self.lines += parsed.lines
        for table, rows in parsed.batches.items():
            n = self.rows(table, rows)
            self.report.rows[table] += n
            self.stored += n
        if parsed.problems:
            self.problems(parsed.problems)
        if self.progress:
            self.progress(self.path, self.stored, False)

    def rows(self, table: str, rows: object) -> int:
        """Rule 5: the rows the store takes; the ones it refuses become problems."""
        try:
            return self.store.write(table, rows)  # type: ignore[arg-type]
        except Exception as exc:
            if store_failure(exc):
                raise StoreError(f"store write to {table} failed while importing {self.path}: {exc}") from exc
        stored: Counter[str] = Counter()
        rejected: list[tuple[str, object, str]] = []
        ok = isolate(
            self.store, table, rows, [256], rejected, lambda t, n: stored.update({t: n}), lambda t, n, e: None
        )
        if not ok:
            raise StoreError(f"store write to {table} failed while importing {self.path}")
        errors = rejected_rows(rejected, time.time_ns())
        self.problems(
            [
                Problem(f"{self.path}: {loc}", msg)
                for loc, msg in zip(errors["location"], errors["message"], strict=True)
            ]
        )
        return stored[table]

    def problems(self, problems: list[Problem], *, count: bool = True, bounded: bool = True) -> None:
        """Rule 4: named with the file, the first ones listed and stored, the rest counted."""
        named = [
            p if str(self.path) in p.location else Problem(f"{self.path}: {p.location}", p.message)
            for p in problems
        ]
        if count:
            self.bad += sum(int(m.group(1)) if (m := _MORE.match(p.message)) else 1 for p in problems)
        if bounded:
            room = max(MAX_PROBLEMS_PER_FILE - self.listed, 0)
            self.unlisted += max(len(named) - room, 0)
            named = named[:room]
        if not named:
            return
        self.listed += len(named)
        keep = max(MAX_REPORT_PROBLEMS - len(self.report.problems), 0)
        self.report.problems.extend(named[:keep])
        self.report.problems_not_listed += len(named) - min(keep, len(named))
        now = time.time_ns()
        self.store.write(
            "ingest_errors",
            frame(
                "ingest_errors",
                {
                    "ts_ns": [now + i for i in range(len(named))],
                    "source": [str(self.path)] * len(named),
                    "location": [p.location for p in named],
                    "message": [p.message for p in named],
                },
            ),
        )
