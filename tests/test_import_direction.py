"""Imports run one way: a package imports only the packages below it.

Layers, lowest first (DESIGN.md: collector -> store -> analyzer -> api / ioe):

1. ``ioeconf``: the settings types every layer shares; imports no project package.
2. ``collector``: parsers, sources, the store and the agent; may import ``ioeconf``.
3. ``analyzer``: judgements over the store's SQL; may import ``ioeconf`` and ``collector``.
4. ``simulate``: the synthetic node; may import the layers below (it uses analyzer's catalogs).
5. ``api``: may import ``ioeconf``, ``collector``, ``analyzer``, never ``ioe`` or ``simulate``.
6. ``ioe``: the command line; may import everything.

Every module of every package is read with :mod:`ast`, including imports inside functions and
``if TYPE_CHECKING:`` blocks (a deferred import is still a dependency), and relative imports are
resolved against the module's own package.
"""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT

ALLOWED = {
    "ioeconf": set(),
    "collector": {"ioeconf"},
    "analyzer": {"ioeconf", "collector"},
    "simulate": {"ioeconf", "collector", "analyzer"},
    "api": {"ioeconf", "collector", "analyzer"},
    "ioe": {"ioeconf", "collector", "analyzer", "simulate", "api"},
}


def imported_packages(source: str, module: str) -> list[tuple[int, str]]:
    """(line, project package) for every import in ``source``, the text of module ``module``
    (dotted, e.g. ``collector.agent``), that names another project package."""
    package = module.split(".")[0]
    module_parts = module.split(".")
    out = []
    for node in ast.walk(ast.parse(source, module)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module_parts[: len(module_parts) - node.level]
                names = [".".join([*base, node.module or ""]).strip(".")]
            else:
                names = [node.module or ""]
        out += [(node.lineno, name.split(".")[0]) for name in names]
    return [(line, top) for line, top in out if top in ALLOWED and top != package]


def upward_imports() -> list[str]:
    found = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for line, top in imported_packages(path.read_text(), module):
                if top not in allowed:
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    return found


def test_no_package_imports_a_layer_above_it() -> None:
    assert upward_imports() == []


def test_every_shipped_package_has_a_layer() -> None:
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = {name.rstrip("*") for name in include["include"]} - {"dashboards"}
    assert shipped == set(ALLOWED)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("def f():\n    from api.app import create_app\n", "collector.agent", [(2, "api")]),
        ("if TYPE_CHECKING:\n    import ioe.settings\n", "api.x", [(2, "ioe")]),
        ("from . import store\n", "collector.agent", []),
        ("from ..ioe import cli\n", "api.sub.x", []),  # api.ioe: a relative import stays inside
        ("import polars, analyzer.envelope\n", "api.x", [(1, "analyzer")]),
    ],
)
def test_the_reader_sees_deferred_guarded_and_relative_imports(
    source: str, module: str, expected: list[tuple[int, str]]
) -> None:
    assert imported_packages(source, module) == expected
