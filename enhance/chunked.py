"""Exact enhancement of arbitrarily long 16 kHz streams in bounded memory.

The input arrives in pieces of any size (``process``), the end is announced with ``flush``. Output frames are
computed ``chunk_frames`` at a time; each chunk is run through the model together with the model's whole
receptive field of past frames (``EnhancerConfig.receptive_past_frames``) and its lookahead, so every output frame
sees exactly the input it sees in the offline path: the samples are the same as :func:`enhance.offline.enhance_waveform`
on the whole signal (to float rounding; tested). Memory is bounded by ``chunk_frames + receptive field``, whatever
the duration. Recomputing the context costs ``receptive_past_frames / chunk_frames`` extra model time.

Sample coordinates: "padded" index p is input sample ``p - (win - hop)``; frame t covers padded samples
``[t*hop, t*hop + win)`` (see :mod:`enhance.stft`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from enhance.stft import analysis_frames, apply_magnitude, log_magnitude, overlap_add, synthesis_frames
from models.enhancer import Enhancer


@dataclass
class ChunkState:
    """What the chunked engine carries between calls."""

    channels: int
    received: int = 0  # input samples received so far
    buffer: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # padded samples kept
    buffer_start: int = 0  # padded index of buffer[:, 0]
    next_frame: int = 0  # first frame whose output is not computed yet
    tail: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 0), np.float32)
    )  # OLA tail after next_frame*hop
    emitted: int = 0  # output samples returned so far
    competition: list[list[np.ndarray]] = field(
        default_factory=list
    )  # per TIM layer, chunks of [C, frames, n_s]


class ChunkedEnhancer:
    def __init__(
        self, model: Enhancer, channels: int = 1, chunk_frames: int = 2000, with_competition: bool = False
    ):
        if chunk_frames < 1:
            raise ValueError("chunk_frames must be >= 1")
        self.model, self.chunk_frames, self.with_competition = model, chunk_frames, with_competition
        self.cfg = model.cfg.stft
        self.past = model.cfg.receptive_past_frames
        self.lookahead = model.cfg.lookahead_frames
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.state = self._new_state(channels)

    def _new_state(self, channels: int) -> ChunkState:
        ov = self.cfg.overlap
        return ChunkState(
            channels, buffer=np.zeros((channels, ov), np.float32), tail=np.zeros((channels, ov), np.float32)
        )

    def reset(self) -> None:
        self.state = self._new_state(self.state.channels)

    # ------------------------------------------------------------------ public API
    def process(self, samples: np.ndarray) -> np.ndarray:
        """Feed ``[channels, n]`` samples; returns the enhanced samples that are final so far."""
        st = self.state
        if samples.ndim != 2 or samples.shape[0] != st.channels:
            raise ValueError(f"expected [{st.channels}, n] samples, got {tuple(samples.shape)}")
        st.buffer = np.concatenate([st.buffer, samples.astype(np.float32, copy=False)], axis=1)
        st.received += samples.shape[1]
        hop, win, ov = self.cfg.hop_length, self.cfg.win_length, self.cfg.overlap
        complete = (
            (ov + st.received - win) // hop + 1 if ov + st.received >= win else 0
        )  # frames fully received
        ready = complete - self.lookahead  # output frames whose lookahead has arrived
        out = []
        while ready - st.next_frame >= self.chunk_frames:
            out.append(
                self._run(
                    st.next_frame + self.chunk_frames,
                    ready_input=st.next_frame + self.chunk_frames + self.lookahead,
                )
            )
        return np.concatenate(out, axis=1) if out else np.zeros((st.channels, 0), np.float32)

    def flush(self) -> np.ndarray:
        """Finish the stream: the remaining enhanced samples (total output length = total input length)."""
        st = self.state
        if st.received == 0:
            return np.zeros((st.channels, 0), np.float32)
        n_frames = self.cfg.n_frames(st.received)
        padded_len = (n_frames - 1) * self.cfg.hop_length + self.cfg.win_length
        missing = padded_len - (st.buffer_start + st.buffer.shape[1])
        if missing > 0:
            st.buffer = np.pad(st.buffer, ((0, 0), (0, missing)))
        out = []
        while st.next_frame < n_frames:
            stop = min(st.next_frame + self.chunk_frames, n_frames)
            out.append(self._run(stop, ready_input=min(stop + self.lookahead, n_frames)))
        return np.concatenate(out, axis=1) if out else np.zeros((st.channels, 0), np.float32)

    def competition(self) -> list[np.ndarray]:
        """Competition maps of the frames computed so far: per TIM layer, [channels, frames, n_s]."""
        return [np.concatenate(chunks, axis=1) for chunks in self.state.competition]

    # ------------------------------------------------------------------ internals
    @torch.inference_mode()
    def _run(self, stop: int, ready_input: int) -> np.ndarray:
        """Compute output frames [next_frame, stop) from input frames [stop - ... , ready_input)."""
        st, hop, win, ov = self.state, self.cfg.hop_length, self.cfg.win_length, self.cfg.overlap
        a = st.next_frame
        first = max(0, a - self.past)  # oldest input frame any output frame in [a, stop) depends on
        lo = first * hop - st.buffer_start
        hi = (ready_input - 1) * hop + win - st.buffer_start
        seg = torch.from_numpy(np.ascontiguousarray(st.buffer[:, lo:hi])).to(self.device, self.dtype)
        spec = analysis_frames(seg, self.cfg)  # [C, ready_input - first, F]
        result = self.model(log_magnitude(spec), return_competition=self.with_competition)
        keep = slice(a - first, stop - first)
        frames = synthesis_frames(apply_magnitude(result.log_mag[:, keep], spec[:, keep]), self.cfg)
        wav = (
            overlap_add(frames, self.cfg).float().cpu().numpy()
        )  # padded samples [a*hop, (stop-1)*hop + win)
        wav[:, :ov] += st.tail
        if result.competition is not None:
            if not st.competition:
                st.competition = [[] for _ in result.competition]
            for store, c in zip(st.competition, result.competition, strict=True):
                store.append(c[:, keep].float().cpu().numpy())
        done = (stop - a) * hop  # padded samples [a*hop, stop*hop) are final now
        st.tail = wav[:, done : done + ov].copy()
        st.next_frame = stop
        # keep only the input that later chunks can still need
        keep_from = max(0, stop - self.past) * hop
        if keep_from > st.buffer_start:
            st.buffer = st.buffer[:, keep_from - st.buffer_start :]
            st.buffer_start = keep_from
        # padded -> input coordinates; never past the input's end
        start_in, stop_in = a * hop - ov, min(stop * hop - ov, st.received)
        lo_out = max(st.emitted, start_in, 0)
        piece = wav[:, lo_out - start_in : max(stop_in - start_in, lo_out - start_in)]
        st.emitted = max(st.emitted, stop_in)
        return piece
