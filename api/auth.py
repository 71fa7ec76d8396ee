"""One auth rule for every route, over HTTP (this module) and gRPC (:mod:`collector.sources.otlp_grpc`).

Rules:
  1. No token configured (``settings.token()`` empty) → every request passes. A server that
     listens beyond loopback without a token refuses to start unless ``allow_unauthenticated``
     says so (``Settings.exposure_problem``, checked by ``ioe serve`` and ``ioe sidecar``).
  2. With a token, every route needs it except :data:`PUBLIC` (``/healthz``, ``/readyz``,
     ``/metrics`` — probes and Prometheus scrapes carry no credentials — and ``/login``).
     ``/v1/traces`` checks it itself, to answer in the OTLP error shape (:mod:`api.otlp`).
  3. The token comes as ``Authorization: Bearer <token>`` and is compared in constant time. A
     ``GET``/``HEAD`` may carry it instead in the ``ioe_token`` cookie that ``POST /login`` sets
     (HttpOnly, SameSite=Strict), so a browser can open the page, ``/docs`` and the JSON the page
     reads; a request that changes or submits something always needs the header.
  4. A configured token file that cannot be read refuses every request with 503: the server
     fails closed rather than open.
  5. A refused page request (``GET`` of ``/``, ``/deployments/…``, ``/docs``, ``/redoc``) gets the
     login form with 401; any other refused request gets ``{"detail": {"parameter":
     "authorization", "message": …}}`` with 401 and ``WWW-Authenticate: Bearer``.

:class:`AuthGate` is the ASGI middleware enforcing rules 2-5; :func:`token_problem` is the same
check for routes that shape their own error body (OTLP).
"""

from __future__ import annotations

import hmac
import html
import json
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from api.limits import ASGIApp, Receive, Scope, Send

PUBLIC = frozenset({"/healthz", "/readyz", "/metrics", "/login"})
SELF_CHECKED = frozenset({"/v1/traces"})
COOKIE = "ioe_token"
_PAGES = ("/", "/docs", "/redoc")
_LOGIN_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
router = APIRouter(include_in_schema=False)


def check_token(expected: str, given: str) -> bool:
    """Rule 3's comparison: constant time, on bytes."""
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def _bearer(header: str) -> str:
    scheme, _, given = header.partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def credential_problem(
    token: Callable[[], str], authorization: str, cookie: str, method: str
) -> tuple[int, str] | None:
    """``None`` when the credentials pass, else ``(http_status, message)`` (rules 1, 3, 4)."""
    try:
        expected = token()
    except OSError as exc:
        return 503, f"server token file cannot be read ({exc.strerror})"
    if not expected:
        return None
    given = _bearer(authorization)
    if not given and method in ("GET", "HEAD"):
        given = _cookie(cookie)
    if not given:
        return 401, "missing bearer token (send 'Authorization: Bearer <token>')"
    if not check_token(expected, given):
        return 401, "wrong bearer token"
    return None


def _cookie(header: str) -> str:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no credential
        return ""
    morsel = jar.get(COOKIE)
    return morsel.value if morsel else ""


def token_problem(request: Request) -> tuple[int, str] | None:
    """Rules 1, 3, 4 for a FastAPI request."""
    return credential_problem(
        request.app.state.settings.token,
        request.headers.get("authorization", ""),
        request.headers.get("cookie", ""),
        request.method,
    )


class AuthGate:
    """ASGI middleware for rules 2-5; ``token`` reads the configured token (may raise OSError)."""

    def __init__(self, app: ASGIApp, token: Callable[[], str]):
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in PUBLIC or path in SELF_CHECKED:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        problem = credential_problem(
            self.token, headers.get("authorization", ""), headers.get("cookie", ""), method
        )
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, message = problem
        if method == "GET" and status == 401 and _is_page(path):
            query = scope.get("query_string", b"").decode("latin-1")
            page = login_page(path + ("?" + query if query else ""))
            csp = [(b"content-security-policy", _LOGIN_CSP.encode())]
            await _send(send, 401, page, "text/html; charset=utf-8", csp)
            return
        body = json.dumps({"detail": {"parameter": "authorization", "message": message}}).encode()
        extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        await _send(send, status, body, "application/json", extra)


def _is_page(path: str) -> bool:
    return path in _PAGES or path.startswith("/deployments/")


async def _send(
    send: Send, status: int, body: bytes | str, media: str, extra: list[tuple[bytes, bytes]]
) -> None:
    data = body.encode() if isinstance(body, str) else body
    headers = [(b"content-type", media.encode()), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def login_page(next_path: str, message: str = "") -> str:
    """Rule 5's form: posts the token to ``/login``, which sets the cookie and goes back."""
    note = f'<p class="err">{html.escape(message)}</p>' if message else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>IOE — sign in</title>"
        "<style>body{font:15px system-ui,sans-serif;margin:4em auto;max-width:26em}"
        "input{width:100%;padding:.4em;margin:.5em 0}.err{color:#b00}</style></head><body>"
        "<h1>IOE</h1><p>This server needs its bearer token.</p>" + note + '<form method=post action="/login">'
        f'<input type=hidden name=next value="{html.escape(_safe_next(next_path), quote=True)}">'
        '<input type=password name=token autocomplete=current-password placeholder="bearer token" autofocus>'
        "<button type=submit>Sign in</button></form></body></html>"
    )


def _safe_next(path: str) -> str:
    """Only a path on this server (no scheme, no host, no ``//``): never an open redirect."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"


@router.post("/login")
async def login(request: Request) -> Response:
    """Rule 3: a form post with the right token sets the cookie and returns to ``next``."""
    raw = await request.body()
    form = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=4)
    given = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or ["/"])[0])
    try:
        expected = request.app.state.settings.token()
    except OSError as exc:
        return _json(503, f"server token file cannot be read ({exc.strerror})")
    if not expected:
        return RedirectResponse(quote(target, safe="/?=&%-._~"), status_code=303)
    if not check_token(expected, given):
        return HTMLResponse(login_page(target, "Wrong token."), status_code=401,
                            headers={"Content-Security-Policy": _LOGIN_CSP})  # fmt: skip
    resp = RedirectResponse(quote(target, safe="/?=&%-._~"), status_code=303)
    resp.set_cookie(COOKIE, given, httponly=True, samesite="strict", path="/",
                    secure=request.url.scheme == "https")  # fmt: skip
    return resp


def _json(status: int, message: str) -> Response:
    body: dict[str, Any] = {"detail": {"parameter": "authorization", "message": message}}
    return Response(json.dumps(body), status_code=status, media_type="application/json")
