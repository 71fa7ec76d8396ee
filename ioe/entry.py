"""The ``ioe`` entry point: the root help and ``--version`` without importing typer.

Rules:
  1. ``ioe --help`` and ``ioe -h`` print the root help to stdout and exit 0; ``ioe`` alone prints
     it to stderr and exits 2 (click's ``no_args_is_help``). The text is rendered here from the
     command index (:mod:`ioe.commands._index`) in click's plain layout: the same bytes as the
     complete application's help at the same width (tests/test_cli_startup.py compares them).
     Importing typer (and its click) alone took longer than the 0.15 s the whole command may take.
  2. ``ioe --version`` prints ``ioe <version>`` (:func:`api.openapi.package_version`).
  3. ``ioe sidecar …`` goes to :func:`ioe.sidecar.main`, which starts a collector-only agent
     without typer or pydantic and hands anything it does not parse to typer (its rule 1).
  4. Anything else goes to :func:`ioe.cli.main` (typer).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap

ROOT_HELP = "Inference Operating Envelope analyzer: which wall each LLM inference deployment is against."
OPTIONS = (("--version", "Print the version and exit."), ("-h, --help", "Show this message and exit."))


def help_width() -> int:
    """click's default help width: the terminal's columns capped at 80, less 2, at least 50."""
    return max(min(shutil.get_terminal_size().columns, 80) - 2, 50)


def program_name() -> str:
    """How click names the program: ``python -m PKG`` when run as a module, else argv[0]'s name."""
    package = getattr(sys.modules.get("__main__"), "__package__", None)
    if not package:
        return os.path.basename(sys.argv[0])
    return f"python -m {package.lstrip('.')}"


def _definitions(rows: list[tuple[str, str]], width: int) -> list[str]:
    """click's ``write_dl`` at indent 2: the first column up to 30 wide, 2 spaces, text wrapped."""
    first = min(max(len(name) for name, _ in rows), 30) + 2
    text_width = max(width - first - 2, 10)
    out = []
    for name, text in rows:
        lines = textwrap.TextWrapper(text_width, replace_whitespace=False).wrap(" ".join(text.split()))
        if len(name) <= first - 2:
            head = f"  {name}".ljust(first + 2)
        else:
            out.append(f"  {name}")
            head = " " * (first + 2)
        if not lines:
            out.append(head.rstrip())
            continue
        out.append(head + lines[0])
        out.extend(" " * (first + 2) + line for line in lines[1:])
    return out


def root_help(prog: str, width: int) -> str:
    """Rule 1's text."""
    from ioe.commands._index import COMMANDS

    wrap = textwrap.TextWrapper(width, initial_indent="  ", subsequent_indent="  ", replace_whitespace=False)
    lines = [f"Usage: {prog} [OPTIONS] COMMAND [ARGS]...", "", *wrap.wrap(ROOT_HELP), "", "Options:"]
    lines += _definitions(list(OPTIONS), width)
    lines += ["", "Commands:"]
    lines += _definitions([(name, text.split("\n\n")[0]) for name, _, text in COMMANDS], width)
    return "\n".join(lines) + "\n"


def configure_logging() -> None:
    """Every command's log set-up: INFO and up on stderr, HTTP clients' and uvicorn's access
    lines at WARNING."""
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main() -> None:
    args = sys.argv[1:]
    if args in ([], ["--help"], ["-h"]):
        (sys.stdout if args else sys.stderr).write(root_help(program_name(), help_width()))
        raise SystemExit(0 if args else 2)
    if args == ["--version"]:
        from api.openapi import package_version

        print(f"ioe {package_version()}")
        raise SystemExit(0)
    if args[0] == "sidecar":
        from ioe.sidecar import main as sidecar_main

        sidecar_main(args[1:])
        return
    from ioe.cli import main as typer_main

    typer_main()
