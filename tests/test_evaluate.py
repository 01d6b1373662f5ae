"""Pair discovery in the supported test-set layouts, and the evaluation command end to end."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from recipes.evaluate import CSV_COLUMNS, SUMMARY_COLUMNS, evaluate, main
from recipes.metrics import METRIC_KEYS
from recipes.pairs import Pair, discover_pairs, dns_pairs, fileid_key, find_pairs

FS = 16000
ROOT = Path(__file__).resolve().parents[1]


def speech_like(seconds: float, seed: int = 0, fs: int = FS) -> np.ndarray:
    """A voiced, syllable-modulated harmonic signal (gliding f0, 1/k harmonics), peak about 0.3."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * fs)) / fs
    f0 = 130 + 25 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, np.pi))
    phase = 2 * np.pi * np.cumsum(f0) / fs
    voiced = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 30))
    x = voiced * np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 2
    return (0.3 * x / np.max(np.abs(x))).astype(np.float32)


def noisy_version(x: np.ndarray, seed: int = 1, level: float = 0.03) -> np.ndarray:
    return (x + level * np.random.default_rng(seed).standard_normal(len(x))).astype(np.float32)


def write(path: Path, wav: np.ndarray, fs: int = FS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, wav, fs)
    return path


def tiny_tone(seed: int = 0) -> np.ndarray:
    return speech_like(0.05, seed)


# --- pair discovery ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sub", ["dev", "."])
def test_dev_layout_pairs_by_name(tmp_path: Path, sub: str) -> None:
    folder = tmp_path / sub
    for name in ("0002.flac", "0001.flac", "0010.flac"):
        write(folder / "noisy" / name, tiny_tone())
        write(folder / "clean" / name, tiny_tone())
    write(folder / "noisy" / "0003.flac", tiny_tone())  # no clean partner
    write(folder / "clean" / ".0001.flac", tiny_tone())  # hidden file: ignored
    (folder / "clean" / "notes.txt").write_text("not audio")

    found = discover_pairs(tmp_path)
    assert found.layout == "dev"
    assert [p.name for p in found.pairs] == ["0001", "0002", "0010"]
    assert all(
        p.noisy_path.parent.name == "noisy" and p.clean_path.parent.name == "clean" for p in found.pairs
    )
    assert all(p.noisy_path.name == p.clean_path.name for p in found.pairs)
    assert len(found.warnings) == 1 and "0003.flac" in found.warnings[0]

    warnings: list[str] = []
    assert find_pairs(tmp_path, warnings) == found.pairs
    assert warnings == found.warnings


def test_pairs_whose_stems_clash_are_named_by_file_name(tmp_path: Path) -> None:
    """x.wav and x.flac are two pairs: per-file tables are keyed by the name, so one was left out of the means."""
    for name in ("h.flac", "h.wav", "k.wav"):
        write(tmp_path / "noisy" / name, tiny_tone())
        write(tmp_path / "clean" / name, tiny_tone())
    assert [p.name for p in discover_pairs(tmp_path).pairs] == ["h.flac", "h.wav", "k"]


def make_dns(folder: Path, ids: list[int]) -> None:
    for i in ids:
        write(folder / "noisy" / f"clnsp{i}_fan_{i * 7}_snr{i % 20}_tl-25_fileid_{i}.wav", tiny_tone(i))
        write(folder / "clean" / f"clean_fileid_{i}.wav", tiny_tone(i))


# "datasets/...": the DNS-Challenge repository, as tim-train --root takes it (evaluate refused it)
@pytest.mark.parametrize(
    "sub", ["datasets/test_set/synthetic/no_reverb", "test_set/synthetic/no_reverb", "."]
)
def test_dns_layout_pairs_by_fileid(tmp_path: Path, sub: str) -> None:
    folder = tmp_path / sub
    make_dns(folder, [10, 2, 1])
    write(folder / "clean" / "clean_fileid_99.wav", tiny_tone())  # unpaired clean file
    found = discover_pairs(tmp_path)
    assert found.layout == "dns"
    assert [p.name for p in found.pairs] == ["fileid_1", "fileid_2", "fileid_10"]
    for p in found.pairs:
        assert fileid_key(p.noisy_path) == fileid_key(p.clean_path) == p.name
        assert p.clean_path.name == f"clean_{p.name}.wav"
    assert any("clean_fileid_99.wav" in w for w in found.warnings)


def test_dns_layout_from_the_test_set_folder(tmp_path: Path) -> None:
    make_dns(tmp_path / "test_set" / "synthetic" / "no_reverb", [5])
    assert [p.name for p in dns_pairs(tmp_path / "test_set").pairs] == ["fileid_5"]


def test_fileid_key() -> None:
    assert fileid_key(Path("book_00012_chp_0009_reader_06709_2_fileid_012.wav")) == "fileid_12"
    assert fileid_key(Path("clean_fileid_12.wav")) == "fileid_12"
    assert fileid_key(Path("p232_001.wav")) is None


def test_voicebank_layout_pairs_by_name(tmp_path: Path) -> None:
    for name in ("p257_002.wav", "p232_001.wav"):
        write(tmp_path / "noisy_testset_wav" / name, tiny_tone(), fs=48000)
        write(tmp_path / "clean_testset_wav" / name, tiny_tone(), fs=48000)
    write(tmp_path / "clean_testset_wav" / "p232_003.wav", tiny_tone(), fs=48000)
    found = discover_pairs(tmp_path)
    assert found.layout == "voicebank"
    assert found.pairs == [
        Pair(
            "p232_001",
            tmp_path / "noisy_testset_wav" / "p232_001.wav",
            tmp_path / "clean_testset_wav" / "p232_001.wav",
        ),
        Pair(
            "p257_002",
            tmp_path / "noisy_testset_wav" / "p257_002.wav",
            tmp_path / "clean_testset_wav" / "p257_002.wav",
        ),
    ]
    assert any("p232_003.wav" in w for w in found.warnings)


def test_no_known_layout_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "audio" / "a.wav", tiny_tone())
    with pytest.raises(ValueError, match="no known test-set layout"):
        find_pairs(tmp_path)
    with pytest.raises(ValueError, match="missing: no such folder"):
        find_pairs(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"a\.wav: not a folder"):  # a file where a folder was asked for
        find_pairs(tmp_path / "audio" / "a.wav")


def test_nothing_pairs_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "dev" / "noisy" / "0001.flac", tiny_tone())
    write(tmp_path / "dev" / "clean" / "0002.flac", tiny_tone())
    with pytest.raises(ValueError, match=r"no noisy file pairs with a clean file \(1 noisy, 1 clean"):
        find_pairs(tmp_path)


def test_empty_voicebank_folders_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "noisy_testset_wav").mkdir()
    (tmp_path / "clean_testset_wav").mkdir()
    with pytest.raises(ValueError, match="voicebank layout"):
        find_pairs(tmp_path)


# --- evaluation --------------------------------------------------------------------------------------------


def make_dev_set(root: Path, n: int, seconds: float, silent_clean: int | None = None) -> Path:
    """``root/dev/{noisy,clean}/NNNN.flac`` with ``n`` generated pairs; one clean file may be all zeros."""
    for i in range(n):
        clean = speech_like(seconds, seed=i)
        write(root / "dev" / "noisy" / f"{i:04d}.flac", noisy_version(clean, seed=100 + i))
        if i == silent_clean:
            clean = np.zeros_like(clean)
        write(root / "dev" / "clean" / f"{i:04d}.flac", clean)
    return root


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        return list(csv.DictReader(f))


def test_evaluate_command_end_to_end(tmp_path: Path) -> None:
    data = make_dev_set(tmp_path / "data", n=3, seconds=2.5, silent_clean=1)
    out = tmp_path / "eval"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "recipes.evaluate",
        "--model-config",
        "tiny",
        "--pairs",
        str(data),
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr

    for name in ("per_file.csv", "summary.csv", "summary.md", "summary.json"):
        assert (out / name).is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left behind

    per_file = read_csv(out / "per_file.csv")
    assert list(per_file[0]) == ["name", "system", *METRIC_KEYS]
    assert [(r["name"], r["system"]) for r in per_file] == [
        (f"{i:04d}", s) for i in range(3) for s in ("noisy", "enhanced")
    ]
    for r in per_file:
        values = [float(r[k]) for k in METRIC_KEYS]
        assert all(math.isfinite(v) for v in values[3:])  # DNSMOS scores the degraded signal only
        assert all(math.isnan(v) for v in values[:3]) == (r["name"] == "0001")  # silent reference

    summary = read_csv(out / "summary.csv")
    assert tuple(summary[0]) == CSV_COLUMNS
    assert {(r["n_skipped"], r["n_unpaired"]) for r in summary} == {("0", "0")}
    assert [r["system"] for r in summary] == ["noisy", "enhanced"]
    for r in summary:
        assert int(r["n_files"]) == 3
        assert int(r["n_failed"]) == 1
        assert all(math.isfinite(float(r[k])) for k in METRIC_KEYS)
        assert 1.0 <= float(r["pesq"]) <= 4.7 and 0.0 <= float(r["stoi"]) <= 1.0
        assert 1.0 <= float(r["dnsmos_ovrl"]) <= 5.0
    # the noisy row's means are over the two finite files
    noisy_pesq = [float(r["pesq"]) for r in per_file if r["system"] == "noisy" and r["name"] != "0001"]
    assert float(summary[0]["pesq"]) == pytest.approx(np.mean(noisy_pesq), abs=1e-5)

    js = json.loads((out / "summary.json").read_text())
    assert list(js["summary"]) == ["noisy", "enhanced"]
    assert js["n_pairs"] == js["n_evaluated"] == 3 and js["skipped"] == [] and js["dnsmos"] is True
    assert js["torch_threads"] == 1  # --threads took effect
    settings = js["settings"]  # what made the folder (it named neither the model nor the pairs)
    assert settings["model_config"] == "tiny" and settings["checkpoint"] is None
    assert settings["pairs"] == str(data.resolve()) and settings["layout"] == "dev"
    assert settings["pairs_found"] == 3 and settings["limit"] is None
    assert settings["command"][:3] == ["tim-evaluate", "--model-config", "tiny"]

    md = (out / "summary.md").read_text()
    assert md.splitlines()[0] == "| " + " | ".join(SUMMARY_COLUMNS) + " |"
    assert "| noisy |" in md and "| enhanced |" in md
    assert md in proc.stdout  # the table is printed


def test_ctrl_c_during_an_evaluation_is_one_line_exit_130_keeps_the_pairs_scored_and_resumes(
    tmp_path: Path,
) -> None:
    """It was a KeyboardInterrupt traceback from wherever it landed (onnxruntime, PESQ); tim-train already said
    one line. Then it said "nothing was written": an hour of DNSMOS on a test set was lost to one Ctrl-C. Now the
    reports hold the pairs scored before it, marked interrupted, and --resume scores the rest; without a
    terminal, progress is logged."""
    data = make_dev_set(tmp_path / "data", n=12, seconds=3.0)
    out = tmp_path / "eval"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "recipes.evaluate", "--model-config", "tiny", "--pairs", str(data)]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out), "--threads", "1", "--no-dnsmos"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        # as from a terminal: a job a script started in the background inherits SIGINT ignored, and Python then
        # never raises KeyboardInterrupt (the evaluation ran to its end)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # a progress line every pair (5 % of 12 is less than one)
            if line.startswith("evaluate: 4/12 pairs"):
                break
        proc.send_signal(signal.SIGINT)
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 130, err
    finally:
        proc.kill()
    assert f"tim-evaluate: interrupted; {out} holds the reports of the " in err and "Traceback" not in err, (
        err
    )
    assert "the same command with --resume goes on" in err
    report = json.loads((out / "summary.json").read_text())
    assert report["interrupted"] is True and report["n_pairs"] == 12 and 4 <= report["n_evaluated"] < 12
    before = read_csv(out / "per_file.csv")
    assert len(before) == 2 * report["n_evaluated"]  # whole pairs: noisy and enhanced
    assert f"**Interrupted**: {report['n_evaluated']} of the 12 pairs" in (out / "summary.md").read_text()

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, "--out", str(out), "--threads", "1", "--no-dnsmos", *extra],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )

    other = run(
        "--resume", "--limit", "5"
    )  # another evaluation than the one in --out: refused, nothing changed
    assert other.returncode == 2 and "--resume: not the evaluation in" in other.stderr, other.stderr
    assert "limit: None then, 5 now" in other.stderr
    done = run("--resume")
    assert done.returncode == 0, done.stderr
    assert f"resuming: the {report['n_evaluated']} pairs scored before are kept" in done.stderr
    final = json.loads((out / "summary.json").read_text())
    assert final["interrupted"] is False and final["n_evaluated"] == 12
    rows = read_csv(out / "per_file.csv")
    assert sorted((r["name"], r["system"]) for r in rows) == sorted(
        (f"{i:04d}", s) for i in range(12) for s in ("noisy", "enhanced")
    )
    assert rows[: len(before)] == before  # the pairs scored before were kept, not scored again
    again = run("--resume")
    assert again.returncode == 2 and "is complete: nothing to resume" in again.stderr
    # the same means as an evaluation never interrupted (the kept rows come back from per_file.csv's 6 decimals:
    # the means differed in the 7th significant digit)
    whole = subprocess.run(
        [*cmd, "--out", str(tmp_path / "whole"), "--threads", "1", "--no-dnsmos"],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "whole" / "summary.csv").read_bytes() == (out / "summary.csv").read_bytes()


def test_resume_refuses_other_weights_at_the_same_path_and_a_summary_that_is_not_one(tmp_path: Path) -> None:
    """--resume compared the checkpoint's path only: other weights saved there since were scored into the same
    tables. A summary.json that is JSON but not an object was an AttributeError traceback."""
    from recipes.evaluate import resumable

    settings = {"checkpoint": "/runs/a/best.safetensors", "checkpoint_sha256": "aa", "dnsmos": False}
    (tmp_path / "per_file.csv").write_text("name,system,pesq\n")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"interrupted": True, "dnsmos": False, "settings": settings}))
    assert resumable(tmp_path, settings).rows == []
    with pytest.raises(ValueError, match="checkpoint_sha256: 'aa' then, 'bb' now"):
        resumable(tmp_path, {**settings, "checkpoint_sha256": "bb"})
    for not_one in ("[]", '{"interrupted": true, "settings": [1]}'):
        summary.write_text(not_one)
        with pytest.raises(ValueError, match="holds no readable evaluation"):
            resumable(tmp_path, settings)


def test_evaluate_function_converts_skips_and_limits(tmp_path: Path) -> None:
    import torch

    from models import Enhancer, get_config

    data = make_dev_set(tmp_path / "data", n=2, seconds=1.5)
    # a 48 kHz stereo noisy file is resampled and reduced to channel 0
    clean = speech_like(1.5, seed=7, fs=48000)
    stereo = np.stack([noisy_version(clean), np.zeros_like(clean)], axis=1)
    write(data / "dev" / "noisy" / "0002.wav", stereo, fs=48000)
    write(data / "dev" / "clean" / "0002.wav", clean, fs=48000)
    # an unreadable file is skipped with its reason
    write(data / "dev" / "clean" / "0003.wav", speech_like(1.0))
    (data / "dev" / "noisy" / "0003.wav").write_bytes(b"RIFF not really a wav file")

    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).train()
    pairs = find_pairs(data)
    logged: list[str] = []
    result = evaluate(model, pairs, tmp_path / "out", dnsmos=False, progress=False, log=logged.append)
    assert model.training  # mode restored
    assert result["n_pairs"] == 4 and result["n_evaluated"] == 3
    assert [s["name"] for s in result["skipped"]] == ["0003"] and "0003" in logged[0]
    # summary.csv, read alone, says a file was left out (it gave only the scored files' count)
    csv_rows = read_csv(tmp_path / "out" / "summary.csv")
    assert [(r["n_files"], r["n_skipped"], r["n_unpaired"]) for r in csv_rows] == [("3", "1", "0")] * 2
    assert result["files_converted"]["resampled"] == 1 and result["files_converted"]["multichannel"] == 1
    for entry in result["summary"].values():
        assert entry["n_files"] == 3 and entry["n_failed"] == 0  # disabled DNSMOS is not a failure
        assert math.isnan(entry["dnsmos_ovrl"]) and math.isfinite(entry["pesq"])
    assert (
        json.loads((tmp_path / "out" / "summary.json").read_text())["summary"]["noisy"]["dnsmos_sig"] is None
    )
    # the resampled pair scores like a 16 kHz one: its noisy STOI is high
    rows = [r for r in read_csv(tmp_path / "out" / "per_file.csv") if r["name"] == "0002"]
    assert float(rows[0]["stoi"]) > 0.8

    limited = evaluate(model, pairs, tmp_path / "out2", dnsmos=False, limit=1, progress=False, log=None)
    assert limited["n_pairs"] == 1 and limited["summary"]["enhanced"]["n_files"] == 1

    # a pair whose file name is not valid UTF-8 is scored, and the reports name it (by its own bytes): it was
    # "not a readable audio file", then writing summary.md failed with a UnicodeEncodeError
    odd = os.fsdecode(b"take\xff")
    for side in ("noisy", "clean"):
        os.rename(data / "dev" / side / "0002.wav", data / "dev" / side / f"{odd}.wav")
    result = evaluate(model, find_pairs(data), tmp_path / "out3", dnsmos=False, progress=False, log=None)
    assert result["n_evaluated"] == 3 and odd in [
        r["name"] for r in read_csv(tmp_path / "out3" / "per_file.csv")
    ]
    assert b"take\xff" in (tmp_path / "out3" / "per_file.csv").read_bytes()


def test_main_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model-config", "tiny", "--out", str(tmp_path / "out"), "--no-dnsmos"]
    assert main([*args, "--pairs", str(tmp_path)]) == 2
    assert "no known test-set layout" in capsys.readouterr().err
    data = make_dev_set(tmp_path / "data", n=1, seconds=0.5)
    assert main(["--model-config", "no-such-model", "--pairs", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "unknown model config" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # an argparse usage error
        main(["--pairs", str(data), "--out", str(tmp_path / "o")])  # neither --checkpoint nor --model-config
    assert exit_.value.code == 2
    assert "error: one of the arguments --checkpoint --model-config is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model-config", "tiny", "--pairs", str(data), "--out", str(tmp_path / "o"), "--threads", "0"])
    assert "--threads: must be at least 1, got 0" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("x")  # found before the evaluation runs, not after it
    assert main(["--model-config", "tiny", "--pairs", str(data), "--out", str(tmp_path / "a-file")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    tiny = ["--model-config", "tiny", "--pairs", str(data), "--out", str(tmp_path / "o")]
    # "auto" passed the check, then failed in torch.device with its own message
    for device in ("auto", "gpu"):
        assert main([*tiny, "--device", device]) == 2
        assert f"--device {device}: use cpu, cuda or cuda:N (or mps)" in capsys.readouterr().err
    # nothing could be scored: exit 1 and the folder's earlier reports are kept (they were replaced by empty ones,
    # which recipes.compare then reused as a fresh evaluation)
    out = tmp_path / "kept"
    assert main(["--model-config", "tiny", "--pairs", str(data), "--out", str(out), "--no-dnsmos"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for noisy in (data / "dev" / "noisy").glob("*.flac"):
        noisy.write_bytes(b"RIFF not really a wav file")
    assert main(["--model-config", "tiny", "--pairs", str(data), "--out", str(out), "--no-dnsmos"]) == 1
    assert "no file could be evaluated; nothing written" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_evaluate_can_score_at_an_attenuation_limit(tmp_path: Path) -> None:
    """``--max-attenuation-db`` scores a training checkpoint (no limit) the way the export bundles it; 'inf'
    removes a limit; nonsense is a usage error."""
    from models import Enhancer, get_config, save_checkpoint
    from recipes.evaluate import build_parser, load_model

    ckpt = tmp_path / "m.safetensors"
    save_checkpoint(ckpt, Enhancer(get_config("tiny")), "tiny")
    parser = build_parser()
    base = ["--checkpoint", str(ckpt), "--pairs", "p", "--out", "o"]
    assert load_model(parser.parse_args(base)).cfg.max_attenuation_db is None
    assert load_model(parser.parse_args([*base, "--max-attenuation-db", "20"])).cfg.max_attenuation_db == 20.0
    limited = tmp_path / "l.safetensors"
    save_checkpoint(limited, load_model(parser.parse_args([*base, "--max-attenuation-db", "12"])), "tiny")
    relimited = ["--checkpoint", str(limited), "--pairs", "p", "--out", "o"]
    assert load_model(parser.parse_args(relimited)).cfg.max_attenuation_db == 12.0
    assert (
        load_model(parser.parse_args([*relimited, "--max-attenuation-db", "inf"])).cfg.max_attenuation_db
        is None
    )
    # the same rule as enhance-cli's flag and the model's own check: 0 dB (never below the noisy input) is a limit
    assert load_model(parser.parse_args([*base, "--max-attenuation-db", "0"])).cfg.max_attenuation_db == 0.0
    for bad in ("-3", "nan", "loud"):
        with pytest.raises(SystemExit):
            parser.parse_args([*base, "--max-attenuation-db", bad])


def test_summary_rows_are_means_over_the_same_files() -> None:
    """A metric that fails for one system on a file (PESQ of a muted output) leaves that file out of every row's
    mean for that metric, not only the failing system's (which would flatter it); n_failed still counts it."""
    from recipes.evaluate import summarize

    nan = float("nan")
    rows = [
        {"name": "a", "system": "noisy", "pesq": 1.0, "stoi": 0.5},
        {"name": "a", "system": "enhanced", "pesq": nan, "stoi": 0.6},
        {"name": "b", "system": "noisy", "pesq": 2.0, "stoi": 0.7},
        {"name": "b", "system": "enhanced", "pesq": 3.0, "stoi": 0.8},
    ]
    out = summarize(rows, ("pesq", "stoi"), keys=("pesq", "stoi"))
    assert out["noisy"]["pesq"] == 2.0 and out["enhanced"]["pesq"] == 3.0  # file b only
    assert out["noisy"]["stoi"] == pytest.approx(0.6) and out["enhanced"]["stoi"] == pytest.approx(0.7)
    assert (out["noisy"]["n_failed"], out["enhanced"]["n_failed"]) == (0, 1)
    # a system that failed on every file is NaN itself and does not blank the others' means
    broken = [{"name": n, "system": "broken", "pesq": nan, "stoi": nan} for n in ("a", "b")]
    out = summarize(rows + broken, ("pesq", "stoi"), ("noisy", "enhanced", "broken"), ("pesq", "stoi"))
    assert out["noisy"]["pesq"] == 2.0 and out["enhanced"]["stoi"] == pytest.approx(0.7)
    assert math.isnan(out["broken"]["pesq"]) and out["broken"]["n_failed"] == 2


def test_a_pair_whose_lengths_differ_is_named_in_the_reports_and_skipped_in_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 0.5-s clean file beside a 1.8-s noisy one (mis-paired) was scored on its first 0.5 s and only counted
    in files_converted; validation during training kept it without a word."""
    data = make_dev_set(tmp_path / "data", n=2, seconds=1.8)
    write(data / "dev" / "clean" / "0001.flac", speech_like(0.5, seed=1))
    out = tmp_path / "eval"
    assert main(["--model-config", "tiny", "--pairs", str(data), "--out", str(out), "--no-dnsmos"]) == 0
    err = capsys.readouterr().err
    assert "warning: 0001: noisy 1.80 s and clean 0.50 s: lengths differ by more than 5%" in err
    report = json.loads((out / "summary.json").read_text())
    assert [m["name"] for m in report["length_mismatched"]] == ["0001"] and report["n_evaluated"] == 2
    assert "lengths differ" in (out / "summary.md").read_text()
    from recipes.datasets import load_val_pairs

    kept, skipped = load_val_pairs(str(data))
    assert [p.name for p in kept] == ["0000"]
    assert len(skipped) == 1 and "mis-paired" in skipped[0].reason


def test_files_without_a_partner_are_recorded_in_the_reports(tmp_path: Path) -> None:
    """They were only printed on stderr: the reports could lose files without a word."""
    data = make_dev_set(tmp_path / "data", n=2, seconds=1.5)
    write(data / "dev" / "noisy" / "0099.flac", noisy_version(speech_like(1.0, seed=9)))  # no clean twin
    out = tmp_path / "eval"
    assert main(["--model-config", "tiny", "--pairs", str(data), "--out", str(out), "--no-dnsmos"]) == 0
    report = json.loads((out / "summary.json").read_text())
    assert len(report["unpaired"]) == 1 and "0099" in report["unpaired"][0]
    summary = (out / "summary.md").read_text()
    assert "Left out, no partner found (1)" in summary and "0099" in summary
    assert report["n_evaluated"] == 2
    assert {r["n_unpaired"] for r in read_csv(out / "summary.csv")} == {"1"}


def test_files_whose_metrics_fail_are_named_with_the_reason(tmp_path: Path) -> None:
    """n_failed counted a pair with a silent clean side (and a silent input) without naming it or saying why."""
    data = make_dev_set(tmp_path / "data", n=3, seconds=1.5)
    write(data / "dev" / "clean" / "0001.flac", np.zeros(24000, np.float32))
    write(data / "dev" / "noisy" / "0002.flac", np.zeros(24000, np.float32))
    out = tmp_path / "eval"
    assert main(["--model-config", "tiny", "--pairs", str(data), "--out", str(out), "--no-dnsmos"]) == 0
    report = json.loads((out / "summary.json").read_text())
    failed = {(f["name"], f["system"]): f for f in report["failed"]}
    assert failed[("0001", "noisy")]["reason"] == "the clean reference is silent (all zeros)"
    assert set(failed[("0001", "noisy")]["metrics"]) == {"pesq", "stoi", "si_sdr"}
    assert failed[("0002", "noisy")]["reason"] == "the scored signal is silent (all zeros)"
    # a silent input's SI-SDR is NaN too, as its PESQ (the eps made it 0 dB, inside the noisy mean)
    assert "si_sdr" in failed[("0002", "noisy")]["metrics"]
    summary = (out / "summary.md").read_text()
    assert (
        "Metrics not computed" in summary
        and "0001, noisy: pesq, stoi, si_sdr: the clean reference" in summary
    )
    rows = {r["system"]: r for r in read_csv(out / "summary.csv")}
    assert rows["noisy"]["n_failed"] == str(len([k for k in failed if k[1] == "noisy"]))


def test_the_reports_are_written_as_a_set_before_a_ctrl_c_lands() -> None:
    """A Ctrl-C while the four reports were written left new files beside old ones; it is held back until they
    are all written, then raised."""
    import time

    from recipes.evaluate import sigint_deferred

    written = []
    # Python's own Ctrl-C handler, whatever this process was started with: a job put in the background by a
    # non-interactive shell starts with SIGINT ignored, and an ignored Ctrl-C stays ignored (no KeyboardInterrupt)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # a signal not held back would have been raised here
            written.append("all four")
    finally:
        signal.signal(signal.SIGINT, outer)
    assert written == ["all four"]


def test_an_ignored_ctrl_c_stays_ignored_after_the_reports() -> None:
    """Run where SIGINT is ignored (nohup-style background jobs), the held-back Ctrl-C is dropped, not raised, and
    the ignoring disposition is put back."""
    import time

    from recipes.evaluate import sigint_deferred

    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)
