"""bench/bench_pmsqe.py runs end to end on a tiny generated dev set with the tiny model, and its report has the
three tables with finite numbers."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

from tests.audio_trees import dev_pairs, speech
from tests.server_fixtures import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_bench_pmsqe_end_to_end(tmp_path: Path) -> None:
    pairs = dev_pairs(tmp_path / "pairs", [speech(2.0, seed=i) for i in range(3)], 0.02, seed=3)
    ckpt = tiny_checkpoint(tmp_path / "tiny.safetensors")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_pmsqe.py"), "--pairs", str(pairs), "--limit", "3"]
    cmd += ["--checkpoint", f"a={ckpt}", "--checkpoint", f"b={ckpt}", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=600)
    report = (out / "summary.md").read_text()
    rho = re.findall(r"^\| (published|PESQ order \(`as_pesq`\)) \| (\S+) \|$", report, re.M)
    assert [name for name, _ in rho] == ["published", "PESQ order (`as_pesq`)"]
    assert all(-1.0 <= float(v) <= 1.0 for _, v in rho)
    grads = re.findall(r"^\| (?:log1p MSE|PMSQE)[^|]* \| (\S+) \| (\S+) \| (\S+) \|$", report, re.M)
    assert len(grads) == 3 and all(math.isfinite(float(x)) and float(g[0]) > 0 for g in grads for x in g)
    levels = [line for line in report.splitlines() if line.startswith(("| a |", "| b |"))]
    assert len(levels) == 2 and levels[0] == levels[1].replace("| b |", "| a |")
    assert all(math.isfinite(float(v)) for v in levels[0].strip("|").split("|")[1:])
