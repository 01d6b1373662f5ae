"""A training run is a folder:

    config.json        resolved configuration (everything needed to rerun it)
    env.json           software versions, host, devices, world size, seed
    metrics.csv        one row per epoch (train/val loss, lr, throughput)
    skipped.txt        input files set aside, with the reason
    best.safetensors   model checkpoint with the lowest validation loss (self-describing, models.checkpoint)
    last.safetensors   latest model checkpoint
    state.pt           everything --resume needs: model, optimizer, scheduler, RNG, epoch and step
    .lock              held (flock) by the process training in the folder: a second run there is refused

Every file is written to a temp file and renamed, so a killed run never leaves a torn file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import pickle
import platform
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from enhance.atomic_files import atomic_path, nearest_existing
from models.checkpoint import software_versions

LOCK_NAME = ".lock"
_held: dict[Path, int] = {}  # run folders this process holds: the descriptor of each one's lock


def hold(run_dir: Path) -> None:
    """Hold ``run_dir`` for this process until it exits: an advisory ``flock`` on its ``.lock``, which the kernel
    releases when the process ends, however it ends (so a killed run's folder is free to ``--resume`` at once).
    A second run started in the folder meanwhile is refused; two once wrote interleaved rows into one
    ``metrics.csv`` and one run's settings beside the other's state. Again from the same process: nothing to do.
    No guard where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl
    except ImportError:
        return
    key = run_dir.resolve()
    if key in _held:
        return
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FileExistsError(
            f"{run_dir} is in use by a training run ({holder}); wait for it to end, or choose another folder"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[key] = fd


def release(run_dir: Path) -> None:
    """Free a folder :func:`hold` took (the end of a run; a process that ends frees it anyway)."""
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


def remove_if_only_lock(run_dir: Path) -> None:
    """Remove a folder a refused run made that holds nothing but its :data:`LOCK_NAME` (another run may have
    written there meanwhile: then it stays)."""
    with contextlib.suppress(OSError):
        if [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
            (run_dir / LOCK_NAME).unlink()
            run_dir.rmdir()


RUN_FILES = ("state.pt", "metrics.csv", "best.safetensors", "last.safetensors")


def foreign_files(run_dir: Path) -> list[str]:
    """The files in ``run_dir`` that a new run would replace but no run wrote: ``config.json`` or
    ``skipped.txt`` without the ``env.json`` a run writes with them (``--config exp/config.json --out exp``
    replaced the user's own config). Other files (a tee'd log, .DS_Store, an eval/ folder) are left alone."""
    if (run_dir / "env.json").is_file():
        return []
    return [n for n in ("config.json", "skipped.txt") if (run_dir / n).is_file()]


def trained_files(run_dir: Path) -> list[str]:
    """Which of :data:`RUN_FILES` ``run_dir`` holds: a run trained there (a finished one may have no state.pt
    left, copied or cleaned to save space)."""
    return [n for n in RUN_FILES if (run_dir / n).is_file()]


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
    its parents that exists, is a file, or a folder this user cannot write in (a NotADirectoryError or
    PermissionError traceback once the work was done)."""
    p = nearest_existing(out)
    if p is not None and not p.is_dir():
        return f"--out {out}: {p} exists and is not a folder"
    if p is not None and not os.access(p, os.W_OK | os.X_OK):
        return f"--out {out}: {p} is not writable"
    return None


def write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically, readable by everyone (the temp file would otherwise stay 0600). File names that
    are not valid UTF-8 (surrogates in Python) are written as their own bytes, not refused."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8", errors="surrogateescape", newline="")
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
    """Written atomically: a failed write leaves the previous state as it was. torch.save reports a full disk
    as a RuntimeError ("unexpected pos ..."): it is raised as the OSError it is, which tim-train reports in one
    line."""
    with atomic_path(path, durable=True) as tmp:
        try:
            torch.save(state, tmp)
        except RuntimeError as exc:
            free = shutil.disk_usage(path.parent).free
            raise OSError(
                f"{path}: writing the training state failed ({str(exc).splitlines()[0][:120]}; "
                f"{free / 2**20:.1f} MiB free there)"
            ) from None


# what every state.pt the trainer writes holds (Trainer._save_state); "ema" and "data" may be None
STATE_KEYS = ("config", "model", "optimizer", "scheduler", "position", "rng")


def load_state(path: Path) -> dict[str, Any]:
    """A run's ``state.pt``; raises ValueError for one that cannot be read, or that another program wrote (a
    torch file without the trainer's keys: --resume said "error: config", or failed with a traceback)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (
        RuntimeError,
        EOFError,
        OSError,
        pickle.UnpicklingError,
    ) as exc:  # truncated, or badly joined parts
        raise ValueError(f"{path}: unreadable training state ({str(exc).splitlines()[0]})") from None
    lacking = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if lacking or not isinstance(state["config"], dict):
        raise ValueError(
            f"{path}: not a training state tim-train wrote (it lacks {', '.join(lacking) or 'a configuration'})"
        )
    return state
