"""deploy/: YAML lint, Kubernetes schema validation (offline), kustomize render, and cross-references between
the manifests, the compose file, the sidecar configs and the project (ports, paths, settings keys).

Nothing here runs a container: there is no Docker engine or cluster on the test machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, require_component

from ioe.settings import Settings, load_settings

DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kubernetes" / "base"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
DEFAULT_PORT = Settings().listen_port
SIDECAR_CONFIGS = [
    BASE / "sidecar.yaml",
    BASE / "node-agent.yaml",
    DEPLOY / "systemd" / "sidecar.yaml",
    DEPLOY / "compose" / "ioe-sidecar.yaml",
]
NCCL_ENV = {
    "NCCL_PROFILER_PLUGIN",
    "NCCL_INSPECTOR_ENABLE",
    "NCCL_INSPECTOR_DUMP_DIR",
    "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS",
    "NCCL_INSPECTOR_DUMP_VERBOSE",
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = require_component("kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _pod(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return dict(_by_kind(objs, kind)[0]["spec"]["template"]["spec"])


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(c for c in pod["containers"] if c["name"] == name))


def test_yamllint_clean() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "yamllint",
            "-c",
            str(DEPLOY / "yamllint.yaml"),
            str(DEPLOY),
            str(ROOT / "dashboards/rules"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_kustomize_renders_every_piece(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(
        (
            o["kind"],
            o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "ConfigMap" else o["metadata"]["name"],
        )
        for o in rendered
    )
    assert kinds == [
        ("ConfigMap", "ioe-dcgm-counters"),
        ("ConfigMap", "ioe-node-agent-config"),
        ("ConfigMap", "ioe-sidecar-config"),
        ("DaemonSet", "ioe-dcgm-exporter"),
        ("Deployment", "llama-3-1-8b"),
        ("Job", "ioe-api-token"),
        ("PrometheusRule", "ioe-rules"),
        ("Role", "ioe-api-token-writer"),
        ("RoleBinding", "ioe-api-token-writer"),
        ("Service", "ioe-dcgm-exporter"),
        ("Service", "llama-3-1-8b"),
        ("ServiceAccount", "ioe-api-token-writer"),
        ("ServiceMonitor", "ioe-dcgm-exporter"),
        ("ServiceMonitor", "ioe-engines"),
    ]
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ioe" for o in rendered)


def test_core_objects_pass_kubernetes_schema(rendered: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    core = [
        o
        for o in rendered
        if o["apiVersion"] in ("v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1")
    ]
    assert len(core) == 11
    for obj in core:
        kubernetes_validate.validate(obj, "1.32.0", strict=True)  # raises ValidationError


def test_schema_validation_rejects_a_bad_manifest(rendered: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    bad = _by_kind(rendered, "Service")[0]
    bad = {**bad, "spec": {**bad["spec"], "ports": [{"name": "ioe", "port": "nine"}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.32.0", strict=True)


def test_sidecar_pod_wiring(rendered: list[dict[str, Any]]) -> None:
    """Engine and sidecar share the Inspector dir; spans go to the sidecar's gRPC port; ports match."""
    pod = _pod(rendered, "Deployment")
    engine, ioe = _container(pod, "vllm"), _container(pod, "ioe")
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert set(env) >= NCCL_ENV and env["NCCL_INSPECTOR_ENABLE"] == "1"
    config = yaml.safe_load(
        next(c for c in _by_kind(rendered, "ConfigMap") if "sidecar-config" in c["metadata"]["name"])["data"][
            "sidecar.yaml"
        ]
    )
    settings = Settings.model_validate(config)
    assert env["NCCL_INSPECTOR_DUMP_DIR"] == settings.nccl_inspector_dir
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (engine, ioe)}
    assert mounts["vllm"]["nccl-inspector"] == mounts["ioe"]["nccl-inspector"] == settings.nccl_inspector_dir
    assert {"name": "nccl-inspector", "emptyDir": {}} in pod["volumes"]
    otlp = f"http://127.0.0.1:{settings.otlp.grpc_port}"
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == otlp
    assert f"--otlp-traces-endpoint={otlp}" in engine["args"]
    assert ioe["args"] == ["sidecar", "--config", "/etc/ioe/sidecar.yaml"]
    assert mounts["ioe"]["ioe-config"] == "/etc/ioe"
    assert settings.listen_port == DEFAULT_PORT == _port(ioe, "ioe")
    assert settings.store_path.startswith(mounts["ioe"]["ioe-store"] + "/")
    assert settings.targets[0].url == f"http://127.0.0.1:{_port(engine, 'http')}/metrics"


def _port(container: dict[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == name))


def test_daemonset_uses_extended_counters(rendered: list[dict[str, Any]]) -> None:
    pod = _pod(rendered, "DaemonSet")
    exporter = _container(pod, "dcgm-exporter")
    csv_name = exporter["args"][exporter["args"].index("-f") + 1]
    counters = next(c for c in _by_kind(rendered, "ConfigMap") if "dcgm-counters" in c["metadata"]["name"])
    assert csv_name == "/etc/dcgm-exporter/" + next(iter(counters["data"]))
    fields = _csv_fields(counters["data"]["ioe-counters.csv"])
    default = _csv_fields((ROOT / "tests/data/dcgm/default-counters.csv").read_text())
    assert default <= fields
    added = {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"}
    assert added <= fields - default
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"} <= fields


def _csv_fields(text: str) -> set[str]:
    return {
        line.split(",")[0].strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    }


def test_services_and_monitors_point_at_named_ports(rendered: list[dict[str, Any]]) -> None:
    named = {
        p["name"]
        for kind in ("Deployment", "DaemonSet")
        for c in _pod(rendered, kind)["containers"]
        for p in c["ports"]
    }
    svc_ports = {p["name"] for s in _by_kind(rendered, "Service") for p in s["spec"]["ports"]}
    assert {p["targetPort"] for s in _by_kind(rendered, "Service") for p in s["spec"]["ports"]} <= named
    for monitor in _by_kind(rendered, "ServiceMonitor"):
        for ep in monitor["spec"]["endpoints"]:
            assert ep["port"] in svc_ports
            assert ep.get("honorLabels", False) == (ep["port"] == "ioe")
    engines = _by_kind(rendered, "ServiceMonitor")[1]
    relabel = engines["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel == {
        "sourceLabels": ["__meta_kubernetes_pod_label_ioe_dev_deployment"],
        "targetLabel": "deployment",
    }
    pod_labels = _by_kind(rendered, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert "ioe.dev/deployment" in pod_labels


@pytest.mark.parametrize("path", SIDECAR_CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_sidecar_configs_load(path: Path) -> None:
    settings = load_settings(path, environ={})
    assert settings.listen_port == DEFAULT_PORT and settings.listen_host == "0.0.0.0"
    assert settings.targets and settings.store_path.startswith("/var/lib/ioe/")


def test_bad_sidecar_config_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "sidecar.yaml"
    bad.write_text((BASE / "sidecar.yaml").read_text().replace("listen_port: 9477", "listen_port: 99999"))
    with pytest.raises(ValueError, match="listen_port"):
        load_settings(bad, environ={})


def test_compose_references_exist() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"dcgm-exporter", "vllm", "ioe", "ioe-token", "prometheus", "grafana"}
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).resolve().exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose["volumes"], f"{name}: named volume {source} undeclared"
    build = services["ioe"]["build"]
    assert services["ioe-token"]["image"] == services["ioe"]["image"]
    assert (
        COMPOSE.parent / build["context"] / build["dockerfile"]
    ).resolve() == DEPLOY / "docker" / "Dockerfile"
    assert services["ioe"]["ports"] == [f"{DEFAULT_PORT}:{DEFAULT_PORT}"]
    grafana = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    assert (
        COMPOSE.parent / next(k for k, v in grafana.items() if v.startswith("/var/lib/grafana"))
    ).resolve() == ROOT / "dashboards" / "grafana"
    provider = yaml.safe_load((DEPLOY / "compose/grafana/provisioning/dashboards/ioe.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == grafana["../../dashboards/grafana"]


def test_compose_prometheus_loads_ioe_rules() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["prometheus"]["volumes"])
    rules_dir = next(k for k, v in mounts.items() if v == "/etc/prometheus/rules")
    assert (COMPOSE.parent / rules_dir).resolve() == ROOT / "dashboards" / "rules"
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.rules.yml"]
    ioe_job = next(j for j in config["scrape_configs"] if j["job_name"] == "ioe")
    assert ioe_job["honor_labels"] is True and ioe_job["static_configs"][0]["targets"] == [
        f"ioe:{DEFAULT_PORT}"
    ]
    sidecar = load_settings(DEPLOY / "compose" / "ioe-sidecar.yaml", environ={})
    env = compose["services"]["vllm"]["environment"]
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == f"http://ioe:{sidecar.otlp.grpc_port}"
    assert set(env) >= NCCL_ENV and env["NCCL_INSPECTOR_DUMP_DIR"] == sidecar.nccl_inspector_dir


def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = require_component("promtool")
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    config["rule_files"] = [str(ROOT / "dashboards" / "rules" / "*.rules.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 39 rules found" in done.stdout


def test_dockerfile() -> None:
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert "FROM python:3.11-slim" in lines
    assert "USER 10001" in lines and "useradd --system --uid 10001" in text
    assert f"EXPOSE {DEFAULT_PORT} 4317" in lines
    assert f"http://127.0.0.1:{DEFAULT_PORT}/healthz" in text and "HEALTHCHECK" in text
    for copied in (line.split()[1] for line in lines if line.startswith("COPY ") and "--" not in line):
        assert (ROOT / copied).exists(), f"Dockerfile copies missing {copied}"
    assert 'CMD ["sidecar", "--config", "/etc/ioe/sidecar.yaml"]' in lines


def test_systemd_unit() -> None:
    text = (DEPLOY / "systemd" / "ioe-sidecar.service").read_text()
    assert "ExecStart=/opt/ioe/venv/bin/ioe sidecar --config /etc/ioe/sidecar.yaml" in text
    assert "User=ioe" in text and "NoNewPrivileges=true" in text and "WantedBy=multi-user.target" in text
    sidecar = load_settings(DEPLOY / "systemd" / "sidecar.yaml", environ={})
    assert "/var/lib/ioe" in text and sidecar.store_path.startswith("/var/lib/ioe/")
    assert (
        sidecar.nccl_inspector_dir == "/var/run/nccl-inspector" and "RuntimeDirectory=nccl-inspector" in text
    )


# ---- the API token -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SIDECAR_CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_shipped_config_that_listens_beyond_loopback_has_a_token(path: Path) -> None:
    settings = load_settings(path, environ={})
    assert settings.auth_token_file and settings.exposure_problem() is None
    assert not settings.allow_unauthenticated


def test_pods_mount_the_generated_token_where_their_config_reads_it(rendered: list[dict[str, Any]]) -> None:
    configs = {
        c["metadata"]["name"].rsplit("-", 1)[0]: yaml.safe_load(next(iter(c["data"].values())))
        for c in _by_kind(rendered, "ConfigMap")
        if "config" in c["metadata"]["name"]
    }
    for kind, config in (("Deployment", "ioe-sidecar-config"), ("DaemonSet", "ioe-node-agent-config")):
        pod = _pod(rendered, kind)
        ioe = _container(pod, "ioe")
        mount = next(m for m in ioe["volumeMounts"] if m["name"] == "ioe-api-token")
        assert mount["readOnly"] is True
        token_file = Settings.model_validate(configs[config]).auth_token_file
        assert token_file == mount["mountPath"] + "/token"
        volume = next(v for v in pod["volumes"] if v["name"] == "ioe-api-token")
        assert volume == {"name": "ioe-api-token", "secret": {"secretName": "ioe-api-token"}}
    engine = _container(_pod(rendered, "Deployment"), "vllm")
    env = {e["name"]: e for e in engine["env"]}
    assert env["IOE_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ioe-api-token", "key": "token"}
    names = [e["name"] for e in engine["env"]]
    assert names.index("IOE_API_TOKEN") < names.index("OTEL_EXPORTER_OTLP_TRACES_HEADERS")  # $(VAR) order
    assert env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]["value"] == "authorization=Bearer%20$(IOE_API_TOKEN)"


def test_token_job_creates_the_secret_once(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """Runs the Job's own script against a stand-in kubectl that keeps secrets in a directory."""
    job = next(o for o in rendered if o["kind"] == "Job")
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    fake = tmp_path / "bin" / "kubectl"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'store="{tmp_path}/secrets"; mkdir -p "$store"\n'
        'if [ "$1" = get ]; then test -f "$store/$3"; exit $?; fi\n'
        'if [ "$1" = create ]; then echo "$5" > "$store/$4"; echo "$4" >> "$store/.created"; fi\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    for _ in range(2):
        done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    stored = (tmp_path / "secrets" / "ioe-api-token").read_text().strip()
    token = stored.removeprefix("--from-literal=token=")
    assert len(token) == 64 and int(token, 16) >= 0
    assert (tmp_path / "secrets" / ".created").read_text().split() == ["ioe-api-token"]  # once


def test_compose_token_writer_writes_once_and_everyone_reads_it(tmp_path: Path) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    script = services["ioe-token"]["entrypoint"][2].replace("/run/ioe-token/token", str(tmp_path / "token"))
    script = script.replace("os.chown(path, 10001, 10001)", "pass")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    first = (tmp_path / "token").read_text()
    assert len(first.strip()) == 64
    sidecar = load_settings(DEPLOY / "compose" / "ioe-sidecar.yaml", environ={})
    for name in ("ioe", "vllm"):
        mounts = dict(v.split(":")[:2] for v in services[name]["volumes"])
        assert mounts["ioe-token"] == "/run/ioe-token"
        assert services[name]["depends_on"]["ioe-token"]["condition"] == "service_completed_successfully"
    assert sidecar.auth_token_file == "/run/ioe-token/token"
    assert "cat /run/ioe-token/token" in services["vllm"]["entrypoint"][2]
