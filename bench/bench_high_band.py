"""What happens above 8 kHz: the band the 16 kHz model never sees, on inputs at 48 kHz.

    python bench/bench_high_band.py --pairs ../shared/data [--limit N] --out bench/results/high-band

For each pair, the output's band above 8 kHz (cut in the frequency domain) is scored against the clean reference's,
for four ways of treating it:

- ``noisy``: the input itself;
- ``drop`` (``--high-band drop``): the 16 kHz model's output only; nothing above 8 kHz;
- ``keep``: the model's output plus the noisy high band, untouched;
- ``gate`` (the default): the model's output plus the high band gated by the model's gain in 6-8 kHz.

Scores per file: ``hb_snr_db`` (the high band's energy in the reference over that of the error), ``speech_db``
(the output's high band against the reference's, in blocks with speech: what was kept) and ``noise_db`` (the
output's high band against the input's, in blocks without speech: how much noise was left; a clean-signal VAD on
16-ms blocks within 30 dB of the file's loudest). Below 8 kHz the four share the model's output.

Pairs recorded at more than 16 kHz (VoiceBank-DEMAND's 48 kHz files) are scored as they are. Pairs at 16 kHz (the
shared dev set) have no high band, so one is made for them: each of clean and noise gets its own 4-8 kHz band
moved up by 4 kHz (8-12 kHz) plus half of it moved up by 8 kHz (12-16 kHz), at 48 kHz; the mixture is the sum. That
high band follows each signal's own energy in time (fricatives, noise bursts) but is synthetic: the scores say how
the gate tracks the model, not how real recordings sound. Writes ``per_file.csv``, ``summary.csv`` and
``summary.md`` to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import soxr
from model_arg import add_model_args, load_model  # bench/ is on sys.path when run as a script

from enhance.audio_io import MODEL_RATE, fit_length, load_audio
from enhance.offline import enhance_audio
from recipes.evaluate import write_csv
from recipes.pairs import discover_pairs
from recipes.run_folder import write_text

RATE = 48000
SYSTEMS = ("noisy", "drop", "keep", "gate")


def high_band(x: np.ndarray, rate: int) -> np.ndarray:
    """The band of ``x`` (1-D, at ``rate``) from 8 kHz up, cut in the frequency domain: what scores are taken on
    (the 16 kHz model's output, upsampled, has nothing there)."""
    spec = np.fft.rfft(x)
    spec[np.fft.rfftfreq(len(x), 1.0 / rate) < MODEL_RATE / 2] = 0
    return np.fft.irfft(spec, n=len(x))


def synthetic_fullband(x16: np.ndarray) -> np.ndarray:
    """``x16`` (16 kHz) at 48 kHz with a made-up high band from its own 4-8 kHz band (see the module's text)."""
    up = fit_length(
        soxr.resample(x16.astype(np.float64), MODEL_RATE, RATE, quality="HQ")[None], 3 * len(x16)
    )[0]
    spec = np.fft.rfft(up)
    freqs = np.fft.rfftfreq(len(up), 1.0 / RATE)
    band = np.where((freqs >= 4000) & (freqs < 8000), spec, 0)
    hz = RATE / len(up)  # bin spacing
    shifted = np.zeros_like(spec)
    for shift_hz, gain in ((4000.0, 1.0), (8000.0, 0.5)):
        k = round(shift_hz / hz)
        shifted[k:] += gain * band[: len(spec) - k]
    return up + np.fft.irfft(shifted, n=len(up))


def speech_blocks(clean: np.ndarray, rate: int) -> np.ndarray:
    """One flag per 16-ms block: the clean signal within 30 dB of its loudest block."""
    block = round(0.016 * rate)
    n = len(clean) // block
    energy = np.mean(clean[: n * block].reshape(n, block) ** 2, axis=1)
    return energy > energy.max() * 1e-3


def _blocks(x: np.ndarray, flags: np.ndarray, rate: int) -> np.ndarray:
    block = round(0.016 * rate)
    return x[: len(flags) * block].reshape(len(flags), block)[flags]


def _db(num: float, den: float) -> float:
    return float(10 * np.log10(num / den)) if num > 0 and den > 0 else float("nan")


def energy(x: np.ndarray) -> float:
    return float(np.sum(x.astype(np.float64) ** 2))


def score(
    out_hb: np.ndarray, clean_hb: np.ndarray, noisy_hb: np.ndarray, speech: np.ndarray, rate: int
) -> dict:
    return {
        "hb_snr_db": _db(energy(clean_hb), energy(out_hb - clean_hb)),
        "speech_db": _db(energy(_blocks(out_hb, speech, rate)), energy(_blocks(clean_hb, speech, rate))),
        "noise_db": _db(energy(_blocks(out_hb, ~speech, rate)), energy(_blocks(noisy_hb, ~speech, rate))),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", required=True, help="a paired test set (dev, DNS or VoiceBank layout)")
    ap.add_argument("--out", type=Path, required=True)
    add_model_args(ap)
    ap.add_argument("--limit", type=int, default=0, help="the first N pairs only (0: all)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        pairs = discover_pairs(args.pairs).pairs
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    if args.limit:
        pairs = pairs[: args.limit]
    model = load_model(args).model.eval()
    rows = []
    synthetic = 0
    for pair in pairs:
        clean, info = load_audio(pair.clean_path)
        noisy, noisy_info = load_audio(pair.noisy_path)
        rate, noisy_rate = info.sample_rate, noisy_info.sample_rate
        clean, noisy = clean[0].astype(np.float64), noisy[0].astype(np.float64)
        if rate != noisy_rate:
            raise SystemExit(f"{pair.name}: clean at {rate} Hz, noisy at {noisy_rate} Hz")
        n = min(len(clean), len(noisy))
        clean, noisy = clean[:n], noisy[:n]
        if rate <= MODEL_RATE:
            if rate != MODEL_RATE:
                raise SystemExit(f"{pair.name}: {rate} Hz; the synthetic high band is made from 16 kHz pairs")
            synthetic += 1
            clean, noisy = (
                synthetic_fullband(clean),
                synthetic_fullband(clean) + synthetic_fullband(noisy - clean),
            )
            rate = RATE
        wav = noisy[None].astype(np.float32)
        outputs = {
            "noisy": noisy,
            "drop": enhance_audio(model, wav, rate, high_band=False).wav[0],
            "gate": enhance_audio(model, wav, rate).wav[0],
        }
        noisy_hb, clean_hb = high_band(noisy, rate), high_band(clean, rate)
        outputs["keep"] = outputs["drop"] + noisy_hb
        speech = speech_blocks(clean, rate)
        for system in SYSTEMS:
            out_hb = high_band(np.asarray(outputs[system], np.float64), rate)
            rows.append(
                {"name": pair.name, "system": system, **score(out_hb, clean_hb, noisy_hb, speech, rate)}
            )
        print(
            f"{pair.name}: " + ", ".join(f"{r['system']} {r['hb_snr_db']:.1f}" for r in rows[-4:]), flush=True
        )
    metrics = ("hb_snr_db", "speech_db", "noise_db")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "per_file.csv", ("name", "system", *metrics), rows)
    summary = []
    for system in SYSTEMS:
        mine = [r for r in rows if r["system"] == system]
        summary.append(
            {"system": system, **{m: round(float(np.nanmean([r[m] for r in mine])), 2) for m in metrics}}
        )
    write_csv(args.out / "summary.csv", ("system", *metrics), summary)
    gate_rows = [r for r in rows if r["system"] == "gate"]
    counts = {m: sum(1 for r in gate_rows if math.isfinite(r[m])) for m in metrics}
    snr = {sys_: np.array([r["hb_snr_db"] for r in rows if r["system"] == sys_]) for sys_ in SYSTEMS}
    per_file = (
        f"Per file, the gate's high-band SNR is above drop's in {int((snr['gate'] > snr['drop']).sum())} of "
        f"{len(gate_rows)} files and above keep's in {int((snr['gate'] > snr['keep']).sum())}; the median "
        f"difference from keep is {float(np.median(snr['gate'] - snr['keep'])):+.2f} dB."
    )
    command = "python bench/bench_high_band.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [
        f"High band (above 8 kHz), {len(pairs)} pairs ({synthetic} with the synthetic high band). Command: `{command}`",
        "",
        "| system | high-band SNR (dB) | speech kept (dB vs clean) | noise left (dB vs noisy) |",
        "|---|---|---|---|",
        *(
            f"| {s['system']} | {s['hb_snr_db']:.2f} | {s['speech_db']:.2f} | {s['noise_db']:.2f} |"
            for s in summary
        ),
        "",
        "Means over the files where the score exists ("
        + ", ".join(f"{m}: {counts[m]}" for m in metrics)
        + "; a file with no block of speech, or none without, has no score for it). `drop` has no high band: "
        "SNR 0 dB, nothing kept, nothing left.",
        "",
        per_file,
    ]
    write_text(args.out / "summary.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
