"""TTL cache: expiry, single flight, stale-while-revalidate, exceptions not cached, eviction."""

from __future__ import annotations

import threading

import pytest

from api.cache import MISSING, TTLCache


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_value_lives_for_ttl_then_is_recomputed() -> None:
    clock, calls = Clock(), []
    c = TTLCache(ttl_s=10, clock=clock)
    assert c.get("k", lambda: calls.append(1) or "a") == "a"
    clock.t = 9.9
    assert c.get("k", lambda: "b") == "a"
    clock.t = 10.0
    assert c.get("k", lambda: "b") == "b"
    assert c.computed == 2


def test_stale_value_is_served_while_one_caller_refreshes() -> None:
    clock = Clock()
    c = TTLCache(ttl_s=10, clock=clock)
    c.get("k", lambda: "old")
    clock.t = 15.0
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "new"

    got: list[str] = []
    refresher = threading.Thread(target=lambda: got.append(c.get("k", slow)))
    refresher.start()
    started.wait(5)
    assert c.get("k", lambda: "never") == "old"  # not blocked behind the refresh
    release.set()
    refresher.join(5)
    assert got == ["new"] and c.get("k", lambda: "never") == "new"
    clock.t = 100.0  # past max_stale_s (60 s): callers wait for a fresh value
    assert c.get("k", lambda: "newest") == "newest"


def test_concurrent_callers_share_one_computation() -> None:
    c = TTLCache(ttl_s=10)
    gate = threading.Event()
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        gate.wait(5)
        return 42

    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(c.get("k", compute))) for _ in range(20)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(5)
    assert out == [42] * 20 and calls == [1]


def test_exceptions_are_not_cached_and_oldest_is_evicted() -> None:
    c = TTLCache(ttl_s=10, max_entries=2)
    with pytest.raises(ZeroDivisionError):
        c.get("k", lambda: 1 / 0)
    assert c.get("k", lambda: 1) == 1
    c.get("a", lambda: 2)
    c.get("b", lambda: 3)
    assert c.get("k", lambda: "recomputed") == "recomputed"  # "k" was the oldest of three


def test_peek_never_computes_and_tells_a_miss_from_a_cached_none() -> None:
    clock = Clock()
    c = TTLCache(ttl_s=10, clock=clock)
    assert c.peek("k") is MISSING
    c.get("k", lambda: None)
    assert c.peek("k") is None  # a cached None is a hit
    clock.t = 10.0  # stale (though still served stale-while-revalidate by get): peek misses
    assert c.peek("k") is MISSING and c.computed == 1


def test_peek_stale_answers_stale_values_and_hands_out_one_refresh() -> None:
    clock = Clock()
    c = TTLCache(ttl_s=10, clock=clock)
    assert c.peek_stale("k") == (MISSING, False)
    c.get("k", lambda: "old")
    assert c.peek_stale("k") == ("old", False)  # fresh: nothing to refresh
    clock.t = 15.0
    assert c.peek_stale("k") == ("old", True)  # the first caller past ttl_s refreshes
    assert c.peek_stale("k") == ("old", False)  # the others are answered stale meanwhile
    c.refreshed("k")  # that refresh failed: the next caller claims it again
    assert c.peek_stale("k") == ("old", True)
    clock.t = 60.0  # max_stale_s: too old to answer, callers compute (and wait)
    assert c.peek_stale("k") == (MISSING, False) and c.computed == 1
