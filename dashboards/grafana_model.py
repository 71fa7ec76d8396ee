"""A small Grafana dashboard model: plain dicts in the JSON shape of Grafana's v1 dashboard API (schema 42).

Only what IOE's dashboards use: Prometheus targets, timeseries / stat / table panels, a datasource variable
and query variables. Layout is automatic: panels flow left to right in a 24-column grid.

Notes:
1. Every panel and target names the datasource by the ``${datasource}`` variable, so one import works against
   any Prometheus; the variable is of type ``datasource`` restricted to ``prometheus``.
2. Panel ids are assigned 1..n in order, so the JSON is stable between runs (the committed files are compared
   byte for byte with a fresh build).
3. Query variables are multi-valued with "All"; the "All" value is the regex ``.*`` (``allValue``) so
   selectors written ``label=~"$var"`` also match series where the label is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24
# The last schema version of Grafana's v1 dashboard JSON (DashboardMigrator.ts in Grafana 12 calls 42 final);
# the panels here use no field that any migration up to it rewrites.
SCHEMA_VERSION = 42


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel; ``legend`` uses Grafana's ``{{label}}`` syntax."""

    expr: str
    legend: str = ""
    instant: bool = False

    def to_json(self, ref_id: str) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "refId": ref_id,
            "range": not self.instant,
            "instant": self.instant,
        }


@dataclass(frozen=True)
class Panel:
    """A panel: ``kind`` is ``timeseries``, ``stat`` or ``table``; ``width`` in grid columns (of 24)."""

    title: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    max_value: float | None = None
    threshold_line: float | None = None
    overrides: list[dict[str, Any]] = field(default_factory=list)
    stacked: bool = False  # timeseries: series stacked on each other (parts of a whole)

    def to_json(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        refs = [chr(ord("A") + i) for i in range(len(self.targets))]
        return {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "targets": [t.to_json(r) for t, r in zip(self.targets, refs, strict=True)],
            "fieldConfig": {"defaults": self._defaults(), "overrides": self.overrides},
            "options": _options(self.kind),
        }

    def _defaults(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        custom: dict[str, Any] = {}
        if self.threshold_line is not None:
            steps.append({"color": "red", "value": self.threshold_line})
            custom["thresholdsStyle"] = {"mode": "line"}
        if self.stacked:
            custom["stacking"] = {"mode": "normal", "group": "A"}
            custom["fillOpacity"] = 40
        out: dict[str, Any] = {
            "unit": self.unit,
            "thresholds": {"mode": "absolute", "steps": steps},
            "custom": custom,
        }
        if self.max_value is not None:
            out["max"] = self.max_value
        return out


def _options(kind: str) -> dict[str, Any]:
    if kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    if kind == "table":
        return {"showHeader": True}
    return {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}}


@dataclass(frozen=True)
class Variable:
    """A template variable: ``query`` is a Grafana ``label_values(...)`` expression."""

    name: str
    label: str
    query: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "type": "query",
            "datasource": DATASOURCE,
            "query": {"query": self.query, "refId": f"{self.name}-values"},
            "definition": self.query,
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
        }


def datasource_variable() -> dict[str, Any]:
    """The ``datasource`` variable every panel refers to (note 1)."""
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    }


def layout(panels: list[Panel]) -> list[dict[str, Any]]:
    """Place panels left to right, wrapping at 24 columns; ids 1..n in order (note 2)."""
    out, x, y, row_height = [], 0, 0, 0
    for number, panel in enumerate(panels, start=1):
        if x + panel.width > GRID_COLUMNS:
            x, y, row_height = 0, y + row_height, 0
        out.append(panel.to_json(number, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return out


def dashboard(
    uid: str, title: str, description: str, panels: list[Panel], variables: list[Variable]
) -> dict[str, Any]:
    """A complete dashboard object (import with Grafana's dashboard API or file provisioning)."""
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["ioe", "inference"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [datasource_variable(), *(v.to_json() for v in variables)]},
        "annotations": {"list": []},
        "links": [
            {"type": "dashboards", "tags": ["ioe"], "asDropdown": True, "title": "IOE", "includeVars": True}
        ],
        "panels": layout(panels),
    }
