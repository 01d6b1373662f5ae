"""The streaming step and engine of two checkouts of this repository, timed alternately in one process.

    git worktree add /tmp/base <revision>          # the code to compare against
    python bench/bench_revisions.py --base /tmp/base [--backends torchscript,onnxruntime,native-int8,...]
        [--rounds 30] [--seconds 4] [--out bench/results/revisions.md]

A change to the model's code that is meant to make streaming faster (fewer operations in the traced or exported
step, say) moves the time per hop by a few per cent, while single runs on a shared machine drift by tens of per
cent. So this builds each backend from both checkouts (each checkout's own ``models`` and ``enhance`` code and its
bundled default model, imported apart), then in every round times each (backend, checkout) in turn:

* the step alone, one new frame per call (the backend's ``run`` on a full ring, or the C step's ``step``; ms per
  call);
* the whole streaming engine fed 16 ms and 32 ms chunks of a test signal (real-time factor).

Rows give each checkout's fastest round and the median over rounds of the per-round ratio current / base (the
statistic least moved by a slow spell, which hits both sides of a round alike); which checkout goes first
alternates from round to round. Each backend's engine outputs from the two checkouts are also compared (largest
absolute difference, with the signal fed in one call and one 16-ms hop at a time): a change meant only for speed
should give the same samples to float32 rounding. One CPU thread. Prints a Markdown table and writes it to ``--out``.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # one thread, set before numpy, torch and onnxruntime are imported

import argparse
import datetime
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # bench/ (not a package)

from bench_streaming import test_signal  # noqa: E402  (imports no repository module)
from machine import cpu_summary  # noqa: E402  (imports no repository module)

PACKAGES = ("models", "enhance", "recipes")
MEASURES = ("step, 1 frame (ms per call)", "engine, 16-ms chunks (RTF)", "engine, 32-ms chunks (RTF)")


@dataclass
class Side:
    """One backend built from one checkout: what is timed, and its engine's output on the test signal."""

    step: Callable[[], object]
    engine: Any  # that checkout's StreamingEnhancer
    output: np.ndarray  # [2, channels, samples]: the signal in one call, and in 16-ms chunks


def revision(root: Path) -> str:
    """The checkout's commit (and '+changes' when its tree differs from it), for the table's heading."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def load_sides(root: Path, backends: list[str], signal: np.ndarray) -> dict[str, Side]:
    """Every backend built by ``root``'s own code, which is then forgotten by ``sys.modules`` (the objects keep
    their modules alive), so that the next checkout imports its own."""
    sys.path.insert(0, str(root))
    try:
        from enhance.backends import streaming_backend
        from enhance.streaming import StreamingEnhancer
        from models.pretrained import load_pretrained

        model = load_pretrained("default").model.float().eval()
        sides = {}
        for name in backends:
            backend = streaming_backend(model, name)
            engine = StreamingEnhancer(model, backend=backend)
            # the whole signal in one call (the multi-frame step) and one 16-ms hop at a time (the one-frame path)
            whole = np.concatenate([engine.process(signal), engine.flush()], axis=1)
            hops = [engine.process(signal[:, i : i + 256]) for i in range(0, signal.shape[1], 256)]
            output = np.stack([whole, np.concatenate([*hops, engine.flush()], axis=1)])
            sides[name] = Side(one_frame_step(backend, model), engine, output)
        return sides
    finally:
        sys.path.remove(str(root))
        for key in [k for k in sys.modules if k.split(".")[0] in PACKAGES]:
            del sys.modules[key]


def one_frame_step(backend: Any, model: Any) -> Callable[[], object]:
    """One new frame per call on a full ring: the fixed-shape steps' ``run`` on a zero feed, or the C step's
    ``step`` on a state that has seen the context's worth of noise features (its ring full, its position moving)."""
    n_bins, context = model.cfg.pre_encoder.n_bins, model.cfg.context_frames
    if hasattr(backend, "run"):
        feed = {
            "feat": torch.zeros(1, 1, n_bins),
            "mask": torch.zeros(1, context + 1),
            **backend.new_state(1).channels[0],
        }
        return lambda: backend.run(feed)
    feats = torch.rand(1, context + 2, n_bins, generator=torch.Generator().manual_seed(0)) * 3
    _, state = backend.step(feats[:, :-1], None)
    return lambda: backend.step(feats[:, -1:], state)


def step_ms(step: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return 1000.0 * (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="a checkout of the revision to compare against")
    ap.add_argument("--current", default=str(ROOT), help="the other checkout (default: this one)")
    ap.add_argument("--backends", default="torchscript,onnxruntime,onnxruntime-int8")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=40, help="step calls per round")
    ap.add_argument("--seconds", type=float, default=4.0, help="test signal for the engine rows")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "revisions.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    backends = [b for b in args.backends.split(",") if b]
    signal = test_signal(args.seconds)[None]
    roots = {"base": Path(args.base).resolve(), "current": Path(args.current).resolve()}
    for key, root in roots.items():
        if not (root / "models" / "static_step.py").is_file():
            ap.error(f"--{key} {root} is not a checkout of tim-enhance (no models/static_step.py)")
    sides = {key: load_sides(root, backends, signal) for key, root in roots.items()}
    # only now: bench_chunk_sizes imports this checkout's modules, which the sides must not see
    from bench_chunk_sizes import rtf as engine_rtf

    times: dict[tuple[str, str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for name in backends:
            for key in list(roots)[:: 1 if round_ % 2 == 0 else -1]:  # who goes first alternates
                side = sides[key][name]
                measured = (
                    step_ms(side.step, args.calls),
                    engine_rtf(side.engine, signal, 256),
                    engine_rtf(side.engine, signal, 512),
                )
                for measure, value in zip(MEASURES, measured, strict=True):
                    times.setdefault((name, measure, key), []).append(value)

    lines = [
        f"Two checkouts timed alternately, one CPU thread, {cpu_summary()}, "
        f"{datetime.date.today().isoformat()}. Base {revision(roots['base'])}, current "
        f"{revision(roots['current'])}. Command: `python bench/bench_revisions.py "
        f"{shlex.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"{args.rounds} rounds; each checkout's fastest round, and the median over rounds of current / base "
        f"within a round. Engine rows: a {args.seconds:g}-s test signal. Outputs: the largest absolute difference "
        "between the two checkouts' engine outputs on it (fed whole and in 16-ms chunks).",
        "",
        "| backend | what | base | current | current / base (median of rounds) | outputs differ by |",
        "|---|---|---|---|---|---|",
    ]
    for name in backends:
        diff = float(np.abs(sides["base"][name].output - sides["current"][name].output).max())
        for measure in MEASURES:
            base, current = times[(name, measure, "base")], times[(name, measure, "current")]
            ratio = statistics.median(c / b for b, c in zip(base, current, strict=True))
            lines.append(
                f"| {name} | {measure} | {min(base):.3f} | {min(current):.3f} | {ratio:.3f} | {diff:.1e} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
