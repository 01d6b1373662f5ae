"""Is system B really better than system A on the same test files? Paired differences with bootstrap intervals.

    python bench/bench_paired.py --base OLD/per_file.csv:tim-default --new bench/results/quality/per_file.csv:tim-default \
        [--metrics pesq,stoi,si_sdr,dnsmos_sig,dnsmos_bak,dnsmos_ovrl] [--resamples 5000] [--seed 0] [--out DIR] \
        [--skip-first N]

Each side is a per-file score table (``per_file.csv`` of ``bench/bench_quality.py`` or of ``recipes.evaluate``,
keyed by ``name`` and ``system``) and the system to take from it. Files are matched by name; both sides must
score the same files (anything else is an error, since a comparison over different files would mislead). Per
metric, over the files where both values are finite: both means, the mean paired difference (new − base), its
95 % percentile-bootstrap interval (files resampled with replacement, seeded) and the share of files where the new
system scores higher. Writes ``summary.md`` / ``summary.csv`` to ``--out`` (atomically) and prints the Markdown.
No audio is processed. ``--skip-first N`` leaves out the first N files by name on both sides: a held-out check
when those files chose something (a checkpoint, a weight), as ``recipes.evaluate --limit N`` takes the same ones.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from recipes.evaluate import write_csv
from recipes.pairs import natural_key
from recipes.run_folder import out_folder_problem, read_csv, write_text

METRICS = "pesq,stoi,si_sdr,dnsmos_sig,dnsmos_bak,dnsmos_ovrl"
COLUMNS = ["metric", "n", "base", "new", "diff", "ci_low", "ci_high", "new_better_share"]


def read_side(spec: str) -> tuple[str, dict[str, dict[str, str]]]:
    """``FILE:SYSTEM`` -> (label, rows of that system by file name). Raises ValueError with a clear reason. The
    file is split off at its ``.csv:``, since system names have colons of their own (``webrtc:1``, ``delay:N``)."""
    match = re.fullmatch(r"(.+?\.csv):(.+)", spec, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"expected FILE.csv:SYSTEM, got {spec!r}")
    path, system = match.groups()
    try:
        rows = read_csv(Path(path))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path} is not a readable CSV: {e}") from None
    if rows and not {"name", "system"} <= rows[0].keys():
        raise ValueError(f"{path} has no 'name' and 'system' columns")
    mine = {r["name"]: r for r in rows if r["system"] == system}
    if not mine:
        systems = sorted({r["system"] for r in rows})
        raise ValueError(f"{path} has no rows of system {system!r} (it has: {', '.join(systems) or 'none'})")
    return f"{path}:{system}", mine


def paired(
    base: dict[str, dict[str, str]],
    new: dict[str, dict[str, str]],
    metrics: list[str],
    resamples: int = 5000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per metric (see the module docstring)."""
    if base.keys() != new.keys():
        only = sorted(base.keys() ^ new.keys())
        raise ValueError(
            f"the two sides score different files ({len(only)} on one side only, first: {only[0]})"
        )
    names = sorted(base)
    rows = []
    for m in metrics:
        if m not in base[names[0]] or m not in new[names[0]]:
            raise ValueError(f"no column {m!r} on both sides")
        # seeded per metric by name: a metric's interval is the same whatever else --metrics lists
        rng = np.random.default_rng([seed, *m.encode()])
        try:
            a = np.array([float(base[n][m] or "nan") for n in names])
            b = np.array([float(new[n][m] or "nan") for n in names])
        except ValueError as e:
            raise ValueError(f"a {m} value is not a number ({e})") from None
        keep = np.isfinite(a) & np.isfinite(b)
        a, b = a[keep], b[keep]
        row: dict[str, Any] = {"metric": m, "n": int(keep.sum())}
        if not len(a):
            rows.append(row | {k: math.nan for k in COLUMNS[2:]})
            continue
        d = b - a
        means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
        low, high = np.percentile(means, [2.5, 97.5])
        rows.append(
            row
            | {
                "base": float(a.mean()),
                "new": float(b.mean()),
                "diff": float(d.mean()),
                "ci_low": float(low),
                "ci_high": float(high),
                "new_better_share": float(np.mean(d > 0)),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| metric | files | base | new | new − base | 95 % interval | new higher in |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not math.isfinite(r["diff"]):
            lines.append(f"| {r['metric']} | 0 | – | – | – | – | – |")
            continue
        f = ".2f" if r["metric"] == "si_sdr" else ".3f"
        lines.append(
            f"| {r['metric']} | {r['n']} | {r['base']:{f}} | {r['new']:{f}} | {r['diff']:+.4f} "
            f"| [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | {r['new_better_share']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="FILE:SYSTEM, the reference")
    ap.add_argument("--new", required=True, help="FILE:SYSTEM, the system compared with it")
    ap.add_argument("--metrics", default=METRICS)
    ap.add_argument("--resamples", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="folder for summary.md / summary.csv")
    ap.add_argument(
        "--skip-first",
        type=int,
        default=0,
        help="leave out the first N files by name (e.g. those a choice used)",
    )
    args = ap.parse_args(argv)
    if args.resamples < 1:
        ap.error("--resamples must be at least 1")
    if args.skip_first < 0:
        ap.error("--skip-first must be >= 0")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    try:
        base_label, base = read_side(args.base)
        new_label, new = read_side(args.new)
        # in the order of discover_pairs and --limit (natural: fileid_2 before fileid_10), as the help promises
        skipped = sorted(base.keys() | new.keys(), key=natural_key)[: args.skip_first]
        base, new = ({n: r for n, r in side.items() if n not in skipped} for side in (base, new))
        if not base and not new:
            raise ValueError(f"--skip-first {args.skip_first} leaves no files")
        rows = paired(base, new, metrics, args.resamples, args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python bench/bench_paired.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = (
        f"Paired comparison: base `{base_label}`, new `{new_label}`; {len(base)} files matched by name"
        + (f" (the first {len(skipped)} by name left out)" if skipped else "")
        + "; "
        f"percentile bootstrap over files, {args.resamples} resamples, seed {args.seed}.\n\n"
        f"Command: `{command}`\n\n" + markdown(rows)
    )
    print(text)
    if args.out:
        problem = out_folder_problem(args.out)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        write_text(args.out / "summary.md", text)
        write_csv(args.out / "summary.csv", COLUMNS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
