"""bench/bench_quality.py end to end on a tiny generated test set, and the delay measurement it relies on.

The peers are optional (``pip install -e '.[bench]'``): the end-to-end run asks for the ones that can be built
here and the tiny model; a peer that is not installed is left out (and reported by the run, tested with a fake
one), so the test also runs without them.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import soundfile as sf

from tests.audio_trees import dev_pairs
from tests.conftest import in_bench_extra, speech_like
from tests.server_fixtures import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SCRIPT = BENCH / "bench_quality.py"
DELAY = 37  # samples, the delayed-identity calibration check
# .ci/run installs the peers (the bench extra) and sets this: a peer that cannot be built then fails, not skips
REQUIRE_PEERS = os.environ.get("TIM_REQUIRE_PEERS") == "1"
SUMMARY_COLUMNS = [
    "system",
    "status",
    "pesq",
    "stoi",
    "si_sdr",
    "dnsmos_sig",
    "dnsmos_bak",
    "dnsmos_ovrl",
    "rtf",
    "rtf_cpu",
    "latency_ms",
    "delay_ms",
    "delay_samples",
    "native_rate",
    "hop_ms",
    "n_files",
    "n_failed",
    "source",
]


def _bench_module(name: str) -> ModuleType:
    """``peers`` or ``bench_quality``, imported the way the command imports them (bench/ on sys.path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def peers() -> ModuleType:
    return _bench_module("peers")


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A dev-layout pairs tree (3 pairs of 2 s, noisy = clean + noise) and a tiny random checkpoint."""
    root = tmp_path_factory.mktemp("bench_quality")
    cleans = [speech_like(2.0, seed=i, f0=110.0 + 30 * i) for i in range(3)]
    pairs = dev_pairs(root / "pairs", cleans, 0.02, seed=7)
    ckpt = tiny_checkpoint(root / "tiny.safetensors")
    return pairs, ckpt


def _available_peers(peers: ModuleType) -> list[str]:
    """The default peers that can be built here: their packages are optional extras (``.[bench]``), so a missing
    one (ImportError, or OSError for a broken native library) is left out, unless ``TIM_REQUIRE_PEERS=1`` (set by
    ``.ci/run``, which installs them) says every peer must run. Any other error is a bug in its adapter and
    fails the test (every exception was taken for "not installed")."""
    names = []
    for name in peers.PEERS:
        try:
            peers.build_peer(name)
        except (ImportError, OSError):
            if REQUIRE_PEERS and in_bench_extra(peers.PEERS[name][1]):
                raise
            continue
        names.append(name)
    return names


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _md_systems(md: str) -> list[str]:
    """The first cell of every body row of the Markdown table."""
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    return [row.split("|")[1].strip() for row in rows[1:]]  # rows[0] is the header


# ------------------------------------------------------------------------------------------------------------
# delay measurement


@pytest.mark.parametrize("delay", [0, 1, 37, 480, 1599, 1600])
def test_measure_delay_finds_a_pure_delay(peers: ModuleType, delay: int) -> None:
    x = peers.calibration_signal(seconds=2.0)
    y = np.concatenate([np.zeros(delay, np.float32), x])[: len(x)]
    assert peers.measure_delay(x, y, 1600) == delay


def test_measure_delay_survives_gain_noise_and_filtering(peers: ModuleType) -> None:
    rng = np.random.default_rng(3)
    x = peers.calibration_signal(seconds=3.0, seed=5)
    y = np.convolve(x, [0.25, 0.5, 0.25])[: len(x)]  # a symmetric low-pass: its own delay is 1 sample
    y = 0.3 * np.concatenate([np.zeros(200, np.float32), y])[: len(x)]
    y = y + 0.01 * rng.standard_normal(len(y))
    assert peers.measure_delay(x, y, 1600) == 201
    assert peers.measure_delay(x, np.roll(y, 500), 300) <= 300  # lags beyond max_lag are never returned


def test_delayed_identity_and_alignment(peers: ModuleType) -> None:
    x = peers.calibration_signal(seconds=1.0)
    system = peers.build_peer(f"delay:{DELAY}")
    assert system.name == f"delay:{DELAY}" and isinstance(system, peers.System)
    y = system.enhance(np.pad(x, (0, DELAY)))
    assert peers.measure_delay(x, y, 1600) == DELAY
    np.testing.assert_array_equal(y[DELAY : DELAY + len(x)], x)


def test_a_system_whose_output_lacks_one_metric_keeps_its_row(peers: ModuleType) -> None:
    """A silent output has no PESQ (NaN: n_failed counts the file), but its STOI and SI-SDR are scores: the row
    was marked "failed on every file", blanked in summary.md and left out of the plot. Only a system that raised
    on every file is."""
    bq = _bench_module("bench_quality")
    entries = [
        bq.Entry(name=n, system=peers.build_peer("delay:0"), audio_s=2.0) for n in ("silent", "broken")
    ]
    scores = {"pesq": math.nan, "stoi": 0.0, "si_sdr": -50.0}
    means = {
        name: {**dict.fromkeys(bq.METRIC_KEYS, math.nan), **scores, "n_files": 2, "n_failed": 2}
        for name in ("silent", "broken")
    }
    rows = {r["system"]: r for r in bq.summary_rows(entries, means, {"broken": 2})}
    assert rows["silent"]["status"] == "ok" and rows["silent"]["stoi"] == 0.0
    assert rows["broken"]["status"] == "failed on every file"


def test_tim_system_is_aligned(peers: ModuleType, tiny_set: tuple[Path, Path]) -> None:
    system = peers.TimSystem("tiny", tiny_set[1])
    x = peers.calibration_signal(seconds=2.0)
    y = system.enhance(x)
    assert y.shape == x.shape and y.dtype == np.float32
    assert system.latency_ms == 48.0 and system.aligned
    assert peers.measure_delay(x, y, 1600) == 0


# ------------------------------------------------------------------------------------------------------------
# the command


def test_bench_quality_end_to_end(peers: ModuleType, tiny_set: tuple[Path, Path], tmp_path: Path) -> None:
    pairs, ckpt = tiny_set
    available = _available_peers(peers)
    systems = ["tiny", f"delay:{DELAY}", *available]
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--pairs",
        str(pairs),
        "--checkpoint",
        f"tiny={ckpt}",
        "--no-dnsmos",
        "--systems",
        ",".join(systems),
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = ["per_file.csv", "summary.csv", "summary.md"]
    if importlib.util.find_spec("matplotlib") is not None:  # the plot needs the viz/bench extra
        outputs.append("summary.png")
    for name in outputs:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name

    rows = _read_csv(out / "summary.csv")
    assert [r["system"] for r in rows] == ["noisy", *systems]
    assert list(rows[0]) == SUMMARY_COLUMNS
    by_name = {r["system"]: r for r in rows}
    for r in rows:
        assert r["status"] == "ok", r
        for key in ("pesq", "stoi", "si_sdr"):
            assert math.isfinite(float(r[key])), (r["system"], key, r[key])
        assert all(r[k] == "nan" for k in ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl"))  # --no-dnsmos
        assert int(r["n_files"]) == 3 and int(r["n_failed"]) == 0, r
        if r["system"] != "noisy":
            assert float(r["rtf"]) > 0 and float(r["rtf_cpu"]) > 0, r

    # the calibration check: its delay is found and removed, and then it scores exactly like the noisy input
    check = by_name[f"delay:{DELAY}"]
    assert abs(int(check["delay_samples"]) - DELAY) <= 1
    for key in ("pesq", "stoi", "si_sdr"):
        assert float(check[key]) == pytest.approx(float(rows[0][key]), abs=1e-6)
    tiny = by_name["tiny"]
    assert float(tiny["latency_ms"]) == 48.0 and int(tiny["delay_samples"]) == 0
    # a peer fed hop by hop: its documented latency is its hop plus the raw delay measured in this run
    for name in available:
        system = peers.build_peer(name)
        if system.streamed:
            derived = float(by_name[name]["hop_ms"]) + float(by_name[name]["delay_ms"])
            assert derived == pytest.approx(float(by_name[name]["latency_ms"]), abs=1.0), name

    per_file = _read_csv(out / "per_file.csv")
    assert len(per_file) == 3 * (1 + len(systems))
    md = (out / "summary.md").read_text()
    assert _md_systems(md) == ["noisy", *systems]
    assert "Command: `python " in md and "--systems" in md and "not run" not in md
    assert proc.stdout == md


def test_missing_peer_is_reported_not_fatal(tiny_set: tuple[Path, Path], tmp_path: Path) -> None:
    """A peer whose package cannot be imported is a "not run" row with the reason, and the run goes on. A
    stand-in package on PYTHONPATH fails to import, as an absent or broken one does (pyrnnoise: the module
    bench/peers.py imports for rnnoise)."""
    fake = tmp_path / "site" / "pyrnnoise"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('pyrnnoise stand-in: not installed')\n")
    pairs, ckpt = tiny_set
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--pairs", str(pairs), "--limit", "1", "--no-dnsmos"]
    cmd += ["--checkpoint", f"tiny={ckpt}", "--systems", f"tiny,rnnoise,delay:{DELAY}", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(fake.parent)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reason = "ImportError: pyrnnoise stand-in: not installed"
    assert f"warning: rnnoise not run: {reason}" in proc.stderr.splitlines()
    rows = _read_csv(out / "summary.csv")
    assert [r["system"] for r in rows] == ["noisy", "tiny", "rnnoise", f"delay:{DELAY}"]
    by_name = {r["system"]: r for r in rows}
    assert by_name["rnnoise"]["status"] == f"not run: {reason}"
    assert by_name["rnnoise"]["n_files"] == "0" and by_name["rnnoise"]["pesq"] == "nan"
    for name in ("noisy", "tiny", f"delay:{DELAY}"):  # the others are scored
        r = by_name[name]
        assert r["status"] == "ok" and r["n_files"] == "1" and r["n_failed"] == "0", r
        assert all(math.isfinite(float(r[k])) for k in ("pesq", "stoi", "si_sdr")), r
    assert {r["system"] for r in _read_csv(out / "per_file.csv")} == {"noisy", "tiny", f"delay:{DELAY}"}
    md = (out / "summary.md").read_text()
    assert f"| rnnoise | not run: {reason} |" in md
    assert _md_systems(md) == ["noisy", "tiny", "rnnoise", f"delay:{DELAY}"]


def test_bad_requests_are_refused_before_any_work(
    tiny_set: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each of these once ran to the end and printed a misleading table (or lost it) with exit 0 or 1; now each
    is exit 2 and one line that says what is wrong."""
    bench = _bench_module("bench_quality")
    pairs, ckpt = tiny_set
    argv = ["--pairs", str(pairs), "--limit", "1", "--no-dnsmos", "--systems", "tim-default,delay:100"]
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(32000, np.float32), 16000)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    missing = tmp_path / "missing.wav"
    out = ["--out", str(tmp_path / "o")]
    ours = ["--pairs", str(pairs), "--limit", "1", "--no-dnsmos", "--checkpoint", f"tiny={ckpt}", *out]
    for args, says in (
        (  # would have run the bundled model under that name
            [*argv, "--checkpoint", f"tim-default={ckpt}", *out],
            "--checkpoint name 'tim-default' is the bundled model's row (--model default); rename it",
        ),
        (  # no delay can be measured: peers were scored unaligned
            [*argv, "--calibration", str(silent), *out],
            f"--calibration {silent}: too short or too quiet to measure delays on (needs over 0.2 s of sound "
            "above -60 dBFS RMS)",
        ),
        (  # was replaced by the generated signal silently
            [*argv, "--calibration", str(missing), *out],
            f"--calibration: {missing}: no such file",
        ),
        (  # failed after the whole run
            [*argv, "--out", str(a_file)],
            f"--out {a_file}: {a_file} exists and is not a folder",
        ),
        (  # under a file: a NotADirectoryError traceback after the whole run
            [*argv, "--out", str(a_file / "sub")],
            f"--out {a_file / 'sub'}: {a_file} exists and is not a folder",
        ),
        (
            [*ours, "--systems", "tiny,nonexistent"],
            "unknown system 'nonexistent' (known: tim-default, tiny, ",
        ),
        ([*ours, "--checkpoint", "tiny=x"], "--checkpoint name 'tiny' given twice"),
    ):
        assert bench.main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"error: {says}") and err.count("\n") == 1, (args, err)
    assert not (tmp_path / "o").exists()


def test_a_run_that_scores_nothing_leaves_earlier_results(
    tiny_set: tuple[Path, Path], tmp_path: Path
) -> None:
    bench = _bench_module("bench_quality")
    pairs, _ = tiny_set
    out = tmp_path / "out"
    argv = ["--no-dnsmos", "--systems", "delay:100", "--out", str(out)]
    assert bench.main(["--pairs", str(pairs), "--limit", "1", *argv]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad"
    for side in ("noisy", "clean"):
        (bad / side).mkdir(parents=True)
        (bad / side / "x.wav").write_bytes(b"RIFF broken")
    assert bench.main(["--pairs", str(bad), *argv]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_mispaired_or_multichannel_pair_is_said_in_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pair whose sides differ in length was scored on the shorter one without a word, and a stereo pair on its
    channel 0 (as recipes.evaluate scores them, which says so): the table's notes and stderr say it now."""
    bench = _bench_module("bench_quality")
    pairs = tmp_path / "pairs"
    clean = speech_like(2.0, seed=1)
    for side, x in (("clean", clean), ("noisy", np.concatenate([clean, clean[:16000]]) + 0.01)):
        (pairs / side).mkdir(parents=True, exist_ok=True)
        sf.write(pairs / side / "a.wav", x, 16000)
        sf.write(pairs / side / "b.wav", np.stack([clean, clean], axis=1), 16000)
    out = tmp_path / "out"
    assert bench.main(["--pairs", str(pairs), "--no-dnsmos", "--systems", "delay:0", "--out", str(out)]) == 0
    assert "warning: a: noisy 3.00 s and clean 2.00 s: lengths differ" in capsys.readouterr().err
    summary = (out / "summary.md").read_text()
    assert "- scored on the shorter length (mis-paired?): a: noisy 3.00 s and clean 2.00 s" in summary
    assert "- 1 pair(s) with more than one channel: channel 0 enhanced and scored" in summary


def test_logmmse_stays_aligned_past_its_one_minute_pieces(peers: ModuleType) -> None:
    """The package's entry point works in 60-s pieces, each of which came back 320 samples short: past the first
    minute of a file the output was 20 ms early, which the delay calibrated on a short signal cannot see."""
    if not REQUIRE_PEERS:
        pytest.importorskip("logmmse")
    rate, n = 16000, 16000 * 66
    rng = np.random.default_rng(0)
    t = np.arange(n) / rate
    bursts = (np.sin(2 * np.pi * 0.7 * t) > 0) * rng.standard_normal(
        n
    )  # broadband: one sharp correlation peak
    x = (0.3 * bursts + 0.01 * rng.standard_normal(n)).astype(np.float32)
    y = peers.build_peer("logmmse").enhance(x).astype(np.float64)
    assert len(y) == n
    for start in (10, 62):  # in the first piece and past it
        seg = slice(start * rate, (start + 3) * rate)
        best = max(range(-800, 801), key=lambda d: float(np.dot(x[seg], y[seg.start + d : seg.stop + d])))
        assert best == 0, (start, best)
