"""Where does each system win or lose? A quality benchmark's per-file scores broken down by a condition of the
test pairs (input SNR, noise source, ...).

    python bench/bench_by_condition.py --per-file bench/results/quality/per_file.csv \
        --pairs-csv ../shared/data/dev/pairs.csv [--by snr_db] [--metrics stoi,pesq,dnsmos_ovrl] \
        [--out bench/results/quality-by-snr]

``--per-file`` is the ``per_file.csv`` that ``bench/bench_quality.py`` writes (one row per file and system, keyed
by ``name``); ``--pairs-csv`` is any CSV with a ``name`` column and the condition column ``--by`` (the shared dev
set's ``dev/pairs.csv`` has ``snr_db`` and ``noise_file``; ``--by noise_source`` takes the folder of
``noise_file``). Writes ``summary.md`` / ``summary.csv`` (one row per system and metric, one column per condition
value, the mean over the files where the metric is finite for every system and the file count per condition) and prints the
Markdown. No audio is processed: it reads the benchmark's scores.
"""

from __future__ import annotations

import argparse
import csv
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from recipes.evaluate import summarize, write_csv
from recipes.run_folder import out_folder_problem, read_csv, write_text


def condition_of(pair: dict[str, str], by: str) -> str:
    """The value of condition ``by`` for one row of the pairs CSV (``noise_source``: the folder of
    ``noise_file``)."""
    if by == "noise_source":
        parts = Path(pair["noise_file"]).parts
        return parts[-2] if len(parts) >= 2 else ""
    return pair[by]


def _sort_key(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def breakdown(
    scores: list[dict[str, str]], pairs: list[dict[str, str]], by: str, metrics: list[str]
) -> tuple[list[str], list[dict[str, Any]], dict[str, int]]:
    """(condition values in order, one row per system and metric with the mean per value, files per value).
    The means are :func:`recipes.evaluate.summarize`'s (over the files where the metric is finite for every system). Files of
    ``scores`` with no row in ``pairs`` are an error (a breakdown of part of the set would mislead)."""
    condition = {p["name"]: condition_of(p, by) for p in pairs}
    missing = sorted({s["name"] for s in scores} - condition.keys())
    if missing:
        raise ValueError(f"{len(missing)} scored files have no row in the pairs CSV (first: {missing[0]})")
    values = sorted({condition[s["name"]] for s in scores}, key=_sort_key)
    systems = list(dict.fromkeys(s["system"] for s in scores))
    means: dict[str, dict[str, dict[str, float]]] = {}
    for v in values:
        group = [s for s in scores if condition[s["name"]] == v]
        try:
            means[v] = summarize(group, metrics, systems=systems, keys=metrics)
        except ValueError as e:
            raise ValueError(f"a score of the {by}={v} files is not a number ({e})") from None
    rows = [
        {"metric": m, "system": system, **{v: means[v][system][m] for v in values}}
        for m in metrics
        for system in systems
    ]
    counts = {v: len({s["name"] for s in scores if condition[s["name"]] == v}) for v in values}
    return values, rows, counts


def markdown(by: str, values: list[str], rows: list[dict[str, Any]], counts: dict[str, int]) -> str:
    lines = [f"| metric | system | {' | '.join(f'{by}={v} (n={counts[v]})' for v in values)} |"]
    lines.append("|---" * (len(values) + 2) + "|")
    for r in rows:
        digits = 2 if r["metric"] == "si_sdr" else 3
        cells = " | ".join("–" if not math.isfinite(r[v]) else f"{r[v]:.{digits}f}" for v in values)
        lines.append(f"| {r['metric']} | {r['system']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-file", required=True, type=Path, help="bench_quality's per_file.csv")
    ap.add_argument("--pairs-csv", required=True, type=Path, help="CSV with 'name' and the condition column")
    ap.add_argument("--by", default="snr_db", help="condition column, or noise_source (default %(default)s)")
    ap.add_argument("--metrics", default="pesq,stoi,si_sdr,dnsmos_ovrl")
    ap.add_argument("--out", type=Path, help="folder for summary.md / summary.csv")
    args = ap.parse_args(argv)
    try:
        scores, pairs = read_csv(args.per_file), read_csv(args.pairs_csv)
    except OSError as e:
        print(f"error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except (UnicodeDecodeError, csv.Error) as e:
        print(f"error: {args.per_file} or {args.pairs_csv} is not a readable CSV: {e}", file=sys.stderr)
        return 2
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not scores or not pairs:
        print("error: empty per-file or pairs CSV", file=sys.stderr)
        return 2
    for name, table, cols in (
        ("per-file CSV", scores, ["name", "system", *metrics]),
        ("pairs CSV", pairs, ["name", "noise_file" if args.by == "noise_source" else args.by]),
    ):
        absent = [c for c in cols if c not in table[0]]
        if absent:
            print(f"error: the {name} has no column {', '.join(absent)}", file=sys.stderr)
            return 2
    try:
        values, rows, counts = breakdown(scores, pairs, args.by, metrics)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python bench/bench_by_condition.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = f"Scores of `{args.per_file}` by `{args.by}`; means over the files where a metric is finite.\n\n"
    text += f"Command: `{command}`\n\n" + markdown(args.by, values, rows, counts)
    print(text)
    if args.out:
        problem = out_folder_problem(args.out)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        write_text(args.out / "summary.md", text)
        write_csv(args.out / "summary.csv", ["metric", "system", *values], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
