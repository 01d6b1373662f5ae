"""Average the weights of checkpoints of one architecture (a "model soup", fairseq's ``average_checkpoints``):
``python -m recipes.average_checkpoints A.safetensors B.safetensors [...] [--weights 0.7 0.3] --out SOUP.safetensors``.

Useful for checkpoints of one training trajectory (the epochs of a run, or a fine-tune and the weights it started
from); checkpoints trained apart from different random starts do not average into a working model. Every input
must have the same model (name and constructor config, the attenuation limit aside); the weights default to equal and
must be positive. The result is written atomically with its sources and weights in the training metadata, and
keeps the first input's attenuation limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

from enhance.atomic_files import nearest_existing
from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from models.config_io import to_dict
from models.enhancer import EnhancerConfig
from recipes.interrupt import on_interrupt


def average(paths: list[str], weights: list[float] | None, out: str) -> None:
    if len(paths) < 2:
        raise ValueError("give at least two checkpoints to average")
    if weights is None:
        weights = [1.0 / len(paths)] * len(paths)
    total = sum(weights)
    # inf passed as positive (a NaN soup refused on load), and 1e308 twice overflowed the sum (an all-zero one)
    if len(weights) != len(paths) or not all(w > 0 for w in weights) or not math.isfinite(total):
        raise ValueError(f"--weights: need {len(paths)} positive finite numbers, got {weights}")
    weights = [w / total for w in weights]
    checkpoints = [load_checkpoint(p) for p in paths]
    first = checkpoints[0]
    for p, ck in zip(paths[1:], checkpoints[1:], strict=True):
        if ck.name != first.name or _network(ck.config) != _network(first.config):
            raise ValueError(f"{p}: model '{ck.name}' with another config than {paths[0]} ('{first.name}')")
    states = [ck.model.state_dict() for ck in checkpoints]
    soup = {}
    for k, v in states[0].items():
        if v.is_floating_point():
            soup[k] = sum(w * s[k].double() for w, s in zip(weights, states, strict=True)).to(v.dtype)
        else:
            soup[k] = v
    first.model.load_state_dict(soup)
    meta = {"averaged": [{"checkpoint": p, "weight": w} for p, w in zip(paths, weights, strict=True)]}
    save_checkpoint(out, first.model, first.name, meta)


def _network(cfg: EnhancerConfig) -> dict[str, Any]:
    """The config without the attenuation limit, a post-processing setting that does not shape the weights."""
    return to_dict(dataclasses.replace(cfg, max_attenuation_db=None))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tim-average-checkpoints",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoints", nargs="+", help=".safetensors checkpoints of one model config")
    p.add_argument(
        "--weights", type=float, nargs="+", help="one positive weight per checkpoint (default: equal)"
    )
    p.add_argument("--out", required=True, help="the averaged checkpoint to write")
    return p


@on_interrupt("tim-average-checkpoints", "nothing was written")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if Path(args.out).resolve() in {Path(c).resolve() for c in args.checkpoints}:
            raise ValueError(f"--out {args.out} is one of the inputs; write the average elsewhere")
        blocked = nearest_existing(Path(args.out).parent)
        # a folder, or a path under a file: tracebacks, after the work
        if Path(args.out).is_dir() or (blocked is not None and not blocked.is_dir()):
            raise ValueError(
                f"--out {args.out}: give a file path (a folder, or a path under a file, is not one)"
            )
        if blocked is not None and not os.access(blocked, os.W_OK):  # found before the work, not after
            raise ValueError(f"--out {args.out}: cannot write in {blocked}")
        average(args.checkpoints, args.weights, args.out)
    except (ValueError, CheckpointError) as exc:
        print(f"tim-average-checkpoints: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only file system or a full disk while writing: one line, not a traceback
        print(f"tim-average-checkpoints: error: writing {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
