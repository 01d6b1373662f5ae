"""Models shipped inside the package (no downloads at run time): ``models/pretrained/<name>.safetensors``.

Each has a model card ``<name>.md`` beside it (data, licences, epochs, measured metrics).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
DEFAULT_MODEL = "default"


def available() -> list[str]:
    return sorted(p.stem for p in PRETRAINED_DIR.glob("*.safetensors"))


def pretrained_path(name: str = DEFAULT_MODEL) -> Path:
    path = PRETRAINED_DIR / f"{name}.safetensors"
    # a name, not a path: "../x" named a file outside the bundled folder
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or not path.is_file():
        known = ", ".join(available()) or "none"
        raise CheckpointError(f"no bundled model named '{name}' (bundled: {known})")
    return path


def load_pretrained(name: str = DEFAULT_MODEL, device: str | torch.device = "cpu") -> Checkpoint:
    ck = load_checkpoint(pretrained_path(name), map_location="cpu")
    ck.model.to(device)
    return ck
