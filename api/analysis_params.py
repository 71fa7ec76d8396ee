"""Analysis settings per request: any field of :class:`analyzer.thresholds.Thresholds` as a query
parameter of the routes that judge (the envelope and the deployment list).

Rules:
  1. Each field is its own optional query parameter, by its own name and with its own description
     (``?bin_s=30&zone_min_score=0.7``); the OpenAPI schema lists them all.
  2. A request's fields replace the server's (config ``analysis:`` block < ``IOE_ANALYSIS__*`` <
     request), field by field; the merged object is validated as a whole. A value of the wrong type
     or out of the field's bounds (published in the schema) → 422 naming it, like every query
     parameter; one failing a rule across fields (``regression_baseline=reference`` without its
     window) → 400 naming the parameter and quoting the value. Nothing is computed for either.
     A setting given twice is refused the same way (which one was meant cannot be told).
  3. A request with any field set is never answered from the refresher's snapshot of the default
     window (that snapshot was computed under the server's settings): it is computed, and cached
     under its own key (the sorted overrides).
  4. Every envelope answer carries the settings in force (``settings``) and the names set by the
     request (``settings_from_request``), so a verdict can be read with the thresholds it used.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import Query, Request
from pydantic import ValidationError

from analyzer.thresholds import Thresholds
from api.params import ParamError

Overrides = tuple[tuple[str, Any], ...]
_TYPES = (float, int, str, bool)


def _query_type(annotation: Any) -> Any:
    """``float | None`` and ``float`` both travel as an optional float."""
    for kind in _TYPES:
        if annotation is kind or kind in getattr(annotation, "__args__", ()):
            return kind
    return str


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    """The field's own bounds and pattern, published in the schema and checked by FastAPI (422)."""
    out: dict[str, Any] = {}
    for m in metadata:
        for attr in ("gt", "ge", "lt", "le", "pattern"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def _parameters() -> list[inspect.Parameter]:
    out = [inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request)]
    for name, field in Thresholds.model_fields.items():
        kind = _query_type(field.annotation)
        doc = f"analysis setting (default {field.default!r}): {field.description or name}"
        extra: dict[str, Any] = {"allow_inf_nan": False} if kind is float else {}
        query = Query(description=doc, **_bounds(field.metadata), **extra)
        annotated = Annotated[kind | None, query]  # type: ignore[valid-type]
        out.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotated)
        )
    return out


def analysis_overrides(request: Request, **given: Any) -> Overrides:
    """Rules 1-2: the fields this request set, sorted by name (a hashable cache key part),
    refused here, before the route runs, when merged over the server's settings they fail."""
    overrides = tuple(sorted((k, v) for k, v in given.items() if v is not None))
    for name, _ in overrides:
        times = len(request.query_params.getlist(name))
        if times > 1:
            raise ParamError(name, f"{name} is given {times} times; give it once")
    merged(analysis_settings(request.app), overrides)
    return overrides


analysis_overrides.__signature__ = inspect.Signature(_parameters(), return_annotation=Overrides)  # type: ignore[attr-defined]


def analysis_settings(app: Any) -> Thresholds | None:
    """The app's analysis settings (the config's ``analysis:`` block), the same object the CLI uses."""
    settings = getattr(app.state, "settings", None)
    return settings.thresholds() if settings is not None and hasattr(settings, "thresholds") else None


def merged(base: Thresholds | None, overrides: Overrides) -> Thresholds | None:
    """Rule 2: the server's settings with the request's fields over them, validated; ``base``
    when the request set none."""
    if not overrides:
        return base
    data = {**(base or Thresholds()).model_dump(), **dict(overrides)}
    try:
        return Thresholds.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        name = loc[0] if loc else _cross_field_name(overrides)
        value = dict(overrides).get(name, data.get(name))
        message = err["msg"].removeprefix("Value error, ")
        raise ParamError(name, f"{name}={value!r}: {message}") from None


def _cross_field_name(overrides: Overrides) -> str:
    """A cross-field failure names the request's field it involves (the baseline mode first)."""
    names = [k for k, _ in overrides]
    for name in ("regression_baseline", "regression_reference_start_s", "regression_reference_end_s"):
        if name in names:
            return name
    return names[0]
