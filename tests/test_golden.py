"""Golden regression test: the bundled default model on the committed example clip (made by the project).

The targets in ``tests/golden/example.json`` were written by ``python -m recipes.export`` from the same model file
(its sha256 is checked). Any change to the signal path, the model code or the weights that moves the metrics fails
here; re-export the model to accept a deliberate change. These targets only pin today's behaviour; the check
that does not come from the code under test is that every enhanced score beats the noisy input's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from models.checkpoint import file_sha256
from models.pretrained import pretrained_path
from recipes.export import EXAMPLE_CLEAN, EXAMPLE_NOISY, GOLDEN, file_section
from recipes.metrics import pesq_wb, si_sdr, stoi
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_golden_targets_belong_to_the_bundled_model(golden: dict) -> None:
    assert golden["model_sha256"] == file_sha256(pretrained_path()), (
        "bundled model changed: re-run recipes.export"
    )
    card = pretrained_path().with_suffix(".md").read_text()  # the model card describes this very file
    assert f"SHA-256 `{golden['model_sha256']}`" in card
    assert card.endswith(
        file_section("default", golden["model_sha256"])
    )  # the section export writes, heading too


def test_cli_on_example_meets_stored_targets(tmp_path: Path, golden: dict) -> None:
    out = tmp_path / "clean.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", str(EXAMPLE_NOISY), "-o", str(out)],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    clean, _ = sf.read(EXAMPLE_CLEAN, dtype="float32")
    noisy, _ = sf.read(EXAMPLE_NOISY, dtype="float32")
    enhanced, _ = sf.read(out, dtype="float32")
    assert len(enhanced) == len(noisy)
    got = {"pesq": pesq_wb(clean, enhanced), "stoi": stoi(clean, enhanced), "si_sdr": si_sdr(clean, enhanced)}
    # the CLI writes 16-bit PCM like its input: allow for that rounding, nothing more
    tolerance = {"pesq": 0.02, "stoi": 0.002, "si_sdr": 0.05}
    for key, value in got.items():
        assert abs(value - golden["enhanced"][key]) <= tolerance[key], (key, value, golden["enhanced"][key])
        assert value > golden["noisy"][key], (
            f"enhanced {key} {value} not above the noisy input's {golden['noisy'][key]}"
        )
