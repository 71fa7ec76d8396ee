"""Pure parsers, one module per input format.

A parser turns bytes, text or a path into frames shaped like :mod:`collector.records`
tables, and never touches the network or the store. Modules that can read a captured file
expose ``FILE_FORMAT`` (a :class:`FileFormat`) so that ``ioe ingest`` detects them from the
file's content; :func:`file_formats` finds them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.batch import as_polars, concat_rows
from collector.errors import Problem

if TYPE_CHECKING:
    import polars as pl

SNIFF_BYTES = 64 * 1024


@dataclass(frozen=True)
class IngestContext:
    """What a file does not say about itself: when it was captured and on which host.

    ``ts_given``: ``ts_ns`` was stated by the user (``ioe ingest --ts``), so it wins over what a
    loader could guess (a file's mtime); otherwise it is only the import time."""

    ts_ns: int
    host: str = ""
    source: str = ""
    # the file's name in series identities: its path under the folder being imported
    # (``node0/metrics.prom``), so two nodes' files of one name stay distinct series
    name: str = ""
    ts_given: bool = False
    # every file is a capture of this one scrape target (a folder of periodic scrapes of one
    # endpoint): the files' series are one series each, named by it instead of by the file's path
    target: str = ""


@dataclass
class Parsed:
    """A parser's answer: rows per table, plus the pieces of input it refused.

    ``batches`` holds what the parser built: a :class:`~collector.batch.Batch` (the scrape
    parsers and readers on the sidecar's path, which never load polars) or a polars frame
    (file formats). ``tables`` is the same rows as polars frames, for ingest and tests.
    """

    batches: dict[str, Any] = field(default_factory=dict)  # table -> Batch | pl.DataFrame
    problems: list[Problem] = field(default_factory=list)
    lines: int = 0  # input lines read, where a streamed file format counts them (ingest's bad share)

    @property
    def tables(self) -> dict[str, pl.DataFrame]:
        return {t: as_polars(b) for t, b in self.batches.items()}

    def add(self, table: str, frame: Any) -> None:
        """Append ``frame`` (a Batch or a polars frame) to ``table``'s rows."""
        if len(frame) == 0:
            return
        prev = self.batches.get(table)
        self.batches[table] = frame if prev is None else concat_rows([prev, frame])

    def extend(self, other: Parsed) -> None:
        for table, frame in other.batches.items():
            self.add(table, frame)
        self.problems.extend(other.problems)


@dataclass(frozen=True)
class FileFormat:
    """A captured-file format ``ioe ingest`` can detect.

    ``sniff(name, head)`` looks at the file name and its first :data:`SNIFF_BYTES` (already
    gunzipped) and says whether this format reads it; ``load(path, ctx)`` parses it. Lower
    ``priority`` is tried first. ``stream(path, ctx)``, where given, yields the rows a chunk
    at a time, so a file of any size is imported with bounded memory (ingest prefers it).
    ``explain(name, head)``, for a head no format claimed, says how close it came:
    ``(closeness 0..1, what is missing)``, or None when it is nothing like it.
    """

    name: str
    sniff: Callable[[str, bytes], bool]
    load: Callable[[Path, IngestContext], Parsed]
    priority: int = 100
    stream: Callable[[Path, IngestContext], Iterator[Parsed]] | None = None
    explain: Callable[[str, bytes], tuple[float, str] | None] | None = None


def file_formats() -> list[FileFormat]:
    """Every ``FILE_FORMAT`` defined by a module of this package, by priority."""
    found: list[FileFormat] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        fmt = getattr(module, "FILE_FORMAT", None)
        if isinstance(fmt, FileFormat):
            found.append(fmt)
        for extra in getattr(module, "FILE_FORMATS", ()):
            found.append(extra)
    return sorted(found, key=lambda f: (f.priority, f.name))


def gather_parts(parts: Iterable[Parsed]) -> Parsed:
    """A streamed file's parts as one :class:`Parsed` (rows, problems and lines read)."""
    whole = Parsed()
    for part in parts:
        whole.extend(part)
        whole.lines += part.lines
    return whole
