"""What the mixing recipes (DNS, folders) hold out for validation, and what they train on."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from recipes.datasets import DataConfig, build
from recipes.mixing import MixingConfig
from tests.audio_trees import RATE, build_voicebank, noise, write


def _tone_corpus(root: Path, n: int) -> list[float]:
    """``n`` one-second speech files, file k a tone at its own frequency (so a validation mix names its file)."""
    freqs = [300.0 + 40.0 * k for k in range(n)]
    t = np.arange(RATE) / RATE
    for k, f in enumerate(freqs):
        write(root / "speech" / f"s{k:02d}.wav", (0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32))
    for k in range(4):
        write(root / "noise" / f"n{k}.wav", noise(2.0, seed=k))
    return freqs


def _source(clean: np.ndarray, freqs: list[float]) -> int:
    spectrum = np.abs(np.fft.rfft(clean * np.hanning(len(clean))))
    peak = np.argmax(spectrum) * RATE / len(clean)
    return int(np.argmin([abs(peak - f) for f in freqs]))


def test_validation_mixes_spread_over_the_held_out_files_and_take_no_more_files_than_they_use(
    tmp_path: Path,
) -> None:
    """The 64 validation mixes were the first 64 segments: the first 8 held-out files by name on DNS's 30-s
    clips, while 5 % of the files (25 h of DNS) were held out of training."""
    freqs = _tone_corpus(tmp_path, 40)
    cfg = DataConfig(
        speech=(str(tmp_path / "speech"),),
        noise=(str(tmp_path / "noise"),),
        val_holdout=0.5,  # 20 files, but 6 validation mixes can use only 6
        val_examples=6,
        mixing=MixingConfig(segment_seconds=0.25, snr_db=(30.0, 40.0)),  # 4 segments per file
    )
    data = build(cfg, seed=0)
    assert data.description.startswith("34 speech files"), data.description
    used = {_source(pair.clean, freqs) for pair in data.val}
    assert len(data.val) == 6 and len(used) == 6, used  # one mix per held-out file (the first 2 files before)
    # a run saved before (no val_spread in its config) resumes with the validation set it had: the first 6
    # segments, of 2 files, and half of the files held out
    from models.config_io import to_dict
    from recipes.trainer import RunConfig, saved_run_config

    raw = to_dict(RunConfig(data=cfg))
    del raw["data"]["val_spread"]
    old = saved_run_config(raw).data
    assert old.val_spread is False
    before = build(old, seed=0)
    assert before.description.startswith("20 speech files"), before.description
    assert len({_source(pair.clean, freqs) for pair in before.val}) == 2


def test_a_link_to_a_listed_file_is_used_once(tmp_path: Path) -> None:
    """A symlink beside the file it points to was a second training file (or held out while its target
    trained); it is skipped with the reason."""
    _tone_corpus(tmp_path, 6)
    os.symlink(tmp_path / "speech" / "s00.wav", tmp_path / "speech" / "s99-link.wav")
    # a link named before its file: the file was called the duplicate, and the link trained
    os.symlink(tmp_path / "speech" / "s01.wav", tmp_path / "speech" / "a-link.wav")
    cfg = DataConfig(speech=(str(tmp_path / "speech"),), noise=(str(tmp_path / "noise"),))
    data = build(cfg, seed=2)
    linked = {Path(s.path).name: s.reason for s in data.skipped}
    assert sorted(linked) == ["a-link.wav", "s99-link.wav"], data.skipped
    assert (
        linked["s99-link.wav"]
        == f"the same file as {tmp_path / 'speech' / 's00.wav'} (through a link): used once"
    )
    assert (
        linked["a-link.wav"]
        == f"the same file as {tmp_path / 'speech' / 's01.wav'} (through a link): used once"
    )


def test_voicebank_without_the_default_speakers_says_which_it_holds_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tree with p226 but not p287 held out p226 alone, without a word; the 56-speaker set (neither) its last
    two, also without a word. Now two speakers, named in a warning; speakers named in a config must be there,
    and a .WAV file is a pair like a .wav one."""
    root = build_voicebank(tmp_path / "vb", speakers=("p226", "p239", "p270", "p301"), utterances=1)
    for side in ("clean", "noisy"):
        (root / f"{side}_trainset_28spk_wav" / "p301_001.wav").rename(
            root / f"{side}_trainset_28spk_wav" / "p301_001.WAV"
        )
    cfg = DataConfig(recipe="voicebank", root=str(root), cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="recipes.datasets"):
        data = build(cfg, seed=0)
    assert sorted(p.name.split("_")[0] for p in data.val) == ["p270", "p301"]
    assert "p287 not in this training set: holding out its last two speakers, p270, p301" in caplog.text
    assert len(data.train) == 2 and data.skipped == []
    with pytest.raises(ValueError, match=r"voicebank_val_speakers \['p999'\] not in the training set"):
        build(dataclasses.replace(cfg, voicebank_val_speakers=("p226", "p999")), seed=0)
    with pytest.raises(ValueError, match="voicebank_trainset is one of 28spk, 56spk"):
        DataConfig(recipe="voicebank", root=str(root), voicebank_trainset="56")


def test_a_wrong_dns_root_names_the_layout(tmp_path: Path) -> None:
    """--root one level too deep blamed the relative folders of --config dns.json."""
    (tmp_path / "DNS" / "datasets" / "clean").mkdir(parents=True)
    with pytest.raises(
        FileNotFoundError, match=r"datasets/clean: missing \(expected the DNS Challenge layout"
    ):
        build(DataConfig(recipe="dns", root=str(tmp_path / "DNS" / "datasets")), seed=0)
