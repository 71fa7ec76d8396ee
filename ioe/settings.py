"""The settings object: defined in :mod:`ioeconf.settings` (below every layer, so the collector
and the API can take it without importing ``ioe``), re-exported here for compatibility."""

from ioeconf.settings import (
    ENV_PREFIX,
    DeploymentSpec,
    NodeReaders,
    OtlpSettings,
    PrometheusSourceSpec,
    Settings,
    SettingsError,
    TargetSpec,
    analysis_origins,
    env_overrides,
    load_settings,
    read_config_file,
)

__all__ = [
    "ENV_PREFIX",
    "DeploymentSpec",
    "NodeReaders",
    "OtlpSettings",
    "PrometheusSourceSpec",
    "Settings",
    "SettingsError",
    "TargetSpec",
    "analysis_origins",
    "env_overrides",
    "load_settings",
    "read_config_file",
]
