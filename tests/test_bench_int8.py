"""bench/bench_int8.py runs end to end with the bundled default model on a tiny generated pairs set, writes its
tables with every row filled, and refuses a folder with no pairs."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.audio_trees import dev_pairs
from tests.conftest import speech_like

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_int8.py"


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """The script as a user runs it, on one thread, quick settings (5 calls, 1 s of audio)."""
    cmd = [sys.executable, str(SCRIPT), "--no-dnsmos", "--calls", "5", "--seconds", "1", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_bench_int8_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    pairs = dev_pairs(tmp_path / "pairs", [speech_like(1.5, seed=s) for s in (1, 2)], noise_std=0.02, seed=0)
    out = tmp_path / "out"
    done = bench("--out", str(out), "--pairs", str(pairs))
    assert done.returncode == 0, done.stderr
    speed = rows(out / "speed.csv")
    assert [(r["what"], r["kind"]) for r in speed[:4]] == [
        ("step alone, 1 frame per call (the one-frame step)", "float32"),
        ("step alone, 1 frame per call (the one-frame step)", "int8"),
        ("step alone, 1 frame per call, free-frame-count step", "float32"),
        ("step alone, 1 frame per call, free-frame-count step", "int8"),
    ]
    assert len(speed) == 10 and all(math.isfinite(float(r["rtf"])) and float(r["rtf"]) > 0 for r in speed)
    per_file = rows(out / "per_file.csv")
    assert sorted((r["name"], r["system"]) for r in per_file) == [
        (n, k) for n in ("0000", "0001") for k in ("float32", "int8")
    ]
    assert all(math.isfinite(float(r["pesq"])) for r in per_file)
    paired = {r["metric"]: r for r in rows(out / "paired.csv")}
    assert list(paired) == ["pesq", "stoi", "si_sdr"] and all(r["n"] == "2" for r in paired.values())
    summary = (out / "summary.md").read_text()
    assert "signal to difference median" in summary and "| streaming engine, 16 ms chunks |" in summary
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = bench("--out", str(out), "--pairs", str(empty))
    assert bad.returncode == 2 and "bench_int8:" in bad.stderr


@pytest.mark.parametrize("backend", ["native-int8", "native-fp16", "torchscript-int8"])
def test_bench_int8_native_backends(tmp_path: Path, backend: str) -> None:
    """The C step's reduced precisions against its float32 (no onnxruntime needed; a C compiler is), and the
    traced step with the int8 pre-encoder against the float traced step."""
    pairs = dev_pairs(tmp_path / "pairs", [speech_like(1.5, seed=s) for s in (1, 2)], noise_std=0.02, seed=0)
    out = tmp_path / "out"
    done = bench("--backend", backend, "--out", str(out), "--pairs", str(pairs))
    assert done.returncode == 0, done.stderr
    reduced = "float16" if backend == "native-fp16" else "int8"
    speed = rows(out / "speed.csv")
    assert [(r["what"], r["kind"]) for r in speed] == [
        (what, kind)
        for what in (
            "step alone, 1 frame per call",
            "step alone, 2 frames per call",
            "streaming engine, 16 ms chunks",
            "streaming engine, 32 ms chunks",
        )
        for kind in ("float32", reduced)
    ]
    assert all(math.isfinite(float(r["rtf"])) and float(r["rtf"]) > 0 for r in speed)
    per_file = rows(out / "per_file.csv")
    assert sorted((r["name"], r["system"]) for r in per_file) == [
        (n, k) for n in ("0000", "0001") for k in sorted(("float32", reduced))
    ]
    summary = (out / "summary.md").read_text()
    base = backend.rsplit("-", 1)[0]
    assert f"{backend} against {base} (float32)" in summary and "signal to difference median" in summary
    what = "the pre-encoder's products in int8" if base == "torchscript" else f"{reduced} matrices"
    assert f"MiB with {what}" in summary
