"""Shared test helpers: fixture paths and the rule for system components.

A test that needs a system component (promtool, chromium, PostgreSQL) calls
:func:`require_component`: on a developer's machine a missing one skips the test, in CI
(``CI=true``) it fails it.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_component(name: str, found: bool | str | None = None) -> str:
    """Path of executable ``name`` (or the truthy ``found``); skip locally, fail in CI, if absent."""
    got = found if found is not None else shutil.which(name)
    if not got:
        msg = f"system component {name!r} is not installed (run `make system-deps`)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)  # only off CI: with CI=true the line above fails the test instead
    return str(got)


def require_module(name: str, why: str = "") -> Any:
    """Module ``name`` imported; skip locally, fail in CI, if it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        msg = f"{name} is not installed{f' ({why})' if why else ''}"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)  # only off CI: with CI=true the line above fails the test instead


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def data_dir() -> Path:
    return DATA


# Chromium for the page tests: the flags keep a headless run off the network and the GPU.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-quic",
]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = require_component(
        "chromium", "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    sync_api = require_module("playwright.sync_api", "the [test] extra")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


# The README's demo table is checked at 2 and 10 minutes of one `ioe demo`. The demo starts as soon
# as collection selects a test marked ``demo_background`` and runs beside the rest of the suite;
# those tests run last and wait for the checkpoints. The demo stops itself 30 s after the last one.
DEMO_CHECKPOINTS = (120.0, 600.0)
_demo: dict[str, object] = {}


def _start_demo() -> object:
    from concurrent.futures import ThreadPoolExecutor

    from bench.demo_surfaces import Demo

    if "future" not in _demo:
        demo = Demo(max(DEMO_CHECKPOINTS) + 30)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ioe-demo")
        _demo.update(demo=demo, pool=pool, future=pool.submit(demo.sample, list(DEMO_CHECKPOINTS)))
    return _demo["future"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    late = [i for i in items if i.get_closest_marker("demo_background")]
    if late:
        items[:] = [i for i in items if not i.get_closest_marker("demo_background")] + late


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(i.get_closest_marker("demo_background") for i in session.items):
        _start_demo()


def pytest_sessionfinish(session: pytest.Session) -> None:
    demo = _demo.get("demo")
    if demo is not None:
        demo.stop()  # type: ignore[attr-defined]


@pytest.fixture
def demo_checkpoints() -> list[tuple[float, str, dict[str, object]]]:
    """The surfaces of the session's demo at :data:`DEMO_CHECKPOINTS` (waits for the last one)."""
    future = _start_demo()
    return future.result(timeout=max(DEMO_CHECKPOINTS) + 300)  # type: ignore[attr-defined,no-any-return]
