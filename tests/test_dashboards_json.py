"""The committed dashboard JSON: up to date with the generator, and structurally sound."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dashboards import build
from dashboards.grafana_model import DATASOURCE

BOARDS = sorted(build.OUT_DIR.glob("*.json"))
EXPECTED = {
    "fleet-overview.json",
    "deployment-drilldown.json",
    "gpu-fabric.json",
    "collectives-stragglers.json",
}


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_committed_json_is_what_the_generator_builds() -> None:
    assert {p.name for p in BOARDS} == EXPECTED
    assert build.stale() == [], "run `python -m dashboards.build` and commit dashboards/grafana/"


def test_stale_detects_an_edited_file(tmp_path: Path) -> None:
    for name, text in build.built().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "gpu-fabric.json").write_text("{}\n")
    assert build.stale(tmp_path) == ["gpu-fabric.json"]


def test_uids_unique() -> None:
    uids = [_load(p)["uid"] for p in BOARDS]
    assert sorted(uids) == ["ioe-collectives", "ioe-deployment", "ioe-fleet", "ioe-gpu-fabric"]


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_panels_have_targets_and_datasource(path: Path) -> None:
    board = _load(path)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 6
    for panel in board["panels"]:
        assert panel["targets"], f"{panel['title']} has no targets"
        assert panel["datasource"] == DATASOURCE
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip()
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_template_variables_defined_and_used(path: Path) -> None:
    board = _load(path)
    defined = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in defined
    text = "\n".join(_exprs(board) + [v.get("definition", "") for v in board["templating"]["list"]])
    used = set(re.findall(r"\$\{?(\w+)", text)) - {"__rate_interval"}
    assert used <= defined, f"undefined variables {used - defined}"
    queries = defined - {"datasource"}
    assert queries <= set(re.findall(r"\$\{?(\w+)", "\n".join(_exprs(board)))), "a variable no panel uses"


def test_dashboards_use_ioe_dcgm_and_every_engine_family() -> None:
    text = "\n".join(e for p in BOARDS for e in _exprs(_load(p)))
    metrics = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
    verdicts = set(re.findall(r"`(ioe_deployment_\w+|ioe_straggler\w*)`", metrics.read_text()))
    used = {v for v in verdicts if re.search(rf"\b{v}\b", text)}
    assert len(used) >= 12, sorted(verdicts - used)
    for family in ("vllm:", "sglang:", "trtllm_", "DCGM_FI_PROF_", "DCGM_FI_DEV_", "node_infiniband_"):
        assert family in text
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES" in text and "DCGM_FI_PROF_SM_ACTIVE" in text
