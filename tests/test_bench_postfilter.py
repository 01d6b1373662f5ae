"""bench/bench_postfilter.py: its steps do what they say, its ``limit`` equals the engine's own attenuation limit,
and the command runs end to end on a tiny generated set with the tiny model."""

from __future__ import annotations

import csv
import dataclasses
import importlib
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import soundfile as sf
import torch

import models
from enhance.offline import enhance_waveform
from tests.audio_trees import dev_pairs
from tests.conftest import speech_like
from tests.server_fixtures import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_postfilter.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("bench_postfilter")


@pytest.fixture(scope="module")
def tiny_model() -> models.Enhancer:
    torch.manual_seed(0)
    return models.Enhancer(models.get_config("tiny")).eval()


def _with_pause(seconds: float, seed: int) -> np.ndarray:
    """Speech-like signal with a silent second in the middle (so there are pause frames to measure)."""
    x = speech_like(seconds, seed=seed)
    mid = len(x) // 2
    x[mid - 8000 : mid + 8000] = 0.0
    return x


def test_limit_step_equals_the_engines_attenuation_limit(
    bench: ModuleType, tiny_model: models.Enhancer
) -> None:
    rng = np.random.default_rng(0)
    noisy = (_with_pause(3.0, 1) + 0.03 * rng.standard_normal(48000)).astype(np.float32)
    free = models.Enhancer(dataclasses.replace(tiny_model.cfg, max_attenuation_db=None)).eval()
    limited = models.Enhancer(dataclasses.replace(free.cfg, max_attenuation_db=12.0)).eval()
    free.load_state_dict(tiny_model.state_dict())
    limited.load_state_dict(tiny_model.state_dict())
    ours = bench.filtered_outputs(free, noisy, {"l": bench.parse_filter("limit=12")})["l"]
    engine = enhance_waveform(limited, noisy[None]).wav[0]
    np.testing.assert_allclose(ours, engine, atol=2e-5)
    raw = bench.filtered_outputs(free, noisy, {"raw": bench.parse_filter("raw")})["raw"]
    assert np.abs(raw - engine).max() > 1e-3  # the untrained model attenuates past 12 dB somewhere


def test_oracle_starts_from_the_clean_magnitude_with_the_noisy_phase(
    bench: ModuleType, tiny_model: models.Enhancer
) -> None:
    """``oracle`` rows: the clean file's magnitude rebuilt with the noisy phase (whatever the network says), and
    later steps of the chain apply to it; ``oracle`` anywhere but first is a bad step."""
    from enhance.dc_blocker import remove_dc
    from enhance.stft import istft, stft

    rng = np.random.default_rng(4)
    clean = _with_pause(2.0, 2)
    noisy = (clean + 0.05 * rng.standard_normal(len(clean))).astype(np.float32)
    filters = {s: bench.parse_filter(s) for s in ("oracle", "oracle+limit=6", "raw")}
    out = bench.filtered_outputs(tiny_model, noisy, filters, clean)
    cfg = tiny_model.cfg.stft
    blocked = remove_dc(noisy[None], cfg.hop_length)[0]  # the phase the engine uses: after its DC blocker
    spec_n, spec_c = (stft(torch.from_numpy(a)[None], cfg)[0] for a in (blocked, clean))
    want = istft(torch.polar(spec_c.abs(), (spec_n + 0.0).angle()), cfg, len(noisy)).numpy()
    np.testing.assert_allclose(out["oracle"], want, atol=1e-6)
    # the oracle is close to the clean signal and far closer than the untrained network's output
    err = {k: float(np.mean((out[k] - clean) ** 2)) for k in ("oracle", "raw")}
    assert err["oracle"] < 0.2 * float(np.mean((noisy - clean) ** 2)) and err["oracle"] < err["raw"]
    # the oracle's pause is silent (clean magnitude 0 there); a 6-dB limit keeps the noise at -6 dB
    pause = slice(len(clean) // 2 - 4000, len(clean) // 2 + 4000)
    noise_energy = np.sum(noisy[pause] ** 2)
    assert np.sum(out["oracle"][pause] ** 2) < 0.01 * noise_energy
    assert np.sum(out["oracle+limit=6"][pause] ** 2) > 10 ** (-6.5 / 10) * noise_energy
    with pytest.raises(ValueError, match="clean file"):
        bench.filtered_outputs(tiny_model, noisy, {"oracle": filters["oracle"]})
    with pytest.raises(ValueError, match="bad post-filter step"):
        bench.parse_filter("limit=20+oracle")


def test_steps(bench: ModuleType) -> None:
    x = torch.ones(6, 5)
    gains = torch.tensor([1.0, 0.5, 0.1, 0.01, 0.0])
    p = x * gains
    pf = bench.parse_filter("dfpf=0.3")(x, p)[0]
    assert pf[0] == pytest.approx(1.0) and bool((pf[1:4] < gains[1:4]).all())  # small gains lowered, 1 kept
    # the closed form at G = 0.5: G sin(pi G / 2) = 0.5 / sqrt(2), so 1.3 * 0.5 / (1 + 0.3 * 2)
    assert float(pf[1]) == pytest.approx(0.65 / 1.6)
    floor = bench.parse_filter("limit=20")(x, p)[0]
    assert floor.tolist() == pytest.approx([1.0, 0.5, 0.1, 0.1, 0.1])
    # the frame-relative floor: one bin kept at 0.1, four at 0, so the frame gain is sqrt(0.01 / 5) and the
    # floor 0.1 times that (the plain limit's floor would be 0.1)
    one_bin = x * torch.tensor([0.1, 0.0, 0.0, 0.0, 0.0])
    floored = bench.parse_filter("relative=20")(x, one_bin)[0]
    assert floored.tolist() == pytest.approx([0.1] + [0.1 * (0.01 / 5) ** 0.5] * 4)
    # release: after a frame of gain 1, the gain falls by at most the factor per frame
    drop = torch.cat([torch.ones(1, 5), torch.zeros(5, 5)]) * x
    released = bench.parse_filter("release=0.5")(x, drop)[:, 0]
    assert released.tolist() == pytest.approx([1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125])
    # expander: a frame at an energy ratio of -20 dB, 10 dB under a -10 dB threshold, loses K x 10 = 20 dB more
    quiet = x * 0.1
    assert float(bench.parse_filter("expander=-10/2")(x, quiet)[0, 0]) == pytest.approx(0.01)
    # above the threshold: unchanged
    assert float(bench.parse_filter("expander=-30/2")(x, quiet)[0, 0]) == pytest.approx(0.1)
    # the gate holds: a frame of full gain, then quiet frames at -20 dB (10 under the threshold, 20 dB more off)
    # pass unchanged for the rest of the 3-frame hold, then are gated like the expander's
    held = torch.cat([torch.ones(1, 5), torch.full((5, 5), 0.1)]) * x
    gated = bench.parse_filter("gate=-10/2/3")(x, held)[:, 0]
    assert gated.tolist() == pytest.approx([1.0, 0.1, 0.1, 0.01, 0.01, 0.01])
    # frequency smoothing over 3 bins (edges repeated): an isolated bin of gain 1 among zeros is spread (mean),
    # removed (median, geometric mean); a notch in ones is filled by the median
    spike = x * torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])
    assert bench.parse_filter("fmean=3")(x, spike)[0].tolist() == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3, 0])
    assert bench.parse_filter("fmed=3")(x, spike)[0].tolist() == pytest.approx([0.0] * 5)
    assert float(bench.parse_filter("fgeo=3")(x, spike)[0, 2]) < 1e-3
    notch = x * torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    assert bench.parse_filter("fmed=3")(x, notch)[0].tolist() == pytest.approx([1.0] * 5)
    assert bench.parse_filter("fmed=5")(x, p)[0].tolist() == pytest.approx(gains.tolist())  # monotone: kept
    # the low cut on the model's 257 bins (31.25 Hz apart): below 60 Hz the DC and 31.25-Hz bins go, 62.5 stays
    full = torch.ones(2, 257)
    cut = bench.parse_filter("limit=30+lowcut=60")(full, full)
    assert cut[:, :2].abs().max() == 0 and torch.equal(cut[:, 2:], full[:, 2:])
    assert int((bench.parse_filter("lowcut=100")(full, full)[0] == 0).sum()) == 4  # 0, 31.25, 62.5, 93.75 Hz
    for bad in (
        "lowcut=0",
        "limit",
        "limit=x",
        "nope=1",
        "expander=3",
        "fmean=2",
        "fmed=0",
        "fgeo=1.5",
        "gate=-10/2/0",
        "gate=-10/2",
    ):
        with pytest.raises(ValueError, match="bad post-filter step"):
            bench.parse_filter(bad)


def test_command_end_to_end(tmp_path: Path) -> None:
    pairs = dev_pairs(tmp_path / "pairs", [_with_pause(3.0, seed=i) for i in range(2)], 0.02, seed=3)
    ckpt = tiny_checkpoint(tmp_path / "tiny.safetensors")
    # a pair whose noisy file is not audio: reported and skipped, the run goes on
    sf.write(pairs / "dev" / "clean" / "0002.wav", _with_pause(3.0, seed=5), 16000, subtype="FLOAT")
    (pairs / "dev" / "noisy" / "0002.wav").write_bytes(b"not a wav file")
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), "--pairs", str(pairs), "--checkpoint", str(ckpt), "--no-dnsmos"]
    done = subprocess.run(
        [*cmd, "--filters", "raw;limit=20;dfpf=0.05+limit=20;oracle", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr and "0002.wav" in done.stderr
    with (out / "summary.csv").open(newline="") as f:
        rows = {r["system"]: r for r in csv.DictReader(f)}
    assert list(rows) == [
        "noisy",
        "clean",
        "tim + raw",
        "tim + limit=20",
        "tim + dfpf=0.05+limit=20",
        "oracle",
    ]
    assert float(rows["oracle"]["si_sdr"]) > float(rows["noisy"]["si_sdr"]) + 5  # the clean magnitude
    assert float(rows["clean"]["si_sdr"]) > 60.0  # the clean file scored against itself
    assert (
        float(rows["clean"]["pause_att_db"]) < -40.0
    )  # its pauses are silent (but for frames at their edges)
    for r in rows.values():
        assert r["n_files"] == "2"
        assert all(math.isfinite(float(r[k])) for k in ("pesq", "stoi", "si_sdr", "pause_att_db"))
        assert math.isnan(float(r["dnsmos_ovrl"]))  # --no-dnsmos
    assert float(rows["noisy"]["pause_att_db"]) == pytest.approx(0.0, abs=1e-6)
    assert {r["n_pause_files"] for r in rows.values()} == {"2"}  # both scored files have a silent second
    # a 20-dB limit cannot take the pauses more than 20 dB down
    assert float(rows["tim + limit=20"]["pause_att_db"]) >= -20.0 - 1e-3
    assert "| tim + limit=20 |" in (out / "summary.md").read_text()
    bad = subprocess.run([*cmd, "--filters", "limit=oops"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "bad post-filter step" in bad.stderr
