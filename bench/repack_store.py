"""Repack every packed slice of a store with this checkout's packing rule, in place.

A bench store keeps the packed order of the code that wrote it; the store's maintenance packs
each closed hour once and never again. To time the analyzer on the layout this checkout would
have written, copy the store and repack the copy::

    cp /tmp/fleet24b/g512_1h.duckdb /tmp/g512_repacked.duckdb
    python -m bench.repack_store /tmp/g512_repacked.duckdb

Each slice of each table moves through :meth:`collector.store.Store.pack_slice` (a chunk a
transaction, as the maintenance pass moves a closed hour); the rows read back are the same.
"""

from __future__ import annotations

import argparse
import time

from collector import series
from collector.records import TABLES
from collector.store import Store


def repack(path: str) -> int:
    """Repack every slice of ``path``; the number of slices."""
    store = Store(path)
    done = 0
    try:
        for name, spec in TABLES.items():
            if not spec.values:
                continue
            slices = store.con.execute(
                f"SELECT DISTINCT ts_ns // {series.SLICE_NS} FROM {series.times_name(name)} ORDER BY 1"
            ).fetchall()
            for (k,) in slices:
                started = time.perf_counter()
                lo = int(k) * series.SLICE_NS
                store.pack_slice(spec, lo)
                print(f"{name} slice {k}: {time.perf_counter() - started:.1f} s", flush=True)
                done += 1
    finally:
        store.close()
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="a copy of a store file (written in place)")
    args = ap.parse_args()
    started = time.perf_counter()
    n = repack(args.store)
    print(f"repacked {n} slices in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
