"""collector.increases rule 1 on a scrape's rows by position (``_steps``): the same numbers as
the rule written row by row, for steps, resets, gauges that fall, equal values, ints, NaN and
infinities, and None where a row holds a NULL or a series' first point. The expected values come
from the rule's own formula, written out here: the increase is ``c - p`` when the value did not
fall (``c >= p``), else the new value ``c`` (a reset counts from zero)."""

from __future__ import annotations

import math
import random
from typing import Any

from collector.increases import _FIRST, _steps


def _rule(c: Any, p: Any) -> Any:
    return c - p if c >= p else c


def _same(a: list[Any], b: list[Any]) -> bool:
    pairs = zip(a, b, strict=True)
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in pairs)


def test_steps_follow_the_rule_on_every_kind_of_row() -> None:
    values = [5.0, 3.0, 7, 2.5, 1e300, float("nan"), 4.0, float("inf"), float("inf"), 0.0]
    previous = [2.0, 3.0, 4, 9.0, -1e300, 1.0, float("nan"), 1.0, float("inf"), -0.0]
    got = _steps(values, previous)
    assert got is not None and _same(got, [_rule(c, p) for c, p in zip(values, previous, strict=True)])
    assert _steps([1.0, 2.0], [0.5, 1.0]) == [0.5, 1.0]  # no row fell: the subtraction alone
    assert _steps([], []) == []


def test_random_counters_and_gauges_match_the_rule() -> None:
    rng = random.Random(24)
    for _ in range(200):
        n = rng.randrange(1, 60)
        kinds = [lambda: rng.uniform(0, 1e6), lambda: float(rng.randrange(100)), lambda: rng.randrange(100)]
        previous = [rng.choice(kinds)() for _ in range(n)]
        values = [p + rng.choice([0, 0, rng.uniform(0, 10), -rng.uniform(0, 10), -p]) for p in previous]
        got = _steps(values, previous)
        assert got is not None and _same(got, [_rule(c, p) for c, p in zip(values, previous, strict=True)])


def test_a_null_or_a_first_point_is_left_to_the_general_rule() -> None:
    assert _steps([1.0, None], [0.5, 0.5]) is None
    assert _steps([1.0, 2.0], [0.5, None]) is None
    assert _steps([1.0, 2.0], [_FIRST, 1.0]) is None
