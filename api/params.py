"""Request parameters: time windows, window ends and deployment names, validated with clear 4xx.

Rules:
  1. ``window`` is a positive number with an optional unit ``s``, ``m``, ``h`` or ``d``
     (``15m``, ``900``, ``1.5h``), at most :data:`MAX_WINDOW_S` (31 days). Anything else → 400
     naming ``window`` and quoting the value.
  2. ``at`` (the window end) is Unix seconds or an ISO-8601 time (UTC when it carries no zone).
     Absent → the newest sample in the store, so a historical store is analyzed where its data is.
  3. A deployment name matches ``[A-Za-z0-9_.:-]{1,128}`` (the config's own pattern); a malformed
     one → 400, an unknown one → 404 listing the known names. (An inferred deployment named after a
     model id with ``/`` cannot be addressed by path: declare it with a name in the config.)
  4. Every error body is ``{"detail": {"parameter": ..., "message": ...}}``.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException

NS = 1_000_000_000
MAX_WINDOW_S = 31 * 86400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_WINDOW = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
_NAME = re.compile(NAME_PATTERN)


class ParamError(HTTPException):
    """A 4xx naming the parameter (rule 4)."""

    def __init__(self, parameter: str, message: str, status: int = 400, **extra: Any):
        super().__init__(status_code=status, detail={"parameter": parameter, "message": message, **extra})


def parse_window(text: str, parameter: str = "window") -> float:
    """Rule 1: ``"15m"`` → 900.0 seconds."""
    m = _WINDOW.fullmatch(text)
    if not m:
        raise ParamError(parameter, f"{text!r} is not a duration: use a number with s, m, h or d (e.g. 15m)")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not 0 < seconds <= MAX_WINDOW_S:
        raise ParamError(parameter, f"{text!r} must be > 0 and at most 31d")
    return seconds


def parse_at(text: str | None) -> int | None:
    """Rule 2: Unix seconds or ISO-8601 → ns; ``None`` when absent."""
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value):
        if not 0 <= value < 4e9:
            raise ParamError("at", f"{text!r} is outside 1970..2096 in Unix seconds")
        return int(value * NS)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ParamError("at", f"{text!r} is neither Unix seconds nor an ISO-8601 time") from exc
    if dt.year < 1970:
        raise ParamError("at", f"{text!r} is before 1970")
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * NS)


def check_name(name: str) -> str:
    """Rule 3 (format only; existence is checked against the store)."""
    if not _NAME.fullmatch(name):
        raise ParamError("name", f"{name[:140]!r} is not a deployment name ({NAME_PATTERN})")
    return name


def unknown_deployment(name: str, known: list[str]) -> ParamError:
    return ParamError("name", f"no deployment {name!r}", status=404, known=known)
