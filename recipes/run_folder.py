"""A training run is a folder:

    config.json        resolved configuration (everything needed to rerun it)
    env.json           software versions, host, devices, world size, seed
    metrics.csv        one row per epoch (train/val loss, lr, throughput)
    skipped.txt        input files set aside, with the reason
    best.safetensors   model checkpoint with the lowest validation loss (self-describing, models.checkpoint)
    last.safetensors   latest model checkpoint
    state.pt           everything --resume needs: model, optimizer, scheduler, RNG, epoch and step

Every file is written to a temp file and renamed, so a killed run never leaves a torn file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pickle
import platform
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from enhance.audio_io import atomic_path
from models.checkpoint import software_versions


def write_json(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def environment(seed: int, world_size: int, device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "versions": software_versions(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "world_size": world_size,
        "seed": seed,
    }
    if torch.cuda.is_available():
        env["cuda"] = {
            "version": torch.version.cuda,
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        }
    return env


def out_folder_problem(out: str | Path) -> str | None:
    """Why ``out`` cannot be (or become) a folder, found before any work (None: it can): it, or the nearest of
    its parents that exists, is a file (a NotADirectoryError traceback once the work was done)."""
    path = Path(out)
    for p in [path, *path.parents]:
        if p.exists():
            return None if p.is_dir() else f"--out {out}: {p} exists and is not a folder"
    return None


def write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically, readable by everyone (the temp file would otherwise stay 0600)."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8", newline="")
        os.chmod(tmp, 0o644)


def append_csv(path: Path, row: dict[str, Any]) -> None:
    """Append one row (header written with the first); the whole file is rewritten atomically. When the row has
    columns the file's header lacks (a run started by an older version, resumed by this one), the file is
    rewritten with every column, the old rows empty in the new ones: appended under the old header, the row's
    values slid into the wrong columns."""
    rows = read_csv(path) if path.is_file() else []
    fields = list(dict.fromkeys([*(rows[0] if rows else ()), *row]))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, restval="")
    writer.writeheader()
    writer.writerows([*rows, row])
    write_text(path, buf.getvalue())


def truncate_csv(path: Path, keep: Callable[[dict[str, str]], bool]) -> None:
    """Drop the rows ``keep`` rejects (a run killed after logging an epoch but before saving its state)."""
    rows = read_csv(path)
    kept = [r for r in rows if keep(r)]
    if len(kept) == len(rows):
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(kept)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(buf.getvalue())


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def save_state(path: Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_state(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (
        RuntimeError,
        EOFError,
        OSError,
        pickle.UnpicklingError,
    ) as exc:  # truncated, or badly joined parts
        raise ValueError(f"{path}: unreadable training state ({str(exc).splitlines()[0]})") from None
