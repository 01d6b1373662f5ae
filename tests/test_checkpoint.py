from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from models import CheckpointError, Enhancer, get_config, load_checkpoint, save_checkpoint
from models.config_io import from_dict, to_dict
from models.enhancer import EnhancerConfig
from tests.conftest import ROOT


@pytest.mark.parametrize("name", ["tiny", "tiny-transformer", "tiny-nocomp", "tiny-tim4", "tim"])
def test_config_dict_round_trip(name: str) -> None:
    cfg = get_config(name)
    assert from_dict(EnhancerConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg


def test_unknown_config_key_is_refused() -> None:
    data = to_dict(get_config("tiny"))
    data["pre_encoder"]["colour"] = "blue"
    with pytest.raises(ValueError, match="colour"):
        from_dict(EnhancerConfig, data)


def test_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, "tiny", training={"epochs_done": 3, "val_loss": 0.5})
    ck = load_checkpoint(path)
    assert ck.name == "tiny" and ck.config == model.cfg
    assert ck.training == {"epochs_done": 3, "val_loss": 0.5}
    assert ck.versions["torch"] == torch.__version__
    x = torch.rand(2, 20, 257) * 3
    with torch.no_grad():
        a = model(x, return_competition=True)
        b = ck.model(x, return_competition=True)
    assert torch.equal(a.log_mag, b.log_mag)
    assert a.competition is not None and b.competition is not None
    assert all(torch.equal(p, q) for p, q in zip(a.competition, b.competition, strict=True))
    assert not [p for p in tmp_path.iterdir() if p.name != "m.safetensors"]  # no temp files left
    # the config read from the checkpoint is the model's as it is now: a copy kept beside it stayed at the
    # saved limit after set_max_attenuation (the CLI's --max-attenuation, the server's models listed)
    ck.model.set_max_attenuation(3.0)
    assert ck.config.max_attenuation_db == 3.0 and ck.config is ck.model.cfg


def _forge(
    path: Path,
    config_name: str,
    weights: dict[str, torch.Tensor],
    fmt: str | None = "tim-enhance-checkpoint/1",
) -> None:
    meta = {
        "format": fmt,
        "name": config_name,
        "config": json.dumps(to_dict(get_config(config_name))),
        "training": "{}",
        "versions": "{}",
    }
    safetensors.torch.save_file(weights, str(path), metadata={k: v for k, v in meta.items() if v is not None})


def test_a_checkpoint_of_another_or_no_format_is_refused(tmp_path: Path) -> None:
    """A later format (tim-enhance-checkpoint/2) may keep these keys and mean other things by them, and a
    safetensors file of another tool has no format at all: neither may load as format 1."""
    weights = Enhancer(get_config("tiny")).state_dict()
    path = tmp_path / "m.safetensors"
    _forge(path, "tiny", weights)
    load_checkpoint(path)  # format 1: loads
    for fmt, shown in (("tim-enhance-checkpoint/2", "'tim-enhance-checkpoint/2'"), (None, "None")):
        _forge(path, "tiny", weights, fmt)
        with pytest.raises(CheckpointError, match=f"unknown checkpoint format {shown}, expected"):
            load_checkpoint(path)


def test_mismatched_weights_are_refused_naming_the_key(tmp_path: Path) -> None:
    weights = Enhancer(get_config("tiny")).state_dict()
    path = tmp_path / "bad.safetensors"
    # config says tiny-nocomp, weights carry the competition scorer: unexpected key
    _forge(path, "tiny-nocomp", weights)
    with pytest.raises(
        CheckpointError, match=r"unexpected key\(s\) 'layers\.1\.score\.bias', 'layers\.1\.score\.weight'"
    ):
        load_checkpoint(path)
    # a missing key
    _forge(path, "tiny", {k: v for k, v in weights.items() if k != "head.bias"})
    with pytest.raises(CheckpointError, match=r"missing key\(s\) 'head\.bias'"):
        load_checkpoint(path)
    # a shape mismatch: tiny-tim4 has 4 mechanisms
    _forge(path, "tiny-tim4", weights)
    with pytest.raises(CheckpointError, match=r"shape mismatch for 'layers\.1"):
        load_checkpoint(path)


def test_foreign_and_truncated_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="not a safetensors checkpoint"):
        load_checkpoint(junk)
    good = tmp_path / "good.safetensors"
    save_checkpoint(good, Enhancer(get_config("tiny")), "tiny")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[: os.path.getsize(good) // 2])
    with pytest.raises(CheckpointError):
        load_checkpoint(cut)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "absent.safetensors")
    # a run folder given as the checkpoint: said "no such checkpoint file" of a folder that is there
    with pytest.raises(
        CheckpointError, match=r": a folder, not a checkpoint file \(it holds cut\.safetensors, "
    ):
        load_checkpoint(tmp_path)


def _small_files(limit: int) -> None:
    """In the child: files may grow to ``limit`` bytes, and a write past that fails with EFBIG, as on a full
    disk (instead of SIGXFSZ killing the process)."""
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_failed_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """A save that fails for want of room (here: the file size limit, RLIMIT_FSIZE, half the checkpoint's size,
    which refuses the new file's bytes as a full disk does) leaves the previous checkpoint byte for byte as it was
    and no temporary file beside it, in a real process (no stand-in writer)."""
    path = tmp_path / "m.safetensors"
    torch.manual_seed(0)
    save_checkpoint(path, Enhancer(get_config("tiny")), "tiny")
    before = path.read_bytes()
    # other weights and training state: a save that went through would change the file
    code = (
        "import sys, torch\n"
        "from models import Enhancer, get_config, save_checkpoint\n"
        "torch.manual_seed(1)\n"
        "save_checkpoint(sys.argv[1], Enhancer(get_config('tiny')), 'tiny', training={'epochs_done': 2})\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=functools.partial(_small_files, len(before) // 2),  # the new file cannot be written whole
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "File too large" in proc.stderr, proc.stderr  # EFBIG: the writing failed, nothing before it
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_a_save_that_fails_halfway_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills while the file is written: part of it is written, then the write fails. The previous
    checkpoint stays as it was and nothing else is left (the file is written beside it, then renamed)."""
    path = tmp_path / "m.safetensors"
    model = Enhancer(get_config("tiny"))
    save_checkpoint(path, model, "tiny")
    before = path.read_bytes()
    real_open = open

    class FullDisk:
        def __init__(self, name: str, mode: str) -> None:
            self.f = real_open(name, mode)

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            self.f.write(data[: len(data) // 2])
            raise OSError("disk full")

    monkeypatch.setattr("models.checkpoint.open", FullDisk, raising=False)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, "tiny")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_checkpoint_file_gets_normal_permissions(tmp_path: Path) -> None:
    import stat

    mask = os.umask(0o022)
    try:
        save_checkpoint(tmp_path / "m.safetensors", Enhancer(get_config("tiny")), "tiny")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "m.safetensors").stat().st_mode) == 0o644


def test_nan_weights_are_refused_naming_the_key(tmp_path: Path) -> None:
    """A diverged run (or damaged bytes) loaded without error, and every enhanced sample was NaN."""
    weights = Enhancer(get_config("tiny")).state_dict()
    weights["head.bias"] = weights["head.bias"].clone()
    weights["head.bias"][3] = float("nan")
    path = tmp_path / "nan.safetensors"
    _forge(path, "tiny", weights)
    with pytest.raises(CheckpointError, match=r"NaN or infinite weights in 'head\.bias'"):
        load_checkpoint(path)


def test_integer_weights_are_refused_half_precision_ones_cast(tmp_path: Path) -> None:
    """An integer tensor was cast to float on loading without a word; float16 weights are a saved-in-half model."""
    torch.manual_seed(0)
    model = Enhancer(get_config("tiny"))
    weights = model.state_dict()
    ints = {**weights, "head.bias": weights["head.bias"].round().to(torch.int32)}
    _forge(tmp_path / "int.safetensors", "tiny", ints)
    with pytest.raises(CheckpointError, match=r"non-float weights in 'head\.bias' \(int32\)"):
        load_checkpoint(tmp_path / "int.safetensors")
    half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    _forge(tmp_path / "half.safetensors", "tiny", half)
    loaded = load_checkpoint(tmp_path / "half.safetensors").model.state_dict()
    for k, v in half.items():
        assert loaded[k].dtype == weights[k].dtype and torch.equal(loaded[k], v.to(weights[k].dtype)), k


def _forge_config(path: Path, edit: dict[str, object]) -> None:
    """A tiny checkpoint whose stored config has top-level or one-level-deep fields replaced ("a.b": value)."""
    torch.manual_seed(0)
    save_checkpoint(path, Enhancer(get_config("tiny")), "tiny")
    with safetensors.safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iteration)
    config = json.loads(meta["config"])
    for key, value in edit.items():
        *outer, last = key.split(".")
        target = config
        for part in outer:
            target = target[part]
        target[last] = value
    meta["config"] = json.dumps(config)
    safetensors.torch.save_file(tensors, str(path), metadata=meta)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"pre_encoder.channels": []}, "IndexError"),  # failed inside the pre-encoder's constructor
        ({"tim.inter_heads": 0}, "ZeroDivisionError"),
        ({"max_attenuation_db": -20.0}, "at least 0 dB"),  # would amplify by 20 dB
        ({"max_attenuation_db": float("nan")}, "expected a finite number, got nan"),  # would give NaN samples
        ({"stft.sample_rate": 8000}, "only 16 kHz models"),  # would be fed 16 kHz audio as its own
    ],
)
def test_a_config_that_cannot_be_built_is_a_checkpoint_error(
    tmp_path: Path, edit: dict[str, object], says: str
) -> None:
    path = tmp_path / "edited.safetensors"
    _forge_config(path, edit)
    with pytest.raises(CheckpointError, match=f"config not understood.*{says}"):
        load_checkpoint(path)


def test_the_same_model_saved_in_two_processes_gives_the_same_bytes(tmp_path: Path) -> None:
    """safetensors wrote the metadata in a per-process hash order: equal runs' checkpoints hashed differently."""
    torch.manual_seed(0)
    save_checkpoint(
        tmp_path / "m.safetensors", Enhancer(get_config("tiny")), "tiny", training={"b": 1, "a": 2}
    )
    code = (
        "import sys; from models import load_checkpoint, save_checkpoint; ck = load_checkpoint(sys.argv[1]); "
        "save_checkpoint(sys.argv[2], ck.model, ck.name, ck.training)"
    )
    for i in range(3):
        subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                str(tmp_path / "m.safetensors"),
                str(tmp_path / f"again{i}.safetensors"),
            ],
            cwd=ROOT,
            check=True,
        )
    first = (tmp_path / "m.safetensors").read_bytes()
    assert all((tmp_path / f"again{i}.safetensors").read_bytes() == first for i in range(3))
    assert load_checkpoint(tmp_path / "again0.safetensors").training == {"b": 1, "a": 2}


def test_a_bundled_model_name_is_a_name_not_a_path() -> None:
    """load_pretrained("../pretrained/default") loaded a file by a path outside the bundled folder."""
    from models import CheckpointError
    from models.pretrained import pretrained_path

    assert pretrained_path("default").name == "default.safetensors"
    for name in ("../pretrained/default", "./default", "/etc/default", ""):
        with pytest.raises(CheckpointError, match=f"no bundled model named '{re.escape(name)}'"):
            pretrained_path(name)
