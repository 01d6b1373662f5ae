"""bench/bench_device.py runs end to end as a user runs it, here with the CPU standing in for the accelerator (the
script compares a device's paths with the CPU's; on CUDA it ran on a lent H200, bench/results/device-cuda.md): every
path has its row, the enhance-cli and enhance-server rows come from real subprocesses, and a check it cannot meet
fails the run (exit 1) instead of passing quietly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from enhance.device import inference_device
from tests.server_fixtures import tiny_checkpoint
from tests.test_bench_speed import bench, number, ran, table

PATHS = [
    "offline, 16 kHz mono, TF32 convolutions on (PyTorch's default)",
    "offline, 48 kHz stereo (high band), TF32 convolutions on (PyTorch's default)",
    "offline, 16 kHz mono, TF32 off",
    "offline, 48 kHz stereo (high band), TF32 off",
    "streaming, chunks of 1000, against the CPU's offline",
    "streaming, random chunks 1-3000, against the device's offline",
    "enhance-cli file mode",
    "enhance-cli --stream",
    "enhance-server POST /v1/enhance",
    "enhance-server, 8 POSTs at once (the worst)",
    "enhance-server WS /v1/stream (20-ms messages)",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("device") / "tiny.safetensors")


def test_every_path_is_compared_and_agrees(tmp_path: Path, tiny: Path) -> None:
    out = tmp_path / "device.md"
    quick = ["--seconds", "2", "--hop-seconds", "1"]
    text = ran("bench_device.py", "--device", "cpu", "--checkpoint", str(tiny), *quick, "--out", str(out))
    rows = table(text, "path on the device, against the CPU")
    assert [r[0] for r in rows] == PATHS
    assert all(r[3] == "yes" for r in rows), rows
    for r in rows:
        if r[0].startswith("enhance-"):  # 16-bit files: within the default 1 LSB
            assert r[1].endswith(" LSB") and int(r[1].split()[0]) <= 1, r
        elif r[0].startswith("offline"):  # the same process and device: the same samples
            assert float(r[1]) == 0.0 and r[2] == "inf", r
        else:
            assert float(r[2]) >= 60.0, r
    speed = table(text, "speed")
    threads = os.cpu_count()  # the script gives the CPU reference all cores
    assert [r[0] for r in speed[:3]] == [
        f"offline real-time factor, 2 s, TF32 off (CPU: {threads} threads)",
        f"offline real-time factor, 2 s, TF32 on (CPU: {threads} threads)",
        "streaming, PyTorch eager, ms per hop p50 / p99 (RTF)",
    ]
    for r in speed[:3]:
        assert number(r[1]) > 0 and number(r[2]) > 0
    p50, p99 = (float(v) for v in speed[2][1].split()[:3:2])  # "p50 / p99 (RTF)"
    assert 0 < p50 <= p99


def test_a_check_it_cannot_meet_fails_the_run(tmp_path: Path, tiny: Path) -> None:
    out = tmp_path / "device.md"
    done = bench(
        "bench_device.py", "--device", "cpu", "--checkpoint", str(tiny), "--seconds", "1", "--hop-seconds", "1",
        "--no-server", "--min-snr", "1000", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    rows = {r[0]: r[3] for r in table(out.read_text(), "path on the device, against the CPU")}
    assert (
        rows["streaming, chunks of 1000, against the CPU's offline"] == "**no**"
    )  # float32 rounding: ~130 dB
    assert rows["offline, 16 kHz mono, TF32 off"] == "yes"  # identical samples: inf dB


def test_the_enhancing_commands_turn_tf32_off_only_on_cuda() -> None:
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    assert inference_device("cpu") == torch.device("cpu")
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            inference_device("cuda")
        return
    try:
        assert inference_device("cuda").type == "cuda"
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
