"""Self-describing model checkpoints: one ``.safetensors`` file holding the weights and, in its metadata, the
format version, model name, constructor config, training metadata and software versions.

Loading is strict: a config this code cannot build, or weights that do not match it key for key and shape for
shape, are refused with a message naming the offending key. Saving is atomic (temp file + rename), so an
interrupted save never leaves a corrupt checkpoint behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch

from enhance.atomic_files import atomic_path
from models.config_io import from_dict, to_dict
from models.enhancer import Enhancer, EnhancerConfig

FORMAT = "tim-enhance-checkpoint/1"


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded, with the reason."""


@dataclass
class Checkpoint:
    model: Enhancer
    name: str
    training: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def config(self) -> EnhancerConfig:
        """The model's config as it is now: a second copy kept beside it went stale when the model's
        attenuation limit was changed (``set_max_attenuation``)."""
        return self.model.cfg


def software_versions() -> dict[str, str]:
    from importlib import metadata

    try:
        ours = metadata.version("tim-enhance")
    except metadata.PackageNotFoundError:
        ours = "unknown"
    return {
        "tim-enhance": ours,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
    }


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file (a checkpoint: the model card's and the golden targets' digest, a delta's base)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(
    path: str | os.PathLike[str], model: Enhancer, name: str, training: dict[str, Any] | None = None
) -> None:
    metadata = {
        "format": FORMAT,
        "name": name,
        "config": json.dumps(to_dict(model.cfg)),
        "training": json.dumps(training or {}),
        "versions": json.dumps(software_versions()),
    }
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    write_safetensors(path, tensors, metadata, durable=True)


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str],
    durable: bool = False,
) -> None:
    """``tensors`` and ``metadata`` as a safetensors file, written atomically, the same bytes for the same
    content in every process (:func:`stable_bytes`)."""
    data = stable_bytes(safetensors.torch.save(tensors, metadata=metadata))
    with atomic_path(path, durable=durable) as tmp, open(tmp, "wb") as f:
        f.write(data)


def stable_bytes(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys sorted. safetensors writes the metadata in the order of a
    Rust hash map, which changes from process to process: the same weights and metadata gave files with other
    bytes (and SHA-256), so hashing two runs' checkpoints could not show that a resumed run was exact. The
    tensors' offsets are relative to the data after the header, so only the header changes."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # safetensors pads the header with spaces to 8 bytes
    return len(header).to_bytes(8, "little") + header + data[8 + n :]


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Name, config, training and versions of a checkpoint, without building the model."""
    p = Path(path)
    if p.is_dir():  # a run folder, most likely: it said "no such checkpoint file"
        found = sorted(c.name for c in p.glob("*.safetensors"))[:3]
        hint = f" (it holds {', '.join(found)})" if found else ""
        raise CheckpointError(f"{p}: a folder, not a checkpoint file{hint}")
    if not p.is_file():
        raise CheckpointError(f"{p}: no such checkpoint file")
    try:
        with safetensors.safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises several types for truncated or foreign files
        raise CheckpointError(f"{p}: not a safetensors checkpoint ({exc})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{p}: unknown checkpoint format {meta.get('format')!r}, expected {FORMAT!r}")
    try:
        return {
            "name": meta["name"],
            "config": json.loads(meta["config"]),
            "training": json.loads(meta.get("training", "{}")),
            "versions": json.loads(meta.get("versions", "{}")),
        }
    except (KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{p}: damaged checkpoint metadata ({exc})") from None


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Checkpoint:
    meta = read_metadata(path)
    try:
        cfg = from_dict(EnhancerConfig, meta["config"])
        model = Enhancer(cfg)
    except Exception as exc:  # a hand-edited config can fail deep in a layer (IndexError, ZeroDivisionError)
        raise CheckpointError(f"{path}: config not understood: {type(exc).__name__}: {exc}") from None
    try:
        tensors = safetensors.torch.load_file(str(path), device=str(map_location))
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read weights ({exc})") from None
    load_state_strict(model, tensors, str(path))
    model.eval()
    return Checkpoint(model, meta["name"], meta["training"], meta["versions"])


def load_state_strict(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Load weights only if keys and shapes match exactly; otherwise name the first offending keys."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if expected[k].shape != tensors[k].shape)
    problems = []
    if missing:
        problems.append(f"missing key(s) {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected key(s) {_few(unexpected)}")
    if wrong:
        k = wrong[0]
        problems.append(
            f"shape mismatch for '{k}': checkpoint {tuple(tensors[k].shape)} vs model {tuple(expected[k].shape)}"
            + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else "")
        )
    # float16/bfloat16 weights are cast on loading; integer or boolean ones would be garbage, not weights
    shared = sorted(set(expected) & set(tensors))
    not_float = [k for k in shared if expected[k].is_floating_point() and not tensors[k].is_floating_point()]
    if not_float:
        problems.append(f"non-float weights in {_few(not_float)} ({str(tensors[not_float[0]].dtype)[6:]})")
    if problems:
        raise CheckpointError(f"{where}: weights do not match the model: " + "; ".join(problems))
    bad = sorted(k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))
    if bad:  # a diverged run, or damaged bytes: every output sample would be NaN
        raise CheckpointError(f"{where}: NaN or infinite weights in {_few(bad)}")
    model.load_state_dict(tensors, strict=True)


def _few(keys: list[str], n: int = 3) -> str:
    shown = ", ".join(f"'{k}'" for k in keys[:n])
    return shown + (f" (+{len(keys) - n} more)" if len(keys) > n else "")
