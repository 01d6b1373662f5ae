"""Format, lint and type checks run as part of the test command, so CI fails on any of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize(
    "args",
    [["ruff", "format", "--check", "."], ["ruff", "check", "."], ["mypy"]],
    ids=["ruff-format", "ruff-check", "mypy"],
)
def test_tool_passes(args: list[str]) -> None:
    proc = subprocess.run([_tool(args[0]), *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
