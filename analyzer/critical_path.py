"""Is the network in a deployment's critical path, and how much of the wall clock do its collectives take?

A collective only meets the network when its group spans nodes; inside one NVLink (scale-up)
domain it runs on NVLink/NVSwitch, which is fabric overhead of the layout, not a network wall.
Rules (numbers are :class:`~analyzer.thresholds.Thresholds` fields where they are settings):

 1. A communicator crosses nodes when its NCCL records name more than one host, or the
    Inspector header's ``nnodes`` is above 1. Records are measurements, so when they exist they
    decide for the collective groups.
 2. Without records, the declared layout decides: the model-parallel group (TP × PP) or the
    expert group (EP) crosses nodes when it holds more GPUs than one scale-up domain (the GPU's
    NVLink domain size, 8 for HGX H100/H200) and the deployment names more than one node.
 3. A disaggregated deployment (both ``prefill`` and ``decode`` roles) on more than one node
    sends every request's KV cache from prefill to decode GPUs across nodes: that transfer is in
    every request's TTFT.
 4. Per communicator, the time share is the median over its ranks of the rank's collective
    duty cycle: mean execution time × collectives issued ÷ the wall time they were issued in.
    Collectives issued = the ``coll_sn`` span (the Inspector writes only the latest completed
    collective per dump, so records are a sample; the sequence numbers count every call), and
    the wall time is the span between the rank's first and last record in the window. When the
    records carry no spread of times (one record, or a single dump time), when the calls were
    made is unknown and the wall time is the whole window. Capped at 1. This is an upper bound
    of exposed time (compute may overlap it).
 5. ``network_share`` is the largest share over crossing communicators (the network wall's
    evidence); ``fabric_share`` the largest over the others (reported, never network evidence).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb

from analyzer.deployments import Deployment

DEFAULT_DOMAIN_GPUS = 8


@dataclass(frozen=True)
class CommShare:
    comm_id: str
    op: str
    n_ranks: int
    hosts: int
    crosses_nodes: bool
    share: float
    median_msg_bytes: float | None


@dataclass
class CriticalPath:
    """Rules 1-5 for one deployment and window."""

    collectives_cross_nodes: bool | None = None  # None: no records and nothing declared says so
    kv_transfer_crosses_nodes: bool = False
    why: str = ""
    network_share: float | None = None
    fabric_share: float | None = None
    comms: list[CommShare] = field(default_factory=list)

    @property
    def network_in_path(self) -> bool:
        return bool(self.collectives_cross_nodes) or self.kv_transfer_crosses_nodes

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["network_in_path"] = self.network_in_path
        return out


# Rule 4 per rank: one row per (comm_id, rank) with ``mean_us``, ``n`` and ``share``. Parameters
# from :func:`rank_share_params`. A wall-time span under a second is no spread of times.
RANK_SHARE_SQL = """per_rank AS (
       SELECT comm_id, rank, mean_us, n, least(1.0, CASE
                  WHEN n > 1 AND t_span_us >= 1e6 THEN mean_us * sn_span / t_span_us
                  ELSE mean_us * (CASE WHEN n > 1 THEN sn_span * n / (n - 1) ELSE n END) / ?
              END) AS share
       FROM (SELECT comm_id, rank, avg(exec_us) AS mean_us, count(*) AS n,
                    max(coll_sn) - min(coll_sn) AS sn_span,
                    max(coalesce(start_us, dump_ts_us)) - min(coalesce(start_us, dump_ts_us)) AS t_span_us
             FROM collective_records
             WHERE list_contains(?, comm_id) AND coll_sn >= 0
               AND coalesce(start_us, dump_ts_us) > ? AND coalesce(start_us, dump_ts_us) <= ?
             GROUP BY comm_id, rank))"""


def rank_share_params(comm_ids: list[str], start_ns: int, end_ns: int) -> list[Any]:
    """The parameters of :data:`RANK_SHARE_SQL`, in order."""
    start_us, end_us = start_ns / 1000, end_ns / 1000
    return [max(end_us - start_us, 1.0), comm_ids, start_us, end_us]


def domain_gpus(dep: Deployment) -> int:
    """GPUs in one scale-up (NVLink) domain for the deployment's GPU type (8 when unknown)."""
    from analyzer import catalog

    try:
        return int(catalog.gpu(dep.gpu_type or "h100_sxm").domain_gpus) or DEFAULT_DOMAIN_GPUS
    except (KeyError, ValueError, AttributeError):
        return DEFAULT_DOMAIN_GPUS


def comm_shares(
    con: duckdb.DuckDBPyConnection, comm_ids: list[str], start_ns: int, end_ns: int
) -> list[CommShare]:
    """Rule 4 per communicator with rule 1's crossing flag."""
    if not comm_ids:
        return []
    rows = con.execute(
        f"""WITH {RANK_SHARE_SQL},
           shares AS (SELECT comm_id, median(share) AS share FROM per_rank GROUP BY comm_id),
           info AS (
               SELECT comm_id, mode(op) AS op, max(n_ranks) AS n_ranks, max(coalesce(nnodes, 0)) AS nnodes,
                      count(DISTINCT host) FILTER (WHERE coalesce(host, '') <> '') AS hosts,
                      median(msg_bytes) AS msg
               FROM collective_records WHERE list_contains(?, comm_id) GROUP BY comm_id)
           SELECT i.comm_id, i.op, i.n_ranks, i.nnodes, i.hosts, i.msg, s.share
           FROM info i JOIN shares s USING (comm_id) ORDER BY i.comm_id""",
        [*rank_share_params(comm_ids, start_ns, end_ns), comm_ids],
    ).fetchall()
    return [
        CommShare(
            str(cid),
            str(op or ""),
            int(n or 0),
            int(hosts or 0),
            (nnodes or 0) > 1 or (hosts or 0) > 1,
            float(share or 0.0),
            None if msg is None else float(msg),
        )
        for cid, op, n, nnodes, hosts, msg, share in rows
    ]


def critical_path(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> CriticalPath:
    """Rules 1-5."""
    comms = comm_shares(con, list(dep.comm_ids), start_ns, end_ns)
    out = CriticalPath(comms=comms)
    nodes = len(dep.nodes)
    per_domain = domain_gpus(dep)
    group = max(dep.tp * dep.pp, dep.ep)
    if comms:
        crossing = [c for c in comms if c.crosses_nodes]
        out.collectives_cross_nodes = bool(crossing)
        out.why = (
            f"NCCL records: {len(crossing)} of {len(comms)} communicators span nodes"
            if crossing
            else f"NCCL records: all {len(comms)} communicators stay inside one node"
        )
        if crossing:
            out.network_share = max(c.share for c in crossing)
        inside = [c for c in comms if not c.crosses_nodes]
        if inside:
            out.fabric_share = max(c.share for c in inside)
    elif nodes > 1 and group > per_domain:
        out.collectives_cross_nodes = True
        out.why = (
            f"declared: a group of {group} GPUs on {nodes} nodes exceeds one {per_domain}-GPU NVLink domain"
        )
    elif group <= per_domain:
        out.collectives_cross_nodes = False
        out.why = f"declared: a group of {group} GPUs fits one {per_domain}-GPU NVLink domain"
    else:
        out.why = "no NCCL records and no node list: whether collectives cross nodes is unknown"
    if "prefill" in dep.roles and "decode" in dep.roles and nodes > 1:
        out.kv_transfer_crosses_nodes = True
        out.why += f"; prefill and decode roles on {nodes} nodes: every request's KV cache crosses nodes"
    return out
