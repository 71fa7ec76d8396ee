"""The API on a real uvicorn bound to 127.0.0.1, and schemathesis against its live OpenAPI."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from api_store import build
from conftest import free_port

from api.app import create_app
from ioe.settings import Settings


class Served:
    """uvicorn in a thread on 127.0.0.1; stops itself when the test ends."""

    def __init__(self, app: object, port: int):
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")  # type: ignore[arg-type]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start within 10 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    st = build()
    with Served(create_app(Settings(store_path=":memory:"), st), free_port()) as s:
        yield s
    st.close()


def test_real_server_answers_on_loopback(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json()["schema_version"] >= 1
        body = c.get("/api/v1/deployments/llama70b/envelope?window=15m").json()
        assert body["envelope"]["primary"] == "kv_capacity"
        assert "ioe_deployment_zone{" in c.get("/metrics").text
        page = c.get("/")
        assert page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
        assert c.get("/static/../app.py").status_code == 404
    sockets = served.server.servers[0].sockets
    assert {s.getsockname()[0] for s in sockets} == {"127.0.0.1"}


def test_openapi_documents_every_route_with_a_response_model(served: Served) -> None:
    spec = httpx.get(f"{served.url}/openapi.json", timeout=10).json()
    v1 = {p: ops for p, ops in spec["paths"].items() if p.startswith("/api/v1")}
    assert len(v1) == 13  # phases added (issue 19)
    for path, ops in v1.items():
        for method, op in ops.items():
            ok = op["responses"]["200"]["content"]["application/json"]["schema"]
            assert ok, f"{method} {path} has no response schema"
            assert op.get("summary") and op.get("description"), f"{method} {path} is undocumented"
            assert "400" in op["responses"] and "404" in op["responses"]
