"""The envelope view of a real ``ioe serve`` on 127.0.0.1, in headless Debian Chromium (Playwright).

The store is :mod:`gen_sweep`: a load sweep whose throughput stops scaling, and whose ITL turns
up, at 48 running requests (its written-down engine model). The test starts ``python -m ioe serve``
over that file, opens ``/deployments/sweep70b``, keeps a screenshot of the envelope view in the
test's tmp dir, and checks in the SVG: two panels with a fitted curve each, axis labels with units,
the Cp and latency-knee markers near 48 with labels inside the plot, every bin of the window drawn
as a dot (warm-up bin left out), verdict colours that mean what they say, and human durations.
Skips off CI when Chromium or Playwright is missing; fails with ``CI=true``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, free_port
from gen_sweep import DEPLOYMENT, KNEE_RUNNING, build, tokens_per_s

NS = 1_000_000_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ioe serve`` (a child process) over the sweep store; its base URL."""
    store = tmp_path_factory.mktemp("sweep") / "sweep.duckdb"
    start_ns = (int(time.time()) // 60 * 60 - 2400) * NS  # 40 min ago: inside raw retention
    build(str(store), start_ns)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOE_")}
    log = (store.parent / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ioe", "serve", "--store", str(store), "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ioe serve did not start: {(store.parent / 'serve.log').read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def open_view(browser: object, url: str, window: str = "15m") -> tuple[object, list[str], list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1100})  # type: ignore[attr-defined]
    errors: list[str] = []
    foreign: list[str] = []
    # the sweep has no request spans, so /plan answers 422 and the page says "No plan" (expected);
    # every other failed request or console error is a failure
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "status of 422" not in m.text else None,
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith((url, "data:")) else foreign.append(r.url))
    page.goto(f"{url}/deployments/{DEPLOYMENT}")
    page.wait_for_selector("main[data-ready='1']", timeout=60_000)
    if window != "15m":
        page.select_option("#window", window)
        page.wait_for_selector("main[data-ready='1']", timeout=60_000)
    page.wait_for_selector("#plan[data-ready='1']", timeout=60_000)
    errors += [f"failed request {u}" for u in failed if "/plan" not in u]
    return page, errors, foreign


# Rendered boxes (rotation included) of the elements matching ``sel``, in their SVG's viewBox units.
BOXES = """sel => [...document.querySelectorAll(sel)].map(e => {
  const r = e.getBoundingClientRect(), s = e.ownerSVGElement.getBoundingClientRect();
  const v = e.ownerSVGElement.viewBox.baseVal, k = v.width / s.width;
  return {x: (r.left - s.left) * k, y: (r.top - s.top) * k, w: r.width * k, h: r.height * k,
          W: v.width, H: v.height, text: e.textContent};
})"""


def inside(box: dict) -> bool:
    return (
        box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["w"] <= box["W"]
        and box["y"] + box["h"] <= box["H"]
    )


def test_envelope_view_has_curve_axes_and_knee(browser: object, served: str, tmp_path: Path) -> None:
    page, errors, foreign = open_view(browser, served)
    q = page.locator  # type: ignore[attr-defined]
    shot = tmp_path / "envelope.png"
    q("#chart-envelope").screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000  # a drawn chart, not an empty box
    env = httpx.get(f"{served}/api/v1/deployments/{DEPLOYMENT}/envelope?window=15m", timeout=60).json()

    # two panels, each with a fitted curve through its dots
    assert q("#chart-envelope svg").count() == 2
    fits = q("#chart-envelope path.fit")
    assert fits.count() == 2
    assert all(int(fits.nth(i).get_attribute("data-vertices")) >= 3 for i in range(2))
    # every bin of the window is a dot: 15 min / 120 bins of 7.5 s, none missing in this store
    assert len(env["load_points"]) == 120
    assert q("#chart-envelope svg").nth(0).locator("circle.pt").count() == 120

    # named axes with units
    x_labels = [q("#chart-envelope .x-label").nth(i).text_content() for i in range(2)]
    y_labels = [q("#chart-envelope .y-label").nth(i).text_content() for i in range(2)]
    assert all("running requests" in t and "req" in t for t in x_labels)
    assert y_labels == ["throughput (tokens/s per GPU)", "ITL p99 (bucket estimate)"]
    ticks = q("#chart-envelope svg").nth(1).locator("text.tick").all_text_contents()
    assert any(t.endswith(" ms") for t in ticks)  # ITL ticks carry their unit

    # Cp and the latency knee: where the sweep's engines saturate (48 running requests)
    knee = q("#chart-envelope line.knee-line")
    assert knee.count() == 2 and q("#chart-envelope line.cp-line").count() == 2
    assert float(knee.first.get_attribute("data-x")) == pytest.approx(KNEE_RUNNING, rel=0.1)
    assert float(q("#chart-envelope line.cp-line").first.get_attribute("data-x")) == pytest.approx(
        KNEE_RUNNING, rel=0.1
    )
    assert q("#chart-envelope .knee-line-label").first.text_content().startswith("latency knee ≈ ")
    labels = page.evaluate(BOXES, "#chart-envelope .marker-label, #chart-envelope .axis-label")  # type: ignore[attr-defined]
    assert len(labels) == 8 and all(inside(b) for b in labels), labels  # none clipped
    first = [b for b in labels[:4] if "≈" in b["text"]]  # Cp and knee of the first panel sit close
    assert len(first) == 2 and abs(first[0]["y"] - first[1]["y"]) >= first[0]["h"]  # stacked, not overlapping
    assert errors == [] and foreign == []


def test_warm_up_bin_is_left_out(browser: object, served: str) -> None:
    """Over 1 h the window holds the run's first scrape, whose counters have no rate yet. Its bin reads
    the rates of the scrapes after it, so no dot sits below the sweep's lowest load (a count of
    increases would read 5 of the bin's 6 scrape intervals there: 83 %)."""
    env = httpx.get(f"{served}/api/v1/deployments/{DEPLOYMENT}/envelope?window=1h", timeout=60).json()
    pts = env["load_points"]
    lowest = 2 * tokens_per_s(4.0) / 8  # the sweep's lowest load: 4 running per engine, 8 GPUs
    assert pts and min(p["tokens_per_s_per_gpu"] for p in pts) >= 0.95 * lowest
    assert len(pts) == 1800 // 30  # 30 s bins over the 30 min of data
    page, errors, _ = open_view(browser, served, "1h")
    assert page.locator("#chart-envelope svg").nth(0).locator("circle.pt").count() == len(pts)  # type: ignore[attr-defined]
    assert errors == []


def test_verdict_colours_and_durations(browser: object, served: str) -> None:
    page, errors, _ = open_view(browser, served)
    colours = page.evaluate(  # type: ignore[attr-defined]
        """() => Object.fromEntries(["v-pass", "v-near", "v-fail", "v-na"].map(c => {
             const s = document.createElement("span"); s.className = "verdict-badge " + c;
             document.body.append(s); const st = getComputedStyle(s);
             const rgb = x => x.match(/\\d+/g).slice(0, 3).map(Number);
             const out = [c, {fg: rgb(st.color), bg: rgb(st.backgroundColor)}]; s.remove(); return out;
           }))"""
    )
    fail, ok = colours["v-fail"], colours["v-pass"]
    assert fail["fg"][0] > fail["fg"][1] and fail["bg"][0] > fail["bg"][1]  # red, never green
    assert ok["fg"][1] > ok["fg"][0] and ok["bg"][1] > ok["bg"][0]  # green
    assert len({tuple(v["bg"]) for v in colours.values()}) == 4  # four distinct fills
    for v in colours.values():  # legible: text darker than its fill by a wide margin
        assert sum(v["bg"]) - sum(v["fg"]) > 300, v
    badges = page.locator("#main .verdict-badge")  # type: ignore[attr-defined]
    assert badges.count() > 0
    assert all(t.split(" ")[1] in ("pass", "near", "fail", "n/a") for t in badges.all_text_contents())
    text = page.locator("#main").inner_text()  # type: ignore[attr-defined]
    assert "k ms" not in text and "M ms" not in text
    shown = page.evaluate("[630.2, 9.66, 0.0349, 0.0005, 7200, null].map(dur)")  # type: ignore[attr-defined]
    assert shown == ["10.5 min", "9.66 s", "34.9 ms", "0.5 ms", "2 h", "–"]  # was "630.2k ms" for 630.2 s
    assert errors == []
