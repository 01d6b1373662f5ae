"""Every command pyproject.toml installs is on the path of this environment, and its --help names it as installed
(a usage line naming a command that pip never made sends users looking for it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _scripts() -> dict[str, str]:
    """The ``[project.scripts]`` table (read by hand: tomllib is Python 3.11+, the package supports 3.10)."""
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    start = lines.index("[project.scripts]") + 1
    table = {}
    for line in lines[start:]:
        if line.startswith("["):
            break
        if "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            table[key] = value.strip('"')
    return table


SCRIPTS = _scripts()


def test_the_recipes_commands_are_installed() -> None:
    assert {"enhance-cli", "enhance-server", "tim-train", "tim-evaluate", "tim-compare"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_command_runs_and_its_usage_names_it(name: str) -> None:
    path = Path(sys.executable).parent / name
    assert path.exists(), (
        f"{name} is not installed: pip install -e '.[dev]' again after changing pyproject.toml"
    )
    proc = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {name} "), proc.stdout[:200]
