"""Checks behind the PMSQE loss term (recipes/pmsqe.py) on real dev pairs; prints a Markdown report and writes it.

1. agreement with PESQ-wb: Spearman rank correlation over the noisy inputs and a model's outputs of the first
   ``--limit`` pairs, for the published PMSQE and the PESQ-order variant (``as_pesq``);
2. the size of its gradient against the log1p MSE's (with ``--over-weight 1.5``, the default model's loss) on one
   batch of 16 four-second crops of dev pairs, and their cosine;
3. the spectral balance of each model's output against the clean speech, in octave-like bands, over the first 10
   pairs (how a PESQ-gaming tilt shows).

    python bench/bench_pmsqe.py --pairs ../shared/data --checkpoint stage4=stage4.safetensors --out DIR
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from enhance.offline import enhance_waveform
from enhance.stft import stft
from models.checkpoint import load_checkpoint
from recipes.datasets import load_val_pairs
from recipes.losses import loss_fn
from recipes.metrics import pesq_wb
from recipes.pmsqe import PMSQE
from recipes.run_folder import write_text

BANDS_HZ = (0, 250, 500, 1000, 2000, 4000, 8001)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", required=True, help="dev-layout root (e.g. ../shared/data)")
    ap.add_argument(
        "--checkpoint", action="append", required=True, help="NAME=PATH; the first is checks 1-2's"
    )
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-attenuation-db", type=float, default=30.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:  # any layout recipes.pairs knows (dev/{noisy,clean} or {noisy,clean}: only the first was taken)
        pairs = load_val_pairs(args.pairs)[0]
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    models = {}
    for spec in args.checkpoint:
        name, _, path = spec.partition("=")
        model = load_checkpoint(path).model.eval()
        model.set_max_attenuation(args.max_attenuation_db)
        models[name] = model
    first_name, first = next(iter(models.items()))
    lines = [f"# PMSQE checks (`{' '.join(sys.argv)}`)", ""]

    def power(wav: np.ndarray) -> torch.Tensor:
        return (
            stft(torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))[None], first.cfg.stft).abs()
            ** 2
        )

    @functools.cache
    def enhanced(name: str, i: int) -> np.ndarray:
        """Pair ``i`` enhanced by model ``name`` (checks 1 and 3 share the first model's outputs)."""
        return enhance_waveform(models[name], pairs[i].noisy[None]).wav[0]

    pmsqe = {as_pesq: PMSQE(as_pesq=as_pesq) for as_pesq in (False, True)}
    scores: dict[bool, list[float]] = {False: [], True: []}
    pesqs = []
    for i, p in enumerate(pairs[: args.limit]):
        reference = power(p.clean)
        for wav in (p.noisy, enhanced(first_name, i)):
            pesqs.append(pesq_wb(p.clean, wav))
            degraded = power(wav)
            for as_pesq in scores:
                scores[as_pesq].append(float(pmsqe[as_pesq](degraded, reference)))
    lines += [
        f"## 1. Rank agreement with PESQ-wb ({len(pesqs)} signals: the noisy inputs and `{first_name}`'s outputs)",
        "",
        "| PMSQE | Spearman rho |",
        "|---|---|",
    ]
    for as_pesq, label in ((False, "published"), (True, "PESQ order (`as_pesq`)")):
        lines.append(f"| {label} | {spearmanr(scores[as_pesq], pesqs).statistic:.3f} |")

    rng = np.random.default_rng(0)
    crops_n, crops_c = [], []
    chosen = [pairs[int(i)] for i in rng.choice(len(pairs), 16, replace=len(pairs) < 16)]
    crop = min(64000, *(len(p.noisy) for p in chosen))  # 4 s, or the shortest pair chosen
    for p in chosen:
        s = int(rng.integers(0, len(p.noisy) - crop + 1))
        crops_n.append(p.noisy[s : s + crop])
        crops_c.append(p.clean[s : s + crop])
    noisy, clean = torch.from_numpy(np.stack(crops_n)), torch.from_numpy(np.stack(crops_c))
    train_model = load_checkpoint(args.checkpoint[0].partition("=")[2]).model.train()

    def grad(**kw: float | bool) -> torch.Tensor:
        torch.manual_seed(1)  # the same dropout masks for both
        train_model.zero_grad()
        loss_fn(train_model, noisy, clean, False, over_weight=1.5, **kw).backward()  # type: ignore[arg-type]
        return torch.cat([q.grad.flatten() for q in train_model.parameters() if q.grad is not None])

    base = grad()
    lines += [
        "",
        f"## 2. Gradients on 16 dev crops of {crop / 16000:g} s (`{first_name}`, training mode)",
        "",
    ]
    lines += ["| term | gradient norm | x the MSE's | cosine with the MSE's |", "|---|---|---|---|"]
    lines.append(f"| log1p MSE, over-weight 1.5 | {base.norm():.4f} | 1 | 1 |")
    for as_pesq in (False, True):
        term = grad(pmsqe_weight=1.0, pmsqe_as_pesq=as_pesq) - base
        cos = torch.nn.functional.cosine_similarity(base, term, 0)
        label = "PMSQE, PESQ order" if as_pesq else "PMSQE (published)"
        lines.append(
            f"| {label}, weight 1 | {term.norm():.4f} | {term.norm() / base.norm():.1f} | {cos:.3f} |"
        )

    heads = " | ".join(f"{a}-{b} Hz" for a, b in itertools.pairwise(BANDS_HZ))
    lines += ["", "## 3. Output level against the clean speech (dB), first 10 pairs", ""]
    lines += [f"| model | {heads} | overall |", "|---|" + "---|" * len(BANDS_HZ)]
    for name in models:
        per_band, overall = [], []
        for i, p in enumerate(pairs[:10]):
            out = enhanced(name, i).astype(np.float64)
            c = p.clean.astype(np.float64)
            f = np.fft.rfftfreq(len(c), 1 / 16000)
            e_pow, c_pow = np.abs(np.fft.rfft(out)) ** 2, np.abs(np.fft.rfft(c)) ** 2
            per_band.append(
                [
                    10 * np.log10(e_pow[(f >= a) & (f < b)].sum() / c_pow[(f >= a) & (f < b)].sum())
                    for a, b in itertools.pairwise(BANDS_HZ)
                ]
            )
            overall.append(10 * np.log10((out**2).sum() / (c**2).sum()))
        cells = " | ".join(f"{v:+.2f}" for v in np.mean(per_band, 0))
        lines.append(f"| {name} | {cells} | {np.mean(overall):+.2f} |")
    report = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "summary.md", report)  # atomically, as every table
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
