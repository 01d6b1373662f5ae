"""The ``native`` streaming backend: the model's incremental step in plain C (:file:`enhance/native_step.c`).

    stepper = NativeStepper(model)                # compiles the C file once per machine (cached), packs weights
    engine = StreamingEnhancer(model, backend=stepper)

Why: at one 16 ms frame per call the TorchScript and onnxruntime steps spend about as long on per-operation
overhead (hundreds of small operations) as on reading the weights (``bench/results/step-floor.md``). The C step
has no framework in between: each weight matrix is streamed once per call for up to 16 frames (once per frame
at one hop per call), everything else is a few thousand flops per frame. It gives the same numbers as the
PyTorch step to float32 rounding (``tests/test_native.py``) and, like the other backends, keeps no per-stream
state of its own (:class:`NativeState` is passed in and out), so one stepper serves many streams and threads (the
C call releases the GIL). The streaming engine calls
:meth:`NativeStepper.run_frames`, which also does each frame's analysis, synthesis and overlap-add in C (one
call per hop and channel); :meth:`NativeStepper.step` is the bare step (features in, log magnitudes out).
``weights="float16"`` / ``"int8"`` (backends ``native-fp16`` / ``native-int8``) read a half / a quarter of the
weight bytes per frame, close to but not the float32 numbers.

It runs the standard and TIM blocks (with or without competition) with the one-frame lookahead; models with SDU
or MAE blocks use the other backends. It needs a C compiler (``cc``, or ``$CC``) the first time on a machine: the
library is built with ``-O3 -march=native`` into ``$TIM_ENHANCE_CACHE`` (default ``~/.cache/tim-enhance``), keyed
by the source, the compiler and the CPU's flags, and written atomically (a concurrent first use is safe); without
a compiler it loads a prebuilt library from ``$TIM_ENHANCE_PREBUILT`` (:mod:`enhance.native_build`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np
import torch

from enhance.native_build import NativeUnavailable as NativeUnavailable  # re-exported: callers import it here
from enhance.native_build import locate
from enhance.stft import sqrt_hann
from models.encoder_layer import StandardLayer
from models.enhancer import Enhancer, EnhancerOutput, WeightsWatch
from models.pre_encoder import ConvBlock
from models.static_step import unsupported
from models.tim_layer import TIMLayer

# the C step's weight matrices (tim_model_new's precision 0, 1, 2)
PRECISIONS = ("float32", "float16", "int8")


def native_unsupported(model: Enhancer) -> str | None:
    """Why the C step cannot run ``model`` (None: it can): what the fixed-shape step needs (a bounded context, the
    one-frame lookahead), and no SDU or MAE blocks, within the C file's limits."""
    cfg = model.cfg
    reason = unsupported(model)
    if reason is not None:
        return reason
    if cfg.sdu_blocks or cfg.mae_blocks:
        return "the native step has no SDU or MAE blocks"
    if cfg.pre_encoder.kernel_size != 3:
        return "the native step is written for kernel 3"
    n_fft = cfg.stft.n_fft
    if n_fft < 4 or n_fft & (n_fft - 1):
        return f"the native signal path's FFT needs a power-of-two n_fft (not {n_fft})"
    if len(cfg.pre_encoder.channels) > 8 or len(model.layers) > 64:
        return "the native step takes at most 8 convolutions and 64 blocks"
    for layer in model.layers:
        assert isinstance(layer, StandardLayer | TIMLayer)
        if isinstance(layer, TIMLayer) and layer.cfg.n_mechanisms > 64:
            return "the native step takes at most 64 mechanisms"
        if layer.attn.cfg.head_dim > 256:
            return "the native step takes heads of at most 256 units"
    return None


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The compiled C step, built on first use (see the module docstring). Raises :class:`NativeUnavailable`."""
    target = locate()
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:  # a cache on a noexec mount, another user's build we may not read, a damaged file
        raise NativeUnavailable(
            f"cannot load the native step {target} ({exc}); set $TIM_ENHANCE_CACHE to a folder this user may "
            "write and execute from, or choose another backend (torchscript)"
        ) from None
    ptr = ctypes.c_void_p
    lib.tim_model_new.restype = ptr
    lib.tim_model_new.argtypes = [ptr, ptr, ptr, ctypes.c_int]
    lib.tim_model_free.argtypes = [ptr]
    lib.tim_sizes.argtypes = [ptr, ptr]
    lib.tim_step.restype = ctypes.c_int
    lib.tim_step.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.c_int, ctypes.c_float, ptr, ptr]
    lib.tim_frames.restype = ctypes.c_int
    lib.tim_frames.argtypes = [
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_float,
        ptr,
        ptr,
        ptr,
        ptr,
    ]
    return lib


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


def _required(p: torch.Tensor | None) -> torch.Tensor:
    if p is None:
        raise ValueError("the native step needs every bias and LayerNorm gain (a layer has none)")
    return p


def pack(model: Enhancer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(config ints, config floats, weights) in the order :file:`native_step.c` reads them."""
    cfg = model.cfg
    pre = cfg.pre_encoder
    ints = [pre.n_bins, len(pre.channels), pre.kernel_size, *pre.channels]
    ints += [cfg.d_model, len(model.layers), cfg.context_frames, int(cfg.output == "residual")]
    floats = [pre.negative_slope, 1e-5]
    parts: list[torch.Tensor | None] = []
    norms = []
    for block in model.pre_encoder.blocks:
        assert isinstance(block, ConvBlock)
        parts += [block.conv.weight.permute(2, 1, 0), block.conv.bias, block.norm.weight, block.norm.bias]
        norms.append(block.norm.eps)
    for layer in model.layers:
        assert isinstance(layer, StandardLayer | TIMLayer)
        att = layer.attn
        if isinstance(layer, TIMLayer):
            c = layer.cfg
            maps = ([layer.score] if layer.score is not None else []) + [att.q, att.k, att.v]
            parts += [
                torch.cat([m.weight for m in maps], -1),
                torch.cat([_required(m.bias) for m in maps], -1),
            ]
            parts += [att.o.weight, att.o.bias, layer.norm1.weight, layer.norm1.bias]
            inter = layer.inter
            parts += [torch.cat([inter.q.weight, inter.k.weight, inter.v.weight], -1)]
            parts += [
                torch.cat([_required(inter.q.bias), _required(inter.k.bias), _required(inter.v.bias)], -1)
            ]
            parts += [inter.o.weight, inter.o.bias, layer.norm2.weight, layer.norm2.bias]
            parts += [layer.ffn_in.weight, layer.ffn_in.bias, layer.ffn_out.weight, layer.ffn_out.bias]
            parts += [layer.norm3.weight, layer.norm3.bias]
            norms += [layer.norm1.eps, layer.norm2.eps, layer.norm3.eps]
            ints += [1, c.n_mechanisms, att.cfg.n_heads, c.d_ff, int(layer.score is not None)]
            ints += [c.inter_heads, c.inter_head_dim, 0]
            floats.append(c.negative_slope)
        else:
            s = layer.cfg
            parts += [torch.cat([att.q.weight, att.k.weight, att.v.weight], -1)]
            parts += [torch.cat([_required(att.q.bias), _required(att.k.bias), _required(att.v.bias)], -1)]
            parts += [att.o.weight, att.o.bias, layer.norm1.weight, layer.norm1.bias]
            ffn_in, ffn_out = layer.ffn[0], layer.ffn[3]
            assert isinstance(ffn_in, torch.nn.Linear) and isinstance(ffn_out, torch.nn.Linear)
            parts += [ffn_in.weight.t(), ffn_in.bias, ffn_out.weight.t(), ffn_out.bias]
            parts += [layer.norm2.weight, layer.norm2.bias]
            norms += [layer.norm1.eps, layer.norm2.eps]
            ints += [0, 1, att.cfg.n_heads, s.d_ff, 0, 0, 0, 0]
            floats.append(s.negative_slope)
    parts += [model.head.weight.t(), model.head.bias]
    floats += sqrt_hann(cfg.stft.win_length).tolist()  # tim_frames' analysis and synthesis window
    if any(eps != 1e-5 for eps in norms):
        raise ValueError("the native step is written for LayerNorm eps 1e-5")
    with torch.no_grad():
        weights = torch.cat([_required(p).detach().float().cpu().reshape(-1) for p in parts]).numpy()
    return np.array(ints, np.int32), np.array(floats, np.float32), np.ascontiguousarray(weights)


@dataclass
class NativeState:
    """One stream's state, per channel: the C step's floats (conv caches, k/v rings) and counters (frame 0
    received, frames output), and one work space for the calls."""

    floats: np.ndarray  # [B, state floats]
    counters: np.ndarray  # [B, 2] int64
    work: np.ndarray  # [work floats]

    @property
    def frames_out(self) -> int:
        return int(self.counters[0, 1]) if len(self.counters) else 0


class NativeStepper:
    """:meth:`models.enhancer.Enhancer.step`'s contract on the C step (CPU, float32 at any model dtype)."""

    def __init__(self, model: Enhancer, weights: str = "float32") -> None:
        """``weights``: the weight matrices in ``float32`` (``native``: the PyTorch numbers), ``float16``
        (``native-fp16``: half the bytes to read per frame) or ``int8`` (``native-int8``: a quarter; one float
        scale per output column). The reduced two are close to but not the float32 numbers (signal to difference
        on the bundled model: about 73 dB and 37 dB on the noise of ``tests/test_native.py``, 81 and 47 dB on the
        dev pairs; scores:
        ``bench/bench_int8.py``) and also keep the key/value rings in float16. The arithmetic is float32 in all."""
        if weights not in PRECISIONS:
            raise ValueError(f"weights must be one of {', '.join(PRECISIONS)}, not {weights!r}")
        reason = native_unsupported(model)
        if reason is not None:
            raise ValueError(f"{reason}; use the torchscript or pytorch backend")
        self.model = model  # read for the attenuation limit at every call, as Enhancer.forward does
        self.weights_watch = WeightsWatch(model)  # the weights are packed (copied) once, here
        self.precision = weights
        self.lib = library()
        # the C model copies the config ints and points into the floats (the window) and the weights
        ints, self.floats, self.weights = pack(model)
        # first without the weights (it then only counts what it would read): packing or converting them reads
        # every matrix, so a count that differs from the packed array must be caught before that read
        sizing = self.lib.tim_model_new(_addr(ints), _addr(self.floats), None, PRECISIONS.index(weights))
        if not sizing:
            raise ValueError("the native step does not cover this model's configuration")
        counted = np.zeros(6, np.int64)
        self.lib.tim_sizes(ctypes.c_void_p(sizing), _addr(counted))
        self.lib.tim_model_free(ctypes.c_void_p(sizing))
        if int(counted[0]) != self.weights.size:
            raise AssertionError(f"packed {self.weights.size} weights, the C step reads {int(counted[0])}")
        handle = self.lib.tim_model_new(
            _addr(ints), _addr(self.floats), _addr(self.weights), PRECISIONS.index(weights)
        )
        if not handle:
            raise ValueError("the native step does not cover this model's configuration")
        self._handle = ctypes.c_void_p(handle)
        self._free = self.lib.tim_model_free
        sizes = np.zeros(6, np.int64)
        self.lib.tim_sizes(self._handle, _addr(sizes))
        _, self.state_floats, self.work_floats, self.n_maps, self.map_groups = (int(x) for x in sizes[:5])
        self.weight_bytes = int(sizes[5])  # read per frame: the matrices in their precision, the rest float32
        self.n_bins = model.cfg.pre_encoder.n_bins
        self.hop, self.win = model.cfg.stft.hop_length, model.cfg.stft.win_length

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            self._free(handle)

    def new_state(self, batch: int) -> NativeState:
        return NativeState(
            np.zeros((batch, self.state_floats), np.float32),
            np.zeros((batch, 2), np.int64),
            np.zeros(self.work_floats, np.float32),
        )

    def _check_state(self, state: NativeState, batch: int) -> None:
        """The C step writes into these arrays: a state of another stepper (another precision's rings) would be
        written past its end."""
        if (
            state.floats.shape != (batch, self.state_floats)
            or state.counters.shape != (batch, 2)
            or state.work.size < self.work_floats
            or state.floats.dtype != np.float32
            or state.counters.dtype != np.int64
            or state.work.dtype != np.float32
            or not all(a.flags.c_contiguous for a in (state.floats, state.counters, state.work))
        ):
            raise ValueError(f"not a state of this stepper for {batch} channel(s) (make it with new_state)")

    def _map_buffer(self, batch: int, frames: int, wanted: bool) -> np.ndarray | None:
        """Where the C calls write competition scores: [B, frames, TIM layers, n_s] (None: not asked for)."""
        return np.empty((batch, frames, self.n_maps, self.map_groups), np.float32) if wanted else None

    def _per_layer(self, maps: np.ndarray | None, m: int) -> list[np.ndarray]:
        """The scores of the ``m`` frames output, one [B, m, n_s] array per TIM layer."""
        if maps is None or not m:
            return []
        return [np.ascontiguousarray(maps[:, :m, i]) for i in range(self.n_maps)]

    def _min_gain(self) -> float:
        limit = self.model.cfg.max_attenuation_db
        return -1.0 if limit is None else float(np.float32(10.0 ** (-limit / 20.0)))

    def step(
        self,
        feats: torch.Tensor,
        state: NativeState | None,
        final: bool = False,
        return_competition: bool = False,
    ) -> tuple[EnhancerOutput, NativeState]:
        self.weights_watch.check(type(self).__name__)
        x = np.ascontiguousarray(feats.detach().to("cpu", torch.float32).numpy())
        batch, n = x.shape[0], x.shape[1]
        state = state or self.new_state(batch)
        self._check_state(state, batch)
        started = bool(state.counters[0, 0]) if batch else False
        if final and (started or n):  # the end's zero padding (one frame: the lookahead)
            x = np.concatenate([x, np.zeros((batch, 1, self.n_bins), np.float32)], axis=1)
            n += 1
        out = np.empty((batch, n, self.n_bins), np.float32)
        maps = self._map_buffer(batch, n, return_competition)
        gain = self._min_gain()
        m = 0
        for b in range(batch):
            m = self.lib.tim_step(
                self._handle,
                _addr(state.floats[b]),
                _addr(state.counters[b]),
                _addr(state.work),
                _addr(x[b]),
                n,
                gain,
                _addr(out[b]),
                None if maps is None else _addr(maps[b]),
            )
        competition = (
            None if maps is None or not m else [torch.from_numpy(c) for c in self._per_layer(maps, m)]
        )
        return EnhancerOutput(torch.from_numpy(out[:, :m]), competition), state

    def run_frames(
        self,
        samples: np.ndarray,
        n: int,
        final: bool,
        state: NativeState,
        pending: np.ndarray,
        tail: np.ndarray,
        return_competition: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The streaming engine's whole per-frame path in C (:meth:`StreamingEnhancer._advance
        <enhance.streaming.StreamingEnhancer._advance>` takes it when the backend has it): analysis of ``n`` new
        frames of ``samples`` [B, (n - 1) * hop + win] (frame t starts at sample t * hop), the step, synthesis
        with the noisy phase and overlap-add, in one call per channel instead of a dozen array operations
        (``final``: the stream's end, :meth:`step`'s). ``pending`` [B, F] complex64 (the spectrum of the frame
        waiting for its lookahead frame) and ``tail`` [B, win - hop] float32 (the overlap-add tail) are the
        engine's state, updated in place. Returns the final samples [B, m * hop] of the m frames output and,
        with ``return_competition``, their competition scores per TIM layer [B, m, n_s]."""
        self.weights_watch.check(type(self).__name__)
        batch = samples.shape[0]
        self._check_state(state, batch)
        x = np.ascontiguousarray(samples, np.float32)
        if n and x.shape[1] < (n - 1) * self.hop + self.win:
            raise ValueError(f"{n} frames need {(n - 1) * self.hop + self.win} samples, got {x.shape[1]}")
        for a, dtype, width in (
            (pending, np.complex64, self.n_bins),
            (tail, np.float32, self.win - self.hop),
        ):
            if a.dtype != dtype or a.shape != (batch, width) or not a.flags.c_contiguous:
                raise ValueError(f"expected a contiguous {dtype.__name__} array [{batch}, {width}]")
        out = np.empty((batch, (n + 1) * self.hop), np.float32)
        maps = self._map_buffer(batch, n + 1, return_competition)
        gain = self._min_gain()
        m = 0
        for b in range(batch):
            m = self.lib.tim_frames(
                self._handle,
                _addr(state.floats[b]),
                _addr(state.counters[b]),
                _addr(state.work),
                _addr(x[b]),
                n,
                int(final),
                gain,
                _addr(pending[b]),
                _addr(tail[b]),
                _addr(out[b]),
                None if maps is None else _addr(maps[b]),
            )
        return out[:, : m * self.hop], self._per_layer(maps, m)
