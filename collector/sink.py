"""The tiny writer protocol every source and receiver writes through.

The store implements it; so does the sidecar's bounded queue (which raises
:class:`Overloaded` instead of blocking when full) and :class:`collector.store.MemorySink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import polars as pl

if TYPE_CHECKING:  # pyarrow is never imported by the write path (see collector.store)
    import pyarrow as pa


class Overloaded(RuntimeError):
    """The writer cannot take more now; the caller should drop-and-count or answer 'retry later'."""


class Sink(Protocol):
    def write(self, table: str, batch: pl.DataFrame | pa.Table) -> int:
        """Accept ``batch`` for ``table``; returns rows accepted (new rows for the store)."""
        ...
