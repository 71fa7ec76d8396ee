"""When the KV pool binds admission, on hand-built signals (classify is pure: each input is written
here with the reason for its expected answer).

The case: a long-context deployment on one node. Each running sequence holds tens of thousands of
tokens of KV, so the pool, 86 % used on average, holds ever fewer of them: 14 run while 84 wait,
and the queue is three quarters of TTFT. The GPUs are busy with what was admitted (SM 0.79), but
what stops the next request is that its KV blocks cannot be allocated: the KV wall."""

from __future__ import annotations

from analyzer.critical_path import CriticalPath
from analyzer.envelope import Signals, classify, kv_free_sequences
from analyzer.thresholds import Thresholds

T0, T1 = 0, 600 * 1_000_000_000
ONE_NODE = CriticalPath(collectives_cross_nodes=False, why="declared: a group of 8 GPUs fits one domain")
BUSY = {"sm_active_ratio": 0.79, "tensor_active_ratio": 0.43, "dram_active_ratio": 0.3}
QUEUE = {"queue_seconds": 7.7, "ttft_seconds": 10.0}


def _verdict(running: float, waiting: float, usage: float, preempt: float = 0.0):  # type: ignore[no-untyped-def]
    engine = {"requests_running": running, "requests_waiting": waiting, "kv_usage_ratio": usage,
              "preemptions_per_s": preempt, "engines_reporting": 1.0}  # fmt: skip
    sig = Signals(gpu=dict(BUSY), engine=engine, means=dict(QUEUE), path=ONE_NODE)
    return classify(sig, Thresholds(), "longctx", T0, T1)


def test_a_nearly_full_pool_with_more_waiting_than_running_binds() -> None:
    v = _verdict(running=14, waiting=84, usage=0.86)
    assert v.primary == "kv_capacity", v.notes
    assert any("kv_capacity over compute" in n for n in v.notes)


def test_the_same_pool_with_a_short_queue_does_not_bind() -> None:
    # 8 waiting per 14 running (0.57 < 1): the pool is not what holds the queue back; the busier
    # wall scores higher and nothing overrides it
    v = _verdict(running=14, waiting=8, usage=0.86)
    assert v.primary == "compute"


def test_no_room_for_one_more_sequence_is_pressure() -> None:
    # 4 sequences fill 85 % of the pool: the free 15 % holds 0.7 of a sequence of their size, and
    # requests wait (0.75 per running: under the backlog rule's 1.0, so only the missing room
    # makes it pressure)
    v = _verdict(running=4, waiting=3, usage=0.85)
    (room,) = [e for e in v.evidence if e.signal == "kv_free_sequences"]
    assert room.value is not None and abs(room.value - 4 * (1 / 0.85 - 1)) < 1e-3
    assert room.verdict == "info" and "no room" in room.note
    assert v.primary == "kv_capacity"


def test_free_sequences_are_per_engine() -> None:
    # two engines, 20 running in all at 80 %: each holds 10 and has room for 2.5 more
    engine = {"requests_running": 20.0, "kv_usage_ratio": 0.8, "engines_reporting": 2.0}
    got = kv_free_sequences(engine)
    assert got is not None and abs(got - 2.5) < 1e-9
