"""recipes.compare end to end on generated folders with tiny models: runs, evaluation, table, curves, re-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipes.compare import build_parser, check_settings, rounds
from recipes.compare import main as compare_main
from tests.audio_trees import FolderTree, build_folders


def _write_data_config(tmp_path: Path) -> FolderTree:
    """Generated speech/noise/dev folders under tmp_path/data and tmp_path/data.json pointing at them."""
    tree = build_folders(tmp_path / "data")
    data = {
        "data": {
            "recipe": "folders",
            "speech": [str(tree.speech)],
            "noise": [str(tree.noise)],
            "val_pairs": str(tree.dev),
            "mixing": {"segment_seconds": 1.0},
        },
        "train": {"batch_size": 2},
    }
    (tmp_path / "data.json").write_text(json.dumps(data))
    return tree


def test_compare_trains_evaluates_and_tabulates_each_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _write_data_config(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative paths mean the caller's folder, in the training children too
    args = ["--out", "cmp", "--config", "data.json", "--configs", "tiny"]
    args += ["tiny-transformer", "--epochs", "2", "--steps-per-epoch", "2", "--threads", "1"]
    assert compare_main(args) == 0
    table = (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
    assert table[0].startswith(
        "| system | val loss by epoch | best val loss | pesq | stoi | si_sdr | files |"
    )
    assert table[2].startswith("| noisy input |") and f"| {tree.n_dev} |" in table[2]
    rows = {line.split("|")[1].strip(): line for line in table[3:]}
    assert set(rows) == {"`tiny`", "`tiny-transformer`"}
    for name in ("tiny", "tiny-transformer"):
        cells = [c.strip() for c in rows[f"`{name}`"].split("|")[1:-1]]
        curve = [float(v) for v in cells[1].split(",")]
        assert len(curve) == 2 and float(cells[2]) == min(curve)
        assert all(c not in ("nan", "–") for c in cells[3:6])  # PESQ, STOI, SI-SDR finite
        assert (tmp_path / "cmp" / name / "eval" / "summary.json").is_file()
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 1000
    # running again keeps the finished runs (nothing retrained) and gives the same table
    before = (tmp_path / "cmp" / "tiny" / "last.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert compare_main(args) == 0
    assert "2 epochs already done" in capsys.readouterr().out
    assert (tmp_path / "cmp" / "tiny" / "last.safetensors").stat().st_mtime_ns == before
    assert (tmp_path / "cmp" / "comparison.md").read_text().splitlines() == table
    # more epochs extend the finished run (resumed, not restarted)
    longer = [*args[:5], "tiny", "--epochs", "3", "--steps-per-epoch", "2", "--threads", "1"]
    assert compare_main(longer) == 0
    assert "--resume --epochs 3" in capsys.readouterr().out
    curve = (tmp_path / "cmp" / "comparison.md").read_text().splitlines()[3].split("|")[2]
    assert len(curve.split(",")) == 3
    summary = (
        tmp_path / "cmp" / "tiny" / "eval" / "summary.json"
    )  # re-evaluated if the best checkpoint changed
    assert summary.stat().st_mtime_ns >= (tmp_path / "cmp" / "tiny" / "best.safetensors").stat().st_mtime_ns
    # both again at 2 epochs: tiny keeps its 3, and the table says the runs differ
    assert compare_main(args) == 0
    assert (
        "different numbers of epochs (`tiny` 3, `tiny-transformer` 2)"
        in (tmp_path / "cmp" / "comparison.md").read_text()
    )


def test_compare_refuses_to_mix_settings_in_one_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"train": {"batch_size": 2}}))
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"configs": [{}], "steps_per_epoch": 2, "seed": 0}))
    # an attempt that trained nothing (a typo in a data path) does not hold the folder to its settings: the
    # corrected command was refused ("holds runs trained with other settings", with no run in it)
    args = build_parser().parse_args(
        ["--out", str(out), "--config", str(data), "--configs", "tiny", "--epochs", "1"]
    )
    check_settings(args)
    assert json.loads((out / "settings.json").read_text())["configs"] == [{"train": {"batch_size": 2}}]
    (out / "settings.json").write_text(json.dumps({"configs": [{}], "steps_per_epoch": 2, "seed": 0}))
    (out / "transformer").mkdir()
    # a run was trained with those: finished and without its state.pt (copied, or cleaned to save space)
    (out / "transformer" / "metrics.csv").write_text("epoch\n1\n")
    code = compare_main(["--out", str(out), "--config", str(data), "--configs", "tiny", "--epochs", "1"])
    assert code == 1
    assert "other settings" in capsys.readouterr().err
    assert not (out / "tiny").exists()
    # a comparison started before runs trained through the DC blocker (no such key: its runs resume without it)
    # is not continued with new runs that would train with it
    same = {"configs": [{"train": {"batch_size": 2}}], "steps_per_epoch": None, "seed": 0}
    (out / "settings.json").write_text(json.dumps(same))
    code = compare_main(["--out", str(out), "--config", str(data), "--configs", "tiny", "--epochs", "1"])
    assert code == 1
    assert "trained without the DC blocker" in capsys.readouterr().err
    assert not (out / "tiny").exists()


def test_compare_reports_a_failed_run_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.json"
    args = ["--configs", "tiny", "--epochs", "1"]
    assert compare_main(["--out", str(tmp_path / "a"), "--config", str(missing), *args]) == 1
    err = capsys.readouterr().err
    assert "tim-compare: error:" in err and "nowhere.json" in err and "Traceback" not in err
    broken = tmp_path / "broken.json"  # the training itself fails: no speech folder
    none = str(tmp_path / "none")
    broken.write_text(json.dumps({"data": {"recipe": "folders", "speech": [none], "val_pairs": none}}))
    assert compare_main(["--out", str(tmp_path / "b"), "--config", str(broken), *args]) == 1
    assert "tim-compare: error: tiny" in capsys.readouterr().err


def test_compare_without_pairs_is_refused_before_any_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DNS or VoiceBank config validates on held-out mixes and names no pairs: the first config trained in
    full, then the comparison failed with nothing to evaluate on."""
    dns = tmp_path / "dns.json"
    dns.write_text(json.dumps({"data": {"recipe": "dns", "root": str(tmp_path / "DNS")}}))
    out = tmp_path / "cmp"
    assert compare_main(["--out", str(out), "--config", str(dns), "--configs", "tiny", "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert "tim-compare: error: nothing to evaluate the runs on: give --pairs" in err
    assert not (out / "tiny").exists()
    # --skip-training on a folder without runs says so (it was "[Errno 2] No such file or directory")
    code = compare_main(
        ["--out", str(out), "--pairs", str(tmp_path), "--configs", "tiny", "--epochs", "1", "--skip-training"]
    )
    assert code == 1 and "no run in" in capsys.readouterr().err


def test_round_epochs_bring_every_config_level_before_any_goes_further(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rounds(5, 2) == [2, 4, 5] and rounds(4, 2) == [2, 4]
    assert rounds(3, None) == [3] and rounds(3, 7) == [3]
    _write_data_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["--out", "cmp", "--config", "data.json", "--configs", "tiny", "tiny-transformer"]
    args += ["--epochs", "2", "--round-epochs", "1", "--steps-per-epoch", "1", "--threads", "1"]
    assert compare_main(args) == 0
    out = capsys.readouterr().out
    starts = [line for line in out.splitlines() if line.startswith("[compare]") and "recipes.train" in line]
    assert len(starts) == 4
    assert "tiny:" in starts[0] and "--epochs 1" in starts[0]
    assert "tiny-transformer:" in starts[1] and "--epochs 1" in starts[1]
    assert "tiny:" in starts[2] and "--resume --epochs 2" in starts[2]
    assert "tiny-transformer:" in starts[3] and "--resume --epochs 2" in starts[3]
    # a table after each round: the first with one epoch per run, the last with two
    tables = out.count("| system | val loss by epoch |")
    assert tables == 2
    final = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "different numbers of epochs" not in final
    for line in final.splitlines()[3:5]:
        assert len(line.split("|")[2].split(",")) == 2


def test_compare_refuses_zero_epochs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = compare_main(
        ["--out", str(tmp_path / "c"), "--configs", "tiny", "--epochs", "2", "--round-epochs", "0"]
    )
    assert code == 2 and "at least 1" in capsys.readouterr().err
    for flag in ("--threads", "--steps-per-epoch"):  # 0 was taken as "not given": all threads, whole epochs
        with pytest.raises(SystemExit):
            compare_main(["--out", str(tmp_path / "c"), "--configs", "tiny", "--epochs", "2", flag, "0"])
        assert f"{flag}: must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_the_table_averages_every_row_over_the_same_files(tmp_path: Path) -> None:
    """Each run's own summary was a mean over the files where its metrics were finite: a model whose output made
    PESQ fail on one file was averaged over fewer files than the others, and the table did not say so."""
    import csv

    from recipes.compare import joint_summary
    from recipes.evaluate import METRIC_KEYS

    def per_file(run: str, pesq: dict[str, float]) -> None:
        folder = tmp_path / run / "eval"
        folder.mkdir(parents=True)
        with (folder / "per_file.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["name", "system", *METRIC_KEYS])
            w.writeheader()
            for name, value in pesq.items():
                base = {k: 0.5 for k in METRIC_KEYS}
                w.writerow({"name": name, "system": "noisy", **base, "pesq": 1.0})
                w.writerow({"name": name, "system": "enhanced", **base, "pesq": value})

    per_file("a", {"f1": 2.0, "f2": 2.0, "f3": 3.0})
    per_file("b", {"f1": 1.5, "f2": float("nan"), "f3": 2.5})  # its output failed PESQ on f2
    runs = {"a": tmp_path / "a", "b": tmp_path / "b"}
    joint = joint_summary({name: run / "eval" / "per_file.csv" for name, run in runs.items()}, dnsmos=False)
    assert joint["a"]["pesq"] == pytest.approx(2.5)  # over f1 and f3, as b: not 7/3 over all three
    assert joint["b"]["pesq"] == pytest.approx(2.0)
    assert joint["noisy"]["pesq"] == pytest.approx(1.0)
    assert joint["b"]["n_failed"] == 1
