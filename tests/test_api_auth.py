"""One auth rule: with a token set, every route but /healthz, /readyz, /metrics (and /login) needs it,
over HTTP and gRPC; a server refuses to listen beyond loopback without one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from api_store import build
from fastapi.testclient import TestClient
from otlp_engine_spans import to_protobuf, vllm_spans

from api.app import create_app
from collector.sources.otlp_grpc import SERVICE, start_grpc_receiver
from collector.store import Store
from ioe.settings import Settings

TOKEN = "t0ken-for-the-auth-tests"
BEARER = {"authorization": f"Bearer {TOKEN}"}
OPEN = {"/healthz", "/readyz", "/metrics", "/login"}


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = build()
    yield st
    st.close()


@pytest.fixture(scope="module")
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(store_path=":memory:", auth_token=TOKEN), store)) as c:
        yield c


def _concrete(path: str) -> str:
    return path.replace("{name}", "llama70b").replace("{asset}", "app.js")


def _routes(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, from its OpenAPI schema and its hidden routes."""
    schema = client.get("/openapi.json", headers=BEARER).json()
    out = [(m.upper(), _concrete(p)) for p, ops in schema["paths"].items() for m in ops]
    hidden = ["/", "/deployments/{name}", "/static/{asset}", "/docs", "/redoc", "/openapi.json", "/metrics",
              "/healthz", "/readyz"]  # fmt: skip
    return out + [("GET", _concrete(p)) for p in hidden]


def test_every_route_but_probes_and_metrics_needs_the_token(client: TestClient) -> None:
    routes = _routes(client)
    assert ("GET", "/api/v1/deployments") in routes and ("POST", "/api/v1/query") in routes
    assert ("GET", "/docs") in routes and ("GET", "/openapi.json") in routes
    for method, path in routes:
        r = client.request(method, path, json={"sql": "SELECT 1"} if method == "POST" else None)
        if path in OPEN:
            assert r.status_code not in (401, 403), (method, path)
        else:
            assert r.status_code == 401, (method, path, r.status_code)
    assert client.get("/api/v1/deployments", headers={"authorization": "Bearer nope"}).status_code == 401
    assert client.get("/api/v1/deployments", headers=BEARER).status_code == 200
    assert client.get("/openapi.json", headers=BEARER).status_code == 200


def test_the_page_asks_for_the_token_and_a_login_cookie_opens_reads_only(client: TestClient) -> None:
    page = client.get("/deployments/llama70b")
    assert page.status_code == 401 and "<form" in page.text and 'action="/login"' in page.text
    wrong = client.post("/login", content=b"token=nope&next=/", follow_redirects=False,
                        headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert wrong.status_code == 401 and "Wrong token" in wrong.text
    form = f"token={TOKEN}&next=/deployments/llama70b".encode()
    ok = client.post("/login", content=form, follow_redirects=False,
                     headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert ok.status_code == 303 and ok.headers["location"] == "/deployments/llama70b"
    cookie = ok.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    jar = {"ioe_token": TOKEN}
    assert client.get("/", cookies=jar).status_code == 200
    assert client.get("/api/v1/deployments", cookies=jar).status_code == 200
    # a request that submits something needs the header: a cookie alone is no credential there
    assert client.post("/api/v1/query", json={"sql": "SELECT 1"}, cookies=jar).status_code == 401
    client.cookies.clear()


def test_login_never_redirects_off_the_server(client: TestClient) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil"):
        r = client.post("/login", content=f"token={TOKEN}&next={target}".encode(), follow_redirects=False,
                        headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert r.status_code == 303 and r.headers["location"] == "/"
    client.cookies.clear()


def test_an_unreadable_token_file_fails_closed(store: Store, tmp_path: Path) -> None:
    settings = Settings(store_path=":memory:", auth_token_file=str(tmp_path / "missing"))
    with TestClient(create_app(settings, store)) as c:
        assert c.get("/api/v1/deployments", headers=BEARER).status_code == 503
        assert c.get("/healthz").status_code == 200


def test_grpc_spans_need_the_token(tmp_path: Path) -> None:
    store = Store(":memory:")
    handle = start_grpc_receiver(store, port=0, token=lambda: TOKEN)
    body = to_protobuf(vllm_spans(2))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            export = channel.unary_unary(f"/{SERVICE}/Export")
            for metadata in (None, (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)):
                with pytest.raises(grpc.RpcError) as err:
                    export(body, timeout=5, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert store.count("request_spans") == 0
            export(body, timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert store.count("request_spans") == 2
    finally:
        handle.stop(0)
        store.close()


@pytest.mark.parametrize("command", ["serve", "sidecar"])
def test_no_token_beyond_loopback_refuses_to_start(command: str, tmp_path: Path) -> None:
    args = [sys.executable, "-m", "ioe", command, "--listen", "0.0.0.0", "--port", "0",
            "--store", str(tmp_path / "s.duckdb")]  # fmt: skip
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to listen on 0.0.0.0 without a token" in lines[0]


def test_loopback_token_or_explicit_opt_out_may_listen() -> None:
    assert Settings(listen_host="127.0.0.1").exposure_problem() is None
    assert Settings(listen_host="::1").exposure_problem() is None
    assert Settings(listen_host="0.0.0.0", auth_token="x").exposure_problem() is None
    assert Settings(listen_host="0.0.0.0", allow_unauthenticated=True).exposure_problem() is None
    assert "refusing" in (Settings(listen_host="10.0.0.5").exposure_problem() or "")
