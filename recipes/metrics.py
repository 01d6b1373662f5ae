"""Objective speech-quality metrics on 16 kHz mono float signals.

Intrusive metrics compare a degraded (noisy or enhanced) signal with its clean reference: wide-band PESQ, STOI
and SI-SDR. DNSMOS P.835 is non-intrusive (it scores the degraded signal alone). Every metric returns
``float('nan')`` when it is undefined for its input (silent reference, too short a signal, a library error), so
that a failure can never be mistaken for a score: averages are taken over the finite values only.

DNSMOS is re-implemented here from Microsoft's ``dnsmos_local.py`` semantics using the ONNX model file shipped in
the ``speechmos`` wheel; ``speechmos.dnsmos`` itself is not imported because it needs ``librosa`` and ``requests``
at import time (for the P.808 model, which is not used here).
"""

from __future__ import annotations

import math
import threading
import warnings
from importlib import util as importlib_util
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
METRIC_KEYS = ("pesq", "stoi", "si_sdr", "dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl")
NAN = float("nan")


def _as_mono(x: np.ndarray) -> np.ndarray:
    """A 1-D float64 copy of ``x`` (a ``[1, N]`` array is accepted too)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise ValueError(f"expected a mono 1-D signal, got shape {a.shape}")
    return a


def _same_length(ref: np.ndarray, deg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both signals as mono float64, cut to the shorter one's length."""
    r, d = _as_mono(ref), _as_mono(deg)
    n = min(len(r), len(d))
    return r[:n], d[:n]


def _usable(ref: np.ndarray, deg: np.ndarray) -> bool:
    """Non-empty, finite signals with a reference that is not all zeros."""
    return (
        len(ref) > 0
        and bool(np.isfinite(ref).all())
        and bool(np.isfinite(deg).all())
        and bool(np.any(ref != 0))
    )


def _finite_or_nan(value: Any) -> float:
    v = float(value)
    return v if math.isfinite(v) else NAN


def pesq_wb(ref: np.ndarray, deg: np.ndarray) -> float:
    """Wide-band PESQ (ITU-T P.862.2, MOS-LQO in [1.04, 4.64]) at 16 kHz; NaN when undefined.

    The ``pesq`` package raises for silent input ("no utterances detected") or input shorter than 1/4 s; those
    cases give NaN, never its -1 error value. Both signals are cut to the same length first.
    """
    from pesq import pesq

    r, d = _same_length(ref, deg)
    if not _usable(r, d) or not np.any(d != 0):
        return NAN
    try:
        score = pesq(SAMPLE_RATE, r, d, "wb")
    except Exception:  # cypesq.PesqError subclasses, and ValueError for degenerate input
        return NAN
    return _finite_or_nan(score) if score >= 0 else NAN


def stoi(ref: np.ndarray, deg: np.ndarray) -> float:
    """Short-time objective intelligibility (classic STOI, not extended) at 16 kHz; NaN when undefined.

    pystoi returns 0 for a silent reference and 1e-5 (with a warning) when too few frames are left after its
    silent-frame removal; both are reported as NaN here. Both signals are cut to the same length first.
    """
    from pystoi import stoi as _pystoi

    r, d = _same_length(ref, deg)
    if not _usable(r, d):
        return NAN
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            score = _pystoi(r, d, SAMPLE_RATE, extended=False)
    except Exception:  # e.g. numpy AxisError for input shorter than one frame
        return NAN
    if any("Not enough STFT frames" in str(w.message) for w in caught):
        return NAN
    return _finite_or_nan(score)


def si_sdr(ref: np.ndarray, deg: np.ndarray) -> float:
    """Scale-invariant signal-to-distortion ratio in dB (Le Roux et al., 2019).

    ``alpha = <deg, ref> / |ref|^2``; ``SI-SDR = 10 log10(|alpha ref|^2 / |deg - alpha ref|^2)``. No mean is
    removed from either signal (speech files are assumed DC-free; mean removal would change the score of signals
    with a DC offset). A tiny ``eps`` keeps it finite: identical signals give a very large value (> 100 dB). NaN
    (undefined: 0/0) for an all-zero ``deg``, as PESQ is, and for an all-zero (or empty, or non-finite) reference:
    the eps made a muted output 0 dB, finite, in the means, and above a noisy input at -5 dB. Both signals are cut
    to the same length first.
    """
    r, d = _same_length(ref, deg)
    if not _usable(r, d) or not np.any(d != 0):
        return NAN
    eps = np.finfo(np.float64).eps
    r, d = r.astype(np.float64), d.astype(np.float64)
    # np.sum of products, not np.dot: BLAS dot products can round differently with memory alignment, and the
    # trainer logs this value, which an exactly resumed run must reproduce bit for bit
    ref_energy = float(np.sum(r * r))
    alpha = float(np.sum(d * r)) / (ref_energy + eps)
    target = alpha * r
    noise = d - target
    return 10.0 * math.log10((float(np.sum(target * target)) + eps) / (float(np.sum(noise * noise)) + eps))


def default_dnsmos_model() -> Path:
    """Path of the DNSMOS P.835 ``sig_bak_ovr.onnx`` model inside the installed ``speechmos`` package."""
    spec = importlib_util.find_spec("speechmos")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the 'speechmos' package (which ships the DNSMOS ONNX models) is not installed"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "dnsmos_models" / "sig_bak_ovr.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"DNSMOS model not found at {path}")
    return path


def metrics_problem(dnsmos: bool) -> str | None:
    """Why the scores cannot be computed here (None: they can), found before any work: a missing package
    surfaced as a traceback mid-run, after the peers' calibration or the first enhancements."""
    needed = ["pesq", "pystoi"] + (["onnxruntime", "speechmos"] if dnsmos else [])
    missing = [name for name in needed if importlib_util.find_spec(name) is None]
    if missing:
        return f"scoring needs {', '.join(missing)}: pip install 'tim-enhance[train]'" + (
            " (or --no-dnsmos)" if dnsmos and set(missing) <= {"onnxruntime", "speechmos"} else ""
        )
    return None


class DNSMOS:
    """DNSMOS P.835 (SIG, BAK, OVRL), following Microsoft's ``dnsmos_local.py`` (non-personalized).

    The signal is scored in windows of 9.01 s with a 1 s hop: a shorter input is repeated (concatenated with
    itself) until it is at least 9.01 s long; the raw network outputs of each window go through the P.835
    polynomial fit and the results are averaged over windows. The ONNX session is created on first use (CPU,
    ``num_threads`` intra-op threads) and reused; calling is thread-safe.
    """

    INPUT_LENGTH = 9.01  # seconds, as in Microsoft's script
    # np.poly1d coefficients (highest power first) of the non-personalized P.835 fit
    POLY_SIG = (-0.08397278, 1.22083953, 0.0052439)
    POLY_BAK = (-0.13166888, 1.60915514, -0.39604546)
    POLY_OVR = (-0.06766283, 1.11546468, 0.04602535)

    def __init__(self, model_path: str | Path | None = None, num_threads: int = 1) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.num_threads = num_threads
        self._session: Any = None
        self._lock = threading.Lock()

    @property
    def session(self) -> Any:
        """The ONNX Runtime session, created on first access."""
        with self._lock:
            if self._session is None:
                self._session = self._create_session()
            return self._session

    def _create_session(self) -> Any:
        import onnxruntime as ort

        path = self.model_path or default_dnsmos_model()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.num_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

    @classmethod
    def windows(cls, wav: np.ndarray, fs: int = SAMPLE_RATE) -> np.ndarray:
        """The ``[n_windows, 9.01 s]`` float32 segments Microsoft's script scores for ``wav``."""
        audio = np.asarray(wav, dtype=np.float32)
        len_samples = int(cls.INPUT_LENGTH * fs)
        while len(audio) < len_samples:
            audio = np.append(audio, audio)
        num_hops = int(np.floor(len(audio) / fs) - cls.INPUT_LENGTH) + 1
        segments = []
        for idx in range(num_hops):
            seg = audio[int(idx * fs) : int((idx + cls.INPUT_LENGTH) * fs)]
            if len(seg) >= len_samples:
                segments.append(seg)
        return np.stack(segments).astype(np.float32, copy=False)

    @classmethod
    def polyfit(cls, raw: np.ndarray) -> np.ndarray:
        """Map raw ``[..., 3]`` (sig, bak, ovr) network outputs to P.835 MOS values."""
        raw = np.asarray(raw, dtype=np.float64)
        fits = [np.poly1d(c) for c in (cls.POLY_SIG, cls.POLY_BAK, cls.POLY_OVR)]
        return np.stack([fit(raw[..., i]) for i, fit in enumerate(fits)], axis=-1)

    def __call__(self, wav: np.ndarray) -> dict[str, float]:
        """Score a 16 kHz mono signal: ``{"sig", "bak", "ovrl"}``; NaN for empty or non-finite input."""
        audio = _as_mono(wav)
        if len(audio) == 0 or not np.isfinite(audio).all():
            return {"sig": NAN, "bak": NAN, "ovrl": NAN}
        session = self.session
        name = session.get_inputs()[0].name
        raw = [session.run(None, {name: seg[np.newaxis, :]})[0][0] for seg in self.windows(audio)]
        mos = self.polyfit(np.asarray(raw)).mean(axis=0)
        return {"sig": float(mos[0]), "bak": float(mos[1]), "ovrl": float(mos[2])}


def failure_reason(ref: np.ndarray, deg: np.ndarray) -> str:
    """Why a metric of ``deg`` against ``ref`` may be NaN, in words for a report (evaluation's ``failed``)."""
    r, d = _same_length(ref, deg)
    if len(r) == 0:
        return "no samples"
    if not (np.isfinite(r).all() and np.isfinite(d).all()):
        return "NaN or infinite samples"
    if not np.any(r != 0):
        return "the clean reference is silent (all zeros)"
    if not np.any(d != 0):
        return "the scored signal is silent (all zeros)"
    if len(r) < SAMPLE_RATE // 4:
        return f"{len(r) / SAMPLE_RATE:.2f} s long: PESQ needs at least 0.25 s"
    return "the metric found nothing to score (e.g. no speech-level frames)"


def compute_metrics(ref: np.ndarray, deg: np.ndarray, dnsmos: DNSMOS | None) -> dict[str, float]:
    """All metrics of ``deg`` against ``ref`` (keys :data:`METRIC_KEYS`); DNSMOS keys are NaN without a scorer."""
    out = {"pesq": pesq_wb(ref, deg), "stoi": stoi(ref, deg), "si_sdr": si_sdr(ref, deg)}
    scores = dnsmos(deg) if dnsmos is not None else {"sig": NAN, "bak": NAN, "ovrl": NAN}
    out.update({f"dnsmos_{k}": scores[k] for k in ("sig", "bak", "ovrl")})
    return out
