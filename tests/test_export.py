"""The export's attenuation sweep: every limit scored, the table has a column per metric, the choice is the best."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import torch

from models import Enhancer, get_config
from recipes.export import best_row, sweep_attenuation, sweep_table
from recipes.pairs import discover_pairs
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
        dataclasses.replace(plain.train, init_from="runs/x/best.safetensors", over_weight=1.5),
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
    assert "a speech pause of 0.3-1.5 s in 50% of the segments" in cards["warm"]
    assert "weighted 2.5x (`--over-weight 1.5`)" in cards["warm"]
    assert (
        "augmentation: a random EQ (±9 dB) of the noise in 70%, a second noise at -10 to 0 dB relative to the first"
        " in 40% of the segments" in cards["warm"]
    )
    assert "no readable run folder beside it at export time" in cards["warm"]
    for word in ("Started from", "speech pause", "over-weight", "Starting weights", "augmentation"):
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
