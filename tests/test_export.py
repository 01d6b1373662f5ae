"""The export's attenuation sweep: every limit scored, the table has a column per metric, the choice is the best."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from models import Enhancer, get_config
from models.checkpoint import file_sha256
from recipes.export import best_row, sweep_attenuation, sweep_table
from recipes.pairs import discover_pairs
from tests.audio_trees import build_folders
from tests.test_evaluate import make_dev_set


def test_attenuation_sweep_with_dnsmos(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ck = SimpleNamespace(model=Enhancer(get_config("tiny")).eval())
    pairs = discover_pairs(make_dev_set(tmp_path / "data", n=2, seconds=2.0)).pairs
    rows = sweep_attenuation(ck, pairs, [None, 3.0], tmp_path / "out", dnsmos=True)
    assert [r["limit_db"] for r in rows] == [None, 3.0]
    keys = ("pesq", "stoi", "si_sdr", "dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl")
    assert all(math.isfinite(r[k]) for r in rows for k in keys)
    assert rows[0]["pesq"] != rows[1]["pesq"]  # a 3 dB limit changes the output of an untrained model
    table = sweep_table(rows, 2, "ovrl").splitlines()
    assert "Chosen by DNSMOS OVRL" in table[2]
    header = [c.strip() for c in table[4].strip("|").split("|")]
    assert header == [
        "max attenuation (dB)",
        "PESQ",
        "STOI",
        "SI-SDR (dB)",
        "DNSMOS SIG",
        "DNSMOS BAK",
        "DNSMOS OVRL",
    ]
    assert [line.split("|")[1].strip() for line in table[6:]] == ["(noisy input)", "no limit", "3"]
    for select, key in (("pesq", "pesq"), ("ovrl", "dnsmos_ovrl")):
        assert best_row(rows, select)[key] == max(r[key] for r in rows)
    sweep = [  # the shape of the real sweep: OVRL alone would take no limit, at a PESQ below the others
        {"limit_db": None, "pesq": 1.50, "dnsmos_ovrl": 2.80},
        {"limit_db": 20, "pesq": 1.73, "dnsmos_ovrl": 2.78},
        {"limit_db": 15, "pesq": 1.75, "dnsmos_ovrl": 2.75},
        {"limit_db": 12, "pesq": 1.74, "dnsmos_ovrl": 2.70},
    ]
    assert [best_row(sweep, s)["limit_db"] for s in ("pesq", "ovrl", "balanced")] == [15, None, 20]
    assert "within 0.05 of the best PESQ" in sweep_table(rows, 2, "balanced")


def test_model_card_names_a_warm_start_and_speech_pauses_only_when_used(tmp_path: Path) -> None:
    import dataclasses
    import json

    from models.config_io import to_dict
    from recipes.augment import AugmentConfig
    from recipes.datasets import DataConfig
    from recipes.evaluate import METRIC_KEYS
    from recipes.export import model_card
    from recipes.mixing import MixingConfig
    from recipes.trainer import RunConfig, TrainConfig

    ck = SimpleNamespace(model=Enhancer(get_config("tiny")).eval(), name="tiny")
    metrics = {k: 1.0 for k in METRIC_KEYS} | {"n_files": 2, "n_failed": 0}
    evaluation = {"summary": {"noisy": metrics, "enhanced": metrics}, "pairs_root": "pairs", "n_evaluated": 2}
    rows = [{"epoch": "1", "train_loss": "0.1", "val_loss": "0.2", "val_si_sdr": "3.0", "lr": "0.0002"}]
    plain = RunConfig(TrainConfig(model="tiny"), DataConfig(speech=("s",), noise=("n",)))
    warm = RunConfig(
        dataclasses.replace(
            plain.train,
            init_from="runs/x/best.safetensors",
            over_weight=1.5,
            ema_decay=0.998,
            pmsqe_weight=0.03,
        ),
        dataclasses.replace(
            plain.data,
            mixing=MixingConfig(
                pause_prob=0.5,
                pause_seconds=(0.3, 1.5),
                augment=AugmentConfig(noise_eq_prob=0.7, eq_db=9.0, noise_mix_prob=0.4),
            ),
        ),
    )
    # a warm start from a run folder that exists: the card carries that run's training line and curve
    base = tmp_path / "base"
    base.mkdir()
    base_cfg = dataclasses.replace(plain.data, mixing=MixingConfig(snr_db=(-5.0, 25.0)))
    (base / "config.json").write_text(json.dumps(to_dict(RunConfig(plain.train, base_cfg))))
    header = "epoch,global_step,train_loss,val_loss,val_si_sdr,lr\n"
    (base / "metrics.csv").write_text(header + "1,9,0.5,0.4,2.0,0.0002\n2,18,0.3,0.25,4.5,0.0001\n")
    chained = RunConfig(
        dataclasses.replace(plain.train, init_from=str(base / "best.safetensors")),
        dataclasses.replace(plain.data, mixing=MixingConfig(snr_db=(-5.0, 15.0))),
    )
    cards = {}
    for name, cfg in (("plain", plain), ("warm", warm), ("chained", chained)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(to_dict(cfg)))
        cards[name] = model_card("m", ck, tmp_path / name, evaluation, "cmd", rows)
    assert "Started from the weights of `runs/x/best.safetensors`" in cards["warm"]
    # the shared corpus is named with its licences, also as the Opus copy a GPU run trains on, and says so
    shared = dataclasses.replace(plain.data, speech=("../shared/data/speech/train",))
    gpu = dataclasses.replace(plain.data, speech=(".gpu/data/speech",), noise=(".gpu/data/noise",))
    for name, data in (("shared", shared), ("gpu", gpu)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(to_dict(RunConfig(plain.train, data))))
        cards[name] = model_card("m", ck, tmp_path / name, evaluation, "cmd", rows)
        assert "treat these weights as internal R&D material" in cards[name]
    assert "Opus copy" not in cards["shared"]
    assert "the shared development corpus, as the Opus copy of its speech/train" in cards["gpu"]
    assert "internal R&D" not in cards["plain"] and "check them before distributing" in cards["plain"]
    assert "these weights are from epoch 1 (lowest validation loss, 0.2000)" in cards["plain"]
    # a run trained through the DC blocker says so; one saved before DataConfig.dc_blocker existed trained without
    assert "mixtures and clean targets through the engines' 5-Hz DC blocker" in cards["plain"]
    (tmp_path / "legacy").mkdir()
    legacy = to_dict(plain)
    del legacy["data"]["dc_blocker"]
    (tmp_path / "legacy" / "config.json").write_text(json.dumps(legacy))
    assert "DC blocker" not in model_card("m", ck, tmp_path / "legacy", evaluation, "cmd", rows)
    # a run that picks its best epoch by val_pmsqe (--select-by pmsqe) says so
    (tmp_path / "by-pmsqe").mkdir()
    by_pmsqe = RunConfig(dataclasses.replace(plain.train, select_by="pmsqe"), plain.data)
    (tmp_path / "by-pmsqe" / "config.json").write_text(json.dumps(to_dict(by_pmsqe)))
    two = [rows[0] | {"val_pmsqe": "1.6"}, rows[0] | {"epoch": "2", "val_loss": "0.3", "val_pmsqe": "1.4"}]
    card = model_card("m", ck, tmp_path / "by-pmsqe", evaluation, "cmd", two)
    assert "these weights are from epoch 2 (lowest validation PMSQE, 1.4000)" in card
    assert "a speech pause of 0.3-1.5 s in 50% of the segments" in cards["warm"]
    assert "weighted 2.5x (`--over-weight 1.5`)" in cards["warm"]
    assert "a moving average of the weights (decay 0.998 per step, `--ema-decay`)" in cards["warm"]
    assert "plus 0.03 x PMSQE, a differentiable stand-in for PESQ (`--pmsqe-weight 0.03`)." in cards["warm"]
    assert (
        "augmentation: a random EQ (±9 dB) of the noise in 70%, a second noise at -10 to 0 dB relative to the first"
        " in 40% of the segments" in cards["warm"]
    )
    assert "no readable run folder beside it at export time" in cards["warm"]
    for word in (
        "Started from",
        "speech pause",
        "over-weight",
        "Starting weights",
        "augmentation",
        "moving average",
        "PMSQE",
    ):
        assert word not in cards["plain"]
    # the fine-tune's own SNR range, then the starting run's, with its curve and best epoch
    own, start = cards["chained"].split("## Starting weights")
    assert "SNR U[-5.0, 15.0] dB" in own and "SNR U[-5.0, 25.0] dB" in start
    assert (
        "| 2 | 0.3000 | 0.2500 | 4.50 | 1.0e-04 |" in start
        and "from epoch 2 (lowest validation loss, 0.2500)" in start
    )
    assert "over-weight" not in cards["chained"]
    # weights that are not the starting run's best file are named, not claimed to be its best epoch
    other = dataclasses.replace(
        chained, train=dataclasses.replace(chained.train, init_from=str(base / "ep1.safetensors"))
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(to_dict(other)))
    start = model_card("m", ck, tmp_path / "other", evaluation, "cmd", rows).split("## Starting weights")[1]
    assert "these weights are its file `ep1.safetensors`, not necessarily its best epoch" in start
    # a starting folder with an empty metrics file: the card says so instead of crashing
    (base / "metrics.csv").write_text(header)
    start = model_card("m", ck, tmp_path / "chained", evaluation, "cmd", rows).split("## Starting weights")[1]
    assert "no readable run folder" in start


def test_model_card_says_where_each_run_trained_and_follows_a_bundled_start_back_through_its_runs(
    tmp_path: Path,
) -> None:
    """A fine-tune that started from a bundled model (no run folder beside it) names the run it was exported from
    (``--init-run``, checked to hold the same weights), and that run's own start, each with the device from its
    env.json; ``same_weights`` ignores metadata but not one changed value."""
    import dataclasses
    import json

    from models import save_checkpoint
    from models.config_io import to_dict
    from recipes.datasets import DataConfig
    from recipes.evaluate import METRIC_KEYS
    from recipes.export import model_card, same_weights
    from recipes.mixing import MixingConfig
    from recipes.trainer import RunConfig, TrainConfig

    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    ck = SimpleNamespace(model=model, name="tiny")
    metrics = {k: 1.0 for k in METRIC_KEYS} | {"n_files": 2, "n_failed": 0}
    evaluation = {"summary": {"noisy": metrics, "enhanced": metrics}, "pairs_root": "pairs", "n_evaluated": 2}
    rows = [{"epoch": "1", "train_loss": "0.1", "val_loss": "0.2", "val_si_sdr": "3.0", "lr": "0.0002"}]
    header = "epoch,global_step,train_loss,val_loss,val_si_sdr,lr\n"
    scratch, middle, gpu = tmp_path / "scratch", tmp_path / "middle", tmp_path / "gpu"
    bundled = tmp_path / "pretrained" / "default.safetensors"
    plain = RunConfig(TrainConfig(model="tiny"), DataConfig(speech=("s",), noise=("n",)))
    configs = {
        scratch: plain,
        middle: dataclasses.replace(
            plain, train=dataclasses.replace(plain.train, init_from=str(scratch / "best.safetensors"))
        ),
        gpu: dataclasses.replace(
            plain,
            train=dataclasses.replace(plain.train, init_from=str(bundled), batch_size=64),
            data=dataclasses.replace(plain.data, mixing=MixingConfig(repeats=40)),
        ),
    }
    for folder, cfg in configs.items():
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(to_dict(cfg)))
        (folder / "metrics.csv").write_text(header + "1,9,0.5,0.4,2.0,0.0002\n")
    (scratch / "env.json").write_text(json.dumps({"device": "cpu"}))
    (gpu / "env.json").write_text(
        json.dumps({"device": "cuda:0", "cuda": {"devices": ["NVIDIA H100 80GB HBM3"]}})
    )
    card = model_card("m", ck, gpu, evaluation, "cmd", rows, "Data carried as Opus.", middle)
    own, first, second = card.split("## Starting weights")
    assert "on cuda:0 (NVIDIA H100 80GB HBM3)." in own and "Data carried as Opus." in own
    assert "(one epoch = 40 passes over the speech files" in own
    assert f"`{bundled}` (exported from `{middle}/best.safetensors`), from the run `{middle}`" in first
    assert "(device not recorded in the run folder)" in first and "from epoch 1" in first
    assert f"from the run `{scratch}`" in second and "on the CPU." in second

    save_checkpoint(tmp_path / "a.safetensors", model, "tiny", {"note": "a"})
    save_checkpoint(tmp_path / "b.safetensors", model, "tiny", {"note": "b"})
    assert same_weights(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
    save_checkpoint(tmp_path / "c.safetensors", model, "tiny")
    assert not same_weights(tmp_path / "a.safetensors", tmp_path / "c.safetensors")


def test_export_writes_nothing_until_everything_it_needs_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command on a real (tiny) run folder, into a stand-in for models/pretrained: a run folder missing a
    file, or a bad option, is a usage error with nothing written. (It once replaced the bundled weights, then
    crashed on the missing config.json, leaving the card and the golden numbers stale.)"""
    from models.checkpoint import load_checkpoint, save_checkpoint
    from recipes import export
    from recipes.export import same_weights
    from recipes.train import main as train_main

    tree = build_folders(tmp_path / "data")
    run = tmp_path / "run"
    args = ["--speech", str(tree.speech), "--noise", str(tree.noise), "--val-pairs", str(tree.dev)]
    args += ["--model", "tiny", "--epochs", "1", "--max-steps-per-epoch", "2", "--batch-size", "2"]
    assert train_main([*args, "--segment-seconds", "1.0", "--threads", "1", "--out", str(run)]) == 0
    bundled = tmp_path / "pretrained"
    monkeypatch.setattr(export, "PRETRAINED_DIR", bundled)
    common = ["--run", str(run), "--name", "scratch", "--pairs", str(tree.dev), "--no-dnsmos"]
    with pytest.raises(SystemExit) as exit_:  # it defaulted to the shipped model: a first try replaced it
        export.main(["--run", str(run), "--pairs", str(tree.dev), "--no-dnsmos"])
    assert exit_.value.code == 2 and "required: --name" in capsys.readouterr().err
    for extra, message in (
        (["--attenuation-sweep", "none,20dB"], "--attenuation-sweep: expected dB values or none"),
        (["--pairs", str(tmp_path / "nowhere")], "nowhere"),
        (["--weights", "ep3.safetensors"], "ep3.safetensors is missing"),
        (["--weights", "../best.safetensors"], "--weights: a file name inside the run folder"),
        (["--limit", "-1"], "must be at least 1"),  # dropped the last pair, and the card said "first -2"
        (["--sweep-pairs", "0"], "must be at least 1"),
        # tracebacks in the sweep, after the evaluation
        (["--attenuation-sweep", "nan"], "--attenuation-sweep: limits are dB >= 0"),
        (["--attenuation-sweep=-5"], "--attenuation-sweep: limits are dB >= 0"),
        # '../../x' wrote x.safetensors and x.md outside models/pretrained; '' hidden files
        (["--name", "../../escaped"], "--name '../../escaped': letters, digits"),
        (["--name", ""], "--name '': letters, digits"),
    ):
        with pytest.raises(SystemExit) as exit_:
            export.main([*common, *extra])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    config = (run / "config.json").read_bytes()
    (run / "config.json").unlink()
    with pytest.raises(SystemExit):
        export.main(common)
    assert "config.json is missing" in capsys.readouterr().err
    assert not bundled.exists() or not list(bundled.iterdir())
    (run / "config.json").write_bytes(config)
    metrics = (run / "metrics.csv").read_bytes()
    for name, text, says in (  # tracebacks after the whole evaluation
        ("metrics.csv", metrics.splitlines()[0] + b"\n", "no epoch"),
        ("config.json", b"not json", "unreadable config.json or metrics.csv"),
    ):
        keep = (run / name).read_bytes()
        (run / name).write_bytes(text)
        with pytest.raises(SystemExit):
            export.main(common)
        assert says in capsys.readouterr().err
        (run / name).write_bytes(keep)
    assert not bundled.exists() or not list(bundled.iterdir())
    bad = tmp_path / "bad-pairs" / "dev"  # no pair can be scored: exit 1, nothing shipped (it shipped a card
    for side in ("noisy", "clean"):  # "measured on the 0 pairs", and would have replaced the default so)
        (bad / side).mkdir(parents=True)
        sf.write(
            bad / side / "0001.wav", np.full(8000, np.nan if side == "noisy" else 0.1), 16000, subtype="FLOAT"
        )
    assert export.main([*common, "--pairs", str(bad.parent)]) == 1
    assert "could be evaluated: nothing exported" in capsys.readouterr().err
    assert not bundled.exists() or not list(bundled.iterdir())
    assert export.main([*common, "--attenuation-sweep", "none,12", "--sweep-pairs", "2"]) == 0
    assert sorted(p.name for p in bundled.iterdir()) == ["scratch.md", "scratch.safetensors"]
    card = (bundled / "scratch.md").read_text()
    assert "| 12 |" in card
    # trained on other data than the shared corpus: the card does not claim the corpus or its licences
    assert "shared development corpus" not in card and "LibriSpeech" not in card
    assert f"`{tree.speech}` speech" in card and "The licences are those of that data" in card
    assert "these weights are from epoch 1 (lowest validation loss" in card
    # another checkpoint of the run (other weights), named as such on the card, and its tensors are what ships
    other = load_checkpoint(run / "best.safetensors")
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(0.01)
    save_checkpoint(run / "ep9.safetensors", other.model, other.name, other.training)
    assert export.main([*common, "--weights", "ep9.safetensors"]) == 0
    card = (bundled / "scratch.md").read_text()
    assert "these weights are its file `ep9.safetensors`, not necessarily its best epoch" in card
    assert "swept" not in card  # no --attenuation-sweep this time
    shipped = bundled / "scratch.safetensors"
    assert same_weights(run / "ep9.safetensors", shipped)
    assert not same_weights(run / "best.safetensors", shipped)
    assert card.endswith(
        f"SHA-256 `{file_sha256(shipped)}` (`sha256sum models/pretrained/scratch.safetensors`).\n"
    )


def test_a_voicebank_runs_card_describes_its_pairs_not_dynamic_mixing(tmp_path: Path) -> None:
    """A VoiceBank run's card said "SNR U[0.0, 40.0] dB" and "one pass over the speech files": its pairs come
    mixed, and an epoch is one random crop of each pair."""
    from models.config_io import to_dict
    from recipes.export import _training
    from recipes.trainer import RunConfig

    cfg = to_dict(RunConfig())
    rows = [{"epoch": "1", "val_loss": "0.5", "val_pmsqe": "1.0"}]
    mixed = _training(cfg["train"], cfg["data"], rows, "best.safetensors", tmp_path)
    assert "SNR U[0.0, 40.0] dB" in mixed and "one pass over the speech files in 4-s segments" in mixed
    vb = dict(cfg["data"], recipe="voicebank")
    line = _training(cfg["train"], vb, rows, "best.safetensors", tmp_path)
    assert "SNR" not in line and "the corpus' own mixtures" in line
    assert "(one epoch = one random 4-s crop of each training pair)" in line
