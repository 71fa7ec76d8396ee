"""Settings: argument > IOE_* environment > config file > default, errors name the field."""

from __future__ import annotations

import pytest

from ioe.settings import SettingsError, load_settings


def test_precedence(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("store_path: from-file.duckdb\nlisten_port: 1111\nflush_interval_s: 3\n")
    env = {"IOE_LISTEN_PORT": "2222", "IOE_OTLP__GRPC_PORT": "4317"}
    s = load_settings(cfg, args={"listen_port": 3333, "store_path": None}, environ=env)
    assert s.listen_port == 3333
    assert s.store_path == "from-file.duckdb"
    assert s.otlp.grpc_port == 4317
    assert s.flush_interval_s == 3.0


def test_toml_config_with_targets(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[targets]]\nname = "dcgm"\nurl = "http://127.0.0.1:9400/metrics"\ninterval_s = 5\n')
    s = load_settings(cfg, environ={})
    assert s.targets[0].name == "dcgm" and s.targets[0].interval_s == 5.0


def test_bad_value_names_field(tmp_path) -> None:
    with pytest.raises(SettingsError, match=r"listen_port.*IOE_LISTEN_PORT"):
        load_settings(environ={"IOE_LISTEN_PORT": "99999"})


def test_duplicate_target_names(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("targets:\n- {name: a, url: 'http://x/m'}\n- {name: a, url: 'http://y/m'}\n")
    with pytest.raises(SettingsError, match="repeated"):
        load_settings(cfg, environ={})


def test_unreadable_and_malformed_config(tmp_path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [unclosed\n")
    with pytest.raises(SettingsError, match="not valid"):
        load_settings(bad, environ={})
