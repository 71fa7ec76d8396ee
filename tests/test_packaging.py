"""What the checkout says about the package: its name, version, licence and changelog, the ``ioe``
command's ``--version`` and ``-h``, and where the deploy files say to install it from.

The wheel itself is built, installed and run in tests/test_wheel_install.py.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

from conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST = "ioe-analyzer"


def _ioe(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ioe", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_distribution_name_is_the_free_one() -> None:
    assert PROJECT["name"] == DIST
    assert PROJECT["scripts"] == {"ioe": "ioe.entry:main"}


def test_version_is_the_pyproject_version_in_a_checkout() -> None:
    done = _ioe("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ioe {PROJECT['version']}\n"


def test_h_is_help_on_the_group_and_on_a_command() -> None:
    for args in (("-h",), ("estimate", "-h")):
        short, long = _ioe(*args), _ioe(*args[:-1], "--help")
        assert short.returncode == long.returncode == 0, short.stderr
        assert short.stdout == long.stdout and "Usage:" in short.stdout
    assert "--version" in _ioe("-h").stdout


def test_licence_file_is_the_apache_2_text_the_metadata_names() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in text.splitlines()[1] and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_changelog_has_unreleased_and_the_current_version() -> None:
    heads = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert heads[:2] == ["## Unreleased", f"## {PROJECT['version']}"]


def test_install_instructions_name_the_distribution() -> None:
    unit = (ROOT / "deploy/systemd/ioe-sidecar.service").read_text()
    assert f"pip install {DIST}" in unit and "pip install ioe " not in unit
    assert "pip install dist/ioe_analyzer-" in (ROOT / "README.md").read_text()
