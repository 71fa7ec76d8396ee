"""Build a store from a truth-set scenario through the real ingest path, and ask ``ioe analyze``.

Test helper for tests/test_truthgen.py and tests/test_truth_verdicts.py (the generator itself,
tests/truthgen/, imports nothing from IOE). Notes:

1. Each ``scrapes/<ts>`` folder is ingested with ``ts`` as its capture time, as ``ioe ingest --ts``
   does (the same :func:`collector.ingest.ingest_paths` with an :class:`IngestContext`), into one open
   store; the NCCL Inspector logs and the OTLP span files carry their own times and are ingested once.
2. The deployment is declared the way the sidecar declares it from its config file: ``deployment.yaml``
   is read with :func:`ioe.settings.load_settings` and written with ``deployments_frame``.
3. Stores are built once per scenario and process (``build``'s cache) and opened read-only after.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from truthgen.render import render
from truthgen.scenarios import Scenario
from typer.testing import CliRunner

from collector.formats import IngestContext
from collector.ingest import IngestReport, ingest_paths
from collector.sidecar import deployments_frame
from collector.store import Store
from ioe.cli import app
from ioe.settings import load_settings

_BUILT: dict[tuple[str, str], tuple[Path, IngestReport]] = {}


def ingest_capture(capture: Path, store_path: Path, *, declare: bool = True) -> IngestReport:
    """Notes 1-2: every file of ``capture`` into the store at ``store_path``."""
    report = IngestReport()
    with Store(store_path) as st:
        for folder in sorted((capture / "scrapes").iterdir()):
            part = ingest_paths(
                st, [folder], IngestContext(ts_ns=int(folder.name) * 1_000_000_000, source="ingest")
            )
            _merge(report, part)
        for own_times in ("nccl", "spans"):  # files that carry their own times: ingested once
            if (capture / own_times).exists():
                ctx = IngestContext(ts_ns=time.time_ns(), source="ingest")
                _merge(report, ingest_paths(st, [capture / own_times], ctx))
        if declare:
            specs = load_settings(capture / "deployment.yaml").deployments
            st.write("deployments", deployments_frame(specs, time.time_ns()))
    return report


def _merge(into: IngestReport, part: IngestReport) -> None:
    into.rows.update(part.rows)
    into.files.update(part.files)
    into.problems.extend(part.problems)
    into.unrecognized.extend(part.unrecognized)


def build(sc: Scenario, root: Path) -> tuple[Path, Path, IngestReport]:
    """Note 3: (capture dir, store file, ingest report) of ``sc`` under ``root``, built once."""
    key = (sc.name, str(root))
    capture = root / sc.name
    if key not in _BUILT:
        render(sc, capture)
        store = root / f"{sc.name}.duckdb"
        _BUILT[key] = (store, ingest_capture(capture, store))
    store, report = _BUILT[key]
    return capture, store, report


def analyze_json(store: Path, *, window_s: float, at_s: float | None = None) -> dict[str, Any]:
    """``ioe analyze --store S --json --window <w>s [--at <t>]`` run in-process, its JSON parsed."""
    args = ["analyze", "--store", str(store), "--json", "--window", f"{window_s:g}s"]
    if at_s is not None:
        args += ["--at", f"{at_s:.0f}"]
    res = CliRunner().invoke(app, args)
    if res.exit_code != 0:
        raise AssertionError(f"ioe analyze exited {res.exit_code}: {res.output}")
    return json.loads(res.output)
