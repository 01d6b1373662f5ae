"""The band above 8 kHz of inputs above 16 kHz (enhance/high_band.py): kept, gated by the model's 6-8 kHz gain."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from enhance.audio_io import MODEL_RATE
from enhance.high_band import GainTracker, HighBand, HighBandConfig, high_band_output, highpass_fir


def _down_up(x: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """x [C, n] at ``rate`` -> (x16 [C, m], up(x16) [C, n]), one-shot soxr as enhance_audio does."""
    x16 = soxr.resample(x.T, rate, MODEL_RATE, quality="HQ").T
    up = soxr.resample(x16.T, MODEL_RATE, rate, quality="HQ").T[:, : x.shape[1]]
    return np.ascontiguousarray(x16, np.float32), np.ascontiguousarray(up, np.float32)


def _hiss(rate: int, seconds: float, channels: int, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal((channels, int(rate * seconds)))).astype(
        np.float32
    )


def _above_8k(x: np.ndarray, rate: int) -> float:
    """Energy of ``x`` (1-D) above 8.5 kHz."""
    spec = np.abs(np.fft.rfft(x.astype(np.float64))) ** 2
    return float(spec[np.fft.rfftfreq(len(x), 1 / rate) > 8500].sum())


def _streamed(x: np.ndarray, rate: int, y16_of, block: int) -> np.ndarray:
    """The file path's plumbing: x in blocks through soxr streams, y16 = y16_of(x16 block), HighBand on top."""
    c = x.shape[0]
    down = soxr.ResampleStream(rate, MODEL_RATE, c, dtype="float32", quality="HQ")
    up = soxr.ResampleStream(MODEL_RATE, rate, c, dtype="float32", quality="HQ")
    band, out = HighBand(rate, c), []
    for i in range(0, x.shape[1] + 1, block):
        last = i + block > x.shape[1]
        b = np.ascontiguousarray(x[:, i : i + block].T)
        d = down.resample_chunk(b, last=last)
        band.add_input(b, d, last=last)
        y16 = y16_of(d.T)
        out.append(band.output(up.resample_chunk(np.ascontiguousarray(y16.T), last=last), y16, last=last))
        if last:
            break
    return np.concatenate(out).T


@pytest.mark.parametrize("rate,channels", [(48000, 1), (44100, 2), (22050, 1)])
def test_untouched_model_output_gives_the_input_back(rate: int, channels: int) -> None:
    """With y16 = x16 every gain is 1 and up(x16) + (x - up(x16)) is the input, to float rounding, whole or in
    blocks."""
    x = _hiss(rate, 1.5, channels)
    x16, up = _down_up(x, rate)
    assert np.abs(high_band_output(x, x16, up, x16, rate) - x).max() < 1e-6
    streamed = _streamed(x, rate, lambda a: a, block=3001)
    n = streamed.shape[1]
    assert n >= x.shape[1] - 2  # the resampler's rounding
    assert np.abs(streamed - x[:, :n]).max() < 1e-6


def test_any_block_size_gives_the_same_samples() -> None:
    rate = 48000
    x = _hiss(rate, 2.0, 2, seed=1)
    x[:, rate // 2 : rate] *= 0.01  # a quiet stretch: the gains move

    def model(a: np.ndarray) -> np.ndarray:  # like the engine, independent of the blocks; quiet parts cut
        return np.where(np.abs(a) > 0.02, a, 0.1 * a).astype(np.float32)

    outs = [_streamed(x, rate, model, block) for block in (1, 777, 4801, 2 * rate, 10 * rate)]
    n = min(o.shape[1] for o in outs)
    loud, quiet = slice(2000, rate // 2 - 2000), slice(rate // 2 + 2000, rate - 2000)
    kept = [_above_8k(outs[0][0, s], rate) / _above_8k(x[0, s], rate) for s in (loud, quiet)]
    assert kept[0] > 0.5 and kept[1] < 0.02  # the quiet stretch's high band was gated with it (-20 dB there)
    for o in outs[1:]:
        assert np.abs(o[:, :n] - outs[0][:, :n]).max() < 1e-6


def test_the_high_band_follows_the_models_gain_near_8khz() -> None:
    """y16 at -12 dB in the first second, silent in the second: the band above 8 kHz follows (-12 dB, then
    gone), while a model that keeps everything keeps it."""
    rate = 48000
    x = _hiss(rate, 2.0, 1, seed=2)
    x16, _ = _down_up(x, rate)
    y16 = x16.copy()
    y16[:, :MODEL_RATE] *= 0.25
    y16[:, MODEL_RATE:] = 0.0
    y = soxr.resample(y16.T, MODEL_RATE, rate, quality="HQ").T[:, : x.shape[1]]
    out = high_band_output(x, x16, y, y16, rate)[0]
    first, second = slice(int(0.1 * rate), int(0.9 * rate)), slice(int(1.1 * rate), int(1.9 * rate))
    ratio_db = 10 * np.log10(_above_8k(out[first], rate) / _above_8k(x[0, first], rate))
    assert -12.5 < ratio_db < -11.5
    assert _above_8k(out[second], rate) < 1e-6 * _above_8k(x[0, second], rate)


def test_gain_tracker_state_is_causal_and_bounded() -> None:
    """Gains come out per complete 4-ms block; the rest on finish; a gain never exceeds 1 (no boost)."""
    tracker = GainTracker(1)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 1000))
    g = tracker.push(x, 2.0 * x)  # the "enhanced" is louder: still 1
    assert g.shape == (1, 960) and np.all(g == 1.0)
    assert tracker.finish().shape == (1, 40)
    assert tracker.state.x_tail.shape == (1, HighBandConfig().taps - 1)
    with pytest.raises(ValueError, match="differ in shape"):
        tracker.push(x, x[:, :10])


def test_the_band_filter_passes_6_to_8khz_only() -> None:
    h = np.abs(np.fft.rfft(highpass_fir(HighBandConfig()), 4096))
    f = np.fft.rfftfreq(4096, 1 / MODEL_RATE)
    assert h[f > 6800].min() > 0.9 and h[f < 5000].max() < 0.05


def test_no_high_band_at_or_below_16khz() -> None:
    with pytest.raises(ValueError, match="no band above 8 kHz"):
        HighBand(16000, 1)


def test_settings_that_would_break_the_filter_or_the_average_are_refused_or_safe() -> None:
    for bad in ({"taps": 32}, {"taps": 1}, {"band_hz": 8000.0}, {"block": 0}, {"smoothing_ms": 0.0}):
        with pytest.raises(ValueError):
            HighBandConfig(**bad)
    x = np.random.default_rng(4).standard_normal((1, 4096))
    for cfg in (HighBandConfig(smoothing_ms=0.3), HighBandConfig(block=512, smoothing_ms=2.0)):
        # a short time constant once overflowed the closed-form average (NaN gains)
        g = GainTracker(1, cfg).push(x, 0.5 * x)
        assert np.isfinite(g).all() and np.abs(g[:, 1024:] - 0.5).max() < 1e-9


def test_an_input_shorter_than_one_16khz_sample_gets_no_stand_in_band() -> None:
    """enhance_audio enhances a zero stand-in sample then; its 'high band' would be the input itself."""
    import torch

    from enhance.offline import enhance_audio
    from models import Enhancer, get_config

    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    x = np.full((1, 1), 0.4, np.float32)
    gate = enhance_audio(model, x, 48000).wav
    assert np.array_equal(gate, enhance_audio(model, x, 48000, high_band=False).wav)
