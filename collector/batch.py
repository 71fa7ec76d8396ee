"""Rows of one table as plain Python column lists: the sidecar's batch, without a dataframe library.

The collector's hot path (scrape → parse → counter rates → write queue → store) moves every row
through :class:`Batch`. Polars is a 25 MB import plus its thread pool; a collector-only sidecar
(``api_enabled: false``) that imported it for a few hundred rows a second spent a quarter of its
memory budget on it (``bench/results/sidecar.md``). A batch hands itself to DuckDB through the
Arrow C stream interface (``__arrow_c_stream__``, built with nanoarrow), so the store reads it
column-wise in one ``INSERT … SELECT`` exactly as it reads a polars frame.

Rules:

1. Columns are in the table's order (:data:`collector.records.TABLES`), all of one length
   (``height``); values are Python ``int``/``float``/``str``/``bool`` or ``None`` (NULL).
2. Types are the table's: a DOUBLE column holds numbers (ints become floats when exported),
   an integer column holds ints, a VARCHAR column strings. A value that cannot be one
   (``"x"`` in an integer column) raises ``TypeError`` naming the table and column when the
   batch is exported, before the store sees any of it.
3. Batches never share a list they may mutate: :meth:`with_column` and :meth:`concat` build
   new lists and keep the others by reference, so a cached batch (a replay plan's identity
   columns) is reused safely.
4. ``unique`` is a promise made by whoever built the batch: no two rows share the table's key
   (a replay whose plan was checked, see ``collector.formats.scrape``). It survives
   :meth:`with_column` and :meth:`take`; :meth:`concat` keeps it only when every part has it and
   no two parts can share a key: their ``ts_ns`` ranges do not overlap (every raw key starts with
   ``ts_ns``), or ``source`` is a key column and each of the two holds one source, not the same
   (two targets scraped at one instant). The store then skips its own de-duplication of the batch.
5. ``runs``, when given, is another promise of the builder: the rows come in runs of these
   lengths (summing to ``height``), the rows of a run equal in every column but ``ts_ns`` and
   the table's value columns, i.e. one series each. The store then looks each run's series up
   once instead of once a row. It survives :meth:`with_column` of ``ts_ns`` or a value column,
   and :meth:`concat` when every part has it; :meth:`take` drops it.
6. ``parts``: the heights of the batches :meth:`concat` joined, in order (a flush's scrapes),
   or None for a batch not joined. The store looks a part's series up once when it repeats an
   earlier part's series (the same scrape target again). It survives :meth:`with_column`;
   :meth:`take` drops it. ``same`` goes with it: for each part, the first part whose columns
   other than ``ts_ns`` and the table's value columns are the very same lists (a replay plan's
   identity columns, shared by every scrape it replays: Batch rule 3), found by identity while
   every part is alive in :meth:`concat`, so no two lists can share an ``id``; None where a part
   was itself joined. The store then takes that part's series ids without comparing a value.
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, pairwise, repeat
from operator import is_not, itemgetter
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import polars as pl

# DuckDB type -> array.array typecode for a NULL-free numeric column (the fast export path).
_TYPECODE = {"BIGINT": "q", "INTEGER": "i", "DOUBLE": "d"}


class Batch:
    """One table's rows as column lists (rules 1-3)."""

    __slots__ = ("data", "height", "parts", "runs", "same", "table", "unique")

    def __init__(
        self,
        table: str,
        data: dict[str, list[Any]],
        height: int,
        *,
        unique: bool = False,
        runs: list[int] | None = None,
        parts: list[int] | None = None,
        same: list[int] | None = None,
    ):
        self.table = table
        self.data = data
        self.height = height
        self.unique = unique  # rule 4
        self.runs = runs  # rule 5
        self.parts = parts  # rule 6
        self.same = same  # rule 6

    @property
    def columns(self) -> list[str]:
        return list(self.data)

    def __len__(self) -> int:
        return self.height

    def __getitem__(self, name: str) -> list[Any]:
        return self.data[name]

    def __repr__(self) -> str:
        return f"Batch({self.table!r}, {self.height} rows, columns={self.columns})"

    def with_column(self, name: str, values: list[Any]) -> Batch:
        """A batch with column ``name`` replaced by ``values`` (same length, same position)."""
        if name not in self.data:
            raise KeyError(f"{self.table}: no column {name!r}")
        if len(values) != self.height:
            raise ValueError(f"{self.table}.{name}: {len(values)} values for {self.height} rows")
        data = {c: (values if c == name else v) for c, v in self.data.items()}
        runs = self.runs
        if runs is not None and name != "ts_ns":
            from collector.records import spec_of

            runs = runs if name in spec_of(self.table).values else None
        return Batch(
            self.table, data, self.height, unique=self.unique, runs=runs, parts=self.parts, same=self.same
        )

    def take(self, order: Sequence[int]) -> Batch:
        """The rows at positions ``order``, in that order."""
        data = {c: [v[i] for i in order] for c, v in self.data.items()}
        return Batch(self.table, data, len(order), unique=self.unique and len(set(order)) == len(order))

    def equals(self, other: object) -> bool:
        return (
            isinstance(other, Batch)
            and other.table == self.table
            and other.height == self.height
            and other.data == self.data
        )

    @staticmethod
    def concat(parts: Iterable[Batch]) -> Batch:
        """The rows of ``parts`` one after the other (all of one table)."""
        items = list(parts)
        if not items:
            raise ValueError("Batch.concat: nothing to concatenate")
        first = items[0]
        if len(items) == 1:
            return first
        for part in items[1:]:
            if part.table != first.table or part.columns != first.columns:
                raise ValueError(f"Batch.concat: {part.table} {part.columns} does not match {first.table}")
        data = {c: list(chain.from_iterable(part.data[c] for part in items)) for c in first.data}
        runs = None
        if all(p.runs is not None for p in items):
            runs = list(chain.from_iterable(p.runs or () for p in items))
        heights = [h for p in items for h in (p.parts or [p.height])]
        height = sum(p.height for p in items)
        same = _same_series(first.table, items) if len(heights) == len(items) else None
        return Batch(first.table, data, height, unique=_disjoint(items), runs=runs, parts=heights, same=same)

    # -- export -------------------------------------------------------------------------------
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The rows as an Arrow C stream (one struct array), for DuckDB's replacement scan."""
        import nanoarrow as na

        from collector.records import spec_of

        types = dict(spec_of(self.table).columns)
        children = [_arrow_column(na, self.table, c, types[c], v, self.height) for c, v in self.data.items()]
        schema = na.struct({c: _na_type(na, types[c]) for c in self.data})
        struct = na.c_array_from_buffers(schema, self.height, [None], children=children)
        return na.c_array_stream(struct).__arrow_c_stream__(requested_schema)

    def to_polars(self) -> pl.DataFrame:
        """The same rows as a polars frame with the table's dtypes (for readers and tests)."""
        import polars as pl

        from collector.records import TABLES

        schema = TABLES[self.table].polars_schema()
        return pl.DataFrame([pl.Series(c, v, dtype=schema[c], strict=False) for c, v in self.data.items()])


def _same_series(table: str, parts: list[Batch]) -> list[int]:
    """Rule 6's ``same`` of ``parts`` (every one alive in the caller's list)."""
    from collector.records import TABLES

    spec = TABLES.get(table)
    skip = {"ts_ns", *(spec.values if spec is not None else ())}
    names = [c for c in parts[0].data if c not in skip]  # every part has these columns (concat)
    if not names:
        return list(range(len(parts)))
    pick = itemgetter(*names) if len(names) > 1 else (lambda data: (data[names[0]],))
    first: dict[tuple[int, ...], int] = {}
    return [first.setdefault(tuple(map(id, pick(p.data))), i) for i, p in enumerate(parts)]


def _disjoint(parts: list[Batch]) -> bool:
    """Rule 4: every part unique and no two parts' keys shared: the ``ts_ns`` ranges of two parts
    do not overlap, or (where ``source`` is a key column) the two parts each hold one ``source``
    and not the same one (two targets scraped at the same instant: their rows are other series)."""
    if not all(p.unique and "ts_ns" in p.data for p in parts):
        return False
    tags: list[Any] = [None] * len(parts)
    if "source" in parts[0].data:
        from collector.records import TABLES

        spec = TABLES.get(parts[0].table)
        if spec is not None and "source" in spec.key:
            tags = [_constant(p.data["source"]) for p in parts]
            if _NOT_CONSTANT in tags:
                tags = [None] * len(parts)
    by_tag: dict[Any, list[tuple[int, int]]] = {}
    for part, tag in zip(parts, tags, strict=True):
        if part.height:
            by_tag.setdefault(tag, []).append((min(part.data["ts_ns"]), max(part.data["ts_ns"])))
    return all(prev[1] < nxt[0] for spans in by_tag.values() for prev, nxt in pairwise(sorted(spans)))


_NOT_CONSTANT: Any = object()


def _constant(values: list[Any]) -> Any:
    """The one value of ``values`` (None when empty), or :data:`_NOT_CONSTANT`."""
    if not values:
        return None
    first = values[0]
    return first if first is not None and values.count(first) == len(values) else _NOT_CONSTANT


def run_on_stream(cur: Any, sql: str, rows: Any) -> int:
    """Execute ``sql``, whose ``_stream`` reads ``rows`` (a Batch, polars frame or Arrow table).

    The fresh Arrow C stream capsule is registered on the cursor as ``_stream`` for this one
    statement, not found by DuckDB's replacement scan among the caller's locals: a store's
    database runs with external access disabled (:meth:`collector.store.Store.lock_down`), which
    turns replacement scans of Python objects off, while a registered relation still reads. It
    costs the same and imports neither pyarrow nor pandas. Returns the first column of the
    result row (an INSERT's count), 0 when there is none."""
    cur.register("_stream", cur.from_arrow(rows.__arrow_c_stream__()))
    try:
        got = cur.execute(sql).fetchone()
    finally:
        cur.unregister("_stream")
    return int(got[0]) if got else 0


def as_polars(rows: Any) -> Any:
    """A Batch as a polars frame; a polars frame (or Arrow table) as it is."""
    return rows.to_polars() if isinstance(rows, Batch) else rows


def concat_rows(parts: Sequence[Any], *, how: Literal["vertical", "vertical_relaxed"] = "vertical") -> Any:
    """One table's rows from ``parts`` in order: Batches stay a Batch (no polars on the sidecar's
    path); a mix with polars frames becomes one polars frame (``how`` as ``polars.concat``)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, Batch) for p in parts):
        return Batch.concat(parts)
    import polars as pl

    return pl.concat([as_polars(p) for p in parts], how=how)


_NA_TYPE = {
    "BIGINT": lambda na: na.int64(),
    "INTEGER": lambda na: na.int32(),
    "DOUBLE": lambda na: na.float64(),
    "VARCHAR": lambda na: na.string(),
    "BOOLEAN": lambda na: na.bool_(),
}
_SCHEMAS: dict[str, Any] = {}  # one nanoarrow type per DuckDB type, made once
_BITS = bytes.maketrans(b"\x00\x01", b"01")


def _na_type(na: Any, duck_type: str) -> Any:
    got = _SCHEMAS.get(duck_type)
    if got is None:
        got = _SCHEMAS[duck_type] = _NA_TYPE[duck_type](na)
    return got


def _arrow_column(na: Any, table: str, name: str, duck_type: str, values: list[Any], height: int) -> Any:
    """One column as a nanoarrow array (rule 2), built from buffers where the values allow it
    (one C loop per buffer: about 4x cheaper than nanoarrow's per-item builder, which is what a
    value of another type or a column of mixed types still goes through)."""
    kind = _na_type(na, duck_type)
    try:
        if duck_type == "VARCHAR":
            return _string_column(na, kind, values, height)
        code = _TYPECODE.get(duck_type)
        if code is not None:
            try:  # a column without NULL (the common case) needs no pass to count them
                validity, nulls, data = None, 0, array.array(code, values)
            except TypeError:  # a None, or a value of another type
                validity, nulls = _validity(values, height)
                if not nulls:
                    raise
                data = array.array(code, [0 if v is None else v for v in values])
            return na.c_array_from_buffers(kind, height, [validity, data], null_count=nulls)
    except (TypeError, ValueError, OverflowError):
        pass  # another type (an int in a VARCHAR column, a float in BIGINT), a lone surrogate: per item
    try:
        return na.c_array(_coerced(duck_type, values), kind)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{table}.{name}: values do not fit {duck_type} ({exc})") from exc


def _validity(values: list[Any], height: int) -> tuple[bytes | None, int]:
    """(Arrow validity bitmap or None when no value is NULL, the NULL count), in C loops: the
    0/1 flags become the binary digits of one integer whose little-endian bytes are the bitmap."""
    nulls = values.count(None)
    if not nulls:
        return None, 0
    flags = bytes(map(is_not, values, repeat(None)))
    bits = int(flags.translate(_BITS)[::-1] or b"0", 2)
    return bits.to_bytes((height + 7) // 8, "little"), nulls


def _string_column(na: Any, kind: Any, values: list[Any], height: int) -> Any:
    """A UTF-8 column from an offsets and a data buffer; TypeError for a value that is not a str."""
    validity, nulls = _validity(values, height)
    present = values if not nulls else [v for v in values if v is not None]
    text = "".join(present)  # TypeError for a non-str value
    if text.isascii():
        lengths: Iterable[int] = map(len, present)
        data = text.encode("ascii")
    else:
        encoded = [v.encode("utf-8") for v in present]  # UnicodeEncodeError: a lone surrogate
        lengths, data = map(len, encoded), b"".join(encoded)
    if nulls:  # NULL rows take no bytes: their length is 0
        it = iter(lengths)
        lengths = [0 if v is None else next(it) for v in values]
    offsets = array.array("i", accumulate(lengths, initial=0))
    return na.c_array_from_buffers(kind, height, [validity, offsets, data], null_count=nulls)


def _coerced(duck_type: str, values: list[Any]) -> list[Any]:
    if duck_type == "DOUBLE":
        return [None if v is None else float(v) for v in values]
    if duck_type in ("BIGINT", "INTEGER"):
        return [None if v is None else _exact_int(v) for v in values]
    if duck_type == "BOOLEAN":
        return [None if v is None else bool(v) for v in values]
    return [None if v is None else v if isinstance(v, str) else str(v) for v in values]


def _exact_int(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise TypeError(f"{value!r} is not an integer")
    return int(value)
