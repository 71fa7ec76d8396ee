"""Bearer-token check for ingest (and, when configured, read) routes.

Rules:
  1. No token configured (``settings.token()`` empty) → every request passes.
  2. Otherwise the request must carry ``Authorization: Bearer <token>`` with exactly that
     token (compared in constant time); anything else is refused with 401.
  3. A configured token file that cannot be read refuses every request with 503: the
     server fails closed rather than open.

:func:`require_token` is the FastAPI dependency; :func:`token_problem` is the same check
returning ``(status, message)`` for routes that must shape their own error body (OTLP).
"""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request


def token_problem(request: Request) -> tuple[int, str] | None:
    """``None`` when the request may proceed, else ``(http_status, message)`` (rules 1–3)."""
    try:
        expected = request.app.state.settings.token()
    except OSError as exc:
        return 503, f"server token file cannot be read ({exc.strerror})"
    if not expected:
        return None
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return 401, "missing bearer token (send 'Authorization: Bearer <token>')"
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return 401, "wrong bearer token"
    return None


def require_token(request: Request) -> None:
    """FastAPI dependency: raises 401 (with ``WWW-Authenticate: Bearer``) or 503."""
    problem = token_problem(request)
    if problem is not None:
        status, message = problem
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        raise HTTPException(status_code=status, detail=message, headers=headers)
