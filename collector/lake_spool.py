"""The lake store's local spool: acknowledged batches waiting for their commit.

Each batch is one Arrow IPC file, written so that it is either whole under its final name or
absent. The directory is locked by one process at a time.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from collector.store import StoreError

log = logging.getLogger(__name__)


class SpoolError(StoreError):
    """The spool directory cannot be used; the message names it and says why."""


class Spool:
    """Arrow IPC files, one per acknowledged batch, named ``<seq>.<table>.arrow`` in order.

    Notes:
    1. A file is visible under its final name only after its bytes were fsynced; a stray
       ``.tmp`` file is an unacknowledged batch and is removed on open.
    2. The directory is ``flock``-ed for the life of the object (one process per spool).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise SpoolError(f"spool {self.path}: in use by another process") from exc
        for stray in self.path.glob("*.tmp"):
            stray.unlink()
        self._seq = max((self._seq_of(p) for p in self.pending()), default=0)
        self._mutex = threading.Lock()

    @staticmethod
    def _seq_of(path: Path) -> int:
        return int(path.name.split(".", 1)[0])

    def put(self, table: str, batch: pa.Table) -> Path:
        """Write ``batch`` durably; returns its file once it would survive a crash."""
        with self._mutex:
            self._seq = max(self._seq + 1, time.time_ns())
            final = self.path / f"{self._seq:020d}.{table}.arrow"
        tmp = final.with_name(final.name + ".tmp")
        with open(tmp, "wb") as fh:
            with ipc.new_file(fh, batch.schema) as writer:
                writer.write_table(batch)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self._sync_dir()
        return final

    def pending(self) -> list[Path]:
        return sorted(self.path.glob("*.arrow"))

    @staticmethod
    def read(path: Path) -> tuple[str, pa.Table]:
        table = path.name.split(".")[1]
        with ipc.open_file(path) as reader:
            return table, reader.read_all()

    def remove(self, paths: list[Path]) -> None:
        for p in paths:
            p.unlink(missing_ok=True)
        self._sync_dir()

    def quarantine(self, path: Path, why: str) -> None:
        bad = self.path / "bad"
        bad.mkdir(exist_ok=True)
        os.replace(path, bad / path.name)
        log.error("spool file %s is unreadable (%s): moved to %s", path, why, bad)

    def _sync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self._lock_fd)
