"""Training command: ``python -m recipes.train --config A.json [--config B.json ...] [flags] --out RUN_DIR``.

Config files are merged in order (later wins), then flags override them. A config file holds
``{"train": {...TrainConfig...}, "data": {...DataConfig...}}``, any part of it. New runs train through the
engines' 5-Hz DC blocker (``data.dc_blocker``; ``--config no-dc-blocker.json`` trains as runs before session 26
did). Examples::

    # the paper's recipe (SNR U[0, 40] dB) for TIM on the shared corpus, validated on its dev pairs
    python -m recipes.train --config recipes/configs/shared.json --config recipes/configs/tim.json --out runs/tim
    # the default model's first stage (SNR U[-5, 25] dB; README.md, "The bundled default model")
    python -m recipes.train --config default.json --out runs/default
    # the paper's rows on DNS
    python -m recipes.train --config recipes/configs/dns.json --config recipes/configs/transformer.json \\
        --root /data/DNS-Challenge --out runs/dns-transformer
    # continue a killed run exactly where it stopped
    python -m recipes.train --out runs/tim --resume
    # several GPUs on one machine (several nodes: torchrun's --nnodes and --rdzv-endpoint)
    torchrun --standalone --nproc_per_node 4 -m recipes.train --config ... --out runs/x
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from models.checkpoint import CheckpointError
from models.config_io import check_keys, from_dict, to_dict
from recipes import run_folder
from recipes.trainer import (
    DATA_LOCATIONS,
    RESUME_OVERRIDES,
    RunConfig,
    StopRequest,
    Trainer,
    config_changes,
    saved_run_config,
)

# the flags --resume may change, as the help and the refusal name them
RESUME_FLAGS = ", ".join("--" + k.replace("_", "-") for k in (*RESUME_OVERRIDES, *DATA_LOCATIONS))

CONFIG_DIR = Path(__file__).parent / "configs"


def merge(base: dict[str, Any], over: dict[str, Any], where: str = "config") -> dict[str, Any]:
    """``over`` on top of ``base``, section by section; a section replaced by something that is not one is an
    error (``{"train": 5}`` after a file with a train section silently dropped its settings)."""
    out = dict(base)
    for k, v in over.items():
        # null may replace a section: it turns an optional one off (train.bcd)
        if isinstance(out.get(k), dict) and not isinstance(v, dict) and v is not None:
            raise ValueError(f"{where}.{k}: expected an object, got {type(v).__name__} {v!r}")
        out[k] = (
            merge(out[k], v, f"{where}.{k}") if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tim-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config", action="append", default=[], help="JSON config file (repeatable, merged in order)"
    )
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run in --out with its saved config; only {RESUME_FLAGS} may change (--epochs: to "
        "extend a finished run; the data's folders: a corpus moved elsewhere, checked to hold the same files)",
    )
    g = p.add_argument_group("overrides")
    g.add_argument("--model", help="model config name (transformer, tim-nocomp, tim, tim4, tiny, ...)")
    g.add_argument("--recipe", choices=["folders", "dns", "voicebank"])
    g.add_argument("--root", help="DNS-Challenge or VoiceBank-DEMAND folder")
    g.add_argument("--speech", action="append", help="clean speech folder (folders recipe, repeatable)")
    g.add_argument("--noise", action="append", help="noise folder (folders recipe, repeatable)")
    g.add_argument("--val-pairs", help="folder of noisy/clean validation pairs")
    g.add_argument(
        "--cache-dir", help="where VoiceBank is resampled to 16 kHz once (default ~/.cache/tim-enhance)"
    )
    g.add_argument("--epochs", type=int, help="epochs to train in all (default 50, the paper's)")
    g.add_argument("--batch-size", type=int, help="segments per step, over all processes (default 16)")
    g.add_argument(
        "--lr", type=float, help="Adam learning rate (default 2e-4; halved after 5 epochs without gain)"
    )
    g.add_argument("--seed", type=int, help="seed of the weights, the mixing and the batches (default 0)")
    g.add_argument("--device", help="auto (default: CUDA if there is one), cpu, cuda or cuda:N")
    g.add_argument(
        "--num-workers", type=int, help="data loader processes (default 0: in the training process)"
    )
    g.add_argument("--threads", type=int, help="torch threads on a CPU (default: torch's choice)")
    g.add_argument(
        "--time-budget-minutes",
        type=float,
        help="stop (resumably) when this many minutes of training are spent; a resumed run may change it (inf: no "
        "limit, which also removes a saved one)",
    )
    g.add_argument("--max-steps-per-epoch", type=int, help="cap on steps per epoch (default: one pass)")
    g.add_argument("--segment-seconds", type=float, help="length of each training segment (default 4 s)")
    g.add_argument("--init-from", help="start from this checkpoint's weights (fresh optimizer)")
    g.add_argument(
        "--low-level-weight",
        type=float,
        help="weight of the extra log(|X| + floor) loss term (0: the paper's objective alone; experimental)",
    )
    g.add_argument(
        "--over-weight",
        type=float,
        help="extra weight on errors that leave noise in (prediction above the clean target): 3 makes them count "
        "4x (0: the paper's symmetric MSE; experimental)",
    )
    g.add_argument(
        "--pmsqe-weight",
        type=float,
        help="add this weight times PMSQE, a differentiable per-frame stand-in for PESQ's disturbances, of the "
        "predicted against the clean magnitude (0: off; experimental)",
    )
    g.add_argument(
        "--pmsqe-as-pesq",
        action="store_true",
        default=None,
        help="equalise the PMSQE term's bands as PESQ does (frame averages, the reference scaled) instead of as the "
        "published PMSQE (frame sums, the degraded scaled)",
    )
    g.add_argument(
        "--select-by",
        choices=("loss", "pmsqe"),
        help="the validation figure that picks best.safetensors and drives the lr schedule: loss (the log1p MSE, "
        "the default) or pmsqe (PESQ-like; for runs with --pmsqe-weight)",
    )
    g.add_argument(
        "--ema-decay",
        type=float,
        help="keep a moving average of the weights with this decay per step (e.g. 0.998), validate it and save it as "
        "best/last (0: off). From random weights the decay warms up as (1 + n) / (10 + n); with --init-from it "
        "applies from the first step",
    )
    return p


def config_path(name: str) -> Path:
    """A ``--config`` argument: a file, or the name of one in recipes/configs/."""
    p = Path(name)
    if not p.is_file() and (CONFIG_DIR / name).is_file():
        return CONFIG_DIR / name
    return p


def read_config(name: str) -> dict[str, Any]:
    p = config_path(name)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not a text file (a JSON config is UTF-8 text)") from None
    except IsADirectoryError:
        raise ValueError(f"{p}: is a folder, not a JSON config file") from None
    except FileNotFoundError:
        raise ValueError(
            f"--config {name}: no such file (nor {CONFIG_DIR / p.name}; the bundled ones: "
            f"{', '.join(sorted(c.name for c in CONFIG_DIR.glob('*.json')))})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


def resolve(args: argparse.Namespace, base: dict[str, Any] | None = None) -> RunConfig:
    """The run's configuration: ``base`` (default: none, the defaults), then the --config files in order, then
    the flags."""
    data: dict[str, Any] = dict(base or {})
    for path in args.config:
        part = read_config(path)
        check_keys(RunConfig, part, f"{config_path(path)}: config")  # which file has the typo
        data = merge(data, part)
    flags = {
        "train": {
            "model": args.model,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "device": args.device,
            "num_workers": args.num_workers,
            "threads": args.threads,
            "time_budget_minutes": args.time_budget_minutes,
            "max_steps_per_epoch": args.max_steps_per_epoch,
            "init_from": args.init_from,
            "low_level_weight": args.low_level_weight,
            "over_weight": args.over_weight,
            "pmsqe_weight": args.pmsqe_weight,
            "pmsqe_as_pesq": args.pmsqe_as_pesq,
            "ema_decay": args.ema_decay,
            "select_by": args.select_by,
        },
        "data": {
            "recipe": args.recipe,
            "root": args.root,
            "speech": args.speech,
            "noise": args.noise,
            "val_pairs": args.val_pairs,
            "cache_dir": args.cache_dir,
            "mixing": {"segment_seconds": args.segment_seconds},
        },
    }
    data = merge(data, _drop_none(flags))
    return from_dict(RunConfig, data)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = _drop_none(v)
            if v:
                out[k] = v
        elif v is not None:
            out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(levelname)s] %(message)s")
    # inf is "no limit", which the config holds as None: written as inf, it was saved as Infinity, which the next
    # --resume refused to read (and a new run refused at once)
    no_budget = args.time_budget_minutes is not None and args.time_budget_minutes == math.inf
    if no_budget:
        args.time_budget_minutes = None
    try:
        if args.resume:
            saved = Path(args.out) / "config.json"
            state = Path(args.out) / "state.pt"
            if saved.is_file():
                try:
                    raw = json.loads(saved.read_text())
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise ValueError(f"{saved}: not readable JSON ({exc})") from None
            elif state.is_file():  # config.json lost or not copied: the state holds the same configuration
                raw = run_folder.load_state(state)["config"]
            else:
                raise FileNotFoundError(f"{saved}: nothing to resume")
            if not isinstance(raw, dict) or not isinstance(raw.get("data", {}), dict):
                raise ValueError(f"{saved}: not a run's configuration (a JSON object with its sections)")
            try:
                cfg = saved_run_config(raw)
            except ValueError as exc:  # a key added by hand, or a run of a newer version
                source = saved if saved.is_file() else state
                raise ValueError(f"{source}: {exc}") from None
            ignored = [
                "--" + k.replace("_", "-")
                for k, v in vars(args).items()
                if k not in (*RESUME_OVERRIDES, *DATA_LOCATIONS, "out", "resume")
                and v not in (None, [], False)
            ]
            # the saved run with this command line on top: the run's own command again with --resume added is
            # fine; flags (or --config files) that would change what it computes are refused
            given = resolve(args, base=to_dict(cfg))
            changed = config_changes(cfg, given)
            if changed:
                shown = "; ".join(changed[:4]) + (
                    f"; and {len(changed) - 4} more" if len(changed) > 4 else ""
                )
                raise ValueError(
                    f"--resume continues the saved run as it was configured; {', '.join(ignored)} would change "
                    f"it ({shown}); only {RESUME_FLAGS} can change"
                )
            # Where and how fast a run executes may change between sessions (a GPU machine, fewer cores), and
            # where its data is (the trainer checks it is the same data), by flag or --config file; what it
            # computes may not. Where it stops: --epochs sets it; a --config file's epochs only extends it (the
            # run's own command again, its --config files included, put back the epochs an earlier --epochs had
            # extended, and said "nothing to train" in the middle of the extension)
            runtime = {k: getattr(given.train, k) for k in RESUME_OVERRIDES}
            if args.epochs is None:
                runtime["epochs"] = max(cfg.train.epochs, given.train.epochs)
            cfg = dataclasses.replace(
                cfg,
                train=dataclasses.replace(cfg.train, **runtime),
                data=dataclasses.replace(cfg.data, **{k: getattr(given.data, k) for k in DATA_LOCATIONS}),
            )
        else:
            cfg = resolve(args)
        if no_budget:  # no limit, whatever a --config file or the saved run says
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, time_budget_minutes=None))
        problem = run_folder.out_folder_problem(args.out)
        if problem:
            raise ValueError(problem)
        stop = StopRequest()
        previous = _stop_on_sigterm(stop)
        try:
            result = Trainer(cfg, args.out, resume=args.resume, stop=stop).fit()
        finally:
            signal.signal(signal.SIGTERM, previous)
    except (
        FileNotFoundError,
        FileExistsError,
        NotADirectoryError,  # e.g. --cache-dir naming a file
        ValueError,
        KeyError,
        CheckpointError,
    ) as exc:
        text = f"{exc.args[0] if isinstance(exc, KeyError) else exc}"
        if (
            args.resume
            and isinstance(exc, FileNotFoundError)
            and ("no such folder" in text or ": missing (" in text)
        ):
            text += (
                " (the run's data folders, as its config.json gives them; a corpus moved elsewhere: give its "
                "folders again with --speech/--noise/--val-pairs or --root)"
            )
        elif args.config and isinstance(exc, FileNotFoundError) and "no such folder" in text:
            # recipes/configs/default.json's ../shared/data, run from outside the checkout
            text += (
                f" (a folder --config {' '.join(args.config)} gives; relative folders in a config are taken "
                f"from where the command runs, here {Path.cwd()}: run it from the folder they are relative to "
                "(the checkout, for the bundled configs' ../shared/data), or give the folders with "
                "--speech/--noise/--val-pairs or --root)"
            )
        print(f"tim-train: error: {text}", file=sys.stderr)
        return 2
    # a full disk, a folder this user cannot read or write: no traceback, and what next
    except OSError as exc:
        then = (
            f"; `--out {args.out} --resume` continues from the last saved state"
            if (Path(args.out) / "state.pt").is_file()
            else ""
        )
        print(f"tim-train: error: {exc}{then}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if (Path(args.out) / "state.pt").is_file():
            then = f"`--out {args.out} --resume` continues from the last saved state"
        else:  # it said --resume, which then found "nothing to resume"
            then = "nothing was saved yet: the same command starts the run again"
        print(f"tim-train: interrupted; {then}", file=sys.stderr)
        return 130
    if result and int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result))
    if result.get("stopped") == SIGTERM_REASON:  # not a run that ended while the stop waited for it
        print(
            f"tim-train: terminated; `--out {args.out} --resume` continues from where it stopped",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    return 0


SIGTERM_REASON = "SIGTERM"


def _stop_on_sigterm(stop: StopRequest) -> Any:
    """SIGTERM (a batch scheduler's stop, ``kill``): once training has started, the run stops at the next step
    with its state saved there; before (the data being scanned), and at a second one, it stops at once (exit
    143; the last saved state stays). Returns the handler it replaced."""

    def handler(signum: int, frame: Any) -> None:
        if stop.reason is not None or not stop.armed:
            print("tim-train: terminated", file=sys.stderr)
            raise SystemExit(128 + signum)
        stop.reason = SIGTERM_REASON

    return signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
