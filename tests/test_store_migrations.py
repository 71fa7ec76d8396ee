"""Schema versioning: an older store is brought forward step by step and stamped; a fresh one is
created at the current version directly."""

from __future__ import annotations

import duckdb
import pytest

import collector.store as store_mod
from collector.records import TABLES, TARGETS
from collector.store import Store


def test_older_store_is_migrated_in_order(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "old.duckdb"
    Store(path).close()  # a store at today's version, playing the part of "v1"
    v = store_mod.SCHEMA_VERSION
    steps = [
        (v, [f"ALTER TABLE {TARGETS.name} ADD COLUMN note VARCHAR"]),
        (v + 1, [f"UPDATE {TARGETS.name} SET note = 'migrated'"]),
    ]
    monkeypatch.setattr(store_mod, "MIGRATIONS", steps)
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", v + 2)
    with Store(path) as st:
        assert st.schema_version() == v + 2
        cols = [r[0] for r in st.con.execute(f"DESCRIBE {TARGETS.name}").fetchall()]
        assert "note" in cols
        stamped = [r[0] for r in st.con.execute("SELECT version FROM ioe_schema ORDER BY version").fetchall()]
    assert stamped == [v, v + 1, v + 2]


def test_fresh_store_has_every_table_at_current_version(tmp_path) -> None:
    with Store(tmp_path / "new.duckdb") as st:
        assert st.schema_version() == store_mod.SCHEMA_VERSION
        names = {r[0] for r in st.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert set(TABLES) <= names


def test_a_store_missing_a_newer_table_gets_it(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE nccl_baselines")
    con.close()
    with Store(path) as st:
        assert st.count("nccl_baselines") == 0
