"""Scraping one HTTP ``/metrics`` target: fetch with a deadline and a body cap, back off on failure.

Rules:
1. Every request asks for ``Accept: text/plain; version=0.0.4`` (REFERENCE §2: OpenMetrics
   negotiation renames ``vllm:`` samples).
2. A whole scrape (connect, headers, body) must finish within the target's ``timeout_s``; a
   target that hangs costs its own task that long and nothing more.
3. A body larger than ``max_body_bytes`` is abandoned as it streams in (or at once, from its
   ``Content-Length``), never buffered whole. The GET itself is
   :class:`collector.sources.http_client.HttpClient`'s (keep-alive, one connection per target).
4. After ``k`` consecutive failures the next attempt waits ``interval × 2^k`` (capped at
   :data:`MAX_BACKOFF_S`), multiplied by a random factor in [0.8, 1.2] so that many sidecars
   do not retry a shared endpoint in step. One success resets the schedule.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from collector.sources.http_client import HttpClient, HttpError

ACCEPT = "text/plain; version=0.0.4"
MAX_BACKOFF_S = 60.0


class ScrapeError(RuntimeError):
    """A scrape that produced no body; the message names the target and the reason."""


@dataclass
class Health:
    """A target's latest health, as written to the ``targets`` table."""

    up: bool = False
    last_scrape_ns: int = 0
    last_duration_s: float = 0.0
    last_error: str = ""
    samples_last: int = 0
    dropped_last: int = 0
    consecutive_failures: int = 0
    scrapes: int = 0
    failures: int = 0


def next_delay(interval_s: float, failures: int, rng: random.Random) -> float:
    """Seconds until the next attempt (rule 4)."""
    if failures <= 0:
        return interval_s
    return min(interval_s * 2.0**failures, MAX_BACKOFF_S) * rng.uniform(0.8, 1.2)


async def fetch(client: HttpClient, name: str, url: str, timeout_s: float, max_body_bytes: int) -> bytes:
    """GET ``url`` (rules 1–3) and return the raw body, or raise :class:`ScrapeError`.

    The body is not decoded here: bytes that are not UTF-8 cost only their own line, in the parser.
    """
    try:
        async with asyncio.timeout(timeout_s):  # no task per scrape, as wait_for would make
            return await _fetch(client, name, url, max_body_bytes)
    except TimeoutError as exc:
        raise ScrapeError(f"target {name}: no complete answer within {timeout_s:g} s") from exc
    except HttpError as exc:
        raise ScrapeError(f"target {name}: {exc}") from exc
    except OSError as exc:  # refused, unreachable, reset
        raise ScrapeError(f"target {name}: {type(exc).__name__}: {exc}") from exc


async def _fetch(client: HttpClient, name: str, url: str, max_body_bytes: int) -> bytes:
    resp = await client.get(url, headers={"Accept": ACCEPT}, max_body_bytes=max_body_bytes)
    if resp.status != 200:
        raise ScrapeError(f"target {name}: HTTP {resp.status} from {url}")
    return resp.body


def now_ns() -> int:
    return time.time_ns()
