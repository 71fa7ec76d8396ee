"""The one settings object, built once at start-up.

Precedence: command-line argument > ``IOE_*`` environment variable > config file > default.
Nested fields are reached with ``__`` in the environment (``IOE_OTLP__GRPC_PORT=0``). Every
value is validated, and a bad one raises :class:`SettingsError` naming the field and where the
value came from.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ioeconf.plain import SettingsError, exposure_problem, token
from ioeconf.promql import DEFAULT_SELECTORS, matchers

if TYPE_CHECKING:
    from ioeconf.thresholds import Thresholds

ENV_PREFIX = "IOE_"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TargetSpec(_Model):
    """One HTTP endpoint the sidecar scrapes."""

    name: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://")
    kind: Literal["dcgm", "engine", "auto"] = "auto"
    interval_s: float = Field(default=1.0, gt=0, le=3600)
    timeout_s: float = Field(default=2.0, gt=0, le=600)
    host: str = ""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)


class PrometheusSourceSpec(_Model):
    """A Prometheus, Thanos or Mimir HTTP API read as a source (collector.sources.prometheus_api).

    ``follow: true`` makes the sidecar poll the newest range every ``interval_s``; ``ioe
    backfill`` reads a past range with the same settings."""

    name: str = Field(default="prometheus", min_length=1)
    url: str = Field(pattern=r"^https?://")
    selectors: list[str] = Field(default_factory=lambda: list(DEFAULT_SELECTORS), min_length=1)
    step_s: float = Field(default=15.0, ge=0.001, le=86400)
    follow: bool = False
    interval_s: float = Field(default=30.0, gt=0, le=86400)
    since_s: float = Field(default=300.0, ge=0)  # how far back the first poll of follow mode reads
    lag_s: float | None = Field(default=None, ge=0)  # default: one step
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    bearer_token: str = ""
    bearer_token_file: str = ""
    basic_user: str = ""
    basic_password: str = ""
    basic_password_file: str = ""
    ca_file: str = ""
    tls_verify: bool = True
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. {"X-Scope-OrgID": "tenant"} for Mimir
    drop_labels: list[str] = Field(default_factory=lambda: ["job", "instance"])
    source_label: str = Field(default="instance", min_length=1)
    host_label: str = "host"
    host: str = ""
    max_samples: int = Field(default=250_000, ge=1000)

    @field_validator("selectors")
    @classmethod
    def _selectors_parse(cls, v: list[str]) -> list[str]:
        for selector in v:
            matchers(selector)  # ValueError quoting the selector
        return v

    @field_validator("ca_file", "bearer_token_file", "basic_password_file")
    @classmethod
    def _file_exists(cls, v: str) -> str:
        if v and not Path(v).is_file():
            raise ValueError(f"no such file: {v}")
        return v


class DeploymentSpec(_Model):
    """A deployment as the operator declares it: model, GPU, layout, roles, nodes and fabric."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    model: str = ""
    gpu_type: str = ""
    engine: str = ""
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    roles: dict[str, int] = Field(default_factory=dict)
    nodes: list[str] = Field(default_factory=list)
    fabric: str = ""
    targets: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)
    ttft_slo_s: float | None = Field(default=None, gt=0)
    itl_slo_s: float | None = Field(default=None, gt=0)


class OtlpSettings(_Model):
    http_enabled: bool = True
    grpc_port: int = Field(default=0, ge=0, le=65535)  # 0: no gRPC receiver
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)


class NodeReaders(_Model):
    nvml: bool = True
    dcgm: bool = True
    infiniband: bool = True
    interval_s: float = Field(default=1.0, gt=0)
    sysfs_infiniband: str = "/sys/class/infiniband"


class Settings(_Model):
    """Everything a command needs; built by :func:`load_settings`."""

    store_path: str = "ioe.duckdb"
    store_backend: Literal["duckdb", "ducklake"] = "duckdb"
    lake_catalog_dsn: str = ""  # e.g. "dbname=ioe host=127.0.0.1 port=5432 user=ioe"
    lake_data_path: str = ""  # local/shared directory, or s3://… where httpfs is deployed
    lake_spool_dir: str = ""  # local spool for rows not yet committed to the lake
    lake_commit_interval_s: float = Field(default=5.0, gt=0)
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=9477, ge=0, le=65535)
    # the REST API, the page and the OTLP/HTTP receiver on listen_port, refreshed every 15 s.
    # false: a collector-only agent that answers just /healthz, /readyz and /metrics there and
    # never imports the web stack, pyarrow or pandas: ~190 MB peak instead of ~325 and about half
    # the CPU (bench/results/sidecar.md); query its store with `ioe query` or over DuckLake.
    api_enabled: bool = True
    host: str = Field(default_factory=lambda: os.uname().nodename)
    targets: list[TargetSpec] = Field(default_factory=list)
    # Prometheus-compatible APIs read as sources; those with follow: true are polled by the sidecar
    prometheus_sources: list[PrometheusSourceSpec] = Field(default_factory=list)
    deployments: list[DeploymentSpec] = Field(default_factory=list)
    readers: NodeReaders = Field(default_factory=NodeReaders)
    otlp: OtlpSettings = Field(default_factory=OtlpSettings)
    nccl_inspector_dir: str = ""
    raw_retention_s: float = Field(default=2 * 86400, gt=0)
    rollup_retention_s: float = Field(default=30 * 86400, gt=0)
    # seconds between store maintenance passes (rollups, retention, packing). Unset: 60 with the API
    # (and for `ioe serve`), 300 for a collector-only sidecar, where each pass rolls up the two
    # minutes before the last pass again and then checkpoints: per minute, 60 s passes cost it ~3
    # ms of a core a second, 300 s passes ~0.8 (collector.agent.maintenance_interval_s)
    maintenance_interval_s: float | None = Field(default=None, gt=0)
    # the writer inserts each table once per flush: 5 s costs a sidecar ~40 % less CPU than 1 s,
    # 10 s another ~20 % less than 5 s, 30 s another ~20-30 % of the writes' CPU less than 10 s
    # (bench/results/sidecar.md); rows become queryable that much later (the sidecar's own /metrics
    # are live), and a crash (SIGKILL, OOM kill, power loss) loses up to this many seconds of rows
    # accepted and not yet flushed; a clean stop (SIGTERM, SIGINT) flushes them first. Unset: 10
    # with the API, 30 for a collector-only sidecar (collector.agent.flush_interval_s). The writer
    # also flushes once half of queue_max_batches is waiting.
    flush_interval_s: float | None = Field(default=None, gt=0)
    # DuckDB's buffer pool cap for the sidecar's store ("64MB", "1GB"). Blocks written by each
    # checkpoint stay cached until the pool is full: a collector grew ~1 MB a minute with DuckDB's
    # default (80 % of RAM). Empty: 32MB when api_enabled is false, DuckDB's default with the API
    # (its analysis queries need room; DuckDB spills past the cap where it can).
    store_memory_limit: str = ""
    # batches waiting for the writer: ~3 per target scrape, so 1024 holds 10 s of ~30 targets at 1 Hz
    queue_max_batches: int = Field(default=1024, gt=0)
    # With a token (or a file holding it), every route but /healthz, /readyz and /metrics needs it,
    # over HTTP and gRPC (api/auth.py). Listening beyond loopback without one is refused unless
    # allow_unauthenticated is true.
    auth_token: str = ""
    auth_token_file: str = ""
    allow_unauthenticated: bool = False
    # Kept so older config files still load: reads always need the token when one is set.
    require_token_for_reads: bool = True
    # The analysis settings every surface uses (thresholds, bin size, baseline mode): the
    # `analysis:` block, IOE_ANALYSIS__<FIELD>, and `ioe analyze --set field=value`; the fields
    # of ioeconf.thresholds.Thresholds (analyzer.thresholds re-exports it), validated against it
    # (imported only when the block is set).
    analysis: dict[str, Any] = Field(default_factory=dict)

    @field_validator("analysis")
    @classmethod
    def _valid_analysis(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v:
            from ioeconf.thresholds import Thresholds

            try:
                Thresholds.model_validate(v)
            except ValidationError as exc:
                raise ValueError(
                    "; ".join(
                        f"{'.'.join(['analysis', *map(str, e['loc'])])}: {e['msg']} (got {e.get('input')!r})"
                        for e in exc.errors()
                    )
                ) from None
        return v

    def thresholds(self) -> Thresholds:
        """The analysis settings as the analyzer's :class:`~analyzer.thresholds.Thresholds`."""
        from ioeconf.thresholds import Thresholds

        return Thresholds.model_validate(self.analysis)

    @field_validator("targets")
    @classmethod
    def _unique_targets(cls, v: list[TargetSpec]) -> list[TargetSpec]:
        _refuse_repeats("target names", [t.name for t in v])
        return v

    @field_validator("prometheus_sources")
    @classmethod
    def _unique_prometheus(cls, v: list[PrometheusSourceSpec]) -> list[PrometheusSourceSpec]:
        _refuse_repeats("prometheus_sources names", [p.name for p in v])
        return v

    def exposure_problem(self) -> str | None:
        """Why serving on ``listen_host`` (HTTP and OTLP/gRPC) is refused, or ``None``: beyond
        loopback a server needs a token unless ``allow_unauthenticated`` is set."""
        return exposure_problem(
            self.listen_host, self.auth_token, self.auth_token_file, self.allow_unauthenticated
        )

    def token(self) -> str:
        """The bearer token: the file's content when a file is named, else ``auth_token``."""
        return token(self.auth_token, self.auth_token_file)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) config file into a mapping."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SettingsError(f"config file {p}: cannot read ({exc.strerror})") from exc
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"config file {p}: not valid {p.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {p}: top level must be a mapping, got {type(data).__name__}")
    return data


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``IOE_A__B=v`` → ``{"a": {"b": v}}``; values that parse as JSON are taken as JSON."""
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key == "IOE_CONFIG":
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _env_value(raw)
    return out


def _env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def analysis_origins(
    config: str | Path | None, environ: Mapping[str, str] | None = None, sets: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Where each analysis setting in force came from: argument, environment, config or default."""
    env = dict(os.environ if environ is None else environ)
    config = config or env.get("IOE_CONFIG") or None
    block = (read_config_file(config).get("analysis") or {}) if config else {}
    from_env = env_overrides(env).get("analysis") or {}
    out = {}
    from ioeconf.thresholds import Thresholds

    for name in Thresholds.model_fields:
        if sets and name in sets:
            out[name] = "argument --set"
        elif name in from_env:
            out[name] = f"environment {ENV_PREFIX}ANALYSIS__{name.upper()}"
        elif isinstance(block, dict) and name in block:
            out[name] = f"config {config}"
        else:
            out[name] = "default"
    return out


def load_settings(
    config: str | Path | None = None,
    *,
    args: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings: defaults < config file < ``IOE_*`` environment < arguments.

    ``args`` holds only the options the user actually gave (None values are ignored).
    """
    env = dict(os.environ if environ is None else environ)
    config = config or env.get("IOE_CONFIG") or None
    data: dict[str, Any] = read_config_file(config) if config else {}
    data = _merge(data, env_overrides(env))
    data = _merge(data, {k: v for k, v in (args or {}).items() if v is not None})
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, config)) from exc


def _describe(exc: ValidationError, config: str | Path | None) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(x) for x in err["loc"]) or "(root)"
        env_name = ENV_PREFIX + "__".join(str(x) for x in err["loc"] if isinstance(x, str)).upper()
        parts.append(
            f"{field}: {err['msg']} (got {err.get('input')!r}; set by arguments, {env_name} or config)"
        )
    origin = f" in {config}" if config else ""
    return f"invalid settings{origin}: " + "; ".join(parts)


def _refuse_repeats(what: str, names: list[str]) -> None:
    """ValueError listing the names that occur more than once."""
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what} must be unique, repeated: {dup}")
