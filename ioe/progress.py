"""The progress bar of ``ioe ingest`` (rich, on stderr).

Rules:
  1. Shown on a terminal once an import has run :data:`AFTER_S` seconds (a quick import prints
     nothing more than before), or from the start with ``--progress``; never with
     ``--no-progress``, and never when stderr is not a terminal unless ``--progress`` asks.
  2. It counts the bytes of the files done out of the bytes of all files given (sizes read once
     at the start), the files done, and the rows stored so far, which move inside a large file.
  3. It writes only to stderr and is closed before the command prints its summary, so stdout
     (the per-table rows, ``--json``) is the same with or without it. rich is imported only when
     the bar is first drawn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from collector.ingest import iter_files

AFTER_S = 2.0


class IngestProgress:
    """A callback for :func:`collector.ingest.ingest_paths` that draws the bar (rules 1-3)."""

    def __init__(
        self,
        paths: Iterable[str | Path],
        *,
        forced: bool | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream or sys.stderr
        self.enabled = forced if forced is not None else self.stream.isatty()  # rule 1
        self.after_s = 0.0 if forced else AFTER_S
        self.clock, self.t0 = clock, clock()
        self.files = self.bytes = self.rows = self.rows_in_file = 0
        self.sizes = {p: _size(p) for p, _ in iter_files(paths)} if self.enabled else {}  # rule 2
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, path: Path, rows: int, done: bool) -> None:
        if not self.enabled:
            return
        self.rows += rows - self.rows_in_file
        self.rows_in_file = 0 if done else rows
        if done:
            self.files += 1
            self.bytes += self.sizes.get(path, 0)
        if self._bar is None and self.clock() - self.t0 >= self.after_s:
            self._start()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.bytes, files=self.files, rows=self.rows)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("ioe ingest"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[files]}/{task.fields[total_files]} files, {task.fields[rows]:,} rows"),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
        )
        self._task = self._bar.add_task(
            "ingest", total=sum(self.sizes.values()), files=0, total_files=len(self.sizes), rows=0
        )
        self._bar.start()

    def close(self) -> None:
        """Stop drawing (rule 3); the last state stays on the terminal."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _size(path: Path) -> int:
    """The file's size; 0 for one that cannot be read (the import itself reports it)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
