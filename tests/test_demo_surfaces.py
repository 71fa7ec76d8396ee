"""The README's demo table on the live page, API and /metrics of a running `ioe demo` at 2 and 10
minutes (20 minutes: bench/demo_surfaces.py, recorded in BENCHMARKS.md).

The demo starts when the session begins and runs beside the other tests (tests/conftest.py); this
test runs last and waits for the 10-minute checkpoint when the suite is shorter than that."""

from __future__ import annotations

import pytest
from conftest import DEMO_CHECKPOINTS

from bench.demo_surfaces import BUILT_TO_SHOW

pytestmark = [pytest.mark.e2e, pytest.mark.demo_background]


@pytest.mark.timeout(max(DEMO_CHECKPOINTS) + 400)
def test_the_demo_table_holds_on_api_page_and_metrics_at_two_and_ten_minutes(demo_checkpoints) -> None:  # type: ignore[no-untyped-def]
    for at in DEMO_CHECKPOINTS:
        got = {name: s for t, name, s in demo_checkpoints if t == at}
        assert {n: s["api"] for n, s in got.items()} == BUILT_TO_SHOW, f"at {at / 60:g} min"
        assert {n: s["metrics"] for n, s in got.items()} == {n: [z] for n, z in BUILT_TO_SHOW.items()}, (
            f"at {at / 60:g} min"
        )
        assert all(s["page"] == 200 for s in got.values()), f"at {at / 60:g} min"
