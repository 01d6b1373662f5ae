"""Training data through the product's DC blocker (:mod:`enhance.dc_blocker`), as the engines feed the model.

Every inference path (offline, streaming, the server) puts the 5-Hz high-pass in front of the model since session
25; a model trained on unfiltered mixtures then sees inputs that differ from its training data below about 20 Hz.
With ``DataConfig.dc_blocker`` on (the default for new runs), each training example's mixture *and* clean target go
through the same blocker, from the segment's first sample as the product filters a file from its first (so a
crop from inside a file with an offset starts with the blocker's 30-ms settling, which the product has only at
the start of a file). The blocker is linear, so the filtered mixture is still the filtered speech plus the
filtered noise, and the target is what the network can reach from its input. Validation (``recipes.trainer.validate``) filters its noisy input the
same way; its SI-SDR is measured against the unfiltered clean file, as ``recipes.evaluate`` measures it.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.signal import lfilter

from enhance.dc_blocker import GAIN, POLE
from recipes.mixing import MixingDataset
from recipes.paired import PairedDataset


def dc_blocked(wav: np.ndarray) -> np.ndarray:
    """A 1-D signal through the blocker from silence, same dtype: the engines' filter (the same float64
    recursion, ``enhance.dc_blocker``), run as one ``lfilter`` call instead of their hop-aligned block products,
    which keep the streaming engine bit-for-bit equal to the offline one but cost 9x the time (3 ms per 4-s
    segment; a GPU run's loader fills thousands of segments a second). The two agree to float32 rounding."""
    return lfilter([GAIN, -GAIN], [1.0, -POLE], wav.astype(np.float64)).astype(wav.dtype, copy=False)


class DCBlockedDataset(torch.utils.data.Dataset):
    """A recipe's training examples (``(noisy, clean)``, addressed by ``(epoch, index)``) with both signals through
    the DC blocker; the order and every random draw stay the inner dataset's."""

    def __init__(self, inner: MixingDataset | PairedDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def order(self, epoch: int) -> np.ndarray:
        return self.inner.order(epoch)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        noisy, clean = self.inner[key]
        return torch.from_numpy(dc_blocked(noisy.numpy())), torch.from_numpy(dc_blocked(clean.numpy()))
