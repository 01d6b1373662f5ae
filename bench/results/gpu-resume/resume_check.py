# Run on the lent GPU machine from the repository root (session 33):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD python3 bench/results/gpu-resume/resume_check.py
"""On CUDA: does --resume continue exactly? Three tiny runs on generated folders: A uninterrupted 2 epochs,
B 1 epoch then --resume to 2, A2 a repeat of A (is training itself deterministic there?)."""

import os
import subprocess
import sys
from pathlib import Path

import safetensors.torch

sys.path.insert(0, os.getcwd())
from tests.audio_trees import build_folders

root = Path("/tmp/rc")
tree = build_folders(root / "data", n_speech=10)
base = [
    sys.executable,
    "-m",
    "recipes.train",
    "--recipe",
    "folders",
    "--speech",
    str(tree.speech),
    "--noise",
    str(tree.noise),
    "--val-pairs",
    str(tree.dev),
    "--model",
    "tiny",
    "--batch-size",
    "4",
    "--segment-seconds",
    "1.0",
    "--max-steps-per-epoch",
    "6",
    "--device",
    "cuda",
    "--num-workers",
    "0",
]


def run(*a):
    p = subprocess.run(
        [*base, *a] if a[0] != "--resume-only" else [sys.executable, "-m", "recipes.train", *a[1:]],
        capture_output=True,
        text=True,
    )
    print(p.stdout[-300:], p.stderr[-1500:] if p.returncode else "", "rc", p.returncode, flush=True)


run("--epochs", "2", "--out", str(root / "A"))
run("--epochs", "2", "--out", str(root / "A2"))
run("--epochs", "1", "--out", str(root / "B"))
run("--resume-only", "--out", str(root / "B"), "--resume", "--epochs", "2")
w = {k: safetensors.torch.load_file(root / k / "last.safetensors") for k in ("A", "A2", "B")}
for x, y in (("A", "A2"), ("A", "B")):
    d = max(float((w[x][k] - w[y][k]).abs().max()) for k in w[x])
    print(f"{x} vs {y}: max abs weight difference {d:.3e}", flush=True)
