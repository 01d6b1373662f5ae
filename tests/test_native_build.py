"""enhance/native_build.py: where the C step's library comes from. A machine without a compiler (the Docker
image) loads a prebuilt library made from the same source for the highest x86-64 level its CPU has (or the next
one down), never one of a level it lacks or of another source; the script that makes them runs without the
package installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from enhance import native_build
from models import Enhancer, get_config, save_checkpoint
from tests.conftest import ROOT

V3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 cx16 lahf_lm popcnt avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ("fpu sse sse2", "x86-64"),
        ("fpu sse sse2 ssse3 sse4_1 sse4_2 cx16 lahf_lm popcnt", "x86-64-v2"),
        (V3, "x86-64-v3"),
        (V3 + " avx512f avx512bw avx512cd avx512dq avx512vl", "x86-64-v4"),
        # AVX-512 without the v3 set below it (no bmi2) is not v4: the levels include the ones below them
        (V3.replace(" bmi2", "") + " avx512f avx512bw avx512cd avx512dq avx512vl", "x86-64-v2"),
        (V3.replace(" f16c", ""), "x86-64-v2"),
    ],
)
def test_x86_level(flags: str, level: str) -> None:
    assert native_build.x86_level(set(flags.split())) == level


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args], capture_output=True, env=env, timeout=300
    )


@pytest.mark.skipif(not native_build.is_x86(), reason="x86-64 levels")
def test_a_machine_without_a_compiler_loads_the_prebuilt_library(tmp_path: Path) -> None:
    prebuilt = tmp_path / "prebuilt"
    level = native_build.x86_level(set(native_build.cpu_flags_line().split()))
    # the script as the Docker build stage runs it: outside the repository, the package not importable
    script = tmp_path / "stage" / "native_build.py"
    script.parent.mkdir()
    script.write_bytes((ROOT / "enhance" / "native_build.py").read_bytes())
    (script.parent / "native_step.c").write_bytes((ROOT / "enhance" / "native_step.c").read_bytes())
    env_stage = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run(
        [sys.executable, "-I", str(script), "--prebuild", str(prebuilt), "--levels", f"{level},x86-64"],
        capture_output=True,
        text=True,
        env=env_stage,
        cwd=tmp_path,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    names = sorted(p.name for p in prebuilt.glob("*.so"))
    assert names == sorted({native_build.prebuilt_name(level), native_build.prebuilt_name("x86-64")})

    torch.manual_seed(0)
    ck = tmp_path / "tiny.safetensors"
    save_checkpoint(ck, Enhancer(get_config("tiny")), "tiny")
    src = tmp_path / "in.wav"
    sf.write(src, (np.random.default_rng(0).standard_normal(8000) * 0.1).astype(np.float32), 16000)
    args = [
        "--stream",
        "--stream-backend",
        "native",
        "--subtype",
        "FLOAT",
        str(src),
        "--checkpoint",
        str(ck),
        "-o",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CC": str(tmp_path / "no-such-cc"),
        "TIM_ENHANCE_CACHE": str(tmp_path / "cache"),
        "TIM_ENHANCE_PREBUILT": str(prebuilt),
    }
    proc = _cli([*args, str(tmp_path / "prebuilt.wav")], env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert not (tmp_path / "cache").exists()  # nothing compiled, nothing cached
    # the same numbers as the build -march=native makes here (within float rounding: tuning may differ)
    proc = _cli([*args, str(tmp_path / "native.wav")], {**env, "CC": "cc"})
    assert proc.returncode == 0, proc.stderr.decode()
    a, b = sf.read(tmp_path / "prebuilt.wav")[0], sf.read(tmp_path / "native.wav")[0]
    assert a.shape == b.shape and np.abs(a - b).max() < 1e-5

    # without the CPU's own level the next one down stands in; a level above the CPU's never does
    (prebuilt / native_build.prebuilt_name(level)).unlink()
    proc = _cli([*args, str(tmp_path / "lower.wav")], env)
    assert proc.returncode == 0, proc.stderr.decode()
    c = sf.read(tmp_path / "lower.wav")[0]
    assert np.abs(c - b).max() < 1e-5
    (prebuilt / native_build.prebuilt_name("x86-64")).unlink()
    if level != "x86-64-v4":
        made = subprocess.run(
            [sys.executable, "-I", str(script), "--prebuild", str(prebuilt), "--levels", "x86-64-v4"],
            capture_output=True,
            text=True,
            env=env_stage,
            timeout=300,
        )
        assert made.returncode == 0, made.stderr
        proc = _cli([*args, str(tmp_path / "o.wav")], env)
        assert proc.returncode == 2
        assert b"prebuilt library of this source for this CPU" in proc.stderr
        assert not (tmp_path / "o.wav").exists()
    # a library of another source (an older install) is never loaded
    for p in prebuilt.glob("*.so"):
        p.rename(p.with_name(p.name.replace(native_build.source_key(), "0" * 16)))
    proc = _cli(["--stream", str(src), "--checkpoint", str(ck), "-o", str(tmp_path / "auto.wav")], env)
    assert proc.returncode == 0, proc.stderr.decode()  # auto: TorchScript, as without a compiler


def test_prebuild_refuses_an_unknown_level(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        native_build.main(["--prebuild", str(tmp_path), "--levels", "pentium"])
    assert exc.value.code == 2
    assert not list(tmp_path.iterdir())
