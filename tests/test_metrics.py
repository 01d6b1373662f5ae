"""Objective metrics: SI-SDR, PESQ, STOI and DNSMOS on generated speech-like signals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recipes.metrics import DNSMOS, METRIC_KEYS, compute_metrics, pesq_wb, si_sdr, stoi

FS = 16000


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """A voiced, syllable-modulated harmonic signal (gliding f0, 1/k harmonics), peak about 0.3."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * FS)) / FS
    f0 = 130 + 25 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, np.pi))
    phase = 2 * np.pi * np.cumsum(f0) / FS
    voiced = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 30))
    envelope = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 2
    x = voiced * envelope
    return 0.3 * x / np.max(np.abs(x))


def add_noise(x: np.ndarray, snr_db: float, seed: int = 1) -> np.ndarray:
    """``x`` plus white noise at exactly ``snr_db`` (energy ratio over the whole signal)."""
    noise = np.random.default_rng(seed).standard_normal(len(x))
    noise *= math.sqrt(np.sum(x**2) / np.sum(noise**2) / 10 ** (snr_db / 10))
    return x + noise


@pytest.fixture(scope="module")
def clean() -> np.ndarray:
    return speech_like(3.0)


@pytest.fixture(scope="module")
def scorer() -> DNSMOS:
    return DNSMOS()


# --- SI-SDR ------------------------------------------------------------------------------------------------


def test_si_sdr_identical_is_very_high(clean: np.ndarray) -> None:
    assert si_sdr(clean, clean) > 60


def test_si_sdr_at_10_db_snr(clean: np.ndarray) -> None:
    assert si_sdr(clean, add_noise(clean, 10.0)) == pytest.approx(10.0, abs=0.5)


def test_si_sdr_exact_for_orthogonal_noise(clean: np.ndarray) -> None:
    noise = np.random.default_rng(3).standard_normal(len(clean))
    noise -= np.dot(noise, clean) / np.dot(clean, clean) * clean  # orthogonal to the reference
    noise *= math.sqrt(np.sum(clean**2) / np.sum(noise**2) / 10 ** (5 / 10))
    assert si_sdr(clean, clean + noise) == pytest.approx(5.0, abs=1e-6)


def test_si_sdr_is_scale_invariant(clean: np.ndarray) -> None:
    noisy = add_noise(clean, 5.0)
    base = si_sdr(clean, noisy)
    assert si_sdr(clean, 7.5 * noisy) == pytest.approx(base, abs=1e-9)
    assert si_sdr(0.01 * clean, noisy) == pytest.approx(base, abs=1e-9)
    assert si_sdr(clean, -noisy) == pytest.approx(base, abs=1e-9)  # alpha may be negative


def test_si_sdr_does_not_remove_the_mean(clean: np.ndarray) -> None:
    assert si_sdr(clean, clean + 0.1) < 20  # a DC offset is distortion


def test_si_sdr_undefined_and_degenerate_inputs(clean: np.ndarray) -> None:
    assert math.isnan(si_sdr(np.zeros_like(clean), clean))
    assert math.isnan(si_sdr(np.array([]), np.array([])))
    assert math.isnan(si_sdr(clean, np.full_like(clean, np.nan)))
    assert math.isnan(si_sdr(clean, np.zeros_like(clean)))  # 0/0: it was 0 dB, above a noisy input at -5 dB
    assert si_sdr(clean, 1e-4 * clean) > 60  # a faint copy is still the signal


def test_si_sdr_cuts_to_common_length(clean: np.ndarray) -> None:
    assert si_sdr(clean, np.concatenate([clean, np.ones(500)])) > 60


# --- PESQ and STOI -----------------------------------------------------------------------------------------


def test_pesq_clean_is_high_and_noisy_lower(clean: np.ndarray) -> None:
    best = pesq_wb(clean, clean)
    noisy = pesq_wb(clean, add_noise(clean, 5.0))
    assert best > 4.0
    assert 1.0 <= noisy < best - 1.0


def test_pesq_silence_and_short_input_are_nan_not_minus_one(clean: np.ndarray) -> None:
    silence = np.zeros_like(clean)
    for ref, deg in [(silence, clean), (clean, silence), (silence, silence), (clean[:1600], clean[:1600])]:
        assert math.isnan(pesq_wb(ref, deg))


def test_stoi_identical_is_one_and_noisy_lower(clean: np.ndarray) -> None:
    assert stoi(clean, clean) == pytest.approx(1.0, abs=1e-6)
    assert stoi(clean, add_noise(clean, -5.0)) < 0.95


def test_stoi_cuts_to_common_length_and_nan_on_failure(clean: np.ndarray) -> None:
    assert stoi(clean, np.concatenate([clean, np.zeros(800)])) == pytest.approx(1.0, abs=1e-6)
    assert math.isnan(stoi(np.zeros_like(clean), clean))  # pystoi itself would say 0.0
    assert math.isnan(stoi(clean[:200], clean[:200]))  # too short for one STOI segment


# --- DNSMOS ------------------------------------------------------------------------------------------------


def test_dnsmos_windows_follow_microsofts_script() -> None:
    x = np.arange(16000, dtype=np.float32)
    tiled = DNSMOS.windows(x)  # 1 s repeated by doubling to 16 s
    assert tiled.shape[1] == 144160
    np.testing.assert_array_equal(tiled[0], np.tile(x, 16)[:144160])
    assert DNSMOS.windows(np.zeros(int(9.5 * FS))).shape[0] == 1
    assert DNSMOS.windows(np.zeros(11 * FS)).shape[0] == 2
    long = DNSMOS.windows(np.arange(20 * FS, dtype=np.float32))
    assert long.shape[0] > 1
    assert long[1][0] == FS  # hop of 1 s


def test_dnsmos_scores_in_range_and_noise_lowers_bak(clean: np.ndarray, scorer: DNSMOS) -> None:
    clean_scores = scorer(clean)
    noisy_scores = scorer(add_noise(clean, 0.0))
    for scores in (clean_scores, noisy_scores):
        assert set(scores) == {"sig", "bak", "ovrl"}
        assert all(math.isfinite(v) and 1.0 <= v <= 5.0 for v in scores.values())
    assert noisy_scores["bak"] < clean_scores["bak"] - 0.5


def test_dnsmos_long_and_short_inputs(scorer: DNSMOS) -> None:
    long = scorer(add_noise(speech_like(20.0, seed=4), 10.0))
    short = scorer(speech_like(1.0, seed=5))
    for scores in (long, short):
        assert all(math.isfinite(v) and 1.0 <= v <= 5.0 for v in scores.values())


def test_dnsmos_session_is_lazy_and_reused() -> None:
    scorer = DNSMOS()
    assert scorer._session is None
    first = scorer.session
    assert scorer.session is first


def test_dnsmos_empty_or_nonfinite_is_nan(scorer: DNSMOS) -> None:
    assert all(math.isnan(v) for v in scorer(np.array([])).values())
    assert all(math.isnan(v) for v in scorer(np.full(100, np.inf)).values())


# --- compute_metrics ---------------------------------------------------------------------------------------


def test_compute_metrics_without_dnsmos(clean: np.ndarray) -> None:
    noisy = add_noise(clean, 5.0)
    m = compute_metrics(clean, noisy, None)
    assert tuple(m) == METRIC_KEYS
    assert all(math.isfinite(m[k]) for k in ("pesq", "stoi", "si_sdr"))
    assert all(math.isnan(m[k]) for k in ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl"))
    assert m["si_sdr"] == pytest.approx(5.0, abs=0.5)


def test_a_missing_scoring_package_is_found_before_any_work(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without pesq (or, with DNSMOS on, speechmos/onnxruntime) the evaluation raised mid-run; now the command
    says what to install and does nothing. The packages are installed here: their absence is simulated by
    hiding them from importlib's lookup, which is all the check asks."""
    import importlib.util as real

    from recipes import metrics
    from recipes.evaluate import main

    class Without:
        def __init__(self, *hidden: str) -> None:
            self.hidden = hidden

        def find_spec(self, name: str) -> object:
            return None if name in self.hidden else real.find_spec(name)

    assert metrics.metrics_problem(dnsmos=True) is None  # all there
    monkeypatch.setattr(metrics, "importlib_util", Without("pesq"))
    assert "pesq" in (metrics.metrics_problem(dnsmos=False) or "")
    out = tmp_path / "out"
    code = main(["--model-config", "tiny", "--pairs", str(tmp_path), "--out", str(out), "--no-dnsmos"])
    assert code == 2 and "scoring needs pesq" in capsys.readouterr().err and not out.exists()
    monkeypatch.setattr(metrics, "importlib_util", Without("speechmos"))
    assert metrics.metrics_problem(dnsmos=False) is None
    assert "(or --no-dnsmos)" in (metrics.metrics_problem(dnsmos=True) or "")
