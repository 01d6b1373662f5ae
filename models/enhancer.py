"""The full enhancer: noisy log1p magnitude [B, T, 257] -> clean log1p magnitude [B, T, 257].

    features -> PreEncoder (causal convs, spends the lookahead) -> blocks 1..8 (standard or TIM) -> Linear
             -> output (residual or direct, see EnhancerConfig.output) -> attenuation limit (eval only)

Output frame t depends on input frames ``t - receptive_past ... t + lookahead`` only (tested).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import KVCache, MultiHeadAttention
from models.encoder_layer import StandardLayer, StandardLayerConfig
from models.mae import MAEConfig
from models.pre_encoder import PreEncoder, PreEncoderConfig
from models.sdu import SDUConfig
from models.stft_config import STFTConfig
from models.tim_layer import TIMLayer, TIMLayerConfig

OUTPUT_MODES = ("direct", "residual")


@dataclass(frozen=True)
class EnhancerConfig:
    stft: STFTConfig = field(default_factory=STFTConfig)
    pre_encoder: PreEncoderConfig = field(default_factory=PreEncoderConfig)
    standard: StandardLayerConfig = field(default_factory=StandardLayerConfig)
    tim: TIMLayerConfig | None = None
    n_layers: int = 8
    tim_blocks: tuple[int, ...] = ()  # 1-based block numbers that are TIM layers (paper: 3..7)
    # "direct": softplus(head(h)), the paper's mapping; "residual": relu(noisy + head(h)), the same target
    # reached from the identity (converges much faster, see README). Default "direct" = what configs without
    # this key meant.
    output: str = "direct"
    # inference only: the output magnitude never falls more than this many dB below the noisy input's (no
    # spectral holes; like DeepFilterNet's atten_lim). None = no limit. Not applied in training mode.
    max_attenuation_db: float | None = None
    # self-dependency units (Highway Transformer) on these 1-based blocks; None/() = none
    sdu: SDUConfig | None = None
    sdu_blocks: tuple[int, ...] = ()
    # mixture of attentive experts (Peng et al. 2020) in the attention of these 1-based blocks; None/() = none
    mae: MAEConfig | None = None
    mae_blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.output not in OUTPUT_MODES:
            raise ValueError(f"output must be one of {OUTPUT_MODES}, got {self.output!r}")
        if self.max_attenuation_db is not None and not self.max_attenuation_db >= 0:  # as set_max_attenuation
            raise ValueError(
                f"max_attenuation_db must be at least 0 dB (or None for no limit), got {self.max_attenuation_db}"
            )
        if self.pre_encoder.n_bins != self.stft.n_bins:
            raise ValueError(f"pre_encoder.n_bins {self.pre_encoder.n_bins} != STFT bins {self.stft.n_bins}")
        if self.standard.d_model != self.pre_encoder.d_model:
            raise ValueError("standard layers' d_model must equal the pre-encoder's output width")
        if self.sdu_blocks and self.sdu is None:
            raise ValueError("sdu_blocks given but no sdu config")
        if not all(1 <= b <= self.n_layers for b in self.sdu_blocks):
            raise ValueError(f"sdu_blocks {self.sdu_blocks} outside 1..{self.n_layers}")
        if self.mae_blocks and self.mae is None:
            raise ValueError("mae_blocks given but no mae config")
        if not all(1 <= b <= self.n_layers for b in self.mae_blocks):
            raise ValueError(f"mae_blocks {self.mae_blocks} outside 1..{self.n_layers}")
        if self.tim_blocks:
            if self.tim is None:
                raise ValueError("tim_blocks given but no tim layer config")
            if self.tim.d_model != self.pre_encoder.d_model:
                raise ValueError("TIM layers' d_model must equal the pre-encoder's output width")
            if self.tim.attention.context_frames != self.standard.attention.context_frames:
                raise ValueError("all layers must share context_frames")
            if not all(1 <= b <= self.n_layers for b in self.tim_blocks):
                raise ValueError(f"tim_blocks {self.tim_blocks} outside 1..{self.n_layers}")

    @property
    def d_model(self) -> int:
        return self.pre_encoder.d_model

    @property
    def context_frames(self) -> int:
        return self.standard.attention.context_frames

    @property
    def lookahead_frames(self) -> int:
        return self.pre_encoder.lookahead_frames

    @property
    def receptive_past_frames(self) -> int:
        """Past input frames that can influence an output frame (convs + one attention context per layer)."""
        return self.pre_encoder.past_frames + self.n_layers * self.context_frames

    @property
    def n_mechanisms(self) -> int:
        return self.tim.n_mechanisms if (self.tim is not None and self.tim_blocks) else 1

    @property
    def latency_samples(self) -> int:
        """Algorithmic delay of streaming, worst case: the window plus the lookahead hops (an input sample waits
        for the rest of its hop, then for the frames after it; GUIDE: 32 + 16 = 48 ms)."""
        return self.stft.win_length + self.lookahead_frames * self.stft.hop_length

    @property
    def latency_ms(self) -> float:
        return 1000.0 * self.latency_samples / self.stft.sample_rate


@dataclass
class EnhancerOutput:
    log_mag: torch.Tensor  # [B, T, n_bins], predicted clean log1p magnitude (>= 0)
    # one [B, T, n_s] tensor per TIM layer with competition, in block order (None unless asked for)
    competition: list[torch.Tensor] | None = None


class Enhancer(nn.Module):
    def __init__(self, cfg: EnhancerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.pre_encoder = PreEncoder(cfg.pre_encoder)
        layers: list[nn.Module] = []
        for block in range(1, cfg.n_layers + 1):
            sdu = cfg.sdu if block in cfg.sdu_blocks else None
            mae = cfg.mae if block in cfg.mae_blocks else None
            if block in cfg.tim_blocks:
                assert cfg.tim is not None
                layers.append(TIMLayer(cfg.tim, sdu, mae))
            else:
                layers.append(StandardLayer(cfg.standard, sdu, mae))
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(cfg.d_model, cfg.pre_encoder.n_bins)

    def set_max_attenuation(self, db: float | None) -> None:
        """Never attenuate more than ``db`` dB from now on (None or inf: no limit; 0: never below the noisy
        magnitude). The limit is part of the config (saved with a checkpoint) and read at every forward/step, so
        it needs no new weights. Raises ValueError for NaN or a negative limit (it would amplify, or give NaN)."""
        if db is not None and not db >= 0:
            raise ValueError(f"the attenuation limit must be at least 0 dB (or inf for none), got {db}")
        limit = None if db is None or math.isinf(db) else float(db)
        self.cfg = dataclasses.replace(self.cfg, max_attenuation_db=limit)

    @property
    def competition_blocks(self) -> list[int]:
        """1-based numbers of the blocks whose competition maps :meth:`forward` returns."""
        return [
            i + 1
            for i, layer in enumerate(self.layers)
            if isinstance(layer, TIMLayer) and layer.score is not None
        ]

    def forward(self, feats: torch.Tensor, return_competition: bool = False) -> EnhancerOutput:
        if feats.ndim != 3 or feats.shape[-1] != self.cfg.pre_encoder.n_bins:
            raise ValueError(
                f"expected features [B, T, {self.cfg.pre_encoder.n_bins}], got {tuple(feats.shape)}"
            )
        if feats.shape[1] == 0:
            raise ValueError("expected at least one frame")
        h = self.pre_encoder(feats)  # [B, T, d_model]
        maps: list[torch.Tensor] = []
        for layer in self.layers:
            h, c, _ = layer(h)
            if c is not None:
                maps.append(c)
        return EnhancerOutput(self.output_stage(feats, h), maps if return_competition else None)

    def output_stage(self, feats: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Predicted clean log1p magnitude of the frames whose input features are ``feats`` [B, T, F] and whose
        last hidden states are ``h`` [B, T, d]: non-negative, then the attenuation limit (eval mode only)."""
        head = self.head(h)
        log_mag = F.relu(feats + head) if self.cfg.output == "residual" else F.softplus(head)
        limit = self.cfg.max_attenuation_db
        if limit is not None and not self.training:
            # log1p(|X| * min gain); exp - 1 rather than expm1, which ONNX lacks
            floor = torch.log1p((torch.exp(feats) - 1.0) * (10.0 ** (-limit / 20.0)))
            log_mag = torch.maximum(log_mag, floor)
        return log_mag

    def new_state(self, batch: int) -> EnhancerState:
        """An empty streaming state (caches are created on the first step)."""
        return EnhancerState()

    def step(
        self, feats: torch.Tensor, state: EnhancerState, final: bool = False, return_competition: bool = False
    ) -> tuple[EnhancerOutput, EnhancerState]:
        """Incremental forward for streaming: new input frames [B, n, F] -> the output frames they complete.

        The concatenation of all outputs equals :meth:`forward` on the concatenated input (tested), with
        ``lookahead_frames`` frames of delay; ``final=True`` (with the last frames, possibly none) releases them.
        The offline :meth:`forward` stays the reference. Streaming is inference: it runs as in eval mode (no
        dropout) whatever the model's mode, which it leaves as it was (:func:`eval_mode`).
        """
        if feats.ndim != 3 or feats.shape[-1] != self.cfg.pre_encoder.n_bins:
            raise ValueError(
                f"expected features [B, n, {self.cfg.pre_encoder.n_bins}], got {tuple(feats.shape)}"
            )
        with eval_mode(self):
            return _step(self, feats, state, final, return_competition)


@dataclass
class EnhancerState:
    """Everything :meth:`Enhancer.step` carries between calls (bounded: nothing grows with the stream's length).

    conv:     per pre-encoder conv, its last ``kernel_size - 1`` input frames            [B, C_in, <= k-1]
    kv:       per block, keys/values of its last ``context_frames`` frames               KVCache [B, H, <= C, Dh]
              (MAE blocks also keep the gate's input of those frames)                    [B, G, <= C, d/G]
    pending:  input feature frames whose output waits for the lookahead (residual skip)  [B, <= lookahead, F]
    frames_out: frames produced so far
    """

    conv: list[torch.Tensor] | None = None
    kv: list[KVCache] | None = None
    pending: torch.Tensor | None = None
    frames_out: int = 0


def _attention(layer: nn.Module) -> MultiHeadAttention:
    assert isinstance(layer, StandardLayer | TIMLayer)
    return layer.attn


def _step(model: Enhancer, feats: torch.Tensor, state: EnhancerState, final: bool, return_competition: bool):
    h, conv = model.pre_encoder.step(feats, state.conv, final)
    pending = feats if state.pending is None else torch.cat([state.pending, feats], dim=1)
    n_out = h.shape[1]
    kv = state.kv or [_attention(layer).empty_cache(feats.shape[0], feats) for layer in model.layers]
    maps: list[torch.Tensor] = []
    new_kv: list[KVCache] = []
    for layer, cache in zip(model.layers, kv, strict=True):
        if n_out:
            h, c, cache = layer(h, cache)
            if c is not None:
                maps.append(c)
        new_kv.append(cache)
    log_mag = model.output_stage(pending[:, :n_out], h)
    state = EnhancerState(conv, new_kv, pending[:, n_out:], state.frames_out + n_out)
    return EnhancerOutput(log_mag, maps if return_competition else None), state


# models inside eval_mode blocks: id -> [blocks open, was it training]; with a lock, as threads share a model
_EVAL_BLOCKS: dict[int, list[Any]] = {}
_EVAL_LOCK = threading.Lock()


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (no dropout) for the block, and in the mode it was in afterwards: enhancing with a
    model in training mode (a new Enhancer is) gave other samples on every call, and switching it to eval for
    good switched dropout off in the caller's training loop. Blocks open in several threads at once share the
    switch: the mode comes back when the last one ends (the first to end turned dropout back on under the
    others: up to 0.16 off on the tiny model of tests/test_streaming.py)."""
    key = id(model)
    with _EVAL_LOCK:
        entry = _EVAL_BLOCKS.get(key)
        if entry is None:
            entry = _EVAL_BLOCKS[key] = [0, model.training]
            if model.training:
                model.eval()
        entry[0] += 1
    try:
        yield model
    finally:
        with _EVAL_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                del _EVAL_BLOCKS[key]
                if entry[1]:
                    model.train()


def weights_digest(model: nn.Module) -> str:
    """SHA-256 of the model's parameters and buffers as float32, in ``state_dict`` order: which weights an exported
    step was made from."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class WeightsWatch:
    """Whether ``load_state_dict`` ran on a model since this was made. The traced, exported and C backends copy
    the weights when they are built: after new weights were loaded they computed with the old ones, silently."""

    def __init__(self, model: nn.Module) -> None:
        self.changed = False
        ref = weakref.ref(self)

        def loaded(module: nn.Module, incompatible: object) -> None:
            watch = ref()
            if watch is not None:
                watch.changed = True

        self._handle = model.register_load_state_dict_post_hook(loaded)

    def check(self, what: str) -> None:
        if self.changed:
            raise ValueError(
                f"the model's weights were loaded anew (load_state_dict) since this {what} was built from them: "
                "build a new backend (enhance.backends.streaming_backend)"
            )

    def __del__(self) -> None:
        self._handle.remove()


def expect_enhancer(model: object) -> Enhancer:
    """``model`` if it is an :class:`Enhancer`; otherwise a TypeError that says what to pass. A
    :class:`models.checkpoint.Checkpoint` (what ``load_pretrained`` and ``load_checkpoint`` return) failed deep inside
    with "'Checkpoint' object has no attribute 'cfg'"."""
    if isinstance(model, Enhancer):
        return model
    hint = "; pass its .model" if isinstance(getattr(model, "model", None), Enhancer) else ""
    raise TypeError(f"expected an Enhancer (the network), got {type(model).__name__}{hint}")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
