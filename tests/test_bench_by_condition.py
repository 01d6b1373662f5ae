"""bench/bench_by_condition.py as a subprocess on hand-made score tables whose means are known."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_by_condition.py"


def _write(path: Path, columns: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)
    return path


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_means_per_condition_and_system(tmp_path: Path) -> None:
    scores = _write(
        tmp_path / "per_file.csv",
        ["name", "system", "pesq", "stoi"],
        [
            ["a", "noisy", 1.0, 0.5],
            ["a", "tim", 2.0, 0.7],
            ["b", "noisy", 3.0, "nan"],  # a failed metric is left out of the mean, not counted as 0
            ["b", "tim", 4.0, 0.9],
            ["c", "noisy", 1.5, 0.8],
            ["c", "tim", 2.5, 0.6],
        ],
    )
    pairs = _write(
        tmp_path / "pairs.csv",
        ["name", "snr_db", "noise_file"],
        [
            ["a", 10, "noise/dev/cars/x.flac"],
            ["b", 0, "noise/dev/cars/y.flac"],
            ["c", 10, "noise/dev/fans/z.flac"],
        ],
    )
    out = tmp_path / "out"
    r = _run("--per-file", scores, "--pairs-csv", pairs, "--metrics", "pesq,stoi", "--out", out)
    assert r.returncode == 0, r.stderr
    with open(out / "summary.csv", newline="") as f:
        rows = {(row["metric"], row["system"]): row for row in csv.DictReader(f)}
    assert list(next(iter(rows.values())).keys()) == ["metric", "system", "0", "10"]  # numeric order
    assert float(rows[("pesq", "tim")]["10"]) == 2.25 and float(rows[("pesq", "tim")]["0"]) == 4.0
    assert float(rows[("stoi", "noisy")]["10"]) == 0.65
    assert rows[("stoi", "noisy")]["0"] == "nan"
    text = (out / "summary.md").read_text()
    assert "snr_db=0 (n=1) | snr_db=10 (n=2)" in text and "| stoi | noisy | – | 0.650 |" in text

    r = _run("--per-file", scores, "--pairs-csv", pairs, "--by", "noise_source", "--metrics", "pesq")
    assert r.returncode == 0, r.stderr
    assert "| pesq | noisy | 2.000 | 1.500 |" in r.stdout  # cars: a, b; fans: c


def test_bad_inputs_are_reported_not_crashed(tmp_path: Path) -> None:
    scores = _write(
        tmp_path / "per_file.csv", ["name", "system", "pesq"], [["a", "tim", 2.0], ["z", "tim", 1.0]]
    )
    pairs = _write(tmp_path / "pairs.csv", ["name", "snr_db"], [["a", 5]])
    r = _run("--per-file", scores, "--pairs-csv", pairs, "--metrics", "pesq", "--out", tmp_path / "out")
    assert r.returncode == 2 and "1 scored files have no row in the pairs CSV (first: z)" in r.stderr
    assert not (tmp_path / "out").exists()
    r = _run("--per-file", scores, "--pairs-csv", pairs, "--by", "room", "--metrics", "pesq")
    assert r.returncode == 2 and "the pairs CSV has no column room" in r.stderr
    r = _run("--per-file", tmp_path / "absent.csv", "--pairs-csv", pairs)
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "latin1.csv").write_bytes(b"name,system,pesq\n\xff\xfe,tim,1.0\n")
    r = _run("--per-file", tmp_path / "latin1.csv", "--pairs-csv", pairs, "--metrics", "pesq")
    assert r.returncode == 2 and "not a readable CSV" in r.stderr and "Traceback" not in r.stderr


def test_low_freq_refs_marks_the_references_that_are_mostly_rumble(tmp_path: Path) -> None:
    """bench/low_freq_refs.py: the condition column that splits SI-SDR by references mostly below 60 Hz."""
    import numpy as np

    from tests.audio_trees import dev_pairs
    from tests.conftest import speech_like

    speech = speech_like(1.0, 16000, seed=1).astype(np.float32)
    t = np.arange(16000) / 16000
    rumble = (0.1 * speech + 0.5 * np.sin(2 * np.pi * 30 * t)).astype(np.float32)  # mostly 30 Hz
    pairs = dev_pairs(tmp_path / "pairs", [speech, rumble, speech], 0.01, seed=0)
    (next(pairs.rglob("clean/0002.*"))).write_bytes(
        b"RIFF broken"
    )  # skipped with its reason (was a traceback)
    out = tmp_path / "lf.csv"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "low_freq_refs.py"), "--pairs", str(pairs), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "skipped 0002" in r.stderr
    assert "1 of 2 references have more than 50% of their energy below 60 Hz: 0001" in r.stdout
    with open(out, newline="") as f:
        rows = {row["name"]: row for row in csv.DictReader(f)}
    assert rows["0000"]["low_freq_heavy"] == "no" and float(rows["0000"]["low_freq_share"]) < 0.1
    assert rows["0001"]["low_freq_heavy"] == "yes" and float(rows["0001"]["low_freq_share"]) > 0.9
