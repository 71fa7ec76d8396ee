"""Validated settings as plain objects, for a process that must not import pydantic.

A collector-only sidecar (``api_enabled: false``) budgets 100 MB resident for its whole life, and
pydantic with the settings models is ~10 MB of it (bench/results/sidecar.md). Validation stays
exactly as strict: it is :func:`ioeconf.settings.load_settings` itself, run in a short-lived child
process, which hands back the validated settings as JSON.

Rules:

1. :func:`validated` runs ``load_settings(config, args=args)`` in a child process (this process's
   ``sys.path`` and environment, so the same code and the same ``IOE_*`` overrides). Invalid
   settings raise :class:`SettingsError` with the child's message: the same text, field and origin
   as in-process validation. A child that fails otherwise raises ``RuntimeError`` with its stderr.
2. :class:`PlainSettings` holds every field of the validated ``Settings`` as an attribute, the
   nested models (targets, Prometheus sources, deployments, readers, OTLP) as :class:`Plain`
   objects with their fields, and the methods the agent calls: ``exposure_problem``, ``token``,
   and each deployment's ``model_dump_json`` (the child's own dump).
3. Nothing here imports pydantic, YAML or TOML parsers: the child reads the config file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the field and its origin."""


_CHILD = (
    "import json, sys\n"
    "sys.path[:] = json.loads(sys.argv[1])\n"
    "from ioeconf.settings import SettingsError, load_settings\n"
    "ask = json.loads(sys.stdin.read())\n"
    "try:\n"
    "    s = load_settings(ask['config'], args=ask['args'])\n"
    "except SettingsError as exc:\n"
    "    print(json.dumps({'error': str(exc)}))\n"
    "else:\n"
    "    dump = s.model_dump(mode='json')\n"
    "    dump['deployments_json'] = [d.model_dump_json() for d in s.deployments]\n"
    "    print(json.dumps({'settings': dump}))\n"
)


def validated(config: str | Path | None, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Rule 1: the validated settings' JSON dump (plus ``deployments_json``)."""
    ask = json.dumps({"config": None if config is None else str(config), "args": dict(args or {})})
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(sys.path)],
        input=ask,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=False,
    )
    try:
        got = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        got = None
    if done.returncode != 0 or not isinstance(got, dict):
        raise RuntimeError(f"settings could not be validated: {done.stderr.strip() or done.stdout.strip()}")
    if "error" in got:
        raise SettingsError(got["error"])
    return dict(got["settings"])


class Plain:
    """A validated model's fields as attributes (rule 2)."""

    def __init__(self, fields: Mapping[str, Any]):
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:  # only for names that are not fields
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__!r})"


class PlainDeployment(Plain):
    def __init__(self, fields: Mapping[str, Any], dumped: str):
        super().__init__(fields)
        self._json = dumped

    def model_dump_json(self) -> str:
        return self._json


class PlainSettings(Plain):
    """Rule 2: ``Settings`` without pydantic, from :func:`validated`'s dump."""

    def __init__(self, dump: Mapping[str, Any]):
        fields = dict(dump)
        dumped = fields.pop("deployments_json", None) or [json.dumps(d) for d in fields["deployments"]]
        fields["targets"] = [Plain(t) for t in fields["targets"]]
        fields["prometheus_sources"] = [Plain(p) for p in fields["prometheus_sources"]]
        fields["deployments"] = [
            PlainDeployment(d, j) for d, j in zip(fields["deployments"], dumped, strict=True)
        ]
        fields["readers"] = Plain(fields["readers"])
        fields["otlp"] = Plain(fields["otlp"])
        super().__init__(fields)

    def exposure_problem(self) -> str | None:
        return exposure_problem(
            self.listen_host, self.auth_token, self.auth_token_file, self.allow_unauthenticated
        )

    def token(self) -> str:
        return token(self.auth_token, self.auth_token_file)


def exposure_problem(listen_host: str, auth_token: str, auth_token_file: str, allow: bool) -> str | None:
    """Why serving on ``listen_host`` (HTTP and OTLP/gRPC) is refused, or ``None``: beyond
    loopback a server needs a token unless ``allow_unauthenticated`` is set."""
    if auth_token or auth_token_file or allow:
        return None
    if loopback(listen_host):
        return None
    return (
        f"refusing to listen on {listen_host or 'all addresses'} without a token: set auth_token or "
        "auth_token_file (IOE_AUTH_TOKEN_FILE), or allow_unauthenticated: true to serve anyone who can "
        "reach the port"
    )


def token(auth_token: str, auth_token_file: str) -> str:
    """The bearer token: the file's content when a file is named, else ``auth_token``."""
    if auth_token_file:
        return Path(auth_token_file).read_text().strip()
    return auth_token


def loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
