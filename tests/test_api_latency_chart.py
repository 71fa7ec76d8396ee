"""The latency chart's points (``api.service.trailing_quantiles``, rule 6 of :mod:`api.service`).

Hand-built ITL histogram, one engine scraped every second (SYNTHETIC, reasons written here): the
engine alternates 7.5 s phases of 100 fast tokens (ITL under 25 ms) and 40 prefill-stalled tokens
(ITL 0.5-0.75 s). Per 7.5 s bin the p50 would swing between the two; over a trailing 60 s (8 bins:
4 fast phases, 400 tokens, against 4 slow ones, 160) more than half of the tokens are fast, so every
point from the 8th bin on has p50 in the fast bucket. A 30 s scrape outage leaves its bins empty.
"""

from __future__ import annotations

import math

from api.service import trailing_quantiles
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
START_NS = 1_800_000_000 * NS
LE = (0.025, 0.05, 0.5, 0.75, math.inf)
BIN_S = 7.5
OUTAGE_S = (150, 180)  # no scrape in (150 s, 180 s]: bins 20-23 hold nothing


def _store() -> Store:
    st = Store(":memory:")
    acc = dict.fromkeys(LE, 0.0)
    rows = []
    for t in range(1, 241):
        fast = (t - 1) // 7.5 % 2 == 0
        per_s = (100 if fast else 40) / 7.5
        for le in LE:  # fast tokens fall in every bucket from 0.025 up, slow ones from 0.75 up
            acc[le] += per_s if (fast or le >= 0.75) else 0.0
        if OUTAGE_S[0] < t <= OUTAGE_S[1]:
            continue
        ident = {"source": "e0", "engine": "0", "model": "m", "dp_rank": -1, "ts_ns": START_NS + t * NS}
        rows += [{**ident, "concept": "itl_seconds", "le": le, "cumulative_count": round(c, 3)}
                 for le, c in acc.items()]  # fmt: skip
    st.write("histogram_buckets", frame("histogram_buckets", rows))
    return st


def test_trailing_span_keeps_the_p50_on_the_majority() -> None:
    st = _store()
    with st.cursor() as con:
        per_bin = trailing_quantiles(
            con, START_NS, START_NS + 240 * NS, BIN_S, 1, None, ("itl_seconds",), (0.5,)
        )
        trailing = trailing_quantiles(
            con, START_NS, START_NS + 240 * NS, BIN_S, 8, None, ("itl_seconds",), (0.5,)
        )
    st.close()
    swing = [r["value_s"] for r in per_bin]
    assert min(swing) < 0.025 and max(swing) > 0.5  # what one bin alone shows
    p50 = {r["bin"]: r["value_s"] for r in trailing}
    assert all(v < 0.025 for b, v in p50.items() if b >= 7), p50
    assert not {20, 21, 22, 23} & set(p50)  # the outage is a gap, not a value borrowed from neighbours
    assert 24 in p50 and p50[24] < 0.025  # after the outage, the trailing span resumes
