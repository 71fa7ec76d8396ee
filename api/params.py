"""Request parameters: time windows, window ends and deployment names, validated with clear 4xx.

Rules:
  1. ``window`` is a whole number with an optional unit: up to 999999 s (``900``, ``900s``), 9999 m,
     99 h or 31 d (``15m``, ``6h``, ``7d``): exactly :data:`WINDOW_PATTERN`, which the OpenAPI
     schema publishes too. Anything else → 400 naming ``window`` and quoting the value.
  2. ``at`` (the window end) is Unix seconds (at most 4099999999, in 2099 like the dates: a time in
     nanoseconds must fit 64 bits, which end in 2262; optional fraction) or an ISO-8601
     date or time (1970-2099, days 01-28 in the pattern so every match is a real date; UTC when it
     carries no zone): exactly :data:`AT_PATTERN`. Absent → the newest sample in the store, so a
     historical store is analyzed where its data is.
  3. A deployment name is 1 to 256 characters of any kind but control characters: inferred
     deployments are named after model ids (``meta-llama/Llama-3.1-8B``), so routes take the name
     as a path (``{name:path}``; a client may send ``/`` as is or as ``%2F``). A malformed one → 400
     (422 from a route's own validation), an unknown one → 404 listing the known names.
  4. Every error body is ``{"detail": {"parameter": ..., "message": ...}}``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException

NS = 1_000_000_000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
WINDOW_PATTERN = r"^([1-9][0-9]{0,5}s?|[1-9][0-9]{0,3}m|[1-9][0-9]?h|([1-9]|[12][0-9]|3[01])d)$"
AT_PATTERN = (
    r"^(([0-9]{1,9}|[1-3][0-9]{9}|40[0-9]{8})(\.[0-9]{1,9})?"
    r"|(19[7-9][0-9]|20[0-9]{2})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
    r"(T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?(Z|[+-](0[0-9]|1[0-4]):[0-5][0-9])?)?)$"
)
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,256}$"
_WINDOW, _AT, _NAME = re.compile(WINDOW_PATTERN), re.compile(AT_PATTERN), re.compile(NAME_PATTERN)


class ParamError(HTTPException):
    """A 4xx naming the parameter (rule 4)."""

    def __init__(self, parameter: str, message: str, status: int = 400, **extra: Any):
        super().__init__(status_code=status, detail={"parameter": parameter, "message": message, **extra})


def parse_window(text: str, parameter: str = "window") -> float:
    """Rule 1: ``"15m"`` → 900.0 seconds."""
    if not _WINDOW.fullmatch(text):
        raise ParamError(
            parameter,
            f"{text[:64]!r} is not a window: a whole number with s, m, h or d, at most 31d (e.g. 15m)",
        )
    unit = text[-1] if text[-1] in _UNITS else "s"
    return float(text.rstrip("smhd")) * _UNITS[unit]


def parse_at(text: str | None) -> int | None:
    """Rule 2: Unix seconds or ISO-8601 → ns; ``None`` when absent."""
    if text is None or text == "":
        return None
    if not _AT.fullmatch(text):
        raise ParamError("at", f"{text[:64]!r} is neither Unix seconds nor an ISO-8601 time (1970-2099)")
    if "-" not in text:  # ISO-8601 dates always hold a "-"
        return int(float(text) * NS)
    dt = datetime.fromisoformat(text)
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * NS)


def check_name(name: str) -> str:
    """Rule 3 (format only; existence is checked against the store): a name with a control
    character names no deployment, so it is a 404 like any unknown name (the OpenAPI schema
    leaves it out of its pattern: generators read ``$`` and escapes differently)."""
    if not _NAME.fullmatch(name):
        raise ParamError("name", f"{name[:140]!r} names no deployment (control characters)", status=404)
    return name


def unknown_deployment(name: str, known: list[str]) -> ParamError:
    return ParamError("name", f"no deployment {name!r}", status=404, known=known)
