"""recipes.average_checkpoints: the weighted mean of same-architecture checkpoints, refused for anything else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.checkpoint import load_checkpoint, save_checkpoint
from models.enhancer import Enhancer
from models.registry import get_config
from recipes.average_checkpoints import main

ROOT = Path(__file__).resolve().parents[1]


def tiny_checkpoint(path: Path, seed: int, name: str = "tiny", limit: float | None = None) -> Path:
    torch.manual_seed(seed)
    model = Enhancer(get_config(name))
    if limit is not None:
        model.set_max_attenuation(limit)
    save_checkpoint(path, model, name, {"seed": seed})
    return path


def test_weighted_average_of_two_checkpoints(tmp_path: Path) -> None:
    a = tiny_checkpoint(tmp_path / "a.safetensors", 0, limit=20.0)
    b = tiny_checkpoint(tmp_path / "b.safetensors", 1, limit=30.0)  # another limit: still the same network
    out = tmp_path / "soup.safetensors"
    assert main([str(a), str(b), "--weights", "3", "1", "--out", str(out)]) == 0
    wa, wb = load_checkpoint(a).model.state_dict(), load_checkpoint(b).model.state_dict()
    soup = load_checkpoint(out)
    assert soup.name == "tiny" and soup.config.max_attenuation_db == 20.0  # the first input's limit
    assert soup.training["averaged"] == [
        {"checkpoint": str(a), "weight": 0.75},
        {"checkpoint": str(b), "weight": 0.25},
    ]
    ws = soup.model.state_dict()
    differ = [k for k in wa if wa[k].is_floating_point() and not torch.equal(wa[k], wb[k])]
    assert differ, "the two seeds gave the same weights, so the average could not be checked"
    for k in wa:
        expect = (0.75 * wa[k].double() + 0.25 * wb[k].double()).to(wa[k].dtype)
        assert torch.allclose(ws[k], expect, atol=1e-7), k
    # equal weights by default
    even = tmp_path / "even.safetensors"
    assert main([str(a), str(b), "--out", str(even)]) == 0
    k = differ[0]
    assert torch.allclose(load_checkpoint(even).model.state_dict()[k], (wa[k] + wb[k]) / 2, atol=1e-7)


@pytest.mark.parametrize(
    "case, message",
    [
        ("other-model", "another config"),
        ("one", "at least two"),
        ("bad-weights", "positive finite numbers"),
        ("inf-weight", "positive finite numbers"),  # wrote a NaN soup that every loader refuses
        ("huge-weights", "positive finite numbers"),  # their sum overflowed: an all-zero soup
        ("out-is-folder", "give a file path"),  # IsADirectoryError after the work
        ("out-is-input", "is one of the inputs"),
        ("missing", "no such checkpoint"),
        ("out-unwritable", "cannot write in /proc/self"),  # an OSError traceback after the work
    ],
)
def test_bad_requests_are_refused_without_writing(tmp_path: Path, case: str, message: str) -> None:
    a = tiny_checkpoint(tmp_path / "a.safetensors", 0)
    b = tiny_checkpoint(tmp_path / "b.safetensors", 1)
    out = tmp_path / "soup.safetensors"
    args = {
        "other-model": [str(a), str(tiny_checkpoint(tmp_path / "c.safetensors", 0, name="tiny-transformer"))],
        "one": [str(a)],
        "bad-weights": [str(a), str(b), "--weights", "1", "0"],
        "inf-weight": [str(a), str(b), "--weights", "inf", "1"],
        "huge-weights": [str(a), str(b), "--weights", "1e308", "1e308"],
        "out-is-folder": [str(a), str(b)],
        "out-is-input": [str(a), str(b)],
        "missing": [str(a), str(tmp_path / "nope.safetensors")],
        "out-unwritable": [str(a), str(b)],
    }[case]
    unwritable = Path("/proc/self/soup.safetensors")  # a folder no one may create files in, root included
    target = {"out-is-input": a, "out-is-folder": tmp_path, "out-unwritable": unwritable}.get(case, out)
    before = a.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "recipes.average_checkpoints", *args, "--out", str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert a.read_bytes() == before
    assert not out.exists()
