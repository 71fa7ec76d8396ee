"""Every dashboard query against a real Prometheus scraping recorded fixtures: no error, no empty target.

This is the FIXTURE side of the split (the live side, against the real ``ioe simulate`` + ``ioe sidecar``, is
``tests/test_dashboards_live.py``, whose docstring states the rule). Here every target is checked, and for the
targets whose series the simulator cannot produce (SGLang, TRT-LLM, node_exporter InfiniBand, dcgm ECC, vLLM
prefix cache; IOE's Cp and p99 regression ratio, which need minutes to a day of history; IOE's TTFT shares,
which need request spans) this is the proof.

A Prometheus (Debian package) is started on 127.0.0.1 with a temporary storage dir and a 1 s scrape interval.
It scrapes one in-test HTTP server that serves the files of ``tests/data/prom/`` (see SOURCES.md there)
as dcgm-exporter, vLLM, SGLang, TRT-LLM and node_exporter endpoints, plus IOE's ``/metrics``. The scrape
config applies the label contract of dashboards/README.md: ``deployment`` as a target label on engines,
``host`` copied from ``Hostname``/``hostname`` on dcgm-exporter, IOE scraped with ``honor_labels``.

Template variables are resolved the way Grafana does (``label_values`` through Prometheus' label API) and
substituted; ``$__rate_interval`` becomes 30s (the whole run fits in it).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from conftest import DATA, free_port, require_component
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from dashboards.build import OUT_DIR

PROM_DATA = DATA / "prom"
HOST = "gpu-node-1"
DEPLOYMENTS = {"vllm": "llama-8b-vllm", "sglang": "llama-8b-sglang", "trtllm": "qwen-32b-trtllm"}
ENDPOINTS = {
    "/dcgm/h100": "h100x8_k8s_pod_labels.prom",
    "/dcgm/t4": "t4_a10g_mixed.prom",
    "/dcgm/h100-extended": "dcgm_h100x8_extended_SYNTHETIC.prom",
    "/engine/vllm": "vllm_0.33.0_dp2.prom",
    "/engine/sglang": "sglang_0.5.23.prom",
    "/engine/trtllm": "trtllm_SYNTHETIC.prom",
    "/node/infiniband": "node_infiniband_SYNTHETIC.prom",
}
RATE_INTERVAL = "30s"
STRAGGLER_GPU = "3"


# --- the served endpoints ---------------------------------------------------------------------------------


def scaled_names(text: str) -> set[str]:
    """Sample names that are cumulative: counters, and histograms' ``_bucket``/``_count``/``_sum``."""
    names: set[str] = set()
    for m in re.finditer(r"^# TYPE (\S+) (counter|histogram|summary)$", text, re.M):
        base, kind = m.groups()
        names |= (
            {base, f"{base}_total"}
            if kind == "counter"
            else {f"{base}_bucket", f"{base}_count", f"{base}_sum"}
        )
    return names


def scale_counters(text: str, factor: int) -> str:
    """``text`` with every cumulative sample multiplied by ``factor`` (gauges and comments unchanged).

    Serving a fixture with factor 1, 2, 3, … on successive scrapes makes its counters grow at a rate
    proportional to their fixture values, so a histogram's rate keeps the fixture's shape and quantiles.
    """
    names = scaled_names(text)
    out = []
    for line in text.splitlines():
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if line and not line.startswith("#") and name in names:
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def ioe_test_exposition() -> bytes:
    """TEST EXPOSITION of IOE's verdict series (names from docs/metrics.md) for the fixture deployments, so
    SGLang/TRT-LLM deployments and the fixture hosts have verdicts that select them. Its families and label
    names are held to the real sidecar's ``/metrics`` by ``test_dashboards_live``; its values are invented."""
    reg = CollectorRegistry()

    def gauge(name: str, labels: tuple[str, ...]) -> Gauge:
        return Gauge(name, name, labels, registry=reg)

    zone, conf = (
        gauge("ioe_deployment_zone", ("deployment", "zone")),
        gauge("ioe_deployment_zone_confidence_ratio", ("deployment",)),
    )
    QUANTILE_VALUES = {("ttft", 50): 0.12, ("ttft", 99): 0.9, ("itl", 50): 0.018, ("itl", 99): 0.06}
    quantiles = {
        (sig, q): gauge(f"ioe_deployment_{sig}_p{q}_seconds", ("deployment",))
        for sig in ("ttft", "itl")
        for q in (50, 99)
    }
    per_dep = {
        n: gauge(n, ("deployment",))
        for n in (
            "ioe_deployment_kv_headroom_ratio",
            "ioe_deployment_kv_headroom_sequences",
            "ioe_deployment_crossover_concurrency",
            "ioe_deployment_concurrency",
            "ioe_deployment_collective_exposed_ratio",
            "ioe_deployment_collective_busbw_ratio",
        )
    }
    regression = gauge("ioe_deployment_p99_regression_ratio", ("deployment", "signal"))
    ttft_share = gauge("ioe_deployment_ttft_share_ratio", ("deployment", "phase"))
    score = gauge("ioe_straggler_score_ratio", ("deployment", "rank", "host", "gpu"))
    flag = gauge("ioe_straggler", ("deployment", "rank", "host", "gpu"))
    up = gauge("ioe_target_up", ("target", "kind"))
    zones = {"llama-8b-vllm": "network", "llama-8b-sglang": "kv_capacity", "qwen-32b-trtllm": "compute"}
    for dep, primary in zones.items():
        for z in ("compute", "hbm_bandwidth", "kv_capacity", "network", "headroom"):
            zone.labels(dep, z).set(1.0 if z == primary else 0.0)
        conf.labels(dep).set(0.8)
        for key, value in QUANTILE_VALUES.items():
            quantiles[key].labels(dep).set(value)
        for i, g in enumerate(per_dep.values()):
            g.labels(dep).set(0.1 * (i + 1))
        regression.labels(dep, "ttft").set(1.1)
        regression.labels(dep, "itl").set(1.0)
        for phase, share in (("queue", 0.3), ("prefill", 0.5), ("other", 0.2)):
            ttft_share.labels(dep, phase).set(share)
    ttft_share.labels("qwen-32b-trtllm", "kv_transfer").set(0.15)
    for rank in range(8):
        score.labels("llama-8b-vllm", str(rank), HOST, str(rank)).set(
            0.7 if str(rank) == STRAGGLER_GPU else 0.04
        )
        flag.labels("llama-8b-vllm", str(rank), HOST, str(rank)).set(
            1.0 if str(rank) == STRAGGLER_GPU else 0.0
        )
    up.labels("vllm", "engine").set(1.0)
    up.labels("dcgm", "dcgm").set(1.0)
    return generate_latest(reg)


IOE_METRICS: Callable[[], bytes] = ioe_test_exposition


class _Handler(BaseHTTPRequestHandler):
    served: ClassVar[dict[str, int]] = {}

    def do_GET(self) -> None:
        if self.path == "/ioe/metrics":
            body = IOE_METRICS()
        elif self.path in ENDPOINTS:
            count = self.served[self.path] = self.served.get(self.path, 0) + 1
            body = scale_counters((PROM_DATA / ENDPOINTS[self.path]).read_text(), count).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


# --- Prometheus ------------------------------------------------------------------------------------------


def scrape_config(port: int) -> dict[str, Any]:
    """Prometheus config: one job per endpoint with the label contract (module docstring)."""
    target = [f"127.0.0.1:{port}"]
    host_from_dcgm = [
        {"source_labels": ["Hostname", "hostname"], "separator": "", "regex": "(.+)", "target_label": "host"}
    ]
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "ioe",
            "honor_labels": True,
            "metrics_path": "/ioe/metrics",
            "static_configs": [{"targets": target}],
        }
    ]
    for path in ENDPOINTS:
        job: dict[str, Any] = {"job_name": path.strip("/").replace("/", "-"), "metrics_path": path}
        labels: dict[str, str] = {}
        if path.startswith("/engine/"):
            labels["deployment"] = DEPLOYMENTS[path.rsplit("/", 1)[1]]
        if path.startswith("/dcgm/"):
            job["metric_relabel_configs"] = host_from_dcgm
        if path.startswith("/node/"):
            labels["host"] = HOST
        job["static_configs"] = [{"targets": target, "labels": labels}]
        jobs.append(job)
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"}, "scrape_configs": jobs}


class Prom:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> dict[str, Any]:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return dict(json.load(resp))
        except urllib.error.HTTPError as exc:
            return dict(json.load(exc))

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)


def _wait(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"timed out after {seconds}s waiting for {what}")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    exe = require_component("prometheus")
    _Handler.served = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(server.server_address[1])))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    p = Prom(f"http://127.0.0.1:{port}")
    try:
        jobs = len(ENDPOINTS) + 1
        # Rates need >= 2 scrapes of every target: wait for 4 samples of `up` on each, all up.
        _wait(
            lambda: _min_up_samples(p) >= 4 and _all_up(p, jobs),
            40,
            f"{jobs} targets up with 4 scrapes each (log: {work / 'prometheus.log'})",
        )
        yield p
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        server.shutdown()
        log.close()


def _min_up_samples(p: Prom) -> float:
    got = p.query("min(count_over_time(up[1m]))")["data"]["result"]
    return float(got[0]["value"][1]) if got else 0.0


def _all_up(p: Prom, jobs: int) -> bool:
    got = p.query("sum(up)")["data"]["result"]
    return bool(got) and float(got[0]["value"][1]) == jobs


# --- template variables ------------------------------------------------------------------------------------

LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$")


def resolve_variables(p: Prom, board: dict[str, Any]) -> dict[str, list[str]]:
    """Each query variable's values, from Prometheus' label API, in declaration order (later ones may use
    earlier ones, as Grafana chains them)."""
    values: dict[str, list[str]] = {}
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = LABEL_VALUES.match(var["definition"])
        assert m, f"{board['uid']}: variable {var['name']} is not label_values(...): {var['definition']!r}"
        params = {"match[]": substitute(m["match"], values)} if m["match"] else {}
        got = p.get(f"/api/v1/label/{m['label']}/values", **params)
        assert got["status"] == "success", got
        values[var["name"]] = sorted(got["data"])
    return values


def substitute(expr: str, values: dict[str, list[str]]) -> str:
    """Grafana's substitution: ``$var`` -> ``(v1|v2)`` regex (escaped for a PromQL string), rate interval."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", RATE_INTERVAL)
    for name in sorted(values, key=len, reverse=True):
        regex = "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values[name]) + ")"
        out = out.replace(f"${{{name}}}", regex).replace(f"${name}", regex)
    return out


def _boards() -> list[Path]:
    return sorted(OUT_DIR.glob("*.json"))


def finite(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]


# --- the tests ---


@pytest.mark.parametrize("path", _boards(), ids=lambda p: p.stem)
def test_every_panel_query_returns_data(prom: Prom, path: Path) -> None:
    board = json.loads(path.read_text())
    values = resolve_variables(prom, board)
    for name, got in values.items():
        assert got, f"{path.name}: variable ${name} resolves to no value"
    problems = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = substitute(target["expr"], values)
            assert "$" not in expr, f"unsubstituted variable in {expr!r}"
            answer = prom.query(expr)
            where = f"{path.name} / {panel['title']!r} / {target['refId']}: {expr}"
            if answer["status"] != "success":
                problems.append(f"{where}: ERROR {answer.get('error')}")
            elif not finite(answer["data"]["result"]):
                problems.append(f"{where}: no finite sample")
    assert not problems, "\n".join(problems)


def test_variables_resolve_to_fixture_values(prom: Prom) -> None:
    board = json.loads((OUT_DIR / "gpu-fabric.json").read_text())
    values = resolve_variables(prom, board)
    assert HOST in values["host"]  # copied from dcgm-exporter's Hostname by the relabel rule
    assert "424773df46e0" in values["host"]  # the T4 scrape (the only T4 host with GPU_TEMP)
    assert [str(g) for g in range(8)] == values["gpu"]
    fleet = resolve_variables(prom, json.loads((OUT_DIR / "fleet-overview.json").read_text()))
    assert fleet["deployment"] == sorted(DEPLOYMENTS.values())


def _fixture_quantile(path: Path, family: str, q: float) -> float:
    """Expected ``histogram_quantile`` from a fixture's buckets summed over all series (linear in-bucket)."""
    sums: dict[float, float] = {}
    for m in re.finditer(
        rf'^{re.escape(family)}_bucket\{{.*le="([^"]+)".*\}} (\S+)$', path.read_text(), re.M
    ):
        le = float(m[1])
        sums[le] = sums.get(le, 0.0) + float(m[2])
    bounds = sorted(sums)
    rank = q * sums[math.inf]
    lower, below = 0.0, 0.0
    for le in bounds:
        if sums[le] >= rank:
            return lower + (le - lower) * (rank - below) / (sums[le] - below)
        lower, below = le, sums[le]
    raise AssertionError(f"{family}: no bucket reaches rank {rank}")


@pytest.mark.parametrize(
    ("engine", "file", "family"),
    [
        ("vLLM", "vllm_0.33.0_dp2.prom", "vllm:time_to_first_token_seconds"),
        ("SGLang", "sglang_0.5.23.prom", "sglang:time_to_first_token_seconds"),
        ("TRT-LLM", "trtllm_SYNTHETIC.prom", "trtllm_time_to_first_token_seconds"),
    ],
)
def test_ttft_p99_panel_matches_fixture_buckets(prom: Prom, engine: str, file: str, family: str) -> None:
    board = json.loads((OUT_DIR / "deployment-drilldown.json").read_text())
    panel = next(p for p in board["panels"] if p["title"] == "TTFT quantiles")
    target = next(t for t in panel["targets"] if t["legendFormat"].endswith(f"{engine} p99"))
    got = prom.query(substitute(target["expr"], resolve_variables(prom, board)))["data"]["result"]
    assert len(got) == 1
    expected = _fixture_quantile(PROM_DATA / file, family, 0.99)
    assert float(got[0]["value"][1]) == pytest.approx(expected, rel=1e-6)


def test_straggler_join_finds_the_throttled_gpu(prom: Prom) -> None:
    """The collectives dashboard joins IOE's flagged rank to its GPU's dcgm clock: 1305 MHz, GPU 3."""
    board = json.loads((OUT_DIR / "collectives-stragglers.json").read_text())
    panel = next(p for p in board["panels"] if p["title"] == "Straggler GPU: SM clock")
    got = prom.query(substitute(panel["targets"][0]["expr"], resolve_variables(prom, board)))["data"][
        "result"
    ]
    assert [(r["metric"]["gpu"], r["metric"]["rank"], float(r["value"][1])) for r in got] == [
        (STRAGGLER_GPU, STRAGGLER_GPU, 1305.0)
    ]


def test_scale_counters_scales_only_cumulative_samples() -> None:
    text = (PROM_DATA / "vllm_0.33.0_dp2.prom").read_text()
    doubled = scale_counters(text, 2)
    assert (
        'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0' in doubled
    )
    assert (
        'vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 153600.0'
        in doubled
    )
    count = 'vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
    assert f"{count} 100.0" in doubled
