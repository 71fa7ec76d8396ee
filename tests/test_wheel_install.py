"""The wheel, installed as a user installs it, runs every command a user starts with.

The wheel is built from this checkout (``pip wheel --no-deps``), installed into a new virtual
environment with ``pip install <wheel>`` alone (its declared dependencies, none of the ``test``
extras), and every command runs from a scratch directory outside the checkout, with no
``PYTHONPATH``, through the installed ``ioe`` script:

1. the installed packages are the wheel's (not this checkout's) and the test-only distributions
   (pytest, httpx, the OTLP/gRPC exporter) are absent;
2. ``ioe serve --create``: ``/healthz``, an API route, the page and a static asset answer, and an
   OTLP/HTTP JSON export is stored (read back through ``/api/v1/query``);
3. ``ioe sidecar`` with the API on (the default): the same API, the page and an OTLP/HTTP export;
4. ``ioe estimate --json``: a strict-JSON estimate;
5. ``ioe demo --duration``: simulated deployments through the sidecar into a report;
6. ``ioe --version`` prints the installed distribution's version.

deploy/docker/Dockerfile installs this same wheel (tests/test_dockerfile.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TEST_ONLY = ("pytest", "httpx", "opentelemetry-exporter-otlp-proto-grpc", "schemathesis", "playwright")


@dataclass
class Installed:
    venv: Path
    wheel: Path
    work: Path  # a scratch directory outside the checkout: every command runs here

    @property
    def ioe(self) -> str:
        return str(self.venv / "bin" / "ioe")

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "LANG", "LC_", "HOME", "TMP"))}
        return {**keep, "PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "COLUMNS": "80"}

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.ioe, *args], cwd=self.work, env=self.env(), capture_output=True,
                              text=True, timeout=timeout, check=False)  # fmt: skip


def build_wheel(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(ROOT)],
                   check=True, timeout=600, capture_output=True)  # fmt: skip
    (wheel,) = dest.glob("ioe_analyzer-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    assert not base.is_relative_to(ROOT)
    wheel = build_wheel(base / "dist")
    venv = base / "venv"
    python = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    work = base / "work"
    work.mkdir()
    return Installed(venv, wheel, work)


def test_installed_packages_are_the_wheels_and_nothing_from_test(installed: Installed) -> None:
    code = "import ioe, ioeconf, collector, analyzer, api, simulate; print(ioe.__file__, api.__file__)"
    python, env = str(installed.venv / "bin" / "python"), installed.env()
    run = {"cwd": installed.work, "env": env, "capture_output": True, "text": True, "check": True}
    where = subprocess.run([python, "-c", code], **run).stdout
    assert all(Path(p).is_relative_to(installed.venv) for p in where.split())
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], **run).stdout
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert "ioe-analyzer" in names
    assert not names & set(TEST_ONLY)
    version = installed.run("--version")
    assert version.returncode == 0 and version.stdout == f"ioe {VERSION}\n", version.stderr


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post_json(url: str, body: object) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def started(installed: Installed) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each is stopped with SIGINT (then killed) at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _start(installed: Installed, procs: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([installed.ioe, *args], cwd=installed.work, env=installed.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    procs.append(proc)
    return proc


def _wait_healthy(proc: subprocess.Popen[str], url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"exited {proc.returncode} before answering: {out[-3000:]}")
        try:
            if _get(f"{url}/healthz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{url}/healthz did not answer in {timeout_s} s")


# One vLLM request span as an OTLP/HTTP JSON export (hex ids, camelCase, attributes in seconds).
SPAN_ID = "00f067aa0ba902b7"
OTLP = {
    "resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeSpans": [{
            "scope": {"name": "vllm.llm_engine"},
            "spans": [{
                "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": SPAN_ID, "name": "llm_request",
                "kind": 2,
                "startTimeUnixNano": "1764000000000000000", "endTimeUnixNano": "1764000001500000000",
                "attributes": [
                    {"key": "gen_ai.request.id", "value": {"stringValue": "cmpl-wheel-1"}},
                    {"key": "gen_ai.response.model", "value": {"stringValue": "llama-3.1-8b"}},
                    {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.12}},
                    {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1.5}},
                    {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "512"}},
                    {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "64"}},
                ],
            }],
        }],
    }]
}  # fmt: skip


def _check_api_page_and_otlp(url: str) -> None:
    status, body = _get(f"{url}/api/v1/deployments")
    assert status == 200, body[:500]
    assert "deployments" in json.loads(body)
    status, page = _get(f"{url}/")
    assert status == 200 and b"<html" in page.lower()
    status, _ = _get(f"{url}/static/app.js")
    assert status == 200
    status, body = _post_json(f"{url}/v1/traces", OTLP)
    assert status == 200, body[:500]
    assert json.loads(body or b"{}").get("partialSuccess", {}).get("rejectedSpans") in (None, "0", 0)
    sql = f"SELECT count(*) FROM request_spans WHERE span_id = '{SPAN_ID}'"
    status, body = _post_json(f"{url}/api/v1/query", {"sql": sql})
    assert status == 200, body[:500]
    assert json.loads(body)["rows"] == [[1]]


def test_serve_answers_api_page_and_otlp(installed: Installed, started: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    proc = _start(installed, started, "serve", "--store", "serve.duckdb", "--create", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(proc, url)
    _check_api_page_and_otlp(url)


def test_sidecar_with_the_api_on(installed: Installed, started: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    config = installed.work / "sidecar.yaml"
    config.write_text(
        f"store_path: {installed.work / 'sidecar.duckdb'}\nlisten_port: {port}\nflush_interval_s: 0.2\n"
        "api_enabled: true\nreaders: {nvml: false, dcgm: false, infiniband: false}\n"
    )
    proc = _start(installed, started, "sidecar", "--config", str(config))
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(proc, url)
    _check_api_page_and_otlp(url)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0


def test_estimate(installed: Installed) -> None:
    done = installed.run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100_sxm", "--batch", "8", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["fits"] is True and doc["ttft_ms"] > 0 and doc["tpot_ms"] > 0


def test_short_demo(installed: Installed) -> None:
    report = installed.work / "demo-report.json"
    workdir = str(installed.work / "demo")
    args = ("--duration", "25", "--warmup", "15", "--workdir", workdir, "--report-json", str(report))
    done = installed.run("demo", *args, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    doc = json.loads(report.read_text())
    assert doc["deployments"], doc
