"""The README's demo table on the live page, API and /metrics of a running `ioe demo` at 2 minutes
(10 and 20 minutes: bench/demo_surfaces.py, recorded in BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from bench.demo_surfaces import BUILT_TO_SHOW, run

pytestmark = pytest.mark.e2e


def test_the_demo_table_holds_on_api_page_and_metrics_at_two_minutes() -> None:
    rows = run([120.0])
    got = {name: s for _, name, s in rows}
    assert {n: s["api"] for n, s in got.items()} == BUILT_TO_SHOW
    assert {n: s["metrics"] for n, s in got.items()} == {n: [z] for n, z in BUILT_TO_SHOW.items()}
    assert all(s["page"] == 200 for s in got.values())
