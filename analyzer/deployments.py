"""Which sources belong to which deployment: declared first, inferred from labels otherwise.

Input: the ``deployments`` table (written from the sidecar config: name, model, gpu_type, layout,
roles, nodes, fabric, and ``spec`` JSON with ``targets`` and ``gpus``), ``engine_samples`` identity
labels, ``targets`` hosts, ``gpu_samples`` hosts/uuids and ``collective_records`` communicators.
Output: one :class:`Deployment` per name with its engine series keys, GPU uuids and NCCL comm ids.

Rules:
 1. A declared deployment owns the engine series whose ``source`` is in its spec ``targets``
    (every series of its ``model`` when it names no targets), the GPUs whose uuid is in spec
    ``gpus`` (every GPU on its ``nodes`` when it names none), and the communicators seen on its
    nodes (or on the hosts of its GPUs).
 2. Engine series no declared deployment owns are grouped by ``model`` (``source`` when the model
    is unknown); each group becomes an inferred deployment named after it.
 3. An inferred deployment's layout: TP = max(tp_rank)+1, PP = max(pp_rank)+1, EP = max(ep_rank)+1,
    DP = distinct dp_rank; when no tp_rank label exists, TP is the most common NCCL communicator
    size on its hosts (``inferred_from`` says which).
 4. An inferred deployment's hosts are the ``targets.host`` of its sources; its GPUs are every GPU
    on those hosts; when no host is known and it is the only deployment, it owns every GPU.
 5. "Seen at or after ``since_ns``" is read without scanning the store: in the series layout
    (:mod:`collector.series`) the series come from the small ``*_series`` tables, and with a
    ``since_ns`` only the points at or after it are read (time-ordered points, so older row
    groups are skipped); series whose points retention removed are pruned there. Wide tables
    (DuckLake, an old file read-only) are scanned as before.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb

ENGINE_KEY_SQL = "(source || '|' || engine || '|' || CAST(dp_rank AS VARCHAR))"
TEXTS = "from_json(?, '[\"VARCHAR\"]')"  # one parameter made by texts(): a list of strings in SQL
# ``x {IN_TEXTS}``: whether x is one of the strings of one texts() parameter, as a semi join. A
# list_contains(TEXTS, x) compared each row with the list's elements one by one: on 335 k rollup
# rows and a deployment's 128 engine keys 0.099 s instead of 0.065 s (512-GPU store, medians of 5).
IN_TEXTS = f"IN (SELECT unnest({TEXTS}))"


def texts(values: Iterable[Any]) -> str:
    """Strings as one query parameter, read back in SQL as a ``VARCHAR[]`` by :data:`TEXTS`
    (``uuid IN_TEXTS``: :data:`IN_TEXTS`).

    DuckDB's Python client converts each element of a list parameter on its own, and tries to
    import pandas twice for each where pandas is not installed: 512 GPU uuids cost 0.4-0.8 s a
    statement, more than the statement. One JSON text is one value, parsed inside DuckDB.
    A tuple's text is kept (a report asks a deployment's 512 GPU uuids' about ten times)."""
    if isinstance(values, tuple):
        try:
            return _tuple_texts(values)
        except TypeError:  # an element that cannot be hashed: not kept
            pass
    return json.dumps([str(v) for v in values])


@functools.lru_cache(maxsize=256)
def _tuple_texts(values: tuple[Any, ...]) -> str:
    return json.dumps([str(v) for v in values])


@dataclass(frozen=True)
class Deployment:
    """A deployment and the sources that belong to it (keys as in ``ENGINE_KEY_SQL``)."""

    name: str
    model: str = ""
    gpu_type: str = ""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    roles: dict[str, int] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    fabric: str = ""
    origin: str = "inferred"
    engine_keys: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    comm_ids: tuple[str, ...] = ()
    ttft_slo_s: float | None = None
    itl_slo_s: float | None = None
    inferred_from: tuple[str, ...] = ()

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_uuids)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description (what the CLI and API print)."""
        return {
            "name": self.name,
            "model": self.model,
            "gpu_type": self.gpu_type,
            "layout": {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep},
            "roles": self.roles,
            "nodes": list(self.nodes),
            "fabric": self.fabric,
            "origin": self.origin,
            "engine_series": len(self.engine_keys),
            "gpus": len(self.gpu_uuids),
            "communicators": len(self.comm_ids),
            "inferred_from": list(self.inferred_from),
        }


def list_deployments(con: duckdb.DuckDBPyConnection, since_ns: int = 0) -> list[Deployment]:
    """Declared deployments (rule 1) followed by inferred ones (rules 2-4), sorted by name.

    Only series and GPUs seen at or after ``since_ns`` count (0: the whole store).
    """
    series = _engine_series(con, since_ns)
    gpus = _gpus(con, since_ns)
    hosts = _target_hosts(con)
    declared = [_declared(con, row, series, gpus) for row in _declared_rows(con)]
    owned = {k for d in declared for k in d.engine_keys}
    free = [s for s in series if s["key"] not in owned]
    inferred = _infer(con, free, gpus, hosts, alone=not declared)
    return sorted(declared, key=lambda d: d.name) + sorted(inferred, key=lambda d: d.name)


def find_deployment(con: duckdb.DuckDBPyConnection, name: str, since_ns: int = 0) -> Deployment:
    """The deployment called ``name``; ``KeyError`` lists the known names when absent."""
    deps = list_deployments(con, since_ns)
    for d in deps:
        if d.name == name:
            return d
    raise KeyError(f"no deployment {name!r}; known: {[d.name for d in deps]}")


def _declared_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    cur = con.execute("SELECT * FROM deployments ORDER BY name")
    cols = [c[0] for c in cur.description or []]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def has_points(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether raw table ``table`` is in the series layout on this connection (rule 5)."""
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_name = ? AND table_catalog = current_database()",  # a table or (packed layout) a view
        [f"{table}_points"],
    ).fetchone()
    return bool(row and row[0])


def has_column(con: duckdb.DuckDBPyConnection, relation: str, column: str) -> bool:
    """Whether the table or view ``relation`` of this connection's store has ``column``."""
    row = con.execute(
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = ? AND column_name = ? AND table_catalog = current_database()",
        [relation, column],
    ).fetchone()
    return bool(row and row[0])


def _seen_since(con: duckdb.DuckDBPyConnection, table: str, since_ns: int) -> tuple[str, list[Any]]:
    """Rule 5: the relation to read ``table``'s series from, and its parameters."""
    if not has_points(con, table):
        return f"(SELECT * FROM {table} WHERE ts_ns >= ?)", [since_ns]
    if since_ns <= 0:
        return f"{table}_series", []
    return (
        f"(SELECT * FROM {table}_series WHERE series_id IN "
        f"(SELECT DISTINCT series_id FROM {table}_points WHERE ts_ns >= ?))",
        [since_ns],
    )


def _engine_series(con: duckdb.DuckDBPyConnection, since_ns: int) -> list[dict[str, Any]]:
    rel, args = _seen_since(con, "engine_samples", since_ns)
    rows = con.execute(
        f"""SELECT {ENGINE_KEY_SQL} AS key, source, any_value(model), max(tp_rank), max(pp_rank),
                   max(ep_rank), any_value(dp_rank)
            FROM (SELECT DISTINCT source, engine, model, dp_rank, tp_rank, pp_rank, ep_rank
                  FROM {rel}) GROUP BY ALL ORDER BY key""",
        args,
    ).fetchall()
    names = ("key", "source", "model", "tp_max", "pp_max", "ep_max", "dp_rank")
    return [dict(zip(names, r, strict=True)) for r in rows]


def _gpus(con: duckdb.DuckDBPyConnection, since_ns: int) -> list[tuple[str, str]]:
    rel, args = _seen_since(con, "gpu_samples", since_ns)
    sql = f"SELECT DISTINCT host, uuid FROM {rel} ORDER BY ALL"
    return [(str(h), str(u)) for h, u in con.execute(sql, args).fetchall()]


def _target_hosts(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    rows = con.execute("SELECT target, host FROM targets WHERE host <> ''").fetchall()
    return {str(t): str(h) for t, h in rows}


def _comms_on(con: duckdb.DuckDBPyConnection, hosts: set[str]) -> list[tuple[str, int]]:
    if not hosts:
        return []
    rows = con.execute(
        f"SELECT comm_id, max(n_ranks) FROM collective_records WHERE host {IN_TEXTS} GROUP BY comm_id",
        [texts(sorted(hosts))],
    ).fetchall()
    return sorted((str(c), int(n or 0)) for c, n in rows)


def _spec(row: dict[str, Any]) -> dict[str, Any]:
    try:
        spec = json.loads(row.get("spec") or "{}")
    except ValueError:
        return {}
    return spec if isinstance(spec, dict) else {}


def _json_field(text: Any, default: Any) -> Any:
    try:
        got = json.loads(text) if text else default
    except ValueError:
        return default
    return got if isinstance(got, type(default)) else default


def _declared(
    con: duckdb.DuckDBPyConnection,
    row: dict[str, Any],
    series: list[dict[str, Any]],
    gpus: list[tuple[str, str]],
) -> Deployment:
    spec = _spec(row)
    targets = set(spec.get("targets") or [])
    nodes = tuple(_json_field(row.get("nodes"), []))
    if targets:
        keys = [s["key"] for s in series if s["source"] in targets]
    else:
        keys = [s["key"] for s in series if row.get("model") and s["model"] == row["model"]]
    wanted = set(spec.get("gpus") or [])
    uuids = [u for h, u in gpus if (u in wanted if wanted else h in nodes)]
    hosts = set(nodes) or {h for h, u in gpus if u in set(uuids)}
    return Deployment(
        name=str(row["name"]),
        model=str(row.get("model") or ""),
        gpu_type=str(row.get("gpu_type") or ""),
        tp=int(row.get("tp") or 1),
        pp=int(row.get("pp") or 1),
        dp=int(row.get("dp") or 1),
        ep=int(row.get("ep") or 1),
        roles=_json_field(row.get("roles"), {}),
        nodes=nodes,
        fabric=str(row.get("fabric") or ""),
        origin=str(row.get("origin") or "config"),
        engine_keys=tuple(keys),
        gpu_uuids=tuple(uuids),
        comm_ids=tuple(c for c, _ in _comms_on(con, hosts)),
        ttft_slo_s=spec.get("ttft_slo_s"),
        itl_slo_s=spec.get("itl_slo_s"),
    )


def _infer(
    con: duckdb.DuckDBPyConnection,
    series: list[dict[str, Any]],
    gpus: list[tuple[str, str]],
    hosts: dict[str, str],
    *,
    alone: bool,
) -> list[Deployment]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in series:
        groups.setdefault(s["model"] or s["source"], []).append(s)
    only = alone and len(groups) == 1
    return [_inferred_one(con, name, members, gpus, hosts, only) for name, members in groups.items()]


def _inferred_one(
    con: duckdb.DuckDBPyConnection,
    name: str,
    members: list[dict[str, Any]],
    gpus: list[tuple[str, str]],
    hosts: dict[str, str],
    only: bool,
) -> Deployment:
    nodes = sorted({hosts[s["source"]] for s in members if s["source"] in hosts})
    uuids = [u for h, u in gpus if h in nodes] if nodes else ([u for _, u in gpus] if only else [])
    comm_hosts = set(nodes) or ({h for h, _ in gpus} if only else set())
    comms = _comms_on(con, comm_hosts)
    how = ["engine labels"]
    tp = max((int(s["tp_max"]) for s in members), default=-1) + 1
    if tp <= 0:
        sizes = [n for _, n in comms if n > 0]
        tp = max(set(sizes), key=sizes.count) if sizes else 1
        how.append("nccl communicator size" if sizes else "default tp=1")
    how.append("targets.host" if nodes else ("all GPUs (single deployment)" if only else "no GPU mapping"))
    return Deployment(
        name=name,
        model=str(members[0]["model"] or ""),
        tp=tp,
        pp=max(max((int(s["pp_max"]) for s in members), default=0) + 1, 1),
        ep=max(max((int(s["ep_max"]) for s in members), default=0) + 1, 1),
        dp=_dp_size(members),
        nodes=tuple(nodes),
        origin="inferred",
        engine_keys=tuple(s["key"] for s in members),
        gpu_uuids=tuple(uuids),
        comm_ids=tuple(c for c, _ in comms),
        inferred_from=tuple(how),
    )


def _dp_size(members: list[dict[str, Any]]) -> int:
    ranks = {int(s["dp_rank"]) for s in members if int(s["dp_rank"]) >= 0}
    return len(ranks) if ranks else max(len(members), 1)
