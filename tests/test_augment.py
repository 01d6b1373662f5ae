"""Training augmentation (recipes.augment): what each step does to a segment, and that it leaves the mixing's own
random draws, and so every earlier run's batches, alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from recipes.audio_pool import list_audio, scan
from recipes.augment import AugmentConfig, augment, augment_rng, random_eq
from recipes.mixing import MixingConfig, MixingDataset
from tests.audio_trees import build_folders
from tests.conftest import speech_like


def _gain_db(before: np.ndarray, after: np.ndarray, freq: float, sr: int = 16000) -> float:
    f = np.fft.rfftfreq(len(before), 1.0 / sr)
    band = (f > freq / 1.2) & (f < freq * 1.2)
    num = np.sum(np.abs(np.fft.rfft(after))[band] ** 2)
    return float(10 * np.log10(num / np.sum(np.abs(np.fft.rfft(before))[band] ** 2)))


def test_random_eq_changes_the_spectrum_within_its_range_and_eq_db_0_is_the_identity() -> None:
    x = np.random.default_rng(0).standard_normal(32000).astype(np.float32)
    cfg = AugmentConfig(eq_db=9.0)
    gains = [_gain_db(x, random_eq(x, augment_rng(1, 0, i), cfg), 1000.0) for i in range(20)]
    assert max(abs(g) for g in gains) <= 9.0 + 0.5
    assert np.std(gains) > 1.0  # each draw its own curve
    y = random_eq(x, augment_rng(1, 0, 0), cfg)
    assert abs(_gain_db(x, y, 200.0) - _gain_db(x, y, 4000.0)) > 0.5  # not a plain level change
    np.testing.assert_array_equal(y, random_eq(x, augment_rng(1, 0, 0), cfg))  # deterministic per key
    flat = random_eq(x, augment_rng(1, 0, 0), AugmentConfig(eq_db=0.0))
    np.testing.assert_allclose(flat, x, atol=1e-5)
    assert random_eq(np.zeros(0, np.float32), augment_rng(1, 0, 0), cfg).shape == (0,)
    # filtered with zero padding: an impulse at the start rings on for a while but never wraps round to the end
    impulse = np.zeros(16000, np.float32)
    impulse[0] = 1.0
    rung = random_eq(impulse, augment_rng(1, 0, 3), cfg)
    assert np.abs(rung[:80]).max() > 1e-3 and np.abs(rung[-4000:]).max() < 1e-5


def test_a_second_noise_is_added_at_a_level_in_its_range() -> None:
    rng = np.random.default_rng(3)
    noise = rng.standard_normal(16000).astype(np.float32)
    second = (5.0 * rng.standard_normal(16000)).astype(np.float32)
    clean = speech_like(1.0, seed=1)
    cfg = AugmentConfig(noise_mix_prob=1.0, noise_mix_db=(-6.0, -3.0))
    for i in range(10):
        out_clean, out_noise = augment(clean, noise, augment_rng(0, 0, i), cfg, lambda _: second)
        np.testing.assert_array_equal(out_clean, clean)
        added = out_noise - noise
        rel_db = 10 * np.log10(
            np.mean(added.astype(np.float64) ** 2) / np.mean(noise.astype(np.float64) ** 2)
        )
        assert -6.0 - 1e-3 <= rel_db <= -3.0 + 1e-3
        np.testing.assert_allclose(added / np.abs(added).max(), second / np.abs(second).max(), atol=1e-5)


def test_a_silent_first_noise_is_replaced_by_the_second() -> None:
    second = np.random.default_rng(1).standard_normal(8000).astype(np.float32)
    cfg = AugmentConfig(noise_mix_prob=1.0)
    _, out = augment(
        np.ones(8000, np.float32), np.zeros(8000, np.float32), augment_rng(0, 0, 0), cfg, lambda _: second
    )
    np.testing.assert_array_equal(out, second)


def test_augmentation_off_draws_nothing_and_config_errors_are_clear() -> None:
    clean = speech_like(0.5, seed=0)
    noise = np.ones(8000, np.float32)
    rng = np.random.default_rng(5)
    out_clean, out_noise = augment(clean, noise, rng, AugmentConfig(), lambda _: pytest.fail("drew a noise"))
    assert out_clean is clean and out_noise is noise
    assert rng.random() == np.random.default_rng(5).random()
    assert not AugmentConfig().active and AugmentConfig(noise_eq_prob=0.1).active
    for bad, match in [
        (dict(speech_eq_prob=1.5), "speech_eq_prob"),
        (dict(eq_db=-1.0), "eq_db"),
        (dict(eq_points=1), "eq_points"),
        (dict(noise_mix_db=(0.0, -10.0)), "noise_mix_db"),
    ]:
        with pytest.raises(ValueError, match=match):
            AugmentConfig(**bad)  # type: ignore[arg-type]


def test_augmentation_keeps_the_mixing_draws_so_snr_level_and_crops_are_unchanged(tmp_path: Path) -> None:
    """An EQ of 0 dB on speech and noise is the identity; with it switched on, every example must still equal the
    example without augmentation: the augmentation's draws come from their own generator."""
    tree = build_folders(tmp_path, n_speech=3, n_dev=0)
    pools = scan(list_audio([tree.speech])), scan(list_audio([tree.noise]))
    plain = MixingConfig(segment_seconds=0.5, snr_db=(0.0, 20.0))
    flat_eq = dataclasses.replace(
        plain, augment=AugmentConfig(speech_eq_prob=1.0, noise_eq_prob=1.0, eq_db=0.0)
    )
    eq = dataclasses.replace(plain, augment=AugmentConfig(speech_eq_prob=1.0, noise_eq_prob=1.0, eq_db=12.0))
    a, b, c = (MixingDataset(*pools, cfg, seed=7) for cfg in (plain, flat_eq, eq))
    for key in [(0, 0), (0, 3), (2, 1)]:
        (na, ca), (nb, cb), (nc, cc) = a[key], b[key], c[key]
        np.testing.assert_allclose(nb.numpy(), na.numpy(), atol=1e-5)
        np.testing.assert_allclose(cb.numpy(), ca.numpy(), atol=1e-5)
        assert not np.allclose(cc.numpy(), ca.numpy(), atol=1e-3)  # a real EQ changes the speech
        assert not np.allclose((nc - cc).numpy(), (na - ca).numpy(), atol=1e-3)  # and the noise
    # a second noise changes the mixture's level, so the clean target is the same crop at another gain
    layered = dataclasses.replace(plain, augment=AugmentConfig(noise_mix_prob=1.0))
    d = MixingDataset(*pools, layered, seed=7)
    for key in [(0, 0), (0, 3), (2, 1)]:
        ca, cd = a[key][1].numpy(), d[key][1].numpy()
        scale = float(np.dot(cd, ca) / np.dot(ca, ca))
        np.testing.assert_allclose(cd, scale * ca, atol=1e-6)
        assert not np.allclose(d[key][0].numpy() - cd, scale * (a[key][0].numpy() - ca), atol=1e-4)
        # and the same SNR: the mixing's draws did not move (the second noise came from the augmentation's own)
        snr = [
            10 * np.log10(np.sum(c**2) / np.sum((n.numpy() - c) ** 2))
            for n, c in ((a[key][0], ca), (d[key][0], cd))
        ]
        assert abs(snr[0] - snr[1]) < 1e-3
