"""Real-time streaming enhancement: audio in chunks of any size, enhanced audio out with a fixed delay.

    engine = StreamingEnhancer(model)            # one per stream; channels are enhanced independently
    for chunk in source:                         # [channels, n] float32 at 16 kHz, any n >= 0
        sink(engine.process(chunk))              # enhanced samples that are final so far
    sink(engine.flush())                         # the rest; total output length == total input length

The output is sample for sample the offline result (:func:`enhance.offline.enhance_waveform` on the whole input;
tested for chunk sizes 1 ... seconds). Output sample ``s`` is returned as soon as ``s + 768 - s % 256`` input
samples have arrived (tested): the delay is one window (32 ms) plus one hop of lookahead (16 ms) minus the part
of the current hop already received, between 513 and ``latency_samples`` = 768 samples (32-48 ms at 16 kHz).

State (:class:`StreamState`) is explicit and bounded: the input of the hop being collected (the DC blocker,
:mod:`enhance.dc_blocker`, filters whole hops) and the blocker's memory, the samples of the frame being collected, the noisy
spectra waiting for their lookahead frame, the model's conv and key/value caches (:class:`EnhancerState`, at most
``context_frames`` frames per layer) and the overlap-add tail.

Threads: an engine's calls (``process``, ``flush``, ``reset``, ``competition``) hold its lock, so an audio thread's
``process`` and a control thread's ``flush`` or ``reset`` (push-to-talk) do not corrupt the state, which they
did, silently, losing output; the order of a stream's chunks is the caller's to keep. Engines of one model may run
in parallel threads (:mod:`enhance.backends` says which backends may be shared).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from enhance.audio_io import MAX_CHANNELS, check_chunk
from enhance.dc_blocker import DCState, block_dc
from enhance.step_backend import FrameBackend, StepBackend
from enhance.stft import analysis_frames, apply_magnitude, log_magnitude, overlap_add, synthesis_frames
from models.enhancer import Enhancer, expect_enhancer


@dataclass
class StreamState:
    """Everything the streaming engine carries between calls."""

    channels: int
    buffer: np.ndarray  # [C, < win] input not yet consumed, padded coordinates from frame `frames_in`'s start
    pending: np.ndarray  # [C, < hop] float64 input of the incomplete hop, not yet through the DC blocker
    dc: DCState  # the DC blocker's memory
    # [C, <= lookahead, F] noisy spectra waiting for their output frame (the C path: [C, F] complex64, one slot)
    spectra: torch.Tensor | np.ndarray | None = None
    model: Any = None  # the backend's state (enhance.step_backend.BackendState): EnhancerState, FixedState or NativeState
    tail: np.ndarray | None = None  # [C, win - hop] overlap-add tail of the last output frame
    received: int = 0  # input samples received
    emitted: int = 0  # output samples returned
    frames_in: int = 0  # frames analysed


class StreamingEnhancer:
    def __init__(
        self,
        model: Enhancer,
        channels: int = 1,
        with_competition: bool = False,
        backend: StepBackend | None = None,
    ) -> None:
        """``backend``: None runs ``model.step`` (PyTorch); :class:`enhance.fixed_step.TracedStepper` (TorchScript)
        or :class:`enhance.onnx_backend.OnnxStepper` (onnxruntime) run the fixed-shape step, and
        :class:`enhance.native_backend.NativeStepper` the step in C, faster on a CPU (:mod:`enhance.backends`
        chooses). All give the same samples, but for an int8 OnnxStepper (``onnxruntime-int8``) or TracedStepper
        (``torchscript-int8``) and a float16 or int8 NativeStepper (``native-fp16``, ``native-int8``), which are
        close to them. A backend with
        ``run_frames`` also does the analysis, synthesis and overlap-add of each frame: NativeStepper in C, the
        fixed-step backends (TorchScript, onnxruntime) in NumPy; for the PyTorch backend they run here with
        :mod:`enhance.stft` (on the model's device and dtype)."""
        expect_enhancer(model)
        if not (isinstance(channels, (int, np.integer)) and 1 <= channels <= MAX_CHANNELS):
            raise ValueError(f"channels must be an integer from 1 to {MAX_CHANNELS}, got {channels!r}")
        # a backend made for another model ran that model's weights, silently
        if backend is not None and getattr(backend, "model", model) is not model:
            raise ValueError(
                "backend was made for another model: make it from this one (streaming_backend(model))"
            )
        self.model, self.with_competition = model, with_competition  # its mode is its owner's (Enhancer.step)
        self.backend: StepBackend = backend if backend is not None else model
        self.cfg = model.cfg.stft
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.channels = int(channels)
        self._run_frames = self.backend.run_frames if isinstance(self.backend, FrameBackend) else None
        self.state = self._new_state()
        # competition scores of the frames output by the last process()/flush() call: per TIM layer [C, m, n_s]
        self.last_competition: list[np.ndarray] = []
        self._maps: list[list[np.ndarray]] = []  # all of the current stream's, for competition()
        self._lock = threading.Lock()

    def _new_state(self) -> StreamState:
        ov = self.cfg.win_length - self.cfg.hop_length
        return StreamState(
            self.channels,
            buffer=np.zeros((self.channels, ov), np.float32),  # the leading zeros of the offline framing
            pending=np.zeros((self.channels, 0), np.float64),
            dc=DCState.zeros(self.channels),
            spectra=np.zeros((self.channels, self.cfg.n_bins), np.complex64) if self._run_frames else None,
            model=self.backend.new_state(self.channels),
            tail=np.zeros((self.channels, ov), np.float32),
        )

    @property
    def latency_samples(self) -> int:
        """Worst-case algorithmic delay: window + lookahead hops (+ the rest of the current hop)."""
        return self.model.cfg.latency_samples

    @property
    def latency_ms(self) -> float:
        return self.model.cfg.latency_ms

    def reset(self) -> None:
        """Drop the stream in progress (its held samples are not returned) and start a new one."""
        with self._lock:
            self.state = self._new_state()
            self.last_competition = []
            self._maps = []

    def competition(self) -> list[np.ndarray]:
        """Competition maps of every frame of the current (or just flushed) stream: per TIM layer [C, T, n_s]
        (with ``with_competition``; T = 0 for a stream too short for a frame, such as one sample at 48 kHz)."""
        with self._lock:
            return self._competition()

    def _competition(self) -> list[np.ndarray]:
        if self.with_competition and not self._maps and self.model.competition_blocks:
            n_s = self.model.cfg.n_mechanisms  # competition blocks are TIM blocks
            return [np.zeros((self.channels, 0, n_s), np.float32) for _ in self.model.competition_blocks]
        return [np.concatenate(chunks, axis=1) for chunks in self._maps]

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Feed ``[channels, n]`` float samples (any n; a NumPy array, or anything ``np.asarray`` takes); returns
        the enhanced samples that became final."""
        chunk = np.asarray(chunk)
        with self._lock:
            return self._process(chunk)

    def _process(self, chunk: np.ndarray) -> np.ndarray:
        st = self.state
        check_chunk(chunk, st.channels)
        if st.received == 0 and chunk.shape[1]:
            # a new stream; an empty chunk leaves the flushed stream's maps readable (it cleared them)
            self._maps = []
        self._block_dc(chunk, final=False)
        st.received += chunk.shape[1]
        return self._advance(final=False)

    def flush(self) -> np.ndarray:
        """End of stream: the remaining samples. The engine is reset and can take a new stream."""
        with self._lock:
            return self._flush()

    def _flush(self) -> np.ndarray:
        st = self.state
        if st.received == 0:  # nothing since the last flush: the competition of that stream stays readable
            self.state = self._new_state()
            self.last_competition = []
            return np.zeros((self.channels, 0), np.float32)
        n_frames = self.cfg.n_frames(st.received)
        self._block_dc(np.zeros((st.channels, 0)), final=True)  # the incomplete last hop
        # the offline framing pads the end with zeros up to the last frame
        need = (n_frames - st.frames_in - 1) * self.cfg.hop_length + self.cfg.win_length
        if need > st.buffer.shape[1]:
            st.buffer = np.pad(st.buffer, ((0, 0), (0, need - st.buffer.shape[1])))
        out = self._advance(final=True, max_frames=n_frames)
        self.state = self._new_state()  # ready for a new stream; the competition of this one stays readable
        return out

    def _block_dc(self, chunk: np.ndarray, final: bool) -> None:
        """Append ``chunk`` to the input buffer through the DC blocker: whole hops now (a frame needs whole hops
        anyway: no delay), the incomplete one kept in ``pending`` until the next chunk or, ``final``, the end."""
        st, hop = self.state, self.cfg.hop_length
        raw = np.concatenate([st.pending, chunk.astype(np.float64, copy=False)], axis=1)
        whole = raw.shape[1] if final else raw.shape[1] - raw.shape[1] % hop
        st.pending = raw[:, whole:]
        if whole:  # chunks shorter than a hop mostly add nothing: no copy of the buffer for them
            st.buffer = np.concatenate(
                [st.buffer, block_dc(raw[:, :whole], st.dc, hop).astype(np.float32)], axis=1
            )

    @torch.inference_mode()
    def _advance(self, final: bool, max_frames: int | None = None) -> np.ndarray:
        st, hop, win = self.state, self.cfg.hop_length, self.cfg.win_length
        ov = win - hop
        n_new = (st.buffer.shape[1] - win) // hop + 1 if st.buffer.shape[1] >= win else 0
        if max_frames is not None:
            n_new = min(n_new, max_frames - st.frames_in)
        if n_new == 0 and not final:
            self.last_competition = []
            return np.zeros((st.channels, 0), np.float32)
        if self._run_frames is not None:
            return self._advance_in_backend(n_new, final)
        if n_new > 0:
            seg = torch.from_numpy(np.ascontiguousarray(st.buffer[:, : (n_new - 1) * hop + win]))
            spec = analysis_frames(seg.to(self.device, self.dtype), self.cfg)  # [C, n_new, F]
            st.buffer = st.buffer[:, n_new * hop :]
            st.frames_in += n_new
        else:
            cdtype = torch.promote_types(self.dtype, torch.complex64)
            spec = torch.zeros(st.channels, 0, self.cfg.n_bins, dtype=cdtype, device=self.device)
        out, st.model = self.backend.step(log_magnitude(spec), st.model, final, self.with_competition)
        out.log_mag = out.log_mag.to(self.device, self.dtype)
        assert not isinstance(st.spectra, np.ndarray)  # the torch path's spectra
        spectra = spec if st.spectra is None else torch.cat([st.spectra, spec], dim=1)
        m = out.log_mag.shape[1]
        first_frame = st.model.frames_out - m
        st.spectra = spectra[:, m:]
        self._keep_competition([c.float().cpu().numpy() for c in (out.competition or [])])
        if m == 0:
            return np.zeros((st.channels, 0), np.float32)
        frames = synthesis_frames(apply_magnitude(out.log_mag, spectra[:, :m]), self.cfg)
        wav = overlap_add(frames, self.cfg).float().cpu().numpy()  # padded [first*hop, (first+m-1)*hop + win)
        assert st.tail is not None
        wav[:, :ov] += st.tail
        st.tail = wav[:, m * hop : m * hop + ov].copy()
        return self._emit(wav, first_frame, m)

    def _advance_in_backend(self, n_new: int, final: bool) -> np.ndarray:
        """:meth:`_advance` with the backend's ``run_frames`` (analysis, step, synthesis, overlap-add in one call)."""
        st, hop = self.state, self.cfg.hop_length
        seg = st.buffer[:, : (n_new - 1) * hop + self.cfg.win_length] if n_new > 0 else st.buffer[:, :0]
        assert isinstance(st.spectra, np.ndarray) and st.tail is not None and self._run_frames is not None
        wav, maps = self._run_frames(seg, n_new, final, st.model, st.spectra, st.tail, self.with_competition)
        if n_new > 0:
            st.buffer = st.buffer[:, n_new * hop :]
            st.frames_in += n_new
        self._keep_competition(maps)
        m = wav.shape[1] // hop
        return self._emit(wav, st.model.frames_out - m, m) if m else np.zeros((st.channels, 0), np.float32)

    def _keep_competition(self, maps: list[np.ndarray]) -> None:
        self.last_competition = maps
        if self.with_competition and maps:
            if not self._maps:
                self._maps = [[] for _ in maps]
            for store, c in zip(self._maps, maps, strict=True):
                store.append(c)

    def _emit(self, wav: np.ndarray, first_frame: int, m: int) -> np.ndarray:
        """The samples of ``wav`` (padded coordinates from ``first_frame * hop``; its first ``m * hop`` are final)
        that are the stream's and not yet returned."""
        st, hop = self.state, self.cfg.hop_length
        ov = self.cfg.win_length - hop
        # padded samples [first*hop, (first+m)*hop) are final; input coordinates are padded - ov
        start_in, stop_in = first_frame * hop - ov, min((first_frame + m) * hop - ov, st.received)
        lo = max(st.emitted, start_in, 0)
        piece = wav[:, lo - start_in : max(stop_in - start_in, lo - start_in)]
        st.emitted = max(st.emitted, stop_in)
        return piece
