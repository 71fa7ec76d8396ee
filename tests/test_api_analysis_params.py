"""Analysis settings per API request: every threshold as a query parameter of the envelope and the
deployment list, validated over the server's settings, never served from the refresher's snapshot,
and the same verdict as the CLI's ``--set`` under the same values.

The store is :mod:`api_store` (SYNTHETIC, deterministic): ``llama70b`` is built KV-bound (pool
full, requests waiting and preempted), so its zone is ``kv_capacity`` at the default thresholds,
with ``hbm_bandwidth`` second (decode reads HBM). Raising the four KV thresholds past anything the
store holds (usage 0.99, waiting/running 50, queue share 1.0, 100 preemptions/s) leaves the KV
checks failing, so the verdict must move to the HBM wall: an override that does not reach the
analysis cannot pass this test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_store import END_NS, NS, build
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from analyzer.thresholds import Thresholds
from api.app import create_app
from collector.store import Store
from ioe.cli import app as cli
from ioe.settings import Settings

BASE = "/api/v1/deployments/llama70b/envelope"
HOUR = 3600.0
STRICT_KV = {"kv_usage_min_ratio": 0.99, "kv_waiting_min_ratio": 50, "kv_queue_share_min_ratio": 1.0,
             "kv_preemptions_min_per_s": 100}  # fmt: skip
QUERY = "&".join(f"{k}={v}" for k, v in STRICT_KV.items())


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("settings") / "store.duckdb"
    build(str(path)).close()
    return path


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = (
        build()
    )  # deterministic: the same data as the file the CLI reads (which one process cannot open twice)
    yield st
    st.close()


@pytest.fixture(scope="module")
def served(store: Store) -> Iterator[tuple[TestClient, Any]]:
    """An app as ``ioe serve`` builds it, with a refresher holding the default window's snapshot."""
    app = create_app(Settings(store_path=":memory:"), store, refresh_s=HOUR)
    with TestClient(app) as c:
        app.state.refresher.refresh_once()
        yield c, app


def _zone(body: dict[str, Any]) -> tuple[str, float, dict[str, float | None]]:
    e = body["envelope"]
    return e["primary"], e["confidence"], e["scores"]


def test_a_request_setting_reaches_the_verdict_and_is_reported(served: tuple[TestClient, Any]) -> None:
    c, _ = served
    default = c.get(BASE).json()
    assert default["envelope"]["primary"] == "kv_capacity"
    assert default["settings_from_request"] == [] and default["settings"] == Thresholds().model_dump()
    got = c.get(f"{BASE}?{QUERY}")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["envelope"]["primary"] == "hbm_bandwidth"
    assert body["settings_from_request"] == sorted(STRICT_KV)
    assert {k: body["settings"][k] for k in STRICT_KV} == STRICT_KV
    assert body["settings"]["bin_s"] == Thresholds().bin_s  # the rest: the server's


def test_a_request_setting_bypasses_the_snapshot(served: tuple[TestClient, Any]) -> None:
    c, app = served
    snap = c.get(BASE)
    assert "age" in snap.headers  # the default request is the refresher's snapshot
    before = app.state.cache.computed
    got = c.get(f"{BASE}?bin_s=30")
    assert got.status_code == 200 and "age" not in got.headers
    assert app.state.cache.computed > before  # computed for this request
    assert got.json()["settings"]["bin_s"] == 30.0 and snap.json()["settings"]["bin_s"] == 60.0
    again = c.get(f"{BASE}?bin_s=30")
    assert again.content == got.content  # cached under its own key


def test_the_server_settings_are_the_base_the_request_overrides(store: Store) -> None:
    """A server configured with strict KV thresholds answers hbm_bandwidth; a request restoring
    the default KV usage threshold alone does not bring KV back (three KV checks still fail
    their strict values), while restoring all four does."""
    settings = Settings(store_path=":memory:", analysis=STRICT_KV)
    with TestClient(create_app(settings, store)) as c:
        assert _zone(c.get(BASE).json())[0] == "hbm_bandwidth"
        one = c.get(f"{BASE}?kv_usage_min_ratio=0.9").json()
        assert one["settings"]["kv_waiting_min_ratio"] == 50 and one["settings_from_request"] == [
            "kv_usage_min_ratio"
        ]
        defaults = "&".join(f"{k}={getattr(Thresholds(), k)}" for k in STRICT_KV)
        assert _zone(c.get(f"{BASE}?{defaults}").json())[0] == "kv_capacity"


def test_api_and_cli_agree_under_the_same_settings(served: tuple[TestClient, Any], store_file: Path) -> None:
    c, _ = served
    api = c.get(f"{BASE}?{QUERY}&window=15m&at={END_NS / NS}").json()
    sets = [x for k, v in STRICT_KV.items() for x in ("--set", f"{k}={v}")]
    res = CliRunner().invoke(cli, ["analyze", "--store", str(store_file), "--deployment", "llama70b",
                                   "--at", str(END_NS / NS), "--json", *sets])  # fmt: skip
    assert res.exit_code == 0, res.output
    (dep,) = json.loads(res.output)["deployments"]
    primary, confidence, scores = _zone(api)
    assert (dep["envelope"]["primary"], dep["envelope"]["scores"]) == (primary, scores)
    assert dep["envelope"]["confidence"] == pytest.approx(confidence)


def test_the_deployment_list_takes_the_same_settings(served: tuple[TestClient, Any]) -> None:
    c, _ = served
    (row,) = c.get(f"/api/v1/deployments?{QUERY}").json()["deployments"]
    assert row["glance"]["zone"] == "hbm_bandwidth"
    (plain,) = c.get("/api/v1/deployments").json()["deployments"]
    assert plain["glance"]["zone"] == "kv_capacity"


@pytest.mark.parametrize(
    ("query", "status", "parameter", "needle"),
    [
        ("bin_s=0.5", 422, "bin_s", "greater than or equal to 1"),
        ("zone_min_score=1.5", 422, "zone_min_score", "less than or equal to 1"),
        ("near_fraction=inf", 422, "near_fraction", "finite"),
        ("regression_baseline=bogus", 422, "regression_baseline", "pattern"),
        ("regression_baseline=reference", 400, "regression_baseline", "regression_reference_start_s"),
        ("regression_reference_start_s=5", 400, "regression_reference_start_s", "set regression_baseline"),
        ("bin_s=30&bin_s=60", 400, "bin_s", "given 2 times"),
        ("bin_s=abc", 422, "bin_s", "valid number"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(
    served: tuple[TestClient, Any], query: str, status: int, parameter: str, needle: str
) -> None:
    c, _ = served
    for path in (BASE, "/api/v1/deployments"):
        r = c.get(f"{path}?{query}")
        assert r.status_code == status, r.text
        detail = r.json()["detail"]
        if status == 400:
            assert detail["parameter"] == parameter and needle in detail["message"]
        else:
            assert detail[0]["loc"] == ["query", parameter] and needle in detail[0]["msg"]


def test_the_schema_lists_every_setting(served: tuple[TestClient, Any]) -> None:
    c, _ = served
    paths = c.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/deployments/{name}/envelope", "/api/v1/deployments"):
        names = {p["name"] for p in paths[path]["get"]["parameters"] if p["in"] == "query"}
        assert set(Thresholds.model_fields) <= names, path
