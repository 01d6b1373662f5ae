"""Ship a trained run as a bundled model: evaluate it, copy its weights into the package, write its model card and
the golden-test targets.

    python -m recipes.export --run runs/default-tim --name default --pairs ../shared/data

Writes ``models/pretrained/<name>.safetensors`` (the run's best checkpoint, with the evaluation summary added to
its training metadata), ``models/pretrained/<name>.md`` (model card) and, for the default model,
``tests/golden/example.json`` (metrics of the committed example clip, checked by ``tests/test_golden.py``).
Every number in the card comes from this command's own evaluation run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

from enhance.atomic_files import atomic_path
from enhance.offline import enhance_waveform
from models.checkpoint import CheckpointError, file_sha256, load_checkpoint, save_checkpoint
from models.enhancer import count_parameters
from models.pretrained import DEFAULT_MODEL, PRETRAINED_DIR
from recipes.evaluate import DNSMOS_KEYS, evaluate, left_out, markdown_table, positive_int
from recipes.interrupt import on_interrupt
from recipes.metrics import DNSMOS, pesq_wb, si_sdr, stoi
from recipes.pairs import discover_pairs
from recipes.run_folder import read_csv
from recipes.trainer import LEGACY_DATA, SELECT_BY

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_NOISY, EXAMPLE_CLEAN = ROOT / "examples" / "noisy.wav", ROOT / "examples" / "clean.wav"
GOLDEN = ROOT / "tests" / "golden" / "example.json"


def file_section(name: str, digest: str) -> str:
    """The card's last section: which file it describes, by content (the card and the file travel separately)."""
    return (
        f"\n## File\n\n`models/pretrained/{name}.safetensors`, SHA-256 `{digest}` "
        f"(`sha256sum models/pretrained/{name}.safetensors`).\n"
    )


def example_metrics(model: Any) -> dict[str, dict[str, float]]:
    """PESQ/STOI/SI-SDR of the committed example clip, noisy and enhanced (as the golden test computes them)."""
    noisy, _ = sf.read(EXAMPLE_NOISY, dtype="float32")
    clean, _ = sf.read(EXAMPLE_CLEAN, dtype="float32")
    enhanced = enhance_waveform(model, noisy[None]).wav[0]
    return {
        name: {"pesq": pesq_wb(clean, x), "stoi": stoi(clean, x), "si_sdr": si_sdr(clean, x)}
        for name, x in (("noisy", noisy), ("enhanced", enhanced))
    }


# how the sweep picks a limit: by PESQ; by DNSMOS OVRL; or "balanced": the best OVRL among the limits whose PESQ is
# within PESQ_TOLERANCE of the best PESQ (OVRL alone favours no limit, which costs PESQ below the noisy input)
SWEEP_SELECT = {"pesq": "pesq", "ovrl": "dnsmos_ovrl", "balanced": "dnsmos_ovrl"}
PESQ_TOLERANCE = 0.05


def sweep_attenuation(
    ck: Any, pairs: list[Any], limits: list[float | None], out: Path, dnsmos: bool | DNSMOS = False
) -> list[dict[str, Any]]:
    """PESQ/STOI/SI-SDR (and DNSMOS) of the enhanced output for each attenuation limit (None = no limit), on
    ``pairs``."""
    rows = []
    dnsmos = DNSMOS() if dnsmos is True else dnsmos  # one ONNX session for every limit
    keys = ("pesq", "stoi", "si_sdr") + (DNSMOS_KEYS if dnsmos else ())
    for limit in limits:
        ck.model.set_max_attenuation(limit)
        tag = "none" if limit is None else f"{limit:g}"
        r = evaluate(ck.model, pairs, out / f"sweep-{tag}", dnsmos=dnsmos, log=None)["summary"]
        rows.append({"limit_db": limit, **{k: r["enhanced"][k] for k in keys}, "noisy": r["noisy"]})
    return rows


def best_row(rows: list[dict[str, Any]], select: str) -> dict[str, Any]:
    """The sweep row chosen by ``select`` (see ``SWEEP_SELECT``); the first of equals."""
    if select == "balanced":
        top = max(r["pesq"] for r in rows)
        rows = [r for r in rows if r["pesq"] >= top - PESQ_TOLERANCE]
    return max(rows, key=lambda r: r[SWEEP_SELECT[select]])


def sweep_table(rows: list[dict[str, Any]], n_pairs: int, select: str = "pesq") -> str:
    noisy = rows[0]["noisy"]
    keys = [k for k in ("pesq", "stoi", "si_sdr", *DNSMOS_KEYS) if k in rows[0]]
    names = {"pesq": "PESQ", "stoi": "STOI", "si_sdr": "SI-SDR (dB)"} | {
        k: k.upper().replace("_", " ") for k in DNSMOS_KEYS
    }

    how = names[SWEEP_SELECT[select]] + (
        f" among the limits within {PESQ_TOLERANCE} of the best PESQ" if select == "balanced" else ""
    )

    def cells(r: dict[str, Any]) -> str:
        return " | ".join(f"{r[k]:.2f}" if k == "si_sdr" else f"{r[k]:.3f}" for k in keys)

    lines = [
        f"## Attenuation limit\n\nChosen by {how} on the first {n_pairs} of the pairs given (`--pairs`; they are "
        "also among the pairs above, so the scores there are not independent of this choice):",
        "",
        "| max attenuation (dB) | " + " | ".join(names[k] for k in keys) + " |",
        "|---" * (len(keys) + 1) + "|",
        f"| (noisy input) | {cells(noisy)} |",
    ]
    for r in rows:
        tag = "no limit" if r["limit_db"] is None else f"{r['limit_db']:g}"
        lines.append(f"| {tag} | {cells(r)} |")
    return "\n".join(lines) + "\n"


def _pauses(mixing: dict[str, Any]) -> str:
    """The card's words for the pause augmentation (recipes.mixing.MixingConfig.pause_prob), if it was on."""
    prob = float(mixing.get("pause_prob", 0.0))
    if prob <= 0:
        return ""
    low, high = mixing["pause_seconds"]
    return f", a speech pause of {low:g}-{high:g} s in {prob:.0%} of the segments"


def _dc_blocker(data: dict[str, Any]) -> str:
    """The card's words for DataConfig.dc_blocker, if it was on (a config saved before it existed: off)."""
    on = data.get("dc_blocker", LEGACY_DATA["dc_blocker"])
    return "; mixtures and clean targets through the engines' 5-Hz DC blocker" if on else ""


def _augment(mixing: dict[str, Any]) -> str:
    """The card's words for the augmentation (recipes.augment.AugmentConfig), if any of it was on."""
    aug = mixing.get("augment") or {}
    parts = []
    eq_db = float(aug.get("eq_db", 0.0))
    for what in ("speech", "noise"):
        prob = float(aug.get(f"{what}_eq_prob", 0.0))
        if prob > 0 and eq_db > 0:
            parts.append(f"a random EQ (±{eq_db:g} dB) of the {what} in {prob:.0%}")
    prob = float(aug.get("noise_mix_prob", 0.0))
    if prob > 0:
        low, high = aug.get("noise_mix_db", (-10.0, 0.0))
        parts.append(f"a second noise at {low:g} to {high:g} dB relative to the first in {prob:.0%}")
    return f"; augmentation: {', '.join(parts)} of the segments" if parts else ""


def _init(train: dict[str, Any]) -> str:
    return (
        f' Started from the weights of `{train["init_from"]}` (fresh optimizer; see "Starting weights").'
        if train.get("init_from")
        else ""
    )


def _loss(train: dict[str, Any]) -> str:
    """The card's words for the training loss: the paper's log1p-magnitude MSE, and the optional extra terms
    (recipes.trainer.TrainConfig.over_weight, low_level_weight and pmsqe_weight) when a run used them."""
    words = " Loss: MSE on log1p magnitude"
    over = float(train.get("over_weight", 0.0))
    if over > 0:
        words += (
            f", errors that leave noise in (prediction above the clean target) weighted {1 + over:g}x"
            f" (`--over-weight {over:g}`)"
        )
    low = float(train.get("low_level_weight", 0.0))
    if low > 0:
        words += f", plus {low:g} x a log(|X| + {float(train['low_level_floor']):g}) MSE term"
    pmsqe = float(train.get("pmsqe_weight", 0.0))
    if pmsqe > 0:
        words += f", plus {pmsqe:g} x PMSQE, a differentiable stand-in for PESQ (`--pmsqe-weight {pmsqe:g}`"
        words += (
            ", its bands equalised as PESQ does, `--pmsqe-as-pesq`)" if train.get("pmsqe_as_pesq") else ")"
        )
    return words + "."


def _averaged(train: dict[str, Any]) -> str:
    """The card's words for a moving average of the weights (TrainConfig.ema_decay), if the run kept one."""
    ema = float(train.get("ema_decay", 0.0))
    if ema <= 0:
        return ""
    warmup = "" if train.get("init_from") else ", warming up as (1 + n) / (10 + n) from the random start"
    return (
        f" The checkpoints hold a moving average of the weights (decay {ema:g} per step, `--ema-decay`{warmup}),"
        " which is also what was validated."
    )


def _curve(rows: list[dict[str, str]]) -> str:
    lines = ["| epoch | train loss | val loss | val SI-SDR (dB) | lr |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['epoch']} | {float(r['train_loss']):.4f} | {float(r['val_loss']):.4f} "
        f"| {float(r['val_si_sdr']):.2f} | {float(r['lr']):.1e} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def _where(folder: Path) -> str:
    """Where a run trained, from its ``env.json`` (``recipes.run_folder.environment``)."""
    try:
        env = json.loads((folder / "env.json").read_text())
    except (OSError, ValueError):
        env = None
    if not isinstance(env, dict) or "device" not in env:
        return " (device not recorded in the run folder)"
    earlier = [e for e in env.get("earlier") or [] if isinstance(e, dict) and "device" in e]
    places = list(dict.fromkeys(_device_words(e) for e in [*earlier, env]))  # in order, each once
    if len(places) == 1:
        return f", on {places[0]}"
    return f", on {', then '.join(places)} (the run was resumed)"


def _device_words(env: dict[str, Any]) -> str:
    if env["device"] == "cpu":
        return "the CPU"
    gpus = (env.get("cuda") or {}).get("devices") or []
    return f"{env['device']}" + (f" ({', '.join(gpus)})" if gpus else "")


def _training(
    train: dict[str, Any], data: dict[str, Any], rows: list[dict[str, str]], weights: str, folder: Path
) -> str:
    """One run's training line (the run in ``folder``): optimiser, loss, SNR range, epochs, where it ran and, when
    ``weights`` is the run's ``best.safetensors``, the epoch they are from (another file of the run is only
    named)."""
    column = SELECT_BY[train.get("select_by", "loss")]
    what = "validation loss" if column == "val_loss" else "validation PMSQE"
    best = min(rows, key=lambda r: float(r[column]))
    which = (
        f"these weights are from epoch {best['epoch']} (lowest {what}, {float(best[column]):.4f})"
        if weights == "best.safetensors"
        else f"these weights are its file `{weights}`, not necessarily its best epoch (lowest {what}:"
        f" epoch {best['epoch']}, {float(best[column]):.4f})"
    )
    mixing = data["mixing"]
    passes = int(mixing.get("repeats", 1))
    epoch = "one pass" if passes == 1 else f"{passes} passes"
    if data.get("recipe") == "voicebank":  # its pairs come mixed: no SNR draw, one crop per pair and epoch
        snr = ", the corpus' own mixtures"
        unit = f"one random {mixing['segment_seconds']:g}-s crop of each training pair"
    else:
        snr = f", SNR U{mixing['snr_db']} dB"
        unit = f"{epoch} over the speech files in {mixing['segment_seconds']:g}-s segments"
    return (
        f"Adam lr {train['lr']}, batch {train['batch_size']}, lr x{train['lr_factor']} after {train['lr_patience']}"
        f" epochs without validation improvement, seed {train['seed']}{snr}"
        f"{_where(folder)}.{_loss(train)}{_averaged(train)}{_init(train)} **{len(rows)} epochs done of {train['epochs']} planned**"
        f" (one epoch = {unit}); {which}."
    )


def starting_weights(train: dict[str, Any], init_run: Path | None = None, depth: int = 0) -> str:
    """For a warm-started run: the card section on the run its weights came from (its training line and curve),
    read from ``init_run`` or else the folder of ``init_from`` when that folder is a run, then the same for that
    run's own starting weights (up to 5 runs back); "" for a run that started from scratch."""
    init = train.get("init_from")
    if not init or depth >= 5:
        return ""
    folder = init_run if init_run is not None else Path(init).parent
    weights = "best.safetensors" if init_run is not None else Path(init).name
    try:
        cfg = json.loads((folder / "config.json").read_text())
        rows = read_csv(folder / "metrics.csv")
        line = _training(cfg["train"], cfg["data"], rows, weights, folder)
    except (OSError, ValueError, KeyError, TypeError):  # no run folder, or not one this version can read
        return f"\n## Starting weights\n\n`{init}`: no readable run folder beside it at export time.\n"
    origin = f" (exported from `{folder}/best.safetensors`)" if init_run is not None else ""
    return (
        f"\n## Starting weights\n\n`{init}`{origin}, from the run `{folder}`: "
        + line
        + "\n\n"
        + _curve(rows)
        + starting_weights(cfg["train"], None, depth + 1)
    )


def same_weights(a: str | Path, b: str | Path) -> bool:
    """Whether two checkpoints hold the same tensors (their metadata may differ)."""
    wa, wb = load_checkpoint(a).model.state_dict(), load_checkpoint(b).model.state_dict()
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# where recipes/gpu_bundle.sh (its default DEST) puts the Opus copies of the shared corpus that a GPU run trains on
GPU_BUNDLE_DATA = ".gpu/data/"


def _gpu_copy(data: dict[str, Any]) -> bool:
    """Whether a run trained on the Opus copy of the shared corpus that recipes/gpu_bundle.sh makes."""
    return any(GPU_BUNDLE_DATA in str(p) for p in data.get("speech") or [])


def _shared_corpus(data: dict[str, Any]) -> bool:
    """Whether a run trained on the shared development corpus (../shared/data, or its GPU copy), whose sources the
    card names."""
    speech = [str(p) for p in data.get("speech") or []]
    return data.get("recipe") == "folders" and (any("shared/data" in p for p in speech) or _gpu_copy(data))


def _data_lines(data: dict[str, Any], pairs_root: str, swept: bool = False) -> str:
    """The card's training and evaluation data: the shared corpus with its licences, or what the run's config
    says (another corpus' licences are the user's to check)."""
    mixing = data["mixing"]
    mixed = (
        f"dynamic mixing at SNR uniform in {mixing['snr_db']} dB, mixture level {mixing['level_dbfs']} dBFS, "
        f"{mixing['segment_seconds']} s segments{_pauses(mixing)}{_augment(mixing)}{_dc_blocker(data)}"
    )
    if _shared_corpus(data):
        copy = (
            ", as the Opus copy of its speech/train and noise/train that `recipes/gpu_bundle.sh` carries to a GPU "
            "machine, so the clean targets were slightly coded"
            if _gpu_copy(data)
            else ""
        )
        return f"""- **Training data**: the shared development corpus{copy} (`{", ".join(data.get("speech") or [])}` speech +
  `{", ".join(data.get("noise") or [])}` noise, {mixed}). Speech:
  LibriSpeech (CC BY 4.0), LJSpeech (public domain), Tux Paint descriptions (GPL-2). Noise: freesound-events (no licence
  stated; internal R&D use), Hu nonspeech (research corpus), Speech Commands background (CC BY 4.0), SoundBible
  (per-clip terms), Tux Paint effects (GPL-2). See the corpus README for sources. **Because of the noise licences,
  treat these weights as internal R&D material, not for redistribution.**
- **Validation / evaluation data**: the corpus' fixed dev pairs (`{pairs_root}`; held-out LibriSpeech speakers and
  held-out noise files at 0-15 dB SNR). They were used to pick the epoch, so the numbers below are validation numbers,
  not a test-set result, and not comparable with VoiceBank-DEMAND or DNS Challenge results."""
    recipe = data.get("recipe")
    if recipe == "voicebank":
        source = (
            f"VoiceBank-DEMAND `{data.get('root')}` ({data.get('voicebank_trainset')} training set, its own "
            f"mixtures{_dc_blocker(data)})"
        )
    elif recipe == "dns":
        source = f"the DNS Challenge tree `{data.get('root')}` (clean + noise, {mixed})"
    else:
        source = f"`{', '.join(data.get('speech') or [])}` speech + `{', '.join(data.get('noise') or [])}` noise, {mixed}"
    return f"""- **Training data**: {source}. The licences are those of that data: check them before distributing these
  weights.
- **Evaluation data**: `{pairs_root}`.{" An attenuation limit swept on the same pairs (below) was chosen on them." if swept else ""}"""


def model_card(
    name: str,
    ck: Any,
    run: Path,
    evaluation: dict[str, Any],
    command: str,
    rows: list[dict[str, str]],
    note: str = "",
    init_run: Path | None = None,
    weights: str = "best.safetensors",
    swept: bool = False,
) -> str:
    cfg = json.loads((run / "config.json").read_text())
    cfg_m = ck.model.cfg
    train, data = cfg["train"], cfg["data"]
    return (
        f"""# Bundled model `{name}`

- **Architecture**: `{ck.name}` ({count_parameters(ck.model):,} parameters), {cfg_m.n_layers} blocks, TIM blocks
  {list(cfg_m.tim_blocks)}, n_s = {cfg_m.n_mechanisms}, output `{cfg_m.output}`, lookahead {cfg_m.lookahead_frames}
  frame, attention context {cfg_m.context_frames} frames, attenuation limit
  {"none" if cfg_m.max_attenuation_db is None else f"{cfg_m.max_attenuation_db:g} dB"} (`enhance-cli --max-attenuation-db`
  overrides it).
{_data_lines(data, evaluation["pairs_root"], swept)}
- **Training**: {_training(train, data, rows, weights, run)}{" " + note if note else ""}

## Measured on the {evaluation["n_evaluated"]} pairs of `{evaluation["pairs_root"]}`

{markdown_table(evaluation["summary"])}{left_out(evaluation)}
Files where a metric failed are counted in `n_failed`. Reproduce:
`{command}` (exported {time.strftime("%Y-%m-%d")}).

## Training curve

"""
        + _curve(rows)
        + starting_weights(train, init_run)
    )


@on_interrupt("recipes.export", "each file it writes is written whole or not at all: run it again")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m recipes.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--run", required=True, help="training run folder")
    ap.add_argument(  # no default: a first try of the command on a test run replaced the shipped model
        "--name",
        required=True,
        help="writes models/pretrained/NAME.safetensors and NAME.md, replacing them; "
        f"'{DEFAULT_MODEL}' is the model every user gets, and also rewrites the golden test targets",
    )
    ap.add_argument("--pairs", required=True, help="paired dev/test folder to evaluate on")
    ap.add_argument("--no-dnsmos", action="store_true")
    ap.add_argument("--limit", type=positive_int)
    ap.add_argument(
        "--attenuation-sweep",
        help="comma-separated max-attenuation limits in dB to try ('none' = no limit); the best is kept",
    )
    ap.add_argument(
        "--sweep-select",
        choices=sorted(SWEEP_SELECT),
        default="pesq",
        help="what the sweep maximises: PESQ; DNSMOS OVRL; or balanced = the best OVRL among the limits within "
        f"{PESQ_TOLERANCE} of the best PESQ (default %(default)s)",
    )
    ap.add_argument(
        "--sweep-pairs",
        type=positive_int,
        default=20,
        help="pairs (the first of --pairs) the sweep is scored on",
    )
    ap.add_argument(
        "--note",
        default="",
        help="a sentence added to the card's training line (e.g. how the data was carried)",
    )
    ap.add_argument(
        "--weights",
        default="best.safetensors",
        help="the run's checkpoint file to ship (default %(default)s, the lowest validation loss; e.g. an epoch's "
        "copy when the loss trained on is not the one validated); the card names it",
    )
    ap.add_argument(
        "--init-run",
        type=Path,
        help="the run folder whose best.safetensors the run's init_from file was exported from (a bundled model "
        "has no run folder beside it); checked to hold the same weights",
    )
    args = ap.parse_args(argv if argv is not None else sys.argv[1:])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", args.name):  # '../x' wrote outside models/pretrained
        ap.error(
            f"--name {args.name!r}: letters, digits, '_', '.', '+' and '-' only, not starting with '.' or '-'"
        )
    run = Path(args.run)
    # everything the card and the files need is checked before anything is written: the bundled model, its card
    # and the golden numbers change together or not at all
    if Path(args.weights).name != args.weights:
        ap.error(f"--weights: a file name inside the run folder, got {args.weights!r}")
    for needed in (args.weights, "config.json", "metrics.csv"):
        if not (run / needed).is_file():
            ap.error(f"--run: {run / needed} is missing (a run folder of recipes.train)")
    try:  # read now, not after the evaluation (a traceback, or min() of no rows)
        run_config = json.loads((run / "config.json").read_text())
        epochs_logged = read_csv(run / "metrics.csv")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        ap.error(f"--run: {run} holds an unreadable config.json or metrics.csv ({exc})")
    if not isinstance(run_config, dict) or not isinstance(run_config.get("train"), dict) or not epochs_logged:
        ap.error(f"--run: {run}'s config.json has no train section, or its metrics.csv no epoch")
    try:
        ck = load_checkpoint(run / args.weights)
        found = discover_pairs(args.pairs)
        pairs = found.pairs
    except (CheckpointError, OSError, ValueError) as exc:
        ap.error(str(exc))
    limits: list[float | None] = []
    try:
        limits = [
            None if v.strip() == "none" else float(v) for v in (args.attenuation_sweep or "").split(",") if v
        ]
    except ValueError:
        ap.error(
            f"--attenuation-sweep: expected dB values or none, comma-separated, got {args.attenuation_sweep!r}"
        )
    if any(v is not None and not (math.isfinite(v) and v >= 0) for v in limits):  # a traceback in the sweep
        ap.error(f"--attenuation-sweep: limits are dB >= 0 (or none), got {args.attenuation_sweep!r}")
    if args.init_run is not None:
        init = run_config["train"].get("init_from")
        try:
            same = bool(init) and same_weights(init, args.init_run / "best.safetensors")
        except (OSError, CheckpointError) as exc:
            ap.error(f"--init-run: {exc}")
        if not same:  # also after this export has replaced a bundled init_from: use the card of that export
            ap.error(
                f"--init-run: {args.init_run}/best.safetensors is not the run's starting weights ({init})"
            )
    out = run / f"eval-{args.name}"
    sweep = ""
    dnsmos = False if args.no_dnsmos else DNSMOS()
    if limits:
        if args.sweep_select != "pesq" and args.no_dnsmos:
            ap.error(f"--sweep-select {args.sweep_select} needs DNSMOS (drop --no-dnsmos)")
        swept = pairs[: args.sweep_pairs]  # the card names how many there were (the set may hold fewer)
        sweep_rows = sweep_attenuation(ck, swept, limits, out, dnsmos=dnsmos)
        best = best_row(sweep_rows, args.sweep_select)
        ck.model.set_max_attenuation(best["limit_db"])
        sweep = "\n" + sweep_table(sweep_rows, len(swept), args.sweep_select)
    evaluation = evaluate(ck.model, pairs, out, dnsmos=dnsmos, limit=args.limit, unpaired=found.warnings)
    evaluation["pairs_root"] = args.pairs
    if evaluation["n_evaluated"] == 0:  # a card "measured on the 0 pairs" would replace the bundled model
        print(f"error: no pair of {args.pairs} could be evaluated: nothing exported", file=sys.stderr)
        for skipped in evaluation["skipped"]:
            print(f"  {skipped['name']}: {skipped['reason']}", file=sys.stderr)
        return 1
    rows = epochs_logged
    training = {**ck.training, "evaluation": {"pairs": args.pairs, "summary": evaluation["summary"]}}
    training = json.loads(json.dumps(training, default=float).replace("NaN", "null"))
    command = "python -m recipes.export " + shlex.join(argv if argv is not None else sys.argv[1:])
    card = model_card(
        args.name, ck, run, evaluation, command, rows, args.note, args.init_run, args.weights, bool(limits)
    )
    card += sweep
    target = PRETRAINED_DIR / f"{args.name}.safetensors"
    staged = target.with_name(f".{target.stem}.staged.safetensors")
    try:
        save_checkpoint(staged, ck.model, ck.name, training)
        card += file_section(args.name, file_sha256(staged))
        golden = None
        if args.name == DEFAULT_MODEL:  # the numbers of the file as saved, read back
            golden = {"model_sha256": file_sha256(staged), **example_metrics(load_checkpoint(staged).model)}
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)
    with atomic_path(PRETRAINED_DIR / f"{args.name}.md") as tmp:
        Path(tmp).write_text(card)
    if golden is not None:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(GOLDEN) as tmp:
            Path(tmp).write_text(json.dumps(golden, indent=2, default=lambda v: float(np.float64(v))) + "\n")
    print(card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
