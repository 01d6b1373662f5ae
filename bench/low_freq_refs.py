"""How much of each clean reference's energy lies below a cutoff (rumble, DC): a condition column for
``bench/bench_by_condition.py``.

    python bench/low_freq_refs.py --pairs ../shared/data --out bench/results/low-freq-refs.csv
    python bench/bench_by_condition.py --per-file bench/results/quality/per_file.csv \
        --pairs-csv bench/results/low-freq-refs.csv --by low_freq_heavy --metrics si_sdr,pesq,stoi \
        --out bench/results/quality-by-low-freq

SI-SDR scores an output against the reference as it is, rumble included: a system that removes what lies below
about 60 Hz (as DeepFilterNet 3, NSNet2 and RNNoise do) loses several dB on a file whose reference is mostly
rumble, however clean its speech. The CSV has one row per pair (``name`` as the benchmarks key them), the
reference's share of energy below ``--cutoff-hz`` and ``low_freq_heavy`` (``yes`` above ``--share``), so the
breakdown shows each system's scores with and without those files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from enhance.audio_io import AudioError, load_mono_16k
from recipes.evaluate import write_csv
from recipes.pairs import discover_pairs
from recipes.run_folder import out_folder_problem


def low_freq_share(wav: np.ndarray, rate: int, cutoff_hz: float) -> float:
    """The share of ``wav``'s energy in the bins below ``cutoff_hz`` (DC included); 0 for silence."""
    power = np.abs(np.fft.rfft(np.asarray(wav, dtype=np.float64))) ** 2
    total = float(power.sum())
    if total == 0.0:
        return 0.0
    freqs = np.fft.rfftfreq(len(wav), 1.0 / rate)
    return float(power[freqs < cutoff_hz].sum()) / total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", required=True, help="a paired test set (dev, DNS or VoiceBank layout)")
    ap.add_argument("--out", type=Path, required=True, help="the CSV to write")
    ap.add_argument("--cutoff-hz", type=float, default=60.0)
    ap.add_argument("--share", type=float, default=0.5, help="a reference above this share is 'heavy'")
    args = ap.parse_args(argv)
    if not args.cutoff_hz > 0 or not 0 < args.share < 1:
        ap.error("--cutoff-hz must be above 0 and --share between 0 and 1")
    try:
        pairs = discover_pairs(args.pairs).pairs
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    problem = out_folder_problem(args.out.parent)
    if problem or args.out.is_dir():
        ap.error(problem or f"--out {args.out} is a folder: name the CSV to write")
    rows = []
    for pair in pairs:
        try:
            clean, _, _ = load_mono_16k(pair.clean_path)
        except AudioError as exc:  # skipped with the reason, as every other command does (it was a traceback)
            print(f"skipped {pair.name}: {exc}", file=sys.stderr)
            continue
        share = low_freq_share(clean, 16000, args.cutoff_hz)
        rows.append(
            {
                "name": pair.name,
                "low_freq_share": round(share, 4),
                "low_freq_heavy": "yes" if share > args.share else "no",
            }
        )
    write_csv(args.out, ("name", "low_freq_share", "low_freq_heavy"), rows)
    heavy = [r["name"] for r in rows if r["low_freq_heavy"] == "yes"]
    print(
        f"{len(heavy)} of {len(rows)} references have more than {args.share:.0%} of their energy below "
        f"{args.cutoff_hz:g} Hz" + (f": {', '.join(heavy)}" if heavy else "")
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
