"""The model a benchmark measures: ``--model NAME`` (a bundled model, default ``default``) or ``--checkpoint PATH``.

One definition for the benchmarks that take one model, so they spell, document and pass it on alike.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.checkpoint import Checkpoint


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """``--model`` and ``--checkpoint``, one or the other."""
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--model", default="default", help="a bundled model (default: default)")
    g.add_argument("--checkpoint", help="a checkpoint file instead of a bundled model")


def model_cli_args(args: argparse.Namespace) -> list[str]:
    """The same choice as ``enhance-cli`` / ``enhance-server`` flags (for benchmarks that run them)."""
    return ["--checkpoint", args.checkpoint] if args.checkpoint else ["--model", args.model]


def model_label(args: argparse.Namespace) -> str:
    """How a table's header names the model: the checkpoint's path, or the bundled model's name quoted."""
    return str(args.checkpoint) if args.checkpoint else repr(args.model)


def load_model(args: argparse.Namespace) -> Checkpoint:
    """The chosen model, loaded (imports torch: call it after the parser, so ``--help`` stays quick)."""
    from models.checkpoint import load_checkpoint
    from models.pretrained import load_pretrained

    return load_checkpoint(args.checkpoint) if args.checkpoint else load_pretrained(args.model)
