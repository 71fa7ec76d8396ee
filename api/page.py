"""The page: plain HTML, CSS and JavaScript served by the API itself (no CDN, no build step).

Rules:
  1. ``/`` (the deployments overview) and ``/deployments/{name}`` (one deployment's envelope; the
     name may hold ``/``, which links encode as ``%2F``) return the same HTML; the script reads
     the path and fetches only this API's ``/api/v1`` JSON. Charts are inline SVG drawn by the
     script.
  2. ``/static/{file}`` serves the files of ``api/static/`` listed in :data:`ASSETS` only.
  3. Every answer carries a Content-Security-Policy allowing only this origin, so nothing can be
     fetched from elsewhere at view time even by mistake.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Response

STATIC = Path(__file__).resolve().parent / "static"
ASSETS = {"app.js": "text/javascript", "app.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
router = APIRouter(include_in_schema=False)


def _file(name: str, media_type: str) -> Response:
    return Response((STATIC / name).read_bytes(), media_type=media_type,
                    headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})  # fmt: skip


@router.get("/")
def overview() -> Response:
    return _file("index.html", "text/html; charset=utf-8")


@router.get("/deployments/{name:path}")  # a model id as name holds "/"
def deployment_page(name: str) -> Response:
    return _file("index.html", "text/html; charset=utf-8")


@router.get("/static/{asset}")
def static(asset: str) -> Response:
    if asset not in ASSETS:
        raise HTTPException(404, detail={"parameter": "asset", "message": f"no asset {asset!r}"})
    return _file(asset, ASSETS[asset])
