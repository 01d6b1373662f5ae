"""STFT framing, log1p-magnitude features and waveform rebuilding with the noisy phase.

Framing (shared by the offline and the streaming engines, so that both give the same samples):

* frame t covers samples ``[t*hop - (win - hop), t*hop + hop)`` of the signal, i.e. the signal is preceded by
  ``win - hop`` zeros; a signal of L samples gives ``T = ceil(L / hop) + 1`` frames (zeros after its end);
* window: periodic sqrt-Hann for analysis and synthesis; at hop = win/2 its square sums to exactly 1, so plain
  overlap-add reconstructs the signal (no window-envelope division, which streaming could not do cheaply).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from models.stft_config import (
    STFTConfig as STFTConfig,
)  # the model's settings, re-exported for the signal path


@functools.lru_cache(maxsize=16)
def sqrt_hann(
    win_length: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> torch.Tensor:
    """Shared (cached: a streaming hop would otherwise build it twice), so never modify it in place. Built as a
    normal tensor even under inference mode, so that autograd can use it later."""
    with torch.inference_mode(False):
        return torch.hann_window(win_length, periodic=True, dtype=dtype, device=device).sqrt()


def analysis_frames(padded: torch.Tensor, cfg: STFTConfig) -> torch.Tensor:
    """Spectra of the frames of an already padded signal: [..., (T-1)*hop + win] -> [..., T, n_bins].

    ``padded`` starts at the first sample of its first frame (offline: ``win - hop`` zeros before the signal).
    """
    lead = padded.shape[:-1]
    flat = padded.reshape(-1, padded.shape[-1])
    spec = torch.stft(
        flat,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        window=sqrt_hann(cfg.win_length, flat.dtype, flat.device),
        center=False,
        return_complex=True,
    )  # [N, n_bins, T]
    return spec.transpose(-1, -2).reshape(*lead, spec.shape[-1], cfg.n_bins)


def synthesis_frames(spec: torch.Tensor, cfg: STFTConfig) -> torch.Tensor:
    """Windowed time frames of spectra, ready for overlap-add: [..., T, n_bins] -> [..., T, win]."""
    frames = torch.fft.irfft(spec, n=cfg.n_fft, dim=-1)
    return frames * sqrt_hann(cfg.win_length, frames.dtype, frames.device)


def overlap_add(frames: torch.Tensor, cfg: STFTConfig) -> torch.Tensor:
    """Overlap-add [..., T, win] frames at the hop: -> [..., (T-1)*hop + win]."""
    lead, n_frames = frames.shape[:-2], frames.shape[-2]
    total = (n_frames - 1) * cfg.hop_length + cfg.win_length
    out = F.fold(
        frames.reshape(-1, n_frames, cfg.win_length).transpose(1, 2),  # [N, win, T]
        output_size=(1, total),
        kernel_size=(1, cfg.win_length),
        stride=(1, cfg.hop_length),
    )
    return out.reshape(*lead, total)


def stft(wav: torch.Tensor, cfg: STFTConfig) -> torch.Tensor:
    """Complex spectrum of ``wav`` [..., L] -> [..., T, n_bins] with T = ceil(L / hop) + 1."""
    n = wav.shape[-1]
    n_frames = cfg.n_frames(n)
    pad_end = (n_frames - 1) * cfg.hop_length + cfg.win_length - cfg.overlap - n
    return analysis_frames(F.pad(wav, (cfg.overlap, pad_end)), cfg)


def istft(spec: torch.Tensor, cfg: STFTConfig, length: int) -> torch.Tensor:
    """Inverse of :func:`stft`: [..., T, n_bins] complex -> [..., length] real (overlap-add, sqrt-Hann)."""
    n_frames = spec.shape[-2]
    if (n_frames - 1) * cfg.hop_length + cfg.win_length - cfg.overlap < length:
        raise ValueError(f"{n_frames} frames cannot cover {length} samples")
    wav = overlap_add(synthesis_frames(spec, cfg), cfg)
    return wav[..., cfg.overlap : cfg.overlap + length]


def apply_magnitude(log_mag: torch.Tensor, noisy_spec: torch.Tensor) -> torch.Tensor:
    """Complex spectrum with the predicted ``log1p`` magnitude and the noisy phase; a zero bin (digital silence)
    has phase 0. (``+ 0.0`` turns the -0.0 real parts that ``torch.stft`` gives some bins of a zero frame into
    +0.0, whose angle is 0 rather than pi: the phase of silence is then defined, not the FFT's sign of zero, and
    the C signal path (enhance/native_step.c) gives the same samples.)"""
    mag = linear_magnitude(log_mag)
    return mag * torch.polar(torch.ones_like(mag), (noisy_spec + 0.0).angle())


def log_magnitude(spec: torch.Tensor) -> torch.Tensor:
    """Model features and target: ``log1p(|X|)`` (no per-utterance normalisation: it would break streaming)."""
    return torch.log1p(spec.abs())


def linear_magnitude(log_mag: torch.Tensor) -> torch.Tensor:
    """The magnitude a ``log1p`` magnitude stands for, as the waveform is rebuilt from it (negative values: 0)."""
    return torch.expm1(log_mag.clamp(min=0.0))


def rebuild(log_mag: torch.Tensor, noisy_spec: torch.Tensor, cfg: STFTConfig, length: int) -> torch.Tensor:
    """Waveform from a predicted ``log1p`` magnitude and the noisy phase, at exactly ``length`` samples."""
    return istft(apply_magnitude(log_mag, noisy_spec), cfg, length)
