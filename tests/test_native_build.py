"""enhance/native_build.py: where the C step's library comes from. A machine without a compiler (the Docker
image) loads a prebuilt library made from the same source for the highest x86-64 level its CPU has (or the next
one down), never one of a level it lacks or of another source; the script that makes them runs without the
package installed."""

from __future__ import annotations

import os
import shutil
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

V3 = "fpu sse sse2 pni ssse3 sse4_1 sse4_2 cx16 lahf_lm popcnt avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ("fpu sse sse2", "x86-64"),
        ("fpu sse sse2 pni ssse3 sse4_1 sse4_2 cx16 lahf_lm popcnt", "x86-64-v2"),
        ("fpu sse sse2 ssse3 sse4_1 sse4_2 cx16 lahf_lm popcnt", "x86-64"),  # no SSE3 ("pni")
        (V3, "x86-64-v3"),
        (V3 + " avx512f avx512bw avx512cd avx512dq avx512vl", "x86-64-v4"),
        # AVX-512 without the v3 set below it (no bmi2) is not v4: the levels include the ones below them
        (V3.replace(" bmi2", "") + " avx512f avx512bw avx512cd avx512dq avx512vl", "x86-64-v2"),
        (V3.replace(" f16c", ""), "x86-64-v2"),
    ],
)
def test_x86_level(flags: str, level: str) -> None:
    assert native_build.x86_level(set(flags.split())) == level


@pytest.mark.parametrize(
    ("present", "flags", "taken"),
    [
        (["x86-64-v3", "x86-64-v2", "x86-64"], V3, "x86-64-v3"),
        (["x86-64-v2", "x86-64"], V3, "x86-64-v2"),  # the CPU's own level missing: the next one down
        (["x86-64-v4", "x86-64"], V3, "x86-64"),  # never a level above the CPU's
        (["x86-64-v4"], V3, None),
        (["x86-64-v4", "x86-64-v3"], V3 + " avx512f avx512bw avx512cd avx512dq avx512vl", "x86-64-v4"),
    ],
)
def test_which_prebuilt_library_a_cpu_takes(
    present: list[str], flags: str, taken: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for level in present:
        (tmp_path / native_build.prebuilt_name(level)).write_bytes(b"")
    # a library of another source (an older install) at the CPU's own level is never taken
    (
        tmp_path / native_build.prebuilt_name("x86-64-v3").replace(native_build.source_key(), "0" * 16)
    ).write_bytes(b"")
    monkeypatch.setenv(native_build.PREBUILT_ENV, str(tmp_path))
    monkeypatch.setattr(native_build, "is_x86", lambda: True)
    monkeypatch.setattr(native_build, "cpu_flags_line", lambda: "flags\t\t: " + flags)
    found = native_build._prebuilt()
    assert found == (tmp_path / native_build.prebuilt_name(taken) if taken else None)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args], capture_output=True, env=env, timeout=300
    )


@pytest.mark.skipif(not native_build.is_x86(), reason="x86-64 levels")
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to make the prebuilt libraries")
def test_a_machine_without_a_compiler_loads_the_prebuilt_library(tmp_path: Path) -> None:
    prebuilt = tmp_path / "prebuilt"
    level = native_build.x86_level(set(native_build.cpu_flags_line().split()))
    if level == "x86-64":
        pytest.skip("a baseline x86-64 CPU: no level below its own to fall back to")
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
    common = ["--stream", "--subtype", "FLOAT", str(src), "--checkpoint", str(ck)]
    args = [*common, "--stream-backend", "native", "-o"]
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
    proc = _cli(
        [*args, str(tmp_path / "native.wav")],
        {**env, "CC": "cc", "TIM_ENHANCE_CACHE": str(tmp_path / "native-cache")},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    a, b = sf.read(tmp_path / "prebuilt.wav")[0], sf.read(tmp_path / "native.wav")[0]
    assert a.shape == b.shape and np.abs(a - b).max() < 1e-5

    # without the CPU's own level the next one down stands in (which one a CPU takes:
    # test_which_prebuilt_library_a_cpu_takes)
    own = prebuilt / native_build.prebuilt_name(level)
    own.rename(tmp_path / "own.so")
    proc = _cli([*args, str(tmp_path / "lower.wav")], env)
    assert proc.returncode == 0, proc.stderr.decode()
    c = sf.read(tmp_path / "lower.wav")[0]
    assert np.abs(c - b).max() < 1e-5
    # a library of another source (an older install) is never loaded, even at the CPU's own level: with no other,
    # the named backend is refused (exit 2, no output) and auto streams on TorchScript
    (prebuilt / native_build.prebuilt_name("x86-64")).unlink()
    (tmp_path / "own.so").rename(prebuilt / own.name.replace(native_build.source_key(), "0" * 16))
    proc = _cli([*args, str(tmp_path / "o.wav")], env)
    assert proc.returncode == 2
    assert b"prebuilt library of this source for this CPU" in proc.stderr
    assert not (tmp_path / "o.wav").exists()
    auto = [*common, "-o", str(tmp_path / "auto.wav")]
    proc = _cli(auto, env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert not (tmp_path / "cache").exists()


def test_prebuild_refuses_an_unknown_level(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        native_build.main(["--prebuild", str(tmp_path), "--levels", "pentium"])
    assert exc.value.code == 2
    assert not list(tmp_path.iterdir())
