"""Token check, body cap, and read-only queries that cannot write, read files or attach databases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_store import build
from fastapi.testclient import TestClient

from api.app import create_app
from collector.store import Store
from ioe.settings import Settings

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = build()
    yield st
    st.close()


@pytest.fixture(scope="module")
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(store_path=":memory:", auth_token=TOKEN), store)) as c:
        yield c


def query(client: TestClient, sql: str, **extra: Any) -> Any:
    return client.post(
        "/api/v1/query", json={"sql": sql, **extra}, headers={"authorization": f"Bearer {TOKEN}"}
    )


# ---- token --------------------------------------------------------------------------------------
def test_ingest_and_reads_need_the_token(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    assert client.post("/v1/traces", content=b"{}", headers=headers).status_code == 401
    ok = client.post("/v1/traces", content=b"{}", headers={**headers, "authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert client.get("/api/v1/targets").status_code == 401
    assert client.get("/api/v1/targets", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_reads_need_the_token_from_a_token_file(store: Store, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = Settings(store_path=":memory:", auth_token_file=str(token_file))
    with TestClient(create_app(settings, store)) as c:
        refused = c.get("/api/v1/deployments/llama70b")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert c.get("/api/v1/targets", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/v1/targets", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.post("/api/v1/query", json={"sql": "SELECT 1"}).status_code == 401
        assert c.get("/healthz").status_code == 200  # probes stay open


# ---- body cap -----------------------------------------------------------------------------------
def test_body_over_the_cap_is_refused_with_413(client: TestClient) -> None:
    big = "SELECT 1 -- " + "x" * (2 << 20)
    r = query(client, big)
    assert r.status_code == 413 and r.json()["detail"]["parameter"] == "body"


def test_streamed_body_over_the_cap_is_refused_with_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"sql": "SELECT 1 -- '
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}'

    headers = {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"}
    r = client.post("/api/v1/query", content=chunks(), headers=headers)
    assert r.status_code == 413
    assert "1048576-byte cap" in r.json()["detail"]["message"]


# ---- read-only queries --------------------------------------------------------------------------
def test_select_over_store_tables_returns_rows(client: TestClient) -> None:
    r = query(client, "SELECT target, up FROM targets ORDER BY target")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["columns"] == ["target", "up"]
    assert body["rows"] == [["dcgm-node0", True], ["llama70b-engine-0", True], ["llama70b-engine-1", False]]
    cte = query(client, "WITH r AS (SELECT rank, avg(exec_us) e FROM collective_records GROUP BY rank) "
                        "SELECT count(*) FROM r")  # fmt: skip
    assert cte.json()["rows"] == [[8]]


def test_result_bytes_are_capped(client: TestClient) -> None:
    # 10,000 rows of ~3.2 KB each: 32 MB of answer from a 100-byte query, past the 16 MiB cap
    big = "SELECT string_agg(md5(range::varchar), '') s FROM range(1000000) GROUP BY range % 10000"
    r = query(client, big, max_rows=10_000, timeout_s=20)
    assert r.status_code == 400 and "result is larger than" in r.json()["detail"]["message"]


def test_row_limit_truncates(client: TestClient) -> None:
    body = query(client, "SELECT * FROM gpu_samples", max_rows=7).json()
    assert len(body["rows"]) == 7 and body["truncated"] is True


def test_time_limit_interrupts(client: TestClient) -> None:
    slow = "SELECT count(*) FROM range(10000000) a, range(100000) b WHERE a.range * b.range = 7"
    r = query(client, slow, timeout_s=0.3)
    assert r.status_code == 400 and "0.3 s time limit" in r.json()["detail"]["message"]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("INSERT INTO targets (target) VALUES ('x')", "only SELECT"),
        ("DELETE FROM gpu_samples", "only SELECT"),
        ("CREATE TABLE t AS SELECT 1", "only SELECT"),
        ("UPDATE targets SET up = true", "only SELECT"),
        ("ATTACH '/tmp/other.duckdb' AS other", "only SELECT"),
        ("ATTACH ':memory:' AS m", "only SELECT"),
        ("COPY targets TO '/tmp/out.csv'", "only SELECT"),
        ("INSTALL httpfs", "only SELECT"),
        ("LOAD httpfs", "only SELECT"),
        ("SET enable_external_access = true", "only SELECT"),
        ("PRAGMA database_list", "refused"),
        ("CALL checkpoint()", "only SELECT"),
        ("SELECT 1; DROP TABLE targets", "exactly one statement"),
        ("SELECT * FROM read_csv('/etc/passwd')", "table function read_csv()"),
        ("SELECT * FROM read_text('/etc/hostname')", "table function read_text()"),
        ("SELECT * FROM glob('/etc/*')", "table function glob()"),
        ("SELECT * FROM '/etc/passwd'", "'/etc/passwd' is not a store table"),
        ("SELECT * FROM 'https://example.com/x.csv'", "is not a store table"),
        ("SELECT * FROM read_parquet('s3://bucket/x.parquet')", "table function read_parquet()"),
        ("SELECT (SELECT count(*) FROM read_csv_auto('/etc/passwd'))", "table function read_csv_auto()"),
        ("SELECT * FROM targets, (FROM duckdb_settings())", "table function duckdb_settings()"),
        ("SELECT * FROM query('SELECT 1')", "table function query()"),
        ("SELECT current_setting('memory_limit')", "function current_setting()"),
        ("SELECT * FROM ioe_state", "'ioe_state' is not a store table"),
        ("SELECT * FROM other.main.targets", "outside the store"),
        ("SELECT * FROM information_schema.tables", "outside the store"),
        ("SUMMARIZE targets", "not allowed"),
        ("WITH x AS (SELECT 1) SELECT * FROM (SELECT * FROM x), '/etc/passwd'", "is not a store table"),
        # a CTE named like a file is not in scope inside its own body, and no name is a path
        (
            'WITH "/etc/passwd" AS (SELECT * FROM \'/etc/passwd\') SELECT * FROM "/etc/passwd"',
            "not a store table",
        ),
        ('WITH "/etc/*" AS (SELECT * FROM \'/etc/*\') SELECT * FROM "/etc/*"', "not a store table"),
        (
            "WITH \"https://example.com/x.parquet\" AS (SELECT * FROM 'https://example.com/x.parquet') "
            'SELECT * FROM "https://example.com/x.parquet"',
            "not a store table",
        ),
        ("WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a", "'b' is not a store table"),
        ("SELECT repeat('x', 10000000) FROM range(150)", "function repeat()"),
        ("SELECT lpad('x', 100000000, 'y')", "function lpad()"),
        ("SELECT printf('%100000000d', 1)", "function printf()"),
        ("SELECT count(*) FROM range(1000000000000)", "at most 10000000 rows"),
        ("SELECT count(*) FROM range((SELECT 9))", "constant integer bounds"),
    ],
)
def test_query_cannot_write_read_files_or_attach(
    client: TestClient, store: Store, sql: str, reason: str
) -> None:
    before = store.counts()
    r = query(client, sql)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail["parameter"] == "sql" and reason in detail["message"]
    assert store.counts() == before
    with store.cursor() as cur:
        databases = [row[0] for row in cur.execute("SELECT database_name FROM duckdb_databases()").fetchall()]
    assert "other" not in databases and "m" not in databases


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("rows.csv", b"secret,value\nkey,42\n"),
        ("rows.json", b'[{"secret": "key"}]'),
        ("rows.csv.gz", None),
    ],
)
def test_cte_named_after_a_file_reads_nothing(
    client: TestClient, tmp_path: Path, name: str, content: bytes | None
) -> None:
    """The attack from the review: a CTE named after the file it reads, in any format or glob."""
    import gzip

    path = tmp_path / name
    path.write_bytes(content if content is not None else gzip.compress(b"secret,value\nkey,42\n"))
    for ref in (str(path), str(tmp_path / "*")):
        r = query(client, f'WITH "{ref}" AS (SELECT * FROM \'{ref}\') SELECT * FROM "{ref}"')
        assert r.status_code == 400 and "key" not in r.text


def test_the_database_itself_refuses_files_even_past_the_checks(store: Store, tmp_path: Path) -> None:
    """Defence in depth: the store's database has external access off and its configuration locked,
    so even a statement the checks missed cannot read a file, attach, or turn access back on."""
    import duckdb

    secret = tmp_path / "s.csv"
    secret.write_text("a\n1\n")
    with store.cursor() as cur:
        attempts = (
            f"SELECT * FROM '{secret}'",
            f"SELECT * FROM read_csv('{secret}')",
            "SET enable_external_access = true",
            "INSTALL httpfs",
            f"ATTACH '{tmp_path}/o.db'",
        )
        for sql in attempts:
            with pytest.raises(duckdb.Error):
                cur.execute(sql).fetchall()
