"""bench/bench_revisions.py times two checkouts against each other; run here with this checkout on both sides
(TorchScript, and the C step whose one-frame call is timed another way; a few rounds): the table has its rows,
finite positive ratios, and identical outputs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_revisions.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("backend", ["torchscript", "native-int8"])
def test_same_checkout_on_both_sides(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "revisions.md"
    done = run(
        *("--base", str(ROOT), "--backends", backend, "--rounds", "2", "--calls", "3"),
        *("--seconds", "0.5", "--out", str(out)),
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith(f"| {backend} |")
    ]
    assert [r[1].strip() for r in rows] == [
        "step, 1 frame (ms per call)",
        "engine, 16-ms chunks (RTF)",
        "engine, 32-ms chunks (RTF)",
    ]
    for row in rows:
        base, current, ratio = (float(row[i]) for i in (2, 3, 4))
        assert all(math.isfinite(v) and v > 0 for v in (base, current, ratio))
        assert float(row[5]) == 0.0  # the same code and model on both sides: the same samples


def test_refuses_a_folder_that_is_not_a_checkout(tmp_path: Path) -> None:
    done = run("--base", str(tmp_path), "--backends", "torchscript", "--out", str(tmp_path / "x.md"))
    assert done.returncode == 2
    assert "is not a checkout of tim-enhance" in done.stderr
    assert not (tmp_path / "x.md").exists()
