"""The one trainer of every recipe: Adam, MSE on log1p magnitudes, lr halved on validation plateaus.

Exact resume: the data order of epoch e is a seeded permutation and every example depends only on
``(seed, epoch, index)``; ``state.pt`` (saved every ``save_every_steps`` and at each epoch end) holds the model,
optimizer, scheduler, RNG states, the weight average if the run keeps one (``ema_decay``) and the position
``(epoch, step)``, so ``--resume`` runs the same next batch with the same optimizer state as the killed run would
have. With a weight average, validation (and so the lr schedule and the choice of ``best.safetensors``) and both
checkpoints use the average; the raw weights live in ``state.pt`` only.

Distributed: under ``torchrun`` (``WORLD_SIZE > 1``) each of the W processes takes every W-th example of each
global batch (so the global batch stays ``batch_size``), gradients are averaged by DDP, rank 0 validates and writes;
``state.pt`` holds every rank's random generators, so a resume with the same number of processes is exact too.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel

from models.checkpoint import load_checkpoint, load_state_strict, save_checkpoint
from models.config_io import from_dict, to_dict
from models.enhancer import Enhancer
from models.registry import get_config
from recipes import run_folder
from recipes.bcd import BCD, BCDConfig
from recipes.datasets import DataConfig, RecipeData, build, collate, describe_skipped
from recipes.dc_blocked import DCBlockedDataset
from recipes.distributed import Distributed, EpochBatches, cfg_seed_for, pick_device
from recipes.ema import WeightEMA
from recipes.losses import loss_fn
from recipes.validation import validate

# TrainConfig.select_by: the validation column each choice reads
SELECT_BY = {"loss": "val_loss", "pmsqe": "val_pmsqe"}


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tim"
    epochs: int = 50
    batch_size: int = 16
    lr: float = 2e-4
    # epochs without validation improvement (by > 0.01 %, relative) that are allowed: the next one halves the lr
    lr_patience: int = 5
    lr_factor: float = 0.5
    grad_clip: float = 5.0  # max global grad norm (not in the paper; a guard against rare spikes)
    seed: int = 0
    num_workers: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: bool = True  # bf16 autocast on CUDA; ignored on CPU
    save_every_steps: int = 25
    log_every_steps: int = 10
    max_steps_per_epoch: int | None = None  # for smoke tests and quick looks
    threads: int | None = None  # torch intra-op threads on CPU (default: torch's choice)
    # wall-clock minutes this process may train (None: no limit): it stops before an epoch that would not finish
    # in time (judged by the last epoch's length) or, at the latest, after the step that crosses the limit, with
    # state.pt saved, so --resume continues exactly. For machines lent for a fixed time.
    time_budget_minutes: float | None = None
    # start from these weights (a .safetensors checkpoint of the same architecture), with a fresh optimizer: how a
    # later session continues a run whose run folder (state.pt) it does not have. --resume is the exact way.
    init_from: str | None = None
    # block-coordinate descent for MAE models (None: gates and experts trained jointly, the plain gradient)
    bcd: BCDConfig | None = None
    # an extra loss term, low_level_weight * MSE(log(|pred| + floor), log(|clean| + floor)) (0: the paper's objective
    # alone). log1p is almost linear below |X| ~ 1, so the paper's MSE barely sees residual noise in pauses; this
    # term counts errors there relatively (as dB), for over- and under-suppression alike. Experimental.
    # Validation (val_loss, which picks best.safetensors) stays the paper's log1p MSE, so runs remain comparable.
    low_level_weight: float = 0.0
    low_level_floor: float = 0.01
    # asymmetric MSE: errors where the prediction is above the clean target (noise left in) count
    # (1 + over_weight) times; 0 is the paper's symmetric loss. Validation stays symmetric. Experimental.
    over_weight: float = 0.0
    # pmsqe_weight * PMSQE (recipes.pmsqe: PESQ's symmetric and asymmetric loudness disturbances, differentiable,
    # per frame) of the predicted against the clean magnitude, added to the loss (0: off). Aims the training at
    # what PESQ measures, where the log1p MSE and PESQ part ways. Validation stays the log1p MSE. Experimental.
    pmsqe_weight: float = 0.0
    # that term's per-band equalisation as PESQ does it (PMSQE(as_pesq=True)) instead of as the published PMSQE
    pmsqe_as_pesq: bool = False
    # exponential moving average of the weights (recipes.ema.WeightEMA; 0: off): validation, best.safetensors and
    # last.safetensors then hold the averaged weights; state.pt keeps both, so --resume stays exact.
    ema_decay: float = 0.0
    # the validation figure that picks best.safetensors and drives the plateau schedule: "loss" (the paper's log1p
    # MSE, val_loss) or "pmsqe" (val_pmsqe, PESQ-like; for runs with a PMSQE term, whose log1p loss rises while
    # PESQ improves). Lower is better for both.
    select_by: str = "loss"

    def __post_init__(self) -> None:
        at_least_one = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "save_every_steps": self.save_every_steps,
            "log_every_steps": self.log_every_steps,
            "max_steps_per_epoch": self.max_steps_per_epoch,
            "threads": self.threads,
        }
        for name, value in at_least_one.items():
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.seed < 0:  # numpy's seed sequences take none (they said so after the data scan)
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not (
            0 < self.lr < math.inf and 0 < self.lr_factor < 1 and self.lr_patience >= 0 and self.grad_clip > 0
        ):
            raise ValueError(
                "lr must be finite and > 0, grad_clip > 0, lr_factor in (0, 1), lr_patience >= 0"
            )
        if (
            self.time_budget_minutes is not None and not self.time_budget_minutes >= 0
        ):  # 0: one step, then stop
            raise ValueError(f"time_budget_minutes must be >= 0, got {self.time_budget_minutes}")
        if self.low_level_weight < 0 or self.low_level_floor <= 0:
            raise ValueError("low_level_weight must be >= 0 and low_level_floor > 0")
        if self.over_weight < 0:
            raise ValueError("over_weight must be >= 0")
        if self.pmsqe_weight < 0:
            raise ValueError("pmsqe_weight must be >= 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0: off), got {self.ema_decay}")
        if self.select_by not in SELECT_BY:
            raise ValueError(f"select_by must be one of {', '.join(SELECT_BY)}, got {self.select_by!r}")


@dataclass(frozen=True)
class RunConfig:
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)


# settings added to RunConfig after runs were saved without them, with the value that reproduces what those runs
# did (not the new default): DataConfig.dc_blocker (session 26; runs before it trained on unfiltered audio),
# DataConfig.val_spread (session 36; runs before it validated on the first segments of the held-out files)
LEGACY_DATA = {"dc_blocker": False, "val_spread": False}


def saved_run_config(raw: dict[str, Any]) -> RunConfig:
    """A run's saved configuration (config.json, state.pt), as the run was trained: a setting it predates takes
    the value :data:`LEGACY_DATA` gives, so ``--resume`` continues it exactly."""
    return from_dict(RunConfig, {**raw, "data": {**LEGACY_DATA, **raw.get("data", {})}})


@dataclass
class Position:
    epoch: int = 0
    step: int = 0  # next step within the epoch
    global_step: int = 0
    best_val: float = math.inf
    best_epoch: int = -1
    # running sums of the current epoch, so that a resumed epoch reports the same train loss
    loss_sum: float = 0.0
    loss_count: int = 0
    audio_seconds: float = 0.0
    compute_seconds: float = 0.0


def steps_per_epoch(n_examples: int, cfg: TrainConfig) -> int:
    n = max(1, n_examples // cfg.batch_size)
    return min(n, cfg.max_steps_per_epoch) if cfg.max_steps_per_epoch else n


@dataclass
class StopRequest:
    """A request to stop at the next step, with the state saved there (``tim-train`` sets it on SIGTERM, as batch
    schedulers stop jobs: the steps since the last periodic save were lost). ``reason`` None: go on. ``armed``:
    training has started (set by :meth:`Trainer.fit`); before, while the data is scanned, there is nothing to
    save and a stop should not wait."""

    reason: str | None = None
    armed: bool = False


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | os.PathLike[str],
        resume: bool = False,
        stop: StopRequest | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.resume = cfg, Path(run_dir), resume
        self.stop = stop or StopRequest()
        self.dist = Distributed()
        self.device = pick_device(cfg.train.device, self.dist.local_rank)
        self.dist.init(self.device)
        if cfg.train.threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.train.threads)
        self.amp = cfg.train.amp and self.device.type == "cuda"
        if cfg.train.batch_size % self.dist.world:
            raise ValueError(
                f"batch_size {cfg.train.batch_size} must divide by the world size {self.dist.world}"
            )

        torch.manual_seed(cfg.train.seed)
        self.model = Enhancer(get_config(cfg.train.model)).to(self.device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr)
        self.bcd = BCD(self.model, cfg.train.bcd) if cfg.train.bcd is not None else None
        self.sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.opt, mode="min", factor=cfg.train.lr_factor, patience=cfg.train.lr_patience
        )
        self.pos = Position()
        self.clock: Callable[[], float] = time.monotonic  # the time budget's clock (a test may give its own)
        self._started = 0.0  # fit() sets it: the time budget counts from there
        if cfg.train.init_from and not (self.run_dir / "state.pt").is_file():
            init = load_checkpoint(cfg.train.init_from)
            load_state_strict(self.model, init.model.state_dict(), cfg.train.init_from)
        # the average starts from the starting weights: init_from's (trained, so no warm-up), or the seeded random
        # ones (a warm-up, so they fade fast). Only rank 0 validates and saves, so only it keeps one.
        self.ema = (
            WeightEMA(self.model, cfg.train.ema_decay, warmup=not cfg.train.init_from)
            if cfg.train.ema_decay > 0 and self.dist.is_main
            else None
        )
        # per-rank dropout masks (the weights are rank 0's, broadcast by DDP)
        torch.manual_seed(cfg.train.seed + 1_000_003 * self.dist.rank)
        # a resumed run's data as its state.pt describes it: (description, fingerprint; None before session 23)
        self._resumed_data: tuple[str | None, str | None] | None = None
        made = not self.run_dir.exists()
        try:
            self._prepare_run_dir()
            self.data: RecipeData = build(cfg.data, cfg.train.seed)
            self._check_resumed_data()
        except BaseException:  # refused: the folder is free for the next try, in this process or another
            if made and self.dist.is_main:  # and not left behind holding only its lock (removed while held)
                run_folder.remove_if_only_lock(self.run_dir)
            run_folder.release(self.run_dir)
            raise
        self._record_run()
        self.net: torch.nn.Module = (
            DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=self.bcd is not None,  # F steps do not use the gates
            )
            if self.dist.active
            else self.model
        )

    # ----------------------------------------------------------------- run folder
    def _check_resumed_data(self) -> None:
        """Refuse to resume on other data than the run's (runs saved before fingerprints: the counts only)."""
        if self._resumed_data is None:
            return
        then, fingerprint = self._resumed_data
        now = self.data.description
        if then == now and fingerprint in (None, self.data.fingerprint):
            return
        what = (
            f"then: {then}; now: {now}"
            if then != now
            else f"{now}, as then, but files were renamed, replaced or edited, or this version of the recipes "
            "picks them differently (links to listed files are used once since session 36)"
        )
        raise ValueError(
            f"--resume: the data changed since the run started ({what}), so it cannot continue exactly; "
            f"start a new run with --init-from {self.run_dir / 'last.safetensors'} to go on training these "
            "weights (their average, if the run keeps one) on the new data"
        )

    def _prepare_run_dir(self) -> None:
        state_path = self.run_dir / "state.pt"
        if self.dist.is_main and self.run_dir.is_dir():  # before reading what another run may be writing
            run_folder.hold(self.run_dir)
        if state_path.is_file():
            if not self.resume:
                raise FileExistsError(
                    f"{self.run_dir} already holds a run; pass --resume or choose a new folder"
                )
            saved = run_folder.load_state(state_path)
            # Round-trip the saved config so fields added since it was written take what the run did.
            changed = config_changes(saved_run_config(saved["config"]), self.cfg)
            if changed:
                raise ValueError(  # (config.json edited by hand says so too: "then" is what state.pt holds)
                    f"{self.run_dir}: --resume with a different configuration than the one its state.pt was "
                    f"saved with ({'; '.join(changed)}; from config.json or the flags and --config files given)"
                )
            self.model.load_state_dict(saved["model"])
            self.opt.load_state_dict(saved["optimizer"])
            self.sched.load_state_dict(saved["scheduler"])
            if self.ema is not None:
                self.ema.load_state_dict(saved["ema"])
            self.pos = Position(**saved["position"])
            if self.pos.epoch > self.cfg.train.epochs:
                raise ValueError(
                    f"--epochs {self.cfg.train.epochs}: the run has already done {self.pos.epoch} epochs"
                )
            self._resumed_data = (saved.get("data"), saved.get("data_fingerprint"))
            metrics = self.run_dir / "metrics.csv"
            if self.dist.is_main and metrics.is_file():
                run_folder.truncate_csv(metrics, lambda row: int(row["epoch"]) <= self.pos.epoch)
            self._restore_rng(saved["rng"])
        elif self.resume:
            raise FileNotFoundError(f"{state_path}: nothing to resume")
        elif self.dist.is_main:  # files of an earlier run with no state to continue it: this run's metrics
            # would follow its rows. Checked by the main rank only: the others could look after it had written
            # this run's config.json and take it for a foreign one (a DDP test failed so, once in five CI runs);
            # its refusal ends them (torchrun stops the group)
            earlier = run_folder.trained_files(self.run_dir)  # (no state.pt here)
            if earlier:
                raise FileExistsError(
                    f"{self.run_dir} holds {', '.join(earlier)} of an earlier run but no state.pt to resume it "
                    "from; choose a new folder, or remove those files to start this one there"
                )
            foreign = run_folder.foreign_files(self.run_dir)
            if foreign:
                raise FileExistsError(
                    f"{self.run_dir} holds {' and '.join(foreign)} that no run wrote (no env.json beside it), "
                    "which this run would replace: choose another --out"
                )
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            run_folder.hold(self.run_dir)
            # a run killed while writing a file leaves its temporary (atomic_path's ".<name>.*.tmp"): never read,
            # and the file it was for is intact, so it only needs removing
            for stale in self.run_dir.glob(".*.tmp"):
                stale.unlink(missing_ok=True)

    def _record_run(self) -> None:
        """``config.json`` and ``env.json``, written once the run is known to go ahead: a refused ``--resume`` (a
        changed flag, a missing data folder, changed data) leaves the folder as it was; it rewrote them before.
        A resume keeps the earlier sessions' environments in ``env.json``'s ``earlier`` (a GPU run resumed once on
        a CPU was called a CPU run), and a finished run resumed with nothing to train leaves ``env.json`` alone."""
        if not self.dist.is_main:
            return
        run_folder.write_json(self.run_dir / "config.json", to_dict(self.cfg))
        path = self.run_dir / "env.json"
        if self.pos.epoch >= self.cfg.train.epochs and path.is_file():
            return
        env = run_folder.environment(self.cfg.train.seed, self.dist.world, str(self.device))
        if self.resume and path.is_file():
            try:
                previous = json.loads(path.read_text())
            except (OSError, ValueError):
                previous = None
            if isinstance(previous, dict):
                env["earlier"] = [*previous.pop("earlier", []), previous]
        run_folder.write_json(path, env)

    def _rng_bytes(self) -> torch.Tensor:
        """This rank's generators (CPU, and its CUDA device's) as one uint8 tensor."""
        parts = [torch.get_rng_state()]
        if self.device.type == "cuda":
            parts.append(torch.cuda.get_rng_state(self.device))
        return torch.cat(parts)

    def _set_rng_bytes(self, state: torch.Tensor) -> None:
        n_cpu = torch.get_rng_state().numel()
        torch.set_rng_state(state[:n_cpu].clone())
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state[n_cpu:].clone(), self.device)

    def _restore_rng(self, saved: dict[str, Any]) -> None:
        ranks = saved.get("ranks")
        if ranks is not None and len(ranks) == self.dist.world:  # the same number of processes: each its own
            self._set_rng_bytes(ranks[self.dist.rank])
            return
        # saved before session 33, or by another number of processes: rank 0's generators, and the other ranks
        # draw fresh masks (close to the uninterrupted run, not equal)
        torch.set_rng_state(saved["torch"])
        if self.dist.rank > 0:
            torch.manual_seed(cfg_seed_for(self.cfg.train.seed, self.dist.rank, self.pos.global_step))
        if torch.cuda.is_available() and saved.get("cuda") is not None:
            torch.cuda.set_rng_state_all(saved["cuda"])
            if self.dist.rank > 0:  # rank 0 saved only its own stream: others draw fresh ones here too
                torch.cuda.manual_seed(
                    cfg_seed_for(self.cfg.train.seed, self.dist.rank, self.pos.global_step)
                )

    def _save_state(self) -> None:
        self._check_weights()  # every rank holds the same weights: all stop alike
        # every rank's generators (its dropout masks), so that a resume goes on exactly on every rank
        ranks = self.dist.gather_bytes(self._rng_bytes(), self.device)
        if not self.dist.is_main:
            return
        state = {
            "config": to_dict(self.cfg),
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "position": self.pos.__dict__.copy(),
            "data": self.data.description,  # --resume checks that the folders still hold the same files
            "data_fingerprint": self.data.fingerprint,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all()
                if torch.cuda.is_available()
                else None,  # (read before 33)
                "ranks": ranks,
            },
        }
        run_folder.save_state(self.run_dir / "state.pt", state)

    def _training_meta(self, val: dict[str, float]) -> dict[str, Any]:
        return {
            "recipe": self.cfg.data.recipe,
            "data": self.data.description,
            "epochs_done": self.pos.epoch + 1,
            "epochs_planned": self.cfg.train.epochs,
            "global_step": self.pos.global_step,
            "seed": self.cfg.train.seed,
            **({"weights": self._averaged_words()} if self.ema is not None else {}),
            **val,
        }

    def _averaged_words(self) -> str:
        assert self.ema is not None
        words = f"moving average, decay {self.ema.decay:g}, {self.ema.updates} updates"
        return words + (f", warm-up (decay now {self.ema.current_decay():.5f})" if self.ema.warmup else "")

    # ----------------------------------------------------------------- loop
    def fit(self) -> dict[str, Any]:
        """Train to the planned epochs (or the time budget); the run folder is free again afterwards."""
        try:
            return self._fit()
        finally:
            run_folder.release(self.run_dir)

    def _fit(self) -> dict[str, Any]:
        cfg = self.cfg.train
        self.stop.armed = True
        if self.dist.is_main:
            print(
                f"[train] {cfg.model}: {self.data.description}; device {self.device}, world {self.dist.world}",
                flush=True,
            )
            if self.data.skipped:
                run_folder.write_text(
                    self.run_dir / "skipped.txt", describe_skipped(self.data.skipped) + "\n"
                )
                print(
                    f"[train] skipped {len(self.data.skipped)} file(s), see {self.run_dir / 'skipped.txt'}",
                    flush=True,
                )
        if self.pos.epoch >= cfg.epochs and self.dist.is_main:
            print(
                f"[train] {self.run_dir} has done all of its {cfg.epochs} epochs: nothing to train "
                "(--resume --epochs N extends it)",
                flush=True,
            )
        last: dict[str, Any] = {}
        self._started = self.clock()
        epoch_seconds = 0.0
        while self.pos.epoch < cfg.epochs:
            # the next epoch would not finish in time (known once an epoch ran whole), or a stop was asked for
            # during the last validation
            reason = self._why_stop(
                epoch_seconds or None, "time budget: the next epoch would not finish in time"
            )
            if reason is not None:
                return self._stop(last, reason)
            t0, whole = self.clock(), self.pos.step == 0
            last = self._epoch()
            if "stopped" in last:
                return last
            if whole:  # a resumed partial epoch would underestimate the next one
                epoch_seconds = self.clock() - t0
        self.dist.barrier()
        return last

    def _why_stop(self, reserve: float | None = 0.0, out_of_time: str = "time budget") -> str | None:
        """Why the run stops here, None when it goes on: :attr:`stop` asks to, or no more than ``reserve``
        seconds of the time budget are left (``out_of_time`` says so; ``reserve`` None: the budget is not
        checked). Every rank must stop at the same step: rank 0's request and clock decide, in one broadcast."""
        budget = self.cfg.train.time_budget_minutes
        spent = (
            budget is not None
            and reserve is not None
            and budget * 60.0 - (self.clock() - self._started) - reserve <= 0
        )
        decision = self.dist.broadcast_float(2.0 if self.stop.reason else 1.0 if spent else 0.0, self.device)
        if decision == 0:
            return None
        return out_of_time if decision == 1 else self.stop.reason or "stop requested"

    def _stop(self, last: dict[str, Any], reason: str) -> dict[str, Any]:
        self._save_state()
        self.dist.barrier()
        if self.dist.is_main:
            print(
                f"[train] stopped at epoch {self.pos.epoch + 1} step {self.pos.step} ({reason}); "
                f"--resume continues",
                flush=True,
            )
        return {**last, "stopped": reason, "next_epoch": self.pos.epoch + 1, "next_step": self.pos.step}

    def _epoch(self) -> dict[str, Any]:
        cfg, pos = self.cfg.train, self.pos
        ds = DCBlockedDataset(self.data.train) if self.cfg.data.dc_blocker else self.data.train
        order = ds.order(pos.epoch)
        n_steps = steps_per_epoch(len(order), cfg)
        batches = EpochBatches(
            order, pos.epoch, cfg.batch_size, pos.step, n_steps, self.dist.rank, self.dist.world
        )
        loader = torch.utils.data.DataLoader(
            ds,
            batch_sampler=batches,
            collate_fn=collate,
            num_workers=cfg.num_workers,
            # its own generator: iterating a loader must not consume the global RNG (dropout), or a resumed
            # run would draw different dropout masks than the run it continues
            generator=torch.Generator().manual_seed(cfg.seed),
        )
        bar = _progress(len(batches), f"epoch {pos.epoch + 1}/{cfg.epochs}", self.dist.is_main)
        self.net.train()
        seg_seconds = self.cfg.data.mixing.segment_seconds
        for noisy, clean in loader:
            t0 = time.perf_counter()
            phase = self.bcd.before_forward(pos.global_step) if self.bcd is not None else ""
            t = self.cfg.train
            loss = loss_fn(
                self.net,
                noisy.to(self.device),
                clean.to(self.device),
                self.amp,
                t.low_level_weight,
                t.low_level_floor,
                t.over_weight,
                t.pmsqe_weight,
                t.pmsqe_as_pesq,
            )
            value = self.dist.mean(float(loss.item()), self.device)  # every rank sees the same
            if not math.isfinite(value):  # before the step
                self._diverged(f"the loss is {value} at epoch {pos.epoch + 1} step {pos.step + 1}")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.bcd is not None:
                self.bcd.after_backward(phase)
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.opt.step()
            if self.ema is not None:
                self.ema.update(self.model)
            pos.compute_seconds += time.perf_counter() - t0
            pos.loss_sum += value
            pos.loss_count += 1
            pos.audio_seconds += noisy.shape[0] * self.dist.world * seg_seconds
            pos.step += 1
            pos.global_step += 1
            rate = pos.audio_seconds / max(pos.compute_seconds, 1e-9)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{pos.loss_sum / pos.loss_count:.4f}", audio_s_per_s=f"{rate:.1f}")
            elif self.dist.is_main and pos.step % cfg.log_every_steps == 0:
                print(
                    f"[train] epoch {pos.epoch + 1} step {pos.step}/{n_steps} loss {pos.loss_sum / pos.loss_count:.4f}"
                    f" ({rate:.1f} audio s/s)",
                    flush=True,
                )
            if pos.step % cfg.save_every_steps == 0 and pos.step < n_steps:
                self._save_state()
            reason = self._why_stop() if pos.step < n_steps else None
            if reason is not None:
                if bar is not None:
                    bar.close()
                return self._stop({}, reason)
        if bar is not None:
            bar.close()
        return self._end_epoch()

    def _end_epoch(self) -> dict[str, Any]:
        pos = self.pos
        with self._shipped_weights() as model:  # the average, when the run keeps one
            row = self._validate_and_save(model)
        pos.epoch += 1
        pos.step = 0
        pos.loss_sum, pos.loss_count, pos.audio_seconds, pos.compute_seconds = 0.0, 0, 0.0, 0.0
        self._save_state()
        self.dist.barrier()
        return row

    @contextmanager
    def _shipped_weights(self) -> Iterator[Enhancer]:
        """The model with the weights a checkpoint ships: the moving average if the run keeps one, else its own."""
        if self.ema is None:
            yield self.model
        else:
            with self.ema.applied(self.model) as model:
                assert isinstance(model, Enhancer)
                yield model

    def _diverged(self, what: str) -> NoReturn:
        raise ValueError(
            f"training diverged: {what}; start a new run "
            "with a lower --lr or other loss settings (a --resume repeats the same steps). The checkpoints and "
            "the state saved before hold finite weights"
        )

    def _check_weights(self) -> None:
        """Before anything is saved: a step can make weights infinite while its loss was still finite, and a
        checkpoint of them is one that every loader refuses."""
        bad = [
            n for n, t in self.model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()
        ]
        if bad:
            names = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
            self._diverged(
                f"NaN or infinite weights ({names}) after epoch {self.pos.epoch + 1} step {self.pos.step}"
            )

    def _validate_and_save(self, model: Enhancer) -> dict[str, Any]:
        """Validation of ``model``, the scheduler step, its best/last checkpoints and the CSV row of the epoch."""
        self._check_weights()
        pos = self.pos
        key = SELECT_BY[self.cfg.train.select_by]
        val = (
            validate(model, self.data.val, self.device, self.cfg.data.dc_blocker)
            if self.dist.is_main
            else {key: 0.0}
        )
        val[key] = score = self.dist.broadcast_float(
            val[key], self.device
        )  # every rank steps the schedule alike
        self.sched.step(score)
        row = {
            "epoch": pos.epoch + 1,
            "global_step": pos.global_step,
            "train_loss": pos.loss_sum / max(pos.loss_count, 1),
            "val_loss": val.get("val_loss", math.nan),
            "val_si_sdr": val.get("val_si_sdr", math.nan),
            "val_pmsqe": val.get("val_pmsqe", math.nan),
            "lr": self.opt.param_groups[0]["lr"],
            "audio_s_per_s": pos.audio_seconds / max(pos.compute_seconds, 1e-9),
        }
        improved = score < pos.best_val
        if improved:
            pos.best_val, pos.best_epoch = score, pos.epoch + 1
        if self.dist.is_main:
            meta = self._training_meta({k: float(v) for k, v in val.items()})
            if improved:
                save_checkpoint(self.run_dir / "best.safetensors", model, self.cfg.train.model, meta)
            save_checkpoint(self.run_dir / "last.safetensors", model, self.cfg.train.model, meta)
            run_folder.append_csv(self.run_dir / "metrics.csv", row)
            print(
                f"[train] epoch {row['epoch']}: train {row['train_loss']:.4f} val {row['val_loss']:.4f} "
                f"si-sdr {row['val_si_sdr']:.2f} dB pmsqe {row['val_pmsqe']:.3f} lr {row['lr']:.2e}"
                + (" (best)" if improved else ""),
                flush=True,
            )
        return row


def _progress(total: int, desc: str, main: bool):  # -> tqdm | None
    if not (main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


# Settings that decide where and how fast a run executes, not what it computes: a
# resumed run may change them (another machine, fewer cores).
RUNTIME_FIELDS = ("device", "threads", "num_workers", "time_budget_minutes")
# ... and "epochs", which only says where the run stops (no schedule depends on it): a finished run can be
# extended, and equals a run started with the larger number.
RESUME_OVERRIDES = (*RUNTIME_FIELDS, "epochs")
# where the data is (data.*): a corpus moved to another folder or machine may be given again on --resume; the
# data's fingerprint (recipes.audio_pool.content_fingerprint: file names, sizes and ends, not folders) then checks
# that it is the same data
DATA_LOCATIONS = ("root", "speech", "noise", "val_pairs", "cache_dir")


def _differences(then: Any, now: Any, where: str = "") -> list[str]:
    """The keys (dotted) whose values differ between two configurations, with both values."""
    if isinstance(then, dict) and isinstance(now, dict):
        return [
            d
            for key in sorted(set(then) | set(now))
            for d in _differences(then.get(key), now.get(key), f"{where}.{key}" if where else key)
        ]
    return [] if then == now else [f"{where}: {then!r} then, {now!r} now"]


def config_changes(then: RunConfig, now: RunConfig) -> list[str]:
    """How ``now`` would change what a run configured as ``then`` computes (the flags a resume may change left
    out), as "key: OLD then, NEW now" lines; empty when it would not."""
    return _differences(_without_runtime(to_dict(then)), _without_runtime(to_dict(now)))


def _without_runtime(config: dict[str, Any]) -> dict[str, Any]:
    train = {k: v for k, v in config.get("train", {}).items() if k not in RESUME_OVERRIDES}
    data = {k: v for k, v in config.get("data", {}).items() if k not in DATA_LOCATIONS}
    return {**config, "train": train, "data": data}
