"""The ``ioe`` command. Each sub-command lives in its own module under :mod:`ioe.commands`.

A module there defines ``register(app: typer.Typer) -> None``; every such module is found and
registered here. A new command is its module plus its row in :mod:`ioe.commands._index`
(tests/test_cli_startup.py fails until the row matches), never an edit of this file.

Rules:
  1. ``ioe NAME …`` registers only the module that defines NAME (:data:`ioe.commands._index.COMMANDS`),
     so a command carries only its own imports: ``ioe sidecar`` would otherwise load every
     analysis module (numpy and the analyzer: +13 MB resident for its whole life).
  2. ``ioe``, ``ioe --help``, ``ioe -h`` and ``ioe --version`` never reach this module: the entry
     point (:mod:`ioe.entry`) prints them without typer. Called here (``ioe.cli.main``), they list
     the commands from that index without importing any command module; ``--version`` registers
     none.
  3. Anything else (an unknown command, a misplaced option) registers every module, so the error
     is typer's own. ``ioe.cli.app`` imported from Python is always the complete application.

Help is plain text (click's layout, no rich panels). ``-h`` is ``--help`` everywhere;
``--version`` prints ``ioe <version>`` (:func:`api.openapi.package_version`).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

import ioe.commands
from ioe.commands._index import COMMANDS
from ioe.entry import OPTIONS, ROOT_HELP, configure_logging

if TYPE_CHECKING:
    from typer._click import Context, HelpFormatter  # typer's own click (typer 0.2x vendors it)


class _Group(TyperGroup):
    """The root group; its command list shows each command's first help paragraph in full,
    wrapped (click's plain layout cuts it to one line ending in "...")."""

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                text = (cmd.short_help or cmd.help or "").split("\n\n")[0]
                rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _new_app() -> typer.Typer:
    app = typer.Typer(
        name="ioe",
        cls=_Group,
        help=ROOT_HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # plain help and usage errors: rendering them with rich imports rich and markdown-it, which
        # took more than the rest of `ioe --help` together (bench/bench_startup.py)
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_root)
    return app


def _print_version(value: bool) -> None:
    if value:
        from api.openapi import package_version

        typer.echo(f"ioe {package_version()}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help=dict(OPTIONS)["--version"]
    ),
) -> None:
    """Inference Operating Envelope analyzer: which wall each LLM inference deployment is against."""
    # a callback keeps ``ioe`` a command group when only one command is registered (rule)


_app = _new_app()
_registered: set[str] = set()


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


def _listing() -> typer.Typer:
    """A separate application with a placeholder per command carrying its indexed help (rule 2):
    enough for the root help, which never runs a command. It is never the shared application, whose
    commands must stay the real ones."""
    app = _new_app()
    for name, _, text in COMMANDS:
        app.command(name, help=text)(_placeholder)
    return app


def _placeholder() -> None:  # never invoked: only the root help is printed from the listing
    raise typer.Exit(2)


def _for_argv(argv: list[str]) -> typer.Typer:
    """The application with just the invoked command's module, the listing, or everything (rules)."""
    args = argv[1:]
    if args == ["--version"]:
        return _app
    if args in ([], ["--help"], ["-h"]):
        return _listing()
    module = {name: module for name, module, _ in COMMANDS}.get(args[0])
    return _register([module] if module else _modules())


def __getattr__(name: str) -> Any:
    if name == "app":
        return _register(_modules())
    raise AttributeError(name)


def main() -> None:
    configure_logging()
    _for_argv(sys.argv)()


if __name__ == "__main__":
    main()
