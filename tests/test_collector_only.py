"""The collector-only agent (``api_enabled: false``): its three endpoints, its store, and what it
never loads — checked on a real ``ioe sidecar`` process scraping fixture bodies on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml

from collector.agent import open_store
from collector.health import HealthServer
from collector.selfmetrics import SelfMetrics, _MemoryCollector
from collector.store import SCHEMA_VERSION, Store, StoreError
from ioe import cli
from ioe.settings import Settings
from tests.conftest import DATA, free_port
from tests.httpfixtures import Route, serve, wait_until

FIX = DATA / "sidecar"
# mapped .so files
HEAVY = ("libarrow", "_multiarray_umath", "pandas/_libs", "_polars_runtime", "_pydantic_core", "libssl")
# packages a collector-only sidecar never imports (issue 24: 100 MB for the whole process)
NEVER = {
    "typer", "click", "pydantic", "pydantic_core", "pydantic_settings", "polars", "pyarrow", "pandas",
    "numpy", "fastapi", "starlette", "uvicorn", "analyzer", "api",
    # collector.selfmetrics renders its own text; no https target: no OpenSSL (ioe.sidecar rule 4;
    # `ssl` itself is a line of -X importtime as asyncio tries it, `_ssl` would follow its load)
    "prometheus_client", "_ssl",
    # DuckDB's engine module alone: the package around it is ~4 MB more (collector.engine)
    "duckdb",
}  # fmt: skip


def _stored(port: int) -> float:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("ioe_rows_stored_total")
    )


@pytest.mark.e2e
def test_collector_only_sidecar_serves_health_and_metrics_and_stores(tmp_path: Path) -> None:
    dcgm = serve({"/metrics": Route((FIX / "h100x8_k8s_pod_labels.prom").read_bytes())})
    vllm = serve({"/metrics": Route((FIX / "vllm_0.33.0_dp2.prom").read_bytes())})
    port = free_port()
    cfg = {
        "store_path": str(tmp_path / "node.duckdb"),
        "listen_port": port,
        "host": "node-a",
        "api_enabled": False,
        "flush_interval_s": 0.2,
        "maintenance_interval_s": 1.0,  # a maintenance pass runs too
        "readers": {"sysfs_infiniband": str(tmp_path / "no-ib")},
        "targets": [
            {"name": "dcgm", "url": dcgm.url(), "kind": "dcgm", "interval_s": 0.5},
            {"name": "vllm", "url": vllm.url(), "kind": "engine", "interval_s": 0.5},
        ],
    }
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = (tmp_path / "stderr").open("w+")
    # -X importtime: every module the process imports, at start-up or later, is a line on stderr
    cmd = [sys.executable, "-X", "importtime", "-m", "ioe", "sidecar", "--config", str(path)]
    proc = subprocess.Popen(cmd, stderr=log)
    try:
        wait_until(lambda: _stored(port) > 500, 60, "rows stored")
        time.sleep(2.5)  # maintenance passes (every second here) import what they need too
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready", "schema_version": SCHEMA_VERSION}
        metrics = httpx.get(f"{base}/metrics")
        assert metrics.headers["content-type"].startswith("text/plain; version=")
        assert 'ioe_target_up{kind="dcgm",target="dcgm"} 1.0' in metrics.text
        assert "ioe_process_resident_memory_bytes " in metrics.text
        assert 'ioe_store_memory_bytes{tag="' in metrics.text
        missing = httpx.get(f"{base}/api/v1/deployments")
        assert missing.status_code == 404 and "/healthz" in missing.json()["error"]
        assert httpx.post(f"{base}/v1/traces", content=b"x").status_code == 405
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        # no pyarrow, numpy, pandas or polars loaded (batches reach DuckDB through nanoarrow), and
        # no pydantic (the settings were validated in a child: ioeconf.plain)
        assert [lib for lib in HEAVY if lib in maps] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        dcgm.close()
        vllm.close()
        log.seek(0)
        err = log.read()
        log.close()
    assert proc.returncode == 0, err
    imported = {
        ln.rsplit("|", 1)[1].strip().split(".")[0] for ln in err.splitlines() if ln.startswith("import time:")
    }
    assert "collector" in imported and "_duckdb" in imported  # the record is complete
    assert sorted(NEVER & imported) == []
    with duckdb.connect(str(tmp_path / "node.duckdb"), read_only=True) as con:
        power = con.execute(
            "SELECT count(*), min(value), max(value) FROM gpu_samples "
            "WHERE metric = 'power_w' AND host = 'gpu-node-1'"
        ).fetchone()
        running = con.execute(
            "SELECT count(*) FROM engine_samples WHERE concept = 'requests_running'"
        ).fetchone()
    assert power is not None and power[0] >= 8 and 0 < power[1] <= power[2] < 1000
    assert running is not None and running[0] >= 2


def test_health_server_answers(tmp_path: Path) -> None:
    metrics = SelfMetrics()
    metrics.stored("gpu_samples", 3)
    broken = HealthServer("127.0.0.1", 0, [metrics.registry], lambda: 1 // 0)
    status, _, body = broken.answer("/readyz")
    assert status == 503 and b"by zero" in body
    server = HealthServer("127.0.0.1", 0, [metrics.registry], lambda: 7)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{base}/readyz?verbose=1").json()["schema_version"] == 7
        assert 'ioe_rows_stored_total{table="gpu_samples"} 3.0' in httpx.get(f"{base}/metrics").text
    finally:
        server.stop()
        broken.stop()


def test_health_server_sleeps_between_requests_and_stops_at_once() -> None:
    """Rule 5: no wake-up every half second, yet a stop (idle or just after a request) is prompt
    and frees the port, on a loopback and on an every-interface bind."""
    import socket
    import time

    from collector import health

    assert health.POLL_S >= 60
    for host in ("127.0.0.1", "0.0.0.0"):
        server = HealthServer(host, 0, [SelfMetrics().registry], lambda: 7)
        server.start()
        time.sleep(0.2)
        if host == "127.0.0.1":
            assert httpx.get(f"http://127.0.0.1:{server.port}/healthz").json() == {"status": "ok"}
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < 2.0 and not server._thread.is_alive()
        with socket.socket() as again:  # the port is free again
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind((host, server.port))


def test_memory_collector_reads_duckdb_and_proc_status(tmp_path: Path) -> None:
    status = "Name:\tioe\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    with Store(tmp_path / "s.duckdb") as st:
        got = {m.name: m for m in _MemoryCollector(st, status=lambda: status).collect()}
    assert got["ioe_process_resident_memory_bytes"].samples[0].value == 102400 * 1024
    assert got["ioe_process_peak_resident_memory_bytes"].samples[0].value == 204800 * 1024
    assert got["ioe_store_memory_bytes"].type == "gauge"


def test_cli_registers_only_the_invoked_command_module() -> None:
    code = textwrap.dedent(
        """
        import sys
        from ioe import cli
        cli._for_argv(["ioe", "sidecar", "--help"])
        print(sorted(cli._registered), "analyzer" in {m.split(".")[0] for m in sys.modules})
        cli._for_argv(["ioe", "ingest", "--help"])
        print(sorted(cli._registered))
        cli._for_argv(["ioe", "--help"])  # the listing comes from the command index: no module
        print(sorted(cli._registered))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "['sidecar'] False"
    assert out[1] == out[2] == "['sidecar', 'store_cmds']"
    names = {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups}
    assert {"sidecar", "serve", "ingest", "query", "analyze", "trace-report"} <= names


def test_store_writes_without_pyarrow_or_pandas(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        for name in ("pyarrow", "pandas", "numpy"):
            sys.modules[name] = None  # any import of them now fails
        from collector.records import frame
        from collector.store import Store
        rows = [{{"ts_ns": 1, "host": "h", "uuid": "GPU-1", "metric": "power_w", "link": -1, "value": 300.0}}]
        with Store({str(tmp_path / "s.duckdb")!r}) as st:
            print(*(st.write("gpu_samples", frame("gpu_samples", rows)) for _ in range(2)))
            print(st.count("gpu_samples"))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["1", "0", "1"]  # written once; the replay is ignored on the natural key


def test_collector_only_store_caps_duckdb_buffer_pool(tmp_path: Path) -> None:
    """Checkpointed blocks stay cached until DuckDB's pool is full: a collector caps it (32 MB by
    default, ``store_memory_limit`` to change); with the API the analysis queries keep DuckDB's."""

    def limit(**over: object) -> str:
        settings = Settings(
            store_path=str(tmp_path / f"{len(over)}-{over.get('api_enabled')}.duckdb"), **over
        )
        store = open_store(settings, threads=1)
        try:
            got = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
        finally:
            store.close()
        assert got is not None
        return str(got[0])

    assert limit(api_enabled=False) == "30.5 MiB"  # 32 MB
    assert limit(api_enabled=False, store_memory_limit="256MB") == "244.1 MiB"
    assert limit(api_enabled=True) not in ("30.5 MiB", "244.1 MiB")
    with pytest.raises(StoreError, match="cannot open"):
        Store(tmp_path / "bad.duckdb", memory_limit="64 potatoes")


def _sidecar(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ioe", "sidecar", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("config", "env"),
    [
        # a target's interval out of range and a key no model has: both named, with their origin
        ({"targets": [{"name": "t", "url": "http://127.0.0.1:1/m", "interval_s": 0}], "listen_prot": 1}, {}),
        ({"readers": {"nvml": "maybe"}, "deployments": [{"name": "bad name"}]}, {}),
        ({}, {"IOE_LISTEN_PORT": "99999"}),  # from the environment
        ("targets: [unclosed\n", {}),  # not YAML
    ],
)
def test_a_collector_refuses_bad_settings_as_strictly_as_before(
    config: dict[str, object] | str, env: dict[str, str], tmp_path: Path
) -> None:
    """The collector-only start validates in a child process (ioeconf.plain rule 1): exit 2 and the
    very message ``load_settings`` gives in process, nothing started."""
    from ioeconf.settings import SettingsError, load_settings

    path = tmp_path / "bad.yaml"
    base = {"api_enabled": False, "store_path": str(tmp_path / "s.duckdb"), "listen_port": 0}
    path.write_text(config if isinstance(config, str) else yaml.safe_dump({**base, **config}))
    with pytest.raises(SettingsError) as expected:
        load_settings(path, environ={**os.environ, **env})
    got = _sidecar(["--config", str(path)], env)
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip() == str(expected.value)
    assert not (tmp_path / "s.duckdb").exists()


def test_plain_settings_hold_every_validated_field(tmp_path: Path) -> None:
    """ioeconf.plain rule 2: every field of every model, the deployments' own JSON and the
    methods the agent calls, equal to the pydantic settings of the same file."""
    from ioeconf.plain import PlainSettings, validated
    from ioeconf.settings import load_settings

    cfg = {
        "api_enabled": False,
        "listen_host": "0.0.0.0",
        "targets": [{"name": "d", "url": "http://127.0.0.1:1/m", "kind": "dcgm", "interval_s": "2"}],
        "prometheus_sources": [{"url": "http://127.0.0.1:2", "follow": True, "headers": {"X-Org": "a"}}],
        "deployments": [{"name": "llama", "tp": 2, "roles": {"decode": 2}, "nodes": ["n1"]}],
        "readers": {"nvml": False, "interval_s": 5},
        "otlp": {"grpc_port": 4317},
        "analysis": {"bin_s": 30},
    }
    path = tmp_path / "ioe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    model = load_settings(path, args={"listen_port": 1234}, environ={})
    plain = PlainSettings(validated(path, {"listen_port": 1234}))

    def same(a: object, b: object) -> None:
        if hasattr(type(a), "model_fields"):
            for name in type(a).model_fields:  # type: ignore[attr-defined]
                same(getattr(a, name), getattr(b, name))
        elif isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            # an int default of a float field (not validated by pydantic) comes back a float
            assert a == b and (type(a) is type(b) or {type(a), type(b)} == {int, float}), (a, b)

    same(model, plain)
    assert plain.targets[0].interval_s == 2.0 and plain.listen_port == 1234
    assert plain.deployments[0].model_dump_json() == model.deployments[0].model_dump_json()
    assert plain.exposure_problem() == model.exposure_problem() is not None
    assert plain.token() == model.token() == ""
    with pytest.raises(AttributeError, match="no field"):
        _ = plain.not_a_setting


def test_the_sidecars_own_option_parsing_hands_the_rest_to_typer() -> None:
    """ioe.sidecar rule 1: the four options in either form; anything else is typer's."""
    from ioe.sidecar import parse

    assert parse(["--config", "a.yaml", "--port=9", "--store", "s.duckdb", "--listen=::1"]) == {
        "config": "a.yaml", "listen_port": 9, "store_path": "s.duckdb", "listen_host": "::1",
    }  # fmt: skip
    assert parse([]) == {}
    for args in (["--help"], ["-h"], ["--port", "x"], ["--config"], ["--config", "--port", "1"], ["x"]):
        assert parse(args) is None, args
    helped = _sidecar(["--help"])
    assert helped.returncode == 0 and "--config" in helped.stdout and "Usage:" in helped.stdout
    wrong = _sidecar(["--port", "nine"])
    assert wrong.returncode == 2 and "Invalid value for '--port'" in wrong.stderr


@pytest.mark.parametrize("api_enabled", [False, True])
def test_a_collector_checkpoints_after_each_maintenance_pass(api_enabled: bool, tmp_path: Path) -> None:
    """collector.agent.Agent._maintain: a collector-only agent hands what the pass rewrote and
    the rows appended since the last checkpoint to the file (its write-ahead log is emptied);
    with the API the WAL's own threshold decides, as before."""
    from collector.agent import Agent
    from collector.records import batch
    from collector.store import Retention

    store = tmp_path / "node.duckdb"
    agent = Agent(Settings(api_enabled=api_enabled, store_path=str(store), listen_port=0), readers=[])
    try:
        rows = [{"ts_ns": 10**18 + k, "host": "h", "uuid": "GPU-1", "metric": "power_w", "value": 1.0}
                for k in range(100)]  # fmt: skip
        agent.store.write("gpu_samples", batch("gpu_samples", rows))
        wal = Path(f"{store}.wal")
        assert wal.exists() and wal.stat().st_size > 0
        agent._maintain(Retention())
        assert (wal.exists() and wal.stat().st_size > 0) == api_enabled
    finally:
        agent.store.close()
