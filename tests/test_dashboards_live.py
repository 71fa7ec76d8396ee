"""Every dashboard query against a real Prometheus scraping REAL IOE components (issue 8).

Processes, all on 127.0.0.1, all stopped at the end (module fixture ``live``):

1. ``ioe simulate --port P --write-sidecar-config F --inspector-dir D --duration S``: the demo deployments
   (``chat-8b``, ``code-70b`` with GPU 2 throttled to 80 % clock, ``longctx-70b``, ``tp16-ib``) serving
   dcgm-exporter and vLLM ``/metrics`` and writing NCCL Inspector logs;
2. ``ioe sidecar --config <F + store_path, listen_port>``: scrapes them into a DuckDB file in tmp, tails the
   Inspector logs, serves ``/metrics`` = its self-metrics + the verdict series of docs/metrics.md
   (api/app.py rule 2); we wait until every simulated deployment has a zone verdict and a rank is flagged;
3. ``prometheus`` (Debian package): scrapes the sidecar and every simulated endpoint, with the label contract
   of dashboards/README.md taken from ``deploy/compose/prometheus.yml`` (IOE job's ``honor_labels``, the
   dcgm-exporter job's ``Hostname``/``hostname`` -> ``host`` metric relabeling) and ``deployment`` set on each
   vLLM target from the sidecar config the simulator wrote (which target belongs to which deployment); it
   loads ``dashboards/rules/ioe.rules.yml`` with every group's interval cut to 1 s.

The split (rule: a target is FIXTURE-ONLY when every series it reads comes from a family in
:data:`FIXTURE_ONLY_FAMILIES`; everything else is LIVE):

* LIVE targets must answer without error and with a finite sample here, from the real sidecar and simulator;
* FIXTURE-ONLY targets (SGLang, TRT-LLM, node_exporter InfiniBand, dcgm ECC counters, vLLM prefix cache) read
  series the simulator does not produce; they are proven by ``tests/test_dashboards_prometheus.py`` against
  recorded exporter bodies (tests/data/prom/), and here they must come back empty without error, so the reason
  stays true: when the simulator grows one of them, the test says to move it to the live side.

That fixture test also serves a stand-in of IOE's ``/metrics`` (so SGLang/TRT-LLM deployments have verdicts to
select them); :func:`test_fixture_stand_in_has_the_real_sidecar_shape` holds it to the real sidecar's families
and label names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, free_port, require_component
from prometheus_client.parser import text_string_to_metric_families
from test_dashboards_prometheus import Prom, finite, ioe_test_exposition, resolve_variables, substitute

from api import verdicts
from dashboards.build import OUT_DIR

pytestmark = [pytest.mark.e2e, pytest.mark.component]

COMPOSE_PROMETHEUS = ROOT / "deploy" / "compose" / "prometheus.yml"
RULE_FILE = ROOT / "dashboards" / "rules" / "ioe.rules.yml"
SIM_DURATION_S = 150  # the simulator's own stop, a backstop should the fixture never reach its teardown
RULE_INTERVAL = "1s"
FIXTURE_ONLY_FAMILIES = {
    "sglang:": "SGLang engine: the simulator serves vLLM only",
    "trtllm_": "TRT-LLM engine: the simulator serves vLLM only",
    "node_infiniband_": "node_exporter InfiniBand: the simulator serves no node_exporter",
    "DCGM_FI_DEV_ECC_": "ECC counters: the simulated dcgm-exporter exports no ECC fields",
    "vllm:prefix_cache_": "prefix caching: the simulated engines keep no prefix cache",
    "ioe_deployment_crossover_concurrency": "Cp is fitted over 60 s bins of varying load "
    "(analyzer.thresholds bin_s): minutes of history a bounded run does not have",
    "ioe_deployment_ttft_share_ratio": "TTFT shares come from request spans: the simulator here is given no "
    "OTLP endpoint, so it sends none",
    "ioe_deployment_p99_regression_ratio": "the p99 baseline is the same 15-min window a day earlier, else "
    "(fallback, analyzer.regression rule 2) the 15 min before it: history a bounded run does not have",
}
SERIES = re.compile(r"\b(?:vllm:|sglang:|trtllm_|DCGM_FI_|node_|ioe_)[\w:]+")
# Like vLLM, the simulator creates vllm:num_preemptions_total at 0 on start-up, so the preemption rule has a
# rate for every deployment after two scrapes; the readiness check waits for longctx-70b's.
PREEMPTED = 'deployment:engine_preemptions:rate5m{deployment="longctx-70b"}'
THROTTLED = ("code-70b", "2", "code-70b-node0", "2")  # deployment, rank, host, gpu (simulate/spec.py)
NOMINAL_SM_CLOCK_MHZ = 1980.0
THROTTLE_RATIO = 0.8


# --- the split --------------------------------------------------------------------------------------------


def families(expr: str) -> set[str]:
    """The series names an expression reads (exporters' and IOE's, by prefix)."""
    return set(SERIES.findall(expr))


def fixture_only(expr: str) -> str:
    """Why ``expr`` cannot be proven live ('' when it can): every series it reads is fixture-only."""
    reasons = {
        next((why for prefix, why in FIXTURE_ONLY_FAMILIES.items() if name.startswith(prefix)), "")
        for name in families(expr)
    }
    return "" if "" in reasons or not reasons else "; ".join(sorted(reasons))


def targets(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target


def _board(name: str) -> dict[str, Any]:
    return dict(json.loads((OUT_DIR / name).read_text()))


def _boards() -> list[Path]:
    return sorted(OUT_DIR.glob("*.json"))


# --- processes ----------------------------------------------------------------------------------------------


@dataclass
class Live:
    prom: Prom
    sidecar_config: dict[str, Any]
    sidecar_metrics: str  # the sidecar's /metrics body once verdicts were in

    @property
    def deployments(self) -> list[str]:
        return sorted(d["name"] for d in self.sidecar_config["deployments"])

    @property
    def hosts(self) -> list[str]:
        return sorted(t["host"] for t in self.sidecar_config["targets"] if t["kind"] == "dcgm")


def _wait(
    check: Callable[[], Any], seconds: float, what: str, procs: dict[str, subprocess.Popen[bytes]]
) -> Any:
    """First truthy ``check()`` within ``seconds``; fails naming ``what`` (or the process that died)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode} while waiting for {what}")
        try:
            got = check()
        except (OSError, ValueError):
            got = None
        if got:
            return got
        time.sleep(0.5)
    pytest.fail(f"timed out after {seconds}s waiting for {what}")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def sidecar_config(generated: dict[str, Any], work: Path, port: int) -> dict[str, Any]:
    """The simulator's config plus a store in ``work``, the listen port, and no device readers."""
    return {
        **generated,
        "store_path": str(work / "node.duckdb"),
        "listen_port": port,
        "flush_interval_s": 0.5,
        "readers": {"nvml": False, "dcgm": False, "infiniband": False},
    }


def _static(target: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """One simulated endpoint; all share one address, so ``instance`` is the endpoint's name (as each real
    exporter would have its own address) and ``up`` stays one series per target."""
    parts = urllib.parse.urlsplit(target["url"])
    return {
        "targets": [parts.netloc],
        "labels": {"__metrics_path__": parts.path, "instance": target["name"], **labels},
    }


def scrape_config(cfg: dict[str, Any], sidecar_port: int, rules: Path) -> dict[str, Any]:
    """Prometheus config: the compose file's IOE and dcgm-exporter jobs, one vLLM target per deployment."""
    compose = {j["job_name"]: j for j in yaml.safe_load(COMPOSE_PROMETHEUS.read_text())["scrape_configs"]}
    owner = {t: d["name"] for d in cfg["deployments"] for t in d["targets"]}
    engines = [_static(t, {"deployment": owner[t["name"]]}) for t in cfg["targets"] if t["kind"] == "engine"]
    dcgm = [_static(t, {}) for t in cfg["targets"] if t["kind"] == "dcgm"]
    jobs = [
        {
            "job_name": "ioe",
            "honor_labels": compose["ioe"]["honor_labels"],
            "static_configs": [{"targets": [f"127.0.0.1:{sidecar_port}"]}],
        },
        {"job_name": "vllm", "static_configs": engines},
        {
            "job_name": "dcgm-exporter",
            "static_configs": dcgm,
            "metric_relabel_configs": compose["dcgm-exporter"]["metric_relabel_configs"],
        },
    ]
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": RULE_INTERVAL},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }


def fast_rules(work: Path) -> Path:
    """The rule file with every group evaluated every :data:`RULE_INTERVAL` (the file says 30 s for some)."""
    doc = yaml.safe_load(RULE_FILE.read_text())
    for group in doc["groups"]:
        group["interval"] = RULE_INTERVAL
    path = work / "ioe.rules.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen(
            args, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Newest first (the scraper before what it scrapes): SIGTERM, then SIGKILL after 15 s."""
    for proc in reversed(procs.values()):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _with_verdicts(body: str, deployments: list[str]) -> str:
    """``body`` when every deployment has a zone verdict and a rank is flagged (the join panels need one)."""
    got = {f.name: f.samples for f in text_string_to_metric_families(body)}
    zoned = {s.labels["deployment"] for s in got.get("ioe_deployment_zone", [])}
    return body if zoned == set(deployments) and got.get("ioe_straggler") else ""


def _scalar(p: Prom, expr: str) -> float:
    got = p.query(expr)["data"]["result"]
    return float(got[0]["value"][1]) if got else 0.0


def _prom_ready(p: Prom, n_targets: int, deployments: int) -> bool:
    """Every target up with >= 4 scrapes (rates need 2), the recording rules have run, and the KV-bound
    deployment's preemption rate is recorded (:data:`PREEMPTED`; the group's last rule, so all have run) and
    its KV cache has filled."""
    return (
        _scalar(p, "sum(up)") == n_targets
        and _scalar(p, "min(count_over_time(up[1m]))") >= 4
        and _scalar(p, "count(deployment:engine_ttft_seconds:p99_5m)") >= deployments
        and _scalar(p, f"count({PREEMPTED})") == 1  # the rule reads its rate: 2 scrapes are in
        and _scalar(p, 'deployment:engine_kv_usage:max{deployment="longctx-70b"}') >= 0.9  # KV full
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    exe = require_component("prometheus")
    work = tmp_path_factory.mktemp("live")
    generated, sidecar_port, prom_port = work / "sim-sidecar.yaml", free_port(), free_port()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["ioe simulate"] = _spawn(
            [sys.executable, "-m", "ioe", "simulate", "--port", str(free_port()), "--write-sidecar-config",
             str(generated), "--inspector-dir", str(work / "nccl"), "--duration", str(SIM_DURATION_S)],
            work / "simulate.log",
        )  # fmt: skip
        sim_cfg = _wait(lambda: yaml.safe_load(generated.read_text()), 30, "the sidecar config", procs)
        cfg = sidecar_config(sim_cfg, work, sidecar_port)
        (work / "sidecar.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        procs["ioe sidecar"] = _spawn(
            [sys.executable, "-m", "ioe", "sidecar", "--config", str(work / "sidecar.yaml")],
            work / "sidecar.log",
        )
        (work / "prometheus.yml").write_text(
            yaml.safe_dump(scrape_config(cfg, sidecar_port, fast_rules(work)))
        )
        procs["prometheus"] = _spawn(
            [exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            work / "prometheus.log",
        )  # fmt: skip
        deployments = sorted(d["name"] for d in cfg["deployments"])
        metrics_url = f"http://127.0.0.1:{sidecar_port}/metrics"
        body = _wait(
            lambda: _with_verdicts(_get(metrics_url), deployments),
            60,
            f"verdicts for {deployments} and a flagged straggler on the sidecar's /metrics (logs: {work})",
            procs,
        )
        prom = Prom(f"http://127.0.0.1:{prom_port}")
        n_targets = len(cfg["targets"]) + 1
        _wait(
            lambda: _prom_ready(prom, n_targets, len(deployments)),
            75,
            f"{n_targets} targets scraped, rules evaluated (logs: {work})",
            procs,
        )
        yield Live(prom, cfg, body)
    finally:
        _stop(procs)


# --- the tests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", _boards(), ids=lambda p: p.stem)
def test_every_live_panel_query_returns_data(live: Live, path: Path) -> None:
    board = json.loads(path.read_text())
    values = resolve_variables(live.prom, board)
    problems, proven = [], 0
    for title, target in targets(board):
        if fixture_only(target["expr"]):
            continue
        expr = substitute(target["expr"], values)
        answer = live.prom.query(expr)
        where = f"{path.name} / {title!r} / {target['legendFormat'] or target['refId']}: {expr}"
        if answer["status"] != "success":
            problems.append(f"{where}: ERROR {answer.get('error')}")
        elif not finite(answer["data"]["result"]):
            problems.append(f"{where}: no finite sample")
        proven += 1
    assert not problems, "\n".join(problems)
    assert proven >= 3


@pytest.mark.parametrize("path", _boards(), ids=lambda p: p.stem)
def test_fixture_only_targets_are_empty_live(live: Live, path: Path) -> None:
    """The reason a target is left to the fixtures still holds: its series do not exist here."""
    board = json.loads(path.read_text())
    values = resolve_variables(live.prom, board)
    for title, target in targets(board):
        if why := fixture_only(target["expr"]):
            answer = live.prom.query(substitute(target["expr"], values))
            assert answer["status"] == "success", answer
            assert not answer["data"]["result"], (
                f"{path.name} / {title!r}: fixture-only ({why}) but returns data live: "
                f"narrow FIXTURE_ONLY_FAMILIES so it is proven live"
            )


def test_the_split_is_explicit() -> None:
    """Every target reads known series; the fixture-only side is exactly the families named, and each
    dashboard keeps live targets."""
    split: dict[str, list[str]] = {"live": [], "fixture": []}
    for path in _boards():
        for title, target in targets(json.loads(path.read_text())):
            assert families(target["expr"]), f"{path.name} / {title!r}: reads no known series"
            split["fixture" if fixture_only(target["expr"]) else "live"].append(f"{path.stem} / {title}")
    assert len(split["live"]) > len(split["fixture"]) > 0
    assert "gpu-fabric / InfiniBand bytes/s vs port rate" in split["fixture"]
    assert "gpu-fabric / InfiniBand bytes/s vs port rate" not in split["live"]
    assert "deployment-drilldown / Preemptions / retractions per second" in split["live"]  # vLLM side is live


def test_variables_resolve_to_the_simulated_fleet(live: Live) -> None:
    """``deployment`` from IOE's verdicts; ``host`` copied from dcgm-exporter's ``Hostname`` by the compose
    file's relabel rule; ``gpu`` the exporter's indexes (tp16-ib spans two 8-GPU nodes)."""
    fleet = resolve_variables(live.prom, _board("fleet-overview.json"))
    assert fleet["deployment"] == live.deployments == ["chat-8b", "code-70b", "longctx-70b", "tp16-ib"]
    gpus = resolve_variables(live.prom, _board("gpu-fabric.json"))
    assert gpus["host"] == live.hosts
    assert gpus["gpu"] == [str(g) for g in range(8)]


def test_each_deployment_has_exactly_one_primary_zone(live: Live) -> None:
    board = _board("fleet-overview.json")
    panel = next(t for title, t in targets(board) if title == "Primary zone per deployment")
    got = live.prom.query(substitute(panel["expr"], resolve_variables(live.prom, board)))["data"]["result"]
    zones = {r["metric"]["deployment"]: r["metric"]["zone"] for r in got}
    assert sorted(zones) == live.deployments and len(got) == len(live.deployments)
    assert set(zones.values()) <= {"compute", "hbm_bandwidth", "kv_capacity", "network", "headroom"}


def test_straggler_clock_panel_shows_a_flagged_rank_with_its_gpu_clock(live: Live) -> None:
    """The join ``DCGM_FI_DEV_SM_CLOCK * on (host, gpu) group_left (deployment, rank) ioe_straggler`` works on
    the real label sets: IOE's ``host``/``gpu`` meet dcgm-exporter's relabeled ``host`` and its ``gpu``."""
    got = _straggler_clock(live)
    assert got, "the join matched no dcgm-exporter series"
    for (dep, rank, host, gpu), mhz in got.items():
        assert dep in live.deployments and host in live.hosts and 0 <= int(gpu) < 8 and 0 <= int(rank) < 16
        assert 0 < mhz <= NOMINAL_SM_CLOCK_MHZ


def test_straggler_clock_panel_names_the_throttled_gpu(live: Live) -> None:
    """The simulator throttles code-70b's GPU 2 to 80 % of 1980 MHz: the panel must show 1584 MHz there."""
    assert _straggler_clock(live).get(THROTTLED) == pytest.approx(NOMINAL_SM_CLOCK_MHZ * THROTTLE_RATIO)


def _straggler_clock(live: Live) -> dict[tuple[str, ...], float]:
    board = _board("collectives-stragglers.json")
    target = next(t for title, t in targets(board) if title == "Straggler GPU: SM clock")
    got = live.prom.query(substitute(target["expr"], resolve_variables(live.prom, board)))["data"]["result"]
    labels = ("deployment", "rank", "host", "gpu")
    return {tuple(r["metric"][k] for k in labels): float(r["value"][1]) for r in got}


def _recorded_names() -> list[str]:
    doc = yaml.safe_load(RULE_FILE.read_text())
    return sorted({r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r})


@pytest.mark.parametrize("record", _recorded_names())
def test_recording_rule_has_a_series_per_simulated_deployment(live: Live, record: str) -> None:
    """Every recording rule yields a finite value for every simulated deployment within the last two
    minutes (on a loaded machine a scrape can time out, and Prometheus marks that target's series
    stale until the next one: an instant query at that moment misses them)."""
    got = live.prom.query(f"last_over_time({record}[2m])")["data"]["result"]
    by_dep: dict[str, list[float]] = {}
    for r in got:
        by_dep.setdefault(r["metric"]["deployment"], []).append(float(r["value"][1]))
    assert sorted(by_dep) == live.deployments, f"{record}: {sorted(by_dep)}"
    assert finite(got), f"{record}: no finite value"


def test_every_rule_evaluates_without_error(live: Live) -> None:
    """Prometheus evaluated every recording and alerting rule on the real label sets: health ``ok`` (no
    many-to-many match, no type error), each rule evaluated at least once."""
    groups = live.prom.get("/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    bad = [f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules if r["health"] != "ok"]
    assert not bad, "\n".join(bad)
    in_file = [r for g in yaml.safe_load(RULE_FILE.read_text())["groups"] for r in g["rules"]]
    assert len(rules) == len(in_file) == 39  # 28 recording rules, 11 alerts
    assert all(r["lastEvaluation"] > "2000" for r in rules), "a rule was never evaluated"


def test_recorded_values_are_in_range(live: Live) -> None:
    """Ratios are shares, quantiles are latencies within the engines' buckets, KV usage is a fraction."""
    checks = {
        "deployment_signal:engine_slo_errors:ratio_rate5m": (0.0, 1.0),
        "deployment:engine_kv_usage:max": (0.0, 1.0),
        "deployment:engine_ttft_seconds:p99_5m": (0.001, 2560.0),
        "deployment:engine_itl_seconds:p50_5m": (0.0, 80.0),
        "deployment:engine_requests:rate5m": (0.0, 1e4),
    }
    for record, (lo, hi) in checks.items():
        values = finite(live.prom.query(record)["data"]["result"])
        assert values and all(lo <= v <= hi for v in values), f"{record}: {values}"
    kv = finite(live.prom.query('deployment:engine_kv_usage:max{deployment="longctx-70b"}')["data"]["result"])
    assert kv and kv[0] >= 0.9  # built KV-bound: its cache is full by the time it preempts


def test_fixture_stand_in_has_the_real_sidecar_shape(live: Live) -> None:
    """Each family of the fixture test's stand-in IOE exposition is in the real ``/metrics`` with the same
    label names, or (Cp, regression ratio: they need history) declared so by the verdict collector."""
    declared = {name: frozenset(labels) for name, _, labels in verdicts.FAMILIES.values()}
    real = {**declared, **_shapes(live.sidecar_metrics)}
    stand_in = _shapes(ioe_test_exposition().decode())
    missing = {name: labels for name, labels in stand_in.items() if real.get(name) != labels}
    assert not missing, f"stand-in families whose names or labels differ from the real sidecar: {missing}"


def _shapes(body: str) -> dict[str, frozenset[str]]:
    return {
        s.name: frozenset(s.labels)
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if not s.name.endswith("_created")
    }
