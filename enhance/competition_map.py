"""Competition maps (which TIM mechanism wins each frame, per layer) as data (.npz) or a figure (.png).

The figure follows the paper's Figure 5: the input's spectrogram on top, then one strip per TIM layer with the
score of each mechanism over time (0..1, the scores of a frame sum to 1). PNG needs matplotlib
(``pip install 'tim-enhance[viz]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from enhance.atomic_files import atomic_path
from models.checkpoint import Checkpoint


def frame_times(n_frames: int, hop: int, rate: int) -> np.ndarray:
    """Centre time (s) of each frame: frame t covers input samples [t*hop - hop, t*hop + hop)."""
    return np.arange(n_frames) * hop / rate


def entropy(maps: np.ndarray) -> np.ndarray:
    """Competition entropy per frame (nats), [..., n_s] -> [...]."""
    p = np.clip(maps, 1e-12, 1.0)
    return -(p * np.log(p)).sum(-1)


def save_competition_map(
    path: str, maps: list[np.ndarray], ck: Checkpoint, source: str | bytes | None, name: str | None = None
) -> None:
    """Write ``maps`` (per TIM layer, [channels, frames, n_s]) to ``path`` (.npz or .png), atomically.

    ``source``: the input audio (a path or the file's bytes) whose spectrogram the .png draws above the maps, or
    None; ``name``: what the figure calls it (default: the path's file name)."""
    if not maps:
        raise ValueError(f"model '{ck.name}' has no competition (no TIM layers with competition)")
    stft = ck.config.stft
    times = frame_times(maps[0].shape[1], stft.hop_length, stft.sample_rate)
    blocks = [i + 1 for i, layer in enumerate(ck.model.layers) if getattr(layer, "score", None) is not None]
    suffix = Path(path).suffix.lower()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".npz":
        arrays: dict[str, Any] = {"frame_times": times, "blocks": np.array(blocks)}
        arrays.update({f"block{b}": m for b, m in zip(blocks, maps, strict=True)})
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
        return
    if suffix != ".png":
        raise ValueError(f"{path}: competition maps are written as .png or .npz")
    if name is None:
        name = Path(source).name if isinstance(source, str) else "input"
    _draw_png(path, maps, blocks, times, source, name, ck)


def _draw_png(
    path: str,
    maps: list[np.ndarray],
    blocks: list[int],
    times: np.ndarray,
    source: str | bytes | None,
    name: str,
    ck: Checkpoint,
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError(
            "drawing .png maps needs matplotlib: pip install 'tim-enhance[viz]' (or use .npz)"
        ) from None
    spec = _spectrogram(source, ck) if source is not None else None
    rows = len(maps) + (1 if spec is not None else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 1.2 + 1.1 * rows), sharex=True, squeeze=False)
    ax_iter = iter(axes[:, 0])
    extent_t = float(times[-1]) if len(times) else 1.0
    if spec is not None:
        ax = next(ax_iter)
        ax.imshow(spec, origin="lower", aspect="auto", extent=(0, extent_t, 0, 8), cmap="magma")
        ax.set_ylabel("kHz")
        ax.set_title(f"{name}: spectrogram and competition (model {ck.name})", fontsize=9)
    for b, m in zip(blocks, maps, strict=True):
        ax = next(ax_iter)
        n_s = m.shape[-1]
        ax.imshow(
            m[0].T,
            origin="lower",
            aspect="auto",
            vmin=0,
            vmax=1,
            cmap="viridis",
            interpolation="nearest",
            extent=(0, extent_t, -0.5, n_s - 0.5),
        )
        ax.set_yticks(range(n_s))
        ax.set_ylabel(f"block {b}", fontsize=8)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _spectrogram(source: str | bytes, ck: Checkpoint) -> np.ndarray | None:
    import torch

    from enhance.audio_io import AudioError, load_audio, resample
    from enhance.stft import log_magnitude, stft

    try:
        wav, info = load_audio(source)
    except AudioError:
        return None
    x = resample(wav[:1], info.sample_rate, ck.config.stft.sample_rate)[0]
    return log_magnitude(stft(torch.from_numpy(x), ck.config.stft)).numpy().T
