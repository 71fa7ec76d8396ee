"""The page in headless Debian Chromium (Playwright) against a real uvicorn on 127.0.0.1.

Checks: both pages load with no console error and no request leaving the server's origin; the
charts are drawn from the API's data (SVG elements per data point); screenshots are kept in
``artifacts/`` as test artifacts.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from api_store import build
from conftest import ROOT, free_port
from test_api_uvicorn import Served

from api.app import create_app
from ioe.settings import Settings

ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    st = build()
    with Served(create_app(Settings(store_path=":memory:"), st), free_port()) as s:
        yield s
    st.close()


def open_page(browser: object, url: str, origin: str) -> tuple[object, list[str], list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    errors: list[str] = []
    foreign: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith((origin, "data:")) else foreign.append(r.url))
    page.goto(url)
    page.wait_for_selector("main[data-ready='1']", timeout=30_000)
    return page, errors, foreign


def api_points(served: Served, signal: str) -> dict[str, int]:
    """Points per latency series the API serves for the page's default window."""
    body = httpx.get(f"{served.url}/api/v1/deployments/llama70b/latency?window=15m", timeout=30).json()
    out: dict[str, int] = {}
    for p in body["series"]:
        if p["concept"] == f"{signal}_seconds" and p["value_s"] is not None:
            name = f"{signal.upper()} p{round(p['q'] * 100)}"
            out[name] = out.get(name, 0) + 1
    return out


def test_overview_lists_the_deployment(browser: object, served: Served) -> None:
    page, errors, foreign = open_page(browser, served.url + "/", served.url)
    row = page.locator("table tbody tr").first  # type: ignore[attr-defined]
    assert row.locator("td").nth(0).inner_text() == "llama70b"
    assert row.locator(".zone").inner_text() == "kv_capacity"
    assert row.locator("td").nth(7).inner_text() == "1"  # one straggler
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page_overview.png"), full_page=True)  # type: ignore[attr-defined]
    assert errors == [] and foreign == []


def test_deployment_page_draws_charts_from_api_data(browser: object, served: Served) -> None:
    page, errors, foreign = open_page(browser, served.url + "/deployments/llama70b", served.url)
    page.wait_for_selector("#plan[data-ready='1']", timeout=30_000)  # type: ignore[attr-defined]
    q = page.locator  # type: ignore[attr-defined]
    # one dot per 7.5 s load bin of the 15 min window; the ITL panel lacks the first bin, whose
    # histogram has no earlier scrape to take an increase from
    panels = q("#chart-envelope svg")
    assert [panels.nth(i).locator("circle.pt").count() for i in range(2)] == [120, 119]
    assert q("#chart-envelope rect.zone-shade").get_attribute("data-zone") == "kv_capacity"
    assert float(q("#chart-envelope line.cp-line").first.get_attribute("data-x")) > 0
    assert q("#chart-envelope path.fit").count() == 2
    for chart, names in (("#chart-ttft", {"TTFT p50", "TTFT p99"}), ("#chart-itl", {"ITL p50", "ITL p99"})):
        paths = q(f"{chart} path.series")
        assert {paths.nth(i).get_attribute("data-name") for i in range(paths.count())} == names
        drawn = {paths.nth(i).get_attribute("data-name"): int(paths.nth(i).get_attribute("data-points"))
                 for i in range(paths.count())}  # fmt: skip
        assert drawn == api_points(served, chart[7:])
        assert min(drawn.values()) >= 100  # ≤ 120 bins of 7.5 s; bins without a scrape are gaps
    assert q("#chart-gpu path.series").count() == 4  # SM, tensor, DRAM, GPU util
    assert q("#chart-fabric path.series").count() == 3  # NVLink tx, IB rx, IB tx
    assert q("#chart-heat rect.cell").count() == 8 * 40  # 8 ranks × 40 ten-second slices
    assert "rank 3" in q("#chart-heat").inner_text()
    assert q("#plan table tbody tr").count() == 8
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page_deployment.png"), full_page=True)  # type: ignore[attr-defined]
    assert errors == [] and foreign == []
