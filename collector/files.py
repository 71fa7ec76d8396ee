"""Reading captured files with bounded memory: gzip or plain, whole lines, capped.

``ioe ingest`` reads files of any size; nothing here holds more than one chunk of a file.

Rules:

1. A file whose first two bytes are the gzip magic is decompressed as a stream. What it
   decompresses to is capped at :data:`MAX_DECOMPRESSED_BYTES` and at
   :data:`MAX_GZIP_RATIO` times its compressed size (at least :data:`MIN_GZIP_CAP`): a gzip
   bomb stops at the cap with a Problem; the lines read before it are kept.
2. :class:`LineChunks` yields whole lines, about ``chunk_bytes`` at a time, each chunk with
   the number of its first line. A line longer than ``chunk_bytes`` is still yielded whole,
   up to ``max_line_bytes`` (64 MiB); a longer one is skipped with a Problem, so a file
   without newlines never fills memory.
3. A last line without a newline may have been cut off while the file was written (a copy
   taken mid-write, a full disk): ``24669591596`` cut to ``246695`` is still a number. It is
   not stored: a Problem names the line and quotes it. A cut comment (``# EOF``) is kept.
4. :func:`read_capped` reads a whole file (for formats that need the whole document) and
   refuses one over ``max_bytes`` with :class:`~collector.errors.ParseError`.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from collector.errors import ParseError, Problem, quote

MAX_DECOMPRESSED_BYTES = 64 << 30
MAX_GZIP_RATIO = 200
MIN_GZIP_CAP = 256 << 20
CHUNK_BYTES = 8 << 20
MAX_LINE_BYTES = 64 << 20
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def gzip_cap(path: Path) -> int:
    """Rule 1: the most bytes a gzip file may decompress to."""
    return min(MAX_DECOMPRESSED_BYTES, max(MIN_GZIP_CAP, MAX_GZIP_RATIO * path.stat().st_size))


@dataclass
class LineChunks:
    """Whole-line chunks of one file and what was refused while reading it (rules 1-3)."""

    path: Path
    chunk_bytes: int = CHUNK_BYTES
    max_line_bytes: int = MAX_LINE_BYTES
    problems: list[Problem] = field(default_factory=list)
    lines: int = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        with _open(self.path) as (fh, cap):
            yield from self._chunks(fh, cap)

    def _chunks(self, fh: BinaryIO, cap: int | None) -> Iterator[tuple[int, bytes]]:
        carry = b""
        read = 0
        first = 1
        skipping = False  # inside a line longer than max_line_bytes (rule 2)
        done = False
        while not done:
            block = self._read(
                fh, self.chunk_bytes if cap is None else min(self.chunk_bytes, cap - read + 1), first
            )
            read += len(block)
            if cap is not None and read > cap:  # rule 1: keep what is under the cap, then stop
                block = block[: len(block) - (read - cap)]
                self.problems.append(
                    Problem(
                        str(self.path),
                        f"decompressed size passes the cap of {cap:,} bytes; the rest is not read",
                    )
                )
                done = True
            if not block:
                break
            if skipping:
                newline = block.find(b"\n")
                if newline < 0:
                    continue
                block, skipping = block[newline + 1 :], False
                first += 1
                self.lines += 1
            data = carry + block
            end = data.rfind(b"\n") + 1
            carry = data[end:]
            if len(carry) > self.max_line_bytes:
                self.problems.append(
                    Problem(
                        f"{self.path}:{first}", f"line longer than {self.max_line_bytes:,} bytes: skipped"
                    )
                )
                carry, skipping = b"", True
            if end:
                n = data.count(b"\n", 0, end)
                yield first, data[:end]
                first += n
                self.lines += n
        yield from self._tail(carry, first, skipping)

    def _read(self, fh: BinaryIO, want: int, line: int) -> bytes:
        try:
            return fh.read(want) if want > 0 else b""
        except (OSError, EOFError, zlib.error) as exc:
            self.problems.append(Problem(f"{self.path}:{line}", f"cannot read further ({exc})"))
            return b""

    def _tail(self, carry: bytes, first: int, skipping: bool) -> Iterator[tuple[int, bytes]]:
        """Rule 3: the last line when it has no newline."""
        tail = carry
        if tail.strip() and not skipping:
            if tail.lstrip().startswith(b"#"):
                self.lines += 1
                yield first, tail + b"\n"
            else:
                self.problems.append(
                    Problem(
                        f"{self.path}:{first}",
                        "last line has no newline: it may be cut off, so it is not stored "
                        f"(got {quote(tail[-80:])})",
                    )
                )


class _open:
    """``(binary stream, decompressed cap or None)`` for a plain or gzip file (rule 1)."""

    def __init__(self, path: Path):
        self.path = path
        self.fh: BinaryIO | None = None

    def __enter__(self) -> tuple[BinaryIO, int | None]:
        if is_gzip(self.path):
            fh: Any = gzip.open(self.path, "rb")
            self.fh = fh
            return fh, gzip_cap(self.path)
        plain = self.path.open("rb")
        self.fh = plain
        return plain, None

    def __exit__(self, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()


def read_capped(path: Path, max_bytes: int) -> bytes:
    """Rule 4: the whole (decompressed) file, or ParseError past ``max_bytes``."""
    with _open(path) as (fh, cap):
        limit = max_bytes if cap is None else min(max_bytes, cap)
        try:
            data = fh.read(limit + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise ParseError(f"cannot read ({exc})", source=str(path)) from exc
    if len(data) > limit:
        raise ParseError(
            f"larger than {limit:,} bytes{' decompressed' if cap is not None else ''}: not read whole",
            source=str(path),
        )
    return data


__all__ = ["CHUNK_BYTES", "LineChunks", "gzip_cap", "is_gzip", "read_capped"]
