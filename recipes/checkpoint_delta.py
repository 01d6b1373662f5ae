"""Carry fine-tuned checkpoints in half the bytes: a checkpoint's difference from the weights it started from, in
float16 (``python -m recipes.checkpoint_delta encode|decode BASE IN OUT``).

A lent machine hands back at most 64 MiB a call (README.md, "Training on a lent GPU"), and a float32 checkpoint of
the default model is 23.6 MB. A fine-tune moves its weights little from its start, so storing ``w - base`` in
float16 keeps each weight to float16's precision on its change (about 5e-4 of it), not on the weight itself as
float16 weights would: decoded, the weights differ from the originals by less than 1e-3 times the change plus
1e-7 (checked by the tests).

    # on the lent machine: 11.8 MB instead of 23.6 MB per epoch's weights
    python -m recipes.checkpoint_delta encode models/pretrained/default.safetensors run/last.safetensors ep5.delta
    # here: the weights back, in float32, with the original metadata
    python -m recipes.checkpoint_delta decode models/pretrained/default.safetensors ep5.delta ep5.safetensors

The delta file records the base's SHA-256; decoding with another base is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from models.checkpoint import file_sha256, write_safetensors
from recipes.interrupt import on_interrupt

DELTA_FORMAT = "tim-enhance-checkpoint-delta/1"


class DeltaError(Exception):
    """A delta that cannot be made or applied, with the reason."""


def _read(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118 (not iterable)
    except FileNotFoundError:
        raise DeltaError(f"{path}: no such file") from None
    except Exception as exc:  # safetensors raises several types for truncated or foreign files
        raise DeltaError(f"{path}: not a safetensors file ({exc})") from None


def encode(base: str | Path, checkpoint: str | Path, out: str | Path) -> None:
    """Write ``checkpoint - base`` in float16 (float tensors; others as they are) with ``checkpoint``'s metadata."""
    base_t, _ = _read(base)
    ck_t, meta = _read(checkpoint)
    if set(base_t) != set(ck_t) or any(base_t[k].shape != ck_t[k].shape for k in ck_t):
        raise DeltaError(f"{checkpoint}: its weights do not match {base} key for key and shape for shape")
    delta = {}
    for k, v in ck_t.items():
        if v.is_floating_point():
            d = (v.double() - base_t[k].double()).to(torch.float16)
            if not bool(torch.isfinite(d).all()):
                raise DeltaError(f"{checkpoint}: '{k}' moved too far from {base} for float16")
            delta[k] = d
        else:
            delta[k] = v
    meta = {**meta, "delta_format": DELTA_FORMAT, "delta_base_sha256": file_sha256(base)}
    write_safetensors(out, delta, meta)


def decode(base: str | Path, delta_path: str | Path, out: str | Path) -> None:
    """Rebuild the checkpoint: ``base + delta`` in the base's dtype, with the delta's original metadata."""
    delta, meta = _read(delta_path)
    if meta.get("delta_format") != DELTA_FORMAT:
        raise DeltaError(f"{delta_path}: not a checkpoint delta (format {meta.get('delta_format')!r})")
    want = meta.pop("delta_base_sha256", "")
    meta.pop("delta_format")
    if file_sha256(base) != want:
        raise DeltaError(f"{delta_path}: made against another base than {base} (SHA-256 {want[:12]}...)")
    base_t, _ = _read(base)
    tensors = {}
    for k, d in delta.items():
        b = base_t[k]
        tensors[k] = (b.double() + d.double()).to(b.dtype) if b.is_floating_point() else d
    write_safetensors(out, tensors, meta, durable=True)


@on_interrupt("tim-checkpoint-delta", "nothing was written")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tim-checkpoint-delta", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["encode", "decode"])
    p.add_argument("base", help="the checkpoint the fine-tune started from")
    p.add_argument("input", help="encode: the fine-tuned checkpoint; decode: the delta")
    p.add_argument("out")
    args = p.parse_args(argv)
    try:
        (encode if args.action == "encode" else decode)(args.base, args.input, args.out)
    except (DeltaError, OSError) as exc:
        print(f"tim-checkpoint-delta: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
