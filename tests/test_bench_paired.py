"""bench/bench_paired.py as a subprocess on hand-made per-file tables whose differences are known."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_paired.py"


def _table(path: Path, rows: list[tuple[str, str, object, object]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "system", "pesq", "stoi"])
        w.writerows(rows)
    return path


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_paired_differences_and_interval(tmp_path: Path) -> None:
    names = [f"{i:04d}" for i in range(20)]
    # base: pesq i/10; new: +0.2 on every file (a sure gain) and stoi equal but one NaN (left out of both means)
    base = _table(
        tmp_path / "a.csv", [(n, "tim", i / 10, 0.8) for i, n in enumerate(names)] + [("0000", "x", 9, 9)]
    )
    new_rows = [(n, "enhanced", i / 10 + 0.2, "nan" if i == 3 else 0.8) for i, n in enumerate(names)]
    new = _table(tmp_path / "b.csv", new_rows)
    out = tmp_path / "out"
    r = _run("--base", f"{base}:tim", "--new", f"{new}:enhanced", "--metrics", "pesq,stoi", "--out", out)
    assert r.returncode == 0, r.stderr
    with open(out / "summary.csv", newline="") as f:
        rows = {row["metric"]: row for row in csv.DictReader(f)}
    pesq, stoi = rows["pesq"], rows["stoi"]
    assert int(pesq["n"]) == 20 and int(stoi["n"]) == 19
    assert abs(float(pesq["diff"]) - 0.2) < 1e-9 and abs(float(pesq["base"]) - 0.95) < 1e-9
    # every paired difference is 0.2, so every resample's mean is too
    assert abs(float(pesq["ci_low"]) - 0.2) < 1e-9 and abs(float(pesq["ci_high"]) - 0.2) < 1e-9
    assert float(pesq["new_better_share"]) == 1.0 and float(stoi["new_better_share"]) == 0.0
    assert float(stoi["diff"]) == 0.0
    assert (
        "| pesq | 20 | 0.950 | 1.150 | +0.2000 | [+0.2000, +0.2000] | 100% |"
        in (out / "summary.md").read_text()
    )


def test_noisy_differences_give_an_interval_around_the_mean(tmp_path: Path) -> None:
    import numpy as np

    d = np.random.default_rng(1).normal(0.05, 0.1, 200)
    base = _table(tmp_path / "a.csv", [(f"f{i}", "s", 1.0, 0.5) for i in range(200)])
    new = _table(tmp_path / "b.csv", [(f"f{i}", "s", 1.0 + x, 0.5) for i, x in enumerate(d)])
    r = _run("--base", f"{base}:s", "--new", f"{new}:s", "--metrics", "pesq", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "o" / "summary.csv", newline="") as f:
        row = next(csv.DictReader(f))
    low, mean, high = float(row["ci_low"]), float(row["diff"]), float(row["ci_high"])
    se = d.std() / np.sqrt(len(d))
    assert low < mean < high and abs((high - low) - 2 * 1.96 * se) < 0.4 * 2 * 1.96 * se


def test_mismatched_or_bad_inputs_are_errors(tmp_path: Path) -> None:
    base = _table(tmp_path / "a.csv", [("a", "s", 1.0, 0.5), ("b", "s", 1.0, 0.5)])
    new = _table(tmp_path / "b.csv", [("a", "s", 1.0, 0.5), ("c", "s", 1.0, 0.5)])
    r = _run("--base", f"{base}:s", "--new", f"{new}:s", "--out", tmp_path / "o")
    assert r.returncode == 2 and "score different files (2 on one side only, first: b)" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _run("--base", f"{base}:nope", "--new", f"{new}:s")
    assert r.returncode == 2 and "no rows of system 'nope' (it has: s)" in r.stderr
    r = _run("--base", str(base), "--new", f"{new}:s")
    assert r.returncode == 2 and "expected FILE.csv:SYSTEM" in r.stderr
    r = _run("--base", f"{tmp_path / 'absent.csv'}:s", "--new", f"{new}:s")
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    r = _run("--base", f"{base}:s", "--new", f"{base}:s", "--metrics", "dnsmos_ovrl")
    assert r.returncode == 2 and "no column 'dnsmos_ovrl'" in r.stderr


def test_an_interval_does_not_depend_on_the_other_metrics(tmp_path: Path) -> None:
    import numpy as np

    d = np.random.default_rng(2).normal(0.0, 0.1, (50, 2))
    base = _table(tmp_path / "a.csv", [(f"f{i}", "s", 1.0, 0.5) for i in range(50)])
    new = _table(tmp_path / "b.csv", [(f"f{i}", "s", 1.0 + x, 0.5 + y) for i, (x, y) in enumerate(d)])
    got = []
    for order in ("pesq,stoi", "stoi,pesq", "pesq"):
        r = _run("--base", f"{base}:s", "--new", f"{new}:s", "--metrics", order, "--out", tmp_path / order)
        assert r.returncode == 0, r.stderr
        with open(tmp_path / order / "summary.csv", newline="") as f:
            got.append(next(row for row in csv.DictReader(f) if row["metric"] == "pesq")["ci_low"])
    assert len(set(got)) == 1


def test_system_names_with_colons(tmp_path: Path) -> None:
    """webrtc:1, delay:N and noisereduce:stationary are bench_quality's own row names."""
    rows = [
        ("a", "webrtc:1", 1.0, 0.5),
        ("b", "webrtc:1", 2.0, 0.6),
        ("a", "noisy", 0.5, 0.4),
        ("b", "noisy", 1.0, 0.5),
    ]
    table = _table(tmp_path / "q.csv", rows)
    r = _run(
        "--base", f"{table}:noisy", "--new", f"{table}:webrtc:1", "--metrics", "pesq", "--out", tmp_path / "o"
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("form", ["{i:04d}", "fileid_{i}"])
def test_skip_first_leaves_out_the_first_files_by_name(tmp_path: Path, form: str) -> None:
    """--skip-first N pairs only the files after the first N by name, in the natural order of --limit
    (fileid_2 before fileid_10; plain string order left fileid_10 and 11 out instead of 8 and 9): here the first 5
    have a gain of 1, the rest none, so the held-out difference is exactly 0."""
    names = [form.format(i=i) for i in range(12)]
    base = _table(tmp_path / "a.csv", [(n, "tim", 2.0, 0.8) for n in names])
    new = _table(tmp_path / "b.csv", [(n, "tim", 3.0 if i < 5 else 2.0, 0.8) for i, n in enumerate(names)])
    out = tmp_path / "out"
    r = _run(
        "--base", f"{base}:tim", "--new", f"{new}:tim", "--metrics", "pesq", "--skip-first", "5", "--out", out
    )
    assert r.returncode == 0, r.stderr
    with open(out / "summary.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["n"]) == 7 and float(row["diff"]) == 0.0
    assert "7 files matched by name (the first 5 by name left out)" in (out / "summary.md").read_text()
    bad = _run("--base", f"{base}:tim", "--new", f"{new}:tim", "--skip-first", "12")
    assert bad.returncode == 2 and "leaves no files" in bad.stderr
