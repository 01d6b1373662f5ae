"""Post-filter study: does reshaping the model's predicted magnitude after the network close the background-noise
(DNSMOS BAK) gap to RNNoise and DeepFilterNet 3?

    python bench/bench_postfilter.py --pairs ../shared/data [--limit 40] [--model default | --checkpoint PATH]
        [--filters "raw;limit=20;..."] [--peers rnnoise] [--no-dnsmos] [--out bench/results/postfilter]

The network runs once per file without an attenuation limit; each post-filter then maps the noisy magnitude
``X`` and the predicted clean magnitude ``P`` (both [T, F], linear) to the output magnitude, which is rebuilt with
the noisy phase like the engine does. A filter is a ``+``-joined chain of steps applied in order:

* ``limit=L``: ``max(P, X * 10^(-L/20))``, the engine's attenuation limit (``limit=20`` is the shipped default;
  checked equal to the engine's own output in tests/test_bench_postfilter.py);
* ``relative=L``: the floor follows the frame's predicted level, ``max(P, X * 10^(-L/20) * g)`` with
  ``g = sqrt(sum P^2 / sum X^2)`` per frame (deeper floor in frames the model takes for noise);
* ``dfpf=B``: DeepFilterNet's post-filter on the gain ``G = P / X`` (Schroeter et al. 2022, beta ``B``):
  ``G (1 + B) / (1 + B (G / (G sin(pi G / 2)))^2)``, lowering small gains more than large ones;
* ``expander=R/K``: a downward expander on the frame's predicted level: a frame whose energy ratio
  ``sum P^2 / sum X^2`` is below ``R`` dB is scaled by ``(ratio / R)^(K/2)``, i.e. it loses another K dB of
  energy per dB under ``R``;
* ``gate=R/K/H``: the expander with a hold time: the frame ratio it reads is the largest of the last ``H``
  frames', so a speech tail or a dip inside a word is not gated;
* ``release=A``: per-bin gain may fall by at most a factor ``A`` per frame, ``G_t = max(G_t, A G_{t-1})`` (like
  RNNoise's gain smoothing; stateful, offline only here);
* ``fmean=N`` / ``fgeo=N`` / ``fmed=N``: the gain ``G = P / X`` replaced by its arithmetic mean, geometric mean or
  median over ``N`` neighbouring bins (odd; the edge bins repeated), against musical noise (RNNoise's band gains
  are smooth across frequency, the network's are per bin);
* ``lowcut=HZ``: the bins whose centre lies below ``HZ`` set to zero (the peers take out the band below about
  60 Hz, rumble and DC, which the network keeps; the bins are 16000 / 512 = 31.25 Hz apart, so ``lowcut=60``
  zeroes the DC and 31-Hz bins);
* ``raw``: no change;
* ``oracle``, first in a chain only: ``P`` is replaced by the clean file's own magnitude, so the row is what a
  perfect magnitude prediction gives with the noisy phase (the ceiling of this design, with any steps after it,
  e.g. ``oracle+limit=30``).

``dfpf``, ``release`` and the ``f*`` smoothers work on the gain ``G = P / X`` capped at 1, so they also cap ``P`` at ``X`` (the network's
residual output can exceed the noisy magnitude slightly); ``relative`` caps the frame gain ``g`` at 1.

Besides PESQ, STOI, SI-SDR and DNSMOS, each row reports **pause attenuation**: the output's energy over the
noisy input's in the frames where the clean signal is more than 45 dB below its loudest frame (speech pauses), in
dB, averaged over the files that have such frames, with a finite value in every row (``n_pause_files``). The ``clean`` row scores the clean file itself: its pause attenuation is how far down the target's own pauses
are (room tone). ``--peers`` adds systems of bench/peers.py (delay-compensated like bench/bench_quality.py) for reference.
Writes ``summary.md`` and ``summary.csv`` to ``--out`` (atomically) and prints the table.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quality  # bench/ is not a package: on sys.path above
from model_arg import add_model_args, load_model, model_label

from enhance.audio_io import load_mono_16k
from enhance.dc_blocker import remove_dc
from enhance.errors import EnhanceError
from enhance.stft import STFTConfig, istft, linear_magnitude, log_magnitude, stft
from recipes.evaluate import summarize, write_csv
from recipes.metrics import DNSMOS, METRIC_KEYS, compute_metrics
from recipes.pairs import discover_pairs
from recipes.run_folder import write_text

DEFAULT_FILTERS = (
    "raw;limit=20;relative=20;relative=15;dfpf=0.05+limit=20;dfpf=0.3+limit=20;"
    "expander=-10/2+limit=20;limit=20+expander=-10/2;release=0.5;release=0.5+limit=20"
)
PAUSE_DB = 45.0  # a frame is a pause when the clean signal is this far below its loudest frame
COLUMNS = ("system", *METRIC_KEYS, "pause_att_db", "n_files", "n_pause_files")

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (X, P) -> new P, magnitudes [T, F]


def _frame_ratio(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Per frame: predicted over noisy energy, [T, 1]."""
    return (p**2).sum(-1, keepdim=True) / (x**2).sum(-1, keepdim=True).clamp_min(1e-12)


def _gain(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return (p / x.clamp_min(1e-12)).clamp(0.0, 1.0)


def step_limit(db: float) -> Step:
    return lambda x, p: torch.maximum(p, x * 10.0 ** (-db / 20.0))


def step_relative(db: float) -> Step:
    return lambda x, p: torch.maximum(p, x * 10.0 ** (-db / 20.0) * _frame_ratio(x, p).clamp(max=1.0).sqrt())


def step_dfpf(beta: float) -> Step:
    def f(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        g = _gain(x, p)
        g_sin = g * torch.sin(math.pi * g / 2.0)
        return (1.0 + beta) * g / (1.0 + beta * (g / g_sin.clamp_min(1e-12)) ** 2) * x

    return f


def step_expander(threshold_db: float, k: float) -> Step:
    def f(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        ratio = _frame_ratio(x, p) / 10.0 ** (threshold_db / 10.0)
        return p * ratio.clamp(max=1.0) ** (k / 2.0)

    return f


def step_gate(threshold_db: float, k: float, hold: int) -> Step:
    """The expander with a hangover: the frame ratio it reads is the largest of the last ``hold`` frames', so a
    speech tail or a short dip inside a word is not gated (a noise gate's hold time; causal)."""

    def f(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        ratio = _frame_ratio(x, p)[:, 0]
        held = torch.nn.functional.pad(ratio, (hold - 1, 0)).unfold(0, hold, 1).amax(-1)[:, None]
        return p * (held / 10.0 ** (threshold_db / 10.0)).clamp(max=1.0) ** (k / 2.0)

    return f


def step_release(alpha: float) -> Step:
    def f(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        g = _gain(x, p)
        out = [g[0]]
        for t in range(1, g.shape[0]):
            out.append(torch.maximum(g[t], alpha * out[-1]))
        return torch.stack(out) * x

    return f


def _bins(g: torch.Tensor, width: int) -> torch.Tensor:
    """Each bin's neighbourhood of ``width`` bins (odd; edges repeated), [T, F, width]."""
    half = width // 2
    padded = torch.cat([g[:, :1].expand(-1, half), g, g[:, -1:].expand(-1, half)], dim=1)
    return padded.unfold(1, width, 1)


def step_lowcut(hz: float) -> Step:
    def f(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        centres = torch.linspace(0.0, 8000.0, p.shape[-1])  # 0 .. Nyquist of the model's 16 kHz
        return torch.where(centres < hz, torch.zeros_like(p), p)

    if not hz > 0:
        raise ValueError(f"a cut-off must be above 0 Hz, got {hz:g}")
    return f


def step_freq(kind: str) -> Callable[[float], Step]:
    """Smooth the gain ``G = P / X`` over ``width`` neighbouring bins: arithmetic mean, geometric mean or
    median (musical-noise removal: an isolated residual bin among suppressed ones is pulled down)."""

    def make(width: float) -> Step:
        if width < 1 or width % 2 != 1:
            raise ValueError(f"a bin neighbourhood must be an odd width, got {width:g}")

        def f(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            nb = _bins(_gain(x, p), int(width))
            if kind == "mean":
                g = nb.mean(-1)
            elif kind == "geo":
                g = nb.clamp_min(1e-6).log().mean(-1).exp()
            else:
                g = nb.median(-1).values
            return g * x

        return f

    return make


def is_oracle(spec: str) -> bool:
    """A chain that starts from the clean magnitude instead of the network's prediction."""
    return spec.split("+")[0].strip() == "oracle"


def parse_filter(spec: str) -> Step:
    """A ``+``-joined chain of ``name=value`` steps (see the module docstring); raises ValueError. A leading
    ``oracle`` is left to :func:`filtered_outputs` (it needs the clean file)."""
    steps: list[Step] = []
    for i, part in enumerate(spec.split("+")):
        name, _, arg = part.strip().partition("=")
        try:
            if (name == "raw" or (name == "oracle" and i == 0)) and not arg:
                continue
            if name == "expander":
                r, k = arg.split("/")
                steps.append(step_expander(float(r), float(k)))
                continue
            if name == "gate":
                r, k, h = arg.split("/")
                if int(h) < 1:
                    raise ValueError(h)
                steps.append(step_gate(float(r), float(k), int(h)))
                continue
            makers = {
                "limit": step_limit,
                "relative": step_relative,
                "dfpf": step_dfpf,
                "release": step_release,
                "fmean": step_freq("mean"),
                "fgeo": step_freq("geo"),
                "fmed": step_freq("median"),
                "lowcut": step_lowcut,
            }
            steps.append(makers[name](float(arg)))
        except (KeyError, ValueError):
            raise ValueError(f"bad post-filter step '{part}' in '{spec}'") from None

    def chain(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        for s in steps:
            p = s(x, p)
        return p

    return chain


def pause_frames(clean: np.ndarray, noisy: np.ndarray, cfg: STFTConfig) -> tuple[torch.Tensor, float] | None:
    """The frames where ``clean`` is ``PAUSE_DB`` below its loudest frame and the noisy input's energy in them;
    None when there is no such frame. Computed once per pair, for every system's output."""
    clean_power, noisy_power = (_frame_power(a, cfg) for a in (clean, noisy))
    level = 10.0 * torch.log10(clean_power + 1e-12)
    pause = level < level.max() - PAUSE_DB
    if not bool(pause.any()):
        return None
    return pause, float(noisy_power[pause].sum().clamp_min(1e-12))


def pause_attenuation(out: np.ndarray, pauses: tuple[torch.Tensor, float] | None, cfg: STFTConfig) -> float:
    """Output over noisy energy (dB) in the pause frames of :func:`pause_frames`; NaN without pauses."""
    if pauses is None:
        return math.nan
    pause, noisy_energy = pauses
    return float(10.0 * torch.log10(_frame_power(out, cfg)[pause].sum() / noisy_energy))


def _frame_power(wav: np.ndarray, cfg: STFTConfig) -> torch.Tensor:
    return stft(torch.from_numpy(wav), cfg).abs().pow(2).sum(-1)


@torch.inference_mode()
def filtered_outputs(
    model: Any, noisy: np.ndarray, filters: dict[str, Step], clean: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The network once, then every post-filter; waveforms at the input's length. ``model`` must have no
    attenuation limit (the ``limit`` step is the limit). ``oracle`` chains start from ``clean``'s magnitude."""
    cfg = model.cfg.stft
    blocked = remove_dc(noisy[None], cfg.hop_length)  # as the engine: its DC blocker, then the STFT
    spec = stft(torch.from_numpy(blocked), cfg)
    x = spec.abs()[0]
    p = linear_magnitude(model(log_magnitude(spec)).log_mag)[0]
    c = None if clean is None else stft(torch.from_numpy(clean)[None], cfg).abs()[0]
    # + 0.0: the engine's phase of silence (enhance.stft.apply_magnitude)
    phase = torch.polar(torch.ones_like(x), (spec + 0.0).angle()[0])
    out = {}
    for name, f in filters.items():
        start = p
        if is_oracle(name):
            if c is None:
                raise ValueError(f"'{name}' needs the clean file")
            start = c
        out[name] = istft(f(x, start) * phase, cfg, len(noisy)).numpy()
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pairs", required=True, help="a folder of noisy/clean pairs (any layout recipes.pairs knows)"
    )
    ap.add_argument("--limit", type=int, default=40, help="use the first N pairs (default 40)")
    add_model_args(ap)
    ap.add_argument(
        "--filters", default=DEFAULT_FILTERS, help="';'-separated post-filters (see the docstring)"
    )
    ap.add_argument(
        "--peers", default="", help="comma-separated peers of bench/peers.py to add as references"
    )
    ap.add_argument("--no-dnsmos", action="store_true")
    # the repository's folder wherever the command runs (it was relative to the current folder)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "bench/results/postfilter"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    try:
        filters = {spec.strip(): parse_filter(spec) for spec in args.filters.split(";") if spec.strip()}
        pairs = discover_pairs(args.pairs).pairs[: args.limit]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ck = load_model(args)
    model = ck.model.eval()
    model.set_max_attenuation(None)  # the post-filters apply any limit
    peer_names = [n.strip() for n in args.peers.split(",") if n.strip()]  # "rnnoise, speex" as bench_quality
    try:
        entries = bench_quality.build_systems(peer_names, None, {}) if peer_names else []
    except (KeyError, ValueError) as exc:  # an unknown peer: a usage error, not a traceback
        print(f"error: --peers: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    signal = bench_quality.calibration_audio(bench_quality.ROOT / "examples" / "noisy.wav")[0]
    for e in entries:
        if e.system is not None:
            bench_quality.calibrate(e, signal)
    scorer = None if args.no_dnsmos else DNSMOS()
    rows: list[dict[str, Any]] = []
    for pair in pairs:
        try:
            clean = load_mono_16k(pair.clean_path)[0]
            noisy = load_mono_16k(pair.noisy_path)[0]
        except EnhanceError as exc:  # reported and skipped, like recipes/evaluate.py does
            print(f"skipped {pair.noisy_path}: {exc}", file=sys.stderr)
            continue
        n = min(len(clean), len(noisy))
        clean, noisy = clean[:n], noisy[:n]
        # the clean file itself is the reference row: how far down the target's own pauses are
        outputs = {"noisy": noisy, "clean": clean, **filtered_outputs(model, noisy, filters, clean)}
        for e in entries:
            if e.system is not None:
                y, _ = bench_quality.run_system(e, noisy)
                if y is not None:
                    outputs[e.name] = y
        pauses = pause_frames(clean, noisy, model.cfg.stft)
        for name, y in outputs.items():
            att = pause_attenuation(y, pauses, model.cfg.stft)
            rows.append(
                {"name": pair.name, "system": name, **compute_metrics(clean, y, scorer), "pause_att_db": att}
            )
    names = list(dict.fromkeys(r["system"] for r in rows))
    means = summarize(rows, systems=names, keys=(*METRIC_KEYS, "pause_att_db"))
    # the files the pause means are over: summarize keeps a file for a metric only where every row has it finite
    # (a per-row count said 3 where a reference's -inf had left one file out of every row's mean)
    files = {r["name"] for r in rows}
    n_pause = sum(all(math.isfinite(r["pause_att_db"]) for r in rows if r["name"] == f) for f in files)
    table = []
    for name in names:
        plain = name in ("noisy", "clean") or name in {e.name for e in entries} or is_oracle(name)
        label = name if plain else f"tim + {name}"
        m = means[name]
        values = {k: m[k] for k in (*METRIC_KEYS, "pause_att_db")}
        table.append({"system": label, **values, "n_files": int(m["n_files"]), "n_pause_files": n_pause})
    for e in entries:
        if e.system is None:
            print(f"not run: {e.name}: {e.reason}", file=sys.stderr)
    head = [
        "system",
        "PESQ",
        "STOI",
        "SI-SDR (dB)",
        "SIG",
        "BAK",
        "OVRL",
        "pause att. (dB)",
        "n",
        "n with pauses",
    ]
    lines = [
        f"Post-filter study, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs; model "
        f"{model_label(args)}; {int(means['noisy']['n_files']) if means else 0} pairs scored under `{args.pairs}`.",
        "",
        f"Command: `{' '.join(['python', *map(shlex.quote, [sys.argv[0], *(argv or sys.argv[1:])])])}`",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for r in table:
        cells = [f"{r[k]:.2f}" if k in ("si_sdr", "pause_att_db") else f"{r[k]:.3f}" for k in COLUMNS[1:-2]]
        lines.append(
            f"| {r['system']} | " + " | ".join(cells) + f" | {r['n_files']} | {r['n_pause_files']} |"
        )
    md = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "summary.csv", COLUMNS, table)
    write_text(args.out / "summary.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
