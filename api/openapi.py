"""The package version, and the OpenAPI document and its documentation pages.

Rules:
  1. :func:`package_version` is, in a checkout, the ``version`` of the ``pyproject.toml`` beside
     the packages (when it names ``ioe-analyzer``); otherwise the installed distribution's
     version, read from its metadata; ``0+unknown`` when neither exists. The checkout comes
     first because it is what runs (an editable install's metadata may name another checkout),
     and because importing :mod:`importlib.metadata` alone costs about what the rest of
     ``ioe --version`` does.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

DISTRIBUTION = "ioe-analyzer"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_version() -> str:
    """Rule 1."""
    try:
        project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    if project.get("name") == DISTRIBUTION and isinstance(project.get("version"), str):
        return str(project["version"])
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"
