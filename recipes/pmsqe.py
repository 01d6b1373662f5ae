"""PMSQE: a differentiable, frame-wise stand-in for PESQ's disturbances, as a training loss term.

Martin-Doñas, Gomez, Gonzalez, Peinado, "A Deep Learning Loss Function Based on the Perceptual Evaluation of the
Speech Quality", IEEE Signal Processing Letters 25(11), 2018. It follows PESQ (ITU-T P.862; wideband P.862.2) from
the magnitude spectra of a reference and a degraded signal, which is what this model predicts (the noisy phase
rebuilds the audio, so the magnitude is all the network controls):

1. level: each signal's power spectra are scaled so that its mean power in 350-3250 Hz is PESQ's 1e7;
2. Bark bands: the 512-point spectrum is summed into PESQ's 49 wideband Bark bands (its bin counts and power
   density corrections, times ``SP``);
3. the degraded Bark spectra are equalised to the reference, per band over the utterance's speech frames and per
   frame in gain (both clipped as in PESQ), so that linear filtering and level are not counted as distortion;
4. Zwicker loudness per band above the hearing threshold; the symmetric disturbance is the loudness difference
   less a masking allowance of a quarter of the smaller loudness; the asymmetric one weighs it by
   ``((deg + 50) / (ref + 50)) ** 1.2`` where that ratio is 3 or more (capped at 12): added components, i.e.
   residual noise, which PESQ punishes far more than missing ones;
5. per frame: the band-width-weighted L2 (symmetric) and L1 (asymmetric) norms over bands 1-48, divided by the
   reference's audible power to the 0.04 and capped at 45, as PESQ does;
6. ``0.1 * symmetric + 0.0309 * asymmetric`` (PESQ's score is 4.5 minus these, aggregated over time with L6 and L2
   norms; PMSQE takes the plain mean over frames, which keeps every frame's gradient).

As in the paper, PESQ's time alignment and its smoothing of the per-frame gain are left out (the signals here are
sample-aligned), and the per-band equalisation is applied to the degraded spectra (PESQ scales the reference;
``PMSQE(as_pesq=True)`` does that instead). Not modelled either (as in the published PMSQE): PESQ-WB's input
filter (+9 dB after the level alignment) and its Hann analysis window (the sqrt-Hann frames here carry 1.25 dB
more power), so the Bark levels sit about 7.7 dB lower against the hearing thresholds than in PESQ-WB.

The band tables are P.862's 16-kHz ones (``pesqpar.h`` of its reference code, as shipped in the ``pesq`` package's
sources; the published PMSQE implementations carry the same numbers). Only 16 kHz, 512-point spectra are supported:
the model's STFT (enhance.stft.STFTConfig).
"""

from __future__ import annotations

import math

import torch

# P.862.2, 16 kHz, 512-point FFT: how many FFT bins (from bin 0) each of the 49 Bark bands sums
_BINS_PER_BAND = (
    1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
    3, 3, 3, 3, 4, 3, 4, 5, 4, 5, 6, 6, 7, 8, 9, 9, 12, 12, 15, 16, 18, 21, 25, 20,
)  # fmt: skip
_BAND_CENTRE_BARK = (
    0.078672, 0.316341, 0.636559, 0.961246, 1.290450, 1.624217, 1.962597, 2.305636, 2.653383, 3.005889,
    3.363201, 3.725371, 4.092449, 4.464486, 4.841533, 5.223642, 5.610866, 6.003256, 6.400869, 6.803755,
    7.211971, 7.625571, 8.044611, 8.469146, 8.899232, 9.334927, 9.776288, 10.223374, 10.676242, 11.134952,
    11.599563, 12.070135, 12.546731, 13.029408, 13.518232, 14.013264, 14.514566, 15.022202, 15.536238,
    16.056736, 16.583761, 17.117382, 17.657663, 18.204674, 18.758478, 19.319147, 19.886751, 20.461355,
    21.043034,
)  # fmt: skip
_BAND_WIDTH_BARK = (
    0.157344, 0.317994, 0.322441, 0.326934, 0.331474, 0.336061, 0.340697, 0.345381, 0.350114, 0.354897,
    0.359729, 0.364611, 0.369544, 0.374529, 0.379565, 0.384653, 0.389794, 0.394989, 0.400236, 0.405538,
    0.410894, 0.416306, 0.421773, 0.427297, 0.432877, 0.438514, 0.444209, 0.449962, 0.455774, 0.461645,
    0.467577, 0.473569, 0.479621, 0.485736, 0.491912, 0.498151, 0.504454, 0.510819, 0.517250, 0.523745,
    0.530308, 0.536934, 0.543629, 0.550390, 0.557220, 0.564119, 0.571085, 0.578125, 0.585232,
)  # fmt: skip
_POW_DENS_CORRECTION = (
    100.000000, 99.999992, 100.000000, 100.000008, 100.000008, 100.000015, 99.999992, 99.999969, 50.000027,
    100.000000, 99.999969, 100.000015, 99.999947, 100.000061, 53.047077, 110.000046, 117.991989, 65.000000,
    68.760147, 69.999931, 71.428818, 75.000038, 76.843384, 80.968781, 88.646126, 63.864388, 68.155350,
    72.547775, 75.584831, 58.379192, 80.950836, 64.135651, 54.384785, 73.821884, 64.437073, 59.176456,
    65.521278, 61.399822, 58.144047, 57.004543, 64.126297, 54.311001, 61.114979, 55.077751, 56.849335,
    55.628868, 53.137054, 54.985844, 79.546974,
)  # fmt: skip
_ABS_THRESHOLD_POWER = (
    51286152.0, 2454709.5, 70794.59375, 4897.788574, 1174.897705, 389.045166, 104.71286, 45.70882, 17.782795,
    9.772372, 4.897789, 3.090296, 1.905461, 1.258925, 0.977237, 0.724436, 0.562341, 0.457088, 0.389045,
    0.331131, 0.295121, 0.269153, 0.25704, 0.251189, 0.251189, 0.251189, 0.251189, 0.263027, 0.288403, 0.30903,
    0.338844, 0.371535, 0.398107, 0.436516, 0.467735, 0.489779, 0.501187, 0.501187, 0.512861, 0.524807,
    0.524807, 0.524807, 0.512861, 0.47863, 0.42658, 0.371535, 0.363078, 0.416869, 0.537032,
)  # fmt: skip
SP = 6.910853e-6  # P.862.2's power scaling into the Bark domain (16 kHz)
SL = 1.866055e-1  # and its loudness scaling
N_FFT = 512
SAMPLE_RATE = 16000
LEVEL = 1e7  # PESQ's target power for the 350-3250 Hz band
SYMMETRIC_WEIGHT = 0.1  # PESQ's weights of its two disturbances
ASYMMETRIC_WEIGHT = 0.0309
_EPS = 1e-8


def _level_mask(window_power: float) -> torch.Tensor:
    """[n_bins] weights whose sum with a frame's |X|^2 is that frame's power in 350-3250 Hz: each bin counts the
    fraction of its 31.25-Hz span inside the band, times 2 / N^2 (one-sided spectrum) / the window's mean square."""
    width = SAMPLE_RATE / N_FFT
    centre = torch.arange(N_FFT // 2 + 1, dtype=torch.float64) * width
    lo, hi = (centre - width / 2).clamp(min=350.0), (centre + width / 2).clamp(max=3250.0)
    inside = ((hi - lo) / width).clamp(min=0.0)
    return inside * 2.0 / N_FFT**2 / window_power


def _bark_matrix() -> torch.Tensor:
    """[n_bins, 49]: sums the bins of each band (bin 256, Nyquist, is in none, as in PESQ) with its correction."""
    m = torch.zeros(N_FFT // 2 + 1, len(_BINS_PER_BAND), dtype=torch.float64)
    start = 0
    for band, (n, corr) in enumerate(zip(_BINS_PER_BAND, _POW_DENS_CORRECTION, strict=True)):
        m[start : start + n, band] = corr * SP
        start += n
    assert start == N_FFT // 2
    return m


def _zwicker_power() -> torch.Tensor:
    """PESQ's loudness exponent per band: 0.23, raised below 4 Bark by min(6 / (centre + 2), 2) ** 0.15."""
    centre = torch.tensor(_BAND_CENTRE_BARK, dtype=torch.float64)
    h = torch.where(centre < 4.0, (6.0 / (centre + 2.0)).clamp(max=2.0), torch.ones_like(centre))
    return 0.23 * h**0.15


class PMSQE(torch.nn.Module):
    """``forward(degraded_power, reference_power) -> [batch]``: mean per-frame PMSQE of power spectra
    ``[batch, frames, 257]`` (|X|^2 of the model's STFT; any common scale, each signal is levelled on its own).
    0 means no audible disturbance; PESQ-like scores fall as it rises. ``window_power`` is the analysis window's
    mean square (0.5 for the model's periodic sqrt-Hann).

    ``as_pesq``: the per-band equalisation as PESQ's code does it (band powers averaged over frames, and the
    reference scaled towards the degraded) instead of as the published PMSQE does (summed over frames, the
    degraded scaled). The published form forgives added noise in bands where the reference is weak (its
    1000 offset is small against frame sums, and a near-zero degraded band cannot be raised), so it ranks
    "clean as degraded against noisy as reference" worse than "noisy against clean", the reverse of PESQ."""

    level_mask: torch.Tensor
    bark: torch.Tensor
    threshold: torch.Tensor
    zwicker: torch.Tensor
    width: torch.Tensor

    def __init__(self, window_power: float = 0.5, as_pesq: bool = False) -> None:
        super().__init__()
        self.as_pesq = as_pesq
        self.register_buffer("level_mask", _level_mask(window_power).float(), persistent=False)
        self.register_buffer("bark", _bark_matrix().float(), persistent=False)
        self.register_buffer("threshold", torch.tensor(_ABS_THRESHOLD_POWER), persistent=False)
        self.register_buffer("zwicker", _zwicker_power().float(), persistent=False)
        width = torch.tensor(_BAND_WIDTH_BARK)
        width[0] = 0.0  # PESQ's norms and audible powers leave band 0 (below 16 Hz) out
        self.register_buffer("width", width, persistent=False)
        self.sqrt_total_width = math.sqrt(float(width.sum()))

    def _bark_spectra(self, power: torch.Tensor) -> torch.Tensor:
        mean_power = (power * self.level_mask).sum(-1).mean(-1)  # [batch]
        levelled = power * (LEVEL / (mean_power + _EPS))[:, None, None]
        return levelled @ self.bark

    def _audible(self, bark: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        """[batch, frames]: summed power of bands 1-48 above ``factor`` times the hearing threshold."""
        keep = (bark > factor * self.threshold) & (self.width > 0)
        return torch.where(keep, bark, torch.zeros_like(bark)).sum(-1)

    def _equalise_bands(self, ref: torch.Tensor, deg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per band, over the frames where the reference is clearly audible (1e7 above 100x threshold); returns
        the equalised (reference, degraded)."""
        speech = (self._audible(ref, 100.0) >= 1e7)[..., None]
        loud = (ref >= 100.0 * self.threshold) & speech
        zero = torch.zeros_like(ref)
        ref_band, deg_band = torch.where(loud, ref, zero).sum(-2), torch.where(loud, deg, zero).sum(-2)
        if self.as_pesq:  # PESQ: frame averages, and the reference is scaled towards the degraded
            ref_band, deg_band = ref_band / ref.shape[-2], deg_band / ref.shape[-2]
            ref = ref * ((deg_band + 1000.0) / (ref_band + 1000.0)).clamp(0.01, 100.0)[:, None, :]
        else:  # the published PMSQE: frame sums, and the degraded is scaled towards the reference
            deg = deg * ((ref_band + 1000.0) / (deg_band + 1000.0)).clamp(0.01, 100.0)[:, None, :]
        return ref, deg

    def _loudness(self, bark: torch.Tensor) -> torch.Tensor:
        t, p = self.threshold, self.zwicker
        loud = SL * (t / 0.5) ** p * ((0.5 + 0.5 * bark / t) ** p - 1.0)
        return torch.where(bark > t, loud, torch.zeros_like(loud))

    def frame_disturbance(self, degraded_power: torch.Tensor, reference_power: torch.Tensor) -> torch.Tensor:
        """[batch, frames]: ``0.1 * symmetric + 0.0309 * asymmetric`` disturbance of each frame."""
        if degraded_power.shape != reference_power.shape or degraded_power.shape[-1] != N_FFT // 2 + 1:
            raise ValueError(
                f"PMSQE needs two [batch, frames, {N_FFT // 2 + 1}] power spectra of one shape, got "
                f"{tuple(degraded_power.shape)} and {tuple(reference_power.shape)}"
            )
        ref, deg = self._equalise_bands(
            self._bark_spectra(reference_power), self._bark_spectra(degraded_power)
        )
        audible_ref = self._audible(ref)
        gain = (audible_ref + 5e3) / (self._audible(deg) + 5e3)  # per frame, the audible power
        deg = deg * gain.clamp(3e-4, 5.0)[..., None]
        l_ref, l_deg = self._loudness(ref), self._loudness(deg)
        sym = ((l_deg - l_ref).abs() - 0.25 * torch.minimum(l_ref, l_deg)).clamp(min=_EPS)
        ratio = ((deg + 50.0) / (ref + 50.0)) ** 1.2
        asym = sym * torch.where(ratio < 3.0, torch.zeros_like(ratio), ratio.clamp(max=12.0))
        weight = ((audible_ref + 1e5) / 1e7) ** 0.04
        d_sym = torch.sqrt(((sym * self.width) ** 2).sum(-1) + _EPS) * self.sqrt_total_width
        d_asym = (asym * self.width).sum(-1)
        d_sym = (d_sym / weight).clamp(max=45.0)
        d_asym = (d_asym / weight).clamp(max=45.0)
        return SYMMETRIC_WEIGHT * d_sym + ASYMMETRIC_WEIGHT * d_asym

    def forward(self, degraded_power: torch.Tensor, reference_power: torch.Tensor) -> torch.Tensor:
        return self.frame_disturbance(degraded_power, reference_power).mean(-1)
