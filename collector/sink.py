"""The tiny writer protocol every source and receiver writes through.

The store implements it; so does the sidecar's bounded queue (which raises
:class:`Overloaded` instead of blocking when full) and :class:`collector.store.MemorySink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # neither is imported by the sidecar's write path (see collector.batch, collector.store)
    import polars as pl
    import pyarrow as pa

    from collector.batch import Batch


class Overloaded(RuntimeError):
    """The writer cannot take more now; the caller should drop-and-count or answer 'retry later'."""


class Sink(Protocol):
    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        """Accept ``batch`` for ``table``; returns rows accepted (new rows for the store)."""
        ...
