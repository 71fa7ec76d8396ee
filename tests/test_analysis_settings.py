"""The analysis settings: one object from config, environment and flags, shown by --explain."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.thresholds import Thresholds
from ioe.cli import app
from ioe.settings import Settings, load_settings


def _explain(args: list[str], env: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    res = CliRunner().invoke(app, ["analyze", "--explain", *args], env=env)
    assert res.exit_code == 0, res.output
    out = {}
    for line in res.output.splitlines():
        name, _, rest = line.partition(" = ")
        value, _, origin = rest.partition("  (")
        out[name] = (value, origin.rstrip(")"))
    return out


def test_explain_names_the_origin_of_each_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "ioe.yaml"
    cfg.write_text("analysis:\n  bin_s: 30\n  zone_min_score: 0.65\n")
    got = _explain(
        ["--config", str(cfg), "--set", "zone_min_score=0.7"], env={"IOE_ANALYSIS__NEAR_FRACTION": "0.8"}
    )
    assert got["bin_s"] == ("30.0", f"config {cfg}")
    assert got["zone_min_score"] == ("0.7", "argument --set")
    assert got["near_fraction"] == ("0.8", "environment IOE_ANALYSIS__NEAR_FRACTION")
    assert got["kv_usage_min_ratio"] == ("0.9", "default")
    assert set(got) == set(Thresholds.model_fields)


@pytest.mark.parametrize(("item", "needle"), [("bogus=1", "analysis.bogus"), ("bin_s=-1", "analysis.bin_s"),
                                             ("bin_s", "expected FIELD=VALUE")])  # fmt: skip
def test_a_bad_setting_is_one_line_and_exit_2(item: str, needle: str) -> None:
    res = CliRunner().invoke(app, ["analyze", "--explain", "--set", item])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0]


def test_the_server_settings_carry_the_same_analysis_block(tmp_path: Path) -> None:
    cfg = tmp_path / "ioe.yaml"
    cfg.write_text("analysis:\n  bin_s: 15\n  regression_baseline: previous_window\n")
    s = load_settings(cfg, environ={})
    assert isinstance(s, Settings) and s.thresholds().bin_s == 15.0
    assert s.thresholds().regression_baseline == "previous_window"
