"""The ``ioe`` command. Each sub-command lives in its own module under :mod:`ioe.commands`.

A module there defines ``register(app: typer.Typer) -> None``; every such module is found and
registered here, so adding a command never means editing this file.

Rule: ``ioe NAME …`` where ``ioe/commands/NAME.py`` exists registers that module alone (``-``
read as ``_``), so a long-running command carries only its own imports: ``ioe sidecar`` would
otherwise load every analysis module (numpy and the analyzer: +13 MB resident for its whole
life). ``ioe --version`` registers none. Anything else (``ioe --help``, ``ioe ingest``) registers
every module. ``ioe.cli.app`` imported from Python is always the complete application.

``-h`` is ``--help`` everywhere; ``--version`` prints ``ioe <version>`` (the installed
distribution's version, or the checkout's pyproject version: :func:`api.openapi.package_version`).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from typing import Any

import typer

import ioe.commands

_app = typer.Typer(
    name="ioe",
    help="Inference Operating Envelope analyzer: which wall each LLM inference deployment is against.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_registered: set[str] = set()


def _print_version(value: bool) -> None:
    if value:
        from api.openapi import package_version

        typer.echo(f"ioe {package_version()}")
        raise typer.Exit()


@_app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Inference Operating Envelope analyzer: which wall each LLM inference deployment is against."""
    # a callback keeps ``ioe`` a command group when only one command is registered (rule)


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(ioe.commands.__path__))


def _register(names: list[str]) -> typer.Typer:
    for name in names:
        if name in _registered:
            continue
        _registered.add(name)
        register = getattr(importlib.import_module(f"ioe.commands.{name}"), "register", None)
        if callable(register):
            register(_app)
    return _app


def _for_argv(argv: list[str]) -> typer.Typer:
    """The application with just the invoked command's module, or with all of them (rule)."""
    if argv[1:] == ["--version"]:
        return _app
    wanted = argv[1].replace("-", "_") if len(argv) > 1 else ""
    modules = _modules()
    return _register([wanted] if wanted in modules and not wanted.startswith("_") else modules)


def __getattr__(name: str) -> Any:
    if name == "app":
        return _register(_modules())
    raise AttributeError(name)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _for_argv(sys.argv)()


if __name__ == "__main__":
    main()
