"""Recipe settings are checked where they are read: wrong types, impossible values and settings a recipe would
not apply are errors naming the setting, not a crash (or a silently different run) later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.config_io import from_dict
from recipes import run_folder
from recipes.audio_pool import list_audio
from recipes.distributed import pick_device
from recipes.trainer import RunConfig
from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # a string where a list belongs became a tuple of its characters (and a walk of / for "/x")
        ({"data": {"speech": "/x"}}, r"config.data.speech: expected a list, got str '/x'"),
        ({"data": {"voicebank_val_speakers": "p226"}}, r"voicebank_val_speakers: expected a list"),
        ({"train": {"epochs": "3"}}, r"config.train.epochs: expected int, got str '3'"),
        ({"train": {"lr": "1e-3"}}, r"config.train.lr: expected float, got str"),
        ({"train": {"amp": 1}}, r"config.train.amp: expected bool, got int"),
        ({"data": {"mixing": {"snr_db": 5}}}, r"config.data.mixing.snr_db: expected a list, got int"),
        ({"data": {"mixing": {"snr_db": [0, 10, 20]}}}, r"snr_db: expected a list of 2 values, got 3"),
        ({"data": {"speech": ["/a", 3]}}, r"config.data.speech\[1\]: expected str, got int"),
        # values that crashed deep in a run
        ({"train": {"batch_size": 0}}, r"batch_size must be >= 1"),
        ({"train": {"lr": 0.0}}, r"lr must be finite and > 0"),
        (
            {"train": {"lr": 1e999}},
            r"config.train.lr: expected a finite number, got inf",
        ),  # JSON 1e999 is inf
        ({"train": {"time_budget_minutes": -1}}, r"time_budget_minutes must be >= 0"),
        ({"data": {"mixing": {"segment_seconds": -1}}}, r"segment_seconds must hold at least one 512-sample"),
        ({"data": {"mixing": {"segment_seconds": 1e-5}}}, r"at least one 512-sample STFT window \(0.032 s\)"),
        ({"data": {"val_examples": 0}}, r"val_examples must be >= 1"),  # no best.safetensors, rc 0
        ({"data": {"val_holdout": 1.5}}, r"val_holdout is a fraction of the files, in \(0, 1\)"),
        ({"data": {"mixing": {"snr_db": [20, 0]}}}, r"snr_db must be \[low, high\] with low <= high"),
    ],
)
def test_wrong_types_and_values_are_named(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_dict(RunConfig, data)


def test_json_numbers_take_their_field_type() -> None:
    cfg = from_dict(RunConfig, {"train": {"epochs": 3.0, "lr": 1}, "data": {"mixing": {"snr_db": [0, 5]}}})
    assert cfg.train.epochs == 3 and isinstance(cfg.train.epochs, int)
    assert isinstance(cfg.train.lr, float) and cfg.data.mixing.snr_db == (0.0, 5.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"recipe": "dns", "root": "/r", "val_pairs": "/dev"}, r"the dns recipe does not use data.val_pairs"),
        ({"recipe": "dns", "root": "/r", "speech": ["/s"], "noise": ["/n"]}, r"data.speech, data.noise"),
        ({"recipe": "folders", "root": "/r", "speech": ["/s"], "noise": ["/n"]}, r"does not use data.root"),
        ({"recipe": "folders", "voicebank_trainset": "56spk"}, r"data.voicebank_trainset"),
        # VoiceBank's pairs come mixed: augmentation, pauses, SNRs and repeats would not be applied
        (
            {
                "recipe": "voicebank",
                "root": "/r",
                "mixing": {"pause_prob": 0.3, "augment": {"noise_eq_prob": 0.5}},
            },
            r"data.mixing.pause_prob, data.mixing.augment",
        ),
        ({"recipe": "voicebank", "root": "/r", "mixing": {"repeats": 4}}, r"data.mixing.repeats"),
    ],
)
def test_settings_a_recipe_would_not_apply_are_refused(data: dict, message: str) -> None:
    """They were accepted and recorded in config.json (and in an exported model card) as if applied."""
    with pytest.raises(ValueError, match=message):
        from_dict(RunConfig, {"data": data})


def test_merged_configs_keep_null_for_an_optional_section() -> None:
    """A later file may turn an optional section off with null (train.bcd); anything else replacing a section is
    an error (tested through the command above)."""
    from recipes.train import merge

    assert merge({"train": {"bcd": {"g_steps": 1}}}, {"train": {"bcd": None}}) == {"train": {"bcd": None}}
    with pytest.raises(ValueError, match=r"config.train.bcd: expected an object, got int 1"):
        merge({"train": {"bcd": {"g_steps": 1}}}, {"train": {"bcd": 1}})


def test_voicebank_keeps_the_segment_length() -> None:
    cfg = from_dict(
        RunConfig, {"data": {"recipe": "voicebank", "root": "/r", "mixing": {"segment_seconds": 2.0}}}
    )
    assert cfg.data.mixing.segment_seconds == 2.0


def test_the_train_command_names_the_bad_setting_and_the_bad_file(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    (tmp_path / "str.json").write_text(json.dumps({"data": {"speech": "/", "noise": ["/n"]}}))
    (tmp_path / "broken.json").write_text('{"train": {"epochs": 3,}}')
    # each of these was a traceback, or accepted and then unresumable (NaN != NaN), or silently dropped settings
    (tmp_path / "nan.json").write_text('{"train": {"over_weight": NaN}}')
    (tmp_path / "inf.json").write_text('{"data": {"mixing": {"pause_seconds": [0.1, Infinity]}}}')
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00junk")
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "a.json").write_text('{"train": {"epochs": 1}}')
    (tmp_path / "b.json").write_text('{"train": 5}')
    (tmp_path / "seed.json").write_text('{"train": {"seed": -1}}')
    for names, message in (
        (["str.json"], "config.data.speech: expected a list, got str '/'"),
        (["broken.json"], f"{tmp_path / 'broken.json'}: not valid JSON"),
        (["nan.json"], "config.train.over_weight: expected a finite number, got nan"),
        (["inf.json"], "config.data.mixing.pause_seconds[1]: expected a finite number, got inf"),
        (["binary.json"], f"{tmp_path / 'binary.json'}: not a text file"),
        (["folder.json"], f"{tmp_path / 'folder.json'}: is a folder"),
        (["a.json", "b.json"], "config.train: expected an object, got int 5"),
        (["seed.json"], "seed must be >= 0, got -1"),
        (["nosuch.json"], f"--config {tmp_path / 'nosuch.json'}: no such file (nor "),  # was "[Errno 2] ..."
    ):
        cmd = [sys.executable, "-m", "recipes.train", "--out", str(tmp_path / "r")]
        for name in names:
            cmd += ["--config", str(tmp_path / name)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def test_audio_folders_are_listed_through_symlinks(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "deep").mkdir(parents=True)
    for p in (corpus / "a.wav", corpus / "deep" / "b.flac", corpus / "notes.txt"):
        p.write_bytes(b"x")
    speech = tmp_path / "speech"
    speech.mkdir()
    (speech / "linked").symlink_to(corpus, target_is_directory=True)
    (speech / "single.wav").symlink_to(corpus / "a.wav")
    (corpus / "deep" / "loop").symlink_to(corpus, target_is_directory=True)  # a cycle ends, not recurses
    found = [Path(p).relative_to(speech).as_posix() for p in list_audio([speech])]
    assert found == ["linked/a.wav", "linked/deep/b.flac", "single.wav"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_without_cuda_and_unknown_devices_are_errors() -> None:
    with pytest.raises(ValueError, match="no CUDA device here"):
        pick_device("cuda", 0)
    with pytest.raises(ValueError, match="no CUDA device here"):
        pick_device("cuda:1", 1)
    for bad in ("gpu", "meta", "cuda:x"):  # meta was taken and failed later, at the first tensor
        with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:N"):
            pick_device(bad, 0)
    assert pick_device("cpu", 0).type == "cpu"
    assert pick_device("auto", 1) == torch.device("cpu")


def test_a_truncated_training_state_is_a_clear_error(tmp_path: Path) -> None:
    """The README's GPU flow joins state files from parts: a missing part must not be a pickle traceback."""
    path = tmp_path / "state.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(ValueError, match=r"state.pt: unreadable training state"):
        run_folder.load_state(path)


def test_sigterm_before_training_stops_at_once_and_during_it_at_the_next_step() -> None:
    """The deferred stop made a SIGTERM during the data scan (minutes on DNS) wait for the scan; a second one,
    or one before training starts, stops at once (exit 143)."""
    import signal

    from recipes.train import SIGTERM_REASON, _stop_on_sigterm
    from recipes.trainer import StopRequest

    stop = StopRequest()
    previous = _stop_on_sigterm(stop)
    try:
        with pytest.raises(SystemExit) as exc:  # the data is being scanned: nothing to save
            os.kill(os.getpid(), signal.SIGTERM)
        assert exc.value.code == 143 and stop.reason is None
        stop.armed = True  # training started (Trainer.fit)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.reason == SIGTERM_REASON  # the trainer stops at its next step
        with pytest.raises(SystemExit):  # a second one does not wait
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_unknown_key_names_the_config_file_that_holds_it(tmp_path: Path) -> None:
    """With several --config files (or a hand-edited config.json on --resume) the error named neither file."""
    import re

    from recipes.train import build_parser, resolve

    good = tmp_path / "good.json"
    good.write_text('{"train": {"epochs": 3}, "data": {"mixing": {"segment_seconds": 2.0}}}')
    for text, message in (
        ('{"train": {"epoch": 3}}', "config.train: unknown key(s) ['epoch'] for TrainConfig"),
        ('{"data": {"mixing": {"snr": 1}}}', "config.data.mixing: unknown key(s) ['snr'] for MixingConfig"),
        ('{"trian": {}}', "config: unknown key(s) ['trian'] for RunConfig"),
    ):
        typo = tmp_path / "typo.json"
        typo.write_text(text)
        args = build_parser().parse_args(["--config", str(good), "--config", str(typo), "--out", "x"])
        with pytest.raises(ValueError, match="^" + re.escape(f"{typo}: {message}")):
            resolve(args)
    # the parts need not be valid configurations alone: the recipe may come from a later file
    root_only, dns = tmp_path / "root.json", tmp_path / "dns.json"
    root_only.write_text(json.dumps({"data": {"root": str(tmp_path)}}))
    dns.write_text('{"data": {"recipe": "dns"}}')
    args = build_parser().parse_args(["--config", str(root_only), "--config", str(dns), "--out", "x"])
    assert resolve(args).data.root == str(tmp_path)


def test_resume_names_a_hand_edited_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.train import main as train_main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"train": {"model": "tiny", "epoch": 3}, "data": {}}')
    assert train_main(["--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"tim-train: error: {run / 'config.json'}: config.train: unknown key(s) ['epoch']" in err, err
