"""Training and validation data of every recipe, built from a :class:`DataConfig`.

* ``folders``: any folder(s) of clean speech + any folder(s) of noise, dynamic mixing; validation on a folder of
  noisy/clean pairs (``val_pairs``, e.g. the shared dev set) or on fixed mixes of held-out files.
* ``dns``: the DNS Challenge (Interspeech 2020) tree, ``datasets/clean`` + ``datasets/noise`` mixed on the fly at
  SNR uniform in [0, 40] dB; validation on fixed mixes of held-out clean and noise files (never the test set).
* ``voicebank``: VoiceBank-DEMAND ``{clean,noisy}_trainset_{28,56}spk_wav``, resampled 48 -> 16 kHz once into a
  cache; validation on two training speakers held out of training (never the test set).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from enhance.atomic_files import atomic_path
from enhance.audio_io import AudioError, fs_path, load_audio, load_mono_16k, resample
from recipes.audio_pool import SILENCE_PEAK, AudioPool, Skipped, content_fingerprint, list_audio, scan
from recipes.mixing import MixingConfig, MixingDataset, mix, why_none
from recipes.paired_crops import PairedDataset
from recipes.pairs import find_pairs, length_problem

log = logging.getLogger(__name__)

RECIPES = ("folders", "dns", "voicebank")
VOICEBANK_TRAINSETS = ("28spk", "56spk")
# held out of the 28-speaker training set; on another set (the 56-speaker one, a test's tree) that lacks them, the
# default holds out that set's last two speakers instead, with a warning (named speakers must be there)
VOICEBANK_VAL_SPEAKERS = ("p226", "p287")


@dataclass(frozen=True)
class DataConfig:
    recipe: str = "folders"
    root: str | None = None  # DNS-Challenge or VoiceBank-DEMAND folder
    speech: tuple[str, ...] = ()  # folders recipe
    noise: tuple[str, ...] = ()  # folders recipe
    val_pairs: str | None = None  # a folder of noisy/clean pairs (layouts of recipes.pairs)
    # fraction of files held out for validation mixes when there are no val_pairs (at most val_examples files)
    val_holdout: float = 0.05
    val_examples: int = 64
    # validation mixes spread over the held-out files, and no more files held out than they use (False: the
    # first val_examples segments, a few files, and val_holdout of the files, as runs saved before session 36)
    val_spread: bool = True
    voicebank_trainset: str = "28spk"
    voicebank_val_speakers: tuple[str, ...] = VOICEBANK_VAL_SPEAKERS
    cache_dir: str | None = None  # where VoiceBank is resampled to 16 kHz (default ~/.cache/tim-enhance)
    min_seconds: float = 0.5
    # training mixtures and targets, and the validation input, through the product's 5-Hz DC blocker, as every
    # engine feeds the model (recipes.dc_blocked; every recipe). Runs saved before it existed read as off.
    dc_blocker: bool = True
    mixing: MixingConfig = field(default_factory=MixingConfig)

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown recipe '{self.recipe}'; known: {', '.join(RECIPES)}")
        if not 0 < self.val_holdout < 1:
            raise ValueError(f"val_holdout is a fraction of the files, in (0, 1), got {self.val_holdout}")
        if self.val_examples < 1:
            raise ValueError(f"val_examples must be >= 1, got {self.val_examples}")
        if self.voicebank_trainset not in VOICEBANK_TRAINSETS:  # "56" failed as a missing folder
            raise ValueError(
                f"voicebank_trainset is one of {', '.join(VOICEBANK_TRAINSETS)} (the {{clean,noisy}}_trainset_"
                f"<set>_wav folders), got {self.voicebank_trainset!r}"
            )
        ignored = self.ignored()
        if ignored:  # it would be recorded in config.json (and a model card) as if it had been applied
            raise ValueError(
                f"the {self.recipe} recipe does not use {', '.join('data.' + k for k in ignored)}; remove "
                f"{'it' if len(ignored) == 1 else 'them'} from the config files and flags"
            )

    def ignored(self) -> list[str]:
        """The settings this recipe would not apply: the folders recipe's speech/noise/val_pairs elsewhere, root
        with it, the VoiceBank settings elsewhere, and any mixing setting but the segment length with VoiceBank
        (its pairs come mixed)."""
        out = []
        if self.recipe == "folders":
            out += ["root"] if self.root is not None else []
        else:
            out += [k for k in ("speech", "noise", "val_pairs") if getattr(self, k)]
        if self.recipe == "voicebank":
            default = MixingConfig()
            out += [
                f"mixing.{f.name}"
                for f in dataclasses.fields(MixingConfig)
                if f.name not in ("segment_seconds", "sample_rate")
                and getattr(self.mixing, f.name) != getattr(default, f.name)
            ]
        else:
            default_data = DataConfig.__dataclass_fields__
            out += [
                k
                for k in ("voicebank_trainset", "voicebank_val_speakers")
                if getattr(self, k) != default_data[k].default
            ]
        return out


@dataclass
class ValPair:
    name: str
    noisy: np.ndarray  # [samples] float32, 16 kHz
    clean: np.ndarray


@dataclass
class RecipeData:
    train: MixingDataset | PairedDataset
    val: list[ValPair]
    skipped: list[Skipped]
    description: str
    fingerprint: str  # the files' names, sizes and ends, and the validation samples (content_fingerprint)


def build(cfg: DataConfig, seed: int) -> RecipeData:
    if cfg.recipe == "folders":
        return _folders(cfg, seed)
    if cfg.recipe == "dns":
        if cfg.root is None:
            raise ValueError("the dns recipe needs root (the DNS-Challenge folder)")
        root = Path(cfg.root)
        folders = [root / "datasets" / "clean", root / "datasets" / "noise"]
        # (it was "no such folder", with a hint about --config's relative folders, when --root was wrong)
        for d in folders:
            if not d.is_dir():
                raise FileNotFoundError(
                    f"{d}: missing (expected the DNS Challenge layout: {root}/datasets/clean and "
                    f"{root}/datasets/noise; --root names the folder holding datasets/)"
                )
        return _mixing(cfg, seed, [str(folders[0])], [str(folders[1])], None)
    return _voicebank(cfg, seed)


def _folders(cfg: DataConfig, seed: int) -> RecipeData:
    if not cfg.speech or not cfg.noise:
        raise ValueError("the folders recipe needs speech and noise folders")
    return _mixing(cfg, seed, list(cfg.speech), list(cfg.noise), cfg.val_pairs)


def _mixing(
    cfg: DataConfig, seed: int, speech_dirs: list[str], noise_dirs: list[str], val_pairs: str | None
) -> RecipeData:
    rate = cfg.mixing.sample_rate
    speech = scan(list_audio(speech_dirs), rate, cfg.min_seconds)
    noise = scan(list_audio(noise_dirs), rate, cfg.min_seconds)
    skipped = speech.skipped + noise.skipped
    # a speech folder that holds the noise folder (--speech my --noise my/noise) trained on noise as clean speech
    speech, out = _leave_out(
        speech, _real_paths(noise.paths), "also a noise file (noise): not used as speech"
    )
    skipped += out
    if val_pairs is not None:
        val, bad = load_val_pairs(val_pairs, cfg.min_seconds)
        skipped += bad
        # nor may the validation pairs train (--speech my --val-pairs my/dev): the model was then chosen on files it
        # trained on, and their noisy sides were clean targets
        held = _real_paths(
            str(p) for pair in find_pairs(val_pairs, []) for p in (pair.noisy_path, pair.clean_path)
        )
        why = "a validation pair's file (val_pairs): not trained on"
        train_speech, out = _leave_out(speech, held, why)
        train_noise, out_noise = _leave_out(noise, held, why)
        skipped += out + out_noise
    else:
        # at most as many files as the validation mixes can use: 5 % of DNS's 60,000 clean files took 25 h out of
        # training for 64 mixes
        most = cfg.val_examples if cfg.val_spread else None
        hint = " (or give validation pairs: --val-pairs)" if cfg.recipe == "folders" else ""
        train_speech, val_speech = split_pool(speech, cfg.val_holdout, seed, "speech", most, hint)
        train_noise, val_noise = split_pool(noise, cfg.val_holdout, seed, "noise", most, hint)
        val = fixed_mixes(val_speech, val_noise, cfg.mixing, cfg.val_examples, seed, cfg.val_spread)
    # decoded once here (below 2 GiB each), shared by the loader's forked workers: examples then cost no
    # decoding, which matters for compressed copies (recipes.compact_corpus) and fast GPUs
    for pool in (train_speech, train_noise):
        pool.preload()
    train = MixingDataset(train_speech, train_noise, cfg.mixing, seed)
    desc = (
        f"{len(train_speech)} speech files ({train_speech.total_seconds / 60:.1f} min), "
        f"{len(train_noise)} noise files ({train_noise.total_seconds / 60:.1f} min), "
        f"{len(val)} validation pairs, {len(skipped)} files skipped"
    )
    files = train_speech.paths + train_noise.paths
    return RecipeData(train, val, skipped, desc, _fingerprint(files, val))


def _real_paths(paths: Iterable[str]) -> set[str]:
    return {os.path.realpath(p) for p in paths}


def _leave_out(pool: AudioPool, real_paths: set[str], reason: str) -> tuple[AudioPool, list[Skipped]]:
    """``pool`` without the files whose real path is in ``real_paths``, and those files as skipped (one log line
    for them all: a dev set inside the speech folder is hundreds of files)."""
    out = [p for p in pool.paths if os.path.realpath(p) in real_paths]
    if not out:
        return pool, []
    log.warning("left %d file(s) out, each %s (e.g. %s)", len(out), reason, out[0])
    dropped = set(out)
    return pool.subset([p for p in pool.paths if p not in dropped]), [Skipped(p, reason) for p in out]


def _fingerprint(files: list[str], val: list[ValPair]) -> str:
    return content_fingerprint(files, [a for pair in val for a in (pair.noisy, pair.clean)])


def split_pool(
    pool: AudioPool, fraction: float, seed: int, what: str = "", most: int | None = None, hint: str = ""
) -> tuple[AudioPool, AudioPool]:
    """Hold out ``fraction`` of the files (at least one, at most ``most``; seeded) for validation; ``what``: the
    pool's name, and ``hint`` what else the recipe could take, for the error."""
    n_val = max(1, min(round(len(pool) * fraction), most or len(pool)))
    if len(pool) == 0:  # why each file was skipped, as the folders recipe with validation pairs says it
        raise ValueError(f"no usable {what + ' ' if what else ''}files{why_none(pool)}")
    if len(pool) < 2:
        raise ValueError(
            f"need at least 2 usable {what + ' ' if what else ''}files to hold one out for validation, got "
            f"{len(pool)}{hint}"
        )
    order = np.random.default_rng([seed, 99]).permutation(len(pool))
    val_idx, train_idx = sorted(order[:n_val]), sorted(order[n_val:])

    return pool.subset([pool.paths[i] for i in train_idx]), pool.subset([pool.paths[i] for i in val_idx])


def fixed_mixes(
    speech: AudioPool, noise: AudioPool, mixing: MixingConfig, n: int, seed: int, spread: bool = True
) -> list[ValPair]:
    """A fixed validation set: ``n`` segments of held-out speech, spread evenly over the held-out files, mixed with
    held-out noise (own seed). The first ``n`` segments were taken: the first few files by name (8 files of
    DNS's 30-s clips)."""
    # one pass: repeats is a training-speed setting and must not change (or pad) the validation set
    ds = MixingDataset(speech, noise, dataclasses.replace(mixing, repeats=1), seed=seed + 7919)
    out = []
    count = min(n, len(ds))
    picks = np.unique(np.linspace(0, len(ds) - 1, count).round().astype(int)) if spread else np.arange(count)
    for i in (int(k) for k in picks):
        noisy, clean = ds[(0, i)]
        out.append(ValPair(f"val_{i:04d}", noisy.numpy(), clean.numpy()))
    return out


def checked_val_pair(
    name: str, noisy: np.ndarray, clean: np.ndarray, paths: tuple[Path, Path], min_seconds: float
) -> ValPair | Skipped:
    """A validation pair cut to its shorter side, or why it is skipped (too short, a silent side): these pairs
    decide which checkpoint is kept, so lengths that do not match (:func:`recipes.pairs.length_problem`) skip it
    too. ``paths``: (noisy, clean), for the report."""
    n = min(len(noisy), len(clean))
    if n < min_seconds * 16000:
        return Skipped(str(paths[0]), f"too short ({n / 16000:.2f} s < {min_seconds} s)")
    if np.abs(clean[:n]).max() < SILENCE_PEAK:
        return Skipped(str(paths[1]), "the clean side is silent")
    # as training skips silent files: the SI-SDR of a silent noisy side (-40 dB or so) took the validation mean
    # down by 12 dB with 5 pairs
    if np.abs(noisy[:n]).max() < SILENCE_PEAK:
        return Skipped(str(paths[0]), "the noisy side is silent")
    mismatch = length_problem(len(noisy), len(clean))
    if mismatch:  # cut to the shorter side, it was kept without a word
        return Skipped(str(paths[0]), mismatch)
    return ValPair(name, noisy[:n], clean[:n])


def skipped_for(exc: AudioError, *paths: Path) -> Skipped:
    """A pair skipped for ``exc``, under the file it names (its message starts with that path; else the first
    of ``paths``), the path not repeated in the reason (skipped.txt said "/x/a.wav: /x/a.wav: not a readable
    audio file", and named the noisy file when the clean one was unreadable)."""
    text = str(exc)
    for path in paths:
        if text.startswith(f"{path}: "):
            return Skipped(str(path), text[len(f"{path}: ") :])
    return Skipped(str(paths[0]), text)


def load_val_pairs(root: str, min_seconds: float = 0.5) -> tuple[list[ValPair], list[Skipped]]:
    """Validation pairs from a folder layout known to :mod:`recipes.pairs` (16 kHz mono after loading). Like the
    training files, unreadable, too short and silent (either side) pairs are skipped and listed with the reason, and
    so is a file without a partner (the layout's warnings): they decide which checkpoint is kept."""
    out: list[ValPair] = []
    warnings: list[str] = []
    pairs = find_pairs(root, warnings)
    bad: list[Skipped] = [Skipped(root, w) for w in warnings]
    for pair in pairs:
        try:
            noisy, _, _ = load_mono_16k(pair.noisy_path)
            clean, _, _ = load_mono_16k(pair.clean_path)
        except AudioError as exc:
            bad.append(skipped_for(exc, pair.noisy_path, pair.clean_path))
            continue
        checked = checked_val_pair(pair.name, noisy, clean, (pair.noisy_path, pair.clean_path), min_seconds)
        if isinstance(checked, ValPair):
            out.append(checked)
        else:
            bad.append(checked)
    if not out:
        raise ValueError(f"{root}: no usable validation pairs; skipped:{os.linesep}{describe_skipped(bad)}")
    return out, bad


def _voicebank(cfg: DataConfig, seed: int) -> RecipeData:
    if cfg.root is None:
        raise ValueError("the voicebank recipe needs root (the VoiceBank-DEMAND folder)")
    root = Path(cfg.root)
    tag = cfg.voicebank_trainset
    clean_dir, noisy_dir = root / f"clean_trainset_{tag}_wav", root / f"noisy_trainset_{tag}_wav"
    for d in (clean_dir, noisy_dir):
        if not d.is_dir():
            raise FileNotFoundError(f"{d}: missing (expected the VoiceBank-DEMAND layout)")
    cache = Path(cfg.cache_dir or Path.home() / ".cache" / "tim-enhance") / (
        "voicebank16k-" + hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:10]
    )
    try:  # the raw "[Errno 30] Read-only file system" or "[Errno 20] Not a directory" named no setting
        for side in ("clean", "noisy"):
            (cache / side).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"the VoiceBank cache (--cache-dir, data.cache_dir: {cache.parent}) cannot be made: "
            f"{exc.strerror or exc} ({exc.filename}); give --cache-dir a folder this user can write"
        ) from None
    names = _wav_names(clean_dir)  # .WAV too, as evaluation and the other recipes take it
    skipped: list[Skipped] = [
        Skipped(str(noisy_dir / n), "no clean twin") for n in sorted(set(_wav_names(noisy_dir)) - set(names))
    ]
    pairs: list[tuple[str, str, str]] = []  # (name, noisy16, clean16)
    for name in names:
        if not (noisy_dir / name).is_file():
            skipped.append(Skipped(str(clean_dir / name), "no noisy twin"))
            continue
        try:
            c16 = cache_16k(clean_dir / name, cache / "clean" / name)
            n16 = cache_16k(noisy_dir / name, cache / "noisy" / name)
        except AudioError as exc:
            skipped.append(skipped_for(exc, clean_dir / name, noisy_dir / name))
            continue
        pairs.append((name, n16, c16))
    speakers = sorted({n.split("_")[0] for n, _, _ in pairs})
    val_speakers = _val_speakers(cfg.voicebank_val_speakers, speakers, tag)
    if len(val_speakers) >= len(speakers):
        raise ValueError(f"need more speakers than the {len(val_speakers)} held out for validation")
    train_pairs = [p for p in pairs if p[0].split("_")[0] not in val_speakers]
    val_pairs = [p for p in pairs if p[0].split("_")[0] in val_speakers]
    # reported (in the log and skipped.txt) by the corpus' names, not the cache's
    source = {n16: str(noisy_dir / name) for name, n16, _ in train_pairs}
    source.update({c16: str(clean_dir / name) for name, _, c16 in train_pairs})
    noisy_pool = scan([p[1] for p in train_pairs], 16000, cfg.min_seconds, shown=source)
    clean_pool = scan([p[2] for p in train_pairs], 16000, cfg.min_seconds, shown=source)
    skipped += [Skipped(source[s.path], s.reason) for s in noisy_pool.skipped + clean_pool.skipped]
    good_noisy, good_clean = set(noisy_pool.paths), set(clean_pool.paths)
    frames = dict(zip(noisy_pool.paths, noisy_pool.frames, strict=True))
    frames.update(zip(clean_pool.paths, clean_pool.frames, strict=True))
    keep = []
    for p in train_pairs:
        if p[1] not in good_noisy or p[2] not in good_clean:
            continue
        # VoiceBank's two sides have the same length: a pair that does not is mis-paired (validation and
        # evaluation said so; training cut it to the shorter side without a word)
        mismatch = length_problem(frames[p[1]], frames[p[2]])
        if mismatch:
            skipped.append(Skipped(source[p[1]], mismatch))
            log.warning("skipping %s: %s", source[p[1]], mismatch)
        else:
            keep.append(p)
    noisy_pool = noisy_pool.subset([p[1] for p in keep])
    clean_pool = clean_pool.subset([p[2] for p in keep])
    train = PairedDataset(noisy_pool, clean_pool, cfg.mixing.segment_samples, seed)
    val: list[ValPair] = []
    for name, n16, c16 in val_pairs:
        noisy, _ = sf.read(fs_path(n16), dtype="float32")
        clean, _ = sf.read(fs_path(c16), dtype="float32")
        checked = checked_val_pair(name, noisy, clean, (noisy_dir / name, clean_dir / name), cfg.min_seconds)
        if isinstance(checked, ValPair):
            val.append(checked)
        else:
            skipped.append(checked)
    if not val:
        raise ValueError(
            f"{root}: no usable validation pairs (speakers {', '.join(val_speakers)}); skipped:{os.linesep}"
            + describe_skipped(
                [s for s in skipped if any(f"{v}_" in Path(s.path).name for v in val_speakers)]
            )
        )
    desc = (
        f"VoiceBank-DEMAND {tag}: {len(keep)} training pairs, {len(val)} validation pairs "
        f"(speakers {', '.join(val_speakers)}), {len(skipped)} files skipped"
    )
    sources = [str(d / name) for name, _, _ in keep for d in (noisy_dir, clean_dir)]
    return RecipeData(train, val, skipped, desc, _fingerprint(sources, val))


def _wav_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".wav" and p.is_file())


def _val_speakers(named: tuple[str, ...], speakers: list[str], tag: str) -> list[str]:
    """The speakers held out for validation: ``named`` when all are in the set. The default pair (the 28-speaker
    set's) missing in part or whole gives the set's last two speakers, with a warning; other named speakers must
    all be there (one of two held out without a word, before)."""
    missing = [s for s in named if s not in speakers]
    if not missing:
        return list(named)
    if named != VOICEBANK_VAL_SPEAKERS:
        raise ValueError(f"voicebank_val_speakers {missing} not in the training set ({', '.join(speakers)})")
    chosen = speakers[-2:]
    log.warning(
        "VoiceBank %s: %s not in this training set: holding out its last two speakers, %s, for validation (name "
        "others with data.voicebank_val_speakers in a --config file)",
        tag,
        ", ".join(missing),
        ", ".join(chosen),
    )
    return chosen


def cache_16k(src: Path, dst: Path) -> str:
    """Resample ``src`` to a 16 kHz mono float WAV (atomic), once per version of ``src``: the cached file's name
    carries the source's size and modification time, so a source replaced since is resampled again (``dst`` by
    name alone kept serving the old audio). Returns the cached file's path."""
    st = src.stat()
    dst = dst.with_name(f"{dst.stem}.{st.st_size}-{st.st_mtime_ns}{dst.suffix}")
    if dst.is_file():
        return str(dst)
    for stale in dst.parent.glob(f"{glob.escape(src.stem)}.*-*{dst.suffix}") if dst.parent.is_dir() else ():
        stale.unlink(missing_ok=True)  # the same source's earlier versions
    wav, info = load_audio(src)
    mono = resample(wav, info.sample_rate, 16000).mean(axis=0)
    with atomic_path(dst) as tmp:
        sf.write(fs_path(tmp), mono, 16000, format="WAV", subtype="FLOAT")
    return str(dst)


def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


def describe_skipped(skipped: list[Skipped]) -> str:
    return os.linesep.join(f"  {s.path}: {s.reason}" for s in skipped)


__all__ = ["DataConfig", "RecipeData", "ValPair", "build", "collate", "mix"]
