"""Follow NCCL Inspector ``*.log`` JSONL files in a directory as they grow.

Each :meth:`InspectorTailer.poll` reads only the bytes appended since the last poll, parses the
complete lines with :func:`collector.formats.nccl_inspector.parse_jsonl` and writes the rows to a
:class:`collector.sink.Sink`. Where it stopped is kept in a small JSON state file (written to a
temporary file and renamed, so a crash never leaves it half-written).

Rules:

1. Only complete lines (ending in ``\\n``) are read; a half-written last line waits for the next
   poll. Nothing is ever reread from the start of a file that only grew.
2. Truncation: a file now shorter than the saved offset, or whose first bytes no longer match
   the saved fingerprint (truncated and regrown between polls), is read again from offset 0.
3. Rotation: a different inode at the same path is a new file and is read from offset 0. The
   unread tail of a file renamed away (e.g. to ``x.log.1``) is not followed (a known limit).
4. The read position moves only after the sink accepted the batch; if the sink refuses
   (:class:`collector.sink.Overloaded`) the same bytes are offered again next poll. The state
   file holds *committed* positions only: behind a write queue (a sink with
   ``after_commit``, :class:`collector.writer.QueueSink`) a position is committed when the
   writer reports the rows before it stored, so a kill -9 between queueing and the store's
   commit loses nothing: the restarted tailer reads those lines again, and the store's natural
   key ``(origin, comm_id, coll_sn, rank, kind)`` makes a line stored twice insert nothing.
   When the writer reports that the store failed, the read position goes back to the
   committed one and the lines are read again. A sink without ``after_commit`` (the store
   itself) has committed when ``write`` returns.
5. A bad line is reported as ``<path>:<line>`` with a quote and skipped; good lines are kept.
6. At most ``max_bytes`` are read per file per poll, so one huge backlog cannot stall the loop;
   a single line longer than that is reported each poll and never read (a known limit).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collector.errors import Problem
from collector.formats.nccl_inspector import parse_jsonl
from collector.sink import Overloaded, Sink

log = logging.getLogger(__name__)

FINGERPRINT_BYTES = 256
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


@dataclass
class FileState:
    """Where reading of one file stands: inode, byte offset, lines consumed, head fingerprint."""

    inode: int = 0
    offset: int = 0
    line: int = 0
    head: str = ""
    head_len: int = 0


@dataclass
class PollReport:
    """What one poll did: new rows per table, bad lines, files restarted and why."""

    rows: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    problems: list[Problem] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)


class InspectorTailer:
    """Tail ``directory/*.log``; remember offsets in ``state_path``; write rows to ``sink``."""

    def __init__(
        self,
        directory: str | Path,
        state_path: str | Path,
        sink: Sink,
        *,
        pattern: str = "*.log",
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], int] = time.time_ns,
    ):
        self.directory = Path(directory)
        self.state_path = Path(state_path)
        self.sink = sink
        self.pattern = pattern
        self.max_bytes = max_bytes
        self.clock = clock
        self.files: dict[str, FileState] = load_state(self.state_path)  # read positions
        self.committed: dict[str, FileState] = {k: replace(v) for k, v in self.files.items()}
        self._epoch: dict[str, int] = {}  # bumped when a file's read position is reset (rule 4)
        self._waiting: dict[str, int] = {}  # commit callbacks not yet called back, per file
        self._lock = threading.Lock()
        self.last_poll_ns = 0

    def poll(self) -> PollReport:
        """Read every file's new complete lines once; save the state if anything moved."""
        report = PollReport()
        self.last_poll_ns = self.clock()
        seen: set[str] = set()
        for path in sorted(self.directory.glob(self.pattern)):
            if path.is_file():
                seen.add(str(path))
                self._poll_file(path, report)
        with self._lock:
            for name in set(self.files) - seen:
                del self.files[name]
                self.committed.pop(name, None)
            for name, state in self.files.items():  # a commit callback the full queue refused
                if self._waiting.get(name, 0) == 0 and state != self.committed.get(name):
                    self._after_commit(name, replace(state))
            committed = {k: replace(v) for k, v in self.committed.items()}
        save_state(self.state_path, committed)
        return report

    def _after_commit(self, key: str, state: FileState) -> None:
        """Rule 4: ``state`` becomes the committed position once the rows before it are stored."""
        ask = getattr(self.sink, "after_commit", None)
        if ask is None:
            self.committed[key] = state
            return
        epoch = self._epoch.get(key, 0)
        try:
            ask(lambda ok: self._commit(key, state, epoch, ok))
        except Overloaded:
            return  # asked again at the end of a later poll
        self._waiting[key] = self._waiting.get(key, 0) + 1

    def _commit(self, key: str, state: FileState, epoch: int, ok: bool) -> None:
        """The writer's answer (its thread): commit ``state``, or go back to the committed one."""
        with self._lock:
            self._waiting[key] = max(self._waiting.get(key, 0) - 1, 0)
            if epoch != self._epoch.get(key, 0) or key not in self.files:
                return
            if ok:
                self.committed[key] = state
                return
            self._epoch[key] = epoch + 1
            back = self.committed.get(key)
            self.files[key] = replace(back) if back is not None else FileState(inode=state.inode)
            log.warning(
                "inspector tailer: store write failed; %s read again from byte %d",
                key,
                self.files[key].offset,
            )

    def _poll_file(self, path: Path, report: PollReport) -> None:
        key = str(path)
        try:
            with path.open("rb") as fh:
                st = os.fstat(fh.fileno())
                state = self._check(key, fh, st.st_ino, st.st_size, report)
                fh.seek(state.offset)
                chunk = fh.read(min(self.max_bytes, st.st_size - state.offset))
        except OSError as exc:
            report.problems.append(Problem(key, f"cannot read ({exc})"))
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]  # rule 1: whole lines only
        if not complete:
            if len(chunk) >= self.max_bytes:
                report.problems.append(Problem(f"{key}:{state.line + 1}", "line longer than max_bytes"))
            return
        parsed = parse_jsonl(complete.decode("utf-8", "replace"), key, first_line=state.line + 1)
        try:
            for table, batch in parsed.batches.items():
                report.rows[table] += self.sink.write(table, batch)
        except Overloaded:
            report.deferred.append(key)  # rule 4: offered again next poll
            return
        report.problems.extend(parsed.problems)
        n_lines = complete.count(b"\n")
        report.lines += n_lines
        with self._lock:
            if self.files.get(key) is not state:  # the writer sent the file back meanwhile (rule 4)
                return
            state.offset += len(complete)
            state.line += n_lines
            if not state.head:
                state.head_len = min(FINGERPRINT_BYTES, len(complete))
                state.head = _fingerprint(complete[: state.head_len])
            self._after_commit(key, replace(state))

    def _check(self, key: str, fh: Any, inode: int, size: int, report: PollReport) -> FileState:
        """The file's state, reset to offset 0 on rotation or truncation (rules 2–3)."""
        state = self.files.get(key)
        reason = ""
        if state is None:
            state = FileState(inode=inode)
        elif state.inode != inode:
            reason = "rotated (new inode)"
        elif size < state.offset:
            reason = f"truncated ({size} < offset {state.offset})"
        elif state.head and _fingerprint(fh.read(state.head_len)) != state.head:
            reason = "rewritten (first bytes changed)"
        if reason:
            report.restarted.append(f"{key}: {reason}")
            log.info("inspector tailer: %s %s, reading from the start", key, reason)
            state = FileState(inode=inode)
            self._epoch[key] = self._epoch.get(key, 0) + 1
        self.files[key] = state
        return state


def _fingerprint(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest() if data else ""


def load_state(path: Path) -> dict[str, FileState]:
    """The saved offsets; a missing or unreadable state file means 'start fresh' (logged)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return {name: FileState(**entry) for name, entry in raw.get("files", {}).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.warning("inspector tailer: state file %s unreadable (%s); starting fresh", path, exc)
        return {}


def save_state(path: Path, files: dict[str, FileState]) -> None:
    """Write the state atomically: a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": 1, "files": {name: vars(st) for name, st in sorted(files.items())}}
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
