from __future__ import annotations

import pytest
import torch

from enhance.stft import STFTConfig, apply_magnitude, istft, log_magnitude, rebuild, sqrt_hann, stft

CFG = STFTConfig()


def test_window_satisfies_overlap_add() -> None:
    w2 = sqrt_hann(512, torch.float64) ** 2
    assert torch.allclose(w2[:256] + w2[256:], torch.ones(256, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 511, 4801, 16000, 16001])
def test_istft_inverts_stft(n: int) -> None:
    x = torch.randn(3, n, dtype=torch.float64)
    spec = stft(x, CFG)
    assert spec.shape == (3, CFG.n_frames(n), 257)
    assert torch.allclose(istft(spec, CFG, n), x, atol=1e-10)


def test_float32_reconstruction_within_1e6() -> None:
    x = torch.rand(16000) * 2 - 1
    assert (istft(stft(x, CFG), CFG, 16000) - x).abs().max() < 1e-6


def test_rebuild_with_own_magnitude_is_identity() -> None:
    x = torch.randn(2, 3333, dtype=torch.float64)
    spec = stft(x, CFG)
    y = rebuild(log_magnitude(spec), spec, CFG, 3333)
    assert y.shape == x.shape
    assert torch.allclose(y, x, atol=1e-9)


def test_framing_is_causal_per_hop() -> None:
    """Frame t only sees samples before (t + 1) * hop, as streaming requires."""
    x = torch.randn(4000, dtype=torch.float64)
    y = x.clone()
    y[1024:] += 1.0
    a, b = stft(x, CFG), stft(y, CFG)
    assert torch.equal(a[:4], b[:4])  # frame 3 covers samples [512, 1024)
    assert not torch.equal(a[4], b[4])


def test_only_half_overlap_supported() -> None:
    with pytest.raises(ValueError):
        STFTConfig(hop_length=128)


def test_only_16khz_models_are_supported() -> None:
    """Every path resamples to 16 kHz: a config at another rate would be fed 16 kHz audio as if it were its own."""
    with pytest.raises(ValueError, match="only 16 kHz models"):
        STFTConfig(sample_rate=8000)


def test_a_zero_bin_has_phase_zero() -> None:
    """A zero bin's phase is 0 whatever the sign of its zeros (torch.stft gives -0.0 real parts in some bins of
    a zero frame, whose angle is pi); the C signal path (enhance/native_step.c) gives phase 0 too."""
    zeros = torch.zeros(3, 257)
    spec = torch.complex(
        torch.full_like(zeros, -0.0), torch.cat([zeros[:2], torch.full_like(zeros[:1], -0.0)])
    )
    assert torch.signbit(spec.real).all()
    out = apply_magnitude(torch.ones_like(zeros), spec)
    assert torch.equal(out.real, torch.full_like(zeros, torch.expm1(torch.tensor(1.0)).item()))
    assert torch.equal(out.imag.abs(), zeros)
