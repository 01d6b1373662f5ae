"""Competition analysis (the paper's Figure 5 and its claims): do TIM's mechanisms specialise?

    python -m recipes.analyze_competition --pairs ../shared/data --out runs/analysis [--model default | --checkpoint P]

For every TIM layer with competition, over all frames of the given noisy/clean pairs:

* competition entropy per frame (nats; ln n_s = no preference, 0 = one mechanism takes all): mean, p10/p50/p90;
* correlation between layers of the competition (mechanism 0's score per frame; for n_s > 2 the mean over
  mechanisms of the per-mechanism correlations);
* how well each mechanism's score separates speech frames from non-speech frames: ROC-AUC against a voice-activity
  label from the clean signal (frame energy within ``--vad-db`` dB of the file's loudest frame; same framing as the
  model). 0.5 = no separation; above 0.5 the mechanism wins on speech, below 0.5 on non-speech.
* the same ROC-AUC within deciles of the noisy input's frame level (the pairs compared are frames of similar input
  level), beside the ROC-AUC of that level alone: speech frames are louder, so a score that only follows the input
  level separates them too. A level-matched AUC near 0.5 means the mechanism tracks loudness, not speech.

Writes ``summary.md``/``summary.json`` (tables), ``entropy_by_layer.png`` and ``maps_<name>.png`` for the first
``--figures`` files (maps drawn over the spectrogram).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from enhance.atomic_files import atomic_path
from enhance.audio_io import AudioError, load_mono_16k
from enhance.competition_map import entropy, save_competition_map
from enhance.offline import enhance_waveform
from enhance.stft import stft
from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from models.pretrained import load_pretrained
from recipes.evaluate import json_safe
from recipes.interrupt import on_interrupt
from recipes.pairs import discover_pairs
from recipes.run_folder import out_folder_problem


def vad_labels(clean: np.ndarray, ck: Checkpoint, vad_db: float) -> np.ndarray:
    """Per model frame: True where the clean frame's energy is within ``vad_db`` dB of the loudest frame and the
    frame is not digital silence (below -80 dBFS RMS: a silent clean file has no speech frames, not all of them)."""
    spec = stft(torch.from_numpy(clean), ck.config.stft)
    energy = (spec.abs() ** 2).sum(-1).numpy()
    level = 10 * np.log10(energy + 1e-12)
    # a frame at RMS r has about r^2 n_fft^2 / 4 over the one-sided bins (Parseval, a window with sum w^2 = n / 2)
    floor = 10 * np.log10(1e-4**2 * ck.config.stft.n_fft**2 / 4)
    return (level > level.max() - vad_db) & (level > floor)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` as a detector of ``labels`` (Mann-Whitney U, ties averaged)."""
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def frame_level_db(x: np.ndarray, ck: Checkpoint) -> np.ndarray:
    """Per model frame: the frame's energy in dB (the noisy input's level as the model sees it, unnormalised)."""
    spec = stft(torch.from_numpy(x), ck.config.stft)
    return 10 * np.log10((spec.abs() ** 2).sum(-1).numpy() + 1e-12)


def level_matched_auc(scores: np.ndarray, labels: np.ndarray, level: np.ndarray, bins: int = 10) -> float:
    """ROC-AUC over the (speech, non-speech) frame pairs that fall in the same quantile bin of ``level``: the
    Mann-Whitney statistic restricted to pairs of similar input level (bins with one class only add nothing)."""
    edges = np.quantile(level, np.linspace(0, 1, bins + 1)[1:-1])
    which = np.searchsorted(edges, level, side="right")
    total, weight = 0.0, 0
    for b in range(bins):
        sel = which == b
        pos = int(labels[sel].sum())
        neg = int(sel.sum()) - pos
        if pos and neg:
            total += roc_auc(scores[sel], labels[sel]) * pos * neg
            weight += pos * neg
    return total / weight if weight else math.nan


def layer_correlation(maps: list[np.ndarray]) -> np.ndarray:
    """[L, L] correlation of the layers' competition over frames (mean over mechanisms of per-mechanism ones)."""
    n_s = maps[0].shape[-1]
    mechanisms = range(1) if n_s == 2 else range(n_s)  # with 2 mechanisms, mechanism 1 = 1 - mechanism 0
    mats = [np.atleast_2d(np.corrcoef(np.stack([m[:, k] for m in maps]))) for k in mechanisms]
    return np.mean(mats, axis=0)


def analyze(
    ck: Checkpoint, pairs: list[Any], out: Path, vad_db: float = 30.0, figures: int = 3
) -> dict[str, Any]:
    blocks = ck.model.competition_blocks
    if not blocks:
        raise ValueError(f"model '{ck.name}' has no TIM layers with competition")
    per_layer: list[list[np.ndarray]] = [[] for _ in blocks]
    labels: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    drawn = 0
    for pair in pairs:
        try:
            clean, _, _ = load_mono_16k(pair.clean_path)
            noisy, _, _ = load_mono_16k(pair.noisy_path)
        except AudioError as exc:  # one bad file does not end the analysis (as in recipes.evaluate)
            print(f"analyze_competition: skipped {pair.name}: {exc}", file=sys.stderr)
            continue
        n = min(len(clean), len(noisy))
        result = enhance_waveform(ck.model, noisy[None, :n], return_competition=True)
        assert result.competition is not None
        for store, c in zip(per_layer, result.competition, strict=True):
            store.append(c[0])
        labels.append(vad_labels(clean[:n], ck, vad_db))
        levels.append(frame_level_db(noisy[:n], ck))
        if drawn < figures:
            out.mkdir(parents=True, exist_ok=True)  # once a pair was read (none: no empty folder left behind)
            save_competition_map(
                str(out / f"maps_{pair.name}.png"), result.competition, ck, str(pair.noisy_path)
            )
            drawn += 1
    if not labels:
        raise ValueError("no pair could be read")
    out.mkdir(parents=True, exist_ok=True)
    vad = np.concatenate(labels)
    level = np.concatenate(levels)
    maps = [np.concatenate(chunks) for chunks in per_layer]  # per layer [frames, n_s]
    layers = []
    for block, m in zip(blocks, maps, strict=True):
        h = entropy(m)
        layers.append(
            {
                "block": block,
                "entropy_mean": float(h.mean()),
                "entropy_p10": float(np.percentile(h, 10)),
                "entropy_p50": float(np.percentile(h, 50)),
                "entropy_p90": float(np.percentile(h, 90)),
                "max_entropy": math.log(m.shape[-1]),
                "auc_speech": [roc_auc(m[:, k], vad) for k in range(m.shape[-1])],
                "auc_speech_level_matched": [
                    level_matched_auc(m[:, k], vad, level) for k in range(m.shape[-1])
                ],
                "mean_score": [float(x) for x in m.mean(0)],
            }
        )
    result_json = {
        "model": ck.name,
        "files": len(labels),  # the pairs analysed (an unreadable one is skipped)
        "frames": len(vad),
        "speech_frames": int(vad.sum()),
        "vad_db": vad_db,
        "auc_noisy_level": roc_auc(level, vad),  # the input level alone as a speech detector
        "layers": layers,
        "layer_correlation": layer_correlation(maps).tolist(),
        "blocks": blocks,
    }
    _write(out, result_json)
    _plot_entropy(out / "entropy_by_layer.png", maps, blocks)
    return result_json


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"Competition of model `{r['model']}` on {r['files']} files ({r['frames']} frames, {r['speech_frames']} speech "
        f"frames by a clean-signal VAD at {r['vad_db']:g} dB below the loudest frame).",
        "",
        f"The noisy input's frame level alone separates speech frames with ROC-AUC {r['auc_noisy_level']:.3f}; the "
        "level-matched column compares only frames within the same decile of that level.",
        "",
        "| block | entropy mean (nats) | p10 | p50 | p90 | max (ln n_s) | speech ROC-AUC per mechanism "
        "| level-matched ROC-AUC | mean score per mechanism |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for L in r["layers"]:
        lines.append(
            f"| {L['block']} | {L['entropy_mean']:.3f} | {L['entropy_p10']:.3f} | {L['entropy_p50']:.3f} | "
            f"{L['entropy_p90']:.3f} | {L['max_entropy']:.3f} | "
            + ", ".join(f"{a:.3f}" for a in L["auc_speech"])
            + " | "
            + ", ".join(f"{a:.3f}" for a in L["auc_speech_level_matched"])
            + " | "
            + ", ".join(f"{s:.3f}" for s in L["mean_score"])
            + " |"
        )
    lines += ["", "Correlation of competition between blocks:", ""]
    blocks = r["blocks"]
    lines.append("| | " + " | ".join(str(b) for b in blocks) + " |")
    lines.append("|---" * (len(blocks) + 1) + "|")
    for b, row in zip(blocks, r["layer_correlation"], strict=True):
        lines.append(f"| {b} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    return "\n".join(lines) + "\n"


def _write(out: Path, r: dict[str, Any]) -> None:
    with atomic_path(out / "summary.json") as tmp:
        # NaN (an AUC without speech or without pauses) as null: JSON has no NaN, and strict parsers refuse it
        Path(tmp).write_text(json.dumps(json_safe(r), indent=2, default=lambda v: None) + "\n")
    with atomic_path(out / "summary.md") as tmp:
        Path(tmp).write_text(markdown(r))


def _plot_entropy(path: Path, maps: list[np.ndarray], blocks: list[int]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.boxplot([entropy(m) for m in maps], showfliers=False)
    ax.set_xticks(range(1, len(blocks) + 1), [f"block {b}" for b in blocks])
    ax.axhline(math.log(maps[0].shape[-1]), color="grey", ls="--", lw=1, label="no preference (ln n_s)")
    ax.set_ylabel("competition entropy (nats)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


@on_interrupt("analyze_competition", "nothing was written (the tables and figures are written at the end)")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m recipes.analyze_competition",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--model", default="default", help="bundled model to analyse (default: %(default)s)")
    g.add_argument("--checkpoint", help="a .safetensors checkpoint made by the training recipes")
    ap.add_argument("--pairs", required=True, help="a folder of noisy/clean pairs (recipes.pairs layouts)")
    ap.add_argument("--out", required=True, help="folder for the tables and figures")
    ap.add_argument("--limit", type=int, help="analyse only the first N pairs")
    ap.add_argument(
        "--vad-db",
        type=float,
        default=30.0,
        help="a frame is speech when the clean signal is within this many dB of its loudest frame "
        "(default: %(default)s)",
    )
    ap.add_argument(
        "--figures", type=int, default=3, help="how many files get a map figure (default: %(default)s)"
    )
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    if not (math.isfinite(args.vad_db) and args.vad_db > 0):  # nan: 0 speech frames and every AUC nan, exit 0
        ap.error(f"--vad-db must be a positive number of dB, got {args.vad_db}")
    problem = out_folder_problem(args.out)
    if problem:
        ap.error(problem)
    try:
        ck = load_checkpoint(args.checkpoint) if args.checkpoint else load_pretrained(args.model)
        found = discover_pairs(args.pairs)
        for warning in found.warnings:  # the files the pairing left out (evaluate says them too)
            print(f"analyze_competition: warning: {warning}", file=sys.stderr)
        pairs = found.pairs[: args.limit]
        r = analyze(ck, pairs, Path(args.out), args.vad_db, args.figures)
    except (ValueError, OSError, CheckpointError) as exc:
        print(f"analyze_competition: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
