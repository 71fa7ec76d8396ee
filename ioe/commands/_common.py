"""Helpers shared by sub-commands (no ``register``: not a command itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ioe.settings import Settings, SettingsError, load_settings


def settings_or_exit(config: Path | None, **args: Any) -> Settings:
    """The settings for a command, or exit 2 printing which field is wrong and where it came from."""
    try:
        return load_settings(config, args=args)
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


def exposure_or_exit(settings: Settings) -> None:
    """Exit 2 with one line when a server would listen beyond loopback without a token."""
    problem = settings.exposure_problem()
    if problem:
        typer.echo(problem, err=True)
        raise typer.Exit(2)
