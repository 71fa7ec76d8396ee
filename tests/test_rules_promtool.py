"""IOE's Prometheus rules: promtool accepts them, their unit tests pass, every alert is complete and tested
both firing and quiet, every runbook exists, and the Kubernetes PrometheusRule is the same rule file."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, require_component

from dashboards import prometheus_rule

RULES_DIR = ROOT / "dashboards" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks"


def _alerts() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in prometheus_rule.load_groups(path)
        for rule in group["rules"]
        if "alert" in rule
    ]


def _alert_cases() -> list[dict[str, Any]]:
    cases = []
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_component("promtool")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, check=False)


def test_rule_files_exist() -> None:
    assert [p.name for p in RULE_FILES] == ["ioe.rules.yml"]
    assert len(TEST_FILES) >= 3


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 39 rules found" in done.stdout


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(path: Path) -> None:
    done = _promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_test_rules_fails_on_wrong_expectation(tmp_path: Path) -> None:
    """The harness can fail: a case expecting a quiet straggler alert while rank 2 straggles is refused."""
    case = {
        "rule_files": [str(RULES_DIR / "ioe.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'ioe_straggler{deployment="d",rank="2",host="h",gpu="2"}', "values": "1x40"}
                ],
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "IOEPersistentStraggler", "exp_alerts": []}
                ],
            }
        ],
    }
    path = tmp_path / "wrong.yml"
    path.write_text(yaml.safe_dump(case))
    done = _promtool("test", "rules", str(path))
    assert done.returncode != 0
    assert "IOEPersistentStraggler" in done.stdout + done.stderr


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_is_complete(alert: dict[str, Any]) -> None:
    """Every alert waits (`for:`), has a severity, and its three annotations; the runbook page exists."""
    assert alert.get("for"), alert["alert"]
    assert alert["labels"]["severity"] in {"warning", "critical"}
    notes = alert["annotations"]
    assert {"summary", "description", "runbook_url"} <= set(notes)
    page = notes["runbook_url"].rsplit("/docs/runbooks/", 1)[1]
    assert page == f"{alert['alert']}.md"
    text = (RUNBOOKS / page).read_text()
    for heading in ("## What it means", "## How to check", "## What to do"):
        assert heading in text, f"{page} lacks {heading!r}"


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_tested_firing_and_quiet(alert: dict[str, Any]) -> None:
    cases = [c for c in _alert_cases() if c["alertname"] == alert["alert"]]
    assert any(c.get("exp_alerts") for c in cases), f"{alert['alert']}: no firing case"
    assert any(not c.get("exp_alerts") for c in cases), f"{alert['alert']}: no quiet case"


def test_prometheus_rule_manifest_matches_rule_file() -> None:
    committed = yaml.safe_load(prometheus_rule.MANIFEST.read_text())
    assert committed["kind"] == "PrometheusRule"
    assert committed["spec"]["groups"] == prometheus_rule.load_groups(RULES_DIR / "ioe.rules.yml")
    assert prometheus_rule.MANIFEST.read_text() == prometheus_rule.render()


def test_load_groups_rejects_file_without_groups(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("rules: []\n")
    with pytest.raises(prometheus_rule.RuleFileError, match=r"bad\.yml: expected a top-level 'groups' list"):
        prometheus_rule.load_groups(bad)
