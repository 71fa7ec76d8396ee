"""The package version, and the OpenAPI document and its documentation pages.

Rules:
  1. :func:`package_version` is the installed distribution's version (``ioe-analyzer``, read from
     its metadata); in a checkout where that distribution is not installed, the ``version`` of
     the ``pyproject.toml`` beside the packages; ``0+unknown`` when neither exists.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "ioe-analyzer"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_version() -> str:
    """Rule 1."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "0+unknown"
    if project.get("name") != DISTRIBUTION or not isinstance(project.get("version"), str):
        return "0+unknown"
    return str(project["version"])
