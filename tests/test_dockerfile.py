"""deploy/docker/Dockerfile builds and installs what tests/test_wheel_install.py proves runs.

No Docker engine runs here, so the file is read, not built:

1. the build stage copies every package the wheel ships (pyproject's package list) and every file
   the build reads (pyproject.toml, the readme, the licence files), and builds the wheel with
   ``pip wheel --no-deps`` as the wheel test does;
2. the run stage copies only that wheel from the build stage (no source tree, so the commands
   import the installed packages, as in the wheel test) and installs it with ``pip install`` and
   no extras: its declared dependencies, the set the wheel test runs serve, the sidecar with the
   API, estimate and demo with;
3. the image runs ``ioe`` with a config that loads, and the sidecar config it copies exists.
"""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

from ioe.settings import load_settings

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), continuations joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), rest.strip()))
    return stages


def _copies(stage: list[tuple[str, str]]) -> list[str]:
    out = []
    for word, rest in stage:
        if word == "COPY" and not rest.startswith("--"):
            *sources, _dest = rest.split()
            out += [s.rstrip("/") for s in sources]
    return out


def test_build_stage_copies_every_shipped_package_and_what_the_build_reads() -> None:
    build = instructions()[0]
    assert build[0] == ("FROM", "python:3.11-slim AS build")
    copied = set(_copies(build))
    shipped = {name.rstrip("*") for name in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    project = PYPROJECT["project"]
    read_by_build = {"pyproject.toml", project["readme"], *project["license-files"]}
    assert shipped | read_by_build <= copied
    for path in copied:
        assert (ROOT / path).exists(), f"the Dockerfile copies {path}, which the checkout lacks"
    runs = [rest for word, rest in build if word == "RUN"]
    assert runs == [
        "pip wheel --no-deps -w /dist ."
    ]  # the wheel test's build (test_wheel_install.build_wheel)


def test_run_stage_installs_that_wheel_alone_without_extras() -> None:
    run = instructions()[-1]
    assert run[0] == ("FROM", "python:3.11-slim")
    assert ("COPY", "--from=build /dist /tmp/dist") in run
    assert not any(p in ("ioeconf", "collector", "analyzer", "api", "ioe", "simulate") for p in _copies(run))
    installs = [rest for word, rest in run if word == "RUN" and "pip install" in rest]
    assert installs == ["pip install /tmp/dist/ioe_analyzer-*.whl && rm -rf /tmp/dist"]
    assert "[" not in installs[0]  # no extras: the declared dependencies the wheel test installs


def test_image_runs_ioe_with_a_config_that_loads() -> None:
    run = instructions()[-1]
    assert ("ENTRYPOINT", '["ioe"]') in run
    assert ("CMD", '["sidecar", "--config", "/etc/ioe/sidecar.yaml"]') in run
    (source,) = [
        rest.split()[0] for word, rest in run if word == "COPY" and rest.endswith("/etc/ioe/sidecar.yaml")
    ]
    settings = load_settings(ROOT / source, environ={})
    assert settings.store_path.startswith("/var/lib/ioe/")
