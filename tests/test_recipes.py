"""The training recipes end to end on tiny generated corpora: DNS, VoiceBank-DEMAND and folders + dev pairs.

Every recipe trains the ``tiny`` model through the real command line (a subprocess), then its run folder,
checkpoints and evaluation are checked. Further: a run killed with SIGKILL and resumed must end bit for bit where
an uninterrupted run ends; used or empty run folders and changed configs are refused; two DDP processes (gloo on
the CPU) must end where one process with the same global batch ends.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import soundfile as sf
import torch
from audio_trees import (
    VB_RATE,
    VB_TEST_SPEAKERS,
    VB_TRAIN_SPEAKERS,
    DNSTree,
    FolderTree,
    build_dns,
    build_folders,
    build_voicebank,
)

from enhance.audio_io import load_audio, resample
from models import load_checkpoint
from recipes import run_folder
from recipes.datasets import DataConfig, build, load_val_pairs
from recipes.evaluate import main as evaluate_main
from recipes.train import build_parser, resolve
from recipes.train import main as train_main
from recipes.trainer import RunConfig, Trainer, saved_run_config
from recipes.validation import validate

ROOT = Path(__file__).resolve().parents[1]
RUN_FILES = ("config.json", "env.json", "metrics.csv", "best.safetensors", "last.safetensors", "state.pt")
TIMING_COLUMNS = {"audio_s_per_s"}  # measured, so never equal between two runs
CLI_TIMEOUT = 240

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------------- helpers


def cli_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd`` with the repository importable; fails the test on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def train_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(["-m", "recipes.train", *args], cwd)


def refused_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m recipes.train ARGS``, which must exit 2 (a usage or data error)."""
    proc = subprocess.run(
        [sys.executable, "-m", "recipes.train", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    assert proc.returncode == 2, f"{args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@contextlib.contextmanager
def in_process() -> Iterator[None]:
    """Run a trainer inside pytest without leaking its thread count or RNG state into other tests."""
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)


def metrics(run: Path) -> list[dict[str, str]]:
    return run_folder.read_csv(run / "metrics.csv")


def check_run_folder(run: Path, epochs: int, recipe: str, model: str = "tiny") -> list[dict[str, str]]:
    """Files, metrics, config and checkpoints of a finished run; returns the metrics rows."""
    for name in RUN_FILES:
        assert (run / name).is_file(), f"{name} missing from {run}"
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")], "temp files left behind"
    rows = metrics(run)
    assert [int(r["epoch"]) for r in rows] == list(range(1, epochs + 1))
    for r in rows:
        assert math.isfinite(float(r["train_loss"])) and float(r["train_loss"]) > 0, r
        assert math.isfinite(float(r["val_loss"])) and float(r["val_loss"]) > 0, r
        assert math.isfinite(float(r["val_si_sdr"])), r
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["recipe"] == recipe
    assert config["train"]["model"] == model
    assert config["train"]["epochs"] == epochs
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 1 and "torch" in env["versions"]

    last = load_checkpoint(run / "last.safetensors")
    assert last.name == model
    assert last.training["recipe"] == recipe
    assert last.training["epochs_done"] == epochs
    assert last.training["global_step"] == int(rows[-1]["global_step"])
    assert last.training["val_loss"] == pytest.approx(float(rows[-1]["val_loss"]), rel=1e-9)
    best = load_checkpoint(run / "best.safetensors")
    best_epoch = min(rows, key=lambda r: float(r["val_loss"]))["epoch"]
    assert best.name == model and best.training["epochs_done"] == int(best_epoch)
    state = run_folder.load_state(run / "state.pt")
    assert state["position"]["epoch"] == epochs and state["position"]["step"] == 0
    assert state["config"] == config
    # last.safetensors holds the weights of state.pt (their moving average when the run keeps one)
    shipped = state["model"] if state.get("ema") is None else state["ema"]["average"]
    for k, v in last.model.state_dict().items():
        assert torch.equal(v, shipped[k].to(v.dtype)), f"last.safetensors and state.pt differ at {k}"
    return rows


def evaluate_and_check(checkpoint: Path, pairs: Path, out: Path, n_pairs: int) -> dict[str, Any]:
    """``recipes.evaluate`` (its command-line entry point) without DNSMOS; checks and returns summary.json."""
    code = evaluate_main(
        ["--checkpoint", str(checkpoint), "--pairs", str(pairs), "--out", str(out), "--no-dnsmos"]
    )
    assert code == 0
    with open(out / "summary.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    assert [r["system"] for r in summary] == ["noisy", "enhanced"]
    for r in summary:
        for key in ("pesq", "stoi", "si_sdr"):
            assert math.isfinite(float(r[key])), (r["system"], key, r[key])
        assert 1.0 <= float(r["pesq"]) <= 4.65 and 0.0 <= float(r["stoi"]) <= 1.0, r
        assert int(r["n_files"]) == n_pairs and int(r["n_failed"]) == 0, r
        assert r["dnsmos_ovrl"] == "nan"
    with open(out / "per_file.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 2 * n_pairs
    result = json.loads((out / "summary.json").read_text())
    assert result["n_pairs"] == result["n_evaluated"] == n_pairs and result["skipped"] == []
    return result


# --------------------------------------------------------------------------------------------------- DNS


@dataclass
class DNSRun:
    tree: DNSTree
    run: Path
    stdout: str


@pytest.fixture(scope="module")
def dns_run(tmp_path_factory: pytest.TempPathFactory) -> DNSRun:
    base = tmp_path_factory.mktemp("dns")
    tree = build_dns(base / "DNS-Challenge")
    run = base / "run"
    proc = train_cli(
        [
            *("--config", "dns.json", "--recipe", "dns", "--root", str(tree.root), "--model", "tiny"),
            *("--epochs", "2", "--batch-size", "4", "--segment-seconds", "1.0", "--threads", "1"),
            *("--out", str(run)),
        ],
        base,
    )
    return DNSRun(tree, run, proc.stdout)


def test_dns_recipe_writes_a_complete_run_folder(dns_run: DNSRun) -> None:
    check_run_folder(dns_run.run, epochs=2, recipe="dns")
    config = json.loads((dns_run.run / "config.json").read_text())
    assert config["data"]["root"] == str(dns_run.tree.root)
    assert config["data"]["mixing"]["segment_seconds"] == 1.0
    assert config["data"]["mixing"]["snr_db"] == [0.0, 40.0]  # from dns.json
    # 6 usable clean files and 4 noise files; one of each held out for the validation mixes
    assert "5 speech files" in dns_run.stdout and "3 noise files" in dns_run.stdout
    assert "4 files skipped" in load_checkpoint(dns_run.run / "best.safetensors").training["data"]


def test_dns_recipe_lists_each_bad_file_with_its_reason(dns_run: DNSRun) -> None:
    lines = [ln.strip() for ln in (dns_run.run / "skipped.txt").read_text().splitlines() if ln.strip()]
    listed = dict(ln.split(": ", 1) for ln in lines)
    assert len(lines) == 4
    assert sorted(listed) == sorted(str(p) for p in dns_run.tree.bad.values())
    keywords = {
        "unreadable": ("unreadable", "corrupt"),
        "silent": ("silent",),
        "too short": ("too short",),
        "sample rate": ("sample rate 8000",),
    }
    for what, path in dns_run.tree.bad.items():
        reason = listed[str(path)].lower()
        assert any(k in reason for k in keywords[what]), f"{path.name}: reason {reason!r} does not say {what}"


def test_dns_model_evaluates_on_the_synthetic_test_set(dns_run: DNSRun, tmp_path: Path) -> None:
    result = evaluate_and_check(dns_run.run / "best.safetensors", dns_run.tree.root / "datasets", tmp_path, 3)
    assert result["files_converted"]["resampled"] == 0


# --------------------------------------------------------------------------------------------------- VoiceBank


@dataclass
class VoiceBank:
    root: Path
    cache: Path


def cache_files(cache: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(cache.rglob("*.wav"))}


@pytest.fixture(scope="module")
def voicebank(tmp_path_factory: pytest.TempPathFactory) -> VoiceBank:
    base = tmp_path_factory.mktemp("voicebank")
    return VoiceBank(build_voicebank(base / "VoiceBank-DEMAND"), base / "cache")


def test_voicebank_holds_out_two_speakers_and_caches_16k_once(voicebank: VoiceBank) -> None:
    cfg = DataConfig(recipe="voicebank", root=str(voicebank.root), cache_dir=str(voicebank.cache))
    data = build(cfg, seed=0)
    assert data.skipped == []
    assert sorted(p.name for p in data.val) == [
        f"{s}_{u:03d}.wav" for s in ("p226", "p287") for u in (1, 2, 3)
    ]
    assert len(data.train) == 6
    train_names = [Path(p).name.split(".")[0] for p in data.train.noisy.paths]  # the cache's names
    assert [Path(p).name.split(".")[0] for p in data.train.clean.paths] == train_names
    assert sorted(n.split("_")[0] for n in train_names) == ["p239"] * 3 + ["p270"] * 3

    files = cache_files(voicebank.cache)
    assert len(files) == 2 * len(VB_TRAIN_SPEAKERS) * 3  # clean + noisy of every training pair
    for path in files:
        info = sf.info(path)
        source = path.name.split(".")[0] + ".wav"  # the cache's name adds the source's size and time
        original = sf.info(voicebank.root / f"{path.parent.name}_trainset_28spk_wav" / source)
        assert info.samplerate == 16000 and info.channels == 1
        assert abs(info.frames - original.frames * 16000 / VB_RATE) <= 2
    for p in data.val:
        assert p.noisy.dtype == p.clean.dtype and len(p.noisy) == len(p.clean)
        assert len(p.clean) == sf.info(next(voicebank.cache.glob(f"*/clean/{Path(p.name).stem}.*"))).frames

    again = build(cfg, seed=0)
    assert cache_files(voicebank.cache) == files, "the second build rewrote the 16 kHz cache"
    assert [p.name for p in again.val] == [p.name for p in data.val]
    assert all(
        (a.noisy == b.noisy).all() and (a.clean == b.clean).all()
        for a, b in zip(again.val, data.val, strict=True)
    )


def test_an_unusable_cache_dir_and_a_configs_relative_folder_say_which_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --cache-dir naming a file gave "[Errno 20] Not a directory"; recipes/configs/default.json run from
    outside the checkout gave "../shared/data/speech/train: no such folder", neither naming where it came from."""
    root = build_voicebank(tmp_path / "vb")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"the VoiceBank cache \(--cache-dir, data.cache_dir"):
        build(DataConfig(recipe="voicebank", root=str(root), cache_dir=str(a_file)), seed=0)
    config = tmp_path / "rel.json"
    config.write_text(json.dumps({"data": {"speech": ["corpus/speech"], "noise": ["corpus/noise"]}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code = train_main(
        ["--config", str(config), "--model", "tiny", "--out", str(tmp_path / "run"), "--epochs", "1"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "corpus/speech: no such folder" in err
    assert f"relative folders in a config are taken from where the command runs, here {elsewhere}" in err


def test_voicebank_reports_its_problems_and_resamples_a_replaced_file_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cache served a replaced source's old audio; the held-out speakers' pairs went unchecked (a silent or
    too short one stayed in the set that picks the best checkpoint); a noisy file without a clean twin went
    unreported."""
    root = build_voicebank(tmp_path / "vb")
    cfg = DataConfig(recipe="voicebank", root=str(root), cache_dir=str(tmp_path / "cache"))
    first = build(cfg, seed=0)
    train_clean = root / "clean_trainset_28spk_wav" / "p239_001.wav"
    before = [p for p in first.train.clean.paths if Path(p).name.startswith("p239_001.")]
    wav, rate = sf.read(train_clean)
    sf.write(train_clean, 0.5 * wav, rate)  # replaced: same name, other audio
    os.utime(train_clean, ns=(1, 1))  # and another time, whatever the clock's resolution
    clean_val = root / "clean_trainset_28spk_wav" / "p226_002.wav"
    sf.write(clean_val, np.zeros(rate), rate)  # a silent clean side among the validation speakers
    short_val = root / "noisy_trainset_28spk_wav" / "p287_003.wav"
    sf.write(short_val, np.zeros(rate // 50) + 0.01, rate)  # 20 ms
    sf.write(root / "noisy_trainset_28spk_wav" / "p230_009.wav", wav, rate)  # no clean twin
    silent_train = root / "clean_trainset_28spk_wav" / "p239_002.wav"
    sf.write(silent_train, np.zeros(rate), rate)
    caplog.clear()
    with caplog.at_level("WARNING"):
        data = build(cfg, seed=0)
    reasons = {Path(s.path).name: s.reason for s in data.skipped}
    # a training file is named as in the corpus, not as its 16 kHz copy in the cache: in skipped.txt and the log
    assert [s.reason[:6] for s in data.skipped if s.path == str(silent_train)] == ["silent"], data.skipped
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping ")]
    assert f"skipping {silent_train}: silent" in " ".join(logged) and str(tmp_path / "cache") not in str(
        logged
    )
    assert reasons["p226_002.wav"] == "the clean side is silent", reasons
    assert reasons["p287_003.wav"].startswith("too short"), reasons
    assert reasons["p230_009.wav"] == "no clean twin", reasons
    assert sorted(p.name for p in data.val) == [
        "p226_001.wav",
        "p226_003.wav",
        "p287_001.wav",
        "p287_002.wav",
    ]
    (after,) = [p for p in data.train.clean.paths if Path(p).name.startswith("p239_001.")]
    assert [after] != before and not Path(before[0]).exists()  # resampled again, the old copy gone
    cached = sf.read(after, dtype="float32")[0]
    fresh = resample(load_audio(train_clean)[0], rate, 16000).mean(axis=0)
    assert np.array_equal(cached, fresh.astype(np.float32))


def test_validation_pairs_that_are_all_bad_are_listed_in_the_error(tmp_path: Path) -> None:
    """Training refused with only "no usable validation pairs"; evaluate listed the reasons."""
    from tests.conftest import speech_like

    x = speech_like(1.0, 16000, seed=4)
    nan = x.copy()
    nan[10] = np.nan
    for side in ("noisy", "clean"):
        (tmp_path / "dev" / side).mkdir(parents=True)
    for name, noisy in (("0001.wav", nan), ("0002.wav", x[:800])):
        sf.write(tmp_path / "dev" / "noisy" / name, noisy, 16000, subtype="FLOAT")
        sf.write(tmp_path / "dev" / "clean" / name, x, 16000)
    with pytest.raises(ValueError, match="no usable validation pairs") as err:
        load_val_pairs(str(tmp_path / "dev"))
    lines = str(err.value).splitlines()
    assert any("0001.wav" in ln and "NaN" in ln for ln in lines), lines
    assert any("0002.wav" in ln and "too short" in ln for ln in lines), lines


def test_voicebank_recipe_trains_and_evaluates(voicebank: VoiceBank, tmp_path: Path) -> None:
    extra = tmp_path / "cache.json"
    extra.write_text(json.dumps({"data": {"cache_dir": str(voicebank.cache)}}))
    run = tmp_path / "run"
    cached = cache_files(voicebank.cache)  # filled by the build test when it ran first
    proc = train_cli(
        [
            *("--config", "voicebank.json", "--config", str(extra), "--root", str(voicebank.root)),
            *("--model", "tiny", "--epochs", "2", "--batch-size", "4", "--segment-seconds", "1.0"),
            *("--threads", "1", "--out", str(run)),
        ],
        tmp_path,
    )
    assert "6 training pairs, 6 validation pairs (speakers p226, p287)" in proc.stdout
    check_run_folder(run, epochs=2, recipe="voicebank")
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["cache_dir"] == str(voicebank.cache)
    assert config["data"]["voicebank_val_speakers"] == ["p226", "p287"]
    assert not (run / "skipped.txt").exists()
    after = cache_files(voicebank.cache)
    assert len(after) == 2 * len(VB_TRAIN_SPEAKERS) * 3
    assert {p: after[p] for p in cached} == cached, "training rewrote the 16 kHz cache"

    n_test = len(VB_TEST_SPEAKERS)
    result = evaluate_and_check(run / "best.safetensors", voicebank.root, tmp_path / "eval", n_test)
    assert result["files_converted"]["resampled"] == n_test  # the 48 kHz test files


# --------------------------------------------------------------------------------------------------- folders


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> FolderTree:
    # 10 speech files of 2-4.25 s: 32 one-second examples, 8 steps of 4 per epoch
    return build_folders(tmp_path_factory.mktemp("folders"), n_speech=10)


def folders_args(tree: FolderTree, *extra: str) -> list[str]:
    return [
        *("--recipe", "folders", "--speech", str(tree.speech), "--noise", str(tree.noise)),
        *("--val-pairs", str(tree.dev), "--model", "tiny", "--batch-size", "4", "--segment-seconds", "1.0"),
        *("--threads", "1", *extra),
    ]


def test_folders_recipe_validates_on_the_dev_pairs(folders: FolderTree, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = train_cli(
        [*folders_args(folders, "--epochs", "2", "--max-steps-per-epoch", "3"), "--out", str(run)], tmp_path
    )
    assert f"{folders.n_dev} validation pairs, 0 files skipped" in proc.stdout
    rows = check_run_folder(run, epochs=2, recipe="folders")
    assert [int(r["global_step"]) for r in rows] == [3, 6]
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["val_pairs"] == str(folders.dev)
    assert config["data"]["speech"] == [str(folders.speech)]
    assert config["data"]["noise"] == [str(folders.noise)]
    assert config["data"]["dc_blocker"] is True  # a new run trains and validates through the DC blocker

    # the logged validation loss is the loss on exactly these dev pairs, the input through the DC blocker
    pairs, bad = load_val_pairs(str(folders.dev))
    assert bad == [] and sorted(p.name for p in pairs) == [f"{i:04d}" for i in range(1, folders.n_dev + 1)]
    with in_process():
        torch.set_num_threads(1)
        model = load_checkpoint(run / "last.safetensors").model
        val = validate(model, pairs, torch.device("cpu"), dc_blocker=True)
        unfiltered = validate(model, pairs, torch.device("cpu"))
    assert val["val_loss"] == pytest.approx(float(rows[-1]["val_loss"]), rel=1e-5)
    assert unfiltered["val_loss"] != pytest.approx(val["val_loss"], rel=1e-5)
    assert val["val_si_sdr"] == pytest.approx(float(rows[-1]["val_si_sdr"]), abs=1e-3)


def test_training_batches_go_through_the_dc_blocker_when_it_is_on(
    folders: FolderTree, tmp_path: Path
) -> None:
    """The same first step with DataConfig.dc_blocker on and off: the examples differ (a 5-Hz high-pass from each
    segment's first sample), so does the loss; off is how runs before session 26 trained."""
    losses = {}
    for on in (True, False):
        run = tmp_path / f"dc-{on}"
        args = [*folders_args(folders, "--epochs", "1", "--max-steps-per-epoch", "1"), "--out", str(run)]
        cfg = resolve(build_parser().parse_args(args))
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dc_blocker=on))
        with in_process():
            Trainer(cfg, run).fit()
        losses[on] = float(metrics(run)[0]["train_loss"])
    assert abs(losses[True] - losses[False]) > 1e-4 * losses[False], losses


def test_select_by_pmsqe_picks_the_best_epoch_and_drives_the_schedule(
    folders: FolderTree, tmp_path: Path
) -> None:
    """``--select-by pmsqe``: best.safetensors is the epoch of lowest val_pmsqe, the plateau schedule follows that
    column (patience 0: the lr halves after every epoch that did not lower it), and the state records its
    minimum, not val_loss's."""
    run = tmp_path / "run"
    args = folders_args(folders, "--epochs", "4", "--max-steps-per-epoch", "2", "--lr", "3e-3")
    args += ["--pmsqe-weight", "0.1", "--select-by", "pmsqe", "--out", str(run)]
    cfg = resolve(build_parser().parse_args(args))
    assert cfg.train.select_by == "pmsqe"
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr_patience=0))
    with in_process():
        Trainer(cfg, run).fit()
    rows = metrics(run)
    scores = [float(r["val_pmsqe"]) for r in rows]
    best_epoch = int(np.argmin(scores)) + 1
    assert load_checkpoint(run / "best.safetensors").training["epochs_done"] == best_epoch
    state = run_folder.load_state(run / "state.pt")["position"]
    assert state["best_val"] == pytest.approx(min(scores), rel=1e-9)
    assert state["best_val"] != pytest.approx(min(float(r["val_loss"]) for r in rows), rel=1e-3)
    lr, best = 3e-3, math.inf
    for r, score in zip(rows, scores, strict=True):
        if score < best:
            best = score
        else:
            lr *= 0.5
        assert float(r["lr"]) == pytest.approx(lr, rel=1e-9)
    with pytest.raises(ValueError, match="select_by"):
        dataclasses.replace(cfg.train, select_by="pesq")


# --------------------------------------------------------------------------------------------------- resume


@dataclass
class ResumeRuns:
    cfg: RunConfig
    args: list[str]  # command line of both runs, without --out
    a: Path  # uninterrupted
    b: Path  # killed, then resumed
    killed_at: dict[str, Any]  # position in B's state.pt right after the kill


def train_and_signal(args: list[str], cwd: Path, log: Path, ready: Callable[[], bool], sig: int) -> int:
    """``python -m recipes.train ARGS`` with its output in ``log``; ``sig`` is sent once ``ready()`` (polled) is
    true. Its exit status (killed after CLI_TIMEOUT)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recipes.train", *args],
            cwd=cwd,
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),  # not inherited as ignored
        )
        deadline = time.monotonic() + CLI_TIMEOUT
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if ready():
                    proc.send_signal(sig)
                    break
                time.sleep(0.002)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode


@pytest.fixture(scope="module")
def resume_runs(folders: FolderTree, tmp_path_factory: pytest.TempPathFactory) -> ResumeRuns:
    base = tmp_path_factory.mktemp("resume")
    fast = base / "save-every-step.json"
    # with a weight average, so the exact resume covers its state too (the time-budget test resumes without one)
    fast.write_text(json.dumps({"train": {"save_every_steps": 1, "log_every_steps": 1000, "ema_decay": 0.9}}))
    args = folders_args(folders, "--config", str(fast), "--epochs", "2")
    a, b = base / "A", base / "B"

    cfg = resolve(build_parser().parse_args([*args, "--out", str(a)]))
    assert cfg.train.save_every_steps == 1 and cfg.train.threads == 1 and cfg.train.epochs == 2
    with in_process():
        Trainer(cfg, a).fit()

    log = base / "B.log"
    state, seen_mtime = b / "state.pt", 0

    def mid_epoch() -> bool:
        nonlocal seen_mtime
        if not state.is_file() or state.stat().st_mtime_ns == seen_mtime:
            return False
        seen_mtime = state.stat().st_mtime_ns
        pos = run_folder.load_state(state)["position"]
        return bool(pos["epoch"] == 0 and pos["step"] >= 2)

    code = train_and_signal([*args, "--out", str(b)], base, log, mid_epoch, signal.SIGKILL)
    assert code == -signal.SIGKILL, f"run B was not killed mid-run:\n{log.read_text()}"
    killed_at = run_folder.load_state(b / "state.pt")["position"]
    train_cli(["--out", str(b), "--resume"], base)
    return ResumeRuns(cfg, args, a, b, killed_at)


def test_killed_run_resumes_exactly(resume_runs: ResumeRuns) -> None:
    pos = resume_runs.killed_at
    assert pos["epoch"] == 0 and 2 <= pos["step"] < 8, f"B was killed at {pos}, not in the middle of epoch 1"
    rows_a = check_run_folder(resume_runs.a, epochs=2, recipe="folders")
    rows_b = check_run_folder(resume_runs.b, epochs=2, recipe="folders")
    assert (resume_runs.b / "config.json").read_text() == (resume_runs.a / "config.json").read_text()

    drop = [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows_a]
    assert [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows_b] == drop
    a = safetensors.torch.load_file(resume_runs.a / "last.safetensors")
    b = safetensors.torch.load_file(resume_runs.b / "last.safetensors")
    assert a.keys() == b.keys()
    differ = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not differ, (
        f"resumed weights differ from the uninterrupted run's (max abs diff per tensor): {differ}"
    )
    state_a = run_folder.load_state(resume_runs.a / "state.pt")
    state_b = run_folder.load_state(resume_runs.b / "state.pt")
    assert torch.equal(state_a["rng"]["torch"], state_b["rng"]["torch"])
    assert state_a["scheduler"] == state_b["scheduler"]
    assert state_a["position"] == state_b["position"]
    # Adam's moments and step counts continued exactly, not restarted at the resume
    opt_a, opt_b = state_a["optimizer"], state_b["optimizer"]
    assert opt_a["param_groups"] == opt_b["param_groups"] and opt_a["state"].keys() == opt_b["state"].keys()
    for i, moments in opt_a["state"].items():
        assert moments.keys() == opt_b["state"][i].keys()
        assert all(torch.equal(v, opt_b["state"][i][name]) for name, v in moments.items()), i
    # the raw weights and the average both continued exactly; the checkpoints hold the average, not the raw weights
    assert all(torch.equal(state_a["model"][k], state_b["model"][k]) for k in state_a["model"])
    ema_a, ema_b = state_a["ema"], state_b["ema"]
    assert ema_a["updates"] == ema_b["updates"] == state_a["position"]["global_step"] > 0
    assert all(torch.equal(ema_a["average"][k], ema_b["average"][k]) for k in ema_a["average"])
    assert all(torch.equal(a[k], ema_a["average"][k].to(a[k].dtype)) for k in a)
    assert any(not torch.equal(a[k], state_a["model"][k]) for k in a)
    meta = load_checkpoint(resume_runs.a / "last.safetensors").training
    n = ema_a["updates"]  # a run from random weights: the decay warms up
    assert (
        meta["weights"]
        == f"moving average, decay 0.9, {n} updates, warm-up (decay now {min(0.9, (1 + n) / (10 + n)):.5f})"
    )


def test_sigterm_stops_at_the_next_step_with_the_state_saved_there(
    resume_runs: ResumeRuns, tmp_path: Path
) -> None:
    """SIGTERM (how batch schedulers stop jobs) ended the run at once, without a word, losing the steps since the
    last periodic save (500 in default-gpu.json). Now it stops at the next step with the state saved there, says
    how to go on and exits 143; the resumed run ends where the uninterrupted one does, bit for bit."""
    rare = tmp_path / "save-rarely.json"
    rare.write_text(json.dumps({"train": {"save_every_steps": 1000, "log_every_steps": 1, "ema_decay": 0.9}}))
    run = tmp_path / "C"
    args = [a for a in resume_runs.args]
    args[args.index("--config") + 1] = str(rare)
    log = tmp_path / "C.log"
    code = train_and_signal(
        [*args, "--out", str(run)],
        tmp_path,
        log,
        lambda: "[train] epoch 1 step 2/" in log.read_text(),
        signal.SIGTERM,
    )
    text = log.read_text()
    assert code == 143, text
    assert f"tim-train: terminated; `--out {run} --resume` continues from where it stopped" in text
    pos = run_folder.load_state(run / "state.pt")["position"]
    assert pos["epoch"] == 0 and 2 <= pos["step"] < 8, pos  # saved where it stopped (no periodic save before)
    train_cli(["--out", str(run), "--resume"], tmp_path)
    a = safetensors.torch.load_file(resume_runs.a / "last.safetensors")
    c = safetensors.torch.load_file(run / "last.safetensors")
    assert a.keys() == c.keys() and all(torch.equal(a[k], c[k]) for k in a)


def snapshot(run: Path) -> dict[str, bytes]:
    """The run's files; not the lock a refused run may have taken on the folder (empty, or naming its pid)."""
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != ".lock"}


def test_new_run_in_a_used_folder_is_refused(
    resume_runs: ResumeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(resume_runs.a)
    with in_process():
        code = train_main([*resume_runs.args, "--out", str(resume_runs.a)])
    err = capsys.readouterr().err
    assert code == 2
    assert "already holds a run" in err and "--resume" in err and str(resume_runs.a) in err
    assert "Traceback" not in err
    assert snapshot(resume_runs.a) == before


@pytest.mark.parametrize("folder", ["missing", "empty", "config-only"])
def test_resume_without_a_run_is_refused(
    folder: str, resume_runs: ResumeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    if folder != "missing":
        run.mkdir()
    if folder == "config-only":  # killed before its first state.pt was written
        (run / "config.json").write_text((resume_runs.a / "config.json").read_text())
    with in_process():
        code = train_main(["--out", str(run), "--resume"])
    err = capsys.readouterr().err
    assert code == 2
    assert "nothing to resume" in err and "Traceback" not in err
    assert not (run / "state.pt").exists() and not (run / "metrics.csv").exists()


def test_resume_refuses_flags_it_would_ignore(
    resume_runs: ResumeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(resume_runs.a)
    with in_process():
        code = train_main(["--out", str(resume_runs.a), "--resume", "--lr", "0.1", "--model", "tiny-tim4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--lr" in err and "--model" in err and "would change it" in err, err
    assert "train.lr: 0.0002 then, 0.1 now" in err, err  # the flags given, not every default
    assert snapshot(resume_runs.a) == before


def test_resume_takes_the_runs_own_command_again(
    resume_runs: ResumeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command that started a run, with --resume added, was refused ("--config, --model, --speech ... cannot
    change") though it changed nothing; a folder whose config.json was lost said "nothing to resume" though its
    state.pt holds the configuration."""
    run = tmp_path / "copy"
    shutil.copytree(resume_runs.a, run)
    with in_process():  # finished: nothing to train, but accepted
        assert train_main([*resume_runs.args, "--out", str(run), "--resume"]) == 0
    (run / "config.json").unlink()
    with in_process():
        assert train_main(["--out", str(run), "--resume"]) == 0
    assert "nothing to train" in capsys.readouterr().out


def test_resume_follows_a_moved_corpus(
    resume_runs: ResumeRuns, folders: FolderTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corpus moved to another folder or machine is the same data: --resume takes its folders again and goes on
    exactly as on the old ones, and config.json then names the new ones. It was refused ("--speech would change
    it"), and without the flags the old folders were missing. Other data in the new place is still refused."""
    moved = tmp_path / "moved"
    for part in (folders.speech, folders.noise, folders.dev):
        shutil.copytree(part, moved / part.name)
    here, there = tmp_path / "here", tmp_path / "there"
    for run in (here, there):
        shutil.copytree(resume_runs.a, run)
    new_places = [
        "--speech",
        str(moved / "speech"),
        "--noise",
        str(moved / "noise"),
        "--val-pairs",
        str(moved / "devset"),
    ]
    with in_process():
        assert train_main(["--out", str(here), "--resume", "--epochs", "3"]) == 0
    with in_process():
        assert train_main(["--out", str(there), "--resume", "--epochs", "3", *new_places]) == 0
    a, b = (safetensors.torch.load_file(run / "last.safetensors") for run in (here, there))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [
        [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in check_run_folder(run, 3, "folders")]
        for run in (here, there)
    ]
    assert rows[0] == rows[1]
    data = json.loads((there / "config.json").read_text())["data"]
    assert data["speech"] == [str(moved / "speech")] and data["val_pairs"] == str(moved / "devset")
    # a folder that is not there says how to give the moved one
    capsys.readouterr()
    with in_process():
        code = train_main(
            ["--out", str(there), "--resume", "--epochs", "4", "--speech", str(tmp_path / "gone")]
        )
    err = capsys.readouterr().err
    assert code == 2 and "no such folder" in err and "give its folders again with --speech" in err, err
    # other files in the new place are other data
    next(iter(sorted((moved / "speech").rglob("*.wav")))).unlink()
    with in_process():
        code = train_main(["--out", str(there), "--resume", "--epochs", "4"])
    assert code == 2 and "the data changed since the run started" in capsys.readouterr().err


def test_a_second_run_in_a_folder_in_use_is_refused(
    resume_runs: ResumeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs started in one folder both ran, interleaving their rows in one metrics.csv and leaving one's
    settings beside the other's state. The folder's lock is an flock: a killed holder frees it at once."""
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from recipes import run_folder; "
            "run_folder.hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)",
            str(run),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with in_process():
            code = train_main([*resume_runs.args, "--out", str(run)])
        err = capsys.readouterr().err
        assert code == 2 and f"is in use by a training run (pid {holder.pid} on " in err, err
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing of this run written
    finally:
        holder.kill()
        holder.wait()
    run_folder.hold(run)  # free again once the holder is gone, killed or not
    run_folder.release(run)


def test_a_fresh_run_over_an_earlier_runs_files_is_refused(
    resume_runs: ResumeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that died before its first state.pt left metrics rows: a new run there appended its own after them,
    read as one curve by compare and export."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.csv", "best.safetensors"):
        (run / name).write_bytes((resume_runs.a / name).read_bytes())
    before = snapshot(run)
    with in_process():
        code = train_main([*resume_runs.args, "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and "holds metrics.csv, best.safetensors of an earlier run but no state.pt" in err
    assert snapshot(run) == before


def test_resume_refuses_fewer_epochs_than_done_and_changed_data(
    resume_runs: ResumeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(resume_runs.a)
    with in_process():
        code = train_main(["--out", str(resume_runs.a), "--resume", "--epochs", "1"])
    assert code == 2 and "--epochs 1: the run has already done 2 epochs" in capsys.readouterr().err
    assert snapshot(resume_runs.a) == before  # config.json not rewritten to 1 planned epoch
    # the folders now hold other files than when the run started (here: its state says so)
    run = tmp_path / "A"
    run.mkdir()
    for name, data in before.items():
        (run / name).write_bytes(data)
    state = run_folder.load_state(run / "state.pt")
    assert state["data"].startswith("10 speech files")
    state["data"] = "5 speech files (0.2 min), 3 noise files (0.2 min), 2 validation pairs, 0 files skipped"
    run_folder.save_state(run / "state.pt", state)
    with in_process():
        code = train_main(["--out", str(run), "--resume", "--epochs", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--resume: the data changed since the run started" in err and "--init-from" in err
    # refused: config.json still plans 2 epochs (it said 3 after this, and a plain --resume then trained a 3rd)
    for name in ("config.json", "env.json"):
        assert (run / name).read_bytes() == before[name], name
    # the same counts and minutes, other contents (a file replaced by one of the same length): refused too
    state = run_folder.load_state(run / "state.pt")
    state["data"] = run_folder.load_state(resume_runs.a / "state.pt")["data"]
    assert len(state["data_fingerprint"]) == 16
    state["data_fingerprint"] = "0" * 16
    run_folder.save_state(run / "state.pt", state)
    with in_process():
        code = train_main(["--out", str(run), "--resume", "--epochs", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "as then, but files were renamed, replaced or edited" in err, err


def test_the_data_fingerprint_sees_replaced_and_renamed_files_not_moved_folders(tmp_path: Path) -> None:
    from recipes.audio_pool import content_fingerprint
    from tests.conftest import speech_like

    x = speech_like(1.0, 16000, seed=1)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        sf.write(tmp_path / folder / "u.wav", x, 16000)
    same = content_fingerprint([tmp_path / "a" / "u.wav"])
    assert content_fingerprint([tmp_path / "b" / "u.wav"]) == same  # the corpus moved: the same data
    sf.write(tmp_path / "b" / "u.wav", speech_like(1.0, 16000, seed=2), 16000)  # same length and size
    assert content_fingerprint([tmp_path / "b" / "u.wav"]) != same
    (tmp_path / "a" / "u.wav").rename(tmp_path / "a" / "v.wav")
    assert content_fingerprint([tmp_path / "a" / "v.wav"]) != same
    val = [x[:8000], x[8000:]]
    assert np.abs(x[8000:]).max() > 0
    assert content_fingerprint([], val) != content_fingerprint([], [x[:8000], x[8000:] * 0.5])


def test_resuming_keeps_the_earlier_sessions_environment(
    resume_runs: ResumeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished run resumed trains nothing, says so and leaves env.json alone; extended, its env.json keeps
    the first session's environment under "earlier" (every resume overwrote it: a GPU run resumed once on a
    CPU was then reported as a CPU run)."""
    run = tmp_path / "A"
    shutil.copytree(resume_runs.a, run)
    first_env = json.loads((run / "env.json").read_text())
    first_env["device"] = "cuda:0"  # as if the first session had run on a GPU
    (run / "env.json").write_text(json.dumps(first_env))
    with in_process():
        assert train_main(["--out", str(run), "--resume"]) == 0
    assert "has done all of its 2 epochs: nothing to train" in capsys.readouterr().out
    assert json.loads((run / "env.json").read_text()) == first_env
    with in_process():
        assert train_main(["--out", str(run), "--resume", "--epochs", "3"]) == 0
    env = json.loads((run / "env.json").read_text())
    assert env["device"] == "cpu" and env["earlier"] == [first_env]
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 3
    assert [r["epoch"] for r in metrics(run)] == ["1", "2", "3"]


def test_metrics_of_a_run_started_by_an_older_version_keep_their_columns(tmp_path: Path) -> None:
    """An older run's metrics.csv lacks columns added since; a resumed run's rows slid into the wrong ones."""
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,val_loss,lr\n1,0.5,0.001\n")
    run_folder.append_csv(path, {"epoch": 2, "val_loss": 0.4, "val_pmsqe": 3.8, "lr": 0.0005})
    rows = run_folder.read_csv(path)
    assert list(rows[0]) == ["epoch", "val_loss", "lr", "val_pmsqe"]
    assert rows[0] == {"epoch": "1", "val_loss": "0.5", "lr": "0.001", "val_pmsqe": ""}
    assert rows[1] == {"epoch": "2", "val_loss": "0.4", "lr": "0.0005", "val_pmsqe": "3.8"}
    run_folder.append_csv(path, {"epoch": 3, "val_loss": 0.3, "val_pmsqe": 3.9, "lr": 0.0005})
    assert run_folder.read_csv(path)[2]["lr"] == "0.0005"


def test_an_out_folder_below_a_file_is_refused_before_the_work(
    folders: FolderTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    with in_process():
        code = train_main([*folders_args(folders), "--out", str(tmp_path / "a-file" / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "a-file exists and is not a folder" in err and "Traceback" not in err
    code = evaluate_main(
        [
            "--model-config",
            "tiny",
            "--pairs",
            str(folders.dev),
            "--out",
            str(tmp_path / "a-file" / "ev"),
            "--no-dnsmos",
        ]
    )
    assert code == 2 and "a-file exists and is not a folder" in capsys.readouterr().err


def test_bad_validation_pairs_are_skipped_and_listed(tmp_path: Path) -> None:
    """Validation pairs pick best.safetensors: like training files, too short and silent ones are left out, and a
    file without its partner is listed, not dropped silently."""
    rng = np.random.default_rng(0)
    dev = tmp_path / "dev"
    for name, clean in (
        ("0001", rng.standard_normal(16000) * 0.1),
        ("0002", np.zeros(16000)),  # silent clean side
        ("0003", rng.standard_normal(800) * 0.1),  # 50 ms
    ):
        for side in ("clean", "noisy"):
            (dev / side).mkdir(parents=True, exist_ok=True)
            sf.write(
                dev / side / f"{name}.wav",
                (clean + rng.standard_normal(len(clean)) * 0.01).astype(np.float32)
                if side == "noisy"
                else clean.astype(np.float32),
                16000,
            )
    sf.write(dev / "noisy" / "0004.wav", (rng.standard_normal(16000) * 0.1).astype(np.float32), 16000)
    pairs, skipped = load_val_pairs(str(dev))
    assert [p.name for p in pairs] == ["0001"]
    reasons = {Path(s.path).name: s.reason for s in skipped}
    assert reasons["0002.wav"] == "the clean side is silent"
    assert reasons["0003.wav"].startswith("too short (0.05 s")
    assert any("0004" in s.reason for s in skipped)  # the orphan, from the layout's warnings


def test_resume_with_a_changed_config_is_refused(resume_runs: ResumeRuns) -> None:
    before = snapshot(resume_runs.a)
    cfg = resume_runs.cfg
    changed = [
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=cfg.train.lr * 2)),
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, model="tiny-transformer")),
        dataclasses.replace(
            cfg,
            data=dataclasses.replace(
                cfg.data, mixing=dataclasses.replace(cfg.data.mixing, segment_seconds=2.0)
            ),
        ),
    ]
    says = ["train.lr: 0.0002 then, 0.0004 now", "train.model: 'tiny' then", "data.mixing.segment_seconds"]
    for new, what in zip(changed, says, strict=True):
        with in_process(), pytest.raises(ValueError, match="different configuration") as err:
            Trainer(new, resume_runs.a, resume=True)
        assert what in str(err.value)  # which setting changed, and how
    assert snapshot(resume_runs.a) == before
    with in_process():  # the unchanged config is accepted
        trainer = Trainer(cfg, resume_runs.a, resume=True)
    assert trainer.pos.epoch == 2 and trainer.pos.global_step == 16
    # ... and so is one that only moves the run to another machine (threads, workers)
    moved = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, threads=2, device="cpu"))
    stale = resume_runs.a / ".state.pt.killed.tmp"  # what a kill in the middle of a save leaves
    stale.write_bytes(b"half a state")
    with in_process():
        trainer = Trainer(moved, resume_runs.a, resume=True)
    assert not stale.exists()
    assert trainer.pos.global_step == 16 and trainer.cfg.train.threads == 2
    # ... or one that extends the finished run to more epochs (nothing depends on the total)
    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=cfg.train.epochs + 1))
    with in_process():
        trainer = Trainer(longer, resume_runs.a, resume=True)
    assert trainer.pos.epoch == 2 and trainer.cfg.train.epochs == 3


def test_a_run_saved_before_the_dc_blocker_resumes_without_it(
    resume_runs: ResumeRuns, tmp_path: Path
) -> None:
    """Runs saved before DataConfig.dc_blocker (session 26) trained on unfiltered audio: --resume continues them
    so, and a config that asks for the blocker is refused as a change, not applied from the middle of the run."""
    old = tmp_path / "old"
    shutil.copytree(resume_runs.a, old)
    config = json.loads((old / "config.json").read_text())
    del config["data"]["dc_blocker"]
    (old / "config.json").write_text(json.dumps(config))
    state = run_folder.load_state(old / "state.pt")
    del state["config"]["data"]["dc_blocker"]
    run_folder.save_state(old / "state.pt", state)

    legacy = saved_run_config(config)
    assert legacy.data == dataclasses.replace(resume_runs.cfg.data, dc_blocker=False)
    with in_process(), pytest.raises(ValueError, match=r"data\.dc_blocker: False then, True now"):
        Trainer(resume_runs.cfg, old, resume=True)
    # the command line reads the saved config as the run was trained, and goes on with one more epoch
    train_cli(["--out", str(old), "--resume", "--epochs", "3"], tmp_path)
    assert [int(r["epoch"]) for r in metrics(old)] == [1, 2, 3]
    assert json.loads((old / "config.json").read_text())["data"]["dc_blocker"] is False


# --------------------------------------------------------------------------------------------------- DDP

# The tiny model without dropout: with dropout each process draws its own masks, so two processes and one
# process cannot end at the same weights whatever the gradient averaging does.
NO_DROPOUT_TRAIN = """
import dataclasses, sys
from models.registry import REGISTRY, tiny_config

def tiny_no_dropout():
    c = tiny_config(2)
    return dataclasses.replace(
        c,
        standard=dataclasses.replace(c.standard, dropout=0.0),
        tim=dataclasses.replace(c.tim, dropout=0.0),
    )

REGISTRY["tiny-nodropout"] = tiny_no_dropout
from recipes.train import main
sys.exit(main())
"""


@dataclass
class DDPRuns:
    ddp: Path
    single: Path
    stdout: str


@pytest.fixture(scope="module")
def ddp_runs(folders: FolderTree, tmp_path_factory: pytest.TempPathFactory) -> DDPRuns:
    base = tmp_path_factory.mktemp("ddp")
    script = base / "train_no_dropout.py"
    script.write_text(NO_DROPOUT_TRAIN)
    args = folders_args(folders, "--epochs", "1", "--max-steps-per-epoch", "3", "--model", "tiny-nodropout")
    ddp, single = base / "ddp", base / "single"
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = run_cli([*launch, str(script), *args, "--out", str(ddp)], base)
    run_cli([str(script), *args, "--out", str(single)], base)
    return DDPRuns(ddp, single, proc.stdout)


def test_ddp_two_processes_match_one_process(ddp_runs: DDPRuns) -> None:
    assert "world 2" in ddp_runs.stdout
    assert json.loads((ddp_runs.ddp / "env.json").read_text())["world_size"] == 2
    for name in RUN_FILES:
        assert (ddp_runs.ddp / name).is_file(), name
    a = safetensors.torch.load_file(ddp_runs.ddp / "last.safetensors")
    b = safetensors.torch.load_file(ddp_runs.single / "last.safetensors")
    assert a and a.keys() == b.keys()
    far = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.allclose(a[k], b[k], atol=1e-5)}
    assert not far, f"2-process weights differ from 1-process weights (max abs diff): {far}"
    rows_d, rows_s = metrics(ddp_runs.ddp), metrics(ddp_runs.single)
    assert [r["global_step"] for r in rows_d] == [r["global_step"] for r in rows_s] == ["3"]
    assert float(rows_d[0]["val_loss"]) == pytest.approx(float(rows_s[0]["val_loss"]), rel=1e-4)


def test_ddp_train_loss_is_the_global_batch_loss(ddp_runs: DDPRuns) -> None:
    """metrics.csv's train_loss under DDP must be the mean over the global batch, as with one process."""
    rows_d, rows_s = metrics(ddp_runs.ddp), metrics(ddp_runs.single)
    assert float(rows_d[0]["train_loss"]) == pytest.approx(float(rows_s[0]["train_loss"]), rel=1e-4)


def test_ddp_resume_goes_on_exactly(folders: FolderTree, tmp_path: Path) -> None:
    """Under DDP, with dropout: a run stopped after epoch 1 and resumed ends at the weights of the run that went on.
    Only rank 0's generators were saved, so the other rank drew new dropout masks after a resume (a helper saw
    weights 6.7e-4 apart); state.pt now keeps every rank's."""
    args = folders_args(folders, "--max-steps-per-epoch", "3")  # the tiny model: dropout 0.1
    # --standalone: the rendezvous binds a free port itself (picking one here and passing it raced other tests)
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_cli([*launch, "-m", "recipes.train", *args, "--epochs", "2", "--out", str(whole)], tmp_path)
    run_cli([*launch, "-m", "recipes.train", *args, "--epochs", "1", "--out", str(resumed)], tmp_path)
    assert len(run_folder.load_state(resumed / "state.pt")["rng"]["ranks"]) == 2
    run_cli([*launch, "-m", "recipes.train", "--out", str(resumed), "--resume", "--epochs", "2"], tmp_path)
    a, b = (safetensors.torch.load_file(run / "last.safetensors") for run in (whole, resumed))
    differ = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert a and not differ, f"the resumed DDP run's weights differ (max abs diff per tensor): {differ}"


def test_init_from_starts_with_the_checkpoints_weights(tmp_path: Path) -> None:
    import numpy as np
    import torch

    from models import Enhancer, get_config, load_checkpoint, save_checkpoint
    from recipes.datasets import DataConfig
    from recipes.mixing import MixingConfig
    from recipes.trainer import RunConfig, TrainConfig, Trainer
    from tests.conftest import speech_like

    torch.manual_seed(123)
    start = tmp_path / "start.safetensors"
    save_checkpoint(start, Enhancer(get_config("tiny")), "tiny")
    speech, noise = tmp_path / "speech", tmp_path / "noise"
    speech.mkdir()
    noise.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        sf.write(speech / f"s{i}.wav", speech_like(1.2, seed=i), 16000)
        sf.write(noise / f"n{i}.wav", (0.05 * rng.standard_normal(16000)).astype(np.float32), 16000)
    cfg = RunConfig(
        TrainConfig(
            model="tiny", epochs=1, batch_size=2, max_steps_per_epoch=1, threads=1, init_from=str(start)
        ),
        DataConfig(
            speech=(str(speech),),
            noise=(str(noise),),
            val_examples=2,
            mixing=MixingConfig(segment_seconds=0.5),
        ),
    )
    trainer = Trainer(cfg, tmp_path / "run")
    expected = load_checkpoint(start).model.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in trainer.model.state_dict().items())
    bad = RunConfig(dataclasses.replace(cfg.train, model="tiny-tim4"), cfg.data)
    with pytest.raises(Exception, match="shape mismatch"):
        Trainer(bad, tmp_path / "run2")


def test_low_level_loss_term_adds_the_log_magnitude_error() -> None:
    """``low_level_weight`` adds weight * MSE(log(|pred| + floor), log(|clean| + floor)) to the paper's log1p MSE;
    0 leaves the paper's objective alone."""
    from enhance.stft import log_magnitude, stft
    from models.enhancer import Enhancer
    from models.registry import get_config
    from recipes.losses import loss_fn

    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    noisy = torch.randn(2, 8000) * 0.1
    clean = noisy * 0.5
    plain = loss_fn(model, noisy, clean, amp=False)
    pred = model(log_magnitude(stft(noisy, model.cfg.stft))).log_mag
    clean_mag = stft(clean, model.cfg.stft).abs()
    assert torch.allclose(plain, torch.mean((pred - torch.log1p(clean_mag)) ** 2), atol=1e-6)
    assert torch.equal(loss_fn(model, noisy, clean, False, 0.0), plain)
    low = torch.mean((torch.log(torch.expm1(pred.clamp(min=0)) + 0.02) - torch.log(clean_mag + 0.02)) ** 2)
    assert low > 0.01  # an untrained model: the term is not negligible, so the check below can fail
    assert torch.allclose(loss_fn(model, noisy, clean, False, 0.5, 0.02), plain + 0.5 * low, atol=1e-5)
    from recipes.trainer import TrainConfig

    with pytest.raises(ValueError, match="low_level_weight"):
        TrainConfig(low_level_weight=-0.1)


@pytest.mark.parametrize("warmup", [True, False])
def test_weight_average_follows_the_formula_and_restores_the_raw_weights(warmup: bool) -> None:
    """WeightEMA: average = d * average + (1 - d) * weight, with d = min(decay, (1 + n) / (10 + n)) under the
    warm-up and d = decay without; ``applied`` lends the model the average and gives its own weights back (also
    when the block raises); a saved state loads into the average without changing its dtype."""
    from recipes.ema import WeightEMA
    from recipes.trainer import TrainConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ema = WeightEMA(model, 0.95, warmup=warmup)
    expect = {k: v.double() for k, v in model.state_dict().items() if v.is_floating_point()}
    for n in range(30):  # the warm-up's (1 + n) / (10 + n) stays below 0.95 until n = 170
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model(torch.randn(4, 3))  # training mode: BatchNorm's running stats and its integer count move
        d = (1 + n) / (10 + n) if warmup else 0.95
        assert ema.current_decay() == pytest.approx(d)
        ema.update(model)
        for k in expect:
            expect[k] = d * expect[k] + (1 - d) * model.state_dict()[k].double()
    assert int(model.state_dict()["1.num_batches_tracked"]) == ema.updates == 30
    for k in expect:
        assert torch.allclose(ema.average[k], expect[k], atol=1e-12), k
    assert torch.equal(ema.average["1.num_batches_tracked"], model.state_dict()["1.num_batches_tracked"])
    raw = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.applied(model) as m:
        assert torch.allclose(m.state_dict()["0.weight"].double(), expect["0.weight"], atol=1e-6)
        assert not torch.equal(m.state_dict()["0.weight"], raw["0.weight"])
    assert all(torch.equal(model.state_dict()[k], raw[k]) for k in raw)
    with pytest.raises(RuntimeError, match="inside"), ema.applied(model):
        raise RuntimeError("inside")
    assert all(torch.equal(model.state_dict()[k], raw[k]) for k in raw)

    other = WeightEMA(model, 0.5, warmup=not warmup)
    state = ema.state_dict()
    saved = {
        **state,
        "average": {k: v.float() if v.is_floating_point() else v for k, v in state["average"].items()},
    }
    other.load_state_dict(saved)  # as if state.pt had held float32 tensors: the average stays float64
    assert (other.decay, other.warmup, other.updates) == (0.95, warmup, 30)
    assert other.average["0.weight"].dtype == torch.float64
    assert all(
        torch.equal(other.average[k], saved["average"][k].to(other.average[k].dtype))
        for k in saved["average"]
    )
    with pytest.raises(ValueError, match="does not match"):
        WeightEMA(torch.nn.Linear(3, 2), 0.9, warmup=True).load_state_dict(ema.state_dict())
    with pytest.raises(ValueError, match="does not match"):  # same keys, other shapes
        WeightEMA(
            torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2)), 0.9, True
        ).load_state_dict(ema.state_dict())
    with pytest.raises(ValueError, match="ema_decay"):
        TrainConfig(ema_decay=1.0)
    args = build_parser().parse_args(["--recipe", "folders", "--out", "x", "--ema-decay", "0.999"])
    assert resolve(args).train.ema_decay == 0.999


def test_over_weight_counts_errors_that_leave_noise_in_more() -> None:
    """``over_weight`` W: squared errors where the prediction is above the clean target weigh 1 + W."""
    from enhance.stft import log_magnitude, stft
    from models.enhancer import Enhancer
    from models.registry import get_config
    from recipes.losses import loss_fn
    from recipes.trainer import TrainConfig

    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    noisy = torch.randn(2, 8000) * 0.1
    clean = noisy * 0.5
    pred = model(log_magnitude(stft(noisy, model.cfg.stft))).log_mag
    err = pred - log_magnitude(stft(clean, model.cfg.stft))
    over, under = (err.clamp(min=0) ** 2).sum(), (err.clamp(max=0) ** 2).sum()
    assert over > 0 and under > 0  # both kinds of error occur, so the weighting is visible
    weighted = loss_fn(model, noisy, clean, False, over_weight=3.0)
    assert torch.allclose(weighted, (4.0 * over + under) / err.numel(), rtol=1e-5)
    assert torch.equal(
        loss_fn(model, noisy, clean, False, over_weight=0.0), loss_fn(model, noisy, clean, False)
    )
    with pytest.raises(ValueError, match="over_weight"):
        TrainConfig(over_weight=-1.0)
    args = build_parser().parse_args(["--recipe", "folders", "--out", "x", "--over-weight", "3"])
    assert resolve(args).train.over_weight == 3.0


def test_pause_removes_speech_from_one_span_of_both_signals_and_keeps_the_noise() -> None:
    import numpy as np

    from recipes.mixing import MixingConfig, insert_pause, mix
    from tests.conftest import speech_like

    cfg = MixingConfig(snr_db=(5.0, 5.0), pause_prob=1.0, pause_seconds=(0.5, 0.5))
    rng = np.random.default_rng(4)
    clean0 = np.abs(speech_like(2.0, seed=2)) + 0.2  # at least 0.2: the span shows exactly, shares are stable
    noise = (0.05 * rng.standard_normal(32000)).astype(np.float32)
    noisy, clean = mix(clean0, noise, np.random.default_rng(1), cfg)
    before_noisy, before_clean = noisy.copy(), clean.copy()
    insert_pause(noisy, clean, np.random.default_rng(2), cfg)
    changed = np.flatnonzero(np.abs(clean - before_clean) > 0)
    assert len(changed) == pytest.approx(8000, abs=2)  # one 0.5-s span (the ramps' ends included)
    assert changed[-1] - changed[0] + 1 == len(changed)  # contiguous
    inner = slice(changed[0] + 200, changed[-1] - 200)  # inside the 10-ms ramps
    assert np.abs(clean[inner]).max() < 1e-6  # speech gone from the target
    np.testing.assert_allclose(noisy - clean, before_noisy - before_clean, atol=1e-6)  # noise untouched
    # faded out over 10 ms (160 samples), not cut: the removed share rises smoothly from ~0 to 1
    share = ((before_clean - clean) / before_clean)[changed[0] : changed[0] + 160]
    assert share[0] < 0.01 and share[-1] > 0.99 and bool((np.diff(share) >= -1e-6).all())


def test_pause_off_draws_nothing_so_earlier_runs_keep_their_mixes() -> None:
    import numpy as np

    from recipes.mixing import MixingConfig, insert_pause

    noisy, clean = np.ones(16000, np.float32), np.ones(16000, np.float32)
    rng = np.random.default_rng(0)
    insert_pause(noisy, clean, rng, MixingConfig(pause_prob=0.0))
    assert rng.random() == np.random.default_rng(0).random()
    assert noisy.min() == clean.min() == 1.0
    with pytest.raises(ValueError, match="pause_prob"):
        MixingConfig(pause_prob=1.5)
    with pytest.raises(ValueError, match="pause_seconds"):
        MixingConfig(pause_seconds=(0.0, 1.0))
    with pytest.raises(ValueError, match="longer than a segment"):
        MixingConfig(segment_seconds=0.5, pause_prob=0.5, pause_seconds=(0.6, 1.0))
    MixingConfig(segment_seconds=0.5)  # no pauses asked for: the default pause_seconds do not matter


def test_the_default_models_two_stage_configs_resolve_to_the_documented_runs() -> None:
    """README "The bundled default model": stage 1 is default.json; stage 2 adds default-finetune.json and a
    warm start. Stage 2 changes only the learning rate, the epochs, the asymmetric loss and the SNR range."""
    stage1 = resolve(build_parser().parse_args(["--config", "default.json", "--out", "x"]))
    args = ["--config", "default.json", "--config", "default-finetune.json", "--init-from", "w.safetensors"]
    stage2 = resolve(build_parser().parse_args([*args, "--out", "y"]))
    assert stage1.train.over_weight == 0.0 and tuple(stage1.data.mixing.snr_db) == (-5.0, 25.0)
    assert (stage2.train.lr, stage2.train.epochs, stage2.train.over_weight) == (5e-5, 8, 1.5)
    assert tuple(stage2.data.mixing.snr_db) == (-5.0, 15.0) and stage2.train.init_from == "w.safetensors"
    same = dataclasses.replace(
        stage2,
        train=dataclasses.replace(
            stage2.train, lr=stage1.train.lr, epochs=stage1.train.epochs, over_weight=0.0, init_from=None
        ),
        data=dataclasses.replace(stage2.data, mixing=stage1.data.mixing),
    )
    assert same == stage1


def test_repeats_visit_every_segment_again_with_new_draws() -> None:
    """``MixingConfig.repeats`` makes an epoch several passes over the speech segments; each pass crops and mixes
    anew (example ``i`` depends on ``(seed, epoch, i)`` only), and ``repeats=1`` keeps the examples of runs made
    before the setting existed."""
    import numpy as np

    from recipes.audio_pool import AudioPool
    from recipes.mixing import MixingConfig, MixingDataset
    from tests.conftest import speech_like

    speech = AudioPool(["a", "b"], [24000, 40000], 16000)
    speech._cache.update({0: speech_like(1.5, seed=1), 1: speech_like(2.5, seed=2)})
    noise = AudioPool(["n"], [16000], 16000)
    noise._cache[0] = (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    once = MixingDataset(speech, noise, MixingConfig(segment_seconds=1.0), seed=3)
    thrice = MixingDataset(speech, noise, MixingConfig(segment_seconds=1.0, repeats=3), seed=3)
    n = len(once)
    assert n == 5 and len(thrice) == 3 * n and len(thrice.order(0)) == 3 * n
    for i in range(n):  # the first pass is the repeats=1 epoch, sample for sample
        assert all(torch.equal(a, b) for a, b in zip(once[(0, i)], thrice[(0, i)], strict=True))
    # a later pass takes the same speech segment with other draws (crop jitter, noise, SNR, level)
    assert not torch.equal(thrice[(0, 0)][0], thrice[(0, n)][0])
    assert not torch.equal(thrice[(0, 0)][1], thrice[(0, n)][1])  # the crop too (segment 0 is not clamped)
    with pytest.raises(ValueError, match="repeats"):
        MixingConfig(repeats=0)


def test_time_budget_stops_resumably_and_the_resumed_run_equals_an_uninterrupted_one(
    folders: FolderTree, tmp_path: Path
) -> None:
    """A run out of time stops after the current step with state.pt saved; --resume (which may change the budget)
    then finishes with the same weights as a run that never stopped."""
    args = folders_args(folders, "--epochs", "2", "--max-steps-per-epoch", "3")
    a, b = tmp_path / "A", tmp_path / "B"
    train_cli([*args, "--out", str(a)], tmp_path)
    proc = train_cli([*args, "--out", str(b), "--time-budget-minutes", "0"], tmp_path)
    assert "stopped at epoch 1 step 1 (time budget)" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["stopped"] == "time budget"
    assert not (b / "metrics.csv").exists()  # no epoch finished
    pos = run_folder.load_state(b / "state.pt")["position"]
    assert (pos["epoch"], pos["step"], pos["global_step"]) == (0, 1, 1)
    train_cli(["--out", str(b), "--resume", "--time-budget-minutes", "60"], tmp_path)
    drop = [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in metrics(a)]
    assert [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in metrics(b)] == drop
    wa = safetensors.torch.load_file(a / "last.safetensors")
    wb = safetensors.torch.load_file(b / "last.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


class _Ticks:
    """A clock that advances one second per reading: the trainer's time-budget arithmetic becomes exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_time_budget_stops_before_an_epoch_that_would_not_finish(folders: FolderTree, tmp_path: Path) -> None:
    """Before each epoch the time left is weighed against the last whole epoch's duration: with one and a half
    epochs of budget the run finishes epoch 1 and stops at the start of epoch 2 (not inside it), resumably."""
    args = folders_args(folders, "--epochs", "3", "--max-steps-per-epoch", "3")
    one = resolve(build_parser().parse_args([*args, "--out", str(tmp_path / "one"), "--epochs", "1"]))
    one = dataclasses.replace(one, train=dataclasses.replace(one.train, time_budget_minutes=1e6))
    with in_process():
        trainer = Trainer(one, tmp_path / "one")
        trainer.clock = clock = _Ticks()
        trainer.fit()
    readings = clock.now  # one epoch's clock readings (under a budget that never binds)
    cfg = resolve(build_parser().parse_args([*args, "--out", str(tmp_path / "run")]))
    cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, time_budget_minutes=1.5 * readings / 60)
    )
    with in_process():
        trainer = Trainer(cfg, tmp_path / "run")
        trainer.clock = _Ticks()
        last = trainer.fit()
    assert last["stopped"] == "time budget: the next epoch would not finish in time"
    assert (last["next_epoch"], last["next_step"]) == (2, 0)
    assert len(metrics(tmp_path / "run")) == 1  # epoch 1 finished and was logged
    pos = run_folder.load_state(tmp_path / "run" / "state.pt")["position"]
    assert (pos["epoch"], pos["step"]) == (1, 0)


def test_compact_corpus_writes_opus_copies_once_and_reports_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from recipes.compact_corpus import main as compact_main
    from tests.conftest import speech_like

    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    sf.write(src / "sub" / "a.flac", speech_like(1.0, seed=1), 16000)
    sf.write(src / "sub" / "a.wav", speech_like(1.0, seed=2), 16000)  # would be a.ogg too
    (src / "broken.wav").write_bytes(b"RIFF not really")
    assert compact_main([str(src), str(dst)]) == 0
    err = capsys.readouterr()
    assert "1 written, 0 already there, 2 skipped" in err.out
    assert (
        "broken.wav: skipped, unreadable" in err.err and "a.wav: skipped" in err.err and "a.flac" in err.err
    )
    out = dst / "sub" / "a.ogg"
    info = sf.info(out)
    assert (info.format, info.subtype, info.samplerate) == ("OGG", "OPUS", 16000)
    assert abs(info.frames - 16000) < 400
    assert not (dst / "broken.ogg").exists() and not list(dst.rglob(".*.tmp"))
    mtime = out.stat().st_mtime_ns
    assert compact_main([str(src), str(dst)]) == 0 and out.stat().st_mtime_ns == mtime  # kept, not redone
    assert compact_main([str(src / "missing"), str(dst)]) == 2


def test_gpu_bundle_script_builds_the_carried_folder_and_checks_its_size(tmp_path: Path) -> None:
    """recipes/gpu_bundle.sh on a corpus laid out like ../shared/data: Opus copies of speech and noise, every 4th
    dev pair as it is, the size line; a limit the tree cannot fit in fails, a folder that is not a corpus too."""
    from tests.conftest import speech_like

    data, dest = tmp_path / "data", tmp_path / "bundle"
    for sub, n in (("speech/train/spk0", 2), ("noise/train", 1)):
        (data / sub).mkdir(parents=True)
        for i in range(n):
            sf.write(data / sub / f"f{i}.flac", speech_like(1.0, seed=i), 16000)
    for kind in ("noisy", "clean"):
        (data / "dev" / kind).mkdir(parents=True)
        for i in range(6):
            sf.write(data / "dev" / kind / f"{i:04d}.flac", speech_like(0.5, seed=10 + i), 16000)
    env = {**cli_env(), "PYTHON": sys.executable, "NO_WHEELS": "1"}
    script = ["bash", str(ROOT / "recipes" / "gpu_bundle.sh"), str(data), str(dest)]
    proc = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.ogg")) == [
        "data/noise/f0.ogg",
        "data/speech/spk0/f0.ogg",
        "data/speech/spk0/f1.ogg",
    ]
    for kind in ("noisy", "clean"):  # pairs 0 and 4 of 6, byte for byte
        copied = sorted(p.name for p in (dest / "data" / "dev" / kind).iterdir())
        assert copied == ["0000.flac", "0004.flac"]
        assert all(
            (dest / "data/dev" / kind / n).read_bytes() == (data / "dev" / kind / n).read_bytes()
            for n in copied
        )
    assert "2 of 6 dev pairs copied" in proc.stdout and "of 62.0 MiB" in proc.stdout
    assert not (dest / "whl").exists()
    small = subprocess.run(
        script, cwd=ROOT, env={**env, "LIMIT_MIB": "1"}, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    assert small.returncode == 1 and "too big to carry" in small.stderr
    wrong = subprocess.run(
        [*script[:2], str(tmp_path / "nothing"), str(dest)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    assert wrong.returncode == 2 and "is not a folder" in wrong.stderr
    # fewer dev pairs (session 28: room for less-coded noise): every 5th of 6 is pairs 0 and 5
    dest5 = tmp_path / "bundle5"
    fewer = subprocess.run(
        [*script[:3], str(dest5)],
        cwd=ROOT,
        env={**env, "DEV_EVERY": "5"},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    assert fewer.returncode == 0, fewer.stderr
    assert sorted(p.name for p in (dest5 / "data/dev/noisy").iterdir()) == ["0000.flac", "0005.flac"]
    for bad in ("0", "x"):
        refused = subprocess.run(
            script,
            cwd=ROOT,
            env={**env, "DEV_EVERY": bad},
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
        )
        assert refused.returncode == 2 and "DEV_EVERY must be a positive whole number" in refused.stderr


def test_gpu_bundle_takes_fewer_dev_pairs_when_every_4th_does_not_fit(tmp_path: Path) -> None:
    """DEV_EVERY=auto (the default): every 4th dev pair while that fits under LIMIT_MIB with the tracked tree, else
    the smallest stride whose pairs fit. The documented command had stopped fitting as the tree grew (62.6 MiB of
    62 in session 33: a helper's walk-through)."""
    import math

    from tests.conftest import speech_like

    data, mib = tmp_path / "data", 1024 * 1024
    for sub in ("speech/train", "noise/train"):
        (data / sub).mkdir(parents=True)
        sf.write(data / sub / "f0.flac", speech_like(1.0, seed=1), 16000)
    rng = np.random.default_rng(0)
    for kind in ("noisy", "clean"):  # 12 pairs of about 1.3 MiB (white noise: FLAC cannot shrink it)
        (data / "dev" / kind).mkdir(parents=True)
        for i in range(12):
            x = np.clip(0.3 * rng.standard_normal(16000 * 21), -1, 1)
            sf.write(data / "dev" / kind / f"{i:04d}.flac", x, 16000, subtype="PCM_16")
    pair = max(
        sum((data / "dev" / k / f"{i:04d}.flac").stat().st_size for k in ("noisy", "clean"))
        for i in range(12)
    )
    assert 1.1 * mib < pair < 2 * mib
    env = {**cli_env(), "PYTHON": sys.executable, "NO_WHEELS": "1"}

    def bundle(dest: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        script = ["bash", str(ROOT / "recipes" / "gpu_bundle.sh"), str(data), str(dest)]
        return subprocess.run(
            script, cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, timeout=CLI_TIMEOUT
        )

    roomy = bundle(tmp_path / "roomy")
    assert roomy.returncode == 0 and "3 of 12 dev pairs copied (stride 4)" in roomy.stdout, roomy.stderr
    rest = sum(p.stat().st_size for p in (tmp_path / "roomy/data").rglob("*.ogg"))
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tree = sum(
        (ROOT / name).stat().st_size
        for name in listed.decode().split("\0")
        if name and (ROOT / name).exists()
    )
    # room for two pairs and less than a MiB more (under three pairs): strides 4 and 5 give three, 6 gives two
    limit = math.ceil((tree + rest + 2 * pair + 0.05 * mib) / mib)
    tight = bundle(tmp_path / "tight", LIMIT_MIB=str(limit))
    assert tight.returncode == 0 and "2 of 12 dev pairs copied (stride 6)" in tight.stdout, (
        tight.stdout + tight.stderr
    )
    assert sorted(p.name for p in (tmp_path / "tight/data/dev/clean").iterdir()) == ["0000.flac", "0006.flac"]


def test_remote_train_script_runs_a_detached_training_and_hands_back_its_files(
    folders: FolderTree, tmp_path: Path
) -> None:
    """recipes/remote_train.sh as the GPU session used it, here on the CPU: `start` launches the run in its own
    process session and watches it until it ends; the run's files land in $OUT, checkpoints in parts that join
    back to the same bytes; `wait` on an ended run collects again at once."""
    work = tmp_path / "cwd"  # the script imports from its working directory: the project's packages, no .gpu/
    work.mkdir()
    for pkg in ("recipes", "models", "enhance"):
        (work / pkg).symlink_to(ROOT / pkg)
    run, out = tmp_path / "run", tmp_path / "out"
    env = {
        **cli_env(),
        "RUN": str(run),
        "WORK": str(tmp_path / "work"),
        "OUT": str(out),
        "PYTHON": sys.executable,
        "START_WAIT": "0",
        "WAIT_SECONDS": "3600",  # far past the subprocess timeout: returning at all means the run's end was seen
    }
    (tmp_path / "work").mkdir()
    script = str(ROOT / "recipes" / "remote_train.sh")
    args = folders_args(folders, "--epochs", "2", "--max-steps-per-epoch", "3")
    proc = subprocess.run(
        ["bash", script, "start", "10", *args], cwd=work, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr
    assert "[remote] run ended" in proc.stdout and "[train] epoch 2:" in proc.stdout
    names = sorted(p.name for p in out.iterdir())
    for name in ("config.json", "env.json", "metrics.csv", "train.log"):
        assert name in names
    for ck in ("best", "last"):
        parts = sorted(out.glob(f"{ck}.safetensors.part-*"))
        assert parts and b"".join(p.read_bytes() for p in parts) == (run / f"{ck}.safetensors").read_bytes()
    assert json.loads((out / "config.json").read_text())["train"]["time_budget_minutes"] == 10.0
    again = subprocess.run(
        ["bash", script, "wait", "300"], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "[remote] run ended" in again.stdout
    bad = subprocess.run(
        ["bash", script, "sideways"], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "usage" in bad.stderr
    # `snaps` (session 28): a fine-tune of those weights; each epoch's weights as a float16 delta from them
    run2, out2 = tmp_path / "run2", tmp_path / "out2"
    env2 = {**env, "RUN": str(run2), "OUT": str(out2), "WORK": str(tmp_path / "work2"), "MAX_SNAPS": "2"}
    base = run / "last.safetensors"
    args2 = folders_args(folders, "--epochs", "3", "--max-steps-per-epoch", "3", "--init-from", str(base))
    snaps = subprocess.run(
        ["bash", script, "snaps", "10", *args2],
        cwd=work,
        env=env2,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert snaps.returncode == 0, snaps.stderr
    deltas = sorted(p.name for p in out2.glob("ep*.delta"))
    assert "ep3.delta" in deltas and len(deltas) <= 2  # the last epoch always, at most MAX_SNAPS
    with tarfile.open(out2 / "run.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["config.json", "env.json", "metrics.csv", "train.log"]
    from recipes.checkpoint_delta import decode

    decode(base, out2 / "ep3.delta", tmp_path / "ep3.safetensors")
    got = load_checkpoint(tmp_path / "ep3.safetensors").model.state_dict()
    want, start = (load_checkpoint(p).model.state_dict() for p in (run2 / "last.safetensors", base))
    assert any(not torch.equal(want[k], start[k]) for k in want)  # it trained
    assert all(
        bool(((got[k] - want[k]).abs() <= 1e-3 * (want[k] - start[k]).abs() + 1e-7).all()) for k in want
    )
    # going on with --resume (BASE in the environment, since --resume takes no --init-from): one more epoch
    more = subprocess.run(
        ["bash", script, "snaps", "10", "--resume", "--epochs", "4"],
        cwd=work,
        env={**env2, "BASE": str(base)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert more.returncode == 0, more.stderr
    assert "ep4.delta" in {p.name for p in out2.glob("ep*.delta")}
    nobase = subprocess.run(
        ["bash", script, "snaps", "10", *folders_args(folders)],
        cwd=work,
        env=env2,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobase.returncode == 2 and "snaps needs --init-from" in nobase.stderr
    # a run that fails before its first epoch: exit 1, and the log still comes back
    out3 = tmp_path / "out3"
    failed = subprocess.run(
        ["bash", script, "snaps", "10", *folders_args(folders, "--init-from", str(tmp_path / "missing.st"))],
        cwd=work,
        env={**env2, "RUN": str(tmp_path / "run3"), "OUT": str(out3)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1 and "no epoch finished" in failed.stderr
    with tarfile.open(out3 / "run.tar.gz") as tar:
        log = tar.extractfile("train.log")
        assert log is not None and b"missing.st" in log.read()


def test_every_shipped_config_resolves(tmp_path: Path) -> None:
    """Each file of recipes/configs loads and validates (a typo in one would otherwise surface on a lent GPU);
    augment.json is an overlay that turns on the augmentations over default-gpu.json's settings."""
    from recipes.train import CONFIG_DIR

    names = sorted(p.name for p in CONFIG_DIR.glob("*.json"))
    assert "default-gpu.json" in names and "augment.json" in names
    for name in names:
        assert resolve(
            build_parser().parse_args(["--config", name, "--out", str(tmp_path / "r")])
        ).train.model
    cfg = resolve(
        build_parser().parse_args(
            ["--config", "default-gpu.json", "--config", "augment.json", "--out", str(tmp_path / "r")]
        )
    )
    mixing = cfg.data.mixing
    assert mixing.augment.active and mixing.pause_prob == 0.3 and mixing.repeats == 40
    assert cfg.train.batch_size == 64 and cfg.train.over_weight == 1.5


@pytest.mark.parametrize(("lr", "saved"), [("1000", False), ("600", True)])
def test_a_diverging_run_stops_with_an_error_and_no_nan_weights(
    folders: FolderTree, tmp_path: Path, capsys: pytest.CaptureFixture[str], lr: str, saved: bool
) -> None:
    """--lr 1000 logged 'train nan val nan' for every epoch, exited 0 and left a last.safetensors that every
    loader refuses (NaN weights). It now stops at the first non-finite loss or weight, before anything NaN is
    saved: at lr 1000 within the first epoch (nothing saved), at lr 600 after the first epoch's checkpoints
    and state (seed 0 diverges in epoch 2 from lr 450 to 750), which stay loadable and finite."""
    run = tmp_path / "run"
    args = folders_args(folders, "--epochs", "4", "--lr", lr, "--max-steps-per-epoch", "4")
    with in_process():
        code = train_main([*args, "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and "training diverged: " in err and "Traceback" not in err, err
    assert "the loss is nan at epoch" in err or "NaN or infinite weights" in err, err
    names = ("best.safetensors", "last.safetensors", "state.pt")
    assert [(run / name).exists() for name in names] == [saved] * 3, sorted(p.name for p in run.iterdir())
    if saved:
        for name in names[:2]:
            load_checkpoint(run / name)  # refuses NaN or infinite weights
        state = torch.load(run / "state.pt", weights_only=False)
        assert all(torch.isfinite(t).all() for t in state["model"].values())


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile writes no MP3")
def test_a_truncated_corpus_file_is_skipped_with_the_reason(tmp_path: Path) -> None:
    """A cut MP3 keeps its header's length; the scan read the reader's stale buffer up to it and kept the file."""
    from recipes.audio_pool import scan

    rng = np.random.default_rng(0)
    whole, cut = tmp_path / "whole.mp3", tmp_path / "cut.mp3"
    sf.write(whole, (0.1 * rng.standard_normal(16000 * 4)).astype(np.float32), 16000)
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 3])
    pool = scan([str(whole), str(cut)])
    assert pool.paths == [str(whole)]
    assert [s.reason.split(" (")[0] for s in pool.skipped] == ["truncated"], pool.skipped


def test_an_infinite_time_budget_is_no_limit_and_the_run_resumes_after_it(
    folders: FolderTree, tmp_path: Path
) -> None:
    """inf was saved as Infinity in config.json and state.pt, which every later --resume refused to read; a new
    run given inf was refused at once, though --help offers it."""
    args = folders_args(folders, "--epochs", "1", "--max-steps-per-epoch", "2")
    run = tmp_path / "run"
    train_cli([*args, "--out", str(run), "--time-budget-minutes", "0"], tmp_path)  # stops, resumably
    train_cli(["--out", str(run), "--resume", "--time-budget-minutes", "inf"], tmp_path)
    assert json.loads((run / "config.json").read_text())["train"]["time_budget_minutes"] is None
    train_cli(["--out", str(run), "--resume", "--epochs", "2"], tmp_path)  # reads what the last one saved
    assert len(metrics(run)) == 2
    train_cli([*args, "--out", str(tmp_path / "fresh"), "--time-budget-minutes", "inf"], tmp_path)


def test_a_new_run_keeps_out_of_a_folder_of_other_files_and_a_refused_one_leaves_none(
    folders: FolderTree, tmp_path: Path
) -> None:
    """--config exp/config.json --out exp replaced the user's own config.json with the resolved one; a run
    refused before it started left its folder behind holding only a .lock."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.json").write_text('{"train": {"epochs": 1}}')
    (exp / "notes.txt").write_text("mine")
    args = folders_args(folders, "--epochs", "1", "--max-steps-per-epoch", "1")
    proc = refused_train([*args, "--config", str(exp / "config.json"), "--out", str(exp)], tmp_path)
    assert "holds config.json that no run wrote" in proc.stderr, proc.stderr
    assert (exp / "config.json").read_text() == '{"train": {"epochs": 1}}'
    empty = tmp_path / "no-speech"
    empty.mkdir()
    refused = tmp_path / "refused"
    only_empty = ["--speech", str(empty), "--noise", str(folders.noise), "--val-pairs", str(folders.dev)]
    proc = refused_train([*only_empty, "--model", "tiny", "--threads", "1", "--out", str(refused)], tmp_path)
    assert "no usable speech files" in proc.stderr and not refused.exists(), proc.stderr
    logged = (
        tmp_path / "logged"
    )  # mkdir runs/x; tim-train --out runs/x | tee runs/x/train.log: a run's folder
    logged.mkdir()
    (logged / "train.log").write_text("")
    (logged / ".DS_Store").write_bytes(b"")
    train_cli([*args, "--out", str(logged)], tmp_path)


def test_resume_takes_runtime_settings_from_a_config_file_and_inf_beats_a_configured_budget(
    folders: FolderTree, tmp_path: Path
) -> None:
    """--resume --config ep.json ({"train": {"epochs": 2}}) went on with the saved epochs; --time-budget-minutes
    inf lost to a budget in a --config file."""
    budget = tmp_path / "budget.json"
    budget.write_text('{"train": {"time_budget_minutes": 30}}')
    args = folders_args(folders, "--epochs", "1", "--max-steps-per-epoch", "1")
    run = tmp_path / "run"
    train_cli([*args, "--config", str(budget), "--time-budget-minutes", "inf", "--out", str(run)], tmp_path)
    assert json.loads((run / "config.json").read_text())["train"]["time_budget_minutes"] is None
    more = tmp_path / "more.json"
    more.write_text('{"train": {"epochs": 2}}')
    train_cli(["--out", str(run), "--resume", "--config", str(more)], tmp_path)
    assert len(metrics(run)) == 2
    # a config file's epochs only extends: the first command's (1 epoch) again put the run back to 1 epoch, and a
    # run stopped in the middle of an extension then said "nothing to train"
    fewer = tmp_path / "fewer.json"
    fewer.write_text('{"train": {"epochs": 1}}')
    again = train_cli(["--out", str(run), "--resume", "--config", str(fewer)], tmp_path)
    assert "has done all of its 2 epochs: nothing to train" in again.stdout, again.stdout
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 2
    assert (
        "already done 2 epochs"
        in refused_train(["--out", str(run), "--resume", "--epochs", "1"], tmp_path).stderr
    )


def test_a_state_file_tim_train_did_not_write_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A foreign state.pt said "tim-train: error: config" (a KeyError's key), or ended in a traceback."""
    run = tmp_path / "run"
    run.mkdir()
    for foreign in ({"model": {"w": torch.zeros(2)}}, [1, 2]):
        torch.save(foreign, run / "state.pt")
        with in_process():
            assert train_main(["--out", str(run), "--resume"]) == 2
        err = capsys.readouterr().err
        assert f"{run / 'state.pt'}: not a training state tim-train wrote (it lacks " in err, err
        assert "Traceback" not in err


def test_the_corpus_must_be_at_the_models_rate_and_an_empty_pool_says_why(tmp_path: Path) -> None:
    """An 8-kHz mixing rate fed 8-kHz audio to the 16-kHz model as if it were 16 kHz; a 48-kHz corpus ended in
    "no usable speech files" alone."""
    from recipes.audio_pool import list_audio, scan
    from recipes.mixing import MixingConfig, MixingDataset

    with pytest.raises(ValueError, match="16000 Hz"):
        MixingConfig(sample_rate=8000)
    rng = np.random.default_rng(0)
    for i in range(3):
        sf.write(tmp_path / f"s{i}.wav", (0.1 * rng.standard_normal(48000)).astype(np.float32), 48000)
    (tmp_path / "gone.wav").symlink_to(tmp_path / "missing.wav")  # dangling: was left out without a word
    speech = scan(list_audio([tmp_path]))
    assert {Path(s.path).name: s.reason for s in speech.skipped}["gone.wav"] == "a link to a missing file"
    with pytest.raises(ValueError) as refused:
        MixingDataset(speech, speech, MixingConfig(), seed=0)
    message = str(refused.value)
    assert "no usable speech files: all 4 skipped" in message and "3 x sample rate 48000 Hz" in message, (
        message
    )
