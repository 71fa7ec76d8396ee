"""`ioe serve` over the lake: the API answers for every node's data, a deployment spanning two nodes
is analyzed as one, and the answers equal the embedded store's on the same rows."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.app import create_app
from collector.lake import open_store
from collector.store import Store
from ioe.settings import Settings
from tests.gen_telemetry import Layout, generate
from tests.test_lake_fleet import lake, pg  # noqa: F401 - pytest fixtures

TWO_NODES = Layout(deployment="tp16", engines=1, gpus=16, hosts=("node-a", "node-b"))


def _answers(store: object, settings: Settings) -> tuple[dict, dict]:
    with TestClient(create_app(settings, store)) as client:
        detail = client.get("/api/v1/deployments/tp16").json()
        env = client.get("/api/v1/deployments/tp16/envelope").json()
    return detail, env


def test_a_deployment_spanning_two_nodes_is_one_deployment_on_the_lake(
    lake: dict[str, str],  # noqa: F811 - the imported fixture
    tmp_path,
) -> None:
    settings = Settings(store_backend="ducklake", lake_catalog_dsn=lake["dsn"], lake_data_path=lake["data"],
                        lake_spool_dir=lake["spool"], store_path=str(tmp_path / "unused.duckdb"))  # fmt: skip
    lake_store = open_store(settings)
    embedded = Store(":memory:")
    try:
        for st in (lake_store, embedded):
            generate(st, "network", TWO_NODES)
        lake_store.flush()
        with lake_store.cursor() as cur:
            hosts = cur.execute(
                "SELECT host, count(DISTINCT uuid) FROM gpu_samples GROUP BY 1 ORDER BY 1"
            ).fetchall()
        assert hosts == [("node-a", 8), ("node-b", 8)]
        lake_detail, lake_env = _answers(lake_store, settings)
        _, emb_env = _answers(embedded, Settings(store_path=":memory:"))
    finally:
        lake_store.close()
        embedded.close()
    dep = lake_detail["deployment"]
    assert dep["nodes"] == ["node-a", "node-b"] and dep["gpus"] == 16
    assert lake_env["envelope"]["primary"] == emb_env["envelope"]["primary"] == "network"
    values = lambda env: {(e["zone"], e["signal"]): e["value"] for e in env["envelope"]["evidence"]}  # noqa: E731
    assert values(lake_env) == values(emb_env)
