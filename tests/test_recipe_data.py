"""What the mixing recipes (DNS, folders) hold out for validation, and what they train on."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest

from recipes.datasets import DataConfig, build
from recipes.mixing import MixingConfig
from tests.audio_trees import RATE, build_dns, build_folders, build_voicebank, noise, write


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


def test_overlapping_folders_use_each_file_once(tmp_path: Path) -> None:
    """The same folder twice, or a folder and one inside it, listed the same paths twice: those files trained
    twice, and one could be held out for validation while its twin trained (a link was caught, not this)."""
    tree = build_folders(tmp_path)
    speech = str(tree.speech)
    for listed in ((speech, speech), (speech, str(tree.speech / "spk0")), (speech, speech + "/spk0/../spk0")):
        cfg = DataConfig(speech=listed, noise=(str(tree.noise),), val_pairs=str(tree.dev))
        data = build(cfg, seed=0)
        assert data.description.startswith("6 speech files"), (listed, data.description)
        twins = [s for s in data.skipped if "used once" in s.reason]
        assert len(twins) == (6 if listed[1] == speech else 3), (listed, data.skipped)
        assert all("(listed twice)" in s.reason for s in twins), twins


def test_noise_and_validation_files_inside_the_speech_folder_are_not_trained_on_as_speech(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--speech my --noise my/noise --val-pairs my/devset trained on the noise and on both sides of the dev pairs
    as clean speech, and the model was then chosen on pairs it had trained on."""
    tree = build_folders(tmp_path)
    cfg = DataConfig(speech=(str(tmp_path),), noise=(str(tree.noise),), val_pairs=str(tree.dev))
    with caplog.at_level(logging.WARNING, logger="recipes.datasets"):
        data = build(cfg, seed=0)
    assert re.match(r"6 speech files \(.*\), 3 noise files \(.*\), 2 validation pairs", data.description), (
        data
    )
    reasons = {Path(s.path).relative_to(tmp_path).as_posix(): s.reason for s in data.skipped}
    assert reasons == {
        **{f"noise/n{i}.wav": "also a noise file (noise): not used as speech" for i in range(3)},
        **{
            f"devset/dev/{side}/{i:04d}.wav": "a validation pair's file (val_pairs): not trained on"
            for side in ("clean", "noisy")
            for i in (1, 2)
        },
    }
    assert "left 4 file(s) out, each a validation pair's file" in caplog.text
    # the validation pairs given as the noise folder: not trained on as noise either
    cfg = DataConfig(
        speech=(str(tree.speech),), noise=(str(tree.noise), str(tree.dev)), val_pairs=str(tree.dev)
    )
    noise_too = build(cfg, seed=0).description
    assert re.match(r"6 speech files \(.*\), 3 noise files \(.*\), 2 validation pairs", noise_too), noise_too


def test_a_mispaired_voicebank_training_pair_and_a_silent_noisy_validation_side_are_skipped(
    tmp_path: Path,
) -> None:
    """A training pair whose sides differ in length (mis-paired: VoiceBank's never do) was cut to the shorter
    side without a word, as validation and evaluation did not; a validation pair with a silent noisy side was
    scored (about -40 dB SI-SDR), taking the validation mean down by 12 dB with 5 pairs."""
    root = build_voicebank(tmp_path / "vb", utterances=2)
    train_noisy = root / "noisy_trainset_28spk_wav"
    write(train_noisy / "p239_002.wav", noise(3.5, 48000, seed=1), 48000)  # p239 trains
    write(train_noisy / "p287_001.wav", np.zeros(48000 * 2, np.float32), 48000)  # p287 is held out
    cfg = DataConfig(recipe="voicebank", root=str(root), cache_dir=str(tmp_path / "cache"))
    data = build(cfg, seed=0)
    reasons = {Path(s.path).name: s.reason for s in data.skipped}
    assert set(reasons) == {"p239_002.wav", "p287_001.wav"}, data.skipped
    assert reasons["p239_002.wav"].startswith("noisy 3.50 s and clean 1.40 s: lengths differ"), reasons
    assert reasons["p287_001.wav"] == "the noisy side is silent"
    assert len(data.train) == 3 and [p.name for p in data.val] == [
        "p226_001.wav",
        "p226_002.wav",
        "p287_002.wav",
    ]


def test_too_few_dns_noise_files_say_why_without_a_flag_the_recipe_refuses(tmp_path: Path) -> None:
    """With one noise file the DNS recipe said "or give validation pairs: --val-pairs", which it then refused
    ("the dns recipe does not use data.val_pairs"); with none it did not say why, as the folders recipe does."""
    tree = build_dns(tmp_path / "dns", n_noise=1)
    cfg = DataConfig(recipe="dns", root=str(tree.root))
    with pytest.raises(ValueError) as one:
        build(cfg, seed=0)
    assert str(one.value) == "need at least 2 usable noise files to hold one out for validation, got 1"
    for path in (tree.root / "datasets" / "noise").iterdir():
        path.unlink()
    with pytest.raises(ValueError, match=r"^no usable noise files \(none found: is it the right folder"):
        build(cfg, seed=0)
    write(tmp_path / "one" / "n.wav", noise(2.0))  # the folders recipe can take validation pairs: it says so
    folders = DataConfig(speech=(str(tree.root / "datasets" / "clean"),), noise=(str(tmp_path / "one"),))
    with pytest.raises(ValueError, match=r"got 1 \(or give validation pairs: --val-pairs\)$"):
        build(folders, seed=0)


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
