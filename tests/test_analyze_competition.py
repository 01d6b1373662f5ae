from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from models import Enhancer, get_config, save_checkpoint
from recipes.analyze_competition import layer_correlation, level_matched_auc, roc_auc
from tests.conftest import ROOT, speech_like


def test_roc_auc_matches_definition() -> None:
    labels = np.array([True, True, False, False, True])
    assert roc_auc(np.array([0.9, 0.8, 0.1, 0.2, 0.7]), labels) == 1.0
    assert roc_auc(np.array([0.1, 0.2, 0.9, 0.8, 0.3]), labels) == 0.0
    assert roc_auc(np.ones(5), labels) == 0.5  # all tied
    rng = np.random.default_rng(0)
    s, lab = rng.random(2000), rng.random(2000) > 0.5
    pairs = (s[lab][:, None] > s[~lab][None, :]).mean()  # P(score_pos > score_neg)
    assert abs(roc_auc(s, lab) - pairs) < 1e-12
    assert np.isnan(roc_auc(s, np.zeros(2000, bool)))


def test_level_matched_auc_sees_through_a_score_that_only_follows_the_level() -> None:
    """Speech is likelier in loud frames: a score equal to the level separates speech overall, but not among
    frames of similar level; a score that carries the label itself does both."""
    rng = np.random.default_rng(3)
    n = 20000
    level = rng.random(n) * 10  # dB-like, uniform
    labels = rng.random(n) < np.floor(level) / 10  # depends on the level's decile only
    assert roc_auc(level, labels) > 0.8
    assert abs(level_matched_auc(level, labels, level) - 0.5) < 0.03
    informed = labels + 0.8 * rng.standard_normal(n)
    assert level_matched_auc(informed, labels, level) > 0.75
    # exactly the pairwise definition: P(score_pos > score_neg) over same-bin pairs
    lv, sc = rng.random(600), rng.random(600)
    lab = rng.random(600) < lv
    which = np.searchsorted(np.quantile(lv, [0.5]), lv, side="right")
    same = which[lab][:, None] == which[~lab][None, :]
    wins = sc[lab][:, None] > sc[~lab][None, :]
    assert abs(level_matched_auc(sc, lab, lv, bins=2) - wins[same].mean()) < 1e-12
    assert np.isnan(level_matched_auc(sc, np.zeros(600, bool), lv))


def test_layer_correlation_of_identical_layers_is_one() -> None:
    m = np.random.default_rng(1).random((100, 2))
    m /= m.sum(1, keepdims=True)
    assert np.allclose(layer_correlation([m, m]), 1.0)


def test_command_end_to_end(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ck = tmp_path / "tiny.safetensors"
    save_checkpoint(ck, Enhancer(get_config("tiny-tim4")), "tiny-tim4")
    for d in ("noisy", "clean"):
        (tmp_path / "dev" / d).mkdir(parents=True)
    rng = np.random.default_rng(2)
    for i in range(2):
        clean = np.concatenate(
            [np.zeros(8000, np.float32), speech_like(1.5, seed=i), np.zeros(8000, np.float32)]
        )
        sf.write(tmp_path / "dev" / "clean" / f"{i}.wav", clean, 16000)
        sf.write(
            tmp_path / "dev" / "noisy" / f"{i}.wav", clean + 0.01 * rng.standard_normal(len(clean)), 16000
        )
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.analyze_competition",
            "--checkpoint",
            str(ck),
            "--pairs",
            str(tmp_path),
            "--out",
            str(out),
            "--figures",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads((out / "summary.json").read_text())
    assert r["files"] == 2 and 0 < r["speech_frames"] < r["frames"]
    (layer,) = r["layers"]
    assert 0 <= layer["entropy_p10"] <= layer["entropy_mean"] <= layer["max_entropy"] + 1e-9
    assert len(layer["auc_speech"]) == 4 and all(0 <= a <= 1 for a in layer["auc_speech"])
    matched = layer["auc_speech_level_matched"]
    assert len(matched) == 4 and all(0 <= a <= 1 for a in matched)
    assert 0.5 < r["auc_noisy_level"] <= 1  # speech frames are the loud ones in these files
    assert abs(sum(layer["mean_score"]) - 1) < 1e-5
    assert (out / "entropy_by_layer.png").is_file() and (out / "maps_0.png").is_file()
    assert "| block |" in (out / "summary.md").read_text()
    assert "level-matched ROC-AUC" in (out / "summary.md").read_text()


def test_command_errors_are_messages_and_a_bad_file_is_skipped(tmp_path: Path, capsys) -> None:
    from recipes.analyze_competition import main

    torch.manual_seed(0)
    ck = tmp_path / "tiny.safetensors"
    save_checkpoint(ck, Enhancer(get_config("tiny")), "tiny")
    for d in ("noisy", "clean"):
        (tmp_path / "dev" / d).mkdir(parents=True)
    for name in ("0001", "0002"):
        x = speech_like(1.0, seed=int(name))
        sf.write(tmp_path / "dev" / "clean" / f"{name}.wav", x, 16000)
        sf.write(
            tmp_path / "dev" / "noisy" / f"{name}.wav",
            x + 0.01 * np.random.default_rng(1).standard_normal(len(x)),
            16000,
        )
    (tmp_path / "dev" / "noisy" / "0002.wav").write_bytes(b"RIFF broken")
    out = str(tmp_path / "out")
    missing = str(tmp_path / "nope.safetensors")
    assert main(["--checkpoint", missing, "--pairs", str(tmp_path / "dev"), "--out", out]) == 2
    assert capsys.readouterr().err == f"analyze_competition: error: {missing}: no such checkpoint file\n"
    assert main(["--checkpoint", str(ck), "--pairs", str(tmp_path / "nowhere"), "--out", out]) == 2
    assert capsys.readouterr().err == f"analyze_competition: error: {tmp_path / 'nowhere'}: no such folder\n"
    with pytest.raises(SystemExit):  # nan: "0 speech frames", every AUC nan, exit 0
        main(["--checkpoint", str(ck), "--pairs", str(tmp_path / "dev"), "--out", out, "--vad-db", "nan"])
    assert "--vad-db must be a positive number of dB, got nan" in capsys.readouterr().err
    assert (
        main(["--checkpoint", str(ck), "--pairs", str(tmp_path / "dev"), "--out", out, "--figures", "1"]) == 0
    )
    assert "skipped 0002" in capsys.readouterr().err
    assert (tmp_path / "out" / "maps_0001.png").is_file()
    # no pair readable: an error, and no empty --out folder left behind
    (tmp_path / "dev" / "noisy" / "0001.wav").write_bytes(b"RIFF broken")
    none_read = tmp_path / "none-read"
    assert main(["--checkpoint", str(ck), "--pairs", str(tmp_path / "dev"), "--out", str(none_read)]) == 2
    assert "error: no pair could be read" in capsys.readouterr().err
    assert not none_read.exists()
    x = speech_like(1.0, seed=1)
    sf.write(
        tmp_path / "dev" / "noisy" / "0001.wav",
        x + 0.01 * np.random.default_rng(1).standard_normal(len(x)),
        16000,
    )
    # a set whose clean side is silent has no speech frames: its AUCs are NaN, null in summary.json (a bare NaN
    # there was invalid JSON for strict parsers)
    sf.write(tmp_path / "dev" / "clean" / "0001.wav", np.zeros(16000, np.float32), 16000)
    out2 = tmp_path / "out2"
    assert main(["--checkpoint", str(ck), "--pairs", str(tmp_path / "dev"), "--out", str(out2)]) == 0

    def no_nan(token: str) -> None:
        raise ValueError(f"{token} in summary.json")

    json.loads((out2 / "summary.json").read_text(), parse_constant=no_nan)
    # an --out under a file: refused before any work (it was a traceback after it)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "--checkpoint",
                str(ck),
                "--pairs",
                str(tmp_path / "dev"),
                "--out",
                str(tmp_path / "a-file" / "o"),
            ]
        )
    assert exit_.value.code == 2
    a_file = tmp_path / "a-file"
    assert f"error: --out {a_file / 'o'}: {a_file} exists and is not a folder" in capsys.readouterr().err


def test_a_silent_clean_file_has_no_speech_frames() -> None:
    """Within 30 dB of its own maximum, digital silence was labelled speech in every frame."""
    from models.pretrained import load_pretrained
    from recipes.analyze_competition import vad_labels

    ck = load_pretrained()
    assert not vad_labels(np.zeros(16000, np.float32), ck, 30.0).any()
    x = speech_like(1.0, seed=3)
    assert vad_labels(x, ck, 30.0).mean() > 0.3  # real sound keeps its labels (speech_like has pauses)
