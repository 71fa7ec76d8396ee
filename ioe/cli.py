"""The ``ioe`` command. Each sub-command lives in its own module under :mod:`ioe.commands`.

A module there defines ``register(app: typer.Typer) -> None``; every such module is found and
registered here, so adding a command never means editing this file.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

import typer

import ioe.commands

app = typer.Typer(
    name="ioe",
    help="Inference Operating Envelope analyzer: which wall each LLM inference deployment is against.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(ioe.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"ioe.commands.{info.name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(app)


_register_all()


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    app()


if __name__ == "__main__":
    main()
