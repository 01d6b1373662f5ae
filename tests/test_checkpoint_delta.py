"""recipes.checkpoint_delta: a fine-tune's weights carried as a float16 difference from its start, rebuilt here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from models.checkpoint import load_checkpoint, save_checkpoint
from models.enhancer import Enhancer
from models.registry import get_config
from recipes.checkpoint_delta import main

ROOT = Path(__file__).resolve().parents[1]


def _base_and_finetune(tmp_path: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = Enhancer(get_config("tiny"))
    base = tmp_path / "base.safetensors"
    save_checkpoint(base, model, "tiny", {"stage": "base"})
    with torch.no_grad():  # a fine-tune's move: small against the weights, different per weight
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p) * (1 + p.abs()))
    tuned = tmp_path / "tuned.safetensors"
    save_checkpoint(tuned, model, "tiny", {"epoch": 5})
    return base, tuned


def test_round_trip_keeps_weights_to_a_fraction_of_the_change(tmp_path: Path) -> None:
    base, tuned = _base_and_finetune(tmp_path)
    delta, back = tmp_path / "ep5.delta", tmp_path / "back.safetensors"
    assert main(["encode", str(base), str(tuned), str(delta)]) == 0
    assert delta.stat().st_size < 0.6 * tuned.stat().st_size  # float16: about half
    assert main(["decode", str(base), str(delta), str(back)]) == 0
    b, t, r = (load_checkpoint(p) for p in (base, tuned, back))
    assert r.name == "tiny" and r.training == {"epoch": 5} and r.config == t.config
    wb, wt, wr = (c.model.state_dict() for c in (b, t, r))
    for k in wt:
        change = (wt[k] - wb[k]).abs()
        assert wr[k].dtype == wt[k].dtype == torch.float32
        # float16's precision on the change (subnormals below 6e-5) and float32's on the sum
        assert bool(((wr[k] - wt[k]).abs() <= 1e-3 * change + 1e-7).all()), k
    # float16 weights, the plain alternative, are far coarser than the delta
    k = max(wt, key=lambda n: float(wt[n].abs().max()))
    assert (wt[k].half().float() - wt[k]).abs().max() > 10 * (wr[k] - wt[k]).abs().max()


def test_another_base_or_a_plain_checkpoint_is_refused(tmp_path: Path) -> None:
    base, tuned = _base_and_finetune(tmp_path)
    delta = tmp_path / "ep5.delta"
    assert main(["encode", str(base), str(tuned), str(delta)]) == 0
    out = tmp_path / "out.safetensors"
    # decoding against the fine-tune instead of its base
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "recipes.checkpoint_delta", "decode", str(tuned), str(delta), str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 1 and "made against another base" in r.stderr and not out.exists()
    # a checkpoint given where a delta belongs
    cmd[4:6] = [str(base), str(tuned)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 1 and "not a checkpoint delta" in r.stderr and not out.exists()
    # weights of another model (the bundled default against the tiny base)
    default = ROOT / "models" / "pretrained" / "default.safetensors"
    assert main(["encode", str(base), str(default), str(tmp_path / "x.delta")]) == 1
    assert not (tmp_path / "x.delta").exists()
