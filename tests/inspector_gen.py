"""Write NCCL Inspector JSONL the way the plugin does (REFERENCE §3), for tests.

Every number is a function of (rank, sequence number) so a test can assert it:
``exec_us = 100 + 10·rank + sn``, ``msg_bytes = 1 MiB``, busbw = algbw × 2(n−1)/n for
AllReduce, verbose start = ``BASE_US + 1000·sn + 5·rank`` and stop = start + exec_us.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE_US = 1_760_000_000_000_000
MSG_BYTES = 1 << 20
COMM_ID = "0x7f3a9c1e5b2d4f60"
P2P_COMM_ID = "0x11aa22bb33cc44dd"


def exec_us(rank: int, sn: int) -> int:
    return 100 + 10 * rank + sn


def _header(comm_id: str, rank: int, n_ranks: int, name: str) -> dict[str, Any]:
    return {"id": comm_id, "comm_name": name, "rank": rank, "n_ranks": n_ranks, "nnodes": 1}


def _meta(host: str, pid: int, sn: int) -> dict[str, Any]:
    return {
        "inspector_output_format_version": "v4.1",
        "git_rev": "synthetic",
        "rec_mechanism": "nccl_profiler_interface",
        "dump_timestamp_us": BASE_US + 1000 * sn + 900,
        "hostname": host,
        "pid": pid,
    }


def _trace(prefix: str, rank: int, sn: int, channels: int = 2) -> dict[str, Any]:
    start = BASE_US + 1000 * sn + 5 * rank
    stop = start + exec_us(rank, sn)
    kernels = [
        {
            "channel_id": ch,
            "kernel_start_ts": start + 1 + ch,
            "kernel_stop_ts": stop - ch,
            "kernel_record_ts": stop,
        }
        for ch in range(channels)
    ]
    return {f"{prefix}_start_ts": start, f"{prefix}_stop_ts": stop, "kernel_events": kernels}


def coll_record(
    rank: int, sn: int, n_ranks: int, *, verbose: bool = False, host: str = "node0", op: str = "AllReduce"
) -> dict[str, Any]:
    t = exec_us(rank, sn)
    algbw = MSG_BYTES / (t * 1e3)
    perf: dict[str, Any] = {
        "coll": op,
        "coll_sn": sn,
        "coll_msg_size_bytes": MSG_BYTES,
        "coll_exec_time_us": t,
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": algbw,
        "coll_busbw_gbs": algbw * 2 * (n_ranks - 1) / n_ranks,
    }
    if verbose:
        perf["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": []}
        perf["event_trace_ts"] = _trace("coll", rank, sn)
    return {
        "header": _header(COMM_ID, rank, n_ranks, "TP0"),
        "metadata": _meta(host, 4000 + rank, sn),
        "coll_perf": perf,
    }


def p2p_record(
    rank: int, sn: int, n_ranks: int, *, verbose: bool = False, host: str = "node0"
) -> dict[str, Any]:
    t = exec_us(rank, sn)
    perf: dict[str, Any] = {
        "p2p": "Send" if rank % 2 == 0 else "Recv",
        "p2p_sn": sn,
        "p2p_peer": rank ^ 1,
        "p2p_msg_size_bytes": MSG_BYTES // 2,
        "p2p_exec_time_us": t,
        "p2p_timing_source": "kernel_gpu",
        "p2p_algobw_gbs": (MSG_BYTES // 2) / (t * 1e3),
        "p2p_busbw_gbs": (MSG_BYTES // 2) / (t * 1e3),
    }
    if verbose:
        perf["event_trace_ts"] = _trace("p2p", rank, sn, channels=1)
    return {
        "header": _header(P2P_COMM_ID, rank, n_ranks, "PP0"),
        "metadata": _meta(host, 4000 + rank, sn),
        "p2p_perf": perf,
    }


def dump_stats_record(rank: int, n_ranks: int, n_coll: int) -> dict[str, Any]:
    return {
        "header": _header(COMM_ID, rank, n_ranks, "TP0"),
        "metadata": _meta("node0", 4000 + rank, 0),
        "dump_stats": {"coll_records": n_coll, "coll_dropped_total": 0, "p2p_records": 0},
    }


def lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def rank_records(
    rank: int, n_ranks: int, sns: range, *, verbose: bool = False, p2p: bool = True
) -> list[dict[str, Any]]:
    """What one rank's dump holds for ``sns``: a dump_stats marker, the collectives, the P2P ops."""
    out = [dump_stats_record(rank, n_ranks, len(sns))]
    out += [coll_record(rank, sn, n_ranks, verbose=verbose) for sn in sns]
    if p2p:
        out += [p2p_record(rank, sn, n_ranks, verbose=verbose) for sn in sns]
    return out


def write_ranks(
    directory: Path, n_ranks: int, sns: range, *, verbose: bool = False, p2p: bool = True, torn: bool = False
) -> dict[int, Path]:
    """Append each rank's records to ``<dir>/node0-pid<4000+rank>.log``; ``torn`` adds half a line."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[int, Path] = {}
    for rank in range(n_ranks):
        path = directory / f"node0-pid{4000 + rank}.log"
        data = lines(rank_records(rank, n_ranks, sns, verbose=verbose, p2p=p2p))
        if torn:
            data += torn_prefix(rank, n_ranks, sns.stop, verbose=verbose)
        with path.open("ab") as fh:
            fh.write(data)
        paths[rank] = path
    return paths


def torn_prefix(rank: int, n_ranks: int, sn: int, *, verbose: bool = False) -> bytes:
    """The first half of collective ``sn``'s line, as a dump thread caught mid-write leaves it."""
    full = lines([coll_record(rank, sn, n_ranks, verbose=verbose)])
    return full[: len(full) // 2]


def torn_rest(rank: int, n_ranks: int, sn: int, *, verbose: bool = False) -> bytes:
    """The rest of the line :func:`torn_prefix` began (with its newline)."""
    full = lines([coll_record(rank, sn, n_ranks, verbose=verbose)])
    return full[len(full) // 2 :]
